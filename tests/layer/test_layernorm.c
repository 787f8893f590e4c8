/*
 * test_layernorm — the CPU side of the normalization module's RMSNorm form
 * (the LayerNorm kernels' own sweep is in test_nvrtc): its requests, a
 * compile for sm_90a with no GPU, and the argument checks of ln_rms_run.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/render.h"
#include "ctx.h"
#include "layer/layernorm.h"
#include "testutil.h"

/* The rendered source of request r (caller frees). */
static char *rendered(const ln_request *r)
{
    err_record err = {0};
    char *src = NULL;
    ck_assert_int_eq(render_template(&err, r->req.tmpl, r->req.vars, r->req.nvars, &src),
                     STOF_OK);
    return src;
}

START_TEST(rms_requests)
{
    stof_ln_desc d = {.rows = 7, .hidden = 4096, .dtype = STOF_BF16, .eps = 1e-6f};
    ln_request rms, ln;
    ln_rms_make_request(&d, 16, 1, 1, &rms);
    ln_make_request(&d, 16, 0, 1, 1, &ln);
    char *a = rendered(&rms), *b = rendered(&ln);
    ck_assert_ptr_nonnull(strstr(a, "#define RMS 1\n"));
    ck_assert_ptr_nonnull(strstr(b, "#define RMS 0\n"));
    /* Apart from the flag, the same kernel: same shape parameters. */
    ck_assert_ptr_nonnull(strstr(a, "#define HIDDEN 4096\n"));
    ck_assert_ptr_nonnull(strstr(a, "#define VEC 8\n"));
    ck_assert_int_eq(rms.req.nvars, ln.req.nvars);
    for (int i = 0; i < rms.req.nvars; i++) {
        ck_assert_str_eq(rms.vars[i].name, ln.vars[i].name);
        if (strcmp(rms.vars[i].name, "RMS") != 0 && strcmp(rms.vars[i].name, "HAS_BIAS") != 0)
            ck_assert_str_eq(rms.vars[i].value, ln.vars[i].value);
    }
    free(a);
    free(b);
}
END_TEST

/* Compile-only, for a GPU that is not here: every residual / sum form over
 * row lengths that are and are not multiples of the vector. */
START_TEST(rms_prepare_sm90a)
{
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = test_kernel_cache(),
                                                      .arch = "sm_90a"}),
                     STOF_OK);
    const int hidden[] = {1000, 4096, 16384};
    for (int h = 0; h < 3; h++)
        for (int k = 0; k < 3; k++) {
            stof_ln_desc d = {.rows = 3, .hidden = hidden[h], .dtype = k ? STOF_BF16 : STOF_F16};
            char key[65] = "";
            ck_assert_msg(ln_rms_prepare(ctx, &d, 16, k > 0, k > 1, key) == STOF_OK, "%s",
                          stof_last_error(ctx));
            ck_assert_int_eq((int)strlen(key), 64);
        }
    stof_close(ctx);
}
END_TEST

START_TEST(rms_bad_arguments)
{
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1, .arch = "sm_90a"}), STOF_OK);
    void *p = (void *)(uintptr_t)4096;
    struct { stof_ln_desc d; const void *w, *x; stof_status st; const char *msg; } bad[] = {
        {{.rows = 1, .hidden = 0, .dtype = STOF_BF16}, p, p, STOF_ERR_INVALID_ARG, "desc.hidden"},
        {{.rows = 0, .hidden = 64, .dtype = STOF_BF16}, p, p, STOF_ERR_INVALID_ARG, "desc.rows"},
        {{.rows = 1, .hidden = 16385, .dtype = STOF_BF16}, p, p, STOF_ERR_UNSUPPORTED, "16384"},
        {{.rows = 1, .hidden = 64, .dtype = STOF_BF16, .eps = -1}, p, p, STOF_ERR_INVALID_ARG,
         "desc.eps"},
        {{.rows = 1, .hidden = 64, .dtype = STOF_BF16}, NULL, p, STOF_ERR_INVALID_ARG, "'weight'"},
        {{.rows = 1, .hidden = 64, .dtype = STOF_BF16}, p, NULL, STOF_ERR_INVALID_ARG, "'x'"},
        {{.rows = 1, .hidden = 64, .dtype = STOF_BF16}, (char *)p + 1, p, STOF_ERR_INVALID_ARG,
         "'weight'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(ln_rms_run(ctx, &bad[i].d, bad[i].x, NULL, bad[i].w, p, NULL, NULL),
                         bad[i].st);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].msg), "case %zu: %s", i,
                      stof_last_error(ctx));
    }
    stof_ln_desc d = {.rows = 1, .hidden = 64, .dtype = STOF_BF16};
    ck_assert_int_eq(ln_rms_run(NULL, &d, p, NULL, p, p, NULL, NULL), STOF_ERR_INVALID_ARG);
    /* No beta and no bias: a NULL there is no error; without a GPU, the
     * launch itself is what fails. */
    if (!test_have_gpu())
        ck_assert_int_eq(ln_rms_run(ctx, &d, p, NULL, p, p, NULL, NULL), STOF_ERR_NO_DEVICE);
    stof_close(ctx);
}
END_TEST

Suite *suite_layernorm(void)
{
    Suite *s = suite_create("layernorm");
    TCase *t = tcase_create("layernorm");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, rms_requests);
    tcase_add_test(t, rms_prepare_sm90a);
    tcase_add_test(t, rms_bad_arguments);
    suite_add_tcase(s, t);
    return s;
}
