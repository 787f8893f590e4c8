/*
 * test_workload — reading workloads: the shared workload files (and
 * embedded copies of them) expand to the right cases, every malformed or
 * out-of-range field is refused with its file, line, column and JSON path
 * and leaves the list unchanged, decoder-layer models and cases, the
 * --mha / --ln / --decoder / --decode one-liners and decode suites, mask specs
 * checked by the library, and randomly damaged files never crashing.
 */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "tools/workload.h"

/* Copies of the shared workload files (attention.json, layers.json), so the formats are tested where
 * the shared folder is absent; the real files are read too when present. */
static const char ATTENTION_JSON[] =
    "{\n"
    "  \"about\": \"Masked multi-head attention cases.\",\n"
    "  \"suites\": [\n"
    "    {\"name\": \"bert-heads\", \"batch\": 8, \"heads\": 12, \"head_dim\": 64, \"dtype\": \"fp16\",\n"
    "     \"seq\": [512, 1024, 2048, 4096],\n"
    "     \"masks\": {\"dense\": \"dense\", \"causal\": \"causal\", \"window\": \"window:256\",\n"
    "               \"longformer\": \"window:256+global:64\",\n"
    "               \"bigbird\": \"window:192+global:64+random:3:64:1\",\n"
    "               \"strided\": \"window:256+strided:8\", \"dilated\": \"dilated:256:2\"}},\n"
    "    {\"name\": \"long-heads\", \"batch\": 2, \"heads\": 16, \"head_dim\": 128, \"dtype\": \"bf16\",\n"
    "     \"seq\": [4096, 8192],\n"
    "     \"masks\": {\"causal\": \"causal\", \"window\": \"window:1024\",\n"
    "               \"longformer\": \"window:512+global:128\"}},\n"
    "    {\"name\": \"packed-docs\", \"batch\": 2, \"heads\": 16, \"head_dim\": 128, \"dtype\": \"bf16\",\n"
    "     \"seq\": [8192],\n"
    "     \"masks\": {\"docs\": \"docs:1024,3072,4096\",\n"
    "               \"causal-docs\": \"causal&docs:1024,3072,4096\"}}\n"
    "  ]\n"
    "}\n";

static const char LAYERS_JSON[] =
    "{\n"
    "  \"about\": \"Encoder layers.\",\n"
    "  \"models\": {\n"
    "    \"bert-base\":  {\"hidden\": 768,  \"heads\": 12, \"ffn\": 4.0, \"activation\": \"gelu\", \"norm\": \"post_ln\"},\n"
    "    \"bert-large\": {\"hidden\": 1024, \"heads\": 16, \"ffn\": 4.0, \"activation\": \"gelu\", \"norm\": \"post_ln\"},\n"
    "    \"vit-base-local\": {\"hidden\": 768, \"heads\": 12, \"ffn\": 4.0, \"activation\": \"gelu\", \"norm\": \"pre_ln\"},\n"
    "    \"llama3.2-1b\": {\"kind\": \"decoder\", \"hidden\": 2048, \"heads\": 32, \"kv_heads\": 8,"
    " \"head_dim\": 64, \"ffn_hidden\": 8192},\n"
    "    \"llama3-8b\":   {\"kind\": \"decoder\", \"hidden\": 4096, \"heads\": 32, \"kv_heads\": 8,"
    " \"head_dim\": 128, \"ffn_hidden\": 14336}\n"
    "  },\n"
    "  \"cases\": [\n"
    "    {\"model\": \"bert-base\",  \"batch\": 8, \"seq\": [512, 2048], \"dtype\": \"fp16\",\n"
    "     \"masks\": [\"window:256\", \"window:256+global:64\", \"window:192+global:64+random:3:64:1\"]},\n"
    "    {\"model\": \"bert-large\", \"batch\": 8, \"seq\": [512, 2048], \"dtype\": \"fp16\",\n"
    "     \"masks\": [\"window:256+global:64\"]},\n"
    "    {\"model\": \"vit-base-local\", \"batch\": 16, \"seq\": [1024], \"dtype\": \"fp16\",\n"
    "     \"masks\": [\"window:128\"]},\n"
    "    {\"model\": \"llama3.2-1b\", \"batch\": 1, \"seq\": [4096, 16384], \"dtype\": \"bf16\",\n"
    "     \"masks\": [\"causal\", \"causal_window:4096\"]},\n"
    "    {\"model\": \"llama3.2-1b\", \"batch\": 4, \"seq\": [4096], \"dtype\": \"bf16\",\n"
    "     \"masks\": [\"causal\", \"causal_window:4096\"]},\n"
    "    {\"model\": \"llama3-8b\", \"batch\": 1, \"seq\": [4096, 16384], \"dtype\": \"bf16\",\n"
    "     \"masks\": [\"causal\", \"causal_window:4096\"]},\n"
    "    {\"model\": \"llama3-8b\", \"batch\": 4, \"seq\": [4096], \"dtype\": \"bf16\",\n"
    "     \"masks\": [\"causal\", \"causal_window:4096\"]}\n"
    "  ]\n"
    "}\n";

static int read_text(workload *w, const char *text, char *err)
{
    return workload_read_text(w, text, strlen(text), "t.json", err, 1024);
}

static const workload_case *find(const workload *w, const char *name)
{
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->cases[i].name, name) == 0)
            return &w->cases[i];
    return NULL;
}

static void check_attention(const workload *w)
{
    ck_assert_int_eq(w->n, 4 * 7 + 2 * 3 + 1 * 2);
    int per_suite[3] = {0};
    for (int i = 0; i < w->n; i++) {
        ck_assert_int_eq(w->cases[i].op, WORKLOAD_MHA);
        per_suite[strncmp(w->cases[i].name, "bert", 4) == 0 ? 0
                  : strncmp(w->cases[i].name, "long", 4) == 0 ? 1 : 2]++;
    }
    ck_assert_int_eq(per_suite[0], 28);
    ck_assert_int_eq(per_suite[1], 6);
    ck_assert_int_eq(per_suite[2], 2);
    /* Order: suite, then seq, then mask in file order. */
    ck_assert_str_eq(w->cases[0].name, "bert-heads/dense/l=512");
    ck_assert_str_eq(w->cases[1].name, "bert-heads/causal/l=512");
    ck_assert_str_eq(w->cases[7].name, "bert-heads/dense/l=1024");
    const workload_case *c = find(w, "bert-heads/bigbird/l=2048");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->batch, 8);
    ck_assert_int_eq(c->heads, 12);
    ck_assert_int_eq(c->head_dim, 64);
    ck_assert_int_eq(c->seq_q, 2048);
    ck_assert_int_eq(c->seq_k, 2048);
    ck_assert_int_eq(c->dtype, STOF_F16);
    ck_assert_str_eq(c->mask, "window:192+global:64+random:3:64:1");
    ck_assert_ptr_nonnull(strstr(c->origin, "$.suites[0].masks.bigbird"));
    c = find(w, "packed-docs/causal-docs/l=8192");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->dtype, STOF_BF16);
    ck_assert_int_eq(c->head_dim, 128);
    ck_assert_str_eq(c->mask, "causal&docs:1024,3072,4096");
    ck_assert_ptr_nonnull(find(w, "long-heads/longformer/l=8192"));
}

