/*
 * rope — rotary position embeddings for the decoder layer, in Hugging
 * Face's rotate-half form, over the packed qkv [rows, (H + 2 KVH) * D]
 * (q's and k's heads rotated in place, v's left): the frequency table
 * (theta, and Llama-3's frequency scaling as HF's _compute_llama3_parameters
 * forms it) computed on the host in double, the checks of those settings,
 * and the standalone pass (templates/rope.cu) that the layer's search can
 * set against a GEMM epilogue doing the same.
 */
#ifndef STOF_ROPE_H
#define STOF_ROPE_H

#include "gpu/jit.h"

/* The largest head size: the table is head_dim / 2 floats. */
#define ROPE_MAX_HEAD_DIM 512

typedef struct rope_params {
    float theta;                /* base, > 0 (Llama-3: 500000) */
    /* Llama-3 scaling, off while factor is 0; else factor >= 1,
     * 0 < low_freq_factor < high_freq_factor, original_max_positions > 0
     * (Llama-3.1: 8, 1, 4, 8192). */
    float factor, low_freq_factor, high_freq_factor;
    int original_max_positions;
} rope_params;

/* Checks p for head size head_dim (even, 2 .. ROPE_MAX_HEAD_DIM); the
 * message names the field as the decoder's desc spells it (desc.rope_theta,
 * desc.rope_factor ...). */
stof_status rope_check(stof_ctx *ctx, const rope_params *p, int head_dim);

/* inv_freq[i] for i < head_dim / 2: theta^(-2i / head_dim), scaled where
 * p->factor is set; computed in double, rounded once to float. p checked. */
void rope_inv_freq(const rope_params *p, int head_dim, float *inv_freq);

/* The pass's shape: heads + kv_heads heads of head_dim rotated in rows of
 * (heads + 2 kv_heads) heads; dtype STOF_F16 or STOF_BF16. */
typedef struct rope_shape { int heads, kv_heads, head_dim; stof_dtype dtype; } rope_shape;

/* The kernel for s with its pointers aligned to align_bytes, as a request
 * for a batch (jit_prepare_all); its values live in `text`. */
typedef struct rope_request {
    char text[4][16];
    render_var vars[7];
    jit_request req;
} rope_request;
void rope_make_request(const rope_shape *s, int align_bytes, rope_request *r);

/* Checks s (a clear CTX_FAIL naming the field). */
stof_status rope_check_shape(stof_ctx *ctx, const rope_shape *s);

/* Compiles without a GPU into the cache; key (65 bytes, may be NULL). */
stof_status rope_prepare(stof_ctx *ctx, const rope_shape *s, int align_bytes, char *key);

typedef struct rope_kernel {
    CUfunction fn;
    int chunks;          /* threads a row takes */
} rope_kernel;

/* Loads (or compiles) the kernel for s (checked) once; rope_launch enqueues
 * it over rows rows of sequences of seq tokens: a row's position is
 * positions[row] when positions (device int32[rows]) is not NULL, else
 * offset + row % seq. inv_freq: device float[head_dim / 2]. */
stof_status rope_load(stof_ctx *ctx, const rope_shape *s, int align_bytes, rope_kernel *k);
stof_status rope_launch(stof_ctx *ctx, const rope_kernel *k, void *qkv, long long rows, int seq,
                        int offset, const int *positions, const float *inv_freq, CUstream stream);

/* Checks, loads and launches: qkv [batch * seq, (H + 2 KVH) * D] in place. */
stof_status rope_run(stof_ctx *ctx, const rope_shape *s, void *qkv, int batch, int seq,
                     int offset, const int *positions, const float *inv_freq,
                     stof_stream stream);

#endif
