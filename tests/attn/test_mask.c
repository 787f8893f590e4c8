/*
 * test_mask — the mask module against definitions written out here
 * independently: every term and combination cell by cell, both storage
 * formats expanded back, statistics recounted from the dense matrix, the
 * canonical hash, and every kind of bad spec.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn/mask.h"
#include "stof.h"
#include "testutil.h"

/* For checks inside loops over cells: Check records every ck_assert it
 * passes, which would dominate the run time there. */
#define EXPECT(cond, ...)              \
    do {                               \
        if (!(cond))                   \
            ck_abort_msg(__VA_ARGS__); \
    } while (0)

static stof_ctx *open_ctx(void)
{
    stof_ctx *ctx = NULL;
    stof_options o = {.no_cache = 1};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    return ctx;
}

/* ---- the definitions, one cell at a time ------------------------------------ */

enum { T_DENSE, T_CAUSAL, T_WINDOW, T_CWINDOW, T_DILATED, T_GLOBAL, T_STRIDED, T_RANDOM, T_DOCS,
       T_KINDS };

typedef struct tterm {
    int kind, and_prev;
    long long a, b;
    unsigned long long seed;
    int ndocs, docs[8];
    unsigned char *rand_set;    /* random: [query block][key block] */
} tterm;

/* The generator as mask.h documents it, written again from the text. */
static uint64_t t_splitmix(uint64_t *s)
{
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void t_random_row(uint64_t seed, long long qb, int nkb, int r, unsigned char *set)
{
    uint64_t s = seed ^ ((uint64_t)(qb + 1) * 0x9E3779B97F4A7C15ull);
    memset(set, 0, (size_t)nkb);
    for (long long j = nkb - r; j < nkb; j++) {
        uint64_t m = (uint64_t)j + 1, rem = (0 - m) % m, z;
        do
            z = t_splitmix(&s);
        while (rem && z >= 0 - rem);
        uint64_t t = z % m;
        set[set[t] ? j : (long long)t] = 1;
    }
}

static void t_prepare(tterm *t, int lq, int lk)
{
    if (t->kind != T_RANDOM)
        return;
    int nqb = (int)((lq + t->b - 1) / t->b), nkb = (int)((lk + t->b - 1) / t->b);
    t->rand_set = malloc((size_t)nqb * nkb);
    for (int i = 0; i < nqb; i++)
        t_random_row(t->seed, i, nkb, (int)t->a, t->rand_set + (size_t)i * nkb);
}

static int t_doc(const tterm *t, int x)
{
    int d = 0, end = t->docs[0];
    while (x >= end)
        end += t->docs[++d];
    return d;
}

static int t_allows(const tterm *t, int q, int k, int lq, int lk)
{
    long long d = (long long)q - k;
    /* causal, window and causal_window: the query at its place among the
     * keys, the last of lk (bottom-right, as under a KV prefix) */
    const long long p = (long long)q + (lk - lq) - k;
    switch (t->kind) {
    case T_DENSE: return 1;
    case T_CAUSAL: return p >= 0;
    case T_WINDOW: return llabs(p) <= t->a / 2;
    case T_CWINDOW: return p >= 0 && p < t->a;
    case T_DILATED: return llabs(d) <= (t->a / 2) * t->b && ((d % t->b) + t->b) % t->b == 0;
    case T_GLOBAL: return q < t->a || k < t->a;
    case T_STRIDED: return k % t->a == t->a - 1;
    case T_RANDOM: {
        int nkb = (int)((lk + t->b - 1) / t->b);
        return t->rand_set[(size_t)(q / t->b) * nkb + k / t->b];
    }
    case T_DOCS: return t_doc(t, q) == t_doc(t, k);
    }
    return 0;
}

/* Sum of products, '&' binding tighter. */
static unsigned char *t_dense(tterm *t, int n, int lq, int lk)
{
    unsigned char *d = malloc((size_t)lq * lk);
    for (int i = 0; i < n; i++)
        t_prepare(&t[i], lq, lk);
    for (int q = 0; q < lq; q++)
        for (int k = 0; k < lk; k++) {
            int any = 0;
            for (int i = 0; i < n;) {
                int all = t_allows(&t[i], q, k, lq, lk);
                for (i++; i < n && t[i].and_prev; i++)
                    all &= t_allows(&t[i], q, k, lq, lk);
                any |= all;
            }
            d[(size_t)q * lk + k] = (unsigned char)any;
        }
    for (int i = 0; i < n; i++) {
        free(t[i].rand_set);
        t[i].rand_set = NULL;
    }
    return d;
}

/* A random valid term for these sizes, written into spec. */
static void t_random_term(test_rng *r, tterm *t, int lq, int lk, char *spec, size_t cap)
{
    memset(t, 0, sizeof *t);
    for (;;) {
        t->kind = test_rng_int(r, 0, T_KINDS - 1);
        if (t->kind != T_DOCS || lq == lk)
            break;
    }
    int lmax = lq > lk ? lq : lk;
    size_t n = strlen(spec);
    switch (t->kind) {
    case T_DENSE: snprintf(spec + n, cap - n, "dense"); break;
    case T_CAUSAL: snprintf(spec + n, cap - n, "causal"); break;
    case T_WINDOW:
        t->a = 2 * test_rng_int(r, 1, lmax / 2 + 2);
        snprintf(spec + n, cap - n, "window:%lld", t->a);
        break;
    case T_CWINDOW:
        t->a = test_rng_int(r, 1, lmax + 2);
        snprintf(spec + n, cap - n, "causal_window:%lld", t->a);
        break;
    case T_DILATED:
        t->a = 2 * test_rng_int(r, 1, lmax / 4 + 2);
        t->b = test_rng_int(r, 1, 5);
        snprintf(spec + n, cap - n, "dilated:%lld:%lld", t->a, t->b);
        break;
    case T_GLOBAL:
        t->a = test_rng_int(r, 1, lmax < 8 ? lmax : lmax / 4);
        snprintf(spec + n, cap - n, "global:%lld", t->a);
        break;
    case T_STRIDED:
        t->a = test_rng_int(r, 1, 12);
        snprintf(spec + n, cap - n, "strided:%lld", t->a);
        break;
    case T_RANDOM: {
        t->b = test_rng_int(r, 1, 40);
        int nkb = (int)((lk + t->b - 1) / t->b);
        t->a = test_rng_int(r, 1, nkb);
        t->seed = test_rng_next(r);
        snprintf(spec + n, cap - n, "random:%lld:%lld:%llu", t->a, t->b, t->seed);
        break;
    }
    case T_DOCS: {
        int left = lq;
        n += (size_t)snprintf(spec + n, cap - n, "docs:");
        while (left > 0) {
            int len = t->ndocs == 7 ? left : test_rng_int(r, 1, left);
            t->docs[t->ndocs++] = len;
            left -= len;
            n += (size_t)snprintf(spec + n, cap - n, "%s%d", t->ndocs > 1 ? "," : "", len);
        }
        break;
    }
    }
}

/* A random spec of 1..max_terms terms, and its terms. */
static int t_random_spec(test_rng *r, int lq, int lk, int max_terms, tterm *t, char *spec,
                         size_t cap)
{
    int n = test_rng_int(r, 1, max_terms);
    spec[0] = 0;
    for (int i = 0; i < n; i++) {
        int and_prev = i > 0 && test_rng_int(r, 0, 2) == 0;
        if (i > 0)
            strcat(spec, and_prev ? "&" : "+");
        t_random_term(r, &t[i], lq, lk, spec, cap);
        t[i].and_prev = and_prev;
    }
    return n;
}

static void assert_same_dense(const stof_mask *m, const unsigned char *want, int lq, int lk,
                              const char *what)
{
    unsigned char *got = NULL;
    ck_assert_int_eq(mask_to_dense(m, &got), STOF_OK);
    for (int q = 0; q < lq; q++)
        for (int k = 0; k < lk; k++)
            EXPECT(got[(size_t)q * lk + k] == want[(size_t)q * lk + k],
                   "%s (%d x %d): cell (%d, %d) is %d, the definition says %d", what, lq,
                   lk, q, k, got[(size_t)q * lk + k], want[(size_t)q * lk + k]);
    free(got);
}

static void random_dims(test_rng *r, int *lq, int *lk)
{
    *lq = test_rng_int(r, 1, 150);
    *lk = test_rng_int(r, 0, 2) ? *lq : test_rng_int(r, 1, 150);
}

START_TEST(each_term_matches_definition)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(101);
    int seen[T_KINDS] = {0};
    for (int it = 0; it < 400; it++) {
        int lq, lk;
        random_dims(&r, &lq, &lk);
        tterm t;
        char spec[512] = "";
        t_random_term(&r, &t, lq, lk, spec, sizeof spec);
        seen[t.kind]++;
        stof_mask *m = NULL;
        ck_assert_msg(stof_mask_parse(ctx, spec, lq, lk, &m) == STOF_OK, "%s: %s", spec,
                      stof_last_error(ctx));
        unsigned char *want = t_dense(&t, 1, lq, lk);
        assert_same_dense(m, want, lq, lk, spec);
        free(want);
        stof_mask_free(m);
    }
    for (int k = 0; k < T_KINDS; k++)
        ck_assert_msg(seen[k] > 5, "term kind %d drawn only %d times", k, seen[k]);
    stof_close(ctx);
}
END_TEST

