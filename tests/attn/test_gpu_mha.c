/* GPU suite: every attention kernel against the CPU reference (double) on
 * fresh random inputs, with the output poisoned first so an unwritten
 * element fails. Runs only where a GPU is present. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mask.h"
#include "attn/mha.h"
#include "attn/reference.h"
#include "base/half.h"
#include "ctx.h"
#include "gpu/jit.h"
#include "testutil.h"

typedef struct mcase {
    const char *spec;
    int batch, heads, lq, lk, d;
    stof_dtype dtype;
    stof_layout layout;
    int packed, lens;
    int kind, bm, bn;   /* kind -1: the planner chooses (tune fast) */
    int mt;             /* m16 row tiles per warp; 0 means 1 */
    int qs;             /* Q re-read from shared memory (mma.sync), P through it (ws) */
    int wg;             /* engine: 1 warpgroup MMA, 2 warp-specialized (sm_90a) */
    int st;             /* its stages; 0 means 2 */
} mcase;

/* What run_case adds to its case (issue 54; 0: off): KV heads (GQA, MQA;
 * 0 means heads), the logit softcap, and the scale (0: 1/sqrt(d)). */
typedef struct mmods {
    int kv;
    float softcap, scale;
} mmods;
static mmods case_mods;

/* And the score modifiers (0: off): ALiBi, its slopes given (random) or
 * standard, and the distance bias's buckets (a random table). */
typedef struct smods {
    int alibi, given, buckets;
} smods;
static smods case_smods;

/* Whether this GPU runs the warpgroup MMA kernels; says so when it does not. */
static int has_wgmma(void)
{
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, NULL), STOF_OK);
    char arch[16];
    int dev = 0;
    ck_assert_int_eq(stof_device_info(ctx, &dev, arch, sizeof arch, NULL, 0), STOF_OK);
    stof_close(ctx);
    if (strcmp(arch, "sm_90a") != 0)
        printf("gpu_mha: the GPU is %s, not sm_90a: wgmma kernels NOT run\n", arch);
    return strcmp(arch, "sm_90a") == 0;
}

/* The cache run_case plans with (none when NULL), and the mask summaries
 * its last plan made. */
static const char *case_cache;
static long long case_walks;
/* How run_case's plan must read gathered rows on the ws engine (0: not
 * checked): 1 copied, p > 1 through a view of period p (describe's rows=). */
static int case_view;

static double run_case(const mcase *c, uint64_t salt)
{
    stof_ctx *ctx;
    stof_options o = {.no_cache = !case_cache, .cache_path = case_cache};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    stof_mask *m;
    ck_assert_msg(stof_mask_parse(ctx, c->spec, c->lq, c->lk, &m) == STOF_OK, "%s",
                  stof_last_error(ctx));
    test_rng r = test_rng_make(salt);
    size_t D = (size_t)c->d, B = (size_t)c->batch, H = (size_t)c->heads;
    size_t KVH = case_mods.kv ? (size_t)case_mods.kv : H;
    size_t nq = B * H * c->lq * D, nk = B * KVH * c->lk * D;
    uint16_t *q = malloc(2 * nq), *k = malloc(2 * nk), *v = malloc(2 * nk), *out = malloc(2 * nq);
    /* Packed rows: q's H heads, then k's and v's KVH heads each. */
    const size_t W = (H + 2 * KVH) * D, npk = B * (size_t)c->lq * W;
    uint16_t *packed = c->packed ? malloc(2 * npk) : NULL;
    double *ref = malloc(sizeof(double) * nq);
    ck_assert(q && k && v && out && ref && (!c->packed || packed));
    test_fill_uniform(&r, c->dtype, q, nq, 0, 1);
    test_fill_uniform(&r, c->dtype, k, nk, 0, 1);
    test_fill_uniform(&r, c->dtype, v, nk, 0, 1);
    int lens[64];
    for (int b = 0; b < c->batch; b++)
        lens[b] = c->lens ? test_rng_int(&r, 1, c->lq) : c->lq;
    if (c->packed) /* [B, L, H + 2 KVH, D] from the BLHD tensors */
        for (size_t b = 0; b < B; b++)
            for (size_t l = 0; l < (size_t)c->lq; l++) {
                uint16_t *row = packed + (b * c->lq + l) * W;
                memcpy(row, q + (b * c->lq + l) * H * D, 2 * H * D);
                memcpy(row + H * D, k + (b * c->lq + l) * KVH * D, 2 * KVH * D);
                memcpy(row + (H + KVH) * D, v + (b * c->lq + l) * KVH * D, 2 * KVH * D);
            }

    /* The modifiers' tables: slopes of 1/64 to 1/2, biases of -2 to 2. */
    const smods sm = case_smods;
    float *slopes = malloc(sizeof(float) * H);
    float *table = malloc(sizeof(float) * H * (size_t)(sm.buckets ? sm.buckets : 1));
    ck_assert(slopes && table);
    for (size_t h = 0; h < H; h++)
        slopes[h] = (float)(1.0 / 64 + test_rng_uniform(&r) * (0.5 - 1.0 / 64));
    for (size_t i = 0; i < H * (size_t)sm.buckets; i++)
        table[i] = (float)(test_rng_uniform(&r) * 4 - 2);
    CUdeviceptr dslopes = sm.alibi && sm.given ? test_upload(ctx, slopes, sizeof(float) * H) : 0;
    CUdeviceptr dtable = sm.buckets ? test_upload(ctx, table, sizeof(float) * H * sm.buckets) : 0;

    stof_mha_desc d = {.batch = c->batch, .heads = c->heads, .seq_q = c->lq, .seq_k = c->lk,
                       .head_dim = c->d, .dtype = c->dtype, .layout = c->layout,
                       .qkv_packed = c->packed, .scale = case_mods.scale, .tune = STOF_TUNE_FAST,
                       .kv_heads = case_mods.kv, .softcap = case_mods.softcap,
                       .alibi = sm.alibi, .alibi_slopes = (const float *)dslopes,
                       .bias_buckets = sm.buckets, .bias_table = (const float *)dtable};
    stof_mha_plan *plan = NULL;
    stof_status st;
    long long walks = mask_summaries_made();
    if (c->kind < 0) {
        st = stof_mha_plan_create(ctx, &d, m, &plan);
    } else {
        mha_candidate cand = {(attn_kind)c->kind, c->bm, c->bn, c->mt ? c->mt : 1, c->qs, c->wg,
                              c->wg ? (c->st ? c->st : 2) : 0};
        st = mha_plan_forced(ctx, &d, m, &cand, &plan);
    }
    ck_assert_msg(st == STOF_OK, "plan %s: %s", c->spec, stof_last_error(ctx));
    case_walks = mask_summaries_made() - walks;
    CUdeviceptr dq = test_upload(ctx, c->packed ? (void *)packed : (void *)q,
                                 2 * (c->packed ? npk : nq));
    CUdeviceptr dk = c->packed ? 0 : test_upload(ctx, k, 2 * nk),
                dv = c->packed ? 0 : test_upload(ctx, v, 2 * nk);
    CUdeviceptr dout = test_upload(ctx, NULL, 2 * nq);
    CUdeviceptr dlens = c->lens ? test_upload(ctx, lens, sizeof(int) * B) : 0;
    st = stof_mha_run(plan, (void *)dq, (void *)dk, (void *)dv, (void *)dout, (const int *)dlens, NULL);
    ck_assert_msg(st == STOF_OK, "run: %s", stof_last_error(ctx));
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemcpyDtoH(out, dout, 2 * nq)), STOF_OK);
    ctx->dev.api.MemFree(dq);
    if (dk) ctx->dev.api.MemFree(dk);
    if (dv) ctx->dev.api.MemFree(dv);
    ctx->dev.api.MemFree(dout);
    if (dlens) ctx->dev.api.MemFree(dlens);
    if (dslopes) ctx->dev.api.MemFree(dslopes);
    if (dtable) ctx->dev.api.MemFree(dtable);
    jit_pop(ctx);

    ref_attn_args a = {c->batch, c->heads, c->lq, c->lk, c->d, c->dtype,
                       c->layout ? c->layout : STOF_LAYOUT_BHLD, case_mods.scale, q, k, v, m,
                       c->lens ? lens : NULL, NULL, case_mods.kv, case_mods.softcap,
                       sm.alibi, sm.alibi && sm.given ? slopes : NULL, sm.buckets,
                       sm.buckets ? table : NULL};
    ck_assert_int_eq(ref_attention(ctx, &a, ref), STOF_OK);
    double tol = c->dtype == STOF_BF16 ? 1.5e-2 : 5e-3;
    /* The case must tell a kernel with each modifier from one that ignores
     * it: the reference without it lies well outside the tolerance. */
    for (int mod = 0; mod < 3; mod++) {
        ref_attn_args without = a;
        if (mod == 0 && case_mods.softcap > 0)
            without.softcap = 0;
        else if (mod == 1 && sm.alibi)
            without.alibi = 0, without.alibi_slopes = NULL;
        else if (mod == 2 && sm.buckets)
            without.bias_buckets = 0, without.bias_table = NULL;
        else
            continue;
        double *plain = malloc(sizeof(double) * nq), pn = 0, pd = 0;
        ck_assert_ptr_nonnull(plain);
        ck_assert_int_eq(ref_attention(ctx, &without, plain), STOF_OK);
        for (size_t i = 0; i < nq; i++) {
            pn += (plain[i] - ref[i]) * (plain[i] - ref[i]);
            pd += ref[i] * ref[i];
        }
        ck_assert_msg(sqrt(pn / pd) > 5 * tol, "%s: %s changes the output by only %.3g", c->spec,
                      mod == 0 ? "the softcap" : mod == 1 ? "ALiBi" : "the bias", sqrt(pn / pd));
        free(plain);
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < nq; i++) {
        double g = dtype_load(c->dtype, out, i);
        ck_assert_msg(!isnan(g), "%s: element %zu not written or NaN", c->spec, i);
        num += (g - ref[i]) * (g - ref[i]);
        den += ref[i] * ref[i];
    }
    double err = den > 0 ? sqrt(num / den) : sqrt(num);
    char desc[512];
    stof_mha_plan_describe(plan, desc, sizeof desc);
    printf("mha %-28s b%d h%d kv%d %dx%d d%d %s %s%s%s softcap %g alibi %s bias %d: rel L2 %.2e  "
           "[%s]\n", c->spec, c->batch, c->heads, (int)KVH, c->lq, c->lk, c->d,
           dtype_name(c->dtype), c->layout == STOF_LAYOUT_BLHD ? "blhd" : "bhld",
           c->packed ? " packed" : "", c->lens ? " lens" : "", (double)case_mods.softcap,
           !sm.alibi ? "off" : sm.given ? "given" : "standard", sm.buckets, err, desc);
    ck_assert_msg(err <= tol, "%s: relative L2 error %.3g above %.3g (%s)", c->spec, err, tol, desc);
    if (case_view) {
        char want[32];
        snprintf(want, sizeof want, case_view > 1 ? " rows=tma/%d " : " rows=copies ", case_view);
        ck_assert_msg(strstr(desc, want), "%s: %s expected (%s)", c->spec, want, desc);
    }
    stof_mha_plan_free(plan);
    stof_mask_free(m);
    free(q); free(k); free(v); free(out); free(packed); free(ref); free(slopes); free(table);
    stof_close(ctx);
    return err;
}

