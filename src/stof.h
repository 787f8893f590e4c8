/*
 * stof.h — the public interface of libstof: fused kernels for sparse (masked)
 * Transformer inference, generated at run time, compiled with NVRTC, kept in a
 * SQLite kernel cache and launched through the CUDA Driver API.
 *
 * Every call returns a stof_status. stof_status_str() names it and
 * stof_last_error() gives the sentence behind the last failure on a context.
 * No call prints, exits or aborts. Handles are opaque; the free and close calls accept
 * NULL. A context is used by one thread at a time.
 */
#ifndef STOF_H
#define STOF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STOF_VERSION_MAJOR 0
#define STOF_VERSION_MINOR 1
#define STOF_VERSION_PATCH 0

typedef enum stof_status {
    STOF_OK = 0,
    STOF_ERR_INVALID_ARG,   /* a bad argument; nothing was changed or launched */
    STOF_ERR_UNSUPPORTED,   /* valid but not supported (dtype, size, arch) */
    STOF_ERR_NO_DEVICE,     /* no driver or no GPU: GPU work is impossible here */
    STOF_ERR_CUDA,          /* a CUDA driver call failed */
    STOF_ERR_COMPILE,       /* NVRTC failed; the message carries its log */
    STOF_ERR_CACHE,         /* the kernel cache failed (only where asked for) */
    STOF_ERR_NO_MEMORY,     /* host allocation failed */
    STOF_ERR_INTERNAL       /* a bug in stof */
} stof_status;

typedef enum stof_dtype {
    STOF_DTYPE_INVALID = 0,
    STOF_F32 = 1,
    STOF_F16 = 2,
    STOF_BF16 = 3
} stof_dtype;

/* Compatible with CUstream and cudaStream_t; NULL is the legacy stream. */
typedef struct CUstream_st *stof_stream;

typedef struct stof_ctx stof_ctx;

/* Zero value: device 0, the default cache path, the device's own arch. */
typedef struct stof_options {
    int device;                 /* CUDA device ordinal */
    const char *cache_path;     /* NULL: $STOF_CACHE, else $XDG_CACHE_HOME/stof/cache.db,
                                   else ~/.cache/stof/cache.db */
    int no_cache;               /* nonzero: run uncached */
    const char *arch;           /* NULL: the device's own ("sm_90a" on Hopper);
                                   set it to compile for a GPU that is not here */
    long long cache_max_bytes;  /* 0: 2 GiB; least recently used kernels go first */
    /* The fleet's second tier behind the cache (README: "Sharing a cache").
     * NULL: $STOF_REMOTE_CACHE; "off": none. "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]" */
    const char *remote_cache;
    const char *remote_key;       /* the signing key; NULL: remote_key_file, else
                                     $STOF_REMOTE_CACHE_KEY, else $STOF_REMOTE_CACHE_KEY_FILE */
    const char *remote_key_file;  /* a file holding it (mode 600) */
    int remote_timeout_ms;        /* 0: $STOF_REMOTE_CACHE_TIMEOUT_MS, else 200 */
    int cache_shared;             /* nonzero (or $STOF_CACHE_SHARED=group): trust a cache
                                     that its group may write; else a cache file or folder
                                     that others can write is not loaded from */
} stof_options;

/* Counters since stof_open: what the cache saved and what was paid. */
typedef struct stof_stats {
    long long nvrtc_compiles;   /* NVRTC runs */
    double nvrtc_ms;            /* time spent in them */
    long long cache_hits;       /* kernels found in the cache (either tier) */
    long long cache_misses;
    long long cache_rejects;    /* entries found damaged or stale, recompiled */
    long long module_loads;     /* cuModuleLoadData calls */
    long long timing_runs;      /* candidate timings by the search */
    long long graph_captures;   /* CUDA Graphs captured by layer plans */
    /* The second tier (kernels and tuning records): cache_hits includes the
     * kernels found there after a local miss. */
    long long remote_hits;      /* values found in Redis, verified and used */
    long long remote_misses;    /* asked for and not there */
    long long remote_rejects;   /* there but refused: unsigned, damaged, stale, foreign */
    long long remote_writes;    /* values stored in Redis */
    long long remote_errors;    /* exchanges that failed: down, slow, refusing */
    /* Writes to the local cache that stored nothing (kernels, tuning records
     * and the rows derived from masks): a full disk, a failed commit, a file
     * found damaged. The work is done and used, but the next process will do
     * it again; stof_last_error() has the reason of a failed kernel store. */
    long long cache_write_failures;
} stof_stats;

const char *stof_version(void);                 /* "0.1.0" */
const char *stof_status_str(stof_status s);     /* "STOF_ERR_INVALID_ARG" */

