/* CPU suite for the generated GEMM: the candidates fit the limits they were
 * given and the epilogue's needs, bad shapes and configs are refused with a
 * message naming the problem, the template renders completely, and every
 * candidate with every epilogue of the encoder layer compiles for sm_80 and
 * sm_90a without spilling registers. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "ctx.h"
#include "layer/gemm.h"
#include "testutil.h"

static stof_ctx *open_ctx(const char *arch)
{
    stof_ctx *ctx;
    stof_options o = {.no_cache = 1, .arch = arch};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    return ctx;
}

/* The encoder layer's epilogues: QKV and FFN1 (bias, activations), the
 * projections before a LayerNorm (residual, then the fused norm). */
static const gemm_epilogue EPILOGUES[] = {
    {0, GEMM_ACT_NONE, 0, 0, 0},      {1, GEMM_ACT_NONE, 0, 0, 0},
    {1, GEMM_ACT_GELU, 0, 0, 0},      {1, GEMM_ACT_GELU_TANH, 0, 0, 0},
    {1, GEMM_ACT_RELU, 0, 0, 0},      {1, GEMM_ACT_NONE, 1, 0, 0},
    {1, GEMM_ACT_NONE, 1, 1, 0},      {1, GEMM_ACT_NONE, 1, 1, 1},
};
#define NEPI (int)(sizeof EPILOGUES / sizeof EPILOGUES[0])

/* BERT-base and -large sizes: (n, k). The last is for LayerNorm only. */
static const int SHAPES[][2] = {{768, 768}, {2304, 768}, {3072, 768}, {768, 3072}, {1024, 4096}};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

/* Whether the compile test covers shape i with epilogue e. */
static int covered(int i, const gemm_epilogue *e)
{
    if (e->ln)
        return SHAPES[i][0] <= 1024;
    return i < NSHAPES - 1;
}

