/*
 * driver — runs a libFuzzer target without libFuzzer (gcc builds): replays
 * every file of the corpus folders (or files) it is given and, with -t
 * SECONDS, mutates them for that long: bit flips, bytes set, inserted and
 * deleted, runs repeated, truncation, splices of two inputs, words of a
 * dictionary (libFuzzer's format), numbers, and the target's own
 * LLVMFuzzerCustomMutator half the time when it has one. There is no
 * coverage feedback: it is the fallback where clang's libFuzzer is not to
 * be had, and the corpus replay that `make test` runs.
 *
 * Every input is handed over in a buffer of exactly its size, so ASan
 * catches a read past its end. On a sanitizer report, an abort or a fatal
 * signal, the input is written to ARTIFACTS/crash-TARGET-HASH first
 * (ARTIFACTS: $FUZZ_ARTIFACTS, else the current folder).
 *
 * usage: TARGET [-t SECONDS] [-seed N] [-dict FILE] [-max_len N] CORPUS...
 * Exit status: 0 no finding, 1 a finding (the process dies on one), 2 bad usage.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fuzz.h"

/* Weak: a target may define these (libFuzzer's optional hooks). */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
    __attribute__((weak));
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

typedef struct input {
    uint8_t *data;
    size_t size;
    char *name;
} input;

static input *g_corpus;
static size_t g_n, g_cap;
static char **g_dict;
static size_t *g_dict_len, g_ndict;
static const char *g_target = "fuzz";
static const uint8_t *g_current;   /* the input being run, for the crash file */
static size_t g_current_size;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545f4914f6cdd1dull;
}

static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* ---- crashes ---- */

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Only async-signal-safe calls: it may run in a signal handler. */
static void save_current(void)
{
    static int saved;
    if (saved || !g_current)
        return;
    saved = 1;
    char path[1024];
    const char *dir = getenv("FUZZ_ARTIFACTS");
    snprintf(path, sizeof path, "%s%scrash-%s-%016llx", dir && *dir ? dir : "",
             dir && *dir ? "/" : "", g_target,
             (unsigned long long)fnv(g_current, g_current_size));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return;
    size_t done = 0;
    while (done < g_current_size) {
        ssize_t w = write(fd, g_current + done, g_current_size - done);
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    close(fd);
    static const char msg[] = "driver: the input is saved as ";
    ssize_t r = write(2, msg, sizeof msg - 1);
    r = write(2, path, strlen(path));
    r = write(2, "\n", 1);
    (void)r;
}

static void on_signal(int sig)
{
    save_current();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* ---- the corpus and the dictionary ---- */

static void add_input(const uint8_t *data, size_t size, const char *name)
{
    if (g_n == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 64;
        g_corpus = realloc(g_corpus, g_cap * sizeof *g_corpus);
        if (!g_corpus) {
            perror("driver");
            exit(2);
        }
    }
    input *in = &g_corpus[g_n++];
    in->data = malloc(size ? size : 1);
    memcpy(in->data, data, size);
    in->size = size;
    in->name = strdup(name);
}

static int read_file(const char *path, uint8_t **data, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 4096, n = 0, got;
    uint8_t *b = malloc(cap);
    while (b && (got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap)
            b = realloc(b, cap *= 2);
    }
    fclose(f);
    if (!b)
        return -1;
    *data = b;
    *size = n;
    return 0;
}

static void load(const char *path, size_t max_len)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "driver: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        char **names = NULL;
        size_t n = 0;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.')
                continue;
            names = realloc(names, (n + 1) * sizeof *names);
            if (asprintf(&names[n], "%s/%s", path, e->d_name) < 0)
                exit(2);
            n++;
        }
        if (d)
            closedir(d);
        /* A fixed order: the same replay on every machine. */
        for (size_t i = 0; i + 1 < n; i++)
            for (size_t j = i + 1; j < n; j++)
                if (strcmp(names[i], names[j]) > 0) {
                    char *t = names[i];
                    names[i] = names[j];
                    names[j] = t;
                }
        for (size_t i = 0; i < n; i++) {
            load(names[i], max_len);
            free(names[i]);
        }
        free(names);
        return;
    }
    uint8_t *data;
    size_t size;
    if (read_file(path, &data, &size) != 0) {
        fprintf(stderr, "driver: cannot read %s\n", path);
        exit(2);
    }
    add_input(data, size < max_len ? size : max_len, path);
    free(data);
}

