#include "gpu/jit.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/strbuf.h"
#include "cache/cache.h"
#include "cache/cache_claim.h"
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
    return err_fail(err_of(ctx), STOF_ERR_CUDA, file, line, "%s failed: %s", call,
                    drv_err_str(&ctx->dev, r));
}

stof_status jit_launch(stof_ctx *ctx, CUfunction fn, unsigned gx, unsigned gy, unsigned gz,
                       unsigned threads, unsigned smem, CUstream stream, void **args)
{
    CUlaunchAttribute pdl = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                             .value.programmaticStreamSerializationAllowed = 1};
    CUlaunchConfig lc = {.gridDimX = gx, .gridDimY = gy, .gridDimZ = gz, .blockDimX = threads,
                         .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = smem,
                         .hStream = stream, .attrs = &pdl, .numAttrs = 1};
    if (!ctx->pdl)
        lc.numAttrs = 0;
    return CU(ctx, LaunchKernelEx(&lc, fn, args, NULL));
}

/* 1 when ctx drives a GPU and compiles for it: kernels can be loaded. */
static int runs_here(const stof_ctx *ctx)
{
    char own[32];
    if (!ctx->dev.ok)
        return 0;
    drv_arch_name(ctx->dev.cc_major, ctx->dev.cc_minor, own, sizeof own);
    return strcmp(own, ctx->arch) == 0;
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
    const char *parts[] = {source, nvrtc_options(), arch, nvrtc_version_string(),
                           stof_version()};
    hash_init(&h);
    for (int i = 0; i < 5; i++)
        hash_update(&h, parts[i], strlen(parts[i]) + 1);
    hash_final(&h, d);
    hash_to_hex(d, out);
}

/* Counts a finished compile and moves it, with its source, into *k
 * (which then owns both); on failure both are freed. */
static stof_status take_compiled(stof_ctx *ctx, const jit_request *req, const char *key,
                                 char *source, nvrtc_output *o, cache_kernel *k)
{
    memset(k, 0, sizeof *k);
    ctx->stats.nvrtc_compiles++;
    ctx->stats.nvrtc_ms += o->ms;
    snprintf(k->key, sizeof k->key, "%s", key);
    k->op = strdup(req->op);
    k->name = strdup(req->tmpl);
    k->entry = strdup(req->entry);
    k->arch = strdup(ctx->arch);
    k->options = strdup(nvrtc_options());
    k->params = params_string(req);
    k->source = source;
    k->log = o->log;
    k->cubin = o->cubin;
    k->cubin_size = o->cubin_size;
    k->ptx = o->ptx;
    k->ptx_size = o->ptx_size;
    k->compile_ms = o->ms;
    memset(o, 0, sizeof *o);
    if (!k->op || !k->name || !k->entry || !k->arch || !k->options || !k->params) {
        cache_kernel_free(k);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory after compiling %s", req->tmpl);
    }
    return STOF_OK;
}

void jit_cache_check(stof_ctx *ctx)
{
    const char *why = ctx->cache ? cache_damage(ctx->cache) : NULL;
    if (!why)
        return;
    /* Its counts live on in the context's. */
    cache_remote_counts n;
    cache_remote_counts_of(ctx->cache, &n);
    ctx->stats.remote_hits += n.hits;
    ctx->stats.remote_misses += n.misses;
    ctx->stats.remote_rejects += n.refused;
    ctx->stats.remote_writes += n.written;
    ctx->stats.remote_errors += n.errors;
    ctx->stats.cache_write_failures += cache_write_failures(ctx->cache);
    snprintf(ctx->cache_note, sizeof ctx->cache_note,
             "running uncached: %.1500s; to save what is intact: stof-dump --cache '%.200s' "
             "recover NEW.db",
             why, ctx->cache_path);
    snprintf(ctx->err.msg, sizeof ctx->err.msg, "%.2000s", ctx->cache_note);
    cache_close(ctx->cache);
    ctx->cache = NULL;
}

/* Stores a compiled kernel; a failed store leaves the kernel usable, and
 * the reason stays readable only if nothing else fails later. */
