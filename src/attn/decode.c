#include "attn/decode.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct stof_decode_plan {
    stof_ctx *ctx;
    stof_decode_desc d;          /* kv_heads, layout and scale filled in */
    CUfunction fn, combine;
    char key[65], combine_key[65];
    const decode_variant *v;     /* the main kernel's build */
    int stages, smem, threads, resident, row_chunks, cta_tiles;
    int regs, spill, combine_regs;
    int forced;                  /* $STOF_DECODE_SPLITS at creation; 0: chosen per run */
    int span_max;                /* keys a sequence may read at max_seq_k */
    long long ws_seq_splits;     /* the workspace holds this many (sequence, split) pairs */
    CUdeviceptr ws;              /* partial O (fp32), then their log2-sum-exps */
};

/* ---- the desc and the kernels ------------------------------------------ */

#define LIST_TEXT_(...) #__VA_ARGS__
#define LIST_TEXT(...) LIST_TEXT_(__VA_ARGS__)

static int kv_heads_of(const stof_decode_desc *d) { return d->kv_heads ? d->kv_heads : d->heads; }

static stof_status check_desc(stof_ctx *ctx, const stof_decode_desc *d)
{
    if (!d)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "argument 'desc' is NULL");
    /* The grid's z counts sequences, its y KV heads; the combine's x rows. */
    if (d->batch <= 0 || d->batch > 65535)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.batch %d must be 1 .. 65535", d->batch);
    if (d->heads <= 0 || d->heads > 65535)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.heads %d must be 1 .. 65535", d->heads);
    if (d->kv_heads < 0 || d->heads % kv_heads_of(d) != 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.kv_heads %d must be 0 or divide desc.heads %d", d->kv_heads,
                        d->heads);
    if (!stof_mha_head_dim_supported(d->head_dim))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.head_dim %d is not one of %s",
                        d->head_dim, LIST_TEXT(STOF_MHA_HEAD_DIMS));
    if (d->seq_q < 1 || d->seq_q > 16)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.seq_q %d must be 1 .. 16", d->seq_q);
    if (d->max_seq_k < d->seq_q || d->max_seq_k > STOF_MAX_SEQ)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.max_seq_k %d must be desc.seq_q (%d) .. %d: the cache holds the "
                        "new rows",
                        d->max_seq_k, d->seq_q, STOF_MAX_SEQ);
    if ((long long)d->batch * d->heads * d->seq_q > INT_MAX)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.batch * heads * seq_q is above %d", INT_MAX);
    if (d->dtype != STOF_F16 && d->dtype != STOF_BF16)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.dtype must be STOF_F16 or STOF_BF16");
    if (d->layout != 0 && d->layout != STOF_LAYOUT_BHLD && d->layout != STOF_LAYOUT_BLHD)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.layout %d is not a stof_layout",
                        (int)d->layout);
    if (!(d->scale >= 0.f) || isinf(d->scale))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.scale must be finite and >= 0");
    if (!(d->softcap >= 0.f) || isinf(d->softcap))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.softcap must be finite and >= 0 (0: off), got %g",
                        (double)d->softcap);
    if (d->window < 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.window %d must be >= 0 (0: none)",
                        d->window);
    return STOF_OK;
}

/* The variants bench_decode compares (issue 57): the default first.
 * Measured on an H200 (bench/results/decode-variants-H200-20261128.md and
 * -0125.md and -0330.md, one process each, ten cases, 32/8 heads, hd 128):
 * the 128-byte L2 prefetch hint on the copies gains 1.02x (geomean;
 * 1.00-1.04x a case); the copies of a whole tile addressed by steps, the
 * mask test skipped where every row reads a warp's keys, and a tile's K
 * rows asked for before its V rows (kfirst) 1.006x over that, unrolled
 * with K and V row by row 1.003x. Gone, as none beat plain cp by more than
 * noise: the 256-byte hint (1.005x, then 0.989x), 8 warps each copying its
 * own rows (0.98x), unrolled copies with no hint (0.988x), a producer
 * warp's bulk copies into an mbarrier ring (0.5-0.93x), the last split
 * merging the rest in place of the combine (0.6-0.94x), the combine
 * launched early through PDL (0.997x), and 128-key tiles on 8 warps copied
 * by the CTA (0.994x).
 * Then on an H100 (bench/results/decode-H100-20261128-swizzle.md): ncu
 * showed L2 taking 1.5x the sectors of K and V from the SMs, the rows
 * padded by 16 bytes putting every odd row's copies across two sectors;
 * swizzled rows (swz-kfirst) took L2's share back to 1.0x and DRAM from
 * 87% to 91% of its peak: 1.03-1.05x a case over cp-l2-128-kfirst. With
 * them the L2 hint no longer matters (128, 256 or none within 0.5%). Also
 * tried there: 2 stages (three CTAs an SM, 0.90-1.00x), a ring of 6 for
 * one CTA an SM (0.99-1.00x), and an L2 evict-first policy: 1.04-1.17x
 * where a step reads under about 130 MB, 0.95-0.99x above, most likely by
 * leaving the benchmark's L2 flush its dirty lines to write back later, so
 * not taken. */
