#include "tools/workload.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

#define MAX_FILE_BYTES (64L << 20)

const char *workload_op_name(workload_op op)
{
    switch (op) {
    case WORKLOAD_MHA: return "mha";
    case WORKLOAD_LAYER: return "layer";
    case WORKLOAD_LN: return "layernorm";
    case WORKLOAD_DECODER: return "decoder";
    case WORKLOAD_DECODE: return "decode";
    }
    return "?";
}

const char *workload_mha_head_dims(char *buf, size_t len)
{
    static const int dims[] = {STOF_MHA_HEAD_DIMS};
    size_t n = sizeof dims / sizeof dims[0], at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%d",
                               i == 0 ? "" : i + 1 == n ? " or " : ", ", dims[i]);
    return buf;
}

stof_dtype workload_dtype(const char *name)
{
    if (!name)
        return STOF_DTYPE_INVALID;
    if (strcmp(name, "fp16") == 0)
        return STOF_F16;
    if (strcmp(name, "bf16") == 0)
        return STOF_BF16;
    if (strcmp(name, "fp32") == 0)
        return STOF_F32;
    return STOF_DTYPE_INVALID;
}

/* ---- the case list ---- */

static void case_free(workload_case *c)
{
    free(c->name);
    free(c->origin);
    free(c->mask);
    free(c->model);
    free(c->activation);
    free(c->norm);
    memset(c, 0, sizeof *c);
}

void workload_free(workload *w)
{
    for (int i = 0; i < w->n; i++)
        case_free(&w->cases[i]);
    free(w->cases);
    memset(w, 0, sizeof *w);
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* Appends a deep copy of c (its strings are borrowed); 0 on out of memory. */
int workload_add_case(workload *w, const workload_case *c)
{
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 16;
        workload_case *p = realloc(w->cases, (size_t)cap * sizeof *p);
        if (!p)
            return 0;
        w->cases = p;
        w->cap = cap;
    }
    workload_case *d = &w->cases[w->n];
    *d = *c;
    d->name = dup_or_null(c->name);
    d->origin = dup_or_null(c->origin);
    d->mask = dup_or_null(c->mask);
    d->model = dup_or_null(c->model);
    d->activation = dup_or_null(c->activation);
    d->norm = dup_or_null(c->norm);
    if (!d->name || !d->origin || (c->mask && !d->mask) || (c->model && !d->model) ||
        (c->activation && !d->activation) || (c->norm && !d->norm)) {
        case_free(d);
        return 0;
    }
    w->n++;
    return 1;
}

/* Moves every case of from to the end of to; 0 on out of memory. */
static int take_all(workload *to, workload *from)
{
    if (to->n + from->n > to->cap) {
        int cap = to->n + from->n;
        workload_case *p = realloc(to->cases, (size_t)cap * sizeof *p);
        if (!p)
            return 0;
        to->cases = p;
        to->cap = cap;
    }
    if (from->n)
        memcpy(to->cases + to->n, from->cases, (size_t)from->n * sizeof *from->cases);
    to->n += from->n;
    free(from->cases);
    memset(from, 0, sizeof *from);
    return 1;
}

/* ---- reading JSON ---- */

typedef struct reader {
    const char *file;
    char *err;
    size_t errlen;
    workload got;
} reader;

static int bad(reader *r, const json_value *v, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int bad(reader *r, const json_value *v, const char *path, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, r->errlen, "%s:%d:%d: %s: %s", r->file, v ? v->line : 1, v ? v->col : 1,
             path, msg);
    return 0;
}

static void child(char *out, size_t n, const char *path, const char *key)
{
    snprintf(out, n, "%s", path);
    json_path_key(out, n, key);
}

static void item(char *out, size_t n, const char *path, size_t i)
{
    snprintf(out, n, "%s", path);
    json_path_index(out, n, i);
}

/* Refuses members other than `allowed` (NULL-terminated); "about" is
 * always allowed, as a comment. */
static int only_keys(reader *r, const json_value *obj, const char *path,
                     const char *const *allowed)
{
    for (size_t i = 0; i < obj->n; i++) {
        int ok = strcmp(obj->keys[i], "about") == 0;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(obj->keys[i], *a) == 0;
        if (ok)
            continue;
        char list[256] = "", p[300];
        for (const char *const *a = allowed; *a; a++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                     a == allowed ? "" : ", ", *a);
        child(p, sizeof p, path, obj->keys[i]);
        return bad(r, obj->items[i], p, "unknown member \"%s\" (expected %s)", obj->keys[i],
                   list);
    }
    return 1;
}

static const json_value *need(reader *r, const json_value *obj, const char *path,
                              const char *key, json_type t)
{
    const json_value *v = json_get(obj, key);
    char p[300];
    child(p, sizeof p, path, key);
    if (!v) {
        bad(r, obj, path, "missing member \"%s\"", key);
        return NULL;
    }
    if (v->type != t) {
        bad(r, v, p, "expected %s, got %s", json_type_name(t), json_type_name(v->type));
        return NULL;
    }
    return v;
}

