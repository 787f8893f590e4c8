/*
 * test_json — the strict JSON reader and the writer: values and escapes
 * read exactly, every kind of malformed input refused with the right line,
 * column and JSON path, and random documents surviving a write/read round
 * trip (pretty and compact) unchanged.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "testutil.h"

static json_value *parse(const char *s, json_error *e)
{
    return json_parse(s, strlen(s), e);
}

START_TEST(test_values)
{
    json_error e;
    json_value *v = parse(" {\"a\": [1, -2.5e3, 0, true, false, null, \"x\"],\n"
                          "  \"b\": {}, \"c\": [], \"d\": \"\", \"e\": 1E2, \"f\": -0.125} ",
                          &e);
    ck_assert_msg(v, "%d:%d %s %s", e.line, e.col, e.path, e.msg);
    ck_assert_int_eq(v->type, JSON_OBJECT);
    ck_assert_uint_eq(v->n, 6);
    const json_value *a = json_get(v, "a");
    ck_assert_int_eq(a->type, JSON_ARRAY);
    ck_assert_uint_eq(a->n, 7);
    ck_assert(a->items[0]->number == 1.0);
    ck_assert(a->items[1]->number == -2500.0);
    ck_assert_int_eq(a->items[3]->type, JSON_BOOL);
    ck_assert_int_eq(a->items[3]->boolean, 1);
    ck_assert_int_eq(a->items[4]->boolean, 0);
    ck_assert_int_eq(a->items[5]->type, JSON_NULL);
    ck_assert_str_eq(a->items[6]->str, "x");
    ck_assert_int_eq(json_get(v, "b")->type, JSON_OBJECT);
    ck_assert_uint_eq(json_get(v, "b")->n, 0);
    ck_assert_uint_eq(json_get(v, "c")->n, 0);
    ck_assert_str_eq(json_get(v, "d")->str, "");
    ck_assert(json_get(v, "e")->number == 100.0);
    ck_assert(json_get(v, "f")->number == -0.125);
    ck_assert_ptr_null(json_get(v, "zz"));
    ck_assert_ptr_null(json_get(a, "a"));
    /* Positions: "a" is on line 1, "b"'s value on line 2. */
    ck_assert_int_eq(a->line, 1);
    ck_assert_int_eq(a->col, 8);
    ck_assert_int_eq(json_get(v, "b")->line, 2);
    ck_assert_int_eq(json_get(v, "b")->col, 8);
    long long x;
    ck_assert(json_int(a->items[0], 0, 10, &x) && x == 1);
    ck_assert(!json_int(a->items[0], 2, 10, &x));
    ck_assert(!json_int(json_get(v, "f"), -10, 10, &x));
    ck_assert(!json_int(a->items[6], -10, 10, &x));
    json_free(v);
}
END_TEST

START_TEST(test_strings)
{
    json_error e;
    const char *doc = "[\"q\\\"b\\\\s\\/n\\n t\\t\\b\\f\\r\", \"\\u00e9\\u20AC\", \"\\ud83d\\ude00\","
                      " \"a\\u0000b\", \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"]";
    json_value *v = parse(doc, &e);
    ck_assert_msg(v, "%d:%d %s", e.line, e.col, e.msg);
    ck_assert_str_eq(v->items[0]->str, "q\"b\\s/n\n t\t\b\f\r");
    ck_assert_str_eq(v->items[1]->str, "\xc3\xa9\xe2\x82\xac");
    ck_assert_str_eq(v->items[2]->str, "\xf0\x9f\x98\x80");
    ck_assert_uint_eq(v->items[3]->len, 3);
    ck_assert(memcmp(v->items[3]->str, "a\0b", 4) == 0);
    ck_assert_str_eq(v->items[4]->str, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    json_free(v);
    /* Columns count characters: the x after a two-byte character is at 7. */
    v = parse("[\"\xc3\xa9\", x]", &e);
    ck_assert_ptr_null(v);
    ck_assert_int_eq(e.line, 1);
    ck_assert_int_eq(e.col, 7);
    /* A byte order mark is skipped. */
    v = parse("\xef\xbb\xbf[1]", &e);
    ck_assert_ptr_nonnull(v);
    json_free(v);
}
END_TEST

