/*
 * test_floors — tools/floors.sh, the check `make` runs on the house's
 * floors: the tree as it stands passes, and a copy of it fails, naming the
 * breach, once an upward include, a sideways include, a circle of modules
 * or an upward call (seen in the objects) is planted in it.
 */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* A copy of the source rooms and the script in a fresh folder. */
static char *copy_tree(void)
{
    char *dir = test_tmpdir(), *out = NULL;
    ck_assert_ptr_nonnull(dir);
    int rc = test_sh(&out, "mkdir -p '%s/tools' && cp -r src cache codegen '%s/' && "
                     "cp tools/floors.sh '%s/tools/'", dir, dir, dir);
    ck_assert_msg(rc == 0, "copying the tree: %s", out);
    free(out);
    return dir;
}

static int floors(const char *dir, const char *objects, char **out)
{
    return test_sh(out, "bash tools/floors.sh --root '%s' %s", dir, objects ? objects : "");
}

/* Appends line to file in a copy of the tree: the check must then fail,
 * saying every fragment of want and never `never` (may be NULL). */
static void planted_fails(const char *file, const char *line, const char *const *want,
                          const char *never)
{
    char *dir = copy_tree(), *out = NULL;
    ck_assert_int_eq(test_sh(&out, "printf '%%s\\n' '%s' >> '%s/%s'", line, dir, file), 0);
    free(out);
    ck_assert_int_eq(floors(dir, NULL, &out), 1);
    for (; *want; want++)
        ck_assert_msg(strstr(out, *want), "%s: no \"%s\" in:\n%s", line, *want, out);
    ck_assert_msg(!never || !strstr(out, never), "%s:\n%s", line, out);
    free(out);
    test_rmtree(dir);
    free(dir);
}

START_TEST(test_tree_passes)
{
    char *out = NULL;
    int rc = test_sh(&out, "bash tools/floors.sh");
    ck_assert_msg(rc == 0, "the tree breaks its floors:\n%s", out);
    ck_assert_ptr_nonnull(strstr(out, "none upward or sideways, no circle"));
    free(out);
    /* So does an untouched copy: the planted lines below are what fail. */
    char *dir = copy_tree();
    ck_assert_int_eq(floors(dir, NULL, &out), 0);
    free(out);
    test_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(test_planted_includes)
{
    planted_fails("src/base/strbuf.c", "#include \"gpu/jit.h\"",
                  (const char *const[]){"upward: src/base/strbuf.c (src/base, floor 1) includes "
                                        "src/gpu/jit.h (src/gpu, floor 3)", NULL},
                  NULL);
    planted_fails("cache/cache.c", "#include \"codegen/nvrtc_drv.h\"",
                  (const char *const[]){"sideways: cache/cache.c (cache) includes "
                                        "codegen/nvrtc_drv.h (codegen), both on floor 2", NULL},
                  NULL);
    /* Within one room any include is allowed, but not a loop. */
    planted_fails("src/attn/model.h", "#include \"attn/mha.h\"",
                  (const char *const[]){"a circle of modules", "src/attn/model", "src/attn/mha",
                                        NULL},
                  "upward");
}
END_TEST

START_TEST(test_upward_call)
{
    /* A call declared where the includes cannot see it climb (as a public
     * function of stof.h would be) is caught in the objects. */
    char *dir = copy_tree(), *out = NULL;
    int rc = test_sh(&out,
                     "cd '%s' && mkdir -p build/obj/src/base build/obj/src/gpu && "
                     "printf 'int low(void);\\nint high(void) { return low(); }\\n' > src/gpu/up.c && "
                     "printf 'int high(void);\\nint low(void) { return high() + 1; }\\n' > src/base/down.c && "
                     "cc -c -o build/obj/src/gpu/up.o src/gpu/up.c && "
                     "cc -c -o build/obj/src/base/down.o src/base/down.c",
                     dir);
    ck_assert_msg(rc == 0, "%s", out);
    free(out);
    ck_assert_int_eq(floors(dir, NULL, &out), 0);  /* no include says so */
    free(out);
    ck_assert_int_eq(floors(dir, "build/obj/src/gpu/up.o build/obj/src/base/down.o", &out), 1);
    ck_assert_msg(strstr(out, "upward: src/base/down.c (src/base, floor 1) calls high "
                              "src/gpu/up.c (src/gpu, floor 3)"), "%s", out);
    ck_assert_ptr_nonnull(strstr(out, "a circle of modules"));
    free(out);
    test_rmtree(dir);
    free(dir);
}
END_TEST

Suite *suite_floors(void)
{
    Suite *s = suite_create("floors");
    TCase *tc = tcase_create("floors");
    tcase_add_test(tc, test_tree_passes);
    tcase_add_test(tc, test_planted_includes);
    tcase_add_test(tc, test_upward_call);
    suite_add_tcase(s, tc);
    return s;
}
