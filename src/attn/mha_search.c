#include "attn/mha_search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/reference.h"
#include "base/half.h"
#include "base/now.h"
#include "base/strbuf.h"
#include "cache/cache.h"
#include "gpu/timing.h"

/* ---- inputs, timing and the CPU check ----------------------------------- */

/* Random inputs for timing, rotated over sets so the L2 does not flatter. */
typedef struct search_io {
    int nsets;
    size_t q_elems, kv_elems, o_elems;
    CUdeviceptr q[4], k[4], v[4], out;
    uint16_t *hq, *hk, *hv;  /* set 0 on the host, for the CPU check */
    /* Outputs on the host, page-locked (a pageable copy of 50 MB took
     * 50 ms a candidate): the first candidate's, and the one compared
     * with it. pinned[i]: from cuMemAllocHost, else malloc. */
    uint16_t *first, *cur;
    int pinned[2];
    /* desc.bias_buckets: a random table of the search's own (the caller's
     * is data, read at run), on the device and on the host. */
    CUdeviceptr table;
    float *htable;
    /* A varlen desc's runs: batch sequences of seq_q rows and seq_k keys
     * (cu_q, then cu_k: batch + 1 boundaries each), which lay the rows out
     * as the padded batch in BLHD does. */
    CUdeviceptr cu;
    mha_varlen vl;
} search_io;

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mha_fill_random(uint16_t *p, size_t n, stof_dtype t, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        float x = (float)((rng_next(&seed) >> 40) * 0x1.0p-24 * 2.0 - 1.0);
        p[i] = t == STOF_BF16 ? bf16_from_float(x) : half_from_float(x);
    }
}

#define FILL_PERIOD 1048573
void mha_fill_periodic(uint16_t *p, size_t n, stof_dtype t, uint64_t seed, float scale,
                       float offset)
{
    size_t m = n < FILL_PERIOD ? n : FILL_PERIOD;
    mha_fill_random(p, m, t, seed);
    if (scale != 1 || offset != 0)
        for (size_t i = 0; i < m; i++)
            dtype_store(t, p, i, offset + scale * (float)dtype_load(t, p, i));
    for (size_t at = m; at < n; at += m)
        memcpy(p + at, p, 2 * (n - at < m ? n - at : m));
}

static void io_free(stof_ctx *ctx, search_io *io)
{
    if (jit_push(ctx) == STOF_OK) {
        for (int i = 0; i < 4; i++) {
            if (io->q[i]) ctx->dev.api.MemFree(io->q[i]);
            if (io->k[i]) ctx->dev.api.MemFree(io->k[i]);
            if (io->v[i]) ctx->dev.api.MemFree(io->v[i]);
        }
        if (io->out)
            ctx->dev.api.MemFree(io->out);
        if (io->table)
            ctx->dev.api.MemFree(io->table);
        if (io->cu)
            ctx->dev.api.MemFree(io->cu);
        uint16_t *h[2] = {io->first, io->cur};
        for (int i = 0; i < 2; i++)
            if (h[i] && io->pinned[i])
                ctx->dev.api.MemFreeHost(h[i]);
        jit_pop(ctx);
    }
    if (!io->pinned[0])
        free(io->first);
    if (!io->pinned[1])
        free(io->cur);
    free(io->hq);
    free(io->hk);
    free(io->hv);
    free(io->htable);
    memset(io, 0, sizeof *io);
}

