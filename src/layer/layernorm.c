#include "layer/layernorm.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu/jit.h"

ln_config ln_choose(int hidden, stof_dtype dtype, int align_bytes)
{
    ln_config c;
    const int es = dtype_size(dtype);
    /* Widest access up to 16 bytes that the row length and pointers allow. */
    c.vec = 16 / es;
    while (c.vec > 1 && (hidden % c.vec != 0 || c.vec * es > align_bytes))
        c.vec /= 2;
    /* About 32 values per thread keeps the row in registers without spills
     * and leaves several 16-byte loads in flight per thread. */
    const int vecs = hidden / c.vec;
    int want = (hidden + 31) / 32;
    c.threads_per_row = 1;
    while (c.threads_per_row < want && c.threads_per_row < 1024)
        c.threads_per_row *= 2;
    while (c.threads_per_row > vecs && c.threads_per_row > 1)
        c.threads_per_row /= 2;
    c.rows_per_cta = c.threads_per_row >= 128 ? 1 : 128 / c.threads_per_row;
    c.items = (vecs + c.threads_per_row - 1) / c.threads_per_row;
    return c;
}

static stof_status check_ptr(stof_ctx *ctx, const void *p, const char *name, int es, int optional)
{
    if (!p && !optional)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "argument '%s' is NULL", name);
    if (p && (uintptr_t)p % (uintptr_t)es != 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "argument '%s' (%p) is not aligned to its %d-byte elements", name, p, es);
    return STOF_OK;
}

static stof_status check(stof_ctx *ctx, const stof_ln_desc *d)
{
    if (!d)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "argument 'desc' is NULL");
    if (d->rows <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.rows must be positive (got %d)", d->rows);
    if (d->hidden <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.hidden must be positive (got %d)",
                        d->hidden);
    if (d->hidden > LN_MAX_HIDDEN)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.hidden %d is above the supported %d",
                        d->hidden, LN_MAX_HIDDEN);
    if (!dtype_size(d->dtype))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.dtype %d is not a stof_dtype", (int)d->dtype);
    if (!(d->eps >= 0.f) || isinf(d->eps))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.eps must be finite and >= 0");
    return STOF_OK;
}

static const char *conv(stof_dtype t, int load)
{
    switch (t) {
    case STOF_F32: return "stof_f32_to_f32";
    case STOF_F16: return load ? "stof_f16_to_f32" : "stof_f32_to_f16";
    default: return load ? "stof_bf16_to_f32" : "stof_f32_to_bf16";
    }
}

static const char *elem(stof_dtype t)
{
    return t == STOF_F32 ? "float" : t == STOF_F16 ? "stof_f16" : "stof_bf16";
}

static void make_request(const stof_ln_desc *d, const ln_config *c, int has_bias, int has_res,
                         int write_sum, int rms, ln_request *r)
{
    const int nums[5] = {d->hidden, c->vec, c->threads_per_row, c->rows_per_cta, c->items};
    static const char *const names[5] = {"HIDDEN", "VEC", "THREADS_PER_ROW", "ROWS_PER_CTA", "ITEMS"};
    for (int i = 0; i < 5; i++) {
        snprintf(r->text[i], sizeof r->text[i], "%d", nums[i]);
        r->vars[i] = (render_var){names[i], r->text[i]};
    }
    r->vars[5] = (render_var){"ELEM", elem(d->dtype)};
    r->vars[6] = (render_var){"LOAD", conv(d->dtype, 1)};
    r->vars[7] = (render_var){"STORE", conv(d->dtype, 0)};
    r->vars[8] = (render_var){"HAS_BIAS", has_bias ? "1" : "0"};
    r->vars[9] = (render_var){"HAS_RESIDUAL", has_res ? "1" : "0"};
    r->vars[10] = (render_var){"WRITE_SUM", write_sum ? "1" : "0"};
    /* Last, so that the recorded parameters of LayerNorm kernels start as
     * they did before RMSNorm joined. */
    r->vars[11] = (render_var){"RMS", rms ? "1" : "0"};
    r->req = (jit_request){"layernorm", "layernorm.cu", "stof_layernorm", r->vars, 12, NULL};
}

void ln_make_request(const stof_ln_desc *desc, int align_bytes, int has_bias, int has_residual,
                     int write_sum, ln_request *r)
{
    ln_config c = ln_choose(desc->hidden, desc->dtype, align_bytes);
    make_request(desc, &c, has_bias, has_residual, write_sum, 0, r);
}

void ln_rms_make_request(const stof_ln_desc *desc, int align_bytes, int has_residual,
                         int write_sum, ln_request *r)
{
    ln_config c = ln_choose(desc->hidden, desc->dtype, align_bytes);
    make_request(desc, &c, 0, has_residual, write_sum, 1, r);
}

static stof_status prepare(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes, int has_bias,
                           int has_residual, int write_sum, int rms, char *key)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(check(ctx, desc));
    ln_request r;
    ln_config c = ln_choose(desc->hidden, desc->dtype, align_bytes);
    make_request(desc, &c, has_bias, has_residual, write_sum, rms, &r);
    return jit_prepare(ctx, &r.req, key, NULL);
}

