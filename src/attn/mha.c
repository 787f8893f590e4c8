#include "attn/mha.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn/mask.h"
#include "attn/memo.h"
#include "attn/model.h"
#include "attn/reference.h"
#include "base/half.h"
#include "base/strbuf.h"
#include "cache/cache.h"
#include "gpu/timing.h"

typedef struct mha_launch {
    CUfunction fn;
    int wg, bm, bn, threads, smem, n_groups;
    int gather;              /* MHA_WS: gathered rows and keys (no TMA descriptors) */
    int period;              /* MHA_WS: > 1, gathered rows and keys read through TMA
                                descriptors of a residue-class view (PERIOD) */
    CUdeviceptr tiles;       /* attn_tiles_pack's arrays, then (wg MHA_WS) the items */
    attn_tiles_layout lay;
    size_t items;            /* MHA_WS: byte offset of the work items in tiles, then
                                each CTA's first item (attn_tiles_schedule) ... */
    int n_items, ctas;       /* ... how many items, and CTAs */
    char key[65];            /* the kernel's cache key */
} mha_launch;

/* TMA descriptors of q, k, v and out and the addresses they were made
 * for: a plan's repeated runs on the same tensors skip re-encoding them
 * (0.22 us of host time each on an H100 host). Bytes, not CUtensorMap, so that
 * a malloc'd plan needs no 128-byte alignment. */
typedef struct mha_maps {
    unsigned char map[4][sizeof(CUtensorMap)];
    CUdeviceptr at[4];
} mha_maps;

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

/* ---- candidates and requests ------------------------------------------- */

void mha_make_request(const mha_candidate *c, int head_dim, int seq_q, stof_dtype dtype,
                      int period, mha_request *r)
{
    const int nums[4] = {head_dim, c->bm, c->bn, c->wg ? c->st : c->mt};
    static const char *const names[2][4] = {{"HEAD_DIM", "BLOCK_M", "BLOCK_N", "M_TILES"},
                                            {"HEAD_DIM", "BLOCK_M", "BLOCK_N", "STAGES"}};
    static const char *const files[3] = {"attn.cu", "attn_wg.cu", "attn_ws.cu"};
    int n = 0;
    for (int i = 0; i < 4; i++) {
        snprintf(r->text[i], sizeof r->text[i], "%d", nums[i]);
        r->vars[n++] = (render_var){names[c->wg != 0][i], r->text[i]};
    }
    r->vars[n++] = (render_var){"MMA_TYPE", dtype == STOF_BF16 ? "bf16" : "f16"};
    r->req = (jit_request){"mha", files[c->wg], "stof_attn", r->vars, n,
                           c->wg ? "wgmma.cuh" : NULL};
    if (c->wg == MHA_WS) {
        r->vars[n++] = (render_var){"P_SMEM", c->qs ? "1" : "0"};
        r->vars[n++] = (render_var){"SIT_OUT", mha_sit_out(c, seq_q) ? "1" : "0"};
        const int view = c->kind == ATTN_GATHER && period > 1;
        snprintf(r->text[4], sizeof r->text[4], "%d", view ? period : 1);
        r->vars[n++] = (render_var){"GATHER", c->kind == ATTN_GATHER && !view ? "1" : "0"};
        r->vars[n++] = (render_var){"PERIOD", r->text[4]};
        r->req.nvars = n;
        return;
    }
    const int g = c->kind == ATTN_GATHER;
    r->vars[n++] = (render_var){"GATHER_Q", g ? "1" : "0"};
    r->vars[n++] = (render_var){"BLOCK_Q", g ? "0" : "1"};
    r->vars[n++] = (render_var){"GATHER_K", g ? "1" : "0"};
    r->vars[n++] = (render_var){"BLOCK_K", g ? "0" : "1"};
    if (!c->wg) {
        r->vars[n++] = (render_var){"Q_IN_REGS", c->qs ? "0" : "1"};
        r->vars[n++] = (render_var){"Q_IN_SMEM", c->qs ? "1" : "0"};
    }
    r->req.nvars = n;
}

int mha_view_period(const mha_candidate *c, const attn_tiles *t, int seq_q, int seq_k)
{
    return c->wg == MHA_WS && c->kind == ATTN_GATHER ? attn_tiles_view_period(t, seq_q, seq_k) : 1;
}

int mha_sit_out(const mha_candidate *c, int seq_q)
{
    /* Where the idle consumers are a tenth of the work or more: on an H100,
     * 192-row items at dense L 1024 (two of 18 consumers' shares idle) ran
     * 9% faster sitting out, at L 4096 (two of 66) 5% slower (the kernel
     * spills more, the deal evens out less). Two consumers (128 rows) never
     * do: the lagging one's turns were not measured with it. */
    if (c->wg != MHA_WS || c->kind != ATTN_BLOCK || c->bm != 192)
        return 0;
    const int groups = (seq_q + c->bm - 1) / c->bm, rest = seq_q % c->bm;
    const int idle = rest ? (c->bm - rest) / 64 : 0;
    return idle > 0 && 10 * idle >= 3 * groups;
}

int mha_smem_bytes(const mha_candidate *c, int head_dim)
{
    if (c->wg == MHA_WS) { /* Q (two where warpgroup 1 lags: LAG in attn_ws.cu), K and V
                              stages, each consumer's O in whole swizzle atoms (80 columns
                              laid out as 96) unless it is staged in P's tile (O_IN_P), P
                              in atoms of 64 keys; each stage's bitmap and tile, the
                              ones (192 rows at head_dim 64, P in registers), the item (one
                              per Q); barriers; alignment slack */
        const int qb = c->bm == 128 && c->bn == 128 && c->st >= 3 ? 2 : 1;
        const int da = (head_dim + 31) / 32 * 32, pk = (c->bn + 63) / 64 * 64;
        const int o_in_p = c->qs && pk >= da;
        return ((qb + !o_in_p) * c->bm + 2 * c->st * c->bn) * da * 2 +
               (c->qs ? c->bm * pk * 2 : 0) + c->st * (c->bm * ((c->bn + 31) / 32) * 4 + 8) +
               (head_dim == 64 && !c->qs && c->bm == 192 ? c->bn * 128 : 0) + 16 * qb +
               8 * (2 * qb + 4 * c->st) + 1024;
    }
    if (c->wg) /* unpadded swizzled tiles, 1 KiB of alignment slack */
        return (c->bm + 2 * c->st * c->bn) * head_dim * 2 + 16 * c->st + 1024;
    return (c->bm + 4 * c->bn) * (head_dim + 8) * 2 + 2 * c->bn * 4;
}

int mha_threads(const mha_candidate *c)
{
    /* wgmma: a warpgroup per 64 rows; warp-specialized: and a producer's. */
    return c->wg == MHA_WS ? c->bm * 2 + 128 : c->wg ? c->bm * 2 : c->bm / c->mt * 2;
}

