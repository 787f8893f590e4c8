#include "attn/model.h"

#include <stdio.h>
#include <string.h>

#include "base/json.h"
#include "base/strbuf.h"

model_device model_device_of(const drv_device *dev, const char *arch)
{
    model_device m = {0};
    int sm90 = arch && strncmp(arch, "sm_9", 4) == 0;
    /* Dense attention as the kernels achieve it (H100: about 250 TFLOP/s on
     * mma.sync, 370 on wgmma, 460 warp-specialized; A100: about 200). */
    m.sm_count = dev && dev->ok ? dev->sm_count : (sm90 ? 132 : 108);
    m.mma_tflops = (sm90 ? 250.0 / 132 : 200.0 / 108) * m.sm_count;
    m.wgmma_tflops = arch && strcmp(arch, "sm_90a") == 0 ? 370.0 / 132 * m.sm_count : 0;
    m.ws_tflops = m.wgmma_tflops > 0 ? 460.0 / 132 * m.sm_count : 0;
    m.mem_gbs = sm90 ? 3000.0 : 1800.0;
    return m;
}

char *model_device_format(const model_device *m, const char *device_name)
{
    /* The name is for readers: characters JSON would need escaped become '_'. */
    char name[128];
    snprintf(name, sizeof name, "%s", device_name ? device_name : "");
    for (char *c = name; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
            *c = '_';
    strbuf b = {0};
    strbuf_printf(&b, "{\"device\":\"%s\"", name);
    strbuf_printf(&b, ",\"sm_count\":%d,\"clock_mhz\":%d,\"mma_tflops\":%.1f,"
                  "\"wgmma_tflops\":%.1f,\"ws_tflops\":%.1f,\"mem_gbs\":%.0f,\"measured\":%d}",
                  m->sm_count, m->clock_mhz, m->mma_tflops, m->wgmma_tflops, m->ws_tflops,
                  m->mem_gbs, m->measured);
    return strbuf_take(&b);
}

int model_device_parse(const char *rec, model_device *m)
{
    json_value *v = rec ? json_parse(rec, strlen(rec), NULL) : NULL;
    /* A record without ws_tflops predates that engine: not usable, so the
     * figures are measured again. */
    const char *num[] = {"sm_count", "clock_mhz", "mma_tflops", "wgmma_tflops", "ws_tflops",
                         "mem_gbs", "measured"};
    double x[7];
    int ok = v != NULL;
    for (int i = 0; ok && i < 7; i++) {
        const json_value *f = json_get(v, num[i]);
        ok = f && f->type == JSON_NUMBER && f->number >= 0 && f->number < 1e7;
        x[i] = ok ? f->number : 0;
    }
    json_free(v);
    /* A usable record: SMs, a positive mma.sync rate and bandwidth. */
    if (!ok || x[0] < 1 || x[2] <= 0 || x[5] <= 0)
        return 0;
    *m = (model_device){(int)x[0], (int)x[1], x[2], x[3], x[4], x[5], x[6] != 0};
    return 1;
}

double model_attn_ms(const model_device *m, const attn_tiles *t, int batch_heads, int head_dim,
                     int m_tiles, int engine)
{
    /* A tile costs its two products (4*bm*bn*d flops) at the engine's
     * dense-attention rate or its K and V reads (2*bn*d*2 bytes, mostly from
     * L2: counted at twice DRAM speed), whichever is longer; a bitmap adds
     * masking work, a gathered tile its index loads. Each group adds its Q
     * load and O store. */
    double tile_flop = 4.0 * t->bm * t->bn * head_dim;
    double tile_bytes = 4.0 * t->bn * head_dim;
    double rate = engine == 2 && m->ws_tflops > 0   ? m->ws_tflops
                  : engine && m->wgmma_tflops > 0 ? m->wgmma_tflops
                                                  : m->mma_tflops;
    double sm_flops = rate * 1e12 / m->sm_count;
    double sm_bytes = 2 * m->mem_gbs * 1e9 / m->sm_count;
    double tile_s = tile_flop / sm_flops > tile_bytes / sm_bytes ? tile_flop / sm_flops
                                                                 : tile_bytes / sm_bytes;
    /* Two row tiles per warp share each K and V fragment: fewer
     * shared-memory reads per product. */
    if (m_tiles == 2)
        tile_s *= 0.95;
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
