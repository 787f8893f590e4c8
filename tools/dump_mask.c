#include "tools/dump_mask.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn/mha.h"
#include "tools/cli.h"

static const char *engine_of(const mha_candidate *c)
{
    return c->wg == MHA_WS ? "wgmma-ws" : c->wg ? "wgmma" : "mma.sync";
}

static const char *kind_of(const mha_candidate *c)
{
    return c->kind == ATTN_GATHER ? "gather" : "block";
}

/* The block map, one character a cell: '#' every block full, '.' every one
 * empty, '+' anything else; a cell is g x g blocks where the grid is wider
 * than 64. */
static void print_map(const unsigned char *map, int nqb, int nkb)
{
    int longer = nqb > nkb ? nqb : nkb, g = (longer + 63) / 64;
    int rows = (nqb + g - 1) / g, cols = (nkb + g - 1) / g;
    if (g == 1)
        printf("map        # full, + partial, . empty: a character a block, query blocks down, key "
               "blocks across\n");
    else
        printf("map        # all full, . all empty, + mixed or partial: a character for %d x %d "
               "blocks\n", g, g);
    if (cols >= 10) {
        printf("%11s", "");
        for (int c = 0; c < cols; c++)
            putchar(c % 10 == 0 ? (char)('0' + c / 10 % 10) : ' ');
        putchar('\n');
    }
    printf("%11s", "");
    for (int c = 0; c < cols; c++)
        putchar((char)('0' + c % 10));
    putchar('\n');
    for (int r = 0; r < rows; r++) {
        printf("%9d  ", r * g);
        for (int c = 0; c < cols; c++) {
            int full = 1, empty = 1;
            for (int i = r * g; i < (r + 1) * g && i < nqb; i++)
                for (int j = c * g; j < (c + 1) * g && j < nkb; j++) {
                    unsigned char b = map[(size_t)i * (size_t)nkb + (size_t)j];
                    full &= b == STOF_BLOCK_FULL;
                    empty &= b == STOF_BLOCK_EMPTY;
                }
            putchar(full ? '#' : empty ? '.' : '+');
        }
        putchar('\n');
    }
}

static void print_blocks(const stof_mask_info *in, const unsigned char *map)
{
    long long total = (long long)in->n_qblocks * in->n_kblocks;
    long long in_range = (long long)in->lq * in->lk;
    printf("entries    %lld of %lld allowed (%.1f%%); a row allows %d to %d key%s (mean %.1f, "
           "%.1f run%s)%s\n",
           in->entries, in_range, 100.0 * in->density, in->row_min, in->row_max,
           cli_s(in->row_max), in->row_mean, in->runs_mean, in->runs_mean == 1.0 ? "" : "s",
           in->empty_rows ? "; some rows allow none" : "");
    printf("blocks     %d x %d: %d x %d = %lld block%s: %lld full, %lld partial, %lld empty\n",
           in->block_q, in->block_k, in->n_qblocks, in->n_kblocks, total, cli_s(total),
           in->blocks_full,
           in->blocks_partial, total - in->blocks_touched);
    printf("           a block kernel walks %.1f%% of the dense work; %.1f%% of what it walks is "
           "allowed\n",
           100.0 * in->block_density, 100.0 * in->block_efficiency);
    if (in->blocks_partial)
        printf("           partial blocks are %.1f%% allowed on average (%lld distinct bitmaps); "
               "only they need masking\n",
               100.0 * in->partial_fill_mean, in->distinct_bitmaps);
    print_map(map, in->n_qblocks, in->n_kblocks);
}

