#include "attn/reference.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attn/mask.h"
#include "base/err.h"
#include "base/half.h"

static int ref_kv_heads(const ref_attn_args *a)
{
    return a->kv_heads > 0 ? a->kv_heads : a->heads;
}

/* Index of element (b, h, l, 0) of a tensor with L rows per sequence and
 * heads heads. */
static size_t ref_offset_h(const ref_attn_args *a, int heads, int b, int h, int l, int rows)
{
    size_t H = (size_t)heads, L = (size_t)rows, D = (size_t)a->head_dim;
    if (a->layout == STOF_LAYOUT_BHLD)
        return (((size_t)b * H + (size_t)h) * L + (size_t)l) * D;
    return (((size_t)b * L + (size_t)l) * H + (size_t)h) * D;
}

/* Of q and out (heads heads). */
static size_t ref_offset(const ref_attn_args *a, int b, int h, int l, int rows)
{
    return ref_offset_h(a, a->heads, b, h, l, rows);
}

static stof_status ref_check(stof_ctx *ctx, const ref_attn_args *a, const double *out)
{
    CTX_ARG(ctx, a, "args");
    CTX_ARG(ctx, out, "out");
    CTX_ARG(ctx, a->q && a->k && a->v, "q/k/v");
    if (a->batch <= 0 || a->heads <= 0 || a->lq <= 0 || a->lk <= 0 || a->head_dim <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "reference attention sizes must be positive: batch %d heads %d "
                        "lq %d lk %d head_dim %d",
                        a->batch, a->heads, a->lq, a->lk, a->head_dim);
    if (!dtype_size(a->dtype))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "reference attention: bad dtype %d",
                        (int)a->dtype);
    if (a->layout != STOF_LAYOUT_BHLD && a->layout != STOF_LAYOUT_BLHD)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "reference attention: bad layout %d",
                        (int)a->layout);
    if (!isfinite(a->scale))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "reference attention: scale is not finite");
    if (a->kv_heads < 0 || a->heads % ref_kv_heads(a) != 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "reference attention: kv_heads %d does not divide heads %d", a->kv_heads,
                        a->heads);
    if (!(a->softcap >= 0) || isinf(a->softcap))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "reference attention: softcap must be finite and >= 0");
    if (a->alibi_slopes && !a->alibi)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "reference attention: alibi_slopes given without alibi");
    if (a->bias_buckets < 0 || a->bias_buckets > STOF_MAX_BIAS_BUCKETS ||
        (a->bias_buckets > 0) != (a->bias_table != NULL))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "reference attention: bias_buckets %d (0 to %d) needs bias_table, and "
                        "only it", a->bias_buckets, STOF_MAX_BIAS_BUCKETS);
    size_t n = (size_t)a->batch, lmax = (size_t)(a->lq > a->lk ? a->lq : a->lk);
    if (__builtin_mul_overflow(n, (size_t)a->heads, &n) || __builtin_mul_overflow(n, lmax, &n) ||
        __builtin_mul_overflow(n, (size_t)a->head_dim, &n) || n > SIZE_MAX / sizeof(double))
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "reference attention: tensors too large");
    if (a->mask) {
        int mq, mk;
        stof_mask_dims(a->mask, &mq, &mk);
        if (mq != a->lq || mk != a->lk)
            return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                            "reference attention: mask is %d x %d, attention is %d x %d", mq, mk,
                            a->lq, a->lk);
    }
    for (int b = 0; a->seq_lens && b < a->batch; b++)
        if (a->seq_lens[b] < 0 || (size_t)a->seq_lens[b] > lmax)
            return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                            "reference attention: seq_lens[%d] = %d is outside 0..%zu", b,
                            a->seq_lens[b], lmax);
    return STOF_OK;
}

double ref_alibi_slope(int h, int heads)
{
    int n = 1;
    while (n * 2 <= heads)
        n *= 2;
    return h < n ? exp2(-8.0 * (h + 1) / n) : exp2(-8.0 * (2 * (h - n) + 1) / (2.0 * n));
}

int ref_bias_bucket(int d, int buckets)
{
    const int lo = -(buckets / 2), hi = buckets - 1 - buckets / 2;
    return (d < lo ? lo : d > hi ? hi : d) + buckets / 2;
}

/* Scratch for one (batch, head): K and V decoded once, and one row's scores. */
typedef struct ref_scratch {
    double *k, *v, *q, *score;
} ref_scratch;

/* K or V of kv head h. */
static void ref_load(const ref_attn_args *a, const void *src, int b, int h, int rows, int n,
                     double *dst)
{
    int D = a->head_dim;
    for (int l = 0; l < n; l++) {
        size_t off = ref_offset_h(a, ref_kv_heads(a), b, h, l, rows);
        for (int d = 0; d < D; d++)
            dst[(size_t)l * D + d] = dtype_load(a->dtype, src, off + (size_t)d);
    }
}

