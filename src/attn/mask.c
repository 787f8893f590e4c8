#include "attn/mask.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mask_picture.h"
#include "attn/mask_walk.h"
#include "base/err.h"
#include "base/hash.h"
#include "base/util.h"

struct stof_mask {
    int lq, lk;
    char *spec;           /* the normal form of the spec, or "dense-matrix" */
    mask_spec terms;      /* spec-built masks; all zero for matrix-built ones */
    int64_t *row_ptr;     /* matrix-built masks: lq + 1 */
    mask_range *ranges;
};

/* ---- the row iterator ------------------------------------------------------- */

stof_status mask_iter_init(mask_iter *it, const stof_mask *m)
{
    memset(it, 0, sizeof *it);
    it->m = m;
    if (m->ranges)
        return STOF_OK;
    return mask_spec_rows_init(&it->rows, &m->terms);
}

void mask_iter_free(mask_iter *it)
{
    mask_spec_rows_free(&it->rows);
    memset(it, 0, sizeof *it);
}

int mask_row_ranges(mask_iter *it, int q, const mask_range **out)
{
    const stof_mask *m = it->m;
    if (m->ranges) {
        *out = m->ranges + m->row_ptr[q];
        return (int)(m->row_ptr[q + 1] - m->row_ptr[q]);
    }
    return mask_spec_row(&it->rows, &m->terms, q, out);
}

/* ---- making masks ------------------------------------------------------------- */

/* Before anything else: every later step walks the rows, so a length past
 * what attention takes would only cost time (minutes at 10^9 rows). */
static stof_status check_dims(stof_ctx *ctx, int lq, int lk)
{
    if (lq <= 0 || lk <= 0)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "mask sizes must be positive, got lq = %d, lk = %d", lq, lk);
    if (lq > STOF_MAX_SEQ || lk > STOF_MAX_SEQ)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "mask sizes go up to STOF_MAX_SEQ = %d (the longest sequence attention "
                        "takes), got %s = %d", STOF_MAX_SEQ, lq > STOF_MAX_SEQ ? "lq" : "lk",
                        lq > STOF_MAX_SEQ ? lq : lk);
    return STOF_OK;
}

stof_status stof_mask_parse(stof_ctx *ctx, const char *spec, int lq, int lk, stof_mask **out)
{
    if (out)
        *out = NULL;
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, out, "out");
    CTX_ARG(ctx, spec, "spec");
    TRY(check_dims(ctx, lq, lk));
    mask_spec terms;
    char *norm;
    TRY(mask_spec_parse(ctx, spec, lq, lk, &terms, &norm));
    stof_mask *m = calloc(1, sizeof *m);
    if (!m) {
        mask_spec_free(&terms);
        free(norm);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory parsing a mask spec");
    }
    m->lq = lq;
    m->lk = lk;
    m->spec = norm;
    m->terms = terms;
    *out = m;
    return STOF_OK;
}

static long long count_runs(const unsigned char *row, int lk)
{
    long long n = 0;
    for (int k = 0; k < lk; k++)
        n += row[k] && (k == 0 || !row[k - 1]);
    return n;
}

stof_status stof_mask_from_dense(stof_ctx *ctx, const unsigned char *allowed, int lq, int lk,
                                 stof_mask **out)
{
    if (out)
        *out = NULL;
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, out, "out");
    CTX_ARG(ctx, allowed, "allowed");
    TRY(check_dims(ctx, lq, lk));
    long long total = 0;
    for (int q = 0; q < lq; q++)
        total += count_runs(allowed + (size_t)q * lk, lk);
    stof_mask *m = calloc(1, sizeof *m);
    if (m) {
        m->row_ptr = malloc(((size_t)lq + 1) * sizeof *m->row_ptr);
        m->ranges = malloc((size_t)(total ? total : 1) * sizeof *m->ranges);
        m->spec = strdup("dense-matrix");
    }
    if (!m || !m->row_ptr || !m->ranges || !m->spec) {
        stof_mask_free(m);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory copying a %d x %d mask", lq, lk);
    }
    m->lq = lq;
    m->lk = lk;
    int64_t n = 0;
    for (int q = 0; q < lq; q++) {
        const unsigned char *row = allowed + (size_t)q * lk;
        m->row_ptr[q] = n;
        for (int k = 0; k < lk; k++) {
            if (!row[k])
                continue;
            if (k == 0 || !row[k - 1])
                m->ranges[n].lo = k;
            if (k == lk - 1 || !row[k + 1])
                m->ranges[n++].hi = k + 1;
        }
    }
    m->row_ptr[lq] = n;
    *out = m;
    return STOF_OK;
}