static stof_status io_alloc(stof_ctx *ctx, const stof_mha_desc *d, search_io *io)
{
    memset(io, 0, sizeof *io);
    size_t bh = (size_t)d->batch * d->heads, D = (size_t)d->head_dim;
    io->q_elems = d->qkv_packed ? (size_t)d->batch * (d->heads + 2 * (size_t)mha_kv_heads(d)) *
                                      (size_t)d->seq_q * D
                                : bh * (size_t)d->seq_q * D;
    io->kv_elems = d->qkv_packed ? 0 : (size_t)d->batch * mha_kv_heads(d) * (size_t)d->seq_k * D;
    io->o_elems = bh * (size_t)d->seq_q * D;
    size_t set_bytes = 2 * (io->q_elems + 2 * io->kv_elems);
    size_t l2 = ctx->dev.l2_bytes > 0 ? (size_t)ctx->dev.l2_bytes : 50u << 20;
    io->nsets = (int)((2 * l2 + set_bytes - 1) / set_bytes);
    io->nsets = io->nsets < 1 ? 1 : io->nsets > 4 ? 4 : io->nsets;
    io->hq = malloc(2 * io->q_elems);
    io->hk = malloc(2 * (io->kv_elems ? io->kv_elems : 1));
    io->hv = malloc(2 * (io->kv_elems ? io->kv_elems : 1));
    if (!io->hq || !io->hk || !io->hv) {
        io_free(ctx, io);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the search's inputs");
    }
    /* One random fill (the host's copy is what the CPU check reads); the
     * sets are copies of it at other addresses, which is all that keeps
     * the L2 from flattering (filling each set anew cost a cold plan at
     * L 4096 over a second). */
    mha_fill_periodic(io->hq, io->q_elems, d->dtype, 1000, 1, 0);
    mha_fill_periodic(io->hk, io->kv_elems, d->dtype, 2000, 1, 0);
    mha_fill_periodic(io->hv, io->kv_elems, d->dtype, 3000, 1, 0);
    stof_status st = jit_push(ctx);
    for (int s = 0; st == STOF_OK && s < io->nsets; s++) {
        st = CU(ctx, MemAlloc(&io->q[s], 2 * io->q_elems));
        if (st == STOF_OK)
            st = CU(ctx, MemcpyHtoD(io->q[s], io->hq, 2 * io->q_elems));
        if (st == STOF_OK && io->kv_elems) {
            st = CU(ctx, MemAlloc(&io->k[s], 2 * io->kv_elems));
            if (st == STOF_OK)
                st = CU(ctx, MemcpyHtoD(io->k[s], io->hk, 2 * io->kv_elems));
            if (st == STOF_OK)
                st = CU(ctx, MemAlloc(&io->v[s], 2 * io->kv_elems));
            if (st == STOF_OK)
                st = CU(ctx, MemcpyHtoD(io->v[s], io->hv, 2 * io->kv_elems));
        }
    }
    if (st == STOF_OK)
        st = CU(ctx, MemAlloc(&io->out, 2 * io->o_elems));
    /* Biases of -2 to 2 in logit units: enough to move the softmax. */
    const size_t nb = (size_t)d->heads * (size_t)(d->bias_buckets > 0 ? d->bias_buckets : 0);
    if (st == STOF_OK && nb) {
        uint64_t seed = 4000;
        if (!(io->htable = malloc(nb * sizeof *io->htable)))
            st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the search's bias table");
        for (size_t i = 0; st == STOF_OK && i < nb; i++)
            io->htable[i] = (float)((rng_next(&seed) >> 40) * 0x1.0p-24 * 4.0 - 2.0);
        if (st == STOF_OK)
            st = CU(ctx, MemAlloc(&io->table, nb * sizeof *io->htable));
        if (st == STOF_OK)
            st = CU(ctx, MemcpyHtoD(io->table, io->htable, nb * sizeof *io->htable));
    }
    if (st == STOF_OK && d->varlen) {
        const size_t n = (size_t)d->batch + 1;
        int *cu = malloc(2 * n * sizeof *cu);
        for (size_t b = 0; cu && b < n; b++)
            cu[b] = (int)b * d->seq_q, cu[n + b] = (int)b * d->seq_k;
        st = cu ? CU(ctx, MemAlloc(&io->cu, 2 * n * sizeof *cu))
                : CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the search's inputs");
        if (st == STOF_OK)
            st = CU(ctx, MemcpyHtoD(io->cu, cu, 2 * n * sizeof *cu));
        free(cu);
        io->vl = (mha_varlen){io->cu, io->cu + n * sizeof(int), d->batch,
                              (long long)d->batch * d->seq_q, (long long)d->batch * d->seq_k};
    }
    if (st == STOF_OK) {
        jit_pop(ctx);
        return STOF_OK;
    }
    jit_pop(ctx);
    io_free(ctx, io);
    return st;
}

typedef struct timed_launch {
    const stof_mha_desc *d;
    const mha_launch *L;
    const search_io *io;
} timed_launch;