/* One malformed document: where the fault must be reported and what it
 * must say. */
typedef struct bad_case {
    const char *text;
    int line, col;
    const char *path, *msg;
} bad_case;

static const bad_case BAD[] = {
    {"", 1, 1, "$", "empty input"},
    {"   \n  ", 2, 3, "$", "empty input"},
    {"{\"a\":1,}", 1, 8, "$", "trailing comma"},
    {"[1,]", 1, 4, "$", "trailing comma"},
    {"[1 2]", 1, 4, "$", "expected ',' or ']'"},
    {"{\"a\" 1}", 1, 6, "$.a", "expected ':'"},
    {"{a:1}", 1, 2, "$", "member name in double quotes"},
    {"{'a':1}", 1, 2, "$", "member name in double quotes"},
    {"01", 1, 1, "$", "leading zeros"},
    {"-", 1, 1, "$", "digit must follow '-'"},
    {"1.", 1, 1, "$", "digit must follow '.'"},
    {"1e", 1, 1, "$", "exponent"},
    {"+1", 1, 1, "$", "expected a value"},
    {".5", 1, 1, "$", "expected a value"},
    {"1e999", 1, 1, "$", "out of range"},
    {"NaN", 1, 1, "$", "expected a value"},
    {"Infinity", 1, 1, "$", "expected a value"},
    {"tru", 1, 1, "$", "expected a value"},
    {"truex", 1, 5, "$", "after the JSON value"},
    {"[1] x", 1, 5, "$", "after the JSON value"},
    {"[1] // c", 1, 5, "$", "after the JSON value"},
    {"/* c */ 1", 1, 1, "$", "expected a value"},
    {"\"abc", 1, 5, "$", "unterminated string"},
    {"\"a\nb\"", 1, 3, "$", "control character"},
    {"\"\\q\"", 1, 3, "$", "invalid escape"},
    {"\"\\u12\"", 1, 2, "$", "four hex digits"},
    {"\"\\ud800\"", 1, 2, "$", "high surrogate"},
    {"\"\\ud800\\u0041\"", 1, 2, "$", "high surrogate"},
    {"\"\\udc00\"", 1, 2, "$", "lone low surrogate"},
    {"\"\xff\"", 1, 2, "$", "invalid UTF-8"},
    {"\"\xc0\xaf\"", 1, 2, "$", "invalid UTF-8"},
    {"\"\xed\xa0\x80\"", 1, 2, "$", "invalid UTF-8"},
    {"\"\xf4\x90\x80\x80\"", 1, 2, "$", "invalid UTF-8"},
    {"\"\xe2\x82\"", 1, 2, "$", "invalid UTF-8"},
    {"{\"a\":1,\"a\":2}", 1, 8, "$", "duplicate member name \"a\""},
    {"{\"s\": [1, {\"t\": [true, nul]}]}", 1, 24, "$.s[1].t[1]", "expected a value"},
    {"{\n  \"a\": [1,\n   2,,3]}", 3, 6, "$.a[2]", "expected a value"},
    {"{\"odd key\": [x]}", 1, 14, "$[\"odd key\"][0]", "expected a value"},
    {"{\"a\": 1 \"b\": 2}", 1, 9, "$", "expected ',' or '}'"},
};

START_TEST(test_malformed)
{
    const bad_case *b = &BAD[_i];
    json_error e;
    json_value *v = parse(b->text, &e);
    ck_assert_msg(!v, "accepted: %s", b->text);
    ck_assert_msg(strstr(e.msg, b->msg), "[%s]: message \"%s\", wanted \"%s\"", b->text, e.msg,
                  b->msg);
    ck_assert_msg(e.line == b->line && e.col == b->col, "[%s]: at %d:%d, wanted %d:%d", b->text,
                  e.line, e.col, b->line, b->col);
    ck_assert_msg(strcmp(e.path, b->path) == 0, "[%s]: path %s, wanted %s", b->text, e.path,
                  b->path);
}
END_TEST

