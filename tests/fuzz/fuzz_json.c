/*
 * fuzz_json — the JSON reader (src/json.c) on hostile text, and its
 * writer on whatever the reader accepts: a rejected input must say where
 * (a line, a column, a path starting with '$') and why; an accepted one,
 * written out, must read back, and writing that must give the same text
 * (compact and pretty), so that the tools' --json output of a record is
 * always JSON.
 */
#include <string.h>

#include "fuzz.h"
#include "base/json.h"

/* v written out, compact or pretty: a malloc'd text and its length. */
static char *write_out(const json_value *v, int pretty, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    FUZZ_CHECK(f != NULL, "open_memstream");
    json_out o;
    json_out_init(&o, f, pretty);
    json_value_out(&o, v);
    json_out_end(&o);
    fclose(f);
    return buf;
}

/* Every member can be looked up by its name; numbers that are integers
 * convert. */
static void walk(const json_value *v, int depth)
{
    FUZZ_CHECK(depth <= JSON_MAX_DEPTH + 1, "depth %d", depth);
    FUZZ_CHECK(v->line >= 1 && v->col >= 1, "position %d:%d", v->line, v->col);
    if (v->type == JSON_STRING)
        FUZZ_CHECK(v->str && v->str[v->len] == 0, "string not terminated");
    if (v->type == JSON_NUMBER) {
        long long x;
        json_int(v, -1000, 1000, &x);
    }
    for (size_t i = 0; i < v->n; i++) {
        if (v->type == JSON_OBJECT)
            FUZZ_CHECK(json_get(v, v->keys[i]) != NULL, "member \"%s\" not found", v->keys[i]);
        walk(v->items[i], depth + 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error e;
    memset(&e, 0, sizeof e);
    json_value *v = json_parse((const char *)data, size, &e);
    if (!v) {
        FUZZ_CHECK(e.line >= 1 && e.col >= 1, "error at %d:%d", e.line, e.col);
        FUZZ_CHECK(e.msg[0] != 0, "error without a message");
        FUZZ_CHECK(e.path[0] == '$', "error path \"%s\"", e.path);
        return 0;
    }
    walk(v, 0);
    for (int pretty = 0; pretty < 2; pretty++) {
        size_t n1, n2;
        char *t1 = write_out(v, pretty, &n1);
        json_error e2;
        json_value *w = json_parse(t1, n1, &e2);
        FUZZ_CHECK(w != NULL, "the writer's output does not read back (%s at %d:%d):\n%s", e2.msg,
                   e2.line, e2.col, t1);
        char *t2 = write_out(w, pretty, &n2);
        FUZZ_CHECK(n1 == n2 && memcmp(t1, t2, n1) == 0, "writing is not stable:\n%s\n%s", t1, t2);
        json_free(w);
        free(t1);
        free(t2);
    }
    json_free(v);
    return 0;
}
