#include "attn/mask_spec.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/util.h"

struct mask_spec_rand {
    int64_t qb;           /* query block whose choice is held, -1 none */
    int n;
    int32_t *chosen;
    unsigned char *seen;
};

#define MASK_GOLDEN 0x9E3779B97F4A7C15ull

/* ---- the random term's generator (documented in mask_spec.h) -------------------- */

static uint64_t rand_next(uint64_t *state)
{
    uint64_t z = (*state += MASK_GOLDEN);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, m) without modulo bias: the same draws on every platform. */
static uint64_t rand_below(uint64_t *state, uint64_t m)
{
    uint64_t limit = UINT64_MAX - (UINT64_MAX % m + 1) % m;
    uint64_t z;
    do
        z = rand_next(state);
    while (z > limit);
    return z % m;
}

void mask_random_blocks(uint64_t seed, int64_t qblock, int nkb, int r, int32_t *chosen,
                        unsigned char *seen)
{
    uint64_t state = seed ^ ((uint64_t)(qblock + 1) * MASK_GOLDEN);
    int n = 0;
    for (int64_t j = (int64_t)nkb - r; j < nkb; j++) {
        int64_t t = (int64_t)rand_below(&state, (uint64_t)j + 1);
        if (seen[t])
            t = j;
        seen[t] = 1;
        chosen[n++] = (int32_t)t;
    }
    for (int i = 0; i < n; i++)
        seen[chosen[i]] = 0;
    qsort(chosen, (size_t)n, sizeof *chosen, util_cmp_i32);
}

/* ---- range lists ------------------------------------------------------------ */

/* Appends [lo, hi) clipped to [0, lk), merging with the last range if they
 * touch. Inputs come in increasing lo. */
static int push_range(mask_range *out, int n, int64_t lo, int64_t hi, int lk)
{
    lo = util_max64(lo, 0);
    hi = util_min64(hi, lk);
    if (lo >= hi)
        return n;
    if (n > 0 && out[n - 1].hi >= lo) {
        if (hi > out[n - 1].hi)
            out[n - 1].hi = (int32_t)hi;
        return n;
    }
    out[n].lo = (int32_t)lo;
    out[n].hi = (int32_t)hi;
    return n + 1;
}

static int range_union(const mask_range *a, int na, const mask_range *b, int nb,
                       mask_range *out, int lk)
{
    int i = 0, j = 0, n = 0;
    while (i < na || j < nb) {
        const mask_range *r = (j >= nb || (i < na && a[i].lo <= b[j].lo)) ? &a[i++] : &b[j++];
        n = push_range(out, n, r->lo, r->hi, lk);
    }
    return n;
}

static int range_intersect(const mask_range *a, int na, const mask_range *b, int nb,
                           mask_range *out)
{
    int i = 0, j = 0, n = 0;
    while (i < na && j < nb) {
        int32_t lo = a[i].lo > b[j].lo ? a[i].lo : b[j].lo;
        int32_t hi = a[i].hi < b[j].hi ? a[i].hi : b[j].hi;
        if (lo < hi)
            out[n++] = (mask_range){lo, hi};
        if (a[i].hi < b[j].hi)
            i++;
        else
            j++;
    }
    return n;
}

/* ---- evaluating one term on one row ------------------------------------------ */

static int term_dilated(const mask_spec_term *t, int64_t q, int lk, mask_range *out)
{
    int64_t d = t->b, reach = (t->a / 2) * d;
    int64_t lo = q - reach, hi = util_min64(q + reach, (int64_t)lk - 1);
    if (lo < 0)
        lo = q % d;
    if (d == 1)
        return push_range(out, 0, lo, hi + 1, lk);
    int n = 0;
    for (int64_t k = lo; k <= hi; k += d)
        out[n++] = (mask_range){(int32_t)k, (int32_t)k + 1};
    return n;
}

static int term_strided(const mask_spec_term *t, int lk, mask_range *out)
{
    if (t->a == 1)
        return push_range(out, 0, 0, lk, lk);
    int n = 0;
    for (int64_t k = t->a - 1; k < lk; k += t->a)
        out[n++] = (mask_range){(int32_t)k, (int32_t)k + 1};
    return n;
}

