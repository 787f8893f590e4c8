#include "attn/mha.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mask.h"
#include "attn/memo.h"
#include "base/util.h"
#include "cache/cache.h"

struct stof_mha_plan {
    stof_ctx *ctx;
    stof_mha_desc d;
    mha_candidate c;
    mha_launch L;
    int regs, spill;             /* the kernel's registers per thread, local-memory bytes */
    double predicted_ms, measured_ms;
    const char *origin;          /* "cache", "search" or "model" */
    int tried;
    char mask_hash[65];
    mha_maps maps;               /* the last run's TMA descriptors (ws engine) */
};

/* ---- argument checks ---------------------------------------------------- */

#define LIST_TEXT_(...) #__VA_ARGS__
#define LIST_TEXT(...) LIST_TEXT_(__VA_ARGS__)
#define HEAD_DIMS_TEXT LIST_TEXT(STOF_MHA_HEAD_DIMS)   /* "32, 64, 80, 96, 128" */

int stof_mha_head_dim_supported(int head_dim)
{
    static const int dims[] = {STOF_MHA_HEAD_DIMS};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (head_dim == dims[i])
            return 1;
    return 0;
}

static stof_status check_desc(stof_ctx *ctx, const stof_mha_desc *d, const stof_mask *mask)
{
    if (!d)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "argument 'desc' is NULL");
    if (!mask)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "argument 'mask' is NULL");
    if (d->batch <= 0 || d->heads <= 0 || d->seq_q <= 0 || d->seq_k <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.batch, heads, seq_q and seq_k must be positive (got %d, %d, %d, %d)",
                        d->batch, d->heads, d->seq_q, d->seq_k);
    /* The limits stof.h publishes: the grid's y counts (batch, head) pairs,
     * its z query groups of 64 rows or more; no mask is longer. */
    if ((long long)d->batch * d->heads > STOF_MAX_BATCH_HEADS)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.batch * desc.heads is above %d",
                        STOF_MAX_BATCH_HEADS);
    if (d->seq_q > STOF_MAX_SEQ || d->seq_k > STOF_MAX_SEQ)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.%s %d is above %d",
                        d->seq_q > STOF_MAX_SEQ ? "seq_q" : "seq_k",
                        d->seq_q > STOF_MAX_SEQ ? d->seq_q : d->seq_k, STOF_MAX_SEQ);
    if (!stof_mha_head_dim_supported(d->head_dim))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "desc.head_dim %d is not supported (%s)", d->head_dim, HEAD_DIMS_TEXT);
    if (d->dtype != STOF_F16 && d->dtype != STOF_BF16)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.dtype must be STOF_F16 or STOF_BF16");
    if (d->layout != 0 && d->layout != STOF_LAYOUT_BHLD && d->layout != STOF_LAYOUT_BLHD)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.layout %d is not a stof_layout",
                        (int)d->layout);
    if (d->kv_heads < 0 || d->heads % mha_kv_heads(d) != 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.kv_heads %d must be 0 or divide desc.heads %d", d->kv_heads,
                        d->heads);
    if (d->qkv_packed && (d->layout != STOF_LAYOUT_BLHD || d->seq_q != d->seq_k))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.qkv_packed needs layout STOF_LAYOUT_BLHD and seq_q == seq_k");
    if (d->varlen && (d->layout != STOF_LAYOUT_BLHD || d->qkv_packed))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.varlen needs layout STOF_LAYOUT_BLHD (rows back to back) and "
                        "qkv_packed 0");
    if (d->varlen && (d->alibi || d->bias_buckets > 0))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "desc.varlen does not take desc.alibi or desc.bias_buckets yet (their "
                        "positions would be the plan's, not each sequence's)");
    if (!(d->scale >= 0.f) || isinf(d->scale))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.scale must be finite and >= 0");
    if (!(d->softcap >= 0.f) || isinf(d->softcap))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.softcap must be finite and >= 0 (0: off), got %g", (double)d->softcap);
    if (d->alibi_slopes && !d->alibi)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.alibi_slopes is set but desc.alibi is 0: set alibi to use them");
    if (d->bias_buckets < 0 || d->bias_buckets > STOF_MAX_BIAS_BUCKETS)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.bias_buckets must be 0 (off) to %d, got %d", STOF_MAX_BIAS_BUCKETS,
                        d->bias_buckets);
    if (d->bias_table && d->bias_buckets == 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.bias_table is set but desc.bias_buckets is 0: say how many "
                        "buckets each head's row holds");
    if (d->tune < STOF_TUNE_DEFAULT || d->tune > STOF_TUNE_FULL)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.tune %d is not a stof_tune", (int)d->tune);
    if (d->max_candidates < 0 || !(d->max_seconds >= 0))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.max_candidates and max_seconds must be >= 0");
    int lq, lk;
    stof_mask_dims(mask, &lq, &lk);
    if (lq != d->seq_q || lk != d->seq_k)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "the mask is %d x %d but desc.seq_q x seq_k is %d x %d", lq, lk, d->seq_q,
                        d->seq_k);
    return STOF_OK;
}

