#include "layer/gemm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- candidates --------------------------------------------------------- */

/* The ranking assumes an H100's 132 SMs: only the order depends on it, and
 * a search times the real device. */
#define GEMM_SMS 132

/* Accumulators per thread above this spill or starve the pipeline. */
#define GEMM_MAX_ACC 128

/* The tiles tried for a plain epilogue, roughly best first for BERT sizes:
 * 8-warp 128-wide tiles with 64x32 or 64x64 warp tiles for large products,
 * 4-warp tiles for products too small to fill the GPU, and a 2-stage
 * 128x128 that fits 48 KiB. */
static const gemm_config TILES[] = {
    {128, 128, 32, 2, 4, 4, 0}, {128, 256, 32, 2, 4, 3, 0}, {256, 128, 32, 4, 2, 3, 0},
    {128, 128, 64, 2, 4, 3, 0}, {128, 128, 32, 2, 4, 3, 0}, {128, 128, 32, 2, 4, 2, 0},
    {64, 128, 32, 2, 2, 4, 0},  {128, 64, 32, 2, 2, 4, 0},  {64, 64, 32, 2, 2, 4, 0},
    {64, 64, 64, 2, 2, 3, 0},
};

/* Warpgroup-MMA tiles (sm_90a), 64 rows per warpgroup. Large tiles first:
 * cp.async reads every operand from L2, and at 500 TFLOP/s a 128 x 128
 * tile needs about 7.8 TB/s of it, 128 x 256 or 256 x 128 about 5.9. Then
 * 128 x 128 at four stages and at three (two CTAs per SM), and one
 * warpgroup for products too small to fill the GPU. */
static const gemm_config WG_TILES[] = {
    {128, 256, 64, 2, 1, 4, 1}, {256, 128, 64, 4, 1, 4, 1}, {128, 256, 64, 2, 1, 3, 1},
    {128, 128, 64, 2, 1, 4, 1}, {128, 128, 64, 2, 1, 3, 1}, {64, 128, 64, 1, 1, 4, 1},
};

/* TMA tiles (sm_90a, wg 2): a producer warpgroup feeds two consumer
 * warpgroups that either take alternate tiles (wm 1, "ping-pong": one's
 * epilogue overlaps the other's products) or share one (wm 2). Stages: at
 * most these, as many as fit beside the output's staging tiles. Where the
 * estimate ties, the table's order stands, and stage 2 times the first
 * four: 128 x 192 shared tiles (4 stages) ran BERT-base's four products at
 * 16384 rows on an H100 at 560, 641, 476 and 681 TFLOP/s, and fill its 132
 * SMs where N is 768 and M 4096 (128 tiles; 128 x 128's 192 took 0.0409 ms
 * to 128 x 192's 0.0331 at K 3072 there); 128 x 128 alternate tiles (5
 * stages) ran the residual product at K 768 at 485 and 128 x 256 shared
 * tiles (3 stages) the QKV one at 650. */
static const gemm_config TMA_TILES[] = {
    {128, 192, 64, 2, 1, 5, 2}, {128, 128, 64, 1, 1, 6, 2}, {256, 128, 64, 2, 1, 4, 2},
    {128, 256, 64, 2, 1, 4, 2}, {64, 256, 64, 1, 1, 5, 2},  {64, 192, 64, 1, 1, 6, 2},
    {64, 128, 64, 1, 1, 8, 2},
};

/* LayerNorm tiles own whole rows: bm rows, warps splitting the columns. */
static const int LN_TILES[][3] = {{16, 1, 8}, {32, 2, 4}, {32, 1, 8}, {32, 2, 8}};

static int round_up(int v, int to) { return (v + to - 1) / to * to; }

int gemm_threads(const gemm_config *c)
{
    return c->wg == GEMM_TMA ? 384 : c->wg ? c->wm * 128 : c->wm * c->wn * 32;
}

/* Columns of out that a tile of bn product columns writes: SwiGLU's take
 * one of each pair. */
