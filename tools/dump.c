/*
 * stof-dump — looks into a stof kernel cache: lists kernels, shows one
 * kernel's source, PTX, SASS, compile log and parameters, prints tuning
 * records (winners, what they beat, the model's error), statistics and an
 * integrity check, prunes, and moves a warmed cache between machines.
 *
 * This file is its command line (read through cli.c, each command's options
 * and values checked before anything is opened), the cache it opens, and
 * the dispatch to the commands: dump_kernels (list, show), dump_tuning,
 * dump_stats, dump_check, dump_admin (prune, export, import, recover) and
 * dump_mask.
 *
 * It never creates a cache (except `import` and `recover`, whose purpose
 * that is) and changes one only in `prune` and `import`, each in one
 * transaction; `recover` only reads the damaged file.
 * Exit status (cli.h): 0 done, 1 a finding (check found damage; recover lost
 * entries; no SASS tool), 2 bad arguments, or no usable cache.
 */
#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "cache/cache_admin.h"
#include "codegen/nvrtc_drv.h"
#include "stof.h"
#include "tools/cli.h"
#include "tools/dump_admin.h"
#include "tools/dump_check.h"
#include "tools/dump_cmd.h"
#include "tools/dump_kernels.h"
#include "tools/dump_mask.h"
#include "tools/dump_stats.h"
#include "tools/dump_tuning.h"
#include "tools/workload.h"

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
    "  import FILE [--trust-source]              merge a stof cache file into this one\n"
    "  recover NEW.db [--json] [--trust-source]  copy every intact entry of a damaged cache\n"
    "                                            into a new file; list what was lost\n"
    "      --trust-source: import and recover refuse a source the library would not load\n"
    "      from (others could have written it); if you know where it came from, this\n"
    "      copies it anyway, and its kernels will then run as the cache's own\n"
    "  mask SPEC --lq N [--lk N] [--block BQxBK] [--svg FILE]\n"
    "       [--batch B] [--heads H] [--head-dim D] [--dtype fp16|bf16] [--arch ARCH]\n"
    "                                            a mask's blocks (full, partial, empty) and\n"
    "                                            the kernel the model picks for it, and why\n"
    "The cache: --cache PATH, else $STOF_CACHE, else $XDG_CACHE_HOME/stof/cache.db,\n"
    "else ~/.cache/stof/cache.db.\n";

static void usage(FILE *f) { fputs(USAGE, f); }

/* The options as given: which, and their values before they are checked. */
typedef struct given {
    unsigned bits;             /* OPT_* */
    const char *older_than, *max_bytes;
    const char *lq, *lk, *block, *batch, *heads, *head_dim, *dtype;
} given;

enum { OPT_OP = 1, OPT_ARCH = 2, OPT_MASK = 4, OPT_JSON = 8, OPT_PART = 16, OPT_OLDER = 32,
       OPT_MAX = 64, OPT_STALE = 128, OPT_LQ = 256, OPT_LK = 512, OPT_SVG = 1024,
       OPT_BLOCK = 2048, OPT_BATCH = 4096, OPT_HEADS = 8192, OPT_HDIM = 16384,
       OPT_DTYPE = 32768, OPT_TRUST = 65536 };
#define OPT_COUNT 17
#define MASK_OPTS (OPT_LQ | OPT_LK | OPT_SVG | OPT_BLOCK | OPT_BATCH | OPT_HEADS | OPT_HDIM | \
                   OPT_DTYPE | OPT_ARCH)

/* ---- the command line ---- */

/* One option and its value (NULL for a flag) into a and g. */
static void take_option(dump_args *a, given *g, const char *opt, const char *val)
{
    static const struct { const char *name; unsigned bit; size_t off; int in_args; } vals[] = {
        {"--op", OPT_OP, offsetof(dump_args, op), 1},
        {"--arch", OPT_ARCH, offsetof(dump_args, arch), 1},
        {"--mask", OPT_MASK, offsetof(dump_args, mask), 1},
        {"--svg", OPT_SVG, offsetof(dump_args, svg), 1},
        {"--older-than", OPT_OLDER, offsetof(given, older_than), 0},
        {"--max-bytes", OPT_MAX, offsetof(given, max_bytes), 0},
        {"--lq", OPT_LQ, offsetof(given, lq), 0},
        {"--lk", OPT_LK, offsetof(given, lk), 0},
        {"--block", OPT_BLOCK, offsetof(given, block), 0},
        {"--batch", OPT_BATCH, offsetof(given, batch), 0},
        {"--heads", OPT_HEADS, offsetof(given, heads), 0},
        {"--head-dim", OPT_HDIM, offsetof(given, head_dim), 0},
        {"--dtype", OPT_DTYPE, offsetof(given, dtype), 0}};
    for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
        if (strcmp(opt, vals[k].name) != 0)
            continue;
        char *base = vals[k].in_args ? (char *)a : (char *)g;
        *(const char **)(base + vals[k].off) = val;
        g->bits |= vals[k].bit;
        return;
    }
    if (strcmp(opt, "--json") == 0) {
        a->json = 1;
        g->bits |= OPT_JSON;
    } else if (strcmp(opt, "--stale") == 0) {
        a->stale = 1;
        g->bits |= OPT_STALE;
    } else if (strcmp(opt, "--trust-source") == 0) {
        a->trust_source = 1;
        g->bits |= OPT_TRUST;
    } else {
        if (a->part)
            cli_fail(DUMP_PROG, "show takes one of --source, --ptx, --sass, --log, --params "
                                "(got --%s and %s)", a->part, opt);
        a->part = opt + 2;
        g->bits |= OPT_PART;
    }
}

