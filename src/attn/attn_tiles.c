#include "attn/attn_tiles.h"

#include <stdlib.h>
#include <string.h>

#include "attn/mask.h"
#include "base/err.h"
#include "base/util.h"

void attn_tiles_free(attn_tiles *t)
{
    free(t->group_order);
    free(t->work);
    free(t->qidx);
    free(t->tile_ptr);
    free(t->tile_key);
    free(t->tile_bits);
    free(t->kidx);
    free(t->bits);
    memset(t, 0, sizeof *t);
}

/* Heaviest groups first, so the last wave is made of short ones. */
static int order_groups(attn_tiles *t)
{
    int n = t->n_groups;
    if (!(t->group_order = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1))))
        return 0;
    /* Counting sort by tile count, descending. */
    long long maxc = 0;
    for (int g = 0; g < n; g++) {
        long long c = t->tile_ptr[g + 1] - t->tile_ptr[g];
        if (c > maxc)
            maxc = c;
    }
    t->max_tiles = maxc;
    int32_t *count = calloc((size_t)maxc + 2, sizeof *count);
    if (!count)
        return 0;
    for (int g = 0; g < n; g++)
        count[maxc - (t->tile_ptr[g + 1] - t->tile_ptr[g]) + 1]++;
    for (long long c = 1; c <= maxc + 1; c++)
        count[c] += count[c - 1];
    for (int g = 0; g < n; g++)
        t->group_order[count[maxc - (t->tile_ptr[g + 1] - t->tile_ptr[g])]++] = g;
    free(count);
    /* What a CTA needs before its first copies, in one 16-byte record. */
    if (!(t->work = malloc(sizeof(int32_t) * 4 * (size_t)(n > 0 ? n : 1))))
        return 0;
    for (int r = 0; r < n; r++) {
        const int g = t->group_order[r], t0 = t->tile_ptr[g], t1 = t->tile_ptr[g + 1];
        int32_t *w = t->work + 4 * (size_t)r;
        w[0] = g, w[1] = t0, w[2] = t1, w[3] = t1 > t0 ? t->tile_key[t0] : 0;
    }
    return 1;
}

static stof_status build_block(stof_ctx *ctx, const mask_summary *ms, attn_tiles *t)
{
    mask_blocks mb;
    TRY(mask_build_blocks(ctx, ms->runs, t->bm, t->bn, &mb));
    t->n_groups = mb.nqb;
    t->n_tiles = mb.n_blocks;
    t->n_full = mb.n_full;
    t->n_bitmaps = mb.n_bitmaps;
    size_t nt = (size_t)(mb.n_blocks > 0 ? mb.n_blocks : 1);
    size_t nw = (size_t)(mb.n_bitmaps > 0 ? mb.n_bitmaps : 1) * (size_t)mb.words_per_block;
    t->tile_ptr = malloc(sizeof(int32_t) * (size_t)(mb.nqb + 1));
    t->tile_key = malloc(sizeof(int32_t) * nt);
    t->tile_bits = malloc(sizeof(int32_t) * nt);
    t->bits = calloc(nw, sizeof(uint32_t));
    stof_status st = STOF_OK;
    if (!t->tile_ptr || !t->tile_key || !t->tile_bits || !t->bits) {
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory building attention tiles");
    } else {
        memcpy(t->tile_ptr, mb.row_ptr, sizeof(int32_t) * (size_t)(mb.nqb + 1));
        for (long long n = 0; n < mb.n_blocks; n++) {
            t->tile_key[n] = mb.col[n] * t->bn;
            t->tile_bits[n] = mb.partial[n];
        }
        if (mb.n_bitmaps)
            memcpy(t->bits, mb.bits, sizeof(uint32_t) * (size_t)mb.n_bitmaps * (size_t)mb.words_per_block);
    }
    mask_blocks_free(&mb);
    return st;
}

