/*
 * mask — attention masks: built from a spec (read by attn/mask_spec) or a
 * dense matrix, the canonical hash, statistics, the two storage formats the
 * GPU kernels read (block-sparse rows and per-row key ranges), the summary
 * a plan reads, and the block map behind the pictures (drawn by
 * attn/mask_picture). Everything is built on one row iterator that yields
 * the sorted, merged allowed ranges of a query row, so a spec mask is never
 * expanded to Lq x Lk.
 *
 * attn/mask_spec.h, included here, holds what a spec means: mask_range, the
 * terms, and the random term's generator (mask_random_blocks, documented
 * there).
 */
#ifndef STOF_MASK_H
#define STOF_MASK_H

#include <stdint.h>
#include "attn/mask_spec.h"
#include "stof.h"

/* Walks the rows of a mask in any order. Holds the scratch the evaluation of
 * a spec needs, so a row costs no allocation. */
typedef struct mask_iter {
    const stof_mask *m;
    mask_spec_rows rows;     /* spec-built masks */
} mask_iter;

stof_status mask_iter_init(mask_iter *it, const stof_mask *m); /* STOF_ERR_NO_MEMORY only */
void mask_iter_free(mask_iter *it);

/* The allowed ranges of row q (0 <= q < Lq); *out stays valid until the next
 * call on it. Returns the number of ranges. */
int mask_row_ranges(mask_iter *it, int q, const mask_range **out);

/* A key for the mask's entries from its spec and sizes alone, without a
 * walk (the cache keeps the canonical hash under it): 1, or 0 for a mask
 * built from a matrix, which its spec does not define. */
int mask_spec_key(const stof_mask *m, char key[65]);

/* Whether every entry (q, k) equals (q - 1, k - 1) where both lie in the
 * mask: it depends on q - k alone (dense, causal, windows, dilated and their
 * unions), so that a packed sequence may stand anywhere along its diagonal
 * (stof_mha_run_varlen). A walk of every row; STOF_ERR_NO_MEMORY only. */
stof_status mask_diagonal(const stof_mask *m, int *diagonal);

/* The whole mask as lq*lk bytes, row-major, 1 = allowed; for tests. */
stof_status mask_to_dense(const stof_mask *m, unsigned char **out);

/*
 * Per-row key lists (row-wise kernel): CSR over runs.
 * The runs of row q are i in [row_ptr[q], row_ptr[q+1]): keys start[i] ..
 * start[i] + len[i] - 1, sorted, disjoint and never adjacent; len[i] >= 1.
 * A row with no run allowed nothing. entries = sum of len, n_ranges =
 * row_ptr[lq].
 */
typedef struct mask_rows {
    int lq, lk;
    int64_t *row_ptr;        /* lq + 1 */
    int32_t *start, *len;    /* n_ranges each */
    long long entries, n_ranges;
} mask_rows;

stof_status mask_build_rows(stof_ctx *ctx, const stof_mask *m, mask_rows *out);
void mask_rows_free(mask_rows *r);

/*
 * Block-sparse rows (block-wise kernel), for blocks of bq query rows by bk
 * key columns, 16 <= bq, bk <= 128 (any value in that range).
 *
 * Query block i covers rows i*bq .. i*bq+bq-1, key block j columns
 * j*bk .. j*bk+bk-1; nqb = ceil(lq/bq), nkb = ceil(lk/bk). Rows >= lq and
 * columns >= lk of the last blocks are out of range.
 *
 * The key blocks of query block i are n in [row_ptr[i], row_ptr[i+1]),
 * listed in increasing col[n], only those holding at least one allowed
 * entry. partial[n] == -1 marks a full block: every in-range entry allowed;
 * an edge block can be full, and the kernel must still not read or write
 * out-of-range rows and columns of it. Otherwise partial[n] = b, the index
 * of its bitmap:
 *
 *   words b*words_per_block .. (b+1)*words_per_block - 1 of bits,
 *   row r (query i*bq + r, 0 <= r < bq) in the words_per_row words starting
 *   at b*words_per_block + r*words_per_row, and key c (column j*bk + c,
 *   0 <= c < bk) in bit (c % 32) (least significant first) of word c / 32
 *   of that row. 1 = allowed. Out-of-range rows and columns, and the padding
 *   bits past bk, are 0.
 *
 * Identical bitmaps are stored once, so several blocks may share an index
 * (n_bitmaps <= n_partial); bitmaps are numbered in order of first use.
 * All arrays are flat int32/uint32, ready to copy to the device; a bitmap's
 * word offset b*words_per_block can pass 2^31, so compute it in 64 bits.
 */
typedef struct mask_blocks {
    int lq, lk, bq, bk, nqb, nkb;
    int words_per_row;       /* ceil(bk / 32) */
    int words_per_block;     /* bq * words_per_row */
    int32_t *row_ptr;        /* nqb + 1 */
    int32_t *col;            /* n_blocks: key block index */
    int32_t *partial;        /* n_blocks: -1 full, else bitmap index */
    uint32_t *bits;          /* n_bitmaps * words_per_block */
    long long n_blocks, n_full, n_partial, n_bitmaps;
} mask_blocks;

/* Partial-tile bitmaps of wpb words each, each stored once and found again
 * by content: zero-initialize with wpb set, add, then take bits (n of them)
 * or free. */
typedef struct mask_bitset {
    uint32_t *bits;
    long long n, cap;        /* bitmaps */
    int wpb;                 /* words per bitmap */
    int32_t *slot;           /* open addressing: bitmap index + 1, 0 empty */
    long long n_slots;
} mask_bitset;

/* The index of bitmap b, adding it if new; -1 when out of memory or past
 * INT32_MAX bitmaps. */
long long mask_bitset_add(mask_bitset *s, const uint32_t *b);
void mask_bitset_free(mask_bitset *s);

/* STOF_ERR_UNSUPPORTED when the listing would pass INT32_MAX entries. */
stof_status mask_build_blocks(stof_ctx *ctx, const stof_mask *m, int bq, int bk,
                              mask_blocks *out);
void mask_blocks_free(mask_blocks *b);

/*
 * What a plan reads of a mask, made in one walk of its rows: the sizes, the
 * canonical hash (stof_mask_hash's), the statistics in 64 x 64 blocks
 * (stof_mask_stats'), the period of its gathered rows, and every row's runs,
 * kept as a mask of runs, so that each candidate's block and gather lists
 * and the CPU reference are cut from them and the plan never evaluates the
 * spec again. `runs` is m itself when m was built from a dense matrix (it
 * must then outlive the summary).
 */
#define MASK_SUMMARY_BLOCK 64
typedef struct mask_summary {
    int lq, lk;
    char hash[65];
    stof_mask_info info;     /* block_q = block_k = MASK_SUMMARY_BLOCK */
    int period;              /* rows with equal q mod period share their keys: the D of
                                the first dilated:W:D term, else 1 */
    const stof_mask *runs;   /* the same entries; walking it evaluates nothing */
    stof_mask *own;          /* runs, where the summary made it */
} mask_summary;

stof_status mask_summarize(stof_ctx *ctx, const stof_mask *m, mask_summary *out);
void mask_summary_free(mask_summary *s);
/* The summaries made in this process so far (tests: a cached plan makes
 * none). */
long long mask_summaries_made(void);

#endif
