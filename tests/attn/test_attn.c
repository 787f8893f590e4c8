/* CPU suite for attention: the tiles expand back to exactly the mask, the
 * candidate space and the model behave, tuning records round-trip, argument
 * checks come before any device work, and every attention template variant
 * compiles for sm_80 and sm_90a. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attn/attn_tiles.h"
#include "attn/mask.h"
#include "attn/memo.h"
#include "attn/mha.h"
#include "attn/mha_search.h"
#include "attn/model.h"
#include "base/json.h"
#include "cache/cache.h"
#include "ctx.h"
#include "testutil.h"

static stof_ctx *open_ctx(const char *arch)
{
    stof_ctx *ctx;
    stof_options o = {.no_cache = 1, .arch = arch};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    return ctx;
}

/* The tiles as a plan cuts them: from the mask's summary. */
static stof_status tiles_of(stof_ctx *ctx, const stof_mask *m, attn_kind kind, int bm, int bn,
                            attn_tiles *t)
{
    mask_summary ms;
    stof_status st = mask_summarize(ctx, m, &ms);
    if (st == STOF_OK)
        st = attn_tiles_build(ctx, &ms, kind, bm, bn, t);
    mask_summary_free(&ms);
    return st;
}

/* Marks every (q, k) the tiles allow; fails on a key listed twice for a row. */
static unsigned char *expand(const attn_tiles *t, int lq, int lk)
{
    unsigned char *d = calloc((size_t)lq * lk, 1);
    ck_assert_ptr_nonnull(d);
    for (int g = 0; g < t->n_groups; g++)
        for (int i = t->tile_ptr[g]; i < t->tile_ptr[g + 1]; i++)
            for (int r = 0; r < t->bm; r++) {
                int q = t->qidx ? t->qidx[(size_t)g * t->bm + r] : g * t->bm + r;
                if (q < 0 || q >= lq)
                    continue;
                for (int c = 0; c < t->bn; c++) {
                    int k = t->kidx ? t->kidx[(size_t)t->tile_key[i] * t->bn + c] : t->tile_key[i] + c;
                    if (k < 0 || k >= lk)
                        continue;
                    int b = t->tile_bits[i];
                    int on = b < 0 || ((t->bits[((size_t)b * t->bm + r) * t->wpr + c / 32] >> (c % 32)) & 1);
                    if (on) {
                        ck_assert_msg(!d[(size_t)q * lk + k], "(%d, %d) listed twice", q, k);
                        d[(size_t)q * lk + k] = 1;
                    }
                }
            }
    return d;
}

static const char *const SPECS[] = {"dense", "causal", "window:40", "dilated:48:3", "strided:7",
                                    "window:30+strided:5", "random:2:16:9+global:5",
                                    "causal&docs:50,77,30", "causal_window:20+global:3",
                                    "strided:6+global:9"};

