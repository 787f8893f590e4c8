/*
 * test_tools — the demos' command lines (build/stof-demo, the LayerNorm;
 * build/stof-demo-attn, masked attention; tools/demo.sh, both): --help,
 * every kind of bad argument (exit 2 with a message), and the compile-only
 * path with no GPU (forced with STOF_NO_GPU), where a second process must
 * hit the cache. stof-dump and stof-warm have tests of their own; here,
 * what all four share: --help ends with one exit-status table, the one
 * README.md gives.
 */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static int run_demo(const char *args, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "STOF_NO_GPU=1 %s %s", test_build_path("stof-demo"), args);
    return test_run(cmd, out);
}

static int run_attn(const char *args, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "STOF_NO_GPU=1 %s %s", test_build_path("stof-demo-attn"), args);
    return test_run(cmd, out);
}

START_TEST(test_demo_help)
{
    char *out = NULL;
    ck_assert_int_eq(run_demo("--help", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: stof-demo"));
    const char *opts[] = {"--cache", "--no-cache", "--rows", "--hidden", "--dtype", "--arch",
                          "--iters", "--seed", "--help"};
    for (int i = 0; i < 9; i++)
        ck_assert_msg(strstr(out, opts[i]) != NULL, "--help does not mention %s", opts[i]);
    free(out);
    ck_assert_int_eq(run_demo("-h", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: stof-demo"));
    free(out);
}
END_TEST

START_TEST(test_demo_bad_args)
{
    static const struct { const char *args, *says; } bad[] = {
        {"--bogus", "unknown option \"--bogus\""},
        {"positional", "unknown option \"positional\""},
        {"--rows", "--rows needs a value"},
        {"--rows 0", "--rows"},
        {"--rows -5", "--rows"},
        {"--rows abc", "\"abc\""},
        {"--rows=12x", "\"12x\""},
        {"--rows 99999999999", "--rows"},
        {"--hidden 16385", "--hidden"},
        {"--hidden 0", "--hidden"},
        {"--iters 0", "--iters"},
        {"--seed -1", "--seed"},
        {"--dtype fp64", "fp64"},
        {"--dtype", "--dtype needs a value"},
        {"--arch sm_9x", "sm_9x"},
        {"--arch compute_90", "compute_90"},
        {"--arch=sm_50", "sm_50"},
        {"--cache ''", "--cache needs a path"},
        {"--cache x.db --no-cache", "contradict"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = NULL;
        int rc = run_demo(bad[i].args, &out);
        ck_assert_msg(rc == 2, "stof-demo %s: exit %d, want 2; output:\n%s", bad[i].args, rc, out);
        ck_assert_msg(strstr(out, "stof-demo: ") && strstr(out, bad[i].says) && strstr(out, "--help"),
                      "stof-demo %s: the message should say \"%s\":\n%s", bad[i].args, bad[i].says, out);
        ck_assert_msg(strstr(out, "result:") == NULL, "stof-demo %s ran anyway", bad[i].args);
        free(out);
    }
}
END_TEST

/* The value of key on the output's "result:" line, or "" if none. */
static void result_field(const char *out, const char *key, char *val, size_t n)
{
    val[0] = 0;
    const char *line = strstr(out, "\nresult: ");
    if (!line)
        return;
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    const char *eol = strchr(line + 1, '\n');
    if (!p || (eol && p > eol))
        return;
    p += strlen(pat);
    size_t k = strcspn(p, " \n");
    snprintf(val, n, "%.*s", (int)(k < n ? k : n - 1), p);
}

START_TEST(test_demo_compile_only)
{
    char *dir = test_tmpdir(), args[1400], *out = NULL, v[64];
    snprintf(args, sizeof args, "--cache %s/c.db --rows 4 --hidden 256 --dtype bf16 --arch sm_80",
             dir);
    /* First process: NVRTC. */
    ck_assert_int_eq(run_demo(args, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "not run: no GPU: STOF_NO_GPU is set"));
    ck_assert_ptr_nonnull(strstr(out, "compiled by NVRTC"));
    result_field(out, "gpu", v, sizeof v);
    ck_assert_str_eq(v, "0");
    result_field(out, "arch", v, sizeof v);
    ck_assert_str_eq(v, "sm_80");
    result_field(out, "compiles", v, sizeof v);
    ck_assert_str_eq(v, "1");
    result_field(out, "cache_hits", v, sizeof v);
    ck_assert_str_eq(v, "0");
    free(out);
    /* Second process: the cache. */
    ck_assert_int_eq(run_demo(args, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "cache hit"));
    result_field(out, "compiles", v, sizeof v);
    ck_assert_str_eq(v, "0");
    result_field(out, "cache_hits", v, sizeof v);
    ck_assert_str_eq(v, "1");
    ck_assert_ptr_nonnull(strstr(out, "nvrtc_compiles=0 "));
    free(out);
    /* Uncached: compiles again, says the kernel was not kept. */
    ck_assert_int_eq(run_demo("--no-cache --rows 2 --hidden 64 --dtype fp32", &out), 0);
    result_field(out, "compiles", v, sizeof v);
    ck_assert_str_eq(v, "1");
    result_field(out, "arch", v, sizeof v);
    ck_assert_str_eq(v, "sm_90a");
    ck_assert_ptr_nonnull(strstr(out, "not kept"));
    free(out);
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_attn_help)
{
    char *out = NULL;
    ck_assert_int_eq(run_attn("--help", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: stof-demo-attn"));
    const char *opts[] = {"--cache", "--no-cache", "--batch", "--heads", "--seq", "--head-dim",
                          "--mask", "--dtype", "--arch", "--iters", "--seed", "--help"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        ck_assert_msg(strstr(out, opts[i]) != NULL, "--help does not mention %s", opts[i]);
    free(out);
}
END_TEST

START_TEST(test_attn_bad_args)
{
    static const struct { const char *args, *says; } bad[] = {
        {"--bogus", "unknown option \"--bogus\""},
        {"--batch", "--batch needs a value"},
        {"--batch 0", "--batch"},
        {"--heads x", "\"x\""},
        {"--seq 0", "--seq"},
        {"--head-dim 48", "--head-dim is 32, 64, 80, 96 or 128"},
        {"--dtype fp32", "--dtype is fp16 or bf16"},
        {"--mask ''", "--mask needs a spec"},
        {"--mask 'window:3'", "--mask: "},
        {"--mask 'docs:100,100' --seq 256", "--mask: "},
        {"--arch sm_9x", "sm_9x"},
        {"--iters 0", "--iters"},
        {"--batch 1024 --heads 256", "at most 65535"},
        {"--cache x.db --no-cache", "contradict"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *out = NULL;
        int rc = run_attn(bad[i].args, &out);
        ck_assert_msg(rc == 2, "stof-demo-attn %s: exit %d, want 2; output:\n%s", bad[i].args, rc,
                      out);
        ck_assert_msg(strstr(out, "stof-demo-attn: ") && strstr(out, bad[i].says) &&
                          strstr(out, "--help"),
                      "stof-demo-attn %s: the message should say \"%s\":\n%s", bad[i].args,
                      bad[i].says, out);
        ck_assert_msg(strstr(out, "result:") == NULL, "stof-demo-attn %s ran anyway", bad[i].args);
        free(out);
    }
}
END_TEST

START_TEST(test_attn_compile_only)
{
    char *dir = test_tmpdir(), args[1400], *out = NULL, v[64];
    snprintf(args, sizeof args,
             "--cache %s/c.db --batch 1 --heads 2 --seq 512 --head-dim 32 --mask "
             "'causal_window:128+global:16'",
             dir);
    /* First process: NVRTC. */
    ck_assert_int_eq(run_attn(args, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "masked attention: batch 1, 2 heads, L 512, head_dim 32, fp16"));
    ck_assert_ptr_nonnull(strstr(out, "not run: no GPU: STOF_NO_GPU is set"));
    ck_assert_ptr_nonnull(strstr(out, "compiled by NVRTC"));
    ck_assert_ptr_nonnull(strstr(out, "the model's pick: "));
    ck_assert_ptr_nonnull(strstr(out, "of the dense work"));
    result_field(out, "gpu", v, sizeof v);
    ck_assert_str_eq(v, "0");
    result_field(out, "arch", v, sizeof v);
    ck_assert_str_eq(v, "sm_90a");
    result_field(out, "case", v, sizeof v);
    ck_assert_str_eq(v, "b=1,h=2,L=512,d=32,fp16");
    result_field(out, "mask", v, sizeof v);
    ck_assert_str_eq(v, "causal_window:128+global:16");
    result_field(out, "compiles", v, sizeof v);
    int compiles = atoi(v);
    ck_assert_int_gt(compiles, 0);
    result_field(out, "cache_hits", v, sizeof v);
    ck_assert_str_eq(v, "0");
    result_field(out, "engine", v, sizeof v);
    ck_assert_str_eq(v, "mma.sync");   /* head_dim 32: no warpgroup engine */
    result_field(out, "saved", v, sizeof v);
    double saved = atof(v);
    /* It skips what the mask leaves out: the tiles it walks say how much. */
    long long walked = 0, all = 0;
    const char *w = strstr(out, "it walks ");
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(sscanf(w, "it walks %lld of %lld tiles", &walked, &all), 2);
    ck_assert(walked > 0 && walked < all);
    ck_assert_double_eq_tol(saved, 1.0 - (double)walked / (double)all, 1e-4);
    ck_assert(saved > 0.3 && saved < 0.7);
    free(out);
    /* Second process: every kernel from the cache. */
    ck_assert_int_eq(run_attn(args, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "cache hit"));
    result_field(out, "compiles", v, sizeof v);
    ck_assert_str_eq(v, "0");
    result_field(out, "cache_hits", v, sizeof v);
    ck_assert_int_eq(atoi(v), compiles);
    free(out);
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_demo_script)
{
    char *dir = test_tmpdir(), cmd[3000], *out = NULL;
    /* Both processes on one cache: exit 0, and the summary says what
     * happened and what was not run. */
    snprintf(cmd, sizeof cmd, "STOF_NO_GPU=1 STOF_DEMO_DIR=%s/demo bash tools/demo.sh", dir);
    ck_assert_int_eq(test_run(cmd, &out), 0);
    const char *summary = strstr(out, "== demo summary");
    ck_assert_msg(summary != NULL, "no summary:\n%s", out);
    ck_assert_ptr_nonnull(strstr(summary, "first process: NVRTC"));
    ck_assert_ptr_nonnull(strstr(summary, "(1 compile)"));
    ck_assert_ptr_nonnull(strstr(summary, "second: cache hit"));
    ck_assert_ptr_nonnull(strstr(summary, "(0 compiles, 1 cache hit)"));
    ck_assert_ptr_nonnull(strstr(summary, "NOT RUN on a GPU: no GPU: STOF_NO_GPU is set"));
    /* The attention step comes first, named in full. */
    ck_assert_ptr_nonnull(strstr(summary, "attention b=8 h=12 L=2048 d=64 fp16 window:256+global:64: "
                                          "compiled for sm_90a only; the model's pick (block on "));
    ck_assert_ptr_nonnull(strstr(summary, "of the dense work"));
    ck_assert_ptr_nonnull(strstr(summary, "NOT RUN on a GPU (no GPU: STOF_NO_GPU is set): stof's time"));
    ck_assert(strstr(out, "== attention-first") < strstr(out, "== layernorm-first"));
    free(out);
    /* A cache that cannot be opened: the second process compiles again, and
     * the script must fail. */
    snprintf(cmd, sizeof cmd,
             "touch %s/file && STOF_NO_GPU=1 STOF_DEMO_DIR=%s/demo STOF_DEMO_CACHE=%s/file/c.db "
             "STOF_DEMO_ATTN_ARGS='--batch 1 --heads 2 --seq 256 --head-dim 32' bash tools/demo.sh",
             dir, dir, dir);
    ck_assert_int_eq(test_run(cmd, &out), 1);
    ck_assert_ptr_nonnull(strstr(out, "FAILED: the second attention process"));
    ck_assert_ptr_nonnull(strstr(out, "FAILED: the second process"));
    free(out);
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* Every tool's --help ends with the same "Exit status:" table, and
 * README.md's table has the same rows. */
START_TEST(test_exit_statuses)
{
    static const char *const tools[] = {"stof-dump", "stof-warm", "stof-demo", "stof-demo-attn"};
    char *first = NULL;
    for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++) {
        char *out;
        /* -h anywhere wins, after an option that is no option too. */
        const char *how = i % 2 ? "--help" : "--bogus -h";
        int rc = test_sh(&out, "%s %s", test_build_path(tools[i]), how);
        ck_assert_msg(rc == 0, "%s %s: rc %d:\n%s", tools[i], how, rc, out);
        const char *table = strstr(out, "Exit status:\n");
        ck_assert_msg(table && strstr(out, "usage: ") < table, "%s: no table:\n%s", tools[i], out);
        ck_assert_msg(!strstr(table + 1, "Exit status:"), "%s: two tables:\n%s", tools[i], out);
        if (!first)
            first = strdup(table);
        else
            ck_assert_msg(strcmp(first, table) == 0, "%s's table differs:\n%s\nfrom:\n%s",
                          tools[i], table, first);
        free(out);
    }
    /* Its rows ("  0    success"), each a row of README.md's table. */
    size_t n;
    char *readme = test_slurp("README.md", &n);
    ck_assert_ptr_nonnull(readme);
    int rows = 0, seen[4] = {0};
    for (const char *line = strchr(first, '\n') + 1; *line; line = strchr(line, '\n') + 1) {
        int status, at = 0;
        ck_assert_msg(sscanf(line, "  %d %n", &status, &at) == 1, "a row: %s", line);
        int len = (int)(strchr(line, '\n') - line) - at;
        char want[256];
        snprintf(want, sizeof want, "\n| %d | %.*s |\n", status, len, line + at);
        ck_assert_msg(strstr(readme, want), "README.md lacks the row %s", want + 1);
        rows++;
        seen[0] |= status == 0;
        seen[1] |= status == 1;
        seen[2] |= status == 2;
        seen[3] |= status == 130;
    }
    ck_assert_int_eq(rows, 4);
    ck_assert(seen[0] && seen[1] && seen[2] && seen[3]);
    /* ... and README.md's table has no other row. */
    const char *head = strstr(readme, "| status | meaning |\n|---|---|\n");
    ck_assert_ptr_nonnull(head);
    int readme_rows = 0;
    for (const char *l = strchr(strchr(head, '\n') + 1, '\n') + 1; *l == '|';
         l = strchr(l, '\n') + 1)
        readme_rows++;
    ck_assert_int_eq(readme_rows, rows);
    free(readme);
    free(first);
}
END_TEST

Suite *suite_tools(void)
{
    Suite *s = suite_create("tools");
    TCase *tc = tcase_create("demo");
    tcase_add_test(tc, test_demo_help);
    tcase_add_test(tc, test_demo_bad_args);
    tcase_add_test(tc, test_demo_compile_only);
    tcase_add_test(tc, test_attn_help);
    tcase_add_test(tc, test_attn_bad_args);
    tcase_add_test(tc, test_attn_compile_only);
    tcase_add_test(tc, test_demo_script);
    tcase_add_test(tc, test_exit_statuses);
    suite_add_tcase(s, tc);
    return s;
}