static int out_cols(int bn, const gemm_epilogue *e)
{
    return e && e->act == GEMM_ACT_SWIGLU ? bn / 2 : bn;
}

int gemm_smem_bytes(const gemm_config *c, const gemm_shape *s, const gemm_epilogue *e)
{
    if (c->wg == GEMM_TMA) {
        /* Stages, a full and an empty barrier each, 2 turns, 4 LN exchange
         * barriers, 2 residual barriers, alignment slack; without ln, the
         * consumers' staging tiles in fp16 (the whole tile, twice where
         * they take alternate tiles); with ln, 8 warps' 16 x 36 fp32
         * staging buffers and the slots: 2 consumers x 2 parities x the
         * cluster's CTAs x 32 row pairs x 16 bytes. */
        const int ln = e && e->ln, cl = ln && c->bn > 0 ? s->n / c->bn : 0;
        const int staging = ln ? 8 * 16 * 36 * 4 + 4 * cl * 32 * 16
                               : (c->wm == 2 ? 1 : 2) * c->bm * out_cols(c->bn, e) * 2;
        return c->stages * (c->bm + c->bn) * 128 + 16 * c->stages + 64 + staging + 1024;
    }
    if (c->wg) {
        /* Swizzled 128-byte rows of X and W per stage, a full and an empty
         * barrier per stage, 1 KiB of alignment slack; the staged output
         * tile reuses the stages. */
        const int pipe = c->stages * (c->bm + c->bn) * 128 + 16 * c->stages;
        const int staged = c->bm * (out_cols(c->bn, e) + 8) * 2;
        return (pipe > staged ? pipe : staged) + 1024;
    }
    const int pipe = c->stages * (c->bm + c->bn) * (c->bk + 8) * 2;
    const int staged = e && e->ln ? c->bm * (c->bn + 8) * 4 : c->bm * (out_cols(c->bn, e) + 8) * 2;
    return pipe > staged ? pipe : staged;
}

/* The TMA LayerNorm layouts, a cluster of n / bn CTAs per row on 64-row
 * blocks: bm 64 and wm 2 mark blocks that the two consumers take in turn,
 * bm 64 and wn 2 blocks that they share, bn / 2 columns each. */
static int tma_ln_layout(const gemm_config *c)
{
    return c->wg == GEMM_TMA && c->bm == 64 && (c->wm == 2 || c->wn == 2);
}

static int acc_per_thread(const gemm_config *c)
{
    if (tma_ln_layout(c))
        return 64 * (c->bn / c->wn) / 128;
    if (c->wg == GEMM_TMA)
        return c->bm / c->wm * c->bn / 128;
    return c->wg ? c->bn / 2 : c->bm / c->wm * (c->bn / c->wn) / 32;
}

/* Estimated time in arbitrary units: the busiest SM's tiles (one wave is
 * GEMM_SMS tiles) times a tile's cost, which grows as the tile reuses its
 * operands less than a 128 x 128 tile with 64 x 32 warp tiles does: loaded
 * elements per product from L2 (bm * bn / (bm + bn)) and ldmatrix per
 * mma.sync within a warp (wgmma reads shared memory itself: no such cost).
 * Occupancy is left to the search's timings. */
static double estimate(const gemm_config *c, const gemm_shape *s)
{
    const long long tiles = (long long)((s->m + c->bm - 1) / c->bm) * ((s->n + c->bn - 1) / c->bn);
    const double waves = (double)((tiles + GEMM_SMS - 1) / GEMM_SMS);
    const int mi = c->bm / c->wm / 16, ni = c->bn / c->wn / 8;
    double l2 = (double)c->bm * c->bn / (c->bm + c->bn) / 64.0;
    double smem = c->wg ? 1 : (double)(mi * ni) / (mi + ni / 2) / (16.0 / 6.0);
    if (l2 > 1)
        l2 = 1;
    if (smem > 1)
        smem = 1;
    return waves * c->bm * c->bn / (l2 * smem);
}