const decode_variant decode_variants[] = {
    /* the CTA copies each tile, 4 warps, two CTAs an SM, K rows then V,
     * swizzled rows */
    {"swz-kfirst", 64, 0, 2, 128, 1, 1, 1},
    {"cp-l2-128-kfirst", 64, 0, 2, 128, 1, 1, 0}, /* padded rows */
    {"cp-l2-128-unroll", 64, 0, 2, 128, 1, 0, 0}, /* and K and V row by row */
    {"cp-l2-128", 64, 0, 2, 128, 0, 0, 0},        /* a loop to the tile's end, every key tested */
    {"cp", 64, 0, 2, 0, 0, 0, 0},                 /* and no L2 prefetch hint */
    {"stream-wide-l2-256", 128, 1, 1, 256, 0, 0, 0}, /* 8 warps each copying its own rows */
};
const int decode_nvariants = (int)(sizeof decode_variants / sizeof decode_variants[0]);

const decode_variant *decode_variant_named(const char *name)
{
    for (int i = 0; name && i < decode_nvariants; i++)
        if (strcmp(decode_variants[i].name, name) == 0)
            return &decode_variants[i];
    return NULL;
}

/* A shared row's elements: swizzled rows are unpadded (attn_decode.cu's LDS). */
static int lds_of(const decode_variant *v, int head_dim)
{
    return v->swizzle && head_dim % 64 == 0 ? head_dim : head_dim + 8;
}

int decode_stages_of(const decode_variant *v, int head_dim)
{
    const int stage = 2 * v->block_n * lds_of(v, head_dim) * 2;
    const int n = 106496 * (v->resident == 1 ? 2 : 1) / stage;
    return n < 2 ? 2 : n > 8 ? 8 : n;
}

int decode_smem_bytes_of(const decode_variant *v, int head_dim)
{
    /* Q's rows, the K and V ring (whose space later takes the warps' O:
     * warps x 16 x head_dim floats, at most one stage), each warp's row
     * maxima and sums. */
    const int lds = lds_of(v, head_dim);
    return DECODE_ROWS * lds * 2 + decode_stages_of(v, head_dim) * 2 * v->block_n * lds * 2 +
           (v->block_n / 16) * DECODE_ROWS * 2 * 4;
}

int decode_stages(int head_dim) { return decode_stages_of(&decode_variants[0], head_dim); }
int decode_smem_bytes(int head_dim) { return decode_smem_bytes_of(&decode_variants[0], head_dim); }

