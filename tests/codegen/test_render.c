/*
 * test_render — the template renderer: placeholders, sections and their
 * nesting, every error (with the template and line named), the
 * STOF_TEMPLATE_DIR override, and the embedded copies of templates/.
 */
#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/render.h"
#include "testutil.h"

/* Renders text and returns the output (caller frees); asserts success. */
static char *render_ok(err_record *err, const char *text, const render_var *vars, int n)
{
    char *out = (char *)1;
    stof_status st = render_text(err, "t.cu", text, vars, n, &out);
    ck_assert_msg(st == STOF_OK, "render failed: %s", err->msg);
    ck_assert_ptr_nonnull(out);
    return out;
}

/* Asserts that rendering fails with a message holding every fragment. */
static void render_fails(err_record *err, const char *text, const render_var *vars, int n,
                         const char *frag1, const char *frag2)
{
    char *out = (char *)1;
    stof_status st = render_text(err, "bad.cu", text, vars, n, &out);
    ck_assert_msg(st != STOF_OK, "rendering \"%s\" should fail", text);
    ck_assert_ptr_null(out);
    const char *e = err->msg;
    ck_assert_msg(strstr(e, "bad.cu") != NULL, "message does not name the template: %s", e);
    ck_assert_msg(strstr(e, frag1) != NULL, "message lacks \"%s\": %s", frag1, e);
    ck_assert_msg(!frag2 || strstr(e, frag2) != NULL, "message lacks \"%s\": %s", frag2, e);
}

START_TEST(test_placeholders)
{
    err_record err = {0};
    render_var v[] = {{"X", "12"}, {"Y_2", "float"}, {"_Z9", ""}};
    char *out = render_ok(&err, "a {{X}} b {{Y_2}}{{_Z9}} {{X}}{{X}}\nno tags here {", v, 3);
    ck_assert_str_eq(out, "a 12 b float 1212\nno tags here {");
    free(out);
    /* No tags at all, and an empty template. */
    out = render_ok(&err, "plain text } {", NULL, 0);
    ck_assert_str_eq(out, "plain text } {");
    free(out);
    out = render_ok(&err, "", NULL, 0);
    ck_assert_str_eq(out, "");
    free(out);
    /* Values are inserted verbatim, never rendered again. */
    render_var w[] = {{"X", "{{Y}}"}};
    out = render_ok(&err, "[{{X}}]", w, 1);
    ck_assert_str_eq(out, "[{{Y}}]");
    free(out);
}
END_TEST

START_TEST(test_sections)
{
    err_record err = {0};
    const char *values[] = {"1", "0", "", "yes", "00"};
    const int kept[] = {1, 0, 0, 1, 1}; /* only "" and "0" are false */
    for (int i = 0; i < 5; i++) {
        render_var v[] = {{"ON", values[i]}};
        char *out = render_ok(&err, "a{{#if ON}}b\n{{/if}}c", v, 1);
        ck_assert_msg(strcmp(out, kept[i] ? "ab\nc" : "ac") == 0, "value \"%s\" gave \"%s\"",
                      values[i], out);
        free(out);
    }
}
END_TEST

/* {{#unless}} keeps what {{#if}} drops, nests with it, and names its value. */
START_TEST(test_unless)
{
    err_record err = {0};
    const char *values[] = {"1", "0", "", "yes"};
    const int kept[] = {0, 1, 1, 0};
    for (int i = 0; i < 4; i++) {
        render_var v[] = {{"ON", values[i]}};
        char *out = render_ok(&err, "a{{#unless ON}}b{{/if}}{{#if ON}}B{{/if}}c", v, 1);
        ck_assert_msg(strcmp(out, kept[i] ? "abc" : "aBc") == 0, "value \"%s\" gave \"%s\"",
                      values[i], out);
        free(out);
    }
    render_var ab[] = {{"A", "1"}, {"B", "0"}};
    char *out = render_ok(&err, "<{{#if A}}{{#unless B}}x{{/if}}{{/if}}{{#unless A}}y{{/if}}>",
                          ab, 2);
    ck_assert_str_eq(out, "<x>");
    free(out);
    render_fails(&err, "{{#unless NOPE}}x{{/if}}", NULL, 0, "line 1", "NOPE");
    render_fails(&err, "{{#unless b}}x{{/if}}", ab, 2, "line 1", "malformed");
}
END_TEST