static int term_random(const mask_spec_term *t, struct mask_spec_rand *rs, int64_t q, int lk,
                       mask_range *out)
{
    int64_t bsz = t->b, qb = q / bsz;
    if (rs->qb != qb) {
        int nkb = (int)(((int64_t)lk + bsz - 1) / bsz);
        mask_random_blocks(t->seed, qb, nkb, (int)t->a, rs->chosen, rs->seen);
        rs->qb = qb;
        rs->n = (int)t->a;
    }
    int n = 0;
    for (int i = 0; i < rs->n; i++)
        n = push_range(out, n, rs->chosen[i] * bsz, (rs->chosen[i] + 1) * bsz, lk);
    return n;
}

static int term_docs(const mask_spec_term *t, int64_t q, int lk, mask_range *out)
{
    int lo = 0, hi = t->n_docs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (t->doc_start[mid] <= q)
            lo = mid;
        else
            hi = mid - 1;
    }
    return push_range(out, 0, t->doc_start[lo], t->doc_start[lo + 1], lk);
}

static int term_row(const mask_spec *s, mask_spec_rows *r, const mask_spec_term *t, int64_t q,
                    mask_range *out)
{
    int lk = s->lk;
    switch (t->kind) {
    case MASK_SPEC_DENSE:
        return push_range(out, 0, 0, lk, lk);
    /* The query's position among the keys: the queries are the last lq of
     * lk (a KV prefix before them), so these align bottom-right. */
    case MASK_SPEC_CAUSAL:
        return push_range(out, 0, 0, q + ((int64_t)lk - s->lq) + 1, lk);
    case MASK_SPEC_WINDOW:
        q += (int64_t)lk - s->lq;
        return push_range(out, 0, q - t->a / 2, q + t->a / 2 + 1, lk);
    case MASK_SPEC_CAUSAL_WINDOW:
        q += (int64_t)lk - s->lq;
        return push_range(out, 0, q - t->a + 1, q + 1, lk);
    case MASK_SPEC_DILATED:
        return term_dilated(t, q, lk, out);
    case MASK_SPEC_GLOBAL:
        return push_range(out, 0, 0, q < t->a ? lk : t->a, lk);
    case MASK_SPEC_STRIDED:
        return term_strided(t, lk, out);
    case MASK_SPEC_RANDOM:
        return term_random(t, &r->rand[t->rand_slot], q, lk, out);
    case MASK_SPEC_DOCS:
        return term_docs(t, q, lk, out);
    }
    return 0;
}

/* ---- a spec's rows ------------------------------------------------------------ */

stof_status mask_spec_rows_init(mask_spec_rows *r, const mask_spec *s)
{
    memset(r, 0, sizeof *r);
    /* Merged ranges in [0, lk) never number more than ceil(lk / 2). */
    r->cap = s->lk / 2 + 2;
    for (int i = 0; i < 4; i++)
        if (!(r->buf[i] = malloc((size_t)r->cap * sizeof(mask_range))))
            goto fail;
    if (s->n_random && !(r->rand = calloc((size_t)s->n_random, sizeof *r->rand)))
        goto fail;
    r->n_rand = s->n_random;
    for (int i = 0; i < s->n_terms; i++) {
        const mask_spec_term *t = &s->terms[i];
        if (t->kind != MASK_SPEC_RANDOM)
            continue;
        struct mask_spec_rand *rs = &r->rand[t->rand_slot];
        size_t nkb = (size_t)(((int64_t)s->lk + t->b - 1) / t->b);
        rs->qb = -1;
        rs->chosen = malloc((size_t)t->a * sizeof *rs->chosen);
        rs->seen = calloc(nkb, 1);
        if (!rs->chosen || !rs->seen)
            goto fail;
    }
    return STOF_OK;
fail:
    mask_spec_rows_free(r);
    return STOF_ERR_NO_MEMORY;
}

void mask_spec_rows_free(mask_spec_rows *r)
{
    for (int i = 0; i < 4; i++)
        free(r->buf[i]);
    if (r->rand)
        for (int i = 0; i < r->n_rand; i++) {
            free(r->rand[i].chosen);
            free(r->rand[i].seen);
        }
    free(r->rand);
    memset(r, 0, sizeof *r);
}

static void swap_buf(mask_range **a, mask_range **b)
{
    mask_range *t = *a;
    *a = *b;
    *b = t;
}

/* Sum of products: each '&' chain is intersected term by term, then the
 * chains are united. Buffers are swapped, not copied. */