/* The tuning record's shape: KV heads, the modifiers and varlen only where
 * they are set, so that the records of plain multi-head attention keep
 * their keys (ALiBi's slopes, given or standard, run the same kernel). */
static void shape_string(const stof_mha_desc *d, char *out, size_t n)
{
    char kv[24] = "", cap[80] = "";
    if (mha_group(d) > 1)
        snprintf(kv, sizeof kv, ",kv=%d", mha_kv_heads(d));
    if (d->softcap > 0.f)
        snprintf(cap, sizeof cap, ",softcap=%.9g", (double)d->softcap);
    if (d->alibi)
        snprintf(cap + strlen(cap), sizeof cap - strlen(cap), ",alibi");
    if (d->bias_buckets > 0)
        snprintf(cap + strlen(cap), sizeof cap - strlen(cap), ",bias=%d", d->bias_buckets);
    snprintf(out, n, "b=%d,h=%d,lq=%d,lk=%d,d=%d,layout=%s%s%s%s%s", d->batch, d->heads,
             d->seq_q, d->seq_k, d->head_dim, d->layout == STOF_LAYOUT_BLHD ? "blhd" : "bhld",
             d->qkv_packed ? ",packed" : "", kv, cap, d->varlen ? ",varlen" : "");
}

/* ---- public calls ------------------------------------------------------- */

/* The mask's summary, made now if the plan has none yet (a plan whose hash
 * came from the cache walks the mask only when it must). The walk's hash
 * is the truth: a cached one that differs is replaced. */
static stof_status need_summary(stof_ctx *ctx, stof_mha_plan *p, const stof_mask *mask,
                                const mask_summary **ms, mask_summary *own)
{
    if (*ms)
        return STOF_OK;
    TRY(mask_summarize(ctx, mask, own));
    *ms = own;
    if (memcmp(p->mask_hash, own->hash, sizeof p->mask_hash) != 0) {
        memcpy(p->mask_hash, own->hash, sizeof p->mask_hash);
        memo_put_mask_hash(ctx, mask, own->hash);
    }
    return STOF_OK;
}

/* Loads the plan's kernel (known: its key from a tuning record, or NULL)
 * on its tiles: `tiles` when the caller has them, else the cache's, else
 * cut from the mask's summary (made if need be) and then kept in the
 * cache. */
static stof_status finish_plan(stof_ctx *ctx, stof_mha_plan *p, const stof_mask *mask,
                               const mask_summary **ms, mask_summary *own,
                               const attn_tiles *tiles, const char *known)
{
    attn_tiles made;
    int from_cache = 0;
    if (!tiles && memo_tiles(ctx, p->mask_hash, p->c.kind, p->c.bm, p->c.bn, &made)) {
        tiles = &made;
        from_cache = 1;
    }
    if (!tiles) {
        TRY(need_summary(ctx, p, mask, ms, own));
        TRY(attn_tiles_build(ctx, *ms, p->c.kind, p->c.bm, p->c.bn, &made));
        tiles = &made;
    }
    /* Varlen: whether a sequence may move along the mask's diagonal. */
    int diagonal = 0;
    if (p->d.varlen && mask_diagonal(mask, &diagonal) != STOF_OK) {
        if (tiles == &made)
            attn_tiles_free(&made);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory walking the mask");
    }
    mha_launch L;
    stof_status st = mha_kernel_load(ctx, &p->d, &p->c, tiles, known, &L);
    L.shift = diagonal;
    if (st == STOF_OK && !from_cache)
        memo_put_tiles(ctx, p->mask_hash, tiles);
    if (tiles == &made)
        attn_tiles_free(&made);
    if (st == STOF_OK) {
        p->L = L;
        if ((st = jit_push(ctx)) == STOF_OK) {
            st = CU(ctx, FuncGetAttribute(&p->regs, CU_FUNC_ATTRIBUTE_NUM_REGS, L.fn));
            if (st == STOF_OK)
                st = CU(ctx, FuncGetAttribute(&p->spill, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, L.fn));
            jit_pop(ctx);
        }
    }
    return st;
}

