/*
 * stof-dump — looks into a stof kernel cache: lists kernels, shows one
 * kernel's source, PTX, SASS, compile log and parameters, prints tuning
 * records (winners, what they beat, the model's error), statistics and an
 * integrity check, prunes, and moves a warmed cache between machines.
 *
 * It never creates a cache (except `import` and `recover`, whose purpose
 * that is) and changes one only in `prune` and `import`, each in one
 * transaction; `recover` only reads the damaged file.
 * Exit status: 0 done, 1 a finding (check found damage; recover lost
 * entries; no SASS tool), 2 bad arguments, or no usable cache.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attn/mha.h"
#include "base/json.h"
#include "cache/cache.h"
#include "cache/cache_admin.h"
#include "cache/cache_recover.h"
#include "cache/trust.h"
#include "codegen/nvrtc_drv.h"
#include "stof.h"

#define EXIT_FINDING 1
#define EXIT_USAGE 2

static const char USAGE[] =
    "usage: stof-dump [--cache PATH] COMMAND ...\n"
    "  list [--op OP] [--arch ARCH] [--json]     kernels in the cache\n"
    "  show KEY [--source|--ptx|--sass|--log|--params]\n"
    "                                            one kernel (KEY: a unique prefix)\n"
    "  tuning [--op OP] [--mask SPEC] [--json]   tuning records: winners, what they beat\n"
    "  stats [--json]                            entries, bytes, hit rates by op and arch,\n"
    "                                            the Redis tier's hits and misses\n"
    "  check [--json]                            integrity: checksums, versions, orphans,\n"
    "                                            and whether others could write the file\n"
    "  prune [--older-than DAYS] [--max-bytes N[K|M|G]] [--stale]\n"
    "  export FILE                               a consistent copy, in a new file\n"
    "  import FILE                               merge a stof cache file into this one\n"
    "  recover NEW.db [--json]                   copy every intact entry of a damaged cache\n"
    "                                            into a new file; list what was lost\n"
    "  mask SPEC --lq N [--lk N] [--block BQxBK] [--svg FILE]\n"
    "       [--batch B] [--heads H] [--head-dim D] [--dtype fp16|bf16] [--arch ARCH]\n"
    "                                            a mask's blocks (full, partial, empty) and\n"
    "                                            the kernel the model picks for it, and why\n"
    "The cache: --cache PATH, else $STOF_CACHE, else $XDG_CACHE_HOME/stof/cache.db,\n"
    "else ~/.cache/stof/cache.db.\n";

typedef struct args {
    const char *cache, *op, *arch, *mask, *older_than, *max_bytes, *part;
    const char *lq, *lk, *svg, *block, *batch, *heads, *head_dim, *dtype;   /* mask */
    int json, stale;
    const char *cmd, *operand;
    unsigned given;            /* OPT_* bits of the options given */
} args;

enum { OPT_OP = 1, OPT_ARCH = 2, OPT_MASK = 4, OPT_JSON = 8, OPT_PART = 16, OPT_OLDER = 32,
       OPT_MAX = 64, OPT_STALE = 128, OPT_LQ = 256, OPT_LK = 512, OPT_SVG = 1024,
       OPT_BLOCK = 2048, OPT_BATCH = 4096, OPT_HEADS = 8192, OPT_HDIM = 16384,
       OPT_DTYPE = 32768 };
#define OPT_COUNT 16
#define MASK_OPTS (OPT_LQ | OPT_LK | OPT_SVG | OPT_BLOCK | OPT_BATCH | OPT_HEADS | OPT_HDIM | \
                   OPT_DTYPE | OPT_ARCH)

typedef struct dump {
    stof_ctx *ctx;             /* for masks */
    err_record err;            /* the cache's last failure */
    cache *c;
    const args *a;
} dump;

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "stof-dump: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(stof-dump --help for usage)\n");
    va_end(ap);
    return EXIT_USAGE;
}

/* ---- arguments ---- */

static int take_value(int argc, char **argv, int *i, const char **out)
{
    const char *arg = argv[*i], *eq = strchr(arg, '=');
    if (eq) {
        *out = eq + 1;
        return 1;
    }
    if (*i + 1 >= argc)
        return 0;
    *out = argv[++*i];
    return 1;
}

static int is_part(const char *s)
{
    static const char *const parts[] = {"--source", "--ptx", "--sass", "--log", "--params", NULL};
    for (const char *const *p = parts; *p; p++)
        if (strcmp(s, *p) == 0)
            return 1;
    return 0;
}

static int parse_option(args *a, int argc, char **argv, int *i)
{
    static const struct { const char *name; unsigned bit; size_t off; } vals[] = {
        {"--cache", 0, offsetof(args, cache)},        {"--op", OPT_OP, offsetof(args, op)},
        {"--arch", OPT_ARCH, offsetof(args, arch)},   {"--mask", OPT_MASK, offsetof(args, mask)},
        {"--older-than", OPT_OLDER, offsetof(args, older_than)},
        {"--max-bytes", OPT_MAX, offsetof(args, max_bytes)},
        {"--lq", OPT_LQ, offsetof(args, lq)},         {"--lk", OPT_LK, offsetof(args, lk)},
        {"--svg", OPT_SVG, offsetof(args, svg)},      {"--block", OPT_BLOCK, offsetof(args, block)},
        {"--batch", OPT_BATCH, offsetof(args, batch)}, {"--heads", OPT_HEADS, offsetof(args, heads)},
        {"--head-dim", OPT_HDIM, offsetof(args, head_dim)},
        {"--dtype", OPT_DTYPE, offsetof(args, dtype)}};
    const char *arg = argv[*i];
    size_t n = strcspn(arg, "=");
    for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
        if (strlen(vals[k].name) != n || strncmp(arg, vals[k].name, n) != 0)
            continue;
        if (!take_value(argc, argv, i, (const char **)((char *)a + vals[k].off)))
            return usage_error("%s needs a value", vals[k].name);
        a->given |= vals[k].bit;
        return 0;
    }
    if (strcmp(arg, "--json") == 0) {
        a->json = 1;
        a->given |= OPT_JSON;
    } else if (strcmp(arg, "--stale") == 0) {
        a->stale = 1;
        a->given |= OPT_STALE;
    } else if (is_part(arg)) {
        if (a->part)
            return usage_error("show takes one of --source, --ptx, --sass, --log, --params "
                               "(got --%s and %s)", a->part, arg);
        a->part = arg + 2;
        a->given |= OPT_PART;
    } else {
        return usage_error("unknown option %s", arg);
    }
    return 0;
}

static int parse_args(args *a, int argc, char **argv)
{
    int positional_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!positional_only && strcmp(arg, "--") == 0) {
            positional_only = 1;
        } else if (!positional_only && arg[0] == '-' && arg[1]) {
            int rc = parse_option(a, argc, argv, &i);
            if (rc)
                return rc;
        } else if (!a->cmd) {
            a->cmd = arg;
        } else if (!a->operand) {
            a->operand = arg;
        } else {
            return usage_error("unexpected argument \"%s\"", arg);
        }
    }
    return 0;
}

/* The name of the lowest option bit set in bits. */
static const char *option_name(unsigned bits)
{
    static const char *const names[OPT_COUNT] = {
        "--op",  "--arch", "--mask", "--json",  "a part (--source ...)", "--older-than",
        "--max-bytes", "--stale", "--lq", "--lk", "--svg", "--block", "--batch", "--heads",
        "--head-dim", "--dtype"};
    for (int i = 0; i < OPT_COUNT; i++)
        if (bits & (1u << i))
            return names[i];
    return "?";
}