int mha_candidates(int head_dim, int smem_max, int wgmma, mha_candidate *out, int cap)
{
    static const int sizes[][4] = {{64, 64, 1, 0},  {128, 64, 1, 0}, {128, 64, 2, 0},
                                   {64, 32, 1, 0},  {128, 32, 1, 0}, {128, 32, 2, 0},
                                   {64, 128, 1, 0}, {128, 128, 1, 0}, {128, 64, 2, 1},
                                   {128, 32, 2, 1}};
    /* Warpgroup MMA: 64 rows per warpgroup, whole 128-byte row halves;
     * rows, keys, stages. */
    static const int wg_sizes[][3] = {{128, 128, 3}, {128, 64, 4}, {192, 64, 4}, {192, 128, 3},
                                      {64, 128, 4},  {64, 64, 4},  {128, 128, 4}, {128, 64, 3},
                                      {64, 64, 3},   {64, 64, 2}};
    /* rows, keys, stages, P through shared memory */
    static const int ws_sizes[][4] = {{128, 128, 2, 0}, {192, 128, 2, 0}, {128, 64, 3, 0},
                                      {128, 192, 2, 0}, {192, 64, 3, 0},  {128, 128, 3, 0},
                                      {192, 128, 2, 1}, {192, 96, 2, 0},  {192, 144, 2, 1},
                                      {192, 128, 3, 0}, {128, 128, 4, 0}};
    int n = 0;
    for (int kind = 0; kind < 2; kind++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && n < cap; i++) {
            mha_candidate c = {(attn_kind)kind, sizes[i][0], sizes[i][1], sizes[i][2], sizes[i][3], 0, 0};
            /* S, O and Q's fragments live in registers: past head_dim 64,
             * 128-key tiles spill, and two row tiles per warp fit only with
             * Q left in shared memory. */
            if (head_dim > 64 && (c.bn == 128 || (c.mt == 2 && !c.qs)))
                continue;
            if (mha_smem_bytes(&c, head_dim) > smem_max)
                continue;
            out[n++] = c;
        }
        const size_t nwg = wgmma && head_dim % 64 == 0 ? sizeof wg_sizes / sizeof wg_sizes[0] : 0;
        for (size_t i = 0; i < nwg && n < cap; i++) {
            mha_candidate c = {(attn_kind)kind, wg_sizes[i][0], wg_sizes[i][1], 1, 0, 1,
                               wg_sizes[i][2]};
            if (mha_smem_bytes(&c, head_dim) <= smem_max)
                out[n++] = c;
        }
        /* Warp-specialized: S of 64 x bn and O of 64 x head_dim in each
         * consumer's registers (232 each with two consumers, 160 with three);
         * head_dim 80 and 96 in swizzled atoms of 32 columns (attn_ws.cu;
         * at 80 the TMA loads fill the last atom's columns 80-95 with zeros,
         * the products and stores leave them out); P through shared memory
         * only where it does not fit in registers. Gathered rows and keys
         * (copied by the producer's threads): head_dim 64 and 128, two
         * consumers, P in registers, 64- and 128-key tiles. */
        const size_t nws = wgmma && head_dim % 16 == 0 && head_dim >= 64 &&
                                   (kind == ATTN_BLOCK || head_dim % 64 == 0)
                               ? sizeof ws_sizes / sizeof ws_sizes[0] : 0;
        for (size_t i = 0; i < nws && n < cap; i++) {
            mha_candidate c = {(attn_kind)kind, ws_sizes[i][0], ws_sizes[i][1], 1, ws_sizes[i][3],
                               MHA_WS, ws_sizes[i][2]};
            if (kind == ATTN_GATHER && (c.bm != 128 || c.qs || c.bn > 128))
                continue;
            const int regs = c.bm == 128 ? (kind == ATTN_GATHER ? 208 : 232) : 160;
            const int live = c.bn / 2 + c.bn / 4 + head_dim / 2; /* S, P, O */
            const int fits = c.qs ? live - c.bn / 4 + 32 <= regs && live + 32 > regs
                                  : live + 32 <= regs;
            /* (192 keys beside an O of 80 or 96 columns fit by this count
             * and spill all the same; 96 keys lost to 128 at head_dim 64;
             * 144 keys, for head_dim 80 and 96, fit in shared memory only
             * with O staged in P's tile.) */
            if (fits && !(c.bn == 192 && head_dim > 64) && !(c.bn == 96 && head_dim <= 64) &&
                !(c.bn == 144 && head_dim != 80 && head_dim != 96) &&
                mha_smem_bytes(&c, head_dim) <= smem_max)
                out[n++] = c;
        }
    }
    return n;
}

static const char *kind_name(attn_kind k) { return k == ATTN_GATHER ? "gather" : "block"; }
static const char *engine_name(const mha_candidate *c)
{
    return c->wg == MHA_WS ? "wgmma-ws" : c->wg ? "wgmma" : "mma.sync";
}

/* ---- argument checks ---------------------------------------------------- */

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
    if ((long long)d->batch * d->heads > 65535)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.batch * desc.heads is above 65535");
    /* The grid's z counts query groups of 64 rows or more. */
    if (d->seq_q > 65535 * 64)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.seq_q %d is above %d", d->seq_q,
                        65535 * 64);
    if (d->head_dim != 32 && d->head_dim != 64 && d->head_dim != 80 && d->head_dim != 96 &&
        d->head_dim != 128)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "desc.head_dim %d is not supported (32, 64, 80, 96, 128)", d->head_dim);
    if (d->dtype != STOF_F16 && d->dtype != STOF_BF16)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "desc.dtype must be STOF_F16 or STOF_BF16");
    if (d->layout != 0 && d->layout != STOF_LAYOUT_BHLD && d->layout != STOF_LAYOUT_BLHD)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.layout %d is not a stof_layout",
                        (int)d->layout);
    if (d->qkv_packed && (d->layout != STOF_LAYOUT_BLHD || d->seq_q != d->seq_k))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "desc.qkv_packed needs layout STOF_LAYOUT_BLHD and seq_q == seq_k");
    if (!(d->scale >= 0.f) || isinf(d->scale))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "desc.scale must be finite and >= 0");
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

static stof_tune tune_level(const stof_mha_desc *d)
{
    if (d->tune != STOF_TUNE_DEFAULT)
        return d->tune;
    const char *e = getenv("STOF_TUNE");
    if (e && strcmp(e, "off") == 0)
        return STOF_TUNE_OFF;
    if (e && strcmp(e, "full") == 0)
        return STOF_TUNE_FULL;
    return STOF_TUNE_FAST;
}

static void shape_string(const stof_mha_desc *d, char *out, size_t n)
{
    snprintf(out, n, "b=%d,h=%d,lq=%d,lk=%d,d=%d,layout=%s%s", d->batch, d->heads, d->seq_q,
             d->seq_k, d->head_dim, d->layout == STOF_LAYOUT_BLHD ? "blhd" : "bhld",
             d->qkv_packed ? ",packed" : "");
}

/* ---- strides and launch ------------------------------------------------- */

typedef struct mha_strides {
    long long s[4][3];   /* q, k, v, out: batch, head, row strides in elements */
    long long kv_offset; /* packed QKV: k = q + offset, v = q + 2 * offset */
} mha_strides;

static mha_strides strides_of(const stof_mha_desc *d)
{
    mha_strides s = {0};
    long long H = d->heads, D = d->head_dim;
    for (int i = 0; i < 4; i++) {
        long long L = (i == 1 || i == 2) ? d->seq_k : d->seq_q;
        if (d->qkv_packed && i < 3) {
            s.s[i][0] = L * 3 * H * D, s.s[i][1] = D, s.s[i][2] = 3 * H * D;
        } else if (d->layout == STOF_LAYOUT_BLHD) {
            s.s[i][0] = L * H * D, s.s[i][1] = D, s.s[i][2] = H * D;
        } else {
            s.s[i][0] = H * L * D, s.s[i][1] = L * D, s.s[i][2] = D;
        }
    }
    s.kv_offset = d->qkv_packed ? H * D : 0;
    return s;
}


/* A TMA descriptor of one of q, k, v, out as the 4-D tensor (head_dim,
 * rows, heads, batch), or with period > 1 the 5-D (head_dim, rows / period,
 * period, heads, batch), with the given element strides (row, head, batch),
 * read or written in boxes of one swizzle atom's columns x box_rows, as
 * attn_ws.cu lays them out: 64 columns 128-byte swizzled at head_dim 64 and
 * 128, 32 columns 64-byte swizzled at 80 and 96; rows and columns past the
 * end read as zeros and are not written. */