static int int_value(reader *r, const json_value *v, const char *path, long long lo,
                     long long hi, int *out)
{
    long long x;
    if (!json_int(v, lo, hi, &x)) {
        if (v->type == JSON_NUMBER)
            return bad(r, v, path, "expected an integer from %lld to %lld, got %g", lo, hi,
                       v->number);
        return bad(r, v, path, "expected an integer from %lld to %lld, got %s", lo, hi,
                   json_type_name(v->type));
    }
    *out = (int)x;
    return 1;
}

static int get_int(reader *r, const json_value *obj, const char *path, const char *key,
                   long long lo, long long hi, int *out)
{
    const json_value *v = json_get(obj, key);
    char p[300];
    if (!v)
        return bad(r, obj, path, "missing member \"%s\"", key);
    child(p, sizeof p, path, key);
    return int_value(r, v, p, lo, hi, out);
}

static int get_dtype(reader *r, const json_value *obj, const char *path, stof_dtype *out)
{
    const json_value *v = need(r, obj, path, "dtype", JSON_STRING);
    char p[300];
    if (!v)
        return 0;
    child(p, sizeof p, path, "dtype");
    if ((*out = workload_dtype(v->str)) == STOF_DTYPE_INVALID)
        return bad(r, v, p, "unknown dtype \"%s\" (expected fp16, bf16 or fp32)", v->str);
    return 1;
}

/* "seq": an integer or a non-empty array of them. */
typedef struct int_list {
    int v[64];
    const json_value *at[64];
    int n;
} int_list;

/* The limits of stof.h, held as a file is read: the number's syntax is
 * int_value's, what attention takes is these. */
static int seq_supported(reader *r, const json_value *v, const char *path, int seq)
{
    if (seq > STOF_MAX_SEQ)
        return bad(r, v, path, "sequence length %d is not supported: masks and attention take "
                   "lengths up to %d", seq, STOF_MAX_SEQ);
    return 1;
}

/* batch x heads, head_dim and dtype of an attention suite or a layer case;
 * at: where the head size came from ("head_dim", or the model's "heads"). */
static int mha_shape_supported(reader *r, const json_value *obj, const char *path,
                               const workload_case *c, const json_value *at, const char *key)
{
    char p[300], dims[64];
    if (!stof_mha_head_dim_supported(c->head_dim)) {
        child(p, sizeof p, path, key);
        return bad(r, at, p, "head_dim %d is not supported: attention takes head_dim %s",
                   c->head_dim, workload_mha_head_dims(dims, sizeof dims));
    }
    if ((long long)c->batch * c->heads > STOF_MAX_BATCH_HEADS)
        return bad(r, obj, path, "batch %d x heads %d is not supported: attention takes "
                   "batch x heads up to %d", c->batch, c->heads, STOF_MAX_BATCH_HEADS);
    if (c->dtype != STOF_F16 && c->dtype != STOF_BF16) {
        child(p, sizeof p, path, "dtype");
        return bad(r, json_get(obj, "dtype"), p, "dtype fp32 is not supported: attention "
                   "takes fp16 or bf16");
    }
    return 1;
}

/* obj[key]: an integer from 1 to hi or a non-empty array of up to 64 of
 * them, each a `what` ("sequence length"); lengths (seq) are also held to
 * what attention takes. */
static int get_list(reader *r, const json_value *obj, const char *path, const char *key,
                    long long hi, const char *what, int lengths, int_list *out)
{
    const json_value *v = json_get(obj, key);
    char p[300], q[320];
    if (!v)
        return bad(r, obj, path, "missing member \"%s\"", key);
    child(p, sizeof p, path, key);
    out->n = 0;
    if (v->type == JSON_NUMBER) {
        out->at[0] = v;
        out->n = 1;
        return int_value(r, v, p, 1, hi, &out->v[0]) &&
               (!lengths || seq_supported(r, v, p, out->v[0]));
    }
    if (v->type != JSON_ARRAY || v->n == 0)
        return bad(r, v, p, "expected a %s or a non-empty array of them", what);
    if (v->n > 64)
        return bad(r, v, p, "more than 64 %ss", what);
    for (size_t i = 0; i < v->n; i++) {
        item(q, sizeof q, p, i);
        out->at[i] = v->items[i];
        if (!int_value(r, v->items[i], q, 1, hi, &out->v[i]) ||
            (lengths && !seq_supported(r, v->items[i], q, out->v[i])))
            return 0;
    }
    out->n = (int)v->n;
    return 1;
}

static int get_seqs(reader *r, const json_value *obj, const char *path, int_list *out)
{
    return get_list(r, obj, path, "seq", WORKLOAD_MAX_SEQ, "sequence length", 1, out);
}

/* "masks": {"name": "spec", ...} or ["spec", ...] (each spec names itself). */
typedef struct mask_list {
    const char *name[64], *spec[64];
    const json_value *at[64];
    char path[64][320];
    int n;
} mask_list;