/* The name of the lowest option bit set in bits. */
static const char *option_name(unsigned bits)
{
    static const char *const names[OPT_COUNT] = {
        "--op",  "--arch", "--mask", "--json",  "a part (--source ...)", "--older-than",
        "--max-bytes", "--stale", "--lq", "--lk", "--svg", "--block", "--batch", "--heads",
        "--head-dim", "--dtype", "--trust-source"};
    for (int i = 0; i < OPT_COUNT; i++)
        if (bits & (1u << i))
            return names[i];
    return "?";
}

/* Which options and operand each command takes. */
static void check_command(const dump_args *a, unsigned bits)
{
    static const struct { const char *name; unsigned opts; int operand; } cmds[] = {
        {"list", OPT_OP | OPT_ARCH | OPT_JSON, 0}, {"show", OPT_PART, 1},
        {"tuning", OPT_OP | OPT_MASK | OPT_JSON, 0}, {"stats", OPT_JSON, 0},
        {"check", OPT_JSON, 0}, {"prune", OPT_OLDER | OPT_MAX | OPT_STALE, 0},
        {"export", 0, 1}, {"import", OPT_TRUST, 1}, {"recover", OPT_JSON | OPT_TRUST, 1},
        {"mask", MASK_OPTS, 1}};
    if (!a->cmd)
        cli_fail(DUMP_PROG, "no command given");
    for (size_t k = 0; k < sizeof cmds / sizeof cmds[0]; k++) {
        if (strcmp(a->cmd, cmds[k].name) != 0)
            continue;
        if (bits & ~cmds[k].opts)
            cli_fail(DUMP_PROG, "\"%s\" does not take %s", a->cmd,
                     option_name(bits & ~cmds[k].opts));
        if (cmds[k].operand && !a->operand)
            cli_fail(DUMP_PROG, "\"%s\" needs its operand (%s)", a->cmd,
                     strcmp(a->cmd, "mask") == 0 ? "a mask spec" : "a key or a file");
        if (!cmds[k].operand && a->operand)
            cli_fail(DUMP_PROG, "unexpected argument \"%s\"", a->operand);
        return;
    }
    cli_fail(DUMP_PROG, "unknown command \"%s\"", a->cmd);
}

/* ---- prune's and mask's values ---- */

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

static void prune_values(dump_args *a, const given *g)
{
    cache_prune_opts *o = &a->prune;
    if (!g->older_than && !g->max_bytes && !a->stale)
        cli_fail(DUMP_PROG, "prune needs --older-than DAYS, --max-bytes N or --stale");
    if (g->older_than) {
        char *end;
        o->older_than_days = strtod(g->older_than, &end);
        if (*end || end == g->older_than || !(o->older_than_days > 0) ||
            o->older_than_days > 1e6)
            cli_fail(DUMP_PROG, "--older-than wants a positive number of days, not \"%s\"",
                     g->older_than);
    }
    if (g->max_bytes && !parse_size(g->max_bytes, &o->max_bytes))
        cli_fail(DUMP_PROG, "--max-bytes wants a size such as 500M (at least 1 byte), not \"%s\"",
                 g->max_bytes);
    o->stale = a->stale;
}

/* --block 64 or --block 128x64 (query rows x keys). */
static void block_option(const char *v, int *bq, int *bk)
{
    int a, b, n = 0;
    if (sscanf(v, "%d%n", &a, &n) == 1 && !v[n])
        b = a;
    else if (!(sscanf(v, "%dx%d%n", &a, &b, &n) == 2 && !v[n]))
        cli_fail(DUMP_PROG, "--block wants N or BQxBK (16 to 256 each), not \"%s\"", v);
    if (a < 16 || a > 256 || b < 16 || b > 256)
        cli_fail(DUMP_PROG, "--block sizes must be 16 to 256, not \"%s\"", v);
    *bq = a;
    *bk = b;
}

