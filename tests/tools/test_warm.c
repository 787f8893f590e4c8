/*
 * test_warm — stof-warm run as a program on a real cache in a temporary
 * folder, with no GPU (STOF_NO_GPU=1): compile-only for sm_90a from
 * workload files the test writes and --mha / --ln / --decoder / --decode
 * one-liners (decode suites too), the summary's
 * counts, resuming (a second run is all cache hits), several jobs sharing
 * the cases with nothing done twice or lost, an interrupt (exit 130, work
 * kept, resumed), terminal progress, and every kind of bad input refused
 * with exit status 2 and nothing created or changed. A cache that cannot
 * grow fails the cases it does not keep (exit 1); one found damaged during
 * the run stops it as a damaged one is refused at open (exit 2).
 */
#include <sqlite3.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache.h"
#include "codegen/nvrtc_drv.h"
#include "testutil.h"

/* ---- helpers ---- */

static char *path_in(const char *dir, const char *name)
{
    char *p = NULL;
    ck_assert_int_ge(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The summary line: "stof-warm: N cases in T: H cache hits, ..." (on a
 * terminal it follows a carriage return). */
static const char *summary_line(const char *out, size_t *len)
{
    for (const char *p = out; p && *p;) {
        size_t n = strcspn(p, "\r\n");
        if (strncmp(p, "\033[K", 3) == 0) {
            p += 3;
            n -= 3;
        }
        if (strncmp(p, "stof-warm: ", 11) == 0) {
            const char *hits = strstr(p, " cache hit");
            if (hits && hits < p + n) {
                *len = n;
                return p;
            }
        }
        p = p[n] ? p + n + 1 : NULL;
    }
    return NULL;
}

/* The number just before `label` on the summary line ("3 compiled"). */
static int count_of(const char *out, const char *label)
{
    size_t len = 0;
    const char *line = summary_line(out, &len), *at = line ? strstr(line, label) : NULL;
    ck_assert_msg(line != NULL, "no summary in:\n%s", out);
    ck_assert_msg(at && at < line + len, "no \"%s\" in the summary:\n%s", label, out);
    while (at > line && at[-1] == ' ')
        at--;
    while (at > line && at[-1] >= '0' && at[-1] <= '9')
        at--;
    return atoi(at);
}

static int occurrences(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* Kernels of op in the cache at path. */
static int list_count(const cache_kernel *k, void *arg)
{
    (void)k;
    ++*(int *)arg;
    return 0;
}

static int kernels_in(const char *path, const char *op)
{
    err_record err = {0};
    cache *c = NULL;
    int n = 0;
    ck_assert_int_eq(cache_open(&err, path, 0, nvrtc_version_string(), &c), STOF_OK);
    ck_assert_int_eq(cache_list_kernels(&err, c, op, NULL, list_count, &n), STOF_OK);
    cache_close(c);
    return n;
}

/* What stof_mha_prepare says here: STOF_OK once attention compiles. */
static stof_status mha_prepare_status(const char *dir, char *why, size_t n)
{
    char *db = path_in(dir, "probe.db");
    stof_ctx *ctx = NULL;
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = db, .arch = "sm_90a"}), STOF_OK);
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 128, 128, &m), STOF_OK);
    stof_mha_desc d = {.batch = 1, .heads = 2, .seq_q = 128, .seq_k = 128, .head_dim = 64,
                       .dtype = STOF_F16};
    stof_status st = stof_mha_prepare(ctx, &d, m);
    snprintf(why, n, "%s", stof_last_error(ctx));
    stof_mask_free(m);
    stof_close(ctx);
    free(db);
    return st;
}

static const char ATTN[] =
    "{\"suites\": [{\"name\": \"tiny\", \"batch\": 1, \"heads\": 2, \"head_dim\": 64,"
    " \"dtype\": \"fp16\", \"seq\": [128], \"masks\": {\"causal\": \"causal\"}}]}\n";
