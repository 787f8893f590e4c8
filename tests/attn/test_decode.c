/* CPU suite for decoding attention: the desc's and the run's checks come
 * before any device work and name the field, the split count stays in its
 * bounds and fills the SMs, and the kernels compile for sm_90a (and sm_80)
 * with no GPU, into a cache a second context finds them in. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/decode.h"
#include "testutil.h"

static stof_ctx *open_ctx(const char *arch)
{
    stof_ctx *ctx;
    stof_options o = {.no_cache = 1, .arch = arch};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    return ctx;
}

#define OK_DESC                                                                            \
    .batch = 8, .heads = 32, .kv_heads = 8, .head_dim = 128, .seq_q = 1, .max_seq_k = 4096, \
    .dtype = STOF_BF16

START_TEST(bad_arguments_name_the_field)
{
    stof_ctx *ctx = open_ctx(NULL);
    /* Each case is the good desc with one field overridden after it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
    struct {
        stof_decode_desc d;
        const char *says;
    } bad[] = {
        {{OK_DESC, .heads = 30}, "desc.kv_heads 8 must be 0 or divide desc.heads 30"},
        {{OK_DESC, .kv_heads = -1}, "desc.kv_heads -1"},
        {{OK_DESC, .seq_q = 0}, "desc.seq_q 0"},
        {{OK_DESC, .seq_q = 17}, "desc.seq_q 17"},
        {{OK_DESC, .seq_q = 4, .max_seq_k = 3}, "desc.max_seq_k 3"},
        {{OK_DESC, .max_seq_k = STOF_MAX_SEQ + 1}, "desc.max_seq_k"},
        {{OK_DESC, .batch = 0}, "desc.batch 0"},
        {{OK_DESC, .batch = 70000}, "desc.batch 70000"},
        {{OK_DESC, .heads = 0, .kv_heads = 0}, "desc.heads 0"},
        {{OK_DESC, .head_dim = 72}, "desc.head_dim 72"},
        {{OK_DESC, .head_dim = 256}, "desc.head_dim 256"},
        {{OK_DESC, .dtype = STOF_F32}, "desc.dtype"},
        {{OK_DESC, .layout = 7}, "desc.layout 7"},
        {{OK_DESC, .scale = -1}, "desc.scale"},
        {{OK_DESC, .scale = INFINITY}, "desc.scale"},
        {{OK_DESC, .softcap = -30}, "desc.softcap"},
        {{OK_DESC, .softcap = NAN}, "desc.softcap"},
        {{OK_DESC, .window = -1}, "desc.window -1"},
    };
#pragma GCC diagnostic pop
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        stof_decode_plan *p = (stof_decode_plan *)1;
        ck_assert_int_eq(stof_decode_plan_create(ctx, &bad[i].d, &p), STOF_ERR_INVALID_ARG);
        ck_assert_ptr_null(p);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].says), "case %zu: %s", i,
                      stof_last_error(ctx));
        ck_assert_int_eq(stof_decode_prepare(ctx, &bad[i].d), STOF_ERR_INVALID_ARG);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].says), "prepare, case %zu: %s", i,
                      stof_last_error(ctx));
    }
    stof_decode_desc ok = {OK_DESC};
    stof_decode_plan *p = (stof_decode_plan *)1;
    ck_assert_int_eq(stof_decode_plan_create(ctx, NULL, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "desc"));
    ck_assert_int_eq(stof_decode_plan_create(ctx, &ok, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "plan"));
    ck_assert_int_eq(stof_decode_plan_create(NULL, &ok, &p), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_decode_prepare(NULL, &ok), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_decode_prepare(ctx, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_decode_run(NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, NULL),
                     STOF_ERR_INVALID_ARG);
    char buf[8];
    ck_assert_int_eq(stof_decode_plan_describe(NULL, buf, sizeof buf), STOF_ERR_INVALID_ARG);
    stof_decode_plan_free(NULL);

    /* A forced split count out of range is refused before the device. */
    const char *was = getenv("STOF_DECODE_SPLITS");
    char *saved = was ? strdup(was) : NULL;
    setenv("STOF_DECODE_SPLITS", "0", 1);
    ck_assert_int_eq(stof_decode_plan_create(ctx, &ok, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "STOF_DECODE_SPLITS"));
    setenv("STOF_DECODE_SPLITS", "9x", 1);
    ck_assert_int_eq(stof_decode_plan_create(ctx, &ok, &p), STOF_ERR_INVALID_ARG);
    if (saved)
        setenv("STOF_DECODE_SPLITS", saved, 1);
    else
        unsetenv("STOF_DECODE_SPLITS");
    free(saved);

    /* So are an unknown kernel variant (the message lists the known ones)
     * and a split cost out of range, by the plan and by prepare. */
    setenv("STOF_DECODE_VARIANT", "tma9", 1);
    ck_assert_int_eq(stof_decode_plan_create(ctx, &ok, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "$STOF_DECODE_VARIANT 'tma9'"));
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "swz-kfirst, cp-l2-128-kfirst, cp-l2-128-unroll, "));
    ck_assert_int_eq(stof_decode_prepare(ctx, &ok), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "STOF_DECODE_VARIANT"));
    unsetenv("STOF_DECODE_VARIANT");
    static const char *bad_tiles[] = {"-1", "65", "2x"};
    for (int i = 0; i < 3; i++) {
        setenv("STOF_DECODE_CTA_TILES", bad_tiles[i], 1);
        ck_assert_int_eq(stof_decode_plan_create(ctx, &ok, &p), STOF_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "STOF_DECODE_CTA_TILES"));
    }
    unsetenv("STOF_DECODE_CTA_TILES");

    int has = 1;
    stof_device_info(ctx, &has, NULL, 0, NULL, 0);
    if (!has) {
        ck_assert_int_eq(stof_decode_plan_create(ctx, &ok, &p), STOF_ERR_NO_DEVICE);
        ck_assert_ptr_null(p);
        ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "GPU"));
    }
    stof_close(ctx);
}
END_TEST