static stof_status build_gather(stof_ctx *ctx, const mask_summary *ms, attn_tiles *t)
{
    const int lq = ms->lq, lk = ms->lk;
    const int bm = t->bm, bn = t->bn, wpr = t->wpr, words = bm * wpr;
    t->period = ms->period;
    /* Groups never mix residues: each residue's rows start a group, so that
     * a group's keys are its residue's alone and its rows step by the
     * period (attn_tiles_view_period); a residue's last group is padded. */
    t->n_groups = 0;
    for (int r = 0; r < t->period && r < lq; r++)
        t->n_groups += ((lq - r + t->period - 1) / t->period + bm - 1) / bm;
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)t->n_groups * (size_t)bm);
    int32_t *stamp = malloc(sizeof(int32_t) * (size_t)lk);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)lk);
    int32_t *keys = malloc(sizeof(int32_t) * (size_t)lk);
    t->qidx = malloc(sizeof(int32_t) * (size_t)t->n_groups * (size_t)bm);
    t->tile_ptr = malloc(sizeof(int32_t) * (size_t)(t->n_groups + 1));
    /* A group's key lists and bitmaps are made in scratch space; the sets
     * keep the distinct lists and the partial tiles' distinct bitmaps
     * (regular masks repeat both across groups). */
    const int max_tiles = (lk + bn - 1) / bn;
    uint32_t *scratch = malloc(sizeof(uint32_t) * (size_t)(max_tiles > 0 ? max_tiles : 1) * words);
    int32_t *kix = malloc(sizeof(int32_t) * (size_t)(max_tiles > 0 ? max_tiles : 1) * bn);
    mask_bitset set = {.wpb = words}, lists = {.wpb = bn};
    int32_t *tk = NULL, *tb = NULL; /* the tiles' key lists and bitmaps, grown per group */
    long long cap_tk = 0, cap_tb = 0;
    mask_iter it;
    int have_iter = 0;
    stof_status st = STOF_OK;
    if (!rows || !stamp || !pos || !keys || !scratch || !kix || !t->qidx || !t->tile_ptr) {
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory building attention tiles");
        goto done;
    }
    if ((st = mask_iter_init(&it, ms->runs)) != STOF_OK)
        goto done;
    have_iter = 1;
    int n = 0;
    for (int r = 0; r < t->period && r < lq; r++) {
        for (int q = r; q < lq; q += t->period)
            rows[n++] = q;
        while (n % bm)
            rows[n++] = -1;
    }
    for (int k = 0; k < lk; k++)
        stamp[k] = -1;
    t->tile_ptr[0] = 0;
    for (int g = 0; g < t->n_groups; g++) {
        int nrows = 0, nkeys = 0;
        while (nrows < bm && rows[g * bm + nrows] >= 0)
            nrows++;
        for (int r = 0; r < bm; r++)
            t->qidx[(size_t)g * bm + r] = rows[g * bm + r];
        /* The union of the group's keys, in increasing order. */
        for (int r = 0; r < nrows; r++) {
            const mask_range *rg;
            int nr = mask_row_ranges(&it, rows[g * bm + r], &rg);
            for (int i = 0; i < nr; i++)
                for (int k = rg[i].lo; k < rg[i].hi; k++)
                    if (stamp[k] != g) {
                        stamp[k] = g;
                        nkeys++;
                    }
        }
        for (int k = 0, i = 0; k < lk; k++)
            if (stamp[k] == g)
                keys[i++] = k;
        int ntiles = (nkeys + bn - 1) / bn;
        const int at = t->tile_ptr[g];
        uint32_t *bw = scratch;
        if (ntiles && (util_grow((void **)&tk, &cap_tk, (long long)at + ntiles, sizeof *tk) ||
                       util_grow((void **)&tb, &cap_tb, (long long)at + ntiles, sizeof *tb))) {
            st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory building attention tiles");
            goto done;
        }
        memset(bw, 0, sizeof(uint32_t) * (size_t)ntiles * words);
        for (int i = 0; i < ntiles * bn; i++)
            kix[i] = i < nkeys ? keys[i] : -1;
        for (int i = 0; i < nkeys; i++)
            pos[keys[i]] = i;
        for (int r = 0; r < nrows; r++) {
            const mask_range *rg;
            int nr = mask_row_ranges(&it, rows[g * bm + r], &rg);
            for (int i = 0; i < nr; i++)
                for (int k = rg[i].lo; k < rg[i].hi; k++) {
                    int p = pos[k], tile = p / bn, c = p % bn;
                    bw[(size_t)tile * words + (size_t)r * wpr + c / 32] |= 1u << (c % 32);
                }
        }
        for (int i = 0; i < ntiles; i++) {
            long long list = mask_bitset_add(&lists, (const uint32_t *)kix + (size_t)i * bn);
            tk[at + i] = (int32_t)list;
            int full = nrows == bm && (i + 1) * bn <= nkeys;
            for (int w = 0; full && w < words; w++) {
                int c0 = (w % wpr) * 32, valid = bn - c0 < 32 ? bn - c0 : 32;
                uint32_t want = valid == 32 ? 0xffffffffu : (1u << valid) - 1;
                full = (bw[(size_t)i * words + w] & want) == want;
            }
            long long b = full ? -1 : mask_bitset_add(&set, bw + (size_t)i * words);
            if (list < 0 || (!full && b < 0)) {
                st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory building attention tiles");
                goto done;
            }
            tb[at + i] = (int32_t)b;
            t->n_full += full;
        }
        t->tile_ptr[g + 1] = t->tile_ptr[g] + ntiles;
    }
    t->n_tiles = t->tile_ptr[t->n_groups];
    t->n_kidx_tiles = lists.n;
    t->n_bitmaps = set.n;
    t->tile_key = tk;
    t->tile_bits = tb;
    t->kidx = (int32_t *)lists.bits;
    t->bits = set.bits;
    tk = tb = NULL;
    set.bits = lists.bits = NULL;
    /* Empty arrays still get a buffer, so packing never copies from NULL. */
    if (!t->tile_key)
        t->tile_key = calloc(1, sizeof(int32_t));
    if (!t->tile_bits)
        t->tile_bits = calloc(1, sizeof(int32_t));
    if (!t->kidx)
        t->kidx = calloc(1, sizeof(int32_t));
    if (!t->bits)
        t->bits = calloc(1, sizeof(uint32_t));
    if (!t->tile_key || !t->tile_bits || !t->kidx || !t->bits)
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory building attention tiles");
done:
    if (have_iter)
        mask_iter_free(&it);
    free(rows);
    free(stamp);
    free(pos);
    free(keys);
    free(scratch);
    free(kix);
    mask_bitset_free(&set);
    mask_bitset_free(&lists);
    free(tk);
    free(tb);
    return st;
}

