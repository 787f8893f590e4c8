/*
 * layer_model — the cost model of a layer's groups: each fusion scheme's
 * time predicted from the device's measured rates (the GEMM's flops or
 * bytes, the passes' bytes, the launches), and the schemes a group can run
 * ranked by it. layer_search times the first few of them.
 */
#ifndef STOF_LAYER_MODEL_H
#define STOF_LAYER_MODEL_H

#include "attn/model.h"
#include "layer/layer_group.h"

/* The schemes group g can run (blas: cuBLAS is usable; smem_max: shared
 * memory per block), in the model's order, fastest predicted first, with
 * their predicted ms; returns how many. */
int layer_rank_schemes(const layer_group *g, int blas, int smem_max, const model_device *md,
                       layer_scheme *out, double *predicted_ms);

#endif