START_TEST(candidates_fit_the_limits)
{
    static const int limits[] = {48 * 1024, 99 * 1024, 227 * 1024};
    stof_ctx *ctx = open_ctx("sm_90a");
    for (int wgmma = 0; wgmma < 2; wgmma++)
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < NSHAPES; i++)
            for (int ei = 0; ei < NEPI; ei++) {
                const gemm_epilogue *e = &EPILOGUES[ei];
                gemm_shape s = {4096, SHAPES[i][0], SHAPES[i][1], STOF_F16};
                gemm_config c[GEMM_MAX_CANDIDATES];
                int n = gemm_candidates(&s, e, limits[l], wgmma, c, GEMM_MAX_CANDIDATES);
                if (e->ln && (limits[l] < 227 * 1024 || s.n > 1024)) {
                    /* Two stages of all N rows of W (and 16 of X) at
                     * BLOCK_K 32 need 125 KB for N = 768, 371 KB for 2304:
                     * only TMA clusters of at most 8 CTAs, without ln_sum. */
                    for (int j = 0; j < n; j++)
                        ck_assert(wgmma && !e->ln_sum && c[j].wg == GEMM_TMA && s.n / c[j].bn <= 8);
                    ck_assert(n > 0 || !wgmma || e->ln_sum || s.n > 2048 || limits[l] < 64 * 1024);
                    continue;
                }
                ck_assert_msg(n >= (e->ln ? 2 : l == 0 ? 2 : 6), "n %d k %d ln %d limit %d: %d",
                              s.n, s.k, e->ln, limits[l], n);
                ck_assert_int_le(n, e->ln ? 7 : wgmma ? GEMM_MAX_CANDIDATES : 12);
                int divides = 1, nwg = 0;
                for (int j = 0; j < n; j++) {
                    char name[48];
                    gemm_config_str(&c[j], name, sizeof name);
                    ck_assert_msg(gemm_check(ctx, &s, e, &c[j]) == STOF_OK, "%s: %s", name,
                                  stof_last_error(ctx));
                    ck_assert_int_le(gemm_smem_bytes(&c[j], &s, e), limits[l]);
                    ck_assert_int_le(gemm_threads(&c[j]), 512);
                    if (c[j].wg) {
                        /* Only where asked for, never with ln, all before
                         * mma.sync; TMA ones first. */
                        ck_assert(wgmma && (!e->ln || (c[j].wg == GEMM_TMA && !e->ln_sum)) && nwg == j);
                        ck_assert(j == 0 || c[j].wg <= c[j - 1].wg);
                        nwg++;
                        ck_assert_int_eq(c[j].bk, 64);
                        if (c[j].wg == GEMM_TMA && e->ln) {
                            /* 64-row blocks in turns, or shared with 384
                             * columns, a cluster per row. */
                            ck_assert_int_eq(c[j].bm, 64);
                            ck_assert(c[j].wn == 1 ? c[j].wm == 2 && (c[j].bn == 128 || c[j].bn == 256)
                                                   : c[j].wn == 2 && c[j].wm == 1 && c[j].bn == 384);
                            ck_assert_int_eq(s.n % c[j].bn, 0);
                            ck_assert_int_le(s.n / c[j].bn, 8);
                        } else if (c[j].wg == GEMM_TMA) {
                            const int rows = c[j].bm / c[j].wm;
                            ck_assert_int_eq(c[j].wn, 1);
                            ck_assert(c[j].bn == 64 || c[j].bn == 128 || c[j].bn == 192 || c[j].bn == 256);
                            ck_assert(c[j].wm == 1 || c[j].wm == 2);
                            ck_assert(rows == 64 || rows == 128);
                            ck_assert_int_le(rows * c[j].bn / 128, 128);
                            ck_assert(c[j].stages >= 2 && c[j].stages <= 8);
                            ck_assert_int_eq(gemm_threads(&c[j]), 384);
                        } else {
                            ck_assert_int_eq(c[j].wn, 1);
                            ck_assert(c[j].bn == 64 || c[j].bn == 128 || c[j].bn == 256);
                            ck_assert_int_eq(c[j].bm, 64 * c[j].wm);
                            ck_assert(c[j].stages >= 2 && c[j].stages <= 5);
                        }
                    } else {
                        ck_assert_int_eq(c[j].bm % (16 * c[j].wm), 0);
                        ck_assert_int_eq(c[j].bn % (16 * c[j].wn), 0);
                        ck_assert(c[j].bk == 32 || c[j].bk == 64);
                        ck_assert(c[j].stages >= 2 && c[j].stages <= 4);
                    }
                    if (e->ln && !c[j].wg) {
                        ck_assert_int_ge(c[j].bn, s.n);
                        ck_assert_int_lt(c[j].bn, s.n + 16 * c[j].wn);
                    } else {
                        /* Within an engine, tiles that divide N come before any that do not. */
                        if (j > 0 && c[j].wg != c[j - 1].wg)
                            divides = 1;
                        ck_assert_msg(divides || s.n % c[j].bn, "n %d k %d ln %d limit %d: config %d",
                                      s.n, s.k, e->ln, limits[l], j);
                        divides = s.n % c[j].bn == 0;
                    }
                }
                /* Every BERT product has wg tiles: all of them with an H100's
                 * shared memory, the two small ones within 99 KiB; the
                 * LayerNorm ones on TMA where N is 768 and no sum is kept. */
                if (wgmma && e->ln && !e->ln_sum && s.n == 768)
                    ck_assert_int_ge(nwg, limits[l] == 227 * 1024 ? 2 : 1);
                if (wgmma && !e->ln && limits[l] >= 99 * 1024)
                    ck_assert_int_ge(nwg, limits[l] == 227 * 1024 ? 6 : 2);
                /* A smaller cap takes the best ones, in order. */
                gemm_config first[2];
                ck_assert_int_eq(gemm_candidates(&s, e, limits[l], wgmma, first, 2), 2);
                ck_assert_mem_eq(first, c, sizeof first);
            }
    /* The default for a large BERT product is a large tile. */
    gemm_shape big = {16384, 3072, 768, STOF_BF16};
    gemm_config c[GEMM_MAX_CANDIDATES];
    ck_assert_int_ge(gemm_candidates(&big, &EPILOGUES[2], 227 * 1024, 0, c, GEMM_MAX_CANDIDATES), 6);
    ck_assert_int_ge(c[0].bm * c[0].bn, 128 * 128);
    /* A small one prefers tiles that fill more SMs. */
    gemm_shape small = {256, 768, 768, STOF_F16};
    ck_assert_int_ge(gemm_candidates(&small, &EPILOGUES[0], 227 * 1024, 0, c, GEMM_MAX_CANDIDATES), 6);
    ck_assert_int_le(c[0].bm * c[0].bn, 64 * 128);
    /* The same with warpgroup MMA, which comes first. */
    ck_assert_int_ge(gemm_candidates(&big, &EPILOGUES[2], 227 * 1024, 1, c, GEMM_MAX_CANDIDATES), 10);
    ck_assert(c[0].wg);
    ck_assert_int_ge(c[0].bm * c[0].bn, 128 * 128);
    ck_assert_int_ge(gemm_candidates(&small, &EPILOGUES[0], 227 * 1024, 1, c, GEMM_MAX_CANDIDATES), 10);
    ck_assert(c[0].wg);
    ck_assert_int_le(c[0].bm * c[0].bn, 64 * 128);
    /* Without ln, a TMA tile's output staging (the whole tile in fp16,
     * twice where the consumers take turns) comes out of its stages: each
     * TMA candidate has the deepest pipeline that fits beside it, 256 x 128
     * shared tiles 3 stages of 48 KiB. */
    const gemm_config coop = {256, 128, 64, 2, 1, 3, GEMM_TMA}, pp = {128, 128, 64, 1, 1, 5, GEMM_TMA};
    ck_assert_int_ge(gemm_smem_bytes(&coop, &big, &EPILOGUES[2]), 3 * 384 * 128 + 256 * 128 * 2);
    ck_assert_int_ge(gemm_smem_bytes(&pp, &big, &EPILOGUES[2]), 5 * 256 * 128 + 2 * 128 * 128 * 2);
    int n = gemm_candidates(&big, &EPILOGUES[2], 227 * 1024, 1, c, GEMM_MAX_CANDIDATES);
    int coops = 0;
    for (int j = 0; j < n && c[j].wg == GEMM_TMA; j++) {
        gemm_config deeper = c[j];
        deeper.stages++;
        ck_assert(deeper.stages > 8 || gemm_smem_bytes(&deeper, &big, &EPILOGUES[2]) > 227 * 1024);
        if (c[j].bm == 256 && c[j].bn == 128)
            coops += c[j].stages == 3;
    }
    ck_assert_int_eq(coops, 1);
    /* LayerNorm's TMA clusters: the fewest CTAs first; shared 384-column
     * blocks first where 64-row blocks take one round of the SMs. */
    for (int m = 4096; m <= 16384; m *= 4) {
        gemm_shape out_ln = {m, 768, 768, STOF_F16};
        ck_assert_int_ge(gemm_candidates(&out_ln, &EPILOGUES[6], 227 * 1024, 1, c, GEMM_MAX_CANDIDATES), 3);
        const int first = m == 4096 ? 0 : 1;
        ck_assert(c[first].wg == GEMM_TMA && c[first].bn == 384 && c[first].wn == 2);
        ck_assert(c[1 - first].wg == GEMM_TMA && c[1 - first].bn == 256);
        ck_assert(c[2].wg == GEMM_TMA && c[2].bn == 128);
    }
    /* No cp.async wg tile where K leaves a partial 64-column step; TMA
     * tiles zero-fill it. */
    gemm_shape odd = {4096, 768, 800, STOF_F16};
    n = gemm_candidates(&odd, &EPILOGUES[0], 227 * 1024, 1, c, GEMM_MAX_CANDIDATES);
    ck_assert_int_ge(n, 6);
    ck_assert_int_eq(c[0].wg, GEMM_TMA);
    for (int j = 0; j < n; j++)
        ck_assert(c[j].wg != 1);
    char buf[48];
    gemm_config_str(&(gemm_config){128, 128, 32, 2, 4, 3, 0}, buf, sizeof buf);
    ck_assert_str_eq(buf, "128x128x32 w2x4 s3");
    gemm_config_str(&(gemm_config){128, 256, 64, 2, 1, 3, 1}, buf, sizeof buf);
    ck_assert_str_eq(buf, "wg 128x256x64 s3");
    gemm_config_str(&(gemm_config){128, 128, 64, 1, 1, 6, GEMM_TMA}, buf, sizeof buf);
    ck_assert_str_eq(buf, "tma pp 128x128x64 s6");
    gemm_config_str(&(gemm_config){256, 128, 64, 2, 1, 4, GEMM_TMA}, buf, sizeof buf);
    ck_assert_str_eq(buf, "tma coop 256x128x64 s4");
    stof_close(ctx);
}
END_TEST

