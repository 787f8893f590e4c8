#include "attn/mask_walk.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/util.h"

void mask_walk_free(mask_walk *w)
{
    free(w->tmp);
    free(w->in_tmp);
    free(w->rg);
    free(w->rg_ptr);
    free(w->count);
    free(w->touched);
    free(w->mark);
}

stof_status mask_walk_init(stof_ctx *ctx, mask_walk *w, int lq, int lk, int bq, int bk,
                           mask_rows_fn rows, void *rows_arg)
{
    memset(w, 0, sizeof *w);
    if (bq < 16 || bq > 256 || bk < 16 || bk > 256)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "mask block sizes must be 16..256 rows by 16..256 keys, got %d x %d", bq, bk);
    w->rows = rows;
    w->rows_arg = rows_arg;
    w->lq = lq;
    w->lk = lk;
    w->bq = bq;
    w->bk = bk;
    w->nqb = (int)(((int64_t)w->lq + bq - 1) / bq);
    w->nkb = (int)(((int64_t)w->lk + bk - 1) / bk);
    w->wpr = (bk + 31) / 32;
    w->row_words = ((int64_t)w->nkb * bk + 31) / 32 + 1;
    w->row_min = INT_MAX;
    w->tmp = calloc((size_t)bq * (size_t)w->row_words, sizeof *w->tmp);
    w->in_tmp = calloc((size_t)bq, 1);
    w->rg_ptr = malloc(((size_t)bq + 1) * sizeof *w->rg_ptr);
    w->count = malloc((size_t)w->nkb * sizeof *w->count);
    w->touched = malloc((size_t)w->nkb * sizeof *w->touched);
    w->mark = calloc((size_t)w->nkb, 1);
    if (!w->tmp || !w->in_tmp || !w->rg_ptr || !w->count || !w->touched || !w->mark) {
        mask_walk_free(w);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory walking a %d x %d mask",
                        w->lq, w->lk);
    }
    return STOF_OK;
}

static void bits_set(uint32_t *w, int64_t lo, int64_t hi)
{
    while (lo < hi) {
        int b = (int)(lo & 31);
        int64_t n = util_min64(32 - b, hi - lo);
        w[lo >> 5] |= (n == 32 ? ~0u : ((1u << n) - 1)) << b;
        lo += n;
    }
}

/* nbits bits from bit off, into ceil(nbits/32) words, high bits cleared. */
static void bits_get(const uint32_t *w, int64_t off, int nbits, uint32_t *out)
{
    for (int i = 0; i * 32 < nbits; i++) {
        int64_t p = off + 32 * i;
        int sh = (int)(p & 31);
        uint32_t v = w[p >> 5] >> sh;
        if (sh)
            v |= w[(p >> 5) + 1] << (32 - sh);
        if (nbits - 32 * i < 32)
            v &= (1u << (nbits - 32 * i)) - 1;
        out[i] = v;
    }
}

static void mask_walk_row_stats(mask_walk *w, const mask_range *r, int n)
{
    int e = 0;
    for (int i = 0; i < n; i++)
        e += r[i].hi - r[i].lo;
    w->entries += e;
    w->runs += n;
    w->row_min = e < w->row_min ? e : w->row_min;
    w->row_max = e > w->row_max ? e : w->row_max;
    w->runs_max = n > w->runs_max ? n : w->runs_max;
    w->empty_rows += e == 0;
}

static void mask_walk_touch(mask_walk *w, int kb, int64_t n)
{
    if (!w->mark[kb]) {
        w->mark[kb] = 1;
        w->count[kb] = 0;
        w->touched[w->n_touched++] = kb;
    }
    w->count[kb] += (int32_t)n;
}

/* Counts the row's entries per key block, and sets its bits where row is
 * given. The ranges come sorted, so the key block is followed along the row
 * rather than found by division for each of the thousands of runs a strided
 * row has. */
static void mask_walk_row(mask_walk *w, uint32_t *row, const mask_range *rg, int n)
{
    int kb = 0;
    int64_t kb_lo = 0, kb_hi = w->bk;
    for (int i = 0; i < n; i++) {
        int64_t lo = rg[i].lo, hi = rg[i].hi;
        if (row && hi - lo == 1)
            row[lo >> 5] |= 1u << (lo & 31);
        else if (row)
            bits_set(row, lo, hi);
        if (lo >= kb_hi + 4 * (int64_t)w->bk) {
            kb = (int)(lo / w->bk);
            kb_lo = (int64_t)kb * w->bk;
            kb_hi = kb_lo + w->bk;
        }
        while (lo >= kb_hi) {
            kb++;
            kb_lo = kb_hi;
            kb_hi += w->bk;
        }
        for (;;) {
            mask_walk_touch(w, kb, util_min64(hi, kb_hi) - util_max64(lo, kb_lo));
            if (hi <= kb_hi)
                break;
            kb++;
            kb_lo = kb_hi;
            kb_hi += w->bk;
        }
    }
}