static const char LAYERS[] =
    "{\"models\": {\"tiny\": {\"hidden\": 256, \"heads\": 4, \"ffn\": 4.0, \"activation\": \"gelu\","
    " \"norm\": \"post_ln\"}},\n"
    " \"cases\": [{\"model\": \"tiny\", \"batch\": 2, \"seq\": [64], \"dtype\": \"fp16\","
    " \"masks\": [\"window:16\"]},\n"
    "            {\"model\": \"tiny\", \"batch\": 1, \"seq\": [64, 128], \"dtype\": \"fp16\","
    " \"masks\": [\"dense\"]}]}\n";

typedef struct fixture {
    char *dir, *cache, *attn, *layers;
} fixture;

static void setup(fixture *f)
{
    setenv("STOF_NO_GPU", "1", 1);
    unsetenv("STOF_CACHE");
    f->dir = test_tmpdir();
    ck_assert_ptr_nonnull(f->dir);
    f->cache = path_in(f->dir, "cache.db");
    f->attn = path_in(f->dir, "attn.json");
    f->layers = path_in(f->dir, "layers.json");
    write_file(f->attn, ATTN);
    write_file(f->layers, LAYERS);
}

static void teardown(fixture *f)
{
    test_rmtree(f->dir);
    free(f->dir);
    free(f->cache);
    free(f->attn);
    free(f->layers);
}

/* ---- tests ---- */

START_TEST(test_compile_only)
{
    fixture f;
    setup(&f);
    char why[2048];
    stof_status mha = mha_prepare_status(f.dir, why, sizeof why);
    ck_assert_msg(mha == STOF_OK, "attention does not compile here: %s", why);
    char *out;
    int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only '%s' '%s' --ln 'rows=64,hidden=512,fp16'",
                test_build_path("stof-warm"), f.cache, f.attn, f.layers);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_int_eq(count_of(out, " cases in "), 5);
    /* The second and third layer cases need no kernel the first did not. */
    ck_assert_int_eq(count_of(out, " cache hit"), 2);
    ck_assert_int_eq(count_of(out, " compiled"), 3);
    ck_assert_int_eq(count_of(out, " tuned"), 0);
    ck_assert_int_eq(count_of(out, " failed"), 0);
    ck_assert_ptr_nonnull(strstr(out, "compiling only, for sm_90a"));
    for (int i = 1; i <= 5; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "[%d/5] ", i);
        ck_assert_msg(strstr(out, tag), "no progress line %s in:\n%s", tag, out);
    }
    /* The layer's LayerNorms (with and without bias and residual), the --ln one. */
    ck_assert_int_eq(kernels_in(f.cache, "layernorm"), 3);
    ck_assert_int_gt(kernels_in(f.cache, "gemm"), 0);
    ck_assert_int_gt(kernels_in(f.cache, "bias_act"), 0);
    ck_assert_int_gt(kernels_in(f.cache, "mha"), 0);
    free(out);

    /* Again: everything is found in the cache, nothing is compiled. */
    rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --quiet '%s' '%s' --ln 'rows=64,hidden=512,fp16'",
            test_build_path("stof-warm"), f.cache, f.attn, f.layers);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_int_eq(count_of(out, " cache hit"), 5);
    ck_assert_int_eq(count_of(out, " compiled"), 0);
    ck_assert_ptr_null(strstr(out, "[1/5]"));   /* --quiet */
    ck_assert_ptr_nonnull(strstr(out, "NVRTC: 0 kernels"));
    free(out);
    teardown(&f);
}
END_TEST

/* A decoder layer from a --decoder line and one from a workload file,
 * compiled for sm_90a with no GPU: its GEMMs, RMSNorm, RoPE, SwiGLU and
 * attention land in the cache; the same layer again needs nothing new. */