static int fits(const gemm_config *c, const gemm_shape *s, const gemm_epilogue *e, int smem_max)
{
    return gemm_smem_bytes(c, s, e) <= smem_max && acc_per_thread(c) <= GEMM_MAX_ACC;
}

/* Sorts c[0..n) by the estimate, stably (ties keep the tables' order);
 * among non-LN tiles, those whose bn divides N come first. */
static void sort_by_estimate(gemm_config *c, int n, const gemm_shape *s, const gemm_epilogue *e)
{
    double key[GEMM_MAX_CANDIDATES];
    for (int i = 0; i < n; i++)
        key[i] = estimate(&c[i], s) * (!e->ln && s->n % c[i].bn ? 4.0 : 1.0);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && key[j] < key[j - 1]; j--) {
            gemm_config tc = c[j];
            c[j] = c[j - 1];
            c[j - 1] = tc;
            double tk = key[j];
            key[j] = key[j - 1];
            key[j - 1] = tk;
        }
}

int gemm_candidates(const gemm_shape *s, const gemm_epilogue *e, int smem_max, int wgmma,
                    gemm_config *out, int cap)
{
    gemm_config c[GEMM_MAX_CANDIDATES];
    int n = 0, ntma = 0, nwg = 0;
    if (e->ln) {
        /* TMA first where it applies: a cluster of n / bn CTAs per row, at
         * most 8, and the deepest pipeline that fits. Consumers sharing
         * 384-column blocks (wn 2) come first where that takes every row
         * block in one round, second where not (on an H100 at 768 x 768:
         * 0.0148 ms against bn 256's 0.0155 at 4096 rows, 0.0555 against
         * 0.0517 at 16384). */
        static const int LN_TMA[3][3] = {{384, 1, 2}, {256, 2, 1}, {128, 2, 1}};
        const int one_round = s->n % 384 == 0 && s->n / 384 <= 8 &&
                              (s->m + 63) / 64 <= GEMM_SMS / (s->n / 384);
        for (int i = 0; wgmma && !e->ln_sum && i < 3; i++) {
            const int *l = LN_TMA[one_round || i == 2 ? i : 1 - i];
            gemm_config t = {64, l[0], 64, l[1], l[2], 8, GEMM_TMA};
            if (s->n % t.bn || s->n / t.bn > 8)
                continue;
            while (t.stages > 2 && !fits(&t, s, e, smem_max))
                t.stages--;
            if (fits(&t, s, e, smem_max))
                c[n++] = t;
        }
        ntma = nwg = n;
        for (size_t i = 0; i < sizeof LN_TILES / sizeof LN_TILES[0]; i++) {
            gemm_config t = {LN_TILES[i][0], round_up(s->n, 16 * LN_TILES[i][2]), 32,
                             LN_TILES[i][1], LN_TILES[i][2], 4, 0};
            /* The deepest pipeline that fits. */
            while (t.stages > 2 && !fits(&t, s, e, smem_max))
                t.stages--;
            if (fits(&t, s, e, smem_max))
                c[n++] = t;
        }
    } else {
        /* Warpgroup MMA first where it applies, TMA-fed before cp.async-fed:
         * on an H100 at BERT-base's products of 16384 rows they reach
         * 430-635 (550 with the erf GELU), 375-550 and (mma.sync) 230-275
         * TFLOP/s. The search times the engines. */
        for (size_t i = 0; wgmma && i < sizeof TMA_TILES / sizeof TMA_TILES[0]; i++) {
            gemm_config t = TMA_TILES[i];
            while (t.stages > 2 && !fits(&t, s, e, smem_max))
                t.stages--;
            if (t.bn > round_up(s->n, 64) || !fits(&t, s, e, smem_max) || n == GEMM_MAX_CANDIDATES)
                continue;
            c[n++] = t;
        }
        ntma = n;
        for (size_t i = 0; wgmma && s->k % 64 == 0 && i < sizeof WG_TILES / sizeof WG_TILES[0]; i++) {
            const gemm_config *t = &WG_TILES[i];
            if (t->bn > round_up(s->n, 64) || !fits(t, s, e, smem_max) || n == GEMM_MAX_CANDIDATES)
                continue;
            c[n++] = *t;
        }
        nwg = n;
        for (size_t i = 0; i < sizeof TILES / sizeof TILES[0]; i++) {
            const gemm_config *t = &TILES[i];
            /* Tiles wider than the whole output only add masked work; columns
             * that do not divide N are allowed only if nothing else fits. */
            if (t->bn > round_up(s->n, 64) || !fits(t, s, e, smem_max) || n == GEMM_MAX_CANDIDATES)
                continue;
            c[n++] = *t;
        }
    }
    /* LayerNorm's clusters stay widest first: fewer CTAs to a cluster pack
     * the GPCs better than the estimate's waves tell (on an H100 at 4096 x
     * 768 x 768, bn 256 in clusters of 3 took 0.0154 ms, bn 128 in
     * clusters of 6 0.0177). */
    if (!e->ln)
        sort_by_estimate(c, ntma, s, e);
    sort_by_estimate(c + ntma, nwg - ntma, s, e);
    sort_by_estimate(c + nwg, n - nwg, s, e);
    if (n > cap)
        n = cap;
    for (int i = 0; i < n; i++)
        out[i] = c[i];
    return n;
}

