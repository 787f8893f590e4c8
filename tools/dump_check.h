/*
 * dump_check — stof-dump's `check`: whether the library would trust the
 * file (who could write it), SQLite's integrity check, every kernel's
 * checksum, stale and orphaned rows, unreadable records; as text or JSON.
 */
#ifndef STOF_DUMP_CHECK_H
#define STOF_DUMP_CHECK_H

#include "tools/dump_cmd.h"

/* The check of the open cache: CLI_EXIT_OK when sound, CLI_EXIT_FAILED when
 * it found damage or the file is not trusted. */
int dump_check(dump_cmd *d);

#endif
