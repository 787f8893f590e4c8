#include "tools/dump_admin.h"

#include <stdio.h>
#include <sys/stat.h>

#include "cache/cache_admin.h"
#include "cache/cache_recover.h"
#include "cache/trust.h"
#include "codegen/nvrtc_drv.h"
#include "tools/cli.h"

/* ---- the source of import and recover ---- */

/* The cache layer refuses to copy kernels from a file the library would not
 * load from (trust.h) into a cache it loads, unless the user vouches for it
 * (--trust-source). The flags for the cache layer; with --trust-source on a
 * file the library would refuse, a warning first. */
static unsigned source_flags(const dump_args *a, const char *file, const char *cache)
{
    char why[1200];
    if (!a->trust_source)
        return 0;
    if (!cache_trusted(file, cache_shared_from_env(), why, sizeof why))
        fprintf(stderr, "%s: warning: %s is not a file stof would load kernels from (%s); "
                        "--trust-source copies it all the same, and its kernels will run as %s's "
                        "own\n",
                DUMP_PROG, file, why, cache);
    return CACHE_SOURCE_VOUCHED;
}

/* After a failure: what to do, when the source's trust was the reason. */
static void source_hint(const dump_args *a, const char *file, const char *cache)
{
    char why[1200];
    if (!a->trust_source && !cache_trusted(file, cache_shared_from_env(), why, sizeof why))
        fprintf(stderr, "%s: if you know where %s came from, --trust-source copies it anyway; "
                        "its kernels will then be loaded from %s\n",
                DUMP_PROG, file, cache);
}

/* ---- prune, export, import ---- */

int dump_admin_prune(dump_cmd *d)
{
    cache_prune_result r;
    if (cache_admin_prune(&d->err, d->c, &d->a->prune, &r) != STOF_OK)
        return dump_cmd_fail(d, "prune");
    char b[32];
    if (r.kernels + r.tuning + r.derived == 0)
        printf("nothing to prune\n");
    else
        printf("pruned %lld kernel%s (%s), %lld tuning record%s and %lld derived row%s%s\n",
               r.kernels, r.kernels == 1 ? "" : "s", dump_cmd_bytes(r.bytes, b), r.tuning,
               r.tuning == 1 ? "" : "s", r.derived, r.derived == 1 ? "" : "s",
               r.compacted ? "; the file was compacted" : "");
    return 0;
}

int dump_admin_export(dump_cmd *d)
{
    cache_stats s;
    if (cache_admin_export(&d->err, d->c, d->a->operand) != STOF_OK)
        return dump_cmd_fail(d, "export");
    if (cache_admin_stats(&d->err, d->c, &s) == STOF_OK) {
        char b[32];
        struct stat st;
        long long size = stat(d->a->operand, &st) == 0 ? (long long)st.st_size : 0;
        printf("exported %lld kernel%s and %lld tuning record%s to %s (%s)\n", s.total.kernels,
               s.total.kernels == 1 ? "" : "s", s.tuning, s.tuning == 1 ? "" : "s", d->a->operand,
               dump_cmd_bytes(size, b));
        cache_stats_free(&s);
    }
    return 0;
}

int dump_admin_import(dump_cmd *d)
{
    cache_import_result r;
    const char *file = d->a->operand;
    unsigned flags = source_flags(d->a, file, cache_file(d->c));
    if (cache_admin_import_flags(&d->err, d->c, file, flags, &r) != STOF_OK) {
        int rc = dump_cmd_fail(d, "import");
        source_hint(d->a, file, cache_file(d->c));
        return rc;
    }
    printf("imported from %s into %s\n", d->a->operand, cache_file(d->c));
    printf("kernels  %lld added, %lld already here, %lld damaged (skipped), %lld stale (skipped)\n",
           r.kernels_added, r.kernels_present, r.kernels_damaged, r.kernels_stale);
    printf("tuning   %lld added, %lld kept (as new or newer here), %lld stale (skipped)\n",
           r.tuning_added, r.tuning_kept, r.tuning_stale);
    return 0;
}

/* ---- recover ---- */