/* The split count: within 1 .. DECODE_MAX_SPLITS and one tile a split at
 * least; enough CTAs for the SMs where the cache is long; none where the
 * batch fills them already. H100 figures: 132 SMs, two CTAs each. */
START_TEST(splits_fill_the_machine)
{
    for (int span = 1; span <= 70000; span = span * 3 + 7)
        for (long long ctas = 1; ctas <= 4096; ctas *= 4) {
            const int s = decode_choose_splits(132, 2, ctas, span);
            const int tiles = (span + DECODE_BLOCK_N - 1) / DECODE_BLOCK_N;
            ck_assert_int_ge(s, 1);
            ck_assert_int_le(s, DECODE_MAX_SPLITS);
            ck_assert_int_le(s, tiles);
        }
    /* batch 1, Llama-3-8B's 8 KV heads, cache 16384: a wave of 264 slots */
    const int s1 = decode_choose_splits(132, 2, 8, 16384);
    ck_assert_int_ge(8 * s1, 200);
    ck_assert_int_le(8 * s1, 264);
    /* batch 8 at 16384: 64 CTAs a split */
    const int s8 = decode_choose_splits(132, 2, 64, 16384);
    ck_assert_int_ge(64 * s8, 200);
    ck_assert_int_le(64 * s8, 528);
    /* batch 64 at 4096: 512 CTAs already */
    ck_assert_int_le(decode_choose_splits(132, 2, 512, 4096), 2);
    /* a short cache: no more splits than tiles */
    ck_assert_int_eq(decode_choose_splits(132, 2, 8, 100), 2);
    ck_assert_int_eq(decode_choose_splits(132, 2, 8, 1), 1);
    /* the shared memory: Q, the ring and the merge's figures fit an H100's
     * block and leave two blocks to an SM at every head size */
    static const int dims[] = {STOF_MHA_HEAD_DIMS};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        const int st = decode_stages(dims[i]);
        ck_assert_int_ge(st, 2);
        ck_assert_int_le(st, 8);
        ck_assert_int_le(2 * (decode_smem_bytes(dims[i]) + 1024), 228 * 1024);
        /* the warps' O (4 x 16 x head_dim floats) fits the ring it reuses */
        ck_assert_int_le(4 * 16 * dims[i] * 4, st * 2 * DECODE_BLOCK_N * (dims[i] + 8) * 2);
    }
}
END_TEST

/* The kernel variants: distinct names, the default first (64-key tiles, the
 * stages decode_stages gives); each fits the shared memory an H100 gives
 * the CTAs an SM is to hold, and the warps' O fits the ring it reuses; the
 * split count keeps its bounds at every tile width. */
