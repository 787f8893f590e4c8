/*
 * dump_mask — stof-dump's `mask SPEC`, which needs no cache: a mask's
 * entries and blocks (full, partial, empty; a map in the terminal), the
 * kernels the model ranks for it at a shape (BERT-base unless told), why the
 * first wins, and its picture as an SVG.
 */
#ifndef STOF_DUMP_MASK_H
#define STOF_DUMP_MASK_H

#include "tools/dump_cmd.h"

/* a's mask sizes are checked already (dump.c): the exit status. */
int dump_mask(const dump_args *a);

#endif
