/*
 * memo — what an attention plan keeps in the cache beside its kernel and
 * its tuning record, so that a cached plan in a fresh process never walks
 * its mask: the mask's canonical hash under its spec and sizes, and the
 * tiles of one kind and tile shape under the mask's hash (the cache's
 * derived rows). Best effort throughout: without a cache, or when it fails,
 * a lookup misses, and a store that fails costs the next process a walk.
 * The context's error record is left as it was.
 */
#ifndef STOF_ATTN_MEMO_H
#define STOF_ATTN_MEMO_H

#include "attn/attn_tiles.h"
#include "stof.h"

/* 1 with hash set when the cache knows the mask's hash. */
int memo_mask_hash(stof_ctx *ctx, const stof_mask *m, char hash[65]);
void memo_put_mask_hash(stof_ctx *ctx, const stof_mask *m, const char *hash);

/* 1 with *out made (attn_tiles_free it) when the cache holds the tiles. */
int memo_tiles(stof_ctx *ctx, const char *hash, attn_kind kind, int bm, int bn, attn_tiles *out);
void memo_put_tiles(stof_ctx *ctx, const char *hash, const attn_tiles *t);

#endif