/* One query row over the runs [start[i], start[i]+len[i]) clipped to keys < klen;
 * pos: its position among the keys, slope: its head's ALiBi slope (0: none),
 * bias: its head's row of the bias table (NULL: none). */
static void ref_row(const ref_attn_args *a, const ref_scratch *s, const int32_t *start,
                    const int32_t *len, long long n_runs, int klen, double scale, int pos,
                    double slope, const float *bias, double *o)
{
    int D = a->head_dim;
    double mx = -INFINITY;
    int any = 0;
    for (long long i = 0; i < n_runs; i++)
        for (int k = start[i]; k < start[i] + len[i] && k < klen; k++) {
            const double *kr = s->k + (size_t)k * D;
            double dot = 0;
            for (int d = 0; d < D; d++)
                dot += s->q[d] * kr[d];
            s->score[k] = dot * scale;
            if (a->softcap > 0)
                s->score[k] = a->softcap * tanh(s->score[k] / a->softcap);
            s->score[k] += slope * (k - pos);
            if (bias)
                s->score[k] += bias[ref_bias_bucket(pos - k, a->bias_buckets)];
            mx = s->score[k] > mx ? s->score[k] : mx;
            any = 1;
        }
    memset(o, 0, (size_t)D * sizeof *o);
    if (!any)
        return;
    double sum = 0;
    for (long long i = 0; i < n_runs; i++)
        for (int k = start[i]; k < start[i] + len[i] && k < klen; k++) {
            double p = exp(s->score[k] - mx);
            const double *vr = s->v + (size_t)k * D;
            sum += p;
            for (int d = 0; d < D; d++)
                o[d] += p * vr[d];
        }
    for (int d = 0; d < D; d++)
        o[d] /= sum;
}

/* Query rows [r0, r1) of one head, on K and V already loaded. */
typedef struct ref_rows_job {
    const ref_attn_args *a;
    ref_scratch s;           /* k, v shared; q, score this job's own */
    const mask_rows *rows;
    int b, h, r0, r1, len, klen; /* the sequence's length, its keys' */
    double scale;
    double *out;
} ref_rows_job;

static void *ref_rows(void *arg)
{
    const ref_rows_job *j = arg;
    const ref_attn_args *a = j->a;
    const ref_scratch *s = &j->s;
    const mask_rows *rows = j->rows;
    const int b = j->b, h = j->h, len = j->len, klen = j->klen;
    const int32_t all_start = 0, all_len = a->lk;
    double scale = j->scale, *out = j->out;
    const double slope = !a->alibi        ? 0
                         : a->alibi_slopes ? a->alibi_slopes[h]
                                           : ref_alibi_slope(h, a->heads);
    const float *bias = a->bias_buckets ? a->bias_table + (size_t)h * a->bias_buckets : NULL;
    for (int i = j->r0; i < j->r1; i++) {
        if (a->rows && !a->rows[i])
            continue;
        double *o = out + ref_offset(a, b, h, i, a->lq);
        if (i >= len) {
            memset(o, 0, (size_t)a->head_dim * sizeof *o);
            continue;
        }
        for (int d = 0; d < a->head_dim; d++)
            s->q[d] = dtype_load(a->dtype, a->q, ref_offset(a, b, h, i, a->lq) + (size_t)d);
        const int pos = i + a->lk - a->lq;
        if (rows)
            ref_row(a, s, rows->start + rows->row_ptr[i], rows->len + rows->row_ptr[i],
                    rows->row_ptr[i + 1] - rows->row_ptr[i], klen, scale, pos, slope, bias, o);
        else
            ref_row(a, s, &all_start, &all_len, 1, klen, scale, pos, slope, bias, o);
    }
    return NULL;
}

/* Threads for one head's rows: the cores, at most 16, and no fewer than
 * 64 rows each. */
#define REF_THREADS 16

/* One head: K and V loaded once, its rows split over threads (each with
 * its own q and scores; one that cannot start leaves its rows to the
 * caller). extra: REF_THREADS - 1 spare scratches. */
