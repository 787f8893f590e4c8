/*
 * cache_salvage — the page scan behind `stof-dump recover`. It reads a cache
 * file's pages itself, never through SQLite's b-trees, so that a truncated
 * file, a lost interior page or a torn overflow chain costs only the rows
 * whose own bytes are gone: every table leaf page still present (in the
 * file, or as a committed frame of its WAL) is read cell by cell, each row
 * put together from its overflow chain and handed on when it is whole and,
 * for a kernel, its checksum holds. Pages on the freelist are skipped, so
 * deleted rows stay deleted. The keys the indexes still list say what was
 * lost. It only reads bytes it is given: cache_recover (cache_recover.h)
 * reads the files and writes the new cache.
 */
#ifndef STOF_CACHE_SALVAGE_H
#define STOF_CACHE_SALVAGE_H

#include <stddef.h>
#include "cache/cache.h"

typedef struct cache_lost {
    char key[65];        /* the kernel's key; "" for a tuning row */
    char what[400];      /* what the row was and why it is lost */
} cache_lost;

/* Where whole rows go as the scan finds them. A key may come more than
 * once (an older copy on a page that was not freed): keep the most
 * recently used kernel and the newest tuning row. A nonzero return stops
 * the scan (a write failed). */
typedef struct cache_salvage_sink {
    int (*kernel)(const cache_kernel *k, void *arg);
    int (*tuning)(const cache_tuning *t, const char *stof_version, void *arg);
    void *arg;
} cache_salvage_sink;

/* What a scan found. */
typedef struct cache_salvage {
    int page_size;
    long long pages_expected;    /* the database's size by its header (or its WAL) */
    long long pages_present;     /* of those, pages the file or the WAL still has whole */
    long long wal_frames;        /* committed WAL frames read */
    long long free_pages;        /* on the freelist: never read for rows */
    long long kernels;           /* distinct kernels kept: whole, checksum holds */
    long long stale_kernels;     /* of those, another stof's or NVRTC's (kept all the same) */
    long long tuning;            /* distinct tuning rows kept: whole */
    long long kernels_damaged;   /* whole rows whose checksum fails */
    long long kernels_cut;       /* rows whose bytes run into missing pages, or lie on them
                                    (kernels_missing) */
    long long kernels_missing;   /* of those, rows wholly on missing pages of the kernels
                                    table that no index names, counted by the rowids the
                                    table's surviving interior pages give those pages (a
                                    kernel replaced there leaves a rowid unused, counted all
                                    the same) */
    long long tuning_cut;
    long long kernels_unseen;    /* named by the key index, their row not found */
    long long tuning_unseen;
    cache_lost *lost;            /* one per kernel key (or tuning row) lost */
    int n_lost;
    long long cap_lost;
} cache_salvage;

/* Scans a database image (db, n bytes: the main file as it is, perhaps
 * truncated) and its WAL (NULL when none), handing whole rows to sink
 * (which may be NULL); rows not of NVRTC nvrtc_version count as stale.
 * Returns 0 and fills *out, or -1 with the reason in
 * why: not a stof cache this stof can read (no SQLite header, an unknown
 * page size or text encoding, a newer schema), out of memory, or the sink
 * stopped it. Free *out with cache_salvage_free either way. */
int cache_salvage_scan(const unsigned char *db, size_t n, const unsigned char *wal, size_t wal_n,
                       const char *nvrtc_version,
                       const cache_salvage_sink *sink, cache_salvage *out, char *why,
                       size_t why_n);
void cache_salvage_free(cache_salvage *s);

#endif