/* For rows of many short runs (strided): set the bits, then count each key
 * block's with popcounts, which costs a fixed sweep instead of work per run. */
static void mask_walk_row_sweep(mask_walk *w, uint32_t *row, const mask_range *rg, int n)
{
    for (int i = 0; i < n; i++)
        bits_set(row, rg[i].lo, rg[i].hi);
    uint32_t words[8];  /* a block's keys: at most 256 */
    for (int kb = 0; kb < w->nkb; kb++) {
        bits_get(row, (int64_t)kb * w->bk, w->bk, words);
        int c = 0;
        for (int i = 0; i < w->wpr; i++)
            c += __builtin_popcount(words[i]);
        if (c)
            mask_walk_touch(w, kb, c);
    }
}

int mask_walk_qblock(mask_walk *w, int qb)
{
    int64_t r0 = (int64_t)qb * w->bq;
    w->nr = (int)util_min64(w->bq, w->lq - r0);
    w->n_touched = 0;
    w->n_in_tmp = 0;
    w->rg_ptr[0] = 0;
    for (int r = 0; r < w->nr; r++) {
        const mask_range *rg;
        int n = w->rows(w->rows_arg, (int)(r0 + r), &rg);
        if (w->row_fn)
            w->row_fn(w->row_arg, rg, n);
        mask_walk_row_stats(w, rg, n);
        int64_t at = w->rg_ptr[r];
        w->in_tmp[r] = n > w->nkb;
        if (w->in_tmp[r]) {
            uint32_t *row = w->tmp + (size_t)r * (size_t)w->row_words;
            w->n_in_tmp++;
            if (n > (int64_t)w->nkb * w->wpr)
                mask_walk_row_sweep(w, row, rg, n);
            else
                mask_walk_row(w, row, rg, n);
        } else {
            mask_walk_row(w, NULL, rg, n);
            if (util_grow((void **)&w->rg, &w->rg_cap, at + n, sizeof *w->rg))
                return -1;
            if (n)
                memcpy(w->rg + at, rg, (size_t)n * sizeof *rg);
            at += n;
        }
        w->rg_ptr[r + 1] = at;
    }
    qsort(w->touched, (size_t)w->n_touched, sizeof *w->touched, util_cmp_i32);
    return 0;
}

int mask_walk_area(const mask_walk *w, int kb)
{
    return w->nr * (int)util_min64(w->bk, w->lk - (int64_t)kb * w->bk);
}

void mask_walk_bitmap(const mask_walk *w, int kb, uint32_t *out)
{
    memset(out, 0, (size_t)w->bq * (size_t)w->wpr * sizeof *out);
    const int64_t k0 = (int64_t)kb * w->bk, k1 = k0 + w->bk;
    for (int r = 0; r < w->nr; r++) {
        uint32_t *row = out + (size_t)r * (size_t)w->wpr;
        if (w->in_tmp[r]) {
            bits_get(w->tmp + (size_t)r * (size_t)w->row_words, k0, w->bk, row);
            continue;
        }
        const mask_range *rg = w->rg + w->rg_ptr[r];
        const int64_t n = w->rg_ptr[r + 1] - w->rg_ptr[r];
        int64_t lo = 0, hi = n;
        while (lo < hi) {     /* the first run that ends past k0 */
            int64_t mid = lo + (hi - lo) / 2;
            if (rg[mid].hi <= k0)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (int64_t i = lo; i < n && rg[i].lo < k1; i++)
            bits_set(row, util_max64(rg[i].lo, k0) - k0, util_min64(rg[i].hi, k1) - k0);
    }
}

/* Unmarks the key blocks the query block touched, and clears only the bits
 * it set, so a sparse mask costs no full sweep. */
void mask_walk_clear(mask_walk *w)
{
    for (int i = 0; i < w->n_touched; i++) {
        int kb = w->touched[i];
        w->mark[kb] = 0;
        if (!w->n_in_tmp)
            continue;
        int64_t w0 = ((int64_t)kb * w->bk) >> 5, w1 = ((int64_t)(kb + 1) * w->bk - 1) >> 5;
        for (int r = 0; r < w->nr; r++)
            if (w->in_tmp[r])
                memset(w->tmp + (size_t)r * (size_t)w->row_words + w0, 0,
                       (size_t)(w1 - w0 + 1) * sizeof *w->tmp);
    }
}