/* Which options and operand each command takes. */
static int check_command(const args *a)
{
    static const struct { const char *name; unsigned opts; int operand; } cmds[] = {
        {"list", OPT_OP | OPT_ARCH | OPT_JSON, 0}, {"show", OPT_PART, 1},
        {"tuning", OPT_OP | OPT_MASK | OPT_JSON, 0}, {"stats", OPT_JSON, 0},
        {"check", OPT_JSON, 0}, {"prune", OPT_OLDER | OPT_MAX | OPT_STALE, 0},
        {"export", 0, 1}, {"import", 0, 1}, {"recover", OPT_JSON, 1}, {"mask", MASK_OPTS, 1}};
    if (!a->cmd)
        return usage_error("no command given");
    for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
        if (strcmp(a->cmd, cmds[k].name) != 0)
            continue;
        if (a->given & ~cmds[k].opts)
            return usage_error("\"%s\" does not take %s", a->cmd,
                               option_name(a->given & ~cmds[k].opts));
        if (cmds[k].operand && !a->operand)
            return usage_error("\"%s\" needs its operand (%s)", a->cmd,
                               strcmp(a->cmd, "mask") == 0 ? "a mask spec" : "a key or a file");
        if (!cmds[k].operand && a->operand)
            return usage_error("unexpected argument \"%s\"", a->operand);
        return 0;
    }
    return usage_error("unknown command \"%s\"", a->cmd);
}

/* ---- formatting ---- */

static const char *human_bytes(long long n, char buf[32])
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%lld B", n);
    else
        snprintf(buf, 32, "%.1f %s", v, units[u]);
    return buf;
}

static const char *when(long long t, char buf[32])
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (t <= 0 || !localtime_r(&tt, &tm) || !strftime(buf, 32, "%Y-%m-%d %H:%M:%S", &tm))
        snprintf(buf, 32, "-");
    return buf;
}

static void begin_doc(json_out *o, const dump *d, const char *list_name)
{
    json_out_init(o, stdout, 1);
    json_begin_object(o);
    json_key(o, "cache");
    json_string(o, cache_file(d->c));
    json_key(o, "stof_version");
    json_string(o, stof_version());
    json_key(o, "nvrtc_version");
    json_string(o, nvrtc_version_string());
    if (list_name) {
        json_key(o, list_name);
        json_begin_array(o);
    }
}

static int fail_lib(const dump *d, const char *what)
{
    fprintf(stderr, "stof-dump: %s: %s\n", what, d->err.msg);
    return EXIT_USAGE;
}

/* ---- list ---- */

typedef struct list_state {
    json_out o;
    int json;
    long long n;
} list_state;

static void list_json_row(json_out *o, const cache_kernel *k)
{
    json_begin_object(o);
    const char *txt[][2] = {{"key", k->key},         {"op", k->op},
                            {"template", k->name},   {"entry", k->entry},
                            {"arch", k->arch},       {"nvrtc_version", k->nvrtc_version},
                            {"stof_version", k->stof_version}, {"options", k->options},
                            {"params", k->params},   {"checksum", k->checksum}};
    for (size_t i = 0; i < sizeof txt / sizeof txt[0]; i++) {
        json_key(o, txt[i][0]);
        json_string(o, txt[i][1]);
    }
    const struct { const char *k; long long v; } nums[] = {
        {"cubin_bytes", (long long)k->cubin_size}, {"ptx_bytes", (long long)k->ptx_size},
        {"created", k->created}, {"last_used", k->last_used}, {"hits", k->hits}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        json_key(o, nums[i].k);
        json_int_out(o, nums[i].v);
    }
    json_key(o, "compile_ms");
    json_double(o, k->compile_ms);
    json_key(o, "current");
    json_bool(o, cache_versions_current(k->nvrtc_version, k->stof_version, nvrtc_version_string()));
    json_end_object(o);
}

static int list_row(const cache_kernel *k, void *arg)
{
    list_state *s = arg;
    char b1[32], b2[32], t[32];
    s->n++;
    if (s->json) {
        list_json_row(&s->o, k);
        return 0;
    }
    if (s->n == 1)
        printf("%-12s  %-10s  %-8s  %-20s  %10s  %10s  %9s  %5s  %-19s  %s\n", "KEY", "OP", "ARCH",
               "ENTRY", "CUBIN", "PTX", "COMPILE", "HITS", "LAST USED", "PARAMS");
    printf("%-12.12s  %-10s  %-8s  %-20s  %10s  %10s  %6.0f ms  %5lld  %-19s  %s%s\n", k->key,
           k->op, k->arch, k->entry, human_bytes((long long)k->cubin_size, b1),
           human_bytes((long long)k->ptx_size, b2), k->compile_ms, k->hits, when(k->last_used, t),
           k->params,
           cache_versions_current(k->nvrtc_version, k->stof_version, nvrtc_version_string())
               ? ""
               : "  [stale]");
    return 0;
}

static int cmd_list(dump *d)
{
    list_state s = {.json = d->a->json};
    if (s.json)
        begin_doc(&s.o, d, "kernels");
    if (cache_list_kernels(&d->err, d->c, d->a->op, d->a->arch, list_row, &s) != STOF_OK)
        return fail_lib(d, "listing");
    if (s.json) {
        json_end_array(&s.o);
        json_end_object(&s.o);
        json_out_end(&s.o);
    } else {
        printf("%s%lld kernel%s", s.n ? "\n" : "", s.n, s.n == 1 ? "" : "s");
        if (d->a->op || d->a->arch)
            printf(" (op %s, arch %s)", d->a->op ? d->a->op : "any", d->a->arch ? d->a->arch : "any");
        printf("\n");
    }
    return 0;
}

/* ---- show ---- */

typedef struct naming {
    const char *key;
    int n;
} naming;

static int print_if_names(const cache_tuning *t, const char *ver, void *arg)
{
    naming *nm = arg;
    char keys[32][65];
    int n = cache_admin_record_kernels(t->record, keys, 32);
    (void)ver;
    for (int i = 0; i < n && i < 32; i++) {
        if (strcmp(keys[i], nm->key) != 0)
            continue;
        /* Attention records name the mask by its spec; older ones only
         * by its hash. */
        json_value *r = json_parse(t->record, strlen(t->record), NULL);
        const json_value *spec = json_get(r, "mask");
        printf("%-13s %s %s %s %s, mask ", nm->n++ ? "" : "tuned for", t->op, t->shape, t->dtype,
               t->arch);
        if (spec && spec->type == JSON_STRING)
            printf("%s (hash %.12s)\n", spec->str, t->mask_hash);
        else
            printf("%.12s (the record does not say its spec)\n", t->mask_hash);
        json_free(r);
        break;
    }
    return 0;
}

static void show_summary(dump *d, const cache_kernel *k)
{
    char sum[65], b[32];
    cache_checksum(k->cubin, k->cubin_size, k->ptx, k->ptx_size, sum);
    int sound = k->cubin_size > 0 && strcmp(sum, k->checksum) == 0;
    int current = cache_versions_current(k->nvrtc_version, k->stof_version, nvrtc_version_string());
    printf("%-13s %s\n%-13s %s\n%-13s %s\n%-13s %s\n%-13s %s\n", "key", k->key, "op", k->op,
           "template", k->name, "entry", k->entry, "arch", k->arch);
    printf("%-13s stof %s, NVRTC %s%s\n", "compiled by", k->stof_version, k->nvrtc_version,
           current ? "" : "  (STALE: not this stof or NVRTC; it will be recompiled)");
    printf("%-13s %s\n", "options", k->options);
    printf("%-13s %s\n", "params", k->params);
    printf("%-13s %zu bytes\n%-13s %zu bytes\n%-13s %zu bytes\n%-13s %zu bytes\n", "cubin",
           k->cubin_size, "ptx", k->ptx_size, "source", strlen(k->source), "log", strlen(k->log));
    printf("%-13s %s\n", "checksum",
           sound ? "ok" : "DAMAGED: the binary or PTX does not match its checksum");
    printf("%-13s %.1f ms\n", "compile", k->compile_ms);
    printf("%-13s %s\n", "created", when(k->created, b));
    printf("%-13s %s\n", "last used", when(k->last_used, b));
    printf("%-13s %lld\n", "hits", k->hits);
    naming nm = {k->key, 0};
    cache_admin_list_tuning(&d->err, d->c, NULL, print_if_names, &nm);
    if (!nm.n)
        printf("%-13s no tuning record names it (compiled ahead, e.g. by stof-warm "
               "--compile-only; a kernel reads its mask as data, so it serves any)\n",
               "tuned for");
}