int mask_spec_row(mask_spec_rows *r, const mask_spec *s, int64_t q, const mask_range **out)
{
    mask_range **acc = &r->buf[0], **prod = &r->buf[1], **term = &r->buf[2],
               **tmp = &r->buf[3];
    int nacc = 0;
    for (int i = 0; i < s->n_terms;) {
        int nprod = term_row(s, r, &s->terms[i], q, *prod);
        for (i++; i < s->n_terms && s->terms[i].and_prev; i++) {
            if (nprod == 0)
                continue;
            int nt = term_row(s, r, &s->terms[i], q, *term);
            nprod = range_intersect(*prod, nprod, *term, nt, *tmp);
            swap_buf(prod, tmp);
        }
        nacc = range_union(*acc, nacc, *prod, nprod, *tmp, s->lk);
        swap_buf(acc, tmp);
    }
    *out = *acc;
    return nacc;
}

/* ---- parsing ------------------------------------------------------------------ */

typedef struct mask_parser {
    stof_ctx *ctx;
    const char *s;
    size_t pos;
    int lq, lk;
    mask_spec_term *terms;
    long long n_terms, cap_terms;
    char *norm;
    long long norm_len, norm_cap;
    int n_random;
    size_t term_at;       /* where the term being parsed starts */
} mask_parser;

/* Writes s[0..len) as a C string literal, escaping what is not printable and
 * cutting long text, so a hostile spec cannot flood the error buffer. */
static void quote(char *dst, size_t cap, const char *s, size_t len, size_t max)
{
    size_t o = 0;
    dst[o++] = '"';
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == max) {
            o += (size_t)snprintf(dst + o, cap - o, "...");
            break;
        }
        if (c == '"' || c == '\\')
            o += (size_t)snprintf(dst + o, cap - o, "\\%c", c);
        else if (c < 32 || c > 126)
            o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
        else
            dst[o++] = (char)c;
    }
    dst[o++] = '"';
    dst[o] = 0;
}

/* "mask spec "S": <what> "<part>" at column N" */
static stof_status parse_fail(mask_parser *p, size_t at, size_t len, const char *fmt, ...)
{
    char what[256], qspec[600], qpart[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    quote(qspec, sizeof qspec, p->s, strlen(p->s), 120);
    quote(qpart, sizeof qpart, p->s + at, len, 48);
    return CTX_FAIL(p->ctx, STOF_ERR_INVALID_ARG, "mask spec %s: %s %s at column %zu", qspec,
                    what, qpart, at + 1);
}

static int is_ws(char c) { return c == ' ' || c == '\t'; }
static int is_op_or_end(char c) { return c == '+' || c == '&' || c == 0; }

static void skip_ws(mask_parser *p)
{
    while (is_ws(p->s[p->pos]))
        p->pos++;
}

/* Length of the token at pos: up to a delimiter of the grammar. */
static size_t token_len(const mask_parser *p, size_t at, const char *delims)
{
    size_t n = 0;
    while (p->s[at + n] && !strchr(delims, p->s[at + n]))
        n++;
    return n;
}

static int append_norm(mask_parser *p, const char *fmt, ...)
{
    char buf[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (util_grow((void **)&p->norm, &p->norm_cap, p->norm_len + n + 1, 1))
        return -1;
    memcpy(p->norm + p->norm_len, buf, (size_t)n + 1);
    p->norm_len += n;
    return 0;
}

static stof_status no_memory(mask_parser *p)
{
    return CTX_FAIL(p->ctx, STOF_ERR_NO_MEMORY, "out of memory parsing a mask spec");
}

/* A missing argument quotes the term as far as it goes. */
static stof_status missing_arg(mask_parser *p, const char *what)
{
    return parse_fail(p, p->term_at, p->pos - p->term_at, "missing %s in", what);
}

/* An unsigned decimal number ending at a delimiter, at most max. `what`
 * names it for the message when it is missing. */
static stof_status parse_number(mask_parser *p, uint64_t max, const char *what, uint64_t *val,
                                size_t *at)
{
    *at = p->pos;
    size_t n = token_len(p, p->pos, ":,+& \t");
    if (n == 0)
        return missing_arg(p, what);
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p->s[p->pos + i];
        if (c < '0' || c > '9')
            return parse_fail(p, p->pos, n, "bad number");
    }
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(p->s[p->pos + i] - '0');
        if (v > (max - d) / 10)
            return parse_fail(p, p->pos, n, "number too large (over %llu)",
                              (unsigned long long)max);
        v = v * 10 + d;
    }
    p->pos += n;
    *val = v;
    return STOF_OK;
}

