#include "gpu/blas.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cublas_api.h>

#include "gpu/jit.h"

/* The sonames of the toolkit stof was built with. */
#define STR_(x) #x
#define STR(x) STR_(x)
#define CUBLAS_SONAME "libcublas.so." STR(CUBLAS_VER_MAJOR)
#define CUBLASLT_SONAME "libcublasLt.so." STR(CUBLAS_VER_MAJOR)

typedef struct blas_api {
    cublasStatus_t (*Create)(cublasHandle_t *);
    cublasStatus_t (*Destroy)(cublasHandle_t);
    cublasStatus_t (*SetStream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*SetWorkspace)(cublasHandle_t, void *, size_t);
    cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                             const void *, const void *, cudaDataType, int, const void *,
                             cudaDataType, int, const void *, void *, cudaDataType, int,
                             cublasComputeType_t, cublasGemmAlgo_t);
    const char *(*StatusString)(cublasStatus_t);
    cublasStatus_t (*LtCreate)(cublasLtHandle_t *);
    cublasStatus_t (*LtDestroy)(cublasLtHandle_t);
    cublasStatus_t (*LtDescCreate)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t);
    cublasStatus_t (*LtDescDestroy)(cublasLtMatmulDesc_t);
    cublasStatus_t (*LtDescSet)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t,
                                const void *, size_t);
    cublasStatus_t (*LtLayoutCreate)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t,
                                     int64_t);
    cublasStatus_t (*LtLayoutDestroy)(cublasLtMatrixLayout_t);
    cublasStatus_t (*LtPrefCreate)(cublasLtMatmulPreference_t *);
    cublasStatus_t (*LtPrefDestroy)(cublasLtMatmulPreference_t);
    cublasStatus_t (*LtPrefSet)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                const void *, size_t);
    cublasStatus_t (*LtHeuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                  cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                  cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                  cublasLtMatmulHeuristicResult_t *, int *);
    cublasStatus_t (*LtMatmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                               cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t,
                               const void *, const void *, cublasLtMatrixLayout_t, void *,
                               cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *,
                               size_t, cudaStream_t);
} blas_api;

struct blas_state {
    void *lib, *lt_lib;
    blas_api api;
    cublasHandle_t h;
    cublasLtHandle_t lt;
    int ok;
    char why[512];
};

static const struct { int lt; const char *name; size_t off; } SYMS[] = {
#define S(lt, field, sym) {lt, sym, offsetof(blas_api, field)}
    S(0, Create, "cublasCreate_v2"),
    S(0, Destroy, "cublasDestroy_v2"),
    S(0, SetStream, "cublasSetStream_v2"),
    S(0, SetWorkspace, "cublasSetWorkspace_v2"),
    S(0, GemmEx, "cublasGemmEx"),
    S(0, StatusString, "cublasGetStatusString"),
    S(1, LtCreate, "cublasLtCreate"),
    S(1, LtDestroy, "cublasLtDestroy"),
    S(1, LtDescCreate, "cublasLtMatmulDescCreate"),
    S(1, LtDescDestroy, "cublasLtMatmulDescDestroy"),
    S(1, LtDescSet, "cublasLtMatmulDescSetAttribute"),
    S(1, LtLayoutCreate, "cublasLtMatrixLayoutCreate"),
    S(1, LtLayoutDestroy, "cublasLtMatrixLayoutDestroy"),
    S(1, LtPrefCreate, "cublasLtMatmulPreferenceCreate"),
    S(1, LtPrefDestroy, "cublasLtMatmulPreferenceDestroy"),
    S(1, LtPrefSet, "cublasLtMatmulPreferenceSetAttribute"),
    S(1, LtHeuristic, "cublasLtMatmulAlgoGetHeuristic"),
    S(1, LtMatmul, "cublasLtMatmul"),
#undef S
};