static stof_status run_timed(stof_ctx *ctx, void *arg, int i)
{
    const timed_launch *t = arg;
    const int s = i % t->io->nsets;
    return mha_kernel_launch(ctx, t->d, t->L, t->io->q[s], t->io->k[s], t->io->v[s], t->io->out,
                             0, t->d->varlen ? &t->io->vl : NULL, NULL, NULL);
}

/* Median milliseconds of one run; the output left in io->out is input set 0's. */
static stof_status time_candidate(stof_ctx *ctx, const stof_mha_desc *d, const mha_launch *L,
                                  const search_io *io, double *ms)
{
    timed_launch t = {d, L, io};
    return timing_median(ctx, run_timed, &t, ms);
}

/* The output of the last launch, on the host: into io->first (which = 0)
 * or io->cur (1), made on first use. */
static stof_status fetch_out(stof_ctx *ctx, search_io *io, int which)
{
    uint16_t **h = which ? &io->cur : &io->first;
    TRY(jit_push(ctx));
    stof_status st = STOF_OK;
    if (!*h) {
        /* Page-locked where the system allows, else plain memory. */
        io->pinned[which] = ctx->dev.api.MemAllocHost((void **)h, 2 * io->o_elems) == CUDA_SUCCESS;
        if (!io->pinned[which] && !(*h = malloc(2 * io->o_elems)))
            st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the search's outputs");
    }
    if (st == STOF_OK)
        st = CU(ctx, MemcpyDtoH(*h, io->out, 2 * io->o_elems));
    jit_pop(ctx);
    return st;
}

/* Relative L2 distance of a from b (NaN anywhere: infinite), converting
 * through a table of all 65536 values. */
static stof_status rel_l2(stof_ctx *ctx, const uint16_t *a, const uint16_t *b, size_t n,
                          stof_dtype t, double *out)
{
    float *val = malloc(65536 * sizeof *val);
    if (!val)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory comparing outputs");
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        val[i] = (float)dtype_load(t, &h, 0);
    }
    double num = 0, den = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        double x = val[a[i]], y = val[b[i]];
        nan |= isnan(x) || isnan(y);
        num += (x - y) * (x - y);
        den += y * y;
    }
    free(val);
    *out = nan ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
    return STOF_OK;
}

/* The reference's share of a search: head (0, 0) is checked on every row
 * while its allowed entries times head_dim stay below this (about a tenth
 * of a second of the double reference), else on a sample of rows. */
#define CHECK_BUDGET 1e8

/* The rows checked: all of them, or the first and last 64 and in between
 * every stride-th row, at an offset that moves from one block of 64 rows to
 * the next so that every position within a tile is met. */
static unsigned char *check_rows(const stof_mha_desc *d, const mask_summary *ms)
{
    int lq = d->seq_q;
    double work = (double)ms->info.entries * d->head_dim;
    int stride = work <= CHECK_BUDGET ? 1 : (int)ceil(work / CHECK_BUDGET);
    unsigned char *rows = malloc((size_t)lq);
    for (int i = 0; rows && i < lq; i++)
        rows[i] = i < 64 || i >= lq - 64 || i % stride == (i / 64) % stride;
    return rows;
}

/* Checks head (0, 0) of a GPU output against the CPU reference, on the
 * rows check_rows picks. */
