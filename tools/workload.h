/*
 * workload — what stof-warm (and benchmarks) must cover, read into plain
 * cases: attention suites (workloads/attention.json and llm.json: each
 * suite's seqs x masks; a decoder model's suite may name kv_heads, softcap
 * and seq_k, a KV prefix), encoder- and decoder-layer cases
 * (workloads/layers.json: each case's seqs x masks, with its model's sizes;
 * a model with "kind": "decoder" is a Llama-family block, its masks causal
 * or causal_window:W), and the one-line forms
 *   --mha "b=8,h=12,l=2048,d=64,fp16,window:256"
 *   --mha "b=1,h=32,kv=8,lq=2048,lk=30720,d=128,bf16,softcap=50,causal"
 *         (kv= or kv_heads=: grouped KV heads; softcap=: the logit softcap)
 *   --mha "b=1,h=32,l=8192,d=128,bf16,alibi=1,bias=32,causal"
 *         (alibi=1: ALiBi, standard slopes; bias= or bias_buckets=: a distance
 *         bias of that many buckets; a plan needs neither's data)
 *   --ln  "rows=16384,hidden=768,fp16"
 *   --decoder "b=1,s=4096,hidden=4096,h=32,kv=8,ffn=14336,bf16,causal_window:4096"
 *         (d= or head_dim=: hidden / h where not given; qkv_bias=1: Qwen2's
 *         q/k/v biases; the mask causal, the default, or causal_window:W;
 *         bf16 unless a dtype is named). RoPE's settings and the RMSNorm
 *         epsilon change neither a decoder plan's kernels nor its record:
 *         no case names them.
 *   --decode "b=8,h=32,kv=8,d=128,cache=32768,new=1,bf16,causal_window:4096"
 *         (a decoding step's plan, stof_decode_desc: b sequences of up to
 *         cache keys, new rows each (1 .. 16, default 1); softcap= as --mha's;
 *         the mask causal, the default, or causal_window:W; bf16 unless a
 *         dtype is named). A file's "decode" array holds them as suites
 *         (llm.json's): name, batch and cache (each an integer or an array),
 *         new, heads, kv_heads, head_dim, dtype, softcap, masks.
 * An attention suite may also say "alibi": true (ALiBi, the standard
 * slopes). A file's "pending" object holds cases for the benchmarks alone:
 * it is passed over.
 * Reading is strict: unknown members, wrong types, out-of-range sizes and
 * sizes attention does not support are refused with the file, line, column
 * and JSON path. Mask specs are checked against the library (workload_check)
 * once a context exists.
 */
#ifndef STOF_WORKLOAD_H
#define STOF_WORKLOAD_H

#include <stddef.h>
#include "stof.h"

typedef enum workload_op {
    WORKLOAD_MHA = 1,    /* masked multi-head attention */
    WORKLOAD_LAYER,      /* a whole encoder layer */
    WORKLOAD_LN,         /* fused bias + residual + LayerNorm */
    WORKLOAD_DECODER,    /* a whole decoder layer (Llama, Mistral, Qwen2) */
    WORKLOAD_DECODE      /* a decoding step's attention (stof_decode_desc) */
} workload_op;

typedef struct workload_case {
    workload_op op;
    char *name;          /* "bert-heads/window/l=2048", "bert-base/l=512/window:256" */
    char *origin;        /* "attention.json:12:5 ($.suites[0])" or "--mha b=8,..." */
    stof_dtype dtype;
    int batch;           /* mha, layer, decoder, decode */
    int seq_q, seq_k;    /* mha, layer, decoder (a layer has seq_q == seq_k); decode:
                            the new rows and the cache's keys (max_seq_k) */
    int heads, head_dim; /* mha, layer (head_dim = hidden / heads), decoder, decode */
    int kv_heads;        /* mha, decoder, decode: KV heads (GQA, MQA), 0 meaning heads */
    double softcap;      /* mha, decode: the logit softcap, 0 off */
    int alibi;           /* mha: ALiBi (1) or not (0) */
    int bias_buckets;    /* mha: the distance bias's buckets, 0 off */
    char *mask;          /* mha, layer, decoder, decode: the spec; NULL for ln */
    char *model;         /* layer, decoder: the model's name (a --decoder line's: NULL) */
    int hidden;          /* layer, ln, decoder */
    double ffn;          /* layer: FFN width as a multiple of hidden */
    char *activation;    /* layer: "gelu", "gelu_tanh", "relu" */
    char *norm;          /* layer: "post_ln" (BERT), "pre_ln" (GPT, ViT) */
    int rows;            /* ln; layer, decoder: batch * seq, the rows its norms see */
    int ffn_hidden;      /* decoder: the MLP's width (intermediate_size) */
    int qkv_bias;        /* decoder: q/k/v_proj have biases (Qwen2) */
} workload_case;

