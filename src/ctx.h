/*
 * ctx — the top of the house: stof_open composes the floors below for the
 * caller (the driver, the architecture NVRTC compiles for, the cache) and
 * stof_close takes them down again (the jit's modules, cuBLAS, the cache,
 * the driver). Nothing below this floor includes it: the record behind
 * stof_ctx is gpu/jit.h's, and failures are reported through base/err.h.
 */
#ifndef STOF_CTX_H
#define STOF_CTX_H

#include "gpu/jit.h"
#include "stof.h"

#endif
