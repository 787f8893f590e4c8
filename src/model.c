#include "model.h"

#include <string.h>

model_device model_device_of(const drv_device *dev, const char *arch)
{
    model_device m;
    int sm90 = arch && strncmp(arch, "sm_9", 4) == 0;
    /* mma.sync reaches about 2/3 of Hopper's wgmma peak; A100-class parts
     * run it at their full 312 TFLOP/s. */
    m.sm_count = dev && dev->ok ? dev->sm_count : (sm90 ? 132 : 108);
    double per_sm_tflops = sm90 ? 620.0 / 132 : 290.0 / 108;
    m.mma_tflops = per_sm_tflops * m.sm_count;
    m.mem_gbs = sm90 ? 3000.0 : 1800.0;
    return m;
}

double model_attn_ms(const model_device *m, const attn_tiles *t, int batch_heads, int head_dim,
                     int m_tiles, int wgmma)
{
    /* A tile costs its two products (4*bm*bn*d flops) at the tensor rate,
     * its K and V reads (2*bn*d*2 bytes, mostly from L2: counted at twice
     * DRAM speed), whichever is longer; a bitmap adds masking work, a
     * gathered tile its index loads. Each group adds its Q load and O store. */
    double tile_flop = 4.0 * t->bm * t->bn * head_dim;
    double tile_bytes = 4.0 * t->bn * head_dim;
    double sm_flops = m->mma_tflops * 1e12 / m->sm_count;
    double sm_bytes = 2 * m->mem_gbs * 1e9 / m->sm_count;
    double tile_s = tile_flop / sm_flops > tile_bytes / sm_bytes ? tile_flop / sm_flops
                                                                 : tile_bytes / sm_bytes;
    /* Two row tiles per warp share each K and V fragment: fewer
     * shared-memory reads per product. */
    if (m_tiles == 2)
        tile_s *= 0.95;
    /* Warpgroup MMA: about 1.5x mma.sync's product rate on Hopper. */
    if (wgmma)
        tile_s *= 0.67;
    double partial = (double)(t->n_tiles - t->n_full);
    double gather = t->kind == ATTN_GATHER ? 0.15 : 0.0;
    double group_s = 4.0 * t->bm * head_dim / sm_bytes + 2e-6;
    double per_head_s = t->n_tiles * tile_s * (1 + gather) + partial * tile_s * 0.15 +
                        t->n_groups * group_s;
    double total = per_head_s * batch_heads / m->sm_count;
    /* The heaviest group bounds the run from below. */
    double crit = t->max_tiles * tile_s * (1 + gather) + group_s;
    return (total > crit ? total : crit) * 1e3;
}
