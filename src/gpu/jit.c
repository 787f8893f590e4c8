#include "gpu/jit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/strbuf.h"
#include "cache/cache.h"
#include "codegen/nvrtc_drv.h"

/* One loaded kernel, found again by the request that asked for it, so a
 * repeated call pays neither rendering nor hashing. */
typedef struct jit_module {
    struct jit_module *next;
    char *signature;
    char key[65];
    CUmodule mod;
    CUfunction fn;
} jit_module;

stof_status jit_cu_check(stof_ctx *ctx, CUresult r, const char *call, const char *file, int line)
{
    if (r == CUDA_SUCCESS)
        return STOF_OK;
    return err_fail(ctx_err(ctx), STOF_ERR_CUDA, file, line, "%s failed: %s", call,
                    drv_err_str(&ctx->dev, r));
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

stof_status jit_push(stof_ctx *ctx)
{
    TRY(ctx_need_device(ctx));
    return CU(ctx, CtxPushCurrent(ctx->dev.cu));
}

void jit_pop(stof_ctx *ctx)
{
    CUcontext c;
    ctx->dev.api.CtxPopCurrent(&c);
}

static char *signature(const jit_request *req)
{
    strbuf b = {0};
    strbuf_printf(&b, "%s|%s|%s|%s", req->op, req->part ? req->part : "", req->tmpl, req->entry);
    for (int i = 0; i < req->nvars; i++)
        strbuf_printf(&b, "|%s=%s", req->vars[i].name, req->vars[i].value);
    return strbuf_take(&b);
}

static char *params_string(const jit_request *req)
{
    strbuf b = {0};
    for (int i = 0; i < req->nvars; i++)
        strbuf_printf(&b, "%s%s=%s", i ? ";" : "", req->vars[i].name, req->vars[i].value);
    return strbuf_take(&b);
}

/* The full source: the common prelude, then the part and the template,
 * rendered as one text so that a value either uses counts as used. */
static stof_status full_source(stof_ctx *ctx, const jit_request *req, char **out)
{
    char *prelude = NULL, *part = NULL, *tmpl = NULL, *body = NULL;
    *out = NULL;
    TRY(render_template(&ctx->err, "common.cuh", NULL, 0, &prelude));
    stof_status st = req->part ? render_load(&ctx->err, req->part, &part) : STOF_OK;
    if (st == STOF_OK)
        st = render_load(&ctx->err, req->tmpl, &tmpl);
    if (st == STOF_OK) {
        strbuf t = {0}, name = {0};
        strbuf_printf(&t, "%s%s", part ? part : "", tmpl);
        strbuf_printf(&name, "%s%s%s", part ? req->part : "", part ? " + " : "", req->tmpl);
        char *text = strbuf_take(&t), *nm = strbuf_take(&name);
        st = text && nm ? render_text(&ctx->err, nm, text, req->vars, req->nvars, &body)
                        : CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory rendering %s", req->tmpl);
        free(text);
        free(nm);
    }
    if (st == STOF_OK) {
        strbuf b = {0};
        strbuf_printf(&b, "// stof %s: %s%s%s, entry %s\n", stof_version(), part ? req->part : "",
                      part ? " + " : "", req->tmpl, req->entry);
        strbuf_puts(&b, prelude);
        strbuf_puts(&b, body);
        if (!(*out = strbuf_take(&b)))
            st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory rendering %s", req->tmpl);
    }
    free(prelude);
    free(part);
    free(tmpl);
    free(body);
    return st;
}

static void kernel_key(const char *source, const char *arch, char out[65])
{
    hash_sha256 h;
    unsigned char d[32];
    const char *parts[] = {source, nvrtc_default_options, arch, nvrtc_version_string(),
                           stof_version()};
    hash_init(&h);
    for (int i = 0; i < 5; i++)
        hash_update(&h, parts[i], strlen(parts[i]) + 1);
    hash_final(&h, d);
    hash_to_hex(d, out);
}

/* Finds req's binary in the cache or compiles (and stores) it. On success
 * *k holds at least cubin, ptx and entry. */
static stof_status find_or_compile(stof_ctx *ctx, const jit_request *req, cache_kernel *k,
                                   jit_origin *origin)
{
    char *source = NULL;
    memset(k, 0, sizeof *k);
    if (!ctx->arch[0])
        return CTX_FAIL(ctx, STOF_ERR_NO_DEVICE,
                        "%s, and no architecture was named (stof_options.arch) to compile for",
                        ctx->dev.why);
    TRY(full_source(ctx, req, &source));
    char key[65];
    kernel_key(source, ctx->arch, key);
    if (ctx->cache) {
        int found = 0, rejected = 0;
        stof_status st = cache_get_kernel(&ctx->err, ctx->cache, key, k, &found, &rejected);
        /* A cache that fails to read is skipped, never fatal. */
        if (st == STOF_OK && found) {
            ctx->stats.cache_hits++;
            *origin = JIT_FROM_CACHE;
            free(source);
            return STOF_OK;
        }
        ctx->stats.cache_misses++;
        ctx->stats.cache_rejects += rejected;
    }
    nvrtc_output o;
    stof_status st = nvrtc_compile(&ctx->err, req->tmpl, source, ctx->arch, &o);
    if (st != STOF_OK) {
        nvrtc_output_free(&o);
        free(source);
        return st;
    }
    ctx->stats.nvrtc_compiles++;
    ctx->stats.nvrtc_ms += o.ms;
    snprintf(k->key, sizeof k->key, "%s", key);
    k->op = strdup(req->op);
    k->name = strdup(req->tmpl);
    k->entry = strdup(req->entry);
    k->arch = strdup(ctx->arch);
    k->options = strdup(nvrtc_default_options);
    k->params = params_string(req);
    k->source = source;
    k->log = o.log;
    k->cubin = o.cubin;
    k->cubin_size = o.cubin_size;
    k->ptx = o.ptx;
    k->ptx_size = o.ptx_size;
    k->compile_ms = o.ms;
    if (!k->op || !k->name || !k->entry || !k->arch || !k->options || !k->params) {
        cache_kernel_free(k);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory after compiling %s", req->tmpl);
    }
    *origin = JIT_COMPILED;
    if (ctx->cache) {
        /* A failed store leaves the kernel usable; the reason stays readable. */
        err_record saved = ctx->err;
        if (cache_put_kernel(&ctx->err, ctx->cache, k) == STOF_OK)
            ctx->err = saved;
    }
    return STOF_OK;
}

stof_status jit_prepare(stof_ctx *ctx, const jit_request *req, char *key, jit_origin *origin)
{
    cache_kernel k;
    jit_origin o;
    TRY(find_or_compile(ctx, req, &k, &o));
    if (key)
        snprintf(key, 65, "%s", k.key);
    if (origin)
        *origin = o;
    cache_kernel_free(&k);
    return STOF_OK;
}

stof_status jit_get(stof_ctx *ctx, const jit_request *req, CUfunction *fn, jit_origin *origin,
                    char *key)
{
    TRY(ctx_need_device(ctx));
    char *sig = signature(req);
    if (!sig)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    for (jit_module *m = ctx->modules; m; m = m->next) {
        if (strcmp(m->signature, sig) == 0) {
            free(sig);
            *fn = m->fn;
            if (key)
                snprintf(key, 65, "%s", m->key);
            if (origin)
                *origin = JIT_FROM_MEMORY;
            return STOF_OK;
        }
    }
    cache_kernel k;
    jit_origin o;
    stof_status st = find_or_compile(ctx, req, &k, &o);
    if (st != STOF_OK) {
        free(sig);
        return st;
    }
    jit_module *m = calloc(1, sizeof *m);
    if (!m) {
        free(sig);
        cache_kernel_free(&k);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    }
    m->signature = sig;
    snprintf(m->key, sizeof m->key, "%s", k.key);
    st = jit_push(ctx);
    if (st == STOF_OK) {
        st = CU(ctx, ModuleLoadData(&m->mod, k.cubin));
        if (st == STOF_OK) {
            ctx->stats.module_loads++;
            st = CU(ctx, ModuleGetFunction(&m->fn, m->mod, req->entry));
            if (st != STOF_OK)
                ctx->dev.api.ModuleUnload(m->mod);
        }
        jit_pop(ctx);
    }
    cache_kernel_free(&k);
    if (st != STOF_OK) {
        free(m->signature);
        free(m);
        return st;
    }
    m->next = ctx->modules;
    ctx->modules = m;
    *fn = m->fn;
    if (key)
        snprintf(key, 65, "%s", m->key);
    if (origin)
        *origin = o;
    return STOF_OK;
}

void jit_unload_all(stof_ctx *ctx)
{
    jit_module *m = ctx->modules;
    int pushed = m && ctx->dev.ok && ctx->dev.api.CtxPushCurrent(ctx->dev.cu) == CUDA_SUCCESS;
    while (m) {
        jit_module *next = m->next;
        if (pushed)
            ctx->dev.api.ModuleUnload(m->mod);
        free(m->signature);
        free(m);
        m = next;
    }
    if (pushed)
        jit_pop(ctx);
    ctx->modules = NULL;
}