typedef struct workload {
    workload_case *cases;
    int n, cap;
} workload;

/* The largest sizes a file or a line may name, before what the library
 * supports is asked (a bound on what reading allocates and multiplies). */
#define WORKLOAD_MAX_BATCH (1 << 20)
#define WORKLOAD_MAX_HEADS 1024
#define WORKLOAD_MAX_HEAD_DIM 1024
#define WORKLOAD_MAX_SEQ (1 << 24)
#define WORKLOAD_MAX_HIDDEN (1 << 20)
#define WORKLOAD_MAX_ROWS 2147483647LL

/* What attention supports is stof.h's (STOF_MAX_SEQ, STOF_MAX_BATCH_HEADS,
 * STOF_MHA_HEAD_DIMS), checked where a command line or a file is read
 * (--mha, workload files, stof-dump mask), so that nothing runs for a case
 * the library would refuse. workload_mha_head_dims writes the head sizes
 * as a reader says them ("32, 64, 80, 96 or 128") into buf and returns it. */
const char *workload_mha_head_dims(char *buf, size_t len);

/* Each appends cases, or returns -1 and leaves w unchanged with the reason
 * in err ("file:line:col: $.path: what"). */
int workload_read_file(workload *w, const char *path, char *err, size_t errlen);
int workload_read_text(workload *w, const char *text, size_t len, const char *file, char *err,
                       size_t errlen);
/* The one-line forms (tools/workload_line.c). An --mha line's sizes and
 * dtype must be ones attention supports (stof.h). */
int workload_add_mha(workload *w, const char *line, char *err, size_t errlen);
int workload_add_ln(workload *w, const char *line, char *err, size_t errlen);
/* A --decoder line's sizes must be ones the decoder layer takes (stof.h). */
int workload_add_decoder(workload *w, const char *line, char *err, size_t errlen);
/* A --decode line's sizes must be ones a decode plan takes (stof.h). */
int workload_add_decode(workload *w, const char *line, char *err, size_t errlen);
void workload_free(workload *w);
/* Appends a copy of c (its strings duplicated); 0 when out of memory. */
int workload_add_case(workload *w, const workload_case *c);

/* "mha", "layer", "layernorm", "decoder", "decode" */
const char *workload_op_name(workload_op op);
/* "fp16", "bf16", "fp32" -> the dtype; STOF_DTYPE_INVALID otherwise. */
stof_dtype workload_dtype(const char *name);

/* Checks what only the library can: every mask spec parses for its case's
 * lengths. STOF_OK, or the first failure with "case (origin): reason" in
 * err. */
stof_status workload_check(stof_ctx *ctx, const workload *w, char *err, size_t errlen);

/* The descriptors a case maps to. A layer case's LayerNorms are
 * rows = batch * seq by hidden. */
void workload_mha_desc(const workload_case *c, stof_tune tune, stof_mha_desc *d);
void workload_ln_desc(const workload_case *c, stof_ln_desc *d);
void workload_layer_desc(const workload_case *c, stof_tune tune, stof_layer_desc *d);
/* A decoder case's desc: its window from its mask, RoPE's theta Llama-2's
 * 10000 and the default epsilon, which no plan's kernels depend on. */
void workload_decoder_desc(const workload_case *c, stof_tune tune, stof_decoder_desc *d);
/* A decode case's desc (BHLD, the default scale, its window from its mask). */
void workload_decode_desc(const workload_case *c, stof_decode_desc *d);
/* A decoder layer's or a decode step's mask: "causal" 0, "causal_window:W"
 * W (W > 0); -1 for any other spec. */
int workload_decoder_window(const char *spec);
/* What a decode case must be for stof_decode_desc (stof.h's limits): NULL,
 * or the reason ("new=17 must be 1 .. 16"). */
const char *workload_decode_refusal(const workload_case *c, char *buf, size_t n);

#endif