void stof_mask_free(stof_mask *m)
{
    if (!m)
        return;
    mask_spec_free(&m->terms);
    free(m->spec);
    free(m->row_ptr);
    free(m->ranges);
    free(m);
}

const char *stof_mask_spec(const stof_mask *m) { return m ? m->spec : ""; }

int mask_spec_key(const stof_mask *m, char key[65])
{
    if (!m || m->ranges || !m->spec)
        return 0;
    hash_sha256 h;
    unsigned char d[32];
    char sizes[32];
    snprintf(sizes, sizeof sizes, "%d x %d", m->lq, m->lk);
    hash_init(&h);
    hash_update(&h, "stof mask spec", 15);
    hash_update(&h, m->spec, strlen(m->spec) + 1);
    hash_update(&h, sizes, strlen(sizes) + 1);
    hash_final(&h, d);
    hash_to_hex(d, key);
    return 1;
}

void stof_mask_dims(const stof_mask *m, int *lq, int *lk)
{
    if (lq)
        *lq = m ? m->lq : 0;
    if (lk)
        *lk = m ? m->lk : 0;
}

/* ---- canonical hash ------------------------------------------------------------ */

static size_t put_varint(unsigned char *b, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        b[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    b[n++] = (unsigned char)v;
    return n;
}

/* The digest covers a version tag, Lq, Lk, and each row as its run count
 * followed by (gap from the previous run's end, length) pairs: merged runs
 * are unique for a set of entries, and the counts make the stream
 * unambiguous. Rows are fed in order, by stof_mask_hash's walk or by the
 * summary's. */
typedef struct mask_hasher {
    hash_sha256 h;
    unsigned char buf[4096];
    size_t n;
} mask_hasher;

static void hasher_init(mask_hasher *x, int lq, int lk)
{
    hash_init(&x->h);
    x->n = (size_t)snprintf((char *)x->buf, sizeof x->buf, "stof-mask-v1") + 1;
    x->n += put_varint(x->buf + x->n, (uint64_t)lq);
    x->n += put_varint(x->buf + x->n, (uint64_t)lk);
}

static void hasher_row(mask_hasher *x, const mask_range *r, int nr)
{
    x->n += put_varint(x->buf + x->n, (uint64_t)nr);
    int32_t prev = 0;
    for (int i = 0; i < nr; i++) {
        if (x->n > sizeof x->buf - 32) {
            hash_update(&x->h, x->buf, x->n);
            x->n = 0;
        }
        x->n += put_varint(x->buf + x->n, (uint64_t)(r[i].lo - prev));
        x->n += put_varint(x->buf + x->n, (uint64_t)(r[i].hi - r[i].lo));
        prev = r[i].hi;
    }
    if (x->n > sizeof x->buf - 32) {
        hash_update(&x->h, x->buf, x->n);
        x->n = 0;
    }
}

static void hasher_final(mask_hasher *x, char hex[65])
{
    hash_update(&x->h, x->buf, x->n);
    unsigned char digest[32];
    hash_final(&x->h, digest);
    hash_to_hex(digest, hex);
}

stof_status stof_mask_hash(const stof_mask *m, char hex[65])
{
    if (!m || !hex)
        return STOF_ERR_INVALID_ARG;
    mask_iter it;
    TRY(mask_iter_init(&it, m));
    mask_hasher x;
    hasher_init(&x, m->lq, m->lk);
    for (int q = 0; q < m->lq; q++) {
        const mask_range *r;
        int nr = mask_row_ranges(&it, q, &r);
        hasher_row(&x, r, nr);
    }
    hasher_final(&x, hex);
    mask_iter_free(&it);
    return STOF_OK;
}

stof_status mask_to_dense(const stof_mask *m, unsigned char **out)
{
    *out = NULL;
    mask_iter it;
    TRY(mask_iter_init(&it, m));
    unsigned char *d = calloc((size_t)m->lq * m->lk, 1);
    if (!d) {
        mask_iter_free(&it);
        return STOF_ERR_NO_MEMORY;
    }
    for (int q = 0; q < m->lq; q++) {
        const mask_range *r;
        int nr = mask_row_ranges(&it, q, &r);
        for (int i = 0; i < nr; i++)
            memset(d + (size_t)q * m->lk + r[i].lo, 1, (size_t)(r[i].hi - r[i].lo));
    }
    mask_iter_free(&it);
    *out = d;
    return STOF_OK;
}

/* Ranges r[0 .. n) moved right by `by`, cut to [lo, hi), adjacent ones
 * joined, into dst (n of them at most); returns how many. */
static int clip_ranges(const mask_range *r, int n, int by, int lo, int hi, mask_range *dst)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        int a = r[i].lo + by, b = r[i].hi + by;
        a = a < lo ? lo : a;
        b = b > hi ? hi : b;
        if (a >= b)
            continue;
        if (m > 0 && dst[m - 1].hi >= a)
            dst[m - 1].hi = b > dst[m - 1].hi ? b : dst[m - 1].hi;
        else
            dst[m++] = (mask_range){a, b};
    }
    return m;
}