START_TEST(bad_shapes_are_named)
{
    stof_ctx *ctx = open_ctx("sm_90a");
    const gemm_config ok = {128, 128, 32, 2, 4, 3, 0}, wg = {128, 128, 64, 2, 1, 4, 1};
    const gemm_epilogue plain = {1, GEMM_ACT_GELU, 0, 0, 0}, ln = {1, GEMM_ACT_NONE, 1, 1, 1};
    struct {
        gemm_shape s;
        gemm_epilogue e;
        gemm_config c;
        stof_status want;
        const char *says;
    } bad[] = {
        {{4096, 768, 100, STOF_F16}, plain, ok, STOF_ERR_UNSUPPORTED, "k (100)"},
        {{4096, 772, 768, STOF_F16}, plain, ok, STOF_ERR_UNSUPPORTED, "n (772)"},
        {{0, 768, 768, STOF_F16}, plain, ok, STOF_ERR_INVALID_ARG, "positive"},
        {{4096, -8, 768, STOF_F16}, plain, ok, STOF_ERR_INVALID_ARG, "positive"},
        {{4096, 768, 768, STOF_F32}, plain, ok, STOF_ERR_UNSUPPORTED, "dtype fp32"},
        {{4096, 768, 768, STOF_F16}, {1, 9, 0, 0, 0}, ok, STOF_ERR_INVALID_ARG, "activation 9"},
        {{4096, 768, 768, STOF_F16}, {1, GEMM_ACT_NONE, 1, 0, 1}, ok, STOF_ERR_INVALID_ARG,
         "ln_sum needs ln"},
        {{4096, 768, 768, STOF_F16}, ln, ok, STOF_ERR_INVALID_ARG, "bn >= n (768)"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 128, 48, 2, 4, 3, 0}, STOF_ERR_INVALID_ARG, "bk"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 128, 32, 2, 4, 5, 0}, STOF_ERR_INVALID_ARG, "stages"},
        {{4096, 768, 768, STOF_F16}, plain, {96, 128, 32, 4, 4, 3, 0}, STOF_ERR_INVALID_ARG,
         "16 * wm"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 128, 32, 8, 4, 3, 0}, STOF_ERR_INVALID_ARG, "warps"},
        /* Warpgroup MMA: no LayerNorm, whole 64-column K steps, its own tiling. */
        {{4096, 768, 768, STOF_F16}, ln, {128, 768, 64, 2, 1, 3, 1}, STOF_ERR_INVALID_ARG,
         "no LayerNorm"},
        {{4096, 768, 800, STOF_F16}, plain, wg, STOF_ERR_UNSUPPORTED, "multiple of 64"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 128, 64, 1, 1, 4, 1}, STOF_ERR_INVALID_ARG,
         "bm = 64 * wm"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 128, 64, 2, 2, 4, 1}, STOF_ERR_INVALID_ARG,
         "wn = 1"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 192, 64, 2, 1, 4, 1}, STOF_ERR_INVALID_ARG,
         "bn must be 64, 128 or 256"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 128, 32, 2, 1, 4, 1}, STOF_ERR_INVALID_ARG,
         "bk must be 64"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 128, 64, 2, 1, 6, 1}, STOF_ERR_INVALID_ARG,
         "stages must be 2 to 5"},
        /* TMA: no LayerNorm, one or two consumers per tile, 64 or 128 rows each. */
        {{4096, 768, 768, STOF_F16}, ln, {128, 128, 64, 1, 1, 6, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "needs bm 64 and wm 2 or wn 2"},
        {{4096, 768, 768, STOF_F16}, {1, GEMM_ACT_NONE, 1, 1, 0}, {64, 256, 64, 1, 2, 3, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "384 with wn 2"},
        {{4096, 768, 768, STOF_F16}, {1, GEMM_ACT_NONE, 1, 1, 0}, {64, 384, 64, 2, 2, 3, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "wn = 1"},
        {{4096, 768, 768, STOF_F16}, plain, {64, 384, 64, 1, 2, 3, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "the epilogue has no ln"},
        {{4096, 768, 768, STOF_F16}, plain, {64, 256, 64, 2, 1, 5, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "the epilogue has no ln"},
        {{4096, 768, 768, STOF_F16}, {1, GEMM_ACT_NONE, 1, 1, 0}, {64, 192, 64, 2, 1, 5, GEMM_TMA},
         STOF_ERR_INVALID_ARG, "at most 8 CTAs"},
        {{4096, 2048, 768, STOF_F16}, {1, GEMM_ACT_NONE, 1, 1, 0}, {64, 128, 64, 2, 1, 5, GEMM_TMA},
         STOF_ERR_INVALID_ARG, "at most 8 CTAs"},
        {{4096, 768, 768, STOF_F16}, ln, {64, 256, 64, 2, 1, 5, GEMM_TMA}, STOF_ERR_UNSUPPORTED,
         "no ln_sum"},
        {{4096, 768, 768, STOF_F16}, plain, {192, 128, 64, 3, 1, 4, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "wm is 1 (ping-pong) or 2"},
        {{4096, 768, 768, STOF_F16}, plain, {256, 128, 64, 1, 1, 4, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "64 or 128 rows per consumer"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 256, 64, 1, 1, 4, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "accumulators"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 96, 64, 1, 1, 4, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "bn must be 64, 128, 192 or 256"},
        {{4096, 768, 768, STOF_F16}, plain, {128, 128, 64, 1, 1, 9, GEMM_TMA}, STOF_ERR_INVALID_ARG,
         "stages must be 2 to 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(gemm_check(ctx, &bad[i].s, &bad[i].e, &bad[i].c), bad[i].want);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].says), "case %zu: %s", i,
                      stof_last_error(ctx));
        /* Nothing is compiled for a refused request. */
        ck_assert_int_eq(gemm_prepare(ctx, &bad[i].c, &bad[i].s, &bad[i].e, NULL), bad[i].want);
    }
    /* A wg config is for sm_90a only. */
    stof_ctx *ampere = open_ctx("sm_80");
    const gemm_shape bert = {4096, 768, 768, STOF_F16};
    ck_assert_int_eq(gemm_check(ampere, &bert, &plain, &wg), STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ampere), "sm_90a"));
    ck_assert_int_eq(gemm_prepare(ampere, &wg, &bert, &plain, NULL), STOF_ERR_UNSUPPORTED);
    ck_assert_int_eq(gemm_check(ctx, &bert, &plain, &wg), STOF_OK);
    const gemm_config tma = {128, 128, 64, 1, 1, 6, GEMM_TMA};
    ck_assert_int_eq(gemm_check(ampere, &bert, &plain, &tma), STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ampere), "TMA"));
    ck_assert_int_eq(gemm_check(ctx, &bert, &plain, &tma), STOF_OK);
    stof_stats st;
    stof_get_stats(ampere, &st);
    ck_assert_int_eq(st.nvrtc_compiles, 0);
    stof_close(ampere);
    stof_get_stats(ctx, &st);
    ck_assert_int_eq(st.nvrtc_compiles, 0);

    /* Launch arguments are checked before the device is asked for. */
    gemm_shape s = {1000, 768, 768, STOF_F16};
    gemm_args a = {.x = (void *)0x1000, .w = (void *)0x2000, .out = (void *)0x3000};
    CUfunction fn = (CUfunction)0x1;
    a.x = NULL;
    ck_assert_int_eq(gemm_launch(ctx, fn, &ok, &s, &a, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "'x'"));
    a.x = (void *)0x1000;
    a.residual = (void *)0x4008;
    ck_assert_int_eq(gemm_launch(ctx, fn, &ok, &s, &a, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "'residual'"));
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "16-byte"));
    int has = 1;
    stof_device_info(ctx, &has, NULL, 0, NULL, 0);
    if (!has) {
        a.residual = NULL;
        ck_assert_int_eq(gemm_launch(ctx, fn, &ok, &s, &a, NULL), STOF_ERR_NO_DEVICE);
        ck_assert_int_eq(gemm_load(ctx, &ok, &s, &plain, &fn, NULL), STOF_ERR_NO_DEVICE);
    }
    stof_close(ctx);
}
END_TEST