static const char *const SPECS[] = {
    "dense", "causal", "window:64", "causal_window:48", "dilated:64:2", "global:16",
    "strided:8", "random:2:32:7", "docs:100,157,120", "window:64+global:16",
    "window:48+global:16+random:2:32:3", "window:64+strided:8", "causal&window:96",
    "causal&docs:100,157,120", "dilated:32:3+global:8"};
#define NSPECS (int)(sizeof SPECS / sizeof SPECS[0])

/* Every mask term and combination, both kernel kinds, odd length 377. */
START_TEST(every_mask_both_kinds)
{
    for (int kind = 0; kind < 2; kind++) {
        mcase c = {SPECS[_i], 2, 3, 377, 377, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, kind,
                   kind ? 128 : 64, 64, kind ? 2 : 1, 0, 0, 0};
        run_case(&c, 100 + _i * 2 + kind);
    }
    if (!has_wgmma())
        return;
    for (int kind = 0; kind < 2; kind++) {
        mcase c = {SPECS[_i], 2, 3, 377, 377, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, kind,
                   kind ? 192 : 128, kind ? 64 : 128, 1, 0, 1, kind ? 3 : 2};
        run_case(&c, 150 + _i * 2 + kind);
    }
    mcase ws = {SPECS[_i], 2, 3, 377, 377, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK,
                128, 128, 1, 0, MHA_WS, 2};
    run_case(&ws, 180 + _i);
    mcase wsg = {SPECS[_i], 2, 3, 377, 377, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_GATHER,
                 128, 128, 1, 0, MHA_WS, 3};
    run_case(&wsg, 200 + _i);
}
END_TEST

/* Each head size and dtype, both kinds, every mma.sync size the search may pick. */
START_TEST(head_dims_dtypes_tiles)
{
    static const int dims[] = {32, 64, 80, 96, 128};
    mha_candidate cs[64];
    int n = mha_candidates(dims[_i], 227 * 1024, 0, cs, 64);
    for (int i = 0; i < n; i++) {
        int dt = i % 2;
        mcase c = {"window:96+global:8", 1, 2, 301, 301, dims[_i], dt ? STOF_BF16 : STOF_F16,
                   STOF_LAYOUT_BHLD, 0, 0, cs[i].kind, cs[i].bm, cs[i].bn, cs[i].mt, cs[i].qs, 0, 0};
        run_case(&c, 500 + _i * 50 + i);
    }
    ck_assert_int_ge(n, 8);
}
END_TEST

/* The warpgroup MMA kernels: each head size and dtype, every size and
 * stage count the search may pick, both kinds (the warp-specialized
 * engine: block kind, and 96, P in registers or shared memory). */
START_TEST(wgmma_tiles)
{
    if (!has_wgmma())
        return;
    static const int dims[] = {64, 128, 96};
    const int dim = dims[_i];
    mha_candidate cs[64];
    int n = mha_candidates(dim, 227 * 1024, 1, cs, 64), tested = 0;
    for (int i = 0; i < n; i++) {
        if (!cs[i].wg)
            continue;
        int dt = tested++ % 2;
        mcase c = {"window:96+global:8", 1, 2, 301, 301, dim, dt ? STOF_BF16 : STOF_F16,
                   STOF_LAYOUT_BHLD, 0, 0, cs[i].kind, cs[i].bm, cs[i].bn, 1, cs[i].qs, cs[i].wg,
                   cs[i].st};
        run_case(&c, 700 + _i * 50 + i);
    }
    ck_assert_int_ge(tested, dim == 96 ? 4 : 8);
}
END_TEST

START_TEST(layouts_lens_packed)
{
    mcase cases[] = {
        {"causal", 3, 2, 250, 250, 64, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, 0, 64, 64, 1, 0, 0, 0},
        {"window:64+global:16", 3, 2, 250, 250, 64, STOF_BF16, STOF_LAYOUT_BHLD, 0, 1, 0, 64, 64, 1, 0, 0, 0},
        {"dilated:64:2", 3, 2, 250, 250, 128, STOF_F16, STOF_LAYOUT_BLHD, 0, 1, 1, 128, 64, 2, 1, 0, 0},
        {"window:64+strided:8", 2, 4, 300, 300, 64, STOF_F16, STOF_LAYOUT_BLHD, 1, 0, 0, 64, 64, 1, 0, 0, 0},
        {"window:64+strided:8", 2, 4, 300, 300, 64, STOF_BF16, STOF_LAYOUT_BLHD, 1, 1, 1, 128, 32, 2, 0, 0, 0},
        {"causal", 2, 2, 200, 333, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, 0, 64, 64, 1, 0, 0, 0},
        {"window:64", 2, 2, 333, 200, 96, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, 1, 64, 64, 1, 0, 0, 0},
        {"causal", 3, 2, 250, 250, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, 0, 128, 128, 1, 0, 1, 2},
        {"window:64+strided:8", 2, 4, 300, 300, 64, STOF_F16, STOF_LAYOUT_BLHD, 1, 1, 1, 192, 64, 1, 0, 1, 3},
        {"causal", 2, 2, 200, 333, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, 0, 128, 64, 1, 0, 1, 4},
        {"window:64", 2, 2, 333, 200, 128, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, 1, 64, 128, 1, 0, 1, 3},
        {"causal", 3, 2, 250, 250, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, 0, 128, 128, 1, 0, MHA_WS, 2},
        {"window:64+global:16", 2, 4, 300, 300, 64, STOF_F16, STOF_LAYOUT_BLHD, 1, 1, 0, 192, 64, 1, 0, MHA_WS, 3},
        {"causal", 2, 2, 200, 333, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, 0, 128, 192, 1, 0, MHA_WS, 2},
        {"window:64", 2, 2, 333, 200, 128, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, 0, 128, 64, 1, 0, MHA_WS, 3},
        {"docs:100,157,120", 3, 2, 377, 377, 64, STOF_BF16, STOF_LAYOUT_BHLD, 0, 1, 0, 128, 128, 1, 0, MHA_WS, 2},
    };
    if (cases[_i].wg && !has_wgmma())
        return;
    run_case(&cases[_i], 900 + _i);
}
END_TEST