START_TEST(tiles_expand_to_the_mask)
{
    test_rng r = test_rng_make(0xa77 + _i);
    stof_ctx *ctx = open_ctx("sm_90a");
    static const int sizes[][3] = {{64, 64, 1}, {128, 64, 2}, {64, 32, 1}, {128, 128, 1}};
    for (int rep = 0; rep < 4; rep++) {
        int l = test_rng_int(&r, 150, 260);
        if (strncmp(SPECS[_i], "causal&docs", 11) == 0)
            l = 157;
        stof_mask *m;
        ck_assert_msg(stof_mask_parse(ctx, SPECS[_i], l, l, &m) == STOF_OK, "%s", stof_last_error(ctx));
        unsigned char *want;
        ck_assert_int_eq(mask_to_dense(m, &want), STOF_OK);
        for (int kind = 0; kind < 2; kind++) {
            const int *s = sizes[test_rng_int(&r, 0, 3)];
            attn_tiles t;
            ck_assert_int_eq(tiles_of(ctx, m, (attn_kind)kind, s[0], s[1], &t), STOF_OK);
            unsigned char *got = expand(&t, l, l);
            for (size_t i = 0; i < (size_t)l * l; i++)
                if (got[i] != want[i])
                    ck_abort_msg("%s kind %d %dx%d L=%d: (%zu, %zu) tiles %d mask %d", SPECS[_i], kind,
                                 s[0], s[1], l, i / l, i % l, got[i], want[i]);
            /* Groups run heaviest first, each exactly once. */
            char *seen = calloc((size_t)t.n_groups, 1);
            for (int i = 0; i < t.n_groups; i++) {
                int g = t.group_order[i];
                ck_assert(g >= 0 && g < t.n_groups && !seen[g]);
                seen[g] = 1;
                if (i > 0) {
                    int p = t.group_order[i - 1];
                    ck_assert_int_ge(t.tile_ptr[p + 1] - t.tile_ptr[p], t.tile_ptr[g + 1] - t.tile_ptr[g]);
                }
                /* Its work record: group, tiles, first key. */
                const int32_t *w = t.work + 4 * (size_t)i;
                ck_assert_int_eq(w[0], g);
                ck_assert_int_eq(w[1], t.tile_ptr[g]);
                ck_assert_int_eq(w[2], t.tile_ptr[g + 1]);
                ck_assert_int_eq(w[3], w[2] > w[1] ? t.tile_key[w[1]] : 0);
            }
            /* The packed arrays hold the same values. */
            attn_tiles_layout lay = attn_tiles_layout_of(&t);
            char *buf = malloc(lay.total);
            attn_tiles_pack(&t, &lay, buf);
            ck_assert_mem_eq(buf + lay.work, t.work, 16 * (size_t)t.n_groups);
            ck_assert_mem_eq(buf + lay.tile_key, t.tile_key, 4 * (size_t)t.n_tiles);
            ck_assert_mem_eq(buf + lay.tile_bits, t.tile_bits, 4 * (size_t)t.n_tiles);
            /* As the cache keeps them: decoded, the same tiles; cut short
             * or with a count changed, no tiles. */
            size_t n = 0;
            unsigned char *enc = attn_tiles_encode(&t, &n);
            ck_assert_ptr_nonnull(enc);
            attn_tiles back;
            ck_assert(attn_tiles_decode(enc, n, &back));
            ck_assert_int_eq(back.n_tiles, t.n_tiles);
            ck_assert_int_eq(back.max_tiles, t.max_tiles);
            ck_assert_int_eq(back.period, t.period);
            ck_assert_int_eq(back.qidx != NULL, t.qidx != NULL);
            attn_tiles_layout lb = attn_tiles_layout_of(&back);
            ck_assert_int_eq(lb.total, lay.total);
            char *again = malloc(lb.total);
            attn_tiles_pack(&back, &lb, again);
            ck_assert_mem_eq(again, buf, lay.total);
            ck_assert_mem_eq(back.group_order, t.group_order, 4 * (size_t)t.n_groups);
            ck_assert_mem_eq(back.tile_ptr, t.tile_ptr, 4 * ((size_t)t.n_groups + 1));
            attn_tiles_free(&back);
            ck_assert(!attn_tiles_decode(enc, n - 4, &back));
            ck_assert(!attn_tiles_decode(enc, 20, &back));
            enc[test_rng_int(&r, 0, 7)] ^= 0x20; /* the magic */
            ck_assert(!attn_tiles_decode(enc, n, &back));
            ck_assert_ptr_null(back.work);
            free(again);
            free(enc);
            free(buf);
            free(seen);
            free(got);
            attn_tiles_free(&t);
        }
        free(want);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

/* The ranking walks the mask once per tile shape and hands that shape's
 * other candidates copies: every candidate's tiles are, byte for byte, the
 * ones its shape builds, and each has arrays of its own. */
START_TEST(rank_shares_tiles_by_shape)
{
    static const char *specs[] = {"causal", "window:64+global:8",
                                  "window:32+global:16+random:3:64:1"};
    stof_ctx *ctx = open_ctx("sm_90a");
    for (int k = 0; k < 3; k++) {
        stof_mask *m;
        ck_assert_int_eq(stof_mask_parse(ctx, specs[k], 517, 517, &m), STOF_OK);
        mask_summary ms;
        ck_assert_int_eq(mask_summarize(ctx, m, &ms), STOF_OK);
        stof_mha_desc d = {.batch = 1, .heads = 2, .seq_q = 517, .seq_k = 517, .head_dim = 64,
                           .dtype = STOF_BF16};
        mha_search_cand cs[MHA_MAX_CANDIDATES];
        int n = 0, copies = 0;
        ck_assert_msg(mha_search_rank(ctx, &d, &ms, 0, cs, &n) == STOF_OK, "%s",
                      stof_last_error(ctx));
        ck_assert_int_gt(n, 4);
        for (int i = 0; i < n; i++) {
            attn_tiles t;
            ck_assert_int_eq(attn_tiles_build(ctx, &ms, cs[i].c.kind, cs[i].c.bm, cs[i].c.bn, &t),
                             STOF_OK);
            size_t na = 0, nb = 0;
            unsigned char *a = attn_tiles_encode(&t, &na), *b = attn_tiles_encode(&cs[i].tiles, &nb);
            ck_assert_ptr_nonnull(a);
            ck_assert_ptr_nonnull(b);
            ck_assert_int_eq(na, nb);
            ck_assert_mem_eq(a, b, na);
            free(a);
            free(b);
            attn_tiles_free(&t);
            for (int j = 0; j < i; j++) {
                if (cs[j].c.kind == cs[i].c.kind && cs[j].c.bm == cs[i].c.bm &&
                    cs[j].c.bn == cs[i].c.bn) {
                    ck_assert_ptr_ne(cs[j].tiles.tile_key, cs[i].tiles.tile_key);
                    ck_assert_ptr_ne(cs[j].tiles.work, cs[i].tiles.work);
                    copies++;
                    break;
                }
            }
        }
        ck_assert_int_gt(copies, 0);
        mha_search_free(cs, n);
        mask_summary_free(&ms);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

/* The cache keeps a spec mask's hash under its spec and sizes, and tiles
 * under the hash and their shape; a mask built from a matrix has no spec
 * to key it by, and other sizes or shapes miss. */
START_TEST(memo_keeps_hash_and_tiles)
{
    char *dir = test_tmpdir(), path[1200];
    snprintf(path, sizeof path, "%s/c.db", dir);
    stof_options o = {.cache_path = path, .arch = "sm_90a"};
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    stof_mask *m, *other, *dense;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:30+strided:5", 190, 190, &m), STOF_OK);
    ck_assert_int_eq(stof_mask_parse(ctx, "window:30+strided:5", 190, 191, &other), STOF_OK);
    unsigned char *bits;
    ck_assert_int_eq(mask_to_dense(m, &bits), STOF_OK);
    ck_assert_int_eq(stof_mask_from_dense(ctx, bits, 190, 190, &dense), STOF_OK);
    char want[65], got[65];
    ck_assert_int_eq(stof_mask_hash(m, want), STOF_OK);
    ck_assert(!memo_mask_hash(ctx, m, got));
    memo_put_mask_hash(ctx, m, want);
    memo_put_mask_hash(ctx, dense, want);
    attn_tiles t, back;
    ck_assert_int_eq(tiles_of(ctx, m, ATTN_GATHER, 64, 32, &t), STOF_OK);
    memo_put_tiles(ctx, want, &t);
    stof_close(ctx);

    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    char before[512];
    snprintf(before, sizeof before, "%s", stof_last_error(ctx));
    ck_assert(memo_mask_hash(ctx, m, got));
    ck_assert_str_eq(got, want);
    ck_assert(!memo_mask_hash(ctx, other, got));
    ck_assert(!memo_mask_hash(ctx, dense, got));
    ck_assert(memo_tiles(ctx, want, ATTN_GATHER, 64, 32, &back));
    ck_assert_int_eq(back.n_tiles, t.n_tiles);
    ck_assert_mem_eq(back.kidx, t.kidx, 4 * (size_t)t.n_kidx_tiles * (size_t)t.bn);
    attn_tiles_free(&back);
    ck_assert(!memo_tiles(ctx, want, ATTN_GATHER, 64, 64, &back));
    ck_assert(!memo_tiles(ctx, want, ATTN_BLOCK, 64, 32, &back));
    ck_assert_str_eq(stof_last_error(ctx), before); /* misses are not errors */
    attn_tiles_free(&t);
    stof_mask_free(m);
    stof_mask_free(other);
    stof_mask_free(dense);
    free(bits);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* Gathering compacts a scattered mask: fewer tiles than blocks. */
/* The persistent grid's deal: every (group, batch, head) exactly once,
 * each CTA's items in the order dealt, the runs of heads kept, and no CTA
 * with more work than the least loaded one plus one item; with lq, an item
 * whose last consumers sit out (192-row groups at 1000 rows) weighs as its
 * working consumers. */
START_TEST(schedule_deals_every_item_once)
{
    stof_ctx *ctx = open_ctx(NULL);
    static const char *const specs[] = {"causal", "window:256+global:64", "dense", "docs:300,700"};
    for (int v = 0; v < 12; v++) {
        const int s = v % 4, bm = v < 4 ? 128 : 192, lq = v < 8 ? 0 : 1000;
        stof_mask *m;
        ck_assert_int_eq(stof_mask_parse(ctx, specs[s], 1000, 1000, &m), STOF_OK);
        attn_tiles t;
        ck_assert_int_eq(tiles_of(ctx, m, ATTN_BLOCK, bm, 128, &t), STOF_OK);
        const int B = 3, H = 5, bh = B * H, n = t.n_groups * bh, ctas = s == 2 ? n + 7 : 13;
        const int real = ctas < n ? ctas : n, nc = bm / 64;
        int32_t *items = malloc(16 * (size_t)n), *first = malloc(4 * (size_t)(real + 1));
        ck_assert(items && first);
        ck_assert(attn_tiles_schedule(&t, B, H, 4, real, lq, items, first));
        ck_assert_int_eq(first[0], 0);
        ck_assert_int_eq(first[real], n);
        unsigned char *seen = calloc((size_t)n, 1);
        long long lo = 1LL << 60, hi = 0, heaviest = 0, light = 0;
        for (int c = 0; c < real; c++) {
            ck_assert_int_le(first[c], first[c + 1]);
            long long load = 0;
            int last_run = -1;
            for (int i = first[c]; i < first[c + 1]; i++) {
                const int32_t *w = items + 4 * (size_t)i;
                const int b = w[3] >> 16, h = w[3] & 0xffff, x = b * H + h;
                ck_assert(b < B && h < H && w[0] >= 0 && w[0] < t.n_groups);
                ck_assert_int_eq(w[1], t.tile_ptr[w[0]]);
                ck_assert_int_eq(w[2], t.tile_ptr[w[0] + 1]);
                const int id = w[0] * bh + x;
                ck_assert_msg(!seen[id], "%s: item %d dealt twice", specs[s], id);
                seen[id] = 1;
                ck_assert_int_ge(x / 4, last_run); /* runs of 4 heads, in order */
                last_run = x / 4;
                /* 1000 rows: the last 192-row group has 40, one consumer's */
                const int working = lq && (w[0] + 1) * bm > lq ? (lq - w[0] * bm + 63) / 64 : nc;
                ck_assert_int_eq(attn_tiles_share(bm, lq, w[0]), 2 * working + 3);
                const long long wt = (long long)(w[2] - w[1] + 1) * (2 * working + 3);
                light += working < nc;
                load += wt;
                heaviest = wt > heaviest ? wt : heaviest;
            }
            lo = load < lo ? load : lo;
            hi = load > hi ? load : hi;
        }
        for (int i = 0; i < n; i++)
            ck_assert_msg(seen[i], "%s: item %d not dealt", specs[s], i);
        ck_assert_msg(hi - lo <= heaviest, "%s bm %d lq %d: loads %lld .. %lld, heaviest item %lld",
                      specs[s], bm, lq, lo, hi, heaviest);
        ck_assert_int_eq(light, lq ? bh : 0);
        free(seen);
        free(items);
        free(first);
        attn_tiles_free(&t);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

START_TEST(gather_compacts_scattered_masks)
{
    stof_ctx *ctx = open_ctx("sm_90a");
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:128+strided:8", 2048, 2048, &m), STOF_OK);
    attn_tiles b, g;
    ck_assert_int_eq(tiles_of(ctx, m, ATTN_BLOCK, 64, 64, &b), STOF_OK);
    ck_assert_int_eq(tiles_of(ctx, m, ATTN_GATHER, 64, 64, &g), STOF_OK);
    ck_assert_int_lt(g.n_tiles * 2, b.n_tiles);
    /* Each distinct key list and bitmap is kept once (the groups of a
     * regular mask repeat them), and a full tile has no bitmap. */
    ck_assert_int_lt(g.n_bitmaps * 4, g.n_tiles);
    ck_assert_int_lt(g.n_kidx_tiles, g.n_tiles);
    const size_t words = (size_t)g.bm * g.wpr;
    for (long long i = 0; i < g.n_bitmaps; i++)
        for (long long j = 0; j < i; j++)
            ck_assert(memcmp(g.bits + i * words, g.bits + j * words, 4 * words) != 0);
    for (long long i = 0; i < g.n_kidx_tiles; i++)
        for (long long j = 0; j < i; j++)
            ck_assert(memcmp(g.kidx + i * g.bn, g.kidx + j * g.bn, 4 * (size_t)g.bn) != 0);
    model_device md = model_device_of(NULL, "sm_90a");
    ck_assert(model_attn_ms(&md, &g, 96, 64, 1, 0) < model_attn_ms(&md, &b, 96, 64, 1, 0));
    ck_assert(model_attn_ms(&md, &b, 96, 64, 1, 1) < model_attn_ms(&md, &b, 96, 64, 1, 0));
    attn_tiles_free(&b);
    attn_tiles_free(&g);
    stof_mask_free(m);
    /* A dilated mask groups rows by residue: one residue's keys are half. */
    ck_assert_int_eq(stof_mask_parse(ctx, "dilated:256:2", 2048, 2048, &m), STOF_OK);
    ck_assert_int_eq(tiles_of(ctx, m, ATTN_GATHER, 64, 64, &g), STOF_OK);
    ck_assert_int_eq(g.period, 2);
    ck_assert_int_eq(tiles_of(ctx, m, ATTN_BLOCK, 64, 64, &b), STOF_OK);
    ck_assert_int_lt(g.n_tiles * 3, b.n_tiles * 2);
    attn_tiles_free(&b);
    attn_tiles_free(&g);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* Gathered tiles read as residue classes (attn_tiles_view_period): where
 * every group's rows and every tile's keys step by the mask's period and the
 * period divides both lengths; the rewrite gives each item its first row
 * and each tile its first key. */
START_TEST(gather_view_by_period)
{
    stof_ctx *ctx = open_ctx("sm_90a");
    static const struct {
        const char *spec;
        int lq, lk, bn, want;
    } cases[] = {
        {"dilated:256:2", 2048, 2048, 128, 2},
        {"dilated:64:4", 512, 1024, 64, 4},
        {"dilated:64:2", 1000, 1000, 128, 2},  /* a residue's last group padded */
        {"dilated:64:3", 1536, 1536, 128, 3},
        {"dilated:64:3", 1155, 1155, 128, 3},
        {"dilated:64:3", 1153, 1152, 128, 1},  /* 3 does not divide lq */
        {"dilated:64:3", 1152, 1153, 128, 1},  /* 3 does not divide lk */
        {"dilated:64:2+global:8", 1024, 1024, 64, 1},  /* both residues' global keys */
        {"window:64+strided:8", 1024, 1024, 64, 1},    /* period 1 */
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        stof_mask *m;
        ck_assert_int_eq(stof_mask_parse(ctx, cases[i].spec, cases[i].lq, cases[i].lk, &m), STOF_OK);
        attn_tiles g, b;
        ck_assert_int_eq(tiles_of(ctx, m, ATTN_GATHER, 128, cases[i].bn, &g), STOF_OK);
        ck_assert_msg(attn_tiles_view_period(&g, cases[i].lq, cases[i].lk) == cases[i].want,
                      "%s %dx%d: period %d", cases[i].spec, cases[i].lq, cases[i].lk,
                      attn_tiles_view_period(&g, cases[i].lq, cases[i].lk));
        ck_assert_int_eq(tiles_of(ctx, m, ATTN_BLOCK, 128, cases[i].bn, &b), STOF_OK);
        ck_assert_int_eq(attn_tiles_view_period(&b, cases[i].lq, cases[i].lk), 1);
        mha_candidate ws = {ATTN_GATHER, 128, cases[i].bn, 1, 0, MHA_WS, 3},
                      wg = {ATTN_GATHER, 128, 64, 1, 0, 1, 3};
        ck_assert_int_eq(mha_view_period(&ws, &g, cases[i].lq, cases[i].lk), cases[i].want);
        ck_assert_int_eq(mha_view_period(&wg, &g, cases[i].lq, cases[i].lk), 1);
        if (cases[i].want > 1) {
            /* Every row and key of the view is the one the lists name. */
            const int p = cases[i].want;
            int32_t *items = malloc(4 * sizeof *items * (size_t)g.n_groups);
            int32_t *keys = malloc(sizeof *keys * (size_t)g.n_tiles);
            ck_assert(items && keys);
            for (int x = 0; x < g.n_groups; x++)
                items[4 * x] = x;
            memcpy(keys, g.tile_key, sizeof *keys * (size_t)g.n_tiles);
            attn_tiles_view(&g, items, g.n_groups, keys);
            for (int x = 0; x < g.n_groups; x++)
                for (int r = 0; r < g.bm; r++) {
                    int q = g.qidx[(size_t)x * g.bm + r];
                    ck_assert(q < 0 ? items[4 * x] + p * r >= cases[i].lq
                                    : q == items[4 * x] + p * r);
                }
            for (long long j = 0; j < g.n_tiles; j++)
                for (int c = 0; c < g.bn; c++) {
                    int k = g.kidx[(size_t)g.tile_key[j] * g.bn + c];
                    ck_assert(k < 0 ? g.tile_bits[j] >= 0 : k == keys[j] + p * c);
                }
            free(items);
            free(keys);
        }
        attn_tiles_free(&g);
        attn_tiles_free(&b);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

/* The device's figures as a cache record: they come back as written, the
 * model follows the measured rate of the engine it is asked about, and
 * records that are not valid figures are refused. */
START_TEST(model_device_record)
{
    model_device m = {132, 1980, 240.5, 401.2, 470.5, 2950, 1}, back;
    char *rec = model_device_format(&m, "GPU \"quoted\"\n");
    ck_assert_ptr_nonnull(rec);
    ck_assert_int_eq(model_device_parse(rec, &back), 1);
    free(rec);
    ck_assert_int_eq(back.sm_count, 132);
    ck_assert_int_eq(back.clock_mhz, 1980);
    ck_assert_double_eq_tol(back.mma_tflops, 240.5, 1e-9);
    ck_assert_double_eq_tol(back.wgmma_tflops, 401.2, 1e-9);
    ck_assert_double_eq_tol(back.ws_tflops, 470.5, 1e-9);
    ck_assert_double_eq_tol(back.mem_gbs, 2950, 1e-9);
    ck_assert_int_eq(back.measured, 1);

    stof_ctx *ctx = open_ctx("sm_90a");
    stof_mask *mk;
    ck_assert_int_eq(stof_mask_parse(ctx, "dense", 2048, 2048, &mk), STOF_OK);
    attn_tiles t;
    ck_assert_int_eq(tiles_of(ctx, mk, ATTN_BLOCK, 128, 64, &t), STOF_OK);
    double wg = model_attn_ms(&m, &t, 96, 64, 1, 1), mma = model_attn_ms(&m, &t, 96, 64, 1, 0);
    model_device faster = m;
    faster.wgmma_tflops *= 2;
    double wg2 = model_attn_ms(&faster, &t, 96, 64, 1, 1);
    ck_assert_msg(wg < mma && wg2 < 0.6 * wg, "wgmma %.4f, mma.sync %.4f, twice the rate %.4f",
                  wg, mma, wg2);
    ck_assert(model_attn_ms(&m, &t, 96, 64, 1, MHA_WS) < wg);
    attn_tiles_free(&t);
    stof_mask_free(mk);
    stof_close(ctx);

    static const char *const bad[] = {
        "", "not json", "[]", "{}",
        "{\"sm_count\":132,\"clock_mhz\":1,\"mma_tflops\":100,\"wgmma_tflops\":0,\"mem_gbs\":1}",
        /* written before the warp-specialized engine: measured again */
        "{\"sm_count\":132,\"clock_mhz\":1,\"mma_tflops\":100,\"wgmma_tflops\":0,\"mem_gbs\":1,"
        "\"measured\":1}",
        "{\"sm_count\":0,\"clock_mhz\":1,\"mma_tflops\":100,\"wgmma_tflops\":0,\"ws_tflops\":0,\"mem_gbs\":1,"
        "\"measured\":1}",
        "{\"sm_count\":132,\"clock_mhz\":1,\"mma_tflops\":-5,\"wgmma_tflops\":0,\"ws_tflops\":0,\"mem_gbs\":1,"
        "\"measured\":1}",
        "{\"sm_count\":132,\"clock_mhz\":1,\"mma_tflops\":\"fast\",\"wgmma_tflops\":0,\"ws_tflops\":0,"
        "\"mem_gbs\":1,\"measured\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(!model_device_parse(bad[i], &back), "accepted: %s", bad[i]);
    ck_assert(!model_device_parse(NULL, &back));
}
END_TEST

START_TEST(model_scales_with_work)
{
    stof_ctx *ctx = open_ctx("sm_90a");
    model_device md = model_device_of(NULL, "sm_90a");
    ck_assert_int_eq(md.sm_count, 132);
    double last = 0;
    for (int w = 256; w <= 2048; w *= 2) {
        char spec[32];
        snprintf(spec, sizeof spec, "window:%d", w);
        stof_mask *m;
        ck_assert_int_eq(stof_mask_parse(ctx, spec, 4096, 4096, &m), STOF_OK);
        attn_tiles t;
        ck_assert_int_eq(tiles_of(ctx, m, ATTN_BLOCK, 64, 64, &t), STOF_OK);
        double ms = model_attn_ms(&md, &t, 96, 64, 1, 0);
        ck_assert_msg(ms > last * 1.3, "window %d: %.4f ms after %.4f", w, ms, last);
        last = ms;
        /* More heads, proportionally more time once the GPU is full. */
        double ms2 = model_attn_ms(&md, &t, 192, 64, 1, 0);
        ck_assert(ms2 > 1.8 * ms && ms2 < 2.2 * ms);
        attn_tiles_free(&t);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

START_TEST(candidates_fit_the_device)
{
    static const int dims[] = {32, 64, 80, 96, 128};
    for (int i = 0; i < 5; i++) {
        mha_candidate c[64];
        int n = mha_candidates(dims[i], 227 * 1024, 0, c, 64);
        ck_assert_int_ge(n, 8);
        for (int j = 0; j < n; j++)
            ck_assert_int_eq(c[j].wg, 0);
        int nwg = mha_candidates(dims[i], 227 * 1024, 1, c, 64), wg = 0, p_smem = 0, k144 = 0;
        /* The planner's arrays hold every candidate: none is cut off. */
        ck_assert_int_le(nwg, MHA_MAX_CANDIDATES);
        ck_assert_int_lt(nwg, 64);
        for (int j = 0; j < nwg; j++) {
            wg += c[j].wg;
            p_smem += c[j].qs && c[j].wg == MHA_WS;
            if (c[j].wg == MHA_WS) { /* two or three consumers and a producer; gathered
                                        rows: two, head_dim 64 or 128, P in registers */
                ck_assert(c[j].kind == ATTN_BLOCK ||
                          (c[j].bm == 128 && c[j].bn <= 128 && !c[j].qs && dims[i] % 64 == 0));
                ck_assert(c[j].bm == 128 || c[j].bm == 192);
                ck_assert(c[j].bn == 64 || c[j].bn == 128 || c[j].bn == 192 ||
                          (c[j].bn == 96 && dims[i] > 64) || c[j].bn == 144);
                /* 144 keys: 192 rows at head_dim 80 and 96, P (and O) in
                 * shared memory, which fits only with O staged in P's tile */
                if (c[j].bn == 144) {
                    ck_assert(c[j].bm == 192 && c[j].qs && (dims[i] == 80 || dims[i] == 96));
                    k144++;
                }
                ck_assert_int_eq(mha_threads(&c[j]), 2 * c[j].bm + 128);
            } else if (c[j].wg) {
                ck_assert_int_eq(c[j].bm % 64, 0);
                ck_assert(c[j].bn == 64 || c[j].bn == 128);
                ck_assert_int_eq(mha_threads(&c[j]), 2 * c[j].bm);
            }
            if (c[j].wg) {
                /* head_dim 80 and 96: the warp-specialized engine only, P
                 * through shared memory only on 192-row items there */
                ck_assert(dims[i] % 64 == 0 || (c[j].wg == MHA_WS && dims[i] >= 64));
                ck_assert(!c[j].qs || (c[j].wg == MHA_WS && c[j].bm == 192 && dims[i] > 64));
                ck_assert(c[j].st >= 2 && c[j].st <= 4);
                ck_assert_int_le(mha_smem_bytes(&c[j], dims[i], 0), 227 * 1024);
                /* a varlen kernel's too (every candidate leaves room for it) */
                ck_assert_int_le(mha_smem_bytes(&c[j], dims[i], 1), 227 * 1024);
                ck_assert_int_eq(mha_smem_bytes(&c[j], dims[i], 1) -
                                     mha_smem_bytes(&c[j], dims[i], 0),
                                 c[j].wg == MHA_WS ? 16 * (c[j].bm == 128 && c[j].bn == 128 &&
                                                           c[j].st >= 3 ? 2 : 1) : 0);
            }
        }
        ck_assert_int_eq(p_smem > 0, dims[i] == 80 || dims[i] == 96);
        ck_assert_int_eq(k144, dims[i] == 80 || dims[i] == 96);
        if (dims[i] % 64 == 0)
            ck_assert_int_ge(wg, 8);
        else if (dims[i] > 64)
            ck_assert_int_ge(wg, 2 * MHA_WS);
        else
            ck_assert_int_eq(wg, 0);
        int small = mha_candidates(dims[i], 48 * 1024, 1, c, 64);
        ck_assert_int_lt(small, nwg);
        for (int j = 0; j < small; j++) {
            ck_assert_int_le(mha_smem_bytes(&c[j], dims[i], 0), 48 * 1024);
            ck_assert_int_eq(c[j].bm % (16 * c[j].mt), 0);
            ck_assert(c[j].wg || !(dims[i] > 64 && (c[j].bn == 128 || (c[j].mt == 2 && !c[j].qs))));
        }
    }
}
END_TEST

/* A forced wgmma plan where there is no warpgroup MMA, or whose tile does
 * not fit in shared memory, fails cleanly, before any device work. */
START_TEST(wgmma_needs_sm90a)
{
    stof_ctx *ctx = open_ctx("sm_80");
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 256, 256, &m), STOF_OK);
    stof_mha_desc d = {.batch = 1, .heads = 1, .seq_q = 256, .seq_k = 256, .head_dim = 64,
                       .dtype = STOF_F16};
    mha_candidate c = {ATTN_BLOCK, 128, 64, 1, 0, 1, 4};
    stof_mha_plan *p = (stof_mha_plan *)1;
    ck_assert_int_eq(mha_plan_forced(ctx, &d, m, &c, &p), STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_null(p);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "sm_90a"));
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "sm_80"));
    stof_mask_free(m);
    stof_close(ctx);
    ctx = open_ctx("sm_90a");
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 256, 256, &m), STOF_OK);
    d.head_dim = 96;
    ck_assert_int_eq(mha_plan_forced(ctx, &d, m, &c, &p), STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "head_dim 96"));
    /* A tile that does not fit the block's shared memory, named as such
     * rather than left for the driver to refuse at launch. */
    mha_candidate big = {ATTN_BLOCK, 128, 192, 1, 0, MHA_WS, 4};
    d.head_dim = 128;
    ck_assert_int_gt(mha_smem_bytes(&big, 128, 0), 227 * 1024);
    ck_assert_int_eq(mha_plan_forced(ctx, &d, m, &big, &p), STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_null(p);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "shared memory"));
    /* Gathered rows on the warp-specialized engine: 128-row groups at
     * head_dim 64 and 128 only, said before any device work. */
    mha_candidate g192 = {ATTN_GATHER, 192, 128, 1, 0, MHA_WS, 2};
    ck_assert_int_eq(mha_plan_forced(ctx, &d, m, &g192, &p), STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_null(p);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "groups of 128 rows"));
    mha_candidate g128 = {ATTN_GATHER, 128, 128, 1, 0, MHA_WS, 2};
    d.head_dim = 96;
    ck_assert_int_eq(mha_plan_forced(ctx, &d, m, &g128, &p), STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "head_dim 64 or 128"));
    /* ... and they are candidates there, beside the block kind's. */
    mha_candidate cs[64];
    int n = mha_candidates(64, 227 * 1024, 1, cs, 64), gathered = 0;
    for (int i = 0; i < n; i++)
        if (cs[i].wg == MHA_WS && cs[i].kind == ATTN_GATHER) {
            ck_assert_int_eq(cs[i].bm, 128);
            ck_assert_int_eq(cs[i].qs, 0);
            gathered++;
        }
    ck_assert_int_ge(gathered, 3);
    n = mha_candidates(96, 227 * 1024, 1, cs, 64);
    for (int i = 0; i < n; i++)
        ck_assert(!(cs[i].wg == MHA_WS && cs[i].kind == ATTN_GATHER));
    /* Varlen: refused on the warp-specialized engine's 192-row and gathered
     * items before any device work, rendered by every engine's request
     * where asked (and by none unasked). */
    mha_candidate ws = {ATTN_BLOCK, 192, 128, 1, 0, MHA_WS, 2};
    stof_mha_desc dv = {.batch = 3, .heads = 4, .seq_q = 256, .seq_k = 256, .head_dim = 64,
                        .dtype = STOF_F16, .layout = STOF_LAYOUT_BLHD, .varlen = 1};
    ck_assert_int_eq(mha_plan_forced(ctx, &dv, m, &ws, &p), STOF_ERR_UNSUPPORTED);
    ck_assert_ptr_null(p);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "128-row block items only"));
    n = mha_candidates(64, 227 * 1024, 1, cs, 64);
    int ws_varlen = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(mha_takes_varlen(&cs[i]),
                         cs[i].wg != MHA_WS || (cs[i].bm == 128 && cs[i].kind == ATTN_BLOCK));
        ws_varlen += cs[i].wg == MHA_WS && mha_takes_varlen(&cs[i]);
        for (int vl = 0; vl < 2; vl++) {
            mha_request r;
            mha_make_request(&cs[i], 64, 256, STOF_F16, 1, (mha_mods){0}, vl, 1, &r);
            const char *val = NULL;
            for (int k = 0; k < r.req.nvars; k++)
                if (strcmp(r.req.vars[k].name, "VARLEN") == 0)
                    val = r.req.vars[k].value;
            ck_assert_ptr_nonnull(val);
            ck_assert_str_eq(val, vl ? "1" : "0");
        }
    }
    ck_assert_int_ge(ws_varlen, 4);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

