/*
 * layer — encoder-layer plans: the plan of a layer (its groups' choices
 * from the tuning record, the model or the search; attention's plan; the
 * workspace), the CUDA Graph candidate for the whole layer and the graphs
 * a plan captures, and the public calls (stof_layer_*). The groups and
 * running one are layer_group's; the model, the search and the records
 * layer_search's (both included here for the plan's users).
 */
#ifndef STOF_LAYER_H
#define STOF_LAYER_H

#include "layer/layer_group.h"
#include "layer/layer_search.h"

/* Shape part of the layer record's key: "b8_s2048_h768_n12_f3072_gelu_post". */
void layer_shape_string(const stof_layer_desc *d, char *out, size_t n);

/* For tests: run plan p as a CUDA Graph (1) or launch by launch (0). */
void layer_plan_force_graph(stof_layer_plan *p, int graph);

#endif
