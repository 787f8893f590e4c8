/*
 * dump_tuning — stof-dump's `tuning`: the tuning records (of one op, or of
 * one mask spec: the records whose mask hash that spec has at their
 * lengths), each with its winner, what it beat (fastest first), the
 * candidates that failed or were never timed, and the model's error and
 * ranking; or the records as JSON.
 */
#ifndef STOF_DUMP_TUNING_H
#define STOF_DUMP_TUNING_H

#include "tools/dump_cmd.h"

/* The exit status: CLI_EXIT_USAGE for a --mask spec that parses for no row
 * nor for a 4096 x 4096 square. */
int dump_tuning(dump_cmd *d);

#endif
