#include "layer/bias_act.h"

#include <stdio.h>

static void make_request(int cols, stof_dtype t, gemm_act act, int has_bias, int has_res,
                         ba_request *r, int *vec)
{
    static const char *const acts[] = {"stof_identity", "stof_gelu", "stof_gelu_tanh",
                                       "stof_relu"};
    *vec = 8;
    while (*vec > 1 && cols % *vec)
        *vec /= 2;
    snprintf(r->text[0], sizeof r->text[0], "%d", cols);
    snprintf(r->text[1], sizeof r->text[1], "%d", *vec);
    const int bf = t == STOF_BF16;
    r->vars[0] = (render_var){"COLS", r->text[0]};
    r->vars[1] = (render_var){"VEC", r->text[1]};
    r->vars[2] = (render_var){"ELEM", bf ? "stof_bf16" : "stof_f16"};
    r->vars[3] = (render_var){"LOAD", bf ? "stof_bf16_to_f32" : "stof_f16_to_f32"};
    r->vars[4] = (render_var){"STORE", bf ? "stof_f32_to_bf16" : "stof_f32_to_f16"};
    r->vars[5] = (render_var){"ACT", acts[act]};
    r->vars[6] = (render_var){"HAS_BIAS", has_bias ? "1" : "0"};
    r->vars[7] = (render_var){"HAS_RESIDUAL", has_res ? "1" : "0"};
    r->req = (jit_request){"bias_act", "bias_act.cu", "stof_bias_act", r->vars, 8, NULL};
}

stof_status ba_load(stof_ctx *ctx, int cols, stof_dtype t, gemm_act act, int has_bias,
                    int has_residual, ba_kernel *k)
{
    ba_request r;
    make_request(cols, t, act, has_bias, has_residual, &r, &k->vec);
    k->cols = cols;
    return jit_get(ctx, &r.req, &k->fn, NULL, NULL);
}

void ba_make_request(int cols, stof_dtype t, gemm_act act, int has_bias, int has_residual,
                     ba_request *r)
{
    int vec;
    make_request(cols, t, act, has_bias, has_residual, r, &vec);
}

stof_status ba_prepare(stof_ctx *ctx, int cols, stof_dtype t, gemm_act act, int has_bias,
                       int has_residual)
{
    ba_request r;
    ba_make_request(cols, t, act, has_bias, has_residual, &r);
    return jit_prepare(ctx, &r.req, NULL, NULL);
}

stof_status ba_launch(stof_ctx *ctx, const ba_kernel *k, long long rows, const void *x,
                      const void *bias, const void *residual, void *out, CUstream stream)
{
    void *args[] = {&x, &bias, &residual, &out, &rows};
    /* Enough CTAs to fill the device a few times over; the loop strides. */
    long long vecs = rows * (k->cols / k->vec);
    long long want = (vecs + 255) / 256, cap = (long long)ctx->dev.sm_count * 16;
    unsigned grid = (unsigned)(want < cap ? want : cap > 0 ? cap : 1);
    TRY(jit_push(ctx));
    stof_status st = jit_launch(ctx, k->fn, grid ? grid : 1, 1, 1, 256, 0, stream, args);
    jit_pop(ctx);
    return st;
}