void decode_make_request(const stof_decode_desc *d, const decode_variant *v, decode_request *r)
{
    snprintf(r->text[0], sizeof r->text[0], "%d", d->head_dim);
    snprintf(r->text[1], sizeof r->text[1], "%d", v->block_n);
    snprintf(r->text[2], sizeof r->text[2], "%d", decode_stages_of(v, d->head_dim));
    if (d->softcap > 0.f)
        snprintf(r->text[3], sizeof r->text[3], "%.9g", (double)d->softcap);
    else
        snprintf(r->text[3], sizeof r->text[3], "0");
    const char *mma = d->dtype == STOF_BF16 ? "bf16" : "f16";
    int n = 0;
    r->vars[n++] = (render_var){"HEAD_DIM", r->text[0]};
    r->vars[n++] = (render_var){"BLOCK_N", r->text[1]};
    r->vars[n++] = (render_var){"STAGES", r->text[2]};
    r->vars[n++] = (render_var){"MMA_TYPE", mma};
    r->vars[n++] = (render_var){"GROUP", "0"};   /* the group is the kernel's argument */
    r->vars[n++] = (render_var){"SOFTCAP", r->text[3]};
    r->vars[n++] = (render_var){"WARP_RING", v->warp_ring ? "1" : "0"};
    r->vars[n++] = (render_var){"UNROLL", v->unroll ? "1" : "0"};
    r->vars[n++] = (render_var){"KFIRST", v->kfirst ? "1" : "0"};
    r->vars[n++] = (render_var){"SWIZZLE", v->swizzle ? "1" : "0"};
    r->vars[n++] = (render_var){"PREFETCH", v->prefetch == 256   ? ".L2::256B"
                                            : v->prefetch == 128 ? ".L2::128B"
                                                                 : ""};
    /* attn_common.cuh's sections that only the prefill engines fill in */
    r->vars[n++] = (render_var){"MODS", "0"};
    r->vars[n++] = (render_var){"ALIBI", "0"};
    r->vars[n++] = (render_var){"BIAS", "0"};
    r->vars[n++] = (render_var){"VARLEN", "0"};
    r->main = (jit_request){"decode", "attn_decode.cu", "stof_attn_decode", r->vars, n, NULL};
    r->cvars[0] = (render_var){"HEAD_DIM", r->text[0]};
    r->cvars[1] = (render_var){"MMA_TYPE", mma};
    r->cvars[2] = (render_var){"MAX_SPLITS", LIST_TEXT(DECODE_MAX_SPLITS)};
    r->combine = (jit_request){"decode", "attn_decode_combine.cu", "stof_attn_decode_combine",
                               r->cvars, 3, NULL};
}

int decode_choose_splits(int sm_count, int resident, long long ctas, int span)
{
    return decode_choose_splits_at(sm_count, resident, ctas, span, DECODE_BLOCK_N,
                                   DECODE_CTA_TILES);
}

int decode_choose_splits_at(int sm_count, int resident, long long ctas, int span, int block_n,
                            int cta_tiles)
{
    const int tiles = span > 0 ? (span + block_n - 1) / block_n : 1;
    const long long slots =
        (long long)(sm_count > 0 ? sm_count : 1) * (resident > 0 ? resident : 1);
    if (ctas < 1)
        ctas = 1;
    int best = 1;
    long long best_cost = LLONG_MAX;
    for (int s = 1; s <= DECODE_MAX_SPLITS && s <= tiles; s++) {
        const int per = (tiles + s - 1) / s;
        if ((tiles + per - 1) / per != s)
            continue;   /* cuts the same chunks as a smaller count */
        const long long waves = (ctas * s + slots - 1) / slots;
        const long long cost = waves * (per + cta_tiles);
        if (cost < best_cost) {
            best_cost = cost;
            best = s;
        }
    }
    return best;
}

/* The CTAs an SM takes in a wave, as the split count is chosen: one, though
 * two fit. Splits that leave one CTA an SM ran faster on an H200 than those
 * filling both places (cp variant, 32/8 heads, hd 128): batch 1 x cache
 * 4096 16 splits 0.0167 ms against 32 0.0192, batch 8 x cache 16384 2
 * splits 0.1466 ms against 4 0.1503; the same or better in all ten cases of
 * bench_decode --variants (bench/results/decode-variants-H200-20261128.md). */
#define DECODE_WAVE_CTAS 1

/* The keys a sequence's new rows may read at most, of kv_capacity cap. */
static int span_of(const stof_decode_desc *d, int cap)
{
    return d->window > 0 && (long long)d->window + d->seq_q - 1 < cap ? d->window + d->seq_q - 1
                                                                      : cap;
}

/* ---- public calls ------------------------------------------------------- */

/* $STOF_DECODE_SPLITS: a count to force, 0 when unset; bad values refused. */
static stof_status forced_splits(stof_ctx *ctx, int *out)
{
    *out = 0;
    const char *e = getenv("STOF_DECODE_SPLITS");
    if (!e || !*e)
        return STOF_OK;
    char *end;
    long n = strtol(e, &end, 10);
    if (*end || n < 1 || n > DECODE_MAX_SPLITS)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "$STOF_DECODE_SPLITS '%s' must be 1 .. %d", e,
                        DECODE_MAX_SPLITS);
    *out = (int)n;
    return STOF_OK;
}