START_TEST(variants_are_sound)
{
    ck_assert_int_ge(decode_nvariants, 2);
    ck_assert_str_eq(decode_variants[0].name, DECODE_DEFAULT_VARIANT);
    ck_assert_int_eq(decode_variants[0].block_n, DECODE_BLOCK_N);
    ck_assert_ptr_null(decode_variant_named("nope"));
    ck_assert_ptr_null(decode_variant_named(NULL));
    static const int dims[] = {STOF_MHA_HEAD_DIMS};
    for (int i = 0; i < decode_nvariants; i++) {
        const decode_variant *v = &decode_variants[i];
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(v->name, decode_variants[j].name);
        ck_assert_ptr_eq(decode_variant_named(v->name), v);
        ck_assert_int_eq(v->block_n % 16, 0);
        ck_assert(v->resident == 1 || v->resident == 2);
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            const int st = decode_stages_of(v, dims[d]), smem = decode_smem_bytes_of(v, dims[d]);
            ck_assert_int_ge(st, 2);
            ck_assert_int_le(st, 8);
            ck_assert_int_le(smem, 227 * 1024);
            ck_assert_int_le(v->resident * (smem + 1024), 228 * 1024);
            /* the ring's rows: unpadded where swizzled (head_dim 64, 128) */
            const int lds = v->swizzle && dims[d] % 64 == 0 ? dims[d] : dims[d] + 8;
            ck_assert_int_eq(smem, DECODE_ROWS * lds * 2 + st * 2 * v->block_n * lds * 2 +
                                       v->block_n / 16 * DECODE_ROWS * 2 * 4);
            ck_assert_int_le(v->block_n / 16 * 16 * dims[d] * 4, st * 2 * v->block_n * lds * 2);
            if (i == 0) {
                ck_assert_int_eq(st, decode_stages(dims[d]));
                ck_assert_int_eq(smem, decode_smem_bytes(dims[d]));
            }
        }
        /* Every value the request names is the variant's. */
        stof_decode_desc d = {.batch = 1, .heads = 8, .head_dim = 128, .seq_q = 1,
                              .max_seq_k = 64, .dtype = STOF_BF16};
        decode_request r;
        decode_make_request(&d, v, &r);
        ck_assert_ptr_null(r.main.part);
        char bn[16];
        snprintf(bn, sizeof bn, "%d", v->block_n);
        for (int k = 0; k < r.main.nvars; k++) {
            if (strcmp(r.main.vars[k].name, "BLOCK_N") == 0)
                ck_assert_str_eq(r.main.vars[k].value, bn);
            if (strcmp(r.main.vars[k].name, "WARP_RING") == 0)
                ck_assert_str_eq(r.main.vars[k].value, v->warp_ring ? "1" : "0");
            if (strcmp(r.main.vars[k].name, "PREFETCH") == 0)
                ck_assert_str_eq(r.main.vars[k].value, v->prefetch == 128   ? ".L2::128B"
                                                       : v->prefetch == 256 ? ".L2::256B"
                                                                            : "");
        }
    }
    for (int span = 1; span <= 70000; span = span * 3 + 7)
        for (long long ctas = 1; ctas <= 4096; ctas *= 4)
            for (int bn = 64; bn <= 128; bn *= 2)
                for (int cost = 0; cost <= 8; cost += 4) {
                    const int s = decode_choose_splits_at(132, 1, ctas, span, bn, cost);
                    ck_assert_int_ge(s, 1);
                    ck_assert_int_le(s, DECODE_MAX_SPLITS);
                    ck_assert_int_le(s, (span + bn - 1) / bn);
                }
    /* A dearer CTA never asks for more splits. */
    for (int cost = 0; cost < 16; cost++)
        ck_assert_int_ge(decode_choose_splits_at(132, 2, 8, 4096, 64, cost),
                         decode_choose_splits_at(132, 2, 8, 4096, 64, cost + 1));
    ck_assert_int_eq(decode_choose_splits_at(132, 2, 8, 16384, 64, DECODE_CTA_TILES),
                     decode_choose_splits(132, 2, 8, 16384));
}
END_TEST

