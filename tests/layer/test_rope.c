/*
 * test_rope — the CPU side of the rotary embeddings: the frequency table
 * (plain, and with Llama-3's scaling, against the rule written out here
 * band by band), the checks of the settings and the shape, and the pass
 * compiled for sm_90a with no GPU (no variable in device memory).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "ctx.h"
#include "layer/rope.h"
#include "testutil.h"

START_TEST(plain_table)
{
    float f[64];
    rope_params p = {.theta = 10000};
    rope_inv_freq(&p, 128, f);
    ck_assert(f[0] == 1.f);
    for (int i = 1; i < 64; i++) {
        ck_assert(f[i] < f[i - 1]);
        double want = exp(-log(10000.0) * (2.0 * i / 128));
        ck_assert_msg(fabs(f[i] - want) <= 1e-7 * want, "i %d: %.9g, want %.9g", i, f[i], want);
    }
    /* theta^(-(D-2)/D): the slowest rotation. */
    ck_assert(fabs(f[63] - pow(10000.0, -126.0 / 128)) < 1e-7 * f[63]);
}
END_TEST

/* Llama-3.1's settings on its head size: every band of the spectrum. */
START_TEST(llama3_table)
{
    float base[64], f[64];
    rope_params plain = {.theta = 500000};
    rope_params p = {.theta = 500000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                     .original_max_positions = 8192};
    ck_assert_int_eq(rope_check(NULL, &p, 128), STOF_OK);
    rope_inv_freq(&plain, 128, base);
    rope_inv_freq(&p, 128, f);
    int kept = 0, stretched = 0, blended = 0;
    for (int i = 0; i < 64; i++) {
        double wl = 2 * M_PI / base[i];
        if (wl < 8192.0 / 4) {           /* high frequencies: unchanged */
            ck_assert(fabs(f[i] - base[i]) <= 1e-7 * base[i]);
            kept++;
        } else if (wl > 8192.0 / 1) {    /* low frequencies: divided by the factor */
            ck_assert(fabs(f[i] - base[i] / 8) <= 1e-6 * base[i] / 8);
            stretched++;
        } else {                         /* between: a blend weighted by 8192 / wl */
            double s = (8192.0 / wl - 1) / (4 - 1);
            double want = (1 - s) * base[i] / 8 + s * base[i];
            ck_assert_msg(fabs(f[i] - want) <= 1e-6 * want, "i %d: %.9g, want %.9g", i, f[i],
                          want);
            ck_assert(f[i] < base[i] && f[i] > base[i] / 8);
            blended++;
        }
        if (i)
            ck_assert(f[i] <= f[i - 1]);
    }
    ck_assert(kept > 0 && stretched > 0 && blended > 0);
    ck_assert(f[0] == 1.f);
}
END_TEST