static stof_status tensor_map(stof_ctx *ctx, CUtensorMap *map, CUdeviceptr p, const stof_mha_desc *d,
                              int rows, const long long (*stride)[3], int box_rows, int period)
{
    /* With a period, rows as (row / period, row % period): five dimensions. */
    const int sw = d->head_dim % 64 == 0 ? 128 : 64, v = period > 1;
    const long long sl = (*stride)[2] * 2;
    const cuuint64_t dims[5] = {(cuuint64_t)d->head_dim, (cuuint64_t)(rows / period),
                                (cuuint64_t)period, (cuuint64_t)d->heads, (cuuint64_t)d->batch};
    const cuuint64_t strides[4] = {(cuuint64_t)(sl * period), (cuuint64_t)sl,
                                   (cuuint64_t)(*stride)[1] * 2, (cuuint64_t)(*stride)[0] * 2};
    cuuint64_t dv[5], sv[4];
    for (int i = 0, j = 0; i < 5; i++)
        if (v || i != 2)
            dv[j++] = dims[i];
    for (int i = 0, j = 0; i < 4; i++)
        if (v || i != 1)
            sv[j++] = strides[i];
    const cuuint32_t box[5] = {(cuuint32_t)sw / 2, (cuuint32_t)box_rows, 1, 1, 1},
                     elem_strides[5] = {1, 1, 1, 1, 1};
    /* What the L2 fetches for each 128-byte request of the copy engine: 256
     * bytes serve a row wider than one atom (its next atom's columns); a row
     * of one atom takes the 128 asked for. Through the view the other 128
     * would be another residue's row, read by other items if at all. H100,
     * 128 against 256 at head_dim 64: dilated:256:2 6-15% faster, block tiles
     * 0-4% at L 512 and within 2% at L 1024-4096; at head_dim 128 the view
     * ran 2-6% slower with 128. */
    const CUtensorMapL2promotion promote = d->head_dim * 2 <= 128
                                               ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                                               : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
    return CU(ctx, TensorMapEncodeTiled(
                       map, d->dtype == STOF_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                  : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                       4 + v, (void *)p, dv, sv, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                       sw == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                       promote, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

/* The warp-specialized engine's launch: descriptors for this run's
 * pointers (none where it gathers rows: it reads the pointers and strides
 * then), the persistent grid load_candidate dealt the work to. */
static stof_status launch_ws(stof_ctx *ctx, const stof_mha_desc *d, const mha_launch *L,
                             const mha_strides *s, CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                             CUdeviceptr out, CUdeviceptr seq_lens, float scale_log2,
                             CUstream stream, mha_maps *cache)
{
    const CUdeviceptr at[4] = {q, k, v, out};
    const int rows[4] = {d->seq_q, d->seq_k, d->seq_k, d->seq_q},
              box[4] = {L->bm, L->bn, L->bn, 64};
    CUtensorMap t[4];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 4 && !L->gather; i++) {
        if (cache && cache->at[i] == at[i]) {
            memcpy(&t[i], cache->map[i], sizeof t[i]);
            continue;
        }
        TRY(tensor_map(ctx, &t[i], at[i], d, rows[i], &s->s[i], box[i], L->period));
        if (cache) {
            memcpy(cache->map[i], &t[i], sizeof t[i]);
            cache->at[i] = at[i];
        }
    }
    int lq = d->seq_q, lk = d->seq_k;
    CUdeviceptr items = L->tiles + L->items, first = items + 16 * (size_t)L->n_items,
                tile_key = L->tiles + L->lay.tile_key, tile_bits = L->tiles + L->lay.tile_bits,
                bits = L->tiles + L->lay.bits, qidx = L->tiles + L->lay.qidx,
                kidx = L->tiles + L->lay.kidx;
    long long st[4][3];
    memcpy(st, s->s, sizeof st);
    void *args[] = {&t[0],     &t[1],     &t[2],     &t[3],     &lq,        &lk,
                    &seq_lens, &items,    &first,    &tile_key, &tile_bits, &bits,
                    &scale_log2, &q,      &k,        &v,        &out,       &st[0][0],
                    &st[0][1], &st[0][2], &st[1][0], &st[1][1], &st[1][2],  &st[2][0],
                    &st[2][1], &st[2][2], &st[3][0], &st[3][1], &st[3][2],  &qidx,
                    &kidx};
    return jit_launch(ctx, L->fn, (unsigned)L->ctas, 1, 1, (unsigned)L->threads, (unsigned)L->smem,
                      stream, args);
}

/* Enqueues one run; the context must be current. */
static stof_status launch(stof_ctx *ctx, const stof_mha_desc *d, const mha_launch *L,
                          CUdeviceptr q, CUdeviceptr k, CUdeviceptr v, CUdeviceptr out,
                          CUdeviceptr seq_lens, CUstream stream, mha_maps *maps)
{
    mha_strides s = strides_of(d);
    if (d->qkv_packed) {
        k = q + (CUdeviceptr)(s.kv_offset * 2);
        v = q + (CUdeviceptr)(s.kv_offset * 4);
    }
    int lq = d->seq_q, lk = d->seq_k;
    float scale = d->scale > 0.f ? d->scale : 1.f / sqrtf((float)d->head_dim);
    float scale_log2 = scale * 1.4426950408889634f;
    if (L->n_groups == 0)
        return STOF_OK;
    if (L->wg == MHA_WS)
        return launch_ws(ctx, d, L, &s, q, k, v, out, seq_lens, scale_log2, stream, maps);
    CUdeviceptr work = L->tiles + L->lay.work, qidx = L->tiles + L->lay.qidx,
                tile_key = L->tiles + L->lay.tile_key,
                tile_bits = L->tiles + L->lay.tile_bits, kidx = L->tiles + L->lay.kidx,
                bits = L->tiles + L->lay.bits;
    void *args[] = {&q, &k, &v, &out,
                    &s.s[0][0], &s.s[0][1], &s.s[0][2], &s.s[1][0], &s.s[1][1], &s.s[1][2],
                    &s.s[2][0], &s.s[2][1], &s.s[2][2], &s.s[3][0], &s.s[3][1], &s.s[3][2],
                    &lq, &lk, &seq_lens, &work, &qidx, &tile_key,
                    &tile_bits, &kidx, &bits, &scale_log2};
    /* Grid (heads, batch, groups by rank): see stof_work_item. */
    return jit_launch(ctx, L->fn, (unsigned)d->heads, (unsigned)d->batch, (unsigned)L->n_groups,
                      (unsigned)L->threads, (unsigned)L->smem, stream, args);
}

/* Loads c's kernel (looked for under `known` first: jit_get_known) and
 * uploads t for it. */
static stof_status load_candidate(stof_ctx *ctx, const stof_mha_desc *d, const mha_candidate *c,
                                  const attn_tiles *t, const char *known, mha_launch *L)
{
    memset(L, 0, sizeof *L);
    mha_request r;
    L->period = mha_view_period(c, t, d->seq_q, d->seq_k);
    mha_make_request(c, d->head_dim, d->seq_q, d->dtype, L->period, &r);
    TRY(jit_get_known(ctx, &r.req, known, &L->fn, L->key));
    L->wg = c->wg;
    L->gather = c->wg == MHA_WS && c->kind == ATTN_GATHER && L->period == 1;
    L->bm = c->bm;
    L->bn = c->bn;
    L->threads = mha_threads(c);
    L->smem = mha_smem_bytes(c, d->head_dim);
    L->n_groups = t->n_groups;
    L->lay = attn_tiles_layout_of(t);
    long long n_items = c->wg == MHA_WS ? (long long)t->n_groups * d->batch * d->heads : 0;
    if (n_items > INT_MAX / 4)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "%lld work items are more than the kernel counts",
                        n_items);
    L->items = L->lay.total;
    L->n_items = (int)n_items;
    /* Persistent: one CTA per SM at most, as many as there are items. */
    L->ctas = n_items < ctx->dev.sm_count ? (int)n_items : ctx->dev.sm_count;
    const size_t total = L->items + 16 * (size_t)n_items + 4 * (size_t)(L->ctas + 1);
    void *host = malloc(total);
    if (!host)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory packing attention tiles");
    attn_tiles_pack(t, &L->lay, host);
    /* Runs of heads whose K and V fill half the L2 (dense attention at L
     * 4096 read 452 MB from DRAM for 50 MB of K and V when the heaviest
     * groups went first across all heads). */
    const double kv = 4.0 * d->seq_k * d->head_dim;
    const int run = (int)fmin((ctx->dev.l2_bytes > 0 ? ctx->dev.l2_bytes : 50 << 20) / 2 / kv,
                              (double)d->batch * d->heads);
    int32_t *items = (int32_t *)((char *)host + L->items);
    if (n_items && !attn_tiles_schedule(t, d->batch, d->heads, run, L->ctas,
                                        mha_sit_out(c, d->seq_q) ? d->seq_q : 0, items,
                                        items + 4 * (size_t)n_items)) {
        free(host);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory scheduling attention work");
    }
    if (L->period > 1)
        attn_tiles_view(t, items, n_items, (int32_t *)((char *)host + L->lay.tile_key));
    stof_status st = jit_push(ctx);
    if (st == STOF_OK) {
        st = CU(ctx, FuncSetAttribute(L->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, L->smem));
        if (st == STOF_OK)
            st = CU(ctx, MemAlloc(&L->tiles, total));
        if (st == STOF_OK && (st = CU(ctx, MemcpyHtoD(L->tiles, host, total))) != STOF_OK) {
            ctx->dev.api.MemFree(L->tiles);
            L->tiles = 0;
        }
        jit_pop(ctx);
    }
    free(host);
    return st;
}

static void unload_candidate(stof_ctx *ctx, mha_launch *L)
{
    if (L->tiles && jit_push(ctx) == STOF_OK) {
        ctx->dev.api.MemFree(L->tiles);
        jit_pop(ctx);
    }
    L->tiles = 0;
}

/* ---- the search --------------------------------------------------------- */

typedef struct cand_state {
    mha_candidate c;         /* these first fields are an mha_tried */
    double predicted_ms, ms;
    const char *verdict;
    attn_tiles tiles;
    int built;
} cand_state;

/* Random inputs for timing, rotated over sets so the L2 does not flatter. */
typedef struct search_io {
    int nsets;
    size_t q_elems, kv_elems, o_elems;
    CUdeviceptr q[4], k[4], v[4], out;
    uint16_t *hq, *hk, *hv;  /* set 0 on the host, for the CPU check */
    /* Outputs on the host, page-locked (a pageable copy of 50 MB took
     * 50 ms a candidate): the first candidate's, and the one compared
     * with it. pinned[i]: from cuMemAllocHost, else malloc. */
    uint16_t *first, *cur;
    int pinned[2];
} search_io;

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void mha_fill_random(uint16_t *p, size_t n, stof_dtype t, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        float x = (float)((rng_next(&seed) >> 40) * 0x1.0p-24 * 2.0 - 1.0);
        p[i] = t == STOF_BF16 ? bf16_from_float(x) : half_from_float(x);
    }
}

