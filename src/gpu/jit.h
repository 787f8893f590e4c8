/*
 * jit — the path from template to launchable kernel: render (with the
 * common prelude), key, look up in memory, then in the SQLite cache, else
 * claim the compile (processes sharing the cache compile a kernel once;
 * one that finds another's claim waits for its kernel), compile with NVRTC
 * and store; load with the driver. Also the driver
 * helpers every op uses to launch: context push/pop and checked calls, and
 * the record behind stof_ctx that jit and every floor above it read.
 */
#ifndef STOF_JIT_H
#define STOF_JIT_H

#include <stddef.h>

#include "base/err.h"
#include "codegen/render.h"
#include "gpu/drv.h"

struct cache;
struct jit_module;
struct blas_state;
struct model_device;

/* What a context holds (stof_ctx is opaque in stof.h). ctx.c, on the api
 * floor, opens and closes it; jit, blas, timing and the ops read it and
 * report into its error record. */
struct stof_ctx {
    err_record err;              /* the last failure's sentence; first, so that base/err.h's
                                    err_of reaches it from an opaque stof_ctx */
    stof_options opt;
    drv_device dev;              /* dev.ok == 0 where there is no GPU */
    char arch[32];               /* what kernels are compiled for */
    struct cache *cache;         /* NULL when running uncached */
    char cache_path[1024];
    char cache_note[2100];       /* why the cache is off, if it is */
    stof_stats stats;
    struct jit_module *modules;  /* loaded kernels, by cache key */
    struct model_device *model;  /* the attention model's figures for the device, once
                                    read from the cache or measured (attn/mha.c) */
    struct blas_state *blas;     /* cuBLAS and cuBLASLt, opened on first use */
    int pdl;                     /* launches are programmatic (jit_launch): sm_90 and later,
                                    unless $STOF_PDL was 0 at stof_open */
};

_Static_assert(offsetof(struct stof_ctx, err) == 0, "err_of(ctx) needs the record first");

/* Fails with STOF_ERR_NO_DEVICE unless the context drives a GPU. */
stof_status ctx_need_device(stof_ctx *ctx);

/* After a cache call: once the cache has found its file damaged
 * (cache_damage), the context goes on uncached, as one whose cache was
 * damaged at stof_open: the cache is closed (its counts kept in ctx->stats),
 * and ctx->cache_note and ctx->err say why and how to recover, once. */
void jit_cache_check(stof_ctx *ctx);

typedef struct jit_request {
    const char *op;          /* what the kernel is for: "layernorm" */
    const char *tmpl;        /* template file: "layernorm.cu" */
    const char *entry;       /* __global__ function name */
    const render_var *vars;
    int nvars;
    const char *part;        /* NULL, or a template ("wgmma.cuh") placed between the
                                prelude and tmpl and rendered with tmpl: every value
                                must be used by one of the two */
} jit_request;

/* Where a kernel came from, for counters and describe(). */
typedef enum jit_origin { JIT_FROM_MEMORY, JIT_FROM_CACHE, JIT_COMPILED } jit_origin;

/* The function for req on this context's GPU; key (65 bytes, may be NULL)
 * receives its cache key. */
stof_status jit_get(stof_ctx *ctx, const jit_request *req, CUfunction *fn, jit_origin *origin,
                    char *key);

/* What a kernel's source depends on besides its request (the templates and
 * the compile options), as 16 hex digits in out; 0 (and "") while the
 * templates come from STOF_TEMPLATE_DIR. A key recorded together with the
 * current id names the kernel that req would render to. */
int jit_source_id(char out[17]);

/* jit_get's derived row (kind JIT_KEY_ROW) names the kernel a request
 * renders to, so that a cached kernel loads without rendering (on an H100
 * host 0.2 of a GEMM's 0.5 ms): its key, written to out, is the digest of
 * the request with the templates, compile options, arch and NVRTC; its
 * data, the kernel's key. 0 while the templates come from
 * STOF_TEMPLATE_DIR, or without a cache. */
#define JIT_KEY_ROW "kernel key"
int jit_key_row(stof_ctx *ctx, const jit_request *req, char out[65]);

/* jit_get, first looking for `known` (a key recorded with the current
 * jit_source_id, or NULL) in the cache without rendering req; a miss there
 * renders as jit_get does. */
stof_status jit_get_known(stof_ctx *ctx, const jit_request *req, const char *known, CUfunction *fn,
                          char *key);

/* Compiles req for ctx->arch into the cache without a GPU; key is the
 * cache key (65 bytes) and may be NULL. */
stof_status jit_prepare(stof_ctx *ctx, const jit_request *req, char *key, jit_origin *origin);

/* Compiles n requests at once: each is rendered and keyed in turn, those
 * loaded or cached already are skipped, the rest are claimed and compiled by
 * NVRTC on jit_compile_threads(n) threads, then each is stored in the cache
 * and, where ctx drives its GPU, loaded, so that a later jit_get finds it
 * with no compile even uncached. Those another process was compiling are
 * waited for afterwards (and compiled here if its claim lapses). Every
 * request is tried; the first failure is returned with its sentence in
 * ctx->err (one met while rendering or looking up comes before any
 * compile's; compiles fail in request order, the waited-for ones last). */
stof_status jit_prepare_all(stof_ctx *ctx, const jit_request *reqs, int n);

/* How many threads compile n kernels: the online cores, or
 * $STOF_COMPILE_THREADS where it is set, at most n (1 means serial). */
int jit_compile_threads(int n);

/* Unloads every module of ctx (at stof_close). */
void jit_unload_all(stof_ctx *ctx);

/* Makes ctx's primary context current for the calling thread / undoes it. */
stof_status jit_push(stof_ctx *ctx);
void jit_pop(stof_ctx *ctx);

/* Launches fn on stream, its context current. On sm_90 and later the launch
 * is programmatic: the kernel may start while the stream's kernel before it
 * finishes, which every template waits for before it touches memory
 * (stof_grid_wait in common.cuh); $STOF_PDL=0 at stof_open launches plainly
 * (ctx->pdl). */
stof_status jit_launch(stof_ctx *ctx, CUfunction fn, unsigned gx, unsigned gy, unsigned gz,
                       unsigned threads, unsigned smem, CUstream stream, void **args);

/* Checked driver call: records the call, file and line on failure. */
stof_status jit_cu_check(stof_ctx *ctx, CUresult r, const char *call, const char *file, int line);
#define CU(ctx, call) jit_cu_check((ctx), (ctx)->dev.api.call, #call, __FILE__, __LINE__)

#endif
