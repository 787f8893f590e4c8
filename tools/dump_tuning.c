#include "tools/dump_tuning.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

typedef struct tuning_state {
    dump_cmd *d;
    json_out o;
    int json;
    long long n;
    int mask_parsed;        /* the --mask spec parsed for some row */
    char mask_err[1024];
} tuning_state;

/* lq and lk from a shape such as "b=8,h=12,lq=2048,lk=2048,d=64" (l= sets both). */
static int shape_lengths(const char *shape, int *lq, int *lk)
{
    *lq = *lk = 0;
    for (const char *p = shape; *p;) {
        size_t n = strcspn(p, ",");
        int v;
        if (sscanf(p, "lq=%d", &v) == 1)
            *lq = v;
        else if (sscanf(p, "lk=%d", &v) == 1)
            *lk = v;
        else if (sscanf(p, "l=%d", &v) == 1)
            *lq = *lk = v;
        p += n + (p[n] == ',');
    }
    return *lq > 0 && *lk > 0;
}

/* Does the row's mask hash equal that of the --mask spec at its lengths? */
static int mask_matches(tuning_state *s, const cache_tuning *t)
{
    int lq, lk;
    if (!shape_lengths(t->shape, &lq, &lk))
        return 0;
    stof_mask *m = NULL;
    if (stof_mask_parse(s->d->ctx, s->d->a->mask, lq, lk, &m) != STOF_OK) {
        snprintf(s->mask_err, sizeof s->mask_err, "%s", stof_last_error(s->d->ctx));
        return 0;
    }
    s->mask_parsed = 1;
    char hex[65] = "";
    stof_mask_hash(m, hex);
    stof_mask_free(m);
    return strcmp(hex, t->mask_hash) == 0;
}

static double num(const json_value *obj, const char *key)
{
    const json_value *v = json_get(obj, key);
    return v && v->type == JSON_NUMBER ? v->number : NAN;
}

static const char *str(const json_value *obj, const char *key)
{
    const json_value *v = json_get(obj, key);
    return v && v->type == JSON_STRING ? v->str : NULL;
}

/* The model's estimate for a candidate: "predicted_ms" (or "model_ms"). */
static double predicted(const json_value *c)
{
    double p = num(c, "predicted_ms");
    return isnan(p) ? num(c, "model_ms") : p;
}

/* Members that are results, not what tells candidates apart. */
static int is_result(const char *key)
{
    static const char *const keys[] = {"kind", "name", "ms", "predicted_ms", "model_ms", "verdict",
                                       "error", "kernel", "kernels", "params", NULL};
    for (const char *const *k = keys; *k; k++)
        if (strcmp(*k, key) == 0)
            return 1;
    return 0;
}

static size_t add_setting(char *out, size_t n, size_t at, int first, const char *k,
                          const json_value *v)
{
    if (at >= n)
        return at;
    if (v->type == JSON_NUMBER)
        return at + (size_t)snprintf(out + at, n - at, "%s%s=%g", first ? " " : ",", k, v->number);
    if (v->type == JSON_STRING)
        return at + (size_t)snprintf(out + at, n - at, "%s%s=%s", first ? " " : ",", k, v->str);
    return at;
}

/* "block bm=64,bn=64": the kind (or name), then its settings, from
 * "params" when the candidate has them, else its other scalar members. */
static void describe(const json_value *c, char *out, size_t n)
{
    const char *kind = str(c, "kind") ? str(c, "kind") : str(c, "name");
    const json_value *p = json_get(c, "params");
    size_t at = (size_t)snprintf(out, n, "%s", kind ? kind : "?");
    int first = 1;
    if (p && p->type == JSON_STRING && at < n)
        at += (size_t)snprintf(out + at, n - at, " %s", p->str);
    const json_value *from = p && p->type == JSON_OBJECT ? p : c;
    for (size_t i = 0; from && from->type == JSON_OBJECT && i < from->n; i++) {
        if (from == c && is_result(c->keys[i]))
            continue;
        size_t before = at;
        at = add_setting(out, n, at, first, from->keys[i], from->items[i]);
        first = first && at == before;
    }
}

static void model_error(const json_value *c, char *out, size_t n)
{
    double ms = num(c, "ms"), model = predicted(c);
    if (isnan(model))
        snprintf(out, n, "%s", "");
    else if (!(ms > 0))
        snprintf(out, n, "model %.3f ms", model);
    else
        snprintf(out, n, "model %.3f ms (%+.1f%%)", model, 100.0 * (model - ms) / ms);
}

