/*
 * strbuf — a growing NUL-terminated string. An allocation failure is sticky
 * (oom), so callers check once at the end.
 */
#ifndef STOF_STRBUF_H
#define STOF_STRBUF_H

#include <stddef.h>

typedef struct strbuf {
    char *p;
    size_t len, cap;
    int oom;
} strbuf;

void strbuf_add(strbuf *b, const char *s, size_t n);
void strbuf_puts(strbuf *b, const char *s);
void strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the string over (never NULL unless oom) and resets b. */
char *strbuf_take(strbuf *b);
void strbuf_free(strbuf *b);

#endif
