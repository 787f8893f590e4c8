/*
 * decoder — the decoder-layer plans (Llama, Mistral, Qwen2): the desc's
 * checks, the layer's four groups handed to layer_search's search_set
 * (QKV; o_proj + residual; gate/up with SwiGLU, in its GEMM's epilogue
 * or as a pass after it, as the search chooses; down_proj + residual) with
 * RMSNorm and RoPE as passes between them and attention through an mha
 * plan on the packed qkv, the weights the plan stacks (q, k, v) and
 * interleaves (gate, up) at create, the
 * record in the cache, the CUDA Graphs (layer_graph's) and the public
 * calls (stof_decoder_*).
 */
#ifndef STOF_DECODER_H
#define STOF_DECODER_H

#include "layer/layer_search.h"

/* The decoder's groups, in the order a layer runs them. */
enum { DG_QKV, DG_O, DG_GATE_UP, DG_DOWN, DG_COUNT };
extern const char *const decoder_group_names[DG_COUNT];   /* "qkv", "o", "gate_up", "down" */

/* The groups of a desc (checked). */
void decoder_groups(const stof_decoder_desc *d, layer_group g[DG_COUNT]);

/* Shape part of the record's key: "b1_s4096_h2048_n32_kv8_d64_f8192_bias0". */
void decoder_shape_string(const stof_decoder_desc *d, char *out, size_t n);

/* For tests: a plan whose groups run choices c (no model, no search, no
 * record), as a graph or not. */
stof_status decoder_plan_forced(stof_ctx *ctx, const stof_decoder_desc *desc,
                                const stof_decoder_weights *w, const layer_choice c[DG_COUNT],
                                int graph, stof_decoder_plan **plan);

#endif