static int same_candidate(const json_value *a, const json_value *b)
{
    char x[512], y[512];
    const char *ka = str(a, "kernel"), *kb = str(b, "kernel");
    if (ka && kb)
        return strcmp(ka, kb) == 0;
    describe(a, x, sizeof x);
    describe(b, y, sizeof y);
    return strcmp(x, y) == 0;
}

static int by_ms(const void *pa, const void *pb)
{
    double a = num(*(const json_value *const *)pa, "ms");
    double b = num(*(const json_value *const *)pb, "ms");
    if (isnan(a) || isnan(b))
        return isnan(a) - isnan(b);
    return (a > b) - (a < b);
}

/* Where the winner stood in the model's ranking (1 = the model's first). */
static int model_rank(const json_value *winner, const json_value *tried)
{
    double w = predicted(winner);
    int rank = 1;
    if (isnan(w))
        return 0;
    for (size_t i = 0; tried && i < tried->n; i++)
        if (!same_candidate(tried->items[i], winner) && predicted(tried->items[i]) < w)
            rank++;
    return rank;
}

/* A candidate that was timed and passed: one the winner beat. */
static int beaten(const json_value *c)
{
    const char *v = str(c, "verdict");
    return !str(c, "error") && (!v || strcmp(v, "ok") == 0) && num(c, "ms") >= 0;
}

/* A candidate that failed or whose output disagreed: its time if it has one. */
static void print_failed(const char *desc, double ms, const char *why, const char *err)
{
    int mismatch = strcmp(why, "mismatch") == 0;
    char t[32] = "";
    if (ms >= 0)
        snprintf(t, sizeof t, "%8.3f ms  ", ms);
    printf("  %-9s %-36s %s%s  %s\n", mismatch ? "mismatch" : "failed", desc, t,
           mismatch ? "output differs from the first candidate's" : why, err);
}

static void print_candidate(const json_value *c, double best)
{
    char desc[512], err[128];
    describe(c, desc, sizeof desc);
    model_error(c, err, sizeof err);
    double ms = num(c, "ms");
    const char *why = str(c, "error") ? str(c, "error") : str(c, "verdict");
    if (beaten(c))
        printf("  %-9s %-36s %8.3f ms  %5.2fx  %s\n", "beat", desc, ms, best > 0 ? ms / best : NAN,
               err);
    else if (why)
        print_failed(desc, ms, why, err);
    else
        printf("  %-9s %-36s %-22s  %s\n", "untimed", desc, "(ranked, not timed)", err);
}

/* What the winner beat, fastest first; then the candidates that failed or
 * were never timed. Returns how many were timed. */
static int print_beaten(const json_value *winner, const json_value *tried)
{
    const json_value **v = calloc(tried->n ? tried->n : 1, sizeof *v);
    size_t n = 0;
    int timed = 0;
    if (!v)
        return 0;
    for (size_t i = 0; i < tried->n; i++) {
        const json_value *c = tried->items[i];
        timed += c->type == JSON_OBJECT && num(c, "ms") >= 0;
        if (c->type == JSON_OBJECT && !same_candidate(c, winner))
            v[n++] = c;
    }
    qsort(v, n, sizeof *v, by_ms);
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n; i++)
            if (beaten(v[i]) == !pass)
                print_candidate(v[i], num(winner, "ms"));
    free(v);
    return timed;
}

static void print_record(const json_value *r)
{
    const json_value *w = json_get(r, "winner"), *tried = json_get(r, "tried");
    char desc[512], err[128];
    describe(w, desc, sizeof desc);
    model_error(w, err, sizeof err);
    const char *kernel = str(w, "kernel");
    printf("  %-9s %-36s %8.3f ms  %5s  %s%s%.12s\n", "winner", desc, num(w, "ms"), "", err,
           kernel ? "  kernel " : "", kernel ? kernel : "");
    int is_list = tried && tried->type == JSON_ARRAY;
    int timed = is_list ? print_beaten(w, tried) : 0;
    int rank = model_rank(w, is_list ? tried : NULL);
    const char *tune = str(r, "how") ? str(r, "how") : str(r, "tune");
    double secs = num(r, "seconds"), merr = num(r, "model_error");
    printf("  searched %zu candidate%s, %d timed", is_list ? tried->n : 0,
           is_list && tried->n == 1 ? "" : "s", timed);
    if (!isnan(secs))
        printf(", in %.1f s", secs);
    if (tune)
        printf(" (tune %s)", tune);
    if (!isnan(merr))
        printf("; model error on the winner %+.1f%%", 100.0 * merr);
    if (rank > 0)
        printf("; the model ranked it #%d", rank);
    printf("\n");
}

