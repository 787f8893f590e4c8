/*
 * cache_btree — what a damaged cache file's surviving table b-tree pages
 * say about the rows on its missing pages, for the salvage (cache_salvage):
 * a table's root page by its name in the schema on page 1, and the rowid
 * ranges under the children of its interior pages that are gone. Rows on a
 * missing leaf that no surviving index names are otherwise uncounted; the
 * ranges count them (each rowid once; SQLite gives a new row the next
 * rowid, so a range holds as many rows as rowids while no row in it was
 * replaced). It reads bytes through the caller's page lookup only.
 */
#ifndef STOF_CACHE_BTREE_H
#define STOF_CACHE_BTREE_H

#include <stddef.h>
#include <stdint.h>

/* Page pgno (1-based), or NULL where it is missing or on the freelist. */
typedef const unsigned char *(*cache_btree_page_fn)(void *arg, long long pgno);

/* A varint at p (at most avail bytes): its length, or 0 when it does not fit. */
int cache_btree_varint(const unsigned char *p, size_t avail, uint64_t *v);

/* The bytes a value of record serial type t takes. */
uint64_t cache_btree_serial_size(uint64_t t);

/* The root page of table `name` in the schema (sqlite_master) whose page 1
 * is page1 (usable bytes a page), or 0 when page 1 does not say. */
long long cache_btree_root(const unsigned char *page1, uint32_t usable, const char *name);

/* How many rows of table `name` lay on its missing pages: walks the table
 * b-tree from its root through page (at most max_pages interior pages: a
 * file whose pages point in circles ends there) and counts the rowids
 * under each missing child, each once, up to max_rowid (the highest rowid
 * known anywhere, for the last child, which has no bound above), leaving
 * out the n rowids (rows read or named elsewhere; sorted here, in place).
 * *pages is the number of missing children. -1 when out of memory. */
long long cache_btree_missing(cache_btree_page_fn page, void *arg, uint32_t usable,
                              const char *name, long long max_pages, int64_t *rowids, size_t n,
                              int64_t max_rowid, int *pages);

#endif