void gemm_config_str(const gemm_config *c, char *buf, size_t n)
{
    if (c->wg == GEMM_TMA)
        snprintf(buf, n, "tma %s %dx%dx%d s%d", tma_ln_layout(c) ? "ln" : c->wm == 2 ? "coop" : "pp",
                 c->bm, c->bn, c->bk, c->stages);
    else if (c->wg)
        snprintf(buf, n, "wg %dx%dx%d s%d", c->bm, c->bn, c->bk, c->stages);
    else
        snprintf(buf, n, "%dx%dx%d w%dx%d s%d", c->bm, c->bn, c->bk, c->wm, c->wn, c->stages);
}

/* ---- checks ------------------------------------------------------------- */

static stof_status check_wg(stof_ctx *ctx, const gemm_shape *s, const gemm_epilogue *e,
                            const gemm_config *c, const char *name)
{
    if (strcmp(ctx->arch, "sm_90a") != 0)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "gemm: config %s needs warpgroup MMA (sm_90a), the context compiles for %s",
                        name, ctx->arch[0] ? ctx->arch : "no architecture");
    if (e->ln)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "gemm: config %s has no LayerNorm epilogue (a wg config with ln)", name);
    if (s->k % 64)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "gemm: config %s needs k (%d) to be a multiple of 64", name, s->k);
    if (c->wm < 1 || c->wm > 4 || c->wn != 1 || c->bm != 64 * c->wm)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "gemm: config %s: 1 to 4 warpgroups along rows (wm), bm = 64 * wm, wn = 1",
                        name);
    if (c->bn != 64 && c->bn != 128 && c->bn != 256)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: config %s: bn must be 64, 128 or 256", name);
    if (c->bk != 64)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: config %s: bk must be 64", name);
    if (c->stages < 2 || c->stages > 5)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: config %s: stages must be 2 to 5", name);
    if ((s->m + c->bm - 1) / c->bm > 65535)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "gemm: m %d needs more than 65535 row tiles of %d",
                        s->m, c->bm);
    return STOF_OK;
}