START_TEST(test_decoder_compile_only)
{
    fixture f;
    setup(&f);
    char why[2048];
    stof_status mha = mha_prepare_status(f.dir, why, sizeof why);
    ck_assert_msg(mha == STOF_OK, "attention does not compile here: %s", why);
    char *dec = path_in(f.dir, "decoder.json");
    write_file(dec, "{\"models\": {\"tiny\": {\"kind\": \"decoder\", \"hidden\": 256,"
                    " \"heads\": 4, \"kv_heads\": 1, \"ffn_hidden\": 512, \"qkv_bias\": true}},"
                    " \"cases\": [{\"model\": \"tiny\", \"batch\": 1, \"seq\": [77],"
                    " \"dtype\": \"bf16\", \"masks\": [\"causal_window:16\"]}]}\n");
    char *out;
    int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --decoder "
                     "'b=1,s=77,hidden=256,h=4,kv=1,ffn=512,bf16,causal' '%s'",
                     test_build_path("stof-warm"), f.cache, dec);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "stof-warm: 2 cases (0 attention, 0 layer, 2 decoder, 0 layernorm)"),
                  "%s", out);
    ck_assert_int_eq(count_of(out, " failed"), 0);
    ck_assert_int_eq(count_of(out, " tuned"), 0);
    ck_assert_int_ge(count_of(out, " compiled"), 1);
    ck_assert_int_gt(kernels_in(f.cache, "gemm"), 0);
    ck_assert_int_gt(kernels_in(f.cache, "rope"), 0);
    ck_assert_int_gt(kernels_in(f.cache, "swiglu"), 0);
    ck_assert_int_gt(kernels_in(f.cache, "mha"), 0);
    free(out);
    rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --quiet --decoder "
                 "'b=1,s=77,hidden=256,h=4,kv=1,ffn=512,bf16,causal' '%s'",
                 test_build_path("stof-warm"), f.cache, dec);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_int_eq(count_of(out, " cache hit"), 2);
    ck_assert_ptr_nonnull(strstr(out, "NVRTC: 0 kernels"));
    free(out);
    free(dec);
    teardown(&f);
}
END_TEST

/* Decoding steps from --decode lines and from a file's "decode" suites,
 * compiled for sm_90a with no GPU: the step kernel and its combine land in
 * the cache under op decode; the window and the cache length are run-time
 * values, so every case after the first finds them there. */
START_TEST(test_decode_compile_only)
{
    fixture f;
    setup(&f);
    char why[2048];
    stof_status mha = mha_prepare_status(f.dir, why, sizeof why);
    ck_assert_msg(mha == STOF_OK, "attention does not compile here: %s", why);
    char *dec = path_in(f.dir, "decode.json");
    write_file(dec, "{\"decode\": [{\"name\": \"tiny\", \"batch\": [1, 4], \"cache\": [100, 333],"
                    " \"heads\": 4, \"kv_heads\": 2, \"head_dim\": 64, \"dtype\": \"bf16\","
                    " \"masks\": {\"causal\": \"causal\", \"window\": \"causal_window:32\"}}]}\n");
    char *out;
    int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --decode "
                     "'b=2,h=4,kv=2,d=64,cache=77,bf16,causal' '%s'",
                     test_build_path("stof-warm"), f.cache, dec);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "stof-warm: 9 cases (0 attention, 0 layer, 0 decoder, 0 layernorm, "
                              "9 decode)"), "%s", out);
    ck_assert_msg(strstr(out, "tiny/window/b=4,cache=333"), "%s", out);
    ck_assert_int_eq(count_of(out, " failed"), 0);
    ck_assert_int_eq(count_of(out, " compiled"), 1);
    ck_assert_int_eq(count_of(out, " cache hit"), 8);
    ck_assert_int_eq(kernels_in(f.cache, "decode"), 2);
    free(out);
    free(dec);
    teardown(&f);
}
END_TEST

/* n LayerNorm cases of distinct widths, so each needs its own kernel. */
static char *ln_args(int n)
{
    size_t cap = (size_t)n * 48 + 1, at = 0;
    char *s = malloc(cap);
    s[0] = 0;
    for (int i = 0; i < n; i++)
        at += (size_t)snprintf(s + at, cap - at, " --ln rows=8,hidden=%d,fp16", 64 * (i + 1));
    return s;
}

