#include "tools/dump_check.h"

#include <stdio.h>
#include <string.h>

#include "cache/trust.h"
#include "codegen/nvrtc_drv.h"
#include "tools/cli.h"

/* Whether the library would load from the file; why when not. */
static char g_untrusted[1600];

static void trust(const char *path)
{
    char why[sizeof g_untrusted];
    g_untrusted[0] = 0;
    if (!cache_trusted(path, cache_shared_from_env(), why, sizeof why))
        snprintf(g_untrusted, sizeof g_untrusted, "%s", why);
}

static int check_failed(const cache_check *k)
{
    return strcmp(k->integrity, "ok") != 0 || k->damaged > 0 || k->bad_records > 0 ||
           g_untrusted[0];
}

/* The document's head: the file, the verdict, its integrity and trust. */
static void json_head(json_out *o, const char *path, int ok, const char *integrity)
{
    dump_cmd_doc(o, path, NULL);
    json_key(o, "ok");
    json_bool(o, ok);
    json_key(o, "integrity");
    json_string(o, integrity);
    json_key(o, "trusted");
    json_bool(o, !g_untrusted[0]);
    if (g_untrusted[0]) {
        json_key(o, "untrusted");
        json_string(o, g_untrusted);
    }
}

static void check_json(dump_cmd *d, const cache_check *k)
{
    json_out o;
    json_head(&o, cache_file(d->c), !check_failed(k), k->integrity);
    const struct { const char *k; long long v; } nums[] = {
        {"kernels", k->kernels},       {"tuning", k->tuning},           {"damaged", k->damaged},
        {"stale_kernels", k->stale_kernels}, {"stale_tuning", k->stale_tuning},
        {"orphans", k->orphans},       {"bad_records", k->bad_records}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        json_key(&o, nums[i].k);
        json_int_out(&o, nums[i].v);
    }
    json_key(&o, "problems");
    json_begin_array(&o);
    for (int i = 0; i < k->n_problems; i++) {
        json_begin_object(&o);
        json_key(&o, "kind");
        json_string(&o, cache_problem_name(k->problems[i].kind));
        json_key(&o, "key");
        json_string(&o, k->problems[i].key);
        json_key(&o, "what");
        json_string(&o, k->problems[i].what);
        json_end_object(&o);
    }
    json_end_array(&o);
    json_end_object(&o);
    json_out_end(&o);
}

static void text_head(const char *path, const char *integrity)
{
    printf("cache      %s\n", path);
    printf("versions   stof %s, NVRTC %s\n", stof_version(), nvrtc_version_string());
    printf("integrity  %s\n", integrity);
    if (g_untrusted[0])
        printf("trust      REFUSED: %s; the library will not load kernels from this file\n",
               g_untrusted);
    else
        printf("trust      ok (only its owner can write the file and its folder)\n");
}

/* What SQLite cannot read is damaged; recover saves the rest. */
static void damaged_result(const char *path)
{
    printf("result     DAMAGED: SQLite cannot read the whole file; `stof-dump --cache %s "
           "recover NEW.db`\n           copies every intact entry into a new file and lists "
           "what was lost\n",
           path);
}

static void check_text(dump_cmd *d, const cache_check *k)
{
    text_head(cache_file(d->c), k->integrity);
    printf("kernels    %lld (%lld damaged, %lld stale)\n", k->kernels, k->damaged,
           k->stale_kernels);
    printf("tuning     %lld (%lld stale, %lld orphaned, %lld unreadable)\n", k->tuning,
           k->stale_tuning, k->orphans, k->bad_records);
    for (int i = 0; i < k->n_problems; i++)
        printf("%-10s %-12.12s %s\n", cache_problem_name(k->problems[i].kind),
               k->problems[i].key[0] ? k->problems[i].key : "-", k->problems[i].what);
    if (check_failed(k) && strcmp(k->integrity, "ok") != 0)
        damaged_result(cache_file(d->c));
    else if (g_untrusted[0] && strcmp(k->integrity, "ok") == 0 && k->damaged + k->bad_records == 0)
        printf("result     UNTRUSTED: others could have written this file; fix its permissions "
               "(see trust), or rebuild it\n");
    else if (check_failed(k))
        printf("result     DAMAGED: damaged rows are never used (they are recompiled); "
               "`stof-dump prune --stale` removes them\n");
    else if (k->stale_kernels + k->stale_tuning + k->orphans > 0)
        printf("result     ok (stale rows are ignored and `prune --stale` removes them; an "
               "orphaned tuning row's kernel is recompiled when needed)\n");
    else
        printf("result     ok\n");
}

int dump_check_unreadable(const char *path, const char *why, int json)
{
    trust(path);
    if (json) {
        json_out o;
        json_head(&o, path, 0, why);
        json_key(&o, "problems");
        json_begin_array(&o);
        json_begin_object(&o);
        json_key(&o, "kind");
        json_string(&o, "unreadable");
        json_key(&o, "key");
        json_string(&o, "");
        json_key(&o, "what");
        json_string(&o, why);
        json_end_object(&o);
        json_end_array(&o);
        json_end_object(&o);
        json_out_end(&o);
    } else {
        text_head(path, why);
        damaged_result(path);
    }
    return CLI_EXIT_FAILED;
}

int dump_check(dump_cmd *d)
{
    cache_check k;
    trust(cache_file(d->c));
    /* A check that cannot read its way through the file has found damage. */
    if (cache_admin_check(&d->err, d->c, &k) != STOF_OK)
        return dump_check_unreadable(cache_file(d->c), d->err.msg, d->a->json);
    if (d->a->json)
        check_json(d, &k);
    else
        check_text(d, &k);
    int rc = check_failed(&k) ? CLI_EXIT_FAILED : CLI_EXIT_OK;
    cache_check_free(&k);
    return rc;
}
