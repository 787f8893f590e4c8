#include "tools/dump_kernels.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/cache_admin.h"
#include "codegen/nvrtc_drv.h"
#include "tools/cli.h"

/* ---- list ---- */

typedef struct list_state {
    json_out o;
    int json;
    long long n;
} list_state;

static void list_json_row(json_out *o, const cache_kernel *k)
{
    json_begin_object(o);
    const char *txt[][2] = {{"key", k->key},         {"op", k->op},
                            {"template", k->name},   {"entry", k->entry},
                            {"arch", k->arch},       {"nvrtc_version", k->nvrtc_version},
                            {"stof_version", k->stof_version}, {"options", k->options},
                            {"params", k->params},   {"checksum", k->checksum}};
    for (size_t i = 0; i < sizeof txt / sizeof txt[0]; i++) {
        json_key(o, txt[i][0]);
        json_string(o, txt[i][1]);
    }
    const struct { const char *k; long long v; } nums[] = {
        {"cubin_bytes", (long long)k->cubin_size}, {"ptx_bytes", (long long)k->ptx_size},
        {"created", k->created}, {"last_used", k->last_used}, {"hits", k->hits}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        json_key(o, nums[i].k);
        json_int_out(o, nums[i].v);
    }
    json_key(o, "compile_ms");
    json_double(o, k->compile_ms);
    json_key(o, "current");
    json_bool(o, cache_versions_current(k->nvrtc_version, k->stof_version, nvrtc_version_string()));
    json_end_object(o);
}

static int list_row(const cache_kernel *k, void *arg)
{
    list_state *s = arg;
    char b1[32], b2[32], t[32];
    s->n++;
    if (s->json) {
        list_json_row(&s->o, k);
        return 0;
    }
    if (s->n == 1)
        printf("%-12s  %-10s  %-8s  %-20s  %10s  %10s  %9s  %5s  %-19s  %s\n", "KEY", "OP", "ARCH",
               "ENTRY", "CUBIN", "PTX", "COMPILE", "HITS", "LAST USED", "PARAMS");
    printf("%-12.12s  %-10s  %-8s  %-20s  %10s  %10s  %6.0f ms  %5lld  %-19s  %s%s\n", k->key,
           k->op, k->arch, k->entry, dump_cmd_bytes((long long)k->cubin_size, b1),
           dump_cmd_bytes((long long)k->ptx_size, b2), k->compile_ms, k->hits,
           dump_cmd_when(k->last_used, t),
           k->params,
           cache_versions_current(k->nvrtc_version, k->stof_version, nvrtc_version_string())
               ? ""
               : "  [stale]");
    return 0;
}

int dump_kernels_list(dump_cmd *d)
{
    list_state s = {.json = d->a->json};
    if (s.json)
        dump_cmd_doc(&s.o, cache_file(d->c), "kernels");
    if (cache_list_kernels(&d->err, d->c, d->a->op, d->a->arch, list_row, &s) != STOF_OK)
        return dump_cmd_fail(d, "listing");
    if (s.json) {
        json_end_array(&s.o);
        json_end_object(&s.o);
        json_out_end(&s.o);
    } else {
        printf("%s%lld kernel%s", s.n ? "\n" : "", s.n, s.n == 1 ? "" : "s");
        if (d->a->op || d->a->arch)
            printf(" (op %s, arch %s)", d->a->op ? d->a->op : "any",
                   d->a->arch ? d->a->arch : "any");
        printf("\n");
    }
    return 0;
}

/* ---- show ---- */

typedef struct naming {
    const char *key;
    int n;
} naming;

static int print_if_names(const cache_tuning *t, const char *ver, void *arg)
{
    naming *nm = arg;
    char keys[32][65];
    int n = cache_admin_record_kernels(t->record, keys, 32);
    (void)ver;
    for (int i = 0; i < n && i < 32; i++) {
        if (strcmp(keys[i], nm->key) != 0)
            continue;
        /* Attention records name the mask by its spec; older ones only
         * by its hash. */
        json_value *r = json_parse(t->record, strlen(t->record), NULL);
        const json_value *spec = json_get(r, "mask");
        printf("%-13s %s %s %s %s, mask ", nm->n++ ? "" : "tuned for", t->op, t->shape, t->dtype,
               t->arch);
        if (spec && spec->type == JSON_STRING)
            printf("%s (hash %.12s)\n", spec->str, t->mask_hash);
        else
            printf("%.12s (the record does not say its spec)\n", t->mask_hash);
        json_free(r);
        break;
    }
    return 0;
}

