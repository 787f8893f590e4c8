/*
 * fuzz_cache — the cache readers on hostile files. An input is a database
 * image, or "STOFWAL1", a 4-byte little-endian length n, n bytes of
 * database and then its WAL. Each input goes through:
 *   - the salvage scan (cache_salvage.c) on the bytes: every row it hands
 *     over is a sound kernel (its checksum holds) or a whole tuning row,
 *     and its counts agree;
 *   - the file on disk: the probe, then, for what opens, the cache as the
 *     library reads it (list, get with checksum verification, tuning
 *     rows, check, stats);
 *   - recovery into a new file, which must then pass the integrity check
 *     with no damaged kernel and hold what the scan kept.
 * Files live in a private folder (under /dev/shm when there is one).
 */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/cache_admin.h"
#include "cache/cache_recover.h"
#include "cache/cache_salvage.h"
#include "codegen/nvrtc_drv.h"
#include "fuzz.h"

static err_record g_err;
static int g_ready;
static char g_dir[256], g_db[300], g_wal[310], g_out[300];

static void clean_dir(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *e;
    char p[600];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        unlink(p);
    }
    if (d)
        closedir(d);
}

static void remove_dir(void)
{
    clean_dir();
    rmdir(g_dir);
}

static void setup(void)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/stof-fuzz-cache-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_dir))
        abort();
    snprintf(g_db, sizeof g_db, "%s/c.db", g_dir);
    snprintf(g_wal, sizeof g_wal, "%s/c.db-wal", g_dir);
    snprintf(g_out, sizeof g_out, "%s/out.db", g_dir);
    atexit(remove_dir);
    g_ready = 1;
}

static void write_file(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f != NULL, "cannot write %s", path);
    FUZZ_CHECK(fwrite(p, 1, n, f) == n, "short write");
    fclose(f);
}

typedef struct tally {
    long long kernels, tuning;
} tally;

static int is_hex_key(const char *k)
{
    return strlen(k) == 64 && strspn(k, "0123456789abcdef") == 64;
}

static int salvaged_kernel(const cache_kernel *k, void *arg)
{
    char sum[65];
    cache_checksum(k->cubin, k->cubin_size, k->ptx, k->ptx_size, sum);
    FUZZ_CHECK(is_hex_key(k->key), "a salvaged kernel's key");
    FUZZ_CHECK(k->cubin_size > 0 && strcmp(sum, k->checksum) == 0, "an unsound kernel salvaged");
    FUZZ_CHECK(k->op && k->name && k->entry && k->arch && k->nvrtc_version && k->stof_version &&
                   k->options && k->params && k->source && k->log,
               "a salvaged kernel with a NULL column");
    ((tally *)arg)->kernels++;
    return 0;
}

static int salvaged_tuning(const cache_tuning *t, const char *ver, void *arg)
{
    FUZZ_CHECK(t->op && t->mask_hash && t->shape && t->dtype && t->arch && t->record && ver,
               "a salvaged tuning row with a NULL column");
    ((tally *)arg)->tuning++;
    return 0;
}

static void scan(const uint8_t *db, size_t n, const uint8_t *wal, size_t wal_n)
{
    tally t = {0, 0};
    cache_salvage_sink sink = {salvaged_kernel, salvaged_tuning, &t};
    cache_salvage s;
    char why[512];
    int rc = cache_salvage_scan(db, n, wal, wal_n, nvrtc_version_string(), &sink, &s, why, sizeof why);
    if (rc != 0) {
        FUZZ_CHECK(why[0], "a refused scan without a reason");
        cache_salvage_free(&s);
        return;
    }
    FUZZ_CHECK(s.kernels <= t.kernels && s.tuning <= t.tuning, "kept %lld/%lld of %lld/%lld",
               s.kernels, s.tuning, t.kernels, t.tuning);
    FUZZ_CHECK(s.stale_kernels <= s.kernels, "stale %lld of %lld", s.stale_kernels, s.kernels);
    FUZZ_CHECK(s.pages_present <= s.pages_expected || s.pages_expected == 0,
               "pages %lld of %lld", s.pages_present, s.pages_expected);
    FUZZ_CHECK(s.n_lost <= s.kernels_damaged + s.kernels_cut + s.kernels_unseen + s.tuning_cut +
                               s.tuning_unseen,
               "lost %d", s.n_lost);
    for (int i = 0; i < s.n_lost; i++)
        FUZZ_CHECK(!s.lost[i].key[0] || is_hex_key(s.lost[i].key), "a lost key");
    cache_salvage_free(&s);
}