START_TEST(tuning_record_round_trip)
{
    mha_tried t[3] = {{{ATTN_BLOCK, 64, 64, 1, 0, 0, 0}, 0.5, 0.61, "ok"},
                      {{ATTN_GATHER, 128, 32, 2, 1, 0, 0}, 0.4, 0.52, "ok"},
                      {{ATTN_BLOCK, 192, 64, 1, 0, 1, 3}, 0.7, 0, NULL}};
    char *rec = mha_record_format(t, 3, 1, "0123abcd", "fast", "window:256+global:64");
    ck_assert_ptr_nonnull(rec);
    ck_assert_ptr_nonnull(strstr(rec, "\"mask\":\"window:256+global:64\""));
    json_value *js = json_parse(rec, strlen(rec), NULL);
    ck_assert_ptr_nonnull(js);
    ck_assert_str_eq(json_get(js, "mask")->str, "window:256+global:64");
    ck_assert_uint_eq(json_get(js, "tried")->n, 3);
    json_free(js);
    ck_assert_ptr_nonnull(strstr(rec, "\"verdict\":\"ok\""));
    ck_assert_ptr_nonnull(strstr(rec, "\"kernel\":\"0123abcd\""));
    mha_candidate c;
    double ms, pred;
    ck_assert(mha_record_parse(rec, &c, &ms, &pred));
    ck_assert_int_eq(c.kind, ATTN_GATHER);
    ck_assert_int_eq(c.bm, 128);
    ck_assert_int_eq(c.bn, 32);
    ck_assert_int_eq(c.mt, 2);
    ck_assert_int_eq(c.qs, 1);
    ck_assert_int_eq(c.wg, 0);
    ck_assert_double_eq_tol(ms, 0.52, 1e-9);
    ck_assert_double_eq_tol(pred, 0.4, 1e-9);
    free(rec);
    rec = mha_record_format(t, 3, 2, "4567", "full", NULL);
    ck_assert_ptr_null(strstr(rec, "\"mask\""));
    ck_assert(mha_record_parse(rec, &c, &ms, &pred));
    ck_assert_int_eq(c.wg, 1);
    ck_assert_int_eq(c.bm, 192);
    ck_assert_int_eq(c.bn, 64);
    ck_assert_int_eq(c.st, 3);
    /* The winner's kernel key is trusted only under the source id it was
     * recorded with: not after a template or option change, not while the
     * templates come from a folder, and never a key that is not one. */
    char key[65], want[65], id[17];
    memset(want, 'a', 64);
    want[64] = 0;
    ck_assert(!mha_record_kernel(rec, key)); /* "4567" */
    free(rec);
    rec = mha_record_format(t, 3, 0, want, "fast", NULL);
    ck_assert(jit_source_id(id));
    ck_assert_ptr_nonnull(strstr(rec, id));
    ck_assert(mha_record_kernel(rec, key));
    ck_assert_str_eq(key, want);
    char *other = strdup(rec);
    char *at = strstr(other, id);
    at[0] = at[0] == '0' ? '1' : '0';
    ck_assert(!mha_record_kernel(other, key));
    free(other);
    char *dir = test_tmpdir();
    setenv("STOF_TEMPLATE_DIR", dir, 1);
    ck_assert(!jit_source_id(id));
    ck_assert(!mha_record_kernel(rec, key));
    free(rec);
    rec = mha_record_format(t, 3, 0, want, "fast", NULL);
    ck_assert_ptr_null(strstr(rec, "\"source\""));
    unsetenv("STOF_TEMPLATE_DIR");
    ck_assert(!mha_record_kernel(rec, key));
    test_rmtree(dir);
    free(dir);
    free(rec);
    ck_assert(!mha_record_kernel(NULL, key));
    ck_assert(!mha_record_parse("{\"winner\":{\"kind\":\"magic\"}}", &c, &ms, &pred));
    ck_assert(!mha_record_parse("not json", &c, &ms, &pred));
    ck_assert(!mha_record_parse(NULL, &c, &ms, &pred));
    /* The warp-specialized engine's winners: P through shared memory, and
     * 96-key tiles; not a P flag past 1, nor keys it has no product for. */
    mha_tried ws[2] = {{{ATTN_BLOCK, 192, 128, 1, 1, MHA_WS, 2}, 0.3, 0.4, "ok"},
                       {{ATTN_BLOCK, 192, 96, 1, 0, MHA_WS, 2}, 0.3, 0.35, "ok"}};
    for (int w = 0; w < 2; w++) {
        rec = mha_record_format(ws, 2, w, "89ab", "fast", NULL);
        ck_assert(mha_record_parse(rec, &c, &ms, &pred));
        ck_assert_int_eq(c.wg, MHA_WS);
        ck_assert_int_eq(c.bm, 192);
        ck_assert_int_eq(c.bn, ws[w].c.bn);
        ck_assert_int_eq(c.qs, ws[w].c.qs);
        free(rec);
    }
    ck_assert(!mha_record_parse("{\"winner\":{\"kind\":\"block\",\"bm\":192,\"bn\":128,\"mt\":1,"
                                "\"qs\":2,\"wg\":2,\"st\":2,\"ms\":0.4,\"predicted_ms\":0.3",
                                &c, &ms, &pred));
    ck_assert(!mha_record_parse("{\"winner\":{\"kind\":\"block\",\"bm\":192,\"bn\":80,\"mt\":1,"
                                "\"qs\":0,\"wg\":2,\"st\":2,\"ms\":0.4,\"predicted_ms\":0.3",
                                &c, &ms, &pred));
    ck_assert(mha_record_parse("{\"winner\":{\"kind\":\"block\",\"bm\":192,\"bn\":96,\"mt\":1,"
                               "\"qs\":0,\"wg\":2,\"st\":2,\"ms\":0.4,\"predicted_ms\":0.3",
                               &c, &ms, &pred));
}
END_TEST