/* Opens a context. Succeeds on a machine with no driver or GPU: GPU calls
 * then return STOF_ERR_NO_DEVICE, and stof_device_info says why there is
 * none. An unusable cache leaves the context working uncached; stof_last_error()
 * says why. So does a cache file that SQLite finds damaged later: the context
 * goes on uncached from that call (stof_cache_path() turns ""), and
 * stof_last_error() says so once, with the stof-dump command that saves what
 * is intact. opts may be NULL.
 * After a successful open, stof_last_error() is "" except in two cases, each
 * a note, not a failure: a cache was wanted but cannot be used (the context
 * runs uncached and stof_cache_path() is ""; the note starts "running
 * uncached"), or else a remote tier was asked for and is off or not answering
 * (the note starts "remote cache"). No GPU leaves it "". */
stof_status stof_open(stof_ctx **ctx, const stof_options *opts);
void stof_close(stof_ctx *ctx);

/* The sentence behind the last failure on ctx ("" if none; see stof_open for
 * the notes an open may leave). With NULL: why the last stof_open on this
 * thread failed. */
const char *stof_last_error(const stof_ctx *ctx);

stof_status stof_get_stats(const stof_ctx *ctx, stof_stats *out);

/* Device facts; *has_device is 0 where no GPU can be used. arch is the
 * architecture kernels are compiled for, e.g. "sm_90a" ("" with no GPU and
 * no options.arch). name is the device's name, or where there is no GPU,
 * the sentence saying why ("no GPU: STOF_NO_GPU is set", "no GPU driver:
 * dlopen(libcuda.so.1) failed: ..."). */
stof_status stof_device_info(const stof_ctx *ctx, int *has_device, char *arch,
                             size_t arch_len, char *name, size_t name_len);

/* The path of the cache in use, or "" when running uncached. */
const char *stof_cache_path(const stof_ctx *ctx);

/* ---- Fused bias + residual add + LayerNorm --------------------------------
 * out[r,:] = LayerNorm(x[r,:] + bias + residual[r,:]) * gamma + beta
 * over rows x hidden, row-major, storage in dtype, math in fp32.
 * bias and residual may be NULL (then not added). out may alias x or residual.
 * Pointers must be aligned to the element size. */
typedef struct stof_ln_desc {
    int rows;
    int hidden;          /* 1 .. 16384 */
    stof_dtype dtype;
    float eps;           /* 0 means 1e-5 */
} stof_ln_desc;

stof_status stof_bias_residual_layernorm(stof_ctx *ctx, const stof_ln_desc *desc,
                                         const void *x, const void *bias,
                                         const void *residual, const void *gamma,
                                         const void *beta, void *out,
                                         stof_stream stream);

/* Compiles (without running) the kernel the call above would use, into the
 * cache, for the context's arch. Works with no GPU. */
stof_status stof_bias_residual_layernorm_prepare(stof_ctx *ctx,
                                                 const stof_ln_desc *desc);

/* ---- Limits ----------------------------------------------------------------
 * What masks and attention take, public so that a front end (a command line,
 * a workload file, the Python package) can refuse the rest as its input is
 * read, before anything is built. The calls refuse the rest as well.
 *   STOF_MAX_SEQ          the longest side of a mask (lq and lk; more is
 *                         STOF_ERR_INVALID_ARG at once), and so the longest
 *                         seq_q and seq_k of attention (more is
 *                         STOF_ERR_UNSUPPORTED) and seq of a layer: attention's
 *                         grid counts query groups of 64 rows in a dimension
 *                         of at most 65535
 *   STOF_MAX_BATCH_HEADS  attention's batch * heads (the grid's other
 *                         dimension; more is STOF_ERR_UNSUPPORTED)
 *   STOF_MHA_HEAD_DIMS    attention's head sizes, as a list for an array's
 *                         initializer: static const int d[] = {STOF_MHA_HEAD_DIMS};
 *   STOF_MAX_BIAS_BUCKETS the most buckets of attention's distance bias
 *                         (desc.bias_buckets; more is STOF_ERR_INVALID_ARG)
 * Attention's dtype is STOF_F16 or STOF_BF16. */
#define STOF_MAX_SEQ (65535 * 64)
#define STOF_MAX_BATCH_HEADS 65535
#define STOF_MHA_HEAD_DIMS 32, 64, 80, 96, 128
#define STOF_MAX_BIAS_BUCKETS 4096

/* 1 where head_dim is one of STOF_MHA_HEAD_DIMS, else 0. */
int stof_mha_head_dim_supported(int head_dim);

/* ---- Masks (src/attn/mask.c) ---- */

