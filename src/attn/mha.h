/*
 * mha — masked multi-head attention plans: argument checks, candidates
 * (kernel kind and tile sizes), their ranking by the model, the two-stage
 * search by timing, the tuning record in the cache, and the launch.
 */
#ifndef STOF_MHA_H
#define STOF_MHA_H

#include <stdint.h>

#include "attn/attn_tiles.h"
#include "attn/model.h"
#include "gpu/jit.h"

typedef struct mha_candidate {
    attn_kind kind;
    int bm, bn;
    int mt;              /* m16 row tiles per warp: 1 or 2 */
    int qs;              /* 1: an operand goes through shared memory each tile, not kept in
                            registers: Q on mma.sync, P (of P V) on the warp-specialized
                            engine */
    int wg;              /* engine: 0 mma.sync (templates/attn.cu); on sm_90a, 1 warpgroup
                            MMA (attn_wg.cu), 2 warp-specialized, TMA-fed (attn_ws.cu;
                            its gathered kind: 128-row groups, head_dim 64 and 128);
                            with 1 and 2, mt 1; with 1, qs 0 */
    int st;              /* wgmma: K and V stages in shared memory, 2 to 4; else 0 */
} mha_candidate;

#define MHA_WS 2         /* mha_candidate.wg of the warp-specialized engine */

/* The kernel request for a candidate; the strings live in *buf. */
typedef struct mha_request {
    char text[5][16];
    render_var vars[11];
    jit_request req;
} mha_request;
/* period: mha_view_period's for the candidate's tiles (1 elsewhere). */
void mha_make_request(const mha_candidate *c, int head_dim, int seq_q, stof_dtype dtype,
                      int period, mha_request *r);

/* The period of the residue-class view (attn_tiles_view_period) that c's
 * kernel reads t's gathered rows and keys through: the warp-specialized
 * engine's gathered kind only; 1 for every other candidate. */
int mha_view_period(const mha_candidate *c, const attn_tiles *t, int seq_q, int seq_k);

/* Whether c's kernel lets the consumer warpgroups whose 64 rows all lie past
 * seq_q sit the item out (SIT_OUT in attn_ws.cu): 192-row items where seq_q
 * leaves the last query group short of a tenth of all the consumers' work
 * or more. */
int mha_sit_out(const mha_candidate *c, int seq_q);

/* Dynamic shared memory of a candidate's kernel, in bytes, and its threads. */
int mha_smem_bytes(const mha_candidate *c, int head_dim);
int mha_threads(const mha_candidate *c);

/* At most this many candidates: both kinds, every engine, every size. */
#define MHA_MAX_CANDIDATES 64

/* Every candidate that fits the head size and the device limits (smem_max
 * bytes of shared memory per block; wgmma: the arch has warpgroup MMA);
 * returns how many were written. */
int mha_candidates(int head_dim, int smem_max, int wgmma, mha_candidate *out, int cap);

/* n values uniform in [-1, 1) rounded to t: element i is drawn from
 * splitmix64 at state seed + (i + 1) * 0x9E3779B97F4A7C15, top 24 bits;
 * bench/peers_mha.py draws the same numbers. */
void mha_fill_random(uint16_t *p, size_t n, stof_dtype t, uint64_t seed);

/* offset + scale * (mha_fill_random's numbers), repeating with a prime
 * period of about a million, for the searches' scratch inputs (drawing
 * every value cost a cold attention plan at L 4096 half a second, a cold
 * layer plan seconds): no two rows or heads of a shape hold the same values
 * unless their distance is a multiple of the prime. */
void mha_fill_periodic(uint16_t *p, size_t n, stof_dtype t, uint64_t seed, float scale,
                       float offset);

/* One line of a tuning record: a candidate, the model's prediction, and,
 * once timed, its median ms and verdict ("ok", "mismatch", "failed"). */
typedef struct mha_tried {
    mha_candidate c;
    double predicted_ms, ms;
    const char *verdict;     /* NULL: not timed */
} mha_tried;

/* The JSON record of a search (winner = index into tried, kernel = its
 * cache key, mask_spec = stof_mask_spec of the mask it was tuned for, so
 * that stof-dump can name it; NULL leaves it out); caller frees. */
char *mha_record_format(const mha_tried *tried, int n, int winner, const char *kernel,
                        const char *why, const char *mask_spec);
/* The winner of a record; 0 when the text is not a valid record. */
int mha_record_parse(const char *record, mha_candidate *c, double *ms, double *predicted_ms);
/* 1 and the winner's kernel key in key when the record was written with
 * the current jit_source_id (so the key is what rendering would give). */
int mha_record_kernel(const char *record, char key[65]);

/* The model's figures for ctx's device: from the cache when this device
 * and arch were measured before, else measured now (dense attention on each
 * engine, a device copy) and stored; with no GPU, the arch's defaults. */
stof_status mha_device_figures(stof_ctx *ctx, model_device *md);

/* The canonical hash of p's mask (64 hex digits; "" for NULL). */
const char *mha_plan_mask_hash(const stof_mha_plan *p);

/* Below this block efficiency (stof_mask_info at 64 x 64 blocks) the
 * gathered kind competes too; above it, block tiles waste little. */
#define MHA_GATHER_BELOW 0.75

/* A candidate as the model ranked it, with what its tiles walk. */
typedef struct mha_ranked {
    mha_candidate c;
    double predicted_ms;
    long long tiles, full_tiles, groups;   /* per (batch, head) */
} mha_ranked;

/* The model's ranking for a case, best first, as a compile-only prepare
 * makes it (the device's known or cached figures, else the arch's
 * defaults in *md; nothing timed, nothing compiled): for stof-dump mask.
 * *n is how many were written (at most cap). */
stof_status mha_rank(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask,
                     mha_ranked *out, int cap, int *n, model_device *md);

/* A plan for exactly candidate c, skipping the model and the search: for
 * tests of every kernel and for benchmarks. */
stof_status mha_plan_forced(stof_ctx *ctx, const stof_mha_desc *desc, const stof_mask *mask,
                            const mha_candidate *c, stof_mha_plan **plan);

#endif