/* The mask's sizes, BERT-base's unless given, held to what attention
 * supports (stof.h's limits), so that nothing runs for a shape it would refuse. */
static void mask_values(dump_args *a, const given *g, const cli *c)
{
    a->bq = a->bk = 64;
    a->batch = 8;
    a->heads = 12;
    a->head_dim = 64;
    a->dtype = STOF_F16;
    if (!g->lq)
        cli_fail(DUMP_PROG,
                 "mask needs --lq N (the query rows; --lk N the keys, when they differ)");
    a->lq = (int)cli_int(c, "--lq", g->lq, 1, 1 << 24);
    if (a->lq > STOF_MAX_SEQ)
        cli_fail(DUMP_PROG, "--lq %d is more than attention supports: query lengths go up to %d",
                 a->lq, STOF_MAX_SEQ);
    a->lk = g->lk ? (int)cli_int(c, "--lk", g->lk, 1, 1 << 24) : a->lq;
    if (a->lk > STOF_MAX_SEQ)
        cli_fail(DUMP_PROG, "--lk %d is more than attention supports: key lengths go up to %d",
                 a->lk, STOF_MAX_SEQ);
    if (g->block)
        block_option(g->block, &a->bq, &a->bk);
    if (g->batch)
        a->batch = (int)cli_int(c, "--batch", g->batch, 1, STOF_MAX_BATCH_HEADS);
    if (g->heads)
        a->heads = (int)cli_int(c, "--heads", g->heads, 1, STOF_MAX_BATCH_HEADS);
    if (g->head_dim)
        a->head_dim = (int)cli_int(c, "--head-dim", g->head_dim, 32, 128);
    char dims[64];
    if (!stof_mha_head_dim_supported(a->head_dim))
        cli_fail(DUMP_PROG, "--head-dim %d is not supported: attention takes head_dim %s",
                 a->head_dim, workload_mha_head_dims(dims, sizeof dims));
    if ((long long)a->batch * a->heads > STOF_MAX_BATCH_HEADS)
        cli_fail(DUMP_PROG, "--batch x --heads is %lld: attention takes at most %d",
                 (long long)a->batch * a->heads, STOF_MAX_BATCH_HEADS);
    if (g->dtype && strcmp(g->dtype, "fp16") != 0) {
        if (strcmp(g->dtype, "bf16") != 0)
            cli_fail(DUMP_PROG, "--dtype wants fp16 or bf16, not \"%s\"", g->dtype);
        a->dtype = STOF_BF16;
    }
}

/* Exits with CLI_EXIT_USAGE on a bad command line. */
static void parse_args(dump_args *a, int argc, char **argv)
{
    static const cli_option own[] = {
        {"--op", CLI_VALUE},     {"--arch", CLI_VALUE},       {"--mask", CLI_VALUE},
        {"--older-than", CLI_VALUE}, {"--max-bytes", CLI_VALUE}, {"--lq", CLI_VALUE},
        {"--lk", CLI_VALUE},     {"--svg", CLI_VALUE},        {"--block", CLI_VALUE},
        {"--batch", CLI_VALUE},  {"--heads", CLI_VALUE},      {"--head-dim", CLI_VALUE},
        {"--dtype", CLI_VALUE},  {"--json", CLI_FLAG},        {"--stale", CLI_FLAG},
        {"--source", CLI_FLAG},  {"--ptx", CLI_FLAG},         {"--sass", CLI_FLAG},
        {"--log", CLI_FLAG},     {"--params", CLI_FLAG},      {"--trust-source", CLI_FLAG},
        {NULL, 0}};
    given g = {0};
    cli c;
    cli_begin(&c, DUMP_PROG, usage, CLI_CACHE | CLI_OPERANDS, argc, argv);
    const char *opt, *val;
    while (cli_next(&c, own, &opt, &val)) {
        if (opt)
            take_option(a, &g, opt, val);
        else if (!a->cmd)
            a->cmd = val;
        else if (!a->operand)
            a->operand = val;
        else
            cli_fail(DUMP_PROG, "unexpected argument \"%s\"", val);
    }
    cli_end(&c);
    a->cache = c.o.cache;
    check_command(a, g.bits);
    if (strcmp(a->cmd, "prune") == 0)
        prune_values(a, &g);
    else if (strcmp(a->cmd, "mask") == 0)
        mask_values(a, &g, &c);
}

/* ---- the cache ---- */