stof_status mask_diagonal(const stof_mask *m, int *diagonal)
{
    *diagonal = 1;
    mask_iter it;
    TRY(mask_iter_init(&it, m));
    mask_range *prev = NULL, *a = NULL, *b = NULL;
    int np = 0, cap = 0;
    stof_status st = STOF_OK;
    for (int q = 0; q < m->lq && *diagonal; q++) {
        const mask_range *r;
        int nr = mask_row_ranges(&it, q, &r);
        if (nr > cap) {
            cap = nr * 2;
            mask_range *p2 = realloc(prev, (size_t)cap * sizeof *p2);
            prev = p2 ? p2 : prev;
            mask_range *a2 = realloc(a, (size_t)cap * sizeof *a2);
            a = a2 ? a2 : a;
            mask_range *b2 = realloc(b, (size_t)cap * sizeof *b2);
            b = b2 ? b2 : b;
            if (!p2 || !a2 || !b2) {
                st = STOF_ERR_NO_MEMORY;
                break;
            }
        }
        /* Entry (q, k) against (q - 1, k - 1), for k >= 1: row q - 1's
         * ranges moved one key right. */
        if (q > 0) {
            int na = clip_ranges(prev, np, 1, 1, m->lk, a);
            int nb = clip_ranges(r, nr, 0, 1, m->lk, b);
            *diagonal = na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
        }
        if (nr > 0)
            memcpy(prev, r, (size_t)nr * sizeof *r);
        np = nr;
    }
    free(prev);
    free(a);
    free(b);
    mask_iter_free(&it);
    return st;
}

/* ---- per-row runs ------------------------------------------------------------------ */

void mask_rows_free(mask_rows *r)
{
    if (!r)
        return;
    free(r->row_ptr);
    free(r->start);
    free(r->len);
    memset(r, 0, sizeof *r);
}

stof_status mask_build_rows(stof_ctx *ctx, const stof_mask *m, mask_rows *out)
{
    CTX_ARG(ctx, m && out, "mask");
    memset(out, 0, sizeof *out);
    mask_iter it;
    if (mask_iter_init(&it, m) != STOF_OK)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory walking a mask");
    out->lq = m->lq;
    out->lk = m->lk;
    long long cap_start = 0, cap_len = 0;
    int failed = !(out->row_ptr = malloc(((size_t)m->lq + 1) * sizeof *out->row_ptr));
    for (int q = 0; q < m->lq && !failed; q++) {
        const mask_range *r;
        int nr = mask_row_ranges(&it, q, &r);
        long long need = out->n_ranges + nr;
        if (util_grow((void **)&out->start, &cap_start, need, sizeof *out->start) ||
            util_grow((void **)&out->len, &cap_len, need, sizeof *out->len)) {
            failed = 1;
            break;
        }
        out->row_ptr[q] = out->n_ranges;
        for (int i = 0; i < nr; i++) {
            out->start[out->n_ranges] = r[i].lo;
            out->len[out->n_ranges++] = r[i].hi - r[i].lo;
            out->entries += r[i].hi - r[i].lo;
        }
    }
    mask_iter_free(&it);
    if (failed) {
        mask_rows_free(out);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory building per-row mask runs");
    }
    out->row_ptr[m->lq] = out->n_ranges;
    return STOF_OK;
}

