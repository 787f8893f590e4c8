#include "layer/rope.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

stof_status rope_check(stof_ctx *ctx, const rope_params *p, int head_dim)
{
    if (!p)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "the RoPE settings are NULL");
    if (head_dim < 2 || head_dim % 2 || head_dim > ROPE_MAX_HEAD_DIM)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.head_dim must be even and within 2..%d for RoPE (got %d)",
                        ROPE_MAX_HEAD_DIM, head_dim);
    if (!(p->theta > 0.f) || isinf(p->theta))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.rope_theta must be finite and > 0 (got %g)", (double)p->theta);
    if (p->factor == 0.f)
        return STOF_OK;
    if (!(p->factor >= 1.f) || isinf(p->factor))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.rope_factor must be 0 (no scaling) or finite and >= 1 (got %g)",
                        (double)p->factor);
    if (!(p->low_freq_factor > 0.f) || isinf(p->low_freq_factor))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.rope_low_freq_factor must be finite and > 0 (got %g)",
                        (double)p->low_freq_factor);
    if (!(p->high_freq_factor > p->low_freq_factor) || isinf(p->high_freq_factor))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.rope_high_freq_factor must be finite and above "
                        "desc.rope_low_freq_factor %g (got %g)",
                        (double)p->low_freq_factor, (double)p->high_freq_factor);
    if (p->original_max_positions <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.rope_original_max_positions must be positive (got %d)",
                        p->original_max_positions);
    return STOF_OK;
}

void rope_inv_freq(const rope_params *p, int head_dim, float *inv_freq)
{
    const double two_pi = 6.283185307179586476925;
    const double old_len = p->original_max_positions;
    /* Wavelengths beyond low_wl are stretched by the factor, those below
     * high_wl kept, and those between blended by how many of them fit the
     * original context. */
    const double low_wl = old_len / p->low_freq_factor, high_wl = old_len / p->high_freq_factor;
    for (int i = 0; i < head_dim / 2; i++) {
        double f = 1.0 / pow((double)p->theta, (double)(2 * i) / head_dim);
        if (p->factor != 0.f) {
            const double wl = two_pi / f;
            if (wl > low_wl) {
                f /= p->factor;
            } else if (wl >= high_wl) {
                const double s = (old_len / wl - p->low_freq_factor) /
                                 ((double)p->high_freq_factor - p->low_freq_factor);
                f = (1 - s) * f / p->factor + s * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

stof_status rope_check_shape(stof_ctx *ctx, const rope_shape *s)
{
    if (!s)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "the RoPE shape is NULL");
    if (s->heads <= 0 || s->kv_heads <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.heads and desc.kv_heads must be positive (got %d and %d)", s->heads,
                        s->kv_heads);
    if (s->head_dim < 2 || s->head_dim % 2 || s->head_dim > ROPE_MAX_HEAD_DIM)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.head_dim must be even and within 2..%d for RoPE (got %d)",
                        ROPE_MAX_HEAD_DIM, s->head_dim);
    if (s->dtype != STOF_F16 && s->dtype != STOF_BF16)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.dtype must be STOF_F16 or STOF_BF16");
    return STOF_OK;
}

/* The widest access (up to 16 bytes) that half a head and the alignment allow. */
static int vec_of(const rope_shape *s, int align_bytes)
{
    int vec = 8;
    while (vec > 1 && ((s->head_dim / 2) % vec || vec * 2 > align_bytes))
        vec /= 2;
    return vec;
}

void rope_make_request(const rope_shape *s, int align_bytes, rope_request *r)
{
    const int nums[4] = {s->head_dim, s->heads + s->kv_heads,
                         (s->heads + 2 * s->kv_heads) * s->head_dim, vec_of(s, align_bytes)};
    static const char *const names[4] = {"HEAD_DIM", "ROT_HEADS", "ROW", "VEC"};
    for (int i = 0; i < 4; i++) {
        snprintf(r->text[i], sizeof r->text[i], "%d", nums[i]);
        r->vars[i] = (render_var){names[i], r->text[i]};
    }
    const int bf = s->dtype == STOF_BF16;
    r->vars[4] = (render_var){"ELEM", bf ? "stof_bf16" : "stof_f16"};
    r->vars[5] = (render_var){"LOAD", bf ? "stof_bf16_to_f32" : "stof_f16_to_f32"};
    r->vars[6] = (render_var){"STORE", bf ? "stof_f32_to_bf16" : "stof_f32_to_f16"};
    r->req = (jit_request){"rope", "rope.cu", "stof_rope", r->vars, 7, NULL};
}

stof_status rope_prepare(stof_ctx *ctx, const rope_shape *s, int align_bytes, char *key)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(rope_check_shape(ctx, s));
    rope_request r;
    rope_make_request(s, align_bytes, &r);
    return jit_prepare(ctx, &r.req, key, NULL);
}

stof_status rope_load(stof_ctx *ctx, const rope_shape *s, int align_bytes, rope_kernel *k)
{
    rope_request r;
    rope_make_request(s, align_bytes, &r);
    k->chunks = (s->heads + s->kv_heads) * (s->head_dim / 2 / vec_of(s, align_bytes));
    return jit_get(ctx, &r.req, &k->fn, NULL, NULL);
}

stof_status rope_launch(stof_ctx *ctx, const rope_kernel *k, void *qkv, long long rows, int seq,
                        int offset, const int *positions, const float *inv_freq, CUstream stream)
{
    void *args[] = {&qkv, &rows, &seq, &offset, &positions, &inv_freq};
    /* Enough CTAs to fill the device a few times over; the loop strides. */
    long long want = (rows * k->chunks + 255) / 256, cap = (long long)ctx->dev.sm_count * 16;
    unsigned grid = (unsigned)(want < cap ? want : cap > 0 ? cap : 1);
    TRY(jit_push(ctx));
    stof_status st = jit_launch(ctx, k->fn, grid ? grid : 1, 1, 1, 256, 0, stream, args);
    jit_pop(ctx);
    return st;
}

stof_status rope_run(stof_ctx *ctx, const rope_shape *s, void *qkv, int batch, int seq,
                     int offset, const int *positions, const float *inv_freq,
                     stof_stream stream)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(rope_check_shape(ctx, s));
    if (batch <= 0 || seq <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "batch and seq must be positive (got %d and %d)", batch, seq);
    if (offset < 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "the position offset must be >= 0 (got %d)",
                        offset);
    if (!qkv || (uintptr_t)qkv % 2)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "argument 'qkv' (%p) is NULL or not aligned to its 2-byte elements", qkv);
    if (!inv_freq || (uintptr_t)inv_freq % 4)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "argument 'inv_freq' (%p) is NULL or not aligned to 4 bytes",
                        (const void *)inv_freq);
    if ((uintptr_t)positions % 4)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "argument 'positions' (%p) is not aligned to 4",
                        (const void *)positions);
    TRY(ctx_need_device(ctx));
    int align = 16;
    while (align > 2 && (uintptr_t)qkv % (uintptr_t)align)
        align /= 2;
    rope_kernel k;
    TRY(rope_load(ctx, s, align, &k));
    return rope_launch(ctx, &k, qkv, (long long)batch * seq, seq, offset, positions, inv_freq,
                       (CUstream)stream);
}
