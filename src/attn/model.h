/*
 * model — the analytical model: predicts an attention candidate's time from
 * its tiles (what the mask leaves to compute), the shape, and the device,
 * so the search times only the most promising candidates. The device's
 * figures are measured once per device (mha.c) and kept in the cache as a
 * record this module writes and reads.
 */
#ifndef STOF_MODEL_H
#define STOF_MODEL_H

#include "attn/attn_tiles.h"
#include "gpu/drv.h"

typedef struct model_device {
    int sm_count;
    int clock_mhz;         /* SM clock the driver reports (0: unknown) */
    double mma_tflops;     /* dense attention on mma.sync, fp16, as achieved */
    double wgmma_tflops;   /* the same on warpgroup MMA (0: the arch has none) */
    double ws_tflops;      /* ... and on the warp-specialized, TMA-fed engine */
    double mem_gbs;        /* device memory bandwidth, read + write */
    int measured;          /* 1: measured on this device; 0: the arch's defaults */
} model_device;

/* The arch's default figures (SM count from dev when it is open). */
model_device model_device_of(const drv_device *dev, const char *arch);

/* The figures as a cache record (JSON naming the device; caller frees),
 * and back: 0 when rec is not a valid record. */
char *model_device_format(const model_device *m, const char *device_name);
int model_device_parse(const char *rec, model_device *m);

/* Predicted milliseconds of one run over batch*heads of the tiles, with
 * m_tiles row tiles per warp on engine 0 (mma.sync), or on engine 1
 * (warpgroup MMA) or 2 (warp-specialized), as mha_candidate.wg numbers them. */
double model_attn_ms(const model_device *m, const attn_tiles *t, int batch_heads, int head_dim,
                     int m_tiles, int engine);

#endif
