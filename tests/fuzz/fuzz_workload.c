/*
 * fuzz_workload — the workload reader (src/workload.c) on hostile input:
 * workload files (those in bench/workloads and worse), and stof-warm's
 * one-liners when the input starts "--mha ", "--ln ", "--decoder " or
 * "--decode ". A refusal must say
 * why and leave the list as it was; an accepted input's cases must be
 * whole (names, origins, sizes in range, a mask for attention and layers)
 * and map to descriptors, and the library must judge every mask without
 * crashing (workload_check).
 */
#include <string.h>

#include "fuzz.h"
#include "tools/workload.h"

static stof_ctx *g_ctx;

static void check_case(const workload_case *c)
{
    FUZZ_CHECK(c->name && *c->name && c->origin && *c->origin, "a case without a name or origin");
    FUZZ_CHECK(c->dtype == STOF_F16 || c->dtype == STOF_BF16 || c->dtype == STOF_F32, "dtype %d",
               (int)c->dtype);
    switch (c->op) {
    case WORKLOAD_MHA: {
        FUZZ_CHECK(c->mask && c->batch > 0 && c->heads > 0 && c->seq_q > 0 && c->seq_k > 0 &&
                       c->head_dim > 0,
                   "attention case %s", c->name);
        stof_mha_desc d;
        workload_mha_desc(c, STOF_TUNE_OFF, &d);
        FUZZ_CHECK(d.batch == c->batch && d.seq_q == c->seq_q && d.seq_k == c->seq_k,
                   "descriptor of %s", c->name);
        break;
    }
    case WORKLOAD_LAYER: {
        FUZZ_CHECK(c->mask && c->model && c->batch > 0 && c->seq_q > 0 && c->seq_q == c->seq_k &&
                       c->hidden > 0 && c->heads > 0,
                   "layer case %s", c->name);
        stof_layer_desc d;
        workload_layer_desc(c, STOF_TUNE_OFF, &d);
        FUZZ_CHECK(d.hidden == c->hidden && d.heads == c->heads, "descriptor of %s", c->name);
        break;
    }
    case WORKLOAD_DECODER: {
        FUZZ_CHECK(c->mask && c->batch > 0 && c->seq_q > 0 && c->seq_q == c->seq_k &&
                       c->hidden > 0 && c->heads > 0 && c->kv_heads > 0 &&
                       c->heads % c->kv_heads == 0 && c->ffn_hidden > 0 &&
                       (long long)c->heads * c->head_dim == c->hidden &&
                       workload_decoder_window(c->mask) >= 0,
                   "decoder case %s", c->name);
        stof_decoder_desc d;
        workload_decoder_desc(c, STOF_TUNE_OFF, &d);
        FUZZ_CHECK(d.hidden == c->hidden && d.kv_heads == c->kv_heads &&
                       d.ffn_hidden == c->ffn_hidden && d.window == workload_decoder_window(c->mask),
                   "descriptor of %s", c->name);
        break;
    }
    case WORKLOAD_DECODE: {
        char why[200];
        FUZZ_CHECK(c->mask && !workload_decode_refusal(c, why, sizeof why),
                   "decode case %s: %s", c->name, c->mask ? why : "no mask");
        stof_decode_desc d;
        workload_decode_desc(c, &d);
        FUZZ_CHECK(d.batch == c->batch && d.seq_q == c->seq_q && d.max_seq_k == c->seq_k &&
                       d.window == workload_decoder_window(c->mask),
                   "descriptor of %s", c->name);
        break;
    }
    case WORKLOAD_LN: {
        FUZZ_CHECK(c->rows > 0 && c->hidden > 0, "layernorm case %s", c->name);
        stof_ln_desc d;
        workload_ln_desc(c, &d);
        FUZZ_CHECK(d.rows == c->rows && d.hidden == c->hidden, "descriptor of %s", c->name);
        break;
    }
    default:
        FUZZ_CHECK(0, "op %d", (int)c->op);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_ctx && stof_open(&g_ctx, &(stof_options){.no_cache = 1}) != STOF_OK)
        abort();
    workload w = {0};
    char err[2048] = "";
    int rc;
    int line = size >= 6 && memcmp(data, "--mha ", 6) == 0 ? 6
               : size >= 5 && memcmp(data, "--ln ", 5) == 0 ? 5
               : size >= 10 && memcmp(data, "--decoder ", 10) == 0 ? 10
               : size >= 9 && memcmp(data, "--decode ", 9) == 0 ? 9 : 0;
    if (line) {
        /* A command-line argument: a C string. */
        char *arg = malloc(size - (size_t)line + 1);
        memcpy(arg, data + line, size - (size_t)line);
        arg[size - (size_t)line] = 0;
        rc = line == 6    ? workload_add_mha(&w, arg, err, sizeof err)
             : line == 5  ? workload_add_ln(&w, arg, err, sizeof err)
             : line == 10 ? workload_add_decoder(&w, arg, err, sizeof err)
                          : workload_add_decode(&w, arg, err, sizeof err);
        free(arg);
    } else {
        rc = workload_read_text(&w, (const char *)data, size, "fuzz.json", err, sizeof err);
    }
    if (rc != 0) {
        FUZZ_CHECK(rc == -1 && err[0], "a refusal without a reason (rc %d)", rc);
        FUZZ_CHECK(w.n == 0, "a refused input left %d cases", w.n);
        workload_free(&w);
        return 0;
    }
    FUZZ_CHECK(w.n >= 0 && w.n <= w.cap, "n %d cap %d", w.n, w.cap);
    for (int i = 0; i < w.n; i++)
        check_case(&w.cases[i]);
    /* Masks are judged against each case's lengths; a bad one is refused
     * with the case named. Huge cases are left out: parsing a mask for 16M
     * rows is allowed, but slow under the sanitizers. */
    long long rows = 0;
    for (int i = 0; i < w.n; i++)
        rows += w.cases[i].op == WORKLOAD_LN ? 0 : w.cases[i].seq_q;
    if (rows <= 1 << 16) {
        char why[2048] = "";
        if (workload_check(g_ctx, &w, why, sizeof why) != STOF_OK)
            FUZZ_CHECK(why[0], "workload_check refused without a reason");
    }
    workload_free(&w);
    return 0;
}