static void tuning_text(const cache_tuning *t, const char *ver)
{
    char b[32];
    printf("%s  %s  %s  %s  mask %.12s  stof %s  %s%s\n", t->op, t->shape, t->dtype, t->arch,
           t->mask_hash, ver, dump_cmd_when(t->created, b),
           strcmp(ver, stof_version()) ? "  [stale]" : "");
    json_value *r = json_parse(t->record, strlen(t->record), NULL);
    if (r && json_get(r, "winner") && json_get(r, "winner")->type == JSON_OBJECT) {
        print_record(r);
    } else if (r) {
        json_out o;
        json_out_init(&o, stdout, 1);
        json_value_out(&o, r);
        json_out_end(&o);
    } else {
        printf("  (the record is not JSON) %s\n", t->record);
    }
    json_free(r);
    printf("\n");
}

static void tuning_json(json_out *o, const cache_tuning *t, const char *ver)
{
    json_begin_object(o);
    const char *txt[][2] = {{"op", t->op},       {"mask_hash", t->mask_hash},
                            {"shape", t->shape}, {"dtype", t->dtype},
                            {"arch", t->arch},   {"stof_version", ver}};
    for (size_t i = 0; i < sizeof txt / sizeof txt[0]; i++) {
        json_key(o, txt[i][0]);
        json_string(o, txt[i][1]);
    }
    json_key(o, "created");
    json_int_out(o, t->created);
    json_value *r = json_parse(t->record, strlen(t->record), NULL);
    json_key(o, "record");
    if (r)
        json_value_out(o, r);
    else
        json_string(o, t->record);
    json_key(o, "record_is_json");
    json_bool(o, r != NULL);
    json_free(r);
    json_end_object(o);
}

/* The pre-pass: does the --mask spec parse for this row's lengths? */
static int try_mask(const cache_tuning *t, const char *ver, void *arg)
{
    (void)ver;
    mask_matches(arg, t);
    return ((tuning_state *)arg)->mask_parsed;
}

static int tuning_row(const cache_tuning *t, const char *ver, void *arg)
{
    tuning_state *s = arg;
    if (s->d->a->mask && !mask_matches(s, t))
        return 0;
    s->n++;
    if (s->json)
        tuning_json(&s->o, t, ver);
    else
        tuning_text(t, ver);
    return 0;
}

/* A spec that parses for no row may still be sound; try it on a square. */
static int mask_spec_ok(tuning_state *s)
{
    stof_mask *m = NULL;
    if (s->mask_parsed || !s->d->a->mask)
        return 1;
    if (!s->mask_err[0] && stof_mask_parse(s->d->ctx, s->d->a->mask, 4096, 4096, &m) == STOF_OK) {
        stof_mask_free(m);
        return 1;
    }
    fprintf(stderr, "stof-dump: bad --mask \"%s\": %s\n", s->d->a->mask,
            s->mask_err[0] ? s->mask_err : stof_last_error(s->d->ctx));
    return 0;
}

int dump_tuning(dump_cmd *d)
{
    tuning_state s = {.d = d, .json = d->a->json};
    /* A bad spec is refused before anything is printed. */
    if (d->a->mask && cache_admin_list_tuning(&d->err, d->c, NULL, try_mask, &s) != STOF_OK)
        return dump_cmd_fail(d, "tuning");
    if (!mask_spec_ok(&s))
        return CLI_EXIT_USAGE;
    if (s.json)
        dump_cmd_doc(&s.o, cache_file(d->c), "tuning");
    if (cache_admin_list_tuning(&d->err, d->c, d->a->op, tuning_row, &s) != STOF_OK)
        return dump_cmd_fail(d, "tuning");
    if (s.json) {
        json_end_array(&s.o);
        json_end_object(&s.o);
        json_out_end(&s.o);
    } else
        printf("%lld tuning record%s\n", s.n, s.n == 1 ? "" : "s");
    return 0;
}