static int get_masks(reader *r, const json_value *obj, const char *path, mask_list *out)
{
    const json_value *v = json_get(obj, "masks");
    char p[300];
    if (!v)
        return bad(r, obj, path, "missing member \"masks\"");
    child(p, sizeof p, path, "masks");
    if ((v->type != JSON_ARRAY && v->type != JSON_OBJECT) || v->n == 0)
        return bad(r, v, p, "expected a non-empty object of named mask specs or array of specs");
    if (v->n > 64)
        return bad(r, v, p, "more than 64 masks");
    for (size_t i = 0; i < v->n; i++) {
        const json_value *s = v->items[i];
        if (v->type == JSON_OBJECT)
            child(out->path[i], sizeof out->path[i], p, v->keys[i]);
        else
            item(out->path[i], sizeof out->path[i], p, i);
        if (s->type != JSON_STRING || s->len == 0 || strlen(s->str) != s->len)
            return bad(r, s, out->path[i], "expected a mask spec string such as \"window:256\"");
        out->spec[i] = s->str;
        out->name[i] = v->type == JSON_OBJECT ? v->keys[i] : s->str;
        out->at[i] = s;
    }
    out->n = (int)v->n;
    return 1;
}

static int add(reader *r, const workload_case *c)
{
    if (!workload_add_case(&r->got, c))
        return bad(r, NULL, "$", "out of memory");
    return 1;
}

static char *origin_of(reader *r, const json_value *v, const char *path)
{
    char *s = NULL;
    if (asprintf(&s, "%s:%d:%d (%s)", r->file, v->line, v->col, path) < 0)
        return NULL;
    return s;
}

/* Expands one case per (seq, mask); c carries the fields they share. seq_k:
 * 0, or the keys of every case (a KV prefix: the queries are its last seq). */
static int expand(reader *r, workload_case c, const char *prefix, const int_list *seqs,
                  int seq_k, const mask_list *masks, int name_by_mask)
{
    for (int i = 0; i < seqs->n; i++) {
        for (int j = 0; j < masks->n; j++) {
            char name[512], len[64];
            if (seq_k && seq_k != seqs->v[i])
                snprintf(len, sizeof len, "lq=%d,lk=%d", seqs->v[i], seq_k);
            else
                snprintf(len, sizeof len, "l=%d", seqs->v[i]);
            if (name_by_mask)
                snprintf(name, sizeof name, "%s/%s/%s", prefix, masks->name[j], len);
            else
                snprintf(name, sizeof name, "%s/%s/%s", prefix, len, masks->spec[j]);
            c.seq_q = seqs->v[i];
            c.seq_k = seq_k ? seq_k : seqs->v[i];
            c.rows = c.batch * seqs->v[i];
            char *origin = origin_of(r, masks->at[j], masks->path[j]);
            if (!origin)
                return bad(r, NULL, "$", "out of memory");
            c.mask = (char *)masks->spec[j];
            c.name = name;
            c.origin = origin;
            int ok = add(r, &c);
            free(origin);
            if (!ok)
                return 0;
        }
    }
    return 1;
}

/* "kv_heads" (grouped KV heads, a divisor of heads) and "softcap" (the
 * logit softcap, a number >= 0), each optional. */
static int get_gqa(reader *r, const json_value *s, const char *path, workload_case *c)
{
    const json_value *v;
    char p[300];
    if ((v = json_get(s, "kv_heads"))) {
        child(p, sizeof p, path, "kv_heads");
        if (!int_value(r, v, p, 1, WORKLOAD_MAX_HEADS, &c->kv_heads))
            return 0;
        if (c->heads % c->kv_heads)
            return bad(r, v, p, "kv_heads %d does not divide heads %d: each KV head serves "
                       "heads / kv_heads query heads", c->kv_heads, c->heads);
    }
    if ((v = json_get(s, "softcap"))) {
        child(p, sizeof p, path, "softcap");
        if (v->type != JSON_NUMBER || !(v->number >= 0) || isinf(v->number))
            return bad(r, v, p, "expected the logit softcap, a finite number >= 0 (0: off)");
        c->softcap = v->number;
    }
    return 1;
}

/* A suite's decoder-model members, each optional: get_gqa's, "alibi" (true:
 * ALiBi, the standard slopes) and "seq_k" (keys, at least every seq: a KV
 * prefix). */
static int get_decoder(reader *r, const json_value *s, const char *path, workload_case *c,
                       const int_list *seqs, int *seq_k)
{
    const json_value *v;
    char p[300];
    if (!get_gqa(r, s, path, c))
        return 0;
    if ((v = json_get(s, "alibi"))) {
        child(p, sizeof p, path, "alibi");
        if (v->type != JSON_BOOL)
            return bad(r, v, p, "expected true (ALiBi, the standard slopes) or false");
        c->alibi = v->boolean;
    }
    *seq_k = 0;
    if ((v = json_get(s, "seq_k"))) {
        child(p, sizeof p, path, "seq_k");
        if (!int_value(r, v, p, 1, WORKLOAD_MAX_SEQ, seq_k) || !seq_supported(r, v, p, *seq_k))
            return 0;
        for (int i = 0; i < seqs->n; i++)
            if (seqs->v[i] > *seq_k)
                return bad(r, v, p, "seq_k %d is shorter than seq %d: the queries are the last "
                           "seq of the seq_k keys", *seq_k, seqs->v[i]);
    }
    return 1;
}