START_TEST(test_jobs_share_cases)
{
    fixture f;
    setup(&f);
    char *args = ln_args(8), *out;
    int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --jobs 3 %s",
                test_build_path("stof-warm"), f.cache, args);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_int_eq(count_of(out, " compiled"), 8);
    ck_assert_int_eq(count_of(out, " cache hit"), 0);
    ck_assert_ptr_nonnull(strstr(out, "3 workers"));
    /* Each case done exactly once. */
    for (int i = 0; i < 8; i++) {
        char name[64];
        snprintf(name, sizeof name, "ln rows=8,hidden=%d,fp16: compiled", 64 * (i + 1));
        ck_assert_msg(occurrences(out, name) == 1, "%s: %d times in\n%s", name,
                      occurrences(out, name), out);
    }
    ck_assert_int_eq(kernels_in(f.cache, "layernorm"), 8);
    free(out);
    /* --devices makes a worker per ordinal; compiling only, they share the arch. */
    rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --devices 0,1 %s",
            test_build_path("stof-warm"), f.cache, args);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_int_eq(count_of(out, " cache hit"), 8);
    ck_assert_ptr_nonnull(strstr(out, "2 workers"));
    free(out);
    free(args);
    teardown(&f);
}
END_TEST

START_TEST(test_interrupt_and_resume)
{
    fixture f;
    setup(&f);
    char *args = ln_args(40), *log = path_in(f.dir, "log"), *out;
    /* Interrupt as soon as the first case is reported. */
    int rc = test_sh(&out,
                "%s --cache '%s' --arch sm_90a --compile-only %s > '%s' 2>&1 & pid=$!; i=0;"
                " while ! grep -q '^\\[1/40\\]' '%s' && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done;"
                " kill -INT $pid; wait $pid; echo \"rc=$?\"; cat '%s'",
                test_build_path("stof-warm"), f.cache, args, log, log, log);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(strstr(out, "rc=130"), "not interrupted:\n%s", out);
    ck_assert_ptr_nonnull(strstr(out, "interrupted"));
    int done = count_of(out, " compiled"), not_run = count_of(out, " not run");
    ck_assert_int_ge(done, 1);
    ck_assert_int_eq(done + not_run, 40);
    ck_assert_int_gt(not_run, 0);
    ck_assert_int_eq(kernels_in(f.cache, "layernorm"), done);
    free(out);
    /* The second run finds the finished cases and does the rest. */
    rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --quiet %s",
            test_build_path("stof-warm"), f.cache, args);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_int_eq(count_of(out, " cache hit"), done);
    ck_assert_int_eq(count_of(out, " compiled"), 40 - done);
    ck_assert_int_eq(kernels_in(f.cache, "layernorm"), 40);
    free(out);
    free(log);
    free(args);
    teardown(&f);
}
END_TEST

START_TEST(test_terminal_progress)
{
    fixture f;
    setup(&f);
    char *out;
    if (test_sh(&out, "command -v script") != 0) {
        printf("test_warm: no `script` here: terminal progress not tested\n");
        free(out);
        teardown(&f);
        return;
    }
    free(out);
    int rc = test_sh(&out, "script -qec \"%s --cache '%s' --arch sm_90a --compile-only"
                      " --ln rows=8,hidden=64 --ln rows=8,hidden=128\" /dev/null",
                test_build_path("stof-warm"), f.cache);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    /* One updating line: carriage returns and erase-line, no "[1/2] ...: compiled" lines. */
    ck_assert_ptr_nonnull(strstr(out, "\r\033[K[1/2]"));
    ck_assert_ptr_nonnull(strstr(out, "elapsed"));
    ck_assert_ptr_null(strstr(out, ": compiled (1 kernel"));
    ck_assert_int_eq(count_of(out, " compiled"), 2);
    free(out);
    teardown(&f);
}
END_TEST

START_TEST(test_no_gpu_needs_arch)
{
    fixture f;
    setup(&f);
    char *out;
    int rc = test_sh(&out, "%s --cache '%s' --ln rows=8,hidden=64", test_build_path("stof-warm"), f.cache);
    ck_assert_msg(rc == 2, "rc %d:\n%s", rc, out);
    ck_assert_ptr_nonnull(strstr(out, "no GPU"));
    ck_assert_ptr_nonnull(strstr(out, "--arch"));
    ck_assert(!exists(f.cache));
    free(out);
    rc = test_sh(&out, "%s --cache '%s' --compile-only --ln rows=8,hidden=64", test_build_path("stof-warm"),
            f.cache);
    ck_assert_int_eq(rc, 2);
    ck_assert(!exists(f.cache));
    free(out);
    /* --arch alone, with no GPU, compiles only and says so. */
    rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --ln rows=8,hidden=64", test_build_path("stof-warm"),
            f.cache);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_ptr_nonnull(strstr(out, "no GPU here: compiling only, for sm_90a"));
    ck_assert_int_eq(count_of(out, " compiled"), 1);
    free(out);
    teardown(&f);
}
END_TEST