/* A request's template as jit renders it: its part first, one text. */
static char *render_request(stof_ctx *ctx, const jit_request *req)
{
    char *part = NULL, *tmpl = NULL, *src = NULL;
    if (req->part)
        ck_assert_int_eq(render_load(&ctx->err, req->part, &part), STOF_OK);
    ck_assert_int_eq(render_load(&ctx->err, req->tmpl, &tmpl), STOF_OK);
    char *text = malloc(strlen(part ? part : "") + strlen(tmpl) + 1);
    ck_assert_ptr_nonnull(text);
    strcpy(text, part ? part : "");
    strcat(text, tmpl);
    ck_assert_msg(render_text(&ctx->err, req->tmpl, text, req->vars, req->nvars, &src) == STOF_OK,
                  "%s", stof_last_error(ctx));
    free(part);
    free(tmpl);
    free(text);
    return src;
}

START_TEST(template_renders_completely)
{
    stof_ctx *ctx = open_ctx("sm_90a");
    for (int wgmma = 0; wgmma < 2; wgmma++)
        for (int ei = 0; ei < NEPI; ei++) {
            gemm_shape s = {333, 768, 3072, ei % 2 ? STOF_BF16 : STOF_F16};
            gemm_config c[GEMM_MAX_CANDIDATES];
            const int n = gemm_candidates(&s, &EPILOGUES[ei], 227 * 1024, wgmma, c, GEMM_MAX_CANDIDATES);
            ck_assert_int_ge(n, 1);
            /* TMA first on sm_90a, but for a LayerNorm that keeps its sum. */
            ck_assert_int_eq(c[0].wg, wgmma && !EPILOGUES[ei].ln_sum ? GEMM_TMA : 0);
            /* The first config of each engine. */
            for (int k = 0; k < n; k++) {
                if (k > 0 && c[k].wg == c[k - 1].wg)
                    continue;
                static const char *const entries[] = {"stof_gemm", "stof_gemm_wg", "stof_gemm_tma"};
                gemm_request r;
                gemm_make_request(&c[k], &s, &EPILOGUES[ei], &r);
                ck_assert(c[k].wg ? r.req.part && !strcmp(r.req.part, "wgmma.cuh") : !r.req.part);
                char *src = render_request(ctx, &r.req);
                ck_assert_ptr_null(strstr(src, "{{"));
                ck_assert_ptr_null(strstr(src, "}}"));
                char call[32];
                snprintf(call, sizeof call, "%s(", entries[c[k].wg]);
                ck_assert_ptr_nonnull(strstr(src, call));
                ck_assert_str_eq(r.req.entry, entries[c[k].wg]);
                ck_assert_ptr_nonnull(strstr(src, "    K = 3072,"));
                ck_assert_ptr_nonnull(strstr(src, s.dtype == STOF_BF16 ? ".bf16.bf16" : ".f16.f16"));
                if (c[k].wg == GEMM_TMA)
                    ck_assert_ptr_nonnull(strstr(src, EPILOGUES[ei].ln ? "    LN = 1,"
                                                                       : "    LN = 0,"));
                free(src);
            }
        }
    stof_close(ctx);
}
END_TEST

