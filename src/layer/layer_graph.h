/*
 * layer_graph — the CUDA Graphs a layer plan runs as (the encoder's and the
 * decoder's alike): graphs captured per set of buffers (up to
 * LAYER_GRAPHS; a new set takes a free slot, else the least recently used),
 * the stream they are captured on, the run that replays or captures and
 * falls back to launch by launch where a capture fails, and the timing of a
 * layer with and without its graph. What a layer enqueues is the plan's:
 * it hands a body that this module calls.
 */
#ifndef STOF_LAYER_GRAPH_H
#define STOF_LAYER_GRAPH_H

#include "gpu/jit.h"

/* Enqueues the layer once on stream s; i numbers the runs of a timing
 * batch (the body may rotate its inputs by it), 0 elsewhere. */
typedef stof_status (*graph_body)(void *arg, int i, CUstream s);

/* What a graph was captured on: the run's pointers and any value baked
 * into its launches (the decoder's position offset). */
typedef struct graph_key {
    const void *x, *out, *aux, *ws;
    long long tag;
} graph_key;

#define LAYER_GRAPHS 4
typedef struct graph_slot {
    CUgraphExec exec;
    graph_key key;
    unsigned long long used;   /* the clock at its last launch */
} graph_slot;

/* A plan's graphs; zeroed is empty. */
typedef struct layer_graphs {
    CUstream cap_stream;
    graph_slot slot[LAYER_GRAPHS];
    unsigned long long clock;
    char note[300];            /* why the graph was given up, if it was */
} layer_graphs;

/* Runs the layer on stream: where *use_graph, as the graph captured on key
 * (captured now if there is none; the first capture on a new stream runs
 * the body once first, uncaptured, behind stream's work, since libraries
 * set themselves up per stream on first use); a capture that fails with
 * STOF_ERR_CUDA clears *use_graph, keeps the reason in note and runs the
 * body launch by launch. Else launch by launch. */
stof_status graphs_run(stof_ctx *ctx, layer_graphs *G, int *use_graph, const graph_key *key,
                       graph_body body, void *arg, CUstream stream);

/* Times the body launch by launch (runs i on the legacy stream) and as a
 * graph captured on run 0; the graphs are dropped afterwards. */
stof_status graphs_time(stof_ctx *ctx, layer_graphs *G, graph_body body, void *arg,
                        double *plain_ms, double *graph_ms);

/* Drops every graph (one still in flight is freed when it completes). */
void graphs_drop(stof_ctx *ctx, layer_graphs *G);
/* Drops them and the capture stream; G is zeroed. */
void graphs_free(stof_ctx *ctx, layer_graphs *G);

#endif
