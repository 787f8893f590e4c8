/*
 * err — the error record every module reports into, on the bottom floor:
 * the sentence of the last failure, and with $STOF_DEBUG set, the file and
 * line it came from.
 * It knows no context's insides: a context holds one as its first member
 * (gpu/jit.h), so that CTX_FAIL reaches it through the opaque stof_ctx from
 * any floor, and a tool or a test that uses the cache or the compiler
 * without a context may hold its own. Also the status and dtype names
 * (stof_status_str, stof_version are public).
 */
#ifndef STOF_ERR_H
#define STOF_ERR_H

#include "stof.h"

typedef struct err_record {
    char msg[2048];
} err_record;

/* Writes the sentence (and " [file:line]" under $STOF_DEBUG) into err, which
 * may be NULL, and returns st. */
stof_status err_fail(err_record *err, stof_status st, const char *file, int line,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define ERR_FAIL(err, st, ...) err_fail((err), (st), __FILE__, __LINE__, __VA_ARGS__)

/* A context's error record, NULL for a NULL context: struct stof_ctx begins
 * with it (gpu/jit.h asserts so). */
static inline err_record *err_of(stof_ctx *ctx) { return (err_record *)(void *)ctx; }

/* Writes the sentence (with the file and line it came from) into ctx's
 * error record and returns st. */
#define CTX_FAIL(ctx, st, ...) ERR_FAIL(err_of(ctx), (st), __VA_ARGS__)

/* Checks a NULL argument of a public call. */
#define CTX_ARG(ctx, cond, name)                                                    \
    do {                                                                            \
        if (!(cond))                                                                \
            return CTX_FAIL((ctx), STOF_ERR_INVALID_ARG, "argument '%s' is invalid", \
                            (name));                                                \
    } while (0)

/* Evaluates a call returning stof_status and returns its failure. */
#define TRY(call)                       \
    do {                                \
        stof_status try_st_ = (call);   \
        if (try_st_ != STOF_OK)         \
            return try_st_;             \
    } while (0)

int dtype_size(stof_dtype t);      /* 0 for an invalid dtype */
const char *dtype_name(stof_dtype t);

#endif