/* ':' then a number. */
static stof_status parse_arg(mask_parser *p, const char *what, uint64_t max, uint64_t *val,
                             size_t *at)
{
    if (p->s[p->pos] != ':')
        return missing_arg(p, what);
    p->pos++;
    return parse_number(p, max, what, val, at);
}

static stof_status parse_docs(mask_parser *p, mask_spec_term *t)
{
    size_t at = p->pos + 1, first = at;
    uint64_t v;
    int64_t sum = 0;
    long long cap = 0, n = 0;
    stof_status st = parse_arg(p, "document length", INT_MAX, &v, &at);
    while (st == STOF_OK) {
        if (v == 0) {
            st = parse_fail(p, at, p->pos - at, "document length must be > 0, got");
            break;
        }
        sum += (int64_t)v;
        if (sum > p->lq) {
            st = parse_fail(p, first, p->pos - first,
                            "document lengths must sum to Lq = %d, these pass it:", p->lq);
            break;
        }
        if (util_grow((void **)&t->doc_start, &cap, n + 2, sizeof(int32_t))) {
            st = no_memory(p);
            break;
        }
        t->doc_start[n] = (int32_t)(sum - (int64_t)v);
        t->doc_start[++n] = (int32_t)sum;
        if (append_norm(p, "%c%llu", n == 1 ? ':' : ',', (unsigned long long)v)) {
            st = no_memory(p);
            break;
        }
        if (p->s[p->pos] != ',')
            break;
        p->pos++;
        st = parse_number(p, INT_MAX, "document length", &v, &at);
    }
    t->n_docs = (int)n;
    if (st == STOF_OK && sum != p->lq)
        st = parse_fail(p, first, p->pos - first,
                        "document lengths must sum to Lq = %d, got %lld from", p->lq,
                        (long long)sum);
    return st;
}

typedef struct mask_term_kind {
    const char *name;
    enum mask_spec_kind kind;
    int n_args;
    const char *args[3];
} mask_term_kind;

static const mask_term_kind term_kinds[] = {
    {"dense", MASK_SPEC_DENSE, 0, {0}},
    {"causal", MASK_SPEC_CAUSAL, 0, {0}},
    {"window", MASK_SPEC_WINDOW, 1, {"width W"}},
    {"causal_window", MASK_SPEC_CAUSAL_WINDOW, 1, {"width W"}},
    {"dilated", MASK_SPEC_DILATED, 2, {"width W", "dilation D"}},
    {"global", MASK_SPEC_GLOBAL, 1, {"count G"}},
    {"strided", MASK_SPEC_STRIDED, 1, {"stride S"}},
    {"random", MASK_SPEC_RANDOM, 3, {"block count R", "block size B", "seed"}},
    {"docs", MASK_SPEC_DOCS, -1, {0}},
};

/* Range checks that need every argument of a term. */
static stof_status check_term(mask_parser *p, const mask_spec_term *t, const uint64_t *v,
                              const size_t *at)
{
    size_t n0 = token_len(p, at[0], ":,+& \t"), n1 = at[1] ? token_len(p, at[1], ":+& \t") : 0;
    switch (t->kind) {
    case MASK_SPEC_WINDOW:
    case MASK_SPEC_DILATED:
        if (v[0] == 0 || v[0] % 2)
            return parse_fail(p, at[0], n0, "window width must be even and > 0, got");
        if (t->kind == MASK_SPEC_DILATED && v[1] == 0)
            return parse_fail(p, at[1], n1, "dilation must be > 0, got");
        return STOF_OK;
    case MASK_SPEC_CAUSAL_WINDOW:
        return v[0] ? STOF_OK : parse_fail(p, at[0], n0, "window width must be > 0, got");
    case MASK_SPEC_GLOBAL: {
        int lmax = p->lq > p->lk ? p->lq : p->lk;
        if (v[0] == 0 || v[0] > (uint64_t)lmax)
            return parse_fail(p, at[0], n0, "global count must be in 1..max(Lq, Lk) = %d, got",
                              lmax);
        return STOF_OK;
    }
    case MASK_SPEC_STRIDED:
        return v[0] ? STOF_OK : parse_fail(p, at[0], n0, "stride must be > 0, got");
    case MASK_SPEC_RANDOM: {
        if (v[1] == 0)
            return parse_fail(p, at[1], n1, "block size must be > 0, got");
        uint64_t nkb = ((uint64_t)p->lk + v[1] - 1) / v[1];
        if (v[0] == 0 || v[0] > nkb)
            return parse_fail(p, at[0], n0,
                              "random block count must be in 1..ceil(Lk / B) = %llu, got",
                              (unsigned long long)nkb);
        return STOF_OK;
    }
    default:
        return STOF_OK;
    }
}

