/*
 * timing — how the searches time a candidate on the GPU: CUDA events around
 * batches of runs (after an untimed first run, a warm-up sizes each batch to
 * about 2 ms), the median of seven batches. Shared by attention, the layer's
 * groups and whole layers. And the device memory's bandwidth, one of the
 * attention model's device figures.
 */
#ifndef STOF_TIMING_H
#define STOF_TIMING_H

#include "gpu/jit.h"

/* Enqueues run i of a batch on the legacy stream (i rotates input sets). */
typedef stof_status (*timing_run_fn)(stof_ctx *ctx, void *arg, int i);

/* Median milliseconds of one run; afterwards run(ctx, arg, 0) has been
 * enqueued once more and finished, so its output is what remains. */
stof_status timing_median(stof_ctx *ctx, timing_run_fn run, void *arg, double *ms);

/* Records e1 behind the work enqueued since e0 on the legacy stream, waits
 * for it, and gives the milliseconds between the two. Context current. */
stof_status timing_elapsed(stof_ctx *ctx, CUevent e0, CUevent e1, float *ms);

/* Device memory bandwidth, read + write, of a 256 MiB device-to-device copy
 * (median of 5 after a warm-up), in GB/s. */
stof_status timing_bandwidth(stof_ctx *ctx, double *gbs);

#endif
