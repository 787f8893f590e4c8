/*
 * fuzz_mask — the mask spec parser (src/mask.c) on hostile specs. An input
 * is four bytes that choose the lengths (Lq, then Lk; ff ff for Lk = Lq),
 * then the spec, fed to stof_mask_parse in a buffer of exactly its size.
 * A refusal must be STOF_ERR_INVALID_ARG, leave *out NULL and, for sound
 * lengths, name the column; a mask must agree with itself: a stable hash,
 * a normalized spec that parses to the same mask, and formats and
 * statistics that count the same entries and blocks. Its own mutator
 * (LLVMFuzzerCustomMutator) edits specs the way they go wrong: numbers
 * swapped for boundary values, terms spliced from other specs, grammar
 * fragments, huge numbers, the spec doubled around an operator.
 */
#include <string.h>

#include "fuzz.h"
#include "attn/mask.h"
#include "stof.h"

static const char *corpus[] = {
    "dense", "causal", "window:256", "window:256+global:64",
    "window:192+global:64+random:3:64:1", "window:256+strided:8", "dilated:256:2",
    "causal&docs:1024,3072,4096", "docs:1024,3072,4096", "causal&window:512",
    "causal_window:128", "global:1", "strided:1", "random:1:1:0",
    "random:2:16:18446744073709551615", "window:4+window:2&causal", " causal & dense ",
    "dilated:8:3+strided:5&global:7", "docs:1,2,3,4,5,6", "window:2&causal_window:3+dense",
};

static const char *fragments[] = {
    "+", "&", ":", ",", " ", "window", "global", "docs", "random", "dilated", "strided",
    "causal", "causal_window", "dense", "0", "1", "2", "64", "-1", "4294967296",
    "2147483647", "2147483648", "18446744073709551615", "18446744073709551616",
    "99999999999999999999999999", "\t", "\x80", "\xff", "%s%n",
};

typedef struct fz_rng { uint64_t s; } fz_rng;

