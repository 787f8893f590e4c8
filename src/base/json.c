#include "base/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 ---- */

/* Length of the well-formed UTF-8 sequence at s (at most n bytes), or 0:
 * no overlong forms, no encoded surrogates, nothing past U+10FFFF. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

/* ---- reader ---- */

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    int line, col;
    int depth;
    char path[256];
    json_error *err;
} parser;

static json_value *fail(parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static json_value *fail(parser *p, const char *fmt, ...)
{
    if (p->err && !p->err->msg[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err->msg, sizeof p->err->msg, fmt, ap);
        va_end(ap);
        p->err->line = p->line;
        p->err->col = p->col;
        snprintf(p->err->path, sizeof p->err->path, "%s", p->path);
    }
    return NULL;
}

/* What is at the current position, for messages. */
static const char *here(const parser *p, char buf[32])
{
    if (p->pos >= p->len)
        return "the end of the input";
    unsigned c = p->s[p->pos];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, 32, "'%c'", (char)c);
    else
        snprintf(buf, 32, "byte 0x%02x", c);
    return buf;
}

static void advance(parser *p, size_t n)
{
    for (size_t i = 0; i < n && p->pos < p->len; i++) {
        unsigned c = p->s[p->pos++];
        if (c == '\n') {
            p->line++;
            p->col = 1;
        } else if ((c & 0xC0) != 0x80) {
            p->col++;
        }
    }
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        unsigned c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        advance(p, 1);
    }
}

static int peek(const parser *p) { return p->pos < p->len ? p->s[p->pos] : -1; }

static json_value *new_value(parser *p, json_type t)
{
    json_value *v = calloc(1, sizeof *v);
    if (!v)
        return fail(p, "out of memory");
    v->type = t;
    v->line = p->line;
    v->col = p->col;
    return v;
}

static json_value *parse_value(parser *p);

static int hex4(const unsigned char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return 0;
        v = v * 16 + d;
    }
    *out = v;
    return 1;
}

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static int sbuf_add(sbuf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q)
            return 0;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 1;
}

static int put_utf8(sbuf *b, unsigned cp)
{
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (unsigned char)(0xC0 | cp >> 6);
        u[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | cp >> 12);
        u[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xF0 | cp >> 18);
        u[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        u[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return sbuf_add(b, u, n);
}

/* After the backslash of \uXXXX: reads the escape (and the low half of a
 * surrogate pair) and appends the character. */
static int unicode_escape(parser *p, sbuf *b)
{
    unsigned cp, lo;
    if (p->pos + 6 > p->len || !hex4(p->s + p->pos + 2, &cp))
        return fail(p, "\\u must be followed by four hex digits"), 0;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
        return fail(p, "\\u%04X is a lone low surrogate", cp), 0;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        const unsigned char *t = p->s + p->pos + 6;
        if (p->pos + 12 > p->len || t[0] != '\\' || t[1] != 'u' || !hex4(t + 2, &lo) ||
            lo < 0xDC00 || lo > 0xDFFF)
            return fail(p, "\\u%04X is a high surrogate without its low half", cp), 0;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        advance(p, 6);
    }
    advance(p, 6);
    if (!put_utf8(b, cp))
        return fail(p, "out of memory"), 0;
    return 1;
}

static int simple_escape(parser *p, sbuf *b)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    int c = p->pos + 1 < p->len ? p->s[p->pos + 1] : -1;
    const char *at = c > 0 ? strchr(from, c) : NULL;
    if (!at) {
        char buf[32];
        advance(p, 1);
        fail(p, "invalid escape: a backslash followed by %s", here(p, buf));
        return 0;
    }
    advance(p, 2);
    if (!sbuf_add(b, &to[at - from], 1))
        return fail(p, "out of memory"), 0;
    return 1;
}

