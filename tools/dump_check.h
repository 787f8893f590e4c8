/*
 * dump_check — stof-dump's `check`: whether the library would trust the
 * file (who could write it), SQLite's integrity check, every kernel's
 * checksum, stale and orphaned rows, unreadable records; as text or JSON.
 * A file SQLite cannot read through is reported as damaged too, with the
 * command that saves what is intact (`recover`).
 */
#ifndef STOF_DUMP_CHECK_H
#define STOF_DUMP_CHECK_H

#include "tools/dump_cmd.h"

/* The check of the open cache: CLI_EXIT_OK when sound, CLI_EXIT_FAILED when
 * it found damage (or could not read the file through) or the file is not
 * trusted. */
int dump_check(dump_cmd *d);

/* The report on a file that could not be opened as a cache because SQLite
 * finds it damaged (why: what it said): CLI_EXIT_FAILED. */
int dump_check_unreadable(const char *path, const char *why, int json);

#endif
