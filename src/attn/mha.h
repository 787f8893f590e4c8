/*
 * mha — masked multi-head attention plans: the arguments' checks, a plan's
 * life (made from a tuning record, the model or a search; forced; run,
 * described, freed), compile-only preparation and the model's ranking for
 * stof-dump. What runs on every call is mha_kernel's, what runs once per
 * shape mha_search's; both headers come with this one.
 */
#ifndef STOF_MHA_H
#define STOF_MHA_H

#include "attn/mha_kernel.h"
#include "attn/mha_search.h"
#include "attn/model.h"

/* The canonical hash of p's mask (64 hex digits; "" for NULL). */
const char *mha_plan_mask_hash(const stof_mha_plan *p);

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
