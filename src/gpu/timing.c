#include "gpu/timing.h"

#include <stdlib.h>

#include "base/util.h"
#include "gpu/jit.h"

stof_status timing_elapsed(stof_ctx *ctx, CUevent e0, CUevent e1, float *ms)
{
    stof_status st = CU(ctx, EventRecord(e1, NULL));
    if (st == STOF_OK)
        st = CU(ctx, EventSynchronize(e1));
    if (st == STOF_OK)
        st = CU(ctx, EventElapsedTime(ms, e0, e1));
    return st;
}

stof_status timing_median(stof_ctx *ctx, timing_run_fn run, void *arg, double *ms)
{
    CUevent e0 = NULL, e1 = NULL;
    TRY(jit_push(ctx));
    stof_status st = CU(ctx, EventCreate(&e0, CU_EVENT_DEFAULT));
    if (st == STOF_OK)
        st = CU(ctx, EventCreate(&e1, CU_EVENT_DEFAULT));
    /* A first run, untimed and waited for: what a first use pays (lazy
     * module loading, library set-up) must not size the batches. A batch
     * sized on it runs a run or two, and the host's launch latency, which
     * the GPU waits out at the batch's start, then counts in its time
     * (cuBLAS products at BERT-base's 4096 rows timed 0.036 ms first in a
     * process and 0.026 after). */
    if (st == STOF_OK)
        st = run(ctx, arg, 0);
    if (st == STOF_OK)
        st = CU(ctx, CtxSynchronize());
    int per_batch = 1;
    double samples[7];
    for (int rep = -1; st == STOF_OK && rep < 7; rep++) {
        st = CU(ctx, EventRecord(e0, NULL));
        for (int i = 0; st == STOF_OK && i < per_batch; i++)
            st = run(ctx, arg, i);
        float t = 0;
        if (st == STOF_OK)
            st = timing_elapsed(ctx, e0, e1, &t);
        if (rep < 0) {
            /* The warm-up also sizes the batches to about 2 ms. */
            per_batch = t > 0 ? (int)(2.0 / t) : 50;
            per_batch = per_batch < 1 ? 1 : per_batch > 50 ? 50 : per_batch;
        } else {
            samples[rep] = t / per_batch;
        }
    }
    if (st == STOF_OK)
        st = run(ctx, arg, 0);
    if (st == STOF_OK)
        st = CU(ctx, CtxSynchronize());
    if (e0)
        ctx->dev.api.EventDestroy(e0);
    if (e1)
        ctx->dev.api.EventDestroy(e1);
    jit_pop(ctx);
    if (st == STOF_OK) {
        qsort(samples, 7, sizeof samples[0], util_cmp_double);
        *ms = samples[3];
        ctx->stats.timing_runs++;
    }
    return st;
}

stof_status timing_bandwidth(stof_ctx *ctx, double *gbs)
{
    const size_t bytes = (size_t)256 << 20;
    CUdeviceptr a = 0, b = 0;
    CUevent e0 = NULL, e1 = NULL;
    double t[5];
    TRY(jit_push(ctx));
    stof_status st = CU(ctx, MemAlloc(&a, bytes));
    if (st == STOF_OK)
        st = CU(ctx, MemAlloc(&b, bytes));
    if (st == STOF_OK)
        st = CU(ctx, EventCreate(&e0, CU_EVENT_DEFAULT));
    if (st == STOF_OK)
        st = CU(ctx, EventCreate(&e1, CU_EVENT_DEFAULT));
    for (int rep = -1; st == STOF_OK && rep < 5; rep++) {
        float ms = 0;
        st = CU(ctx, EventRecord(e0, NULL));
        if (st == STOF_OK)
            st = CU(ctx, MemcpyDtoDAsync(b, a, bytes, NULL));
        if (st == STOF_OK)
            st = timing_elapsed(ctx, e0, e1, &ms);
        if (rep >= 0)
            t[rep] = ms;
    }
    if (e0) ctx->dev.api.EventDestroy(e0);
    if (e1) ctx->dev.api.EventDestroy(e1);
    if (a) ctx->dev.api.MemFree(a);
    if (b) ctx->dev.api.MemFree(b);
    jit_pop(ctx);
    if (st != STOF_OK)
        return st;
    qsort(t, 5, sizeof t[0], util_cmp_double);
    if (!(t[2] > 0))
        return CTX_FAIL(ctx, STOF_ERR_INTERNAL, "timing a device copy gave %g ms", t[2]);
    *gbs = 2.0 * (double)bytes / (t[2] * 1e-3) / 1e9;
    return STOF_OK;
}