START_TEST(test_nesting)
{
    err_record err = {0};
    const char *text = "<{{#if A}}a{{V}}{{#if B}}b{{#if C}}c{{/if}}{{/if}}-{{/if}}{{#if B}}B{{/if}}>";
    for (int m = 0; m < 8; m++) {
        int a = m & 1, b = (m >> 1) & 1, c = (m >> 2) & 1;
        render_var v[] = {{"A", a ? "1" : "0"}, {"B", b ? "1" : "0"}, {"C", c ? "1" : "0"},
                          {"V", "v"}};
        char want[32];
        snprintf(want, sizeof want, "<%s%s%s%s%s>", a ? "av" : "", a && b ? "b" : "",
                 a && b && c ? "c" : "", a ? "-" : "", b ? "B" : "");
        char *out = render_ok(&err, text, v, 4);
        ck_assert_msg(strcmp(out, want) == 0, "A=%d B=%d C=%d: got %s, want %s", a, b, c, out, want);
        free(out);
    }
    /* Sixteen levels are allowed; a seventeenth is refused. */
    char deep[1024] = "", tail[256] = "";
    for (int i = 0; i < 16; i++) {
        strcat(deep, "{{#if A}}");
        strcat(tail, "{{/if}}");
    }
    render_var v[] = {{"A", "1"}};
    char text16[1400];
    snprintf(text16, sizeof text16, "%sx%s", deep, tail);
    char *out = render_ok(&err, text16, v, 1);
    ck_assert_str_eq(out, "x");
    free(out);
    char text17[1400];
    snprintf(text17, sizeof text17, "%s{{#if A}}x{{/if}}%s", deep, tail);
    render_fails(&err, text17, v, 1, "too deep", "line 1");
}
END_TEST

START_TEST(test_errors)
{
    err_record err = {0};
    render_var ab[] = {{"A", "1"}, {"B", "2"}};
    /* A placeholder with no value, on line 3; also inside a false section. */
    render_fails(&err, "x\ny\n  {{MISSING}}\n", ab, 0, "line 3", "MISSING");
    render_var a0[] = {{"A", "0"}};
    render_fails(&err, "{{#if A}}\n{{NOPE}}{{/if}}", a0, 1, "line 2", "NOPE");
    render_fails(&err, "\n{{#if NOPE}}x{{/if}}", NULL, 0, "line 2", "NOPE");
    /* A value the template never names. */
    render_fails(&err, "{{A}}", ab, 2, "unknown name B", NULL);
    /* Malformed names and tags. */
    render_fails(&err, "ok\n{{lower}}", NULL, 0, "line 2", "malformed");
    render_fails(&err, "{{A B}}", ab, 1, "line 1", "malformed");
    render_fails(&err, "{{}}", NULL, 0, "line 1", "malformed");
    render_fails(&err, "{{9A}}", NULL, 0, "line 1", "malformed");
    render_fails(&err, "{{#if}}x{{/if}}", NULL, 0, "line 1", "malformed");
    render_fails(&err, "{{#if a}}x{{/if}}", NULL, 0, "line 1", "malformed");
    render_fails(&err, "{{#else}}", NULL, 0, "line 1", "malformed");
    /* Unclosed tags: at the end, and across a line break. */
    render_fails(&err, "a\nb {{A", ab, 1, "line 2", "unclosed");
    render_fails(&err, "{{A\n}}", ab, 1, "line 1", "unclosed");
    /* An {{#if}} never closed names the line it opened on. */
    render_fails(&err, "{{#if A}}\n{{#if A}}\n{{/if}}\n", ab, 1, "line 1", "never closed");
    /* A stray {{/if}}. */
    render_fails(&err, "\n\n\n{{/if}}", NULL, 0, "line 4", "{{/if}}");
    render_fails(&err, "{{#if A}}{{/if}}\n{{/if}}", ab, 1, "line 2", "{{/if}}");
    /* NULL values and bad value names are caller bugs, refused. */
    render_var bad[] = {{"A", NULL}};
    render_fails(&err, "{{A}}", bad, 1, "value 0", NULL);
    render_var lower[] = {{"a", "1"}};
    render_fails(&err, "{{A}}", lower, 1, "value 0", NULL);
}
END_TEST

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* {{>file}}: the file rendered in place with the same values, once per
 * rendering, never inside a section; its errors name it and its line. */
