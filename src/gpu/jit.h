/*
 * jit — the path from template to launchable kernel: render (with the
 * common prelude), key, look up in memory, then in the SQLite cache, else
 * compile with NVRTC and store; load with the driver. Also the driver
 * helpers every op uses to launch: context push/pop and checked calls.
 */
#ifndef STOF_JIT_H
#define STOF_JIT_H

#include "codegen/render.h"
#include "ctx.h"

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

/* Compiles req for ctx->arch into the cache without a GPU; key is the
 * cache key (65 bytes) and may be NULL. */
stof_status jit_prepare(stof_ctx *ctx, const jit_request *req, char *key, jit_origin *origin);

/* Unloads every module of ctx (at stof_close). */
void jit_unload_all(stof_ctx *ctx);

/* Makes ctx's primary context current for the calling thread / undoes it. */
stof_status jit_push(stof_ctx *ctx);
void jit_pop(stof_ctx *ctx);

/* Checked driver call: records the call, file and line on failure. */
stof_status jit_cu_check(stof_ctx *ctx, CUresult r, const char *call, const char *file, int line);
#define CU(ctx, call) jit_cu_check((ctx), (ctx)->dev.api.call, #call, __FILE__, __LINE__)

#endif