/* A new plan for desc, after the checks every plan needs. Its mask hash is
 * the summary's: *ms when the caller made one, else the cache's for the
 * mask's spec (*ms then stays NULL: need_summary makes it when wanted),
 * else that of *own, made here (the caller frees own; it is zeroed when
 * unused). */
static stof_status plan_new(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask,
                            const mask_summary **ms, mask_summary *own, stof_mha_plan **out)
{
    memset(own, 0, sizeof *own);
    TRY(check_desc(ctx, desc, mask));
    TRY(ctx_need_device(ctx));
    char hash[65];
    int memo = !*ms && memo_mask_hash(ctx, mask, hash);
    if (!*ms && !memo) {
        TRY(mask_summarize(ctx, mask, own));
        *ms = own;
        memo_put_mask_hash(ctx, mask, own->hash);
    }
    stof_mha_plan *p = calloc(1, sizeof *p);
    if (!p) {
        mask_summary_free(own);
        *ms = NULL;
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    }
    p->ctx = ctx;
    p->d = *desc;
    if (!p->d.layout)
        p->d.layout = STOF_LAYOUT_BHLD;
    memcpy(p->mask_hash, memo ? hash : (*ms)->hash, sizeof p->mask_hash);
    *out = p;
    return STOF_OK;
}

stof_status stof_mha_plan_create(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask,
                                 stof_mha_plan **plan)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, plan, "plan");
    *plan = NULL;
    stof_mha_plan *p;
    const mask_summary *ms = NULL;
    mask_summary own;
    TRY(plan_new(ctx, desc, mask, &ms, &own, &p));
    stof_status st = STOF_OK;
    char shape[160];
    shape_string(&p->d, shape, sizeof shape);
    const char *dt = dtype_name(p->d.dtype);
    stof_tune level = util_tune_level(p->d.tune);

    /* A tuning record for this case: no model, no timing. */
    if (st == STOF_OK && ctx->cache) {
        cache_tuning rec;
        int found = 0;
        if (cache_get_tuning(&ctx->err, ctx->cache, "mha", p->mask_hash, shape, dt, ctx->arch,
                             &rec, &found) == STOF_OK && found) {
            char key[65];
            const int known = mha_record_kernel(rec.record, key);
            if (mha_record_parse(rec.record, &p->c, &p->measured_ms, &p->predicted_ms) &&
                finish_plan(ctx, p, mask, &ms, &own, NULL, known ? key : NULL) == STOF_OK) {
                p->origin = "cache";
                cache_tuning_free(&rec);
                mask_summary_free(&own);
                *plan = p;
                return STOF_OK;
            }
            cache_tuning_free(&rec);
        }
    }
    mha_search_cand cs[MHA_MAX_CANDIDATES];
    int n = 0, winner = 0;
    if (st == STOF_OK)
        st = need_summary(ctx, p, mask, &ms, &own);
    if (st == STOF_OK)
        st = mha_search_rank(ctx, &p->d, ms, 1, cs, &n);
    if (st == STOF_OK && n == 0)
        st = CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "no attention kernel fits this device for head_dim %d",
                      p->d.head_dim);
    if (st == STOF_OK && level == STOF_TUNE_OFF) {
        p->origin = "model";
    } else if (st == STOF_OK) {
        st = mha_search_run(ctx, &p->d, ms, cs, n, level, &winner);
        p->origin = "search";
    }
    if (st == STOF_OK) {
        p->c = cs[winner].c;
        p->predicted_ms = cs[winner].predicted_ms;
        p->measured_ms = cs[winner].ms;
        for (int i = 0; i < n; i++)
            p->tried += cs[i].verdict != NULL;
        st = finish_plan(ctx, p, mask, &ms, &own, &cs[winner].tiles, NULL);
    }
    if (st == STOF_OK && ctx->cache && level != STOF_TUNE_OFF) {
        mha_tried tried[MHA_MAX_CANDIDATES];
        for (int i = 0; i < n; i++)
            tried[i] = (mha_tried){cs[i].c, cs[i].predicted_ms, cs[i].ms, cs[i].verdict};
        char *record = mha_record_format(tried, n, winner, p->L.key,
                                         level == STOF_TUNE_FULL ? "full" : "fast",
                                         stof_mask_spec(mask));
        cache_tuning t = {"mha", p->mask_hash, shape, (char *)dt, ctx->arch, record, 0};
        if (record) {
            /* A record that fails to store costs a later search, no more. */
            err_record saved = ctx->err;
            if (cache_put_tuning(&ctx->err, ctx->cache, &t) == STOF_OK)
                ctx->err = saved;
        }
        free(record);
    }
    mha_search_free(cs, n);
    mask_summary_free(&own);
    if (st != STOF_OK) {
        stof_mha_plan_free(p);
        return st;
    }
    *plan = p;
    return STOF_OK;
}