static stof_status cpu_check(stof_ctx *ctx, const stof_mha_desc *d, const mask_summary *ms,
                             const search_io *io, const uint16_t *gpu, int *checked, double *err)
{
    *checked = 0;
    mha_strides s = mha_kernel_strides(d);
    size_t D = (size_t)d->head_dim, lq = (size_t)d->seq_q, lk = (size_t)d->seq_k;
    uint16_t *q = malloc(2 * lq * D), *k = malloc(2 * lk * D), *v = malloc(2 * lk * D);
    double *ref = malloc(sizeof(double) * lq * D);
    unsigned char *rows = check_rows(d, ms);
    stof_status st = STOF_OK;
    if (!q || !k || !v || !ref || !rows) {
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the CPU check");
        goto done;
    }
    const uint16_t *hk = d->qkv_packed ? io->hq + s.k_offset : io->hk;
    const uint16_t *hv = d->qkv_packed ? io->hq + s.v_offset : io->hv;
    for (size_t r = 0; r < lq; r++)
        memcpy(q + r * D, io->hq + r * s.s[0][2], 2 * D);
    for (size_t r = 0; r < lk; r++) {
        memcpy(k + r * D, hk + r * s.s[1][2], 2 * D);
        memcpy(v + r * D, hv + r * s.s[2][2], 2 * D);
    }
    /* Head 0's modifiers: the search's slopes are the standard ones of
     * desc.heads heads (search_desc), its table is io's. */
    const float slope = (float)ref_alibi_slope(0, d->heads);
    ref_attn_args a = {1, 1, d->seq_q, d->seq_k, d->head_dim, d->dtype, STOF_LAYOUT_BHLD,
                       d->scale, q, k, v, ms->runs, NULL, rows, 0, d->softcap,
                       d->alibi, d->alibi ? &slope : NULL,
                       d->bias_buckets > 0 ? d->bias_buckets : 0,
                       d->bias_buckets > 0 ? io->htable : NULL};
    if ((st = ref_attention(ctx, &a, ref)) != STOF_OK)
        goto done;
    double num = 0, den = 0;
    for (size_t r = 0; r < lq; r++)
        for (size_t c = 0; c < D && rows[r]; c++) {
            double g = dtype_load(d->dtype, gpu, r * s.s[3][2] + c), x = ref[r * D + c];
            num += (g - x) * (g - x);
            den += x * x;
        }
    *err = isnan(num) ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
    *checked = 1;
done:
    free(q);
    free(k);
    free(v);
    free(ref);
    free(rows);
    return st;
}

/* ---- the model's device figures ----------------------------------------- */

/* What an engine's tiles achieve on dense attention (fp16, b=4, h=16,
 * l=2048, d=64), timed as the search times candidates, in TFLOP/s. */
#define FIGURE_B 4
#define FIGURE_H 16
#define FIGURE_L 2048
#define FIGURE_D 64
static const stof_mha_desc FIGURE_DESC = {.batch = FIGURE_B, .heads = FIGURE_H,
                                          .seq_q = FIGURE_L, .seq_k = FIGURE_L,
                                          .head_dim = FIGURE_D, .dtype = STOF_F16,
                                          .layout = STOF_LAYOUT_BHLD};
/* The tiles each engine is measured on, by engine (mha_candidate.wg). */
static const mha_candidate FIGURE_ENGINES[3] = {{ATTN_BLOCK, 64, 64, 1, 0, 0, 0},
                                                {ATTN_BLOCK, 128, 64, 1, 0, 1, 4},
                                                {ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}};

static stof_status measure_engine(stof_ctx *ctx, int wg, double *tflops)
{
    const int B = FIGURE_B, H = FIGURE_H, L = FIGURE_L, D = FIGURE_D;
    stof_mha_desc d = FIGURE_DESC;
    const mha_candidate c = FIGURE_ENGINES[wg];
    stof_mask *m = NULL;
    TRY(stof_mask_parse(ctx, "dense", L, L, &m));
    mask_summary dense;
    attn_tiles t;
    stof_status st = mask_summarize(ctx, m, &dense);
    if (st == STOF_OK)
        st = attn_tiles_build(ctx, &dense, c.kind, c.bm, c.bn, &t);
    mask_summary_free(&dense);
    stof_mask_free(m);
    if (st != STOF_OK)
        return st;
    search_io io;
    mha_launch lc;
    double ms = 0;
    if ((st = io_alloc(ctx, &d, &io)) == STOF_OK) {
        if ((st = mha_kernel_load(ctx, &d, &c, &t, NULL, &lc)) == STOF_OK) {
            st = time_candidate(ctx, &d, &lc, &io, &ms);
            mha_kernel_unload(ctx, &lc);
        }
        io_free(ctx, &io);
    }
    attn_tiles_free(&t);
    if (st == STOF_OK && !(ms > 0))
        st = CTX_FAIL(ctx, STOF_ERR_INTERNAL, "timing the %s engine gave %g ms",
                      mha_kernel_engine_name(&c), ms);
    if (st == STOF_OK)
        *tflops = 4.0 * B * H * (double)L * L * D / (ms * 1e-3) / 1e12;
    return st;
}

/* Keeps the figures on the context (out of memory, a later plan looks
 * them up again). */
static void keep_figures(stof_ctx *ctx, const model_device *md)
{
    if (!ctx->model)
        ctx->model = malloc(sizeof *ctx->model);
    if (ctx->model)
        *ctx->model = *md;
}

