#include "codegen/render.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"

#define MAX_DEPTH 16
#define MAX_VARS 64
#define MAX_INCLUDES 16
#define MAX_INCLUDE_DEPTH 4

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    strbuf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        strbuf_add(&b, chunk, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        strbuf_free(&b);
        return NULL;
    }
    return strbuf_take(&b);
}

const char *render_templates_digest(void)
{
    const char *dir = getenv("STOF_TEMPLATE_DIR");
    return dir && *dir ? NULL : render_embedded_digest;
}

stof_status render_load(err_record *err, const char *name, char **text)
{
    *text = NULL;
    if (!name || !*name || strchr(name, '/'))
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "bad template name \"%s\"", name ? name : "");
    const char *dir = getenv("STOF_TEMPLATE_DIR");
    if (dir && *dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (!(*text = read_file(path)))
            return ERR_FAIL(err, STOF_ERR_INVALID_ARG,
                            "template %s: cannot read %s (STOF_TEMPLATE_DIR is set)", name, path);
        return STOF_OK;
    }
    for (const render_embedded *t = render_embedded_templates; t->name; t++) {
        if (strcmp(t->name, name) == 0) {
            if (!(*text = strdup(t->text)))
                return ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory loading %s", name);
            return STOF_OK;
        }
    }
    return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "no template named %s", name);
}

static int line_of(const char *text, const char *at)
{
    int line = 1;
    for (const char *p = text; p < at; p++)
        line += *p == '\n';
    return line;
}

