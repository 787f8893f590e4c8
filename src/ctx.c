#include "ctx.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "cache.h"
#include "cache_admin.h"
#include "jit.h"
#include "nvrtc_drv.h"
#include "remote.h"
#include "trust.h"

stof_status ctx_fail(stof_ctx *ctx, stof_status st, const char *file, int line, const char *fmt,
                     ...)
{
    if (!ctx)
        return st;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof ctx->err - 1)
        snprintf(ctx->err + n, sizeof ctx->err - (size_t)n, " [%s:%d]", file, line);
    return st;
}

const char *stof_version(void)
{
#define STR2(x) #x
#define STR(x) STR2(x)
    return STR(STOF_VERSION_MAJOR) "." STR(STOF_VERSION_MINOR) "." STR(STOF_VERSION_PATCH);
}

const char *stof_status_str(stof_status s)
{
    switch (s) {
    case STOF_OK: return "STOF_OK";
    case STOF_ERR_INVALID_ARG: return "STOF_ERR_INVALID_ARG";
    case STOF_ERR_UNSUPPORTED: return "STOF_ERR_UNSUPPORTED";
    case STOF_ERR_NO_DEVICE: return "STOF_ERR_NO_DEVICE";
    case STOF_ERR_CUDA: return "STOF_ERR_CUDA";
    case STOF_ERR_COMPILE: return "STOF_ERR_COMPILE";
    case STOF_ERR_CACHE: return "STOF_ERR_CACHE";
    case STOF_ERR_NO_MEMORY: return "STOF_ERR_NO_MEMORY";
    case STOF_ERR_INTERNAL: return "STOF_ERR_INTERNAL";
    }
    return "STOF_ERR_UNKNOWN";
}

int dtype_size(stof_dtype t)
{
    switch (t) {
    case STOF_F32: return 4;
    case STOF_F16:
    case STOF_BF16: return 2;
    default: return 0;
    }
}

const char *dtype_name(stof_dtype t)
{
    switch (t) {
    case STOF_F32: return "fp32";
    case STOF_F16: return "fp16";
    case STOF_BF16: return "bf16";
    default: return "invalid";
    }
}

/* Why the last stof_open on this thread failed: stof_last_error(NULL). */
static __thread char open_err[2048];