const char *mha_plan_mask_hash(const stof_mha_plan *p) { return p ? p->mask_hash : ""; }

stof_status mha_plan_forced(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask,
                            const mha_candidate *c, stof_mha_plan **plan)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, plan && c, "plan");
    *plan = NULL;
    if (c->wg == MHA_WS && c->kind != ATTN_BLOCK &&
        (c->bm != 128 || c->bn > 128 || c->qs || (desc && desc->head_dim % 64 != 0)))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "the warp-specialized attention engine gathers rows and keys only in "
                        "groups of 128 rows, tiles of 64 or 128 keys, P in registers, at "
                        "head_dim 64 or 128");
    if (c->wg && (strcmp(ctx->arch, "sm_90a") != 0 ||
                  (desc && (c->wg == MHA_WS ? desc->head_dim < 64 : desc->head_dim % 64 != 0))))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "wgmma attention kernels need sm_90a and head_dim 64 or 128 (80 and 96 on "
                        "the warp-specialized engine; this context compiles for %s, head_dim %d)",
                        ctx->arch, desc ? desc->head_dim : 0);
    if (desc && desc->varlen && !mha_takes_varlen(c))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "the warp-specialized engine takes desc.varlen on 128-row block "
                        "items only (its 192-row and gathered items spill with it); the "
                        "other engines take it on every size");
    if (desc && desc->softcap > 0.f && !mha_takes_softcap(c))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "the warp-specialized engine's 192-row items do not take desc.softcap "
                        "(their registers spill with it); its 128-row items and the other "
                        "engines do");
    if (desc && !mha_takes_score_mods(c, mha_mods_of(desc), desc->head_dim))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "the warp-specialized engine takes desc.alibi or desc.bias_buckets only "
                        "on 128-row items: both up to head_dim 64, and past it desc.alibi "
                        "alone on block tiles (the others' registers spill with them); the "
                        "other engines take them at every size");
    const int smem_max = mha_kernel_device_smem(ctx);
    if (desc && mha_smem_bytes(c, desc->head_dim, desc->varlen) > smem_max)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "this attention kernel needs %d bytes of shared memory at head_dim %d; "
                        "the device gives a block %d",
                        mha_smem_bytes(c, desc->head_dim, desc->varlen), desc->head_dim,
                        smem_max);
    stof_mha_plan *p;
    const mask_summary *ms = NULL;
    mask_summary own;
    TRY(plan_new(ctx, desc, mask, &ms, &own, &p));
    p->c = *c;
    p->origin = "forced";
    stof_status st = finish_plan(ctx, p, mask, &ms, &own, NULL, NULL);
    mask_summary_free(&own);
    if (st != STOF_OK) {
        stof_mha_plan_free(p);
        return st;
    }
    *plan = p;
    return STOF_OK;
}

/* The launch of a run whose arguments are checked (vl: a varlen run's
 * sequences, else NULL). */
