/*
 * test_mask_picture — the mask's public pictures: the dense matrix, the
 * block map against counts made here from the dense matrix (and against
 * stof_mask_stats), the SVG's text and the PNG decoded byte by byte
 * (chunks, CRCs, stored deflate, Adler-32, pixels), and bad arguments.
 */
#include <stdlib.h>
#include <string.h>

#include "stof.h"
#include "testutil.h"

static stof_ctx *open_ctx(void)
{
    stof_ctx *ctx = NULL;
    stof_options o = {.no_cache = 1};
    ck_assert_int_eq(stof_open(&ctx, &o), STOF_OK);
    return ctx;
}

/* The block map from its definition, cell by cell. */
static void expected_map(const unsigned char *d, int lq, int lk, int bq, int bk,
                         unsigned char *map)
{
    int nqb = (lq + bq - 1) / bq, nkb = (lk + bk - 1) / bk;
    for (int i = 0; i < nqb; i++)
        for (int j = 0; j < nkb; j++) {
            int allowed = 0, area = 0;
            for (int q = i * bq; q < lq && q < (i + 1) * bq; q++)
                for (int k = j * bk; k < lk && k < (j + 1) * bk; k++) {
                    area++;
                    allowed += d[(size_t)q * lk + k] != 0;
                }
            map[i * nkb + j] = allowed == 0      ? STOF_BLOCK_EMPTY
                               : allowed == area ? STOF_BLOCK_FULL
                                                 : STOF_BLOCK_PARTIAL;
        }
}

START_TEST(dense_matches_definition)
{
    stof_ctx *ctx = open_ctx();
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 5, 7, &m), STOF_OK);
    unsigned char d[35];
    memset(d, 9, sizeof d);
    ck_assert_int_eq(stof_mask_to_dense(ctx, m, d), STOF_OK);
    for (int q = 0; q < 5; q++)
        for (int k = 0; k < 7; k++)
            ck_assert_int_eq(d[q * 7 + k], k <= q + 2);   /* bottom-right aligned */
    stof_mask_free(m);

    /* A random matrix comes back as it went in. */
    test_rng r = test_rng_make(41);
    int lq = 77, lk = 130;
    unsigned char *in = malloc((size_t)lq * lk), *out = malloc((size_t)lq * lk);
    for (int i = 0; i < lq * lk; i++)
        in[i] = test_rng_uniform(&r) < 0.3;
    ck_assert_int_eq(stof_mask_from_dense(ctx, in, lq, lk, &m), STOF_OK);
    ck_assert_int_eq(stof_mask_to_dense(ctx, m, out), STOF_OK);
    ck_assert_mem_eq(in, out, (size_t)lq * lk);
    stof_mask_free(m);
    free(in);
    free(out);
    stof_close(ctx);
}
END_TEST

START_TEST(block_map_matches_definition)
{
    stof_ctx *ctx = open_ctx();
    stof_mask *m;
    /* causal 128 x 128 in 64 x 64 blocks: diagonal partial, below full, above empty. */
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 128, 128, &m), STOF_OK);
    unsigned char map[4];
    ck_assert_int_eq(stof_mask_block_map(ctx, m, 64, 64, map), STOF_OK);
    unsigned char want[4] = {STOF_BLOCK_PARTIAL, STOF_BLOCK_EMPTY, STOF_BLOCK_FULL,
                             STOF_BLOCK_PARTIAL};
    ck_assert_mem_eq(map, want, 4);
    stof_mask_free(m);

    static const char *specs[] = {"window:32+global:8", "dilated:8:3", "strided:7",
                                  "random:2:16:5+causal", "docs:50,100,33&causal", "dense"};
    static const int sizes[][4] = {{183, 183, 16, 16}, {200, 200, 64, 32}, {150, 170, 32, 128},
                                   {183, 183, 16, 64}, {183, 183, 48, 80}, {65, 33, 64, 16}};
    for (size_t t = 0; t < sizeof specs / sizeof *specs; t++) {
        int lq = sizes[t][0], lk = sizes[t][1], bq = sizes[t][2], bk = sizes[t][3];
        int nqb = (lq + bq - 1) / bq, nkb = (lk + bk - 1) / bk;
        ck_assert_int_eq(stof_mask_parse(ctx, specs[t], lq, lk, &m), STOF_OK);
        unsigned char *d = malloc((size_t)lq * lk), *got = malloc((size_t)nqb * nkb),
                      *exp = malloc((size_t)nqb * nkb);
        ck_assert_int_eq(stof_mask_to_dense(ctx, m, d), STOF_OK);
        expected_map(d, lq, lk, bq, bk, exp);
        ck_assert_int_eq(stof_mask_block_map(ctx, m, bq, bk, got), STOF_OK);
        ck_assert_msg(!memcmp(got, exp, (size_t)nqb * nkb), "%s: block map differs", specs[t]);
        stof_mask_info s;
        ck_assert_int_eq(stof_mask_stats(ctx, m, bq, bk, &s), STOF_OK);
        long long n[3] = {0, 0, 0};
        for (int i = 0; i < nqb * nkb; i++)
            n[got[i]]++;
        ck_assert_int_eq(n[STOF_BLOCK_FULL], s.blocks_full);
        ck_assert_int_eq(n[STOF_BLOCK_PARTIAL], s.blocks_partial);
        ck_assert_int_eq(n[STOF_BLOCK_EMPTY], (long long)nqb * nkb - s.blocks_touched);
        free(d);
        free(got);
        free(exp);
        stof_mask_free(m);
    }
    stof_close(ctx);
}
END_TEST

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