static void store(stof_ctx *ctx, cache_kernel *k)
{
    if (!ctx->cache)
        return;
    err_record saved = ctx->err;
    if (cache_put_kernel(&ctx->err, ctx->cache, k) == STOF_OK)
        ctx->err = saved;
    jit_cache_check(ctx);
}

/* How long a claim to compile a kernel stands (cache_claim): longer than a
 * batch of compiles takes, as a waiter compiles itself when it lapses. A
 * claimant that died is seen at once on its own host. */
#define JIT_CLAIM_LEASE_MS (5 * 60 * 1000)

/* Looks key's binary up in the cache and, on a miss, claims its compile,
 * so that processes sharing the cache compile it once. Returns 1 when
 * found (a hit, perhaps compiled meanwhile by the process waited for), 0
 * when it is to be compiled here (a miss: release_claim after storing), -1
 * when another process is compiling it and wait is 0 (nothing counted). */
static int lookup_or_claim(stof_ctx *ctx, const char *key, cache_kernel *k, int wait)
{
    if (!ctx->cache)
        return 0;
    int found = 0, rejected = 0, got = 0;
    /* A cache that fails to read is skipped, never fatal. */
    if (cache_get_cubin(&ctx->err, ctx->cache, key, k, &found, &rejected) == STOF_OK && found) {
        got = 1;
    } else {
        cache_claim_state cs = cache_claim(ctx->cache, key, JIT_CLAIM_LEASE_MS, wait);
        if (cs == CACHE_CLAIM_HELD)
            return -1;
        /* Stored meanwhile; a damaged row is compiled again, unclaimed. */
        int again = 0;
        if (cs == CACHE_CLAIM_STORED &&
            cache_get_cubin(&ctx->err, ctx->cache, key, k, &found, &again) == STOF_OK && found)
            got = 1;
        rejected |= again;
    }
    if (got) {
        ctx->stats.cache_hits++;
    } else {
        ctx->stats.cache_misses++;
        ctx->stats.cache_rejects += rejected;
    }
    jit_cache_check(ctx);
    return got;
}

/* Drops this process's claim on key's compile, if the cache is still there. */
static void release_claim(stof_ctx *ctx, const char *key)
{
    cache_release(ctx->cache, key);
}

int jit_source_id(char out[17])
{
    const char *t = render_templates_digest();
    out[0] = 0;
    if (!t)
        return 0;
    hash_sha256 h;
    unsigned char d[32];
    char hex[65];
    hash_init(&h);
    hash_update(&h, t, strlen(t) + 1);
    const char *opts = nvrtc_options();
    hash_update(&h, opts, strlen(opts));
    hash_final(&h, d);
    hash_to_hex(d, hex);
    snprintf(out, 17, "%.16s", hex);
    return 1;
}

/* Finds req's binary in the cache (under `known` first, when given: see
 * jit_get_known) or compiles (and stores) it. On success *k holds at least
 * its key and cubin. */
static stof_status find_or_compile(stof_ctx *ctx, const jit_request *req, const char *known,
                                   cache_kernel *k, jit_origin *origin)
{
    char *source = NULL;
    memset(k, 0, sizeof *k);
    if (!ctx->arch[0])
        return CTX_FAIL(ctx, STOF_ERR_NO_DEVICE,
                        "%s, and no architecture was named (stof_options.arch) to compile for",
                        ctx->dev.why);
    if (known && ctx->cache) {
        /* Rendering would give this key: the row, if sound, is req's. A
         * miss is not counted; the rendered key's lookup counts. */
        int found = 0, rejected = 0;
        err_record saved = ctx->err;
        if (cache_get_cubin(&ctx->err, ctx->cache, known, k, &found, &rejected) == STOF_OK &&
            found) {
            ctx->stats.cache_hits++;
            *origin = JIT_FROM_CACHE;
            return STOF_OK;
        }
        ctx->err = saved;
        cache_kernel_free(k);
        jit_cache_check(ctx);
    }
    TRY(full_source(ctx, req, &source));
    char key[65];
    kernel_key(source, ctx->arch, key);
    if (lookup_or_claim(ctx, key, k, 1)) {
        *origin = JIT_FROM_CACHE;
        free(source);
        return STOF_OK;
    }
    nvrtc_output o;
    stof_status st = nvrtc_compile(&ctx->err, req->tmpl, source, ctx->arch, &o);
    if (st != STOF_OK) {
        release_claim(ctx, key);
        nvrtc_output_free(&o);
        free(source);
        return st;
    }
    st = take_compiled(ctx, req, key, source, &o, k);
    if (st == STOF_OK) {
        *origin = JIT_COMPILED;
        store(ctx, k);
    }
    release_claim(ctx, key);
    return st;
}

