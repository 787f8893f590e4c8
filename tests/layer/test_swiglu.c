/*
 * test_swiglu — the CPU side of the gated activation pass: its requests
 * (vector width by row lengths and alignment), compiles for sm_90a with no
 * GPU (gate and up apart, stacked and in pairs), and the argument checks of
 * swiglu_run and swiglu_check.
 */
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "layer/swiglu.h"
#include "testutil.h"

START_TEST(requests)
{
    swiglu_request r;
    swiglu_make_request(8192, 16384, 0, STOF_BF16, 16, &r);
    ck_assert_str_eq(r.vars[2].value, "8");
    ck_assert_str_eq(r.vars[3].value, "stof_bf16");
    ck_assert_str_eq(r.vars[6].value, "0");
    swiglu_make_request(8192, 8192, 0, STOF_F16, 4, &r);   /* pointers 4 bytes apart from 16 */
    ck_assert_str_eq(r.vars[2].value, "2");
    swiglu_make_request(1001, 2002, 0, STOF_F16, 16, &r);   /* an odd row length: one at a time */
    ck_assert_str_eq(r.vars[2].value, "1");
    ck_assert_str_eq(r.vars[1].value, "2002");
    swiglu_make_request(8192, 16384, 1, STOF_BF16, 16, &r); /* pairs: the same widths */
    ck_assert_str_eq(r.vars[2].value, "8");
    ck_assert_str_eq(r.vars[6].value, "1");
}
END_TEST

START_TEST(prepare_sm90a)
{
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = test_kernel_cache(),
                                                      .arch = "sm_90a"}),
                     STOF_OK);
    const int ffn[] = {8192, 14336, 1001};
    for (int i = 0; i < 3; i++)
        for (int form = 0; form < 3; form++) {   /* apart, stacked, pairs */
            char key[65] = "";
            ck_assert_msg(swiglu_prepare(ctx, ffn[i], ffn[i] * (1 + (form > 0)), form == 2,
                                         i ? STOF_BF16 : STOF_F16, 16, key) == STOF_OK,
                          "%s", stof_last_error(ctx));
            ck_assert_int_eq((int)strlen(key), 64);
        }
    stof_close(ctx);
}
END_TEST

START_TEST(bad_arguments)
{
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    char *p = (char *)(uintptr_t)4096;
    struct { int ffn; stof_dtype t; long long rows; const void *g, *u; void *o; stof_status st;
             const char *msg; } bad[] = {
        {0, STOF_BF16, 1, p, NULL, p, STOF_ERR_INVALID_ARG, "desc.ffn_hidden"},
        {64, STOF_F32, 1, p, NULL, p, STOF_ERR_UNSUPPORTED, "desc.dtype"},
        {64, STOF_BF16, 0, p, NULL, p, STOF_ERR_INVALID_ARG, "rows"},
        {64, STOF_BF16, 1, NULL, NULL, p, STOF_ERR_INVALID_ARG, "'gate'"},
        {64, STOF_BF16, 1, p + 1, NULL, p, STOF_ERR_INVALID_ARG, "'gate'"},
        {64, STOF_BF16, 1, p, p + 3, p, STOF_ERR_INVALID_ARG, "'up'"},
        {64, STOF_BF16, 1, p, p, NULL, STOF_ERR_INVALID_ARG, "'out'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(swiglu_run(ctx, bad[i].ffn, bad[i].t, bad[i].rows, bad[i].g, bad[i].u,
                                    bad[i].o, NULL),
                         bad[i].st);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].msg), "case %zu: %s", i,
                      stof_last_error(ctx));
    }
    ck_assert_int_eq(swiglu_check(ctx, 64, 96, 0, STOF_BF16), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(swiglu_check(ctx, 64, 64, 1, STOF_BF16), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "pairs need rows of twice"));
    ck_assert_int_eq(swiglu_check(ctx, 64, 128, 1, STOF_BF16), STOF_OK);
    ck_assert_int_eq(swiglu_run(NULL, 64, STOF_BF16, 1, p, NULL, p, NULL), STOF_ERR_INVALID_ARG);
    if (!test_have_gpu())
        ck_assert_int_eq(swiglu_run(ctx, 64, STOF_BF16, 1, p, NULL, p + 4096, NULL),
                         STOF_ERR_NO_DEVICE);
    stof_close(ctx);
}
END_TEST

Suite *suite_swiglu(void)
{
    Suite *s = suite_create("swiglu");
    TCase *t = tcase_create("swiglu");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, requests);
    tcase_add_test(t, prepare_sm90a);
    tcase_add_test(t, bad_arguments);
    suite_add_tcase(s, t);
    return s;
}