/* A mask says which (query row q, key column k) pairs attention may use, over
 * Lq query rows and Lk key columns (0-based). It is built from a spec string
 * or from a dense boolean matrix, and is immutable afterwards.
 *
 * Spec grammar: terms joined by '+' (union) and '&' (intersection, binds
 * tighter than '+'); spaces around terms and operators are ignored; numbers
 * are unsigned decimal.
 *   dense              every pair
 *   causal             k <= p, p = q + (Lk - Lq): the query's position, bottom-right
 *                      aligned when Lk != Lq (the queries are the last Lq of Lk)
 *   window:W           |p - k| <= W/2; W even, > 0
 *   causal_window:W    0 <= p - k < W; W > 0
 *   dilated:W:D        |q - k| <= (W/2)*D and (q - k) mod D == 0; W even, > 0; D > 0
 *   global:G           q < G or k < G; 0 < G <= max(Lq, Lk)
 *   strided:S          k mod S == S - 1; S > 0
 *   random:R:B:SEED    each block of B query rows sees R distinct blocks of B key
 *                      columns (the last key block may be short), drawn by the
 *                      generator documented in src/attn/mask.h; B > 0,
 *                      0 < R <= ceil(Lk / B); SEED < 2^64
 *   docs:N1,N2,...     q and k lie in the same document; Ni > 0, sum = Lq = Lk.
 *                      Its run-time form needs no new mask per composition: a
 *                      plan made with desc.varlen on a causal (or dense) mask,
 *                      run by stof_mha_run_varlen with the documents'
 *                      boundaries as cu_seqlens_q and cu_seqlens_k
 * Example: "window:192+global:64+random:3:64:1" (BigBird).
 * Per-sequence valid lengths (key padding) are not part of a mask: attention
 * takes them at run time. */
typedef struct stof_mask stof_mask;

/* How a [batch, heads, seq, head_dim] tensor is laid out in memory. */
typedef enum stof_layout {
    STOF_LAYOUT_BHLD = 1,   /* [B, H, L, D], D fastest */
    STOF_LAYOUT_BLHD = 2    /* [B, L, H, D], D fastest */
} stof_layout;

/* Bad specs give STOF_ERR_INVALID_ARG; the message quotes the offending part
 * and its 1-based column. lq and lk are 1 .. STOF_MAX_SEQ, checked before
 * anything else. *out is NULL after any failure. */
stof_status stof_mask_parse(stof_ctx *ctx, const char *spec, int lq, int lk,
                            stof_mask **out);

/* allowed: lq*lk bytes, row-major (row q, column k), nonzero = allowed;
 * lq and lk 1 .. STOF_MAX_SEQ. The mask keeps its own copy, compressed to
 * runs per row. */
stof_status stof_mask_from_dense(stof_ctx *ctx, const unsigned char *allowed,
                                 int lq, int lk, stof_mask **out);

void stof_mask_free(stof_mask *m);

/* The spec with spaces removed and numbers in plain decimal, or
 * "dense-matrix" for a mask built from a matrix. Lives as long as m. */
const char *stof_mask_spec(const stof_mask *m);
void stof_mask_dims(const stof_mask *m, int *lq, int *lk);

/* Canonical SHA-256 (64 lowercase hex digits) over (Lq, Lk) and exactly the
 * allowed entries: masks allowing the same entries hash alike, however they
 * were built. */
stof_status stof_mask_hash(const stof_mask *m, char hex[65]);

/* What an analytical performance model needs to know about a mask, for one
 * tiling into blocks of block_q query rows by block_k key columns. Entries
 * outside [0, Lq) x [0, Lk) in edge blocks are out of range: never counted
 * as allowed, never needed for a block to be full. */
typedef struct stof_mask_info {
    int lq, lk;
    long long entries;          /* allowed (q, k) pairs */
    double density;             /* entries / (lq * lk) */
    int row_min, row_max;       /* allowed keys in the sparsest / densest row */
    double row_mean;
    int empty_rows;             /* rows with no allowed key: attention gives zeros */
    double runs_mean;           /* contiguous runs of allowed keys per row */
    int runs_max;
    int block_q, block_k;
    int n_qblocks, n_kblocks;   /* ceil(lq / block_q), ceil(lk / block_k) */
    long long blocks_touched;   /* blocks holding at least one allowed entry */
    long long blocks_full;      /* touched blocks whose in-range entries are all allowed */
    long long blocks_partial;   /* touched blocks that need a bitmap */
    double partial_fill_mean;   /* mean fraction of in-range entries allowed, partial blocks */
    double kblocks_mean;        /* key blocks per query block (touched / n_qblocks) */
    int kblocks_max;
    double block_density;       /* blocks_touched / (n_qblocks * n_kblocks) */
    double block_efficiency;    /* entries / in-range entries of touched blocks: the
                                   useful share of a block kernel's work */
    long long partial_entries;  /* allowed entries that lie in partial blocks */
    long long distinct_bitmaps; /* different partial-block bitmaps (the block format shares them) */
} stof_mask_info;

/* block_q: 16 .. 256; block_k: 16 .. 256. */
stof_status stof_mask_stats(stof_ctx *ctx, const stof_mask *m, int block_q, int block_k,
                            stof_mask_info *out);

/* Every cell of the mask: lq*lk bytes into out, row-major (row q, column k),
 * 1 allowed, 0 not. */
stof_status stof_mask_to_dense(stof_ctx *ctx, const stof_mask *m, unsigned char *out);

/* The block layout stof_mask_stats counts, for the same block sizes:
 * n_qblocks * n_kblocks bytes into out, row-major (query block i, key block
 * j), each one of these. */
