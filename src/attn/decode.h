/*
 * decode — decoding attention (issue 57): a few new query rows per sequence
 * against a KV cache, split over the cache (templates/attn_decode.cu) and
 * merged (attn_decode_combine.cu). Owns the desc's checks, the kernels'
 * requests, the split count chosen per run on the host, the plan's
 * workspace, the launches and the public stof_decode_* calls.
 */
#ifndef STOF_DECODE_H
#define STOF_DECODE_H

#include "gpu/jit.h"

#define DECODE_BLOCK_N 64       /* the default variant's keys per tile: 16 per warp, four */
#define DECODE_ROWS 16          /* query rows per CTA (one m16 tile) */
#define DECODE_MAX_SPLITS 128   /* the most splits a run cuts a sequence into */

/* A way to build the main kernel, chosen when a plan is made
 * ($STOF_DECODE_VARIANT, else DECODE_DEFAULT_VARIANT), the same for every
 * desc. */
typedef struct decode_variant {
    const char *name;
    int block_n;     /* keys per tile: 16 per warp */
    int warp_ring;   /* 1: each warp copies its own rows of a tile, no CTA barrier a tile */
    int resident;    /* CTAs per SM the ring is sized for: 2 (about 104 KiB each), or 1 */
    int prefetch;    /* the L2 prefetch size of the K and V copies, bytes: 0 (none), 128, 256 */
    int unroll;      /* 1: a thread's copies of a tile unrolled (a known trip count) */
    int kfirst;      /* with unroll, 1: a tile's K rows all asked for before its V rows */
    int swizzle;     /* 1: shared rows unpadded and swizzled at head_dim 64 and 128 */
} decode_variant;
extern const decode_variant decode_variants[];
extern const int decode_nvariants;
#define DECODE_DEFAULT_VARIANT "swz-kfirst"
/* The variant of that name, NULL for none. */
const decode_variant *decode_variant_named(const char *name);

/* K and V tiles in a CTA's ring at head_dim d: as many as fit about 104 KiB
 * (two CTAs to an SM on an H100) a resident CTA, 2 to 8. decode_stages is
 * the default variant's. */
int decode_stages_of(const decode_variant *v, int head_dim);
int decode_stages(int head_dim);
/* The main kernel's dynamic shared memory at head_dim d, in bytes. */
int decode_smem_bytes_of(const decode_variant *v, int head_dim);
int decode_smem_bytes(int head_dim);

/* How many splits a run cuts each sequence's `span` keys into, for
 * `ctas` CTAs per split (batch x kv_heads x row chunks) on sm_count SMs
 * holding `resident` CTAs each, tiles of block_n keys: the count with the
 * least waves of CTAs times a CTA's tiles plus cta_tiles (its pipeline's
 * fill, its merge and its share of the combine, counted as tiles), the
 * smallest on a tie; 1 .. DECODE_MAX_SPLITS and at most one per tile.
 * decode_choose_splits: at DECODE_BLOCK_N and DECODE_CTA_TILES
 * ($STOF_DECODE_CTA_TILES changes the plan's). */
#define DECODE_CTA_TILES 2
int decode_choose_splits_at(int sm_count, int resident, long long ctas, int span, int block_n,
                            int cta_tiles);
int decode_choose_splits(int sm_count, int resident, long long ctas, int span);

/* The two kernel requests of a desc (checked) for variant v; the strings
 * live in *r. */
typedef struct decode_request {
    char text[4][24];
    render_var vars[15], cvars[3];
    jit_request main, combine;
} decode_request;
void decode_make_request(const stof_decode_desc *d, const decode_variant *v, decode_request *r);

#endif