/* The warp-specialized engine on lengths that are not tile multiples, with
 * and without per-sequence lengths, batch 1, every head size (80 and 96 in
 * 64-byte swizzled atoms) and both dtypes. */
START_TEST(ws_long_rows)
{
    if (!has_wgmma())
        return;
    static const char *const specs[] = {"dense", "causal", "window:256+global:64", "causal",
                                        "dense", "causal", "window:256+global:64", "causal"};
    static const int lens[] = {1000, 3001, 1000, 3001, 3001, 1000, 3001, 1000};
    static const int dims[] = {64, 128, 64, 128, 80, 96, 96, 80};
    const int d = dims[_i];
    mcase c = {specs[_i], 1, 2, lens[_i], lens[_i], d, _i % 2 ? STOF_BF16 : STOF_F16,
               STOF_LAYOUT_BHLD, 0, _i >= 2, ATTN_BLOCK, 128, d == 64 ? 192 : 128, 1, 0, MHA_WS, 2};
    run_case(&c, 1100 + _i);
}
END_TEST

/* The warp-specialized engine's 192-row items at head_dim 80 and 96 (P
 * through shared memory beside 128- and 144-key tiles, O staged in P's
 * tile; in registers beside 96-key ones; and at 64): lengths that are not
 * tile multiples, per-sequence lengths, partial tiles of five bitmap words
 * a row (144 keys), several items per CTA, both dtypes. */
START_TEST(ws_wide_heads)
{
    if (!has_wgmma())
        return;
    mcase cases[] = {
        {"dense", 1, 2, 3001, 3001, 96, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 192, 128, 1, 1, MHA_WS, 2},
        {"causal", 4, 8, 1000, 1000, 80, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_BLOCK, 192, 128, 1, 1, MHA_WS, 2},
        {"window:256+global:64", 2, 4, 1000, 1000, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 1, ATTN_BLOCK, 192, 128, 1, 1, MHA_WS, 2},
        {"docs:100,157,120", 3, 2, 377, 377, 96, STOF_BF16, STOF_LAYOUT_BHLD, 0, 1, ATTN_BLOCK, 192, 128, 1, 1, MHA_WS, 2},
        {"causal", 1, 2, 3001, 3001, 96, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 192, 96, 1, 0, MHA_WS, 2},
        {"window:256+global:64", 4, 8, 1000, 1000, 80, STOF_F16, STOF_LAYOUT_BLHD, 0, 1, ATTN_BLOCK, 192, 96, 1, 0, MHA_WS, 2},
        {"dense", 3, 4, 3001, 3001, 96, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 192, 144, 1, 1, MHA_WS, 2},
        {"causal", 4, 8, 1000, 1000, 80, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_BLOCK, 192, 144, 1, 1, MHA_WS, 2},
        {"window:256+global:64", 4, 8, 1000, 1000, 96, STOF_F16, STOF_LAYOUT_BHLD, 0, 1, ATTN_BLOCK, 192, 144, 1, 1, MHA_WS, 2},
        {"docs:100,157,120", 3, 2, 377, 377, 80, STOF_BF16, STOF_LAYOUT_BHLD, 0, 1, ATTN_BLOCK, 192, 144, 1, 1, MHA_WS, 2},
    };
    run_case(&cases[_i], 1350 + _i);
}
END_TEST

/* The warp-specialized engine with several items per CTA (its persistent
 * grid has one CTA per SM), so that an item's last P V runs with the next
 * item's first S, items with no tile (Lq > Lk under a window) among them;
 * the lagging consumer on items of one tile, none, and many; three
 * consumers on a ring of three stages. */
START_TEST(ws_items_in_turn)
{
    if (!has_wgmma())
        return;
    mcase cases[] = {
        {"dense", 4, 8, 1000, 1000, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2},
        {"window:64", 4, 8, 1000, 300, 64, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 64, 1, 0, MHA_WS, 3},
        {"causal", 4, 8, 1000, 1000, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2},
        {"window:256+global:64", 4, 8, 1000, 1000, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 1, ATTN_BLOCK, 192, 128, 1, 0, MHA_WS, 2},
        /* warpgroup 1 a step behind (LAG: 128-key tiles, 3 or 4 stages) */
        {"window:64", 4, 8, 1000, 300, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 1, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 3},
        {"causal", 4, 8, 1000, 1000, 64, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 4},
        {"dense", 3, 4, 3001, 3001, 96, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 3},
        /* three consumers on a ring of three stages */
        {"causal", 4, 8, 1000, 1000, 64, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_BLOCK, 192, 128, 1, 0, MHA_WS, 3},
    };
    run_case(&cases[_i], 1300 + _i);
}
END_TEST

/* The warp-specialized engine on gathered rows and keys: lengths that are
 * not tile multiples, per-sequence lengths, both layouts and packed QKV,
 * batch 1, head_dim 64 and 128, both dtypes, 64- and 128-key tiles, every
 * stage count (the lagging consumer at 3 and 4), several items per CTA. */
START_TEST(ws_gathers_rows)
{
    if (!has_wgmma())
        return;
    mcase cases[] = {
        {"dilated:256:2", 1, 2, 3001, 3001, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 2},
        {"window:256+strided:8", 4, 8, 1000, 1000, 64, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 3},
        {"dilated:128:3+global:8", 3, 4, 1000, 1000, 128, STOF_BF16, STOF_LAYOUT_BHLD, 0, 1, ATTN_GATHER, 128, 64, 1, 0, MHA_WS, 4},
        {"window:64+strided:8", 2, 4, 300, 300, 64, STOF_F16, STOF_LAYOUT_BLHD, 1, 1, ATTN_GATHER, 128, 64, 1, 0, MHA_WS, 3},
        {"strided:8", 2, 2, 200, 333, 128, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 2},
        {"random:2:32:7", 2, 2, 333, 200, 64, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 4},
        /* Residue classes through the view: lengths the period divides into
         * whole groups, per-sequence lengths, Lq != Lk, packed QKV. */
        {"dilated:256:2", 2, 3, 1024, 1024, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 3},
        {"dilated:128:4", 2, 2, 2048, 2048, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 2},
        {"dilated:64:2", 3, 2, 512, 1024, 64, STOF_BF16, STOF_LAYOUT_BHLD, 0, 1, ATTN_GATHER, 128, 64, 1, 0, MHA_WS, 4},
        {"dilated:96:3", 2, 4, 768, 768, 64, STOF_F16, STOF_LAYOUT_BLHD, 1, 1, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 2},
        {"dilated:200:2", 1, 2, 256, 256, 128, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_GATHER, 128, 64, 1, 0, MHA_WS, 3},
        /* each residue's last group padded: 500 and 385 rows a residue */
        {"dilated:256:2", 2, 2, 1000, 1000, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 1, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 3},
        {"dilated:96:3", 1, 3, 1155, 1155, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, ATTN_GATHER, 128, 64, 1, 0, MHA_WS, 2},
    };
    static const int views[] = {1, 1, 1, 1, 1, 1, 2, 4, 2, 3, 2, 2, 3};
    case_view = views[_i];
    run_case(&cases[_i], 1400 + _i);
    case_view = 0;
}
END_TEST

/* A plan keeps the last run's TMA descriptors: runs on other tensors, the
 * same inputs into another output and other inputs into the same output
 * each read and write their own (checked against the reference). */
