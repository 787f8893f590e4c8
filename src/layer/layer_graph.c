#include "layer/layer_graph.h"

#include <stdio.h>
#include <string.h>

#include "gpu/timing.h"

static void drop_slot(stof_ctx *ctx, graph_slot *g)
{
    if (g->exec && jit_push(ctx) == STOF_OK) {
        /* One still in flight is freed when it completes. */
        ctx->dev.api.GraphExecDestroy(g->exec);
        jit_pop(ctx);
    }
    memset(g, 0, sizeof *g);
}

void graphs_drop(stof_ctx *ctx, layer_graphs *G)
{
    for (int i = 0; i < LAYER_GRAPHS; i++)
        drop_slot(ctx, &G->slot[i]);
}

void graphs_free(stof_ctx *ctx, layer_graphs *G)
{
    graphs_drop(ctx, G);
    if (G->cap_stream && jit_push(ctx) == STOF_OK) {
        ctx->dev.api.StreamDestroy(G->cap_stream);
        jit_pop(ctx);
    }
    memset(G, 0, sizeof *G);
}

static int same_key(const graph_key *a, const graph_key *b)
{
    return a->x == b->x && a->out == b->out && a->aux == b->aux && a->ws == b->ws &&
           a->tag == b->tag;
}

/* The graph captured on key, or NULL. */
static graph_slot *find(layer_graphs *G, const graph_key *key)
{
    for (int i = 0; i < LAYER_GRAPHS; i++) {
        graph_slot *g = &G->slot[i];
        if (g->exec && same_key(&g->key, key)) {
            g->used = ++G->clock;
            return g;
        }
    }
    return NULL;
}

/* Captures the body on key into a free slot or the least recently used
 * one, *slot. */
static stof_status capture(stof_ctx *ctx, layer_graphs *G, const graph_key *key, graph_body body,
                           void *arg, CUstream after, graph_slot **slot)
{
    graph_slot *g = &G->slot[0];
    for (int i = 1; i < LAYER_GRAPHS && g->exec; i++)
        if (!G->slot[i].exec || G->slot[i].used < g->used)
            g = &G->slot[i];
    drop_slot(ctx, g);
    TRY(jit_push(ctx));
    stof_status st = STOF_OK;
    if (!G->cap_stream) {
        CUevent ev = NULL;
        st = CU(ctx, StreamCreate(&G->cap_stream, CU_STREAM_NON_BLOCKING));
        if (st == STOF_OK)
            st = CU(ctx, EventCreate(&ev, CU_EVENT_DISABLE_TIMING));
        if (st == STOF_OK)
            st = CU(ctx, EventRecord(ev, after));
        if (st == STOF_OK)
            st = CU(ctx, StreamWaitEvent(G->cap_stream, ev, 0));
        if (st == STOF_OK)
            st = body(arg, 0, G->cap_stream);
        if (st == STOF_OK)
            st = CU(ctx, StreamSynchronize(G->cap_stream));
        if (ev)
            ctx->dev.api.EventDestroy(ev);
    }
    if (st == STOF_OK)
        st = CU(ctx, StreamBeginCapture(G->cap_stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    if (st == STOF_OK) {
        st = body(arg, 0, G->cap_stream);
        CUgraph graph = NULL;
        /* Ends the capture whatever happened; the first failure is the one told. */
        CUresult r = ctx->dev.api.StreamEndCapture(G->cap_stream, &graph);
        if (st == STOF_OK && r != CUDA_SUCCESS)
            st = jit_cu_check(ctx, r, "StreamEndCapture", __FILE__, __LINE__);
        if (st == STOF_OK)
            st = CU(ctx, GraphInstantiate(&g->exec, graph, 0));
        if (graph)
            ctx->dev.api.GraphDestroy(graph);
    }
    jit_pop(ctx);
    if (st != STOF_OK) {
        g->exec = NULL;
        return st;
    }
    g->key = *key;
    g->used = ++G->clock;
    ctx->stats.graph_captures++;
    *slot = g;
    return STOF_OK;
}

stof_status graphs_run(stof_ctx *ctx, layer_graphs *G, int *use_graph, const graph_key *key,
                       graph_body body, void *arg, CUstream stream)
{
    if (!*use_graph)
        return body(arg, 0, stream);
    graph_slot *g = find(G, key);
    if (!g) {
        stof_status st = capture(ctx, G, key, body, arg, stream, &g);
        if (st == STOF_ERR_CUDA) {
            /* A layer that cannot be captured still runs, launch by launch. */
            snprintf(G->note, sizeof G->note, "%.280s", ctx->err.msg);
            *use_graph = 0;
            ctx->err.msg[0] = 0;
            return body(arg, 0, stream);
        }
        TRY(st);
    }
    TRY(jit_push(ctx));
    stof_status st = CU(ctx, GraphLaunch(g->exec, stream));
    jit_pop(ctx);
    return st;
}

typedef struct timed {
    graph_body body;
    void *arg;
    CUgraphExec exec;
} timed;

static stof_status run_plain(stof_ctx *ctx, void *arg, int i)
{
    (void)ctx;
    const timed *t = arg;
    return t->body(t->arg, i, NULL);
}

static stof_status run_graph(stof_ctx *ctx, void *arg, int i)
{
    (void)i;
    const timed *t = arg;
    return CU(ctx, GraphLaunch(t->exec, NULL));
}

stof_status graphs_time(stof_ctx *ctx, layer_graphs *G, graph_body body, void *arg,
                        double *plain_ms, double *graph_ms)
{
    timed t = {body, arg, NULL};
    stof_status st = timing_median(ctx, run_plain, &t, plain_ms);
    if (st == STOF_OK) {
        graph_slot *g = NULL;
        const graph_key none = {0};
        st = capture(ctx, G, &none, body, arg, NULL, &g);
        if (st == STOF_OK) {
            t.exec = g->exec;
            st = timing_median(ctx, run_graph, &t, graph_ms);
        }
        graphs_drop(ctx, G);
    }
    return st;
}
