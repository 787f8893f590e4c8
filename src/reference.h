/*
 * reference — CPU attention in double precision, the yardstick the GPU
 * kernels and their tests are checked against. It walks only the allowed
 * runs of each row, so it stays quick on sparse masks and usable on dense
 * ones of a thousand or two rows.
 */
#ifndef STOF_REFERENCE_H
#define STOF_REFERENCE_H

#include "stof.h"

/* out = softmax(Q K^T * scale + mask) V for every batch b and head h.
 *
 * q is [batch, heads, lq, head_dim] or [batch, lq, heads, head_dim] as
 * layout says; k and v the same with lk rows. out is written in q's layout,
 * as doubles (batch*heads*lq*head_dim of them).
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
} ref_attn_args;

stof_status ref_attention(stof_ctx *ctx, const ref_attn_args *a, double *out);

#endif
