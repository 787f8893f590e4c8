/*
 * dump_cmd — what every stof-dump command shares: its command line, read and
 * checked (dump_args), the context and cache it works on (dump_cmd), and how
 * the commands print sizes, times, a JSON document's head and a library
 * failure.
 */
#ifndef STOF_DUMP_CMD_H
#define STOF_DUMP_CMD_H

#include "base/json.h"
#include "cache/cache.h"
#include "cache/cache_admin.h"
#include "stof.h"

#define DUMP_PROG "stof-dump"

typedef struct dump_args {
    const char *cmd, *operand;
    const char *cache, *op, *arch, *mask, *part;
    int json, stale;
    int trust_source;                     /* import, recover: the user vouches for the
                                             source file (--trust-source) */
    cache_prune_opts prune;               /* prune: --older-than, --max-bytes, --stale */
    /* mask: the sizes, checked against what attention supports */
    const char *svg;
    int lq, lk, bq, bk, batch, heads, head_dim;
    stof_dtype dtype;
} dump_args;

typedef struct dump_cmd {
    stof_ctx *ctx;             /* for masks */
    err_record err;            /* the cache's last failure */
    cache *c;
    const dump_args *a;
} dump_cmd;

/* "1.5 MiB", "12 B". */
const char *dump_cmd_bytes(long long n, char buf[32]);
/* A time as "2026-11-27 10:42:00", or "-" for none. */
const char *dump_cmd_when(long long t, char buf[32]);

/* Opens the JSON document on stdout with the cache and the versions; with
 * list_name, opens that array too. */
void dump_cmd_doc(json_out *o, const char *cache_path, const char *list_name);

/* "stof-dump: WHAT: why" from the cache's failure; CLI_EXIT_USAGE. */
int dump_cmd_fail(const dump_cmd *d, const char *what);

#endif
