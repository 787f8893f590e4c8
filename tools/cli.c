#include "tools/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char CLI_EXIT_STATUSES[] =
    "Exit status:\n"
    "  0    success\n"
    "  1    the work failed or found damage (a case failed; check found a damaged cache)\n"
    "  2    a bad command line or bad input (an option, a workload, a mask, an unusable cache)\n"
    "  130  interrupted (Ctrl-C)\n";

static const struct { const char *name; unsigned bit; } COMMON[] = {
    {"--cache", CLI_CACHE}, {"--dtype", CLI_DTYPE}, {"--arch", CLI_ARCH},
    {"--iters", CLI_ITERS}, {"--seed", CLI_SEED}};

void cli_begin(cli *c, const char *prog, void (*usage)(FILE *f), unsigned takes, int argc,
               char **argv)
{
    memset(c, 0, sizeof *c);
    c->prog = prog;
    c->usage = usage;
    c->takes = takes;
    c->argc = argc;
    c->argv = argv;
    c->i = 1;
    c->o.dtype = STOF_F16;
    c->o.arch = "sm_90a";
    c->o.iters = 50;
    const char *seed = getenv("STOF_SEED");
    c->o.seed = seed && *seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL);
    /* Help wins over whatever else the line holds. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            fputs(CLI_EXIT_STATUSES, stdout);
            exit(CLI_EXIT_OK);
        }
    }
}

static int verror(const char *prog, const char *fmt, va_list ap)
{
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '%s --help'.\n", prog);
    return CLI_EXIT_USAGE;
}

int cli_error(const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(prog, fmt, ap);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

void cli_fail(const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(prog, fmt, ap);
    va_end(ap);
    exit(CLI_EXIT_USAGE);
}

long long cli_int(const cli *c, const char *opt, const char *s, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        cli_fail(c->prog, "%s wants an integer from %lld to %lld, not \"%s\"", opt, lo, hi, s);
    return v;
}

const char *cli_s(long long n) { return n == 1 ? "" : "s"; }

/* The common option named s, if the program takes it: its bit, else 0. */
static unsigned common_bit(const cli *c, const char *s)
{
    for (size_t k = 0; k < sizeof COMMON / sizeof COMMON[0]; k++)
        if (strcmp(COMMON[k].name, s) == 0)
            return c->takes & COMMON[k].bit;
    return 0;
}

static const cli_option *own_option(const cli_option *own, const char *s)
{
    for (; own && own->name; own++)
        if (strcmp(own->name, s) == 0)
            return own;
    return NULL;
}

/* One common option and its value, into c->o. */
static void common(cli *c, unsigned bit, const char *opt, const char *val)
{
    cli_opts *o = &c->o;
    const int fp32 = (c->takes & CLI_FP32) != 0;
    if (bit == CLI_CACHE) {
        if (!*val)
            cli_fail(c->prog, "--cache needs a path");
        o->cache = val;
    } else if (bit == CLI_DTYPE) {
        o->dtype = fp32 && strcmp(val, "fp32") == 0 ? STOF_F32
                   : strcmp(val, "fp16") == 0       ? STOF_F16
                   : strcmp(val, "bf16") == 0       ? STOF_BF16
                                                    : STOF_DTYPE_INVALID;
        if (!o->dtype)
            cli_fail(c->prog, "--dtype is %s, not \"%s\"",
                     fp32 ? "fp32, fp16 or bf16" : "fp16 or bf16", val);
    } else if (bit == CLI_ARCH) {
        o->arch = val;
        o->arch_given = 1;
    } else if (bit == CLI_ITERS) {
        o->iters = (int)cli_int(c, opt, val, 1, 100000);
    } else {
        o->seed = (uint64_t)cli_int(c, opt, val, 0, LLONG_MAX);
    }
}

int cli_next(cli *c, const cli_option *own, const char **opt, const char **val)
{
    const int operands = (c->takes & CLI_OPERANDS) != 0;
    while (c->i < c->argc) {
        const char *arg = c->argv[c->i++], *o = arg, *v = NULL;
        if (operands && (c->operands_only || arg[0] != '-' || !arg[1])) {
            *opt = NULL;
            *val = arg;
            return 1;
        }
        if (operands && strcmp(arg, "--") == 0) {
            c->operands_only = 1;
            continue;
        }
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof c->name) {
            snprintf(c->name, sizeof c->name, "%.*s", (int)(eq - arg), arg);
            o = c->name;
            v = eq + 1;
        }
        if ((c->takes & CLI_NO_CACHE) && strcmp(o, "--no-cache") == 0) {
            if (v)
                cli_fail(c->prog, "--no-cache takes no value");
            c->o.no_cache = 1;
            continue;
        }
        const unsigned bit = common_bit(c, o);
        const cli_option *mine = bit ? NULL : own_option(own, o);
        if (!bit && !mine)
            cli_fail(c->prog, "unknown option \"%s\"", arg);
        const cli_takes takes = mine ? mine->takes : CLI_VALUE;
        if (takes == CLI_FLAG && v)
            cli_fail(c->prog, "%s takes no value", o);
        if (takes == CLI_VALUE && !v) {
            if (c->i >= c->argc)
                cli_fail(c->prog, "%s needs a value", o);
            v = c->argv[c->i++];
        }
        if (mine) {
            *opt = mine->name;
            *val = v;
            return 1;
        }
        common(c, bit, o, v);
    }
    return 0;
}

void cli_end(cli *c)
{
    if (c->o.no_cache && c->o.cache)
        cli_fail(c->prog, "--cache and --no-cache contradict each other");
}
