#include "cache/cache_salvage.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/util.h"
#include "cache/cache_btree.h"

/*
 * The SQLite file format, as far as a salvage needs it (sqlite.org/fileformat2.html):
 * a 100-byte header on page 1 (page size at 16, reserved bytes per page at
 * 20, change counter at 24, page count at 28, freelist at 32, text encoding
 * at 56, user_version at 60, version-valid-for at 92); b-tree pages of
 * type 2 (index interior), 5 (table interior), 10 (index leaf) and 13
 * (table leaf) with a cell pointer array; a cell's payload spills past a
 * size that depends on the page kind into a chain of overflow pages, each
 * a 4-byte next-page number and its share of the payload; a payload is a
 * record: a header of serial types, then the values. The WAL is a 32-byte
 * header and frames of a 24-byte header and one page, checksummed in a
 * running pair of sums; a frame with a nonzero database size ends a commit.
 */

typedef struct wal_page {
    uint32_t pgno, order;
    const unsigned char *data;
} wal_page;

/* A name kept, named by an index, or lost: a kernel's key or a tuning
 * row's key columns joined by \x1f. */
typedef struct name_list {
    char **v;
    int n;
    long long cap;
} name_list;

typedef struct lost_entry {
    char *id;
    cache_lost l;
    int kernel;          /* 1 kernel, 0 tuning row */
    int cut;             /* 1 cut, 0 damaged */
} lost_entry;

typedef struct scan {
    const char *nvrtc;                /* the current compiler: rows of another are stale */
    const unsigned char *db;
    size_t n;
    uint32_t page_size, usable;
    long long expected, file_pages;
    wal_page *wal;
    size_t n_wal;
    uint32_t *free;
    size_t n_free;
    const cache_salvage_sink *sink;
    cache_salvage *out;
    int oom, stopped;
    name_list kept, kept_stale, named, tuning_kept, tuning_named;
    lost_entry *lost;
    int n_lost;
    long long cap_lost;
    int64_t *rowids;                  /* of kernel rows read, and of keys the key index names */
    int n_rowids;
    long long cap_rowids;
    int64_t max_rowid;                /* the highest any index or row gives */
} scan;