static int read_suite(reader *r, const json_value *s, const char *path)
{
    static const char *const keys[] = {"name", "batch", "heads", "kv_heads", "head_dim",
                                       "dtype", "softcap", "alibi", "seq", "seq_k", "masks",
                                       NULL};
    if (s->type != JSON_OBJECT)
        return bad(r, s, path, "expected an attention suite object, got %s",
                   json_type_name(s->type));
    workload_case c = {.op = WORKLOAD_MHA};
    int_list seqs;
    mask_list masks;
    int seq_k;
    const json_value *name;
    if (!only_keys(r, s, path, keys) || !(name = need(r, s, path, "name", JSON_STRING)) ||
        !get_int(r, s, path, "batch", 1, WORKLOAD_MAX_BATCH, &c.batch) ||
        !get_int(r, s, path, "heads", 1, WORKLOAD_MAX_HEADS, &c.heads) ||
        !get_int(r, s, path, "head_dim", 1, WORKLOAD_MAX_HEAD_DIM, &c.head_dim) ||
        !get_dtype(r, s, path, &c.dtype) ||
        !mha_shape_supported(r, s, path, &c, json_get(s, "head_dim"), "head_dim") ||
        !get_seqs(r, s, path, &seqs) || !get_decoder(r, s, path, &c, &seqs, &seq_k) ||
        !get_masks(r, s, path, &masks))
        return 0;
    return expand(r, c, name->str, &seqs, seq_k, &masks, 1);
}

/* v, at path: an array of `what` ("suites"), each read by one. */
static int read_each(reader *r, const json_value *v, const char *path, const char *what,
                     int (*one)(reader *, const json_value *, const char *))
{
    char p[300];
    if (v->type != JSON_ARRAY)
        return bad(r, v, path, "expected an array of %s, got %s", what, json_type_name(v->type));
    for (size_t i = 0; i < v->n; i++) {
        item(p, sizeof p, path, i);
        if (!one(r, v->items[i], p))
            return 0;
    }
    return 1;
}

/* A decoder model: "kind": "decoder", hidden, heads, kv_heads (a divisor of
 * heads), ffn_hidden (the MLP's width), and optionally head_dim (hidden /
 * heads, the one the decoder layer takes) and qkv_bias (Qwen2). */
static int check_decoder_model(reader *r, const json_value *m, const char *path)
{
    static const char *const keys[] = {"kind", "hidden", "heads", "kv_heads", "head_dim",
                                       "ffn_hidden", "qkv_bias", NULL};
    int hidden, heads, kv_heads, ffn, head_dim;
    char p[300];
    if (!only_keys(r, m, path, keys) || !get_int(r, m, path, "hidden", 1, WORKLOAD_MAX_HIDDEN, &hidden) ||
        !get_int(r, m, path, "heads", 1, WORKLOAD_MAX_HEADS, &heads) ||
        !get_int(r, m, path, "kv_heads", 1, WORKLOAD_MAX_HEADS, &kv_heads) ||
        !get_int(r, m, path, "ffn_hidden", 1, WORKLOAD_MAX_HIDDEN, &ffn))
        return 0;
    if (json_get(m, "head_dim") && !get_int(r, m, path, "head_dim", 1, WORKLOAD_MAX_HEAD_DIM, &head_dim))
        return 0;
    if (json_get(m, "head_dim") && (long long)head_dim * heads != hidden) {
        child(p, sizeof p, path, "head_dim");
        return bad(r, json_get(m, "head_dim"), p, "heads %d x head_dim %d is not hidden %d: "
                   "the decoder layer takes hidden == heads x head_dim", heads, head_dim, hidden);
    }
    if (hidden % heads != 0)
        return bad(r, m, path, "hidden %d is not a multiple of heads %d", hidden, heads);
    child(p, sizeof p, path, "kv_heads");
    if (heads % kv_heads)
        return bad(r, json_get(m, "kv_heads"), p, "kv_heads %d does not divide heads %d: each "
                   "KV head serves heads / kv_heads query heads", kv_heads, heads);
    if (hidden % 8 || ffn % 8)
        return bad(r, m, path, "hidden %d and ffn_hidden %d must be multiples of 8 for the "
                   "decoder layer", hidden, ffn);
    const json_value *b = json_get(m, "qkv_bias");
    child(p, sizeof p, path, "qkv_bias");
    if (b && b->type != JSON_BOOL)
        return bad(r, b, p, "expected true or false, got %s", json_type_name(b->type));
    return 1;
}