/* ---- walking query blocks (attn/mask_walk) ------------------------------------ */

static int iter_rows(void *it, int q, const mask_range **out)
{
    return mask_row_ranges(it, q, out);
}

/* A walk of m in bq x bk blocks, its rows read through *it. */
static stof_status walk_open(stof_ctx *ctx, mask_walk *w, mask_iter *it, const stof_mask *m,
                             int bq, int bk)
{
    TRY(mask_walk_init(ctx, w, m->lq, m->lk, bq, bk, iter_rows, it));
    if (mask_iter_init(it, m) != STOF_OK) {
        mask_walk_free(w);
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory walking a %d x %d mask",
                        m->lq, m->lk);
    }
    return STOF_OK;
}

static void walk_close(mask_walk *w, mask_iter *it)
{
    mask_walk_free(w);
    mask_iter_free(it);
}

/* ---- distinct bitmaps --------------------------------------------------------------- */

static uint64_t bitmap_hash(const uint32_t *b, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static int bitset_rehash(mask_bitset *s, long long n_slots)
{
    int32_t *slot = calloc((size_t)n_slots, sizeof *slot);
    if (!slot)
        return -1;
    for (long long i = 0; i < s->n; i++) {
        uint64_t h = bitmap_hash(s->bits + i * s->wpb, s->wpb) & (uint64_t)(n_slots - 1);
        while (slot[h])
            h = (h + 1) & (uint64_t)(n_slots - 1);
        slot[h] = (int32_t)(i + 1);
    }
    free(s->slot);
    s->slot = slot;
    s->n_slots = n_slots;
    return 0;
}

long long mask_bitset_add(mask_bitset *s, const uint32_t *b)
{
    if ((s->n + 1) * 2 > s->n_slots && bitset_rehash(s, s->n_slots ? s->n_slots * 2 : 1024))
        return -1;
    uint64_t mask = (uint64_t)(s->n_slots - 1);
    uint64_t h = bitmap_hash(b, s->wpb) & mask;
    for (; s->slot[h]; h = (h + 1) & mask) {
        long long i = s->slot[h] - 1;
        if (!memcmp(s->bits + i * s->wpb, b, (size_t)s->wpb * sizeof *b))
            return i;
    }
    if (s->n >= INT32_MAX - 1 ||
        util_grow((void **)&s->bits, &s->cap, (s->n + 1) * s->wpb, sizeof *s->bits))
        return -1;
    memcpy(s->bits + s->n * s->wpb, b, (size_t)s->wpb * sizeof *b);
    s->slot[h] = (int32_t)(s->n + 1);
    return s->n++;
}

void mask_bitset_free(mask_bitset *s)
{
    free(s->bits);
    free(s->slot);
    memset(s, 0, sizeof *s);
}

/* ---- block-sparse rows ------------------------------------------------------------ */

void mask_blocks_free(mask_blocks *b)
{
    if (!b)
        return;
    free(b->row_ptr);
    free(b->col);
    free(b->partial);
    free(b->bits);
    memset(b, 0, sizeof *b);
}

stof_status mask_build_blocks(stof_ctx *ctx, const stof_mask *m, int bq, int bk,
                              mask_blocks *out)
{
    CTX_ARG(ctx, m && out, "mask");
    memset(out, 0, sizeof *out);
    mask_walk w;
    mask_iter it;
    TRY(walk_open(ctx, &w, &it, m, bq, bk));
    mask_bitset set = {.wpb = bq * w.wpr};
    uint32_t *bm = malloc((size_t)set.wpb * sizeof *bm);
    out->row_ptr = malloc(((size_t)w.nqb + 1) * sizeof *out->row_ptr);
    long long cap_col = 0, cap_partial = 0;
    stof_status st = bm && out->row_ptr ? STOF_OK : STOF_ERR_NO_MEMORY;
    for (int qb = 0; qb < w.nqb && st == STOF_OK; qb++) {
        if (mask_walk_qblock(&w, qb)) {
            st = STOF_ERR_NO_MEMORY;
            break;
        }
        out->row_ptr[qb] = (int32_t)out->n_blocks;
        long long need = out->n_blocks + w.n_touched;
        if (need > INT32_MAX) {
            st = STOF_ERR_UNSUPPORTED;
            break;
        }
        if (util_grow((void **)&out->col, &cap_col, need, sizeof *out->col) ||
            util_grow((void **)&out->partial, &cap_partial, need, sizeof *out->partial)) {
            st = STOF_ERR_NO_MEMORY;
            break;
        }
        for (int i = 0; i < w.n_touched && st == STOF_OK; i++) {
            int kb = w.touched[i];
            long long idx = -1;
            if (w.count[kb] < mask_walk_area(&w, kb)) {
                mask_walk_bitmap(&w, kb, bm);
                if ((idx = mask_bitset_add(&set, bm)) < 0)
                    st = STOF_ERR_NO_MEMORY;
                out->n_partial++;
            } else {
                out->n_full++;
            }
            out->col[out->n_blocks] = kb;
            out->partial[out->n_blocks++] = (int32_t)idx;
        }
        mask_walk_clear(&w);
    }
    free(bm);
    walk_close(&w, &it);
    free(set.slot);
    out->bits = set.bits;
    out->n_bitmaps = set.n;
    if (st != STOF_OK) {
        mask_blocks_free(out);
        if (st == STOF_ERR_UNSUPPORTED)
            return CTX_FAIL(ctx, st, "mask %d x %d in %d x %d blocks lists over INT32_MAX blocks",
                            m->lq, m->lk, bq, bk);
        return CTX_FAIL(ctx, st, "out of memory building the block-sparse mask");
    }
    out->row_ptr[w.nqb] = (int32_t)out->n_blocks;
    out->lq = m->lq;
    out->lk = m->lk;
    out->bq = bq;
    out->bk = bk;
    out->nqb = w.nqb;
    out->nkb = w.nkb;
    out->words_per_row = w.wpr;
    out->words_per_block = set.wpb;
    return STOF_OK;
}

/* ---- statistics ------------------------------------------------------------------- */

static void stats_finish(stof_mask_info *o, const mask_walk *w, long long area,
                         double fill_sum)
{
    o->entries = w->entries;
    o->density = (double)w->entries / ((double)w->lq * w->lk);
    o->row_min = w->row_min;
    o->row_max = w->row_max;
    o->row_mean = (double)w->entries / w->lq;
    o->empty_rows = w->empty_rows;
    o->runs_mean = (double)w->runs / w->lq;
    o->runs_max = w->runs_max;
    o->partial_fill_mean = o->blocks_partial ? fill_sum / (double)o->blocks_partial : 0;
    o->kblocks_mean = (double)o->blocks_touched / w->nqb;
    o->block_density = (double)o->blocks_touched / ((double)w->nqb * w->nkb);
    o->block_efficiency = area ? (double)w->entries / (double)area : 0;
}

/* The statistics in block_q x block_k blocks, telling row_fn (may be NULL)
 * every row on the way. */
static stof_status stats_walk(stof_ctx *ctx, const stof_mask *m, int block_q, int block_k,
                              mask_row_fn row_fn, void *row_arg, stof_mask_info *out)
{
    mask_walk w;
    mask_iter it;
    TRY(walk_open(ctx, &w, &it, m, block_q, block_k));
    w.row_fn = row_fn;
    w.row_arg = row_arg;
    mask_bitset set = {.wpb = block_q * w.wpr};
    uint32_t *bm = malloc((size_t)set.wpb * sizeof *bm);
    stof_mask_info o = {.lq = m->lq, .lk = m->lk, .block_q = block_q, .block_k = block_k,
                        .n_qblocks = w.nqb, .n_kblocks = w.nkb};
    long long area = 0;
    double fill_sum = 0;
    int failed = !bm;
    for (int qb = 0; qb < w.nqb && !failed; qb++) {
        if ((failed = mask_walk_qblock(&w, qb) != 0))
            break;
        o.blocks_touched += w.n_touched;
        o.kblocks_max = w.n_touched > o.kblocks_max ? w.n_touched : o.kblocks_max;
        for (int i = 0; i < w.n_touched; i++) {
            int kb = w.touched[i], a = mask_walk_area(&w, kb);
            area += a;
            if (w.count[kb] == a) {
                o.blocks_full++;
                continue;
            }
            o.blocks_partial++;
            o.partial_entries += w.count[kb];
            fill_sum += (double)w.count[kb] / a;
            mask_walk_bitmap(&w, kb, bm);
            failed |= mask_bitset_add(&set, bm) < 0;
        }
        mask_walk_clear(&w);
    }
    o.distinct_bitmaps = set.n;
    stats_finish(&o, &w, area, fill_sum);
    free(bm);
    walk_close(&w, &it);
    mask_bitset_free(&set);
    if (failed)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory computing mask statistics");
    *out = o;
    return STOF_OK;
}

stof_status stof_mask_stats(stof_ctx *ctx, const stof_mask *m, int block_q, int block_k,
                            stof_mask_info *out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, m, "m");
    CTX_ARG(ctx, out, "out");
    return stats_walk(ctx, m, block_q, block_k, NULL, NULL, out);
}

