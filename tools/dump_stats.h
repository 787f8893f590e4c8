/*
 * dump_stats — stof-dump's `stats`: the file's size and schema, kernels,
 * bytes, hits, hit rates and the NVRTC time saved by op and arch, tuning and
 * derived rows, and the Redis tier's counts; as a table or JSON.
 */
#ifndef STOF_DUMP_STATS_H
#define STOF_DUMP_STATS_H

#include "tools/dump_cmd.h"

/* The exit status. */
int dump_stats(dump_cmd *d);

#endif
