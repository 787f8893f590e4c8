/*
 * cli — what the demos' command lines share: options given as "--name
 * value" or "--name=value"; the common ones (--cache, --no-cache, --dtype,
 * --arch, --iters, --seed, and --help or -h, which prints the program's
 * usage and exits 0); and a bad command line's message, "PROG: why" and
 * "Try 'PROG --help'.", which ends the program with status 2.
 */
#ifndef STOF_CLI_H
#define STOF_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "stof.h"

/* The common options, with their defaults: stof's default cache, fp16,
 * sm_90a where there is no GPU, 50 timed repeats, $STOF_SEED else the clock. */
typedef struct cli_opts {
    const char *cache;      /* NULL: stof's default */
    int no_cache;
    stof_dtype dtype;
    const char *arch;       /* compile-only target where there is no GPU */
    int arch_given;
    int iters;
    uint64_t seed;
} cli_opts;

typedef struct cli {
    const char *prog;
    void (*usage)(FILE *f);
    int fp32;               /* --dtype takes fp32 too */
    int argc, i;
    char **argv;
    char name[32];
    cli_opts o;
} cli;

void cli_begin(cli *c, const char *prog, void (*usage)(FILE *f), int fp32, int argc, char **argv);

/* The next of the program's own options (`own`, a NULL-ended list; each
 * takes a value): its name into *opt, its value into *val; 0 once the
 * command line is read. Common options are taken into c->o on the way. */
int cli_next(cli *c, const char *const *own, const char **opt, const char **val);

/* After the last cli_next: refuses common options that contradict. */
void cli_end(cli *c);

/* "PROG: why" and "Try 'PROG --help'." on stderr, then exit(2). */
void cli_fail(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* s as an integer from lo to hi, else cli_fail naming opt. */
long long cli_int(const cli *c, const char *opt, const char *s, long long lo, long long hi);

#endif
