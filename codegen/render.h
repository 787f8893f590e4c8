/*
 * render — CUDA C text templates: finding them (embedded at build time, or
 * $STOF_TEMPLATE_DIR during development) and rendering `{{NAME}}`
 * placeholders, `{{#if NAME}} ... {{/if}}` sections (nestable; `{{#unless
 * NAME}} ... {{/if}}` keeps its text where NAME's section would drop it) and
 * `{{>file.cuh}}` includes: the named template rendered in place with the
 * same values (a value only it names counts as used), once per rendering
 * (a later include of it adds nothing), never inside a section. Rendering
 * fails, naming the template and line, on a placeholder with no value, a
 * value the template never names, a template it cannot include, or
 * malformed syntax.
 */
#ifndef STOF_RENDER_H
#define STOF_RENDER_H

#include "base/err.h"

typedef struct render_var {
    const char *name;
    const char *value;   /* a section is kept when value is non-empty and not "0" */
} render_var;

typedef struct render_embedded {
    const char *name;
    const char *text;
} render_embedded;

/* The table written by codegen/embed.c; ends with a NULL name. */
extern const render_embedded render_embedded_templates[];
extern const char render_embedded_digest[];

/* A digest of the templates in use (16 hex digits), or NULL while
 * STOF_TEMPLATE_DIR is set: their texts are then not known in advance. */
const char *render_templates_digest(void);

/* The text of template `name` ("layernorm.cu"); the caller frees it. */
stof_status render_load(err_record *err, const char *name, char **text);

/* Renders `text` (called `name` in messages) into *out (caller frees). */
stof_status render_text(err_record *err, const char *name, const char *text,
                        const render_var *vars, int nvars, char **out);

/* render_load then render_text. */
stof_status render_template(err_record *err, const char *name, const render_var *vars,
                            int nvars, char **out);

#endif