static stof_status check_tma(stof_ctx *ctx, const gemm_shape *s, const gemm_epilogue *e,
                             const gemm_config *c, const char *name)
{
    if (strcmp(ctx->arch, "sm_90a") != 0)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "gemm: config %s needs TMA and warpgroup MMA (sm_90a), the context compiles for %s",
                        name, ctx->arch[0] ? ctx->arch : "no architecture");
    if (e->ln != tma_ln_layout(c))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        e->ln ? "gemm: config %s: a tma LayerNorm needs bm 64 and wm 2 or wn 2"
                              : "gemm: config %s (bm 64, wm or wn 2) is the tma LayerNorm layout, the epilogue has no ln",
                        name);
    if (e->ln) {
        if (e->ln_sum)
            return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "gemm: config %s has no ln_sum", name);
        if ((c->wn == 1 ? c->bn != 128 && c->bn != 256 : c->bn != 384) || s->n % c->bn ||
            s->n / c->bn > 8)
            return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                            "gemm: config %s: bn must be 128 or 256 (384 with wn 2) and divide n (%d) "
                            "into at most 8 CTAs",
                            name, s->n);
    }
    if (c->wm != 1 && c->wm != 2)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "gemm: config %s: wm is 1 (ping-pong) or 2 (shared tiles)", name);
    /* wn 2 only in the LayerNorm layout that splits columns (wm 1). */
    const int rows = e->ln ? 64 : c->bm / c->wm, split = e->ln && c->wn == 2 && c->wm == 1;
    if (c->bm % c->wm || (rows != 64 && rows != 128) || (c->wn != 1 && !split))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "gemm: config %s: 64 or 128 rows per consumer warpgroup (bm / wm), wn = 1",
                        name);
    if (c->bn != 64 && c->bn != 128 && c->bn != 192 && c->bn != 256 && !split)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: config %s: bn must be 64, 128, 192 or 256",
                        name);
    if (acc_per_thread(c) > GEMM_MAX_ACC)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "gemm: config %s: more than %d accumulators per thread", name, GEMM_MAX_ACC);
    if (c->bk != 64)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: config %s: bk must be 64", name);
    if (c->stages < 2 || c->stages > 8)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: config %s: stages must be 2 to 8", name);
    return STOF_OK;
}

stof_status gemm_check(stof_ctx *ctx, const gemm_shape *s, const gemm_epilogue *e,
                       const gemm_config *c)
{
    if (!s)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: argument 'shape' is NULL");
    if (!e)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: argument 'epilogue' is NULL");
    if (s->m <= 0 || s->n <= 0 || s->k <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: m, n and k must be positive (got %d, %d, %d)",
                        s->m, s->n, s->k);
    if (s->n % 8 || s->k % 8)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "gemm: n (%d) and k (%d) must be multiples of 8 (16-byte rows)", s->n, s->k);
    if (s->dtype != STOF_F16 && s->dtype != STOF_BF16)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "gemm: dtype %s is not fp16 or bf16",
                        dtype_name(s->dtype));
    if ((int)e->act < GEMM_ACT_NONE || (int)e->act > GEMM_ACT_SWIGLU)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: activation %d is not a gemm_act", (int)e->act);
    if (e->ln_sum && !e->ln)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: ln_sum needs ln");
    if (e->act == GEMM_ACT_SWIGLU && (e->ln || e->residual))
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "gemm: the SwiGLU epilogue takes no %s (its output is half the product's "
                        "columns)",
                        e->ln ? "ln" : "residual");
    if (e->act == GEMM_ACT_SWIGLU && s->n % 16)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "gemm: with SwiGLU n (%d) must be a multiple of 16 (output rows of n / 2 "
                        "in 16-byte chunks)",
                        s->n);
    if (!c)
        return STOF_OK;
    char name[48];
    gemm_config_str(c, name, sizeof name);
    if (c->wg == GEMM_TMA)
        return check_tma(ctx, s, e, c, name);
    if (c->wg)
        return check_wg(ctx, s, e, c, name);
    if (c->wm <= 0 || c->wn <= 0 || c->wm * c->wn > 16)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: config %s: 1 to 16 warps", name);
    if (c->bm <= 0 || c->bn <= 0 || c->bm % (16 * c->wm) || c->bn % (16 * c->wn))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "gemm: config %s: bm must be a multiple of 16 * wm and bn of 16 * wn", name);
    if (c->bk != 32 && c->bk != 64)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: config %s: bk must be 32 or 64", name);
    if (c->stages < 2 || c->stages > 4)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: config %s: stages must be 2 to 4", name);
    if (e->ln && c->bn < s->n)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "gemm: config %s: ln needs one CTA per whole row, bn >= n (%d)", name, s->n);
    if ((s->m + c->bm - 1) / c->bm > 65535)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED, "gemm: m %d needs more than 65535 row tiles of %d",
                        s->m, c->bm);
    return STOF_OK;
}