static void open_libs(stof_ctx *ctx, struct blas_state *b)
{
    if (!ctx->dev.ok) {
        snprintf(b->why, sizeof b->why, "no GPU: %.480s", ctx->dev.why);
        return;
    }
    b->lib = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    b->lt_lib = b->lib ? dlopen(CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!b->lib || !b->lt_lib) {
        snprintf(b->why, sizeof b->why, "cannot open %s: %s",
                 b->lib ? CUBLASLT_SONAME : CUBLAS_SONAME, dlerror());
        return;
    }
    for (size_t i = 0; i < sizeof SYMS / sizeof SYMS[0]; i++) {
        void *f = dlsym(SYMS[i].lt ? b->lt_lib : b->lib, SYMS[i].name);
        if (!f) {
            snprintf(b->why, sizeof b->why, "%s lacks %s",
                     SYMS[i].lt ? CUBLASLT_SONAME : CUBLAS_SONAME, SYMS[i].name);
            return;
        }
        memcpy((char *)&b->api + SYMS[i].off, &f, sizeof f);
    }
    /* The handles bind to the current context: the device's primary one. */
    if (jit_push(ctx) != STOF_OK) {
        snprintf(b->why, sizeof b->why, "cannot make the device current: %.460s", ctx->err.msg);
        return;
    }
    cublasStatus_t r = b->api.Create(&b->h);
    if (r == CUBLAS_STATUS_SUCCESS) {
        r = b->api.LtCreate(&b->lt);
        if (r != CUBLAS_STATUS_SUCCESS) {
            b->api.Destroy(b->h);
            b->h = NULL;
        }
    }
    jit_pop(ctx);
    if (r != CUBLAS_STATUS_SUCCESS) {
        snprintf(b->why, sizeof b->why, "cuBLAS handle creation failed: %s",
                 b->api.StatusString(r));
        return;
    }
    b->ok = 1;
}

int blas_available(stof_ctx *ctx, const char **why)
{
    if (!ctx->blas) {
        ctx->blas = calloc(1, sizeof *ctx->blas);
        if (!ctx->blas) {
            if (why)
                *why = "out of memory";
            return 0;
        }
        open_libs(ctx, ctx->blas);
    }
    if (why)
        *why = ctx->blas->why;
    return ctx->blas->ok;
}

stof_status blas_need(stof_ctx *ctx)
{
    const char *why;
    if (!blas_available(ctx, &why))
        return CTX_FAIL(ctx, ctx->dev.ok ? STOF_ERR_UNSUPPORTED : STOF_ERR_NO_DEVICE,
                        "cuBLAS is not usable: %s", why);
    return STOF_OK;
}

static stof_status check(stof_ctx *ctx, cublasStatus_t r, const char *call, const char *file,
                         int line)
{
    if (r == CUBLAS_STATUS_SUCCESS)
        return STOF_OK;
    return err_fail(&ctx->err,
                    r == CUBLAS_STATUS_NOT_SUPPORTED ? STOF_ERR_UNSUPPORTED : STOF_ERR_CUDA, file,
                    line, "%s failed: %s", call, ctx->blas->api.StatusString(r));
}
#define BL(ctx, call) check((ctx), (ctx)->blas->api.call, #call, __FILE__, __LINE__)

static cudaDataType data_type(stof_dtype t) { return t == STOF_BF16 ? CUDA_R_16BF : CUDA_R_16F; }

/* Row-major y[m,n] = x[m,k] w[n,k]' is column-major y'[n,m] = w'' x': the
 * column-major w' (k x n) transposed, times the column-major x' (k x m). */