/* "sm_" then two or three digits and at most one letter ("sm_90a"). */
static int arch_like(const char *a)
{
    if (strncmp(a, "sm_", 3) != 0)
        return 0;
    size_t d = strspn(a + 3, "0123456789"), rest = strlen(a + 3 + d);
    return d >= 2 && d <= 3 && (rest == 0 || (rest == 1 && islower((unsigned char)a[3 + d])));
}

static int known_filters(dump_cmd *d)
{
    static const char *const ops[] = {"layernorm", "mha", "layer", "layer-group", "decoder",
                                      NULL};
    const char *op = d->a->op, *arch = d->a->arch;
    int ok = !op;
    for (const char *const *p = ops; op && *p && !ok; p++)
        ok = strcmp(*p, op) == 0;
    if (!ok && !cache_admin_has_op(d->c, op))
        return cli_error(DUMP_PROG,
                         "unknown op \"%s\" (known: layernorm, mha, layer, layer-group, decoder)",
                         op);
    if (arch && !arch_like(arch))
        return cli_error(DUMP_PROG, "unknown arch \"%s\" (expected sm_NN, e.g. sm_90a)", arch);
    return 0;
}

/* Resolves the path and refuses what is not (yet) a stof cache; `check`
 * reports a file SQLite finds damaged as its finding. */
static int cache_path(const dump_args *a, char *path, size_t n)
{
    char why[1400];
    if (a->cache)
        snprintf(path, n, "%s", a->cache);
    else if (!cache_admin_default_path(path, n))
        return cli_error(DUMP_PROG, "no cache: STOF_CACHE is off and there is no home folder; "
                                    "pass --cache PATH");
    if (strcmp(a->cmd, "import") == 0) {
        cache_probe_result p = cache_admin_probe(a->operand, why, sizeof why);
        if (p != CACHE_PROBE_OK) {
            fprintf(stderr, "stof-dump: cannot import: %s\n", why);
            return CLI_EXIT_USAGE;
        }
    }
    cache_probe_result p = cache_admin_probe(path, why, sizeof why);
    /* recover reads what SQLite would refuse. */
    if (strcmp(a->cmd, "recover") == 0 && p != CACHE_PROBE_ABSENT)
        return 0;
    if (strcmp(a->cmd, "check") == 0 && p == CACHE_PROBE_DAMAGED)
        return dump_check_unreadable(path, why, a->json);
    if (p == CACHE_PROBE_BAD || p == CACHE_PROBE_DAMAGED ||
        (p == CACHE_PROBE_ABSENT && strcmp(a->cmd, "import") != 0)) {
        fprintf(stderr, "stof-dump: %s%s\n", why,
                p == CACHE_PROBE_ABSENT ? " (no stof cache there; nothing was created)" : "");
        if (p == CACHE_PROBE_DAMAGED)
            fprintf(stderr, "stof-dump: `stof-dump --cache '%s' recover NEW.db` copies every "
                            "intact entry into a new file and lists what was lost\n",
                    path);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

static int run(dump_cmd *d)
{
    static const struct { const char *name; int (*fn)(dump_cmd *); } cmds[] = {
        {"list", dump_kernels_list},  {"show", dump_kernels_show},  {"tuning", dump_tuning},
        {"stats", dump_stats},        {"check", dump_check},        {"prune", dump_admin_prune},
        {"export", dump_admin_export}, {"import", dump_admin_import}};
    int rc = known_filters(d);
    for (size_t i = 0; !rc && i < sizeof cmds / sizeof cmds[0]; i++)
        if (strcmp(d->a->cmd, cmds[i].name) == 0)
            return cmds[i].fn(d);
    return rc;
}

int main(int argc, char **argv)
{
    dump_args a = {0};
    parse_args(&a, argc, argv);
    /* A mask needs no cache. */
    if (strcmp(a.cmd, "mask") == 0)
        return dump_mask(&a);
    char path[4096];
    int rc = cache_path(&a, path, sizeof path);
    if (rc)
        return rc;
    stof_options opt = {.no_cache = 1};
    dump_cmd d = {.a = &a};
    if (stof_open(&d.ctx, &opt) != STOF_OK) {
        fprintf(stderr, "stof-dump: %s\n", stof_last_error(NULL));
        return CLI_EXIT_USAGE;
    }
    if (strcmp(a.cmd, "recover") == 0) {
        rc = dump_admin_recover(&d.err, &a, path);
        stof_close(d.ctx);
        return rc;
    }
    if (cache_open(&d.err, path, 0, nvrtc_version_string(), &d.c) != STOF_OK) {
        fprintf(stderr, "stof-dump: %s\n", d.err.msg);
        stof_close(d.ctx);
        return CLI_EXIT_USAGE;
    }
    rc = run(&d);
    fflush(stdout);
    cache_close(d.c);
    stof_close(d.ctx);
    return rc;
}