enum {
    STOF_BLOCK_EMPTY = 0,   /* no allowed entry */
    STOF_BLOCK_PARTIAL = 1, /* some in-range entries allowed: the kernel needs a bitmap */
    STOF_BLOCK_FULL = 2     /* every in-range entry allowed */
};
stof_status stof_mask_block_map(stof_ctx *ctx, const stof_mask *m, int block_q, int block_k,
                                unsigned char *out);

typedef enum stof_picture {
    STOF_PICTURE_SVG = 1,   /* the block map with a caption (spec, sizes, counts); NUL-terminated */
    STOF_PICTURE_PNG = 2    /* the block map alone, a palette PNG (stored, not compressed) */
} stof_picture;

/* A picture of the block map (full blocks dark, partial light, empty white),
 * its longer side about 500 pixels, at most 4096 blocks a side. *data is
 * allocated here and freed with stof_mask_picture_free; *len is its size in
 * bytes. What stof-dump and the Python package draw. */
stof_status stof_mask_picture(stof_ctx *ctx, const stof_mask *m, int block_q, int block_k,
                              stof_picture format, void **data, size_t *len);
void stof_mask_picture_free(void *data);

/* ---- end of masks ---- */

/* ---- Masked multi-head attention (src/attn/mha.c) ------------------------
 * out = softmax(cap(Q Kᵀ · scale) + mods + mask) V per (batch, head), fp32
 * accumulation; cap(s) = softcap · tanh(s / softcap), or s where softcap is 0.
 * mods, added to the capped logit before the mask: ALiBi's slope[h] · (k - p)
 * and a distance bias's table[h][bucket(p - k)] (see the desc), for query
 * position p and key k.
 * A plan is made once for a shape and a mask (cache hit, or model + search)
 * and run as often as wanted, from several streams at once.
 *
 * Grouped KV heads (GQA; MQA at kv_heads 1): k and v hold kv_heads heads
 * ([batch, kv_heads, seq_k, head_dim], or [batch, seq_k, kv_heads,
 * head_dim] in BLHD), and query head h reads kv head h / (heads / kv_heads).
 * A KV prefix: where seq_k > seq_q the queries are the last seq_q positions,
 * and causal, causal_window and window align to the bottom right (query row
 * q stands at position q + seq_k - seq_q).
 *
 * Packed variable-length batches (desc.varlen, stof_mha_run_varlen): q is
 * [total_q, heads, head_dim], k and v [total_k, kv_heads, head_dim], out
 * like q: the rows of all sequences back to back (BLHD with batch 1).
 * cu_seqlens_q and cu_seqlens_k are device int32 arrays of batch + 1
 * entries: sequence b's rows are cu[b] .. cu[b+1]-1. The plan is made with
 * desc.batch the most sequences a run takes, desc.seq_q and desc.seq_k the
 * longest sequence, desc.layout BLHD; a new composition costs no plan, no
 * compile and no host synchronisation: the kernel reads cu_seqlens itself.
 * Sequence b has len_q = cu_q[b+1] - cu_q[b] queries and len_k keys, its
 * queries being its last len_q positions (a KV prefix per sequence), and the
 * plan's mask applies inside it:
 *   - where len_k - len_q equals seq_k - seq_q (equal lengths, on a plan with
 *     seq_q == seq_k, the common case), it takes the mask's top-left len_q x
 *     len_k corner, as seq_lens does;
 *   - otherwise, where the mask depends on q - k alone (dense, causal,
 *     causal_window, window, dilated and their unions, checked when the plan
 *     is made), it stands on the mask moved along the diagonal so that its
 *     queries align bottom-right: d = (len_k - len_q) - (seq_k - seq_q), query
 *     rows moved down by d where d > 0, keys right by -d where d < 0;
 *   - for other masks it takes the top-left corner all the same (its queries
 *     then do not align bottom-right).
 * Boundaries are read on the device and clamped, not checked: each to the
 * buffer's rows [0, total] and to the one before it, lengths to seq_q and
 * seq_k (a longer sequence keeps its first seq_q queries and seq_k keys; its
 * later query rows are not written). A run writes out's rows of its
 * sequences only: rows between or past them are left as they were, and
 * nothing is read outside [0, total_q) of q or [0, total_k) of k and v.
 * Every engine takes varlen (the warp-specialized one on its 128-row block
 * items); a plan's work is laid out for desc.batch
 * sequences of the longest length, so the work of a run is that of its
 * longest sequences: a shorter one's query groups and key tiles outside it
 * cost a check each, not a walk. */
typedef enum stof_tune {
    STOF_TUNE_DEFAULT = 0,  /* $STOF_TUNE (off|fast|full), else fast */
    STOF_TUNE_OFF,          /* the model's first choice, default parameters */
    STOF_TUNE_FAST,         /* stage 1 on the model's best two, stage 2 small */
    STOF_TUNE_FULL          /* every kernel kind, the whole pruned space */
} stof_tune;