static stof_status run_plan(stof_mha_plan *p, const void *q, const void *k, const void *v,
                            void *out, CUdeviceptr seq_lens, const mha_varlen *vl,
                            stof_stream stream)
{
    stof_ctx *ctx = p->ctx;
    /* 16-byte loads of rows need 16-byte aligned rows. */
    if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)out) % 16)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "q, k, v and out must be 16-byte aligned");
    /* A caller that already made the device's primary context current
     * (PyTorch does) skips the push and pop. */
    CUcontext cur = NULL;
    int push = !ctx->dev.ok || ctx->dev.api.CtxGetCurrent(&cur) != CUDA_SUCCESS ||
               cur != ctx->dev.cu;
    if (push)
        TRY(jit_push(ctx));
    stof_status st = mha_kernel_launch(ctx, &p->d, &p->L, (CUdeviceptr)q, (CUdeviceptr)k,
                                       (CUdeviceptr)v, (CUdeviceptr)out, seq_lens, vl,
                                       (CUstream)stream, &p->maps);
    if (push)
        jit_pop(ctx);
    return st;
}

stof_status stof_mha_run(stof_mha_plan *p, const void *q, const void *k, const void *v, void *out,
                         const int *seq_lens, stof_stream stream)
{
    if (!p)
        return STOF_ERR_INVALID_ARG;
    stof_ctx *ctx = p->ctx;
    CTX_ARG(ctx, q, "q");
    CTX_ARG(ctx, p->d.qkv_packed || k, "k");
    CTX_ARG(ctx, p->d.qkv_packed || v, "v");
    CTX_ARG(ctx, out, "out");
    if (p->d.varlen)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "this plan was made with desc.varlen: run it with stof_mha_run_varlen");
    /* The table is data, read only here: a plan (stof-warm's, a search's)
     * is made for its shape alone. */
    if (p->d.bias_buckets > 0 && !p->d.bias_table)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.bias_table is NULL but desc.bias_buckets is %d: the kernel reads "
                        "table[heads][bias_buckets] on the device", p->d.bias_buckets);
    return run_plan(p, q, k, v, out, (CUdeviceptr)seq_lens, NULL, stream);
}

stof_status stof_mha_run_varlen(stof_mha_plan *p, const void *q, const void *k, const void *v,
                                void *out, const int *cu_seqlens_q, const int *cu_seqlens_k,
                                int batch, long long total_q, long long total_k,
                                stof_stream stream)
{
    if (!p)
        return STOF_ERR_INVALID_ARG;
    stof_ctx *ctx = p->ctx;
    if (!p->d.varlen)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "the plan was made without desc.varlen: stof_mha_run_varlen needs a "
                        "varlen plan (stof_mha_run runs this one)");
    CTX_ARG(ctx, q, "q");
    CTX_ARG(ctx, k, "k");
    CTX_ARG(ctx, v, "v");
    CTX_ARG(ctx, out, "out");
    CTX_ARG(ctx, cu_seqlens_q, "cu_seqlens_q");
    CTX_ARG(ctx, cu_seqlens_k, "cu_seqlens_k");
    if (batch < 1 || batch > p->d.batch)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "batch %d must be within 1 .. desc.batch %d, the plan's most sequences",
                        batch, p->d.batch);
    if (total_q < 0 || total_k < 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "%s %lld must be >= 0",
                        total_q < 0 ? "total_q" : "total_k", total_q < 0 ? total_q : total_k);
    if (((uintptr_t)cu_seqlens_q | (uintptr_t)cu_seqlens_k) % 4)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "cu_seqlens_q and cu_seqlens_k must be 4-byte aligned int32 arrays");
    mha_varlen vl = {(CUdeviceptr)cu_seqlens_q, (CUdeviceptr)cu_seqlens_k, batch, total_q,
                     total_k};
    return run_plan(p, q, k, v, out, 0, &vl, stream);
}

