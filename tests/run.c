/*
 * The test runner: every CPU suite always; the GPU suites only when a GPU is
 * usable, and it says aloud when they were left out and why. Each suite runs
 * in a process of its own, several side by side (STOF_TEST_JOBS), and its
 * output is printed whole in file order, closed by its check count and its
 * times; the run closes with its wall time and "N passed, N failed".
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <ftw.h>
#include <sqlite3.h>
#include <pthread.h>

#include "base/half.h"
#include "ctx.h"
#include "stof.h"
#include "testutil.h"

#define SUITE(n) Suite *suite_##n(void);
#define GPU_SUITE(n) Suite *suite_##n(void);
#include "suites.inc"
#undef SUITE
#undef GPU_SUITE

static uint64_t g_seed;
static int g_gpu;

uint64_t test_seed(void) { return g_seed; }
int test_have_gpu(void) { return g_gpu; }

test_rng test_rng_make(uint64_t salt)
{
    test_rng r = {g_seed ^ (salt * 0x9e3779b97f4a7c15ull)};
    if (r.s == 0)
        r.s = 0x2545f4914f6cdd1dull;
    return r;
}

uint64_t test_rng_next(test_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

double test_rng_uniform(test_rng *r) { return (test_rng_next(r) >> 11) * 0x1.0p-53; }

int test_rng_int(test_rng *r, int lo, int hi)
{
    return lo + (int)(test_rng_next(r) % (uint64_t)(hi - lo + 1));
}

char *test_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *p = NULL;
    if (asprintf(&p, "%s/stof-test-XXXXXX", base && *base ? base : "/tmp") < 0)
        return NULL;
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

void test_rmtree(const char *path)
{
    if (path)
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void test_copy_file(const char *from, const char *to)
{
    size_t n = 0;
    char *data = test_slurp(from, &n);
    struct stat st;
    ck_assert_int_eq(stat(from, &st), 0);
    FILE *f = fopen(to, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", to);
    ck_assert_int_eq(fchmod(fileno(f), st.st_mode & 07777), 0);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
    free(data);
}

const char *test_kernels_dir(void)
{
    static char dir[1024];
    if (!dir[0]) {
        const char *env = getenv("STOF_TEST_KERNELS");
        snprintf(dir, sizeof dir, "%s", env && *env ? env : test_build_path("test-kernels"));
    }
    return dir;
}

const char *test_kernel_cache(void)
{
    static char path[1024 + 16];
    if (!path[0])
        snprintf(path, sizeof path, "%s/cache.db", test_kernels_dir());
    return path;
}

long long test_sql_int(const char *path, const char *query)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    ck_assert_msg(sqlite3_prepare_v2(db, query, -1, &s, NULL) == SQLITE_OK, "%s: %s", query,
                  sqlite3_errmsg(db));
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    long long v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

int test_run(const char *cmd, char **output)
{
    char *full = NULL;
    if (asprintf(&full, "(%s) 2>&1", cmd) < 0)
        return -1;
    FILE *p = popen(full, "r");
    free(full);
    if (!p)
        return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 2048) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; }
            else buf = nb;
        }
    }
    int st = pclose(p);
    if (buf)
        buf[n] = 0;
    if (output)
        *output = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int test_on_threads(void *(*fn)(void *), void *arg)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
    pthread_t th[8];
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, fn, arg), 0);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    return n;
}

int test_take(pthread_mutex_t *lock, int *next, int n)
{
    pthread_mutex_lock(lock);
    int i = *next < n ? (*next)++ : -1;
    pthread_mutex_unlock(lock);
    return i;
}

int test_ptx_global(const char *ptx, char *line, size_t n)
{
    for (const char *l = ptx; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        const char *t = l;
        if (!strncmp(t, ".visible ", 9) || !strncmp(t, ".weak ", 6))
            t = strchr(t, ' ') + 1;
        if (strncmp(t, ".global ", 8) && strncmp(t, ".const ", 7))
            continue;
        const char *end = strchr(l, '\n');
        snprintf(line, n, "%.*s", (int)(end ? end - l : (long)strlen(l)), l);
        return 1;
    }
    return 0;
}

char *test_slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            buf = realloc(buf, cap *= 2);
            ck_assert_ptr_nonnull(buf);
        }
    }
    fclose(f);
    *n = len;
    return buf;
}

int test_sh(char **out, const char *fmt, ...)
{
    char *cmd = NULL;
    va_list ap;
    va_start(ap, fmt);
    ck_assert_int_ge(vasprintf(&cmd, fmt, ap), 0);
    va_end(ap);
    int rc = test_run(cmd, out);
    ck_assert_ptr_nonnull(*out);
    free(cmd);
    return rc;
}

const char *test_build_path(const char *name)
{
    static char path[4][1024];
    static int next;
    const char *b = getenv("STOF_BUILD");
    char *p = path[next++ & 3];
    snprintf(p, sizeof path[0], "%s/%s", b && *b ? b : "build", name);
    return p;
}

stof_ctx *test_open_in(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/cache.db", dir);
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.cache_path = path}), STOF_OK);
    return ctx;
}

CUdeviceptr test_upload(stof_ctx *ctx, const void *host, size_t bytes)
{
    CUdeviceptr p = 0;
    ck_assert_int_eq(jit_push(ctx), STOF_OK);
    ck_assert_int_eq(CU(ctx, MemAlloc(&p, bytes)), STOF_OK);
    if (host)
        ck_assert_int_eq(CU(ctx, MemcpyHtoD(p, host, bytes)), STOF_OK);
    else
        ck_assert_int_eq(CU(ctx, MemsetD8(p, 0xff, bytes)), STOF_OK);
    jit_pop(ctx);
    return p;
}

void test_fill_uniform(test_rng *r, stof_dtype t, void *p, size_t n, double offset, double scale)
{
    for (size_t i = 0; i < n; i++)
        dtype_store(t, p, i, offset + scale * (test_rng_uniform(r) * 2 - 1));
}

double test_rel_l2(stof_dtype t, const void *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = dtype_load(t, got, i);
        if (isnan(x) || isinf(x))
            return INFINITY;
        num += (x - ref[i]) * (x - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* The suites in file order (build/gen/suites.inc), the order their output
 * is printed in. */