stof_status attn_tiles_build(stof_ctx *ctx, const mask_summary *ms, attn_kind kind, int bm,
                             int bn, attn_tiles *out)
{
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->bm = bm;
    out->bn = bn;
    out->wpr = (bn + 31) / 32;
    out->period = 1;
    stof_status st = kind == ATTN_BLOCK ? build_block(ctx, ms, out) : build_gather(ctx, ms, out);
    if (st == STOF_OK && !order_groups(out))
        st = CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory building attention tiles");
    if (st != STOF_OK)
        attn_tiles_free(out);
    return st;
}

/* Whether x[0 .. n) is x[0], x[0] + per, x[0] + 2 per, ... up to a tail
 * of -1 (at least one element listed); *pad: where the tail starts (n
 * without one). */
static int arithmetic(const int32_t *x, int n, int per, int *pad)
{
    int i = 0;
    while (i < n && x[i] >= 0 && x[i] == x[0] + per * i)
        i++;
    *pad = i;
    while (i < n && x[i] < 0)
        i++;
    return i == n && *pad > 0;
}

int attn_tiles_view_period(const attn_tiles *t, int lq, int lk)
{
    const int per = t->period;
    if (t->kind != ATTN_GATHER || per < 2 || lq % per || lk % per)
        return 1;
    /* A group's padding rows past its residue's last row, so that a box
     * of the view reads zeros for them and its store writes none. */
    for (int g = 0; g < t->n_groups; g++) {
        const int32_t *q = t->qidx + (size_t)g * t->bm;
        int pad;
        if (!arithmetic(q, t->bm, per, &pad) || (pad < t->bm && q[0] / per + pad < lq / per))
            return 1;
    }
    /* A list with padding keys belongs to partial tiles only: their
     * bitmaps leave the padding out, whatever the view reads there. */
    unsigned char *padded = calloc((size_t)(t->n_kidx_tiles > 0 ? t->n_kidx_tiles : 1), 1);
    if (!padded)
        return 1;
    int ok = 1;
    for (long long i = 0; ok && i < t->n_kidx_tiles; i++) {
        int pad;
        ok = arithmetic(t->kidx + (size_t)i * t->bn, t->bn, per, &pad);
        padded[i] = pad < t->bn;
    }
    for (long long j = 0; ok && j < t->n_tiles; j++)
        ok = !padded[t->tile_key[j]] || t->tile_bits[j] >= 0;
    free(padded);
    return ok ? per : 1;
}