/* 80,000 members are checked for duplicates in linear time: the pairwise
 * check this replaced took 44 s here, so a second is a bound with a wide
 * margin, not a benchmark. The duplicate is the last member, reported where
 * it stands, and every name before it is distinct but for its last digits. */
START_TEST(test_many_keys)
{
    enum { N = 80000 };
    size_t cap = (size_t)N * 24 + 64, n = 0;
    char *text = malloc(cap);
    ck_assert_ptr_nonnull(text);
    text[n++] = '{';
    for (int i = 0; i < N; i++)
        n += (size_t)snprintf(text + n, cap - n, "%s\"key%06d\":%d", i ? "," : "", i, i);
    size_t open_end = n;
    text[n++] = '}';
    json_error e;
    clock_t t0 = clock();
    json_value *v = json_parse(text, n, &e);
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    ck_assert_msg(v, "rejected: %s", e.msg);
    ck_assert_int_eq((int)v->n, N);
    const json_value *last = json_get(v, "key079999");
    ck_assert_ptr_nonnull(last);
    ck_assert_int_eq((int)last->number, N - 1);
    json_free(v);
    ck_assert_msg(secs < 1.0, "80000 members took %.2f s", secs);

    n = open_end;
    int col = (int)n + 2;
    n += (size_t)snprintf(text + n, cap - n, ",\"key000017\":0}");
    ck_assert_ptr_null(json_parse(text, n, &e));
    ck_assert_ptr_nonnull(strstr(e.msg, "duplicate member name \"key000017\""));
    ck_assert_int_eq(e.line, 1);
    ck_assert_int_eq(e.col, col);
    free(text);
}
END_TEST

START_TEST(test_depth)
{
    char deep[400];
    json_error e;
    memset(deep, '[', 200);
    memset(deep + 200, ']', 200);
    ck_assert_ptr_null(json_parse(deep, 400, &e));
    ck_assert_ptr_nonnull(strstr(e.msg, "nesting deeper"));
    json_value *v = json_parse(deep + 200 - JSON_MAX_DEPTH, 2 * JSON_MAX_DEPTH, &e);
    ck_assert_ptr_nonnull(v);
    json_free(v);
    ck_assert_ptr_null(json_parse(NULL, 0, &e));
}
END_TEST

/* ---- random round trips ---- */

static json_value *random_value(test_rng *r, int depth);

static char *random_string(test_rng *r, size_t *len)
{
    static const char *const pieces[] = {"a", "Z", "0", " ", "\"", "\\", "/", "\n", "\t", "\x01",
                                         "\x1f", "\x7f", "\xc3\xa9", "\xe2\x82\xac",
                                         "\xf0\x9f\x98\x80", "key", "{", "]", ","};
    size_t n = (size_t)test_rng_int(r, 0, 12), at = 0;
    char *s = malloc(n * 4 + 1);
    ck_assert_ptr_nonnull(s);
    for (size_t i = 0; i < n; i++) {
        const char *p = pieces[test_rng_next(r) % (sizeof pieces / sizeof pieces[0])];
        memcpy(s + at, p, strlen(p));
        at += strlen(p);
    }
    s[at] = 0;
    *len = at;
    return s;
}

static json_value *random_container(test_rng *r, int depth, json_type t)
{
    json_value *v = calloc(1, sizeof *v);
    v->type = t;
    size_t n = (size_t)test_rng_int(r, 0, 5);
    v->items = calloc(n + 1, sizeof *v->items);
    if (t == JSON_OBJECT)
        v->keys = calloc(n + 1, sizeof *v->keys);
    for (size_t i = 0; i < n; i++) {
        if (t == JSON_OBJECT) {
            size_t len;
            char *k = random_string(r, &len);
            char *unique = NULL;
            ck_assert_int_ge(asprintf(&unique, "%zu%s", i, k), 0);  /* names must differ */
            free(k);
            v->keys[i] = unique;
        }
        v->items[i] = random_value(r, depth + 1);
    }
    v->n = n;
    return v;
}