static int find_tool(char *out, size_t n, const char **name)
{
    static const char *const tools[] = {"cuobjdump", "nvdisasm"};
    const char *path = getenv("PATH"), *cuda = getenv("CUDA_HOME");
    char dirs[8192];
    snprintf(dirs, sizeof dirs, "%s:%s%s/usr/local/cuda/bin", path ? path : "",
             cuda && *cuda ? cuda : "", cuda && *cuda ? "/bin:" : "");
    for (char *save = NULL, *dir = strtok_r(dirs, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        for (int t = 0; t < 2; t++) {
            snprintf(out, n, "%s/%s", dir, tools[t]);
            if (access(out, X_OK) == 0) {
                *name = tools[t];
                return 1;
            }
        }
    }
    return 0;
}

static int run_tool(const char *tool, const char *name, const char *file)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (strcmp(name, "cuobjdump") == 0)
            execl(tool, name, "-sass", file, (char *)NULL);
        else
            execl(tool, name, file, (char *)NULL);
        fprintf(stderr, "stof-dump: cannot run %s: %s\n", tool, strerror(errno));
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return EXIT_FINDING;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : EXIT_FINDING;
}

static int show_sass(const cache_kernel *k)
{
    char tool[4096];
    const char *name;
    if (!find_tool(tool, sizeof tool, &name)) {
        fprintf(stderr, "stof-dump: no SASS: neither cuobjdump nor nvdisasm was found on PATH,"
                        " in $CUDA_HOME/bin or in /usr/local/cuda/bin (install the CUDA "
                        "toolkit's binary utilities; --ptx shows the PTX)\n");
        return EXIT_FINDING;
    }
    const char *tmp = getenv("TMPDIR");
    char file[4096];
    snprintf(file, sizeof file, "%s/stof-dump-XXXXXX.cubin", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemps(file, 6);
    if (fd < 0) {
        fprintf(stderr, "stof-dump: cannot make a temporary file: %s\n", strerror(errno));
        return EXIT_FINDING;
    }
    int ok = write(fd, k->cubin, k->cubin_size) == (ssize_t)k->cubin_size;
    close(fd);
    int rc = ok ? run_tool(tool, name, file) : EXIT_FINDING;
    if (!ok)
        fprintf(stderr, "stof-dump: cannot write %s\n", file);
    unlink(file);
    return rc;
}

static int show_part(const cache_kernel *k, const char *part)
{
    if (strcmp(part, "source") == 0) {
        fputs(k->source, stdout);
    } else if (strcmp(part, "ptx") == 0) {
        fwrite(k->ptx, 1, k->ptx_size, stdout);
    } else if (strcmp(part, "log") == 0) {
        fputs(k->log, stdout);
        if (!k->log[0])
            fprintf(stderr, "stof-dump: the compile log of %.12s is empty\n", k->key);
    } else if (strcmp(part, "params") == 0) {
        for (const char *p = k->params; *p;) {
            size_t n = strcspn(p, ";");
            printf("%.*s\n", (int)n, p);
            p += n + (p[n] == ';');
        }
    } else {
        return show_sass(k);
    }
    return 0;
}

static int cmd_show(dump *d)
{
    char key[65];
    if (cache_resolve_key(&d->err, d->c, d->a->operand, key) != STOF_OK)
        return fail_lib(d, "show");
    cache_kernel k;
    int found = 0;
    if (cache_admin_read_kernel(&d->err, d->c, key, &k, &found) != STOF_OK)
        return fail_lib(d, "show");
    if (!found) {
        fprintf(stderr, "stof-dump: kernel %s vanished while reading it\n", key);
        return EXIT_FINDING;
    }
    int rc = 0;
    if (d->a->part)
        rc = show_part(&k, d->a->part);
    else
        show_summary(d, &k);
    cache_kernel_free(&k);
    return rc;
}

/* ---- tuning ---- */

typedef struct tuning_state {
    dump *d;
    json_out o;
    int json;
    long long n;
    int mask_parsed;        /* the --mask spec parsed for some row */
    char mask_err[1024];
} tuning_state;

/* lq and lk from a shape such as "b=8,h=12,lq=2048,lk=2048,d=64" (l= sets both). */
static int shape_lengths(const char *shape, int *lq, int *lk)
{
    *lq = *lk = 0;
    for (const char *p = shape; *p;) {
        size_t n = strcspn(p, ",");
        int v;
        if (sscanf(p, "lq=%d", &v) == 1)
            *lq = v;
        else if (sscanf(p, "lk=%d", &v) == 1)
            *lk = v;
        else if (sscanf(p, "l=%d", &v) == 1)
            *lq = *lk = v;
        p += n + (p[n] == ',');
    }
    return *lq > 0 && *lk > 0;
}

/* Does the row's mask hash equal that of the --mask spec at its lengths? */
static int mask_matches(tuning_state *s, const cache_tuning *t)
{
    int lq, lk;
    if (!shape_lengths(t->shape, &lq, &lk))
        return 0;
    stof_mask *m = NULL;
    if (stof_mask_parse(s->d->ctx, s->d->a->mask, lq, lk, &m) != STOF_OK) {
        snprintf(s->mask_err, sizeof s->mask_err, "%s", stof_last_error(s->d->ctx));
        return 0;
    }
    s->mask_parsed = 1;
    char hex[65] = "";
    stof_mask_hash(m, hex);
    stof_mask_free(m);
    return strcmp(hex, t->mask_hash) == 0;
}

static double num(const json_value *obj, const char *key)
{
    const json_value *v = json_get(obj, key);
    return v && v->type == JSON_NUMBER ? v->number : NAN;
}

static const char *str(const json_value *obj, const char *key)
{
    const json_value *v = json_get(obj, key);
    return v && v->type == JSON_STRING ? v->str : NULL;
}

/* The model's estimate for a candidate: "predicted_ms" (or "model_ms"). */
static double predicted(const json_value *c)
{
    double p = num(c, "predicted_ms");
    return isnan(p) ? num(c, "model_ms") : p;
}

/* Members that are results, not what tells candidates apart. */
static int is_result(const char *key)
{
    static const char *const keys[] = {"kind", "name", "ms", "predicted_ms", "model_ms", "verdict",
                                       "error", "kernel", "kernels", "params", NULL};
    for (const char *const *k = keys; *k; k++)
        if (strcmp(*k, key) == 0)
            return 1;
    return 0;
}

static size_t add_setting(char *out, size_t n, size_t at, int first, const char *k,
                          const json_value *v)
{
    if (at >= n)
        return at;
    if (v->type == JSON_NUMBER)
        return at + (size_t)snprintf(out + at, n - at, "%s%s=%g", first ? " " : ",", k, v->number);
    if (v->type == JSON_STRING)
        return at + (size_t)snprintf(out + at, n - at, "%s%s=%s", first ? " " : ",", k, v->str);
    return at;
}

/* "block bm=64,bn=64": the kind (or name), then its settings, from
 * "params" when the candidate has them, else its other scalar members. */
static void describe(const json_value *c, char *out, size_t n)
{
    const char *kind = str(c, "kind") ? str(c, "kind") : str(c, "name");
    const json_value *p = json_get(c, "params");
    size_t at = (size_t)snprintf(out, n, "%s", kind ? kind : "?");
    int first = 1;
    if (p && p->type == JSON_STRING && at < n)
        at += (size_t)snprintf(out + at, n - at, " %s", p->str);
    const json_value *from = p && p->type == JSON_OBJECT ? p : c;
    for (size_t i = 0; from && from->type == JSON_OBJECT && i < from->n; i++) {
        if (from == c && is_result(c->keys[i]))
            continue;
        size_t before = at;
        at = add_setting(out, n, at, first, from->keys[i], from->items[i]);
        first = first && at == before;
    }
}

static void model_error(const json_value *c, char *out, size_t n)
{
    double ms = num(c, "ms"), model = predicted(c);
    if (isnan(model))
        snprintf(out, n, "%s", "");
    else if (!(ms > 0))
        snprintf(out, n, "model %.3f ms", model);
    else
        snprintf(out, n, "model %.3f ms (%+.1f%%)", model, 100.0 * (model - ms) / ms);
}

static int same_candidate(const json_value *a, const json_value *b)
{
    char x[512], y[512];
    const char *ka = str(a, "kernel"), *kb = str(b, "kernel");
    if (ka && kb)
        return strcmp(ka, kb) == 0;
    describe(a, x, sizeof x);
    describe(b, y, sizeof y);
    return strcmp(x, y) == 0;
}

static int by_ms(const void *pa, const void *pb)
{
    double a = num(*(const json_value *const *)pa, "ms"), b = num(*(const json_value *const *)pb, "ms");
    if (isnan(a) || isnan(b))
        return isnan(a) - isnan(b);
    return (a > b) - (a < b);
}

/* Where the winner stood in the model's ranking (1 = the model's first). */
static int model_rank(const json_value *winner, const json_value *tried)
{
    double w = predicted(winner);
    int rank = 1;
    if (isnan(w))
        return 0;
    for (size_t i = 0; tried && i < tried->n; i++)
        if (!same_candidate(tried->items[i], winner) && predicted(tried->items[i]) < w)
            rank++;
    return rank;
}

/* A candidate that was timed and passed: one the winner beat. */
static int beaten(const json_value *c)
{
    const char *v = str(c, "verdict");
    return !str(c, "error") && (!v || strcmp(v, "ok") == 0) && num(c, "ms") >= 0;
}

/* A candidate that failed or whose output disagreed: its time if it has one. */
static void print_failed(const char *desc, double ms, const char *why, const char *err)
{
    int mismatch = strcmp(why, "mismatch") == 0;
    char t[32] = "";
    if (ms >= 0)
        snprintf(t, sizeof t, "%8.3f ms  ", ms);
    printf("  %-9s %-36s %s%s  %s\n", mismatch ? "mismatch" : "failed", desc, t,
           mismatch ? "output differs from the first candidate's" : why, err);
}

static void print_candidate(const json_value *c, double best)
{
    char desc[512], err[128];
    describe(c, desc, sizeof desc);
    model_error(c, err, sizeof err);
    double ms = num(c, "ms");
    const char *why = str(c, "error") ? str(c, "error") : str(c, "verdict");
    if (beaten(c))
        printf("  %-9s %-36s %8.3f ms  %5.2fx  %s\n", "beat", desc, ms, best > 0 ? ms / best : NAN,
               err);
    else if (why)
        print_failed(desc, ms, why, err);
    else
        printf("  %-9s %-36s %-22s  %s\n", "untimed", desc, "(ranked, not timed)", err);
}

/* What the winner beat, fastest first; then the candidates that failed or
 * were never timed. Returns how many were timed. */
static int print_beaten(const json_value *winner, const json_value *tried)
{
    const json_value **v = calloc(tried->n ? tried->n : 1, sizeof *v);
    size_t n = 0;
    int timed = 0;
    if (!v)
        return 0;
    for (size_t i = 0; i < tried->n; i++) {
        const json_value *c = tried->items[i];
        timed += c->type == JSON_OBJECT && num(c, "ms") >= 0;
        if (c->type == JSON_OBJECT && !same_candidate(c, winner))
            v[n++] = c;
    }
    qsort(v, n, sizeof *v, by_ms);
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++)
            if (beaten(v[i]) == !pass)
                print_candidate(v[i], num(winner, "ms"));
    free(v);
    return timed;
}

