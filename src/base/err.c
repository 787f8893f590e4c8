#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* $STOF_DEBUG set (and not "0"): sentences end with the source location. */
static int debug_locations(void)
{
    static int state = -1; /* read once; a race here only reads it twice */
    if (state < 0) {
        const char *e = getenv("STOF_DEBUG");
        state = e && *e && strcmp(e, "0") != 0;
    }
    return state;
}

stof_status err_fail(err_record *err, stof_status st, const char *file, int line,
                     const char *fmt, ...)
{
    if (!err)
        return st;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (debug_locations() && n >= 0 && (size_t)n < sizeof err->msg - 1)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, " [%s:%d]", file, line);
    return st;
}

const char *stof_version(void)
{
#define STR2(x) #x
#define STR(x) STR2(x)
    return STR(STOF_VERSION_MAJOR) "." STR(STOF_VERSION_MINOR) "." STR(STOF_VERSION_PATCH);
}

const char *stof_status_str(stof_status s)
{
    switch (s) {
    case STOF_OK: return "STOF_OK";
    case STOF_ERR_INVALID_ARG: return "STOF_ERR_INVALID_ARG";
    case STOF_ERR_UNSUPPORTED: return "STOF_ERR_UNSUPPORTED";
    case STOF_ERR_NO_DEVICE: return "STOF_ERR_NO_DEVICE";
    case STOF_ERR_CUDA: return "STOF_ERR_CUDA";
    case STOF_ERR_COMPILE: return "STOF_ERR_COMPILE";
    case STOF_ERR_CACHE: return "STOF_ERR_CACHE";
    case STOF_ERR_NO_MEMORY: return "STOF_ERR_NO_MEMORY";
    case STOF_ERR_INTERNAL: return "STOF_ERR_INTERNAL";
    }
    return "STOF_ERR_UNKNOWN";
}

int dtype_size(stof_dtype t)
{
    switch (t) {
    case STOF_F32: return 4;
    case STOF_F16:
    case STOF_BF16: return 2;
    default: return 0;
    }
}

const char *dtype_name(stof_dtype t)
{
    switch (t) {
    case STOF_F32: return "fp32";
    case STOF_F16: return "fp16";
    case STOF_BF16: return "bf16";
    default: return "invalid";
    }
}