/* Every candidate of every covered shape and epilogue, both dtypes taking
 * turns, compiled on several threads into the shared kernel cache
 * (test_kernel_cache), where the compile log (ptxas -v) gives registers and
 * spills. For sm_90a, where wg
 * configs come first for every epilogue without ln, the mma.sync ones are
 * compiled only as each list's first mma.sync config and with ln: all of
 * them would put the suite past its time, and sm_80 compiles every one. */
#define MAX_VARIANTS 800
typedef struct variant_job {
    const char *arch;
    gemm_config c[MAX_VARIANTS];
    gemm_shape s[MAX_VARIANTS];
    int epi[MAX_VARIANTS], is_default[MAX_VARIANTS];
    stof_status st[MAX_VARIANTS];
    int regs[MAX_VARIANTS], spills[MAX_VARIANTS];
    char err[MAX_VARIANTS][320], global[MAX_VARIANTS][96];
    int n, next, compiled;
    pthread_mutex_t lock;
} variant_job;

static void *compile_variants(void *arg)
{
    variant_job *j = arg;
    stof_ctx *ctx;
    stof_options o = {.cache_path = test_kernel_cache(), .arch = j->arch};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    ck_assert_msg(ctx->cache != NULL, "%s", stof_last_error(ctx));
    for (int i; (i = test_take(&j->lock, &j->next, j->n)) >= 0;) {
        char key[65];
        j->st[i] = gemm_prepare(ctx, &j->c[i], &j->s[i], &EPILOGUES[j->epi[i]], key);
        snprintf(j->err[i], sizeof j->err[i], "%s", stof_last_error(ctx));
        cache_kernel k;
        int found = 0, rejected = 0;
        j->spills[i] = -1;  /* no log to read */
        /* The library turns a cache it finds damaged off (ctx->cache NULL). */
        ck_assert_msg(ctx->cache != NULL, "the test kernel cache went off: %s", ctx->cache_note);
        /* Other suites share the file: a read that finds it busy is tried
         * again, and one that still fails says why. */
        stof_status cs = STOF_OK;
        for (int t = 0; j->st[i] == STOF_OK && t < 5; t++) {
            found = rejected = 0;
            cs = cache_get_kernel(&ctx->err, ctx->cache, key, &k, &found, &rejected);
            if (cs == STOF_OK && found)
                break;
            usleep(200000);
        }
        if (j->st[i] == STOF_OK && !(cs == STOF_OK && found))
            snprintf(j->err[i], sizeof j->err[i], "reading it back: %s, found %d, rejected %d: %s",
                     stof_status_str(cs), found, rejected, stof_last_error(ctx));
        if (j->st[i] == STOF_OK && cs == STOF_OK && found) {
            const char *used = strstr(k.log, "Used ");
            j->regs[i] = used ? atoi(used + 5) : -1;
            j->spills[i] = !strstr(k.log, " 0 bytes spill stores") || strstr(k.log, "ptxas warning");
            const char *line = strstr(k.log, "bytes stack frame");
            snprintf(j->err[i], sizeof j->err[i], "%s", line ? line : k.log);
            test_ptx_global(k.ptx, j->global[i], sizeof j->global[i]);
            cache_kernel_free(&k);
        }
    }
    pthread_mutex_lock(&j->lock);
    j->compiled += (int)ctx->stats.nvrtc_compiles;
    pthread_mutex_unlock(&j->lock);
    stof_close(ctx);
    return NULL;
}