stof_status ln_prepare(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes, int has_bias,
                       int has_residual, int write_sum, char *key)
{
    return prepare(ctx, desc, align_bytes, has_bias, has_residual, write_sum, 0, key);
}

stof_status ln_rms_prepare(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes,
                           int has_residual, int write_sum, char *key)
{
    return prepare(ctx, desc, align_bytes, 0, has_residual, write_sum, 1, key);
}

stof_status stof_bias_residual_layernorm_prepare(stof_ctx *ctx, const stof_ln_desc *desc)
{
    /* Device allocations are 256-byte aligned: prepare for that case. */
    return ln_prepare(ctx, desc, 16, 1, 1, 0, NULL);
}

static stof_status load(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes, int has_bias,
                        int has_residual, int write_sum, int rms, ln_kernel *k)
{
    k->c = ln_choose(desc->hidden, desc->dtype, align_bytes);
    k->rows = desc->rows;
    k->eps = desc->eps > 0.f ? desc->eps : 1e-5f;
    ln_request r;
    make_request(desc, &k->c, has_bias, has_residual, write_sum, rms, &r);
    return jit_get(ctx, &r.req, &k->fn, NULL, NULL);
}

stof_status ln_load(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes, int has_bias,
                    int has_residual, int write_sum, ln_kernel *k)
{
    return load(ctx, desc, align_bytes, has_bias, has_residual, write_sum, 0, k);
}

stof_status ln_rms_load(stof_ctx *ctx, const stof_ln_desc *desc, int align_bytes,
                        int has_residual, int write_sum, ln_kernel *k)
{
    return load(ctx, desc, align_bytes, 0, has_residual, write_sum, 1, k);
}

stof_status ln_launch(stof_ctx *ctx, const ln_kernel *k, const void *x, const void *bias,
                      const void *residual, const void *gamma, const void *beta, void *out,
                      void *sum_out, CUstream stream)
{
    int rows = k->rows;
    float eps = k->eps;
    void *args[] = {&x, &bias, &residual, &gamma, &beta, &out, &rows, &eps, &sum_out};
    unsigned grid = (unsigned)((rows + k->c.rows_per_cta - 1) / k->c.rows_per_cta);
    TRY(jit_push(ctx));
    stof_status st =
        jit_launch(ctx, k->fn, grid, 1, 1, (unsigned)(k->c.threads_per_row * k->c.rows_per_cta), 0,
                   stream, args);
    jit_pop(ctx);
    return st;
}

/* ln_run and ln_rms_run: gamma is named `name_g` in messages; RMSNorm has
 * no bias and no beta. */
static stof_status run(stof_ctx *ctx, const stof_ln_desc *desc, const void *x, const void *bias,
                       const void *residual, const void *gamma, const void *beta, void *out,
                       void *sum_out, int rms, const char *name_g, stof_stream stream)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(check(ctx, desc));
    const int es = dtype_size(desc->dtype);
    TRY(check_ptr(ctx, x, "x", es, 0));
    TRY(check_ptr(ctx, bias, "bias", es, 1));
    TRY(check_ptr(ctx, residual, "residual", es, 1));
    TRY(check_ptr(ctx, gamma, name_g, es, 0));
    TRY(check_ptr(ctx, beta, "beta", es, rms));
    TRY(check_ptr(ctx, out, "out", es, 0));
    TRY(check_ptr(ctx, sum_out, "sum_out", es, 1));
    TRY(ctx_need_device(ctx));

    uintptr_t all = (uintptr_t)x | (uintptr_t)bias | (uintptr_t)residual | (uintptr_t)gamma |
                    (uintptr_t)beta | (uintptr_t)out | (uintptr_t)sum_out;
    int align = 16;
    while (align > es && all % (uintptr_t)align)
        align /= 2;
    ln_kernel k;
    TRY(load(ctx, desc, align, bias != NULL, residual != NULL, sum_out != NULL, rms, &k));
    return ln_launch(ctx, &k, x, bias, residual, gamma, beta, out, sum_out, (CUstream)stream);
}

stof_status ln_run(stof_ctx *ctx, const stof_ln_desc *desc, const void *x, const void *bias,
                   const void *residual, const void *gamma, const void *beta, void *out,
                   void *sum_out, stof_stream stream)
{
    return run(ctx, desc, x, bias, residual, gamma, beta, out, sum_out, 0, "gamma", stream);
}

stof_status ln_rms_run(stof_ctx *ctx, const stof_ln_desc *desc, const void *x,
                       const void *residual, const void *weight, void *out, void *sum_out,
                       stof_stream stream)
{
    return run(ctx, desc, x, NULL, residual, weight, NULL, out, sum_out, 1, "weight", stream);
}

stof_status stof_bias_residual_layernorm(stof_ctx *ctx, const stof_ln_desc *desc, const void *x,
                                         const void *bias, const void *residual,
                                         const void *gamma, const void *beta, void *out,
                                         stof_stream stream)
{
    return ln_run(ctx, desc, x, bias, residual, gamma, beta, out, NULL, stream);
}