stof_status jit_prepare(stof_ctx *ctx, const jit_request *req, char *key, jit_origin *origin)
{
    cache_kernel k;
    jit_origin o;
    TRY(find_or_compile(ctx, req, NULL, &k, &o));
    if (key)
        snprintf(key, 65, "%s", k.key);
    if (origin)
        *origin = o;
    cache_kernel_free(&k);
    return STOF_OK;
}

/* Loads k's CUBIN and keeps it in ctx->modules under sig (which it then
 * owns, as on failure it frees it). */
static stof_status load_module(stof_ctx *ctx, char *sig, const cache_kernel *k, const char *entry,
                               jit_module **out)
{
    jit_module *m = calloc(1, sizeof *m);
    if (!m) {
        free(sig);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    }
    m->signature = sig;
    snprintf(m->key, sizeof m->key, "%s", k->key);
    stof_status st = jit_push(ctx);
    if (st == STOF_OK) {
        st = CU(ctx, ModuleLoadData(&m->mod, k->cubin));
        if (st == STOF_OK) {
            ctx->stats.module_loads++;
            st = CU(ctx, ModuleGetFunction(&m->fn, m->mod, entry));
            if (st != STOF_OK)
                ctx->dev.api.ModuleUnload(m->mod);
        }
        jit_pop(ctx);
    }
    if (st != STOF_OK) {
        free(m->signature);
        free(m);
        return st;
    }
    m->next = ctx->modules;
    ctx->modules = m;
    *out = m;
    return STOF_OK;
}

static jit_module *loaded(stof_ctx *ctx, const char *sig)
{
    for (jit_module *m = ctx->modules; m; m = m->next)
        if (strcmp(m->signature, sig) == 0)
            return m;
    return NULL;
}

static int key_row(stof_ctx *ctx, const char *sig, char out[65])
{
    char id[17];
    if (!ctx->cache || !jit_source_id(id))
        return 0;
    hash_sha256 h;
    unsigned char d[32];
    const char *parts[] = {sig, id, ctx->arch, nvrtc_version_string()};
    hash_init(&h);
    for (int i = 0; i < 4; i++)
        hash_update(&h, parts[i], strlen(parts[i]) + 1);
    hash_final(&h, d);
    hash_to_hex(d, out);
    return 1;
}

int jit_key_row(stof_ctx *ctx, const jit_request *req, char out[65])
{
    char *sig = signature(req);
    int ok = sig && key_row(ctx, sig, out);
    free(sig);
    return ok;
}

/* Writes key_row's row for sig: key names its kernel. Best effort. */
static void put_key_row(stof_ctx *ctx, const char *sig, const char *key)
{
    char row[65];
    if (!key_row(ctx, sig, row))
        return;
    err_record saved = ctx->err;
    if (cache_put_derived(&ctx->err, ctx->cache, JIT_KEY_ROW, row, key, 64) != STOF_OK)
        ctx->err = saved;
    jit_cache_check(ctx);
}

/* The key key_row's row names, in out; 0 if none (a failed read is a miss). */
static int mapped_key(stof_ctx *ctx, const char *row, char out[65])
{
    err_record saved = ctx->err;
    void *data = NULL;
    size_t n = 0;
    int found = 0;
    if (cache_get_derived(&ctx->err, ctx->cache, JIT_KEY_ROW, row, &data, &n, &found) != STOF_OK)
        ctx->err = saved;
    jit_cache_check(ctx);
    int ok = found && n == 64 && strspn(data, "0123456789abcdef") >= 64;
    if (ok) {
        memcpy(out, data, 64);
        out[64] = 0;
    }
    free(data);
    return ok;
}