typedef struct suite_entry {
    const char *name;
    Suite *(*make)(void);
    int gpu;
} suite_entry;

static const suite_entry SUITES[] = {
#define SUITE(n) {#n, suite_##n, 0},
#define GPU_SUITE(n) {#n, suite_##n, 1},
#include "suites.inc"
#undef SUITE
#undef GPU_SUITE
};
#define NSUITES (int)(sizeof SUITES / sizeof SUITES[0])

/* The suites whose NVRTC compiles take most of a run, longest first: they
 * start first, and the short suites fill the other cores meanwhile. */
static const char *const HEAVY[] = {"attn", "gemm", "nvrtc", "warm", "remote", "layer", "tools"};

/* One suite's run: its output is kept aside and printed whole, in file
 * order, so that suites run side by side still read as one log. */
typedef struct suite_run {
    const suite_entry *e;
    pid_t pid;
    FILE *out;
    int res;                    /* read end of the pipe its counts come through */
    double t0, wall, cpu;
    int counts[3];              /* checks, failures, errors */
    int started, done;
    char why[96];               /* how its process ended, when not by itself */
} suite_run;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu_s(const struct rusage *r)
{
    return r->ru_utime.tv_sec + r->ru_utime.tv_usec * 1e-6 + r->ru_stime.tv_sec +
           r->ru_stime.tv_usec * 1e-6;
}

/* Runs one suite as Check does (each test in a forked process unless
 * CK_FORK=no) and counts its checks, failures and errors. */
static void run_suite(const suite_entry *e, int counts[3])
{
    SRunner *sr = srunner_create(e->make());
    srunner_run_all(sr, CK_NORMAL);
    counts[0] = srunner_ntests_run(sr);
    counts[1] = counts[2] = 0;
    TestResult **r = srunner_results(sr);
    for (int i = 0; r && i < counts[0]; i++) {
        counts[1] += tr_rtype(r[i]) == CK_FAILURE;
        counts[2] += tr_rtype(r[i]) == CK_ERROR;
    }
    free(r);
    srunner_free(sr);
}

/* Starts r's suite in a child whose stdout and stderr go to a temporary file. */
static void start_suite(suite_run *r)
{
    int fd[2];
    r->out = tmpfile();
    if (!r->out || pipe(fd) != 0) {
        snprintf(r->why, sizeof r->why, "could not start: %s", strerror(errno));
        r->done = 1;
        return;
    }
    fflush(stdout);
    fflush(stderr);
    r->t0 = now_s();
    r->started = 1;
    r->pid = fork();
    if (r->pid == 0) {
        close(fd[0]);
        dup2(fileno(r->out), STDOUT_FILENO);
        dup2(fileno(r->out), STDERR_FILENO);
        int counts[3];
        run_suite(r->e, counts);
        fflush(stdout);
        ssize_t w = write(fd[1], counts, sizeof counts);
        _exit(w == (ssize_t)sizeof counts ? 0 : 1);
    }
    close(fd[1]);
    r->res = fd[0];
    if (r->pid < 0) {
        snprintf(r->why, sizeof r->why, "could not fork: %s", strerror(errno));
        close(r->res);
        r->done = 1;
    }
}