/* Reads a string literal at the current '"' into *out (malloc'd). */
static int read_string(parser *p, char **out, size_t *len)
{
    sbuf b = {0};
    advance(p, 1);
    for (;;) {
        if (p->pos >= p->len) {
            fail(p, "unterminated string");
            break;
        }
        unsigned c = p->s[p->pos];
        if (c == '"') {
            advance(p, 1);
            if (!b.p && !sbuf_add(&b, "", 0)) {
                fail(p, "out of memory");
                break;
            }
            *out = b.p;
            *len = b.n;
            return 1;
        }
        if (c < 0x20) {
            fail(p, "control character 0x%02x in a string (escape it)", c);
            break;
        }
        if (c == '\\') {
            int ok = p->pos + 1 < p->len && p->s[p->pos + 1] == 'u' ? unicode_escape(p, &b)
                                                                      : simple_escape(p, &b);
            if (!ok)
                break;
            continue;
        }
        /* A run of plain ASCII goes in at once (no line or column to count
         * but its length). */
        size_t run = 0;
        for (unsigned ch; p->pos + run < p->len && (ch = p->s[p->pos + run]) >= 0x20 && ch < 0x80 &&
                          ch != '"' && ch != '\\';)
            run++;
        if (run) {
            if (!sbuf_add(&b, p->s + p->pos, run)) {
                fail(p, "out of memory");
                break;
            }
            p->pos += run;
            p->col += (int)run;
            continue;
        }
        size_t n = utf8_len(p->s + p->pos, p->len - p->pos);
        if (n == 0) {
            fail(p, "invalid UTF-8 (byte 0x%02x)", c);
            break;
        }
        if (!sbuf_add(&b, p->s + p->pos, n)) {
            fail(p, "out of memory");
            break;
        }
        advance(p, n);
    }
    free(b.p);
    return 0;
}

static size_t digits(const parser *p, size_t at)
{
    size_t n = 0;
    while (at + n < p->len && p->s[at + n] >= '0' && p->s[at + n] <= '9')
        n++;
    return n;
}

static json_value *parse_number(parser *p)
{
    size_t at = p->pos, n;
    if (at < p->len && p->s[at] == '-')
        at++;
    if ((n = digits(p, at)) == 0)
        return fail(p, "invalid number: a digit must follow '-'");
    if (p->s[at] == '0' && n > 1)
        return fail(p, "invalid number: leading zeros are not allowed");
    at += n;
    if (at < p->len && p->s[at] == '.') {
        if ((n = digits(p, at + 1)) == 0)
            return fail(p, "invalid number: a digit must follow '.'");
        at += 1 + n;
    }
    if (at < p->len && (p->s[at] == 'e' || p->s[at] == 'E')) {
        at++;
        if (at < p->len && (p->s[at] == '+' || p->s[at] == '-'))
            at++;
        if ((n = digits(p, at)) == 0)
            return fail(p, "invalid number: the exponent has no digits");
        at += n;
    }
    char buf[512];
    size_t len = at - p->pos;
    if (len >= sizeof buf)
        return fail(p, "number too long (%zu characters)", len);
    memcpy(buf, p->s + p->pos, len);
    buf[len] = 0;
    /* An integer of up to 15 digits is exact in a double: no strtod. */
    double d = 0;
    int integer = len <= 15 + (buf[0] == '-');
    for (size_t i = buf[0] == '-'; integer && i < len; i++)
        integer = buf[i] >= '0' && buf[i] <= '9';
    errno = 0;
    if (integer) {
        long long v = 0;
        for (size_t i = buf[0] == '-'; i < len; i++)
            v = v * 10 + (buf[i] - '0');
        d = buf[0] == '-' ? -(double)v : (double)v;
    } else {
        d = strtod(buf, NULL);
    }
    if (errno == ERANGE && isinf(d))
        return fail(p, "number %s is out of range", buf);
    json_value *v = new_value(p, JSON_NUMBER);
    if (v) {
        v->number = d;
        advance(p, len);
    }
    return v;
}

static json_value *parse_literal(parser *p)
{
    static const struct { const char *word; json_type t; int b; } lits[] = {
        {"true", JSON_BOOL, 1}, {"false", JSON_BOOL, 0}, {"null", JSON_NULL, 0}};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lits[i].word);
        if (p->pos + n <= p->len && memcmp(p->s + p->pos, lits[i].word, n) == 0) {
            json_value *v = new_value(p, lits[i].t);
            if (v) {
                v->boolean = lits[i].b;
                advance(p, n);
            }
            return v;
        }
    }
    char buf[32];
    return fail(p, "expected a value, found %s", here(p, buf));
}

/* Appends one more slot to a container; 0 on out of memory. */
static int grow(parser *p, json_value *v, size_t *cap)
{
    if (v->n < *cap)
        return 1;
    size_t nc = *cap ? *cap * 2 : 4;
    json_value **items = realloc(v->items, nc * sizeof *items);
    if (items)
        v->items = items;
    if (items && v->type == JSON_OBJECT) {
        char **keys = realloc(v->keys, nc * sizeof *keys);
        if (!keys)
            items = NULL;
        else
            v->keys = keys;
    }
    if (!items) {
        fail(p, "out of memory");
        return 0;
    }
    *cap = nc;
    return 1;
}