/* ---- the summary a plan reads --------------------------------------------------------- */

/* The D of the mask's first dilated:W:D term, else 1: rows sharing q mod D
 * share their keys. */
static int spec_period(const char *s)
{
    const char *p = s ? strstr(s, "dilated:") : NULL;
    if (!p)
        return 1;
    p = strchr(p + 8, ':');
    int d = p ? atoi(p + 1) : 1;
    return d >= 1 && d <= 64 ? d : 1;
}

/* What the walk keeps of each row: the hash, and the runs (unless the mask
 * is its runs already). */
typedef struct summary_walk {
    mask_hasher h;
    stof_mask *runs;
    long long cap;
    int q, failed;
} summary_walk;

static void summary_row(void *arg, const mask_range *r, int n)
{
    summary_walk *s = arg;
    hasher_row(&s->h, r, n);
    stof_mask *k = s->runs;
    if (k && !s->failed) {
        int64_t at = k->row_ptr[s->q];
        if (util_grow((void **)&k->ranges, &s->cap, at + n, sizeof *k->ranges)) {
            s->failed = 1;
        } else {
            memcpy(k->ranges + at, r, (size_t)n * sizeof *r);
            k->row_ptr[s->q + 1] = at + n;
        }
    }
    s->q++;
}

static long long summaries_made;

