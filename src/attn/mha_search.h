/*
 * mha_search — what runs once per attention shape: the search's inputs
 * and their timing, the check against the CPU reference, the model's
 * device figures, the candidates ranked by the model, the two-stage search
 * and the tuning record it leaves.
 */
#ifndef STOF_MHA_SEARCH_H
#define STOF_MHA_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "attn/mask.h"
#include "attn/mha_kernel.h"
#include "attn/model.h"

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

/* Below this block efficiency (stof_mask_info at 64 x 64 blocks) the
 * gathered kind competes too; above it, block tiles waste little. */
#define MHA_GATHER_BELOW 0.75

/* A candidate in a search: its tiles, the model's prediction and, once
 * tried, its time and verdict. */
typedef struct mha_search_cand {
    mha_candidate c;         /* these first fields are an mha_tried */
    double predicted_ms, ms;
    const char *verdict;
    attn_tiles tiles;
    int built;
} mha_search_cand;

/* The same figures, measured only where `measure` allows (compile-only
 * work takes the arch's defaults rather than time anything). */
stof_status mha_search_device_figures(stof_ctx *ctx, model_device *md, int measure);

/* Builds every candidate's tiles into cs (MHA_MAX_CANDIDATES of room) and
 * ranks them by the model, best first; *n is how many. Gathered tiles are
 * skipped where block tiles already waste little. */
stof_status mha_search_rank(stof_ctx *ctx, const stof_mha_desc *d, const mask_summary *ms,
                            int measure, mha_search_cand *cs, int *n);
/* Frees the tiles of cs[0 .. n - 1]. */
void mha_search_free(mha_search_cand *cs, int n);

/* Stage 1's sizes for each kind: mma.sync's 64x64, wgmma's 64x64 (small
 * tiles waste least on windows) and 128x64 (dense rows), four stages, and
 * the warp-specialized engine's 128x128, 192x128 and (at head_dim 80 and
 * 96) 192x96 and 192x144, two stages (long rows). */
int mha_search_is_default(const mha_candidate *c);

/* Compiles the candidates listed in idx together (jit_prepare_all), so a
 * search pays for the slowest compile rather than for all of them. */
stof_status mha_search_compile(stof_ctx *ctx, const stof_mha_desc *d,
                               const mha_search_cand *cs, const int *idx, int m);

/* The two-stage search over cs (ranked), leaving each tried candidate's
 * time and verdict in it and the winner's index in *winner. Stage 1: every
 * kind's default sizes. Stage 2: the winner kind's other sizes, on either
 * engine, best-ranked first (all of them when tuning full). Each stage's
 * kernels are compiled together before any is timed; a kernel that fails
 * to compile there fails again, in order, when it is loaded. */
stof_status mha_search_run(stof_ctx *ctx, const stof_mha_desc *d, const mask_summary *ms,
                           mha_search_cand *cs, int n, stof_tune level, int *winner);

#endif