static int hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* libFuzzer's dictionary format: name="word" or "word" a line, \\, \" and \xNN. */
static void load_dict(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "driver: cannot read the dictionary %s\n", path);
        exit(2);
    }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char *q = strchr(line, '"');
        if (!q || line[strspn(line, " \t")] == '#')
            continue;
        char *end = strrchr(line, '"');
        if (end == q)
            continue;
        char word[4096];
        size_t n = 0;
        for (char *p = q + 1; p < end; p++) {
            if (*p == '\\' && p + 1 < end) {
                p++;
                if (*p == 'x' && p + 2 < end && hexval(p[1]) >= 0 && hexval(p[2]) >= 0) {
                    word[n++] = (char)(hexval(p[1]) * 16 + hexval(p[2]));
                    p += 2;
                } else {
                    word[n++] = *p;
                }
            } else {
                word[n++] = *p;
            }
        }
        g_dict = realloc(g_dict, (g_ndict + 1) * sizeof *g_dict);
        g_dict_len = realloc(g_dict_len, (g_ndict + 1) * sizeof *g_dict_len);
        g_dict[g_ndict] = malloc(n ? n : 1);
        memcpy(g_dict[g_ndict], word, n);
        g_dict_len[g_ndict++] = n;
    }
    fclose(f);
}

/* ---- mutation ---- */

static size_t insert_bytes(uint8_t *d, size_t size, size_t max, size_t at, const void *src,
                           size_t n)
{
    if (size + n > max)
        n = max - size;
    memmove(d + at + n, d + at, size - at);
    memcpy(d + at, src, n);
    return size + n;
}

/* Replaces a run of ASCII digits with a number that is often a boundary. */
static size_t tweak_number(uint8_t *d, size_t size, size_t max)
{
    size_t starts[64], n = 0;
    for (size_t i = 0; i < size && n < 64; i++)
        if (d[i] >= '0' && d[i] <= '9' && (i == 0 || d[i - 1] < '0' || d[i - 1] > '9'))
            starts[n++] = i;
    if (!n)
        return size;
    size_t at = starts[below(n)], end = at;
    while (end < size && d[end] >= '0' && d[end] <= '9')
        end++;
    static const char *const nums[] = {"0", "1", "2", "7", "8", "16", "63", "64", "65", "128",
                                       "255", "256", "511", "512", "4096", "65535", "65536",
                                       "2147483647", "2147483648", "4294967295", "4294967296",
                                       "9223372036854775807", "18446744073709551615",
                                       "18446744073709551616", "99999999999999999999"};
    char buf[32];
    const char *num = nums[below(sizeof nums / sizeof nums[0])];
    if (below(3) == 0) {
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)below(5000));
        num = buf;
    }
    memmove(d + at, d + end, size - end);
    size -= end - at;
    return insert_bytes(d, size, max, at, num, strlen(num));
}

/* What LLVMFuzzerMutate does under libFuzzer: one to four random edits. */
size_t LLVMFuzzerMutate(uint8_t *d, size_t size, size_t max)
{
    static const uint32_t words[] = {0, 1, 0x7f, 0x80, 0xff, 0x100, 0x200, 0x1000, 0xffff,
                                     0x10000, 0x7fffffff, 0x80000000u, 0xffffffffu};
    int steps = 1 + (int)below(4);
    for (int s = 0; s < steps; s++) {
        size_t at = below(size + 1);
        switch (below(12)) {
        case 0:
            if (size)
                d[below(size)] ^= (uint8_t)(1u << below(8));
            break;
        case 1:
            if (size)
                d[below(size)] = (uint8_t)rnd();
            break;
        case 2: {
            uint8_t b = (uint8_t)rnd();
            size = insert_bytes(d, size, max, at, &b, 1);
            break;
        }
        case 3:
            if (size && at < size) {
                size_t n = 1 + below(size - at < 16 ? size - at : 16);
                memmove(d + at, d + at + n, size - at - n);
                size -= n;
            }
            break;
        case 4:
            if (size && at < size) {
                size_t n = 1 + below(size - at < 32 ? size - at : 32);
                uint8_t tmp[32];
                memcpy(tmp, d + at, n);
                size = insert_bytes(d, size, max, below(size + 1), tmp, n);
            }
            break;
        case 5:
            size = at;
            break;
        case 6:
        case 7:
            if (g_ndict) {
                size_t w = below(g_ndict);
                if (below(2) && at + g_dict_len[w] <= size)
                    memcpy(d + at, g_dict[w], g_dict_len[w]);
                else
                    size = insert_bytes(d, size, max, at, g_dict[w], g_dict_len[w]);
            }
            break;
        case 8:
            size = tweak_number(d, size, max);
            break;
        case 9:
            if (size >= 4) {   /* a 32-bit word, big- or little-endian */
                uint32_t v = words[below(sizeof words / sizeof words[0])];
                size_t p = below(size - 3);
                int be = (int)below(2);
                for (int i = 0; i < 4; i++)
                    d[p + (size_t)i] = (uint8_t)(v >> (be ? 24 - 8 * i : 8 * i));
            }
            break;
        case 10:
            if (size) {        /* a run set to one byte */
                size_t p = below(size), n = 1 + below(size - p < 512 ? size - p : 512);
                memset(d + p, below(2) ? 0 : 0xff, n);
            }
            break;
        default:
            if (g_n) {         /* splice: a piece of another input */
                const input *o = &g_corpus[below(g_n)];
                if (o->size) {
                    size_t a = below(o->size), n = 1 + below(o->size - a < 256 ? o->size - a : 256);
                    size = insert_bytes(d, size, max, at, o->data + a, n);
                }
            }
            break;
        }
    }
    return size;
}