#define FILL_PERIOD 1048573
void mha_fill_periodic(uint16_t *p, size_t n, stof_dtype t, uint64_t seed, float scale,
                       float offset)
{
    size_t m = n < FILL_PERIOD ? n : FILL_PERIOD;
    mha_fill_random(p, m, t, seed);
    if (scale != 1 || offset != 0)
        for (size_t i = 0; i < m; i++)
            dtype_store(t, p, i, offset + scale * (float)dtype_load(t, p, i));
    for (size_t at = m; at < n; at += m)
        memcpy(p + at, p, 2 * (n - at < m ? n - at : m));
}

static void io_free(stof_ctx *ctx, search_io *io)
{
    if (jit_push(ctx) == STOF_OK) {
        for (int i = 0; i < 4; i++) {
            if (io->q[i]) ctx->dev.api.MemFree(io->q[i]);
            if (io->k[i]) ctx->dev.api.MemFree(io->k[i]);
            if (io->v[i]) ctx->dev.api.MemFree(io->v[i]);
        }
        if (io->out)
            ctx->dev.api.MemFree(io->out);
        uint16_t *h[2] = {io->first, io->cur};
        for (int i = 0; i < 2; i++)
            if (h[i] && io->pinned[i])
                ctx->dev.api.MemFreeHost(h[i]);
        jit_pop(ctx);
    }
    if (!io->pinned[0])
        free(io->first);
    if (!io->pinned[1])
        free(io->cur);
    free(io->hq);
    free(io->hk);
    free(io->hv);
    memset(io, 0, sizeof *io);
}

static stof_status io_alloc(stof_ctx *ctx, const stof_mha_desc *d, search_io *io)
{
    memset(io, 0, sizeof *io);
    size_t bh = (size_t)d->batch * d->heads, D = (size_t)d->head_dim;
    io->q_elems = bh * (size_t)d->seq_q * D * (d->qkv_packed ? 3 : 1);
    io->kv_elems = d->qkv_packed ? 0 : bh * (size_t)d->seq_k * D;
    io->o_elems = bh * (size_t)d->seq_q * D;
    size_t set_bytes = 2 * (io->q_elems + 2 * io->kv_elems);
    size_t l2 = ctx->dev.l2_bytes > 0 ? (size_t)ctx->dev.l2_bytes : 50u << 20;
    io->nsets = (int)((2 * l2 + set_bytes - 1) / set_bytes);
    io->nsets = io->nsets < 1 ? 1 : io->nsets > 4 ? 4 : io->nsets;
    io->hq = malloc(2 * io->q_elems);
    io->hk = malloc(2 * (io->kv_elems ? io->kv_elems : 1));
    io->hv = malloc(2 * (io->kv_elems ? io->kv_elems : 1));
    if (!io->hq || !io->hk || !io->hv) {
        io_free(ctx, io);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the search's inputs");
    }
    /* One random fill (the host's copy is what the CPU check reads); the
     * sets are copies of it at other addresses, which is all that keeps
     * the L2 from flattering (filling each set anew cost a cold plan at
     * L 4096 over a second). */
    mha_fill_periodic(io->hq, io->q_elems, d->dtype, 1000, 1, 0);
    mha_fill_periodic(io->hk, io->kv_elems, d->dtype, 2000, 1, 0);
    mha_fill_periodic(io->hv, io->kv_elems, d->dtype, 3000, 1, 0);
    stof_status st = jit_push(ctx);
    for (int s = 0; st == STOF_OK && s < io->nsets; s++) {
        st = CU(ctx, MemAlloc(&io->q[s], 2 * io->q_elems));
        if (st == STOF_OK)
            st = CU(ctx, MemcpyHtoD(io->q[s], io->hq, 2 * io->q_elems));
        if (st == STOF_OK && io->kv_elems) {
            st = CU(ctx, MemAlloc(&io->k[s], 2 * io->kv_elems));
            if (st == STOF_OK)
                st = CU(ctx, MemcpyHtoD(io->k[s], io->hk, 2 * io->kv_elems));
            if (st == STOF_OK)
                st = CU(ctx, MemAlloc(&io->v[s], 2 * io->kv_elems));
            if (st == STOF_OK)
                st = CU(ctx, MemcpyHtoD(io->v[s], io->hv, 2 * io->kv_elems));
        }
    }
    if (st == STOF_OK)
        st = CU(ctx, MemAlloc(&io->out, 2 * io->o_elems));
    if (st == STOF_OK) {
        jit_pop(ctx);
        return STOF_OK;
    }
    jit_pop(ctx);
    io_free(ctx, io);
    return st;
}

