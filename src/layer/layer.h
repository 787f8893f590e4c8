/*
 * layer — encoder-layer plans: the model's ranking of the groups' fusion
 * schemes (layer_group's), the two-stage search (stage 1 the scheme, stage 2
 * its parameters; every candidate checked against the CPU before it may
 * win), the tuning record in the cache, the CUDA Graph candidate for the
 * whole layer, and the run.
 */
#ifndef STOF_LAYER_H
#define STOF_LAYER_H

#include "attn/model.h"
#include "layer/layer_group.h"

/* The schemes group g can run (blas: cuBLAS is usable; smem_max: shared
 * memory per block), in the model's order, fastest predicted first, with
 * their predicted ms; returns how many. */
int layer_rank_schemes(const layer_group *g, int blas, int smem_max, const model_device *md,
                       layer_scheme *out, double *predicted_ms);

/* A library scheme (cuBLAS, cuBLASLt) wins a group only where it is faster
 * than every generated candidate timed by more than this fraction (layer.c
 * says why). */
#define LAYER_LIB_MARGIN 0.10

/* The record of a search and back. A record names, per group, the chosen
 * scheme and parameters with its time, and what else was tried. */
typedef struct layer_tried {
    int group;
    layer_choice c;
    double predicted_ms, ms;
    const char *verdict;       /* "ok", "mismatch", "failed"; NULL: not timed */
} layer_tried;
typedef struct layer_record {
    layer_choice c[LG_COUNT];
    double ms[LG_COUNT];
    int graph;                 /* run the layer as a CUDA Graph */
    double plain_ms, graph_ms; /* the whole layer, without and with the graph */
} layer_record;
char *layer_record_format(const layer_record *r, const layer_tried *tried, int n, const char *how);
int layer_record_parse(const char *text, layer_record *r);

/* Shape part of the record's key: "b8_s2048_h768_n12_f3072_gelu_post". */
void layer_shape_string(const stof_layer_desc *d, char *out, size_t n);

/* A group's choice does not depend on the mask, so a search also keeps it
 * in a record of its own (op "layer-group", mask hash "-", the shape part
 * from layer_group_shape: "qkv_m16384_n2304_k768_bias1_act0_res0_ln0_sum0"),
 * which a search for a layer of the same shape and another mask takes
 * instead of timing the group again. The record: the choice, its ms and
 * what its search tried (the entries of tried[] of group g). */
#define LAYER_GROUP_OP "layer-group"
void layer_group_shape(int g, const layer_group *grp, char *out, size_t n);
char *layer_group_record_format(int g, const layer_choice *c, double ms, const layer_tried *tried,
                                int n, const char *how);
int layer_group_record_parse(const char *text, int g, layer_choice *c, double *ms);

/* For tests: runs choice c of group g on random inputs (fresh output
 * poisoned), checks rows against the CPU in double, and times it; verdict
 * is "ok", "mismatch" or "failed" (then ctx's error says why). */
stof_status layer_try_choice(stof_ctx *ctx, const layer_group *g, const layer_choice *c,
                             const char **verdict, double *ms, double *err);
/* Every parameter set scheme s offers group g, default first; returns how many. */
int layer_scheme_params(stof_ctx *ctx, const layer_group *g, layer_scheme s, layer_choice *out,
                        int cap);
/* For tests: run plan p as a CUDA Graph (1) or launch by launch (0). */
void layer_plan_force_graph(stof_layer_plan *p, int graph);

#endif