typedef struct stof_mha_desc {
    int batch, heads, seq_q, seq_k, head_dim;  /* within the limits above: head_dim
                                                  one of STOF_MHA_HEAD_DIMS */
    stof_dtype dtype;                          /* STOF_F16 or STOF_BF16 */
    stof_layout layout;                        /* 0 means BHLD; out has q's layout */
    int qkv_packed;                            /* nonzero: q points at [batch, seq, heads
                                                  + 2 kv_heads, head_dim] from a QKV
                                                  projection (q's heads, k's, v's); k and
                                                  v are ignored; layout must be BLHD */
    float scale;                               /* 0 means 1/sqrt(head_dim) */
    stof_tune tune;
    int max_candidates;                        /* search budget; 0: no cap */
    double max_seconds;                        /* search budget; 0: no cap */
    int kv_heads;                              /* heads of k and v: 0 means heads; heads
                                                  must be a multiple of it (GQA, MQA) */
    float softcap;                             /* logit softcap (Gemma-2): 0 off, else
                                                  finite and > 0; rendered into the kernel */
    /* Score modifiers, added to the logit after the softcap and before the
     * mask, in this order: softcap(s · scale) + alibi + bias. p is a query's
     * position, q + seq_k - seq_q for query row q (bottom-right, as the masks
     * align), k a key's. Each is rendered into the kernel when set (whether,
     * not where: the pointers are read at each run, and must stay valid
     * while the plan lives). */
    int alibi;                                 /* nonzero: ALiBi, slope[h] · (k - p) */
    const float *alibi_slopes;                 /* device float[heads], or NULL: the
                                                  standard geometric slopes, 2^(-8(h+1)/n)
                                                  for n the power of two at or below heads,
                                                  the heads past n interleaved from 2n's
                                                  (the ALiBi paper, HF build_alibi_tensor);
                                                  set only with alibi */
    int bias_buckets;                          /* 0 off; else 1 to 4096 buckets B of a
                                                  bias on the distance (T5, Swin):
                                                  table[h][bucket(p - k)], bucket(d) =
                                                  clamp(d, -(B/2), B - 1 - B/2) + B/2 */
    const float *bias_table;                   /* device float[heads][bias_buckets] */
    int varlen;                                /* nonzero: packed variable-length
                                                  sequences, run only by
                                                  stof_mha_run_varlen; layout must be
                                                  BLHD, qkv_packed 0 */
} stof_mha_desc;

typedef struct stof_mha_plan stof_mha_plan;

stof_status stof_mha_plan_create(stof_ctx *ctx, const stof_mha_desc *desc,
                                 const stof_mask *mask, stof_mha_plan **plan);
/* seq_lens: NULL, or a device array of batch int32 valid lengths (keys and
 * queries at or past it are padding; padded query rows come out zero).
 * Lengths are read on the device and clamped to the sequence, not checked:
 * checking would cost a host synchronisation per call. q, k, v and out must
 * be 16-byte aligned. A plan must not outlive its context (undefined). */
stof_status stof_mha_run(stof_mha_plan *plan, const void *q, const void *k,
                         const void *v, void *out, const int *seq_lens,
                         stof_stream stream);
/* A varlen plan's run (desc.varlen; the header above says what it does):
 * batch sequences, 1 <= batch <= desc.batch; cu_seqlens_q
 * and cu_seqlens_k device int32[batch + 1]; total_q and total_k >= 0 the rows
 * q and out, and k and v, hold (q.shape[0]), passed so that no host read of
 * cu_seqlens is needed. A plan without desc.varlen gets STOF_ERR_INVALID_ARG,
 * as does a varlen plan given to stof_mha_run. */
stof_status stof_mha_run_varlen(stof_mha_plan *plan, const void *q, const void *k,
                                const void *v, void *out, const int *cu_seqlens_q,
                                const int *cu_seqlens_k, int batch, long long total_q,
                                long long total_k, stof_stream stream);
/* Which kernel, its parameters, and why: a line of text. */
stof_status stof_mha_plan_describe(const stof_mha_plan *plan, char *buf, size_t n);
void stof_mha_plan_free(stof_mha_plan *plan);

/* Compiles, with no GPU, the kernels the model ranks first for this case,
 * for the context's arch, into the cache. */
stof_status stof_mha_prepare(stof_ctx *ctx, const stof_mha_desc *desc,
                             const stof_mask *mask);