typedef struct timed_launch {
    const stof_mha_desc *d;
    const mha_launch *L;
    const search_io *io;
} timed_launch;

static stof_status run_timed(stof_ctx *ctx, void *arg, int i)
{
    const timed_launch *t = arg;
    const int s = i % t->io->nsets;
    return launch(ctx, t->d, t->L, t->io->q[s], t->io->k[s], t->io->v[s], t->io->out, 0, NULL,
                  NULL);
}

/* Median milliseconds of one run; the output left in io->out is input set 0's. */
static stof_status time_candidate(stof_ctx *ctx, const stof_mha_desc *d, const mha_launch *L,
                                  const search_io *io, double *ms)
{
    timed_launch t = {d, L, io};
    return timing_median(ctx, run_timed, &t, ms);
}

/* The output of the last launch, on the host: into io->first (which = 0)
 * or io->cur (1), made on first use. */
static stof_status fetch_out(stof_ctx *ctx, search_io *io, int which)
{
    uint16_t **h = which ? &io->cur : &io->first;
    TRY(jit_push(ctx));
    stof_status st = STOF_OK;
    if (!*h) {
        /* Page-locked where the system allows, else plain memory. */
        io->pinned[which] = ctx->dev.api.MemAllocHost((void **)h, 2 * io->o_elems) == CUDA_SUCCESS;
        if (!io->pinned[which] && !(*h = malloc(2 * io->o_elems)))
            st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the search's outputs");
    }
    if (st == STOF_OK)
        st = CU(ctx, MemcpyDtoH(*h, io->out, 2 * io->o_elems));
    jit_pop(ctx);
    return st;
}

/* Relative L2 distance of a from b (NaN anywhere: infinite), converting
 * through a table of all 65536 values. */
static stof_status rel_l2(stof_ctx *ctx, const uint16_t *a, const uint16_t *b, size_t n,
                          stof_dtype t, double *out)
{
    float *val = malloc(65536 * sizeof *val);
    if (!val)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory comparing outputs");
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        val[i] = (float)dtype_load(t, &h, 0);
    }
    double num = 0, den = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        double x = val[a[i]], y = val[b[i]];
        nan |= isnan(x) || isnan(y);
        num += (x - y) * (x - y);
        den += y * y;
    }
    free(val);
    *out = nan ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
    return STOF_OK;
}

/* The reference's share of a search: head (0, 0) is checked on every row
 * while its allowed entries times head_dim stay below this (about a tenth
 * of a second of the double reference), else on a sample of rows. */
#define CHECK_BUDGET 1e8

/* The rows checked: all of them, or the first and last 64 and in between
 * every stride-th row, at an offset that moves from one block of 64 rows to
 * the next so that every position within a tile is met. */
static unsigned char *check_rows(const stof_mha_desc *d, const mask_summary *ms)
{
    int lq = d->seq_q;
    double work = (double)ms->info.entries * d->head_dim;
    int stride = work <= CHECK_BUDGET ? 1 : (int)ceil(work / CHECK_BUDGET);
    unsigned char *rows = malloc((size_t)lq);
    for (int i = 0; rows && i < lq; i++)
        rows[i] = i < 64 || i >= lq - 64 || i % stride == (i / 64) % stride;
    return rows;
}

/* Checks head (0, 0) of a GPU output against the CPU reference, on the
 * rows check_rows picks. */