static int check_model(reader *r, const json_value *m, const char *path)
{
    static const char *const keys[] = {"kind", "hidden", "heads", "ffn", "activation", "norm",
                                       NULL};
    static const char *const acts[] = {"gelu", "gelu_tanh", "relu", NULL};
    static const char *const norms[] = {"post_ln", "pre_ln", NULL};
    int hidden, heads;
    const json_value *ffn, *act, *norm;
    char p[300];
    if (m->type != JSON_OBJECT)
        return bad(r, m, path, "expected a model object, got %s", json_type_name(m->type));
    const json_value *kind = json_get(m, "kind");
    if (kind) {
        child(p, sizeof p, path, "kind");
        if (kind->type != JSON_STRING ||
            (strcmp(kind->str, "encoder") != 0 && strcmp(kind->str, "decoder") != 0))
            return bad(r, kind, p, "expected \"encoder\" or \"decoder\" (the default: "
                       "encoder)");
        if (strcmp(kind->str, "decoder") == 0)
            return check_decoder_model(r, m, path);
    }
    if (!only_keys(r, m, path, keys) || !get_int(r, m, path, "hidden", 1, WORKLOAD_MAX_HIDDEN, &hidden) ||
        !get_int(r, m, path, "heads", 1, WORKLOAD_MAX_HEADS, &heads) ||
        !(ffn = need(r, m, path, "ffn", JSON_NUMBER)) ||
        !(act = need(r, m, path, "activation", JSON_STRING)) ||
        !(norm = need(r, m, path, "norm", JSON_STRING)))
        return 0;
    if (hidden % heads != 0)
        return bad(r, m, path, "hidden %d is not a multiple of heads %d", hidden, heads);
    child(p, sizeof p, path, "ffn");
    if (!(ffn->number > 0 && ffn->number <= 64))
        return bad(r, ffn, p, "expected a multiple of hidden in (0, 64], got %g", ffn->number);
    int ok = 0;
    for (const char *const *a = acts; *a; a++)
        ok |= strcmp(*a, act->str) == 0;
    child(p, sizeof p, path, "activation");
    if (!ok)
        return bad(r, act, p, "unknown activation \"%s\" (expected gelu, gelu_tanh or relu)",
                   act->str);
    ok = 0;
    for (const char *const *a = norms; *a; a++)
        ok |= strcmp(*a, norm->str) == 0;
    child(p, sizeof p, path, "norm");
    if (!ok)
        return bad(r, norm, p, "unknown norm \"%s\" (expected post_ln or pre_ln)", norm->str);
    return 1;
}

static int read_models(reader *r, const json_value *models)
{
    char p[300];
    if (models->type != JSON_OBJECT || models->n == 0)
        return bad(r, models, "$.models", "expected a non-empty object of models");
    for (size_t i = 0; i < models->n; i++) {
        child(p, sizeof p, "$.models", models->keys[i]);
        if (!check_model(r, models->items[i], p))
            return 0;
    }
    return 1;
}

/* A decoder model's case: its sizes onto c, its masks causal or
 * causal_window:W, what the decoder layer takes checked where the case is. */
static int read_decoder_case(reader *r, const json_value *m, const char *model,
                             const json_value *v, const char *path, workload_case c,
                             const int_list *seqs, const mask_list *masks)
{
    long long x;
    c.op = WORKLOAD_DECODER;
    json_int(json_get(m, "hidden"), 1, WORKLOAD_MAX_HIDDEN, &x);
    c.hidden = (int)x;
    json_int(json_get(m, "heads"), 1, WORKLOAD_MAX_HEADS, &x);
    c.heads = (int)x;
    json_int(json_get(m, "kv_heads"), 1, WORKLOAD_MAX_HEADS, &x);
    c.kv_heads = (int)x;
    json_int(json_get(m, "ffn_hidden"), 1, WORKLOAD_MAX_HIDDEN, &x);
    c.ffn_hidden = (int)x;
    c.head_dim = c.hidden / c.heads;
    const json_value *b = json_get(m, "qkv_bias");
    c.qkv_bias = b && b->boolean;
    char mp[300];
    child(mp, sizeof mp, "$.models", model);
    if (!stof_mha_head_dim_supported(c.head_dim)) {
        char dims[64], hp[320];
        child(hp, sizeof hp, mp, "heads");
        return bad(r, json_get(m, "heads"), hp, "hidden %d / heads %d is head_dim %d, which is "
                   "not supported: attention takes head_dim %s", c.hidden, c.heads, c.head_dim,
                   workload_mha_head_dims(dims, sizeof dims));
    }
    if (!mha_shape_supported(r, v, path, &c, NULL, "model"))
        return 0;
    for (int i = 0; i < masks->n; i++)
        if (workload_decoder_window(masks->spec[i]) < 0)
            return bad(r, masks->at[i], masks->path[i], "mask \"%s\": a decoder layer's mask is "
                       "causal or causal_window:W", masks->spec[i]);
    c.model = (char *)model;
    for (int i = 0; i < seqs->n; i++)
        if ((long long)c.batch * seqs->v[i] > WORKLOAD_MAX_ROWS)
            return bad(r, seqs->at[i], path, "batch x seq is too large");
    return expand(r, c, model, seqs, 0, masks, 0);
}