stof_status mha_search_device_figures(stof_ctx *ctx, model_device *md, int measure)
{
    *md = model_device_of(&ctx->dev, ctx->arch);
    if (!ctx->dev.ok)
        return STOF_OK;  /* compiling for a named arch: its defaults */
    if (ctx->model) {
        *md = *ctx->model;
        return STOF_OK;
    }
    /* Once per device and arch, in the cache next to the tuning records. */
    if (ctx->cache) {
        cache_tuning rec;
        int found = 0;
        TRY(cache_get_tuning(&ctx->err, ctx->cache, "device", "-", ctx->dev.name, "-", ctx->arch,
                             &rec, &found));
        model_device got;
        int ok = found && model_device_parse(rec.record, &got) && got.measured;
        if (found)
            cache_tuning_free(&rec);
        if (ok) {
            *md = got;
            keep_figures(ctx, md);
            return STOF_OK;
        }
    }
    if (!measure)
        return STOF_OK;
    int khz = 0;
    TRY(CU(ctx, DeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, ctx->dev.dev)));
    md->clock_mhz = khz / 1000;
    /* The engines' kernels compile together, as a search's do (one after
     * another they cost a cold plan two seconds); a failure shows again
     * when the engine is measured. */
    int engines = strcmp(ctx->arch, "sm_90a") == 0 ? 3 : 1, idx[3] = {0, 1, 2};
    mha_search_cand cs[3];
    memset(cs, 0, sizeof cs);
    for (int i = 0; i < engines; i++)
        cs[i].c = FIGURE_ENGINES[i];
    err_record before = ctx->err;
    if (mha_search_compile(ctx, &FIGURE_DESC, cs, idx, engines) != STOF_OK)
        ctx->err = before;
    TRY(measure_engine(ctx, 0, &md->mma_tflops));
    if (strcmp(ctx->arch, "sm_90a") == 0)
        TRY(measure_engine(ctx, 1, &md->wgmma_tflops));
    if (strcmp(ctx->arch, "sm_90a") == 0)
        TRY(measure_engine(ctx, MHA_WS, &md->ws_tflops));
    TRY(timing_bandwidth(ctx, &md->mem_gbs));
    md->measured = 1;
    keep_figures(ctx, md);
    char *record = model_device_format(md, ctx->dev.name);
    if (!record)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    if (ctx->cache) {
        /* A record that fails to store costs a later measurement, no more. */
        err_record saved = ctx->err;
        cache_tuning t = {"device", "-", ctx->dev.name, "-", ctx->arch, record, 0};
        if (cache_put_tuning(&ctx->err, ctx->cache, &t) == STOF_OK)
            ctx->err = saved;
    }
    free(record);
    return STOF_OK;
}

stof_status mha_device_figures(stof_ctx *ctx, model_device *md)
{
    return mha_search_device_figures(ctx, md, 1);
}

/* ---- ranking and the two-stage search ----------------------------------- */

static int by_prediction(const void *a, const void *b)
{
    const mha_search_cand *x = a, *y = b;
    return x->predicted_ms < y->predicted_ms ? -1 : x->predicted_ms > y->predicted_ms;
}

stof_status mha_search_rank(stof_ctx *ctx, const stof_mha_desc *d, const mask_summary *ms,
                            int measure, mha_search_cand *cs, int *n)
{
    mha_candidate c[MHA_MAX_CANDIDATES];
    int nc = mha_candidates(d->head_dim, mha_kernel_device_smem(ctx),
                            strcmp(ctx->arch, "sm_90a") == 0, c, MHA_MAX_CANDIDATES);
    int want_gather = ms->info.block_efficiency < MHA_GATHER_BELOW;
    model_device md;
    TRY(mha_search_device_figures(ctx, &md, measure));
    *n = 0;
    for (int i = 0; i < nc; i++) {
        if ((c[i].kind == ATTN_GATHER && !want_gather) ||
            !mha_takes_mods(&c[i], d))
            continue;
        mha_search_cand *s = &cs[(*n)++];
        memset(s, 0, sizeof *s);
        s->c = c[i];
        /* Candidates of one tile shape share its tiles: a copy costs far
         * less than walking the mask again (28 walks of 9 shapes at L 16384). */
        const mha_search_cand *same = NULL;
        for (int j = 0; j < *n - 1 && !same; j++)
            if (cs[j].c.kind == c[i].kind && cs[j].c.bm == c[i].bm && cs[j].c.bn == c[i].bn)
                same = &cs[j];
        stof_status st = same ? attn_tiles_copy(ctx, &same->tiles, &s->tiles)
                              : attn_tiles_build(ctx, ms, c[i].kind, c[i].bm, c[i].bn, &s->tiles);
        if (st != STOF_OK) {
            for (int j = 0; j < *n - 1; j++)
                attn_tiles_free(&cs[j].tiles);
            *n = 0;
            return st;
        }
        s->built = 1;
        s->predicted_ms =
            model_attn_ms(&md, &s->tiles, d->batch * d->heads, d->head_dim, s->c.mt, s->c.wg);
    }
    qsort(cs, (size_t)*n, sizeof *cs, by_prediction);
    return STOF_OK;
}

