/*
 * model — the analytical model: predicts an attention candidate's time from
 * its tiles (what the mask leaves to compute), the shape, and the device,
 * so the search times only the most promising candidates.
 */
#ifndef STOF_MODEL_H
#define STOF_MODEL_H

#include "attn_tiles.h"
#include "drv.h"

typedef struct model_device {
    int sm_count;
    double mma_tflops;     /* mma.sync fp16/bf16 dense rate, fp32 accumulate */
    double mem_gbs;        /* device memory bandwidth, read + write */
} model_device;

/* Figures for dev (or for arch alone when dev is NULL or not ok). */
model_device model_device_of(const drv_device *dev, const char *arch);

/* Predicted milliseconds of one run over batch*heads of the tiles, with
 * m_tiles row tiles per warp (mma.sync) or on warpgroup MMA (wgmma 1). */
double model_attn_ms(const model_device *m, const attn_tiles *t, int batch_heads, int head_dim,
                     int m_tiles, int wgmma);

#endif