/* Every variant compiles for sm_90a with no GPU (head_dim 128 bf16 and 32
 * f16: the widest rows and the narrowest). */
START_TEST(every_variant_compiles_for_sm90a)
{
    stof_ctx *ctx = open_ctx("sm_90a");
    for (int i = 0; i < decode_nvariants; i++) {
        setenv("STOF_DECODE_VARIANT", decode_variants[i].name, 1);
        for (int hd = 32; hd <= 128; hd *= 4) {
            stof_decode_desc d = {.batch = 2, .heads = 8, .kv_heads = 2, .head_dim = hd,
                                  .seq_q = 2, .max_seq_k = 1000,
                                  .dtype = hd == 128 ? STOF_BF16 : STOF_F16};
            ck_assert_msg(stof_decode_prepare(ctx, &d) == STOF_OK, "%s hd %d: %s",
                          decode_variants[i].name, hd, stof_last_error(ctx));
        }
    }
    unsetenv("STOF_DECODE_VARIANT");
    stof_close(ctx);
}
END_TEST

/* Compile-only preparation for sm_90a at every head size and both dtypes,
 * softcap on and off: the kernels land in the cache, and a second context
 * finds every one of them there. */
START_TEST(prepare_compiles_with_no_gpu)
{
    char *dir = test_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/cache.db", dir);
    const char *arch = _i ? "sm_80" : "sm_90a";
    stof_options o = {.cache_path = path, .arch = arch};
    static const int dims[] = {STOF_MHA_HEAD_DIMS};
    const int nd = (int)(sizeof dims / sizeof dims[0]);
    long long compiles = 0;
    for (int run = 0; run < 2; run++) {
        stof_ctx *ctx;
        ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
        for (int i = 0; i < nd; i++) {
            /* sm_80 only the shapes of the issue: the compile is the test's cost */
            if (_i && dims[i] != 128)
                continue;
            stof_decode_desc d = {.batch = 4, .heads = 32, .kv_heads = 8, .head_dim = dims[i],
                                  .seq_q = 1 + i, .max_seq_k = 8192,
                                  .dtype = i % 2 ? STOF_F16 : STOF_BF16,
                                  .softcap = dims[i] == 128 ? 50.f : 0.f,
                                  .window = i == 1 ? 4096 : 0};
            ck_assert_msg(stof_decode_prepare(ctx, &d) == STOF_OK, "head_dim %d: %s", dims[i],
                          stof_last_error(ctx));
        }
        stof_stats s;
        stof_get_stats(ctx, &s);
        if (run == 0) {
            compiles = s.nvrtc_compiles;
            ck_assert_int_ge(compiles, _i ? 2 : 2 * nd);
        } else {
            ck_assert_int_eq(s.nvrtc_compiles, 0);
            ck_assert_int_eq(s.cache_hits, compiles);
        }
        stof_close(ctx);
    }
    /* The same desc but for seq_q, kv_heads and the window is the same
     * kernel: those are its arguments. */
    stof_decode_desc a = {.batch = 1, .heads = 8, .head_dim = 64, .seq_q = 1, .max_seq_k = 64,
                          .dtype = STOF_F16},
                     b = {.batch = 64, .heads = 64, .kv_heads = 1, .head_dim = 64, .seq_q = 16,
                          .max_seq_k = 65536, .dtype = STOF_F16, .window = 100};
    decode_request ra, rb;
    decode_make_request(&a, &decode_variants[0], &ra);
    decode_make_request(&b, &decode_variants[0], &rb);
    for (int i = 0; i < ra.main.nvars; i++)
        ck_assert_str_eq(ra.main.vars[i].value, rb.main.vars[i].value);
    test_rmtree(dir);
    free(dir);
}
END_TEST

Suite *suite_decode(void)
{
    Suite *s = suite_create("decode");
    TCase *t = tcase_create("checks");
    tcase_add_test(t, bad_arguments_name_the_field);
    tcase_add_test(t, splits_fill_the_machine);
    tcase_add_test(t, variants_are_sound);
    suite_add_tcase(s, t);
    TCase *c = tcase_create("compile");
    tcase_set_timeout(c, 600);
    tcase_add_loop_test(c, prepare_compiles_with_no_gpu, 0, 2);
    tcase_add_test(c, every_variant_compiles_for_sm90a);
    suite_add_tcase(s, c);
    return s;
}