static stof_status cpu_check(stof_ctx *ctx, const stof_mha_desc *d, const mask_summary *ms,
                             const search_io *io, const uint16_t *gpu, int *checked, double *err)
{
    *checked = 0;
    mha_strides s = strides_of(d);
    size_t D = (size_t)d->head_dim, lq = (size_t)d->seq_q, lk = (size_t)d->seq_k;
    uint16_t *q = malloc(2 * lq * D), *k = malloc(2 * lk * D), *v = malloc(2 * lk * D);
    double *ref = malloc(sizeof(double) * lq * D);
    unsigned char *rows = check_rows(d, ms);
    stof_status st = STOF_OK;
    if (!q || !k || !v || !ref || !rows) {
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the CPU check");
        goto done;
    }
    const uint16_t *hk = d->qkv_packed ? io->hq + s.kv_offset : io->hk;
    const uint16_t *hv = d->qkv_packed ? io->hq + 2 * s.kv_offset : io->hv;
    for (size_t r = 0; r < lq; r++)
        memcpy(q + r * D, io->hq + r * s.s[0][2], 2 * D);
    for (size_t r = 0; r < lk; r++) {
        memcpy(k + r * D, hk + r * s.s[1][2], 2 * D);
        memcpy(v + r * D, hv + r * s.s[2][2], 2 * D);
    }
    ref_attn_args a = {1, 1, d->seq_q, d->seq_k, d->head_dim, d->dtype, STOF_LAYOUT_BHLD,
                       d->scale, q, k, v, ms->runs, NULL, rows};
    if ((st = ref_attention(ctx, &a, ref)) != STOF_OK)
        goto done;
    double num = 0, den = 0;
    for (size_t r = 0; r < lq; r++)
        for (size_t c = 0; c < D && rows[r]; c++) {
            double g = dtype_load(d->dtype, gpu, r * s.s[3][2] + c), x = ref[r * D + c];
            num += (g - x) * (g - x);
            den += x * x;
        }
    *err = isnan(num) ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
    *checked = 1;
done:
    free(q);
    free(k);
    free(v);
    free(ref);
    free(rows);
    return st;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* ---- the model's device figures ----------------------------------------- */

static stof_status compile_candidates(stof_ctx *ctx, const stof_mha_desc *d, const cand_state *cs,
                                      const int *idx, int m);

/* What an engine's tiles achieve on dense attention (fp16, b=4, h=16,
 * l=2048, d=64), timed as the search times candidates, in TFLOP/s. */
#define FIGURE_B 4
#define FIGURE_H 16
#define FIGURE_L 2048
#define FIGURE_D 64
static const stof_mha_desc FIGURE_DESC = {.batch = FIGURE_B, .heads = FIGURE_H,
                                          .seq_q = FIGURE_L, .seq_k = FIGURE_L,
                                          .head_dim = FIGURE_D, .dtype = STOF_F16,
                                          .layout = STOF_LAYOUT_BHLD};
/* The tiles each engine is measured on, by engine (mha_candidate.wg). */
static const mha_candidate FIGURE_ENGINES[3] = {{ATTN_BLOCK, 64, 64, 1, 0, 0, 0},
                                                {ATTN_BLOCK, 128, 64, 1, 0, 1, 4},
                                                {ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}};

static stof_status measure_engine(stof_ctx *ctx, int wg, double *tflops)
{
    const int B = FIGURE_B, H = FIGURE_H, L = FIGURE_L, D = FIGURE_D;
    stof_mha_desc d = FIGURE_DESC;
    const mha_candidate c = FIGURE_ENGINES[wg];
    stof_mask *m = NULL;
    TRY(stof_mask_parse(ctx, "dense", L, L, &m));
    mask_summary dense;
    attn_tiles t;
    stof_status st = mask_summarize(ctx, m, &dense);
    if (st == STOF_OK)
        st = attn_tiles_build(ctx, &dense, c.kind, c.bm, c.bn, &t);
    mask_summary_free(&dense);
    stof_mask_free(m);
    if (st != STOF_OK)
        return st;
    search_io io;
    mha_launch lc;
    double ms = 0;
    if ((st = io_alloc(ctx, &d, &io)) == STOF_OK) {
        if ((st = load_candidate(ctx, &d, &c, &t, NULL, &lc)) == STOF_OK) {
            st = time_candidate(ctx, &d, &lc, &io, &ms);
            unload_candidate(ctx, &lc);
        }
        io_free(ctx, &io);
    }
    attn_tiles_free(&t);
    if (st == STOF_OK && !(ms > 0))
        st = CTX_FAIL(ctx, STOF_ERR_INTERNAL, "timing the %s engine gave %g ms",
                      engine_name(&c), ms);
    if (st == STOF_OK)
        *tflops = 4.0 * B * H * (double)L * L * D / (ms * 1e-3) / 1e12;
    return st;
}

/* Keeps the figures on the context (out of memory, a later plan looks
 * them up again). */
static void keep_figures(stof_ctx *ctx, const model_device *md)
{
    if (!ctx->model)
        ctx->model = malloc(sizeof *ctx->model);
    if (ctx->model)
        *ctx->model = *md;
}

/* The figures, measured only where `measure` allows (compile-only work
 * takes the arch's defaults rather than time anything). */
static stof_status device_figures(stof_ctx *ctx, model_device *md, int measure)
{
    *md = model_device_of(&ctx->dev, ctx->arch);
    if (!ctx->dev.ok)
        return STOF_OK;  /* compiling for a named arch: its defaults */
    if (ctx->model) {
        *md = *ctx->model;
        return STOF_OK;
    }
    /* Once per device and arch, in the cache next to the tuning records. */
    if (ctx->cache) {
        cache_tuning rec;
        int found = 0;
        TRY(cache_get_tuning(&ctx->err, ctx->cache, "device", "-", ctx->dev.name, "-", ctx->arch,
                             &rec, &found));
        model_device got;
        int ok = found && model_device_parse(rec.record, &got) && got.measured;
        if (found)
            cache_tuning_free(&rec);
        if (ok) {
            *md = got;
            keep_figures(ctx, md);
            return STOF_OK;
        }
    }
    if (!measure)
        return STOF_OK;
    int khz = 0;
    TRY(CU(ctx, DeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, ctx->dev.dev)));
    md->clock_mhz = khz / 1000;
    /* The engines' kernels compile together, as a search's do (one after
     * another they cost a cold plan two seconds); a failure shows again
     * when the engine is measured. */
    int engines = strcmp(ctx->arch, "sm_90a") == 0 ? 3 : 1, idx[3] = {0, 1, 2};
    cand_state cs[3];
    memset(cs, 0, sizeof cs);
    for (int i = 0; i < engines; i++)
        cs[i].c = FIGURE_ENGINES[i];
    err_record before = ctx->err;
    if (compile_candidates(ctx, &FIGURE_DESC, cs, idx, engines) != STOF_OK)
        ctx->err = before;
    TRY(measure_engine(ctx, 0, &md->mma_tflops));
    if (strcmp(ctx->arch, "sm_90a") == 0)
        TRY(measure_engine(ctx, 1, &md->wgmma_tflops));
    if (strcmp(ctx->arch, "sm_90a") == 0)
        TRY(measure_engine(ctx, MHA_WS, &md->ws_tflops));
    TRY(timing_bandwidth(ctx, &md->mem_gbs));
    md->measured = 1;
    keep_figures(ctx, md);
    char *record = model_device_format(md, ctx->dev.name);
    if (!record)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory");
    if (ctx->cache) {
        /* A record that fails to store costs a later measurement, no more. */
        err_record saved = ctx->err;
        cache_tuning t = {"device", "-", ctx->dev.name, "-", ctx->arch, record, 0};
        if (cache_put_tuning(&ctx->err, ctx->cache, &t) == STOF_OK)
            ctx->err = saved;
    }
    free(record);
    return STOF_OK;
}

stof_status mha_device_figures(stof_ctx *ctx, model_device *md)
{
    return device_figures(ctx, md, 1);
}

static int by_prediction(const void *a, const void *b)
{
    const cand_state *x = a, *y = b;
    return x->predicted_ms < y->predicted_ms ? -1 : x->predicted_ms > y->predicted_ms;
}

/* Shared memory a block may opt in to: the device's, or an H100's where
 * there is no device (compiling offline for sm_90a). */
static int device_smem(const stof_ctx *ctx)
{
    return ctx->dev.ok ? ctx->dev.smem_optin : 227 * 1024;
}

/* Builds every candidate's tiles and ranks them by the model. Gathered
 * tiles are skipped where block tiles already waste little. */
static stof_status rank_candidates(stof_ctx *ctx, const stof_mha_desc *d, const mask_summary *ms,
                                   int measure, cand_state *cs, int *n)
{
    mha_candidate c[MHA_MAX_CANDIDATES];
    int nc = mha_candidates(d->head_dim, device_smem(ctx), strcmp(ctx->arch, "sm_90a") == 0, c,
                            MHA_MAX_CANDIDATES);
    int want_gather = ms->info.block_efficiency < MHA_GATHER_BELOW;
    model_device md;
    TRY(device_figures(ctx, &md, measure));
    *n = 0;
    for (int i = 0; i < nc; i++) {
        if (c[i].kind == ATTN_GATHER && !want_gather)
            continue;
        cand_state *s = &cs[(*n)++];
        memset(s, 0, sizeof *s);
        s->c = c[i];
        stof_status st = attn_tiles_build(ctx, ms, c[i].kind, c[i].bm, c[i].bn, &s->tiles);
        if (st != STOF_OK) {
            for (int j = 0; j < *n - 1; j++)
                attn_tiles_free(&cs[j].tiles);
            *n = 0;
            return st;
        }
        s->built = 1;
        s->predicted_ms =
            model_attn_ms(&md, &s->tiles, d->batch * d->heads, d->head_dim, s->c.mt, s->c.wg);
    }
    qsort(cs, (size_t)*n, sizeof *cs, by_prediction);
    return STOF_OK;
}

static void free_candidates(cand_state *cs, int n)
{
    for (int i = 0; i < n; i++)
        attn_tiles_free(&cs[i].tiles);
}

/* Stage 1's sizes for each kind: mma.sync's 64x64, wgmma's 64x64 (small
 * tiles waste least on windows) and 128x64 (dense rows), four stages, and
 * the warp-specialized engine's 128x128, 192x128 and (at head_dim 80 and
 * 96) 192x96 and 192x144, two stages (long rows). */
static int is_default_size(const mha_candidate *c)
{
    if (c->wg == MHA_WS)
        return (c->bm == 128 || c->bm == 192) &&
               (c->bn == 128 || (c->bm == 192 && (c->bn == 96 || c->bn == 144))) && c->st == 2;
    if (c->wg)
        return (c->bm == 64 || c->bm == 128) && c->bn == 64 && c->st == 4;
    return c->bm == 64 && c->bn == 64 && c->mt == 1 && !c->qs;
}

/* Times candidate s and checks its output, recording the verdict: the
 * first to run (*have_first 0) against the CPU reference, every later one
 * against the first's output. */