START_TEST(test_includes)
{
    err_record err = {0};
    char *dir = test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    write_file(dir, "h.cuh", "int h{{X}};\n");
    write_file(dir, "g.cuh", "{{>h.cuh}}int g{{#if ON}}{{Y}}{{/if}};\n");
    write_file(dir, "self.cuh", "s\n{{>self.cuh}}");
    write_file(dir, "bad_value.cuh", "\n\nx {{NOPE}}\n");
    write_file(dir, "open.cuh", "\n{{#if ON}}\n");
    write_file(dir, "d1.cuh", "{{>d2.cuh}}");
    write_file(dir, "d2.cuh", "{{>d3.cuh}}");
    write_file(dir, "d3.cuh", "{{>d4.cuh}}");
    write_file(dir, "d4.cuh", "{{>d5.cuh}}");
    write_file(dir, "d5.cuh", "deep\n");
    setenv("STOF_TEMPLATE_DIR", dir, 1);
    /* X and Y are named only by the headers, and still count as used; a
     * header included again adds nothing. */
    render_var v[] = {{"X", "7"}, {"Y", "9"}, {"ON", "1"}};
    char *out = render_ok(&err, "a\n{{>g.cuh}}b\n{{>h.cuh}}{{>g.cuh}}c", v, 3);
    ck_assert_str_eq(out, "a\nint h7;\nint g9;\nb\nc");
    free(out);
    out = render_ok(&err, "[{{>self.cuh}}]", NULL, 0);
    ck_assert_str_eq(out, "[s\n]");
    free(out);
    /* Four levels of includes are allowed, a fifth is refused. */
    out = render_ok(&err, "{{>d2.cuh}}", NULL, 0);
    ck_assert_str_eq(out, "deep\n");
    free(out);
    render_fails(&err, "{{>d1.cuh}}", NULL, 0, "too deep", "d4.cuh line 1");
    render_fails(&err, "x\n{{>bad_value.cuh}}", NULL, 0, "bad_value.cuh line 3", "NOPE");
    render_fails(&err, "{{>open.cuh}}", v + 2, 1, "open.cuh line 2", "never closed");
    render_fails(&err, "{{>h.cuh}}", v, 2, "unknown name Y", NULL);
    render_fails(&err, "\n{{>nope.cuh}}", NULL, 0, "line 2", "cannot include nope.cuh");
    render_fails(&err, "{{#if ON}}\n{{>h.cuh}}{{/if}}", v, 3, "line 2", "inside a section");
    render_fails(&err, "{{>}}", NULL, 0, "line 1", "malformed");
    render_fails(&err, "{{>../h.cuh}}", NULL, 0, "line 1", "malformed");
    render_fails(&err, "{{>sub/h.cuh}}", NULL, 0, "line 1", "malformed");
    render_fails(&err, "{{> h.cuh}}", NULL, 0, "line 1", "malformed");
    unsetenv("STOF_TEMPLATE_DIR");
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_template_dir_override)
{
    err_record err = {0};
    char *dir = test_tmpdir();
    ck_assert_ptr_nonnull(dir);
    write_file(dir, "layernorm.cu", "override {{X}}\n");
    ck_assert_ptr_eq(render_templates_digest(), render_embedded_digest);
    setenv("STOF_TEMPLATE_DIR", dir, 1);
    /* Texts from a folder are not the embedded ones: no digest. */
    ck_assert_ptr_null(render_templates_digest());
    render_var v[] = {{"X", "works"}};
    char *out = NULL;
    ck_assert_int_eq(render_template(&err, "layernorm.cu", v, 1, &out), STOF_OK);
    ck_assert_str_eq(out, "override works\n");
    free(out);
    /* A template missing from the folder is an error naming the path, not a
     * silent fall back to the embedded copy. */
    ck_assert_int_eq(render_load(&err, "common.cuh", &out), STOF_ERR_INVALID_ARG);
    ck_assert_ptr_null(out);
    ck_assert_ptr_nonnull(strstr(err.msg, dir));
    ck_assert_ptr_nonnull(strstr(err.msg, "STOF_TEMPLATE_DIR"));
    /* Errors in an override name the template file and line. */
    write_file(dir, "broken.cu", "one\ntwo {{#if X}}\n");
    ck_assert_int_ne(render_template(&err, "broken.cu", v, 1, &out), STOF_OK);
    ck_assert_ptr_nonnull(strstr(err.msg, "broken.cu line 2"));
    unsetenv("STOF_TEMPLATE_DIR");
    /* Back to the embedded copy. */
    ck_assert_int_eq(render_load(&err, "layernorm.cu", &out), STOF_OK);
    ck_assert_ptr_null(strstr(out, "override"));
    free(out);
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_bad_names)
{
    err_record err = {0};
    const char *bad[] = {"", "../templates/layernorm.cu", "sub/x.cu", "no-such-template.cu"};
    for (int i = 0; i < 4; i++) {
        char *out = (char *)1;
        ck_assert_int_eq(render_load(&err, bad[i], &out), STOF_ERR_INVALID_ARG);
        ck_assert_ptr_null(out);
        ck_assert_str_ne(err.msg, "");
    }
    ck_assert_ptr_nonnull(strstr(err.msg, "no-such-template.cu"));
}
END_TEST

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(fread(p, 1, (size_t)n, f), (size_t)n);
    p[n] = 0;
    fclose(f);
    return p;
}