START_TEST(svg_says_what_the_map_says)
{
    stof_ctx *ctx = open_ctx();
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal&docs:64,64", 128, 128, &m), STOF_OK);
    void *data;
    size_t len;
    ck_assert_int_eq(stof_mask_picture(ctx, m, 64, 64, STOF_PICTURE_SVG, &data, &len), STOF_OK);
    const char *svg = data;
    ck_assert_uint_eq(strlen(svg), len);
    ck_assert_int_eq(strncmp(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"", 39), 0);
    ck_assert_str_eq(svg + len - 7, "</svg>\n");
    /* The spec escaped; two partial diagonal blocks, both off-diagonal blocks empty. */
    ck_assert_ptr_nonnull(strstr(svg, "causal&amp;docs:64,64 (128 x 128), 64 x 64 blocks"));
    ck_assert_ptr_null(strstr(svg, "causal&docs"));
    ck_assert_ptr_nonnull(strstr(svg, ">full 0<"));
    ck_assert_ptr_nonnull(strstr(svg, ">partial 2<"));
    ck_assert_ptr_nonnull(strstr(svg, ">empty 2<"));
    ck_assert_int_eq(count(svg, "fill=\"#8fb8de\"/>"), 2);   /* the two partial cells */
    ck_assert_int_eq(count(svg, "fill=\"#1f4e79\"/>"), 0);
    stof_mask_picture_free(data);
    stof_mask_free(m);

    /* A row's run of full blocks is one rectangle. */
    ck_assert_int_eq(stof_mask_parse(ctx, "dense", 64, 256, &m), STOF_OK);
    ck_assert_int_eq(stof_mask_picture(ctx, m, 16, 16, STOF_PICTURE_SVG, &data, &len), STOF_OK);
    ck_assert_int_eq(count(data, "fill=\"#1f4e79\"/>"), 4);
    ck_assert_ptr_nonnull(strstr(data, ">full 64<"));
    stof_mask_picture_free(data);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t crc32_of(const unsigned char *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
}

START_TEST(png_decodes_to_the_map)
{
    stof_ctx *ctx = open_ctx();
    stof_mask *m;
    int lq = 1000, lk = 333, bq = 32, bk = 16;
    int nqb = (lq + bq - 1) / bq, nkb = (lk + bk - 1) / bk;   /* 32 x 21 */
    ck_assert_int_eq(stof_mask_parse(ctx, "window:64+global:20", lq, lk, &m), STOF_OK);
    unsigned char *map = malloc((size_t)nqb * nkb);
    ck_assert_int_eq(stof_mask_block_map(ctx, m, bq, bk, map), STOF_OK);
    void *data;
    size_t len;
    ck_assert_int_eq(stof_mask_picture(ctx, m, bq, bk, STOF_PICTURE_PNG, &data, &len), STOF_OK);
    const unsigned char *p = data;
    ck_assert_mem_eq(p, "\x89PNG\r\n\x1a\n", 8);
    int s = 512 / 32;   /* each block an s x s square */
    unsigned char *z = malloc(len);
    size_t zn = 0, at = 8;
    uint32_t w = 0, h = 0;
    int ended = 0;
    while (at + 12 <= len) {
        uint32_t n = be32(p + at);
        ck_assert_uint_le(at + 12 + n, len);
        ck_assert_uint_eq(crc32_of(p + at + 4, n + 4), be32(p + at + 8 + n));
        const unsigned char *c = p + at + 8;
        if (!memcmp(p + at + 4, "IHDR", 4)) {
            w = be32(c);
            h = be32(c + 4);
            ck_assert_int_eq(c[8], 8);    /* bit depth */
            ck_assert_int_eq(c[9], 3);    /* palette */
        } else if (!memcmp(p + at + 4, "PLTE", 4)) {
            ck_assert_uint_eq(n, 9);
            ck_assert_int_eq(c[0] + c[1] + c[2], 3 * 255);   /* index 0, empty: white */
        } else if (!memcmp(p + at + 4, "IDAT", 4)) {
            memcpy(z + zn, c, n);
            zn += n;
        } else if (!memcmp(p + at + 4, "IEND", 4)) {
            ended = 1;
        }
        at += 12 + n;
    }
    ck_assert(ended);
    ck_assert_uint_eq(at, len);
    ck_assert_uint_eq(w, (uint32_t)(nkb * s));
    ck_assert_uint_eq(h, (uint32_t)(nqb * s));
    /* zlib: header, stored blocks, Adler-32 of what they hold. */
    ck_assert_int_eq((z[0] * 256 + z[1]) % 31, 0);
    size_t raw_len = (size_t)(w + 1) * h, rn = 0, zi = 2;
    unsigned char *raw = malloc(raw_len);
    for (int final = 0; !final;) {
        final = z[zi] & 1;
        ck_assert_int_eq(z[zi] >> 1, 0);   /* BTYPE 00 */
        size_t n = z[zi + 1] | (size_t)z[zi + 2] << 8;
        ck_assert_uint_eq(n ^ 0xFFFF, z[zi + 3] | (size_t)z[zi + 4] << 8);
        ck_assert_uint_le(rn + n, raw_len);
        memcpy(raw + rn, z + zi + 5, n);
        rn += n;
        zi += 5 + n;
    }
    ck_assert_uint_eq(rn, raw_len);
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < raw_len; i++) {
        a = (a + raw[i]) % 65521;
        b = (b + a) % 65521;
    }
    ck_assert_uint_eq(be32(z + zi), b << 16 | a);
    ck_assert_uint_eq(zi + 4, zn);
    for (uint32_t y = 0; y < h; y++) {
        ck_assert_int_eq(raw[(size_t)y * (w + 1)], 0);
        for (uint32_t x = 0; x < w; x++)
            if (raw[(size_t)y * (w + 1) + 1 + x] != map[(y / s) * nkb + x / s])
                ck_abort_msg("pixel (%u, %u) is not its block's kind", x, y);
    }
    free(raw);
    free(z);
    free(map);
    stof_mask_picture_free(data);
    stof_mask_free(m);
    stof_close(ctx);
}
END_TEST

