#include "attn/mask_picture.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stof.h"

/* Full blocks dark, partial light, empty white: the palette of both formats. */
static const unsigned char PICTURE_RGB[3][3] = {{255, 255, 255}, {143, 184, 222}, {31, 78, 121}};

static void svg_escaped(strbuf *b, const char *s, size_t max)
{
    for (size_t i = 0; s[i] && i < max; i++) {
        switch (s[i]) {
        case '&': strbuf_puts(b, "&amp;"); break;
        case '<': strbuf_puts(b, "&lt;"); break;
        case '>': strbuf_puts(b, "&gt;"); break;
        case '"': strbuf_puts(b, "&quot;"); break;
        default: strbuf_add(b, s + i, 1);
        }
    }
    if (strlen(s) > max)
        strbuf_puts(b, "...");
}

/* The grid scaled so its longer side is about 480 px (a cell at most 24 px),
 * each row's runs of one kind as one rectangle, empty blocks left as the
 * background; a caption gives the spec, the sizes and the counts. */
void mask_picture_svg(strbuf *b, const char *spec, int lq, int lk, const unsigned char *map,
                      int nqb, int nkb, int bq, int bk)
{
    int longer = nqb > nkb ? nqb : nkb;
    double cell = 480.0 / longer;
    if (cell > 24)
        cell = 24;
    double gw = cell * nkb, gh = cell * nqb;
    double width = gw > 380 ? gw : 380, height = gh + 44;
    long long n[3] = {0, 0, 0};
    for (size_t i = 0; i < (size_t)nqb * (size_t)nkb; i++)
        n[map[i]]++;
    strbuf_printf(b,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                  "viewBox=\"0 0 %.2f %.2f\" font-family=\"sans-serif\" font-size=\"12\">\n"
                  "<title>stof mask ",
                  width, height, width, height);
    svg_escaped(b, spec, 200);
    strbuf_printf(b, " (%d x %d) in %d x %d blocks</title>\n", lq, lk, bq, bk);
    strbuf_printf(b, "<rect width=\"%.2f\" height=\"%.2f\" fill=\"#fff\" stroke=\"#999\" "
                  "stroke-width=\"0.5\"/>\n<g shape-rendering=\"crispEdges\" stroke=\"none\">\n",
                  gw, gh);
    for (int i = 0; i < nqb; i++) {
        const unsigned char *row = map + (size_t)i * (size_t)nkb;
        for (int j = 0; j < nkb;) {
            int k = j;
            while (k < nkb && row[k] == row[j])
                k++;
            if (row[j] != STOF_BLOCK_EMPTY)
                strbuf_printf(b,
                              "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
                              "fill=\"#%02x%02x%02x\"/>\n",
                              j * cell, i * cell, (k - j) * cell, cell, PICTURE_RGB[row[j]][0],
                              PICTURE_RGB[row[j]][1], PICTURE_RGB[row[j]][2]);
            j = k;
        }
    }
    strbuf_printf(b, "</g>\n<text x=\"0\" y=\"%.2f\">", gh + 17);
    svg_escaped(b, spec, 60);
    strbuf_printf(b, " (%d x %d), %d x %d blocks</text>\n", lq, lk, bq, bk);
    static const char *names[3] = {"empty", "partial", "full"};
    double x = 0;
    for (int kind = 2; kind >= 0; kind--) {
        strbuf_printf(b,
                      "<rect x=\"%.0f\" y=\"%.2f\" width=\"10\" height=\"10\" "
                      "fill=\"#%02x%02x%02x\" stroke=\"#999\" stroke-width=\"0.5\"/>"
                      "<text x=\"%.0f\" y=\"%.2f\">%s %lld</text>\n",
                      x, gh + 26, PICTURE_RGB[kind][0], PICTURE_RGB[kind][1],
                      PICTURE_RGB[kind][2], x + 14, gh + 35, names[kind], n[kind]);
        x += 120;
    }
    strbuf_puts(b, "</svg>\n");
}

static uint32_t png_crc(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1)));
    }
    return ~crc;
}

static void put_be32(strbuf *b, uint32_t v)
{
    unsigned char c[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 8), (unsigned char)v};
    strbuf_add(b, (const char *)c, 4);
}

static void png_chunk(strbuf *b, const char *type, const unsigned char *data, size_t n)
{
    put_be32(b, (uint32_t)n);
    size_t at = b->len;
    strbuf_add(b, type, 4);
    if (n)
        strbuf_add(b, (const char *)data, n);
    put_be32(b, b->oom ? 0 : png_crc(0, (const unsigned char *)b->p + at, n + 4));
}

/* A palette PNG, one block an s x s square (the longer side about 512 px),
 * its image data in stored (uncompressed) deflate blocks: no zlib needed. */
void mask_picture_png(strbuf *b, const unsigned char *map, int nqb, int nkb)
{
    int longer = nqb > nkb ? nqb : nkb;
    int s = 512 / longer > 1 ? 512 / longer : 1;
    uint32_t w = (uint32_t)nkb * (uint32_t)s, h = (uint32_t)nqb * (uint32_t)s;
    size_t line = (size_t)w + 1, raw_len = line * h;
    unsigned char *raw = malloc(raw_len);
    size_t nblocks = raw_len / 65535 + 1;
    unsigned char *z = malloc(2 + raw_len + 5 * nblocks + 4);
    if (!raw || !z) {
        free(raw);
        free(z);
        b->oom = 1;
        return;
    }
    for (uint32_t y = 0; y < h; y++) {
        unsigned char *o = raw + (size_t)y * line;
        const unsigned char *row = map + (size_t)(y / (uint32_t)s) * (size_t)nkb;
        *o++ = 0; /* filter: none */
        for (uint32_t x = 0; x < w; x++)
            *o++ = row[x / (uint32_t)s];
    }
    size_t zn = 0;
    z[zn++] = 0x78;
    z[zn++] = 0x01;
    for (size_t at = 0; at < raw_len; at += 65535) {
        size_t len = raw_len - at < 65535 ? raw_len - at : 65535;
        z[zn++] = at + len >= raw_len;   /* BFINAL on the last, BTYPE 00: stored */
        z[zn++] = (unsigned char)len;
        z[zn++] = (unsigned char)(len >> 8);
        z[zn++] = (unsigned char)~len;
        z[zn++] = (unsigned char)(~len >> 8);
        memcpy(z + zn, raw + at, len);
        zn += len;
    }
    uint32_t a = 1, bsum = 0;
    for (size_t i = 0; i < raw_len; i++) {
        a = (a + raw[i]) % 65521;
        bsum = (bsum + a) % 65521;
    }
    uint32_t adler = bsum << 16 | a;
    for (int i = 3; i >= 0; i--)
        z[zn++] = (unsigned char)(adler >> (8 * i));
    strbuf_add(b, "\x89PNG\r\n\x1a\n", 8);
    unsigned char ihdr[13] = {(unsigned char)(w >> 24), (unsigned char)(w >> 16),
                              (unsigned char)(w >> 8), (unsigned char)w,
                              (unsigned char)(h >> 24), (unsigned char)(h >> 16),
                              (unsigned char)(h >> 8), (unsigned char)h,
                              8, 3, 0, 0, 0}; /* 8-bit palette indices */
    png_chunk(b, "IHDR", ihdr, sizeof ihdr);
    png_chunk(b, "PLTE", &PICTURE_RGB[0][0], sizeof PICTURE_RGB);
    png_chunk(b, "IDAT", z, zn);
    png_chunk(b, "IEND", NULL, 0);
    free(raw);
    free(z);
}
