/*
 * nvrtc_drv — the one door to NVRTC: compiles rendered CUDA C for an
 * architecture ("sm_80", "sm_90a", ...) to CUBIN and PTX and keeps the log.
 * A failed compile becomes STOF_ERR_COMPILE carrying the log's first lines.
 */
#ifndef STOF_NVRTC_H
#define STOF_NVRTC_H

#include <stddef.h>
#include "base/err.h"

typedef struct nvrtc_output {
    void *cubin;
    size_t cubin_size;
    char *ptx;           /* NUL-terminated */
    size_t ptx_size;     /* without the NUL */
    char *log;           /* NUL-terminated, may be "" */
    double ms;           /* wall time of the compile */
} nvrtc_output;

/* The options every kernel is compiled with, besides -arch, as one string
 * (part of every kernel's key): "-std=c++17 --ptxas-options=-v", with
 * -lineinfo added while $STOF_LINEINFO is set and not "0" (source lines
 * for a profiler; NVRTC then also embeds the PTX text, which made a
 * cached kernel four times the size to read, check and load). */
const char *nvrtc_options(void);

stof_status nvrtc_compile(err_record *err, const char *name, const char *source,
                          const char *arch, nvrtc_output *out);
void nvrtc_output_free(nvrtc_output *o);

/* "13.0" */
const char *nvrtc_version_string(void);

/* Fails with STOF_ERR_INVALID_ARG unless NVRTC can compile for `arch`. */
stof_status nvrtc_check_arch(err_record *err, const char *arch);

#endif