static void check_layers(const workload *w)
{
    /* The encoder layers, then the two decoder models' (B1 at two lengths,
     * B4 at one) x two masks. */
    ck_assert_int_eq(w->n, 2 * 3 + 2 * 1 + 1 * 1 + 2 * (2 + 1) * 2);
    int decoders = 0;
    for (int i = 0; i < w->n; i++)
        decoders += w->cases[i].op == WORKLOAD_DECODER;
    ck_assert_int_eq(decoders, 12);
    const workload_case *d = find(w, "llama3-8b/l=16384/causal_window:4096");
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq(d->op, WORKLOAD_DECODER);
    ck_assert_str_eq(d->model, "llama3-8b");
    ck_assert(d->hidden == 4096 && d->heads == 32 && d->kv_heads == 8 && d->head_dim == 128 &&
              d->ffn_hidden == 14336 && d->batch == 1 && d->seq_q == 16384 &&
              d->seq_k == 16384 && d->rows == 16384 && d->dtype == STOF_BF16 && !d->qkv_bias);
    stof_decoder_desc dd;
    workload_decoder_desc(d, STOF_TUNE_FAST, &dd);
    ck_assert(dd.batch == 1 && dd.seq == 16384 && dd.hidden == 4096 && dd.heads == 32 &&
              dd.kv_heads == 8 && dd.head_dim == 128 && dd.ffn_hidden == 14336 &&
              dd.window == 4096 && dd.dtype == STOF_BF16 && dd.tune == STOF_TUNE_FAST &&
              dd.rope_theta > 0 && dd.rope_factor == 0 && dd.qkv_bias == 0);
    d = find(w, "llama3.2-1b/l=4096/causal");
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq(d->batch, 1);
    workload_decoder_desc(d, STOF_TUNE_OFF, &dd);
    ck_assert(dd.window == 0 && dd.head_dim == 64 && dd.ffn_hidden == 8192);
    const workload_case *c = find(w, "bert-large/l=2048/window:256+global:64");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->op, WORKLOAD_LAYER);
    ck_assert_str_eq(c->model, "bert-large");
    ck_assert_int_eq(c->hidden, 1024);
    ck_assert_int_eq(c->heads, 16);
    ck_assert_int_eq(c->head_dim, 64);
    ck_assert(c->ffn == 4.0);
    ck_assert_str_eq(c->activation, "gelu");
    ck_assert_str_eq(c->norm, "post_ln");
    ck_assert_int_eq(c->rows, 8 * 2048);
    c = find(w, "vit-base-local/l=1024/window:128");
    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(c->norm, "pre_ln");
    ck_assert_int_eq(c->batch, 16);
    ck_assert_int_eq(c->rows, 16 * 1024);
    ck_assert_ptr_nonnull(strstr(c->origin, "$.cases[2].masks[0]"));
}

/* bench/workloads/llm.json: its suites (ALiBi among them) and its decode
 * steps (9 + 3 + 3). */
static void check_llm(const workload *w)
{
    ck_assert_int_eq(w->n, 3 + 2 + 1 + 2 + 2 + 1 + 1 + 15);
    const workload_case *c = find(w, "llama3-8b/causal/l=32768");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->heads, 32);
    ck_assert_int_eq(c->kv_heads, 8);
    ck_assert_int_eq(c->head_dim, 128);
    ck_assert_int_eq(c->dtype, STOF_BF16);
    c = find(w, "llama3-8b/docs/l=16384");
    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(c->mask, "causal&docs:2253,2629,2310,722,1197,5859,1078,336");
    c = find(w, "gemma2-like/window/l=8192");
    ck_assert_ptr_nonnull(c);
    ck_assert(c->softcap == 50.0);
    ck_assert_int_eq(c->kv_heads, 16);
    ck_assert_str_eq(c->mask, "causal_window:4096");
    c = find(w, "chunked-prefill/causal/lq=2048,lk=30720");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->seq_k, 30720);
    c = find(w, "alibi/causal/l=8192");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->alibi, 1);
    c = find(w, "llama3-8b-spec4/causal/b=8,cache=16384");
    ck_assert_ptr_nonnull(c);
    ck_assert(c->op == WORKLOAD_DECODE && c->seq_q == 4 && c->seq_k == 16384 && c->batch == 8 &&
              c->kv_heads == 8);
    c = find(w, "llama3-8b-decode/window/b=64,cache=32768");
    ck_assert_ptr_nonnull(c);
    ck_assert_str_eq(c->mask, "causal_window:4096");
}

START_TEST(test_embedded_copies)
{
    workload w = {0};
    char err[1024];
    ck_assert_msg(read_text(&w, ATTENTION_JSON, err) == 0, "%s", err);
    check_attention(&w);
    workload_free(&w);
    ck_assert_msg(read_text(&w, LAYERS_JSON, err) == 0, "%s", err);
    check_layers(&w);
    workload_free(&w);
}
END_TEST

/* The shared folder: $STOF_WORKLOADS, else the usual places. */
static const char *shared_dir(void)
{
    static const char *const dirs[] = {"bench/workloads", "workloads", "../shared/workloads",
                                       "/work/shared/workloads"};
    const char *e = getenv("STOF_WORKLOADS");
    if (e && *e)
        return e;
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/attention.json", dirs[i]);
        if (access(p, R_OK) == 0)
            return dirs[i];
    }
    return NULL;
}

START_TEST(test_shared_files)
{
    const char *dir = shared_dir();
    if (!dir) {
        printf("test_workload: no shared workload folder (set STOF_WORKLOADS); the embedded "
               "copies were tested\n");
        return;
    }
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
            continue;
        char path[1024], err[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        workload w = {0};
        ck_assert_msg(workload_read_file(&w, path, err, sizeof err) == 0, "%s", err);
        ck_assert_int_gt(w.n, 0);
        if (strcmp(e->d_name, "attention.json") == 0)
            check_attention(&w);
        if (strcmp(e->d_name, "layers.json") == 0)
            check_layers(&w);
        if (strcmp(e->d_name, "llm.json") == 0)
            check_llm(&w);
        /* Every mask of every case parses for its lengths. */
        stof_ctx *ctx = NULL;
        ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
        ck_assert_msg(workload_check(ctx, &w, err, sizeof err) == STOF_OK, "%s", err);
        stof_close(ctx);
        workload_free(&w);
        files++;
    }
    closedir(d);
    ck_assert_int_ge(files, 2);
}
END_TEST

START_TEST(test_both_formats_append)
{
    workload w = {0};
    char err[1024];
    ck_assert(read_text(&w, ATTENTION_JSON, err) == 0);
    ck_assert(read_text(&w, LAYERS_JSON, err) == 0);
    ck_assert(workload_add_ln(&w, "rows=16384,hidden=768,fp16", err, sizeof err) == 0);
    ck_assert_int_eq(w.n, 36 + 9 + 12 + 1);
    ck_assert_int_eq(w.cases[57].op, WORKLOAD_LN);
    workload_free(&w);
    /* One file may hold both kinds. */
    const char *both = "{\"suites\": [{\"name\": \"s\", \"batch\": 1, \"heads\": 2, \"head_dim\": 64,"
                       " \"dtype\": \"fp16\", \"seq\": 128, \"masks\": [\"causal\"]}],"
                       " \"models\": {\"m\": {\"hidden\": 256, \"heads\": 4, \"ffn\": 2,"
                       " \"activation\": \"relu\", \"norm\": \"pre_ln\"}},"
                       " \"cases\": [{\"model\": \"m\", \"batch\": 2, \"seq\": [64, 128],"
                       " \"dtype\": \"bf16\", \"masks\": {\"all\": \"dense\"}}]}";
    ck_assert_msg(read_text(&w, both, err) == 0, "%s", err);
    ck_assert_int_eq(w.n, 3);
    ck_assert_str_eq(w.cases[0].name, "s/causal/l=128");
    ck_assert_str_eq(w.cases[2].name, "m/l=128/dense");
    ck_assert_int_eq(w.cases[2].rows, 256);
    workload_free(&w);
}
END_TEST

/* A decoder model's suite: grouped KV heads, the softcap and a KV prefix reach
 * each case and its desc; "pending" is passed over. */