long long mask_summaries_made(void) { return __atomic_load_n(&summaries_made, __ATOMIC_RELAXED); }

stof_status mask_summarize(stof_ctx *ctx, const stof_mask *m, mask_summary *out)
{
    __atomic_fetch_add(&summaries_made, 1, __ATOMIC_RELAXED);
    CTX_ARG(ctx, m && out, "mask");
    memset(out, 0, sizeof *out);
    summary_walk s = {0};
    hasher_init(&s.h, m->lq, m->lk);
    if (!m->ranges) {
        stof_mask *k = calloc(1, sizeof *k);
        if (k) {
            k->lq = m->lq;
            k->lk = m->lk;
            k->spec = strdup(m->spec ? m->spec : "");
            k->row_ptr = calloc((size_t)m->lq + 1, sizeof *k->row_ptr);
            k->ranges = malloc(sizeof *k->ranges);  /* a mask of runs has an array */
            s.cap = 1;
        }
        if (!k || !k->spec || !k->row_ptr || !k->ranges) {
            stof_mask_free(k);
            return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory summarizing a %d x %d mask",
                            m->lq, m->lk);
        }
        s.runs = k;
    }
    stof_status st = stats_walk(ctx, m, MASK_SUMMARY_BLOCK, MASK_SUMMARY_BLOCK, summary_row, &s,
                                &out->info);
    if (st == STOF_OK && s.failed)
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory keeping a %d x %d mask's runs",
                      m->lq, m->lk);
    if (st != STOF_OK) {
        stof_mask_free(s.runs);
        memset(out, 0, sizeof *out);
        return st;
    }
    out->lq = m->lq;
    out->lk = m->lk;
    hasher_final(&s.h, out->hash);
    out->period = spec_period(m->spec);
    out->own = s.runs;
    out->runs = s.runs ? s.runs : m;
    return STOF_OK;
}

void mask_summary_free(mask_summary *s)
{
    if (!s)
        return;
    stof_mask_free(s->own);
    memset(s, 0, sizeof *s);
}

