#include "layer/swiglu.h"

#include <stdint.h>
#include <stdio.h>

/* The widest access (up to 16 bytes) that the row lengths and the
 * alignment allow. */
static int vec_of(int ffn, int in_stride, int align_bytes)
{
    int vec = 8;
    while (vec > 1 && (ffn % vec || in_stride % vec || vec * 2 > align_bytes))
        vec /= 2;
    return vec;
}

void swiglu_make_request(int ffn, int in_stride, int pairs, stof_dtype t, int align_bytes,
                         swiglu_request *r)
{
    const int nums[3] = {ffn, in_stride, vec_of(ffn, in_stride, align_bytes)};
    static const char *const names[3] = {"FFN", "IN_STRIDE", "VEC"};
    for (int i = 0; i < 3; i++) {
        snprintf(r->text[i], sizeof r->text[i], "%d", nums[i]);
        r->vars[i] = (render_var){names[i], r->text[i]};
    }
    const int bf = t == STOF_BF16;
    r->vars[3] = (render_var){"ELEM", bf ? "stof_bf16" : "stof_f16"};
    r->vars[4] = (render_var){"LOAD", bf ? "stof_bf16_to_f32" : "stof_f16_to_f32"};
    r->vars[5] = (render_var){"STORE", bf ? "stof_f32_to_bf16" : "stof_f32_to_f16"};
    r->vars[6] = (render_var){"PAIRS", pairs ? "1" : "0"};
    r->req = (jit_request){"swiglu", "swiglu.cu", "stof_swiglu", r->vars, 7, NULL};
}

stof_status swiglu_check(stof_ctx *ctx, int ffn, int in_stride, int pairs, stof_dtype t)
{
    if (ffn <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.ffn_hidden must be positive (got %d)",
                        ffn);
    if (in_stride != ffn && in_stride != 2 * ffn)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "the SwiGLU input rows must be ffn_hidden %d or twice it apart (got %d)",
                        ffn, in_stride);
    if (pairs && in_stride != 2 * ffn)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "the SwiGLU input pairs need rows of twice ffn_hidden %d (got %d)", ffn,
                        in_stride);
    if (t != STOF_F16 && t != STOF_BF16)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.dtype must be STOF_F16 or STOF_BF16");
    return STOF_OK;
}

stof_status swiglu_prepare(stof_ctx *ctx, int ffn, int in_stride, int pairs, stof_dtype t,
                           int align_bytes, char *key)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(swiglu_check(ctx, ffn, in_stride, pairs, t));
    swiglu_request r;
    swiglu_make_request(ffn, in_stride, pairs, t, align_bytes, &r);
    return jit_prepare(ctx, &r.req, key, NULL);
}

stof_status swiglu_load(stof_ctx *ctx, int ffn, int in_stride, int pairs, stof_dtype t,
                        int align_bytes, swiglu_kernel *k)
{
    swiglu_request r;
    swiglu_make_request(ffn, in_stride, pairs, t, align_bytes, &r);
    k->ffn = ffn;
    k->vec = vec_of(ffn, in_stride, align_bytes);
    return jit_get(ctx, &r.req, &k->fn, NULL, NULL);
}

stof_status swiglu_launch(stof_ctx *ctx, const swiglu_kernel *k, long long rows,
                          const void *gate, const void *up, void *out, CUstream stream)
{
    void *args[] = {&gate, &up, &out, &rows};
    /* Enough CTAs to fill the device a few times over; the loop strides. */
    long long want = (rows * (k->ffn / k->vec) + 255) / 256;
    long long cap = (long long)ctx->dev.sm_count * 16;
    unsigned grid = (unsigned)(want < cap ? want : cap > 0 ? cap : 1);
    TRY(jit_push(ctx));
    stof_status st = jit_launch(ctx, k->fn, grid ? grid : 1, 1, 1, 256, 0, stream, args);
    jit_pop(ctx);
    return st;
}

stof_status swiglu_run(stof_ctx *ctx, int ffn, stof_dtype t, long long rows, const void *gate,
                       const void *up, void *out, stof_stream stream)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    const int stride = up ? ffn : 2 * ffn;
    TRY(swiglu_check(ctx, ffn, stride, 0, t));
    if (rows <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "rows must be positive (got %lld)", rows);
    const void *ptrs[3] = {gate, up, out};
    static const char *const names[3] = {"gate", "up", "out"};
    for (int i = 0; i < 3; i++)
        if ((!ptrs[i] && i != 1) || (uintptr_t)ptrs[i] % 2)
            return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                            "argument '%s' (%p) is NULL or not aligned to its 2-byte elements",
                            names[i], ptrs[i]);
    if (!up)
        up = (const char *)gate + (size_t)ffn * 2;
    TRY(ctx_need_device(ctx));
    const uintptr_t all = (uintptr_t)gate | (uintptr_t)up | (uintptr_t)out;
    int align = 16;
    while (align > 2 && all % (uintptr_t)align)
        align /= 2;
    swiglu_kernel k;
    TRY(swiglu_load(ctx, ffn, stride, 0, t, align, &k));
    return swiglu_launch(ctx, &k, rows, gate, up, out, (CUstream)stream);
}
