#include "attn/mha_kernel.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/reference.h"

/* ---- candidates and requests ------------------------------------------- */

mha_mods mha_mods_of(const stof_mha_desc *d)
{
    return (mha_mods){d->softcap, d->alibi != 0, d->bias_buckets};
}

void mha_make_request(const mha_candidate *c, int head_dim, int seq_q, stof_dtype dtype,
                      int group, mha_mods mods, int varlen, int period, mha_request *r)
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
    /* Score modifiers render as sections that "0" drops (attn_common.cuh),
     * so that a kernel without them renders as it always did. */
    snprintf(r->text[5], sizeof r->text[5], "%d", group > 1 ? group : 0);
    r->vars[n++] = (render_var){"GROUP", r->text[5]};
    if (mods.softcap > 0.f)
        snprintf(r->text[6], sizeof r->text[6], "%.9g", (double)mods.softcap);
    else
        snprintf(r->text[6], sizeof r->text[6], "0");
    r->vars[n++] = (render_var){"SOFTCAP", r->text[6]};
    snprintf(r->text[7], sizeof r->text[7], "%d", mods.bias_buckets > 0 ? mods.bias_buckets : 0);
    r->vars[n++] = (render_var){"MODS", mods.alibi || mods.bias_buckets > 0 ? "1" : "0"};
    r->vars[n++] = (render_var){"ALIBI", mods.alibi ? "1" : "0"};
    r->vars[n++] = (render_var){"BIAS", r->text[7]};
    r->vars[n++] = (render_var){"VARLEN", varlen ? "1" : "0"};
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

int mha_takes_softcap(const mha_candidate *c)
{
    return !(c->wg == MHA_WS && c->bm == 192);
}

int mha_takes_score_mods(const mha_candidate *c, mha_mods mods, int head_dim)
{
    if (c->wg != MHA_WS || (!mods.alibi && mods.bias_buckets <= 0))
        return 1;
    return c->bm == 128 &&
           (head_dim <= 64 || (c->kind == ATTN_BLOCK && mods.bias_buckets <= 0));
}

int mha_takes_varlen(const mha_candidate *c)
{
    return c->wg != MHA_WS || (c->bm == 128 && c->kind == ATTN_BLOCK);
}

int mha_takes_mods(const mha_candidate *c, const stof_mha_desc *d)
{
    return (!(d->softcap > 0.f) || mha_takes_softcap(c)) &&
           mha_takes_score_mods(c, mha_mods_of(d), d->head_dim) &&
           (!d->varlen || mha_takes_varlen(c));
}

int mha_smem_bytes(const mha_candidate *c, int head_dim, int varlen)
{
    if (c->wg == MHA_WS) { /* Q (two where warpgroup 1 lags: LAG in attn_ws.cu), K and V
                              stages, each consumer's O in whole swizzle atoms (80 columns
                              laid out as 96) unless it is staged in P's tile (O_IN_P), P
                              in atoms of 64 keys; each stage's bitmap and tile, the
                              ones (192 rows at head_dim 64, P in registers), the item (one
                              per Q; with varlen its sequence too); barriers; alignment
                              slack */
        const int qb = c->bm == 128 && c->bn == 128 && c->st >= 3 ? 2 : 1;
        const int da = (head_dim + 31) / 32 * 32, pk = (c->bn + 63) / 64 * 64;
        const int o_in_p = c->qs && pk >= da;
        return ((qb + !o_in_p) * c->bm + 2 * c->st * c->bn) * da * 2 +
               (c->qs ? c->bm * pk * 2 : 0) + c->st * (c->bm * ((c->bn + 31) / 32) * 4 + 8) +
               (head_dim == 64 && !c->qs && c->bm == 192 ? c->bn * 128 : 0) +
               (varlen ? 32 : 16) * qb + 8 * (2 * qb + 4 * c->st) + 1024;
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
            if (mha_smem_bytes(&c, head_dim, 0) > smem_max)
                continue;
            out[n++] = c;
        }
        const size_t nwg = wgmma && head_dim % 64 == 0 ? sizeof wg_sizes / sizeof wg_sizes[0] : 0;
        for (size_t i = 0; i < nwg && n < cap; i++) {
            mha_candidate c = {(attn_kind)kind, wg_sizes[i][0], wg_sizes[i][1], 1, 0, 1,
                               wg_sizes[i][2]};
            if (mha_smem_bytes(&c, head_dim, 0) <= smem_max)
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
                mha_smem_bytes(&c, head_dim, 0) <= smem_max)
                out[n++] = c;
        }
    }
    return n;
}