/* The ranking, and a sentence on why the first won. */
static void print_model(const stof_mha_desc *d, const char *arch, const model_device *md,
                        const stof_mask_info *at64, const mha_ranked *r, int n)
{
    printf("model      b=%d h=%d d=%d %s on %s, %s figures (%d SMs; dense attention %.0f "
           "TFLOP/s on mma.sync",
           d->batch, d->heads, d->head_dim, d->dtype == STOF_BF16 ? "bf16" : "fp16", arch,
           md->measured ? "this GPU's measured" : "the arch's default", md->sm_count,
           md->mma_tflops);
    if (md->wgmma_tflops > 0)
        printf(", %.0f on wgmma, %.0f warp-specialized", md->wgmma_tflops, md->ws_tflops);
    printf("; %.0f GB/s)\n", md->mem_gbs);
    if (at64->block_efficiency < MHA_GATHER_BELOW)
        printf("           block efficiency at 64 x 64 is %.1f%%, below %.0f%%: the gather kind "
               "(rows grouped by shared keys, keys compacted into dense tiles) competes too\n",
               100.0 * at64->block_efficiency, 100.0 * MHA_GATHER_BELOW);
    else
        printf("           block efficiency at 64 x 64 is %.1f%% (%.0f%% or more): block tiles "
               "waste little, so only the block kind competes\n",
               100.0 * at64->block_efficiency, 100.0 * MHA_GATHER_BELOW);
    printf("  rank     %-7s %-9s %-17s %-36s %s\n", "KIND", "ENGINE", "TILE", "WALKS PER HEAD",
           "PREDICTED");
    int shown = n < 8 ? n : 8;
    for (int i = 0; i < shown; i++) {
        const mha_candidate *c = &r[i].c;
        long long dense =
            (long long)((d->seq_q + c->bm - 1) / c->bm) * ((d->seq_k + c->bn - 1) / c->bn);
        char tile[32], walks[96];
        if (c->wg)
            snprintf(tile, sizeof tile, "%dx%d %d stages", c->bm, c->bn, c->st);
        else
            snprintf(tile, sizeof tile, "%dx%d%s%s", c->bm, c->bn, c->mt == 2 ? " 2 rows" : "",
                     c->qs ? " q smem" : "");
        snprintf(walks, sizeof walks, "%lld of %lld tiles (%.1f%%), %lld full", r[i].tiles, dense,
                 dense ? 100.0 * (double)r[i].tiles / (double)dense : 0.0, r[i].full_tiles);
        printf("  %4d     %-7s %-9s %-17s %-36s %.4f ms\n", i + 1, kind_of(c), engine_of(c), tile,
               walks, r[i].predicted_ms);
    }
    if (n > shown)
        printf("  ... and %d more candidate%s\n", n - shown, cli_s(n - shown));
    if (n == 0)
        return;
    const mha_ranked *w = &r[0], *other = NULL;
    for (int i = 1; i < n && !other; i++)
        if (r[i].c.kind != w->c.kind)
            other = &r[i];
    printf("pick       %s on %s, %d x %d tiles: predicted %.4f ms", kind_of(&w->c),
           engine_of(&w->c), w->c.bm, w->c.bn, w->predicted_ms);
    if (other && other->predicted_ms > 0)
        printf(", %.2fx ahead of the best %s kernel (%s %dx%d, %.4f ms)",
               other->predicted_ms / w->predicted_ms, kind_of(&other->c), engine_of(&other->c),
               other->c.bm, other->c.bn, other->predicted_ms);
    printf("\n           the model's first choice; on a GPU the search (stof_mha_plan_create, "
           "stof-warm) times the best few\n           and keeps the fastest: `stof-dump tuning "
           "--mask SPEC` shows what it kept\n");
}

int dump_mask(const dump_args *a)
{
    const int lq = a->lq, lk = a->lk, bq = a->bq, bk = a->bk;
    const char *arch = a->arch ? a->arch : "sm_90a";
    stof_options opt = {.no_cache = 1, .arch = arch};
    stof_ctx *ctx = NULL;
    if (stof_open(&ctx, &opt) != STOF_OK)
        return cli_error(DUMP_PROG, "--arch %s: %s", arch, stof_last_error(NULL));
    stof_mask *m = NULL;
    int rc = 0;
    unsigned char *map = NULL;
    stof_mask_info in, at64;
    if (stof_mask_parse(ctx, a->operand, lq, lk, &m) != STOF_OK) {
        rc = cli_error(DUMP_PROG, "bad mask: %s", stof_last_error(ctx));
        goto done;
    }
    if (stof_mask_stats(ctx, m, bq, bk, &in) != STOF_OK ||
        stof_mask_stats(ctx, m, 64, 64, &at64) != STOF_OK) {
        rc = cli_error(DUMP_PROG, "%s", stof_last_error(ctx));
        goto done;
    }
    map = malloc((size_t)in.n_qblocks * (size_t)in.n_kblocks);
    if (!map || stof_mask_block_map(ctx, m, bq, bk, map) != STOF_OK) {
        fprintf(stderr, "stof-dump: %s\n", map ? stof_last_error(ctx) : "out of memory");
        rc = CLI_EXIT_FAILED;
        goto done;
    }
    char hash[65] = "";
    stof_mask_hash(m, hash);
    printf("mask       %s over %d query row%s x %d key%s (hash %.12s)\n", stof_mask_spec(m), lq,
           cli_s(lq), lk, cli_s(lk), hash);
    print_blocks(&in, map);
    stof_mha_desc d = {.batch = a->batch, .heads = a->heads, .seq_q = lq, .seq_k = lk,
                       .head_dim = a->head_dim, .dtype = a->dtype};
    mha_ranked r[MHA_MAX_CANDIDATES];
    int n = 0;
    model_device md;
    if (mha_rank(ctx, &d, m, r, MHA_MAX_CANDIDATES, &n, &md) == STOF_OK)
        print_model(&d, arch, &md, &at64, r, n);
    else
        printf("model      no ranking: %s\n", stof_last_error(ctx));
    if (a->svg) {
        void *pic = NULL;
        size_t len = 0;
        if (stof_mask_picture(ctx, m, bq, bk, STOF_PICTURE_SVG, &pic, &len) != STOF_OK) {
            fprintf(stderr, "stof-dump: no picture: %s\n", stof_last_error(ctx));
            rc = CLI_EXIT_FAILED;
            goto done;
        }
        FILE *f = fopen(a->svg, "wb");
        int ok = f && fwrite(pic, 1, len, f) == len;
        ok = (f && fclose(f) == 0) && ok;
        stof_mask_picture_free(pic);
        if (!ok) {
            fprintf(stderr, "stof-dump: cannot write %s: %s\n", a->svg, strerror(errno));
            rc = CLI_EXIT_FAILED;
            goto done;
        }
        printf("picture    %s (SVG: %d x %d blocks of %d x %d; dark full, light partial, white "
               "empty)\n",
               a->svg, in.n_qblocks, in.n_kblocks, bq, bk);
    }
done:
    free(map);
    stof_mask_free(m);
    stof_close(ctx);
    return rc;
}