START_TEST(ws_runs_follow_pointers)
{
    if (!has_wgmma())
        return;
    stof_ctx *ctx;
    stof_options o = {.no_cache = 1};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    const int B = 2, H = 3, L = 300, D = 64;
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:64+global:16", L, L, &m), STOF_OK);
    stof_mha_desc d = {.batch = B, .heads = H, .seq_q = L, .seq_k = L, .head_dim = D,
                       .dtype = STOF_F16, .layout = STOF_LAYOUT_BHLD};
    mha_candidate cand = {ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2};
    stof_mha_plan *plan;
    ck_assert_msg(mha_plan_forced(ctx, &d, m, &cand, &plan) == STOF_OK, "%s", stof_last_error(ctx));
    size_t n = (size_t)B * H * L * D;
    uint16_t *host[2][3], *got = malloc(2 * n);
    double *ref[2];
    CUdeviceptr dev[2][3], out[2];
    test_rng r = test_rng_make(1400);
    for (int s = 0; s < 2; s++) {
        for (int t = 0; t < 3; t++) {
            host[s][t] = malloc(2 * n);
            test_fill_uniform(&r, STOF_F16, host[s][t], n, 0, 1);
            dev[s][t] = test_upload(ctx, host[s][t], 2 * n);
        }
        out[s] = test_upload(ctx, NULL, 2 * n);
        ref[s] = malloc(sizeof(double) * n);
        ref_attn_args a = {B, H, L, L, D, STOF_F16, STOF_LAYOUT_BHLD, 0,
                           host[s][0], host[s][1], host[s][2], m, NULL, NULL, 0, 0, 0, NULL, 0,
                           NULL};
        ck_assert_int_eq(ref_attention(ctx, &a, ref[s]), STOF_OK);
    }
    /* (inputs, output): new both, new both, old inputs into a used output,
     * the same again (every descriptor reused). */
    static const int runs[4][2] = {{0, 0}, {1, 1}, {0, 1}, {0, 1}};
    for (int i = 0; i < 4; i++) {
        int s = runs[i][0], w = runs[i][1];
        ck_assert_int_eq(jit_push(ctx), STOF_OK);
        ck_assert_int_eq(CU(ctx, MemsetD8(out[w], 0xff, 2 * n)), STOF_OK);
        jit_pop(ctx);
        ck_assert_int_eq(stof_mha_run(plan, (void *)dev[s][0], (void *)dev[s][1], (void *)dev[s][2],
                                      (void *)out[w], NULL, NULL), STOF_OK);
        ck_assert_int_eq(jit_push(ctx), STOF_OK);
        ck_assert_int_eq(CU(ctx, MemcpyDtoH(got, out[w], 2 * n)), STOF_OK);
        jit_pop(ctx);
        double num = 0, den = 0;
        for (size_t e = 0; e < n; e++) {
            double g = dtype_load(STOF_F16, got, e);
            ck_assert_msg(!isnan(g), "run %d: element %zu not written", i, e);
            num += (g - ref[s][e]) * (g - ref[s][e]);
            den += ref[s][e] * ref[s][e];
        }
        ck_assert_msg(sqrt(num / den) <= 5e-3, "run %d: relative L2 error %.3g", i,
                      sqrt(num / den));
    }
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    for (int s = 0; s < 2; s++) {
        for (int t = 0; t < 3; t++) {
            ctx->dev.api.MemFree(dev[s][t]);
            free(host[s][t]);
        }
        ctx->dev.api.MemFree(out[s]);
        free(ref[s]);
    }
    jit_pop(ctx);
    free(got);
    stof_mha_plan_free(plan);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* Issue 54's decoder-model cases, each engine forced as the suites above
 * force them (mma.sync block and gathered, wgmma, warp-specialized by TMA,
 * by copies and through a view), then the planner's own choice:
 *   grouped KV heads: 8 query heads on 2 KV heads (GQA) and on 1 (MQA), k
 *   and v holding only those (a kernel reading KV head h instead of h /
 *   group reads past them or the wrong one);
 *   a KV prefix: 257 queries, the last of 1000 keys, causal and
 *   causal_window bottom-right aligned (chunked prefill);
 *   the logit softcap 30 with scale 8, so that the scores reach the cap
 *   (run_case checks that the uncapped reference is far off; the
 *   warp-specialized engine's 192-row items refuse it: 128-row ones here);
 * at odd lengths, both layouts and dtypes, outputs poisoned. */
static const struct {
    mcase c;
    mmods mods;
} LLM_CASES[] = {
    /* GQA 8 / 2 and MQA on every engine */
    {{"causal", 2, 8, 377, 377, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, {2, 0, 0}},
    {{"window:64+global:16", 2, 8, 377, 377, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_GATHER, 128, 64, 2, 1, 0, 0}, {2, 0, 0}},
    {{"causal_window:96", 1, 8, 301, 301, 80, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, {1, 0, 0}},
    {{"causal", 2, 8, 377, 377, 128, STOF_BF16, STOF_LAYOUT_BHLD, 0, 1, ATTN_BLOCK, 128, 128, 1, 0, 1, 2}, {2, 0, 0}},
    {{"dilated:64:2", 2, 8, 377, 377, 64, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, ATTN_GATHER, 128, 64, 1, 0, 1, 3}, {1, 0, 0}},
    {{"causal", 2, 8, 1000, 1000, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {2, 0, 0}},
    {{"dense", 1, 8, 1000, 1000, 96, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 192, 128, 1, 1, MHA_WS, 2}, {1, 0, 0}},
    {{"causal_window:256", 2, 8, 1000, 1000, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 192, 128, 1, 0, MHA_WS, 3}, {2, 0, 0}},
    {{"window:256+strided:8", 2, 8, 1000, 1000, 64, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 3}, {2, 0, 0}},
    {{"dilated:256:2", 2, 8, 1024, 1024, 128, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 2}, {1, 0, 0}},
    /* GQA from one packed QKV projection, [B, L, H + 2 KVH, D] (the decoder layer's) */
    {{"causal", 2, 8, 377, 377, 64, STOF_F16, STOF_LAYOUT_BLHD, 1, 0, ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, {2, 0, 0}},
    {{"causal_window:96", 1, 8, 301, 301, 128, STOF_BF16, STOF_LAYOUT_BLHD, 1, 1, ATTN_BLOCK, 128, 64, 1, 0, 1, 3}, {2, 0, 0}},
    {{"causal", 2, 8, 1000, 1000, 128, STOF_BF16, STOF_LAYOUT_BLHD, 1, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {2, 0, 0}},
    {{"causal_window:256", 1, 8, 1000, 1000, 64, STOF_F16, STOF_LAYOUT_BLHD, 1, 0, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 3}, {1, 0, 0}},
    {{"causal", 1, 8, 1000, 1000, 128, STOF_BF16, STOF_LAYOUT_BLHD, 1, 0, -1, 0, 0, 0, 0, 0, 0}, {2, 0, 0}},
    /* a KV prefix: 257 queries after 743 keys of context */
    {{"causal", 2, 4, 257, 1000, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, {0, 0, 0}},
    {{"causal_window:128", 2, 4, 257, 1000, 64, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, ATTN_GATHER, 64, 64, 1, 0, 0, 0}, {0, 0, 0}},
    {{"causal", 2, 4, 257, 1000, 128, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 64, 1, 0, 1, 3}, {0, 0, 0}},
    {{"causal_window:128", 2, 4, 257, 1000, 64, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 64, 128, 1, 0, 1, 4}, {0, 0, 0}},
    {{"causal", 2, 4, 257, 1000, 128, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {0, 0, 0}},
    {{"causal_window:128", 2, 4, 257, 1000, 64, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 192, 128, 1, 0, MHA_WS, 2}, {0, 0, 0}},
    {{"window:128", 2, 4, 257, 1000, 96, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 3}, {0, 0, 0}},
    /* softcap 30, scores scaled up to reach it */
    {{"causal", 2, 4, 377, 377, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, {0, 30, 8}},
    {{"window:64+global:16", 2, 4, 377, 377, 64, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_GATHER, 64, 64, 1, 0, 0, 0}, {0, 30, 8}},
    {{"causal", 2, 4, 377, 377, 128, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, 1, 2}, {0, 30, 8}},
    {{"causal_window:256", 2, 4, 1000, 1000, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 1, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {0, 30, 8}},
    {{"dense", 1, 4, 1000, 1000, 80, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {0, 30, 8}},
    {{"window:256+strided:8", 2, 4, 1000, 1000, 128, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_GATHER, 128, 64, 1, 0, MHA_WS, 3}, {0, 30, 8}},
    /* all three at once: Gemma-2 style chunked prefill */
    {{"causal_window:256", 2, 8, 257, 1000, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, {2, 30, 8}},
    {{"causal_window:256", 2, 8, 257, 1000, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, 1, 3}, {2, 30, 8}},
    {{"causal_window:256", 2, 8, 257, 1000, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {2, 30, 8}},
    /* the planner's choice (tune fast: the model's best, timed and checked) */
    {{"causal", 1, 8, 1000, 1000, 128, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, -1, 0, 0, 0, 0, 0, 0}, {2, 0, 0}},
    {{"causal_window:128", 1, 8, 257, 1000, 64, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, -1, 0, 0, 0, 0, 0, 0}, {1, 0, 0}},
    {{"causal", 2, 4, 377, 377, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, -1, 0, 0, 0, 0, 0, 0}, {0, 30, 8}},
    {{"dilated:128:2", 2, 8, 640, 640, 64, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, -1, 0, 0, 0, 0, 0, 0}, {4, 50, 8}},
};
#define NLLM (int)(sizeof LLM_CASES / sizeof LLM_CASES[0])

START_TEST(gqa_prefix_softcap)
{
    if (LLM_CASES[_i].c.wg && !has_wgmma())
        return;
    case_mods = LLM_CASES[_i].mods;
    run_case(&LLM_CASES[_i].c, 1600 + _i);
    case_mods = (mmods){0};
}
END_TEST

/* Packed variable-length batches (issue 54, stof_mha_run_varlen): the
 * plan's longest sequence and its mask, then the sequences of one run,
 * each checked against the reference of its own mask (the spec at its own
 * lengths: bottom-right aligned for causal and windows, the top-left corner
 * at equal lengths for the rest, what stof.h promises). */
typedef struct vcase {
    const char *spec;
    int lq, lk, heads, kv, d;   /* the plan's longest sequence; kv: 0 means heads */
    stof_dtype dtype;
    int kind, bm, bn, wg, st;   /* the candidate forced; kind -1: the planner's */
    int n;                      /* sequences in the run (the plan takes one more) */
    int len_q[5], len_k[5];     /* len_k 0: len_q */
} vcase;

static const vcase VARLEN_CASES[] = {
    /* equal lengths, odd, one past the plan's longest (truncated), every engine */
    {"causal", 600, 600, 4, 0, 64, STOF_F16, ATTN_BLOCK, 64, 64, 0, 0, 5, {1, 63, 200, 513, 700},
     {0}},
    {"causal_window:128", 600, 600, 4, 0, 128, STOF_BF16, ATTN_BLOCK, 64, 32, 0, 0, 4,
     {63, 1, 513, 200}, {0}},
    {"dense", 600, 600, 4, 0, 80, STOF_F16, ATTN_BLOCK, 128, 64, 0, 0, 4, {200, 513, 1, 63}, {0}},
    {"dilated:64:2", 600, 600, 4, 0, 64, STOF_BF16, ATTN_GATHER, 64, 64, 0, 0, 4,
     {513, 63, 200, 1}, {0}},
    {"causal", 600, 600, 4, 0, 128, STOF_BF16, ATTN_BLOCK, 128, 64, 1, 4, 5,
     {1, 63, 200, 513, 700}, {0}},
    {"causal_window:128", 600, 600, 4, 0, 64, STOF_F16, ATTN_BLOCK, 64, 128, 1, 4, 4,
     {513, 200, 63, 1}, {0}},
    {"dense", 600, 600, 4, 0, 64, STOF_BF16, ATTN_BLOCK, 128, 128, 1, 3, 3, {200, 1, 513}, {0}},
    {"dilated:64:2", 600, 600, 4, 0, 128, STOF_F16, ATTN_GATHER, 128, 64, 1, 4, 4,
     {1, 513, 63, 200}, {0}},
    {"window:32+strided:8", 600, 600, 4, 0, 64, STOF_F16, ATTN_GATHER, 64, 64, 0, 0, 3,
     {513, 63, 200}, {0}},
    /* GQA 8 / 2 */
    {"causal", 600, 600, 8, 2, 64, STOF_F16, ATTN_BLOCK, 64, 64, 0, 0, 4, {63, 200, 1, 513}, {0}},
    {"causal_window:96", 600, 600, 8, 2, 128, STOF_BF16, ATTN_BLOCK, 128, 128, 1, 2, 4,
     {513, 1, 200, 63}, {0}},
    {"dilated:64:2", 600, 600, 8, 2, 64, STOF_F16, ATTN_GATHER, 128, 64, 1, 3, 3, {200, 513, 63},
     {0}},
    /* a KV prefix per sequence: keys moved right (d < 0) and rows moved
     * down (d > 0) along the plan's diagonal */
    {"causal", 256, 600, 8, 2, 64, STOF_F16, ATTN_BLOCK, 64, 64, 0, 0, 4, {1, 63, 200, 256},
     {100, 363, 513, 600}},
    {"causal_window:128", 256, 600, 4, 0, 64, STOF_BF16, ATTN_GATHER, 64, 64, 0, 0, 3,
     {63, 200, 1}, {513, 300, 2}},
    {"causal", 600, 600, 4, 0, 128, STOF_BF16, ATTN_BLOCK, 128, 64, 1, 4, 4, {100, 1, 63, 200},
     {400, 513, 63, 599}},
    {"window:64", 256, 600, 8, 2, 128, STOF_F16, ATTN_BLOCK, 64, 64, 1, 4, 3, {200, 63, 1},
     {513, 200, 600}},
    {"causal_window:128", 600, 600, 8, 2, 64, STOF_F16, ATTN_BLOCK, 128, 128, 1, 3, 3,
     {63, 200, 17}, {500, 201, 513}},
    /* the warp-specialized engine (MHA_WS): odd lengths, a truncated
     * sequence, boxes of O that cross a sequence's ends, GQA, the lagging
     * consumer (128 x 128, 3 stages), KV prefixes both ways, tiles outside
     * a sequence's keys skipped, sequences of one or two keys */
    {"causal", 600, 600, 4, 0, 128, STOF_BF16, ATTN_BLOCK, 128, 128, MHA_WS, 2, 5,
     {1, 63, 200, 513, 700}, {0}},
    {"dense", 600, 600, 4, 0, 80, STOF_F16, ATTN_BLOCK, 128, 128, MHA_WS, 2, 4, {200, 513, 1, 63},
     {0}},
    {"causal_window:128", 600, 600, 8, 2, 64, STOF_F16, ATTN_BLOCK, 128, 128, MHA_WS, 3, 4,
     {513, 1, 200, 63}, {0}},
    {"causal", 256, 600, 8, 2, 64, STOF_F16, ATTN_BLOCK, 128, 64, MHA_WS, 3, 4, {1, 63, 200, 256},
     {100, 363, 513, 600}},
    {"causal", 600, 600, 4, 0, 128, STOF_BF16, ATTN_BLOCK, 128, 64, MHA_WS, 3, 4,
     {100, 1, 63, 200}, {400, 513, 63, 599}},
    {"window:64", 256, 600, 8, 2, 96, STOF_F16, ATTN_BLOCK, 128, 128, MHA_WS, 2, 3, {200, 63, 1},
     {513, 200, 600}},
    {"dense", 600, 600, 4, 0, 64, STOF_BF16, ATTN_BLOCK, 128, 128, MHA_WS, 2, 3, {130, 7, 300},
     {300, 1, 2}},
    /* the planner's choice */
    {"causal", 600, 600, 8, 2, 64, STOF_BF16, -1, 0, 0, 0, 0, 4, {513, 1, 200, 63}, {0}},
    {"causal_window:128", 256, 600, 8, 2, 128, STOF_F16, -1, 0, 0, 0, 0, 3, {200, 1, 63},
     {600, 300, 63}},
};
#define NVARLEN (int)(sizeof VARLEN_CASES / sizeof VARLEN_CASES[0])

static int imin(int a, int b) { return a < b ? a : b; }

START_TEST(varlen_sequences)
{
    const vcase *c = &VARLEN_CASES[_i];
    if (c->wg && !has_wgmma())
        return;
    stof_ctx *ctx;
    stof_options o = {.no_cache = 1};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, c->spec, c->lq, c->lk, &m), STOF_OK);
    test_rng r = test_rng_make(1700 + _i);
    const size_t D = (size_t)c->d, H = (size_t)c->heads, KVH = c->kv ? (size_t)c->kv : H;
    /* Rows past the last sequence: never read as keys, never written. */
    int cu_q[6] = {0}, cu_k[6] = {0};
    for (int b = 0; b < c->n; b++) {
        cu_q[b + 1] = cu_q[b] + c->len_q[b];
        cu_k[b + 1] = cu_k[b] + (c->len_k[b] ? c->len_k[b] : c->len_q[b]);
    }
    const long long total_q = cu_q[c->n] + 37, total_k = cu_k[c->n] + 11;
    const size_t nq = (size_t)total_q * H * D, nk = (size_t)total_k * KVH * D;
    uint16_t *q = malloc(2 * nq), *k = malloc(2 * nk), *v = malloc(2 * nk), *out = malloc(2 * nq);
    double *ref = malloc(sizeof(double) * nq);
    unsigned char *mine = calloc((size_t)total_q, 1);  /* rows a sequence writes */
    ck_assert(q && k && v && out && ref && mine);
    test_fill_uniform(&r, c->dtype, q, nq, 0, 1);
    test_fill_uniform(&r, c->dtype, k, nk, 0, 1);
    test_fill_uniform(&r, c->dtype, v, nk, 0, 1);

    stof_mha_desc d = {.batch = c->n + 1, .heads = c->heads, .seq_q = c->lq, .seq_k = c->lk,
                       .head_dim = c->d, .dtype = c->dtype, .layout = STOF_LAYOUT_BLHD,
                       .tune = STOF_TUNE_FAST, .kv_heads = c->kv, .varlen = 1};
    stof_mha_plan *plan = NULL;
    stof_status st;
    if (c->kind < 0) {
        st = stof_mha_plan_create(ctx, &d, m, &plan);
    } else {
        mha_candidate cand = {(attn_kind)c->kind, c->bm, c->bn, 1, 0, c->wg, c->wg ? c->st : 0};
        st = mha_plan_forced(ctx, &d, m, &cand, &plan);
    }
    ck_assert_msg(st == STOF_OK, "plan %s: %s", c->spec, stof_last_error(ctx));
    CUdeviceptr dq = test_upload(ctx, q, 2 * nq), dk = test_upload(ctx, k, 2 * nk),
                dv = test_upload(ctx, v, 2 * nk), dout = test_upload(ctx, NULL, 2 * nq);
    CUdeviceptr dcq = test_upload(ctx, cu_q, sizeof(int) * (c->n + 1)),
                dck = test_upload(ctx, cu_k, sizeof(int) * (c->n + 1));
    void *Q = (void *)dq, *K = (void *)dk, *V = (void *)dv, *O = (void *)dout;
    const int *CQ = (const int *)dcq, *CK = (const int *)dck;

    /* Bad arguments: refused, the field named, nothing run. */
    static const struct {
        int batch, nulls;
        long long tq, tk;
        const char *says;
    } bad[] = {{0, 0, 1, 1, "batch 0"},      {7, 0, 1, 1, "batch 7"},
               {1, 1, 1, 1, "cu_seqlens_q"}, {1, 2, 1, 1, "cu_seqlens_k"},
               {1, 0, -1, 1, "total_q -1"},  {1, 0, 1, -5, "total_k -5"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        st = stof_mha_run_varlen(plan, Q, K, V, O, bad[i].nulls == 1 ? NULL : CQ,
                                 bad[i].nulls == 2 ? NULL : CK, bad[i].batch, bad[i].tq,
                                 bad[i].tk, NULL);
        ck_assert_int_eq(st, STOF_ERR_INVALID_ARG);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].says), "%s", stof_last_error(ctx));
    }
    ck_assert_int_eq(stof_mha_run(plan, Q, K, V, O, NULL, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "stof_mha_run_varlen"));

    st = stof_mha_run_varlen(plan, Q, K, V, O, CQ, CK, c->n, total_q, total_k, NULL);
    ck_assert_msg(st == STOF_OK, "run: %s", stof_last_error(ctx));
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemcpyDtoH(out, dout, 2 * nq)), STOF_OK);
    jit_pop(ctx);

    /* Each sequence against the reference of its own mask, on its first
     * lq rows and lk keys (a longer one is truncated). */
    double tol = c->dtype == STOF_BF16 ? 1.5e-2 : 5e-3, num = 0, den = 0;
    for (int b = 0; b < c->n; b++) {
        const int sq = imin(cu_q[b + 1] - cu_q[b], c->lq), sk = imin(cu_k[b + 1] - cu_k[b], c->lk);
        stof_mask *mb;
        ck_assert_int_eq(stof_mask_parse(ctx, c->spec, sq, sk, &mb), STOF_OK);
        const size_t oq = (size_t)cu_q[b] * H * D, ok = (size_t)cu_k[b] * KVH * D;
        ref_attn_args a = {1, c->heads, sq, sk, c->d, c->dtype, STOF_LAYOUT_BLHD, 0, q + oq,
                           k + ok, v + ok, mb, NULL, NULL, c->kv, 0, 0, NULL, 0, NULL};
        ck_assert_int_eq(ref_attention(ctx, &a, ref + oq), STOF_OK);
        memset(mine + cu_q[b], 1, (size_t)sq);
        for (size_t i = oq; i < oq + (size_t)sq * H * D; i++) {
            double g = dtype_load(c->dtype, out, i);
            ck_assert_msg(!isnan(g), "%s: sequence %d, element %zu not written", c->spec, b,
                          i - oq);
            num += (g - ref[i]) * (g - ref[i]);
            den += ref[i] * ref[i];
        }
        stof_mask_free(mb);
    }
    /* Rows no sequence owns (a truncated sequence's tail, the rows past the
     * last) keep their poison, bit for bit. */
    for (long long row = 0; row < total_q; row++)
        for (size_t i = 0; !mine[row] && i < H * D; i++)
            ck_assert_msg(out[(size_t)row * H * D + i] == 0xffff,
                          "%s: row %lld, which no sequence owns, was written", c->spec, row);
    double err = den > 0 ? sqrt(num / den) : sqrt(num);
    char desc[512];
    stof_mha_plan_describe(plan, desc, sizeof desc);
    ck_assert_ptr_nonnull(strstr(desc, "varlen"));
    printf("mha varlen %-20s %d seqs h%d kv%d plan %dx%d d%d %s: rel L2 %.2e  [%s]\n", c->spec,
           c->n, c->heads, (int)KVH, c->lq, c->lk, c->d, dtype_name(c->dtype), err, desc);
    ck_assert_msg(err <= tol, "%s: relative L2 error %.3g above %.3g (%s)", c->spec, err, tol,
                  desc);

    /* Run again on an output poisoned again: the same bits (a run leaves
     * nothing behind that the next one reads). */
    uint16_t *again = malloc(2 * nq);
    ck_assert_ptr_nonnull(again);
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemsetD8(dout, 0xff, 2 * nq)), STOF_OK);
    jit_pop(ctx);
    ck_assert_int_eq(stof_mha_run_varlen(plan, Q, K, V, O, CQ, CK, c->n, total_q, total_k, NULL),
                     STOF_OK);
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemcpyDtoH(again, dout, 2 * nq)), STOF_OK);
    jit_pop(ctx);
    ck_assert_msg(memcmp(again, out, 2 * nq) == 0, "%s: a second run differs", c->spec);
    free(again);

    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    CUdeviceptr all[6] = {dq, dk, dv, dout, dcq, dck};
    for (int i = 0; i < 6; i++)
        ctx->dev.api.MemFree(all[i]);
    jit_pop(ctx);
    free(q);
    free(k);
    free(v);
    free(out);
    free(ref);
    free(mine);
    stof_mha_plan_free(plan);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* Equal lengths, every sequence the plan's longest: the varlen run gives
 * what the padded batch in BLHD gives on the same candidate, bit for bit
 * (the same products in the same order), on each engine; and a plan made
 * without desc.varlen is refused by stof_mha_run_varlen. */
START_TEST(varlen_equal_lengths_match_the_batch)
{
    static const mha_candidate cands[] = {{ATTN_BLOCK, 64, 64, 1, 0, 0, 0},
                                          {ATTN_GATHER, 64, 64, 1, 0, 0, 0},
                                          {ATTN_BLOCK, 128, 64, 1, 0, 1, 4},
                                          {ATTN_GATHER, 128, 64, 1, 0, 1, 4},
                                          {ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 3},
                                          {ATTN_BLOCK, 128, 64, 1, 0, MHA_WS, 3}};
    const mha_candidate *cand = &cands[_i];
    if (cand->wg && !has_wgmma())
        return;
    stof_ctx *ctx;
    stof_options o = {.no_cache = 1};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    const char *spec = cand->kind == ATTN_GATHER ? "dilated:64:2" : "causal";
    const int B = 3, H = 8, KVH = 2, L = 333, D = 64;
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, spec, L, L, &m), STOF_OK);
    test_rng r = test_rng_make(1800 + _i);
    const size_t nq = (size_t)B * L * H * D, nk = (size_t)B * L * KVH * D;
    uint16_t *q = malloc(2 * nq), *k = malloc(2 * nk), *v = malloc(2 * nk);
    uint16_t *o1 = malloc(2 * nq), *o2 = malloc(2 * nq);
    ck_assert(q && k && v && o1 && o2);
    test_fill_uniform(&r, STOF_F16, q, nq, 0, 1);
    test_fill_uniform(&r, STOF_F16, k, nk, 0, 1);
    test_fill_uniform(&r, STOF_F16, v, nk, 0, 1);
    stof_mha_desc d = {.batch = B, .heads = H, .seq_q = L, .seq_k = L, .head_dim = D,
                       .dtype = STOF_F16, .layout = STOF_LAYOUT_BLHD, .kv_heads = KVH};
    stof_mha_plan *padded = NULL, *packed = NULL;
    ck_assert_msg(mha_plan_forced(ctx, &d, m, cand, &padded) == STOF_OK, "%s",
                  stof_last_error(ctx));
    d.varlen = 1;
    ck_assert_msg(mha_plan_forced(ctx, &d, m, cand, &packed) == STOF_OK, "%s",
                  stof_last_error(ctx));
    int cu[4] = {0, L, 2 * L, 3 * L};
    CUdeviceptr dq = test_upload(ctx, q, 2 * nq), dk = test_upload(ctx, k, 2 * nk),
                dv = test_upload(ctx, v, 2 * nk), d1 = test_upload(ctx, NULL, 2 * nq),
                d2 = test_upload(ctx, NULL, 2 * nq), dcu = test_upload(ctx, cu, sizeof cu);
    ck_assert_int_eq(stof_mha_run_varlen(padded, (void *)dq, (void *)dk, (void *)dv, (void *)d2,
                                         (const int *)dcu, (const int *)dcu, B, 3LL * L, 3LL * L,
                                         NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "without desc.varlen"));
    ck_assert_int_eq(stof_mha_run(padded, (void *)dq, (void *)dk, (void *)dv, (void *)d1, NULL,
                                  NULL), STOF_OK);
    ck_assert_int_eq(stof_mha_run_varlen(packed, (void *)dq, (void *)dk, (void *)dv, (void *)d2,
                                         (const int *)dcu, (const int *)dcu, B, 3LL * L, 3LL * L,
                                         NULL),
                     STOF_OK);
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, CtxSynchronize()), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemcpyDtoH(o1, d1, 2 * nq)), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemcpyDtoH(o2, d2, 2 * nq)), STOF_OK);
    CUdeviceptr all[6] = {dq, dk, dv, d1, d2, dcu};
    for (int i = 0; i < 6; i++)
        ctx->dev.api.MemFree(all[i]);
    jit_pop(ctx);
    for (size_t i = 0; i < nq; i++)
        ck_assert_msg(o1[i] == o2[i] && o1[i] != 0xffff,
                      "%s %s: element %zu: padded 0x%04x, varlen 0x%04x", spec,
                      mha_kernel_engine_name(cand), i, o1[i], o2[i]);
    free(q);
    free(k);
    free(v);
    free(o1);
    free(o2);
    stof_mha_plan_free(padded);
    stof_mha_plan_free(packed);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* The softcap on the warp-specialized engine's 192-row items is refused
 * (their registers spill with it), with the field named, not run. */