void attn_tiles_view(const attn_tiles *t, int32_t *items, long long n_items, int32_t *tile_key)
{
    for (long long i = 0; i < n_items; i++)
        items[4 * i] = t->qidx[(size_t)items[4 * i] * t->bm];
    for (long long j = 0; j < t->n_tiles; j++)
        tile_key[j] = t->kidx[(size_t)tile_key[j] * t->bn];
}

/* ---- the tiles as one buffer ---------------------------------------------- */

#define TILES_MAGIC "stoftil1"

typedef struct tiles_header {
    char magic[8];
    int32_t kind, bm, bn, wpr, n_groups, period, has_qidx, pad;
    int64_t n_tiles, n_full, n_bitmaps, n_kidx_tiles, max_tiles;
} tiles_header;

/* The arrays in buffer order, with their element counts (int32 each). */
typedef struct tiles_part {
    void **p;
    size_t n;
} tiles_part;

static int tiles_parts(attn_tiles *t, int has_qidx, tiles_part parts[8])
{
    const size_t g = (size_t)t->n_groups, nt = (size_t)t->n_tiles;
    tiles_part all[8] = {
        {(void **)&t->group_order, g},
        {(void **)&t->work, 4 * g},
        {(void **)&t->qidx, has_qidx ? g * (size_t)t->bm : 0},
        {(void **)&t->tile_ptr, g + 1},
        {(void **)&t->tile_key, nt},
        {(void **)&t->tile_bits, nt},
        {(void **)&t->kidx, (size_t)t->n_kidx_tiles * (size_t)t->bn},
        {(void **)&t->bits, (size_t)t->n_bitmaps * (size_t)t->bm * (size_t)t->wpr},
    };
    memcpy(parts, all, sizeof all);
    return 8;
}

void *attn_tiles_encode(const attn_tiles *t, size_t *n)
{
    attn_tiles c = *t;
    tiles_part parts[8];
    int np = tiles_parts(&c, t->qidx != NULL, parts);
    tiles_header h = {.kind = t->kind, .bm = t->bm, .bn = t->bn, .wpr = t->wpr,
                      .n_groups = t->n_groups, .period = t->period, .has_qidx = t->qidx != NULL,
                      .n_tiles = t->n_tiles, .n_full = t->n_full, .n_bitmaps = t->n_bitmaps,
                      .n_kidx_tiles = t->n_kidx_tiles, .max_tiles = t->max_tiles};
    memcpy(h.magic, TILES_MAGIC, 8);
    size_t total = sizeof h;
    for (int i = 0; i < np; i++)
        total += 4 * parts[i].n;
    char *buf = malloc(total), *at = buf;
    if (!buf)
        return NULL;
    memcpy(at, &h, sizeof h);
    at += sizeof h;
    for (int i = 0; i < np; i++) {
        if (parts[i].n)
            memcpy(at, *parts[i].p, 4 * parts[i].n);
        at += 4 * parts[i].n;
    }
    *n = total;
    return buf;
}