/* $STOF_DECODE_VARIANT, or the default; an unknown name is refused with the
 * list. */
static stof_status chosen_variant(stof_ctx *ctx, const decode_variant **out)
{
    const char *e = getenv("STOF_DECODE_VARIANT");
    *out = decode_variant_named(e && *e ? e : DECODE_DEFAULT_VARIANT);
    if (*out)
        return STOF_OK;
    char names[256] = "";
    for (int i = 0; i < decode_nvariants; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 decode_variants[i].name);
    return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "$STOF_DECODE_VARIANT '%s' is not one of %s", e,
                    names);
}

/* $STOF_DECODE_CTA_TILES: the split count's fixed cost a CTA, in tiles
 * (decode_choose_splits_at); DECODE_CTA_TILES when unset. */
static stof_status chosen_cta_tiles(stof_ctx *ctx, int *out)
{
    *out = DECODE_CTA_TILES;
    const char *e = getenv("STOF_DECODE_CTA_TILES");
    if (!e || !*e)
        return STOF_OK;
    char *end;
    long n = strtol(e, &end, 10);
    if (*end || n < 0 || n > 64)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "$STOF_DECODE_CTA_TILES '%s' must be 0 .. 64",
                        e);
    *out = (int)n;
    return STOF_OK;
}

stof_status stof_decode_plan_create(stof_ctx *ctx, const stof_decode_desc *desc,
                                    stof_decode_plan **plan)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, plan, "plan");
    *plan = NULL;
    TRY(check_desc(ctx, desc));
    int forced, cta_tiles;
    const decode_variant *v;
    TRY(forced_splits(ctx, &forced));
    TRY(chosen_cta_tiles(ctx, &cta_tiles));
    TRY(chosen_variant(ctx, &v));
    TRY(ctx_need_device(ctx));
    const int smem = decode_smem_bytes_of(v, desc->head_dim);
    if (smem > ctx->dev.smem_optin)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "the decoding kernel (variant %s) needs %d bytes of shared memory at "
                        "head_dim %d; the device gives a block %d",
                        v->name, smem, desc->head_dim, ctx->dev.smem_optin);
    stof_decode_plan *p = calloc(1, sizeof *p);
    if (!p)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    p->ctx = ctx;
    p->d = *desc;
    p->d.kv_heads = kv_heads_of(desc);
    if (!p->d.layout)
        p->d.layout = STOF_LAYOUT_BHLD;
    if (!(p->d.scale > 0.f))
        p->d.scale = 1.f / sqrtf((float)desc->head_dim);
    p->forced = forced;
    p->v = v;
    p->cta_tiles = cta_tiles;
    p->stages = decode_stages_of(v, desc->head_dim);
    p->smem = smem;
    p->threads = v->block_n / 16 * 32;
    /* An SM's shared memory is about a block's opt-in plus 1 KiB, each
     * block reserving 1 KiB. */
    p->resident = (ctx->dev.smem_optin + 1024) / (smem + 1024);
    if (p->resident < 1)
        p->resident = 1;
    const int group = p->d.heads / p->d.kv_heads;
    p->row_chunks = (group * p->d.seq_q + DECODE_ROWS - 1) / DECODE_ROWS;

    /* The workspace: the most (sequence, split) pairs any run may use. */
    const int span = p->span_max = span_of(&p->d, p->d.max_seq_k);
    long long most = forced > 1 ? (long long)forced * p->d.batch : 1;
    for (int b = 1; !forced && b <= p->d.batch; b++) {
        const long long ctas = (long long)b * p->d.kv_heads * p->row_chunks;
        const int s = decode_choose_splits_at(ctx->dev.sm_count, DECODE_WAVE_CTAS, ctas, span,
                                              v->block_n, cta_tiles);
        if (s > 1 && (long long)b * s > most)
            most = (long long)b * s;
    }
    p->ws_seq_splits = most;

    decode_request r;
    decode_make_request(&p->d, v, &r);
    jit_origin origin;
    stof_status st = jit_get(ctx, &r.main, &p->fn, &origin, p->key);
    if (st == STOF_OK)
        st = jit_get(ctx, &r.combine, &p->combine, &origin, p->combine_key);
    if (st == STOF_OK && (st = jit_push(ctx)) == STOF_OK) {
        st = CU(ctx, FuncSetAttribute(p->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      p->smem));
        if (st == STOF_OK)
            st = CU(ctx, FuncGetAttribute(&p->regs, CU_FUNC_ATTRIBUTE_NUM_REGS, p->fn));
        if (st == STOF_OK)
            st = CU(ctx, FuncGetAttribute(&p->spill, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, p->fn));
        if (st == STOF_OK)
            st = CU(ctx, FuncGetAttribute(&p->combine_regs, CU_FUNC_ATTRIBUTE_NUM_REGS,
                                          p->combine));
        const size_t bytes = (size_t)most * p->d.heads * p->d.seq_q * (p->d.head_dim + 1) * 4;
        if (st == STOF_OK && most > 1)
            st = CU(ctx, MemAlloc(&p->ws, bytes));
        jit_pop(ctx);
    }
    if (st != STOF_OK) {
        stof_decode_plan_free(p);
        return st;
    }
    *plan = p;
    return STOF_OK;
}

