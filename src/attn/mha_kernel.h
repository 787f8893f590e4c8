/*
 * mha_kernel — what an attention plan runs on every call: the candidates
 * (kernel kind, engine and tile sizes) and the kernel request each renders,
 * the tensors' strides and TMA descriptors, loading a candidate's kernel
 * with its tiles, and the launch. Uses neither the search nor the plan.
 */
#ifndef STOF_MHA_KERNEL_H
#define STOF_MHA_KERNEL_H

#include "attn/attn_tiles.h"
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
    char text[8][24];
    render_var vars[20];
    jit_request req;
} mha_request;
/* The score modifiers a kernel renders (stof_mha_desc's softcap, alibi and
 * bias_buckets; zeros: none): part of its source, and so of its key. */
typedef struct mha_mods {
    float softcap;
    int alibi, bias_buckets;
} mha_mods;
/* desc's modifiers. */
mha_mods mha_mods_of(const stof_mha_desc *d);
/* period: mha_view_period's for the candidate's tiles (1 elsewhere, and
 * with varlen, whose sequences start at any row);
 * group: query heads per KV head (mha_group); varlen: the desc's (packed
 * variable-length sequences; 0: off). */
void mha_make_request(const mha_candidate *c, int head_dim, int seq_q, stof_dtype dtype,
                      int group, mha_mods mods, int varlen, int period, mha_request *r);

/* The period of the residue-class view (attn_tiles_view_period) that c's
 * kernel reads t's gathered rows and keys through: the warp-specialized
 * engine's gathered kind only; 1 for every other candidate. */
int mha_view_period(const mha_candidate *c, const attn_tiles *t, int seq_q, int seq_k);

/* Whether c's kernel lets the consumer warpgroups whose 64 rows all lie past
 * seq_q sit the item out (SIT_OUT in attn_ws.cu): 192-row items where seq_q
 * leaves the last query group short of a tenth of all the consumers' work
 * or more. */
int mha_sit_out(const mha_candidate *c, int seq_q);

/* Whether c's kernel takes the logit softcap (desc.softcap): all but the
 * warp-specialized engine's 192-row items, whose three consumers (160
 * registers a thread) spill 32 to 116 bytes with it (NVRTC 12, sm_90a). */
int mha_takes_softcap(const mha_candidate *c);

/* Whether c's kernel takes mods' ALiBi and distance bias at head_dim (1
 * where mods has neither). The warp-specialized engine's items spill with
 * them (NVRTC 13, sm_90a): its 192-row items (656 bytes with both at
 * head_dim 64) never take them; its 128-row items take both at head_dim 64
 * and, past it, ALiBi alone on block tiles: 32 bytes (40 with the softcap),
 * all outside the tile loop, where the bias's table row costs 108 bytes and
 * gathered rows 248, reloaded in the loop. The other engines take both at
 * every size. */
int mha_takes_score_mods(const mha_candidate *c, mha_mods mods, int head_dim);

/* Whether c's kernel takes packed variable-length sequences (desc.varlen):
 * all but the warp-specialized engine's 192-row and gathered items, whose
 * consumers spill with the sequence's bounds (NVRTC 12, sm_90a, head_dim
 * 64: 192 x 128 28 bytes, 56 with consumers sitting out, 192 x 64 4; the
 * gathered 128 x 128 12 at head_dim 128). */
int mha_takes_varlen(const mha_candidate *c);

/* Whether c's kernel takes every modifier desc names, and varlen. */
int mha_takes_mods(const mha_candidate *c, const stof_mha_desc *d);

/* Dynamic shared memory of a candidate's kernel, in bytes, and its threads;
 * varlen: a desc.varlen kernel's (the warp-specialized engine keeps each
 * item's sequence beside it, 16 bytes more a Q buffer; mha_candidates
 * counts without them: every candidate leaves more than that free). */
int mha_smem_bytes(const mha_candidate *c, int head_dim, int varlen);
int mha_threads(const mha_candidate *c);

/* At most this many candidates: both kinds, every engine, every size. */
#define MHA_MAX_CANDIDATES 64

/* Every candidate that fits the head size and the device limits (smem_max
 * bytes of shared memory per block; wgmma: the arch has warpgroup MMA);
 * returns how many were written. */