static json_value *random_value(test_rng *r, int depth)
{
    int kind = test_rng_int(r, 0, depth > 4 ? 3 : 5);
    if (kind >= 4)
        return random_container(r, depth, kind == 4 ? JSON_ARRAY : JSON_OBJECT);
    json_value *v = calloc(1, sizeof *v);
    v->type = kind == 0 ? JSON_NULL : kind == 1 ? JSON_BOOL : kind == 2 ? JSON_NUMBER : JSON_STRING;
    if (kind == 1)
        v->boolean = (int)(test_rng_next(r) & 1);
    if (kind == 2) {
        double m[] = {0, 1, -1, 0.5, 1e-300, 1e300, 123456789, -2.75};
        v->number = test_rng_uniform(r) < 0.5 ? m[test_rng_next(r) % 8]
                                               : (test_rng_uniform(r) - 0.5) * 1e6;
    }
    if (kind == 3)
        v->str = random_string(r, &v->len);
    return v;
}

static void assert_same(const json_value *a, const json_value *b)
{
    ck_assert_int_eq(a->type, b->type);
    ck_assert_uint_eq(a->n, b->n);
    if (a->type == JSON_BOOL)
        ck_assert_int_eq(a->boolean, b->boolean);
    if (a->type == JSON_NUMBER)
        ck_assert_msg(a->number == b->number, "%.17g != %.17g", a->number, b->number);
    if (a->type == JSON_STRING) {
        ck_assert_uint_eq(a->len, b->len);
        ck_assert(memcmp(a->str, b->str, a->len) == 0);
    }
    for (size_t i = 0; i < a->n; i++) {
        if (a->type == JSON_OBJECT)
            ck_assert_str_eq(a->keys[i], b->keys[i]);
        assert_same(a->items[i], b->items[i]);
    }
}

START_TEST(test_roundtrip)
{
    test_rng r = test_rng_make(0x6a73);
    for (int iter = 0; iter < 300; iter++) {
        json_value *v = random_value(&r, 0);
        for (int pretty = 0; pretty < 2; pretty++) {
            char *buf = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            json_out o;
            json_out_init(&o, f, pretty);
            json_value_out(&o, v);
            json_out_end(&o);
            fclose(f);
            json_error e;
            json_value *back = json_parse(buf, len, &e);
            ck_assert_msg(back, "seed %llu iter %d: %s at %d:%d in %s",
                          (unsigned long long)test_seed(), iter, e.msg, e.line, e.col, buf);
            assert_same(v, back);
            json_free(back);
            free(buf);
        }
        json_free(v);
    }
}
END_TEST

START_TEST(test_writer)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    json_out o;
    json_out_init(&o, f, 0);
    json_begin_object(&o);
    json_key(&o, "s");
    json_string(&o, "a\"b\\c\n\x01\xff");
    json_key(&o, "n");
    json_double(&o, NAN);
    json_key(&o, "i");
    json_int_out(&o, -42);
    json_key(&o, "l");
    json_begin_array(&o);
    json_bool(&o, 1);
    json_null(&o);
    json_string(&o, NULL);
    json_begin_object(&o);
    json_end_object(&o);
    json_end_array(&o);
    json_end_object(&o);
    fclose(f);
    ck_assert_str_eq(buf, "{\"s\":\"a\\\"b\\\\c\\n\\u0001\\ufffd\",\"n\":null,\"i\":-42,"
                          "\"l\":[true,null,null,{}]}");
    free(buf);
    char path[64] = "$.a";
    json_path_key(path, sizeof path, "b c");
    json_path_index(path, sizeof path, 3);
    json_path_key(path, sizeof path, "d_e-1");
    ck_assert_str_eq(path, "$.a[\"b c\"][3].d_e-1");
}
END_TEST

Suite *suite_json(void)
{
    Suite *s = suite_create("json");
    TCase *tc = tcase_create("json");
    tcase_add_test(tc, test_values);
    tcase_add_test(tc, test_strings);
    tcase_add_loop_test(tc, test_malformed, 0, (int)(sizeof BAD / sizeof BAD[0]));
    tcase_add_test(tc, test_depth);
    tcase_add_test(tc, test_many_keys);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_writer);
    suite_add_tcase(s, tc);
    return s;
}
