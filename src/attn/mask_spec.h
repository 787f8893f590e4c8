/*
 * mask_spec — the mask spec language: the parser that reads a spec string
 * ("window:256+global:64", "causal&docs:1024,3072") into its terms and its
 * normal form, and what those terms allow on one query row (the random
 * term's generator included). It knows no stof_mask: attn/mask keeps the
 * parsed spec inside one and walks its rows through mask_spec_row.
 */
#ifndef STOF_MASK_SPEC_H
#define STOF_MASK_SPEC_H

#include <stdint.h>
#include "stof.h"

/* Keys lo .. hi-1 of one row. A row's ranges are sorted, disjoint and never
 * adjacent (a.hi < b.lo), and lie within [0, Lk). */
typedef struct mask_range {
    int32_t lo, hi;
} mask_range;

enum mask_spec_kind {
    MASK_SPEC_DENSE,
    MASK_SPEC_CAUSAL,
    MASK_SPEC_WINDOW,
    MASK_SPEC_CAUSAL_WINDOW,
    MASK_SPEC_DILATED,
    MASK_SPEC_GLOBAL,
    MASK_SPEC_STRIDED,
    MASK_SPEC_RANDOM,
    MASK_SPEC_DOCS
};

typedef struct mask_spec_term {
    enum mask_spec_kind kind;
    int and_prev;         /* joined to the previous term by '&' */
    int64_t a, b;         /* W, D, G, S; for random R and B */
    uint64_t seed;
    int rand_slot;        /* random terms: index of the evaluation's state */
    int n_docs;
    int32_t *doc_start;   /* n_docs + 1 prefix sums */
} mask_spec_term;

/* A parsed spec for Lq x Lk: a sum ('+') of products ('&') of terms, in the
 * order written. All zero for a mask that has no spec to evaluate. */
typedef struct mask_spec {
    int lq, lk;
    int n_terms, n_random;
    mask_spec_term *terms;
} mask_spec;

/* Parses text for lq x lk (both > 0; the caller checks) into *out and its
 * normal form (no spaces, numbers in decimal) into *norm, a malloc'ed
 * string. A bad spec fails with STOF_ERR_INVALID_ARG and a sentence that
 * quotes it and names the column; on any failure *out is zeroed and *norm
 * NULL. */
stof_status mask_spec_parse(stof_ctx *ctx, const char *text, int lq, int lk, mask_spec *out,
                            char **norm);
void mask_spec_free(mask_spec *s);

/* The scratch that evaluating a spec's rows needs, so a row costs no
 * allocation: four range buffers and the held choice of each random term. */
typedef struct mask_spec_rows {
    mask_range *buf[4];
    int cap;                       /* ranges each buffer holds */
    int n_rand;
    struct mask_spec_rand *rand;   /* one per random term */
} mask_spec_rows;

/* STOF_ERR_NO_MEMORY only. */
stof_status mask_spec_rows_init(mask_spec_rows *r, const mask_spec *s);
void mask_spec_rows_free(mask_spec_rows *r);

/* The allowed ranges of row q (0 <= q < Lq) under s; *out stays valid until
 * the next call on r. Returns the number of ranges. */
int mask_spec_row(mask_spec_rows *r, const mask_spec *s, int64_t q, const mask_range **out);

/*
 * The random term's generator, identical on every platform (uint64 only).
 * random:R:B:SEED splits keys into nkb = ceil(Lk/B) blocks of B columns (the
 * last may be short) and gives query block i (rows i*B .. i*B+B-1) the key
 * blocks chosen by:
 *
 *   state = SEED ^ ((i + 1) * 0x9E3779B97F4A7C15)         (mod 2^64)
 *   next():  state += 0x9E3779B97F4A7C15;  z = state;      (splitmix64)
 *            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
 *            z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
 *            return z ^ (z >> 31);
 *   below(m): draws z = next() until z < 2^64 - (2^64 mod m); returns z mod m
 *   chosen = {}
 *   for j = nkb - R .. nkb - 1:                            (Floyd's sampling)
 *       t = below(j + 1)
 *       add (t in chosen ? j : t) to chosen
 *
 * R > nkb is an error (R distinct blocks must exist); R*B may pass Lk by
 * less than one block, when the last block is short.
 */
void mask_random_blocks(uint64_t seed, int64_t qblock, int nkb, int r, int32_t *chosen,
                        unsigned char *seen);

#endif
