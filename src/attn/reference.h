/*
 * reference — CPU attention in double precision, the yardstick the GPU
 * kernels and their tests are checked against. It walks only the allowed
 * runs of each row, so it stays quick on sparse masks and usable on dense
 * ones of a thousand or two rows.
 */
#ifndef STOF_REFERENCE_H
#define STOF_REFERENCE_H

#include "stof.h"

/* out = softmax(cap(Q K^T * scale) + mods + mask) V for every batch b and
 * head h, cap(s) = softcap tanh(s / softcap) (s where softcap is 0), mods
 * ALiBi's slope[h] (k - p) and the distance bias table[h][bucket(p - k)]
 * (stof.h's desc), p = q + lk - lq the position of query row q.
 *
 * q is [batch, heads, lq, head_dim] or [batch, lq, heads, head_dim] as
 * layout says; k and v the same with lk rows and kv_heads heads (0: heads;
 * query head h reads kv head h / (heads / kv_heads)). out is written in q's
 * layout, as doubles (batch*heads*lq*head_dim of them). The mask says where
 * the queries stand among the keys (stof.h: bottom-right for a KV prefix).
 *
 * seq_lens (NULL: every sequence full) gives sequence b a valid length
 * 0 <= len <= max(lq, lk): keys k >= len are masked out and query rows
 * q >= len are written as zeros. A row with no allowed key left is written
 * as zeros, never NaN. */
typedef struct ref_attn_args {
    int batch, heads, lq, lk, head_dim;
    stof_dtype dtype;
    stof_layout layout;
    double scale;              /* 0: 1/sqrt(head_dim) */
    const void *q, *k, *v;
    const stof_mask *mask;     /* NULL: dense; else its dims must be (lq, lk) */
    const int *seq_lens;       /* [batch] or NULL */
    const unsigned char *rows; /* [lq]: only the query rows marked nonzero are
                                  computed (the others' out is left as it was);
                                  NULL: every row */
    int kv_heads;              /* heads of k and v; 0: heads, else a divisor of it */
    double softcap;            /* 0: off, else > 0 */
    int alibi;                 /* nonzero: ALiBi */
    const float *alibi_slopes; /* host [heads], or NULL: ref_alibi_slope's */
    int bias_buckets;          /* 0: off, else the table's buckets B */
    const float *bias_table;   /* host [heads][bias_buckets] */
} ref_attn_args;

/* The standard ALiBi slope of head h of heads (stof.h): 2^(-8(h+1)/n) for
 * n the power of two at or below heads, and for the heads past n the odd
 * powers of 2n's base, 2^(-8(2(h-n)+1)/(2n)). */
double ref_alibi_slope(int h, int heads);

/* The distance bias's bucket of d = p - k among B. */
int ref_bias_bucket(int d, int buckets);

stof_status ref_attention(stof_ctx *ctx, const ref_attn_args *a, double *out);

/* One encoder layer as src/stof.h defines it, on the host: x and the
 * weights (w's pointers are host memory here) in d->dtype, products, softmax
 * and LayerNorm in double. Each group's output is rounded to d->dtype where
 * the GPU stores it (q/k/v, the attention output, the residual stream
 * between the halves, the FFN's inner activation), so the GPU is compared
 * with its own storage precision and nothing else. seq_lens (host, NULL:
 * full) as for attention. out: batch * seq * hidden doubles. */
stof_status ref_layer(stof_ctx *ctx, const stof_layer_desc *d, const stof_mask *mask,
                      const stof_layer_weights *w, const void *x, const int *seq_lens,
                      double *out);

#endif