int mha_kernel_device_smem(const stof_ctx *ctx)
{
    return ctx->dev.ok ? ctx->dev.smem_optin : 227 * 1024;
}

const char *mha_kernel_kind_name(attn_kind k)
{
    return k == ATTN_GATHER ? "gather" : "block";
}

const char *mha_kernel_engine_name(const mha_candidate *c)
{
    return c->wg == MHA_WS ? "wgmma-ws" : c->wg ? "wgmma" : "mma.sync";
}

/* ---- strides and launch ------------------------------------------------- */

int mha_kv_heads(const stof_mha_desc *d)
{
    return d->kv_heads > 0 ? d->kv_heads : d->heads;
}

int mha_group(const stof_mha_desc *d)
{
    return d->heads / mha_kv_heads(d);
}

mha_strides mha_kernel_strides(const stof_mha_desc *d)
{
    mha_strides s = {0};
    /* Packed: a row holds q's heads, then k's and v's kv_heads each (GQA). */
    const long long W = ((long long)d->heads + 2ll * mha_kv_heads(d)) * d->head_dim;
    for (int i = 0; i < 4; i++) {
        const int kv = i == 1 || i == 2;
        long long L = kv ? d->seq_k : d->seq_q, D = d->head_dim;
        long long H = kv ? mha_kv_heads(d) : d->heads;
        if (d->qkv_packed && i < 3) {
            s.s[i][0] = L * W, s.s[i][1] = D, s.s[i][2] = W;
        } else if (d->layout == STOF_LAYOUT_BLHD) {
            s.s[i][0] = L * H * D, s.s[i][1] = D, s.s[i][2] = H * D;
        } else {
            s.s[i][0] = H * L * D, s.s[i][1] = L * D, s.s[i][2] = D;
        }
    }
    if (d->qkv_packed) {
        s.k_offset = (long long)d->heads * d->head_dim;
        s.v_offset = s.k_offset + (long long)mha_kv_heads(d) * d->head_dim;
    }
    return s;
}


/* A TMA descriptor of one of q, k, v, out as the 4-D tensor (head_dim,
 * rows, heads, batch) (k and v: kv_heads), or with period > 1 the 5-D (head_dim, rows / period,
 * period, heads, batch), with the given element strides (row, head, batch),
 * read or written in boxes of one swizzle atom's columns x box_rows, as
 * attn_ws.cu lays them out: 64 columns 128-byte swizzled at head_dim 64 and
 * 128, 32 columns 64-byte swizzled at 80 and 96; rows and columns past the
 * end read as zeros and are not written. */
static stof_status tensor_map(stof_ctx *ctx, CUtensorMap *map, CUdeviceptr p, const stof_mha_desc *d,
                              int rows, int heads, const long long (*stride)[3], int box_rows,
                              int period)
{
    /* With a period, rows as (row / period, row % period): five dimensions. */
    const int sw = d->head_dim % 64 == 0 ? 128 : 64, v = period > 1;
    const long long sl = (*stride)[2] * 2;
    const cuuint64_t dims[5] = {(cuuint64_t)d->head_dim, (cuuint64_t)(rows / period),
                                (cuuint64_t)period, (cuuint64_t)heads, (cuuint64_t)d->batch};
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
 * then), the persistent grid mha_kernel_load dealt the work to. A varlen
 * run's tensors are one batch of its total rows (at least one row: a map
 * has no empty dimension, and a run with none reads none), and the kernel
 * takes its sequences after the others' arguments. */