typedef struct bad_run {
    const char *args, *what;
} bad_run;

static const bad_run BAD_RUNS[] = {
    {"'{D}/nothere.json'", "nothere.json: cannot open the workload file"},
    {"'{D}/syntax.json'", "syntax.json:2:16: $.suites[0]: expected a member name"},
    {"'{D}/field.json'", "field.json:1:97: $.suites[0].seq[1]: expected an integer"},
    {"'{D}/mask.json'", "$.suites[0].masks.w"},
    {"--mha 'b=1,h=1,l=64,d=64,bogus:3'", "bogus"},
    {"--mha 'b=1,h=1,d=64'", "missing l="},
    {"--ln 'rows=8'", "missing hidden="},
    {"--arch sm_xx --ln rows=8,hidden=64", "sm_xx"},
    {"--tune bogus --ln rows=8,hidden=64", "--tune wants off, fast or full"},
    {"--jobs 0 --ln rows=8,hidden=64", "--jobs wants a number"},
    {"--devices 0,0 --ln rows=8,hidden=64", "lists 0 twice"},
    {"--devices x --ln rows=8,hidden=64", "--devices wants GPU ordinals"},
    {"--devices 1, --ln rows=8,hidden=64", "--devices wants GPU ordinals"},
    {"--frobnicate --ln rows=8,hidden=64", "unknown option \"--frobnicate\""},
    {"", "nothing to warm"},
    {"--ln rows=8,hidden=64 --mha", "--mha needs a value"},
    {"--decoder 'b=1,s=64,hidden=512,h=8,ffn=1376,window:16'", "a decoder layer's mask is causal"},
    {"--decoder 'b=1,s=64,hidden=512,h=8,kv=3,ffn=1376'", "kv=3 does not divide h=8"},
    {"--decoder 'b=1,s=64,hidden=512,h=8'", "missing ffn="},
    {"--ln rows=8,hidden=64 --decoder", "--decoder needs a value"},
    {"--decode 'b=1,h=8,d=64,cache=64,window:16'", "a decoding step's mask is causal"},
    {"--decode 'b=1,h=8,d=64,cache=3,new=4'", "cache=3 must be new (4)"},
    {"--decode 'b=1,h=8,d=64'", "missing cache="},
    /* Issue 58: what attention does not support is refused as the line is
     * read, naming the field, not case by case after the workers start; an
     * empty --cache is bad input, not a missing GPU. */
    {"--mha 'b=1,h=1,l=16777216,d=64'", "l=16777216 is not supported"},
    {"--mha 'b=1,h=1,lq=4194241,lk=64,d=64'", "lq=4194241 is not supported"},
    {"--mha 'b=1,h=1,l=64,d=1024'", "d=1024 is not supported"},
    {"--mha 'b=1,h=1,l=64,d=100'", "head_dim 32, 64, 80, 96 or 128"},
    {"--mha 'b=1048576,h=1,l=64,d=64'", "b=1048576 x h=1 is not supported"},
    {"--mha 'b=1,h=1,l=64,d=64,fp32'", "dtype fp32 is not supported"},
    {"--cache '' --ln rows=8,hidden=64", "--cache needs a path"},
    {"--quiet=yes --ln rows=8,hidden=64", "--quiet takes no value"},
};

static void write_bad_files(const char *dir)
{
    char *p = path_in(dir, "syntax.json");
    write_file(p, "{\"suites\": [\n  {\"name\": \"x\",, }]}");
    free(p);
    p = path_in(dir, "field.json");
    write_file(p, "{\"suites\": [{\"name\": \"s\", \"batch\": 1, \"heads\": 2, \"head_dim\": 64,"
                  " \"dtype\": \"fp16\", \"seq\": [128, -3], \"masks\": [\"dense\"]}]}");
    free(p);
    p = path_in(dir, "mask.json");
    write_file(p, "{\"suites\": [{\"name\": \"s\", \"batch\": 1, \"heads\": 2, \"head_dim\": 64,"
                  " \"dtype\": \"fp16\", \"seq\": [128], \"masks\": {\"w\": \"window:3\"}}]}");
    free(p);
}