/* ---- Decoding (src/attn/decode.c) ----------------------------------------
 * A generation step: each sequence brings seq_q new query rows (1 .. 16)
 * that attend to its KV cache, the new rows' keys included. One plan serves
 * every step up to max_seq_k keys: each run gives the cache's capacity and,
 * on the device, each sequence's length, so a new length costs no plan, no
 * compile and no host synchronisation, and a step can be captured in a CUDA
 * graph (the plan owns its workspace; run allocates nothing).
 *
 * q and out are [batch, heads, seq_q, head_dim] (BHLD) or [batch, seq_q,
 * heads, head_dim] (BLHD); k and v [batch, kv_heads, kv_capacity, head_dim]
 * (BHLD) or [batch, kv_capacity, kv_heads, head_dim] (BLHD), as HF's caches
 * hold them; query head h reads KV head h / (heads / kv_heads). New row i
 * of sequence b stands at key position seqused_k[b] - seq_q + i and reads
 * keys 0 .. that position (causal among the new rows), or with window W only
 * the last W of them. A row with no key to read comes out as zeros.
 *
 * The cache is cut into splits that CTAs read in parallel and a second
 * kernel merges; their number is chosen on the host at each run from batch,
 * kv_heads, kv_capacity (and the window) and the SM count, never from the
 * lengths. $STOF_DECODE_SPLITS=N at plan creation forces N splits on every
 * run of that plan (tests use it to cover each count). */
typedef struct stof_decode_desc {
    int batch;            /* the most sequences a run may pass */
    int heads, kv_heads;  /* kv_heads 0 means heads; heads must be a multiple of it */
    int head_dim;         /* one of STOF_MHA_HEAD_DIMS */
    int seq_q;            /* new rows per sequence, 1 .. 16 */
    int max_seq_k;        /* the largest kv_capacity a run may pass, seq_q .. STOF_MAX_SEQ */
    stof_dtype dtype;     /* STOF_F16 or STOF_BF16 */
    stof_layout layout;   /* of q and out, and of k and v: 0 means BHLD */
    float scale;          /* 0 means 1/sqrt(head_dim) */
    float softcap;        /* logit softcap: 0 off, else finite and > 0 (rendered in) */
    int window;           /* 0: a new row reads the whole cache up to itself; W > 0:
                             causal_window:W, only the last W keys up to the row */
} stof_decode_desc;

typedef struct stof_decode_plan stof_decode_plan;

/* Loads (from the kernel cache, else compiles) the plan's two kernels and
 * allocates its workspace; no search, no timing. */
stof_status stof_decode_plan_create(stof_ctx *ctx, const stof_decode_desc *desc,
                                    stof_decode_plan **plan);
/* One step. batch: 1 .. desc.batch (0 means desc.batch). kv_capacity: the
 * rows allocated per sequence in k and v, seq_q .. desc.max_seq_k (0 means
 * desc.max_seq_k). seqused_k: NULL (every sequence is kv_capacity long) or a
 * device array of batch int32 lengths, the new rows included, read on the
 * device and clamped to [0, kv_capacity], not checked (that would cost a
 * synchronisation). q, k, v and out must be 16-byte aligned device memory. */
stof_status stof_decode_run(stof_decode_plan *plan, const void *q, const void *k,
                            const void *v, void *out, const int *seqused_k, int batch,
                            int kv_capacity, stof_stream stream);
/* The kernels, their tiles, registers and shared memory, the splits: a line. */
stof_status stof_decode_plan_describe(const stof_decode_plan *plan, char *buf, size_t n);
void stof_decode_plan_free(stof_decode_plan *plan);
/* Compiles the plan's kernels for the context's arch into the cache, with
 * no GPU. */
stof_status stof_decode_prepare(stof_ctx *ctx, const stof_decode_desc *desc);

/* ---- Encoder layer (src/layer/layer.c) -----------------------------------
 * One Transformer encoder layer over x [batch, seq, hidden] (row-major, rows
 * = batch * seq), attention restricted by a mask:
 *   POST_LN (BERT):    h   = LN1(x + attn(x) Wo' + bo)
 *                      out = LN2(h + act(h W1' + b1) W2' + b2)
 *   PRE_LN (GPT, ViT): h   = x + attn(LN1(x)) Wo' + bo
 *                      out = h + act(LN2(h) W1' + b1) W2' + b2
 * where attn(a) is masked multi-head attention on q, k, v = a Wqkv' + bqkv.
 * Weights follow torch.nn.Linear: a weight is [out_features, in_features],
 * row-major, and y = a W' + b. qkv_w is [3*hidden, hidden]: rows 0 .. hidden-1
 * make q, then k, then v; within each, head h owns rows h*head_dim ..
 * (h+1)*head_dim - 1 (nn.MultiheadAttention's in_proj_weight). Every group of
 * operators (QKV projection; output projection + bias + residual +
 * LayerNorm; FFN1 + bias + activation; FFN2 + bias + residual + LayerNorm)
 * runs the fusion scheme a two-stage search chose for this shape; the
 * choice is kept in the cache. */
typedef enum stof_activation {
    STOF_ACT_GELU = 0,          /* x * Phi(x), the erf form (BERT, ViT) */
    STOF_ACT_GELU_TANH,         /* the tanh approximation (GPT-2) */
    STOF_ACT_RELU
} stof_activation;

typedef enum stof_norm {
    STOF_POST_LN = 0,           /* residual, then LayerNorm (BERT) */
    STOF_PRE_LN                 /* LayerNorm first, residual last (GPT, ViT) */
} stof_norm;

