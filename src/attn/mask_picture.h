/*
 * mask_picture — a mask's block map drawn for people: SVG with a caption
 * and a legend, or a palette PNG written without zlib. It reads only the map
 * (one STOF_BLOCK_* per block) and the caption's figures; attn/mask makes
 * the map and hands the bytes out through stof_mask_picture.
 */
#ifndef STOF_MASK_PICTURE_H
#define STOF_MASK_PICTURE_H

#include "base/strbuf.h"

/* map: nqb x nkb, row-major, of the mask (spec, lq x lk) in bq x bk blocks;
 * nqb and nkb are at least 1. The picture is appended to b; a failed
 * allocation is left in b->oom. */
void mask_picture_svg(strbuf *b, const char *spec, int lq, int lk, const unsigned char *map,
                      int nqb, int nkb, int bq, int bk);
void mask_picture_png(strbuf *b, const unsigned char *map, int nqb, int nkb);

#endif