static stof_status parse_args(mask_parser *p, const mask_term_kind *k, mask_spec_term *t)
{
    uint64_t v[3] = {0};
    size_t at[3] = {0};
    for (int i = 0; i < k->n_args; i++) {
        uint64_t max = (k->kind == MASK_SPEC_RANDOM && i == 2) ? UINT64_MAX : INT_MAX;
        TRY(parse_arg(p, k->args[i], max, &v[i], &at[i]));
        if (append_norm(p, ":%llu", (unsigned long long)v[i]))
            return no_memory(p);
    }
    TRY(check_term(p, t, v, at));
    t->a = (int64_t)v[0];
    t->b = (int64_t)v[1];
    t->seed = v[2];
    return STOF_OK;
}

static stof_status parse_term(mask_parser *p, int and_prev)
{
    skip_ws(p);
    size_t at = p->term_at = p->pos;
    if (is_op_or_end(p->s[at]))
        return parse_fail(p, at, p->s[at] ? 1 : 0, "expected a term, got");
    size_t n = token_len(p, at, ":+& \t");
    if (n == 0)
        return parse_fail(p, at, token_len(p, at, "+&"), "expected a term name, got");
    const mask_term_kind *k = NULL;
    for (size_t i = 0; i < sizeof term_kinds / sizeof term_kinds[0]; i++)
        if (strlen(term_kinds[i].name) == n && !memcmp(term_kinds[i].name, p->s + at, n))
            k = &term_kinds[i];
    if (!k)
        return parse_fail(p, at, n, "unknown term");
    if (util_grow((void **)&p->terms, &p->cap_terms, p->n_terms + 1, sizeof *p->terms))
        return no_memory(p);
    mask_spec_term *t = &p->terms[p->n_terms++];
    memset(t, 0, sizeof *t);
    t->kind = k->kind;
    t->and_prev = and_prev;
    p->pos += n;
    if (append_norm(p, "%s%s", p->n_terms == 1 ? "" : and_prev ? "&" : "+", k->name))
        return no_memory(p);
    if (k->kind == MASK_SPEC_DOCS) {
        if (p->lq != p->lk)
            return parse_fail(p, at, n, "docs needs Lq = Lk (here %d and %d):", p->lq, p->lk);
        TRY(parse_docs(p, t));
    } else {
        TRY(parse_args(p, k, t));
    }
    if (k->kind == MASK_SPEC_RANDOM)
        t->rand_slot = p->n_random++;
    skip_ws(p);
    if (!is_op_or_end(p->s[p->pos]))
        return parse_fail(p, p->pos, token_len(p, p->pos, "+&"),
                          "unexpected text after a term:");
    return STOF_OK;
}

static void free_terms(mask_spec_term *terms, long long n)
{
    for (long long i = 0; i < n; i++)
        free(terms[i].doc_start);
    free(terms);
}

stof_status mask_spec_parse(stof_ctx *ctx, const char *text, int lq, int lk, mask_spec *out,
                            char **norm)
{
    memset(out, 0, sizeof *out);
    *norm = NULL;
    mask_parser p = {.ctx = ctx, .s = text, .lq = lq, .lk = lk};
    stof_status st = parse_term(&p, 0);
    while (st == STOF_OK && p.s[p.pos]) {
        int and_op = p.s[p.pos] == '&';
        p.pos++;
        st = parse_term(&p, and_op);
    }
    if (st != STOF_OK) {
        free_terms(p.terms, p.n_terms);
        free(p.norm);
        return st;
    }
    out->lq = lq;
    out->lk = lk;
    out->terms = p.terms;
    out->n_terms = (int)p.n_terms;
    out->n_random = p.n_random;
    *norm = p.norm;
    return STOF_OK;
}

void mask_spec_free(mask_spec *s)
{
    free_terms(s->terms, s->n_terms);
    memset(s, 0, sizeof *s);
}