stof_status stof_decode_run(stof_decode_plan *p, const void *q, const void *k, const void *v,
                            void *out, const int *seqused_k, int batch, int kv_capacity,
                            stof_stream stream)
{
    if (!p)
        return STOF_ERR_INVALID_ARG;
    stof_ctx *ctx = p->ctx;
    const stof_decode_desc *d = &p->d;
    CTX_ARG(ctx, q, "q");
    CTX_ARG(ctx, k, "k");
    CTX_ARG(ctx, v, "v");
    CTX_ARG(ctx, out, "out");
    if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)out) % 16)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "q, k, v and out must be 16-byte aligned");
    if (batch == 0)
        batch = d->batch;
    if (batch < 1 || batch > d->batch)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "batch %d must be 1 .. desc.batch %d (0: %d)",
                        batch, d->batch, d->batch);
    int cap = kv_capacity ? kv_capacity : d->max_seq_k;
    if (cap < d->seq_q || cap > d->max_seq_k)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "kv_capacity %d must be desc.seq_q %d .. desc.max_seq_k %d (0: %d)",
                        kv_capacity, d->seq_q, d->max_seq_k, d->max_seq_k);

    const long long D = d->head_dim, H = d->heads, KVH = d->kv_heads, LQ = d->seq_q;
    const int bhld = d->layout == STOF_LAYOUT_BHLD;
    long long q_sb = H * LQ * D, q_sh = bhld ? LQ * D : D, q_sl = bhld ? D : H * D;
    long long kv_sb = KVH * cap * D, kv_sh = bhld ? (long long)cap * D : D,
              kv_sl = bhld ? D : KVH * D;

    /* The splits, from the host's figures alone, within the workspace. */
    const int span = span_of(d, cap);
    const int bn = p->v->block_n;
    const int tiles = (span + bn - 1) / bn;
    int nsplit = p->forced;
    if (!nsplit) {
        const long long ctas = (long long)batch * KVH * p->row_chunks;
        nsplit = decode_choose_splits_at(ctx->dev.sm_count, DECODE_WAVE_CTAS, ctas, span, bn,
                                         p->cta_tiles);
        while (nsplit > 1 && (long long)batch * nsplit > p->ws_seq_splits)
            nsplit--;
    }
    const int per = (tiles + nsplit - 1) / nsplit;
    int chunk = per * bn;
    if (!p->forced)
        nsplit = (tiles + per - 1) / per;   /* no split left empty by the rounding */

    CUdeviceptr ws_o = p->ws,
                ws_lse = p->ws + (CUdeviceptr)((size_t)p->ws_seq_splits * H * LQ * D * 4);
    CUdeviceptr qp = (CUdeviceptr)q, kp = (CUdeviceptr)k, vp = (CUdeviceptr)v,
                op = (CUdeviceptr)out, lens = (CUdeviceptr)seqused_k;
    /* A window as long as the cache is none (and keeps the kernel's
     * arithmetic on key positions within int). */
    int heads = d->heads, group = d->heads / d->kv_heads, seq_q = d->seq_q,
        window = d->window < cap ? d->window : 0, row_chunks = p->row_chunks;
    float scale_log2 = d->scale * 1.4426950408889634f;
    void *args[] = {&qp,     &kp,      &vp,    &op,    &ws_o,       &ws_lse, &q_sb, &q_sh,
                    &q_sl,   &kv_sb,   &kv_sh, &kv_sl, &heads,      &group,  &seq_q, &cap,
                    &window, &lens,    &nsplit, &chunk, &row_chunks, &scale_log2};
    int rows = batch * heads * seq_q;
    void *cargs[] = {&ws_o, &ws_lse, &op, &q_sb, &q_sh, &q_sl, &heads, &seq_q, &nsplit};

    /* A caller that already made the device's primary context current
     * (PyTorch does) skips the push and pop. */
    CUcontext cur = NULL;
    int push = !ctx->dev.ok || ctx->dev.api.CtxGetCurrent(&cur) != CUDA_SUCCESS ||
               cur != ctx->dev.cu;
    if (push)
        TRY(jit_push(ctx));
    stof_status st = jit_launch(ctx, p->fn, (unsigned)(nsplit * row_chunks), (unsigned)KVH,
                                (unsigned)batch, (unsigned)p->threads, (unsigned)p->smem,
                                (CUstream)stream, args);
    if (st == STOF_OK && nsplit > 1)
        st = jit_launch(ctx, p->combine, (unsigned)rows, 1, 1, (unsigned)D, 0, (CUstream)stream,
                        cargs);
    if (push)
        jit_pop(ctx);
    return st;
}