/* Reads ", item" / "]" (or "}") after an item; returns 1 for more, 0 at the
 * end, -1 on a fault. */
static int next_or_end(parser *p, char close, const char *what)
{
    skip_ws(p);
    int c = peek(p);
    if (c == ',') {
        advance(p, 1);
        skip_ws(p);
        if (peek(p) == close) {
            fail(p, "trailing comma before '%c'", close);
            return -1;
        }
        return 1;
    }
    if (c == close) {
        advance(p, 1);
        return 0;
    }
    char buf[32];
    fail(p, "expected ',' or '%c' after %s, found %s", close, what, here(p, buf));
    return -1;
}

static json_value *parse_array(parser *p)
{
    json_value *v = new_value(p, JSON_ARRAY);
    if (!v)
        return NULL;
    size_t cap = 0, base = strlen(p->path);
    advance(p, 1);
    skip_ws(p);
    if (peek(p) == ']') {
        advance(p, 1);
        return v;
    }
    for (;;) {
        if (!grow(p, v, &cap))
            break;
        json_path_index(p->path, sizeof p->path, v->n);
        json_value *item = parse_value(p);
        if (!item)
            break;
        p->path[base] = 0;
        v->items[v->n++] = item;
        int more = next_or_end(p, ']', "an array item");
        if (more == 0)
            return v;
        if (more < 0)
            break;
    }
    json_free(v);
    return NULL;
}

/* The member names of one object, for the duplicate check: an open-addressed
 * table of indices into v->keys (0 = empty), at most half full, so that an
 * object of n members is checked in O(n) rather than O(n^2). */
typedef struct keyset {
    size_t *slot;
    size_t cap; /* a power of two, or 0 */
} keyset;

static size_t key_hash(const char *k)
{
    size_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *k; k++)
        h = (h ^ (unsigned char)*k) * 1099511628211ull;
    return h;
}

/* The slot of key in ks: the one holding it, or the empty one it would take. */
static size_t *keyset_find(const keyset *ks, char *const *keys, const char *key)
{
    size_t i = key_hash(key) & (ks->cap - 1);
    while (ks->slot[i] && strcmp(keys[ks->slot[i] - 1], key) != 0)
        i = (i + 1) & (ks->cap - 1);
    return &ks->slot[i];
}

/* Room for n + 1 names; 0 on out of memory. */
static int keyset_reserve(keyset *ks, char *const *keys, size_t n)
{
    if (2 * (n + 1) <= ks->cap)
        return 1;
    keyset grown = {NULL, ks->cap ? ks->cap * 2 : 16};
    while (2 * (n + 1) > grown.cap)
        grown.cap *= 2;
    grown.slot = calloc(grown.cap, sizeof *grown.slot);
    if (!grown.slot)
        return 0;
    for (size_t i = 0; i < n; i++)
        *keyset_find(&grown, keys, keys[i]) = i + 1;
    free(ks->slot);
    *ks = grown;
    return 1;
}

/* Reads `"key" :` into v's next slot; 0 on a fault. */
static int member_key(parser *p, json_value *v, size_t *cap, keyset *ks)
{
    char buf[32];
    if (peek(p) != '"') {
        fail(p, "expected a member name in double quotes, found %s", here(p, buf));
        return 0;
    }
    if (!grow(p, v, cap))
        return 0;
    if (!keyset_reserve(ks, v->keys, v->n)) {
        fail(p, "out of memory");
        return 0;
    }
    char *key;
    size_t klen;
    int line = p->line, col = p->col;
    if (!read_string(p, &key, &klen))
        return 0;
    size_t *slot = keyset_find(ks, v->keys, key);
    if (*slot) {
        p->line = line;
        p->col = col;
        fail(p, "duplicate member name \"%.60s\"", key);
        free(key);
        return 0;
    }
    json_path_key(p->path, sizeof p->path, key);
    v->keys[v->n] = key;
    *slot = v->n + 1;
    skip_ws(p);
    if (peek(p) != ':') {
        fail(p, "expected ':' after the member name, found %s", here(p, buf));
        free(key);
        return 0;
    }
    advance(p, 1);
    return 1;
}