static void print_record(const json_value *r)
{
    const json_value *w = json_get(r, "winner"), *tried = json_get(r, "tried");
    char desc[512], err[128];
    describe(w, desc, sizeof desc);
    model_error(w, err, sizeof err);
    const char *kernel = str(w, "kernel");
    printf("  %-9s %-36s %8.3f ms  %5s  %s%s%.12s\n", "winner", desc, num(w, "ms"), "", err,
           kernel ? "  kernel " : "", kernel ? kernel : "");
    int is_list = tried && tried->type == JSON_ARRAY;
    int timed = is_list ? print_beaten(w, tried) : 0;
    int rank = model_rank(w, is_list ? tried : NULL);
    const char *tune = str(r, "how") ? str(r, "how") : str(r, "tune");
    double secs = num(r, "seconds"), merr = num(r, "model_error");
    printf("  searched %zu candidate%s, %d timed", is_list ? tried->n : 0,
           is_list && tried->n == 1 ? "" : "s", timed);
    if (!isnan(secs))
        printf(", in %.1f s", secs);
    if (tune)
        printf(" (tune %s)", tune);
    if (!isnan(merr))
        printf("; model error on the winner %+.1f%%", 100.0 * merr);
    if (rank > 0)
        printf("; the model ranked it #%d", rank);
    printf("\n");
}

static void tuning_text(const cache_tuning *t, const char *ver)
{
    char b[32];
    printf("%s  %s  %s  %s  mask %.12s  stof %s  %s%s\n", t->op, t->shape, t->dtype, t->arch,
           t->mask_hash, ver, when(t->created, b),
           strcmp(ver, stof_version()) ? "  [stale]" : "");
    json_value *r = json_parse(t->record, strlen(t->record), NULL);
    if (r && json_get(r, "winner") && json_get(r, "winner")->type == JSON_OBJECT) {
        print_record(r);
    } else if (r) {
        json_out o;
        json_out_init(&o, stdout, 1);
        json_value_out(&o, r);
        json_out_end(&o);
    } else {
        printf("  (the record is not JSON) %s\n", t->record);
    }
    json_free(r);
    printf("\n");
}

static void tuning_json(json_out *o, const cache_tuning *t, const char *ver)
{
    json_begin_object(o);
    const char *txt[][2] = {{"op", t->op},       {"mask_hash", t->mask_hash}, {"shape", t->shape},
                            {"dtype", t->dtype}, {"arch", t->arch},           {"stof_version", ver}};
    for (size_t i = 0; i < sizeof txt / sizeof txt[0]; i++) {
        json_key(o, txt[i][0]);
        json_string(o, txt[i][1]);
    }
    json_key(o, "created");
    json_int_out(o, t->created);
    json_value *r = json_parse(t->record, strlen(t->record), NULL);
    json_key(o, "record");
    if (r)
        json_value_out(o, r);
    else
        json_string(o, t->record);
    json_key(o, "record_is_json");
    json_bool(o, r != NULL);
    json_free(r);
    json_end_object(o);
}

/* The pre-pass: does the --mask spec parse for this row's lengths? */
static int try_mask(const cache_tuning *t, const char *ver, void *arg)
{
    (void)ver;
    mask_matches(arg, t);
    return ((tuning_state *)arg)->mask_parsed;
}

static int tuning_row(const cache_tuning *t, const char *ver, void *arg)
{
    tuning_state *s = arg;
    if (s->d->a->mask && !mask_matches(s, t))
        return 0;
    s->n++;
    if (s->json)
        tuning_json(&s->o, t, ver);
    else
        tuning_text(t, ver);
    return 0;
}

/* A spec that parses for no row may still be sound; try it on a square. */
static int mask_spec_ok(tuning_state *s)
{
    stof_mask *m = NULL;
    if (s->mask_parsed || !s->d->a->mask)
        return 1;
    if (!s->mask_err[0] && stof_mask_parse(s->d->ctx, s->d->a->mask, 4096, 4096, &m) == STOF_OK) {
        stof_mask_free(m);
        return 1;
    }
    fprintf(stderr, "stof-dump: bad --mask \"%s\": %s\n", s->d->a->mask,
            s->mask_err[0] ? s->mask_err : stof_last_error(s->d->ctx));
    return 0;
}

static int cmd_tuning(dump *d)
{
    tuning_state s = {.d = d, .json = d->a->json};
    /* A bad spec is refused before anything is printed. */
    if (d->a->mask && cache_admin_list_tuning(&d->err, d->c, NULL, try_mask, &s) != STOF_OK)
        return fail_lib(d, "tuning");
    if (!mask_spec_ok(&s))
        return EXIT_USAGE;
    if (s.json)
        begin_doc(&s.o, d, "tuning");
    if (cache_admin_list_tuning(&d->err, d->c, d->a->op, tuning_row, &s) != STOF_OK)
        return fail_lib(d, "tuning");
    if (s.json) {
        json_end_array(&s.o);
        json_end_object(&s.o);
        json_out_end(&s.o);
    } else
        printf("%lld tuning record%s\n", s.n, s.n == 1 ? "" : "s");
    return 0;
}

/* ---- stats ---- */