typedef struct stof_layer_desc {
    int batch, seq;
    int hidden, heads;          /* hidden / heads: a head_dim attention supports */
    int ffn_hidden;             /* FFN width; 0 means 4 * hidden */
    stof_activation activation;
    stof_norm norm;
    stof_dtype dtype;           /* STOF_F16 or STOF_BF16: weights, x and out */
    float eps;                  /* LayerNorm epsilon; 0 means 1e-5 */
    stof_tune tune;             /* as for attention */
    int max_candidates;         /* search budget per group; 0: no cap */
    double max_seconds;         /* search budget for the whole layer; 0: no cap */
} stof_layer_desc;

/* Device pointers in desc.dtype; they must stay valid while the plan lives
 * and be 16-byte aligned. ln1 is the LayerNorm after attention (POST_LN) or
 * before it (PRE_LN); ln2 the one after (POST_LN) or before (PRE_LN) the FFN. */
typedef struct stof_layer_weights {
    const void *qkv_w, *qkv_b;  /* [3*hidden, hidden], [3*hidden] */
    const void *o_w, *o_b;      /* [hidden, hidden], [hidden] */
    const void *ln1_g, *ln1_b;  /* [hidden] */
    const void *ff1_w, *ff1_b;  /* [ffn_hidden, hidden], [ffn_hidden] */
    const void *ff2_w, *ff2_b;  /* [hidden, ffn_hidden], [hidden] */
    const void *ln2_g, *ln2_b;  /* [hidden] */
} stof_layer_weights;

typedef struct stof_layer_plan stof_layer_plan;

/* Plans the layer: cache hit, or the model and the search (which times
 * candidates on scratch buffers of its own, never on the weights' owner's
 * data). mask is seq x seq. */
stof_status stof_layer_plan_create(stof_ctx *ctx, const stof_layer_desc *desc,
                                   const stof_mask *mask, const stof_layer_weights *w,
                                   stof_layer_plan **plan);

/* Bytes of device workspace stof_layer_run needs: batch * seq *
 * (4 * hidden + max(3 * hidden, ffn_hidden)) elements of dtype (q/k/v,
 * later the FFN's inner activation; the attention output; the residual
 * stream; a normalised copy; one scratch), each of the five rounded up to
 * 256 bytes. BERT-base at batch 8, seq 2048: 192 MiB. */
stof_status stof_layer_workspace_size(const stof_layer_plan *plan, size_t *bytes);

/* out = layer(x). x and out are [batch, seq, hidden]; out must not alias x.
 * seq_lens: NULL, or a device array of batch int32 valid lengths: keys at or
 * past a sequence's length are masked out and its padded rows see a zero
 * attention output (they stay finite, but carry no meaning). workspace:
 * 256-byte aligned device memory of stof_layer_workspace_size bytes, used by
 * one run at a time. A plan, too, runs on one stream at a time: it keeps a
 * cuBLAS workspace and CUDA Graphs of its own, one per set of x, out,
 * seq_lens and workspace pointers (up to 4; a fifth set replaces the least
 * recently used): a caller rotating a few buffers replays, any other set
 * costs a capture (stof_stats.graph_captures counts them). */
stof_status stof_layer_run(stof_layer_plan *plan, const void *x, void *out,
                           const int *seq_lens, void *workspace, stof_stream stream);

/* The chosen scheme and parameters per group, their timings, the attention
 * plan and whether the layer runs as a CUDA Graph: a few lines of text. */
stof_status stof_layer_plan_describe(const stof_layer_plan *plan, char *buf, size_t n);
void stof_layer_plan_free(stof_layer_plan *plan);

/* Plans the layer as stof_layer_plan_create would, without weights, so
 * that its record (and its attention's) lands in the cache: what a warm-up
 * tool needs. The search runs on scratch buffers of its own. */
stof_status stof_layer_tune(stof_ctx *ctx, const stof_layer_desc *desc, const stof_mask *mask);

/* Compiles, with no GPU, the generated kernels this layer's schemes use
 * (with default parameters) and its attention's, for the context's arch. */
stof_status stof_layer_prepare(stof_ctx *ctx, const stof_layer_desc *desc,
                               const stof_mask *mask);

/* ---- Decoder layer (src/layer/decoder.c) ---------------------------------
 * The pre-norm decoder block of Llama, Mistral and Qwen2 over x [batch, seq,
 * hidden] (row-major, rows = batch * seq), causal:
 *   h   = x + o_proj(attn(rope(q), rope(k), v)),  q, k, v = q/k/v_proj(RMSNorm1(x))
 *   out = h + down_proj(silu(gate_proj(a)) * up_proj(a)),  a = RMSNorm2(h)
 * RMSNorm(v) = v * rsqrt(mean(v^2) + eps) * weight, in fp32. RoPE in Hugging
 * Face's rotate-half form, inv_freq = theta^(-2i / head_dim) computed in
 * double (with Llama-3's frequency scaling where rope_factor is set, as HF's
 * _compute_llama3_parameters), cos and sin in fp32. Attention has kv_heads
 * K/V heads (GQA; query head h reads kv head h / (heads / kv_heads)) under
 * the mask causal, or causal_window:window. The plan keeps its own copies
 * of q/k/v_proj stacked ([q; k; v]) and of gate/up stacked, made once at
 * create. Every group of operators (QKV projection; o_proj + residual;
 * gate/up; down_proj + residual) runs the scheme a two-stage search chose
 * for this shape, kept in the cache as the encoder layer's are. */