static json_value *parse_object(parser *p)
{
    json_value *v = new_value(p, JSON_OBJECT);
    if (!v)
        return NULL;
    size_t cap = 0, base = strlen(p->path);
    keyset ks = {NULL, 0};
    advance(p, 1);
    skip_ws(p);
    if (peek(p) == '}') {
        advance(p, 1);
        return v;
    }
    for (;;) {
        if (!member_key(p, v, &cap, &ks))
            break;
        json_value *item = parse_value(p);
        if (!item) {
            free(v->keys[v->n]);
            break;
        }
        p->path[base] = 0;
        v->items[v->n++] = item;
        int more = next_or_end(p, '}', "an object member");
        if (more == 0) {
            free(ks.slot);
            return v;
        }
        if (more < 0)
            break;
        skip_ws(p);
    }
    free(ks.slot);
    json_free(v);
    return NULL;
}

static json_value *parse_value(parser *p)
{
    skip_ws(p);
    int c = peek(p);
    if (c == '{' || c == '[') {
        if (p->depth >= JSON_MAX_DEPTH)
            return fail(p, "nesting deeper than %d", JSON_MAX_DEPTH);
        p->depth++;
        json_value *v = c == '{' ? parse_object(p) : parse_array(p);
        p->depth--;
        return v;
    }
    if (c == '"') {
        json_value *v = new_value(p, JSON_STRING);
        if (v && !read_string(p, &v->str, &v->len)) {
            free(v);
            return NULL;
        }
        return v;
    }
    if (c == '-' || (c >= '0' && c <= '9'))
        return parse_number(p);
    return parse_literal(p);
}

json_value *json_parse(const char *text, size_t len, json_error *err)
{
    parser p = {.s = (const unsigned char *)text, .len = len, .line = 1, .col = 1, .err = err};
    snprintf(p.path, sizeof p.path, "$");
    if (err)
        memset(err, 0, sizeof *err);
    if (!text)
        return fail(&p, "no input");
    /* A byte order mark may be ignored (RFC 8259, section 8.1). */
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        p.pos = 3;
    skip_ws(&p);
    if (p.pos >= p.len)
        return fail(&p, "empty input: expected a JSON value");
    json_value *v = parse_value(&p);
    if (!v)
        return NULL;
    skip_ws(&p);
    if (p.pos < p.len) {
        char buf[32];
        snprintf(p.path, sizeof p.path, "$");
        fail(&p, "unexpected %s after the JSON value", here(&p, buf));
        json_free(v);
        return NULL;
    }
    return v;
}