START_TEST(every_variant_compiles)
{
    static variant_job j;
    memset(&j, 0, sizeof j);
    j.arch = _i ? "sm_80" : "sm_90a";
    pthread_mutex_init(&j.lock, NULL);
    for (int i = 0; i < NSHAPES; i++)
        for (int ei = 0; ei < NEPI; ei++) {
            if (!covered(i, &EPILOGUES[ei]))
                continue;
            gemm_shape s = {4096, SHAPES[i][0], SHAPES[i][1], STOF_F16};
            gemm_config c[GEMM_MAX_CANDIDATES];
            int n = gemm_candidates(&s, &EPILOGUES[ei], 227 * 1024, !_i, c, GEMM_MAX_CANDIDATES);
            ck_assert_int_ge(n, 1);
            for (int k = 0, mma = 0; k < n; k++) {
                ck_assert(!c[k].wg || !_i);
                if (!_i && !c[k].wg && !EPILOGUES[ei].ln && mma++ > 0)
                    continue;
                ck_assert_int_lt(j.n, MAX_VARIANTS);
                s.dtype = (j.n % 2) ? STOF_BF16 : STOF_F16;
                j.c[j.n] = c[k];
                j.s[j.n] = s;
                j.epi[j.n] = ei;
                j.is_default[j.n++] = k == 0;
            }
        }
    int nthreads = test_on_threads(compile_variants, &j), maxregs = 0, nwg = 0;
    pthread_mutex_destroy(&j.lock);
    /* Registers of each wg config over its shapes and epilogues. */
    struct wg_regs { gemm_config c; int lo, hi, n; } wg[24];
    for (int i = 0; i < j.n; i++) {
        char name[48];
        gemm_config_str(&j.c[i], name, sizeof name);
        const gemm_epilogue *e = &EPILOGUES[j.epi[i]];
        ck_assert_msg(j.st[i] == STOF_OK, "%s n%d k%d %s epilogue %d: %s", j.arch, j.s[i].n,
                      j.s[i].k, name, j.epi[i], j.err[i]);
        ck_assert_msg(j.spills[i] == 0, "%s n%d k%d %s epilogue %d spills (or has no log): %s",
                      j.arch, j.s[i].n, j.s[i].k, name, j.epi[i], j.err[i]);
        ck_assert_msg(!j.global[i][0], "%s n%d k%d %s epilogue %d: a variable in device memory: %s",
                      j.arch, j.s[i].n, j.s[i].k, name, j.epi[i], j.global[i]);
        ck_assert_int_gt(j.regs[i], 0);
        if (j.regs[i] > maxregs)
            maxregs = j.regs[i];
        if (j.c[i].wg) {
            int w = 0;
            while (w < nwg && memcmp(&wg[w].c, &j.c[i], sizeof j.c[i]))
                w++;
            if (w == nwg) {
                ck_assert_int_lt(nwg, 24);
                wg[nwg++] = (struct wg_regs){j.c[i], j.regs[i], j.regs[i], 0};
            }
            wg[w].lo = j.regs[i] < wg[w].lo ? j.regs[i] : wg[w].lo;
            wg[w].hi = j.regs[i] > wg[w].hi ? j.regs[i] : wg[w].hi;
            wg[w].n++;
        }
        if (j.is_default[i] && (j.epi[i] == 2 || e->ln_sum))
            printf("test_gemm: %s default for n%d k%d %s: %s, %d registers\n", j.arch, j.s[i].n,
                   j.s[i].k, e->ln ? "ln+sum" : "bias+gelu", name, j.regs[i]);
    }
    for (int w = 0; w < nwg; w++) {
        char name[48];
        gemm_config_str(&wg[w].c, name, sizeof name);
        printf("test_gemm: %s: %d variants, %d to %d registers, no spills\n", name, wg[w].n,
               wg[w].lo, wg[w].hi);
    }
    printf("test_gemm: %d GEMM variants compiled for %s (%d now, on %d threads, the rest found "
           "in the test kernel cache); none spills; at most %d registers\n", j.n, j.arch,
           j.compiled, nthreads, maxregs);
    ck_assert_int_ge(j.n, 100);
    /* Every wg tile with every non-LN epilogue of the four BERT products. */
    if (!_i)
        ck_assert_int_ge(nwg, 6);
}
END_TEST