stof_status stof_open(stof_ctx **out, const stof_options *opts)
{
    open_err[0] = 0;
    if (!out) {
        snprintf(open_err, sizeof open_err, "argument 'ctx' is NULL");
        return STOF_ERR_INVALID_ARG;
    }
    *out = NULL;
    stof_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        snprintf(open_err, sizeof open_err, "out of memory");
        return STOF_ERR_NO_MEMORY;
    }
    if (opts)
        ctx->opt = *opts;
    /* The caller's strings need not outlive this call. */
    ctx->opt.cache_path = NULL;
    ctx->opt.arch = NULL;
    if (ctx->opt.device < 0) {
        snprintf(open_err, sizeof open_err, "options.device is negative (%d)", ctx->opt.device);
        free(ctx);
        return STOF_ERR_INVALID_ARG;
    }
    drv_open(&ctx->dev, ctx->opt.device);
    if (opts && opts->arch) {
        stof_status st = nvrtc_check_arch(ctx, opts->arch);
        if (st != STOF_OK) {
            snprintf(open_err, sizeof open_err, "%s", ctx->err);
            drv_close(&ctx->dev);
            free(ctx);
            return st;
        }
        snprintf(ctx->arch, sizeof ctx->arch, "%s", opts->arch);
    } else if (ctx->dev.ok) {
        drv_arch_name(ctx->dev.cc_major, ctx->dev.cc_minor, ctx->arch, sizeof ctx->arch);
    }

    char path[1024] = "";
    int want_cache = !ctx->opt.no_cache;
    if (want_cache && opts && opts->cache_path)
        snprintf(path, sizeof path, "%s", opts->cache_path);
    else if (want_cache && !cache_admin_default_path(path, sizeof path))
        snprintf(ctx->cache_note, sizeof ctx->cache_note,
                 "running uncached: STOF_CACHE is off or no cache folder could be found");
    char why[1600], remote_note[1400] = "";
    int shared = ctx->opt.cache_shared || cache_shared_from_env();
    if (path[0] && !cache_trusted(path, shared, why, sizeof why)) {
        /* Kernels from a file others can write would be their code. */
        snprintf(ctx->cache_note, sizeof ctx->cache_note, "running uncached: %s", why);
    } else if (path[0]) {
        if (cache_open(ctx, path, ctx->opt.cache_max_bytes, &ctx->cache) == STOF_OK)
            snprintf(ctx->cache_path, sizeof ctx->cache_path, "%s", path);
        else
            snprintf(ctx->cache_note, sizeof ctx->cache_note, "running uncached: %s", ctx->err);
    }
    remote_config rc;
    if (ctx->cache && remote_config_resolve(opts, shared, &rc)) {
        remote *r = NULL;
        remote_open(&rc, &r, remote_note, sizeof remote_note);
        cache_set_remote(ctx->cache, r);
    }
    ctx->opt.remote_cache = ctx->opt.remote_key = ctx->opt.remote_key_file = NULL;
    /* Not failures: the context works, but the caller may ask why. */
    if (ctx->cache_note[0])
        snprintf(ctx->err, sizeof ctx->err, "%.2000s", ctx->cache_note);
    else if (remote_note[0])
        snprintf(ctx->err, sizeof ctx->err, "%s", remote_note);
    else if (!ctx->dev.ok)
        snprintf(ctx->err, sizeof ctx->err, "%s", ctx->dev.why);
    else
        ctx->err[0] = 0;
    *out = ctx;
    return STOF_OK;
}

void stof_close(stof_ctx *ctx)
{
    if (!ctx)
        return;
    blas_close(ctx);
    jit_unload_all(ctx);
    cache_close(ctx->cache);
    drv_close(&ctx->dev);
    free(ctx);
}

const char *stof_last_error(const stof_ctx *ctx)
{
    return ctx ? ctx->err : open_err;
}

stof_status stof_get_stats(const stof_ctx *ctx, stof_stats *out)
{
    if (!ctx || !out)
        return STOF_ERR_INVALID_ARG;
    *out = ctx->stats;
    cache_remote_counts n;
    cache_remote_counts_of(ctx->cache, &n);
    out->remote_hits = n.hits;
    out->remote_misses = n.misses;
    out->remote_rejects = n.refused;
    out->remote_writes = n.written;
    out->remote_errors = n.errors;
    return STOF_OK;
}

stof_status stof_device_info(const stof_ctx *ctx, int *has_device, char *arch, size_t arch_len,
                             char *name, size_t name_len)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    if (has_device)
        *has_device = ctx->dev.ok;
    if (arch && arch_len)
        snprintf(arch, arch_len, "%s", ctx->arch);
    if (name && name_len)
        snprintf(name, name_len, "%s", ctx->dev.ok ? ctx->dev.name : "");
    return STOF_OK;
}

const char *stof_cache_path(const stof_ctx *ctx)
{
    return ctx && ctx->cache ? ctx->cache_path : "";
}

stof_status ctx_need_device(stof_ctx *ctx)
{
    if (!ctx->dev.ok)
        return CTX_FAIL(ctx, STOF_ERR_NO_DEVICE,
                        "%s; GPU work is impossible here (compiling for a named arch still works)",
                        ctx->dev.why);
    char own[32];
    drv_arch_name(ctx->dev.cc_major, ctx->dev.cc_minor, own, sizeof own);
    if (strcmp(own, ctx->arch) != 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "this context compiles for %s but the GPU is %s: open it without options.arch "
                        "to run kernels",
                        ctx->arch, own);
    return STOF_OK;
}