void mha_search_free(mha_search_cand *cs, int n)
{
    for (int i = 0; i < n; i++)
        attn_tiles_free(&cs[i].tiles);
}

int mha_search_is_default(const mha_candidate *c)
{
    if (c->wg == MHA_WS)
        return (c->bm == 128 || c->bm == 192) &&
               (c->bn == 128 || (c->bm == 192 && (c->bn == 96 || c->bn == 144))) && c->st == 2;
    if (c->wg)
        return (c->bm == 64 || c->bm == 128) && c->bn == 64 && c->st == 4;
    return c->bm == 64 && c->bn == 64 && c->mt == 1 && !c->qs;
}

/* Times candidate s and checks its output, recording the verdict: the
 * first to run (*have_first 0) against the CPU reference, every later one
 * against the first's output. */
static stof_status try_candidate(stof_ctx *ctx, const stof_mha_desc *d, const mask_summary *ms,
                                 mha_search_cand *s, search_io *io, int *have_first)
{
    mha_launch L;
    stof_status st = mha_kernel_load(ctx, d, &s->c, &s->tiles, NULL, &L);
    if (st == STOF_OK)
        st = time_candidate(ctx, d, &L, io, &s->ms);
    if (st == STOF_OK)
        st = fetch_out(ctx, io, *have_first);
    mha_kernel_unload(ctx, &L);
    if (st != STOF_OK) {
        s->verdict = "failed";
        return st;
    }
    if (!*have_first) {
        int checked = 0;
        double err = 0;
        st = cpu_check(ctx, d, ms, io, io->first, &checked, &err);
        double tol = d->dtype == STOF_BF16 ? 1.5e-2 : 5e-3;
        if (st == STOF_OK && checked && !(err <= tol)) {
            s->verdict = "mismatch";
            return CTX_FAIL(ctx, STOF_ERR_INTERNAL,
                            "attention kernel %s %dx%d (%s, m_tiles %d, q in %s) disagrees "
                            "with the CPU reference (relative L2 error %.3g)",
                            mha_kernel_kind_name(s->c.kind), s->c.bm, s->c.bn,
                            mha_kernel_engine_name(&s->c), s->c.mt, s->c.qs ? "smem" : "regs",
                            err);
        }
        s->verdict = "ok";
        *have_first = 1;
        return st;
    }
    double tol = d->dtype == STOF_BF16 ? 2e-2 : 1e-2, dist = 0;
    TRY(rel_l2(ctx, io->cur, io->first, io->o_elems, d->dtype, &dist));
    s->verdict = dist <= tol ? "ok" : "mismatch";
    return STOF_OK;
}

stof_status mha_search_compile(stof_ctx *ctx, const stof_mha_desc *d,
                               const mha_search_cand *cs, const int *idx, int m)
{
    if (m <= 0)
        return STOF_OK;
    mha_request *r = malloc((size_t)m * sizeof *r);
    jit_request *reqs = malloc((size_t)m * sizeof *reqs);
    stof_status st = STOF_OK;
    if (!r || !reqs) {
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory listing attention kernels");
    } else {
        for (int i = 0; i < m; i++) {
            const mha_search_cand *c = &cs[idx[i]];
            mha_make_request(&c->c, d->head_dim, d->seq_q, d->dtype, mha_group(d), mha_mods_of(d),
                             d->varlen,
                             d->varlen ? 1
                                       : mha_view_period(&c->c, &c->tiles, d->seq_q, d->seq_k),
                             &r[i]);
            reqs[i] = r[i].req;
        }
        st = jit_prepare_all(ctx, reqs, m);
    }
    free(r);
    free(reqs);
    return st;
}

