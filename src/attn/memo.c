#include "attn/memo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mask.h"
#include "cache/cache.h"
#include "gpu/jit.h"

static void tiles_key(const char *hash, attn_kind kind, int bm, int bn, char *key, size_t n)
{
    snprintf(key, n, "%s %s %dx%d", hash, kind == ATTN_GATHER ? "gather" : "block", bm, bn);
}

/* The derived row (kind, key), or NULL; the error record left as it was. */
static void *get_row(stof_ctx *ctx, const char *kind, const char *key, size_t *n)
{
    err_record saved = ctx->err;
    void *data = NULL;
    int found = 0;
    if (cache_get_derived(&ctx->err, ctx->cache, kind, key, &data, n, &found) != STOF_OK)
        ctx->err = saved;
    jit_cache_check(ctx);
    return found ? data : NULL;
}

static void put_row(stof_ctx *ctx, const char *kind, const char *key, const void *data, size_t n)
{
    err_record saved = ctx->err;
    if (cache_put_derived(&ctx->err, ctx->cache, kind, key, data, n) != STOF_OK)
        ctx->err = saved;
    jit_cache_check(ctx);
}

int memo_mask_hash(stof_ctx *ctx, const stof_mask *m, char hash[65])
{
    char key[65];
    if (!ctx->cache || !mask_spec_key(m, key))
        return 0;
    size_t n = 0;
    char *data = get_row(ctx, "mask hash", key, &n);
    int ok = data && n == 64 && strspn(data, "0123456789abcdef") >= 64;
    if (ok) {
        memcpy(hash, data, 64);
        hash[64] = 0;
    }
    free(data);
    return ok;
}

void memo_put_mask_hash(stof_ctx *ctx, const stof_mask *m, const char *hash)
{
    char key[65];
    if (ctx->cache && mask_spec_key(m, key))
        put_row(ctx, "mask hash", key, hash, 64);
}

int memo_tiles(stof_ctx *ctx, const char *hash, attn_kind kind, int bm, int bn, attn_tiles *out)
{
    if (!ctx->cache)
        return 0;
    char key[160];
    tiles_key(hash, kind, bm, bn, key, sizeof key);
    size_t n = 0;
    void *data = get_row(ctx, "tiles", key, &n);
    int ok = data && attn_tiles_decode(data, n, out);
    free(data);
    if (ok && (out->kind != kind || out->bm != bm || out->bn != bn)) {
        attn_tiles_free(out);
        ok = 0;
    }
    return ok;
}

void memo_put_tiles(stof_ctx *ctx, const char *hash, const attn_tiles *t)
{
    if (!ctx->cache)
        return;
    char key[160];
    tiles_key(hash, t->kind, t->bm, t->bn, key, sizeof key);
    size_t n = 0;
    void *data = attn_tiles_encode(t, &n);
    if (data)
        put_row(ctx, "tiles", key, data, n);
    free(data);
}