int attn_tiles_decode(const void *data, size_t n, attn_tiles *t)
{
    memset(t, 0, sizeof *t);
    tiles_header h;
    if (n < sizeof h)
        return 0;
    memcpy(&h, data, sizeof h);
    if (memcmp(h.magic, TILES_MAGIC, 8) != 0 || (h.kind != ATTN_BLOCK && h.kind != ATTN_GATHER) ||
        h.bm < 1 || h.bm > 1024 || h.bn < 1 || h.bn > 1024 || h.wpr != (h.bn + 31) / 32 ||
        h.n_groups < 0 || h.period < 1 || h.n_tiles < 0 || h.n_full < 0 || h.n_bitmaps < 0 ||
        h.n_kidx_tiles < 0 || h.max_tiles < 0 || h.n_tiles > (int64_t)(n / 4) ||
        h.n_bitmaps > (int64_t)(n / 4) || h.n_kidx_tiles > (int64_t)(n / 4))
        return 0;
    *t = (attn_tiles){.kind = (attn_kind)h.kind, .bm = h.bm, .bn = h.bn, .wpr = h.wpr,
                      .n_groups = h.n_groups, .period = h.period, .n_tiles = h.n_tiles,
                      .n_full = h.n_full, .n_bitmaps = h.n_bitmaps,
                      .n_kidx_tiles = h.n_kidx_tiles, .max_tiles = h.max_tiles};
    tiles_part parts[8];
    int np = tiles_parts(t, h.has_qidx, parts);
    size_t total = sizeof h;
    for (int i = 0; i < np; i++)
        total += 4 * parts[i].n;
    if (total != n) {
        memset(t, 0, sizeof *t);
        return 0;
    }
    const char *at = (const char *)data + sizeof h;
    for (int i = 0; i < np; i++) {
        if (parts[i].p == (void **)&t->qidx && !h.has_qidx)
            continue; /* rows of a block walk are not listed */
        /* Every other array is allocated, even when empty. */
        if (!(*parts[i].p = malloc(4 * (parts[i].n ? parts[i].n : 1)))) {
            attn_tiles_free(t);
            return 0;
        }
        memcpy(*parts[i].p, at, 4 * parts[i].n);
        at += 4 * parts[i].n;
    }
    const int32_t *tp = t->tile_ptr;
    int ok = tp && tp[0] == 0 && tp[t->n_groups] == t->n_tiles;
    for (int i = 0; ok && i < t->n_groups; i++)
        ok = tp[i] <= tp[i + 1];
    if (!ok)
        attn_tiles_free(t);
    return ok;
}

stof_status attn_tiles_copy(stof_ctx *ctx, const attn_tiles *t, attn_tiles *out)
{
    size_t n = 0;
    void *buf = attn_tiles_encode(t, &n);
    int ok = buf && attn_tiles_decode(buf, n, out);
    free(buf);
    return ok ? STOF_OK
              : CTX_FAIL(ctx, STOF_ERR_NO_MEMORY, "out of memory copying attention tiles");
}

static size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

attn_tiles_layout attn_tiles_layout_of(const attn_tiles *t)
{
    attn_tiles_layout l;
    size_t at = 0, sz;
#define PLACE(field, bytes) (l.field = at, sz = (bytes), at += up16(sz > 0 ? sz : 4))
    PLACE(work, 16 * (size_t)t->n_groups);
    PLACE(qidx, t->qidx ? 4 * (size_t)t->n_groups * (size_t)t->bm : 0);
    PLACE(tile_key, 4 * (size_t)t->n_tiles);
    PLACE(tile_bits, 4 * (size_t)t->n_tiles);
    PLACE(kidx, 4 * (size_t)t->n_kidx_tiles * (size_t)t->bn);
    PLACE(bits, 4 * (size_t)t->n_bitmaps * (size_t)t->bm * (size_t)t->wpr);
#undef PLACE
    l.total = at;
    return l;
}

