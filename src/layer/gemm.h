/*
 * gemm — the generated tensor-core GEMM of the encoder layer's projections,
 * out = epilogue(X · Wᵀ) (nn.Linear, row-major) with bias, activation,
 * residual and LayerNorm fused: its tile candidates, argument checks, kernel
 * requests, loading and launch. Three engines: mma.sync (templates/gemm.cu,
 * any epilogue) and, on sm_90a, warpgroup MMA fed by cp.async
 * (templates/gemm_wg.cu, every epilogue but LayerNorm) or by TMA
 * (templates/gemm_tma.cu, every epilogue but LayerNorm with ln_sum).
 * SwiGLU (GEMM_ACT_SWIGLU) runs on all three.
 */
#ifndef STOF_GEMM_H
#define STOF_GEMM_H

#include "gpu/jit.h"

/* GEMM_ACT_SWIGLU: the product's columns alternate gate_j, up_j (W's row
 * 2j is gate_proj's row j, 2j + 1 up_proj's), and out is [m, n / 2] with
 * out[r, j] = silu(gate) * up in fp32 (silu(x) = x sigmoid(x)), after the
 * bias (of the n interleaved columns); n a multiple of 16, no residual and
 * no LayerNorm. */
typedef enum gemm_act {
    GEMM_ACT_NONE = 0,
    GEMM_ACT_GELU,
    GEMM_ACT_GELU_TANH,
    GEMM_ACT_RELU,
    GEMM_ACT_SWIGLU,
} gemm_act;

typedef struct gemm_epilogue {
    int bias;            /* add bias[n] */
    gemm_act act;        /* after the bias */
    int residual;        /* add residual[m,n] after the activation */
    int ln;              /* LayerNorm over each row (needs bn >= n) */
    int ln_sum;          /* with ln: also store the pre-norm row to sum_out */
} gemm_epilogue;

/* The engine, gemm_config.wg: 0 mma.sync (wm x wn warps); 1 warpgroup MMA
 * on sm_90a (wm warpgroups of 64 rows, bm = 64 wm, wn = 1, bk = 64, K a
 * multiple of 64); GEMM_TMA, persistent warpgroup MMA on TMA-loaded
 * operands, sm_90a (a producer and two consumer warpgroups; wm 1: the
 * consumers take alternate bm x bn tiles, 2: they share each one; bm / wm
 * is 64 or 128, bk 64, wn 1; with ln, a cluster of n / bn CTAs, at most 8,
 * covers a row and bm 64 with wm 2 marks the layout in which the consumers
 * take 64-row blocks in turn, bm 64 with wn 2 (bn 384) the one in which
 * they share each block, bn / 2 columns each). */
#define GEMM_TMA 2
typedef struct gemm_config { int bm, bn, bk, wm, wn, stages, wg; } gemm_config;

typedef struct gemm_shape { int m, n, k; stof_dtype dtype; } gemm_shape;

/* At most this many candidates for any shape and epilogue. */
#define GEMM_MAX_CANDIDATES 16

/* Every config that fits (shared memory smem_max bytes per block, the
 * epilogue's needs: ln needs bn >= n, registers) best first by a simple
 * heuristic; returns how many written (<= cap). The first is the default.
 * wgmma nonzero (the arch is sm_90a): warpgroup-MMA configs first, where
 * the epilogue has no ln and K is a multiple of 64. */
int gemm_candidates(const gemm_shape *s, const gemm_epilogue *e, int smem_max, int wgmma,
                    gemm_config *out, int cap);
int gemm_smem_bytes(const gemm_config *c, const gemm_shape *s, const gemm_epilogue *e);
int gemm_threads(const gemm_config *c);

/* Checks the shape and epilogue (K % 8, N % 8, ln only with bn >= n; wg
 * configs only for sm_90a, without ln, with K % 64; SwiGLU with N % 16,
 * without residual or ln ...); a clear CTX_FAIL message on failure. c may
 * be NULL: the shape and epilogue only. */
stof_status gemm_check(stof_ctx *ctx, const gemm_shape *s, const gemm_epilogue *e,
                       const gemm_config *c);

/* Kernel request; strings live in *r (like mha_request / ln_request). */
typedef struct gemm_request {
    char text[12][16];
    render_var vars[24];
    jit_request req;
} gemm_request;
void gemm_make_request(const gemm_config *c, const gemm_shape *s, const gemm_epilogue *e,
                       gemm_request *r);

/* Device pointers; those the epilogue does not use may be NULL. All 16-byte
 * aligned. out must not overlap x, w, bias or residual. */
typedef struct gemm_args {
    const void *x, *w, *bias, *residual, *gamma, *beta;
    void *out, *sum_out;
    float eps;           /* LayerNorm's; <= 0 means 1e-5 */
    int swiglu;          /* fn's epilogue is GEMM_ACT_SWIGLU: out is [m, n / 2] */
} gemm_args;

/* Loads (jit_get) and returns the function, setting its dynamic smem
 * attribute; key (65 bytes, may be NULL) receives its cache key. */
stof_status gemm_load(stof_ctx *ctx, const gemm_config *c, const gemm_shape *s,
                      const gemm_epilogue *e, CUfunction *fn, char *key);

/* Launches fn on stream; makes the context current for the call. fn must
 * come from gemm_load with the same c and s, and a->swiglu say whether its
 * epilogue is SwiGLU (the TMA engine's output map and staging follow it).
 * The shared memory it needs is read back from the function (TMA's:
 * computed from c, s and a->swiglu). */
stof_status gemm_launch(stof_ctx *ctx, CUfunction fn, const gemm_config *c, const gemm_shape *s,
                        const gemm_args *a, CUstream stream);

/* Compiles without a GPU into the cache (jit_prepare); key as gemm_load's. */
stof_status gemm_prepare(stof_ctx *ctx, const gemm_config *c, const gemm_shape *s,
                         const gemm_epilogue *e, char *key);

/* The requests of those of the n kernels (config c[i] of shape s[i] with
 * epilogue e[i]) that gemm_check accepts and the device's shared memory
 * holds, into r (room for n); returns how many. */
int gemm_requests(stof_ctx *ctx, const gemm_config *c, const gemm_shape *s, const gemm_epilogue *e,
                  int n, gemm_request *r);

/* Compiles n kernels together (jit_prepare_all): config c[i] of shape s[i]
 * with epilogue e[i]; where ctx drives its GPU they are loaded too, so a
 * later gemm_load compiles nothing. A config that gemm_check refuses, or
 * that needs more shared memory than the device allows, is left to fail
 * where it is loaded. */
stof_status gemm_prepare_all(stof_ctx *ctx, const gemm_config *c, const gemm_shape *s,
                             const gemm_epilogue *e, int n);

/* "128x128x32 w2x4 s3", "wg 128x128x64 s4" */
void gemm_config_str(const gemm_config *c, char *buf, size_t n);

#endif