static void ref_head(const ref_attn_args *a, const ref_scratch *s, ref_scratch *extra,
                     int nthreads, const mask_rows *rows, int b, int h, double scale, double *out)
{
    int len = a->seq_lens ? a->seq_lens[b] : (a->lq > a->lk ? a->lq : a->lk);
    int klen = len < a->lk ? len : a->lk;
    const int kh = h / (a->heads / ref_kv_heads(a));
    ref_load(a, a->k, b, kh, a->lk, klen, s->k);
    ref_load(a, a->v, b, kh, a->lk, klen, s->v);
    int n = a->lq / 64 < nthreads ? a->lq / 64 : nthreads;
    n = n < 1 ? 1 : n;
    ref_rows_job jobs[REF_THREADS];
    pthread_t th[REF_THREADS];
    int started[REF_THREADS] = {0};
    for (int t = 0; t < n; t++) {
        jobs[t] = (ref_rows_job){a, *s, rows, b, h, (int)((long long)a->lq * t / n),
                                 (int)((long long)a->lq * (t + 1) / n), len, klen, scale, out};
        if (t > 0) {
            jobs[t].s.q = extra[t - 1].q;
            jobs[t].s.score = extra[t - 1].score;
            started[t] = pthread_create(&th[t], NULL, ref_rows, &jobs[t]) == 0;
        }
    }
    ref_rows(&jobs[0]);
    for (int t = 1; t < n; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            ref_rows(&jobs[t]);
    }
}

stof_status ref_attention(stof_ctx *ctx, const ref_attn_args *a, double *out)
{
    TRY(ref_check(ctx, a, out));
    double scale = a->scale != 0 ? a->scale : 1.0 / sqrt((double)a->head_dim);
    mask_rows rows = {0};
    if (a->mask)
        TRY(mask_build_rows(ctx, a->mask, &rows));
    size_t kv = (size_t)a->lk * (size_t)a->head_dim;
    ref_scratch s = {malloc(kv * sizeof(double)), malloc(kv * sizeof(double)),
                     malloc((size_t)a->head_dim * sizeof(double)),
                     malloc((size_t)a->lk * sizeof(double))};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = cores < 1 ? 1 : cores > REF_THREADS ? REF_THREADS : (int)cores;
    ref_scratch extra[REF_THREADS - 1] = {{0}};
    stof_status st = STOF_OK;
    for (int t = 0; t < nthreads - 1; t++) {
        extra[t].q = malloc((size_t)a->head_dim * sizeof(double));
        extra[t].score = malloc((size_t)a->lk * sizeof(double));
        if (!extra[t].q || !extra[t].score)
            st = STOF_ERR_NO_MEMORY;
    }
    if (!s.k || !s.v || !s.q || !s.score || st != STOF_OK)
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory in reference attention");
    for (int b = 0; b < a->batch && st == STOF_OK; b++)
        for (int h = 0; h < a->heads; h++)
            ref_head(a, &s, extra, nthreads, a->mask ? &rows : NULL, b, h, scale, out);
    for (int t = 0; t < nthreads - 1; t++) {
        free(extra[t].q);
        free(extra[t].score);
    }
    free(s.k);
    free(s.v);
    free(s.q);
    free(s.score);
    mask_rows_free(&rows);
    return st;
}

/* y[m, n] = round(act(sum_k a[m, k] w[n, k] + b[n])) into dtype storage. */
static void ref_linear(stof_dtype t, int rows, int n, int k, const void *a, const void *w,
                       const void *b, stof_activation act, int has_act, void *y)
{
    double *wd = malloc(sizeof(double) * (size_t)n * (size_t)k);
    double *ad = malloc(sizeof(double) * (size_t)k);
    for (size_t i = 0; wd && i < (size_t)n * (size_t)k; i++)
        wd[i] = dtype_load(t, w, i);
    for (int r = 0; wd && ad && r < rows; r++) {
        for (int j = 0; j < k; j++)
            ad[j] = dtype_load(t, a, (size_t)r * k + j);
        for (int c = 0; c < n; c++) {
            const double *wr = wd + (size_t)c * k;
            double s = dtype_load(t, b, (size_t)c);
            for (int j = 0; j < k; j++)
                s += ad[j] * wr[j];
            if (has_act)
                s = act == STOF_ACT_RELU ? (s > 0 ? s : 0)
                    : act == STOF_ACT_GELU_TANH
                        ? 0.5 * s * (1 + tanh(sqrt(2 / M_PI) * (s + 0.044715 * s * s * s)))
                        : 0.5 * s * (1 + erf(s / sqrt(2.0)));
            dtype_store(t, y, (size_t)r * n + c, s);
        }
    }
    free(wd);
    free(ad);
}

/* out = LayerNorm(v) * g + b per row of v (doubles), stored as doubles. */
static void ref_norm(stof_dtype t, int rows, int h, const double *v, const void *g,
                     const void *b, double eps, double *out)
{
    for (int r = 0; r < rows; r++) {
        const double *x = v + (size_t)r * h;
        double mean = 0, var = 0;
        for (int c = 0; c < h; c++)
            mean += x[c];
        mean /= h;
        for (int c = 0; c < h; c++)
            var += (x[c] - mean) * (x[c] - mean);
        const double rstd = 1 / sqrt(var / h + eps);
        for (int c = 0; c < h; c++)
            out[(size_t)r * h + c] =
                (x[c] - mean) * rstd * dtype_load(t, g, c) + dtype_load(t, b, c);
    }
}