typedef struct stof_decoder_desc {
    int batch, seq;
    int hidden, heads;          /* hidden == heads * head_dim */
    int kv_heads;               /* 0 means heads; must divide heads */
    int head_dim;               /* one of STOF_MHA_HEAD_DIMS */
    int ffn_hidden;             /* the MLP's width (intermediate_size), > 0 */
    stof_dtype dtype;           /* STOF_F16 or STOF_BF16: weights, x and out */
    float eps;                  /* RMSNorm epsilon (rms_norm_eps); 0 means 1e-6 */
    float rope_theta;           /* RoPE base, finite and > 0 (Llama-3: 500000) */
    /* Llama-3 frequency scaling, off while rope_factor is 0; else factor
     * >= 1, 0 < low_freq_factor < high_freq_factor, original_max_positions
     * > 0 (Llama-3.1: 8, 1, 4, 8192). */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_positions;
    int window;                 /* 0: causal; W > 0: causal_window:W (Mistral's sliding window) */
    int qkv_bias;               /* nonzero: q/k/v_proj have biases (Qwen2) */
    stof_tune tune;             /* as for attention */
    int max_candidates;         /* search budget per group; 0: no cap */
    double max_seconds;         /* search budget for the whole layer; 0: no cap */
} stof_decoder_desc;

/* Device pointers in desc.dtype, Hugging Face's layouts ([out, in],
 * row-major); 16-byte aligned. They are copied at create (the projections'
 * and the biases') or read by every run (the rest: keep them valid while the
 * plan lives). The biases only where desc.qkv_bias is set, else ignored. */
typedef struct stof_decoder_weights {
    const void *q_proj;                     /* [heads * head_dim, hidden] */
    const void *k_proj, *v_proj;            /* [kv_heads * head_dim, hidden] */
    const void *q_bias, *k_bias, *v_bias;   /* [heads * head_dim], [kv_heads * head_dim] x 2 */
    const void *o_proj;                     /* [hidden, heads * head_dim] */
    const void *gate_proj, *up_proj;        /* [ffn_hidden, hidden] */
    const void *down_proj;                  /* [hidden, ffn_hidden] */
    const void *input_layernorm;            /* [hidden] */
    const void *post_attention_layernorm;   /* [hidden] */
} stof_decoder_weights;

typedef struct stof_decoder_plan stof_decoder_plan;

/* Plans the layer (cache hit, or the model and the search on scratch
 * buffers of its own) and copies the stacked weights. */
stof_status stof_decoder_plan_create(stof_ctx *ctx, const stof_decoder_desc *desc,
                                     const stof_decoder_weights *w, stof_decoder_plan **plan);

/* Bytes of device workspace stof_decoder_run needs: batch * seq * (3 *
 * hidden + max((heads + 2 kv_heads) * head_dim, 2 * ffn_hidden) +
 * max(hidden, ffn_hidden)) elements of dtype, each of the four buffers
 * rounded up to 256 bytes. */
stof_status stof_decoder_workspace_size(const stof_decoder_plan *plan, size_t *bytes);

/* out = layer(x); x and out [batch, seq, hidden], out not aliasing x.
 * positions: NULL, then token t of each sequence stands at position
 * offset + t; or a device array of batch * seq int32 positions, one per
 * row (the varlen form; offset is then ignored). workspace: 256-byte
 * aligned device memory of stof_decoder_workspace_size bytes. Streams,
 * graphs and their reuse as stof_layer_run's (the offset is part of a
 * graph's buffer set). */
stof_status stof_decoder_run(stof_decoder_plan *plan, const void *x, void *out,
                             const int *positions, int offset, void *workspace,
                             stof_stream stream);

/* The chosen scheme and parameters per group, their timings, the attention
 * plan, the passes and whether the layer runs as a CUDA Graph. */
stof_status stof_decoder_plan_describe(const stof_decoder_plan *plan, char *buf, size_t n);
void stof_decoder_plan_free(stof_decoder_plan *plan);

/* Plans the layer without weights, so that its record (and its
 * attention's) lands in the cache. */
stof_status stof_decoder_tune(stof_ctx *ctx, const stof_decoder_desc *desc);

/* Compiles, with no GPU, the generated kernels the layer's schemes use
 * (GEMMs with default parameters, RMSNorm, RoPE, SwiGLU) and its
 * attention's, for the context's arch. */
stof_status stof_decoder_prepare(stof_ctx *ctx, const stof_decoder_desc *desc);

#ifdef __cplusplus
}
#endif
#endif