START_TEST(combinations_match_definition)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(102);
    for (int it = 0; it < 300; it++) {
        int lq, lk;
        random_dims(&r, &lq, &lk);
        tterm t[5];
        char spec[1024];
        int n = t_random_spec(&r, lq, lk, 5, t, spec, sizeof spec);
        stof_mask *m = NULL;
        ck_assert_msg(stof_mask_parse(ctx, spec, lq, lk, &m) == STOF_OK, "%s: %s", spec,
                      stof_last_error(ctx));
        unsigned char *want = t_dense(t, n, lq, lk);
        assert_same_dense(m, want, lq, lk, spec);
        free(want);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

static long long count_entries(stof_ctx *ctx, const char *spec, int lq, int lk)
{
    stof_mask *m = NULL;
    ck_assert_msg(stof_mask_parse(ctx, spec, lq, lk, &m) == STOF_OK, "%s: %s", spec,
                  stof_last_error(ctx));
    stof_mask_info info;
    ck_assert_int_eq(stof_mask_stats(ctx, m, 16, 16, &info), STOF_OK);
    stof_mask_free(m);
    return info.entries;
}

/* A KV prefix: 3 queries that are the last 3 of 10 keys stand at
 * positions 7, 8 and 9, and causal, causal_window and window all count
 * from there, by hand. */
START_TEST(windows_align_bottom_right)
{
    stof_ctx *ctx = open_ctx();
    static const struct {
        const char *spec;
        const char *rows[3];
    } cases[] = {
        {"causal", {"1111111100", "1111111110", "1111111111"}},
        {"causal_window:4", {"0000111100", "0000011110", "0000001111"}},
        {"window:4", {"0000011111", "0000001111", "0000000111"}},
        {"causal&window:2", {"0000001100", "0000000110", "0000000011"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        stof_mask *m = NULL;
        unsigned char *d = NULL;
        ck_assert_int_eq(stof_mask_parse(ctx, cases[c].spec, 3, 10, &m), STOF_OK);
        ck_assert_int_eq(mask_to_dense(m, &d), STOF_OK);
        for (int q = 0; q < 3; q++)
            for (int k = 0; k < 10; k++)
                ck_assert_msg(d[q * 10 + k] == (cases[c].rows[q][k] == '1'),
                              "%s, 3 x 10: cell (%d, %d) is %d", cases[c].spec, q, k, d[q * 10 + k]);
        free(d);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

/* mask_diagonal against its definition on the dense matrix: (q, k) equals
 * (q - 1, k - 1) wherever both lie in the mask. */
START_TEST(diagonal_masks_found)
{
    stof_ctx *ctx = open_ctx();
    static const struct {
        const char *spec;
        int lq, lk, diagonal;
    } cases[] = {
        {"dense", 100, 100, 1},           {"causal", 100, 100, 1},
        {"causal", 60, 150, 1},           {"causal_window:16", 130, 130, 1},
        {"window:8", 77, 200, 1},         {"dilated:8:3", 150, 150, 1},
        {"causal+window:32", 90, 90, 1},  {"causal&window:6", 40, 100, 1},
        {"global:4", 100, 100, 0},        {"strided:8", 100, 100, 0},
        {"docs:30,70", 100, 100, 0},      {"random:2:16:7", 96, 96, 0},
        {"causal+global:2", 64, 64, 0},   {"window:8+strided:4", 64, 64, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        stof_mask *m = NULL;
        unsigned char *d = NULL;
        const int lq = cases[c].lq, lk = cases[c].lk;
        ck_assert_int_eq(stof_mask_parse(ctx, cases[c].spec, lq, lk, &m), STOF_OK);
        ck_assert_int_eq(mask_to_dense(m, &d), STOF_OK);
        int want = 1, got = -1;
        for (int q = 1; q < lq; q++)
            for (int k = 1; k < lk; k++)
                want &= d[q * lk + k] == d[(q - 1) * lk + k - 1];
        ck_assert_int_eq(want, cases[c].diagonal);
        ck_assert_int_eq(mask_diagonal(m, &got), STOF_OK);
        ck_assert_msg(got == want, "%s, %d x %d: mask_diagonal says %d", cases[c].spec, lq, lk,
                      got);
        /* The same entries from a matrix give the same answer. */
        stof_mask *dm = NULL;
        ck_assert_int_eq(stof_mask_from_dense(ctx, d, lq, lk, &dm), STOF_OK);
        ck_assert_int_eq(mask_diagonal(dm, &got), STOF_OK);
        ck_assert_int_eq(got, want);
        stof_mask_free(dm);
        free(d);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

START_TEST(precedence_and_known_counts)
{
    stof_ctx *ctx = open_ctx();
    /* '&' binds tighter: dense + (causal & window) is dense. */
    ck_assert_int_eq(count_entries(ctx, "dense+causal&window:2", 10, 10), 100);
    ck_assert_int_eq(count_entries(ctx, "causal&window:2+dense", 10, 10), 100);
    /* causal & window:2 is the diagonal and the one below it: 10 + 9. */
    ck_assert_int_eq(count_entries(ctx, "causal&window:2", 10, 10), 19);
    ck_assert_int_eq(count_entries(ctx, " causal & window:2 ", 10, 10), 19);
    ck_assert_int_eq(count_entries(ctx, "causal", 10, 10), 55);
    /* Bottom-right aligned: 4 queries over 6 keys allow 3, 4, 5, 6 keys. */
    ck_assert_int_eq(count_entries(ctx, "causal", 4, 6), 18);
    /* 6 queries over 4 keys: rows 0 and 1 see nothing. */
    ck_assert_int_eq(count_entries(ctx, "causal", 6, 4), 10);
    ck_assert_int_eq(count_entries(ctx, "global:2", 10, 10), 2 * 10 + 8 * 2);
    ck_assert_int_eq(count_entries(ctx, "strided:4", 3, 10), 3 * 2);
    ck_assert_int_eq(count_entries(ctx, "docs:3,7", 10, 10), 9 + 49);
    ck_assert_int_eq(count_entries(ctx, "causal&docs:3,7", 10, 10), 6 + 28);
    ck_assert_int_eq(count_entries(ctx, "causal_window:3", 10, 10), 1 + 2 + 8 * 3);
    ck_assert_int_eq(count_entries(ctx, "random:2:4:9", 16, 16), 4 * 4 * 2 * 4);
    /* Three key blocks of 4, 4 and 2 columns: all of them, so dense. */
    ck_assert_int_eq(count_entries(ctx, "random:3:4:9", 16, 10), 160);
    stof_close(ctx);
}
END_TEST

/* The draws are part of the mask's meaning: a change would silently change
 * every cached BigBird kernel's mask, so they are pinned. */
START_TEST(random_generator_pinned)
{
    int32_t chosen[8];
    unsigned char seen[64] = {0};
    mask_random_blocks(1, 0, 64, 3, chosen, seen);
    int32_t want0[3] = {9, 18, 49};
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(chosen[i], want0[i]);
    mask_random_blocks(12345678901234567ull, 7, 10, 5, chosen, seen);
    int32_t want1[5] = {1, 2, 3, 5, 7};
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(chosen[i], want1[i]);
    for (int i = 0; i < 64; i++)
        ck_assert_int_eq(seen[i], 0);
    /* All blocks drawn: exactly 0..n-1. */
    mask_random_blocks(99, 3, 8, 8, chosen, seen);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(chosen[i], i);
}
END_TEST

/* ---- storage formats ------------------------------------------------------------ */

/* A random mask: a spec most of the time, else a random matrix. */
static stof_mask *random_mask(stof_ctx *ctx, test_rng *r, int lq, int lk, char *spec, size_t cap)
{
    stof_mask *m = NULL;
    if (test_rng_int(r, 0, 3) == 0) {
        unsigned char *d = malloc((size_t)lq * lk);
        double p = test_rng_uniform(r);
        for (size_t i = 0; i < (size_t)lq * lk; i++)
            d[i] = test_rng_uniform(r) < p;
        ck_assert_int_eq(stof_mask_from_dense(ctx, d, lq, lk, &m), STOF_OK);
        snprintf(spec, cap, "dense-matrix p=%.2f", p);
        free(d);
        return m;
    }
    tterm t[4];
    t_random_spec(r, lq, lk, 4, t, spec, cap);
    ck_assert_msg(stof_mask_parse(ctx, spec, lq, lk, &m) == STOF_OK, "%s: %s", spec,
                  stof_last_error(ctx));
    return m;
}

static void check_blocks(const mask_blocks *b, const unsigned char *d, const char *spec)
{
    int lq = b->lq, lk = b->lk, bq = b->bq, bk = b->bk;
    ck_assert_int_eq(b->nqb, (lq + bq - 1) / bq);
    ck_assert_int_eq(b->nkb, (lk + bk - 1) / bk);
    ck_assert_int_eq(b->words_per_row, (bk + 31) / 32);
    ck_assert_int_eq(b->words_per_block, bq * b->words_per_row);
    ck_assert_int_eq(b->row_ptr[0], 0);
    ck_assert_int_eq(b->row_ptr[b->nqb], b->n_blocks);
    ck_assert_int_eq(b->n_full + b->n_partial, b->n_blocks);
    unsigned char *got = calloc((size_t)lq * lk, 1);
    long long full = 0, partial = 0;
    for (int i = 0; i < b->nqb; i++)
        for (int n = b->row_ptr[i]; n < b->row_ptr[i + 1]; n++) {
            int j = b->col[n];
            EXPECT(j >= 0 && j < b->nkb, "%s: key block %d", spec, j);
            if (n > b->row_ptr[i])
                EXPECT(b->col[n - 1] < j, "%s: key blocks not increasing", spec);
            int p = b->partial[n], any = 0, all = 1;
            full += p < 0;
            partial += p >= 0;
            EXPECT(p < b->n_bitmaps, "%s: bitmap index %d past %lld", spec, p, b->n_bitmaps);
            const uint32_t *bm = p >= 0 ? b->bits + (size_t)p * b->words_per_block : NULL;
            for (int r = 0; r < bq; r++)
                for (int c = 0; c < b->words_per_row * 32; c++) {
                    int q = i * bq + r, k = j * bk + c, in = q < lq && k < lk && c < bk;
                    int bit = bm ? (int)(bm[r * b->words_per_row + c / 32] >> (c % 32) & 1) : in;
                    EXPECT(in || !bit, "%s: bit set out of range", spec);
                    if (!in)
                        continue;
                    got[(size_t)q * lk + k] = (unsigned char)bit;
                    any |= d[(size_t)q * lk + k];
                    all &= d[(size_t)q * lk + k];
                }
            EXPECT(any, "%s: block (%d, %d) listed but empty", spec, i, j);
            EXPECT(all == (p < 0), "%s: block (%d, %d) full flag wrong", spec, i, j);
        }
    ck_assert_int_eq(full, b->n_full);
    ck_assert_int_eq(partial, b->n_partial);
    EXPECT(memcmp(got, d, (size_t)lq * lk) == 0, "%s: blocks do not expand back", spec);
    for (long long x = 0; x < b->n_bitmaps; x++)
        for (long long y = 0; y < x; y++)
            EXPECT(memcmp(b->bits + x * b->words_per_block, b->bits + y * b->words_per_block,
                          (size_t)b->words_per_block * 4),
                   "%s: bitmaps %lld and %lld are the same", spec, x, y);
    free(got);
}

static void check_rows(const mask_rows *rw, const unsigned char *d, const char *spec)
{
    int lq = rw->lq, lk = rw->lk;
    unsigned char *got = calloc((size_t)lq * lk, 1);
    long long entries = 0;
    ck_assert_int_eq(rw->row_ptr[0], 0);
    ck_assert_int_eq(rw->row_ptr[lq], rw->n_ranges);
    for (int q = 0; q < lq; q++)
        for (int64_t i = rw->row_ptr[q]; i < rw->row_ptr[q + 1]; i++) {
            EXPECT(rw->len[i] >= 1 && rw->start[i] >= 0 && rw->start[i] + rw->len[i] <= lk,
                   "%s: run out of range", spec);
            if (i > rw->row_ptr[q])
                EXPECT(rw->start[i - 1] + rw->len[i - 1] < rw->start[i],
                       "%s: runs of row %d overlap or touch", spec, q);
            memset(got + (size_t)q * lk + rw->start[i], 1, (size_t)rw->len[i]);
            entries += rw->len[i];
        }
    ck_assert_int_eq(entries, rw->entries);
    EXPECT(memcmp(got, d, (size_t)lq * lk) == 0, "%s: runs do not expand back", spec);
    free(got);
}

START_TEST(formats_expand_back)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(103);
    for (int it = 0; it < 150; it++) {
        int lq = test_rng_int(&r, 1, 300), lk = test_rng_int(&r, 0, 1) ? lq : test_rng_int(&r, 1, 300);
        char spec[1024];
        stof_mask *m = random_mask(ctx, &r, lq, lk, spec, sizeof spec);
        unsigned char *d = NULL;
        ck_assert_int_eq(mask_to_dense(m, &d), STOF_OK);
        int bq = test_rng_int(&r, 0, 1) ? 16 << test_rng_int(&r, 0, 4) : test_rng_int(&r, 16, 256);
        int bk = test_rng_int(&r, 0, 1) ? 16 << test_rng_int(&r, 0, 4) : test_rng_int(&r, 16, 256);
        mask_blocks b;
        ck_assert_int_eq(mask_build_blocks(ctx, m, bq, bk, &b), STOF_OK);
        check_blocks(&b, d, spec);
        mask_blocks_free(&b);
        mask_rows rw;
        ck_assert_int_eq(mask_build_rows(ctx, m, &rw), STOF_OK);
        check_rows(&rw, d, spec);
        mask_rows_free(&rw);
        free(d);
        stof_mask_free(m);
    }
    mask_blocks_free(NULL);
    mask_rows_free(NULL);
    stof_close(ctx);
}
END_TEST

START_TEST(block_sizes_checked)
{
    stof_ctx *ctx = open_ctx();
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 64, 64, &m), STOF_OK);
    mask_blocks b;
    stof_mask_info info;
    ck_assert_int_eq(mask_build_blocks(ctx, m, 15, 64, &b), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(mask_build_blocks(ctx, m, 64, 257, &b), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(mask_build_blocks(ctx, m, 257, 64, &b), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_stats(ctx, m, 8, 64, &info), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "16..256 rows by 16..256 keys"));
    ck_assert_int_eq(stof_mask_stats(ctx, NULL, 64, 64, &info), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_stats(ctx, m, 64, 64, NULL), STOF_ERR_INVALID_ARG);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* ---- statistics ------------------------------------------------------------------ */

/* A partial block's cells, bq x bk bytes (blocks reach 256 x 256), sorted
 * by content to count the distinct ones. */
static size_t block_bytes;

static int cmp_block(const void *a, const void *b) { return memcmp(a, b, block_bytes); }

static void check_stats(stof_ctx *ctx, const stof_mask *m, const unsigned char *d, int lq, int lk,
                        int bq, int bk, const char *spec)
{
    stof_mask_info s;
    ck_assert_int_eq(stof_mask_stats(ctx, m, bq, bk, &s), STOF_OK);
    long long entries = 0, runs = 0;
    int rmin = lk + 1, rmax = -1, runs_max = 0, empty = 0;
    for (int q = 0; q < lq; q++) {
        int e = 0, n = 0;
        for (int k = 0; k < lk; k++) {
            e += d[(size_t)q * lk + k];
            n += d[(size_t)q * lk + k] && (k == 0 || !d[(size_t)q * lk + k - 1]);
        }
        entries += e;
        runs += n;
        rmin = e < rmin ? e : rmin;
        rmax = e > rmax ? e : rmax;
        runs_max = n > runs_max ? n : runs_max;
        empty += e == 0;
    }
    int nqb = (lq + bq - 1) / bq, nkb = (lk + bk - 1) / bk;
    long long touched = 0, full = 0, partial = 0, area = 0, pentries = 0;
    int kmax = 0;
    double fill = 0;
    block_bytes = (size_t)bq * bk;
    unsigned char *pats = malloc(block_bytes * (size_t)nqb * nkb);
    ck_assert_ptr_nonnull(pats);
    for (int i = 0; i < nqb; i++) {
        int kb_here = 0;
        for (int j = 0; j < nkb; j++) {
            int cnt = 0, in = 0;
            unsigned char *cells = pats + (size_t)partial * block_bytes;
            memset(cells, 0, block_bytes);
            for (int q = i * bq; q < (i + 1) * bq && q < lq; q++)
                for (int k = j * bk; k < (j + 1) * bk && k < lk; k++) {
                    in++;
                    cnt += d[(size_t)q * lk + k];
                    cells[(size_t)(q - i * bq) * bk + (k - j * bk)] = d[(size_t)q * lk + k];
                }
            if (!cnt)
                continue;
            touched++;
            kb_here++;
            area += in;
            if (cnt == in) {
                full++;
                continue;
            }
            fill += (double)cnt / in;
            pentries += cnt;
            partial++;
        }
        kmax = kb_here > kmax ? kb_here : kmax;
    }
    qsort(pats, (size_t)partial, block_bytes, cmp_block);
    long long distinct = 0;
    for (long long x = 0; x < partial; x++)
        distinct += x == 0 || memcmp(pats + x * block_bytes, pats + (x - 1) * block_bytes,
                                     block_bytes) != 0;
    free(pats);
    ck_assert_int_eq(s.lq, lq);
    ck_assert_int_eq(s.lk, lk);
    ck_assert_int_eq(s.entries, entries);
    ck_assert_double_eq_tol(s.density, (double)entries / ((double)lq * lk), 1e-12);
    ck_assert_int_eq(s.row_min, rmin);
    ck_assert_int_eq(s.row_max, rmax);
    ck_assert_double_eq_tol(s.row_mean, (double)entries / lq, 1e-9);
    ck_assert_int_eq(s.empty_rows, empty);
    ck_assert_double_eq_tol(s.runs_mean, (double)runs / lq, 1e-9);
    ck_assert_int_eq(s.runs_max, runs_max);
    ck_assert_int_eq(s.block_q, bq);
    ck_assert_int_eq(s.block_k, bk);
    ck_assert_int_eq(s.n_qblocks, nqb);
    ck_assert_int_eq(s.n_kblocks, nkb);
    ck_assert_msg(s.blocks_touched == touched, "%s: touched %lld vs %lld", spec, s.blocks_touched,
                  touched);
    ck_assert_int_eq(s.blocks_full, full);
    ck_assert_int_eq(s.blocks_partial, partial);
    ck_assert_double_eq_tol(s.partial_fill_mean, partial ? fill / partial : 0, 1e-9);
    ck_assert_double_eq_tol(s.kblocks_mean, (double)touched / nqb, 1e-9);
    ck_assert_int_eq(s.kblocks_max, kmax);
    ck_assert_double_eq_tol(s.block_density, (double)touched / ((double)nqb * nkb), 1e-12);
    ck_assert_double_eq_tol(s.block_efficiency, area ? (double)entries / area : 0, 1e-12);
    ck_assert_int_eq(s.partial_entries, pentries);
    ck_assert_msg(s.distinct_bitmaps == distinct, "%s (%d x %d, blocks %d x %d): distinct bitmaps "
                  "%lld vs %lld", spec, lq, lk, bq, bk, s.distinct_bitmaps, distinct);
}

START_TEST(stats_match_dense_counts)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(104);
    for (int it = 0; it < 80; it++) {
        int lq = test_rng_int(&r, 1, 260), lk = test_rng_int(&r, 0, 1) ? lq : test_rng_int(&r, 1, 260);
        char spec[1024];
        stof_mask *m = random_mask(ctx, &r, lq, lk, spec, sizeof spec);
        unsigned char *d = NULL;
        ck_assert_int_eq(mask_to_dense(m, &d), STOF_OK);
        check_stats(ctx, m, d, lq, lk, test_rng_int(&r, 16, 128), test_rng_int(&r, 16, 256), spec);
        free(d);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

/* ---- the summary a plan reads -------------------------------------------------------- */

/* n 4-byte words equal; an empty list's pointer may be NULL. */
static int same_words(const void *a, const void *b, size_t n)
{
    return n == 0 || !memcmp(a, b, 4 * n);
}

static void same_blocks(const mask_blocks *a, const mask_blocks *b, const char *spec)
{
    EXPECT(a->nqb == b->nqb && a->n_blocks == b->n_blocks && a->n_full == b->n_full &&
               a->n_bitmaps == b->n_bitmaps && a->words_per_block == b->words_per_block,
           "%s: block counts differ", spec);
    EXPECT(same_words(a->row_ptr, b->row_ptr, (size_t)a->nqb + 1) &&
               same_words(a->col, b->col, (size_t)a->n_blocks) &&
               same_words(a->partial, b->partial, (size_t)a->n_blocks) &&
               same_words(a->bits, b->bits, (size_t)a->n_bitmaps * (size_t)a->words_per_block),
           "%s: block lists differ", spec);
}

/* One walk gives what the separate walks give: the hash, the 64 x 64
 * statistics, and runs from which every block size lists the same blocks
 * and bitmaps; a matrix-built mask is its own runs. */
START_TEST(summary_matches_the_walks)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(107);
    for (int it = 0; it < 60; it++) {
        int lq = test_rng_int(&r, 1, 300), lk = test_rng_int(&r, 0, 1) ? lq : test_rng_int(&r, 1, 300);
        char spec[1024];
        stof_mask *m = random_mask(ctx, &r, lq, lk, spec, sizeof spec);
        unsigned char *d = NULL;
        ck_assert_int_eq(mask_to_dense(m, &d), STOF_OK);
        stof_mask *fromd = NULL;
        ck_assert_int_eq(stof_mask_from_dense(ctx, d, lq, lk, &fromd), STOF_OK);
        for (int v = 0; v < 2; v++) {
            const stof_mask *x = v ? fromd : m;
            mask_summary ms;
            ck_assert_int_eq(mask_summarize(ctx, x, &ms), STOF_OK);
            EXPECT(ms.lq == lq && ms.lk == lk, "%s: sizes", spec);
            int matrix = v || !strncmp(spec, "dense-matrix", 12);
            EXPECT(matrix ? ms.runs == x && !ms.own : ms.own && ms.runs == ms.own, "%s: runs",
                   spec);
            char hex[65];
            ck_assert_int_eq(stof_mask_hash(x, hex), STOF_OK);
            EXPECT(!strcmp(hex, ms.hash), "%s: hash %s, summary %s", spec, hex, ms.hash);
            stof_mask_info want;
            ck_assert_int_eq(stof_mask_stats(ctx, x, 64, 64, &want), STOF_OK);
            EXPECT(ms.info.entries == want.entries && ms.info.row_min == want.row_min &&
                       ms.info.row_max == want.row_max && ms.info.runs_max == want.runs_max &&
                       ms.info.empty_rows == want.empty_rows &&
                       ms.info.blocks_touched == want.blocks_touched &&
                       ms.info.blocks_full == want.blocks_full &&
                       ms.info.partial_entries == want.partial_entries &&
                       ms.info.distinct_bitmaps == want.distinct_bitmaps &&
                       ms.info.kblocks_max == want.kblocks_max &&
                       ms.info.block_efficiency == want.block_efficiency &&
                       ms.info.partial_fill_mean == want.partial_fill_mean,
                   "%s: statistics differ", spec);
            unsigned char *got = NULL;
            ck_assert_int_eq(mask_to_dense(ms.runs, &got), STOF_OK);
            EXPECT(!memcmp(got, d, (size_t)lq * lk), "%s: runs differ from the mask", spec);
            free(got);
            int bq = test_rng_int(&r, 16, 256), bk = test_rng_int(&r, 16, 256);
            mask_blocks a, b;
            ck_assert_int_eq(mask_build_blocks(ctx, x, bq, bk, &a), STOF_OK);
            ck_assert_int_eq(mask_build_blocks(ctx, ms.runs, bq, bk, &b), STOF_OK);
            same_blocks(&a, &b, spec);
            mask_blocks_free(&a);
            mask_blocks_free(&b);
            mask_summary_free(&ms);
        }
        /* The period of gathered rows comes from the first dilated term. */
        mask_summary ms;
        ck_assert_int_eq(mask_summarize(ctx, m, &ms), STOF_OK);
        const char *dil = strstr(stof_mask_spec(m), "dilated:");
        int want = dil ? atoi(strchr(dil + 8, ':') + 1) : 1;
        EXPECT(ms.period == (want >= 1 && want <= 64 ? want : 1), "%s: period %d", spec, ms.period);
        mask_summary_free(&ms);
        stof_mask_free(fromd);
        free(d);
        stof_mask_free(m);
    }
    mask_summary_free(NULL);
    stof_close(ctx);
}
END_TEST

/* ---- hashing --------------------------------------------------------------------- */

static void hash_spec(stof_ctx *ctx, const char *spec, int lq, int lk, char hex[65])
{
    stof_mask *m = NULL;
    ck_assert_msg(stof_mask_parse(ctx, spec, lq, lk, &m) == STOF_OK, "%s: %s", spec,
                  stof_last_error(ctx));
    ck_assert_int_eq(stof_mask_hash(m, hex), STOF_OK);
    ck_assert_int_eq((int)strlen(hex), 64);
    stof_mask_free(m);
}

START_TEST(hash_equal_for_equal_masks)
{
    stof_ctx *ctx = open_ctx();
    static const char *same[][2] = {
        {"window:4+window:2", "window:4"},
        {"causal&dense", "causal"},
        {"dense", "causal+global:1&dense+window:200"},
        {"causal_window:1", "window:2&causal&causal_window:1"},
        {"dilated:8:1", "window:8"},
        {"strided:1", "dense"},
        {"docs:60", "dense"},
        {"global:60", "dense"},
        {"random:4:16:7", "dense"},
        {"window:6&causal", "causal_window:4"},
        {"docs:10,50&causal", "causal&docs:10,50"},
        {"window:0004+global:01", "window:4 + global:1"},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        char a[65], b[65];
        hash_spec(ctx, same[i][0], 60, 60, a);
        hash_spec(ctx, same[i][1], 60, 60, b);
        ck_assert_msg(strcmp(a, b) == 0, "%s and %s hash apart", same[i][0], same[i][1]);
    }
    char a[65], b[65];
    hash_spec(ctx, "causal", 60, 60, a);
    hash_spec(ctx, "causal", 60, 61, b);
    ck_assert_str_ne(a, b);
    hash_spec(ctx, "window:4", 60, 60, b);
    ck_assert_str_ne(a, b);
    /* A spec and its own matrix. */
    test_rng r = test_rng_make(105);
    for (int it = 0; it < 100; it++) {
        int lq, lk;
        random_dims(&r, &lq, &lk);
        tterm t[4];
        char spec[1024];
        t_random_spec(&r, lq, lk, 4, t, spec, sizeof spec);
        stof_mask *m = NULL, *md = NULL;
        unsigned char *d = NULL;
        ck_assert_int_eq(stof_mask_parse(ctx, spec, lq, lk, &m), STOF_OK);
        ck_assert_int_eq(mask_to_dense(m, &d), STOF_OK);
        ck_assert_int_eq(stof_mask_from_dense(ctx, d, lq, lk, &md), STOF_OK);
        ck_assert_str_eq(stof_mask_spec(md), "dense-matrix");
        ck_assert_int_eq(stof_mask_hash(m, a), STOF_OK);
        ck_assert_int_eq(stof_mask_hash(md, b), STOF_OK);
        ck_assert_msg(strcmp(a, b) == 0, "%s and its matrix hash apart", spec);
        free(d);
        stof_mask_free(m);
        stof_mask_free(md);
    }
    stof_close(ctx);
}
END_TEST

typedef struct hmask {
    unsigned char key[2 + 64];   /* lq, lk, cells */
    char hex[65];
} hmask;

static int cmp_key(const void *a, const void *b)
{
    return memcmp(((const hmask *)a)->key, ((const hmask *)b)->key, sizeof((hmask *)0)->key);
}

static int cmp_hex(const void *a, const void *b)
{
    return strcmp(((const hmask *)a)->hex, ((const hmask *)b)->hex);
}

START_TEST(hash_differs_for_different_masks)
{
    stof_ctx *ctx = open_ctx();
    test_rng r = test_rng_make(106);
    enum { N = 12000 };
    hmask *h = calloc(N, sizeof *h);
    for (int i = 0; i < N; i++) {
        int lq = test_rng_int(&r, 3, 8), lk = test_rng_int(&r, 3, 8);
        unsigned char d[64];
        stof_mask *m = NULL;
        if (i % 8 == 0) {
            tterm t[3];
            char spec[512];
            t_random_spec(&r, lq, lk, 3, t, spec, sizeof spec);
            EXPECT(stof_mask_parse(ctx, spec, lq, lk, &m) == STOF_OK, "%s", spec);
            unsigned char *dd = NULL;
            EXPECT(mask_to_dense(m, &dd) == STOF_OK, "mask_to_dense");
            memcpy(d, dd, (size_t)lq * lk);
            free(dd);
        } else {
            double p = 0.15 + 0.7 * test_rng_uniform(&r);
            for (int c = 0; c < lq * lk; c++)
                d[c] = test_rng_uniform(&r) < p;
            EXPECT(stof_mask_from_dense(ctx, d, lq, lk, &m) == STOF_OK, "from_dense");
        }
        h[i].key[0] = (unsigned char)lq;
        h[i].key[1] = (unsigned char)lk;
        memcpy(h[i].key + 2, d, (size_t)lq * lk);
        EXPECT(stof_mask_hash(m, h[i].hex) == STOF_OK, "hash");
        stof_mask_free(m);
    }
    qsort(h, N, sizeof *h, cmp_key);
    int n = 0;
    for (int i = 0; i < N; i++)
        if (i == 0 || cmp_key(&h[i], &h[n - 1]) != 0)
            h[n++] = h[i];
        else
            EXPECT(!strcmp(h[i].hex, h[n - 1].hex), "equal masks hash apart");
    ck_assert_msg(n >= 10000, "only %d distinct masks drawn", n);
    qsort(h, (size_t)n, sizeof *h, cmp_hex);
    for (int i = 1; i < n; i++)
        EXPECT(strcmp(h[i].hex, h[i - 1].hex) != 0, "two different masks share hash %s", h[i].hex);
    free(h);
    stof_close(ctx);
}
END_TEST

/* ---- the API around the mask --------------------------------------------------------- */

START_TEST(spec_and_dims)
{
    stof_ctx *ctx = open_ctx();
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_mask_parse(ctx, " window:0256 +global:64& causal+docs:10,0502 ", 512,
                                     512, &m),
                     STOF_OK);
    ck_assert_str_eq(stof_mask_spec(m), "window:256+global:64&causal+docs:10,502");
    int lq = 0, lk = 0;
    stof_mask_dims(m, &lq, &lk);
    ck_assert_int_eq(lq, 512);
    ck_assert_int_eq(lk, 512);
    stof_mask_free(m);
    ck_assert_int_eq(stof_mask_parse(ctx, "random:3:64:18446744073709551615", 300, 200, &m),
                     STOF_OK);
    ck_assert_str_eq(stof_mask_spec(m), "random:3:64:18446744073709551615");
    stof_mask_dims(m, &lq, NULL);
    ck_assert_int_eq(lq, 300);
    stof_mask_free(m);
    stof_mask_free(NULL);
    stof_mask_dims(NULL, &lq, &lk);
    ck_assert_int_eq(lq, 0);
    stof_close(ctx);
}
END_TEST

typedef struct bad_case {
    const char *spec;
    int lq, lk;
    const char *part;   /* quoted in the message, with its column */
    int column;
} bad_case;

static const bad_case bad_cases[] = {
    {"windo:4", 64, 64, "windo", 1},
    {"Causal", 64, 64, "Causal", 1},
    {"window:25x+global:64", 64, 64, "25x", 8},
    {"window:-4", 64, 64, "-4", 8},
    {"window", 64, 64, "window", 1},
    {"window:", 64, 64, "window:", 1},
    {"window:+causal", 64, 64, "window:", 1},
    {"window:3", 64, 64, "3", 8},
    {"window:0", 64, 64, "0", 8},
    {"window:4:5", 64, 64, ":5", 9},
    {"window:4,5", 64, 64, ",5", 9},
    {"window:4 causal", 64, 64, "causal", 10},
    {"window:99999999999", 64, 64, "99999999999", 8},
    {"window:2147483648", 64, 64, "2147483648", 8},
    {"causal_window:0", 64, 64, "0", 15},
    {"dilated:4", 64, 64, "dilated:4", 1},
    {"dilated:4:0", 64, 64, "0", 11},
    {"dilated:5:2", 64, 64, "5", 9},
    {"strided:0", 64, 64, "0", 9},
    {"strided:", 64, 64, "strided:", 1},
    {"global:0", 64, 64, "0", 8},
    {"global:65", 64, 64, "65", 8},
    {"global:65", 64, 32, "65", 8},
    {"docs:10,20", 64, 64, "10,20", 6},
    {"docs:10,60", 64, 64, "10,60", 6},
    {"docs:32,32", 64, 32, "docs", 1},
    {"docs:0,64", 64, 64, "0", 6},
    {"docs:32,,32", 64, 64, "docs:32,", 1},
    {"docs", 64, 64, "docs", 1},
    {"random:5:16:1", 64, 64, "5", 8},
    {"random:0:16:1", 64, 64, "0", 8},
    {"random:1:0:1", 64, 64, "0", 10},
    {"random:1:16", 64, 64, "random:1:16", 1},
    {"random:1:16:18446744073709551616", 64, 64, "18446744073709551616", 13},
    {"", 64, 64, "\"\" at column 1", 0},
    {"   ", 64, 64, "\"\" at column 4", 0},
    {"window:4+", 64, 64, "\"\" at column 10", 0},
    {"window:4++causal", 64, 64, "+", 10},
    {"+causal", 64, 64, "+", 1},
    {"causal&", 64, 64, "\"\" at column 8", 0},
    {"dense:4", 64, 64, ":4", 6},
    {":4", 64, 64, ":4", 1},
    {"causal+\x01", 64, 64, "\\x01", 8},
};

START_TEST(bad_specs_rejected)
{
    stof_ctx *ctx = open_ctx();
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        stof_mask *m = (stof_mask *)&m;
        ck_assert_msg(stof_mask_parse(ctx, c->spec, c->lq, c->lk, &m) == STOF_ERR_INVALID_ARG,
                      "spec \"%s\" was accepted", c->spec);
        ck_assert_ptr_null(m);
        const char *err = stof_last_error(ctx);
        char want[256];
        if (c->column)
            snprintf(want, sizeof want, "\"%s\" at column %d", c->part, c->column);
        else
            snprintf(want, sizeof want, "%s", c->part);
        ck_assert_msg(strstr(err, want), "spec \"%s\": message \"%s\" lacks '%s'", c->spec, err,
                      want);
        ck_assert_msg(strstr(err, "mask spec \""), "spec \"%s\": message \"%s\"", c->spec, err);
    }
    stof_close(ctx);
}
END_TEST

START_TEST(bad_arguments_rejected)
{
    stof_ctx *ctx = open_ctx();
    stof_mask *m = (stof_mask *)&m;
    unsigned char d[4] = {1, 0, 1, 1};
    ck_assert_int_eq(stof_mask_parse(ctx, NULL, 4, 4, &m), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "spec"));
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 4, 4, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_parse(NULL, "causal", 4, 4, &m), STOF_ERR_INVALID_ARG);
    m = (stof_mask *)&m;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 0, 4, &m), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "lq = 0"));
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 4, -1, &m), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "lk = -1"));
    m = (stof_mask *)&m;
    ck_assert_int_eq(stof_mask_from_dense(ctx, NULL, 2, 2, &m), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "allowed"));
    ck_assert_int_eq(stof_mask_from_dense(ctx, d, 2, 0, &m), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_from_dense(ctx, d, 2, 2, NULL), STOF_ERR_INVALID_ARG);
    char hex[65];
    ck_assert_int_eq(stof_mask_hash(NULL, hex), STOF_ERR_INVALID_ARG);
    ck_assert_str_eq(stof_mask_spec(NULL), "");
    stof_close(ctx);
}
END_TEST

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* A side past STOF_MAX_SEQ is refused before anything else is done (a
 * window:256 mask of 10^9 rows once took minutes to be refused by
 * attention, its rows walked first), and the message names the side. The
 * dense matrix given is four bytes: refused without being read. */