/* Every name a template uses must be documented in its leading comment. */
static void check_documented(const char *name, const char *text)
{
    const char *body = text;
    while (strncmp(body, "//", 2) == 0) {
        const char *nl = strchr(body, '\n');
        body = nl ? nl + 1 : body + strlen(body);
    }
    size_t head_len = (size_t)(body - text);
    for (const char *p = strstr(text, "{{"); p; p = strstr(p + 2, "{{")) {
        const char *s = p + 2;
        if (strncmp(s, "#if ", 4) == 0 || strncmp(s, "#unless ", 8) == 0) {
            s += s[1] == 'i' ? 4 : 8;
        } else if (*s == '/') {
            continue;
        } else if (*s == '>') {
            /* An include names a template of its own, whose names its own
             * head documents. */
            const char *e = strstr(s, "}}");
            int embedded = 0;
            for (const render_embedded *t = render_embedded_templates; t->name && e; t++)
                embedded += strlen(t->name) == (size_t)(e - s - 1) &&
                            strncmp(t->name, s + 1, (size_t)(e - s - 1)) == 0;
            ck_assert_msg(embedded == 1, "%s: includes a template that is not embedded: %.*s",
                          name, e ? (int)(e - s + 2) : 8, p);
            continue;
        }
        size_t n = 0;
        while (isupper((unsigned char)s[n]) || isdigit((unsigned char)s[n]) || s[n] == '_')
            n++;
        ck_assert_msg(n > 0, "%s: odd tag at offset %td", name, p - text);
        int found = 0;
        for (const char *h = text; h + n <= text + head_len && !found; h++)
            found = strncmp(h, s, n) == 0 && !isalnum((unsigned char)h[n]) && h[n] != '_' &&
                    (h == text || (!isalnum((unsigned char)h[-1]) && h[-1] != '_'));
        ck_assert_msg(found, "%s: {{%.*s}} is not documented in the comment at its head", name,
                      (int)n, s);
    }
}