/* args with {D} replaced by dir. */
static char *expand_dir(const char *args, const char *dir)
{
    char *out = malloc(strlen(args) + 4 * strlen(dir) + 1), *o = out;
    for (const char *a = args; *a;) {
        if (strncmp(a, "{D}", 3) == 0) {
            o += sprintf(o, "%s", dir);
            a += 3;
        } else {
            *o++ = *a++;
        }
    }
    *o = 0;
    return out;
}

START_TEST(test_bad_input)
{
    const bad_run *b = &BAD_RUNS[_i];
    fixture f;
    setup(&f);
    write_bad_files(f.dir);
    char *args = expand_dir(b->args, f.dir), *out;
    int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only %s", test_build_path("stof-warm"),
                f.cache, args);
    ck_assert_msg(rc == 2, "[%s] rc %d:\n%s", args, rc, out);
    ck_assert_msg(strstr(out, b->what), "[%s] wanted \"%s\" in:\n%s", args, b->what, out);
    ck_assert_msg(!exists(f.cache), "[%s] created the cache", args);
    ck_assert_msg(!strstr(out, "case (") && !strstr(out, "cases ("), "[%s] started:\n%s", args,
                  out);
    ck_assert_msg(!strstr(out, "no GPU"), "[%s] blamed the GPU:\n%s", args, out);
    free(out);
    free(args);
    teardown(&f);
}
END_TEST

static void make_db(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

START_TEST(test_bad_caches)
{
    fixture f;
    setup(&f);
    struct { const char *name, *what; } files[] = {
        {"text.db", "not a SQLite database"},
        {"foreign.db", "not a stof cache"},
        {"newer.db", "newer than this stof"},
    };
    char *p = path_in(f.dir, "text.db");
    write_file(p, "this is no database, just text that is longer than a header\n");
    free(p);
    p = path_in(f.dir, "foreign.db");
    make_db(p, "CREATE TABLE notes (x TEXT); INSERT INTO notes VALUES ('mine');");
    free(p);
    p = path_in(f.dir, "newer.db");
    make_db(p, "CREATE TABLE kernels (key TEXT); PRAGMA user_version = 99;");
    free(p);
    for (int i = 0; i < 3; i++) {
        p = path_in(f.dir, files[i].name);
        size_t n0, n1;
        char *before = test_slurp(p, &n0), *out;
        int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --ln rows=8,hidden=64",
                    test_build_path("stof-warm"), p);
        ck_assert_msg(rc == 2, "%s: rc %d:\n%s", files[i].name, rc, out);
        ck_assert_msg(strstr(out, files[i].what), "%s:\n%s", files[i].name, out);
        char *after = test_slurp(p, &n1);
        ck_assert_msg(n0 == n1 && memcmp(before, after, n0) == 0, "%s was changed", files[i].name);
        free(before);
        free(after);
        free(out);
        free(p);
    }
    teardown(&f);
}
END_TEST

static long long file_size(const char *path)
{
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return (long long)st.st_size;
}

/* A cache that cannot grow (the file size limit of the process, a real
 * EFBIG from write(2) with SIGXFSZ ignored): the kernels compile but are
 * not kept, so their cases fail and the run exits 1. */
START_TEST(test_unstored_cases_fail)
{
    fixture f;
    setup(&f);
    char *out;
    int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --quiet"
                     " --ln rows=8,hidden=32", test_build_path("stof-warm"), f.cache);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    free(out);
    /* The file as it is and 8 kB more (ulimit -f counts 512-byte blocks). */
    long long blocks = file_size(f.cache) / 512 + 16;
    char *args = ln_args(4);
    rc = test_sh(&out, "trap '' XFSZ; ulimit -f %lld && exec %s --cache '%s' --arch sm_90a"
                 " --compile-only %s", blocks, test_build_path("stof-warm"), f.cache, args);
    ck_assert_msg(rc == 1, "rc %d:\n%s", rc, out);
    int failed = count_of(out, " failed"), compiled = count_of(out, " compiled");
    ck_assert_int_ge(failed, 1);
    ck_assert_int_eq(failed + compiled, 4);
    ck_assert_msg(strstr(out, "cache write") && strstr(out, "not kept"), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "NVRTC: 4 kernels"));
    /* Every case whose kernel is not in the cache was reported failed. */
    int stored = kernels_in(f.cache, "layernorm") - 1;
    ck_assert_int_ge(failed, 4 - stored);
    free(out);
    free(args);
    teardown(&f);
}
END_TEST