/* Which candidates a stage times, in order: stage 1, the default size of
 * every kind; stage 2, the winner kind's others, best-ranked first, at most
 * cap; never more than left. */
static int stage_set(const mha_search_cand *cs, int n, int stage, int winner, int left, int cap,
                     int *idx)
{
    int m = 0;
    for (int i = 0; i < n && m < left; i++) {
        const mha_search_cand *s = &cs[i];
        if (s->verdict)
            continue;
        if (stage == 1 ? !mha_search_is_default(&s->c)
                       : winner < 0 || s->c.kind != cs[winner].c.kind || m >= cap)
            continue;
        idx[m++] = i;
    }
    return m;
}

stof_status mha_search_run(stof_ctx *ctx, const stof_mha_desc *desc, const mask_summary *ms,
                           mha_search_cand *cs, int n, stof_tune level, int *winner)
{
    search_io io;
    TRY(io_alloc(ctx, desc, &io));
    /* The candidates run on the search's own data: the standard ALiBi slopes
     * (uploaded with each candidate's tiles), io's bias table. */
    stof_mha_desc sd = *desc;
    const stof_mha_desc *d = &sd;
    sd.alibi_slopes = NULL;
    sd.bias_table = (const float *)(uintptr_t)io.table;
    int have_first = 0;
    double t0 = now_mono_s();
    int budget = d->max_candidates > 0 ? d->max_candidates : 1 << 30, timed = 0;
    int stage2_cap = level == STOF_TUNE_FULL ? 1 << 30 : 3;
    stof_status st = STOF_OK;
    *winner = -1;
    for (int stage = 1; stage <= 2 && st == STOF_OK; stage++) {
        int idx[MHA_MAX_CANDIDATES];
        int m = stage_set(cs, n, stage, *winner, budget - timed, stage2_cap, idx);
        /* Out of time: the loop would stop at its first candidate. */
        if (d->max_seconds > 0 && now_mono_s() - t0 > d->max_seconds && *winner >= 0)
            m = 0;
        err_record saved = ctx->err;
        if (mha_search_compile(ctx, d, cs, idx, m) != STOF_OK)
            ctx->err = saved;
        for (int k = 0; k < m && st == STOF_OK; k++) {
            if (d->max_seconds > 0 && now_mono_s() - t0 > d->max_seconds && *winner >= 0)
                break;
            mha_search_cand *s = &cs[idx[k]];
            st = try_candidate(ctx, d, ms, s, &io, &have_first);
            timed++;
            if (st == STOF_OK && strcmp(s->verdict, "ok") == 0 &&
                (*winner < 0 || s->ms < cs[*winner].ms))
                *winner = idx[k];
        }
        /* Stage 1 found no default-sized candidate (the device's shared
         * memory ruled them out): take the best-ranked one. */
        if (stage == 1 && *winner < 0 && st == STOF_OK && n > 0 && timed < budget) {
            st = try_candidate(ctx, d, ms, &cs[0], &io, &have_first);
            timed++;
            if (st == STOF_OK && strcmp(cs[0].verdict, "ok") == 0)
                *winner = 0;
        }
    }
    io_free(ctx, &io);
    if (st == STOF_OK && *winner < 0)
        st = CTX_FAIL(ctx, STOF_ERR_INTERNAL, "no attention candidate passed its checks");
    return st;
}

/* ---- tuning records ----------------------------------------------------- */