START_TEST(bad_arguments_before_the_device)
{
    stof_ctx *ctx = open_ctx(NULL);
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:64", 256, 256, &m), STOF_OK);
    stof_mha_desc ok = {.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64,
                        .dtype = STOF_F16};
    stof_mha_plan *p = (stof_mha_plan *)1;
    struct {
        stof_mha_desc d;
        stof_status want;
        const char *says;
    } bad[] = {
        {{.batch = 0, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16},
         STOF_ERR_INVALID_ARG, "positive"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 72, .dtype = STOF_F16},
         STOF_ERR_UNSUPPORTED, "head_dim 72"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F32},
         STOF_ERR_UNSUPPORTED, "dtype"},
        {{.batch = 2, .heads = 2, .seq_q = 255, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16},
         STOF_ERR_INVALID_ARG, "mask is 256 x 256"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .qkv_packed = 1}, STOF_ERR_INVALID_ARG, "qkv_packed"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .layout = 7}, STOF_ERR_INVALID_ARG, "layout"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .scale = -1}, STOF_ERR_INVALID_ARG, "scale"},
        /* grouped KV heads: a divisor of heads, packed QKV or not */
        {{.batch = 2, .heads = 8, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .kv_heads = 3}, STOF_ERR_INVALID_ARG, "desc.kv_heads 3"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .kv_heads = 4}, STOF_ERR_INVALID_ARG, "desc.kv_heads 4"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .kv_heads = -1}, STOF_ERR_INVALID_ARG, "desc.kv_heads -1"},
        {{.batch = 2, .heads = 8, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .layout = STOF_LAYOUT_BLHD, .qkv_packed = 1, .kv_heads = 3},
         STOF_ERR_INVALID_ARG, "desc.kv_heads 3 must be 0 or divide desc.heads 8"},
        /* the softcap: 0 (off) or finite and positive */
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .softcap = -30}, STOF_ERR_INVALID_ARG, "desc.softcap"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .softcap = NAN}, STOF_ERR_INVALID_ARG, "desc.softcap"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .softcap = INFINITY}, STOF_ERR_INVALID_ARG, "desc.softcap"},
        /* ALiBi's slopes only with alibi; 0 to 4096 buckets, a table only with them
         * (a NULL table with buckets is refused by the run: plans take shapes) */
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .alibi_slopes = (const float *)16}, STOF_ERR_INVALID_ARG, "desc.alibi_slopes"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .bias_buckets = -1}, STOF_ERR_INVALID_ARG, "desc.bias_buckets"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .bias_buckets = 4097, .bias_table = (const float *)16}, STOF_ERR_INVALID_ARG,
         "desc.bias_buckets must be 0 (off) to 4096, got 4097"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .bias_table = (const float *)16}, STOF_ERR_INVALID_ARG, "desc.bias_table"},
        /* packed variable-length sequences: rows back to back (BLHD), not packed QKV */
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .varlen = 1}, STOF_ERR_INVALID_ARG, "desc.varlen needs layout STOF_LAYOUT_BLHD"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .layout = STOF_LAYOUT_BHLD, .varlen = 1}, STOF_ERR_INVALID_ARG, "desc.varlen"},
        {{.batch = 2, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64, .dtype = STOF_F16,
          .layout = STOF_LAYOUT_BLHD, .qkv_packed = 1, .varlen = 1}, STOF_ERR_INVALID_ARG,
         "qkv_packed 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(stof_mha_plan_create(ctx, &bad[i].d, m, &p), bad[i].want);
        ck_assert_ptr_null(p);
        ck_assert_msg(strstr(stof_last_error(ctx), bad[i].says), "case %zu: %s", i, stof_last_error(ctx));
        ck_assert_int_eq(stof_mha_prepare(ctx, &bad[i].d, m), bad[i].want);
    }
    ck_assert_int_eq(stof_mha_plan_create(ctx, NULL, m, &p), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mha_plan_create(ctx, &ok, NULL, &p), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "mask"));
    ck_assert_int_eq(stof_mha_plan_create(ctx, &ok, m, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mha_run(NULL, NULL, NULL, NULL, NULL, NULL, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mha_run_varlen(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 0, 0, NULL),
                     STOF_ERR_INVALID_ARG);
    char buf[8];
    ck_assert_int_eq(stof_mha_plan_describe(NULL, buf, sizeof buf), STOF_ERR_INVALID_ARG);
    stof_mha_plan_free(NULL);
    int has = 1;
    stof_device_info(ctx, &has, NULL, 0, NULL, 0);
    if (!has) {
        ck_assert_int_eq(stof_mha_plan_create(ctx, &ok, m, &p), STOF_ERR_NO_DEVICE);
        ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "GPU"));
        /* packed QKV with grouped KV heads ([B, L, H + 2 KVH, D]) passes the checks */
        stof_mha_desc gqa = ok;
        gqa.layout = STOF_LAYOUT_BLHD, gqa.qkv_packed = 1, gqa.kv_heads = 1;
        ck_assert_int_eq(stof_mha_plan_create(ctx, &gqa, m, &p), STOF_ERR_NO_DEVICE);
    }
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