static uint64_t fz_next(fz_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

static size_t fz_below(fz_rng *r, size_t n) { return n ? (size_t)(fz_next(r) % n) : 0; }

#define FZ_MAX 512

/* Inserts text at pos, keeping the buffer within FZ_MAX. */
static size_t insert(char *buf, size_t len, size_t pos, const char *text, size_t n)
{
    if (len + n > FZ_MAX)
        n = FZ_MAX - len;
    memmove(buf + pos + n, buf + pos, len - pos);
    memcpy(buf + pos, text, n);
    return len + n;
}

/* Replaces one number by another that is often valid, so that many
 * mutants still parse and reach the builders. */
static size_t tweak_number(fz_rng *r, char *buf, size_t len)
{
    size_t starts[FZ_MAX], n = 0;
    for (size_t i = 0; i < len; i++)
        if (buf[i] >= '0' && buf[i] <= '9' && (i == 0 || buf[i - 1] < '0' || buf[i - 1] > '9'))
            starts[n++] = i;
    if (!n)
        return len;
    size_t at = starts[fz_below(r, n)], end = at;
    while (end < len && buf[end] >= '0' && buf[end] <= '9')
        end++;
    char num[32];
    unsigned long long v = fz_below(r, 4) == 0 ? fz_next(r) : fz_below(r, 3) ? fz_below(r, 9) : fz_below(r, 600);
    int w = snprintf(num, sizeof num, "%llu", v);
    memmove(buf + at, buf + end, len - end);
    len -= end - at;
    return insert(buf, len, at, num, (size_t)w);
}

static size_t mutate(fz_rng *r, char *buf, size_t len)
{
    if (fz_below(r, 3) == 0)
        return tweak_number(r, buf, len);
    int steps = 1 + (int)fz_below(r, 4);
    for (int s = 0; s < steps; s++) {
        size_t pos = fz_below(r, len + 1);
        switch (fz_below(r, 8)) {
        case 0: /* flip a bit */
            if (len)
                buf[fz_below(r, len)] ^= (char)(1u << fz_below(r, 8));
            break;
        case 1: { /* insert a random byte, never NUL: the parser sees C strings */
            char c = (char)(1 + fz_below(r, 255));
            len = insert(buf, len, pos, &c, 1);
            break;
        }
        case 2: /* delete a run */
            if (len) {
                size_t n = 1 + fz_below(r, len - pos + 1 > 8 ? 8 : len - pos + 1);
                n = pos + n > len ? len - pos : n;
                memmove(buf + pos, buf + pos + n, len - pos - n);
                len -= n;
            }
            break;
        case 3: /* truncate */
            len = pos;
            break;
        case 4: { /* splice in a term of another corpus entry */
            const char *src = corpus[fz_below(r, sizeof corpus / sizeof *corpus)];
            size_t sl = strlen(src), a = fz_below(r, sl), b = a + 1 + fz_below(r, sl - a);
            len = insert(buf, len, pos, src + a, b - a);
            break;
        }
        case 5: { /* a grammar fragment or a huge number */
            const char *f = fragments[fz_below(r, sizeof fragments / sizeof *fragments)];
            len = insert(buf, len, pos, f, strlen(f));
            break;
        }
        case 6: /* replace a digit by a long run of digits */
            for (size_t i = 0; i < len; i++)
                if (buf[i] >= '0' && buf[i] <= '9' && fz_below(r, 3) == 0) {
                    char digits[40];
                    size_t n = 1 + fz_below(r, sizeof digits);
                    for (size_t k = 0; k < n; k++)
                        digits[k] = (char)('0' + fz_below(r, 10));
                    len = insert(buf, len, i, digits, n);
                    break;
                }
            break;
        default: /* duplicate the whole spec after an operator */
            if (len && len * 2 + 1 <= FZ_MAX) {
                buf[len] = fz_below(r, 2) ? '+' : '&';
                memcpy(buf + len + 1, buf, len);
                len = len * 2 + 1;
            }
            break;
        }
    }
    return len;
}

static void fail(const char *spec, int lq, int lk, const char *what)
{
    fprintf(stderr, "fuzz_mask: %s for spec \"", what);
    for (const char *p = spec; *p; p++)
        fprintf(stderr, (*p >= 32 && *p < 127) ? "%c" : "\\x%02x", (unsigned char)*p);
    fprintf(stderr, "\" lq %d lk %d\n", lq, lk);
    abort();
}

/* A parsed mask must agree with itself: the formats count the same entries
 * and the hash is stable. Big masks get only the cheap checks. */
static void exercise(stof_ctx *ctx, stof_mask *m, const char *spec, int lq, int lk, fz_rng *r)
{
    char h1[65], h2[65];
    if (stof_mask_hash(m, h1) != STOF_OK || stof_mask_hash(m, h2) != STOF_OK || strcmp(h1, h2))
        fail(spec, lq, lk, "unstable hash");
    if (!stof_mask_spec(m)[0])
        fail(spec, lq, lk, "empty normalized spec");
    stof_mask *again = NULL;
    if (stof_mask_parse(ctx, stof_mask_spec(m), lq, lk, &again) != STOF_OK)
        fail(spec, lq, lk, "normalized spec does not parse");
    char h3[65];
    stof_mask_hash(again, h3);
    stof_mask_free(again);
    if (strcmp(h1, h3))
        fail(spec, lq, lk, "normalized spec is a different mask");
    if ((long long)lq * lk > 1 << 18)
        return;
    int bq = 16 + (int)fz_below(r, 113), bk = 16 + (int)fz_below(r, 113);
    stof_mask_info info;
    mask_rows rows;
    mask_blocks blocks;
    if (stof_mask_stats(ctx, m, bq, bk, &info) != STOF_OK ||
        mask_build_rows(ctx, m, &rows) != STOF_OK)
        fail(spec, lq, lk, stof_last_error(ctx));
    if (mask_build_blocks(ctx, m, bq, bk, &blocks) != STOF_OK)
        fail(spec, lq, lk, stof_last_error(ctx));
    if (rows.entries != info.entries || blocks.n_blocks != info.blocks_touched ||
        blocks.n_full != info.blocks_full || blocks.n_bitmaps != info.distinct_bitmaps)
        fail(spec, lq, lk, "formats and statistics disagree");
    mask_rows_free(&rows);
    mask_blocks_free(&blocks);
}

/* Two bytes to a length: mostly short, sometimes long, and 0 and -1. */
static int length_of(unsigned v)
{
    if (v == 0xffff)
        return -1;
    if (v == 0xfffe)
        return 0;
    return v >> 14 ? 1 + (int)(v % 300) : 1 + (int)(v % 5000);
}

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static stof_ctx *g_ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    if (!g_ctx && stof_open(&g_ctx, &(stof_options){.no_cache = 1}) != STOF_OK)
        abort();
    int lq = length_of(data[0] | (unsigned)data[1] << 8);
    int lk = data[2] == 0xff && data[3] == 0xff ? lq : length_of(data[2] | (unsigned)data[3] << 8);
    /* A C string: up to the first NUL, in exactly its bytes plus the NUL. */
    size_t len = strnlen((const char *)data + 4, size - 4);
    char *spec = malloc(len + 1);
    memcpy(spec, data + 4, len);
    spec[len] = 0;
    fz_rng r = {fnv(data, size) | 1};
    stof_mask *m = (stof_mask *)&m;
    stof_status st = stof_mask_parse(g_ctx, spec, lq, lk, &m);
    if (st == STOF_OK) {
        exercise(g_ctx, m, spec, lq, lk, &r);
        stof_mask_free(m);
    } else if (m != NULL) {
        fail(spec, lq, lk, "*out not NULL after an error");
    } else if (st != STOF_ERR_INVALID_ARG) {
        fail(spec, lq, lk, stof_status_str(st));
    } else if (lq > 0 && lk > 0 && !strstr(stof_last_error(g_ctx), "at column ")) {
        fail(spec, lq, lk, "error message without a column");
    }
    free(spec);
    return 0;
}

/* Mostly the spec-shaped edits above; now and then new lengths, or the
 * generic edits. */
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    fz_rng r = {((uint64_t)seed << 1) | 1};
    if (max_size < 8)
        return size;
    if (size < 4) {
        const char *base = corpus[fz_below(&r, sizeof corpus / sizeof *corpus)];
        size_t n = strlen(base) < max_size - 4 ? strlen(base) : max_size - 4;
        memset(data, 0xff, 4);
        memcpy(data + 4, base, n);
        size = 4 + n;
    }
    switch (fz_below(&r, 8)) {
    case 0: {
        unsigned v = (unsigned)fz_next(&r);
        data[fz_below(&r, 4)] = (uint8_t)v;
        return size;
    }
    case 1:
        return LLVMFuzzerMutate(data, size, max_size);
    default: {
        char buf[FZ_MAX + 1];
        size_t cap = max_size - 4 < FZ_MAX ? max_size - 4 : FZ_MAX;
        size_t len = size - 4 < cap ? size - 4 : cap;
        memcpy(buf, data + 4, len);
        len = mutate(&r, buf, len);
        if (len > cap)
            len = cap;
        memcpy(data + 4, buf, len);
        return 4 + len;
    }
    }
}
