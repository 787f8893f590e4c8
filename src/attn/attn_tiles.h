/*
 * attn_tiles — what an attention CTA walks: query groups and, per group, key
 * tiles with their bitmaps, in the flat int32 arrays templates/attn.cu reads.
 * Two kinds: block-wise (consecutive rows and keys, from the mask's block
 * format) and gathered (rows grouped by residue, keys compacted to the
 * union the group allows, for scattered masks).
 */
#ifndef STOF_ATTN_TILES_H
#define STOF_ATTN_TILES_H

#include <stdint.h>
#include "attn/mask.h"

typedef enum attn_kind { ATTN_BLOCK = 0, ATTN_GATHER = 1 } attn_kind;

typedef struct attn_tiles {
    attn_kind kind;
    int bm, bn, wpr;          /* rows per group, keys per tile, bitmap words per row */
    int n_groups;
    int period;               /* gathered rows: rows of one group share q mod period */
    int32_t *group_order;     /* n_groups: heaviest group first */
    int32_t *work;            /* n_groups x 4, in that order: group, first tile, end tile,
                                 first tile's key (tile_key; 0 without tiles) */
    int32_t *qidx;            /* gathered: n_groups * bm row indices, -1 padding */
    int32_t *tile_ptr;        /* n_groups + 1 */
    int32_t *tile_key;        /* n_tiles: first key (block) or offset into kidx in tiles */
    int32_t *tile_bits;       /* n_tiles: -1 full, else bitmap index */
    int32_t *kidx;            /* gathered: n_kidx_tiles * bn key indices, -1 padding */
    uint32_t *bits;           /* n_bitmaps * bm * wpr */
    long long n_tiles, n_full, n_bitmaps, n_kidx_tiles;
    long long max_tiles;      /* tiles of the heaviest group */
} attn_tiles;

/* The tiles of bm x bn for a kind, cut from the mask's summary (gathered
 * rows are grouped by the summary's period). */
stof_status attn_tiles_build(stof_ctx *ctx, const mask_summary *ms, attn_kind kind, int bm,
                             int bn, attn_tiles *out);
void attn_tiles_free(attn_tiles *t);

/* The tiles as one buffer (a header, then every array; host byte order),
 * for the cache, so that a cached plan never walks its mask: *out is
 * malloc'd, NULL when out of memory. attn_tiles_decode makes the tiles again
 * from such a buffer; 0 (and *t zeroed) when the buffer is not one: wrong
 * size, foreign header, counts that do not add up. */
void *attn_tiles_encode(const attn_tiles *t, size_t *n);
int attn_tiles_decode(const void *data, size_t n, attn_tiles *t);

/* *out, a copy of t with arrays of its own (through encode and decode). */
stof_status attn_tiles_copy(stof_ctx *ctx, const attn_tiles *t, attn_tiles *out);

/* Bytes of the arrays the kernels read (work, qidx, tile_key, tile_bits,
 * kidx, bits), laid out one after another (each 16-byte aligned) as
 * attn_tiles_pack writes them. */
typedef struct attn_tiles_layout {
    size_t work, qidx, tile_key, tile_bits, kidx, bits, total; /* bytes */
} attn_tiles_layout;
attn_tiles_layout attn_tiles_layout_of(const attn_tiles *t);
void attn_tiles_pack(const attn_tiles *t, const attn_tiles_layout *l, void *dst);

/* An item's time per tile, relative to other items of bm rows: 2 k + 3 for
 * k working consumers of 64 rows (all bm / 64 of them unless lq > 0 leaves
 * group's last ones no row; one at least). */
int attn_tiles_share(int bm, int lq, int group);

/* A persistent grid's work: every (group, batch, head) of bh = batch *
 * heads, as items of 4 ints (group, first tile, end tile, batch << 16 |
 * head), dealt to `ctas` CTAs. Items are taken heaviest group first within
 * runs of `run` heads (heads whose K and V share the L2), each going to the
 * CTA with the least work so far (tiles plus one per item for its Q and
 * epilogue), so that every CTA ends at about the same time. With lq > 0 the
 * kernel's consumers of 64 rows that all lie at or past lq sit an item out,
 * and the item weighs less (attn_tiles_share). CTA x walks items
 * first[x] .. first[x + 1] - 1 of `items` (n_groups * bh of them; first has
 * ctas + 1 entries). Returns 0 when out of memory. */
int attn_tiles_schedule(const attn_tiles *t, int batch, int heads, int run, int ctas, int lq,
                        int32_t *items, int32_t *first);

/* The period of a residue-class view of gathered tiles: where every group
 * lists rows q0, q0 + p, q0 + 2p, ... and every key list keys k0, k0 + p,
 * ... (padding at the end only: rows past their residue's last, keys in
 * partial tiles), and p divides lq and lk, a kernel can read them as boxes
 * of the tensors viewed as (length / p, p) (templates/attn_ws.cu's
 * PERIOD). 1 otherwise, and for block tiles. */
int attn_tiles_view_period(const attn_tiles *t, int lq, int lk);
/* For such a kernel: each item's group (items as attn_tiles_schedule
 * writes them) becomes its first row q0, and each tile's key list (tile_key,
 * as attn_tiles_pack writes it) its first key k0. */
void attn_tiles_view(const attn_tiles *t, int32_t *items, long long n_items, int32_t *tile_key);

#endif