/* Compile-only preparation fills a cache; a second context finds it all. */
START_TEST(prepare_fills_the_cache)
{
    char *dir = test_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/cache.db", dir);
    stof_options o = {.cache_path = path, .arch = "sm_90a"};
    stof_ctx *ctx;
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "window:64+strided:8", 512, 512, &m), STOF_OK);
    stof_mha_desc d = {.batch = 2, .heads = 4, .seq_q = 512, .seq_k = 512, .head_dim = 64,
                       .dtype = STOF_BF16};
    ck_assert_msg(stof_mha_prepare(ctx, &d, m) == STOF_OK, "%s", stof_last_error(ctx));
    stof_stats s1;
    stof_get_stats(ctx, &s1);
    ck_assert_int_ge(s1.nvrtc_compiles, 2);
    stof_close(ctx);
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    ck_assert_int_eq(stof_mha_prepare(ctx, &d, m), STOF_OK);
    stof_stats s2;
    stof_get_stats(ctx, &s2);
    ck_assert_int_eq(s2.nvrtc_compiles, 0);
    ck_assert_int_eq(s2.cache_hits, s1.nvrtc_compiles);
    stof_mask_free(m);
    stof_close(ctx);
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* Compile-only preparation on several threads stores exactly the kernels
 * that one thread stores. */
