/*
 * layer_search — how a layer plan chooses its groups' schemes: given the
 * cost model's ranking (layer_model), the device scratch a candidate runs
 * on and the CPU check of its output, the two-stage search (stage 1 the
 * scheme, stage 2
 * its parameters) over whichever groups a layer kind hands it, the batches
 * that compile their kernels ahead, and the tuning records (the layer's
 * and each group's own), and the whole layer on scratch timed with and
 * without its CUDA Graph. Plans, graphs and the run are the layer kinds'
 * (layer.c, decoder.c) and layer_graph's.
 */
#ifndef STOF_LAYER_SEARCH_H
#define STOF_LAYER_SEARCH_H

#include "attn/model.h"
#include "layer/layer_graph.h"
#include "layer/layer_group.h"
#include "layer/layer_model.h"

/* A library scheme (cuBLAS, cuBLASLt) wins a group only where it is faster
 * than every generated candidate timed by more than this fraction
 * (layer_search.c says why). */
#define LAYER_LIB_MARGIN 0.10

/* ---- records ---- */

/* The record of a search and back. A record names, per group, the chosen
 * scheme and parameters with its time, and what else was tried (group: the
 * group's index in the layer kind's list). */
typedef struct layer_tried {
    int group;
    layer_choice c;
    double predicted_ms, ms;
    const char *verdict;       /* "ok", "mismatch", "failed"; NULL: not timed */
} layer_tried;
typedef struct layer_record {
    layer_choice c[LAYER_MAX_GROUPS];
    double ms[LAYER_MAX_GROUPS];
    int graph;                 /* run the layer as a CUDA Graph */
    double plain_ms, graph_ms; /* the whole layer, without and with the graph */
} layer_record;
/* A layer kind's record of its ng groups, named by names[] (parse: 0
 * unless the record holds exactly those groups, in that order). */
char *search_record_format(const char *const *names, int ng, const layer_record *r,
                           const layer_tried *tried, int n, const char *how);
int search_record_parse(const char *const *names, int ng, const char *text, layer_record *r);
/* The same for the encoder's four groups. */
char *layer_record_format(const layer_record *r, const layer_tried *tried, int n, const char *how);
int layer_record_parse(const char *text, layer_record *r);

/* A group's choice does not depend on the mask, so a search also keeps it
 * in a record of its own (op "layer-group", mask hash "-", the shape part
 * from layer_group_shape: "qkv_m16384_n2304_k768_bias1_act0_res0_ln0_sum0"),
 * which a search for a layer of the same shape and another mask takes
 * instead of timing the group again. The record: the choice, its ms and
 * what its search tried (the entries of tried[] of group g). These take
 * the encoder's group g; search_groups keeps any kind's the same way. */
#define LAYER_GROUP_OP "layer-group"
void layer_group_shape(int g, const layer_group *grp, char *out, size_t n);
char *layer_group_record_format(int g, const layer_choice *c, double ms, const layer_tried *tried,
                                int n, const char *how);
int layer_group_record_parse(const char *text, int g, layer_choice *c, double *ms);

/* ---- candidates ---- */

/* For tests: runs choice c of group g on random inputs (fresh output
 * poisoned), checks rows against the CPU in double, and times it; verdict
 * is "ok", "mismatch" or "failed" (then ctx's error says why). */
stof_status layer_try_choice(stof_ctx *ctx, const layer_group *g, const layer_choice *c,
                             const char **verdict, double *ms, double *err);
/* Every parameter set scheme s offers group g, default first; returns how many. */
int layer_scheme_params(stof_ctx *ctx, const layer_group *g, layer_scheme s, layer_choice *out,
                        int cap);

/* Allocates n 16-bit values on the device (ctx pushed), filled as
 * mha_fill_periodic draws them (or not at all when seed is 0); the host
 * copy goes to *host when asked. */
stof_status search_upload(stof_ctx *ctx, CUdeviceptr *d, size_t n, stof_dtype t, uint64_t seed,
                          float scale, float offset, uint16_t **host);
/* Frees the n device buffers of p that are set, and zeroes them (ctx pushed). */
void search_free_all(stof_ctx *ctx, CUdeviceptr *p, int n);

/* ---- whole layers ---- */

/* The scratch a layer kind's whole layer is timed on: nw weights drawn at
 * random (weight i: n[i] values of scale[i] about offset[i], from seed
 * seed + i), two inputs of x_n values (seeds seed + 101 and seed + 102; run
 * i reads input i % 2, so the L2 does not flatter), an output of x_n
 * values and a workspace of ws_bytes. */
#define SCRATCH_MAX_WEIGHTS 12
typedef struct scratch_spec {
    stof_dtype dtype;
    int nw;
    size_t n[SCRATCH_MAX_WEIGHTS];
    float scale[SCRATCH_MAX_WEIGHTS], offset[SCRATCH_MAX_WEIGHTS];
    uint64_t seed;
    size_t x_n, ws_bytes;
} scratch_spec;
typedef struct layer_scratch {
    CUdeviceptr w[SCRATCH_MAX_WEIGHTS], x[2], out, ws;
} layer_scratch;

/* Enqueues the layer kind's plan once on scratch s, as run i of a batch. */
typedef stof_status (*layer_scratch_body)(void *plan, const layer_scratch *s, int i, CUstream st);

/* Times the whole layer on fresh scratch as sp draws it, launch by launch
 * and as a CUDA Graph (graphs_time on G): r gets both times, and r->graph
 * the faster. */
stof_status search_layer_graph(stof_ctx *ctx, const scratch_spec *sp, layer_graphs *G,
                               layer_scratch_body body, void *plan, layer_record *r);

/* ---- the search ---- */

/* What a layer kind hands the search: its groups, in the order it runs
 * them, and their names (messages, records and the group records' keys).
 * The encoder hands layer_groups' four with group_encoder_names. */
typedef struct search_set {
    const layer_group *g;
    const char *const *names;
    int n;                     /* at most LAYER_MAX_GROUPS */
} search_set;

#define SEARCH_MAX_TRIED 32
/* Room for a layer's timings: per group, stage 1 and stage 2 twice (the
 * winner's parameters, and a generated scheme's behind a library winner). */
#define SEARCH_ROOM (LAYER_MAX_GROUPS * 2 * SEARCH_MAX_TRIED)

typedef struct search_state {
    stof_tune level;
    int max_candidates;
    double deadline;           /* 0: none */
    layer_tried tried[SEARCH_ROOM];
    int n;
} search_state;

/* Chooses every group of set: from its group record where one loads
 * (from_record[i] 1), else by the search, whose timings go to ss->tried;
 * a group searched without a budget is kept in its own record. c[i] and
 * ms[i] get group i's choice and time. */
stof_status search_groups(stof_ctx *ctx, const search_set *set, int smem_max,
                          const model_device *md, search_state *ss, layer_choice *c, double *ms,
                          int *from_record);
/* The model's choice for every group of set, default parameters, ms
 * predicted (tune off), into r; r->graph set for a layer the model puts
 * under a millisecond, where launch gaps count. */
stof_status search_by_model(stof_ctx *ctx, const search_set *set, int smem_max,
                            const model_device *md, layer_record *r);
/* The shared memory a block may opt in to: the device's, else the named
 * arch's (ctx->arch; a compile without the device). */
int search_smem_max(const stof_ctx *ctx);
/* Compiles, without the device, every kernel a scheme of set's groups
 * could use (the generated GEMMs with default parameters) in one batch,
 * with LayerNorm ln too where given. */
stof_status search_prepare(stof_ctx *ctx, const search_set *set, int smem_max,
                           const stof_ln_desc *ln);

#endif