static void show_summary(dump_cmd *d, const cache_kernel *k)
{
    char sum[65], b[32];
    cache_checksum(k->cubin, k->cubin_size, k->ptx, k->ptx_size, sum);
    int sound = k->cubin_size > 0 && strcmp(sum, k->checksum) == 0;
    int current = cache_versions_current(k->nvrtc_version, k->stof_version, nvrtc_version_string());
    printf("%-13s %s\n%-13s %s\n%-13s %s\n%-13s %s\n%-13s %s\n", "key", k->key, "op", k->op,
           "template", k->name, "entry", k->entry, "arch", k->arch);
    printf("%-13s stof %s, NVRTC %s%s\n", "compiled by", k->stof_version, k->nvrtc_version,
           current ? "" : "  (STALE: not this stof or NVRTC; it will be recompiled)");
    printf("%-13s %s\n", "options", k->options);
    printf("%-13s %s\n", "params", k->params);
    printf("%-13s %zu bytes\n%-13s %zu bytes\n%-13s %zu bytes\n%-13s %zu bytes\n", "cubin",
           k->cubin_size, "ptx", k->ptx_size, "source", strlen(k->source), "log", strlen(k->log));
    printf("%-13s %s\n", "checksum",
           sound ? "ok" : "DAMAGED: the binary or PTX does not match its checksum");
    printf("%-13s %.1f ms\n", "compile", k->compile_ms);
    printf("%-13s %s\n", "created", dump_cmd_when(k->created, b));
    printf("%-13s %s\n", "last used", dump_cmd_when(k->last_used, b));
    printf("%-13s %lld\n", "hits", k->hits);
    naming nm = {k->key, 0};
    cache_admin_list_tuning(&d->err, d->c, NULL, print_if_names, &nm);
    if (!nm.n)
        printf("%-13s no tuning record names it (compiled ahead, e.g. by stof-warm "
               "--compile-only; a kernel reads its mask as data, so it serves any)\n",
               "tuned for");
}

static int find_tool(char *out, size_t n, const char **name)
{
    static const char *const tools[] = {"cuobjdump", "nvdisasm"};
    const char *path = getenv("PATH"), *cuda = getenv("CUDA_HOME");
    char dirs[8192];
    snprintf(dirs, sizeof dirs, "%s:%s%s/usr/local/cuda/bin", path ? path : "",
             cuda && *cuda ? cuda : "", cuda && *cuda ? "/bin:" : "");
    for (char *save = NULL, *dir = strtok_r(dirs, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        for (int t = 0; t < 2; t++) {
            snprintf(out, n, "%s/%s", dir, tools[t]);
            if (access(out, X_OK) == 0) {
                *name = tools[t];
                return 1;
            }
        }
    }
    return 0;
}

static int run_tool(const char *tool, const char *name, const char *file)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (strcmp(name, "cuobjdump") == 0)
            execl(tool, name, "-sass", file, (char *)NULL);
        else
            execl(tool, name, file, (char *)NULL);
        fprintf(stderr, "stof-dump: cannot run %s: %s\n", tool, strerror(errno));
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return CLI_EXIT_FAILED;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : CLI_EXIT_FAILED;
}

static int show_sass(const cache_kernel *k)
{
    char tool[4096];
    const char *name;
    if (!find_tool(tool, sizeof tool, &name)) {
        fprintf(stderr, "stof-dump: no SASS: neither cuobjdump nor nvdisasm was found on PATH,"
                        " in $CUDA_HOME/bin or in /usr/local/cuda/bin (install the CUDA "
                        "toolkit's binary utilities; --ptx shows the PTX)\n");
        return CLI_EXIT_FAILED;
    }
    const char *tmp = getenv("TMPDIR");
    char file[4096];
    snprintf(file, sizeof file, "%s/stof-dump-XXXXXX.cubin", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemps(file, 6);
    if (fd < 0) {
        fprintf(stderr, "stof-dump: cannot make a temporary file: %s\n", strerror(errno));
        return CLI_EXIT_FAILED;
    }
    int ok = write(fd, k->cubin, k->cubin_size) == (ssize_t)k->cubin_size;
    close(fd);
    int rc = ok ? run_tool(tool, name, file) : CLI_EXIT_FAILED;
    if (!ok)
        fprintf(stderr, "stof-dump: cannot write %s\n", file);
    unlink(file);
    return rc;
}

static int show_part(const cache_kernel *k, const char *part)
{
    if (strcmp(part, "source") == 0) {
        fputs(k->source, stdout);
    } else if (strcmp(part, "ptx") == 0) {
        fwrite(k->ptx, 1, k->ptx_size, stdout);
    } else if (strcmp(part, "log") == 0) {
        fputs(k->log, stdout);
        if (!k->log[0])
            fprintf(stderr, "stof-dump: the compile log of %.12s is empty\n", k->key);
    } else if (strcmp(part, "params") == 0) {
        for (const char *p = k->params; *p;) {
            size_t n = strcspn(p, ";");
            printf("%.*s\n", (int)n, p);
            p += n + (p[n] == ';');
        }
    } else {
        return show_sass(k);
    }
    return 0;
}

int dump_kernels_show(dump_cmd *d)
{
    char key[65];
    if (cache_resolve_key(&d->err, d->c, d->a->operand, key) != STOF_OK)
        return dump_cmd_fail(d, "show");
    cache_kernel k;
    int found = 0;
    if (cache_admin_read_kernel(&d->err, d->c, key, &k, &found) != STOF_OK)
        return dump_cmd_fail(d, "show");
    if (!found) {
        fprintf(stderr, "stof-dump: kernel %s vanished while reading it\n", key);
        return CLI_EXIT_FAILED;
    }
    int rc = 0;
    if (d->a->part)
        rc = show_part(&k, d->a->part);
    else
        show_summary(d, &k);
    cache_kernel_free(&k);
    return rc;
}
