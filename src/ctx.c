#include "ctx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "cache/cache_admin.h"
#include "cache/remote.h"
#include "cache/trust.h"
#include "codegen/nvrtc_drv.h"
#include "gpu/blas.h"

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
    /* Kernels run only where they were compiled for the device itself, so
     * the device's architecture is theirs: programmatic launches from sm_90. */
    const char *pdl = getenv("STOF_PDL");
    ctx->pdl = ctx->dev.ok && ctx->dev.cc_major >= 9 && !(pdl && strcmp(pdl, "0") == 0);
    if (opts && opts->arch) {
        stof_status st = nvrtc_check_arch(&ctx->err, opts->arch);
        if (st != STOF_OK) {
            snprintf(open_err, sizeof open_err, "%s", ctx->err.msg);
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
        if (cache_open(&ctx->err, path, ctx->opt.cache_max_bytes, nvrtc_version_string(),
                       &ctx->cache) == STOF_OK)
            snprintf(ctx->cache_path, sizeof ctx->cache_path, "%s", path);
        else
            snprintf(ctx->cache_note, sizeof ctx->cache_note, "running uncached: %s",
                     ctx->err.msg);
    }
    remote_config rc;
    if (ctx->cache && remote_config_resolve(opts, shared, &rc)) {
        remote *r = NULL;
        rc.nvrtc_version = nvrtc_version_string();
        remote_open(&rc, &r, remote_note, sizeof remote_note);
        cache_set_remote(ctx->cache, r, ctx->arch);
    }
    ctx->opt.remote_cache = ctx->opt.remote_key = ctx->opt.remote_key_file = NULL;
    /* Not failures: the context works, but the caller may ask why it runs
     * without the cache or the tier it asked for. A machine without a GPU
     * is no failure of the open: stof_device_info says why there is none. */
    if (ctx->cache_note[0])
        snprintf(ctx->err.msg, sizeof ctx->err.msg, "%.2000s", ctx->cache_note);
    else if (remote_note[0])
        snprintf(ctx->err.msg, sizeof ctx->err.msg, "%s", remote_note);
    else
        ctx->err.msg[0] = 0;
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
    free(ctx->model);
    free(ctx);
}

const char *stof_last_error(const stof_ctx *ctx)
{
    return ctx ? ctx->err.msg : open_err;
}

stof_status stof_get_stats(const stof_ctx *ctx, stof_stats *out)
{
    if (!ctx || !out)
        return STOF_ERR_INVALID_ARG;
    *out = ctx->stats;
    /* The cache's counts; those of a cache closed as damaged are in ctx->stats. */
    cache_remote_counts n;
    cache_remote_counts_of(ctx->cache, &n);
    out->remote_hits += n.hits;
    out->remote_misses += n.misses;
    out->remote_rejects += n.refused;
    out->remote_writes += n.written;
    out->remote_errors += n.errors;
    out->cache_write_failures += cache_write_failures(ctx->cache);
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
        snprintf(name, name_len, "%s", ctx->dev.ok ? ctx->dev.name : ctx->dev.why);
    return STOF_OK;
}

const char *stof_cache_path(const stof_ctx *ctx)
{
    return ctx && ctx->cache ? ctx->cache_path : "";
}