static int read_layer_case(reader *r, const json_value *models, const json_value *v,
                           const char *path)
{
    static const char *const keys[] = {"model", "batch", "seq", "dtype", "masks", NULL};
    if (v->type != JSON_OBJECT)
        return bad(r, v, path, "expected a layer case object, got %s", json_type_name(v->type));
    workload_case c = {.op = WORKLOAD_LAYER};
    int_list seqs;
    mask_list masks;
    const json_value *model;
    char p[300];
    if (!only_keys(r, v, path, keys) || !(model = need(r, v, path, "model", JSON_STRING)))
        return 0;
    const json_value *m = json_get(models, model->str);
    child(p, sizeof p, path, "model");
    if (!m)
        return bad(r, model, p, "unknown model \"%s\" (not in $.models)", model->str);
    if (!get_int(r, v, path, "batch", 1, WORKLOAD_MAX_BATCH, &c.batch) || !get_dtype(r, v, path, &c.dtype) ||
        !get_seqs(r, v, path, &seqs) || !get_masks(r, v, path, &masks))
        return 0;
    const json_value *kind = json_get(m, "kind");
    if (kind && strcmp(kind->str, "decoder") == 0)
        return read_decoder_case(r, m, model->str, v, path, c, &seqs, &masks);
    long long x;
    json_int(json_get(m, "hidden"), 1, WORKLOAD_MAX_HIDDEN, &x);
    c.hidden = (int)x;
    json_int(json_get(m, "heads"), 1, WORKLOAD_MAX_HEADS, &x);
    c.heads = (int)x;
    c.head_dim = c.hidden / c.heads;
    /* A model's head size is the model's fault, said where the model is. */
    char mp[300];
    child(mp, sizeof mp, "$.models", model->str);
    if (!stof_mha_head_dim_supported(c.head_dim)) {
        char dims[64], hp[320];
        child(hp, sizeof hp, mp, "heads");
        return bad(r, json_get(m, "heads"), hp, "hidden %d / heads %d is head_dim %d, which is "
                   "not supported: attention takes head_dim %s", c.hidden, c.heads, c.head_dim,
                   workload_mha_head_dims(dims, sizeof dims));
    }
    if (!mha_shape_supported(r, v, path, &c, NULL, "model"))
        return 0;
    c.ffn = json_get(m, "ffn")->number;
    c.model = model->str;
    c.activation = json_get(m, "activation")->str;
    c.norm = json_get(m, "norm")->str;
    for (int i = 0; i < seqs.n; i++)
        if ((long long)c.batch * seqs.v[i] > WORKLOAD_MAX_ROWS)
            return bad(r, seqs.at[i], path, "batch x seq is too large");
    return expand(r, c, model->str, &seqs, 0, &masks, 0);
}

static int read_layers(reader *r, const json_value *models, const json_value *cases)
{
    char p[300];
    if (!read_models(r, models))
        return 0;
    if (cases->type != JSON_ARRAY)
        return bad(r, cases, "$.cases", "expected an array of layer cases, got %s",
                   json_type_name(cases->type));
    for (size_t i = 0; i < cases->n; i++) {
        item(p, sizeof p, "$.cases", i);
        if (!read_layer_case(r, models, cases->items[i], p))
            return 0;
    }
    return 1;
}

/* A decode suite: one case per batch x cache x mask, named as
 * bench/peers_llm.py names them ("llama3-8b-decode/causal/b=8,cache=16384"). */
static int read_decode_suite(reader *r, const json_value *s, const char *path)
{
    static const char *const keys[] = {"name", "batch", "cache", "new", "heads", "kv_heads",
                                       "head_dim", "dtype", "softcap", "masks", NULL};
    if (s->type != JSON_OBJECT)
        return bad(r, s, path, "expected a decode suite object, got %s",
                   json_type_name(s->type));
    workload_case c = {.op = WORKLOAD_DECODE, .seq_q = 1};
    int_list batches, caches;
    mask_list masks;
    const json_value *name;
    if (!only_keys(r, s, path, keys) || !(name = need(r, s, path, "name", JSON_STRING)) ||
        !get_list(r, s, path, "batch", WORKLOAD_MAX_BATCH, "batch size", 0, &batches) ||
        !get_list(r, s, path, "cache", WORKLOAD_MAX_SEQ, "cache length", 1, &caches) ||
        !get_int(r, s, path, "heads", 1, WORKLOAD_MAX_HEADS, &c.heads) ||
        !get_int(r, s, path, "head_dim", 1, WORKLOAD_MAX_HEAD_DIM, &c.head_dim) ||
        !get_dtype(r, s, path, &c.dtype) || !get_gqa(r, s, path, &c) ||
        (json_get(s, "new") && !get_int(r, s, path, "new", 1, 16, &c.seq_q)) ||
        !get_masks(r, s, path, &masks))
        return 0;
    for (int i = 0; i < batches.n; i++) {
        for (int k = 0; k < caches.n; k++) {
            for (int j = 0; j < masks.n; j++) {
                char cname[512], why[200];
                c.batch = batches.v[i];
                c.seq_k = caches.v[k];
                c.mask = (char *)masks.spec[j];
                if (workload_decode_refusal(&c, why, sizeof why))
                    return bad(r, masks.at[j], masks.path[j], "batch %d, cache %d: %s", c.batch,
                               c.seq_k, why);
                snprintf(cname, sizeof cname, "%s/%s/b=%d,cache=%d", name->str, masks.name[j],
                         c.batch, c.seq_k);
                c.name = cname;
                c.origin = origin_of(r, masks.at[j], masks.path[j]);
                if (!c.origin)
                    return bad(r, NULL, "$", "out of memory");
                int ok = add(r, &c);
                free(c.origin);
                if (!ok)
                    return 0;
            }
        }
    }
    return 1;
}

