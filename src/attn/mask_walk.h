/*
 * mask_walk — a mask's rows walked one query block at a time: the key
 * blocks each block touches, its allowed entries per key block and, where
 * asked, a key block's bitmap. Block tables (mask_build_blocks), statistics
 * (stof_mask_stats, the summary) and block maps are each one pass of it.
 */
#ifndef STOF_MASK_WALK_H
#define STOF_MASK_WALK_H

#include <stdint.h>

#include "attn/mask_spec.h"
#include "stof.h"

/* Told each row's runs, in row order. */
typedef void (*mask_row_fn)(void *arg, const mask_range *r, int n);
/* Row q's runs, sorted and disjoint, into *out (valid until the next call);
 * returns how many (mask_row_ranges over a mask_iter). */
typedef int (*mask_rows_fn)(void *arg, int q, const mask_range **out);

/* One query block at a time: the key blocks its rows touch and the allowed
 * entries per block, and each block's bitmap where it is asked for (the
 * partial blocks). A row of few runs (at most one per key block: causal,
 * windows) is counted from its runs' ends and kept as runs, its bits drawn
 * only into the bitmaps asked for, so that a long row costs no bits; a row
 * of many short runs (strided, dilated) sets its bits in a scratch bitmap as
 * wide as the key range, where counting and drawing cost a fixed sweep. It
 * also gathers the per-row figures the statistics need, and hands each
 * row's runs to row_fn (the summary keeps and hashes them there). */
typedef struct mask_walk {
    mask_rows_fn rows;       /* the rows, read through rows(rows_arg, q, &runs) */
    void *rows_arg;
    int lq, lk, bq, bk, nqb, nkb, wpr;
    int64_t row_words;       /* scratch words per row, one spare for unaligned reads */
    int nr;                  /* in-range rows of the current query block */
    uint32_t *tmp;           /* bq * row_words: the bits of the rows of many runs */
    unsigned char *in_tmp;   /* bq: whether row r's bits are in tmp, else its runs in rg */
    int n_in_tmp;            /* rows of the current query block in tmp */
    mask_range *rg;          /* the other rows' runs, row after row */
    long long rg_cap;
    int64_t *rg_ptr;         /* bq + 1: row r's runs are rg[rg_ptr[r] .. rg_ptr[r + 1]) */
    int32_t *count;          /* nkb */
    int32_t *touched;        /* nkb */
    unsigned char *mark;     /* nkb */
    int n_touched;
    long long entries, runs;
    int row_min, row_max, runs_max, empty_rows;
    mask_row_fn row_fn;      /* NULL, or told every row, in order */
    void *row_arg;
} mask_walk;

/* An lq x lk mask's rows, read through rows, in blocks of bq rows by bk
 * keys, each 16..256 (else STOF_ERR_INVALID_ARG). */
stof_status mask_walk_init(stof_ctx *ctx, mask_walk *w, int lq, int lk, int bq, int bk,
                           mask_rows_fn rows, void *rows_arg);
void mask_walk_free(mask_walk *w);
/* Walks query block qb: w->touched[0 .. n_touched) the key blocks it
 * touches, ascending, w->count[kb] their allowed entries. 0, or -1 out of
 * memory. */
int mask_walk_qblock(mask_walk *w, int qb);
/* In-range entries of key block kb in the current query block. */
int mask_walk_area(const mask_walk *w, int kb);
/* Key block kb's bitmap in the current query block: bq rows of wpr words,
 * rows past the block and keys past lk clear. */
void mask_walk_bitmap(const mask_walk *w, int kb, uint32_t *out);
/* Ready for the next query block. */
void mask_walk_clear(mask_walk *w);

#endif