/* ---- requests, loading, launch ------------------------------------------ */

void gemm_make_request(const gemm_config *c, const gemm_shape *s, const gemm_epilogue *e,
                       gemm_request *r)
{
    static const char *const acts[] = {"0", "1", "2", "3", "4"};
    const int nums[8] = {s->n, s->k, c->bm, c->bn, c->bk, c->wm, c->wn, c->stages};
    static const char *const names[8] = {"N",       "K",       "BLOCK_M", "BLOCK_N",
                                         "BLOCK_K", "WARPS_M", "WARPS_N", "STAGES"};
    int n = 0;
    for (int i = 0; i < 8; i++) {
        /* gemm_wg.cu's and gemm_tma.cu's tiling is bm, bn and stages: bk is
         * 64, warps follow bm (and for TMA, whether consumers share tiles). */
        if (c->wg && i >= 4 && i < 7)
            continue;
        snprintf(r->text[i], sizeof r->text[i], "%d", nums[i]);
        r->vars[n++] = (render_var){names[i], r->text[i]};
    }
    const int act = (int)e->act >= 0 && (int)e->act <= GEMM_ACT_SWIGLU ? (int)e->act : 0;
    r->vars[n++] = (render_var){"MMA_TYPE", s->dtype == STOF_BF16 ? "bf16" : "f16"};
    r->vars[n++] = (render_var){"BIAS", e->bias ? "1" : "0"};
    r->vars[n++] = (render_var){"ACT", acts[act]};
    r->vars[n++] = (render_var){"RESIDUAL", e->residual ? "1" : "0"};
    if (c->wg == GEMM_TMA) {
        r->vars[n++] = (render_var){"COOP", c->wn == 2 ? "2" : c->wm == 2 && !e->ln ? "1" : "0"};
        r->vars[n++] = (render_var){"LN", e->ln ? "1" : "0"};
        r->req = (jit_request){"gemm", "gemm_tma.cu", "stof_gemm_tma", r->vars, n, "wgmma.cuh"};
        return;
    }
    if (c->wg) {
        r->req = (jit_request){"gemm", "gemm_wg.cu", "stof_gemm_wg", r->vars, n, "wgmma.cuh"};
        return;
    }
    r->vars[n++] = (render_var){"LN", e->ln ? "1" : "0"};
    r->vars[n++] = (render_var){"LN_SUM", e->ln && e->ln_sum ? "1" : "0"};
    r->req = (jit_request){"gemm", "gemm.cu", "stof_gemm", r->vars, n, NULL};
}

stof_status gemm_prepare(stof_ctx *ctx, const gemm_config *c, const gemm_shape *s,
                         const gemm_epilogue *e, char *key)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    if (!c)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: argument 'config' is NULL");
    TRY(gemm_check(ctx, s, e, c));
    gemm_request r;
    gemm_make_request(c, s, e, &r);
    return jit_prepare(ctx, &r.req, key, NULL);
}

int gemm_requests(stof_ctx *ctx, const gemm_config *c, const gemm_shape *s, const gemm_epilogue *e,
                  int n, gemm_request *r)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        err_record saved = ctx->err;
        if (gemm_check(ctx, &s[i], &e[i], &c[i]) != STOF_OK ||
            (ctx->dev.ok && gemm_smem_bytes(&c[i], &s[i], &e[i]) > ctx->dev.smem_optin)) {
            ctx->err = saved;
            continue;
        }
        gemm_make_request(&c[i], &s[i], &e[i], &r[m++]);
    }
    return m;
}