/* Takes the counts of r's ended child; a child that died before sending
 * them counts as one error. */
static void end_suite(suite_run *r, int status, const struct rusage *ru)
{
    r->wall = now_s() - r->t0;
    r->cpu = cpu_s(ru);
    ssize_t n = read(r->res, r->counts, sizeof r->counts);
    close(r->res);
    if (n != (ssize_t)sizeof r->counts || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (WIFSIGNALED(status))
            snprintf(r->why, sizeof r->why, "its process died of signal %d", WTERMSIG(status));
        else
            snprintf(r->why, sizeof r->why, "its process exited with status %d",
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        if (n != (ssize_t)sizeof r->counts) {   /* its tests uncounted: one lost check */
            memset(r->counts, 0, sizeof r->counts);
            r->counts[0] = 1;
        }
        r->counts[2]++;
    }
    r->done = 1;
}

/* Its output, then a line with its name, check count and times. */
static void print_suite(suite_run *r)
{
    if (r->out) {
        char buf[8192];
        size_t n;
        rewind(r->out);
        while ((n = fread(buf, 1, sizeof buf, r->out)) > 0)
            fwrite(buf, 1, n, stdout);
        fclose(r->out);
        r->out = NULL;
    }
    if (r->why[0])
        printf("stof tests: suite %s: %s\n", r->e->name, r->why);
    printf("stof tests: suite %s: %d checks, %d failed in %.1f s (CPU %.1f s)\n", r->e->name,
           r->counts[0], r->counts[1] + r->counts[2], r->wall, r->cpu);
    fflush(stdout);
}

static int heaviness(const char *name)
{
    for (int i = 0; i < (int)(sizeof HEAVY / sizeof HEAVY[0]); i++)
        if (strcmp(HEAVY[i], name) == 0)
            return (int)(sizeof HEAVY / sizeof HEAVY[0]) - i;
    return 0;
}

/* Runs the n suites of runs[], at most jobs at a time, printing each in
 * order as soon as it and all before it have ended. The heavy CPU suites
 * start first; a GPU suite runs alone, so no compile competes with its
 * timings. */
static void run_all(suite_run *runs, int n, int jobs)
{
    int order[NSUITES], m = 0;
    for (int h = (int)(sizeof HEAVY / sizeof HEAVY[0]); h >= 0; h--)
        for (int i = 0; i < n; i++)
            if (!runs[i].e->gpu && heaviness(runs[i].e->name) == h)
                order[m++] = i;
    for (int i = 0; i < n; i++)
        if (runs[i].e->gpu)
            order[m++] = i;
    int next = 0, running = 0, printed = 0;
    while (printed < n) {
        while (next < n && running < jobs) {
            suite_run *r = &runs[order[next]];
            if (r->e->gpu && running > 0)
                break;
            next++;
            start_suite(r);
            running += r->started && !r->done;
            if (r->e->gpu)
                break;
        }
        if (running > 0) {
            int status = 0;
            struct rusage ru;
            pid_t pid = wait4(-1, &status, 0, &ru);
            if (pid < 0 && errno == EINTR)
                continue;
            for (int i = 0; i < n; i++)
                if (runs[i].started && !runs[i].done && runs[i].pid == pid) {
                    end_suite(&runs[i], status, &ru);
                    running--;
                }
            if (pid < 0)
                break;
        }
        while (printed < n && runs[printed].done)
            print_suite(&runs[printed++]);
    }
}

int main(void)
{
    double t0 = now_s();
    const char *s = getenv("STOF_SEED");
    g_seed = s && *s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("stof tests: seed %llu (set STOF_SEED to replay)\n", (unsigned long long)g_seed);

    /* Check's default of 4 s per test is too short for NVRTC. */
    setenv("CK_DEFAULT_TIMEOUT", "300", 0);

    /* Probe the GPU in a child: a parent that initialised CUDA would leave
     * Check's forked test processes unable to use it. */
    char why[1024] = "";
    int fd[2];
    if (pipe(fd) == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            close(fd[0]);
            stof_ctx *ctx = NULL;
            stof_options opt = {.no_cache = 1};
            int have = 0;
            char name[600] = "stof_open failed"; /* with no GPU, the name says why */
            if (stof_open(&ctx, &opt) == STOF_OK)
                stof_device_info(ctx, &have, NULL, 0, name, sizeof name);
            const char *msg = have ? "" : name;
            ssize_t w = write(fd[1], msg, strlen(msg));
            (void)w;
            _exit(have ? 0 : 1);
        }
        close(fd[1]);
        ssize_t n = read(fd[0], why, sizeof why - 1);
        why[n > 0 ? n : 0] = 0;
        close(fd[0]);
        int st = 0;
        waitpid(pid, &st, 0);
        g_gpu = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }

    /* The shared kernel cache's folder, writable by this user alone (the
     * cache refuses a looser one). */
    char kdir[1024];
    struct stat kst;
    snprintf(kdir, sizeof kdir, "%s", test_kernels_dir());
    int kept = stat(test_kernel_cache(), &kst) == 0;
    if (mkdir(kdir, 0700) != 0 && errno != EEXIST)
        printf("stof tests: cannot make %s: %s\n", kdir, strerror(errno));
    if (kept)
        printf("stof tests: the variant sweeps find %.0f MB of kernels in %s from earlier runs "
               "(remove %s to compile them afresh)\n",
               kst.st_size / 1e6, test_kernel_cache(), kdir);
    else
        printf("stof tests: the variant sweeps compile into %s, kept for later runs\n",
               test_kernel_cache());

    /* CK_RUN_SUITE picks one suite, as Check's own runner would. */
    const char *only = getenv("CK_RUN_SUITE");
    static suite_run runs[NSUITES];
    int n = 0, gpu_suites = 0;
    for (int i = 0; i < NSUITES; i++) {
        gpu_suites += SUITES[i].gpu;
        if ((!SUITES[i].gpu || g_gpu) && (!only || !*only || strcmp(only, SUITES[i].name) == 0))
            runs[n++] = (suite_run){.e = &SUITES[i]};
    }
    if (only && *only && n == 0)
        printf("stof tests: no suite here is named %s (CK_RUN_SUITE)\n", only);
    if (g_gpu)
        printf("stof tests: GPU present: running the %d GPU suites too\n", gpu_suites);
    else
        printf("stof tests: NO GPU: the %d GPU suites were NOT run (%s)\n", gpu_suites, why);

    /* Suites side by side, each in a process of its own: STOF_TEST_JOBS of
     * them, by default one per CPU (at most 8). CK_FORK=no runs them one
     * after another in this process, for a debugger. */
    const char *fork_env = getenv("CK_FORK"), *jobs_env = getenv("STOF_TEST_JOBS");
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int jobs = jobs_env && *jobs_env ? atoi(jobs_env) : cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
    jobs = jobs < 1 ? 1 : jobs;
    if (fork_env && strcmp(fork_env, "no") == 0) {
        jobs = 1;
        for (int i = 0; i < n; i++) {
            struct rusage a, b, ca, cb;
            getrusage(RUSAGE_SELF, &a);
            getrusage(RUSAGE_CHILDREN, &ca);
            runs[i].t0 = now_s();
            run_suite(runs[i].e, runs[i].counts);
            runs[i].wall = now_s() - runs[i].t0;
            getrusage(RUSAGE_SELF, &b);
            getrusage(RUSAGE_CHILDREN, &cb);
            runs[i].cpu = cpu_s(&b) - cpu_s(&a) + cpu_s(&cb) - cpu_s(&ca);
            runs[i].done = 1;
            print_suite(&runs[i]);
        }
    } else {
        if (n > 1 && jobs > 1)
            printf("stof tests: %d suites, %d at a time, the heavy ones first; each is printed "
                   "when it and those above it have ended\n", n, jobs < n ? jobs : n);
        run_all(runs, n, jobs);
    }

    /* The whole run, as Check sums one runner's suites (tools/gpu-check.sh
     * reads this line), then the times and the closing count. */
    int checks = 0, failures = 0, errors = 0;
    double cpu = 0;
    for (int i = 0; i < n; i++) {
        checks += runs[i].counts[0];
        failures += runs[i].counts[1];
        errors += runs[i].counts[2];
        cpu += runs[i].cpu;
    }
    int failed = failures + errors;
    printf("%d%%: Checks: %d, Failures: %d, Errors: %d\n",
           checks ? (int)(100.0 * (checks - failed) / checks) : 0, checks, failures, errors);
    if (!g_gpu)
        printf("stof tests: reminder: GPU suites left out; run tools/gpu-check.sh on a GPU machine\n");
    printf("stof tests: %d suite%s, %d at a time, in %.1f s (CPU %.1f s)\n", n, n == 1 ? "" : "s",
           jobs < n ? jobs : n, now_s() - t0, cpu);
    printf("%d passed, %d failed\n", checks - failed > 0 ? checks - failed : 0, failed);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