static uint32_t be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void names_add(scan *s, name_list *l, const char *name, size_t len)
{
    char *d = malloc(len + 1);
    if (!d || util_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) {
        free(d);
        s->oom = 1;
        return;
    }
    memcpy(d, name, len);
    d[len] = 0;
    l->v[l->n++] = d;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorts and drops repeats. */
static void names_unique(name_list *l)
{
    if (l->n == 0)
        return;
    qsort(l->v, (size_t)l->n, sizeof *l->v, cmp_str);
    int w = 1;
    for (int i = 1; i < l->n; i++) {
        if (strcmp(l->v[i], l->v[w - 1]) == 0)
            free(l->v[i]);
        else
            l->v[w++] = l->v[i];
    }
    l->n = w;
}

static int names_has(const name_list *l, const char *name)
{
    return l->n && bsearch(&name, l->v, (size_t)l->n, sizeof *l->v, cmp_str) != NULL;
}

static void names_free(name_list *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static void add_lost(scan *s, const char *id, int kernel, int cut, const char *key, const char *fmt,
                     ...) __attribute__((format(printf, 6, 7)));

static void add_lost(scan *s, const char *id, int kernel, int cut, const char *key, const char *fmt,
                     ...)
{
    char *d = strdup(id);
    if (!d || util_grow((void **)&s->lost, &s->cap_lost, s->n_lost + 1, sizeof *s->lost)) {
        free(d);
        s->oom = 1;
        return;
    }
    lost_entry *e = &s->lost[s->n_lost++];
    memset(e, 0, sizeof *e);
    e->id = d;
    e->kernel = kernel;
    e->cut = cut;
    snprintf(e->l.key, sizeof e->l.key, "%s", key ? key : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->l.what, sizeof e->l.what, fmt, ap);
    va_end(ap);
}

/* ---- pages ---- */

static int cmp_wal(const void *a, const void *b)
{
    const wal_page *x = a, *y = b;
    if (x->pgno != y->pgno)
        return x->pgno < y->pgno ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

static const unsigned char *wal_lookup(const scan *s, long long pgno)
{
    size_t lo = 0, hi = s->n_wal;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->wal[mid].pgno < pgno)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->n_wal && s->wal[lo].pgno == pgno ? s->wal[lo].data : NULL;
}

/* Page pgno (1-based), or NULL where neither the WAL nor the file has it whole. */
static const unsigned char *page(const scan *s, long long pgno)
{
    if (pgno < 1 || pgno > s->expected)
        return NULL;
    const unsigned char *w = s->n_wal ? wal_lookup(s, pgno) : NULL;
    if (w)
        return w;
    return pgno <= s->file_pages ? s->db + (size_t)(pgno - 1) * s->page_size : NULL;
}

static int is_free(const scan *s, uint32_t pgno)
{
    return s->n_free && bsearch(&pgno, s->free, s->n_free, sizeof *s->free, util_cmp_u32) != NULL;
}

/* The running checksum of the WAL over n bytes (n a multiple of 8). */
static void wal_sum(const unsigned char *p, size_t n, int big, uint32_t *s0, uint32_t *s1)
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint32_t x0, x1;
        if (big) {
            x0 = be32(p + i);
            x1 = be32(p + i + 4);
        } else {
            x0 = (uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16 |
                 (uint32_t)p[i + 3] << 24;
            x1 = (uint32_t)p[i + 4] | (uint32_t)p[i + 5] << 8 | (uint32_t)p[i + 6] << 16 |
                 (uint32_t)p[i + 7] << 24;
        }
        *s0 += x0 + *s1;
        *s1 += x1 + *s0;
    }
}

/* The committed frames of a WAL for this page size, latest per page;
 * returns the database size the last commit gives (0: none). */
static uint32_t read_wal(scan *s, const unsigned char *w, size_t n)
{
    if (!w || n < 32)
        return 0;
    uint32_t magic = be32(w);
    if ((magic != 0x377f0682 && magic != 0x377f0683) || be32(w + 8) != s->page_size)
        return 0;
    int big = magic & 1;
    uint32_t s0 = 0, s1 = 0;
    wal_sum(w, 24, big, &s0, &s1);
    if (s0 != be32(w + 24) || s1 != be32(w + 28))
        return 0;
    size_t frame = 24 + (size_t)s->page_size, frames = (n - 32) / frame;
    wal_page *v = frames ? calloc(frames, sizeof *v) : NULL;
    if (frames && !v) {
        s->oom = 1;
        return 0;
    }
    size_t committed = 0, k = 0;
    uint32_t db_size = 0;
    for (size_t i = 0; i < frames; i++) {
        const unsigned char *f = w + 32 + i * frame;
        if (be32(f + 8) != be32(w + 16) || be32(f + 12) != be32(w + 20))
            break;
        wal_sum(f, 8, big, &s0, &s1);
        wal_sum(f + 24, s->page_size, big, &s0, &s1);
        if (s0 != be32(f + 16) || s1 != be32(f + 20) || be32(f) == 0)
            break;
        v[k++] = (wal_page){be32(f), (uint32_t)i, f + 24};
        if (be32(f + 4)) {
            committed = k;
            db_size = be32(f + 4);
        }
    }
    s->out->wal_frames = (long long)committed;
    if (committed)
        qsort(v, committed, sizeof *v, cmp_wal);
    size_t u = 0;
    for (size_t i = 0; i < committed; i++) {
        if (u && v[u - 1].pgno == v[i].pgno)
            v[u - 1] = v[i];   /* a later frame of the same page wins */
        else
            v[u++] = v[i];
    }
    s->wal = v;
    s->n_wal = u;
    return db_size;
}

/* Marks the freelist's trunk and leaf pages, as far as its chain survives. */
static void read_freelist(scan *s, uint32_t trunk)
{
    long long cap = 0;
    long long steps = 0, limit = s->file_pages + (long long)s->n_wal + 1;
    while (trunk && steps++ < limit && !s->oom) {
        const unsigned char *t = page(s, trunk);
        if (!t)
            break;
        uint32_t leaves = be32(t + 4);
        if (leaves > (s->usable - 8) / 4)
            break;
        if (util_grow((void **)&s->free, &cap, (long long)(s->n_free + leaves + 1),
                      sizeof *s->free)) {
            s->oom = 1;
            break;
        }
        s->free[s->n_free++] = trunk;
        for (uint32_t i = 0; i < leaves; i++)
            s->free[s->n_free++] = be32(t + 8 + 4 * i);
        trunk = be32(t);
    }
    if (s->n_free)
        qsort(s->free, s->n_free, sizeof *s->free, util_cmp_u32);
    size_t u = 0;
    for (size_t i = 0; i < s->n_free; i++)
        if (!u || s->free[u - 1] != s->free[i])
            s->free[u++] = s->free[i];
    s->n_free = u;
}

/* ---- records ---- */

#define MAX_COLS 32

static int is_text(uint64_t t) { return t >= 13 && t % 2; }
static int is_blob(uint64_t t) { return t >= 12 && t % 2 == 0; }
static int is_int(uint64_t t) { return (t >= 1 && t <= 6) || t == 8 || t == 9; }

/* A record's columns: serial types, where each value starts (offset into
 * the payload) and the payload length the header implies. */
typedef struct record {
    int n;
    uint64_t type[MAX_COLS];
    uint64_t at[MAX_COLS];
    uint64_t total;
} record;

/* The record header, from the first avail bytes of the payload. */
static int read_header(const unsigned char *p, size_t avail, record *r)
{
    uint64_t h;
    int k = cache_btree_varint(p, avail, &h);
    if (!k || h < (uint64_t)k || h > avail)
        return 0;
    size_t at = (size_t)k;
    uint64_t body = h;
    r->n = 0;
    while (at < h) {
        uint64_t t;
        int m = cache_btree_varint(p + at, (size_t)h - at, &t);
        if (!m || r->n == MAX_COLS || t == 10 || t == 11 || t > (1ull << 40))
            return 0;
        r->type[r->n] = t;
        r->at[r->n++] = body;
        body += cache_btree_serial_size(t);
        at += (size_t)m;
    }
    r->total = body;
    return 1;
}

static int64_t get_int(const unsigned char *p, uint64_t t)
{
    if (t == 8 || t == 9)
        return (int64_t)(t - 8);
    int n = (int)cache_btree_serial_size(t);
    uint64_t x = p[0] & 0x80 ? ~0ull : 0;
    for (int i = 0; i < n; i++)
        x = x << 8 | p[i];
    return (int64_t)x;
}

static double get_real(const unsigned char *p, uint64_t t)
{
    if (t != 7)
        return (double)get_int(p, t);
    uint64_t x = 0;
    for (int i = 0; i < 8; i++)
        x = x << 8 | p[i];
    double d;
    memcpy(&d, &x, sizeof d);
    return d;
}

/* Column i as a new NUL-terminated string; *len its bytes. */
static char *get_bytes(scan *s, const unsigned char *p, const record *r, int i, size_t *len)
{
    size_t n = (size_t)cache_btree_serial_size(r->type[i]);
    char *d = malloc(n + 1);
    if (!d) {
        s->oom = 1;
        return NULL;
    }
    if (n)
        memcpy(d, p + r->at[i], n);
    d[n] = 0;
    if (len)
        *len = n;
    return d;
}

/* Column i's text, if it lies within the first avail bytes, into out. */
static void peek_text(const unsigned char *p, size_t avail, const record *r, int i, char *out,
                      size_t n)
{
    out[0] = 0;
    if (i >= r->n || !is_text(r->type[i]))
        return;
    uint64_t len = cache_btree_serial_size(r->type[i]);
    if (r->at[i] + len > avail)
        return;
    size_t k = len < n - 1 ? (size_t)len : n - 1;
    for (size_t j = 0; j < k; j++)
        out[j] = (char)(p[r->at[i] + j] < 0x20 || p[r->at[i] + j] >= 0x7f ? '?' : p[r->at[i] + j]);
    out[k] = 0;
}

static int is_key(const unsigned char *p, size_t n)
{
    if (n != 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return 0;
    return 1;
}

/* ---- cells ---- */

/* How much of a payload of P bytes stays on its page (index: an index page). */
static uint64_t local_size(const scan *s, uint64_t P, int index)
{
    uint64_t U = s->usable;
    uint64_t X = index ? (U - 12) * 64 / 255 - 23 : U - 35;
    if (P <= X)
        return P;
    uint64_t M = (U - 12) * 32 / 255 - 23;
    uint64_t K = M + (P - M) % (U - 4);
    return K <= X ? K : M;
}

/* The whole payload: 1 (*buf malloc'd), 0 when its overflow chain runs
 * into a page that is missing or free (*missing: that page, 0 when the
 * length itself is past what the file holds). */
static int assemble(scan *s, const unsigned char *local, size_t nlocal, uint64_t P,
                    uint32_t first, unsigned char **buf, long long *missing)
{
    uint64_t room = s->usable - 4, pages = (uint64_t)s->file_pages + s->n_wal;
    *missing = 0;
    if (P > nlocal + pages * room)
        return 0;
    unsigned char *b = malloc((size_t)P + 1);
    if (!b) {
        s->oom = 1;
        return 0;
    }
    memcpy(b, local, nlocal);
    uint64_t have = nlocal;
    uint32_t pg = first;
    while (have < P) {
        const unsigned char *o = page(s, pg);
        if (!o || is_free(s, pg)) {
            *missing = pg;
            free(b);
            return 0;
        }
        uint64_t take = P - have < room ? P - have : room;
        memcpy(b + have, o + 4, (size_t)take);
        have += take;
        pg = be32(o);
    }
    *buf = b;
    return 1;
}

static void describe_cut(char *out, size_t n, long long missing)
{
    if (missing)
        snprintf(out, n, "its row runs into page %lld, which is missing or reused", missing);
    else
        snprintf(out, n, "its row is longer than what is left of the file");
}

static void kernel_row(scan *s, const unsigned char *local, size_t nlocal, uint64_t P,
                       uint32_t first, const record *r)
{
    /* On small pages the key may spill past the cell: then it is known
     * only once the row is whole. */
    int key_here = r->at[0] + 64 <= nlocal;
    if (key_here && !is_key(local + r->at[0], 64))
        return;
    char key[65] = "", op[24], arch[16], entry[40], why[96];
    if (key_here) {
        memcpy(key, local + r->at[0], 64);
        key[64] = 0;
    }
    peek_text(local, nlocal, r, 1, op, sizeof op);
    peek_text(local, nlocal, r, 4, arch, sizeof arch);
    peek_text(local, nlocal, r, 3, entry, sizeof entry);
    unsigned char *p = NULL;
    long long missing = 0;
    if (r->total != P || !assemble(s, local, nlocal, P, first, &p, &missing)) {
        /* A row cut before its key cannot be named here; the key index
         * may still name it. */
        if (s->oom || !key_here)
            return;
        if (r->total != P)
            snprintf(why, sizeof why, "its record is malformed");
        else
            describe_cut(why, sizeof why, missing);
        add_lost(s, key, 1, r->total == P, key, "%s %s %s: %s", op[0] ? op : "kernel", arch,
                 entry, why);
        return;
    }
    if (!key_here) {
        if (!is_key(p + r->at[0], 64)) {
            free(p);
            return;
        }
        memcpy(key, p + r->at[0], 64);
        key[64] = 0;
    }
    /* key op name entry arch nvrtc stof options params source log cubin ptx
     * checksum compile_ms created last_used hits */
    int types_ok = 1;
    for (int i = 1; i <= 10; i++)
        types_ok &= is_text(r->type[i]);
    types_ok &= (is_blob(r->type[11]) || is_text(r->type[11])) &&
                (is_blob(r->type[12]) || is_text(r->type[12])) && is_text(r->type[13]) &&
                (is_int(r->type[14]) || r->type[14] == 7) && is_int(r->type[15]) &&
                is_int(r->type[16]) && is_int(r->type[17]);
    cache_kernel k;
    memset(&k, 0, sizeof k);
    int sound = 0;
    if (types_ok) {
        snprintf(k.key, sizeof k.key, "%s", key);
        char **txt[] = {&k.op, &k.name, &k.entry, &k.arch, &k.nvrtc_version, &k.stof_version,
                        &k.options, &k.params, &k.source, &k.log};
        for (int i = 0; i < 10; i++)
            *txt[i] = get_bytes(s, p, r, i + 1, NULL);
        k.cubin = get_bytes(s, p, r, 11, &k.cubin_size);
        k.ptx = get_bytes(s, p, r, 12, &k.ptx_size);
        uint64_t cl = cache_btree_serial_size(r->type[13]);
        if (cl == 64)
            memcpy(k.checksum, p + r->at[13], 64);
        k.compile_ms = get_real(p + r->at[14], r->type[14]);
        k.created = get_int(p + r->at[15], r->type[15]);
        k.last_used = get_int(p + r->at[16], r->type[16]);
        k.hits = get_int(p + r->at[17], r->type[17]);
        if (!s->oom && k.cubin_size > 0) {
            char sum[65];
            cache_checksum(k.cubin, k.cubin_size, k.ptx, k.ptx_size, sum);
            sound = strcmp(sum, k.checksum) == 0;
        }
    }
    free(p);
    if (s->oom) {
        cache_kernel_free(&k);
        return;
    }
    if (!sound) {
        add_lost(s, key, 1, 0, key, "%s %s %s: %s", op[0] ? op : "kernel", arch, entry,
                 types_ok ? (k.cubin_size ? "checksum mismatch: its binary or PTX changed"
                                          : "no binary")
                          : "its columns have the wrong types");
    } else {
        names_add(s, &s->kept, key, 64);
        if (!cache_versions_current(k.nvrtc_version, k.stof_version, s->nvrtc))
            names_add(s, &s->kept_stale, key, 64);
        if (s->sink && s->sink->kernel && s->sink->kernel(&k, s->sink->arg))
            s->stopped = 1;
    }
    cache_kernel_free(&k);
}

static int tuning_types(const record *r, int n)
{
    if (r->n != n)
        return 0;
    for (int i = 0; i < n - 1; i++)
        if (!is_text(r->type[i]))
            return 0;
    return is_int(r->type[n - 1]);
}

/* The key columns (op, mask_hash, shape, dtype, arch, stof_version), each
 * as its length in decimal, ':' and its bytes: two rows share an id only
 * when they share every key column. */
static char *tuning_id(scan *s, const unsigned char *p, const record *r)
{
    size_t n = 1;
    for (int i = 0; i < 6; i++)
        n += (size_t)cache_btree_serial_size(r->type[i]) + 24;
    char *id = malloc(n);
    if (!id) {
        s->oom = 1;
        return NULL;
    }
    size_t at = 0;
    for (int i = 0; i < 6; i++) {
        /* A value ends at a NUL, as it does when the row is written again. */
        size_t len = strnlen((const char *)p + r->at[i],
                             (size_t)cache_btree_serial_size(r->type[i]));
        at += (size_t)snprintf(id + at, n - at, "%zu:", len);
        memcpy(id + at, p + r->at[i], len);
        at += len;
    }
    id[at] = 0;
    return id;
}

/* "tuning OP SHAPE DTYPE ARCH (mask HASH)" from an id, its values shown
 * up to 47 bytes, anything unprintable as '?'. */
static void tuning_label(const char *id, char *out, size_t n)
{
    char f[6][48] = {{0}};
    const char *p = id;
    for (int i = 0; i < 6 && *p; i++) {
        char *end;
        unsigned long long len = strtoull(p, &end, 10);
        if (*end != ':' || len > strlen(end + 1))
            break;
        p = end + 1;
        size_t k = len < 47 ? (size_t)len : 47;
        for (size_t j = 0; j < k; j++)
            f[i][j] = (unsigned char)p[j] < 0x20 || (unsigned char)p[j] >= 0x7f ? '?' : p[j];
        p += len;
    }
    snprintf(out, n, "tuning %s %s %s %s (mask %.12s)", f[0], f[2], f[3], f[4], f[1]);
}

static void tuning_row(scan *s, const unsigned char *local, size_t nlocal, uint64_t P,
                       uint32_t first, const record *r)
{
    unsigned char *p = NULL;
    long long missing = 0;
    if (r->total != P || !assemble(s, local, nlocal, P, first, &p, &missing)) {
        /* Without its key columns, a cut tuning row cannot be named here;
         * the tuning index may still name it. */
        int named = r->at[5] + cache_btree_serial_size(r->type[5]) <= nlocal;
        char *id = named && !s->oom ? tuning_id(s, local, r) : NULL;
        if (id) {
            char label[300], why[64];
            tuning_label(id, label, sizeof label);
            if (r->total != P)
                snprintf(why, sizeof why, "its record is malformed");
            else
                describe_cut(why, sizeof why, missing);
            add_lost(s, id, 0, 1, NULL, "%s: %s", label, why);
            free(id);
        } else if (!s->oom) {
            s->out->tuning_cut++;
        }
        return;
    }
    char *id = tuning_id(s, p, r);
    cache_tuning t = {0};
    char *ver = NULL;
    if (id) {
        t.op = get_bytes(s, p, r, 0, NULL);
        t.mask_hash = get_bytes(s, p, r, 1, NULL);
        t.shape = get_bytes(s, p, r, 2, NULL);
        t.dtype = get_bytes(s, p, r, 3, NULL);
        t.arch = get_bytes(s, p, r, 4, NULL);
        ver = get_bytes(s, p, r, 5, NULL);
        t.record = get_bytes(s, p, r, 6, NULL);
        t.created = get_int(p + r->at[7], r->type[7]);
    }
    /* A whole row whose record no longer parses (a page zeroed within its
     * text) is lost, not kept: check would call the new file damaged. */
    json_value *v = id && t.record ? json_parse(t.record, strlen(t.record), NULL) : NULL;
    if (!s->oom && id && t.record && !v) {
        char label[300];
        tuning_label(id, label, sizeof label);
        add_lost(s, id, 0, 0, NULL, "%s: its record is not JSON", label);
        free(id);
        id = NULL;
    }
    json_free(v);
    if (!s->oom && id) {
        names_add(s, &s->tuning_kept, id, strlen(id));
        if (s->sink && s->sink->tuning && s->sink->tuning(&t, ver, s->sink->arg))
            s->stopped = 1;
    }
    free(id);
    free(ver);
    cache_tuning_free(&t);
    free(p);
}

/* An entry of the kernels' key index or the tuning rows' key index. */
static void index_entry(scan *s, const unsigned char *local, size_t nlocal, uint64_t P,
                        uint32_t first, const record *r)
{
    int key_entry = r->n == 2 && r->type[0] == 13 + 2 * 64 && is_int(r->type[1]);
    if (key_entry && r->at[0] + 64 <= nlocal) {
        if (is_key(local + r->at[0], 64))
            names_add(s, &s->named, (const char *)local + r->at[0], 64);
        return;
    }
    if ((!key_entry && !tuning_types(r, 7)) || r->total != P)
        return;
    unsigned char *p = NULL;
    long long missing;
    if (!assemble(s, local, nlocal, P, first, &p, &missing))
        return;
    if (key_entry) {
        if (is_key(p + r->at[0], 64))
            names_add(s, &s->named, (const char *)p + r->at[0], 64);
        free(p);
        return;
    }
    char *id = tuning_id(s, p, r);
    if (id)
        names_add(s, &s->tuning_named, id, strlen(id));
    free(id);
    free(p);
}

/* One cell at off of a page of the given type. */
static void scan_cell(scan *s, const unsigned char *pg, int type, size_t off)
{
    size_t end = s->usable, at = off + (type == 2 ? 4 : 0);
    uint64_t P, rowid;
    int k;
    if (at >= end || !(k = cache_btree_varint(pg + at, end - at, &P)))
        return;
    at += (size_t)k;
    if (type == 13) {
        if (!(k = cache_btree_varint(pg + at, end - at, &rowid)))
            return;
        at += (size_t)k;
    }
    uint64_t local = local_size(s, P, type != 13);
    int spill = P > local;
    if (at + local + (spill ? 4 : 0) > end)
        return;
    uint32_t first = spill ? be32(pg + at + local) : 0;
    record r;
    if (!read_header(pg + at, (size_t)local, &r))
        return;
    /* Rowids tell how many rows the kernels' missing pages held (settle):
     * a kernel row's own, the key index's (key, rowid), the LRU index's. */
    int kernel = r.n == 18 && r.type[0] == 13 + 2 * 64 && type == 13;
    int entry = type != 13 && r.n == 2 && is_int(r.type[1]) &&
                r.at[1] + cache_btree_serial_size(r.type[1]) <= local;
    if (entry)
        rowid = (uint64_t)get_int(pg + at + r.at[1], r.type[1]);
    if ((kernel || entry) && (int64_t)rowid > s->max_rowid)
        s->max_rowid = (int64_t)rowid;
    if (kernel || (entry && r.type[0] == 13 + 2 * 64)) {
        if (!util_grow((void **)&s->rowids, &s->cap_rowids, s->n_rowids + 1, sizeof *s->rowids))
            s->rowids[s->n_rowids++] = (int64_t)rowid;
        else
            s->oom = 1;
    }
    if (type != 13)
        index_entry(s, pg + at, (size_t)local, P, first, &r);
    else if (kernel)
        kernel_row(s, pg + at, (size_t)local, P, first, &r);
    else if (tuning_types(&r, 8))
        tuning_row(s, pg + at, (size_t)local, P, first, &r);
}

static void scan_page(scan *s, long long pgno, const unsigned char *pg)
{
    size_t h = pgno == 1 ? 100 : 0;
    int type = pg[h];
    if (type != 2 && type != 10 && type != 13)
        return;   /* table interior pages hold no rows */
    uint32_t cells = be16(pg + h + 3);
    size_t start = h + (type == 2 ? 12 : 8);
    if (start + 2 * (size_t)cells > s->usable)
        return;
    for (uint32_t i = 0; i < cells && !s->oom && !s->stopped; i++) {
        size_t off = be16(pg + start + 2 * i);
        if (off >= start + 2 * (size_t)cells && off < s->usable)
            scan_cell(s, pg, type, off);
    }
}

/* ---- the scan ---- */

static int fail_why(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail_why(char *why, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* The header: page size, pages, WAL and freelist. */
static int scan_open(scan *s, const unsigned char *wal, size_t wal_n, char *why, size_t why_n)
{
    static const char magic[16] = "SQLite format 3";
    const unsigned char *h = s->db;
    if (s->n >= 100 && memcmp(h, magic, 16) == 0) {
        s->page_size = be16(h + 16) == 1 ? 65536 : be16(h + 16);
        s->usable = s->page_size - h[20];
    } else if (wal && wal_n >= 32) {
        s->page_size = be32(wal + 8);   /* the file lost its header; its WAL may have page 1 */
        s->usable = s->page_size;
    } else {
        return fail_why(why, why_n, "not a SQLite database (no SQLite header)");
    }
    if (s->page_size < 512 || s->page_size > 65536 || (s->page_size & (s->page_size - 1)) ||
        s->usable < 480 || s->usable > s->page_size)
        return fail_why(why, why_n, "not a SQLite database this stof can read (page size %u)",
                        (unsigned)s->page_size);
    s->out->page_size = (int)s->page_size;
    s->file_pages = (long long)(s->n / s->page_size);
    /* The header's page count is trusted only when it was written with the
     * change counter beside it (SQLite's own rule); a committed WAL frame
     * says the size after it. */
    s->expected = s->file_pages;
    if (s->n >= 100 && be32(h + 28) && be32(h + 24) == be32(h + 92))
        s->expected = be32(h + 28);
    uint32_t wal_size = read_wal(s, wal, wal_n);
    if (s->oom)
        return fail_why(why, why_n, "out of memory reading the WAL");
    if (wal_size)
        s->expected = wal_size;
    const unsigned char *p1 = page(s, 1);
    if (!p1 || memcmp(p1, magic, 16) != 0)
        return fail_why(why, why_n, "not a SQLite database (its first page is missing)");
    if (be32(p1 + 56) > 1)
        return fail_why(why, why_n, "a SQLite database in UTF-16, not a stof cache");
    if (be32(p1 + 60) > CACHE_SCHEMA_VERSION)
        return fail_why(why, why_n, "cache schema version %u is newer than this stof's %d",
                        (unsigned)be32(p1 + 60), CACHE_SCHEMA_VERSION);
    read_freelist(s, be32(p1 + 32));
    if (s->oom)
        return fail_why(why, why_n, "out of memory reading the freelist");
    s->out->pages_expected = s->expected;
    s->out->free_pages = (long long)s->n_free;
    return 0;
}

static void scan_rows(scan *s)
{
    long long in_file = s->file_pages < s->expected ? s->file_pages : s->expected;
    long long present = in_file;
    for (long long pgno = 1; pgno <= in_file && !s->oom && !s->stopped; pgno++)
        if (!is_free(s, (uint32_t)pgno))
            scan_page(s, pgno, page(s, pgno));
    for (size_t i = 0; i < s->n_wal && !s->oom && !s->stopped; i++) {
        long long pgno = s->wal[i].pgno;
        if (pgno <= in_file || pgno > s->expected)
            continue;
        present++;
        if (!is_free(s, (uint32_t)pgno))
            scan_page(s, pgno, s->wal[i].data);
    }
    s->out->pages_present = present;
}

static int cmp_lost(const void *a, const void *b)
{
    const lost_entry *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : y->cut - x->cut;
}

/* The kernels table's pages for cache_btree: NULL where missing, and a
 * page of zeros (no b-tree page) where free, whose rows were deleted. */
static const unsigned char *tree_page(void *arg, long long pgno)
{
    static const unsigned char none[128];
    scan *s = arg;
    const unsigned char *p = page(s, pgno);
    return p && pgno <= UINT32_MAX && is_free(s, (uint32_t)pgno) ? none : p;
}

/* Rows on missing pages of the kernels table that no surviving index
 * names (kernels_cut, and one line for them all). */
static void count_missing(scan *s)
{
    cache_salvage *o = s->out;
    int pages;
    long long lost = cache_btree_missing(tree_page, s, s->usable, "kernels",
                                         s->file_pages + (long long)s->n_wal, s->rowids,
                                         (size_t)s->n_rowids, s->max_rowid, &pages);
    if (lost < 0 || (lost && util_grow((void **)&o->lost, &o->cap_lost, o->n_lost + 1,
                                    sizeof *o->lost)))
        s->oom = 1;
    if (lost <= 0 || s->oom)
        return;
    o->kernels_missing = lost;
    o->kernels_cut += lost;
    cache_lost *l = &o->lost[o->n_lost++];
    l->key[0] = 0;
    snprintf(l->what, sizeof l->what,
             "%lld kernel%s on %d missing page%s of the kernels table, named by no surviving "
             "index (counted by their rowids)", lost, lost == 1 ? "" : "s", pages,
             pages == 1 ? "" : "s");
}

/* What was lost: rows found cut or damaged and not kept in another copy,
 * then what the indexes name that was not found at all, then the rows
 * of the kernels table's missing pages. */
static void settle(scan *s)
{
    cache_salvage *o = s->out;
    names_unique(&s->kept);
    names_unique(&s->kept_stale);
    names_unique(&s->named);
    names_unique(&s->tuning_kept);
    names_unique(&s->tuning_named);
    o->kernels = s->kept.n;
    o->stale_kernels = s->kept_stale.n;
    o->tuning = s->tuning_kept.n;
    if (s->n_lost)
        qsort(s->lost, (size_t)s->n_lost, sizeof *s->lost, cmp_lost);
    name_list lost_ids = {0};
    for (int i = 0; i < s->n_lost && !s->oom; i++) {
        lost_entry *e = &s->lost[i];
        if ((i && strcmp(e->id, s->lost[i - 1].id) == 0) ||
            names_has(e->kernel ? &s->kept : &s->tuning_kept, e->id))
            continue;
        if (e->kernel && e->cut)
            o->kernels_cut++;
        else if (e->kernel)
            o->kernels_damaged++;
        else
            o->tuning_cut++;
        if (util_grow((void **)&o->lost, &o->cap_lost, o->n_lost + 1, sizeof *o->lost)) {
            s->oom = 1;
            break;
        }
        o->lost[o->n_lost++] = e->l;
        names_add(s, &lost_ids, e->id, strlen(e->id));
    }
    names_unique(&lost_ids);
    for (int i = 0; i < s->named.n && !s->oom; i++) {
        const char *k = s->named.v[i];
        if (names_has(&s->kept, k) || names_has(&lost_ids, k))
            continue;
        if (util_grow((void **)&o->lost, &o->cap_lost, o->n_lost + 1, sizeof *o->lost)) {
            s->oom = 1;
            break;
        }
        cache_lost *l = &o->lost[o->n_lost++];
        snprintf(l->key, sizeof l->key, "%s", k);
        snprintf(l->what, sizeof l->what,
                 "kernel: named by the key index, but its row is not here whole (a missing "
                 "page, or cut off before its key)");
        o->kernels_unseen++;
    }
    for (int i = 0; i < s->tuning_named.n && !s->oom; i++) {
        const char *id = s->tuning_named.v[i];
        if (names_has(&s->tuning_kept, id) || names_has(&lost_ids, id))
            continue;
        if (util_grow((void **)&o->lost, &o->cap_lost, o->n_lost + 1, sizeof *o->lost)) {
            s->oom = 1;
            break;
        }
        cache_lost *l = &o->lost[o->n_lost++];
        char label[300];
        tuning_label(id, label, sizeof label);
        l->key[0] = 0;
        snprintf(l->what, sizeof l->what,
                 "%s: named by its index, but its row is not here whole (a missing page, or cut "
                 "off before its key)",
                 label);
        o->tuning_unseen++;
    }
    names_free(&lost_ids);
    if (!s->oom)
        count_missing(s);
}

int cache_salvage_scan(const unsigned char *db, size_t n, const unsigned char *wal, size_t wal_n,
                       const char *nvrtc_version,
                       const cache_salvage_sink *sink, cache_salvage *out, char *why,
                       size_t why_n)
{
    memset(out, 0, sizeof *out);
    if (why_n)
        why[0] = 0;
    scan s = {.db = db, .n = db ? n : 0, .sink = sink, .out = out, .nvrtc = nvrtc_version};
    int rc = scan_open(&s, wal, wal_n, why, why_n);
    if (rc == 0) {
        scan_rows(&s);
        if (!s.oom && !s.stopped)
            settle(&s);
        if (s.oom)
            rc = fail_why(why, why_n, "out of memory scanning the file");
        else if (s.stopped)
            rc = fail_why(why, why_n, "writing the rows failed");
    }
    free(s.wal);
    free(s.free);
    names_free(&s.kept);
    names_free(&s.kept_stale);
    names_free(&s.named);
    names_free(&s.tuning_kept);
    names_free(&s.tuning_named);
    for (int i = 0; i < s.n_lost; i++)
        free(s.lost[i].id);
    free(s.lost);
    free(s.rowids);
    return rc;
}

void cache_salvage_free(cache_salvage *s)
{
    free(s->lost);
    memset(s, 0, sizeof *s);
}
