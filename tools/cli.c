#include "tools/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void cli_begin(cli *c, const char *prog, void (*usage)(FILE *f), int fp32, int argc, char **argv)
{
    memset(c, 0, sizeof *c);
    c->prog = prog;
    c->usage = usage;
    c->fp32 = fp32;
    c->argc = argc;
    c->argv = argv;
    c->i = 1;
    c->o.dtype = STOF_F16;
    c->o.arch = "sm_90a";
    c->o.iters = 50;
    const char *seed = getenv("STOF_SEED");
    c->o.seed = seed && *seed ? strtoull(seed, NULL, 0) : (uint64_t)time(NULL);
}

void cli_fail(const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '%s --help'.\n", prog);
    va_end(ap);
    exit(2);
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

static int listed(const char *const *names, const char *s)
{
    for (; *names; names++)
        if (strcmp(*names, s) == 0)
            return 1;
    return 0;
}

/* One common option and its value, into c->o. */
static void common(cli *c, const char *opt, const char *val)
{
    cli_opts *o = &c->o;
    if (strcmp(opt, "--cache") == 0) {
        if (!*val)
            cli_fail(c->prog, "--cache needs a path");
        o->cache = val;
    } else if (strcmp(opt, "--dtype") == 0) {
        o->dtype = c->fp32 && strcmp(val, "fp32") == 0 ? STOF_F32
                   : strcmp(val, "fp16") == 0          ? STOF_F16
                   : strcmp(val, "bf16") == 0          ? STOF_BF16
                                                       : STOF_DTYPE_INVALID;
        if (!o->dtype)
            cli_fail(c->prog, "--dtype is %s, not \"%s\"", c->fp32 ? "fp32, fp16 or bf16" : "fp16 or bf16",
                     val);
    } else if (strcmp(opt, "--arch") == 0) {
        o->arch = val;
        o->arch_given = 1;
    } else if (strcmp(opt, "--iters") == 0) {
        o->iters = (int)cli_int(c, opt, val, 1, 100000);
    } else {
        o->seed = (uint64_t)cli_int(c, opt, val, 0, LLONG_MAX);
    }
}

int cli_next(cli *c, const char *const *own, const char **opt, const char **val)
{
    static const char *const with_value[] = {"--cache", "--dtype", "--arch", "--iters", "--seed",
                                             NULL};
    while (c->i < c->argc) {
        const char *arg = c->argv[c->i++], *o = arg, *v = NULL;
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof c->name) {
            snprintf(c->name, sizeof c->name, "%.*s", (int)(eq - arg), arg);
            o = c->name;
            v = eq + 1;
        }
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            c->usage(stdout);
            exit(0);
        }
        if (strcmp(o, "--no-cache") == 0) {
            c->o.no_cache = 1;
            continue;
        }
        const int is_common = listed(with_value, o);
        if (!is_common && !listed(own, o))
            cli_fail(c->prog, "unknown option \"%s\"", arg);
        if (!v) {
            if (c->i >= c->argc)
                cli_fail(c->prog, "%s needs a value", o);
            v = c->argv[c->i++];
        }
        if (!is_common) {
            *opt = o;
            *val = v;
            return 1;
        }
        common(c, o, v);
    }
    return 0;
}

void cli_end(cli *c)
{
    if (c->o.no_cache && c->o.cache)
        cli_fail(c->prog, "--cache and --no-cache contradict each other");
}