/* ---- running ---- */

static void run_one(const uint8_t *data, size_t size)
{
    /* Exactly size bytes, so a read past the end is caught. */
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    g_current = copy;
    g_current_size = size;
    LLVMFuzzerTestOneInput(copy, size);
    g_current = NULL;
    free(copy);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *slash = strrchr(argv[0], '/');
    g_target = slash ? slash + 1 : argv[0];
    double seconds = 0;
    size_t max_len = 1 << 20;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    const char *env = getenv("STOF_SEED");
    if (env && *env)
        seed = strtoull(env, NULL, 0);
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    int paths = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-t") == 0 && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "-seed") == 0 && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "-dict") == 0 && i + 1 < argc)
            load_dict(argv[++i]);
        else if (strcmp(argv[i], "-max_len") == 0 && i + 1 < argc)
            max_len = (size_t)strtoull(argv[++i], NULL, 0);
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [-t SECONDS] [-seed N] [-dict FILE] [-max_len N] "
                            "CORPUS...\n", g_target);
            return 2;
        } else {
            load(argv[i], max_len);
            paths++;
        }
    }
    if (!paths) {
        fprintf(stderr, "%s: no corpus given\n", g_target);
        return 2;
    }
    g_rng = seed ? seed : 1;
    if (__sanitizer_set_death_callback)
        __sanitizer_set_death_callback(save_current);
    int sigs[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], on_signal);

    double t0 = now_s();
    for (size_t i = 0; i < g_n; i++)
        run_one(g_corpus[i].data, g_corpus[i].size);
    long long mutated = 0;
    if (seconds > 0 && g_n) {
        size_t cap = max_len < (1 << 16) ? max_len : 1 << 16;
        for (size_t i = 0; i < g_n; i++)
            cap = g_corpus[i].size * 2 + 64 > cap ? g_corpus[i].size * 2 + 64 : cap;
        if (cap > max_len)
            cap = max_len;
        uint8_t *buf = malloc(cap);
        while (now_s() - t0 < seconds) {
            for (int k = 0; k < 64; k++) {
                const input *in = &g_corpus[below(g_n)];
                size_t size = in->size < cap ? in->size : cap;
                memcpy(buf, in->data, size);
                if (LLVMFuzzerCustomMutator && below(2))
                    size = LLVMFuzzerCustomMutator(buf, size, cap, (unsigned)rnd());
                else
                    size = LLVMFuzzerMutate(buf, size, cap);
                run_one(buf, size);
                mutated++;
            }
        }
        free(buf);
    }
    double el = now_s() - t0;
    printf("%s: %zu corpus inputs replayed, %lld mutated inputs in %.1f s (%.0f/s), seed %llu, "
           "no finding\n",
           g_target, g_n, mutated, el, el > 0 ? (double)((long long)g_n + mutated) / el : 0.0,
           (unsigned long long)seed);
    for (size_t i = 0; i < g_n; i++) {
        free(g_corpus[i].data);
        free(g_corpus[i].name);
    }
    free(g_corpus);
    for (size_t i = 0; i < g_ndict; i++)
        free(g_dict[i]);
    free(g_dict);
    free(g_dict_len);
    return 0;
}