static stof_status get(stof_ctx *ctx, const jit_request *req, const char *known, CUfunction *fn,
                       jit_origin *origin, char *key)
{
    TRY(ctx_need_device(ctx));
    char *sig = signature(req);
    if (!sig)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    jit_module *m = loaded(ctx, sig);
    jit_origin o = JIT_FROM_MEMORY;
    if (m) {
        free(sig);
    } else {
        char row[65], mapped[65];
        const int has_row = !known && key_row(ctx, sig, row);
        const int hit = has_row && mapped_key(ctx, row, mapped);
        cache_kernel k;
        stof_status st = find_or_compile(ctx, req, hit ? mapped : known, &k, &o);
        if (st != STOF_OK) {
            free(sig);
            return st;
        }
        if (has_row && (!hit || strcmp(mapped, k.key) != 0))
            put_key_row(ctx, sig, k.key);
        st = load_module(ctx, sig, &k, req->entry, &m);
        cache_kernel_free(&k);
        TRY(st);
    }
    *fn = m->fn;
    if (key)
        snprintf(key, 65, "%s", m->key);
    if (origin)
        *origin = o;
    return STOF_OK;
}

stof_status jit_get(stof_ctx *ctx, const jit_request *req, CUfunction *fn, jit_origin *origin,
                    char *key)
{
    return get(ctx, req, NULL, fn, origin, key);
}

stof_status jit_get_known(stof_ctx *ctx, const jit_request *req, const char *known, CUfunction *fn,
                          char *key)
{
    return get(ctx, req, known, fn, NULL, key);
}

/* ---- several requests at once ------------------------------------------ */

/* One request of jit_prepare_all: its source and key, rendered serially,
 * then (if neither loaded nor cached) compiled on a pool thread into an
 * error record of its own. */
typedef struct prep_item {
    const jit_request *req;
    char *sig, *source;
    char key[65];
    int waiting;             /* another process was compiling it */
    stof_status st;
    nvrtc_output out;
    err_record err;
} prep_item;

typedef struct prep_pool {
    prep_item *items;
    const int *todo;
    int n, next;
    const char *arch;
    pthread_mutex_t lock;
} prep_pool;

static void *compile_worker(void *arg)
{
    prep_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        int i = p->next < p->n ? p->todo[p->next++] : -1;
        pthread_mutex_unlock(&p->lock);
        if (i < 0)
            return NULL;
        prep_item *it = &p->items[i];
        it->st = nvrtc_compile(&it->err, it->req->tmpl, it->source, p->arch, &it->out);
    }
}

int jit_compile_threads(int n)
{
    const char *env = getenv("STOF_COMPILE_THREADS");
    long t = env && atoi(env) > 0 ? atoi(env) : sysconf(_SC_NPROCESSORS_ONLN);
    if (t < 1)
        t = 1;
    return n < t ? (n > 0 ? n : 1) : (int)t;
}

/* Compiles the items listed in todo on up to jit_compile_threads() threads,
 * the calling one among them. */
static void compile_all(stof_ctx *ctx, prep_item *items, const int *todo, int n)
{
    prep_pool p = {items, todo, n, 0, ctx->arch, PTHREAD_MUTEX_INITIALIZER};
    int nt = jit_compile_threads(n), started = 0;
    pthread_t th[256];
    if (nt > 256)
        nt = 256;
    /* A thread that cannot start leaves its share to the others. */
    while (started < nt - 1 && pthread_create(&th[started], NULL, compile_worker, &p) == 0)
        started++;
    compile_worker(&p);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&p.lock);
}

/* A batch's first failure, kept while the rest of the batch goes on. */
typedef struct prep_first {
    stof_status st;
    err_record err;
} prep_first;

static void prep_fail(prep_first *f, const err_record *err, stof_status st)
{
    if (f->st == STOF_OK) {
        f->st = st;
        f->err = *err;
    }
}

/* An item the cache had (k): loaded where ctx runs it. */
static void take_cached(stof_ctx *ctx, prep_item *it, cache_kernel *k, int load, prep_first *f)
{
    char *sig = it->sig;
    it->sig = NULL;
    jit_module *m;
    stof_status st;
    if (load && (st = load_module(ctx, sig, k, it->req->entry, &m)) != STOF_OK)
        prep_fail(f, &ctx->err, st);
    else if (!load)
        free(sig);
    cache_kernel_free(k);
}