static stof_status try_candidate(stof_ctx *ctx, const stof_mha_desc *d, const mask_summary *ms,
                                 cand_state *s, search_io *io, int *have_first)
{
    mha_launch L;
    stof_status st = load_candidate(ctx, d, &s->c, &s->tiles, NULL, &L);
    if (st == STOF_OK)
        st = time_candidate(ctx, d, &L, io, &s->ms);
    if (st == STOF_OK)
        st = fetch_out(ctx, io, *have_first);
    unload_candidate(ctx, &L);
    if (st != STOF_OK) {
        s->verdict = "failed";
        return st;
    }
    if (!*have_first) {
        int checked = 0;
        double err = 0;
        st = cpu_check(ctx, d, ms, io, io->first, &checked, &err);
        double tol = d->dtype == STOF_BF16 ? 1.5e-2 : 5e-3;
        if (st == STOF_OK && checked && !(err <= tol)) {
            s->verdict = "mismatch";
            return CTX_FAIL(ctx, STOF_ERR_INTERNAL,
                            "attention kernel %s %dx%d (%s, m_tiles %d, q in %s) disagrees "
                            "with the CPU reference (relative L2 error %.3g)",
                            kind_name(s->c.kind), s->c.bm, s->c.bn, engine_name(&s->c), s->c.mt,
                            s->c.qs ? "smem" : "regs", err);
        }
        s->verdict = "ok";
        *have_first = 1;
        return st;
    }
    double tol = d->dtype == STOF_BF16 ? 2e-2 : 1e-2, dist = 0;
    TRY(rel_l2(ctx, io->cur, io->first, io->o_elems, d->dtype, &dist));
    s->verdict = dist <= tol ? "ok" : "mismatch";
    return STOF_OK;
}

/* Compiles the candidates listed in idx together (jit_prepare_all), so a
 * search pays for the slowest compile rather than for all of them. */
static stof_status compile_candidates(stof_ctx *ctx, const stof_mha_desc *d, const cand_state *cs,
                                      const int *idx, int m)
{
    if (m <= 0)
        return STOF_OK;
    mha_request *r = malloc((size_t)m * sizeof *r);
    jit_request *reqs = malloc((size_t)m * sizeof *reqs);
    stof_status st = STOF_OK;
    if (!r || !reqs) {
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory listing attention kernels");
    } else {
        for (int i = 0; i < m; i++) {
            const cand_state *c = &cs[idx[i]];
            mha_make_request(&c->c, d->head_dim, d->seq_q, d->dtype,
                             mha_view_period(&c->c, &c->tiles, d->seq_q, d->seq_k), &r[i]);
            reqs[i] = r[i].req;
        }
        st = jit_prepare_all(ctx, reqs, m);
    }
    free(r);
    free(reqs);
    return st;
}

/* Which candidates a stage times, in order: stage 1, the default size of
 * every kind; stage 2, the winner kind's others, best-ranked first, at most
 * cap; never more than left. */
static int stage_set(const cand_state *cs, int n, int stage, int winner, int left, int cap,
                     int *idx)
{
    int m = 0;
    for (int i = 0; i < n && m < left; i++) {
        const cand_state *s = &cs[i];
        if (s->verdict)
            continue;
        if (stage == 1 ? !is_default_size(&s->c)
                       : winner < 0 || s->c.kind != cs[winner].c.kind || m >= cap)
            continue;
        idx[m++] = i;
    }
    return m;
}

/* Stage 1: every kind's default sizes. Stage 2: the winner kind's other
 * sizes, on either engine, best-ranked first (all of them when tuning full).
 * Each stage's kernels are compiled together before any is timed; a kernel
 * that fails to compile there fails again, in order, when it is loaded. */
static stof_status search(stof_ctx *ctx, const stof_mha_desc *d, const mask_summary *ms,
                          cand_state *cs, int n, stof_tune level, int *winner)
{
    search_io io;
    TRY(io_alloc(ctx, d, &io));
    int have_first = 0;
    double t0 = now_s();
    int budget = d->max_candidates > 0 ? d->max_candidates : 1 << 30, timed = 0;
    int stage2_cap = level == STOF_TUNE_FULL ? 1 << 30 : 3;
    stof_status st = STOF_OK;
    *winner = -1;
    for (int stage = 1; stage <= 2 && st == STOF_OK; stage++) {
        int idx[MHA_MAX_CANDIDATES];
        int m = stage_set(cs, n, stage, *winner, budget - timed, stage2_cap, idx);
        /* Out of time: the loop would stop at its first candidate. */
        if (d->max_seconds > 0 && now_s() - t0 > d->max_seconds && *winner >= 0)
            m = 0;
        err_record saved = ctx->err;
        if (compile_candidates(ctx, d, cs, idx, m) != STOF_OK)
            ctx->err = saved;
        for (int k = 0; k < m && st == STOF_OK; k++) {
            if (d->max_seconds > 0 && now_s() - t0 > d->max_seconds && *winner >= 0)
                break;
            cand_state *s = &cs[idx[k]];
            st = try_candidate(ctx, d, ms, s, &io, &have_first);
            timed++;
            if (st == STOF_OK && strcmp(s->verdict, "ok") == 0 &&
                (*winner < 0 || s->ms < cs[*winner].ms))
                *winner = idx[k];
        }
        /* Stage 1 found no default-sized candidate (the device's shared
         * memory ruled them out): take the best-ranked one. */
        if (stage == 1 && *winner < 0 && st == STOF_OK && n > 0 && timed < budget) {
            st = try_candidate(ctx, d, ms, &cs[0], &io, &have_first);
            timed++;
            if (st == STOF_OK && strcmp(cs[0].verdict, "ok") == 0)
                *winner = 0;
        }
    }
    io_free(ctx, &io);
    if (st == STOF_OK && *winner < 0)
        st = CTX_FAIL(ctx, STOF_ERR_INTERNAL, "no attention candidate passed its checks");
    return st;
}

char *mha_record_format(const mha_tried *cs, int n, int winner, const char *kernel, const char *why,
                        const char *mask_spec)
{
    strbuf b = {0};
    const mha_tried *w = &cs[winner];
    strbuf_printf(&b,
                  "{\"winner\":{\"kind\":\"%s\",\"bm\":%d,\"bn\":%d,\"mt\":%d,\"qs\":%d,\"wg\":%d,"
                  "\"st\":%d,\"ms\":%.6f,\"predicted_ms\":%.6f,\"kernel\":\"%s\"},"
                  "\"model_error\":%.4f,\"how\":\"%s\",",
                  kind_name(w->c.kind), w->c.bm, w->c.bn, w->c.mt, w->c.qs, w->c.wg, w->c.st, w->ms,
                  w->predicted_ms, kernel,
                  w->ms > 0 ? w->predicted_ms / w->ms - 1 : 0.0, why);
    char id[17];
    if (jit_source_id(id))
        strbuf_printf(&b, "\"source\":\"%s\",", id);
    /* A spec is [a-z0-9_:,+&-] only, so it needs no escaping; a record
     * without one just cannot name its mask. */
    if (mask_spec && *mask_spec && strspn(mask_spec, "abcdefghijklmnopqrstuvwxyz0123456789_:,+&-") ==
                                       strlen(mask_spec))
        strbuf_printf(&b, "\"mask\":\"%s\",", mask_spec);
    strbuf_puts(&b, "\"tried\":[");
    int first = 1;
    for (int i = 0; i < n; i++) {
        const mha_tried *s = &cs[i];
        strbuf_printf(&b, "%s{\"kind\":\"%s\",\"bm\":%d,\"bn\":%d,\"mt\":%d,\"qs\":%d,\"wg\":%d,"
                      "\"st\":%d,\"predicted_ms\":%.6f",
                      first ? "" : ",", kind_name(s->c.kind), s->c.bm, s->c.bn, s->c.mt, s->c.qs,
                      s->c.wg, s->c.st, s->predicted_ms);
        if (s->verdict)
            strbuf_printf(&b, ",\"ms\":%.6f,\"verdict\":\"%s\"", s->ms, s->verdict);
        strbuf_puts(&b, "}");
        first = 0;
    }
    strbuf_puts(&b, "]}");
    return strbuf_take(&b);
}