static int add_key(const cache_kernel *k, void *arg)
{
    char (*keys)[65] = arg;
    int i = 0;
    while (keys[i][0])
        i++;
    if (i < 63)
        snprintf(keys[i], 65, "%s", k->key);
    return 0;
}

static int by_key(const void *a, const void *b) { return strcmp(a, b); }

START_TEST(prepare_on_threads_matches_one_thread)
{
    char *dir = test_tmpdir();
    static char keys[2][64][65];
    memset(keys, 0, sizeof keys);
    long long compiles[2];
    const char *was = getenv("STOF_COMPILE_THREADS");
    char *saved = was ? strdup(was) : NULL;
    for (int run = 0; run < 2; run++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/c%d.db", dir, run);
        setenv("STOF_COMPILE_THREADS", run ? "4" : "1", 1);
        stof_options o = {.cache_path = path, .arch = "sm_90a"};
        stof_ctx *ctx;
        ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
        stof_mask *m;
        ck_assert_int_eq(stof_mask_parse(ctx, "causal", 256, 256, &m), STOF_OK);
        stof_mha_desc d = {.batch = 1, .heads = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64,
                           .dtype = STOF_F16};
        ck_assert_msg(stof_mha_prepare(ctx, &d, m) == STOF_OK, "%s", stof_last_error(ctx));
        compiles[run] = ctx->stats.nvrtc_compiles;
        ck_assert_int_eq(cache_list_kernels(&ctx->err, ctx->cache, "mha", "sm_90a", add_key,
                                            keys[run]), STOF_OK);
        stof_mask_free(m);
        stof_close(ctx);
    }
    if (saved)
        setenv("STOF_COMPILE_THREADS", saved, 1);
    else
        unsetenv("STOF_COMPILE_THREADS");
    free(saved);
    ck_assert_int_ge(compiles[0], 2);
    ck_assert_int_le(compiles[0], 63);
    ck_assert_int_eq(compiles[0], compiles[1]);
    for (int run = 0; run < 2; run++)
        qsort(keys[run], (size_t)compiles[run], 65, by_key);
    for (int i = 0; i < compiles[0]; i++)
        ck_assert_str_eq(keys[0][i], keys[1][i]);
    test_rmtree(dir);
    free(dir);
}
END_TEST