/* Garbage on page 2 (the kernels' table) of a cache that opens: the first
 * lookup finds it, the workers stop, and the run refuses as it would at
 * open, naming stof-dump recover, with exit status 2. */
START_TEST(test_damaged_during_run)
{
    fixture f;
    setup(&f);
    char *args = ln_args(4), *out;
    int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --quiet %s",
                     test_build_path("stof-warm"), f.cache, args);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    free(out);
    FILE *fp = fopen(f.cache, "r+b");
    ck_assert_ptr_nonnull(fp);
    char junk[4096];
    memset(junk, 0xa5, sizeof junk);
    ck_assert_int_eq(fseek(fp, 4096, SEEK_SET), 0);
    ck_assert_uint_eq(fwrite(junk, 1, sizeof junk, fp), sizeof junk);
    fclose(fp);
    rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --jobs 2 %s",
                 test_build_path("stof-warm"), f.cache, args);
    ck_assert_msg(rc == 2, "rc %d:\n%s", rc, out);
    ck_assert_int_ge(count_of(out, " failed"), 1);
    ck_assert_int_eq(count_of(out, " cache hit"), 0);
    ck_assert_msg(strstr(out, "stopped") && strstr(out, "damaged") &&
                  strstr(out, "recover NEW.db") && strstr(out, "put NEW.db in the cache's place"),
                  "%s", out);
    free(out);
    free(args);
    teardown(&f);
}
END_TEST

/* One case is "1 case", one worker "1 worker". */
START_TEST(test_one_case)
{
    fixture f;
    setup(&f);
    char *out;
    int rc = test_sh(&out, "%s --cache '%s' --arch sm_90a --compile-only --ln rows=8,hidden=64",
                     test_build_path("stof-warm"), f.cache);
    ck_assert_msg(rc == 0, "rc %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "stof-warm: 1 case (0 attention, 0 layer, 0 decoder, 1 layernorm)") &&
                      strstr(out, "; 1 worker; cache "),
                  "%s", out);
    ck_assert_ptr_null(strstr(out, "1 cases"));
    ck_assert_ptr_nonnull(strstr(out, "stof-warm: 1 case in "));
    free(out);
    teardown(&f);
}
END_TEST

START_TEST(test_help)
{
    char *out;
    int rc = test_sh(&out, "%s --help", test_build_path("stof-warm"));
    ck_assert_int_eq(rc, 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: stof-warm"));
    ck_assert_ptr_nonnull(strstr(out, "--compile-only"));
    free(out);
}
END_TEST

Suite *suite_warm(void)
{
    Suite *s = suite_create("warm");
    TCase *tc = tcase_create("warm");
    tcase_add_test(tc, test_compile_only);
    tcase_add_test(tc, test_decoder_compile_only);
    tcase_add_test(tc, test_decode_compile_only);
    tcase_add_test(tc, test_jobs_share_cases);
    tcase_add_test(tc, test_interrupt_and_resume);
    tcase_add_test(tc, test_terminal_progress);
    tcase_add_test(tc, test_no_gpu_needs_arch);
    tcase_add_loop_test(tc, test_bad_input, 0, (int)(sizeof BAD_RUNS / sizeof BAD_RUNS[0]));
    tcase_add_test(tc, test_bad_caches);
    tcase_add_test(tc, test_unstored_cases_fail);
    tcase_add_test(tc, test_damaged_during_run);
    tcase_add_test(tc, test_one_case);
    tcase_add_test(tc, test_help);
    suite_add_tcase(s, tc);
    return s;
}
