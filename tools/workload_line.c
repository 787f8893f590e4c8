/*
 * workload_line — the one-line forms of workload cases that stof-warm takes
 * on its command line (--mha, --ln, --decoder, --decode; tools/workload.h shows them),
 * read into the same cases as a file's, with the same limits and refusals.
 */
#include "tools/workload.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct field {
    const char *names[3];   /* accepted spellings */
    long long lo, hi;
    long long value;        /* -1: not given */
} field;

/* "  x " -> "x" in place. */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = 0;
    return s;
}

static int parse_count(const char *s, long long lo, long long hi, long long *out)
{
    if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 12)
        return 0;
    *out = strtoll(s, NULL, 10);
    return *out >= lo && *out <= hi;
}

/* Sets the field `key` names from `val`; 0 with err set when it fails. */
static int set_field(field *f, int nf, const char *opt, const char *key, const char *val,
                     char *err, size_t errlen)
{
    for (int i = 0; i < nf; i++) {
        for (int j = 0; j < 3 && f[i].names[j]; j++) {
            if (strcmp(key, f[i].names[j]) != 0)
                continue;
            if (f[i].value >= 0) {
                snprintf(err, errlen, "%s: %s is given twice", opt, key);
                return 0;
            }
            if (!parse_count(val, f[i].lo, f[i].hi, &f[i].value)) {
                snprintf(err, errlen, "%s: %s=%s: expected an integer from %lld to %lld", opt,
                         key, val, f[i].lo, f[i].hi);
                return 0;
            }
            return 1;
        }
    }
    char list[256] = "";
    for (int i = 0; i < nf; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s=, ", f[i].names[0]);
    snprintf(err, errlen, "%s: unknown field \"%s\" (expected %sdtype=%s)", opt, key, list,
             strcmp(opt, "--ln") != 0 ? ", mask=" : "");
    return 0;
}

/* Splits "k=v,fp16,...,rest" into fields and a dtype; with allow_rest, the
 * first token that is neither starts the rest (a mask spec may hold commas).
 * Returns 0 with err set on a fault. */
/* softcap: where a line may name one (softcap=, a number), else NULL. */
static int parse_line(const char *opt, const char *line, field *f, int nf, stof_dtype *dtype,
                      double *softcap, int allow_rest, char **rest, char *err, size_t errlen)
{
    char *copy = strdup(line), *save = NULL;
    if (!copy) {
        snprintf(err, errlen, "out of memory");
        return 0;
    }
    int ok = 1;
    *dtype = STOF_DTYPE_INVALID;
    for (char *at = copy; ok && at;) {
        char *comma = strchr(at, ',');
        if (comma)
            *comma = 0;
        char *tok = trim(at), *eq = strchr(tok, '=');
        char *next = comma ? comma + 1 : NULL;
        if (!*tok) {
            snprintf(err, errlen, "%s: an empty field (two commas, or one at an end)", opt);
            ok = 0;
        } else if (eq) {
            *eq = 0;
            char *key = trim(tok), *val = trim(eq + 1);
            if (strcmp(key, "dtype") == 0) {
                if ((*dtype = workload_dtype(val)) == STOF_DTYPE_INVALID) {
                    snprintf(err, errlen, "%s: unknown dtype \"%s\" (expected fp16, bf16 or fp32)",
                             opt, val);
                    ok = 0;
                }
            } else if (softcap && strcmp(key, "softcap") == 0) {
                char *end = NULL;
                *softcap = strtod(val, &end);
                if (!*val || *end || !(*softcap >= 0) || isinf(*softcap)) {
                    snprintf(err, errlen, "%s: softcap=%s is not a finite number >= 0", opt, val);
                    ok = 0;
                }
            } else if (allow_rest && strcmp(key, "mask") == 0) {
                /* The rest of the line, commas and all, is the spec. */
                save = strdup(line + (val - copy));
                ok = save != NULL;
                break;
            } else {
                ok = set_field(f, nf, opt, key, val, err, errlen);
            }
        } else if (workload_dtype(tok) != STOF_DTYPE_INVALID) {
            *dtype = workload_dtype(tok);
        } else if (allow_rest) {
            save = strdup(line + (tok - copy));
            ok = save != NULL;
            break;
        } else {
            snprintf(err, errlen, "%s: unexpected \"%s\" (expected name=value or a dtype)", opt,
                     tok);
            ok = 0;
        }
        at = next;
    }
    free(copy);
    if (ok && save) {
        trim(save);  /* it starts at a trimmed token: only its end can hold blanks */
        *rest = save;
    } else {
        free(save);
    }
    if (!ok && !err[0])
        snprintf(err, errlen, "out of memory");
    return ok;
}

static int add_line_case(workload *w, workload_case *c, const char *opt, const char *line,
                         char *err, size_t errlen)
{
    char *name = NULL, *origin = NULL;
    int ok = asprintf(&name, "%s %s", opt + 2, line) >= 0;
    ok = ok && asprintf(&origin, "%s \"%s\"", opt, line) >= 0;
    c->name = name;
    c->origin = origin;
    ok = ok && workload_add_case(w, c);
    free(name);
    free(origin);
    if (!ok)
        snprintf(err, errlen, "out of memory");
    return ok ? 0 : -1;
}

/* 0, with the field named in err, when attention would refuse the case. */
static int mha_supported(const workload_case *c, const char *l, const char *line, char *err,
                         size_t errlen)
{
    char dims[64];
    if (!stof_mha_head_dim_supported(c->head_dim))
        snprintf(err, errlen, "--mha \"%s\": d=%d is not supported: attention takes head_dim %s",
                 line, c->head_dim, workload_mha_head_dims(dims, sizeof dims));
    else if (c->seq_q > STOF_MAX_SEQ)
        snprintf(err, errlen, "--mha \"%s\": %s=%d is not supported: attention takes query "
                 "lengths up to %d", line, l, c->seq_q, STOF_MAX_SEQ);
    else if (c->seq_k > STOF_MAX_SEQ)
        snprintf(err, errlen, "--mha \"%s\": %s=%d is not supported: attention takes key "
                 "lengths up to %d", line, strcmp(l, "l") ? "lk" : "l", c->seq_k, STOF_MAX_SEQ);
    else if ((long long)c->batch * c->heads > STOF_MAX_BATCH_HEADS)
        snprintf(err, errlen, "--mha \"%s\": b=%d x h=%d is not supported: attention takes b x h "
                 "up to %d", line, c->batch, c->heads, STOF_MAX_BATCH_HEADS);
    else if (c->dtype != STOF_F16 && c->dtype != STOF_BF16)
        snprintf(err, errlen, "--mha \"%s\": dtype fp32 is not supported: attention takes fp16 "
                 "or bf16", line);
    else if (c->kv_heads && c->heads % c->kv_heads)
        snprintf(err, errlen, "--mha \"%s\": kv=%d does not divide h=%d: each KV head serves "
                 "h / kv query heads", line, c->kv_heads, c->heads);
    else
        return 1;
    return 0;
}

int workload_add_mha(workload *w, const char *line, char *err, size_t errlen)
{
    field f[] = {{{"b", "batch", NULL}, 1, WORKLOAD_MAX_BATCH, -1},   {{"h", "heads", NULL}, 1, WORKLOAD_MAX_HEADS, -1},
                 {{"l", "seq", NULL}, 1, WORKLOAD_MAX_SEQ, -1},       {{"lq", "seq_q", NULL}, 1, WORKLOAD_MAX_SEQ, -1},
                 {{"lk", "seq_k", NULL}, 1, WORKLOAD_MAX_SEQ, -1},    {{"d", "head_dim", NULL}, 1, WORKLOAD_MAX_HEAD_DIM, -1},
                 {{"kv", "kv_heads", NULL}, 1, WORKLOAD_MAX_HEADS, -1},
                 {{"alibi", NULL, NULL}, 0, 1, -1},
                 {{"bias", "bias_buckets", NULL}, 0, STOF_MAX_BIAS_BUCKETS, -1}};
    workload_case c = {.op = WORKLOAD_MHA};
    char *mask = NULL;
    err[0] = 0;
    if (!parse_line("--mha", line, f, 9, &c.dtype, &c.softcap, 1, &mask, err, errlen))
        return -1;
    const char *missing = f[0].value < 0 ? "b=" : f[1].value < 0 ? "h=" : f[5].value < 0 ? "d=" : NULL;
    if (!missing && f[2].value < 0 && (f[3].value < 0 || f[4].value < 0))
        missing = "l= (or lq= and lk=)";
    if (missing || (f[2].value >= 0 && (f[3].value >= 0 || f[4].value >= 0))) {
        if (missing)
            snprintf(err, errlen, "--mha \"%s\": missing %s", line, missing);
        else
            snprintf(err, errlen, "--mha \"%s\": give l= or lq= and lk=, not both", line);
        free(mask);
        return -1;
    }
    c.batch = (int)f[0].value;
    c.heads = (int)f[1].value;
    c.seq_q = (int)(f[2].value >= 0 ? f[2].value : f[3].value);
    c.seq_k = (int)(f[2].value >= 0 ? f[2].value : f[4].value);
    c.head_dim = (int)f[5].value;
    c.kv_heads = f[6].value >= 0 ? (int)f[6].value : 0;
    c.alibi = f[7].value > 0;
    c.bias_buckets = f[8].value > 0 ? (int)f[8].value : 0;
    if (c.dtype == STOF_DTYPE_INVALID)
        c.dtype = STOF_F16;
    c.mask = mask ? mask : "dense";
    int rc = mha_supported(&c, f[2].value >= 0 ? "l" : "lq", line, err, errlen)
                 ? add_line_case(w, &c, "--mha", line, err, errlen)
                 : -1;
    free(mask);
    return rc;
}

int workload_add_ln(workload *w, const char *line, char *err, size_t errlen)
{
    field f[] = {{{"rows", "r", NULL}, 1, WORKLOAD_MAX_ROWS, -1}, {{"hidden", "n", NULL}, 1, WORKLOAD_MAX_HIDDEN, -1}};
    workload_case c = {.op = WORKLOAD_LN};
    err[0] = 0;
    if (!parse_line("--ln", line, f, 2, &c.dtype, NULL, 0, NULL, err, errlen))
        return -1;
    if (f[0].value < 0 || f[1].value < 0) {
        snprintf(err, errlen, "--ln \"%s\": missing %s=", line, f[0].value < 0 ? "rows" : "hidden");
        return -1;
    }
    c.rows = (int)f[0].value;
    c.hidden = (int)f[1].value;
    if (c.dtype == STOF_DTYPE_INVALID)
        c.dtype = STOF_F16;
    return add_line_case(w, &c, "--ln", line, err, errlen);
}

int workload_add_decoder(workload *w, const char *line, char *err, size_t errlen)
{
    field f[] = {{{"b", "batch", NULL}, 1, WORKLOAD_MAX_BATCH, -1},
                 {{"s", "l", "seq"}, 1, WORKLOAD_MAX_SEQ, -1},
                 {{"hidden", NULL, NULL}, 1, WORKLOAD_MAX_HIDDEN, -1},
                 {{"h", "heads", NULL}, 1, WORKLOAD_MAX_HEADS, -1},
                 {{"kv", "kv_heads", NULL}, 1, WORKLOAD_MAX_HEADS, -1},
                 {{"ffn", "ffn_hidden", NULL}, 1, WORKLOAD_MAX_HIDDEN, -1},
                 {{"d", "head_dim", NULL}, 1, WORKLOAD_MAX_HEAD_DIM, -1},
                 {{"qkv_bias", NULL, NULL}, 0, 1, -1}};
    workload_case c = {.op = WORKLOAD_DECODER};
    char *mask = NULL, dims[64];
    err[0] = 0;
    if (!parse_line("--decoder", line, f, 8, &c.dtype, NULL, 1, &mask, err, errlen))
        return -1;
    static const char *const need_names[] = {"b=", "s=", "hidden=", "h=", NULL, "ffn="};
    for (int i = 0; i < 6; i++) {
        if (need_names[i] && f[i].value < 0) {
            snprintf(err, errlen, "--decoder \"%s\": missing %s", line, need_names[i]);
            free(mask);
            return -1;
        }
    }
    c.batch = (int)f[0].value;
    c.seq_q = c.seq_k = (int)f[1].value;
    c.hidden = (int)f[2].value;
    c.heads = (int)f[3].value;
    c.kv_heads = f[4].value >= 0 ? (int)f[4].value : c.heads;
    c.ffn_hidden = (int)f[5].value;
    c.head_dim = f[6].value >= 0 ? (int)f[6].value : c.hidden / c.heads;
    c.qkv_bias = f[7].value > 0;
    if (c.dtype == STOF_DTYPE_INVALID)
        c.dtype = STOF_BF16;
    c.mask = mask ? mask : "causal";
    if ((long long)c.heads * c.head_dim != c.hidden)
        snprintf(err, errlen, "--decoder \"%s\": hidden=%d is not h=%d x head_dim %d", line,
                 c.hidden, c.heads, c.head_dim);
    else if (c.heads % c.kv_heads)
        snprintf(err, errlen, "--decoder \"%s\": kv=%d does not divide h=%d: each KV head "
                 "serves h / kv query heads", line, c.kv_heads, c.heads);
    else if (!stof_mha_head_dim_supported(c.head_dim))
        snprintf(err, errlen, "--decoder \"%s\": head_dim %d is not supported: attention takes "
                 "head_dim %s", line, c.head_dim, workload_mha_head_dims(dims, sizeof dims));
    else if (c.hidden % 8 || c.ffn_hidden % 8)
        snprintf(err, errlen, "--decoder \"%s\": hidden=%d and ffn=%d must be multiples of 8",
                 line, c.hidden, c.ffn_hidden);
    else if (c.seq_q > STOF_MAX_SEQ)
        snprintf(err, errlen, "--decoder \"%s\": s=%d is not supported: attention takes "
                 "lengths up to %d", line, c.seq_q, STOF_MAX_SEQ);
    else if ((long long)c.batch * c.heads > STOF_MAX_BATCH_HEADS)
        snprintf(err, errlen, "--decoder \"%s\": b=%d x h=%d is not supported: attention takes "
                 "b x h up to %d", line, c.batch, c.heads, STOF_MAX_BATCH_HEADS);
    else if ((long long)c.batch * c.seq_q > WORKLOAD_MAX_ROWS)
        snprintf(err, errlen, "--decoder \"%s\": b x s is too large", line);
    else if (c.dtype != STOF_F16 && c.dtype != STOF_BF16)
        snprintf(err, errlen, "--decoder \"%s\": dtype fp32 is not supported: the decoder "
                 "layer takes fp16 or bf16", line);
    else if (workload_decoder_window(c.mask) < 0)
        snprintf(err, errlen, "--decoder \"%s\": mask \"%s\": a decoder layer's mask is causal "
                 "or causal_window:W", line, c.mask);
    if (!err[0])
        c.rows = c.batch * c.seq_q;
    int rc = err[0] ? -1 : add_line_case(w, &c, "--decoder", line, err, errlen);
    free(mask);
    return rc;
}

int workload_add_decode(workload *w, const char *line, char *err, size_t errlen)
{
    field f[] = {{{"b", "batch", NULL}, 1, WORKLOAD_MAX_BATCH, -1},
                 {{"h", "heads", NULL}, 1, WORKLOAD_MAX_HEADS, -1},
                 {{"kv", "kv_heads", NULL}, 1, WORKLOAD_MAX_HEADS, -1},
                 {{"d", "head_dim", NULL}, 1, WORKLOAD_MAX_HEAD_DIM, -1},
                 {{"cache", "max_seq_k", NULL}, 1, WORKLOAD_MAX_SEQ, -1},
                 {{"new", "seq_q", NULL}, 1, WORKLOAD_MAX_SEQ, -1}};
    workload_case c = {.op = WORKLOAD_DECODE};
    char *mask = NULL, why[200];
    err[0] = 0;
    if (!parse_line("--decode", line, f, 6, &c.dtype, &c.softcap, 1, &mask, err, errlen))
        return -1;
    static const char *const need_names[] = {"b=", "h=", NULL, "d=", "cache="};
    for (int i = 0; i < 5; i++) {
        if (need_names[i] && f[i].value < 0) {
            snprintf(err, errlen, "--decode \"%s\": missing %s", line, need_names[i]);
            free(mask);
            return -1;
        }
    }
    c.batch = (int)f[0].value;
    c.heads = (int)f[1].value;
    c.kv_heads = f[2].value >= 0 ? (int)f[2].value : 0;
    c.head_dim = (int)f[3].value;
    c.seq_k = (int)f[4].value;
    c.seq_q = f[5].value >= 0 ? (int)f[5].value : 1;
    if (c.dtype == STOF_DTYPE_INVALID)
        c.dtype = STOF_BF16;
    c.mask = mask ? mask : "causal";
    if (workload_decode_refusal(&c, why, sizeof why))
        snprintf(err, errlen, "--decode \"%s\": %s", line, why);
    int rc = err[0] ? -1 : add_line_case(w, &c, "--decode", line, err, errlen);
    free(mask);
    return rc;
}
