/*
 * dump_admin — stof-dump's commands that change or move a cache: `prune`
 * (old, oversized or stale entries, in one transaction), `export` (a
 * consistent copy in a new file), `import` (a cache file merged into this
 * one) and `recover` (every intact entry of a damaged file, read page by
 * page, copied into a new cache, with what was lost listed). The last two
 * copy kernels only from a file the library would load from, or one the
 * user vouches for (--trust-source, with a warning where the library would
 * not); a refusal says how to vouch.
 */
#ifndef STOF_DUMP_ADMIN_H
#define STOF_DUMP_ADMIN_H

#include "tools/dump_cmd.h"

/* Each returns the exit status. */
int dump_admin_prune(dump_cmd *d);
int dump_admin_export(dump_cmd *d);
int dump_admin_import(dump_cmd *d);

/* Reads the damaged file src itself (no SQLite connection ever opens it)
 * into a->operand: CLI_EXIT_FAILED when entries may be lost. */
int dump_admin_recover(err_record *err, const dump_args *a, const char *src);

#endif