static void group_json(json_out *o, const cache_group_stats *g)
{
    json_begin_object(o);
    if (g->op[0]) {
        json_key(o, "op");
        json_string(o, g->op);
        json_key(o, "arch");
        json_string(o, g->arch);
    }
    const struct { const char *k; long long v; } nums[] = {
        {"kernels", g->kernels},       {"cubin_bytes", g->cubin_bytes}, {"ptx_bytes", g->ptx_bytes},
        {"source_bytes", g->source_bytes}, {"hits", g->hits},          {"used", g->used}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        json_key(o, nums[i].k);
        json_int_out(o, nums[i].v);
    }
    json_key(o, "hit_rate");
    json_double(o, cache_admin_hit_rate(g));
    json_key(o, "compile_ms");
    json_double(o, g->compile_ms);
    json_key(o, "saved_ms");
    json_double(o, g->saved_ms);
    json_end_object(o);
}

static void group_text(const cache_group_stats *g, const char *op, const char *arch)
{
    char b1[32], b2[32], b3[32];
    printf("%-12s  %-8s  %7lld  %10s  %10s  %10s  %6lld  %5lld  %7.1f%%  %8.2f s  %8.2f s\n", op,
           arch, g->kernels, human_bytes(g->cubin_bytes, b1), human_bytes(g->ptx_bytes, b2),
           human_bytes(g->source_bytes, b3), g->hits, g->used, 100.0 * cache_admin_hit_rate(g),
           g->compile_ms / 1000.0, g->saved_ms / 1000.0);
}

static int cmd_stats(dump *d)
{
    cache_stats s;
    if (cache_admin_stats(&d->err, d->c, &s) != STOF_OK)
        return fail_lib(d, "stats");
    if (d->a->json) {
        json_out o;
        begin_doc(&o, d, NULL);
        const struct { const char *k; long long v; } nums[] = {
            {"schema", s.schema}, {"file_bytes", s.file_bytes}, {"wal_bytes", s.wal_bytes},
            {"kernels", s.total.kernels}, {"tuning", s.tuning}, {"derived", s.derived},
            {"derived_bytes", s.derived_bytes}};
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
            json_key(&o, nums[i].k);
            json_int_out(&o, nums[i].v);
        }
        json_key(&o, "groups");
        json_begin_array(&o);
        for (int i = 0; i < s.n_groups; i++)
            group_json(&o, &s.groups[i]);
        json_end_array(&o);
        json_key(&o, "total");
        group_json(&o, &s.total);
        json_key(&o, "remote");
        json_begin_object(&o);
        const struct { const char *k; long long v; } rem[] = {
            {"hits", s.remote.hits},       {"misses", s.remote.misses},
            {"refused", s.remote.refused}, {"written", s.remote.written},
            {"errors", s.remote.errors}};
        for (size_t i = 0; i < sizeof rem / sizeof rem[0]; i++) {
            json_key(&o, rem[i].k);
            json_int_out(&o, rem[i].v);
        }
        json_end_object(&o);
        json_end_object(&o);
        json_out_end(&o);
    } else {
        char b1[32], b2[32];
        printf("cache     %s (schema %d; %s file, %s WAL)\n", cache_file(d->c), s.schema,
               human_bytes(s.file_bytes, b1), human_bytes(s.wal_bytes, b2));
        printf("versions  stof %s, NVRTC %s\n\n", stof_version(), nvrtc_version_string());
        printf("%-12s  %-8s  %7s  %10s  %10s  %10s  %6s  %5s  %8s  %10s  %10s\n", "OP", "ARCH",
               "KERNELS", "BINARIES", "PTX", "SOURCES", "HITS", "USED", "HIT RATE", "COMPILE",
               "SAVED");
        for (int i = 0; i < s.n_groups; i++)
            group_text(&s.groups[i], s.groups[i].op, s.groups[i].arch);
        group_text(&s.total, "total", "");
        printf("\ntuning records: %lld\n", s.tuning);
        char b3[32];
        printf("derived rows:   %lld (%s: masks' hashes and tiles, kernels' binary sums, so that "
               "cached plans walk no mask and load no PTX; remade on a miss)\n",
               s.derived, human_bytes(s.derived_bytes, b3));
        if (s.remote_used)
            printf("remote tier:    %lld hit%s, %lld miss%s, %lld refused, %lld written, "
                   "%lld failed exchange%s (counted on this host)\n",
                   s.remote.hits, s.remote.hits == 1 ? "" : "s", s.remote.misses,
                   s.remote.misses == 1 ? "" : "es", s.remote.refused, s.remote.written,
                   s.remote.errors, s.remote.errors == 1 ? "" : "s");
        else
            printf("remote tier:    never used with this file\n");
        printf("hit rate = hits / (hits + kernels): lookups that found their kernel here instead\n"
               "of compiling it; saved = NVRTC time those hits did not spend\n");
    }
    cache_stats_free(&s);
    return 0;
}

/* ---- check ---- */

/* Whether the library would load from this file; why when not. */
static char g_untrusted[1600];

static int check_failed(const cache_check *k)
{
    return strcmp(k->integrity, "ok") != 0 || k->damaged > 0 || k->bad_records > 0 ||
           g_untrusted[0];
}

static void check_json(dump *d, const cache_check *k)
{
    json_out o;
    begin_doc(&o, d, NULL);
    json_key(&o, "ok");
    json_bool(&o, !check_failed(k));
    json_key(&o, "integrity");
    json_string(&o, k->integrity);
    json_key(&o, "trusted");
    json_bool(&o, !g_untrusted[0]);
    if (g_untrusted[0]) {
        json_key(&o, "untrusted");
        json_string(&o, g_untrusted);
    }
    const struct { const char *k; long long v; } nums[] = {
        {"kernels", k->kernels},       {"tuning", k->tuning},           {"damaged", k->damaged},
        {"stale_kernels", k->stale_kernels}, {"stale_tuning", k->stale_tuning},
        {"orphans", k->orphans},       {"bad_records", k->bad_records}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        json_key(&o, nums[i].k);
        json_int_out(&o, nums[i].v);
    }
    json_key(&o, "problems");
    json_begin_array(&o);
    for (int i = 0; i < k->n_problems; i++) {
        json_begin_object(&o);
        json_key(&o, "kind");
        json_string(&o, cache_problem_name(k->problems[i].kind));
        json_key(&o, "key");
        json_string(&o, k->problems[i].key);
        json_key(&o, "what");
        json_string(&o, k->problems[i].what);
        json_end_object(&o);
    }
    json_end_array(&o);
    json_end_object(&o);
    json_out_end(&o);
}

static void check_text(dump *d, const cache_check *k)
{
    printf("cache      %s\n", cache_file(d->c));
    printf("versions   stof %s, NVRTC %s\n", stof_version(), nvrtc_version_string());
    printf("integrity  %s\n", k->integrity);
    if (g_untrusted[0])
        printf("trust      REFUSED: %s; the library will not load kernels from this file\n",
               g_untrusted);
    else
        printf("trust      ok (only its owner can write the file and its folder)\n");
    printf("kernels    %lld (%lld damaged, %lld stale)\n", k->kernels, k->damaged, k->stale_kernels);
    printf("tuning     %lld (%lld stale, %lld orphaned, %lld unreadable)\n", k->tuning,
           k->stale_tuning, k->orphans, k->bad_records);
    for (int i = 0; i < k->n_problems; i++)
        printf("%-10s %-12.12s %s\n", cache_problem_name(k->problems[i].kind),
               k->problems[i].key[0] ? k->problems[i].key : "-", k->problems[i].what);
    if (check_failed(k) && strcmp(k->integrity, "ok") != 0)
        printf("result     DAMAGED: SQLite cannot read the whole file; `stof-dump --cache %s "
               "recover NEW.db`\n           copies every intact entry into a new file and lists "
               "what was lost\n",
               cache_file(d->c));
    else if (g_untrusted[0] && strcmp(k->integrity, "ok") == 0 && k->damaged + k->bad_records == 0)
        printf("result     UNTRUSTED: others could have written this file; fix its permissions "
               "(see trust), or rebuild it\n");
    else if (check_failed(k))
        printf("result     DAMAGED: damaged rows are never used (they are recompiled); "
               "`stof-dump prune --stale` removes them\n");
    else if (k->stale_kernels + k->stale_tuning + k->orphans > 0)
        printf("result     ok (stale rows are ignored and `prune --stale` removes them; an "
               "orphaned tuning row's kernel is recompiled when needed)\n");
    else
        printf("result     ok\n");
}