stof_status blas_gemm_run(stof_ctx *ctx, const blas_gemm *g, CUstream stream)
{
    TRY(blas_need(ctx));
    const float one = 1.f, zero = 0.f;
    const cudaDataType t = data_type(g->dtype);
    TRY(jit_push(ctx));
    stof_status st = BL(ctx, SetStream(ctx->blas->h, (cudaStream_t)stream));
    if (st == STOF_OK)
        st = BL(ctx, SetWorkspace(ctx->blas->h, g->workspace, BLAS_WORKSPACE_BYTES));
    if (st == STOF_OK)
        st = BL(ctx, GemmEx(ctx->blas->h, CUBLAS_OP_T, CUBLAS_OP_N, g->n, g->m, g->k, &one, g->w,
                            t, g->k, g->x, t, g->k, &zero, g->y, t, g->n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
    jit_pop(ctx);
    return st;
}

void blas_lt_free(stof_ctx *ctx, blas_lt_op *op)
{
    if (!op || !ctx->blas || !ctx->blas->ok)
        return;
    const blas_api *a = &ctx->blas->api;
    if (op->desc) a->LtDescDestroy(op->desc);
    if (op->ab) a->LtLayoutDestroy(op->ab);
    if (op->w) a->LtLayoutDestroy(op->w);
    if (op->y) a->LtLayoutDestroy(op->y);
    memset(op, 0, sizeof *op);
}

stof_status blas_lt_make(stof_ctx *ctx, const blas_gemm *g, int algo, blas_lt_op *op, int *count)
{
    memset(op, 0, sizeof *op);
    if (count)
        *count = 0;
    TRY(blas_need(ctx));
    const blas_api *a = &ctx->blas->api;
    const cudaDataType t = data_type(g->dtype);
    const cublasOperation_t tr = CUBLAS_OP_T;
    static const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                                              CUBLASLT_EPILOGUE_GELU_BIAS,
                                              CUBLASLT_EPILOGUE_RELU_BIAS};
    const cublasLtEpilogue_t epi = epis[g->epi];
    const uint64_t ws = BLAS_WORKSPACE_BYTES;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[BLAS_MAX_ALGOS];
    int n = 0;
    op->has_residual = g->residual != NULL;

    stof_status st = BL(ctx, LtDescCreate((cublasLtMatmulDesc_t *)&op->desc, CUBLAS_COMPUTE_32F,
                                          CUDA_R_32F));
    if (st == STOF_OK)
        st = BL(ctx, LtDescSet(op->desc, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
    if (st == STOF_OK)
        st = BL(ctx, LtDescSet(op->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    /* Column-major views: w' is k x n (transposed by TRANSA), x' k x m, y' n x m. */
    if (st == STOF_OK)
        st = BL(ctx, LtLayoutCreate((cublasLtMatrixLayout_t *)&op->w, t, g->k, g->n, g->k));
    if (st == STOF_OK)
        st = BL(ctx, LtLayoutCreate((cublasLtMatrixLayout_t *)&op->ab, t, g->k, g->m, g->k));
    if (st == STOF_OK)
        st = BL(ctx, LtLayoutCreate((cublasLtMatrixLayout_t *)&op->y, t, g->n, g->m, g->n));
    if (st == STOF_OK)
        st = BL(ctx, LtPrefCreate(&pref));
    if (st == STOF_OK)
        st = BL(ctx, LtPrefSet(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    if (st == STOF_OK)
        st = BL(ctx, LtHeuristic(ctx->blas->lt, op->desc, op->w, op->ab, op->y, op->y, pref,
                                 BLAS_MAX_ALGOS, res, &n));
    if (pref)
        a->LtPrefDestroy(pref);
    if (st == STOF_OK && count)
        *count = n;
    if (st == STOF_OK && (algo < 0 || algo >= n))
        st = CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                      "cuBLASLt offers %d algorithm%s for %dx%dx%d, not number %d", n,
                      n == 1 ? "" : "s", g->m, g->n, g->k, algo);
    if (st == STOF_OK)
        memcpy(op->algo, &res[algo].algo, sizeof op->algo);
    if (st != STOF_OK)
        blas_lt_free(ctx, op);
    return st;
}

stof_status blas_lt_run(stof_ctx *ctx, const blas_lt_op *op, const blas_gemm *g, CUstream stream)
{
    TRY(blas_need(ctx));
    const float one = 1.f, zero = 0.f;
    stof_status st = STOF_OK;
    if (g->epi != BLAS_EPI_NONE)
        st = BL(ctx, LtDescSet(op->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                               sizeof g->bias));
    if (st != STOF_OK)
        return st;
    TRY(jit_push(ctx));
    const void *c = op->has_residual ? g->residual : g->y;
    st = BL(ctx, LtMatmul(ctx->blas->lt, op->desc, &one, g->w, op->w, g->x, op->ab,
                          op->has_residual ? &one : &zero, c, op->y, g->y, op->y,
                          (const cublasLtMatmulAlgo_t *)op->algo, g->workspace,
                          BLAS_WORKSPACE_BYTES, (cudaStream_t)stream));
    jit_pop(ctx);
    return st;
}

void blas_close(stof_ctx *ctx)
{
    struct blas_state *b = ctx->blas;
    if (!b)
        return;
    if (b->ok && jit_push(ctx) == STOF_OK) {
        b->api.LtDestroy(b->lt);
        b->api.Destroy(b->h);
        jit_pop(ctx);
    }
    /* The libraries stay loaded: cuBLAS keeps process-wide state. */
    free(b);
    ctx->blas = NULL;
}