START_TEST(bad_settings)
{
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    const rope_params good = {.theta = 500000, .factor = 8, .low_freq_factor = 1,
                              .high_freq_factor = 4, .original_max_positions = 8192};
    struct { rope_params p; int head_dim; const char *msg; } bad[] = {
        {{.theta = 0}, 128, "desc.rope_theta"},
        {{.theta = -1}, 128, "desc.rope_theta"},
        {{.theta = INFINITY}, 128, "desc.rope_theta"},
        {{.theta = NAN}, 128, "desc.rope_theta"},
        {{.theta = 10000}, 127, "desc.head_dim"},
        {{.theta = 10000}, 0, "desc.head_dim"},
        {{.theta = 10000}, 1024, "desc.head_dim"},
        {{.theta = 1e4f, .factor = 0.5f, .low_freq_factor = 1, .high_freq_factor = 4,
          .original_max_positions = 8192}, 128, "desc.rope_factor"},
        {{.theta = 1e4f, .factor = -8, .low_freq_factor = 1, .high_freq_factor = 4,
          .original_max_positions = 8192}, 128, "desc.rope_factor"},
        {{.theta = 1e4f, .factor = 8, .low_freq_factor = 0, .high_freq_factor = 4,
          .original_max_positions = 8192}, 128, "desc.rope_low_freq_factor"},
        {{.theta = 1e4f, .factor = 8, .low_freq_factor = 4, .high_freq_factor = 4,
          .original_max_positions = 8192}, 128, "desc.rope_high_freq_factor"},
        {{.theta = 1e4f, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
          .original_max_positions = 0}, 128, "desc.rope_original_max_positions"},
    };
    ck_assert_int_eq(rope_check(ctx, &good, 128), STOF_OK);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(rope_check(ctx, &bad[i].p, bad[i].head_dim), STOF_ERR_INVALID_ARG);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].msg), "case %zu: %s", i,
                      stof_last_error(ctx));
    }
    ck_assert_int_eq(rope_check(ctx, NULL, 128), STOF_ERR_INVALID_ARG);

    /* The pass's own arguments. */
    rope_shape s = {.heads = 32, .kv_heads = 8, .head_dim = 128, .dtype = STOF_BF16};
    void *p = (void *)(uintptr_t)4096;
    const float *t = (const float *)(uintptr_t)8192;
    struct { rope_shape s; int batch, seq, offset; void *qkv; const float *table; stof_status st;
             const char *msg; } runs[] = {
        {{32, 0, 128, STOF_BF16}, 1, 8, 0, p, t, STOF_ERR_INVALID_ARG, "desc.kv_heads"},
        {{32, 8, 66 + 1, STOF_BF16}, 1, 8, 0, p, t, STOF_ERR_INVALID_ARG, "desc.head_dim"},
        {{32, 8, 128, STOF_F32}, 1, 8, 0, p, t, STOF_ERR_UNSUPPORTED, "desc.dtype"},
        {s, 0, 8, 0, p, t, STOF_ERR_INVALID_ARG, "batch"},
        {s, 1, 0, 0, p, t, STOF_ERR_INVALID_ARG, "seq"},
        {s, 1, 8, -1, p, t, STOF_ERR_INVALID_ARG, "offset"},
        {s, 1, 8, 0, NULL, t, STOF_ERR_INVALID_ARG, "'qkv'"},
        {s, 1, 8, 0, (char *)p + 1, t, STOF_ERR_INVALID_ARG, "'qkv'"},
        {s, 1, 8, 0, p, NULL, STOF_ERR_INVALID_ARG, "'inv_freq'"},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        ck_assert_int_eq(rope_run(ctx, &runs[i].s, runs[i].qkv, runs[i].batch, runs[i].seq,
                                  runs[i].offset, NULL, runs[i].table, NULL),
                         runs[i].st);
        ck_assert_msg(strstr(stof_last_error(ctx), runs[i].msg), "run case %zu: %s", i,
                      stof_last_error(ctx));
    }
    ck_assert_int_eq(rope_run(ctx, &s, p, 1, 8, 0, (const int *)(uintptr_t)4098, t, NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "'positions'"));
    if (!test_have_gpu())
        ck_assert_int_eq(rope_run(ctx, &s, p, 1, 8, 0, NULL, t, NULL), STOF_ERR_NO_DEVICE);
    stof_close(ctx);
}
END_TEST

/* Compiled for Hopper with no GPU: MHA, GQA 4:1 and MQA heads, head sizes
 * whose halves are and are not multiples of the 16-byte vector. */
START_TEST(prepare_sm90a)
{
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = test_kernel_cache(),
                                                      .arch = "sm_90a"}),
                     STOF_OK);
    const rope_shape shapes[] = {{32, 8, 64, STOF_BF16}, {32, 8, 128, STOF_BF16},
                                 {12, 12, 64, STOF_F16}, {28, 4, 128, STOF_BF16},
                                 {16, 1, 80, STOF_F16}, {8, 2, 36, STOF_BF16}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char key[65] = "";
        ck_assert_msg(rope_prepare(ctx, &shapes[i], 16, key) == STOF_OK, "%s",
                      stof_last_error(ctx));
        cache_kernel k;
        int found = 0, rejected = 0;
        ck_assert_int_eq(cache_get_kernel(&ctx->err, ctx->cache, key, &k, &found, &rejected),
                         STOF_OK);
        ck_assert(found);
        ck_assert_ptr_nonnull(strstr(k.ptx, ".entry stof_rope"));
        char global[96];
        ck_assert_msg(!test_ptx_global(k.ptx, global, sizeof global),
                      "a variable in device memory: %s", global);
        char want[48];
        snprintf(want, sizeof want, "#define ROT_HEADS %d\n", shapes[i].heads + shapes[i].kv_heads);
        ck_assert_ptr_nonnull(strstr(k.source, want));
        cache_kernel_free(&k);
    }
    stof_close(ctx);
}
END_TEST

Suite *suite_rope(void)
{
    Suite *s = suite_create("rope");
    TCase *t = tcase_create("rope");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, plain_table);
    tcase_add_test(t, llama3_table);
    tcase_add_test(t, bad_settings);
    tcase_add_test(t, prepare_sm90a);
    suite_add_tcase(s, t);
    return s;
}