/* "pending": cases for the benchmarks alone; passed over, as long as it is
 * an object. */
static int read_doc(reader *r, const json_value *root)
{
    static const char *const keys[] = {"suites", "models", "cases", "decode", "pending", NULL};
    if (root->type != JSON_OBJECT)
        return bad(r, root, "$", "expected a workload object, got %s", json_type_name(root->type));
    if (!only_keys(r, root, "$", keys))
        return 0;
    const json_value *pending = json_get(root, "pending");
    if (pending && pending->type != JSON_OBJECT)
        return bad(r, pending, "$.pending", "expected an object of cases for the benchmarks "
                   "alone, got %s", json_type_name(pending->type));
    const json_value *suites = json_get(root, "suites"), *models = json_get(root, "models"),
                     *cases = json_get(root, "cases"), *decode = json_get(root, "decode");
    if (!suites && !models && !cases && !decode)
        return bad(r, root, "$",
                   "neither an attention workload (\"suites\", \"decode\") nor a layer "
                   "workload (\"models\" and \"cases\")");
    if (!models != !cases)
        return bad(r, root, "$", "a layer workload needs both \"models\" and \"cases\"");
    if (suites && !read_each(r, suites, "$.suites", "suites", read_suite))
        return 0;
    if (decode && !read_each(r, decode, "$.decode", "decode suites", read_decode_suite))
        return 0;
    return !models || read_layers(r, models, cases);
}

int workload_read_text(workload *w, const char *text, size_t len, const char *file, char *err,
                       size_t errlen)
{
    reader r = {.file = file ? file : "<text>", .err = err, .errlen = errlen};
    json_error je;
    json_value *root = json_parse(text, len, &je);
    if (!root) {
        snprintf(err, errlen, "%s:%d:%d: %s: %s", r.file, je.line, je.col, je.path, je.msg);
        return -1;
    }
    int ok = read_doc(&r, root);
    json_free(root);
    if (ok && !take_all(w, &r.got))
        ok = bad(&r, NULL, "$", "out of memory");
    workload_free(&r.got);
    return ok ? 0 : -1;
}

int workload_read_file(workload *w, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open the workload file: %s", path, strerror(errno));
        return -1;
    }
    char *buf = malloc(MAX_FILE_BYTES + 1);
    size_t n = buf ? fread(buf, 1, MAX_FILE_BYTES + 1, f) : 0;
    int rd_err = ferror(f);
    fclose(f);
    int rc = -1;
    if (!buf)
        snprintf(err, errlen, "%s: out of memory", path);
    else if (rd_err)
        snprintf(err, errlen, "%s: cannot read the workload file", path);
    else if (n > MAX_FILE_BYTES)
        snprintf(err, errlen, "%s: larger than %ld MiB: not a workload file", path,
                 MAX_FILE_BYTES >> 20);
    else
        rc = workload_read_text(w, buf, n, path, err, errlen);
    free(buf);
    return rc;
}

int workload_decoder_window(const char *spec)
{
    if (strcmp(spec, "causal") == 0)
        return 0;
    static const char pre[] = "causal_window:";
    const char *n = spec + sizeof pre - 1;
    if (strncmp(spec, pre, sizeof pre - 1) != 0 || !*n || strspn(n, "0123456789") != strlen(n) ||
        strlen(n) > 12)
        return -1;
    const long long w = strtoll(n, NULL, 10);
    return w >= 1 && w <= WORKLOAD_MAX_SEQ ? (int)w : -1;
}

/* ---- what the library must say ---- */

stof_status workload_check(stof_ctx *ctx, const workload *w, char *err, size_t errlen)
{
    for (int i = 0; i < w->n; i++) {
        const workload_case *c = &w->cases[i];
        if (!c->mask)
            continue;
        stof_mask *m = NULL;
        stof_status st = stof_mask_parse(ctx, c->mask, c->seq_q, c->seq_k, &m);
        stof_mask_free(m);
        if (st != STOF_OK) {
            snprintf(err, errlen, "%s (%s): mask \"%s\" for lq=%d lk=%d: %s", c->name, c->origin,
                     c->mask, c->seq_q, c->seq_k, stof_last_error(ctx));
            return st;
        }
    }
    return STOF_OK;
}

