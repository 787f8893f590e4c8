/*
 * util — small helpers that several floors would otherwise each write
 * again: an array that grows by doubling, qsort's comparisons of plain
 * numbers, 64-bit min and max, and the tuning level a plan's search runs at.
 */
#ifndef STOF_UTIL_H
#define STOF_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include "stof.h"

/* Grows *p (realloc) to hold at least need elements of size sz, doubling
 * *cap from 64; 0, or -1 out of memory (then *p and *cap are as they were). */
int util_grow(void **p, long long *cap, long long need, size_t sz);

/* Ascending order for qsort and bsearch. */
int util_cmp_i32(const void *a, const void *b);
int util_cmp_u32(const void *a, const void *b);
int util_cmp_i64(const void *a, const void *b);
int util_cmp_float(const void *a, const void *b);
int util_cmp_double(const void *a, const void *b);

static inline int64_t util_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t util_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* The level asked for, or where that is STOF_TUNE_DEFAULT, $STOF_TUNE's
 * ("off" or "full"), else STOF_TUNE_FAST. */
stof_tune util_tune_level(stof_tune asked);

#endif
