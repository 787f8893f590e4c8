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

#define DECODE_BLOCK_N 64       /* keys per tile: 16 per warp, four warps */
#define DECODE_ROWS 16          /* query rows per CTA (one m16 tile) */
#define DECODE_MAX_SPLITS 128   /* the most splits a run cuts a sequence into */

/* K and V tiles in a CTA's ring at head_dim d: as many as fit about 104 KiB
 * (two CTAs to an SM on an H100), 2 to 8. */
int decode_stages(int head_dim);
/* The main kernel's dynamic shared memory at head_dim d, in bytes. */
int decode_smem_bytes(int head_dim);

/* How many splits a run cuts each sequence's `span` keys into, for
 * `ctas` CTAs per split (batch x kv_heads x row chunks) on sm_count SMs
 * holding `resident` CTAs each: the count with the least waves of CTAs
 * times a CTA's tiles plus DECODE_CTA_TILES (its pipeline's fill, its merge
 * and its share of the combine, counted as tiles), the smallest on a tie;
 * 1 .. DECODE_MAX_SPLITS and at most one per tile. */
#define DECODE_CTA_TILES 2
int decode_choose_splits(int sm_count, int resident, long long ctas, int span);

/* The two kernel requests of a desc (checked); the strings live in *r. */
typedef struct decode_request {
    char text[4][24];
    render_var vars[10], cvars[2];
    jit_request main, combine;
} decode_request;
void decode_make_request(const stof_decode_desc *d, decode_request *r);

#endif