static stof_status launch_ws(stof_ctx *ctx, const stof_mha_desc *d, const mha_launch *L,
                             const mha_strides *s, CUdeviceptr q, CUdeviceptr k, CUdeviceptr v,
                             CUdeviceptr out, CUdeviceptr seq_lens, const mha_varlen *vl,
                             float scale_log2, CUdeviceptr slopes, CUdeviceptr table,
                             CUstream stream, mha_maps *cache)
{
    const CUdeviceptr at[4] = {q, k, v, out};
    /* k and v hold kv_heads heads (GQA): the kernel reads kv head h / GROUP. */
    int rows[4] = {d->seq_q, d->seq_k, d->seq_k, d->seq_q};
    const int heads[4] = {d->heads, mha_kv_heads(d), mha_kv_heads(d), d->heads},
              box[4] = {L->bm, L->bn, L->bn, 64};
    stof_mha_desc one = *d;
    if (vl) {
        /* TMA coordinates are int32: a sequence's rows are addressed from
         * the buffer's row 0. */
        if (vl->total_q > INT_MAX - d->seq_q || vl->total_k > INT_MAX - d->seq_k)
            return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                            "the warp-specialized engine addresses fewer rows than total_q "
                            "%lld and total_k %lld",
                            vl->total_q, vl->total_k);
        one.batch = 1;
        rows[0] = rows[3] = vl->total_q > 0 ? (int)vl->total_q : 1;
        rows[1] = rows[2] = vl->total_k > 0 ? (int)vl->total_k : 1;
    }
    CUtensorMap t[4];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 4 && !L->gather; i++) {
        if (cache && cache->at[i] == at[i] && cache->rows[i] == rows[i]) {
            memcpy(&t[i], cache->map[i], sizeof t[i]);
            continue;
        }
        TRY(tensor_map(ctx, &t[i], at[i], &one, rows[i], heads[i], &s->s[i], box[i],
                       L->period));
        if (cache) {
            memcpy(cache->map[i], &t[i], sizeof t[i]);
            cache->at[i] = at[i];
            cache->rows[i] = rows[i];
        }
    }
    int lq = d->seq_q, lk = d->seq_k;
    CUdeviceptr items = L->tiles + L->items, first = items + 16 * (size_t)L->n_items,
                tile_key = L->tiles + L->lay.tile_key, tile_bits = L->tiles + L->lay.tile_bits,
                bits = L->tiles + L->lay.bits, qidx = L->tiles + L->lay.qidx,
                kidx = L->tiles + L->lay.kidx;
    long long st[4][3];
    memcpy(st, s->s, sizeof st);
    /* Varlen: cu_q where seq_lens goes, then cu_k, the buffers' rows, the
     * mask's shift and the run's sequences (the items of later slots idle). */
    CUdeviceptr cu_k = vl ? vl->cu_k : 0;
    long long total_q = vl ? vl->total_q : 0, total_k = vl ? vl->total_k : 0;
    int shift = L->shift, nseq = vl ? vl->batch : 0;
    if (vl)
        seq_lens = vl->cu_q;
    void *args[] = {&t[0],     &t[1],     &t[2],     &t[3],     &lq,        &lk,
                    &seq_lens, &items,    &first,    &tile_key, &tile_bits, &bits,
                    &scale_log2, &q,      &k,        &v,        &out,       &st[0][0],
                    &st[0][1], &st[0][2], &st[1][0], &st[1][1], &st[1][2],  &st[2][0],
                    &st[2][1], &st[2][2], &st[3][0], &st[3][1], &st[3][2],  &qidx,
                    &kidx,
                    /* A kernel takes the modifiers' tables or the varlen
                     * arguments, never both (check_desc, mha.c): the driver reads as
                     * many as the kernel has. */
                    vl ? (void *)&cu_k : (void *)&slopes, vl ? (void *)&total_q : (void *)&table,
                    &total_k,  &shift,    &nseq};
    return jit_launch(ctx, L->fn, (unsigned)L->ctas, 1, 1, (unsigned)L->threads, (unsigned)L->smem,
                      stream, args);
}