static int read_listed(const cache_kernel *k, void *arg)
{
    cache *c = arg;
    cache_kernel full;
    int found = 0, rejected = 0;
    if (cache_get_kernel(&g_err, c, k->key, &full, &found, &rejected) == STOF_OK && found) {
        char sum[65];
        cache_checksum(full.cubin, full.cubin_size, full.ptx, full.ptx_size, sum);
        FUZZ_CHECK(strcmp(sum, full.checksum) == 0 && full.cubin_size > 0,
                   "cache_get_kernel found an unsound kernel");
        cache_kernel_free(&full);
    }
    return 0;
}

static int read_tuning(const cache_tuning *t, const char *ver, void *arg)
{
    (void)arg;
    (void)ver;
    char keys[8][65];
    cache_admin_record_kernels(t->record, keys, 8);
    return 0;
}

/* The file as the library and the tools read it. */
static void as_a_cache(void)
{
    char why[1400];
    cache_probe_result p = cache_admin_probe(g_db, why, sizeof why);
    FUZZ_CHECK(p >= CACHE_PROBE_OK && p <= CACHE_PROBE_DAMAGED, "probe %d", (int)p);
    if (p == CACHE_PROBE_BAD || p == CACHE_PROBE_DAMAGED)
        FUZZ_CHECK(why[0], "a bad file without a reason");
    if (p != CACHE_PROBE_OK)
        return;
    cache *c = NULL;
    if (cache_open(&g_err, g_db, 0, nvrtc_version_string(), &c) != STOF_OK)
        return;
    cache_list_kernels(&g_err, c, NULL, NULL, read_listed, c);
    cache_admin_list_tuning(&g_err, c, NULL, read_tuning, NULL);
    cache_check k;
    if (cache_admin_check(&g_err, c, &k) == STOF_OK)
        cache_check_free(&k);
    cache_stats st;
    if (cache_admin_stats(&g_err, c, &st) == STOF_OK)
        cache_stats_free(&st);
    cache_close(c);
}

/* Recovery writes a sound cache, or nothing. */
static void recover(void)
{
    cache_salvage s;
    struct stat st;
    if (cache_recover(&g_err, g_db, g_out, nvrtc_version_string(), &s) != STOF_OK) {
        FUZZ_CHECK(stat(g_out, &st) != 0, "a failed recovery left %s", g_out);
        return;
    }
    cache *c = NULL;
    FUZZ_CHECK(cache_open(&g_err, g_out, 0, nvrtc_version_string(), &c) == STOF_OK, "the recovered file does not open: %s",
               g_err.msg);
    cache_check k;
    FUZZ_CHECK(cache_admin_check(&g_err, c, &k) == STOF_OK, "checking the recovered file: %s",
               g_err.msg);
    FUZZ_CHECK(strcmp(k.integrity, "ok") == 0 && k.damaged == 0,
               "the recovered file is not sound: integrity %s, %lld damaged", k.integrity,
               k.damaged);
    FUZZ_CHECK(k.kernels == s.kernels && k.tuning == s.tuning,
               "recovered %lld kernels and %lld tuning rows, the file holds %lld and %lld",
               s.kernels, s.tuning, k.kernels, k.tuning);
    cache_check_free(&k);
    cache_close(c);
    cache_salvage_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_ready)
        setup();
    const uint8_t *db = data, *wal = NULL;
    size_t n = size, wal_n = 0;
    if (size >= 12 && memcmp(data, "STOFWAL1", 8) == 0) {
        size_t k = (size_t)data[8] | (size_t)data[9] << 8 | (size_t)data[10] << 16 |
                   (size_t)data[11] << 24;
        db = data + 12;
        n = k < size - 12 ? k : size - 12;
        wal = db + n;
        wal_n = size - 12 - n;
    }
    scan(db, n, wal, wal_n);
    clean_dir();
    write_file(g_db, db, n);
    if (wal)
        write_file(g_wal, wal, wal_n);
    /* The library's own open may change the file (WAL mode, a checkpoint):
     * recovery reads it first. */
    recover();
    as_a_cache();
    return 0;
}