void json_free(json_value *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n; i++) {
        json_free(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

const json_value *json_get(const json_value *obj, const char *key)
{
    if (!obj || obj->type != JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return obj->items[i];
    return NULL;
}

int json_int(const json_value *v, long long lo, long long hi, long long *out)
{
    if (!v || v->type != JSON_NUMBER || v->number != floor(v->number) ||
        v->number < (double)lo || v->number > (double)hi)
        return 0;
    *out = (long long)v->number;
    return 1;
}

const char *json_type_name(json_type t)
{
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "a boolean";
    case JSON_NUMBER: return "a number";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "?";
}

void json_path_key(char *path, size_t n, const char *key)
{
    size_t at = strlen(path), i = 0;
    int plain = key[0] && !(key[0] >= '0' && key[0] <= '9');
    for (; key[i] && plain; i++)
        plain = (key[i] >= 'a' && key[i] <= 'z') || (key[i] >= 'A' && key[i] <= 'Z') ||
                (key[i] >= '0' && key[i] <= '9') || key[i] == '_' || key[i] == '-';
    if (at >= n)
        return;
    /* As snprintf would write ".key" or ["key"] (40 bytes of it at most),
     * cut to fit: without its cost, which every member paid. */
    const size_t klen = plain ? i : strnlen(key, 40);
    const char *parts[3] = {plain ? "." : "[\"", key, plain ? "" : "\"]"};
    const size_t lens[3] = {plain ? 1 : 2, klen, plain ? 0 : 2};
    for (int k = 0; k < 3; k++) {
        const size_t m = at + lens[k] < n - 1 ? lens[k] : n - 1 - at;
        memcpy(path + at, parts[k], m);
        at += m;
    }
    path[at] = 0;
}

void json_path_index(char *path, size_t n, size_t i)
{
    size_t at = strlen(path);
    if (at >= n)
        return;
    /* "[i]" as snprintf would write it, cut to fit. */
    char buf[24], *d = buf + sizeof buf;
    *--d = ']';
    do
        *--d = (char)('0' + i % 10);
    while (i /= 10);
    *--d = '[';
    const size_t len = (size_t)(buf + sizeof buf - d), m = at + len < n - 1 ? len : n - 1 - at;
    memcpy(path + at, d, m);
    path[at + m] = 0;
}

/* ---- writer ---- */

void json_write_string(FILE *f, const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        unsigned c = u[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f" : NULL;
        if (esc) {
            fputs(esc, f);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else {
            size_t n = utf8_len(u + i, len - i);
            if (n == 0) {
                fputs("\\ufffd", f);  /* not UTF-8: keep the output valid JSON */
                i++;
            } else {
                fwrite(u + i, 1, n, f);
                i += n;
            }
        }
    }
    fputc('"', f);
}

static void newline(json_out *o, int depth)
{
    if (!o->pretty)
        return;
    fputc('\n', o->f);
    for (int i = 0; i < depth; i++)
        fputs("  ", o->f);
}

/* Separator and indentation before a value (not after a key). */
static void before_value(json_out *o)
{
    if (o->after_key) {
        o->after_key = 0;
        return;
    }
    if (o->depth > 0) {
        if (o->count[o->depth]++)
            fputc(',', o->f);
        newline(o, o->depth);
    }
}

void json_out_init(json_out *o, FILE *f, int pretty)
{
    memset(o, 0, sizeof *o);
    o->f = f;
    o->pretty = pretty;
}

static void open_container(json_out *o, char c)
{
    before_value(o);
    fputc(c, o->f);
    if (o->depth < JSON_OUT_DEPTH - 1)
        o->depth++;
    o->count[o->depth] = 0;
}

static void close_container(json_out *o, char c)
{
    if (o->count[o->depth] > 0)
        newline(o, o->depth - 1);
    fputc(c, o->f);
    if (o->depth > 0)
        o->depth--;
}

void json_begin_object(json_out *o) { open_container(o, '{'); }
void json_end_object(json_out *o) { close_container(o, '}'); }
void json_begin_array(json_out *o) { open_container(o, '['); }
void json_end_array(json_out *o) { close_container(o, ']'); }

void json_key(json_out *o, const char *key)
{
    if (o->count[o->depth]++)
        fputc(',', o->f);
    newline(o, o->depth);
    json_write_string(o->f, key, strlen(key));
    fputs(o->pretty ? ": " : ":", o->f);
    o->after_key = 1;
}

void json_string(json_out *o, const char *s)
{
    before_value(o);
    if (s)
        json_write_string(o->f, s, strlen(s));
    else
        fputs("null", o->f);
}

void json_int_out(json_out *o, long long v)
{
    before_value(o);
    fprintf(o->f, "%lld", v);
}

void json_double(json_out *o, double v)
{
    before_value(o);
    if (!isfinite(v)) {
        fputs("null", o->f);
        return;
    }
    /* The short form when it reads back exactly, else all the digits. */
    char buf[40];
    snprintf(buf, sizeof buf, "%.15g", v);
    if (strtod(buf, NULL) != v)
        snprintf(buf, sizeof buf, "%.17g", v);
    fputs(buf, o->f);
}

void json_bool(json_out *o, int b)
{
    before_value(o);
    fputs(b ? "true" : "false", o->f);
}

void json_null(json_out *o)
{
    before_value(o);
    fputs("null", o->f);
}

void json_value_out(json_out *o, const json_value *v)
{
    if (!v) {
        json_null(o);
        return;
    }
    switch (v->type) {
    case JSON_NULL: json_null(o); break;
    case JSON_BOOL: json_bool(o, v->boolean); break;
    case JSON_NUMBER: json_double(o, v->number); break;
    case JSON_STRING:
        before_value(o);
        json_write_string(o->f, v->str, v->len);
        break;
    case JSON_ARRAY:
        json_begin_array(o);
        for (size_t i = 0; i < v->n; i++)
            json_value_out(o, v->items[i]);
        json_end_array(o);
        break;
    case JSON_OBJECT:
        json_begin_object(o);
        for (size_t i = 0; i < v->n; i++) {
            json_key(o, v->keys[i]);
            json_value_out(o, v->items[i]);
        }
        json_end_object(o);
        break;
    }
}

void json_out_end(json_out *o) { fputc('\n', o->f); }