stof_status ref_layer(stof_ctx *ctx, const stof_layer_desc *d, const stof_mask *mask,
                      const stof_layer_weights *w, const void *x, const int *seq_lens,
                      double *out)
{
    CTX_ARG(ctx, d && w && x && out, "args");
    const stof_dtype t = d->dtype;
    const int rows = d->batch * d->seq, h = d->hidden, f = d->ffn_hidden ? d->ffn_hidden : 4 * h;
    const int hd = h / d->heads;
    const double eps = d->eps > 0 ? d->eps : 1e-5;
    const size_t es = (size_t)dtype_size(t), rh = (size_t)rows * h;
    unsigned char *a = malloc(rh * es), *qkv = malloc(3 * rh * es), *q = malloc(3 * rh * es);
    unsigned char *att = malloc(rh * es), *hs = malloc(rh * es), *ff = malloc((size_t)rows * f * es);
    double *v = calloc(rh, sizeof(double)), *ao = calloc(rh, sizeof(double));
    stof_status st = STOF_OK;
    if (!a || !qkv || !q || !att || !hs || !ff || !v || !ao) {
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for the reference layer");
        goto done;
    }
    /* a: the attention's input (x, or LN1(x) before it). */
    if (d->norm == STOF_PRE_LN) {
        for (size_t i = 0; i < rh; i++)
            v[i] = dtype_load(t, x, i);
        ref_norm(t, rows, h, v, w->ln1_g, w->ln1_b, eps, v);
        for (size_t i = 0; i < rh; i++)
            dtype_store(t, a, i, v[i]);
    } else {
        memcpy(a, x, rh * es);
    }
    ref_linear(t, rows, 3 * h, h, a, w->qkv_w, w->qkv_b, 0, 0, qkv);
    /* [rows, 3, heads, hd] into q, k, v of [rows, heads, hd] each. */
    for (int r = 0; r < rows; r++)
        for (int p = 0; p < 3; p++)
            memcpy(q + ((size_t)p * rh + (size_t)r * h) * es, qkv + ((size_t)r * 3 + p) * h * es,
                   h * es);
    ref_attn_args aa = {.batch = d->batch, .heads = d->heads, .lq = d->seq, .lk = d->seq,
                        .head_dim = hd, .dtype = t, .layout = STOF_LAYOUT_BLHD,
                        .q = q, .k = q + rh * es, .v = q + 2 * rh * es, .mask = mask,
                        .seq_lens = seq_lens};
    st = ref_attention(ctx, &aa, ao);
    if (st != STOF_OK)
        goto done;
    for (size_t i = 0; i < rh; i++)
        dtype_store(t, att, i, ao[i]);
    /* v = attention projected + bias + residual x. */
    ref_linear(t, rows, h, h, att, w->o_w, w->o_b, 0, 0, a);
    for (size_t i = 0; i < rh; i++)
        v[i] = dtype_load(t, a, i) + dtype_load(t, x, i);
    if (d->norm == STOF_POST_LN) {
        ref_norm(t, rows, h, v, w->ln1_g, w->ln1_b, eps, v);
        for (size_t i = 0; i < rh; i++)
            dtype_store(t, hs, i, v[i]);           /* h: the FFN's input and residual */
        memcpy(a, hs, rh * es);
    } else {
        for (size_t i = 0; i < rh; i++)
            dtype_store(t, hs, i, v[i]);           /* h: the residual stream */
        ref_norm(t, rows, h, v, w->ln2_g, w->ln2_b, eps, v);
        for (size_t i = 0; i < rh; i++)
            dtype_store(t, a, i, v[i]);            /* LN2(h): the FFN's input */
    }
    ref_linear(t, rows, f, h, a, w->ff1_w, w->ff1_b, d->activation, 1, ff);
    ref_linear(t, rows, h, f, ff, w->ff2_w, w->ff2_b, 0, 0, a);
    for (size_t i = 0; i < rh; i++)
        v[i] = dtype_load(t, a, i) + dtype_load(t, hs, i);
    if (d->norm == STOF_POST_LN)
        ref_norm(t, rows, h, v, w->ln2_g, w->ln2_b, eps, out);
    else
        memcpy(out, v, rh * sizeof(double));
done:
    free(a);
    free(qkv);
    free(q);
    free(att);
    free(hs);
    free(ff);
    free(v);
    free(ao);
    return st;
}
