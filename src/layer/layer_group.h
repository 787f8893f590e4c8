/*
 * layer_group — a layer's fused operator groups and running one: what a
 * group computes (a GEMM and its epilogue), the encoder's four (QKV; out
 * projection + residual + LayerNorm; FFN1 + activation; FFN2 + residual +
 * LayerNorm; attention runs between the first two), the fusion schemes a
 * group can run, and a chosen scheme loaded (group_load) and launched on
 * device buffers (group_run), with the pass (LayerNorm, bias and
 * activation, SwiGLU) a scheme runs after its GEMM. It knows nothing of
 * searching or plans.
 */
#ifndef STOF_LAYER_GROUP_H
#define STOF_LAYER_GROUP_H

#include "gpu/blas.h"
#include "layer/bias_act.h"
#include "layer/gemm.h"
#include "layer/layernorm.h"
#include "layer/swiglu.h"

/* The encoder's groups, in the order a layer runs them (attention sits
 * between the first two). */
enum { LG_QKV, LG_OUT, LG_FFN1, LG_FFN2, LG_COUNT };
/* The most groups a layer kind may have (records and searches are sized by it). */
#define LAYER_MAX_GROUPS 8

typedef enum layer_scheme {
    LS_BLAS = 0,   /* cublasGemmEx, then a generated kernel for the whole epilogue */
    LS_LT,         /* cuBLASLt with its bias (+ReLU/GELU-tanh) epilogue and the residual
                      as C, then a generated kernel for what remains (LayerNorm, erf GELU) */
    LS_GEN,        /* the generated GEMM with bias, activation and residual fused,
                      then the generated LayerNorm where the group has one */
    LS_GEN_LN,     /* the generated GEMM with everything fused, LayerNorm included
                      (a CTA owns whole rows) */
    LS_GEN_SWIGLU, /* the generated GEMM with SwiGLU in its epilogue (a SwiGLU group);
                      the others write the product and run the SwiGLU pass */
    LS_COUNT
} layer_scheme;

/* What a group computes: out = epi(x w' ...) on an m x k input. A SwiGLU
 * group (epi.act GEMM_ACT_SWIGLU, the decoder's gate/up) has n interleaved
 * product columns (gemm.h) and out [m, n / 2], no residual, no LayerNorm
 * and, under cuBLAS alone (LS_BLAS), no bias. */
typedef struct layer_group {
    int m, n, k;
    stof_dtype dtype;
    gemm_epilogue epi;
    float eps;
} layer_group;

/* One candidate: a scheme and its parameters (algo: cuBLASLt's heuristic
 * choice number; cfg: the generated GEMM's tiles). */
typedef struct layer_choice {
    layer_scheme scheme;
    int algo;
    gemm_config cfg;
} layer_choice;

const char *layer_scheme_name(layer_scheme s);   /* "cublas+gen" ... "gen-swiglu" */
const char *layer_group_name(int g);             /* "qkv", "out", "ffn1", "ffn2" */
/* The encoder's group names, by LG_ index (records and messages name groups so). */
extern const char *const group_encoder_names[LG_COUNT];

/* The FFN's inner width of desc d (ffn_hidden, or 4 x hidden when 0). */
int group_ffn_width(const stof_layer_desc *d);
/* The encoder's groups of the layer desc describes (desc checked). */
void layer_groups(const stof_layer_desc *d, layer_group g[LG_COUNT]);

/* The product of g, and the generated GEMM's epilogue under scheme s. */
gemm_shape group_gemm_shape(const layer_group *g);
gemm_epilogue group_gen_epilogue(const layer_group *g, layer_scheme s);
/* Whether LS_LT leaves an elementwise kernel behind (the erf GELU). */
int group_lt_needs_act(const layer_group *g);
/* The cuBLASLt product of g's scheme LS_LT, for blas_lt_make. */
blas_gemm group_lt_gemm(const layer_group *g);

/* The kernel a scheme runs beside its GEMM: a LayerNorm (ln), a bias and
 * activation pass (ba), the SwiGLU pass over the product's pairs (swiglu),
 * or none, with what that pass adds itself. */
typedef struct group_aux {
    int ln, ba;
    int bias, residual;
    int swiglu;
} group_aux;
group_aux group_aux_of(const layer_group *g, layer_scheme s);

/* A group's choice, loaded. */
typedef struct group_exec {
    layer_group g;
    layer_choice c;
    blas_lt_op lt;
    CUfunction gemm_fn;
    ln_kernel ln;
    ba_kernel ba;
    swiglu_kernel sw;
    int has_ln, has_ba, has_swiglu;
} group_exec;

/* Device buffers of one group run. */
typedef struct group_io {
    CUdeviceptr x, w, bias, residual, gamma, beta, out, sum_out, tmp, blas_ws;
} group_io;

stof_status group_load(stof_ctx *ctx, const layer_group *g, const layer_choice *c, group_exec *e);
stof_status group_run(stof_ctx *ctx, const group_exec *e, const group_io *io, CUstream s);
void group_free(stof_ctx *ctx, group_exec *e);   /* zeroes e; a zeroed e is a no-op */
/* A layer's n groups: g[i] loaded with choice c[i] into ex[i], and the
 * libraries' workspace (BLAS_WORKSPACE_BYTES) into *blas_ws, unless it is
 * there already, where a group runs cuBLAS or cuBLASLt; on a failure the
 * groups loaded stay loaded (group_free_all frees them). */
stof_status group_load_all(stof_ctx *ctx, const layer_group *g, const layer_choice *c, int n,
                           group_exec *ex, CUdeviceptr *blas_ws);
void group_free_all(stof_ctx *ctx, group_exec *ex, int n);

#endif