START_TEST(softcap_refused_on_192_rows)
{
    if (!has_wgmma())
        return;
    stof_ctx *ctx;
    stof_options o = {.no_cache = 1};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 1000, 1000, &m), STOF_OK);
    stof_mha_desc d = {.batch = 1, .heads = 4, .seq_q = 1000, .seq_k = 1000, .head_dim = 64,
                       .dtype = STOF_F16, .softcap = 30};
    mha_candidate cand = {ATTN_BLOCK, 192, 128, 1, 0, MHA_WS, 2};
    stof_mha_plan *plan = (stof_mha_plan *)1;
    ck_assert_int_eq(mha_plan_forced(ctx, &d, m, &cand, &plan), STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_null(plan);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "desc.softcap"));
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* Issue 54's score modifiers, ALiBi and the distance bias, each engine
 * forced as above and then the planner's choice: ALiBi with the standard
 * slopes (8 heads: 2^-1 .. 2^-8; 12 heads: 8 and 4 interleaved) and with
 * slopes given, the bias with an odd count of buckets (the clamp at both
 * ends: lengths past B/2) and with a large one, each with GQA and a KV
 * prefix (positions q + lk - lq) and the softcap before them; odd lengths,
 * both layouts and dtypes, outputs poisoned. */
static const struct {
    mcase c;
    mmods mods;
    smods sm;
} MOD_CASES[] = {
    /* mma.sync: block and gathered rows */
    {{"causal", 2, 8, 377, 377, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, {2, 0, 0}, {1, 0, 0}},
    {{"window:64+global:16", 2, 12, 377, 377, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 1, ATTN_GATHER, 128, 64, 2, 1, 0, 0}, {4, 0, 0}, {1, 0, 31}},
    {{"dense", 1, 4, 301, 301, 80, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 128, 64, 2, 1, 0, 0}, {0, 0, 0}, {0, 0, 33}},
    /* wgmma: block and gathered */
    {{"causal", 2, 8, 257, 1000, 128, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, 1, 3}, {2, 0, 0}, {1, 1, 0}},
    {{"dilated:64:2", 2, 4, 377, 377, 64, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, ATTN_GATHER, 128, 64, 1, 0, 1, 3}, {0, 0, 0}, {1, 0, 64}},
    /* warp-specialized 128-row items at head_dim 64 (the others refuse them):
     * by TMA, by copies, through a view */
    {{"causal_window:256", 2, 8, 1000, 1000, 64, STOF_F16, STOF_LAYOUT_BLHD, 0, 1, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {2, 0, 0}, {1, 0, 0}},
    {{"dense", 1, 4, 1000, 1000, 64, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 3}, {0, 0, 0}, {0, 0, 257}},
    {{"window:256+strided:8", 2, 4, 1000, 1000, 64, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 3}, {0, 0, 0}, {1, 1, 257}},
    {{"dilated:256:2", 2, 4, 1024, 1024, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 2}, {1, 0, 0}, {1, 0, 101}},
    /* with the softcap before them, under a KV prefix */
    {{"causal_window:256", 2, 8, 257, 1000, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, {2, 30, 8}, {1, 0, 32}},
    {{"causal_window:256", 2, 8, 257, 1000, 128, STOF_BF16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, 1, 3}, {2, 30, 8}, {1, 1, 32}},
    {{"causal", 2, 8, 257, 1000, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {2, 30, 8}, {1, 0, 4096}},
    /* warp-specialized 128-row block tiles past head_dim 64: ALiBi alone */
    {{"causal", 1, 8, 1000, 1000, 128, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {2, 0, 0}, {1, 0, 0}},
    {{"causal_window:256", 2, 8, 257, 1000, 128, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, ATTN_BLOCK, 128, 128, 1, 0, MHA_WS, 2}, {2, 30, 8}, {1, 1, 0}},
    /* the planner's choice */
    {{"causal", 1, 8, 1000, 1000, 128, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, -1, 0, 0, 0, 0, 0, 0}, {2, 0, 0}, {1, 0, 0}},
    {{"window:128", 2, 4, 377, 377, 64, STOF_F16, STOF_LAYOUT_BLHD, 0, 0, -1, 0, 0, 0, 0, 0, 0}, {0, 0, 0}, {0, 0, 32}},
};
#define NMOD (int)(sizeof MOD_CASES / sizeof MOD_CASES[0])

START_TEST(alibi_and_bias)
{
    if (MOD_CASES[_i].c.wg && !has_wgmma())
        return;
    case_mods = MOD_CASES[_i].mods;
    case_smods = MOD_CASES[_i].sm;
    run_case(&MOD_CASES[_i].c, 1700 + _i);
    case_mods = (mmods){0};
    case_smods = (smods){0};
}
END_TEST

/* ALiBi and the bias on the warp-specialized engine's 192-row items, and
 * past head_dim 64 the bias, and ALiBi on gathered rows, are refused
 * (spills); a run without the bias's table is refused with the field named,
 * and nothing runs. */
START_TEST(mods_refused)
{
    if (!has_wgmma())
        return;
    stof_ctx *ctx;
    stof_options o = {.no_cache = 1};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 1000, 1000, &m), STOF_OK);
    for (int i = 0; i < 4; i++) {
        stof_mha_desc d = {.batch = 1, .heads = 4, .seq_q = 1000, .seq_k = 1000,
                           .head_dim = i >= 2 ? 128 : 64, .dtype = STOF_F16, .alibi = i != 1,
                           .bias_buckets = 8 * (i == 1 || i == 2)};
        mha_candidate cand = {i == 3 ? ATTN_GATHER : ATTN_BLOCK, i >= 2 ? 128 : 192, 128, 1, 0,
                              MHA_WS, 2};
        stof_mha_plan *plan = (stof_mha_plan *)1;
        ck_assert_int_eq(mha_plan_forced(ctx, &d, m, &cand, &plan), STOF_ERR_UNSUPPORTED);
        ck_assert_ptr_null(plan);
        ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "desc.alibi or desc.bias_buckets"));
    }
    /* A plan for the bias's shape needs no table; its run does. */
    stof_mha_desc d = {.batch = 1, .heads = 4, .seq_q = 1000, .seq_k = 1000, .head_dim = 64,
                       .dtype = STOF_F16, .bias_buckets = 8};
    mha_candidate cand = {ATTN_BLOCK, 64, 64, 1, 0, 0, 0};
    stof_mha_plan *plan;
    ck_assert_msg(mha_plan_forced(ctx, &d, m, &cand, &plan) == STOF_OK, "%s", stof_last_error(ctx));
    size_t n = 4 * 1000 * 64;
    CUdeviceptr x = test_upload(ctx, NULL, 2 * n);
    ck_assert_int_eq(stof_mha_run(plan, (void *)x, (void *)x, (void *)x, (void *)x, NULL, NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "desc.bias_table"));
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ctx->dev.api.MemFree(x);
    jit_pop(ctx);
    stof_mha_plan_free(plan);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* The planner's own choice (model + search) is right too. */
START_TEST(planner_choice)
{
    static const char *const specs[] = {"window:128+global:32", "dilated:128:2", "causal"};
    mcase c = {specs[_i], 2, 4, 640, 640, 64, _i == 2 ? STOF_BF16 : STOF_F16, STOF_LAYOUT_BHLD, 0, 0,
               -1, 0, 0, 0, 0, 0, 0};
    run_case(&c, 1200 + _i);
}
END_TEST

/* A plan made again in a fresh context on the same cache: its kernel, its
 * tuning, the mask's hash and its tiles all come from the cache, and the
 * mask is never walked; the result is checked as every other. Forced plans
 * read the tiles the cache holds as well. */
START_TEST(cached_plan_walks_nothing)
{
    static const char *const specs[] = {"window:128+global:32", "dilated:64:2",
                                        "window:64+strided:8", "causal"};
    char *dir = test_tmpdir(), path[1200];
    ck_assert_ptr_nonnull(dir);
    snprintf(path, sizeof path, "%s/c.db", dir);
    case_cache = path;
    mcase c = {specs[_i], 2, 3, 1000, 1000, 64, STOF_F16, STOF_LAYOUT_BHLD, 0, _i == 3, -1, 0, 0,
               0, 0, 0, 0};
    run_case(&c, 1300 + _i);
    ck_assert_int_ge(case_walks, 1);
    run_case(&c, 1310 + _i);
    ck_assert_msg(case_walks == 0, "%s: a cached plan summarized its mask %lld times", specs[_i],
                  case_walks);
    mcase f = {specs[_i], 1, 2, 1000, 1000, 64, STOF_BF16, STOF_LAYOUT_BHLD, 0, 0, 1, 64, 64, 1,
               0, 0, 0};
    run_case(&f, 1320 + _i); /* the cut tiles kept */
    run_case(&f, 1330 + _i); /* and read back */
    ck_assert_int_eq(case_walks, 0);
    case_cache = NULL;
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* The model's device figures: measured on this GPU the first time, stored in
 * the cache, and read back by a second context with no compile and no
 * timing. The rates are what a kernel library's users would recognise. */
START_TEST(device_figures_once)
{
    char *dir = test_tmpdir(), path[1200];
    ck_assert_ptr_nonnull(dir);
    snprintf(path, sizeof path, "%s/c.db", dir);
    stof_options o = {.cache_path = path};
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    model_device md;
    ck_assert_msg(mha_device_figures(ctx, &md) == STOF_OK, "%s", stof_last_error(ctx));
    printf("device figures: %d SMs at %d MHz, dense attention %.0f TFLOP/s on mma.sync, "
           "%.0f on wgmma, %.0f warp-specialized, memory %.0f GB/s\n", md.sm_count, md.clock_mhz,
           md.mma_tflops, md.wgmma_tflops, md.ws_tflops, md.mem_gbs);
    ck_assert_int_eq(md.measured, 1);
    ck_assert_int_eq(md.sm_count, ctx->dev.sm_count);
    ck_assert(md.mma_tflops > 20 && md.mma_tflops < 3000);
    ck_assert(md.mem_gbs > 200 && md.mem_gbs < 30000);
    if (strcmp(ctx->arch, "sm_90a") == 0)
        ck_assert(md.wgmma_tflops > md.mma_tflops && md.wgmma_tflops < 3000 &&
                  md.ws_tflops > md.wgmma_tflops && md.ws_tflops < 3000);
    else
        ck_assert(md.wgmma_tflops == 0 && md.ws_tflops == 0);
    stof_close(ctx);

    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    model_device again;
    ck_assert_int_eq(mha_device_figures(ctx, &again), STOF_OK);
    stof_stats st;
    stof_get_stats(ctx, &st);
    ck_assert_int_eq(st.nvrtc_compiles, 0);
    ck_assert_int_eq(st.timing_runs, 0);
    ck_assert_int_eq(again.measured, 1);
    ck_assert_double_eq_tol(again.mma_tflops, md.mma_tflops, 0.06);
    ck_assert_double_eq_tol(again.ws_tflops, md.ws_tflops, 0.06);
    ck_assert_double_eq_tol(again.mem_gbs, md.mem_gbs, 0.6);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

Suite *suite_gpu_mha(void)
{
    Suite *s = suite_create("gpu_mha");
    TCase *t = tcase_create("kernels");
    tcase_set_timeout(t, 600);
    tcase_add_loop_test(t, every_mask_both_kinds, 0, NSPECS);
    tcase_add_loop_test(t, head_dims_dtypes_tiles, 0, 5);
    tcase_add_loop_test(t, wgmma_tiles, 0, 3);
    tcase_add_loop_test(t, layouts_lens_packed, 0, 16);
    tcase_add_loop_test(t, ws_long_rows, 0, 8);
    tcase_add_loop_test(t, ws_items_in_turn, 0, 8);
    tcase_add_loop_test(t, ws_wide_heads, 0, 10);
    tcase_add_loop_test(t, ws_gathers_rows, 0, 13);
    tcase_add_test(t, ws_runs_follow_pointers);
    tcase_add_loop_test(t, planner_choice, 0, 3);
    tcase_add_test(t, device_figures_once);
    tcase_add_loop_test(t, cached_plan_walks_nothing, 0, 4);
    suite_add_tcase(s, t);
    /* The decoder models' cases, a case of their own (CK_RUN_CASE=llm). */
    TCase *l = tcase_create("llm");
    tcase_set_timeout(l, 600);
    tcase_add_loop_test(l, gqa_prefix_softcap, 0, NLLM);
    tcase_add_test(l, softcap_refused_on_192_rows);
    tcase_add_loop_test(l, alibi_and_bias, 0, NMOD);
    tcase_add_test(l, mods_refused);
    tcase_add_loop_test(l, varlen_sequences, 0, NVARLEN);
    tcase_add_loop_test(l, varlen_equal_lengths_match_the_batch, 0, 6);
    suite_add_tcase(s, l);
    return s;
}