START_TEST(test_embedded_templates)
{
    err_record err = {0};
    /* The embedded table holds exactly the files of templates/, byte for byte. */
    DIR *d = opendir("templates");
    ck_assert_msg(d != NULL, "run the tests from the repository root (templates/ not found)");
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (!((n > 3 && strcmp(e->d_name + n - 3, ".cu") == 0) ||
              (n > 4 && strcmp(e->d_name + n - 4, ".cuh") == 0)))
            continue;
        files++;
        int in_table = 0;
        for (const render_embedded *t = render_embedded_templates; t->name; t++)
            in_table += strcmp(t->name, e->d_name) == 0;
        ck_assert_msg(in_table == 1, "templates/%s is embedded %d times (rebuild?)", e->d_name,
                      in_table);
    }
    closedir(d);
    int embedded = 0;
    for (const render_embedded *t = render_embedded_templates; t->name; t++) {
        embedded++;
        char *loaded = NULL, path[512];
        ck_assert_int_eq(render_load(&err, t->name, &loaded), STOF_OK);
        snprintf(path, sizeof path, "templates/%s", t->name);
        char *disk = slurp(path);
        ck_assert_msg(disk != NULL, "%s is embedded but templates/ has no such file", t->name);
        ck_assert_msg(strcmp(disk, loaded) == 0, "embedded %s differs from %s: rebuild", t->name, path);
        ck_assert_msg(strncmp(loaded, "//", 2) == 0, "%s does not start with its comment", t->name);
        check_documented(t->name, loaded);
        /* jit_launch launches every kernel as a programmatic dependent on
         * sm_90: a kernel that does not wait for its predecessor would read
         * its inputs while they are being written. */
        const char *kernel = strstr(loaded, "__global__");
        ck_assert_msg(!kernel || strstr(kernel, "stof_grid_wait();"),
                      "%s: its kernel never calls stof_grid_wait() (common.cuh)", t->name);
        free(disk);
        free(loaded);
    }
    ck_assert_int_eq(embedded, files);
    ck_assert_int_ge(embedded, 2);
    /* The digest covers every byte and every name: embed writes another
     * for a changed byte or a renamed file, the same for the same files. */
    ck_assert_uint_eq(strlen(render_embedded_digest), 16);
    char *dir = test_tmpdir(), *out[4] = {0};
    write_file(dir, "a.cu", "// one\n");
    write_file(dir, "b.cu", "// one!\n");
    write_file(dir, "c.cu", "// one\n");
    const char *files_of[4] = {"a.cu", "a.cu", "b.cu", "c.cu"};
    for (int i = 0; i < 4; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s %s/%s | grep render_embedded_digest", test_build_path("embed"),
                 dir, files_of[i]);
        ck_assert_int_eq(test_run(cmd, &out[i]), 0);
    }
    ck_assert_str_eq(out[0], out[1]);
    ck_assert_str_ne(out[0], out[2]);
    ck_assert_str_ne(out[0], out[3]);
    for (int i = 0; i < 4; i++)
        free(out[i]);
    test_rmtree(dir);
    free(dir);
    /* The prelude takes no values and renders to itself. */
    char *prelude = NULL, *raw = NULL;
    ck_assert_int_eq(render_template(&err, "common.cuh", NULL, 0, &prelude), STOF_OK);
    ck_assert_int_eq(render_load(&err, "common.cuh", &raw), STOF_OK);
    ck_assert_str_eq(prelude, raw);
    free(prelude);
    free(raw);
}
END_TEST

Suite *suite_render(void)
{
    Suite *s = suite_create("render");
    TCase *tc = tcase_create("render");
    tcase_add_test(tc, test_placeholders);
    tcase_add_test(tc, test_sections);
    tcase_add_test(tc, test_unless);
    tcase_add_test(tc, test_nesting);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_includes);
    tcase_add_test(tc, test_template_dir_override);
    tcase_add_test(tc, test_bad_names);
    tcase_add_test(tc, test_embedded_templates);
    suite_add_tcase(s, tc);
    return s;
}