START_TEST(test_decoder_suites)
{
    const char *text =
        "{\"suites\": [{\"name\": \"chunk\", \"batch\": 1, \"heads\": 32, \"kv_heads\": 8,"
        " \"head_dim\": 128, \"dtype\": \"bf16\", \"softcap\": 50, \"seq\": [2048, 30720],"
        " \"seq_k\": 30720, \"masks\": {\"causal\": \"causal\"}},"
        " {\"name\": \"plain\", \"batch\": 2, \"heads\": 4, \"head_dim\": 64, \"dtype\":"
        " \"fp16\", \"seq\": 100, \"masks\": [\"causal_window:32\"]}],"
        " \"pending\": {\"about\": \"for the benchmarks\", \"decode\": [{\"x\": [1, {}]}]}}";
    workload w = {0};
    char err[1024];
    ck_assert_msg(read_text(&w, text, err) == 0, "%s", err);
    ck_assert_int_eq(w.n, 3);
    const workload_case *c = find(&w, "chunk/causal/lq=2048,lk=30720");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->seq_q, 2048);
    ck_assert_int_eq(c->seq_k, 30720);
    ck_assert_int_eq(c->kv_heads, 8);
    ck_assert(c->softcap == 50.0);
    stof_mha_desc d;
    workload_mha_desc(c, STOF_TUNE_OFF, &d);
    ck_assert_int_eq(d.heads, 32);
    ck_assert_int_eq(d.kv_heads, 8);
    ck_assert_int_eq(d.seq_q, 2048);
    ck_assert_int_eq(d.seq_k, 30720);
    ck_assert(d.softcap == 50.0f);
    /* seq equal to seq_k: one length, named as before. */
    c = find(&w, "chunk/causal/l=30720");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->seq_q, 30720);
    ck_assert_int_eq(c->seq_k, 30720);
    /* A suite without them: plain multi-head attention, as before. */
    c = find(&w, "plain/causal_window:32/l=100");
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(c->kv_heads, 0);
    ck_assert(c->softcap == 0.0);
    ck_assert_int_eq(c->seq_k, 100);
    /* The library takes every mask at its lengths (bottom-right under the prefix). */
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    ck_assert_msg(workload_check(ctx, &w, err, sizeof err) == STOF_OK, "%s", err);
    stof_close(ctx);
    workload_free(&w);
}
END_TEST

/* A bad document: what the message must hold (position and path). */
typedef struct bad_doc {
    const char *text, *where, *what;
} bad_doc;

#define SUITE_OK "\"name\": \"s\", \"batch\": 1, \"heads\": 2, \"head_dim\": 64, \"dtype\": \"fp16\""
#define MODEL_OK "\"hidden\": 256, \"heads\": 4, \"ffn\": 4, \"activation\": \"gelu\", \"norm\": \"post_ln\""

#define DECODE_OK "{\"name\": \"d\", \"batch\": [1, 8], \"cache\": 64, \"heads\": 8, " \
                  "\"head_dim\": 64, \"dtype\": \"bf16\", \"masks\": [\"causal\"]"
#define DECODER_OK "\"kind\": \"decoder\", \"hidden\": 512, \"heads\": 8, \"kv_heads\": 2, " \
                   "\"ffn_hidden\": 1376"
#define DECODER_CASE "\"cases\": [{\"model\": \"d\", \"batch\": 1, \"seq\": 64, " \
                     "\"dtype\": \"bf16\", \"masks\": "