stof_status stof_mha_plan_describe(const stof_mha_plan *p, char *buf, size_t n)
{
    if (!p || !buf || n == 0)
        return STOF_ERR_INVALID_ARG;
    /* How the warp-specialized engine reads rows: TMA boxes, boxes of a
     * residue-class view (tma/period), or the producer's copies. */
    char rows[32] = "", mods[128] = "";
    if (mha_group(&p->d) > 1)
        snprintf(mods, sizeof mods, " kv_heads=%d", mha_kv_heads(&p->d));
    if (p->d.softcap > 0.f)
        snprintf(mods + strlen(mods), sizeof mods - strlen(mods), " softcap=%g",
                 (double)p->d.softcap);
    if (p->d.alibi)
        snprintf(mods + strlen(mods), sizeof mods - strlen(mods), " alibi=%s",
                 p->d.alibi_slopes ? "given" : "standard");
    if (p->d.bias_buckets > 0)
        snprintf(mods + strlen(mods), sizeof mods - strlen(mods), " bias_buckets=%d",
                 p->d.bias_buckets);
    if (p->d.varlen)
        snprintf(mods + strlen(mods), sizeof mods - strlen(mods), " varlen%s",
                 p->L.shift ? "" : "=corner");
    if (p->c.wg == MHA_WS && p->L.period > 1)
        snprintf(rows, sizeof rows, " rows=tma/%d", p->L.period);
    else if (p->c.wg == MHA_WS)
        snprintf(rows, sizeof rows, " rows=%s", p->L.gather ? "copies" : "tma");
    snprintf(buf, n,
             "kernel=%s engine=%s%s block_m=%d block_n=%d m_tiles=%d q_in=%s stages=%d p_in=%s "
             "head_dim=%d%s "
             "%s groups=%d regs=%d local=%d smem=%d chosen_by=%s predicted_ms=%.4f "
             "measured_ms=%.4f candidates_timed=%d mask=%.16s",
             mha_kernel_kind_name(p->c.kind), mha_kernel_engine_name(&p->c), rows, p->c.bm,
             p->c.bn, p->c.mt,
             p->c.wg || p->c.qs ? "smem" : "regs", p->c.wg ? p->c.st : 2,
             p->c.wg == MHA_WS && p->c.qs ? "smem" : "regs", p->d.head_dim, mods,
             dtype_name(p->d.dtype),
             p->L.n_groups, p->regs, p->spill, p->L.smem, p->origin, p->predicted_ms, p->measured_ms,
             p->tried, p->mask_hash);
    return STOF_OK;
}

void stof_mha_plan_free(stof_mha_plan *p)
{
    if (!p)
        return;
    if (p->L.tiles && p->ctx->dev.ok && jit_push(p->ctx) == STOF_OK) {
        p->ctx->dev.api.MemFree(p->L.tiles);
        jit_pop(p->ctx);
    }
    free(p);
}

/* The model's ranking of the candidates for desc on mask, best first. */
static stof_status rank_mask(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask,
                             mha_search_cand *cs, int *n)
{
    mask_summary ms;
    TRY(mask_summarize(ctx, mask, &ms));
    stof_status st = mha_search_rank(ctx, desc, &ms, 0, cs, n);
    mask_summary_free(&ms);
    return st;
}

stof_status stof_mha_prepare(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(check_desc(ctx, desc, mask));
    mha_search_cand cs[MHA_MAX_CANDIDATES];
    int n = 0;
    TRY(rank_mask(ctx, desc, mask, cs, &n));
    /* The model's first three, and the default size of each kind, so a
     * later search on the GPU finds its stage 1 compiled. */
    int idx[MHA_MAX_CANDIDATES], m = 0;
    for (int i = 0; i < n; i++)
        if (i < 3 || mha_search_is_default(&cs[i].c))
            idx[m++] = i;
    stof_status st = mha_search_compile(ctx, desc, cs, idx, m);
    mha_search_free(cs, n);
    return st;
}

stof_status mha_rank(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask,
                     mha_ranked *out, int cap, int *n, model_device *md)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    *n = 0;
    TRY(check_desc(ctx, desc, mask));
    TRY(mha_search_device_figures(ctx, md, 0));
    mha_search_cand cs[MHA_MAX_CANDIDATES];
    int nc = 0;
    TRY(rank_mask(ctx, desc, mask, cs, &nc));
    for (int i = 0; i < nc && *n < cap; i++)
        out[(*n)++] = (mha_ranked){cs[i].c, cs[i].predicted_ms, cs[i].tiles.n_tiles,
                                   cs[i].tiles.n_full, cs[i].tiles.n_groups};
    mha_search_free(cs, nc);
    return STOF_OK;
}