stof_status mha_kernel_launch(stof_ctx *ctx, const stof_mha_desc *d, const mha_launch *L,
                              CUdeviceptr q, CUdeviceptr k, CUdeviceptr v, CUdeviceptr out,
                              CUdeviceptr seq_lens, const mha_varlen *vl, CUstream stream,
                              mha_maps *maps)
{
    mha_strides s = mha_kernel_strides(d);
    if (d->qkv_packed) {
        k = q + (CUdeviceptr)(s.k_offset * 2);
        v = q + (CUdeviceptr)(s.v_offset * 2);
    }
    int lq = d->seq_q, lk = d->seq_k;
    float scale = d->scale > 0.f ? d->scale : 1.f / sqrtf((float)d->head_dim);
    float scale_log2 = scale * 1.4426950408889634f;
    if (L->n_groups == 0)
        return STOF_OK;
    /* The modifiers' tables come last; a kernel that renders none has fewer
     * parameters and reads no further (the driver takes their count from
     * the kernel). */
    CUdeviceptr slopes = !d->alibi          ? 0
                         : d->alibi_slopes ? (CUdeviceptr)d->alibi_slopes
                                           : L->tiles + L->slopes;
    CUdeviceptr table = d->bias_buckets > 0 ? (CUdeviceptr)d->bias_table : 0;
    if (L->wg == MHA_WS)
        return launch_ws(ctx, d, L, &s, q, k, v, out, seq_lens, vl, scale_log2, slopes, table,
                         stream, maps);
    CUdeviceptr work = L->tiles + L->lay.work, qidx = L->tiles + L->lay.qidx,
                tile_key = L->tiles + L->lay.tile_key,
                tile_bits = L->tiles + L->lay.tile_bits, kidx = L->tiles + L->lay.kidx,
                bits = L->tiles + L->lay.bits;
    /* Varlen: cu_q where seq_lens goes, then cu_k, the buffers' rows and
     * the mask's shift (ATTN_ITEM_PARAMS); a grid row per sequence. */
    CUdeviceptr cu_k = vl ? vl->cu_k : 0;
    long long total_q = vl ? vl->total_q : 0, total_k = vl ? vl->total_k : 0;
    int shift = L->shift;
    if (vl)
        seq_lens = vl->cu_q;
    void *args[] = {&q, &k, &v, &out,
                    &s.s[0][0], &s.s[0][1], &s.s[0][2], &s.s[1][0], &s.s[1][1], &s.s[1][2],
                    &s.s[2][0], &s.s[2][1], &s.s[2][2], &s.s[3][0], &s.s[3][1], &s.s[3][2],
                    &lq, &lk, &seq_lens, &work, &qidx, &tile_key,
                    &tile_bits, &kidx, &bits, &scale_log2,
                    /* the modifiers' tables or the varlen arguments, as launch_ws */
                    vl ? (void *)&cu_k : (void *)&slopes, vl ? (void *)&total_q : (void *)&table,
                    &total_k, &shift};
    /* Grid (heads, batch, groups by rank): see stof_work_item. */
    return jit_launch(ctx, L->fn, (unsigned)d->heads, (unsigned)(vl ? vl->batch : d->batch),
                      (unsigned)L->n_groups, (unsigned)L->threads, (unsigned)L->smem, stream,
                      args);
}

stof_status mha_kernel_load(stof_ctx *ctx, const stof_mha_desc *d, const mha_candidate *c,
                            const attn_tiles *t, const char *known, mha_launch *L)
{
    memset(L, 0, sizeof *L);
    mha_request r;
    L->period = d->varlen ? 1 : mha_view_period(c, t, d->seq_q, d->seq_k);
    mha_make_request(c, d->head_dim, d->seq_q, d->dtype, mha_group(d), mha_mods_of(d),
                     d->varlen, L->period, &r);
    TRY(jit_get_known(ctx, &r.req, known, &L->fn, L->key));
    L->wg = c->wg;
    L->gather = c->wg == MHA_WS && c->kind == ATTN_GATHER && L->period == 1;
    L->bm = c->bm;
    L->bn = c->bn;
    L->threads = mha_threads(c);
    L->smem = mha_smem_bytes(c, d->head_dim, d->varlen);
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
    size_t total = L->items + 16 * (size_t)n_items + 4 * (size_t)(L->ctas + 1);
    /* ALiBi without slopes of the caller's: the standard ones, after the rest. */
    if (d->alibi && !d->alibi_slopes) {
        L->slopes = (total + 15) / 16 * 16;
        total = L->slopes + 4 * (size_t)d->heads;
    }
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
    for (int h = 0; L->slopes && h < d->heads; h++)
        ((float *)((char *)host + L->slopes))[h] = (float)ref_alibi_slope(h, d->heads);
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

void mha_kernel_unload(stof_ctx *ctx, mha_launch *L)
{
    if (L->tiles && jit_push(ctx) == STOF_OK) {
        ctx->dev.api.MemFree(L->tiles);
        jit_pop(ctx);
    }
    L->tiles = 0;
}