START_TEST(too_long_refused_at_once)
{
    stof_ctx *ctx = open_ctx();
    stof_mask *m = (stof_mask *)&m;
    unsigned char d[4] = {1, 1, 1, 1};
    static const struct { int lq, lk; const char *says; } bad[] = {
        {1000000000, 1000000000, "lq = 1000000000"},
        {STOF_MAX_SEQ + 1, 64, "lq = 4194241"},
        {64, STOF_MAX_SEQ + 1, "lk = 4194241"},
        {2147483647, 1, "lq = 2147483647"},
    };
    double t0 = now_s();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(stof_mask_parse(ctx, "window:256", bad[i].lq, bad[i].lk, &m),
                         STOF_ERR_INVALID_ARG);
        ck_assert_ptr_null(m);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].says) &&
                          strstr(stof_last_error(ctx), "STOF_MAX_SEQ = 4194240"),
                      "%s", stof_last_error(ctx));
        m = (stof_mask *)&m;
        ck_assert_int_eq(stof_mask_from_dense(ctx, d, bad[i].lq, bad[i].lk, &m),
                         STOF_ERR_INVALID_ARG);
        ck_assert_ptr_null(m);
        ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), bad[i].says));
    }
    ck_assert_msg(now_s() - t0 < 1, "refusing took %.2f s", now_s() - t0);
    /* The limit itself is a mask. */
    ck_assert_int_eq(STOF_MAX_SEQ, 65535 * 64);
    ck_assert_int_eq(stof_mask_parse(ctx, "window:256", STOF_MAX_SEQ, STOF_MAX_SEQ, &m), STOF_OK);
    int lq = 0, lk = 0;
    stof_mask_dims(m, &lq, &lk);
    ck_assert_int_eq(lq, STOF_MAX_SEQ);
    ck_assert_int_eq(lk, STOF_MAX_SEQ);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* The workloads' masks at a realistic length, checked against counts that
 * follow from their definitions. */