void attn_tiles_pack(const attn_tiles *t, const attn_tiles_layout *l, void *dst)
{
    char *d = dst;
    memset(d, 0, l->total);
    memcpy(d + l->work, t->work, 16 * (size_t)t->n_groups);
    if (t->qidx)
        memcpy(d + l->qidx, t->qidx, 4 * (size_t)t->n_groups * (size_t)t->bm);
    memcpy(d + l->tile_key, t->tile_key, 4 * (size_t)t->n_tiles);
    memcpy(d + l->tile_bits, t->tile_bits, 4 * (size_t)t->n_tiles);
    if (t->kidx)
        memcpy(d + l->kidx, t->kidx, 4 * (size_t)t->n_kidx_tiles * (size_t)t->bn);
    memcpy(d + l->bits, t->bits, 4 * (size_t)t->n_bitmaps * (size_t)t->bm * (size_t)t->wpr);
}

/* The CTA with the least work sits at the top of a binary heap of keys
 * load << 16 | cta: one integer compare orders by load, ties to the lower
 * CTA, so that the deal is the same on every run (a heap of pairs compared
 * field by field cost a cached plan 0.2 ms for 2048 items). */
static void heap_down(uint64_t *h, int n)
{
    uint64_t x = h[0];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1;
        if (l >= n)
            break;
        int m = l + 1 < n && h[l + 1] < h[l] ? l + 1 : l;
        if (h[m] >= x)
            break;
        h[i] = h[m];
        i = m;
    }
    h[i] = x;
}

int attn_tiles_share(int bm, int lq, int group)
{
    /* Not k alone: a lone consumer's softmax leaves the tensor cores idle
     * where another's products would fill them (on an H100, dense hd64:
     * one consumer of three takes about 0.55 of the three's step, two
     * about 0.8; 5 / 9 and 7 / 9 here). */
    const int nc = (bm + 63) / 64, rows = lq - group * bm;
    const int k = lq <= 0 || rows >= 64 * nc ? nc : rows <= 0 ? 1 : (rows + 63) / 64;
    return 2 * k + 3;
}

int attn_tiles_schedule(const attn_tiles *t, int batch, int heads, int run, int ctas, int lq,
                        int32_t *items, int32_t *first)
{
    const long long bh = (long long)batch * heads, n = (long long)t->n_groups * bh;
    run = run < 1 ? 1 : run > bh ? (int)bh : run;
    if (ctas < 1 || ctas > 0xffff)
        return 0;
    uint64_t *heap = malloc(sizeof *heap * (size_t)ctas);
    uint16_t *owner = malloc(sizeof *owner * (size_t)(n > 0 ? n : 1));
    int32_t *order = malloc(4 * sizeof *order * (size_t)(n > 0 ? n : 1));
    if (!heap || !owner || !order) {
        free(heap);
        free(owner);
        free(order);
        return 0;
    }
    for (int c = 0; c < ctas; c++)
        heap[c] = (uint64_t)c;
    memset(first, 0, sizeof *first * (size_t)(ctas + 1));
    long long k = 0;
    for (long long r0 = 0; r0 < bh; r0 += run)
        for (int rank = 0; rank < t->n_groups; rank++)
            for (long long x = r0; x < r0 + run && x < bh; x++, k++) {
                const int32_t *w = t->work + 4 * (size_t)rank;
                int32_t *o = order + 4 * k;
                o[0] = w[0], o[1] = w[1], o[2] = w[2];
                o[3] = (int32_t)((x / heads) << 16 | (x % heads));
                const int c = (int)(heap[0] & 0xffff);
                owner[k] = (uint16_t)c;
                first[c + 1]++;
                heap[0] += (uint64_t)((w[2] - w[1] + 1) * attn_tiles_share(t->bm, lq, w[0])) << 16;
                heap_down(heap, ctas);
            }
    for (int c = 0; c < ctas; c++)
        first[c + 1] += first[c];
    /* Each CTA's items in the order dealt; first[] is the cursor meanwhile. */
    for (long long i = 0; i < n; i++)
        memcpy(items + 4 * (size_t)first[owner[i]]++, order + 4 * i, 4 * sizeof *items);
    for (int c = ctas; c > 0; c--)
        first[c] = first[c - 1];
    first[0] = 0;
    free(heap);
    free(owner);
    free(order);
    return 1;
}
