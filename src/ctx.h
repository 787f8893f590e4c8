/*
 * ctx — the context behind stof_ctx: options, the device it drives, the cache
 * it uses, its counters, the modules it has loaded, and its error buffer.
 * ctx_fail() is how every module reports a failure: it writes the sentence
 * (with the file and line it came from) and returns the status.
 */
#ifndef STOF_CTX_H
#define STOF_CTX_H

#include "stof.h"
#include "gpu/drv.h"
#include "attn/model.h"

struct cache;
struct jit_module;
struct blas_state;

struct stof_ctx {
    stof_options opt;
    char err[2048];
    drv_device dev;              /* dev.ok == 0 where there is no GPU */
    char arch[32];               /* what kernels are compiled for */
    struct cache *cache;         /* NULL when running uncached */
    char cache_path[1024];
    char cache_note[2100];       /* why the cache is off, if it is */
    stof_stats stats;
    struct jit_module *modules;  /* loaded kernels, by cache key */
    model_device model;          /* the device's figures for the model ... */
    int model_known;             /* ... once read from the cache or measured */
    struct blas_state *blas;     /* cuBLAS and cuBLASLt, opened on first use */
};

stof_status ctx_fail(stof_ctx *ctx, stof_status st, const char *file, int line,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define CTX_FAIL(ctx, st, ...) ctx_fail((ctx), (st), __FILE__, __LINE__, __VA_ARGS__)

/* Checks a NULL argument of a public call. */
#define CTX_ARG(ctx, cond, name)                                                    \
    do {                                                                            \
        if (!(cond))                                                                \
            return CTX_FAIL((ctx), STOF_ERR_INVALID_ARG, "argument '%s' is invalid", \
                            (name));                                                \
    } while (0)

/* Evaluates a call returning stof_status and returns its failure. */
#define TRY(call)                       \
    do {                                \
        stof_status try_st_ = (call);   \
        if (try_st_ != STOF_OK)         \
            return try_st_;             \
    } while (0)

/* Fails with STOF_ERR_NO_DEVICE unless the context drives a GPU. */
stof_status ctx_need_device(stof_ctx *ctx);

int dtype_size(stof_dtype t);      /* 0 for an invalid dtype */
const char *dtype_name(stof_dtype t);

#endif
