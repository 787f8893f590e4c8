/*
 * cli — what the tools' command lines share (stof-dump, stof-warm and the
 * demos): options given as "--name value" or "--name=value"; flags; operands;
 * the common options a tool may take (--cache, --no-cache, --dtype, --arch,
 * --iters, --seed); --help or -h anywhere, which prints the program's usage
 * and then the exit statuses every tool shares, and exits 0; and a bad
 * command line's message, "PROG: why" and "Try 'PROG --help'.", with
 * status 2.
 */
#ifndef STOF_CLI_H
#define STOF_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "stof.h"

/* The exit statuses of every tool (CLI_EXIT_STATUSES says them to users). */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAILED 1          /* the work failed, or found damage */
#define CLI_EXIT_USAGE 2           /* a bad command line or bad input */
#define CLI_EXIT_INTERRUPTED 130   /* Ctrl-C (128 + SIGINT) */

/* The table every --help ends with; README.md's Tools section has the same
 * rows. */
extern const char CLI_EXIT_STATUSES[];

/* The common options a program takes (cli_begin's `takes`), and whether it
 * takes operands. */
enum {
    CLI_CACHE = 1,          /* --cache PATH */
    CLI_NO_CACHE = 2,       /* --no-cache */
    CLI_DTYPE = 4,          /* --dtype fp16|bf16 */
    CLI_FP32 = 8,           /* --dtype fp32 too */
    CLI_ARCH = 16,          /* --arch ARCH */
    CLI_ITERS = 32,         /* --iters N */
    CLI_SEED = 64,          /* --seed N */
    CLI_OPERANDS = 128,     /* arguments that are not options ("-" is one; "--" ends options) */
    CLI_DEMO = CLI_CACHE | CLI_NO_CACHE | CLI_DTYPE | CLI_ARCH | CLI_ITERS | CLI_SEED
};

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

/* One of a program's own options. */
typedef enum cli_takes {
    CLI_VALUE = 0,          /* --name VALUE or --name=VALUE */
    CLI_FLAG,               /* --name alone */
    CLI_OPTIONAL            /* --name alone, or --name=VALUE (never a separate value) */
} cli_takes;

typedef struct cli_option {
    const char *name;       /* "--rows" */
    cli_takes takes;
} cli_option;

typedef struct cli {
    const char *prog;
    void (*usage)(FILE *f);
    unsigned takes;         /* CLI_* bits */
    int argc, i, operands_only;
    char **argv;
    char name[32];
    cli_opts o;
} cli;

/* Prints the usage and the exit statuses, and exits 0, when an argument is
 * --help or -h. */
void cli_begin(cli *c, const char *prog, void (*usage)(FILE *f), unsigned takes, int argc,
               char **argv);

/* The next of the program's own options (`own`, ended by {NULL}): its name
 * into *opt, its value into *val (NULL for a flag, or an optional value not
 * given); or, with CLI_OPERANDS, the next operand: *opt NULL, the operand in
 * *val. 0 once the command line is read. Common options are taken into c->o
 * on the way. */
int cli_next(cli *c, const cli_option *own, const char **opt, const char **val);

/* After the last cli_next: refuses common options that contradict. */
void cli_end(cli *c);

/* "PROG: why" and "Try 'PROG --help'." on stderr; CLI_EXIT_USAGE. */
int cli_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* cli_error, then exit(CLI_EXIT_USAGE). */
void cli_fail(const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

/* s as an integer from lo to hi, else cli_fail naming opt. */
long long cli_int(const cli *c, const char *opt, const char *s, long long lo, long long hi);

/* "s" unless n is 1: "%d case%s". */
const char *cli_s(long long n);

#endif
