#include "tools/dump_stats.h"

#include <stdio.h>

#include "cache/cache_admin.h"
#include "codegen/nvrtc_drv.h"
#include "tools/cli.h"

static void group_json(json_out *o, const cache_group_stats *g)
{
    json_begin_object(o);
    if (g->op[0]) {
        json_key(o, "op");
        json_string(o, g->op);
        json_key(o, "arch");
        json_string(o, g->arch);
    }
    const struct { const char *k; long long v; } nums[] = {
        {"kernels", g->kernels},       {"cubin_bytes", g->cubin_bytes}, {"ptx_bytes", g->ptx_bytes},
        {"source_bytes", g->source_bytes}, {"hits", g->hits},          {"used", g->used}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        json_key(o, nums[i].k);
        json_int_out(o, nums[i].v);
    }
    json_key(o, "hit_rate");
    json_double(o, cache_admin_hit_rate(g));
    json_key(o, "compile_ms");
    json_double(o, g->compile_ms);
    json_key(o, "saved_ms");
    json_double(o, g->saved_ms);
    json_end_object(o);
}

static void group_text(const cache_group_stats *g, const char *op, const char *arch)
{
    char b1[32], b2[32], b3[32];
    printf("%-12s  %-8s  %7lld  %10s  %10s  %10s  %6lld  %5lld  %7.1f%%  %8.2f s  %8.2f s\n", op,
           arch, g->kernels, dump_cmd_bytes(g->cubin_bytes, b1), dump_cmd_bytes(g->ptx_bytes, b2),
           dump_cmd_bytes(g->source_bytes, b3), g->hits, g->used, 100.0 * cache_admin_hit_rate(g),
           g->compile_ms / 1000.0, g->saved_ms / 1000.0);
}

int dump_stats(dump_cmd *d)
{
    cache_stats s;
    if (cache_admin_stats(&d->err, d->c, &s) != STOF_OK)
        return dump_cmd_fail(d, "stats");
    if (d->a->json) {
        json_out o;
        dump_cmd_doc(&o, cache_file(d->c), NULL);
        const struct { const char *k; long long v; } nums[] = {
            {"schema", s.schema}, {"file_bytes", s.file_bytes}, {"wal_bytes", s.wal_bytes},
            {"kernels", s.total.kernels}, {"tuning", s.tuning}, {"derived", s.derived},
            {"derived_bytes", s.derived_bytes}};
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
            json_key(&o, nums[i].k);
            json_int_out(&o, nums[i].v);
        }
        json_key(&o, "groups");
        json_begin_array(&o);
        for (int i = 0; i < s.n_groups; i++)
            group_json(&o, &s.groups[i]);
        json_end_array(&o);
        json_key(&o, "total");
        group_json(&o, &s.total);
        json_key(&o, "remote");
        json_begin_object(&o);
        const struct { const char *k; long long v; } rem[] = {
            {"hits", s.remote.hits},       {"misses", s.remote.misses},
            {"refused", s.remote.refused}, {"written", s.remote.written},
            {"errors", s.remote.errors}};
        for (size_t i = 0; i < sizeof rem / sizeof rem[0]; i++) {
            json_key(&o, rem[i].k);
            json_int_out(&o, rem[i].v);
        }
        json_end_object(&o);
        json_end_object(&o);
        json_out_end(&o);
    } else {
        char b1[32], b2[32];
        printf("cache     %s (schema %d; %s file, %s WAL)\n", cache_file(d->c), s.schema,
               dump_cmd_bytes(s.file_bytes, b1), dump_cmd_bytes(s.wal_bytes, b2));
        printf("versions  stof %s, NVRTC %s\n\n", stof_version(), nvrtc_version_string());
        printf("%-12s  %-8s  %7s  %10s  %10s  %10s  %6s  %5s  %8s  %10s  %10s\n", "OP", "ARCH",
               "KERNELS", "BINARIES", "PTX", "SOURCES", "HITS", "USED", "HIT RATE", "COMPILE",
               "SAVED");
        for (int i = 0; i < s.n_groups; i++)
            group_text(&s.groups[i], s.groups[i].op, s.groups[i].arch);
        group_text(&s.total, "total", "");
        printf("\ntuning records: %lld\n", s.tuning);
        char b3[32];
        printf("derived rows:   %lld (%s: masks' hashes and tiles, kernels' binary sums, so that "
               "cached plans walk no mask and load no PTX; remade on a miss)\n",
               s.derived, dump_cmd_bytes(s.derived_bytes, b3));
        if (s.remote_used)
            printf("remote tier:    %lld hit%s, %lld miss%s, %lld refused, %lld written, "
                   "%lld failed exchange%s (counted on this host)\n",
                   s.remote.hits, s.remote.hits == 1 ? "" : "s", s.remote.misses,
                   s.remote.misses == 1 ? "" : "es", s.remote.refused, s.remote.written,
                   s.remote.errors, s.remote.errors == 1 ? "" : "s");
        else
            printf("remote tier:    never used with this file\n");
        printf("hit rate = hits / (hits + kernels): lookups that found their kernel here instead\n"
               "of compiling it; saved = NVRTC time those hits did not spend\n");
    }
    cache_stats_free(&s);
    return 0;
}