stof_status gemm_prepare_all(stof_ctx *ctx, const gemm_config *c, const gemm_shape *s,
                             const gemm_epilogue *e, int n)
{
    if (n <= 0)
        return STOF_OK;
    gemm_request *r = malloc((size_t)n * sizeof *r);
    jit_request *reqs = malloc((size_t)n * sizeof *reqs);
    if (!r || !reqs) {
        free(r);
        free(reqs);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "gemm: out of memory listing %d kernels", n);
    }
    const int m = gemm_requests(ctx, c, s, e, n, r);
    for (int i = 0; i < m; i++)
        reqs[i] = r[i].req;
    stof_status st = jit_prepare_all(ctx, reqs, m);
    free(r);
    free(reqs);
    return st;
}

stof_status gemm_load(stof_ctx *ctx, const gemm_config *c, const gemm_shape *s,
                      const gemm_epilogue *e, CUfunction *fn, char *key)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    if (!c || !fn)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: argument '%s' is NULL", c ? "fn" : "config");
    TRY(gemm_check(ctx, s, e, c));
    TRY(ctx_need_device(ctx));
    const int smem = gemm_smem_bytes(c, s, e);
    if (smem > ctx->dev.smem_optin)
        return CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                        "gemm: config needs %d bytes of shared memory, the device allows %d", smem,
                        ctx->dev.smem_optin);
    gemm_request r;
    gemm_make_request(c, s, e, &r);
    CUfunction f;
    TRY(jit_get(ctx, &r.req, &f, NULL, key));
    /* Set even below the 48 KiB default: gemm_launch, which is not told the
     * epilogue, reads the size back from the function. */
    TRY(jit_push(ctx));
    stof_status st = CU(ctx, FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
    jit_pop(ctx);
    TRY(st);
    *fn = f;
    return STOF_OK;
}

static stof_status check_ptr(stof_ctx *ctx, const void *p, const char *name, int needed)
{
    if (!p && needed)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: argument '%s' is NULL", name);
    if ((uintptr_t)p % 16)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: argument '%s' (%p) is not 16-byte aligned",
                        name, p);
    return STOF_OK;
}

/* A TMA descriptor of rows x k elements, row-major, read or written in
 * boxes of box_rows x box_cols (64, with 128-byte swizzling, or 32, with
 * 64-byte: SwiGLU's output); out-of-range elements read as 0 and are not
 * written. */
