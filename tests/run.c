/*
 * The test runner: every CPU suite always; the GPU suites only when a GPU is
 * usable, and it says aloud when they were left out and why.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <ftw.h>
#include <pthread.h>

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

int main(void)
{
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

    SRunner *sr = srunner_create(NULL);
    int gpu_suites = 0;
#define SUITE(n) srunner_add_suite(sr, suite_##n());
#define GPU_SUITE(n) if (g_gpu) srunner_add_suite(sr, suite_##n()); gpu_suites++;
#include "suites.inc"
#undef SUITE
#undef GPU_SUITE
    if (g_gpu)
        printf("stof tests: GPU present: running the %d GPU suites too\n", gpu_suites);
    else
        printf("stof tests: NO GPU: the %d GPU suites were NOT run (%s)\n", gpu_suites, why);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (!g_gpu)
        printf("stof tests: reminder: GPU suites left out; run tools/gpu-check.sh on a GPU machine\n");
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