int mha_record_kernel(const char *rec, char key[65])
{
    char id[17], got[17];
    const char *k = rec ? strstr(rec, "\"kernel\":\"") : NULL;
    const char *s = rec ? strstr(rec, "\"source\":\"") : NULL;
    if (!k || !s || !jit_source_id(id) || sscanf(s, "\"source\":\"%16[0-9a-f]\"", got) != 1 ||
        strcmp(got, id) != 0 || sscanf(k, "\"kernel\":\"%64[0-9a-f]\"", key) != 1)
        return 0;
    return strlen(key) == 64;
}

/* The winner stored in a tuning record. */
int mha_record_parse(const char *rec, mha_candidate *c, double *ms, double *pred)
{
    const char *w = rec ? strstr(rec, "\"winner\":{") : NULL;
    char kind[16];
    if (!w || sscanf(w, "\"winner\":{\"kind\":\"%15[a-z]\",\"bm\":%d,\"bn\":%d,\"mt\":%d,\"qs\":%d,"
                        "\"wg\":%d,\"st\":%d,\"ms\":%lf,\"predicted_ms\":%lf",
                     kind, &c->bm, &c->bn, &c->mt, &c->qs, &c->wg, &c->st, ms, pred) != 9)
        return 0;
    if (strcmp(kind, "block") != 0 && strcmp(kind, "gather") != 0)
        return 0;
    c->kind = strcmp(kind, "gather") == 0 ? ATTN_GATHER : ATTN_BLOCK;
    if (c->wg == MHA_WS)
        return (c->kind == ATTN_BLOCK || (c->bm == 128 && c->qs == 0 && c->bn <= 128)) &&
               (c->bm == 128 || c->bm == 192) &&
               (c->bn == 64 || c->bn == 96 || c->bn == 128 || c->bn == 144 || c->bn == 192) &&
               c->mt == 1 &&
               (c->qs == 0 || c->qs == 1) && c->st >= 2 && c->st <= 4;
    if (c->wg == 1)
        return c->bm >= 64 && c->bm <= 192 && c->bm % 64 == 0 && (c->bn == 64 || c->bn == 128) &&
               c->mt == 1 && c->qs == 0 && c->st >= 2 && c->st <= 4;
    return c->wg == 0 && c->st == 0 && c->bm >= 16 && c->bm <= 128 && c->bn >= 16 && c->bn <= 128 &&
           (c->mt == 1 || c->mt == 2) && c->bm % (16 * c->mt) == 0 && (c->qs == 0 || c->qs == 1);
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
    mha_launch L;
    stof_status st = load_candidate(ctx, &p->d, &p->c, tiles, known, &L);
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
    stof_tune level = tune_level(&p->d);

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
    cand_state cs[MHA_MAX_CANDIDATES];
    int n = 0, winner = 0;
    if (st == STOF_OK)
        st = need_summary(ctx, p, mask, &ms, &own);
    if (st == STOF_OK)
        st = rank_candidates(ctx, &p->d, ms, 1, cs, &n);
    if (st == STOF_OK && n == 0)
        st = CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "no attention kernel fits this device for head_dim %d",
                      p->d.head_dim);
    if (st == STOF_OK && level == STOF_TUNE_OFF) {
        p->origin = "model";
    } else if (st == STOF_OK) {
        st = search(ctx, &p->d, ms, cs, n, level, &winner);
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
    free_candidates(cs, n);
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
    const int smem_max = device_smem(ctx);
    if (desc && mha_smem_bytes(c, desc->head_dim) > smem_max)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "this attention kernel needs %d bytes of shared memory at head_dim %d; "
                        "the device gives a block %d",
                        mha_smem_bytes(c, desc->head_dim), desc->head_dim, smem_max);
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
    stof_status st = launch(ctx, &p->d, &p->L, (CUdeviceptr)q, (CUdeviceptr)k, (CUdeviceptr)v,
                            (CUdeviceptr)out, (CUdeviceptr)seq_lens, (CUstream)stream, &p->maps);
    if (push)
        jit_pop(ctx);
    return st;
}

stof_status stof_mha_plan_describe(const stof_mha_plan *p, char *buf, size_t n)
{
    if (!p || !buf || n == 0)
        return STOF_ERR_INVALID_ARG;
    /* How the warp-specialized engine reads rows: TMA boxes, boxes of a
     * residue-class view (tma/period), or the producer's copies. */
    char rows[32] = "";
    if (p->c.wg == MHA_WS && p->L.period > 1)
        snprintf(rows, sizeof rows, " rows=tma/%d", p->L.period);
    else if (p->c.wg == MHA_WS)
        snprintf(rows, sizeof rows, " rows=%s", p->L.gather ? "copies" : "tma");
    snprintf(buf, n,
             "kernel=%s engine=%s%s block_m=%d block_n=%d m_tiles=%d q_in=%s stages=%d p_in=%s "
             "head_dim=%d "
             "%s groups=%d regs=%d local=%d smem=%d chosen_by=%s predicted_ms=%.4f "
             "measured_ms=%.4f candidates_timed=%d mask=%.16s",
             kind_name(p->c.kind), engine_name(&p->c), rows, p->c.bm, p->c.bn, p->c.mt,
             p->c.wg || p->c.qs ? "smem" : "regs", p->c.wg ? p->c.st : 2,
             p->c.wg == MHA_WS && p->c.qs ? "smem" : "regs", p->d.head_dim,
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

stof_status stof_mha_prepare(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    TRY(check_desc(ctx, desc, mask));
    mask_summary ms;
    TRY(mask_summarize(ctx, mask, &ms));
    cand_state cs[MHA_MAX_CANDIDATES];
    int n = 0;
    stof_status st = rank_candidates(ctx, desc, &ms, 0, cs, &n);
    mask_summary_free(&ms);
    TRY(st);
    /* The model's first three, and the default size of each kind, so a
     * later search on the GPU finds its stage 1 compiled. */
    int idx[MHA_MAX_CANDIDATES], m = 0;
    for (int i = 0; i < n; i++)
        if (i < 3 || is_default_size(&cs[i].c))
            idx[m++] = i;
    st = compile_candidates(ctx, desc, cs, idx, m);
    free_candidates(cs, n);
    return st;
}

stof_status mha_rank(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask,
                     mha_ranked *out, int cap, int *n, model_device *md)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    *n = 0;
    TRY(check_desc(ctx, desc, mask));
    TRY(device_figures(ctx, md, 0));
    mask_summary ms;
    TRY(mask_summarize(ctx, mask, &ms));
    cand_state cs[MHA_MAX_CANDIDATES];
    int nc = 0;
    stof_status st = rank_candidates(ctx, desc, &ms, 0, cs, &nc);
    mask_summary_free(&ms);
    TRY(st);
    for (int i = 0; i < nc && *n < cap; i++)
        out[(*n)++] = (mha_ranked){cs[i].c, cs[i].predicted_ms, cs[i].tiles.n_tiles,
                                   cs[i].tiles.n_full, cs[i].tiles.n_groups};
    free_candidates(cs, nc);
    return STOF_OK;
}