static const bad_doc BAD_DOCS[] = {
    {"[]", "t.json:1:1: $", "expected a workload object"},
    {"{\"models\": {\"d\": {" DECODER_OK ", \"ffn\": 4}}, " DECODER_CASE "[\"causal\"]}]}",
     "$.models.d.ffn", "unknown member \"ffn\""},
    {"{\"models\": {\"d\": {\"kind\": \"gpt\", \"hidden\": 8}}, " DECODER_CASE "[\"causal\"]}]}",
     "$.models.d.kind", "expected \"encoder\" or \"decoder\""},
    {"{\"models\": {\"d\": {\"kind\": \"decoder\", \"hidden\": 512, \"heads\": 8,"
     " \"ffn_hidden\": 1376}}, " DECODER_CASE "[\"causal\"]}]}",
     "$.models.d", "missing member \"kv_heads\""},
    {"{\"models\": {\"d\": {\"kind\": \"decoder\", \"hidden\": 512, \"heads\": 8,"
     " \"kv_heads\": 3, \"ffn_hidden\": 1376}}, " DECODER_CASE "[\"causal\"]}]}",
     "$.models.d.kv_heads", "kv_heads 3 does not divide heads 8"},
    {"{\"models\": {\"d\": {" DECODER_OK ", \"head_dim\": 128}}, " DECODER_CASE "[\"causal\"]}]}",
     "$.models.d.head_dim", "heads 8 x head_dim 128 is not hidden 512"},
    {"{\"models\": {\"d\": {\"kind\": \"decoder\", \"hidden\": 512, \"heads\": 8,"
     " \"kv_heads\": 2, \"ffn_hidden\": 1380}}, " DECODER_CASE "[\"causal\"]}]}",
     "$.models.d", "must be multiples of 8"},
    {"{\"models\": {\"d\": {" DECODER_OK ", \"qkv_bias\": 1}}, " DECODER_CASE "[\"causal\"]}]}",
     "$.models.d.qkv_bias", "expected true or false"},
    {"{\"models\": {\"d\": {\"kind\": \"decoder\", \"hidden\": 800, \"heads\": 16,"
     " \"kv_heads\": 2, \"ffn_hidden\": 1376}}, " DECODER_CASE "[\"causal\"]}]}",
     "$.models.d.heads", "head_dim 50, which is not supported"},
    {"{\"models\": {\"d\": {" DECODER_OK "}}, " DECODER_CASE "[\"causal\", \"window:16\"]}]}",
     "$.cases[0].masks[1]", "a decoder layer's mask is causal or causal_window:W"},
    {"{\"models\": {\"d\": {" DECODER_OK "}}, " DECODER_CASE "{\"w\": \"causal_window:0\"}}]}",
     "$.cases[0].masks.w", "causal_window:0"},
    {"{}", "t.json:1:1: $", "neither an attention workload"},
    {"{\"about\": \"x\"}", "t.json:1:1: $", "neither"},
    {"{\"models\": {}}", "t.json:1:1: $", "needs both"},
    {"{\"suites\": [], \"extra\": 1}", "t.json:1:25: $.extra", "unknown member \"extra\""},
    {"{\"suites\": {}}", "$.suites", "expected an array of suites"},
    {"{\"suites\": [5]}", "t.json:1:13: $.suites[0]", "expected an attention suite object"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": 64, \"masks\": [\"dense\"], \"head\": 2}]}",
     "$.suites[0].head", "unknown member \"head\""},
    {"{\"suites\": [{\"name\": \"s\", \"batch\": 1, \"heads\": 2, \"head_dim\": 64, \"seq\": 64,"
     " \"masks\": [\"dense\"]}]}",
     "$.suites[0]", "missing member \"dtype\""},
    {"{\"suites\": [{\"name\": \"s\", \"batch\": \"8\", \"heads\": 2, \"head_dim\": 64, \"dtype\":"
     " \"fp16\", \"seq\": 64, \"masks\": [\"dense\"]}]}",
     "$.suites[0].batch", "expected an integer from 1 to"},
    {"{\"suites\": [{\"name\": \"s\", \"batch\": 0, \"heads\": 2, \"head_dim\": 64, \"dtype\":"
     " \"fp16\", \"seq\": 64, \"masks\": [\"dense\"]}]}",
     "$.suites[0].batch", "got 0"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": [128, -3], \"masks\": [\"dense\"]}]}",
     "t.json:1:97: $.suites[0].seq[1]", "got -3"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": [1.5], \"masks\": [\"dense\"]}]}", "$.suites[0].seq[0]",
     "got 1.5"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": [], \"masks\": [\"dense\"]}]}", "$.suites[0].seq",
     "non-empty array"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": 64, \"masks\": {}}]}", "$.suites[0].masks",
     "non-empty object"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": 64, \"masks\": {\"a\": 5}}]}", "$.suites[0].masks.a",
     "expected a mask spec string"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": 64, \"masks\": [\"\"]}]}", "$.suites[0].masks[0]",
     "expected a mask spec string"},
    {"{\"suites\": [{\"name\": \"s\", \"batch\": 1, \"heads\": 2, \"head_dim\": 64, \"dtype\":"
     " \"fp8\", \"seq\": 64, \"masks\": [\"dense\"]}]}",
     "$.suites[0].dtype", "unknown dtype \"fp8\""},
    {"{\"suites\": [{\"name\": 3, \"batch\": 1, \"heads\": 2, \"head_dim\": 64, \"dtype\":"
     " \"fp16\", \"seq\": 64, \"masks\": [\"dense\"]}]}",
     "$.suites[0].name", "expected a string, got a number"},
    {"{\"models\": {\"m\": {" MODEL_OK "}}, \"cases\": [{\"model\": \"x\", \"batch\": 1,"
     " \"seq\": 64, \"dtype\": \"fp16\", \"masks\": [\"dense\"]}]}",
     "$.cases[0].model", "unknown model \"x\""},
    {"{\"models\": {\"m\": {\"hidden\": 250, \"heads\": 4, \"ffn\": 4, \"activation\": \"gelu\","
     " \"norm\": \"post_ln\"}}, \"cases\": []}",
     "$.models.m", "not a multiple of heads"},
    {"{\"models\": {\"m\": {\"hidden\": 256, \"heads\": 4, \"ffn\": 4, \"activation\": \"swish\","
     " \"norm\": \"post_ln\"}}, \"cases\": []}",
     "$.models.m.activation", "unknown activation \"swish\""},
    {"{\"models\": {\"m\": {\"hidden\": 256, \"heads\": 4, \"ffn\": 4, \"activation\": \"gelu\","
     " \"norm\": \"mid_ln\"}}, \"cases\": []}",
     "$.models.m.norm", "unknown norm"},
    {"{\"models\": {\"m\": {\"hidden\": 256, \"heads\": 4, \"ffn\": -1, \"activation\": \"gelu\","
     " \"norm\": \"post_ln\"}}, \"cases\": []}",
     "$.models.m.ffn", "expected a multiple of hidden"},
    {"{\"models\": {\"m\": {" MODEL_OK "}}, \"cases\": [{\"model\": \"m\", \"batch\": 1,"
     " \"seq\": 64, \"dtype\": \"fp16\", \"masks\": [\"dense\"], \"heads\": 3}]}",
     "$.cases[0].heads", "unknown member \"heads\""},
    {"{\"models\": {\"m\": {" MODEL_OK "}}, \"cases\": {}}", "$.cases", "expected an array"},
    {"{\"suites\": [\n  {\"name\": \"x\",, }]}", "t.json:2:16: $.suites[0]",
     "expected a member name in double quotes"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": 64, \"masks\": [\"dense\"], \"seq\": 1}]}",
     "$.suites[0]", "duplicate member name \"seq\""},
    /* Sizes attention does not support (stof.h's limits), refused as the file is read. */
    {"{\"suites\": [{\"name\": \"s\", \"batch\": 1, \"heads\": 2, \"head_dim\": 48, \"dtype\":"
     " \"fp16\", \"seq\": 64, \"masks\": [\"dense\"]}]}",
     "$.suites[0].head_dim", "head_dim 48 is not supported: attention takes head_dim 32, 64, 80, "
     "96 or 128"},
    {"{\"suites\": [{\"name\": \"s\", \"batch\": 32768, \"heads\": 4, \"head_dim\": 64, "
     "\"dtype\": \"fp16\", \"seq\": 64, \"masks\": [\"dense\"]}]}",
     "$.suites[0]", "batch x heads up to 65535"},
    {"{\"suites\": [{\"name\": \"s\", \"batch\": 1, \"heads\": 2, \"head_dim\": 64, \"dtype\":"
     " \"fp32\", \"seq\": 64, \"masks\": [\"dense\"]}]}",
     "$.suites[0].dtype", "dtype fp32 is not supported"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": [128, 4194241], \"masks\": [\"dense\"]}]}",
     "$.suites[0].seq[1]", "sequence length 4194241 is not supported"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": 16777216, \"masks\": [\"dense\"]}]}",
     "$.suites[0].seq", "lengths up to 4194240"},
    {"{\"models\": {\"m\": {\"hidden\": 192, \"heads\": 4, \"ffn\": 4, \"activation\": \"gelu\","
     " \"norm\": \"post_ln\"}}, \"cases\": [{\"model\": \"m\", \"batch\": 1, \"seq\": 64, "
     "\"dtype\": \"fp16\", \"masks\": [\"dense\"]}]}",
     "$.models.m.heads", "head_dim 48, which is not supported"},
    {"{\"models\": {\"m\": {" MODEL_OK "}}, \"cases\": [{\"model\": \"m\", \"batch\": 1,"
     " \"seq\": 64, \"dtype\": \"fp32\", \"masks\": [\"dense\"]}]}",
     "$.cases[0].dtype", "dtype fp32 is not supported"},
    {"{\"models\": {\"m\": {" MODEL_OK "}}, \"cases\": [{\"model\": \"m\", \"batch\": 1,"
     " \"seq\": 4194304, \"dtype\": \"fp16\", \"masks\": [\"dense\"]}]}",
     "$.cases[0].seq", "sequence length 4194304 is not supported"},
    /* A decoder model's members (llm.json): kv_heads, softcap, seq_k; and "pending". */
    {"{\"suites\": [{" SUITE_OK ", \"kv_heads\": 3, \"seq\": 64, \"masks\": [\"causal\"]}]}",
     "$.suites[0].kv_heads", "kv_heads 3 does not divide heads 2"},
    {"{\"suites\": [{" SUITE_OK ", \"kv_heads\": 0, \"seq\": 64, \"masks\": [\"causal\"]}]}",
     "$.suites[0].kv_heads", "expected an integer from 1 to"},
    {"{\"suites\": [{" SUITE_OK ", \"softcap\": -1, \"seq\": 64, \"masks\": [\"causal\"]}]}",
     "$.suites[0].softcap", "a finite number >= 0"},
    {"{\"suites\": [{" SUITE_OK ", \"softcap\": \"50\", \"seq\": 64, \"masks\": [\"causal\"]}]}",
     "$.suites[0].softcap", "the logit softcap"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": [64, 256], \"seq_k\": 128, \"masks\": [\"causal\"]}]}",
     "$.suites[0].seq_k", "seq_k 128 is shorter than seq 256"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": 64, \"seq_k\": 4194304, \"masks\": [\"causal\"]}]}",
     "$.suites[0].seq_k", "sequence length 4194304 is not supported"},
    {"{\"suites\": [{" SUITE_OK ", \"seq\": 64, \"masks\": [\"causal\"], \"alibi\": 1}]}",
     "$.suites[0].alibi", "expected true (ALiBi"},
    /* Decode suites (llm.json's "decode"). */
    {"{\"decode\": {}}", "$.decode", "expected an array of decode suites"},
    {"{\"decode\": [" DECODE_OK ", \"seq\": 4}]}", "$.decode[0].seq", "unknown member \"seq\""},
    {"{\"decode\": [{\"name\": \"d\", \"batch\": [], \"cache\": 64, \"heads\": 8,"
     " \"head_dim\": 64, \"dtype\": \"bf16\", \"masks\": [\"causal\"]}]}",
     "$.decode[0].batch", "expected a batch size or a non-empty array"},
    {"{\"decode\": [{\"name\": \"d\", \"batch\": 1, \"heads\": 8, \"head_dim\": 64,"
     " \"dtype\": \"bf16\", \"masks\": [\"causal\"]}]}",
     "$.decode[0]", "missing member \"cache\""},
    {"{\"decode\": [" DECODE_OK ", \"new\": 17}]}", "$.decode[0].new", "from 1 to 16"},
    {"{\"decode\": [{\"name\": \"d\", \"batch\": 1, \"cache\": [64, 2], \"new\": 4,"
     " \"heads\": 8, \"head_dim\": 64, \"dtype\": \"bf16\", \"masks\": [\"causal\"]}]}",
     "$.decode[0].masks[0]", "batch 1, cache 2: cache=2 must be new (4)"},
    {"{\"decode\": [" DECODE_OK ", \"kv_heads\": 3}]}", "$.decode[0].kv_heads",
     "kv_heads 3 does not divide heads 8"},
    {"{\"decode\": [{\"name\": \"d\", \"batch\": 1, \"cache\": 64, \"heads\": 8,"
     " \"head_dim\": 48, \"dtype\": \"bf16\", \"masks\": [\"causal\"]}]}",
     "$.decode[0].masks[0]", "head_dim 48 is not supported: decoding takes"},
    {"{\"decode\": [{\"name\": \"d\", \"batch\": 1, \"cache\": 64, \"heads\": 8,"
     " \"head_dim\": 64, \"dtype\": \"bf16\", \"masks\": {\"w\": \"window:16\"}}]}",
     "$.decode[0].masks.w", "a decoding step's mask is causal or causal_window:W"},
    {"{\"suites\": [], \"pending\": []}", "$.pending", "expected an object of cases"},
    {"{\"pending\": {}}", "t.json:1:1: $", "neither an attention workload"},
};