static int valid_name(const char *s, size_t n)
{
    if (n == 0 || !(isupper((unsigned char)s[0]) || s[0] == '_'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(isupper((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '_'))
            return 0;
    return 1;
}

static int find_var(const render_var *vars, int nvars, const char *s, size_t n)
{
    for (int i = 0; i < nvars; i++)
        if (strlen(vars[i].name) == n && memcmp(vars[i].name, s, n) == 0)
            return i;
    return -1;
}

static int truthy(const char *v) { return v && *v && strcmp(v, "0") != 0; }

/* One rendering: the values, which of them a text used, the headers
 * included so far and the output. */
typedef struct render_state {
    err_record *err;
    const render_var *vars;
    int nvars;
    char used[MAX_VARS];
    char *included[MAX_INCLUDES];
    int nincluded;
    strbuf out;
} render_state;

static int valid_file(const char *s, size_t n)
{
    if (n == 0 || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(islower((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '_' ||
              s[i] == '.'))
            return 0;
    return 1;
}

static stof_status render_body(render_state *rs, const char *name, const char *text, int level);

/* {{>file}} at line `line` of `name`: file, rendered in its place with the
 * same values, unless this rendering has included it already. */
static stof_status render_include(render_state *rs, const char *name, int line, const char *file,
                                  size_t n, int level)
{
    err_record *err = rs->err;
    if (level == MAX_INCLUDE_DEPTH)
        return ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: includes nest too deep",
                        name, line);
    for (int i = 0; i < rs->nincluded; i++)
        if (strlen(rs->included[i]) == n && memcmp(rs->included[i], file, n) == 0)
            return STOF_OK;
    if (rs->nincluded == MAX_INCLUDES)
        return ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: too many includes", name,
                        line);
    char *inc = strndup(file, n), *text = NULL;
    if (!inc)
        return ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory including %.*s", (int)n, file);
    rs->included[rs->nincluded++] = inc;
    err_record why = {0};
    stof_status st = render_load(&why, inc, &text);
    if (st != STOF_OK)
        return ERR_FAIL(err, st == STOF_ERR_NO_MEMORY ? st : STOF_ERR_INTERNAL,
                        "template %s line %d: cannot include %s: %s", name, line, inc, why.msg);
    st = render_body(rs, inc, text, level + 1);
    free(text);
    if (st != STOF_OK && err) {
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, " (included by %s line %d)", name, line);
    }
    return st;
}

/* Renders text (called name in messages) onto rs->out; level counts the
 * includes it lies in. */
static stof_status render_body(render_state *rs, const char *name, const char *text, int level)
{
    err_record *err = rs->err;
    const render_var *vars = rs->vars;
    const int nvars = rs->nvars;
    int keep[MAX_DEPTH + 1] = {1}; /* keep[d]: text at depth d is emitted */
    int depth = 0;
    const char *open_at[MAX_DEPTH + 1] = {0};
    strbuf *b = &rs->out;
    const char *p = text;
    stof_status st = STOF_OK;

    while (*p && st == STOF_OK) {
        const char *tag = strstr(p, "{{");
        if (!tag) {
            if (keep[depth])
                strbuf_puts(b, p);
            break;
        }
        if (keep[depth])
            strbuf_add(b, p, (size_t)(tag - p));
        const char *end = strstr(tag + 2, "}}");
        const char *nl = strchr(tag + 2, '\n');
        if (!end || (nl && nl < end)) {
            st = ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: unclosed \"{{\"", name,
                          line_of(text, tag));
            break;
        }
        const char *s = tag + 2;
        size_t n = (size_t)(end - s);
        int line = line_of(text, tag);
        const int unless = n >= 8 && memcmp(s, "#unless ", 8) == 0;
        if (unless || (n >= 4 && memcmp(s, "#if ", 4) == 0)) {
            s += unless ? 8 : 4;
            n -= unless ? 8 : 4;
            if (!valid_name(s, n)) {
                st = ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: malformed \"{{%.*s}}\"",
                              name, line, (int)(end - tag - 2), tag + 2);
            } else if (depth == MAX_DEPTH) {
                st = ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: sections nest too deep",
                              name, line);
            } else {
                int v = find_var(vars, nvars, s, n);
                if (v < 0) {
                    st = ERR_FAIL(err, STOF_ERR_INTERNAL,
                                  "template %s line %d: missing value for {{#if %.*s}}", name, line,
                                  (int)n, s);
                } else {
                    rs->used[v] = 1;
                    depth++;
                    keep[depth] = keep[depth - 1] && truthy(vars[v].value) != unless;
                    open_at[depth] = tag;
                }
            }
        } else if (n == 3 && memcmp(s, "/if", 3) == 0) {
            if (depth == 0)
                st = ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: {{/if}} with no {{#if}}",
                              name, line);
            else
                depth--;
        } else if (n >= 1 && s[0] == '>') {
            if (!valid_file(s + 1, n - 1))
                st = ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: malformed \"{{%.*s}}\"",
                              name, line, (int)n, s);
            else if (depth > 0)
                st = ERR_FAIL(err, STOF_ERR_INTERNAL,
                              "template %s line %d: {{%.*s}} inside a section", name, line, (int)n,
                              s);
            else
                st = render_include(rs, name, line, s + 1, n - 1, level);
        } else if (valid_name(s, n)) {
            int v = find_var(vars, nvars, s, n);
            if (v < 0)
                st = ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: missing value for {{%.*s}}",
                              name, line, (int)n, s);
            else {
                rs->used[v] = 1;
                if (keep[depth])
                    strbuf_puts(b, vars[v].value);
            }
        } else {
            st = ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: malformed \"{{%.*s}}\"", name,
                          line, (int)n, s);
        }
        p = end + 2;
    }
    if (st == STOF_OK && depth > 0)
        st = ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s line %d: {{#if}} never closed", name,
                      line_of(text, open_at[depth]));
    return st;
}

stof_status render_text(err_record *err, const char *name, const char *text,
                        const render_var *vars, int nvars, char **out)
{
    *out = NULL;
    if (nvars > MAX_VARS)
        return ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s: too many values", name);
    for (int i = 0; i < nvars; i++)
        if (!vars[i].name || !vars[i].value || !valid_name(vars[i].name, strlen(vars[i].name)))
            return ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s: value %d has a bad name or NULL",
                            name, i);
    render_state rs = {.err = err, .vars = vars, .nvars = nvars};
    stof_status st = render_body(&rs, name, text, 0);
    for (int i = 0; st == STOF_OK && i < nvars; i++)
        if (!rs.used[i])
            st = ERR_FAIL(err, STOF_ERR_INTERNAL, "template %s: unknown name %s (the template never uses it)",
                          name, vars[i].name);
    if (st == STOF_OK && rs.out.oom)
        st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "template %s: out of memory", name);
    for (int i = 0; i < rs.nincluded; i++)
        free(rs.included[i]);
    if (st != STOF_OK) {
        strbuf_free(&rs.out);
        return st;
    }
    *out = strbuf_take(&rs.out);
    return STOF_OK;
}

stof_status render_template(err_record *err, const char *name, const render_var *vars, int nvars,
                            char **out)
{
    char *text;
    *out = NULL;
    TRY(render_load(err, name, &text));
    stof_status st = render_text(err, name, text, vars, nvars, out);
    free(text);
    return st;
}
