#include "cache/cache_btree.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static uint32_t be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int cache_btree_varint(const unsigned char *p, size_t avail, uint64_t *v)
{
    uint64_t x = 0;
    for (int i = 0; i < 9; i++) {
        if ((size_t)i >= avail)
            return 0;
        if (i == 8) {
            *v = x << 8 | p[i];
            return 9;
        }
        x = x << 7 | (p[i] & 0x7f);
        if (!(p[i] & 0x80)) {
            *v = x;
            return i + 1;
        }
    }
    return 0;
}

static uint64_t serial_size(uint64_t t)
{
    static const unsigned char sizes[12] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0, 0, 0};
    return t >= 12 ? (t - 12) / 2 : sizes[t];
}

uint64_t cache_btree_serial_size(uint64_t t) { return serial_size(t); }

long long cache_btree_root(const unsigned char *page1, uint32_t usable, const char *name)
{
    if (!page1 || usable < 512 || page1[100] != 13)
        return 0;   /* a schema too big for page 1: not a stof cache's */
    const unsigned char *h = page1 + 100;
    uint32_t cells = be16(h + 3);
    size_t start = 100 + 8, want = strlen(name);
    if (start + 2 * (size_t)cells > usable)
        return 0;
    for (uint32_t i = 0; i < cells; i++) {
        size_t at = be16(h + 8 + 2 * i);
        uint64_t payload, rowid, hdr, t[4];
        int k;
        if (at >= usable || !(k = cache_btree_varint(page1 + at, usable - at, &payload)))
            continue;
        at += (size_t)k;
        if (!(k = cache_btree_varint(page1 + at, usable - at, &rowid)))
            continue;
        at += (size_t)k;
        const unsigned char *rec = page1 + at;
        size_t avail = usable - at, hat;
        if (!(k = cache_btree_varint(rec, avail, &hdr)) || hdr > avail)
            continue;
        hat = (size_t)k;
        int ok = 1;
        for (int c = 0; c < 4 && ok; c++) {
            ok = hat < hdr && (k = cache_btree_varint(rec + hat, (size_t)hdr - hat, &t[c])) &&
                 t[c] != 10 && t[c] != 11;
            hat += (size_t)k;
        }
        /* type, name, tbl_name, rootpage: a name of text, a root of 1-4 bytes. */
        if (!ok || t[1] < 13 || t[1] % 2 == 0 || serial_size(t[1]) != want || t[3] < 1 || t[3] > 4)
            continue;
        uint64_t name_at = hdr + serial_size(t[0]);
        uint64_t root_at = name_at + serial_size(t[1]) + serial_size(t[2]);
        if (root_at + serial_size(t[3]) > avail || memcmp(rec + name_at, name, want) != 0)
            continue;
        long long root = 0;
        for (uint64_t j = 0; j < serial_size(t[3]); j++)
            root = root << 8 | rec[root_at + j];
        return root > 0 ? root : 0;
    }
    return 0;
}

/* Rowids lo+1 .. hi lie on a missing page; hi is INT64_MAX for the last
 * child of a table, whose rowids have no bound above. */
typedef struct cache_btree_gap {
    int64_t lo, hi;
} cache_btree_gap;

typedef struct walk {
    cache_btree_page_fn page;
    void *arg;
    uint32_t usable;
    long long budget;
    cache_btree_gap *gaps;
    int n, cap, oom;
} walk;

static void add_gap(walk *w, int64_t lo, int64_t hi)
{
    if (hi <= lo)
        return;
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 32;
        cache_btree_gap *g = realloc(w->gaps, (size_t)cap * sizeof *g);
        if (!g) {
            w->oom = 1;
            return;
        }
        w->gaps = g;
        w->cap = cap;
    }
    w->gaps[w->n++] = (cache_btree_gap){lo, hi};
}

/* The subtree at pgno holds rowids lo+1 .. hi. */
static void descend(walk *w, long long pgno, int64_t lo, int64_t hi, int depth)
{
    const unsigned char *p = w->page(w->arg, pgno);
    if (!p) {
        add_gap(w, lo, hi);
        return;
    }
    size_t h = pgno == 1 ? 100 : 0;
    if (p[h] != 5 || depth > 20 || w->budget-- <= 0 || w->oom)
        return;   /* a leaf (its rows were read), or not a table's interior page */
    uint32_t cells = be16(p + h + 3);
    size_t start = h + 12;
    if (start + 2 * (size_t)cells > w->usable)
        return;
    int64_t prev = lo;
    for (uint32_t i = 0; i < cells && !w->oom; i++) {
        size_t at = be16(p + start + 2 * i);
        uint64_t key;
        if (at + 4 >= w->usable || !cache_btree_varint(p + at + 4, w->usable - at - 4, &key))
            return;
        int64_t k = (int64_t)key;
        if (k <= prev || k > hi)
            return;   /* out of order: not a b-tree page to believe */
        descend(w, be32(p + at), prev, k, depth + 1);
        prev = k;
    }
    descend(w, be32(p + h + 8), prev, hi, depth + 1);
}

static int gaps_of(cache_btree_page_fn page, void *arg, uint32_t usable, long long root,
                   long long max_pages, cache_btree_gap **gaps)
{
    walk w = {.page = page, .arg = arg, .usable = usable, .budget = max_pages};
    *gaps = NULL;
    if (root > 0)
        descend(&w, root, 0, INT64_MAX, 0);
    if (w.oom) {
        free(w.gaps);
        return -1;
    }
    *gaps = w.gaps;
    return w.n;
}

static int cmp_gap(const void *a, const void *b)
{
    const cache_btree_gap *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* The rowids in the gaps g (sorted here), each once, up to max_rowid,
 * less the n_known in known (sorted, no repeats). */
static long long count(cache_btree_gap *g, int n, int64_t max_rowid, const int64_t *known,
                       size_t n_known)
{
    qsort(g, (size_t)n, sizeof *g, cmp_gap);
    long long total = 0;
    int64_t done = INT64_MIN;   /* rowids up to here are counted */
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        int64_t lo = g[i].lo > done ? g[i].lo : done;
        int64_t hi = g[i].hi == INT64_MAX && max_rowid < g[i].hi ? max_rowid : g[i].hi;
        if (hi <= lo)
            continue;
        long long span = (long long)((uint64_t)hi - (uint64_t)lo);
        while (k < n_known && known[k] <= lo)
            k++;
        for (; k < n_known && known[k] <= hi; k++)
            span--;
        total = span > LLONG_MAX - total ? LLONG_MAX : total + span;
        done = hi;
    }
    return total;
}

long long cache_btree_missing(cache_btree_page_fn page, void *arg, uint32_t usable,
                              const char *name, long long max_pages, int64_t *rowids, size_t n,
                              int64_t max_rowid, int *pages)
{
    *pages = 0;
    const unsigned char *p1 = page(arg, 1);
    long long root = p1 ? cache_btree_root(p1, usable, name) : 0;
    cache_btree_gap *g = NULL;
    int n_gaps = root ? gaps_of(page, arg, usable, root, max_pages, &g) : 0;
    if (n_gaps <= 0)
        return n_gaps;
    size_t u = 0;
    if (n)   /* no rows read: rowids may be NULL */
        qsort(rowids, n, sizeof *rowids, util_cmp_i64);
    for (size_t i = 0; i < n; i++)
        if (!u || rowids[u - 1] != rowids[i])
            rowids[u++] = rowids[i];
    long long lost = count(g, n_gaps, max_rowid, rowids, u);
    free(g);
    *pages = n_gaps;
    return lost;
}