START_TEST(test_bad_docs)
{
    const bad_doc *b = &BAD_DOCS[_i];
    workload w = {0};
    char err[1024] = "";
    ck_assert(workload_add_ln(&w, "rows=1,hidden=8", err, sizeof err) == 0);
    ck_assert_msg(read_text(&w, b->text, err) != 0, "accepted: %s", b->text);
    ck_assert_msg(strstr(err, b->where) && strstr(err, b->what), "[%s]\n  said: %s\n  wanted: %s ... %s",
                  b->text, err, b->where, b->what);
    ck_assert_int_eq(w.n, 1);   /* unchanged */
    workload_free(&w);
}
END_TEST

START_TEST(test_missing_file)
{
    workload w = {0};
    char err[1024];
    ck_assert(workload_read_file(&w, "/nonexistent/x.json", err, sizeof err) != 0);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/x.json"));
    ck_assert_ptr_nonnull(strstr(err, "No such file"));
    ck_assert_int_eq(w.n, 0);
}
END_TEST

START_TEST(test_masks_checked)
{
    workload w = {0};
    char err[2048];
    const char *doc = "{\"suites\": [{" SUITE_OK ", \"seq\": [64, 128],"
                      " \"masks\": {\"ok\": \"causal\", \"w\": \"window:3\"}}]}";
    ck_assert(read_text(&w, doc, err) == 0);
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    ck_assert_int_eq(workload_check(ctx, &w, err, sizeof err), STOF_ERR_INVALID_ARG);
    ck_assert_msg(strstr(err, "s/w/l=64") && strstr(err, "$.suites[0].masks.w") &&
                  strstr(err, "window:3"), "%s", err);
    workload_free(&w);
    /* A spec that fits one length but not another. */
    ck_assert(workload_add_mha(&w, "b=1,h=1,l=300,d=64,docs:100,200", err, sizeof err) == 0);
    ck_assert_int_eq(workload_check(ctx, &w, err, sizeof err), STOF_OK);
    ck_assert(workload_add_mha(&w, "b=1,h=1,l=256,d=64,docs:100,200", err, sizeof err) == 0);
    ck_assert_int_eq(workload_check(ctx, &w, err, sizeof err), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err, "--mha \"b=1,h=1,l=256"));
    workload_free(&w);
    stof_close(ctx);
}
END_TEST

START_TEST(test_mha_lines)
{
    workload w = {0};
    char err[1024];
    ck_assert(workload_add_mha(&w, "b=8,h=12,l=2048,d=64,fp16,window:256", err, sizeof err) == 0);
    ck_assert(workload_add_mha(&w, "b=2, h=16, l=8192, d=128, bf16, docs:1024,3072,4096", err,
                               sizeof err) == 0);
    ck_assert(workload_add_mha(&w, "batch=1,heads=2,lq=128,lk=256,head_dim=64", err, sizeof err) == 0);
    ck_assert(workload_add_mha(&w, "b=1,h=1,l=64,d=32,mask=causal_window:32, ", err, sizeof err) == 0);
    ck_assert(workload_add_mha(&w, "dtype=bf16,b=1,h=1,l=64,d=64,causal+global:4", err, sizeof err) == 0);
    ck_assert_msg(workload_add_mha(&w, "b=1,h=32,kv=8,lq=2048,lk=30720,d=128,bf16,softcap=50.5,"
                                   "causal", err, sizeof err) == 0, "%s", err);
    ck_assert(workload_add_mha(&w, "b=1,h=4,kv_heads=1,l=64,d=64,softcap=0", err, sizeof err) == 0);
    ck_assert_msg(workload_add_mha(&w, "b=1,h=32,l=8192,d=128,bf16,softcap=30,alibi=1,bias=32,"
                                   "causal", err, sizeof err) == 0, "%s", err);
    ck_assert(workload_add_mha(&w, "b=1,h=4,l=64,d=64,alibi=0,bias_buckets=0", err,
                               sizeof err) == 0);
    ck_assert_int_eq(w.n, 9);
    const workload_case *c = &w.cases[0];
    ck_assert(c->op == WORKLOAD_MHA && c->batch == 8 && c->heads == 12 && c->seq_q == 2048 &&
              c->seq_k == 2048 && c->head_dim == 64 && c->dtype == STOF_F16);
    ck_assert_str_eq(c->mask, "window:256");
    ck_assert_str_eq(c->name, "mha b=8,h=12,l=2048,d=64,fp16,window:256");
    ck_assert_str_eq(w.cases[1].mask, "docs:1024,3072,4096");
    ck_assert_int_eq(w.cases[1].dtype, STOF_BF16);
    ck_assert_str_eq(w.cases[2].mask, "dense");
    ck_assert_int_eq(w.cases[2].seq_q, 128);
    ck_assert_int_eq(w.cases[2].seq_k, 256);
    ck_assert_int_eq(w.cases[2].dtype, STOF_F16);
    ck_assert_str_eq(w.cases[3].mask, "causal_window:32,");
    ck_assert_str_eq(w.cases[4].mask, "causal+global:4");
    ck_assert_int_eq(w.cases[4].dtype, STOF_BF16);
    stof_mha_desc d;
    workload_mha_desc(&w.cases[2], STOF_TUNE_FULL, &d);
    ck_assert(d.batch == 1 && d.heads == 2 && d.seq_q == 128 && d.seq_k == 256 &&
              d.head_dim == 64 && d.dtype == STOF_F16 && d.layout == STOF_LAYOUT_BHLD &&
              d.tune == STOF_TUNE_FULL && d.scale == 0 && d.kv_heads == 0 && d.softcap == 0);
    /* grouped KV heads and the softcap, into the desc */
    workload_mha_desc(&w.cases[5], STOF_TUNE_FAST, &d);
    ck_assert(d.heads == 32 && d.kv_heads == 8 && d.seq_q == 2048 && d.seq_k == 30720 &&
              d.softcap == 50.5f && d.dtype == STOF_BF16);
    ck_assert_str_eq(w.cases[5].mask, "causal");
    ck_assert_str_eq(w.cases[5].name, "mha b=1,h=32,kv=8,lq=2048,lk=30720,d=128,bf16,softcap=50.5,"
                                      "causal");
    workload_mha_desc(&w.cases[6], STOF_TUNE_FAST, &d);
    ck_assert(d.heads == 4 && d.kv_heads == 1 && d.softcap == 0 && !d.alibi &&
              !d.bias_buckets);
    /* ALiBi and the bias, into the desc with no data: a plan needs none */
    workload_mha_desc(&w.cases[7], STOF_TUNE_FAST, &d);
    ck_assert(d.alibi == 1 && !d.alibi_slopes && d.bias_buckets == 32 && !d.bias_table &&
              d.softcap == 30.f);
    ck_assert_str_eq(w.cases[7].mask, "causal");
    workload_mha_desc(&w.cases[8], STOF_TUNE_FAST, &d);
    ck_assert(!d.alibi && !d.bias_buckets);
    workload_free(&w);
}
END_TEST

typedef struct bad_line {
    int ln;
    const char *line, *what;
} bad_line;