START_TEST(bad_arguments_rejected)
{
    stof_ctx *ctx = open_ctx();
    stof_mask *m;
    ck_assert_int_eq(stof_mask_parse(ctx, "causal", 64, 64, &m), STOF_OK);
    unsigned char buf[64 * 64];
    void *data = (void *)buf;
    size_t len = 7;
    ck_assert_int_eq(stof_mask_to_dense(NULL, m, buf), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_to_dense(ctx, NULL, buf), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "'m'"));
    ck_assert_int_eq(stof_mask_to_dense(ctx, m, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "'out'"));
    ck_assert_int_eq(stof_mask_block_map(ctx, m, 0, 0, buf), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "16..256 rows by 16..256 keys, got 0 x 0"));
    ck_assert_int_eq(stof_mask_block_map(ctx, m, 64, 257, buf), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_block_map(ctx, NULL, 64, 64, buf), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_block_map(ctx, m, 64, 64, NULL), STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_picture(ctx, m, 0, 64, STOF_PICTURE_SVG, &data, &len),
                     STOF_ERR_INVALID_ARG);
    ck_assert_ptr_null(data);
    ck_assert_uint_eq(len, 0);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "got 0 x 64"));
    ck_assert_int_eq(stof_mask_picture(ctx, m, 64, 64, (stof_picture)0, &data, &len),
                     STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "not a stof_picture"));
    ck_assert_int_eq(stof_mask_picture(ctx, m, 64, 64, STOF_PICTURE_PNG, NULL, &len),
                     STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_picture(ctx, m, 64, 64, STOF_PICTURE_PNG, &data, NULL),
                     STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_picture(NULL, m, 64, 64, STOF_PICTURE_PNG, &data, &len),
                     STOF_ERR_INVALID_ARG);
    ck_assert_int_eq(stof_mask_picture(ctx, NULL, 64, 64, STOF_PICTURE_PNG, &data, &len),
                     STOF_ERR_INVALID_ARG);
    stof_mask_free(m);
    ck_assert_int_eq(stof_mask_parse(ctx, "window:16", 70000, 64, &m), STOF_OK);
    ck_assert_int_eq(stof_mask_picture(ctx, m, 16, 16, STOF_PICTURE_SVG, &data, &len),
                     STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(stof_last_error(ctx), "too large"));
    stof_mask_free(m);
    stof_mask_picture_free(NULL);
    stof_close(ctx);
}
END_TEST

Suite *suite_mask_picture(void)
{
    Suite *s = suite_create("mask_picture");
    TCase *t = tcase_create("mask_picture");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, dense_matches_definition);
    tcase_add_test(t, block_map_matches_definition);
    tcase_add_test(t, svg_says_what_the_map_says);
    tcase_add_test(t, png_decodes_to_the_map);
    tcase_add_test(t, bad_arguments_rejected);
    suite_add_tcase(s, t);
    return s;
}
