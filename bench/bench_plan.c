/*
 * bench_plan — what a plan costs to make. For each attention, layer or
 * decoding case of a workload file (default bench/workloads/attention.json;
 * layers in bench/workloads/layers.json), in a fresh process
 * each time: the cold plan (an empty cache: every candidate compiled, then
 * timed) and the cached plan (the cache the cold one filled); then the median
 * and the slowest of each per suite. Where there is no GPU the plan is a
 * compile-only stof_mha_prepare for sm_90a, so the compiling is what is
 * measured. A layer case is planned by stof_layer_tune (stof_layer_plan_create
 * without weights: the same search, records and loads), or stof_layer_prepare
 * with no GPU; a decoder layer by stof_decoder_tune (stof_decoder_prepare), and
 * a decoding step by stof_decode_plan_create (stof_decode_prepare): its two
 * kernels, no search (bench/workloads/llm.json's "decode" suites). The
 * threads that compile are $STOF_COMPILE_THREADS, else the online cores; the
 * Redis tier is left out so that cold means cold. A plan's time runs from an
 * open context (stof_open: the driver, the context and the
 * cache file, printed apart as "open ms") to the plan made: the mask parsed,
 * the plan created. The cached plan runs in CACHED_RUNS fresh processes, one
 * after another: a case's figure is their median, and their slowest is shown
 * beside it (a single process moved by 2-4 ms between runs on an H100
 * machine).
 *
 *   bench_plan [--workload FILE] [--only SUBSTRING]...
 *
 * A case runs as `bench_plan --child INDEX --cache PATH --workload FILE`,
 * which prints "plan MS COMPILES NVRTC_MS HITS OPEN_MS".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu/jit.h"
#include "tools/workload.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* One case in this process: open, plan (or prepare), report. */
static int child(const workload *w, int i, const char *cache)
{
    const workload_case *c = &w->cases[i];
    double t0 = now_ms();
    stof_ctx *ctx = NULL;
    stof_options o = {.cache_path = cache};
    int has = 0;
    stof_status st = stof_open(&ctx, &o);
    if (st == STOF_OK)
        st = stof_device_info(ctx, &has, NULL, 0, NULL, 0);
    if (st == STOF_OK && !has) {
        stof_close(ctx);
        o.arch = "sm_90a";
        st = stof_open(&ctx, &o);
    }
    double t1 = now_ms();
    stof_mask *m = NULL;
    if (st == STOF_OK && (c->op == WORKLOAD_MHA || c->op == WORKLOAD_LAYER))
        st = stof_mask_parse(ctx, c->mask, c->seq_q, c->seq_k, &m);
    if (st == STOF_OK) {
        if (c->op == WORKLOAD_LAYER) {
            stof_layer_desc d;
            workload_layer_desc(c, STOF_TUNE_DEFAULT, &d);
            st = has ? stof_layer_tune(ctx, &d, m) : stof_layer_prepare(ctx, &d, m);
        } else if (c->op == WORKLOAD_DECODER) {
            stof_decoder_desc d;
            workload_decoder_desc(c, STOF_TUNE_DEFAULT, &d);
            st = has ? stof_decoder_tune(ctx, &d) : stof_decoder_prepare(ctx, &d);
        } else if (c->op == WORKLOAD_DECODE) {
            stof_decode_desc d;
            workload_decode_desc(c, &d);
            stof_decode_plan *p = NULL;
            st = has ? stof_decode_plan_create(ctx, &d, &p) : stof_decode_prepare(ctx, &d);
            stof_decode_plan_free(p);
        } else {
            stof_mha_desc d;
            workload_mha_desc(c, STOF_TUNE_DEFAULT, &d);
            stof_mha_plan *p = NULL;
            st = has ? stof_mha_plan_create(ctx, &d, m, &p) : stof_mha_prepare(ctx, &d, m);
            stof_mha_plan_free(p);
        }
    }
    double ms = now_ms() - t1, open_ms = t1 - t0;
    stof_mask_free(m);
    if (st != STOF_OK) {
        fprintf(stderr, "bench_plan: %s: %s: %s\n", c->name, stof_status_str(st),
                ctx ? stof_last_error(ctx) : "no context");
        stof_close(ctx);
        return 1;
    }
    stof_stats s;
    stof_get_stats(ctx, &s);
    printf("plan %.2f %lld %.1f %lld %.1f\n", ms, (long long)s.nvrtc_compiles, s.nvrtc_ms,
           (long long)s.cache_hits, open_ms);
    stof_close(ctx);
    return 0;
}

#define CACHED_RUNS 5

typedef struct run_result {
    double ms, nvrtc_ms, open_ms;
    long long compiles, hits;
} run_result;