void workload_mha_desc(const workload_case *c, stof_tune tune, stof_mha_desc *d)
{
    memset(d, 0, sizeof *d);
    d->batch = c->batch;
    d->heads = c->heads;
    d->seq_q = c->seq_q;
    d->seq_k = c->seq_k;
    d->head_dim = c->head_dim;
    d->dtype = c->dtype;
    d->layout = STOF_LAYOUT_BHLD;
    d->tune = tune;
    d->kv_heads = c->kv_heads;
    d->softcap = (float)c->softcap;
    /* A plan is made for the modifiers' shape: no slopes (the standard
     * ones) and no table, which only a run reads. */
    d->alibi = c->alibi;
    d->bias_buckets = c->bias_buckets;
}

void workload_ln_desc(const workload_case *c, stof_ln_desc *d)
{
    memset(d, 0, sizeof *d);
    d->rows = c->rows;
    d->hidden = c->hidden;
    d->dtype = c->dtype;
}

void workload_decoder_desc(const workload_case *c, stof_tune tune, stof_decoder_desc *d)
{
    memset(d, 0, sizeof *d);
    d->batch = c->batch;
    d->seq = c->seq_q;
    d->hidden = c->hidden;
    d->heads = c->heads;
    d->kv_heads = c->kv_heads;
    d->head_dim = c->head_dim;
    d->ffn_hidden = c->ffn_hidden;
    d->dtype = c->dtype;
    d->rope_theta = 10000.f;
    const int window = c->mask ? workload_decoder_window(c->mask) : 0;
    d->window = window > 0 ? window : 0;
    d->qkv_bias = c->qkv_bias;
    d->tune = tune;
}

void workload_decode_desc(const workload_case *c, stof_decode_desc *d)
{
    memset(d, 0, sizeof *d);
    d->batch = c->batch;
    d->heads = c->heads;
    d->kv_heads = c->kv_heads;
    d->head_dim = c->head_dim;
    d->seq_q = c->seq_q;
    d->max_seq_k = c->seq_k;
    d->dtype = c->dtype;
    d->layout = STOF_LAYOUT_BHLD;
    d->softcap = (float)c->softcap;
    const int window = c->mask ? workload_decoder_window(c->mask) : 0;
    d->window = window > 0 ? window : 0;
}

const char *workload_decode_refusal(const workload_case *c, char *buf, size_t n)
{
    char dims[64];
    const int kv = c->kv_heads ? c->kv_heads : c->heads;
    if (c->seq_q < 1 || c->seq_q > 16)
        snprintf(buf, n, "new=%d must be 1 .. 16 (the rows a step brings)", c->seq_q);
    else if (c->seq_k < c->seq_q || c->seq_k > STOF_MAX_SEQ)
        snprintf(buf, n, "cache=%d must be new (%d) .. %d: the cache holds the new rows",
                 c->seq_k, c->seq_q, STOF_MAX_SEQ);
    else if (c->batch < 1 || c->batch > 65535)
        snprintf(buf, n, "batch %d must be 1 .. 65535", c->batch);
    else if (c->heads < 1 || c->heads % kv)
        snprintf(buf, n, "kv_heads %d does not divide heads %d: each KV head serves heads / "
                 "kv_heads query heads", kv, c->heads);
    else if (!stof_mha_head_dim_supported(c->head_dim))
        snprintf(buf, n, "head_dim %d is not supported: decoding takes head_dim %s",
                 c->head_dim, workload_mha_head_dims(dims, sizeof dims));
    else if (c->dtype != STOF_F16 && c->dtype != STOF_BF16)
        snprintf(buf, n, "dtype fp32 is not supported: decoding takes fp16 or bf16");
    else if (!c->mask || workload_decoder_window(c->mask) < 0)
        snprintf(buf, n, "mask \"%s\": a decoding step's mask is causal or causal_window:W",
                 c->mask ? c->mask : "");
    else
        return NULL;
    return buf;
}

void workload_layer_desc(const workload_case *c, stof_tune tune, stof_layer_desc *d)
{
    memset(d, 0, sizeof *d);
    d->batch = c->batch;
    d->seq = c->seq_q;
    d->hidden = c->hidden;
    d->heads = c->heads;
    d->ffn_hidden = (int)lround(c->ffn * c->hidden);
    d->activation = !strcmp(c->activation, "relu")        ? STOF_ACT_RELU
                    : !strcmp(c->activation, "gelu_tanh") ? STOF_ACT_GELU_TANH
                                                          : STOF_ACT_GELU;
    d->norm = !strcmp(c->norm, "pre_ln") ? STOF_PRE_LN : STOF_POST_LN;
    d->dtype = c->dtype;
    d->tune = tune;
}