static int cmd_check(dump *d)
{
    cache_check k;
    char why[sizeof g_untrusted];
    g_untrusted[0] = 0;
    if (!cache_trusted(cache_file(d->c), cache_shared_from_env(), why, sizeof why))
        snprintf(g_untrusted, sizeof g_untrusted, "%s", why);
    if (cache_admin_check(&d->err, d->c, &k) != STOF_OK)
        return fail_lib(d, "check");
    if (d->a->json)
        check_json(d, &k);
    else
        check_text(d, &k);
    int rc = check_failed(&k) ? EXIT_FINDING : 0;
    cache_check_free(&k);
    return rc;
}

/* ---- prune, export, import ---- */

static int parse_size(const char *s, long long *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mult = 1;
    if (*end && !end[1] && strchr("kKmMgG", *end))
        mult = tolower((unsigned char)*end) == 'k' ? 1024.0
             : tolower((unsigned char)*end) == 'm' ? 1048576.0 : 1073741824.0;
    else if (*end)
        return 0;
    if (errno || end == s || !(v * mult >= 1) || v * mult > 9e18)
        return 0;
    *out = (long long)(v * mult);
    return 1;
}

static int cmd_prune(dump *d)
{
    cache_prune_opts o = {0};
    const args *a = d->a;
    if (!a->older_than && !a->max_bytes && !a->stale)
        return usage_error("prune needs --older-than DAYS, --max-bytes N or --stale");
    if (a->older_than) {
        char *end;
        o.older_than_days = strtod(a->older_than, &end);
        if (*end || end == a->older_than || !(o.older_than_days > 0) || o.older_than_days > 1e6)
            return usage_error("--older-than wants a positive number of days, not \"%s\"",
                               a->older_than);
    }
    if (a->max_bytes && !parse_size(a->max_bytes, &o.max_bytes))
        return usage_error("--max-bytes wants a size such as 500M (at least 1 byte), not \"%s\"",
                           a->max_bytes);
    o.stale = a->stale;
    cache_prune_result r;
    if (cache_admin_prune(&d->err, d->c, &o, &r) != STOF_OK)
        return fail_lib(d, "prune");
    char b[32];
    if (r.kernels + r.tuning + r.derived == 0)
        printf("nothing to prune\n");
    else
        printf("pruned %lld kernel%s (%s), %lld tuning record%s and %lld derived row%s%s\n",
               r.kernels, r.kernels == 1 ? "" : "s", human_bytes(r.bytes, b), r.tuning,
               r.tuning == 1 ? "" : "s", r.derived, r.derived == 1 ? "" : "s",
               r.compacted ? "; the file was compacted" : "");
    return 0;
}

static int cmd_export(dump *d)
{
    cache_stats s;
    if (cache_admin_export(&d->err, d->c, d->a->operand) != STOF_OK)
        return fail_lib(d, "export");
    if (cache_admin_stats(&d->err, d->c, &s) == STOF_OK) {
        char b[32];
        struct stat st;
        long long size = stat(d->a->operand, &st) == 0 ? (long long)st.st_size : 0;
        printf("exported %lld kernel%s and %lld tuning record%s to %s (%s)\n", s.total.kernels,
               s.total.kernels == 1 ? "" : "s", s.tuning, s.tuning == 1 ? "" : "s", d->a->operand,
               human_bytes(size, b));
        cache_stats_free(&s);
    }
    return 0;
}

static int cmd_import(dump *d)
{
    cache_import_result r;
    if (cache_admin_import(&d->err, d->c, d->a->operand, &r) != STOF_OK)
        return fail_lib(d, "import");
    printf("imported from %s into %s\n", d->a->operand, cache_file(d->c));
    printf("kernels  %lld added, %lld already here, %lld damaged (skipped), %lld stale (skipped)\n",
           r.kernels_added, r.kernels_present, r.kernels_damaged, r.kernels_stale);
    printf("tuning   %lld added, %lld kept (as new or newer here), %lld stale (skipped)\n",
           r.tuning_added, r.tuning_kept, r.tuning_stale);
    return 0;
}

/* ---- recover ---- */

static void recover_json(const char *src, const char *dst, const cache_salvage *r)
{
    json_out o;
    json_out_init(&o, stdout, 1);
    json_begin_object(&o);
    json_key(&o, "source");
    json_string(&o, src);
    json_key(&o, "output");
    json_string(&o, dst);
    const struct { const char *k; long long v; } nums[] = {
        {"page_size", r->page_size},         {"pages_expected", r->pages_expected},
        {"pages_present", r->pages_present}, {"wal_frames", r->wal_frames},
        {"free_pages", r->free_pages},       {"kernels", r->kernels},
        {"stale_kernels", r->stale_kernels}, {"tuning", r->tuning},
        {"kernels_damaged", r->kernels_damaged}, {"kernels_cut", r->kernels_cut},
        {"kernels_unseen", r->kernels_unseen},   {"tuning_cut", r->tuning_cut},
        {"tuning_unseen", r->tuning_unseen}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        json_key(&o, nums[i].k);
        json_int_out(&o, nums[i].v);
    }
    json_key(&o, "lost");
    json_begin_array(&o);
    for (int i = 0; i < r->n_lost; i++) {
        json_begin_object(&o);
        json_key(&o, "key");
        json_string(&o, r->lost[i].key);
        json_key(&o, "what");
        json_string(&o, r->lost[i].what);
        json_end_object(&o);
    }
    json_end_array(&o);
    json_end_object(&o);
    json_out_end(&o);
}

static void recover_text(const char *src, const char *dst, const cache_salvage *r)
{
    long long lost_k = r->kernels_damaged + r->kernels_cut + r->kernels_unseen;
    long long lost_t = r->tuning_cut + r->tuning_unseen;
    long long missing = r->pages_expected - r->pages_present;
    printf("recovered  %s into %s\n", src, dst);
    printf("pages      %lld of %lld present (%lld missing; %d-byte pages), %lld WAL frame%s, "
           "%lld free\n",
           r->pages_present, r->pages_expected, missing, r->page_size, r->wal_frames,
           r->wal_frames == 1 ? "" : "s", r->free_pages);
    printf("kernels    %lld kept (%lld stale), %lld lost: %lld cut off, %lld damaged, %lld named by "
           "the key index only\n",
           r->kernels, r->stale_kernels, lost_k, r->kernels_cut, r->kernels_damaged,
           r->kernels_unseen);
    printf("tuning     %lld kept, %lld lost: %lld cut off, %lld named by their index only\n",
           r->tuning, lost_t, r->tuning_cut, r->tuning_unseen);
    for (int i = 0; i < r->n_lost; i++)
        printf("lost       %-12.12s %s\n", r->lost[i].key[0] ? r->lost[i].key : "-",
               r->lost[i].what);
    if (missing > 0)
        printf("note       rows on the %lld missing page%s that no surviving index names cannot "
               "be counted\n",
               missing, missing == 1 ? "" : "s");
    printf("result     %s\n", lost_k + lost_t || missing > 0 ? "entries may be lost (above)"
                                                           : "nothing lost");
    printf("next       `stof-dump --cache %s check`; to use it, remove %s and its -wal and -shm "
           "files and move %s there\n",
           dst, src, dst);
}

/* Reads the damaged file itself: no SQLite connection ever opens it. */
static int cmd_recover(err_record *err, const args *a, const char *src)
{
    cache_salvage r;
    if (cache_recover(err, src, a->operand, nvrtc_version_string(), &r) != STOF_OK) {
        fprintf(stderr, "stof-dump: %s\n", err->msg);
        return EXIT_USAGE;
    }
    if (a->json)
        recover_json(src, a->operand, &r);
    else
        recover_text(src, a->operand, &r);
    int lost = r.kernels_damaged + r.kernels_cut + r.kernels_unseen + r.tuning_cut +
                   r.tuning_unseen > 0 || r.pages_present < r.pages_expected;
    cache_salvage_free(&r);
    return lost ? EXIT_FINDING : 0;
}

/* ---- mask ---- */

/* An integer option in [lo, hi]; 0 on a bad value (after the message). */
static int int_option(const char *opt, const char *v, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) {
        usage_error("%s wants an integer from %d to %d, not \"%s\"", opt, lo, hi, v ? v : "");
        return 0;
    }
    *out = (int)x;
    return 1;
}