START_TEST(workload_masks_at_4096)
{
    stof_ctx *ctx = open_ctx();
    const int L = 4096;
    stof_mask *m = NULL;
    mask_blocks b;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:256+global:64", L, L, &m), STOF_OK);
    ck_assert_int_eq(mask_build_blocks(ctx, m, 64, 64, &b), STOF_OK);
    /* Query block 0 is all global; every other block row reaches block
     * offsets -2..2 plus key block 0. */
    ck_assert_int_eq(b.row_ptr[1] - b.row_ptr[0], L / 64);
    ck_assert_int_eq(b.row_ptr[10] - b.row_ptr[9], 6);
    ck_assert_int_eq(b.n_bitmaps, 2);
    mask_blocks_free(&b);
    stof_mask_free(m);
    ck_assert_int_eq(stof_mask_parse(ctx, "causal&docs:1024,1024,2048", L, L, &m), STOF_OK);
    ck_assert_int_eq(mask_build_blocks(ctx, m, 128, 128, &b), STOF_OK);
    ck_assert_int_eq(b.n_partial, L / 128);
    ck_assert_int_eq(b.n_full, 2 * (8 * 7 / 2) + 16 * 15 / 2);
    ck_assert_int_eq(b.n_bitmaps, 1);
    mask_blocks_free(&b);
    stof_mask_free(m);
    ck_assert_int_eq(stof_mask_parse(ctx, "window:192+global:64+random:3:64:1", L, L, &m),
                     STOF_OK);
    mask_rows rw;
    ck_assert_int_eq(mask_build_rows(ctx, m, &rw), STOF_OK);
    ck_assert_int_eq(rw.lq, L);
    ck_assert(rw.entries > (long long)L * 193);
    mask_rows_free(&rw);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

Suite *suite_mask(void)
{
    Suite *s = suite_create("mask");
    TCase *t = tcase_create("mask");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, each_term_matches_definition);
    tcase_add_test(t, windows_align_bottom_right);
    tcase_add_test(t, diagonal_masks_found);
    tcase_add_test(t, combinations_match_definition);
    tcase_add_test(t, precedence_and_known_counts);
    tcase_add_test(t, random_generator_pinned);
    tcase_add_test(t, formats_expand_back);
    tcase_add_test(t, block_sizes_checked);
    tcase_add_test(t, stats_match_dense_counts);
    tcase_add_test(t, summary_matches_the_walks);
    tcase_add_test(t, hash_equal_for_equal_masks);
    tcase_add_test(t, hash_differs_for_different_masks);
    tcase_add_test(t, spec_and_dims);
    tcase_add_test(t, bad_specs_rejected);
    tcase_add_test(t, bad_arguments_rejected);
    tcase_add_test(t, too_long_refused_at_once);
    tcase_add_test(t, workload_masks_at_4096);
    suite_add_tcase(s, t);
    return s;
}