static const bad_line BAD_LINES[] = {
    {0, "h=12,l=2048,d=64", "missing b="},
    {0, "b=8,l=2048,d=64", "missing h="},
    {0, "b=8,h=12,l=2048", "missing d="},
    {0, "b=8,h=12,d=64", "missing l= (or lq= and lk=)"},
    {0, "b=8,h=12,d=64,lq=4", "missing l="},
    {0, "b=8,h=12,l=5,lq=5,d=64", "not both"},
    {0, "b=0,h=12,l=2048,d=64", "b=0: expected an integer from 1"},
    {0, "b=x,h=12,l=2048,d=64", "b=x"},
    {0, "b=-1,h=12,l=2048,d=64", "b=-1"},
    {0, "b=8,b=9,h=12,l=2048,d=64", "b is given twice"},
    {0, "b=8,x=3,h=12,l=2048,d=64", "unknown field \"x\""},
    {0, "b=8,,h=12,l=2048,d=64", "empty field"},
    {0, "b=8,h=12,l=2048,d=64,dtype=fp8", "unknown dtype \"fp8\""},
    /* Sizes attention does not support, refused as the line is read. */
    {0, "b=1,h=1,l=4194241,d=64", "l=4194241 is not supported"},
    {0, "b=1,h=1,lq=4194241,lk=8,d=64", "lq=4194241 is not supported"},
    {0, "b=1,h=1,l=16777216,d=64", "query lengths up to 4194240"},
    {0, "b=1,h=1,lq=8,lk=4194241,d=64", "lk=4194241 is not supported"},
    {0, "b=1,h=1,lq=8,lk=16777216,d=64", "key lengths up to 4194240"},
    {0, "b=1,h=1,l=64,d=100", "d=100 is not supported"},
    {0, "b=1,h=1,l=64,head_dim=1024", "d=1024 is not supported"},
    {0, "b=65536,h=1,l=64,d=64", "b=65536 x h=1 is not supported"},
    {0, "b=256,h=256,l=64,d=64", "b x h up to 65535"},
    {0, "b=1,h=1,l=64,d=64,fp32", "dtype fp32 is not supported"},
    {0, "b=1,h=8,kv=3,l=64,d=64", "kv=3 does not divide h=8"},
    {0, "b=1,h=8,kv=0,l=64,d=64", "kv=0: expected an integer from 1"},
    {0, "b=1,h=8,l=64,d=64,softcap=-1", "softcap=-1 is not a finite number >= 0"},
    {0, "b=1,h=8,l=64,d=64,softcap=nan", "softcap=nan is not"},
    {0, "b=1,h=8,l=64,d=64,softcap=inf", "softcap=inf is not"},
    {0, "b=1,h=8,l=64,d=64,softcap=", "softcap= is not"},
    {0, "b=1,h=8,l=64,d=64,softcap=3x", "softcap=3x is not"},
    {0, "b=1,h=8,l=64,d=64,alibi=2", "alibi=2: expected an integer from 0 to 1"},
    {0, "b=1,h=8,l=64,d=64,bias=4097", "bias=4097: expected an integer from 0 to 4096"},
    {0, "b=1,h=8,l=64,d=64,bias=-1", "bias=-1"},
    {1, "rows=4", "missing hidden="},
    {1, "hidden=8", "missing rows="},
    {1, "rows=4,hidden=8,causal", "unexpected \"causal\""},
    {1, "rows=4,hidden=8,mask=causal", "unknown field \"mask\""},
    {1, "rows=4,hidden=99999999999999", "hidden="},
};

START_TEST(test_bad_lines)
{
    const bad_line *b = &BAD_LINES[_i];
    workload w = {0};
    char err[1024] = "";
    int rc = b->ln ? workload_add_ln(&w, b->line, err, sizeof err)
                   : workload_add_mha(&w, b->line, err, sizeof err);
    ck_assert_msg(rc != 0, "accepted: %s", b->line);
    ck_assert_msg(strstr(err, b->what), "[%s] said: %s; wanted: %s", b->line, err, b->what);
    ck_assert_ptr_nonnull(strstr(err, b->ln ? "--ln" : "--mha"));
    ck_assert_int_eq(w.n, 0);
}
END_TEST

/* The limits --mha holds lines to are the library's: what attention refuses
 * as unsupported (STOF_ERR_UNSUPPORTED) is what stof.h says it does not
 * take. The mask is 64 x 64 and seq_q 65, so a descriptor within every
 * limit fails only on the mismatch (STOF_ERR_INVALID_ARG), before any
 * compile. */