static void recover_json(const char *src, const char *dst, const cache_salvage *r)
{
    json_out o;
    json_out_init(&o, stdout, 1);
    json_begin_object(&o);
    json_key(&o, "source");
    json_string(&o, src);
    json_key(&o, "output");
    json_string(&o, dst);
    const struct { const char *k; long long v; } nums[] = {
        {"page_size", r->page_size},         {"pages_expected", r->pages_expected},
        {"pages_present", r->pages_present}, {"wal_frames", r->wal_frames},
        {"free_pages", r->free_pages},       {"kernels", r->kernels},
        {"stale_kernels", r->stale_kernels}, {"tuning", r->tuning},
        {"kernels_damaged", r->kernels_damaged}, {"kernels_cut", r->kernels_cut},
        {"kernels_missing", r->kernels_missing}, {"kernels_unseen", r->kernels_unseen},
        {"tuning_cut", r->tuning_cut},
        {"tuning_unseen", r->tuning_unseen}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        json_key(&o, nums[i].k);
        json_int_out(&o, nums[i].v);
    }
    json_key(&o, "lost");
    json_begin_array(&o);
    for (int i = 0; i < r->n_lost; i++) {
        json_begin_object(&o);
        json_key(&o, "key");
        json_string(&o, r->lost[i].key);
        json_key(&o, "what");
        json_string(&o, r->lost[i].what);
        json_end_object(&o);
    }
    json_end_array(&o);
    json_end_object(&o);
    json_out_end(&o);
}

static void recover_text(const char *src, const char *dst, const cache_salvage *r)
{
    long long lost_k = r->kernels_damaged + r->kernels_cut + r->kernels_unseen;
    long long lost_t = r->tuning_cut + r->tuning_unseen;
    long long missing = r->pages_expected - r->pages_present;
    printf("recovered  %s into %s\n", src, dst);
    printf("pages      %lld of %lld present (%lld missing; %d-byte pages), %lld WAL frame%s, "
           "%lld free\n",
           r->pages_present, r->pages_expected, missing, r->page_size, r->wal_frames,
           r->wal_frames == 1 ? "" : "s", r->free_pages);
    printf("kernels    %lld kept (%lld stale), %lld lost: %lld cut off (%lld of them wholly on "
           "missing pages), %lld damaged, %lld named by the key index only\n",
           r->kernels, r->stale_kernels, lost_k, r->kernels_cut, r->kernels_missing,
           r->kernels_damaged, r->kernels_unseen);
    printf("tuning     %lld kept, %lld lost: %lld cut off, %lld named by their index only\n",
           r->tuning, lost_t, r->tuning_cut, r->tuning_unseen);
    for (int i = 0; i < r->n_lost; i++)
        printf("lost       %-12.12s %s\n", r->lost[i].key[0] ? r->lost[i].key : "-",
               r->lost[i].what);
    /* The kernels table's surviving interior pages give the rowids on its
     * missing pages, but not past the highest rowid the file still shows,
     * and the tuning table is not walked. */
    if (missing > 0)
        printf("note       of the rows on the %lld missing page%s that no surviving index "
               "names, kernels are counted by their rowids, but those past the last rowid the "
               "file shows (the kernels table's last page) and tuning rows cannot be counted\n",
               missing, missing == 1 ? "" : "s");
    printf("result     %s\n", lost_k + lost_t || missing > 0 ? "entries may be lost (above)"
                                                           : "nothing lost");
    printf("next       `stof-dump --cache %s check`; to use it, remove %s and its -wal and -shm "
           "files and move %s there\n",
           dst, src, dst);
}

/* Reads the damaged file itself: no SQLite connection ever opens it. */
int dump_admin_recover(err_record *err, const dump_args *a, const char *src)
{
    cache_salvage r;
    unsigned flags = source_flags(a, src, a->operand);
    if (cache_recover_flags(err, src, a->operand, nvrtc_version_string(), flags, &r) !=
        STOF_OK) {
        fprintf(stderr, "stof-dump: %s\n", err->msg);
        source_hint(a, src, a->operand);
        return CLI_EXIT_USAGE;
    }
    if (a->json)
        recover_json(src, a->operand, &r);
    else
        recover_text(src, a->operand, &r);
    int lost = r.kernels_damaged + r.kernels_cut + r.kernels_unseen + r.tuning_cut +
                   r.tuning_unseen > 0 || r.pages_present < r.pages_expected;
    cache_salvage_free(&r);
    return lost ? CLI_EXIT_FAILED : 0;
}