/* Every variant the search can pick, for both architectures CI can name,
 * compiled on several threads (NVRTC programs are independent). */
#define MAX_VARIANTS 1024
typedef struct variant_job {
    const char *arch;
    mha_candidate c[MAX_VARIANTS];
    int dim[MAX_VARIANTS], dtype[MAX_VARIANTS], seq[MAX_VARIANTS], period[MAX_VARIANTS];
    int group[MAX_VARIANTS];      /* query heads per KV head (GQA); 0 or 1: none */
    float softcap[MAX_VARIANTS];  /* 0: none */
    int alibi[MAX_VARIANTS], bias[MAX_VARIANTS];  /* ALiBi; the bias's buckets (0: none) */
    int varlen[MAX_VARIANTS];     /* packed variable-length sequences; 0: none */
    stof_status st[MAX_VARIANTS];
    int spills[MAX_VARIANTS], spill_bytes[MAX_VARIANTS];
    char err[MAX_VARIANTS][320], global[MAX_VARIANTS][96];
    int n, next, compiled;
    pthread_mutex_t lock;
} variant_job;

/* Each thread compiles into the shared kernel cache (test_kernel_cache),
 * where the compile log (ptxas -v) says whether the kernel spills registers. */
static void *compile_variants(void *arg)
{
    variant_job *j = arg;
    stof_ctx *ctx;
    stof_options o = {.cache_path = test_kernel_cache(), .arch = j->arch};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    ck_assert_msg(ctx->cache != NULL, "%s", stof_last_error(ctx));
    for (int i; (i = test_take(&j->lock, &j->next, j->n)) >= 0;) {
        mha_request r;
        char key[65];
        mha_mods mods = {j->softcap[i], j->alibi[i], j->bias[i]};
        mha_make_request(&j->c[i], j->dim[i], j->seq[i], j->dtype[i] ? STOF_BF16 : STOF_F16,
                         j->group[i], mods, j->varlen[i], j->period[i] ? j->period[i] : 1,
                         &r);
        j->st[i] = jit_prepare(ctx, &r.req, key, NULL);
        snprintf(j->err[i], sizeof j->err[i], "%s", stof_last_error(ctx));
        cache_kernel k;
        int found = 0, rejected = 0;
        /* The library turns a cache it finds damaged off (ctx->cache NULL). */
        ck_assert_msg(ctx->cache != NULL, "the test kernel cache went off: %s", ctx->cache_note);
        if (j->st[i] == STOF_OK &&
            cache_get_kernel(&ctx->err, ctx->cache, key, &k, &found, &rejected) == STOF_OK && found) {
            /* ptxas also says when it had to serialize the wgmma products
             * (C7514 and its kin): as costly as a spill, and counted as one. */
            const char *serial = strstr(k.log, "Potential Performance Loss");
            const char *line = serial ? serial : strstr(k.log, "bytes stack frame");
            const char *sp = strstr(k.log, " bytes spill stores");
            int stores = 0;
            while (sp && sp > k.log && sp[-1] >= '0' && sp[-1] <= '9')
                sp--;
            if (sp)
                stores = atoi(sp);
            /* The warp-specialized engine's 192-row items are compiled
             * for 128 registers a thread (512 threads) and reload a few of
             * an item's words about once per tile at head_dim 80 and 96:
             * 16 bytes at 96 with P (and O) in shared memory (dense L 4096
             * 1.05 ms against 1.07 for 192 x 96). Since the producer hands
             * the consumers each tile's metadata in shared memory, none
             * spill at head_dim 64 but the 192 x 128 tile whose products
             * take the row sums (attn_ws.cu's SUM_MMA): 12 bytes, the item
             * loop's counter, reloaded once an item (dense L 4096 still
             * 1.9% faster than with the sums in the softmax), 32 where
             * consumers sit out (dense L 1024 9% faster than without). */
            /* The softcap's pass over the scores costs the two-consumer
             * kernel at head_dim 128 (232 registers) 16 bytes of spill;
             * ALiBi and the bias with it (their slope, row, positions)
             * cost the wgmma engine's 128 x 128 tiles at head_dim 128 (255
             * registers) 8 (not yet timed on a GPU); ALiBi alone, the
             * warp-specialized engine's 128-row block tiles past head_dim
             * 64 32, 40 with the softcap: an item's words, reloaded outside
             * the tile loop (cuobjdump); the search picks that kernel over
             * the wgmma engine's for causal ALiBi at L 8192 on an H100
             * (0.99 against 1.26 ms, 32 heads, head_dim 128). */
            const int ws192 = j->c[i].wg == MHA_WS && j->c[i].bm == 192;
            const int score_mods = j->alibi[i] || j->bias[i];
            const int allowed = score_mods && j->c[i].wg == MHA_WS && j->dim[i] > 64 ? 40
                                : score_mods && j->c[i].wg ? 16
                                : j->softcap[i] > 0 ? (j->c[i].wg == MHA_WS ? 16 : 0)
                                : !ws192           ? 0
                                : j->dim[i] > 64 ? 16
                                : j->c[i].bn == 128 && !j->c[i].qs
                                    ? (mha_sit_out(&j->c[i], j->seq[i]) ? 32 : 12)
                                    : 0;
            j->spills[i] = stores > allowed || strstr(k.log, "ptxas warning") || serial;
            j->spill_bytes[i] = stores;
            snprintf(j->err[i], sizeof j->err[i], "%s", line ? line : k.log);
            test_ptx_global(k.ptx, j->global[i], sizeof j->global[i]);
            cache_kernel_free(&k);
        } else {
            j->spills[i] = -1;  /* no log to read */
        }
    }
    pthread_mutex_lock(&j->lock);
    j->compiled += (int)ctx->stats.nvrtc_compiles;
    pthread_mutex_unlock(&j->lock);
    stof_close(ctx);
    return NULL;
}