/* ---- the dense matrix, the block map and its picture ------------------------------ */

stof_status stof_mask_to_dense(stof_ctx *ctx, const stof_mask *m, unsigned char *out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, m, "m");
    CTX_ARG(ctx, out, "out");
    mask_iter it;
    if (mask_iter_init(&it, m))
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory walking a %d x %d mask", m->lq,
                        m->lk);
    memset(out, 0, (size_t)m->lq * (size_t)m->lk);
    for (int q = 0; q < m->lq; q++) {
        const mask_range *r;
        int nr = mask_row_ranges(&it, q, &r);
        for (int i = 0; i < nr; i++)
            memset(out + (size_t)q * m->lk + r[i].lo, 1, (size_t)(r[i].hi - r[i].lo));
    }
    mask_iter_free(&it);
    return STOF_OK;
}

/* The same walk as stof_mask_stats, so the map and the counts always agree. */
stof_status stof_mask_block_map(stof_ctx *ctx, const stof_mask *m, int block_q, int block_k,
                                unsigned char *out)
{
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, m, "m");
    CTX_ARG(ctx, out, "out");
    mask_walk w;
    mask_iter it;
    TRY(walk_open(ctx, &w, &it, m, block_q, block_k));
    memset(out, STOF_BLOCK_EMPTY, (size_t)w.nqb * (size_t)w.nkb);
    for (int qb = 0; qb < w.nqb; qb++) {
        if (mask_walk_qblock(&w, qb)) {
            walk_close(&w, &it);
            return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory walking a %d x %d mask",
                            m->lq, m->lk);
        }
        unsigned char *row = out + (size_t)qb * (size_t)w.nkb;
        for (int i = 0; i < w.n_touched; i++) {
            int kb = w.touched[i];
            row[kb] = w.count[kb] == mask_walk_area(&w, kb) ? STOF_BLOCK_FULL : STOF_BLOCK_PARTIAL;
        }
        mask_walk_clear(&w);
    }
    walk_close(&w, &it);
    return STOF_OK;
}

stof_status stof_mask_picture(stof_ctx *ctx, const stof_mask *m, int block_q, int block_k,
                              stof_picture format, void **data, size_t *len)
{
    if (data)
        *data = NULL;
    if (len)
        *len = 0;
    if (!ctx)
        return STOF_ERR_INVALID_ARG;
    CTX_ARG(ctx, m, "m");
    CTX_ARG(ctx, data, "data");
    CTX_ARG(ctx, len, "len");
    if (format != STOF_PICTURE_SVG && format != STOF_PICTURE_PNG)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG, "format %d is not a stof_picture",
                        (int)format);
    if (block_q < 16 || block_q > 256 || block_k < 16 || block_k > 128)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "mask block sizes must be 16..256 rows by 16..128 keys, got %d x %d",
                        block_q, block_k);
    int nqb = (int)(((int64_t)m->lq + block_q - 1) / block_q);
    int nkb = (int)(((int64_t)m->lk + block_k - 1) / block_k);
    /* A picture is for looking at: past 4096 blocks a side, a larger block says more. */
    if (nqb > 4096 || nkb > 4096)
        return CTX_FAIL(ctx, STOF_ERR_INVALID_ARG,
                        "a picture of %d x %d blocks is too large (4096 a side at most): use "
                        "larger blocks",
                        nqb, nkb);
    unsigned char *map = malloc((size_t)nqb * (size_t)nkb);
    if (!map)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory for a %d x %d block map", nqb,
                        nkb);
    stof_status st = stof_mask_block_map(ctx, m, block_q, block_k, map);
    if (st != STOF_OK) {
        free(map);
        return st;
    }
    strbuf b = {0};
    if (format == STOF_PICTURE_SVG)
        mask_picture_svg(&b, m->spec, m->lq, m->lk, map, nqb, nkb, block_q, block_k);
    else
        mask_picture_png(&b, map, nqb, nkb);
    free(map);
    size_t n = b.len;
    char *p = strbuf_take(&b);
    if (!p)
        return CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory drawing a mask picture");
    *data = p;
    *len = n;
    return STOF_OK;
}

void stof_mask_picture_free(void *data) { free(data); }