START_TEST(test_mha_limits_are_the_library_s)
{
    stof_ctx *ctx = NULL;
    stof_mask *m = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    ck_assert_int_eq(stof_mask_parse(ctx, "dense", 64, 64, &m), STOF_OK);
    for (int d = 1; d <= 1024; d++) {
        stof_mha_desc desc = {.batch = 1, .heads = 1, .seq_q = 65, .seq_k = 64, .head_dim = d,
                              .dtype = STOF_F16};
        stof_status st = stof_mha_prepare(ctx, &desc, m);
        ck_assert_msg(st == (stof_mha_head_dim_supported(d) ? STOF_ERR_INVALID_ARG
                                                            : STOF_ERR_UNSUPPORTED),
                      "head_dim %d: %s: %s", d, stof_status_str(st), stof_last_error(ctx));
    }
    /* The call and the list agree, and the tools say the list whole. */
    static const int dims[] = {STOF_MHA_HEAD_DIMS};
    int listed = 0;
    for (int d = -1; d <= 1024; d++) {
        int in = 0;
        for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
            in |= dims[i] == d;
        listed += in;
        ck_assert_int_eq(stof_mha_head_dim_supported(d), in);
    }
    ck_assert_int_eq(listed, 5);
    char text[64];
    ck_assert_str_eq(workload_mha_head_dims(text, sizeof text), "32, 64, 80, 96 or 128");
    static const struct { int b, h, lq, lk; stof_dtype dt; int ok; } cases[] = {
        {1, 1, STOF_MAX_SEQ, 64, STOF_F16, 1},
        {1, 1, STOF_MAX_SEQ + 1, 64, STOF_F16, 0},
        {1, 1, 65, STOF_MAX_SEQ, STOF_F16, 1},
        {1, 1, 65, STOF_MAX_SEQ + 1, STOF_F16, 0},
        {STOF_MAX_BATCH_HEADS, 1, 65, 64, STOF_BF16, 1},
        {STOF_MAX_BATCH_HEADS + 1, 1, 65, 64, STOF_F16, 0},
        {256, 256, 65, 64, STOF_F16, 0},
        {1, 1, 65, 64, STOF_F32, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        stof_mha_desc desc = {.batch = cases[i].b, .heads = cases[i].h, .seq_q = cases[i].lq,
                              .seq_k = cases[i].lk, .head_dim = 64, .dtype = cases[i].dt};
        stof_status st = stof_mha_prepare(ctx, &desc, m);
        ck_assert_msg(st == (cases[i].ok ? STOF_ERR_INVALID_ARG : STOF_ERR_UNSUPPORTED),
                      "case %zu: %s: %s", i, stof_status_str(st), stof_last_error(ctx));
    }
    stof_mask_free(m);
    stof_close(ctx);
    /* And --mha takes the largest of each. */
    workload w = {0};
    char err[1024];
    ck_assert_msg(workload_add_mha(&w, "b=65535,h=1,l=4194240,d=128,bf16", err, sizeof err) == 0,
                  "%s", err);
    ck_assert_msg(workload_add_mha(&w, "b=1,h=1,lq=64,lk=4194240,d=32", err, sizeof err) == 0,
                  "%s", err);
    ck_assert_int_eq(w.n, 2);
    workload_free(&w);
}
END_TEST

/* --decoder: the one-liner and its spellings, defaults (kv heads =
 * heads, head_dim = hidden / heads, causal, bf16), a file's decoder model
 * with Qwen2's biases, the desc each maps to; what the decoder layer
 * refuses is refused as the line is read, naming the field. */
START_TEST(test_decoder_lines)
{
    workload w = {0};
    char err[1024];
    ck_assert_msg(workload_add_decoder(&w, "b=1,s=4096,hidden=4096,h=32,kv=8,ffn=14336,bf16,"
                                       "causal_window:4096", err, sizeof err) == 0, "%s", err);
    ck_assert_msg(workload_add_decoder(&w, "batch=2, seq=333, hidden=512, heads=4, "
                                       "ffn_hidden=1376, head_dim=128, qkv_bias=1, fp16, "
                                       "mask=causal", err, sizeof err) == 0, "%s", err);
    ck_assert_msg(workload_add_decoder(&w, "b=1,l=64,hidden=2048,h=32,kv=8,ffn=8192", err,
                                       sizeof err) == 0, "%s", err);
    ck_assert_int_eq(w.n, 3);
    const workload_case *c = &w.cases[0];
    ck_assert(c->op == WORKLOAD_DECODER && c->batch == 1 && c->seq_q == 4096 &&
              c->seq_k == 4096 && c->hidden == 4096 && c->heads == 32 && c->kv_heads == 8 &&
              c->head_dim == 128 && c->ffn_hidden == 14336 && c->dtype == STOF_BF16 &&
              c->rows == 4096 && !c->qkv_bias && !c->model);
    ck_assert_str_eq(c->mask, "causal_window:4096");
    ck_assert_str_eq(c->origin, "--decoder \"b=1,s=4096,hidden=4096,h=32,kv=8,ffn=14336,bf16,"
                                "causal_window:4096\"");
    ck_assert_str_eq(workload_op_name(c->op), "decoder");
    stof_decoder_desc d;
    workload_decoder_desc(c, STOF_TUNE_FULL, &d);
    ck_assert(d.batch == 1 && d.seq == 4096 && d.window == 4096 && d.kv_heads == 8 &&
              d.head_dim == 128 && d.ffn_hidden == 14336 && d.tune == STOF_TUNE_FULL &&
              d.dtype == STOF_BF16 && d.rope_theta == 10000.f && d.eps == 0);
    c = &w.cases[1];
    ck_assert(c->kv_heads == 4 && c->head_dim == 128 && c->qkv_bias && c->dtype == STOF_F16 &&
              c->rows == 666);
    ck_assert_str_eq(c->mask, "causal");
    workload_decoder_desc(c, STOF_TUNE_OFF, &d);
    ck_assert(d.window == 0 && d.qkv_bias == 1 && d.kv_heads == 4);
    c = &w.cases[2];
    ck_assert(c->kv_heads == 8 && c->head_dim == 64 && c->dtype == STOF_BF16 && c->seq_q == 64);
    ck_assert_str_eq(c->mask, "causal");
    /* The masks parse for their lengths. */
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    ck_assert_int_eq(workload_check(ctx, &w, err, sizeof err), STOF_OK);
    stof_close(ctx);
    workload_free(&w);

    const char *doc = "{\"models\": {\"qwen2-like\": {\"kind\": \"decoder\", \"hidden\": 896,"
                      " \"heads\": 14, \"kv_heads\": 2, \"head_dim\": 64, \"ffn_hidden\": 4864,"
                      " \"qkv_bias\": true}, \"enc\": {\"kind\": \"encoder\", " MODEL_OK "}},"
                      " \"cases\": [{\"model\": \"qwen2-like\", \"batch\": 3, \"seq\": [100, 333],"
                      " \"dtype\": \"fp16\", \"masks\": {\"c\": \"causal\", \"w\": \"causal_window:32\"}},"
                      " {\"model\": \"enc\", \"batch\": 1, \"seq\": 64, \"dtype\": \"fp16\","
                      " \"masks\": [\"dense\"]}]}";
    ck_assert_msg(read_text(&w, doc, err) == 0, "%s", err);
    ck_assert_int_eq(w.n, 5);
    c = find(&w, "qwen2-like/l=333/causal_window:32");
    ck_assert_ptr_nonnull(c);
    ck_assert(c->op == WORKLOAD_DECODER && c->qkv_bias && c->kv_heads == 2 && c->rows == 999 &&
              c->head_dim == 64 && c->dtype == STOF_F16);
    ck_assert_ptr_nonnull(strstr(c->origin, "$.cases[0].masks.w"));
    workload_decoder_desc(c, STOF_TUNE_OFF, &d);
    ck_assert(d.window == 32 && d.qkv_bias == 1 && d.seq == 333 && d.batch == 3);
    ck_assert_int_eq(w.cases[4].op, WORKLOAD_LAYER);
    workload_free(&w);

    ck_assert_int_eq(workload_decoder_window("causal"), 0);
    ck_assert_int_eq(workload_decoder_window("causal_window:7"), 7);
    ck_assert_int_eq(workload_decoder_window("causal_window:0"), -1);
    ck_assert_int_eq(workload_decoder_window("causal_window:"), -1);
    ck_assert_int_eq(workload_decoder_window("causal_window:8x"), -1);
    ck_assert_int_eq(workload_decoder_window("window:8"), -1);
    ck_assert_int_eq(workload_decoder_window("causal+global:4"), -1);
}
END_TEST

static const char *const BAD_DECODER_LINES[][2] = {
    {"s=64,hidden=512,h=8,ffn=1376", "missing b="},
    {"b=1,hidden=512,h=8,ffn=1376", "missing s="},
    {"b=1,s=64,h=8,ffn=1376", "missing hidden="},
    {"b=1,s=64,hidden=512,ffn=1376", "missing h="},
    {"b=1,s=64,hidden=512,h=8", "missing ffn="},
    {"b=1,s=64,hidden=512,h=8,kv=3,ffn=1376", "kv=3 does not divide h=8"},
    {"b=1,s=64,hidden=512,h=8,d=128,ffn=1376", "hidden=512 is not h=8 x head_dim 128"},
    {"b=1,s=64,hidden=400,h=8,ffn=1376", "head_dim 50 is not supported"},
    {"b=1,s=64,hidden=512,h=8,ffn=1380", "must be multiples of 8"},
    {"b=1,s=64,hidden=512,h=8,ffn=1376,fp32", "dtype fp32 is not supported"},
    {"b=1,s=64,hidden=512,h=8,ffn=1376,window:16", "mask \"window:16\""},
    {"b=1,s=64,hidden=512,h=8,ffn=1376,causal_window:0", "causal or causal_window:W"},
    {"b=1,s=64,hidden=512,h=8,ffn=1376,qkv_bias=2", "qkv_bias=2"},
    {"b=1,s=64,hidden=512,h=8,ffn=1376,softcap=3", "unknown field \"softcap\""},
    {"b=1,s=16777216,hidden=512,h=8,ffn=1376", "s=16777216 is not supported"},
    {"b=1048576,s=64,hidden=512,h=8,ffn=1376", "b=1048576 x h=8 is not supported"},
    {"b=1,s=64,s=32,hidden=512,h=8,ffn=1376", "s is given twice"},
};

START_TEST(test_bad_decoder_lines)
{
    const char *line = BAD_DECODER_LINES[_i][0], *what = BAD_DECODER_LINES[_i][1];
    workload w = {0};
    char err[1024] = "";
    ck_assert_msg(workload_add_decoder(&w, line, err, sizeof err) != 0, "accepted: %s", line);
    ck_assert_msg(strstr(err, what), "[%s] said: %s; wanted: %s", line, err, what);
    ck_assert_ptr_nonnull(strstr(err, "--decoder"));
    ck_assert_int_eq(w.n, 0);
}
END_TEST

/* --decode and a file's "decode" suites: the one-liner and its
 * spellings, defaults (kv heads = heads, one new row, causal, bf16), the
 * desc each maps to (max_seq_k the cache, the window from the mask). */
START_TEST(test_decode_lines)
{
    workload w = {0};
    char err[1024];
    ck_assert_msg(workload_add_decode(&w, "b=8,h=32,kv=8,d=128,cache=32768,new=1,bf16,"
                                      "causal_window:4096", err, sizeof err) == 0, "%s", err);
    ck_assert_msg(workload_add_decode(&w, "batch=3, heads=4, head_dim=64, max_seq_k=333, "
                                      "seq_q=16, fp16, softcap=30, mask=causal", err,
                                      sizeof err) == 0, "%s", err);
    ck_assert_msg(workload_add_decode(&w, "b=1,h=8,d=96,cache=7", err, sizeof err) == 0, "%s",
                  err);
    ck_assert_int_eq(w.n, 3);
    const workload_case *c = &w.cases[0];
    ck_assert(c->op == WORKLOAD_DECODE && c->batch == 8 && c->heads == 32 && c->kv_heads == 8 &&
              c->head_dim == 128 && c->seq_q == 1 && c->seq_k == 32768 && c->dtype == STOF_BF16);
    ck_assert_str_eq(c->mask, "causal_window:4096");
    ck_assert_str_eq(workload_op_name(c->op), "decode");
    stof_decode_desc d;
    workload_decode_desc(c, &d);
    ck_assert(d.batch == 8 && d.heads == 32 && d.kv_heads == 8 && d.head_dim == 128 &&
              d.seq_q == 1 && d.max_seq_k == 32768 && d.window == 4096 && d.softcap == 0.f &&
              d.dtype == STOF_BF16 && d.layout == STOF_LAYOUT_BHLD && d.scale == 0.f);
    c = &w.cases[1];
    workload_decode_desc(c, &d);
    ck_assert(d.batch == 3 && d.kv_heads == 0 && d.seq_q == 16 && d.max_seq_k == 333 &&
              d.window == 0 && d.softcap == 30.f && d.dtype == STOF_F16);
    c = &w.cases[2];
    ck_assert(c->seq_q == 1 && c->kv_heads == 0 && c->dtype == STOF_BF16);
    ck_assert_str_eq(c->mask, "causal");
    workload_free(&w);

    const char *doc = "{\"decode\": [{\"name\": \"q\", \"batch\": [1, 8], \"cache\": [64, 100],"
                      " \"new\": 2, \"heads\": 8, \"kv_heads\": 2, \"head_dim\": 64, \"dtype\":"
                      " \"fp16\", \"softcap\": 50, \"masks\": {\"c\": \"causal\","
                      " \"w\": \"causal_window:32\"}}]}";
    ck_assert_msg(read_text(&w, doc, err) == 0, "%s", err);
    ck_assert_int_eq(w.n, 8);
    c = find(&w, "q/w/b=8,cache=100");
    ck_assert_ptr_nonnull(c);
    ck_assert(c->op == WORKLOAD_DECODE && c->seq_q == 2 && c->seq_k == 100 && c->kv_heads == 2 &&
              c->softcap == 50.0);
    ck_assert_ptr_nonnull(strstr(c->origin, "$.decode[0].masks.w"));
    workload_decode_desc(c, &d);
    ck_assert(d.window == 32 && d.batch == 8 && d.max_seq_k == 100 && d.softcap == 50.f);
    /* The masks parse for their lengths (the new rows last). */
    stof_ctx *ctx = NULL;
    ck_assert_int_eq(stof_open(&ctx, &(stof_options){.no_cache = 1}), STOF_OK);
    ck_assert_msg(workload_check(ctx, &w, err, sizeof err) == STOF_OK, "%s", err);
    stof_close(ctx);
    workload_free(&w);
}
END_TEST

static const char *const BAD_DECODE_LINES[][2] = {
    {"h=8,d=64,cache=64", "missing b="},
    {"b=1,d=64,cache=64", "missing h="},
    {"b=1,h=8,cache=64", "missing d="},
    {"b=1,h=8,d=64", "missing cache="},
    {"b=1,h=8,d=64,cache=64,new=17", "new=17 must be 1 .. 16"},
    {"b=1,h=8,d=64,cache=3,new=4", "cache=3 must be new (4)"},
    {"b=1,h=8,d=64,cache=16777216", "cache=16777216 must be new"},
    {"b=65536,h=8,d=64,cache=64", "batch 65536 must be 1 .. 65535"},
    {"b=1,h=8,kv=3,d=64,cache=64", "kv_heads 3 does not divide heads 8"},
    {"b=1,h=8,d=48,cache=64", "head_dim 48 is not supported"},
    {"b=1,h=8,d=64,cache=64,fp32", "dtype fp32 is not supported"},
    {"b=1,h=8,d=64,cache=64,window:16", "mask \"window:16\""},
    {"b=1,h=8,d=64,cache=64,softcap=-1", "softcap=-1 is not a finite number"},
    {"b=1,h=8,d=64,cache=64,l=5", "unknown field \"l\""},
    {"b=1,h=8,d=64,cache=64,cache=32", "cache is given twice"},
};

START_TEST(test_bad_decode_lines)
{
    const char *line = BAD_DECODE_LINES[_i][0], *what = BAD_DECODE_LINES[_i][1];
    workload w = {0};
    char err[1024] = "";
    ck_assert_msg(workload_add_decode(&w, line, err, sizeof err) != 0, "accepted: %s", line);
    ck_assert_msg(strstr(err, what), "[%s] said: %s; wanted: %s", line, err, what);
    ck_assert_ptr_nonnull(strstr(err, "--decode"));
    ck_assert_int_eq(w.n, 0);
}
END_TEST

START_TEST(test_ln_lines)
{
    workload w = {0};
    char err[1024];
    ck_assert(workload_add_ln(&w, "rows=16384,hidden=768,fp16", err, sizeof err) == 0);
    ck_assert(workload_add_ln(&w, "r=4,n=8", err, sizeof err) == 0);
    ck_assert(workload_add_ln(&w, "hidden=1024,rows=2,dtype=fp32", err, sizeof err) == 0);
    ck_assert_int_eq(w.n, 3);
    ck_assert(w.cases[0].op == WORKLOAD_LN && w.cases[0].rows == 16384 &&
              w.cases[0].hidden == 768 && w.cases[0].dtype == STOF_F16 && !w.cases[0].mask);
    ck_assert_int_eq(w.cases[1].dtype, STOF_F16);
    ck_assert_int_eq(w.cases[2].dtype, STOF_F32);
    stof_ln_desc d;
    workload_ln_desc(&w.cases[0], &d);
    ck_assert(d.rows == 16384 && d.hidden == 768 && d.dtype == STOF_F16 && d.eps == 0);
    ck_assert_str_eq(workload_op_name(w.cases[0].op), "layernorm");
    workload_free(&w);
}
END_TEST

/* Randomly damaged copies of the shared files: accepted or refused with a
 * positioned message, never a crash, and a refusal changes nothing. */
START_TEST(test_damaged_files)
{
    test_rng r = test_rng_make(0x776b);
    const char *src[2] = {ATTENTION_JSON, LAYERS_JSON};
    for (int iter = 0; iter < 400; iter++) {
        char buf[4096];
        const char *s = src[iter & 1];
        size_t n = strlen(s);
        memcpy(buf, s, n + 1);
        int edits = test_rng_int(&r, 1, 3);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)test_rng_int(&r, 0, (int)n - 1);
            int how = test_rng_int(&r, 0, 2);
            static const char pick[] = "{}[]\",:0-9a \\\x01\xff";
            if (how == 0)
                buf[at] = pick[test_rng_int(&r, 0, (int)sizeof pick - 2)];
            else if (how == 1)
                memmove(buf + at, buf + at + 1, n - at), n--;
            else
                buf[at] = (char)(test_rng_next(&r) & 0xff);
        }
        workload w = {0};
        char err[1024] = "";
        if (workload_read_text(&w, buf, n, "t.json", err, sizeof err) == 0) {
            ck_assert_int_gt(w.n, 0);
        } else {
            ck_assert_msg(strncmp(err, "t.json:", 7) == 0 && strstr(err, ": $"),
                          "seed %llu iter %d: %s", (unsigned long long)test_seed(), iter, err);
            ck_assert_int_eq(w.n, 0);
        }
        workload_free(&w);
    }
}
END_TEST