START_TEST(every_variant_compiles)
{
    static const int dims[] = {32, 64, 80, 96, 128};
    static variant_job j;
    memset(&j, 0, sizeof j);
    j.arch = _i ? "sm_80" : "sm_90a";
    pthread_mutex_init(&j.lock, NULL);
    for (int d = 0; d < 5; d++) {
        mha_candidate c[64];
        int n = mha_candidates(dims[d], 227 * 1024, _i == 0, c, 64);
        /* 192-row warp-specialized items: with and without consumers
         * sitting out (1000 rows leave the last group 40 rows); gathered
         * rows: copied, and read through views of periods 2 and 3 */
        for (int i = 0; i < n; i++) {
            const int sits = c[i].wg == MHA_WS && c[i].bm == 192;
            const int views = c[i].wg == MHA_WS && c[i].kind == ATTN_GATHER;
            ck_assert(!mha_sit_out(&c[i], 4096) && !mha_sit_out(&c[i], 1064));
            for (int v = 0; v < (sits || views ? 4 : 2); v++) {
                ck_assert_int_lt(j.n, MAX_VARIANTS);
                j.c[j.n] = c[i];
                j.dim[j.n] = dims[d];
                j.seq[j.n] = v < 2 || views ? 1536 : 1000;
                j.period[j.n] = views && v >= 2 ? v : 1;
                ck_assert_int_eq(mha_sit_out(&c[i], j.seq[j.n]), sits && v >= 2);
                j.dtype[j.n++] = v % 2;
            }
            /* Grouped KV heads with the logit softcap (issue 54): each
             * engine and kind's first size, and the warp-specialized
             * engine's first 192-row one (the fewest registers a thread;
             * grouped heads only: those items do not take the softcap). */
            int first = 1;
            for (int e = 0; e < i && first; e++)
                first = !(c[e].wg == c[i].wg && c[e].kind == c[i].kind &&
                          (c[i].wg != MHA_WS || (c[e].bm == 192) == (c[i].bm == 192)));
            if (first) {
                ck_assert_int_lt(j.n, MAX_VARIANTS);
                j.c[j.n] = c[i];
                j.dim[j.n] = dims[d];
                j.seq[j.n] = 1536;
                j.period[j.n] = 1;
                j.group[j.n] = 4;
                j.softcap[j.n] = mha_takes_softcap(&c[i]) ? 30.f : 0.f;
                j.dtype[j.n++] = (i + d) % 2;
                /* And ALiBi with the distance bias, after the softcap
                 * (issue 54), where the kernel takes them (ALiBi alone
                 * where it takes only that); the other dtype, gathered rows
                 * read through a view where there are some. */
                const int bias = mha_takes_score_mods(&c[i], (mha_mods){0.f, 1, 32}, dims[d]);
                if (!bias && !mha_takes_score_mods(&c[i], (mha_mods){0.f, 1, 0}, dims[d]))
                    continue;
                ck_assert_int_lt(j.n, MAX_VARIANTS);
                j.c[j.n] = c[i];
                j.dim[j.n] = dims[d];
                j.seq[j.n] = 1536;
                j.period[j.n] = c[i].wg == MHA_WS && c[i].kind == ATTN_GATHER ? 2 : 1;
                j.group[j.n] = 4;
                j.softcap[j.n] = mha_takes_softcap(&c[i]) ? 30.f : 0.f;
                j.alibi[j.n] = 1;
                j.bias[j.n] = bias ? 32 : 0;
                j.dtype[j.n++] = (i + d + 1) % 2;
            }
            /* Packed variable-length sequences (issue 54), where taken:
             * each engine and kind's first size, alone at odd head sizes,
             * with grouped heads and the softcap at even. */
            if (first && mha_takes_varlen(&c[i])) {
                ck_assert_int_lt(j.n, MAX_VARIANTS);
                j.c[j.n] = c[i];
                j.dim[j.n] = dims[d];
                j.seq[j.n] = 1536;
                j.period[j.n] = 1;
                j.group[j.n] = d % 2 ? 0 : 4;
                j.softcap[j.n] = d % 2 ? 0.f : 30.f;
                j.varlen[j.n] = 1;
                j.dtype[j.n++] = (i + d + 1) % 2;
            }
        }
    }
    int nthreads = test_on_threads(compile_variants, &j), mma_spills = 0, wg = 0;
    int wg_allowed = 0, wg_most = 0;  /* wgmma variants that spill within their allowance */
    pthread_mutex_destroy(&j.lock);
    for (int i = 0; i < j.n; i++) {
        ck_assert_msg(j.st[i] == STOF_OK,
                      "%s d%d %s %dx%d mt%d qs%d seq %d group %d softcap %g alibi %d bias %d "
                      "varlen %d: %s",
                      j.arch, j.dim[i], j.dtype[i] ? "bf16" : "fp16", j.c[i].bm, j.c[i].bn,
                      j.c[i].mt, j.c[i].qs, j.seq[i], j.group[i], (double)j.softcap[i],
                      j.alibi[i], j.bias[i], j.varlen[i], j.err[i]);
        /* Spilled registers or serialized products cost a wgmma kernel half
         * its speed or more; the mma.sync engine's spills are counted and
         * shown. */
        ck_assert_msg(j.spills[i] >= 0, "%s d%d: no compile log", j.arch, j.dim[i]);
        mma_spills += j.spills[i] && !j.c[i].wg;
        wg += j.c[i].wg != 0;  /* 1 warpgroup MMA, MHA_WS warp-specialized */
        if (j.c[i].wg && j.spill_bytes[i] > 0) {
            wg_allowed++;
            wg_most = j.spill_bytes[i] > wg_most ? j.spill_bytes[i] : wg_most;
        }
        ck_assert_msg(!(j.spills[i] && j.c[i].wg),
                      "%s d%d %s %dx%d stages %d seq %d group %d softcap %g alibi %d bias %d "
                      "varlen %d spills or serializes: %s", j.arch, j.dim[i],
                      j.dtype[i] ? "bf16" : "fp16", j.c[i].bm, j.c[i].bn, j.c[i].st, j.seq[i],
                      j.group[i], (double)j.softcap[i], j.alibi[i], j.bias[i], j.varlen[i],
                      j.err[i]);
        ck_assert_msg(!j.global[i][0], "%s d%d %s %dx%d: a variable in device memory: %s", j.arch,
                      j.dim[i], j.dtype[i] ? "bf16" : "fp16", j.c[i].bm, j.c[i].bn, j.global[i]);
    }
    /* An arch without wgmma (sm_80) has none of those to count. */
    char wgs[160];
    if (!wg)
        snprintf(wgs, sizeof wgs, "no wgmma variants for this arch");
    else if (!wg_allowed)
        snprintf(wgs, sizeof wgs, "none of the %d wgmma variant%s spills registers", wg,
                 wg == 1 ? "" : "s");
    else
        snprintf(wgs, sizeof wgs, "registers spill in %d of the %d wgmma variant%s, within their "
                 "allowances (at most %d bytes)", wg_allowed, wg, wg == 1 ? "" : "s", wg_most);
    printf("test_attn: %d attention variants compiled for %s (%d now, on %d thread%s, the rest "
           "found in the test kernel cache); %s; registers spill in %d of the %d mma.sync "
           "variant%s\n",
           j.n, j.arch, j.compiled, nthreads, nthreads == 1 ? "" : "s", wgs, mma_spills, j.n - wg,
           j.n - wg == 1 ? "" : "s");
    ck_assert_int_ge(j.n, 100);
}
END_TEST

Suite *suite_attn(void)
{
    Suite *s = suite_create("attn");
    TCase *t = tcase_create("tiles");
    tcase_add_loop_test(t, tiles_expand_to_the_mask, 0, (int)(sizeof SPECS / sizeof SPECS[0]));
    tcase_add_test(t, memo_keeps_hash_and_tiles);
    tcase_add_test(t, rank_shares_tiles_by_shape);
    tcase_add_test(t, gather_compacts_scattered_masks);
    tcase_add_test(t, gather_view_by_period);
    tcase_add_test(t, schedule_deals_every_item_once);
    tcase_add_test(t, model_scales_with_work);
    tcase_add_test(t, model_device_record);
    tcase_add_test(t, candidates_fit_the_device);
    tcase_add_test(t, tuning_record_round_trip);
    tcase_add_test(t, wgmma_needs_sm90a);
    tcase_add_test(t, bad_arguments_before_the_device);
    suite_add_tcase(s, t);
    TCase *p = tcase_create("prepare");
    tcase_set_timeout(p, 300);
    tcase_add_test(p, prepare_fills_the_cache);
    tcase_add_test(p, prepare_on_threads_matches_one_thread);
    suite_add_tcase(s, p);
    TCase *c = tcase_create("compile");
    tcase_set_timeout(c, 900);
    tcase_add_loop_test(c, every_variant_compiles, 0, 2);
    suite_add_tcase(s, c);
    return s;
}