/* --block 64 or --block 128x64 (query rows x keys). */
static int block_option(const char *v, int *bq, int *bk)
{
    int a, b, n = 0;
    if (sscanf(v, "%d%n", &a, &n) == 1 && !v[n]) {
        b = a;
    } else if (!(sscanf(v, "%dx%d%n", &a, &b, &n) == 2 && !v[n])) {
        usage_error("--block wants N or BQxBK (16 to 256 each), not \"%s\"", v);
        return 0;
    }
    if (a < 16 || a > 256 || b < 16 || b > 256) {
        usage_error("--block sizes must be 16 to 256, not \"%s\"", v);
        return 0;
    }
    *bq = a;
    *bk = b;
    return 1;
}

static const char *engine_of(const mha_candidate *c)
{
    return c->wg == MHA_WS ? "wgmma-ws" : c->wg ? "wgmma" : "mma.sync";
}

static const char *kind_of(const mha_candidate *c) { return c->kind == ATTN_GATHER ? "gather" : "block"; }

/* The block map, one character a cell: '#' every block full, '.' every one
 * empty, '+' anything else; a cell is g x g blocks where the grid is wider
 * than 64. */
static void print_map(const unsigned char *map, int nqb, int nkb)
{
    int longer = nqb > nkb ? nqb : nkb, g = (longer + 63) / 64;
    int rows = (nqb + g - 1) / g, cols = (nkb + g - 1) / g;
    if (g == 1)
        printf("map        # full, + partial, . empty: a character a block, query blocks down, key "
               "blocks across\n");
    else
        printf("map        # all full, . all empty, + mixed or partial: a character for %d x %d "
               "blocks\n", g, g);
    if (cols >= 10) {
        printf("%11s", "");
        for (int c = 0; c < cols; c++)
            putchar(c % 10 == 0 ? (char)('0' + c / 10 % 10) : ' ');
        putchar('\n');
    }
    printf("%11s", "");
    for (int c = 0; c < cols; c++)
        putchar((char)('0' + c % 10));
    putchar('\n');
    for (int r = 0; r < rows; r++) {
        printf("%9d  ", r * g);
        for (int c = 0; c < cols; c++) {
            int full = 1, empty = 1;
            for (int i = r * g; i < (r + 1) * g && i < nqb; i++)
                for (int j = c * g; j < (c + 1) * g && j < nkb; j++) {
                    unsigned char b = map[(size_t)i * (size_t)nkb + (size_t)j];
                    full &= b == STOF_BLOCK_FULL;
                    empty &= b == STOF_BLOCK_EMPTY;
                }
            putchar(full ? '#' : empty ? '.' : '+');
        }
        putchar('\n');
    }
}

static void print_blocks(const stof_mask_info *in, const unsigned char *map)
{
    long long total = (long long)in->n_qblocks * in->n_kblocks;
    long long in_range = (long long)in->lq * in->lk;
    printf("entries    %lld of %lld allowed (%.1f%%); a row allows %d to %d keys (mean %.1f, %.1f "
           "run%s)%s\n",
           in->entries, in_range, 100.0 * in->density, in->row_min, in->row_max, in->row_mean,
           in->runs_mean, in->runs_mean == 1.0 ? "" : "s",
           in->empty_rows ? "; some rows allow none" : "");
    printf("blocks     %d x %d: %d x %d = %lld blocks: %lld full, %lld partial, %lld empty\n",
           in->block_q, in->block_k, in->n_qblocks, in->n_kblocks, total, in->blocks_full,
           in->blocks_partial, total - in->blocks_touched);
    printf("           a block kernel walks %.1f%% of the dense work; %.1f%% of what it walks is "
           "allowed\n",
           100.0 * in->block_density, 100.0 * in->block_efficiency);
    if (in->blocks_partial)
        printf("           partial blocks are %.1f%% allowed on average (%lld distinct bitmaps); "
               "only they need masking\n",
               100.0 * in->partial_fill_mean, in->distinct_bitmaps);
    print_map(map, in->n_qblocks, in->n_kblocks);
}

/* The ranking, and a sentence on why the first won. */
static void print_model(const stof_mha_desc *d, const char *arch, const model_device *md,
                        const stof_mask_info *at64, const mha_ranked *r, int n)
{
    printf("model      b=%d h=%d d=%d %s on %s, %s figures (%d SMs; dense attention %.0f "
           "TFLOP/s on mma.sync",
           d->batch, d->heads, d->head_dim, d->dtype == STOF_BF16 ? "bf16" : "fp16", arch,
           md->measured ? "this GPU's measured" : "the arch's default", md->sm_count,
           md->mma_tflops);
    if (md->wgmma_tflops > 0)
        printf(", %.0f on wgmma, %.0f warp-specialized", md->wgmma_tflops, md->ws_tflops);
    printf("; %.0f GB/s)\n", md->mem_gbs);
    if (at64->block_efficiency < MHA_GATHER_BELOW)
        printf("           block efficiency at 64 x 64 is %.1f%%, below %.0f%%: the gather kind "
               "(rows grouped by shared keys, keys compacted into dense tiles) competes too\n",
               100.0 * at64->block_efficiency, 100.0 * MHA_GATHER_BELOW);
    else
        printf("           block efficiency at 64 x 64 is %.1f%% (%.0f%% or more): block tiles "
               "waste little, so only the block kind competes\n",
               100.0 * at64->block_efficiency, 100.0 * MHA_GATHER_BELOW);
    printf("  rank     %-7s %-9s %-17s %-36s %s\n", "KIND", "ENGINE", "TILE", "WALKS PER HEAD",
           "PREDICTED");
    int shown = n < 8 ? n : 8;
    for (int i = 0; i < shown; i++) {
        const mha_candidate *c = &r[i].c;
        long long dense = (long long)((d->seq_q + c->bm - 1) / c->bm) * ((d->seq_k + c->bn - 1) / c->bn);
        char tile[32], walks[96];
        if (c->wg)
            snprintf(tile, sizeof tile, "%dx%d %d stages", c->bm, c->bn, c->st);
        else
            snprintf(tile, sizeof tile, "%dx%d%s%s", c->bm, c->bn, c->mt == 2 ? " 2 rows" : "",
                     c->qs ? " q smem" : "");
        snprintf(walks, sizeof walks, "%lld of %lld tiles (%.1f%%), %lld full", r[i].tiles, dense,
                 dense ? 100.0 * (double)r[i].tiles / (double)dense : 0.0, r[i].full_tiles);
        printf("  %4d     %-7s %-9s %-17s %-36s %.4f ms\n", i + 1, kind_of(c), engine_of(c), tile,
               walks, r[i].predicted_ms);
    }
    if (n > shown)
        printf("  ... and %d more candidates\n", n - shown);
    if (n == 0)
        return;
    const mha_ranked *w = &r[0], *other = NULL;
    for (int i = 1; i < n && !other; i++)
        if (r[i].c.kind != w->c.kind)
            other = &r[i];
    printf("pick       %s on %s, %d x %d tiles: predicted %.4f ms", kind_of(&w->c), engine_of(&w->c),
           w->c.bm, w->c.bn, w->predicted_ms);
    if (other && other->predicted_ms > 0)
        printf(", %.2fx ahead of the best %s kernel (%s %dx%d, %.4f ms)",
               other->predicted_ms / w->predicted_ms, kind_of(&other->c), engine_of(&other->c),
               other->c.bm, other->c.bn, other->predicted_ms);
    printf("\n           the model's first choice; on a GPU the search (stof_mha_plan_create, "
           "stof-warm) times the best few\n           and keeps the fastest: `stof-dump tuning "
           "--mask SPEC` shows what it kept\n");
}