Suite *suite_workload(void)
{
    Suite *s = suite_create("workload");
    TCase *tc = tcase_create("workload");
    tcase_add_test(tc, test_embedded_copies);
    tcase_add_test(tc, test_shared_files);
    tcase_add_test(tc, test_both_formats_append);
    tcase_add_test(tc, test_decoder_suites);
    tcase_add_loop_test(tc, test_bad_docs, 0, (int)(sizeof BAD_DOCS / sizeof BAD_DOCS[0]));
    tcase_add_test(tc, test_missing_file);
    tcase_add_test(tc, test_masks_checked);
    tcase_add_test(tc, test_mha_lines);
    tcase_add_loop_test(tc, test_bad_lines, 0, (int)(sizeof BAD_LINES / sizeof BAD_LINES[0]));
    tcase_add_test(tc, test_mha_limits_are_the_library_s);
    tcase_add_test(tc, test_ln_lines);
    tcase_add_test(tc, test_decoder_lines);
    tcase_add_loop_test(tc, test_bad_decoder_lines, 0,
                        (int)(sizeof BAD_DECODER_LINES / sizeof BAD_DECODER_LINES[0]));
    tcase_add_test(tc, test_decode_lines);
    tcase_add_loop_test(tc, test_bad_decode_lines, 0,
                        (int)(sizeof BAD_DECODE_LINES / sizeof BAD_DECODE_LINES[0]));
    tcase_add_test(tc, test_damaged_files);
    suite_add_tcase(s, tc);
    return s;
}
