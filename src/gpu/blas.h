/*
 * blas — the one door to cuBLAS and cuBLASLt. Both libraries are opened with
 * dlopen on first use, so stof links and runs where they are absent (the
 * generated GEMM then stands alone). Products are row-major in the
 * nn.Linear convention: y[m, n] = sum_k x[m, k] * w[n, k], fp32 accumulation.
 */
#ifndef STOF_BLAS_H
#define STOF_BLAS_H

#include <cuda.h>

#include "gpu/jit.h"

/* The epilogues of cuBLASLt that the layer uses; GELU is its tanh form. */
typedef enum blas_epilogue {
    BLAS_EPI_NONE = 0,
    BLAS_EPI_BIAS,
    BLAS_EPI_GELU_TANH_BIAS,
    BLAS_EPI_RELU_BIAS
} blas_epilogue;

/* Most algorithms cuBLASLt's heuristic is asked for. */
#define BLAS_MAX_ALGOS 6
/* Workspace each call may use, in bytes (cuBLAS and cuBLASLt alike). */
#define BLAS_WORKSPACE_BYTES (32u << 20)

typedef struct blas_gemm {
    int m, n, k;
    stof_dtype dtype;           /* of x, w, bias, residual and y */
    const void *x, *w;          /* [m, k], [n, k] */
    const void *bias;           /* [n] or NULL; cuBLASLt only */
    const void *residual;       /* [m, n] or NULL, added; cuBLASLt only */
    void *y;                    /* [m, n]; may alias residual */
    blas_epilogue epi;          /* cuBLASLt only */
    void *workspace;            /* BLAS_WORKSPACE_BYTES of device memory */
} blas_gemm;

/* Whether cuBLAS and cuBLASLt could be opened on ctx's device; *why (may be
 * NULL) says why not. Opens the handles on the first call. */
int blas_available(stof_ctx *ctx, const char **why);

/* STOF_OK where cuBLAS and cuBLASLt are open and their handles made (on
 * first use), else fails with the reason. */
stof_status blas_need(stof_ctx *ctx);

/* y = x w' with cublasGemmEx (no bias, residual or epilogue). */
stof_status blas_gemm_run(stof_ctx *ctx, const blas_gemm *g, CUstream stream);

/* A cuBLASLt product made once for a shape, an epilogue and whether a
 * residual is added: its descriptors and the algorithm chosen. */
typedef struct blas_lt_op {
    void *desc, *ab, *w, *y;    /* matmul descriptor and layouts */
    unsigned char algo[64];     /* cublasLtMatmulAlgo_t */
    int has_residual;
} blas_lt_op;

/* Makes op for g's shape, dtype, epilogue and residual (pointers unused),
 * with algorithm number `algo` of the heuristic's list (best first);
 * *count (may be NULL) gets that list's length. Fails with
 * STOF_ERR_UNSUPPORTED when algo is past the list. */
stof_status blas_lt_make(stof_ctx *ctx, const blas_gemm *g, int algo, blas_lt_op *op, int *count);
/* y = epi(x w' + residual + bias) on stream; g's shape must be op's. */
stof_status blas_lt_run(stof_ctx *ctx, const blas_lt_op *op, const blas_gemm *g, CUstream stream);
void blas_lt_free(stof_ctx *ctx, blas_lt_op *op);

/* Closes the handles (at stof_close). */
void blas_close(stof_ctx *ctx);

#endif