int mha_candidates(int head_dim, int smem_max, int wgmma, mha_candidate *out, int cap);

/* A candidate's kernel as loaded for launching: its function, how it is
 * launched, and its tiles uploaded. */
typedef struct mha_launch {
    CUfunction fn;
    int wg, bm, bn, threads, smem, n_groups;
    int gather;              /* MHA_WS: gathered rows and keys (no TMA descriptors) */
    int period;              /* MHA_WS: > 1, gathered rows and keys read through TMA
                                descriptors of a residue-class view (PERIOD) */
    CUdeviceptr tiles;       /* attn_tiles_pack's arrays, then (wg MHA_WS) the items */
    attn_tiles_layout lay;
    size_t slopes;           /* desc.alibi with no alibi_slopes: byte offset in tiles of the
                                standard slopes, one per head; else 0 */
    size_t items;            /* MHA_WS: byte offset of the work items in tiles, then
                                each CTA's first item (attn_tiles_schedule) ... */
    int n_items, ctas;       /* ... how many items, and CTAs */
    int shift;               /* varlen: the mask depends on q - k alone, so a sequence
                                whose KV prefix differs from the plan's moves along
                                the diagonal (attn_common.cuh) */
    char key[65];            /* the kernel's cache key */
} mha_launch;

/* TMA descriptors of q, k, v and out and the addresses (and rows: a
 * varlen run's totals) they were made for: a plan's repeated runs on the
 * same tensors skip re-encoding them (0.22 us of host time each on an H100
 * host). Bytes, not CUtensorMap, so that a malloc'd plan needs no 128-byte
 * alignment. */
typedef struct mha_maps {
    unsigned char map[4][sizeof(CUtensorMap)];
    CUdeviceptr at[4];
    long long rows[4];
} mha_maps;

typedef struct mha_strides {
    long long s[4][3];   /* q, k, v, out: batch, head, row strides in elements */
    long long k_offset;  /* packed QKV: k = q + k_offset, v = q + v_offset (elements) */
    long long v_offset;
} mha_strides;

/* Shared memory a block may opt in to: the device's, or an H100's where
 * there is no device (compiling offline for sm_90a). */
int mha_kernel_device_smem(const stof_ctx *ctx);

/* A candidate's kind and engine by name, as records and descriptions say them. */
const char *mha_kernel_kind_name(attn_kind k);
const char *mha_kernel_engine_name(const mha_candidate *c);

/* desc's KV heads (kv_heads, 0 meaning heads) and query heads per KV head. */
int mha_kv_heads(const stof_mha_desc *d);
int mha_group(const stof_mha_desc *d);

/* The strides of desc's q, k, v and out. */
mha_strides mha_kernel_strides(const stof_mha_desc *d);

/* A varlen run's sequences (stof_mha_run_varlen): the device arrays of
 * batch + 1 boundaries, the sequences (at most desc.batch) and the rows the
 * buffers hold; shift: the mask depends on q - k alone (mha_launch). */
typedef struct mha_varlen {
    CUdeviceptr cu_q, cu_k;
    int batch;
    long long total_q, total_k;
} mha_varlen;

/* Enqueues one run; the context must be current. maps: the TMA
 * descriptors kept from the last run, or NULL to make them anew. vl: the
 * sequences of a varlen desc's run (then seq_lens is 0), else NULL. */
stof_status mha_kernel_launch(stof_ctx *ctx, const stof_mha_desc *d, const mha_launch *L,
                              CUdeviceptr q, CUdeviceptr k, CUdeviceptr v, CUdeviceptr out,
                              CUdeviceptr seq_lens, const mha_varlen *vl, CUstream stream,
                              mha_maps *maps);

/* Loads c's kernel (looked for under `known` first: jit_get_known) and
 * uploads t for it. */
stof_status mha_kernel_load(stof_ctx *ctx, const stof_mha_desc *d, const mha_candidate *c,
                            const attn_tiles *t, const char *known, mha_launch *L);
/* Frees what mha_kernel_load uploaded. */
void mha_kernel_unload(stof_ctx *ctx, mha_launch *L);

#endif