/* The SwiGLU epilogue (GEMM_ACT_SWIGLU): what cannot combine with it is
 * refused by name; its candidates fit in no more shared memory than the
 * plain product's (the staging tile is half as wide); the first config of
 * each engine renders and compiles for sm_90a (and mma.sync for sm_80) without
 * spilling, at Llama-3.2-1B's gate/up product and at one whose n / 2 (1000)
 * no tile divides. */
START_TEST(swiglu_epilogue)
{
    stof_ctx *ctx = open_ctx("sm_90a");
    const gemm_epilogue sw = {0, GEMM_ACT_SWIGLU, 0, 0, 0}, plain = {0, GEMM_ACT_NONE, 0, 0, 0};
    const gemm_config mma = {128, 128, 32, 2, 4, 3, 0}, tma = {128, 128, 64, 1, 1, 6, GEMM_TMA};
    const gemm_shape gu = {4096, 16384, 2048, STOF_BF16};
    struct {
        gemm_shape s;
        gemm_epilogue e;
        gemm_config c;
        stof_status want;
        const char *says;
    } bad[] = {
        {gu, {0, GEMM_ACT_SWIGLU, 0, 1, 0}, mma, STOF_ERR_UNSUPPORTED,
         "SwiGLU epilogue takes no ln"},
        {gu, {1, GEMM_ACT_SWIGLU, 1, 0, 0}, tma, STOF_ERR_UNSUPPORTED,
         "SwiGLU epilogue takes no residual"},
        {{4096, 2008, 2048, STOF_F16}, sw, mma, STOF_ERR_UNSUPPORTED, "with SwiGLU n (2008)"},
        {gu, {0, GEMM_ACT_SWIGLU + 1, 0, 0, 0}, mma, STOF_ERR_INVALID_ARG, "activation 5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(gemm_check(ctx, &bad[i].s, &bad[i].e, &bad[i].c), bad[i].want);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].says), "case %zu: %s", i,
                      stof_last_error(ctx));
        ck_assert_int_eq(gemm_check(ctx, &bad[i].s, &bad[i].e, NULL), bad[i].want);
        ck_assert_int_eq(gemm_prepare(ctx, &bad[i].c, &bad[i].s, &bad[i].e, NULL), bad[i].want);
    }
    /* A launch checks the shape it is told is SwiGLU's. */
    gemm_args a = {.x = (void *)0x1000, .w = (void *)0x2000, .out = (void *)0x3000, .swiglu = 1};
    const gemm_shape odd16 = {4096, 2008, 2048, STOF_F16};
    ck_assert_int_eq(gemm_launch(ctx, (CUfunction)0x1, &mma, &odd16, &a, NULL),
                     STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "with SwiGLU n (2008)"));
    stof_stats st0;
    stof_get_stats(ctx, &st0);
    ck_assert_int_eq(st0.nvrtc_compiles, 0);
    stof_close(ctx);

    /* Candidates, requests and compiles. */
    const gemm_shape shapes[2] = {gu, {1000, 2000, 832, STOF_F16}};
    static const char *const arches[2] = {"sm_90a", "sm_80"};
    int engines = 0;
    for (int ai = 0; ai < 2; ai++) {
        stof_options o = {.cache_path = test_kernel_cache(), .arch = arches[ai]};
        ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
        for (int si = 0; si < 2; si++) {
            const gemm_shape *s = &shapes[si];
            gemm_config c[GEMM_MAX_CANDIDATES];
            const int n = gemm_candidates(s, &sw, 227 * 1024, !ai, c, GEMM_MAX_CANDIDATES);
            ck_assert_int_ge(n, ai ? 2 : 6);
            ck_assert_int_eq(c[0].wg, ai ? 0 : GEMM_TMA);
            for (int k = 0; k < n; k++) {
                char name[48];
                gemm_config_str(&c[k], name, sizeof name);
                ck_assert_msg(gemm_check(ctx, s, &sw, &c[k]) == STOF_OK, "%s: %s", name,
                              stof_last_error(ctx));
                ck_assert_int_le(gemm_smem_bytes(&c[k], s, &sw), 227 * 1024);
                ck_assert_int_le(gemm_smem_bytes(&c[k], s, &sw), gemm_smem_bytes(&c[k], s, &plain));
                if (k > 0 && c[k].wg == c[k - 1].wg)
                    continue;
                /* The first of each engine: rendered with ACT 4, compiled. */
                gemm_request r;
                gemm_make_request(&c[k], s, &sw, &r);
                char *src = render_request(ctx, &r.req);
                ck_assert_ptr_null(strstr(src, "{{"));
                ck_assert_ptr_nonnull(strstr(src, "    ACT = 4,"));
                ck_assert_ptr_nonnull(strstr(src, "swiglu_out("));
                free(src);
                char key[65];
                ck_assert_msg(gemm_prepare(ctx, &c[k], s, &sw, key) == STOF_OK, "%s %s: %s",
                              arches[ai], name, stof_last_error(ctx));
                cache_kernel kk;
                int found = 0, rejected = 0;
                ck_assert_int_eq(cache_get_kernel(&ctx->err, ctx->cache, key, &kk, &found,
                                                  &rejected), STOF_OK);
                ck_assert(found);
                ck_assert_msg(strstr(kk.log, " 0 bytes spill stores") &&
                                  !strstr(kk.log, "ptxas warning"),
                              "%s %s spills: %s", arches[ai], name, kk.log);
                char global[96];
                ck_assert_msg(!test_ptx_global(kk.ptx, global, sizeof global), "%s: %s", name,
                              global);
                cache_kernel_free(&kk);
                printf("test_gemm: swiglu %s n%d k%d %s compiles\n", arches[ai], s->n, s->k,
                       name);
                engines |= 1 << c[k].wg;
            }
        }
        stof_close(ctx);
    }
    /* mma.sync, cp.async wgmma and TMA all took the SwiGLU epilogue. */
    ck_assert_int_eq(engines, 7);
}
END_TEST

Suite *suite_gemm(void)
{
    Suite *s = suite_create("gemm");
    TCase *t = tcase_create("plan");
    tcase_add_test(t, candidates_fit_the_limits);
    tcase_add_test(t, bad_shapes_are_named);
    tcase_add_test(t, template_renders_completely);
    suite_add_tcase(s, t);
    TCase *sw = tcase_create("swiglu");
    tcase_set_timeout(sw, 600);
    tcase_add_test(sw, swiglu_epilogue);
    suite_add_tcase(s, sw);
    TCase *c = tcase_create("compile");
    tcase_set_timeout(c, 900);
    tcase_add_loop_test(c, every_variant_compiles, 0, 2);
    suite_add_tcase(s, c);
    return s;
}