/* Runs case i in a fresh process of this program; 0 on success. */
static int run_child(const char *self, const char *file, int i, const char *cache, run_result *r)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char idx[16];
        snprintf(idx, sizeof idx, "%d", i);
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execl(self, self, "--child", idx, "--cache", cache, "--workload", file, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char line[256];
    int ok = 0;
    while (f && fgets(line, sizeof line, f))
        ok |= sscanf(line, "plan %lf %lld %lf %lld %lf", &r->ms, &r->compiles, &r->nvrtc_ms,
                     &r->hits, &r->open_ms) == 5;
    if (f)
        fclose(f);
    else
        close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* The cases that have a plan to time: attention, layers, decoding steps. */
static int planned(const workload_case *c)
{
    return c->op == WORKLOAD_MHA || c->op == WORKLOAD_LAYER || c->op == WORKLOAD_DECODER ||
           c->op == WORKLOAD_DECODE;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void summarize(const char *suite, double *cold, double *cached, int n)
{
    if (n == 0)
        return;
    qsort(cold, (size_t)n, sizeof *cold, cmp_double);
    qsort(cached, (size_t)n, sizeof *cached, cmp_double);
    printf("suite %-12s cases %2d  cold median %8.1f ms max %8.1f ms  cached median %7.2f ms max %7.2f ms\n",
           suite, n, cold[n / 2], cold[n - 1], cached[n / 2], cached[n - 1]);
}

int main(int argc, char **argv)
{
    const char *file = "bench/workloads/attention.json", *cache = NULL;
    const char *only[32];
    int nonly = 0, child_index = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--workload") == 0 && i + 1 < argc)
            file = argv[++i];
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc && nonly < 32)
            only[nonly++] = argv[++i];
        else if (strcmp(argv[i], "--child") == 0 && i + 1 < argc)
            child_index = atoi(argv[++i]);
        else if (strcmp(argv[i], "--cache") == 0 && i + 1 < argc)
            cache = argv[++i];
        else {
            fprintf(stderr, "usage: bench_plan [--workload FILE] [--only SUBSTRING]...\n");
            return 2;
        }
    }
    workload w = {0};
    char err[512];
    if (workload_read_file(&w, file, err, sizeof err) != 0) {
        fprintf(stderr, "bench_plan: %s\n", err);
        return 1;
    }
    if (child_index >= 0) {
        int rc = child_index < w.n && planned(&w.cases[child_index]) && cache
                     ? child(&w, child_index, cache)
                     : 2;
        workload_free(&w);
        return rc;
    }

    unsetenv("STOF_REMOTE_CACHE");
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
        fprintf(stderr, "bench_plan: cannot find its own program: %s\n", strerror(errno));
        return 1;
    }
    self[len] = 0;
    char tmpl[] = "/tmp/stof-bench-plan-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (!dir) {
        fprintf(stderr, "bench_plan: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    stof_ctx *ctx = NULL;
    stof_options o = {.no_cache = 1};
    int has = 0;
    char arch[32] = "sm_90a", name[128] = "no GPU";
    if (stof_open(&ctx, &o) == STOF_OK)
        stof_device_info(ctx, &has, arch, sizeof arch, name, sizeof name);
    stof_close(ctx);
    if (!has)
        snprintf(name, sizeof name, "no GPU");
    printf("bench_plan: %s (%s), %s, compile threads %d (online cores %ld)\n", name,
           has ? arch : "sm_90a", has ? "plans searched on the GPU" : "compile-only prepares",
           jit_compile_threads(1 << 20), sysconf(_SC_NPROCESSORS_ONLN));
    printf("%-44s %10s %8s %10s %10s %10s %8s\n", "case", "cold ms", "compiles", "nvrtc ms",
           "cached ms", "(slowest)", "open ms");

    double *cold = calloc((size_t)w.n + 1, sizeof *cold);
    double *cached = calloc((size_t)w.n + 1, sizeof *cached);
    double *all_cold = calloc((size_t)w.n + 1, sizeof *all_cold);
    int n = 0, nall = 0, failed = 0;
    char suite[128] = "";
    for (int i = 0; i < w.n && cold && cached && all_cold; i++) {
        const workload_case *c = &w.cases[i];
        int pick = planned(c) && nonly == 0;
        for (int k = 0; k < nonly && !pick; k++)
            pick = planned(c) && strstr(c->name, only[k]) != NULL;
        if (!pick)
            continue;
        char s[128];
        snprintf(s, sizeof s, "%.*s", (int)strcspn(c->name, "/"), c->name);
        if (strcmp(s, suite) != 0) {
            summarize(suite, cold, cached, n);
            snprintf(suite, sizeof suite, "%s", s);
            n = 0;
        }
        char path[4200];
        snprintf(path, sizeof path, "%s/case%d.db", dir, i);
        run_result a = {0}, b[CACHED_RUNS] = {{0}};
        int ok = run_child(self, file, i, path, &a) == 0;
        for (int k = 0; k < CACHED_RUNS && ok; k++)
            ok = run_child(self, file, i, path, &b[k]) == 0;
        if (!ok) {
            printf("%-44s failed (see above)\n", c->name);
            failed++;
        } else {
            double ms[CACHED_RUNS], open_ms[CACHED_RUNS];
            for (int k = 0; k < CACHED_RUNS; k++) {
                ms[k] = b[k].ms;
                open_ms[k] = b[k].open_ms;
            }
            qsort(ms, CACHED_RUNS, sizeof *ms, cmp_double);
            qsort(open_ms, CACHED_RUNS, sizeof *open_ms, cmp_double);
            printf("%-44s %10.1f %8lld %10.1f %10.2f %10.2f %8.1f\n", c->name, a.ms, a.compiles,
                   a.nvrtc_ms, ms[CACHED_RUNS / 2], ms[CACHED_RUNS - 1], open_ms[CACHED_RUNS / 2]);
            cold[n] = a.ms;
            cached[n++] = ms[CACHED_RUNS / 2];
            all_cold[nall++] = a.ms;
        }
        unlink(path);
        char side[4300];
        snprintf(side, sizeof side, "%s-wal", path);
        unlink(side);
        snprintf(side, sizeof side, "%s-shm", path);
        unlink(side);
    }
    summarize(suite, cold, cached, n);
    if (nall) {
        qsort(all_cold, (size_t)nall, sizeof *all_cold, cmp_double);
        printf("summary: %d cases on %d compile threads: cold plan median %.0f ms, max %.0f ms%s\n",
               nall, jit_compile_threads(1 << 20), all_cold[nall / 2], all_cold[nall - 1],
               failed ? " (some failed)" : "");
    }
    free(cold);
    free(cached);
    free(all_cold);
    rmdir(dir);
    workload_free(&w);
    return failed || !nall ? 1 : 0;
}
