/*
 * json — a small strict JSON (RFC 8259) reader and writer for the tools and
 * the modules that serve them: workload files, tuning records and the
 * tools' --json output. The reader builds a tree of plain values, keeps
 * where each value began, and refuses anything the RFC does not allow
 * (comments, trailing commas, leading zeros, bad escapes, invalid UTF-8,
 * duplicate member names), naming the line, column and JSON path of the
 * fault. No dependencies beyond libc: a library such as jansson gives a
 * position only for a syntax error, where the workload reader names the
 * line and column of any value it refuses after parsing, and the GPU
 * machine and the Python wheel would have to carry it.
 */
#ifndef STOF_JSON_H
#define STOF_JSON_H

#include <stddef.h>
#include <stdio.h>

typedef enum json_type {
    JSON_NULL,
    JSON_BOOL,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT
} json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    int line, col;          /* 1-based; col counts characters, not bytes */
    int boolean;            /* JSON_BOOL */
    double number;          /* JSON_NUMBER */
    char *str;              /* JSON_STRING: UTF-8, NUL-terminated */
    size_t len;             /* JSON_STRING: bytes, without the NUL (\u0000 may occur) */
    size_t n;               /* JSON_ARRAY items / JSON_OBJECT members */
    json_value **items;     /* array items, or object member values, in order */
    char **keys;            /* JSON_OBJECT: member names, in order */
};

typedef struct json_error {
    int line, col;          /* where the fault is, 1-based */
    char path[256];         /* "$.suites[0].seq[2]": the value being read */
    char msg[256];          /* "expected ',' or ']' after an array item" */
} json_error;

/* Parses text[0 .. len). NULL on failure, with err filled (err may be NULL).
 * Nesting deeper than JSON_MAX_DEPTH is refused. */
#define JSON_MAX_DEPTH 128
json_value *json_parse(const char *text, size_t len, json_error *err);
void json_free(json_value *v);

/* The member `key` of an object; NULL when absent or when obj is no object. */
const json_value *json_get(const json_value *obj, const char *key);
/* 1 when v is a number holding an integer in [lo, hi], stored in *out. */
int json_int(const json_value *v, long long lo, long long hi, long long *out);
const char *json_type_name(json_type t);   /* "an object", "a number", ... */

/* Appends ".key", "[\"odd key\"]" or "[i]" to a path such as "$.suites". */
void json_path_key(char *path, size_t n, const char *key);
void json_path_index(char *path, size_t n, size_t i);

/* ---- writer ----
 * Emits well-formed JSON to a FILE: pretty (two-space indent, one member per
 * line) or compact. Numbers that are not finite are written as null. */
#define JSON_OUT_DEPTH (JSON_MAX_DEPTH + 2)   /* whatever the reader accepts can be written */
typedef struct json_out {
    FILE *f;
    int pretty;
    int depth;
    int count[JSON_OUT_DEPTH];  /* values written at each depth */
    int after_key;
} json_out;

void json_out_init(json_out *o, FILE *f, int pretty);
void json_begin_object(json_out *o);
void json_end_object(json_out *o);
void json_begin_array(json_out *o);
void json_end_array(json_out *o);
void json_key(json_out *o, const char *key);
void json_string(json_out *o, const char *s);
void json_int_out(json_out *o, long long v);
void json_double(json_out *o, double v);
void json_bool(json_out *o, int b);
void json_null(json_out *o);
void json_value_out(json_out *o, const json_value *v);
/* Ends the document with a newline. */
void json_out_end(json_out *o);

/* s as a JSON string literal, quotes included. */
void json_write_string(FILE *f, const char *s, size_t len);

#endif