static int cmd_mask(const args *a)
{
    int lq = 0, lk = 0, bq = 64, bk = 64, batch = 8, heads = 12, hd = 64;   /* BERT-base */
    if (!a->lq)
        return usage_error("mask needs --lq N (the query rows; --lk N the keys, when they differ)");
    if (!int_option("--lq", a->lq, 1, 1 << 24, &lq))
        return EXIT_USAGE;
    lk = lq;
    if ((a->lk && !int_option("--lk", a->lk, 1, 1 << 24, &lk)) ||
        (a->block && !block_option(a->block, &bq, &bk)) ||
        (a->batch && !int_option("--batch", a->batch, 1, 65535, &batch)) ||
        (a->heads && !int_option("--heads", a->heads, 1, 65535, &heads)) ||
        (a->head_dim && !int_option("--head-dim", a->head_dim, 32, 128, &hd)))
        return EXIT_USAGE;
    stof_dtype dt = STOF_F16;
    if (a->dtype && strcmp(a->dtype, "fp16") != 0) {
        if (strcmp(a->dtype, "bf16") != 0)
            return usage_error("--dtype wants fp16 or bf16, not \"%s\"", a->dtype);
        dt = STOF_BF16;
    }
    const char *arch = a->arch ? a->arch : "sm_90a";
    stof_options opt = {.no_cache = 1, .arch = arch};
    stof_ctx *ctx = NULL;
    if (stof_open(&ctx, &opt) != STOF_OK)
        return usage_error("--arch %s: %s", arch, stof_last_error(NULL));
    stof_mask *m = NULL;
    int rc = 0;
    unsigned char *map = NULL;
    stof_mask_info in, at64;
    if (stof_mask_parse(ctx, a->operand, lq, lk, &m) != STOF_OK) {
        rc = usage_error("bad mask: %s", stof_last_error(ctx));
        goto done;
    }
    if (stof_mask_stats(ctx, m, bq, bk, &in) != STOF_OK ||
        stof_mask_stats(ctx, m, 64, 64, &at64) != STOF_OK) {
        rc = usage_error("%s", stof_last_error(ctx));
        goto done;
    }
    map = malloc((size_t)in.n_qblocks * (size_t)in.n_kblocks);
    if (!map || stof_mask_block_map(ctx, m, bq, bk, map) != STOF_OK) {
        fprintf(stderr, "stof-dump: %s\n", map ? stof_last_error(ctx) : "out of memory");
        rc = EXIT_FINDING;
        goto done;
    }
    char hash[65] = "";
    stof_mask_hash(m, hash);
    printf("mask       %s over %d query rows x %d keys (hash %.12s)\n", stof_mask_spec(m), lq, lk,
           hash);
    print_blocks(&in, map);
    stof_mha_desc d = {.batch = batch, .heads = heads, .seq_q = lq, .seq_k = lk, .head_dim = hd,
                       .dtype = dt};
    mha_ranked r[MHA_MAX_CANDIDATES];
    int n = 0;
    model_device md;
    if (mha_rank(ctx, &d, m, r, MHA_MAX_CANDIDATES, &n, &md) == STOF_OK)
        print_model(&d, arch, &md, &at64, r, n);
    else
        printf("model      no ranking: %s\n", stof_last_error(ctx));
    if (a->svg) {
        void *pic = NULL;
        size_t len = 0;
        if (stof_mask_picture(ctx, m, bq, bk, STOF_PICTURE_SVG, &pic, &len) != STOF_OK) {
            fprintf(stderr, "stof-dump: no picture: %s\n", stof_last_error(ctx));
            rc = EXIT_FINDING;
            goto done;
        }
        FILE *f = fopen(a->svg, "wb");
        int ok = f && fwrite(pic, 1, len, f) == len;
        ok = (f && fclose(f) == 0) && ok;
        stof_mask_picture_free(pic);
        if (!ok) {
            fprintf(stderr, "stof-dump: cannot write %s: %s\n", a->svg, strerror(errno));
            rc = EXIT_FINDING;
            goto done;
        }
        printf("picture    %s (SVG: %d x %d blocks of %d x %d; dark full, light partial, white "
               "empty)\n",
               a->svg, in.n_qblocks, in.n_kblocks, bq, bk);
    }
done:
    free(map);
    stof_mask_free(m);
    stof_close(ctx);
    return rc;
}

/* ---- opening ---- */

/* "sm_" then two or three digits and at most one letter ("sm_90a"). */
static int arch_like(const char *a)
{
    if (strncmp(a, "sm_", 3) != 0)
        return 0;
    size_t d = strspn(a + 3, "0123456789"), rest = strlen(a + 3 + d);
    return d >= 2 && d <= 3 && (rest == 0 || (rest == 1 && islower((unsigned char)a[3 + d])));
}

static int known_filters(dump *d)
{
    static const char *const ops[] = {"layernorm", "mha", "layer", "layer-group", NULL};
    const char *op = d->a->op, *arch = d->a->arch;
    int ok = !op;
    for (const char *const *p = ops; op && *p && !ok; p++)
        ok = strcmp(*p, op) == 0;
    if (!ok && !cache_admin_has_op(d->c, op))
        return usage_error("unknown op \"%s\" (known: layernorm, mha, layer, layer-group)", op);
    if (arch && !arch_like(arch))
        return usage_error("unknown arch \"%s\" (expected sm_NN, e.g. sm_90a)", arch);
    return 0;
}

/* Resolves the path and refuses what is not (yet) a stof cache. */
static int cache_path(const args *a, char *path, size_t n)
{
    char why[1400];
    if (a->cache)
        snprintf(path, n, "%s", a->cache);
    else if (!cache_admin_default_path(path, n))
        return usage_error("no cache: STOF_CACHE is off and there is no home folder; pass "
                           "--cache PATH");
    if (strcmp(a->cmd, "import") == 0) {
        cache_probe_result p = cache_admin_probe(a->operand, why, sizeof why);
        if (p != CACHE_PROBE_OK) {
            fprintf(stderr, "stof-dump: cannot import: %s\n", why);
            return EXIT_USAGE;
        }
    }
    cache_probe_result p = cache_admin_probe(path, why, sizeof why);
    /* recover reads what SQLite would refuse. */
    if (strcmp(a->cmd, "recover") == 0 && p != CACHE_PROBE_ABSENT)
        return 0;
    if (p == CACHE_PROBE_BAD || p == CACHE_PROBE_DAMAGED ||
        (p == CACHE_PROBE_ABSENT && strcmp(a->cmd, "import") != 0)) {
        fprintf(stderr, "stof-dump: %s%s\n", why,
                p == CACHE_PROBE_ABSENT ? " (no stof cache there; nothing was created)" : "");
        if (p == CACHE_PROBE_DAMAGED)
            fprintf(stderr, "stof-dump: `stof-dump --cache '%s' recover NEW.db` copies every "
                            "intact entry into a new file and lists what was lost\n",
                    path);
        return EXIT_USAGE;
    }
    return 0;
}

static int run(dump *d)
{
    static const struct { const char *name; int (*fn)(dump *); } cmds[] = {
        {"list", cmd_list},   {"show", cmd_show},     {"tuning", cmd_tuning},
        {"stats", cmd_stats}, {"check", cmd_check},   {"prune", cmd_prune},
        {"export", cmd_export}, {"import", cmd_import}};
    int rc = known_filters(d);
    for (size_t i = 0; !rc && i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(d->a->cmd, cmds[i].name) == 0)
            return cmds[i].fn(d);
    return rc;
}

int main(int argc, char **argv)
{
    args a = {0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        }
    }
    int rc = parse_args(&a, argc, argv);
    if (!rc)
        rc = check_command(&a);
    /* A mask needs no cache. */
    if (!rc && strcmp(a.cmd, "mask") == 0)
        return cmd_mask(&a);
    char path[4096];
    if (!rc)
        rc = cache_path(&a, path, sizeof path);
    if (rc)
        return rc;
    stof_options opt = {.no_cache = 1};
    dump d = {.a = &a};
    if (stof_open(&d.ctx, &opt) != STOF_OK) {
        fprintf(stderr, "stof-dump: %s\n", stof_last_error(NULL));
        return EXIT_USAGE;
    }
    if (strcmp(a.cmd, "recover") == 0) {
        rc = cmd_recover(&d.err, &a, path);
        stof_close(d.ctx);
        return rc;
    }
    if (cache_open(&d.err, path, 0, nvrtc_version_string(), &d.c) != STOF_OK) {
        fprintf(stderr, "stof-dump: %s\n", d.err.msg);
        stof_close(d.ctx);
        return EXIT_USAGE;
    }
    rc = run(&d);
    fflush(stdout);
    cache_close(d.c);
    stof_close(d.ctx);
    return rc;
}