stof_status stof_decode_plan_describe(const stof_decode_plan *p, char *buf, size_t n)
{
    if (!p || !buf || n == 0)
        return STOF_ERR_INVALID_ARG;
    const stof_decode_desc *d = &p->d;
    char splits[48];
    if (p->forced)
        snprintf(splits, sizeof splits, "splits=%d(forced)", p->forced);
    else
        snprintf(splits, sizeof splits, "splits_at_max=%d",
                 decode_choose_splits_at(p->ctx->dev.sm_count, DECODE_WAVE_CTAS,
                                         (long long)d->batch * d->kv_heads * p->row_chunks,
                                         p->span_max, p->v->block_n, p->cta_tiles));
    char mods[64] = "";
    if (d->window > 0)
        snprintf(mods, sizeof mods, " window=%d", d->window);
    if (d->softcap > 0.f)
        snprintf(mods + strlen(mods), sizeof mods - strlen(mods), " softcap=%g",
                 (double)d->softcap);
    snprintf(buf, n,
             "kernel=decode variant=%s heads=%d kv_heads=%d head_dim=%d seq_q=%d max_seq_k=%d "
             "%s %s%s block_n=%d stages=%d threads=%d rows_per_cta=%d row_chunks=%d %s "
             "cta_tiles=%d regs=%d local=%d smem=%d resident=%d combine_regs=%d workspace=%lld "
             "key=%.16s",
             p->v->name, d->heads, d->kv_heads, d->head_dim, d->seq_q, d->max_seq_k,
             d->dtype == STOF_BF16 ? "bf16" : "f16",
             d->layout == STOF_LAYOUT_BLHD ? "blhd" : "bhld", mods, p->v->block_n, p->stages,
             p->threads, DECODE_ROWS, p->row_chunks, splits, p->cta_tiles, p->regs, p->spill,
             p->smem, p->resident, p->combine_regs,
             p->ws ? (long long)p->ws_seq_splits * d->heads * d->seq_q * (d->head_dim + 1) * 4
                   : 0LL,
             p->key);
    return STOF_OK;
}

void stof_decode_plan_free(stof_decode_plan *p)
{
    if (!p)
        return;
    if (p->ws && p->ctx->dev.ok && jit_push(p->ctx) == STOF_OK) {
        p->ctx->dev.api.MemFree(p->ws);
        jit_pop(p->ctx);
    }
    free(p);
}

stof_status stof_decode_prepare(stof_ctx *ctx, const stof_decode_desc *desc)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(check_desc(ctx, desc));
    const decode_variant *v;
    TRY(chosen_variant(ctx, &v));
    decode_request r;
    decode_make_request(desc, v, &r);
    const jit_request reqs[2] = {r.main, r.combine};
    return jit_prepare_all(ctx, reqs, 2);
}