static stof_status tma_map(stof_ctx *ctx, CUtensorMap *map, const void *p, stof_dtype t, int rows,
                           int k, int box_rows, int box_cols)
{
    const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)k * 2};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows};
    const cuuint32_t elem_strides[2] = {1, 1};
    return CU(ctx, TensorMapEncodeTiled(
                       map, t == STOF_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                       2, (void *)p, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                       box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

static stof_status launch_tma(stof_ctx *ctx, CUfunction fn, const gemm_config *c, const gemm_shape *s,
                              const gemm_args *a, CUstream stream)
{
    CUtensorMap tx, tw, to, tr;
    memset(&to, 0, sizeof to);
    memset(&tr, 0, sizeof tr);
    const void *bias = a->bias, *res = a->residual, *gamma = a->gamma, *beta = a->beta;
    void *out = a->out;
    int m = s->m;
    float eps = a->eps > 0.f ? a->eps : 1e-5f;
    void *args[] = {&tx, &tw, &to, &tr, &bias, &res, &gamma, &beta, &out, &m, &eps};
    const int ln = tma_ln_layout(c), cl = ln ? s->n / c->bn : 1;
    const gemm_epilogue layout = {.ln = ln, .act = a->swiglu ? GEMM_ACT_SWIGLU : GEMM_ACT_NONE};
    const unsigned smem = (unsigned)gemm_smem_bytes(c, s, &layout);
    /* Persistent: as many CTAs as run at once, at most one per tile; with
     * ln, whole clusters (the kernel's fixed size), as many as the device
     * can hold at once (fewer than SMs / cl where a GPC's SMs do not
     * divide), at most one per row block. */
    const long long units = ln ? (s->m + 63) / 64
                               : (long long)((s->m + c->bm - 1) / c->bm) * ((s->n + c->bn - 1) / c->bn);
    int slots = ctx->dev.sm_count;
    /* The descriptors are encoded in the context, like the launch. */
    TRY(jit_push(ctx));
    stof_status st = STOF_OK;
    if (ln) {
        CUlaunchConfig lc = {.gridDimX = (unsigned)cl, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 384,
                             .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = smem, .hStream = stream};
        st = CU(ctx, OccupancyMaxActiveClusters(&slots, fn, &lc));
        if (st == STOF_OK && slots < 1)
            st = CTX_FAIL(ctx, STOF_ERR_UNSUPPORTED,
                          "gemm: no cluster of %d CTAs with %u bytes of shared memory fits the device",
                          cl, smem);
    }
    const unsigned grid = (unsigned)((units < slots ? units : slots) * cl);
    if (st == STOF_OK)
        st = tma_map(ctx, &tx, a->x, s->dtype, s->m, s->k, c->bm, 64);
    if (st == STOF_OK)
        st = tma_map(ctx, &tw, a->w, s->dtype, s->n, s->k, c->wn == 2 ? c->bn / 2 : c->bn, 64);
    /* Without ln, the output and the residual in boxes of 64 columns by a
     * consumer's rows (the staging tile's boxes); SwiGLU's output of n / 2
     * columns in boxes of 32. */
    const int wg_rows = c->wm == 2 ? c->bm / 2 : c->bm;
    if (st == STOF_OK && !ln)
        st = tma_map(ctx, &to, a->out, s->dtype, s->m, a->swiglu ? s->n / 2 : s->n, wg_rows,
                     a->swiglu ? 32 : 64);
    if (st == STOF_OK && !ln && a->residual)
        st = tma_map(ctx, &tr, a->residual, s->dtype, s->m, s->n, wg_rows, 64);
    if (st == STOF_OK)
        st = jit_launch(ctx, fn, grid, 1, 1, 384, smem, stream, args);
    jit_pop(ctx);
    return st;
}

stof_status gemm_launch(stof_ctx *ctx, CUfunction fn, const gemm_config *c, const gemm_shape *s,
                        const gemm_args *a, CUstream stream)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    if (!fn || !c || !a)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "gemm: argument '%s' is NULL",
                        !fn ? "fn" : !c ? "config" : "args");
    /* The function was built for some epilogue; only the layout matters here. */
    const gemm_epilogue layout = {.ln = tma_ln_layout(c),
                                  .act = a->swiglu ? GEMM_ACT_SWIGLU : GEMM_ACT_NONE};
    TRY(gemm_check(ctx, s, &layout, c));
    TRY(check_ptr(ctx, a->x, "x", 1));
    TRY(check_ptr(ctx, a->w, "w", 1));
    TRY(check_ptr(ctx, a->out, "out", 1));
    TRY(check_ptr(ctx, a->bias, "bias", 0));
    TRY(check_ptr(ctx, a->residual, "residual", 0));
    TRY(check_ptr(ctx, a->gamma, "gamma", 0));
    TRY(check_ptr(ctx, a->beta, "beta", 0));
    TRY(check_ptr(ctx, a->sum_out, "sum_out", 0));
    TRY(ctx_need_device(ctx));

    if (c->wg == GEMM_TMA)
        return launch_tma(ctx, fn, c, s, a, stream);
    const void *x = a->x, *w = a->w, *bias = a->bias, *res = a->residual, *gamma = a->gamma,
               *beta = a->beta;
    void *out = a->out, *sum_out = a->sum_out;
    int m = s->m;
    float eps = a->eps > 0.f ? a->eps : 1e-5f;
    void *args[] = {&x, &w, &bias, &res, &gamma, &beta, &out, &sum_out, &m, &eps};
    TRY(jit_push(ctx));
    int smem = 0;
    stof_status st = CU(ctx, FuncGetAttribute(&smem, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn));
    if (st == STOF_OK)
        st = jit_launch(ctx, fn, (unsigned)((s->n + c->bn - 1) / c->bn),
                        (unsigned)((s->m + c->bm - 1) / c->bm), 1, (unsigned)gemm_threads(c),
                        (unsigned)smem, stream, args);
    jit_pop(ctx);
    return st;
}