char *mha_record_format(const mha_tried *cs, int n, int winner, const char *kernel, const char *why,
                        const char *mask_spec)
{
    strbuf b = {0};
    const mha_tried *w = &cs[winner];
    strbuf_printf(&b,
                  "{\"winner\":{\"kind\":\"%s\",\"bm\":%d,\"bn\":%d,\"mt\":%d,\"qs\":%d,\"wg\":%d,"
                  "\"st\":%d,\"ms\":%.6f,\"predicted_ms\":%.6f,\"kernel\":\"%s\"},"
                  "\"model_error\":%.4f,\"how\":\"%s\",",
                  mha_kernel_kind_name(w->c.kind), w->c.bm, w->c.bn, w->c.mt, w->c.qs, w->c.wg,
                  w->c.st, w->ms, w->predicted_ms, kernel,
                  w->ms > 0 ? w->predicted_ms / w->ms - 1 : 0.0, why);
    char id[17];
    if (jit_source_id(id))
        strbuf_printf(&b, "\"source\":\"%s\",", id);
    /* A spec is [a-z0-9_:,+&-] only, so it needs no escaping; a record
     * without one just cannot name its mask. */
    if (mask_spec && *mask_spec && strspn(mask_spec, "abcdefghijklmnopqrstuvwxyz0123456789_:,+&-") ==
                                       strlen(mask_spec))
        strbuf_printf(&b, "\"mask\":\"%s\",", mask_spec);
    strbuf_puts(&b, "\"tried\":[");
    int first = 1;
    for (int i = 0; i < n; i++) {
        const mha_tried *s = &cs[i];
        strbuf_printf(&b, "%s{\"kind\":\"%s\",\"bm\":%d,\"bn\":%d,\"mt\":%d,\"qs\":%d,\"wg\":%d,"
                      "\"st\":%d,\"predicted_ms\":%.6f",
                      first ? "" : ",", mha_kernel_kind_name(s->c.kind), s->c.bm, s->c.bn,
                      s->c.mt, s->c.qs, s->c.wg, s->c.st, s->predicted_ms);
        if (s->verdict)
            strbuf_printf(&b, ",\"ms\":%.6f,\"verdict\":\"%s\"", s->ms, s->verdict);
        strbuf_puts(&b, "}");
        first = 0;
    }
    strbuf_puts(&b, "]}");
    return strbuf_take(&b);
}

int mha_record_kernel(const char *rec, char key[65])
{
    char id[17], got[17];
    const char *k = rec ? strstr(rec, "\"kernel\":\"") : NULL;
    const char *s = rec ? strstr(rec, "\"source\":\"") : NULL;
    if (!k || !s || !jit_source_id(id) || sscanf(s, "\"source\":\"%16[0-9a-f]\"", got) != 1 ||
        strcmp(got, id) != 0 || sscanf(k, "\"kernel\":\"%64[0-9a-f]\"", key) != 1)
        return 0;
    return strlen(key) == 64;
}

/* The winner stored in a tuning record. */
int mha_record_parse(const char *rec, mha_candidate *c, double *ms, double *pred)
{
    const char *w = rec ? strstr(rec, "\"winner\":{") : NULL;
    char kind[16];
    if (!w || sscanf(w, "\"winner\":{\"kind\":\"%15[a-z]\",\"bm\":%d,\"bn\":%d,\"mt\":%d,\"qs\":%d,"
                        "\"wg\":%d,\"st\":%d,\"ms\":%lf,\"predicted_ms\":%lf",
                     kind, &c->bm, &c->bn, &c->mt, &c->qs, &c->wg, &c->st, ms, pred) != 9)
        return 0;
    if (strcmp(kind, "block") != 0 && strcmp(kind, "gather") != 0)
        return 0;
    c->kind = strcmp(kind, "gather") == 0 ? ATTN_GATHER : ATTN_BLOCK;
    if (c->wg == MHA_WS)
        return (c->kind == ATTN_BLOCK || (c->bm == 128 && c->qs == 0 && c->bn <= 128)) &&
               (c->bm == 128 || c->bm == 192) &&
               (c->bn == 64 || c->bn == 96 || c->bn == 128 || c->bn == 144 || c->bn == 192) &&
               c->mt == 1 &&
               (c->qs == 0 || c->qs == 1) && c->st >= 2 && c->st <= 4;
    if (c->wg == 1)
        return c->bm >= 64 && c->bm <= 192 && c->bm % 64 == 0 && (c->bn == 64 || c->bn == 128) &&
               c->mt == 1 && c->qs == 0 && c->st >= 2 && c->st <= 4;
    return c->wg == 0 && c->st == 0 && c->bm >= 16 && c->bm <= 128 && c->bn >= 16 && c->bn <= 128 &&
           (c->mt == 1 || c->mt == 2) && c->bm % (16 * c->mt) == 0 && (c->qs == 0 || c->qs == 1);
}