/* Compiles the items listed in todo, then serially, in the callers' order,
 * counts, stores (releasing their claims) and loads them. */
static void compile_store(stof_ctx *ctx, prep_item *items, const int *todo, int ntodo, int load,
                          prep_first *f)
{
    compile_all(ctx, items, todo, ntodo);
    for (int t = 0; t < ntodo; t++) {
        prep_item *it = &items[todo[t]];
        if (it->st != STOF_OK) {
            release_claim(ctx, it->key);
            prep_fail(f, &it->err, it->st);
            continue;
        }
        cache_kernel k;
        char *source = it->source;
        it->source = NULL;
        stof_status st = take_compiled(ctx, it->req, it->key, source, &it->out, &k);
        if (st != STOF_OK) {
            release_claim(ctx, it->key);
            prep_fail(f, &ctx->err, st);
            continue;
        }
        store(ctx, &k);
        release_claim(ctx, it->key);
        if (load) {
            jit_module *m;
            char *sig = it->sig;
            it->sig = NULL;
            if ((st = load_module(ctx, sig, &k, it->req->entry, &m)) != STOF_OK)
                prep_fail(f, &ctx->err, st);
        }
        cache_kernel_free(&k);
    }
}

stof_status jit_prepare_all(stof_ctx *ctx, const jit_request *reqs, int n)
{
    if (n <= 0)
        return STOF_OK;
    if (!ctx->arch[0])
        return CTX_FAIL(ctx, STOF_ERR_NO_DEVICE,
                        "%s, and no architecture was named (stof_options.arch) to compile for",
                        ctx->dev.why);
    prep_item *items = calloc((size_t)n, sizeof *items);
    int *todo = calloc((size_t)n, sizeof *todo);
    if (!items || !todo) {
        free(items);
        free(todo);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory preparing %d kernels", n);
    }
    const int load = runs_here(ctx);
    prep_first first = {STOF_OK, {{0}}};

    /* Serially: render, key, and find what is loaded or cached already;
     * claim the rest, and leave those another process is compiling. */
    int ntodo = 0;
    for (int i = 0; i < n; i++) {
        prep_item *it = &items[i];
        it->req = &reqs[i];
        if (!(it->sig = signature(it->req))) {
            prep_fail(&first, &ctx->err, CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory"));
            continue;
        }
        if (loaded(ctx, it->sig))
            continue;
        int twin = 0;
        for (int j = 0; j < i && !twin; j++)
            twin = items[j].sig && strcmp(items[j].sig, it->sig) == 0;
        if (twin)
            continue;
        stof_status st = full_source(ctx, it->req, &it->source);
        if (st != STOF_OK) {
            prep_fail(&first, &ctx->err, st);
            continue;
        }
        kernel_key(it->source, ctx->arch, it->key);
        /* Loaded from here on, the kernel is not looked up again in this
         * process: its row now, for the next. */
        put_key_row(ctx, it->sig, it->key);
        cache_kernel k;
        memset(&k, 0, sizeof k);
        int got = lookup_or_claim(ctx, it->key, &k, 0);
        if (got > 0)
            take_cached(ctx, it, &k, load, &first);
        else if (got < 0)
            it->waiting = 1;
        else
            todo[ntodo++] = i;
    }
    compile_store(ctx, items, todo, ntodo, load, &first);

    /* Then those another process was compiling, waited for now that this
     * one holds no claim (two batches waiting on each other's would stall
     * till the leases lapsed): its kernel, or, its claim lapsed, a compile. */
    ntodo = 0;
    for (int i = 0; i < n; i++) {
        prep_item *it = &items[i];
        cache_kernel k;
        memset(&k, 0, sizeof k);
        if (!it->waiting)
            continue;
        if (lookup_or_claim(ctx, it->key, &k, 1) > 0)
            take_cached(ctx, it, &k, load, &first);
        else
            todo[ntodo++] = i;
    }
    compile_store(ctx, items, todo, ntodo, load, &first);

    for (int i = 0; i < n; i++) {
        free(items[i].sig);
        free(items[i].source);
        nvrtc_output_free(&items[i].out);
    }
    free(items);
    free(todo);
    if (first.st != STOF_OK)
        ctx->err = first.err;
    return first.st;
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
