/*
 * dump_kernels — stof-dump's `list` (the kernels in the cache, as a table or
 * JSON) and `show KEY` (one kernel: its summary and the tuning records that
 * name it, or one part: source, PTX, SASS through cuobjdump or nvdisasm,
 * compile log, parameters).
 */
#ifndef STOF_DUMP_KERNELS_H
#define STOF_DUMP_KERNELS_H

#include "tools/dump_cmd.h"

/* Each returns the exit status. */
int dump_kernels_list(dump_cmd *d);
int dump_kernels_show(dump_cmd *d);

#endif
