/*
 * stof-warm — fills the kernel cache ahead of production, so that it never
 * waits for NVRTC or for tuning. It reads workload files (and --mha, --ln,
 * --decoder and --decode one-liners), then plans every case on the GPU(s), or, with no GPU,
 * compiles the model's first choices for a named architecture.
 *
 * Processes: the parent never touches CUDA (a forked child could not use
 * it afterwards). A probe child opens the library once to check the arch,
 * the devices, the cache and every mask; then one worker per job or device
 * takes the cases i with i % workers == its number and reports each over a
 * pipe. The cache is shared safely (WAL, one transaction per write), so
 * finished work survives an interrupt and a second run resumes.
 *
 * With a remote tier (STOF_REMOTE_CACHE), every worker asks it before
 * compiling and stores what it compiles there too; --remote then pushes the
 * whole warmed cache into it, from the parent, after the workers are done.
 *
 * Exit status (cli.h): 0 all done, 1 some cases failed (or the push did not
 * finish; a case whose work the cache did not store has failed), 2 bad
 * arguments, workload or cache (a cache found damaged during the run too:
 * the workers stop), 130 interrupted.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache_admin.h"
#include "cache/remote.h"
#include "cache/trust.h"
#include "codegen/nvrtc_drv.h"
#include "stof.h"
#include "tools/cli.h"
#include "tools/workload.h"

#define MAX_DEVICES 64
#define MAX_WORKERS 256
#define MSG_MAX 3800          /* one report stays below PIPE_BUF: writes are atomic */

static const char USAGE[] =
    "usage: stof-warm [--cache PATH] [--arch sm_90a] [--compile-only] [--tune off|fast|full]\n"
    "                 [--devices 0,1,...] [--jobs N] [--quiet]\n"
    "                 [--mha \"b=8,h=12,l=2048,d=64,fp16,window:256\"]...\n"
    "                 [--ln \"rows=16384,hidden=768,fp16\"]...\n"
    "                 [--decoder \"b=1,s=4096,hidden=4096,h=32,kv=8,ffn=14336,bf16,causal\"]...\n"
    "                 [--decode \"b=8,h=32,kv=8,d=128,cache=32768,new=1,bf16,causal\"]...\n"
    "                 [--remote[=URL]] [WORKLOAD.json]...\n"
    "Plans every case on the GPU so that production finds it in the cache; with no GPU,\n"
    "--arch (with --compile-only) compiles the model's first choices for that GPU.\n"
    "--devices: one worker per GPU; --jobs: N worker processes. Ctrl-C finishes the\n"
    "current cases (twice: abandons them); run again to resume.\n"
    "--remote: then push the whole cache (signed) into the Redis tier at URL, else\n"
    "$STOF_REMOTE_CACHE; with no cases, only push. The key: $STOF_REMOTE_CACHE_KEY or\n"
    "$STOF_REMOTE_CACHE_KEY_FILE.\n";

typedef struct options {
    const char *cache, *arch, *remote_url;
    int compile_only, quiet, jobs, push;
    stof_tune tune;
    int devices[MAX_DEVICES], ndevices;
    workload w;
    char cache_path[4096];
} options;

/* What the probe child found out, and the mode it settled. */
typedef struct preflight {
    int code;                    /* 0 go, CLI_EXIT_USAGE stop */
    int has_device, compile_only;
    char arch[32], device[512]; /* the GPU's name, or why there is none */
    char note[1024];             /* said before the work */
    char remote_note[1500];      /* what the remote tier said at open */
    char msg[3000];              /* why it stops */
} preflight;

typedef enum outcome {
    OUT_PENDING, OUT_RUNNING, OUT_HIT, OUT_COMPILED, OUT_TUNED, OUT_FAILED, OUT_NOT_RUN
} outcome;

typedef struct case_state {
    outcome out;
    int worker;
    long long compiles;
    long long remote[5];         /* hits, misses, refused, written, errors */
    double nvrtc_ms, secs;
    char *reason;
} case_state;

typedef struct run_state {
    const options *o;
    case_state *cs;
    int total, done, current, nworkers;
    pid_t pids[MAX_WORKERS];
    int tty, forwarded, abandoned;
    double start, last_draw;
    long long compiles;
    double nvrtc_ms;
    long long remote[5];
    char *cache_lost;            /* why a worker's cache went off (damaged), or NULL */
} run_state;

static volatile sig_atomic_t g_interrupts;
static volatile sig_atomic_t g_worker_stop;

static void on_parent_sigint(int sig)
{
    (void)sig;
    g_interrupts++;
}

static void on_worker_sigint(int sig)
{
    (void)sig;
    g_worker_stop = 1;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char PROG[] = "stof-warm";

static void usage(FILE *f) { fputs(USAGE, f); }

/* ---- arguments ---- */

static void parse_devices(options *o, const char *s)
{
    o->ndevices = 0;
    for (const char *p = s; *p;) {
        char *end;
        long d = strtol(p, &end, 10);
        if (end == p || d < 0 || d > 255 || (*end && *end != ',') || o->ndevices == MAX_DEVICES)
            cli_fail(PROG, "--devices wants GPU ordinals such as 0,1,2, not \"%s\"", s);
        for (int i = 0; i < o->ndevices; i++)
            if (o->devices[i] == d)
                cli_fail(PROG, "--devices lists %ld twice", d);
        o->devices[o->ndevices++] = (int)d;
        p = *end ? end + 1 : end;
        if (*end && !*p)
            cli_fail(PROG, "--devices wants GPU ordinals such as 0,1,2, not \"%s\"", s);
    }
    if (!o->ndevices)
        cli_fail(PROG, "--devices is empty");
}

static void parse_tune(options *o, const char *s)
{
    static const struct { const char *name; stof_tune t; } tunes[] = {
        {"off", STOF_TUNE_OFF}, {"fast", STOF_TUNE_FAST}, {"full", STOF_TUNE_FULL}};
    for (int i = 0; i < 3; i++) {
        if (strcmp(s, tunes[i].name) == 0) {
            o->tune = tunes[i].t;
            return;
        }
    }
    cli_fail(PROG, "--tune wants off, fast or full, not \"%s\"", s);
}

static void parse_jobs(options *o, const char *s)
{
    char *end;
    long n = strtol(s, &end, 10);
    if (end == s || *end || n < 1 || n > MAX_WORKERS)
        cli_fail(PROG, "--jobs wants a number from 1 to %d, not \"%s\"", MAX_WORKERS, s);
    o->jobs = (int)n;
}

/* One of stof-warm's own options; cases from --mha, --ln, --decoder and --decode go straight into
 * o->w, as workload files do, in the order given. */
static void take_option(options *o, const char *opt, const char *v)
{
    char err[1024];
    if (strcmp(opt, "--compile-only") == 0) {
        o->compile_only = 1;
    } else if (strcmp(opt, "--quiet") == 0) {
        o->quiet = 1;
    } else if (strcmp(opt, "--remote") == 0) {
        /* A flag, or --remote=URL: a separate value would be taken for a file. */
        o->push = 1;
        o->remote_url = v;
        if (v && !*v)
            cli_fail(PROG, "--remote= wants a redis://HOST[:PORT][/DB] address");
    } else if (strcmp(opt, "--tune") == 0) {
        parse_tune(o, v);
    } else if (strcmp(opt, "--devices") == 0) {
        parse_devices(o, v);
    } else if (strcmp(opt, "--jobs") == 0) {
        parse_jobs(o, v);
    } else if (strcmp(opt, "--mha") == 0) {
        if (workload_add_mha(&o->w, v, err, sizeof err) != 0)
            cli_fail(PROG, "%s", err);
    } else if (strcmp(opt, "--decoder") == 0) {
        if (workload_add_decoder(&o->w, v, err, sizeof err) != 0)
            cli_fail(PROG, "%s", err);
    } else if (strcmp(opt, "--decode") == 0) {
        if (workload_add_decode(&o->w, v, err, sizeof err) != 0)
            cli_fail(PROG, "%s", err);
    } else if (workload_add_ln(&o->w, v, err, sizeof err) != 0) {
        cli_fail(PROG, "%s", err);
    }
}

/* Exits with CLI_EXIT_USAGE on a bad command line or workload. */
static void parse_args(options *o, int argc, char **argv)
{
    static const cli_option own[] = {
        {"--compile-only", CLI_FLAG}, {"--quiet", CLI_FLAG}, {"--remote", CLI_OPTIONAL},
        {"--tune", CLI_VALUE},        {"--devices", CLI_VALUE}, {"--jobs", CLI_VALUE},
        {"--mha", CLI_VALUE},         {"--ln", CLI_VALUE},      {"--decoder", CLI_VALUE},
        {"--decode", CLI_VALUE},      {NULL, 0}};
    char err[2048];
    cli c;
    cli_begin(&c, PROG, usage, CLI_CACHE | CLI_ARCH | CLI_OPERANDS, argc, argv);
    const char *opt, *val;
    while (cli_next(&c, own, &opt, &val)) {
        if (opt) {
            take_option(o, opt, val);
        } else if (workload_read_file(&o->w, val, err, sizeof err) != 0) {
            fprintf(stderr, "%s: %s\n", PROG, err);
            exit(CLI_EXIT_USAGE);
        }
    }
    cli_end(&c);
    o->cache = c.o.cache;
    o->arch = c.o.arch_given ? c.o.arch : NULL;
    if (o->w.n == 0 && !o->push)
        cli_fail(PROG, "nothing to warm: give a workload file, --mha, --ln, --decoder or "
                       "--decode (or --remote to push the cache as it is)");
    if (o->push && !o->remote_url && !remote_config_resolve(NULL, 0, &(remote_config){0}))
        cli_fail(PROG, "--remote: no Redis tier named: set STOF_REMOTE_CACHE or pass "
                       "--remote=redis://HOST[:PORT][/DB]");
    if (!o->ndevices) {
        o->devices[0] = 0;
        o->ndevices = 1;
    }
    if (o->cache)
        snprintf(o->cache_path, sizeof o->cache_path, "%s", o->cache);
    else if (!cache_admin_default_path(o->cache_path, sizeof o->cache_path))
        cli_fail(PROG, "no cache to warm: STOF_CACHE is off and there is no home folder; pass "
                       "--cache PATH");
}

/* ---- the probe child ---- */

/* Settles compile-only or planning from what the machine has. */
static void decide_mode(const options *o, preflight *p, const char *why_no_gpu)
{
    p->compile_only = o->compile_only;
    if (!p->has_device && !o->arch) {
        p->code = CLI_EXIT_USAGE;
        snprintf(p->msg, sizeof p->msg,
                 "no GPU can be used here (%.1000s); to compile without one, name the GPU it is "
                 "for: pass --arch (e.g. --arch sm_90a) with --compile-only",
                 why_no_gpu);
        return;
    }
    if (!p->has_device && !o->compile_only) {
        p->compile_only = 1;
        snprintf(p->note, sizeof p->note, "no GPU here: compiling only, for %s", o->arch);
    } else if (o->arch && !o->compile_only && strcmp(o->arch, p->arch) != 0) {
        p->compile_only = 1;
        snprintf(p->note, sizeof p->note, "--arch %s is not this GPU's: compiling only", o->arch);
    }
    if (p->compile_only && o->tune != STOF_TUNE_DEFAULT && !p->note[0])
        snprintf(p->note, sizeof p->note, "--tune has no effect when compiling only");
}

/* Every listed device must be usable when planning on GPUs. */
static int check_devices(const options *o, preflight *p)
{
    for (int i = 1; i < o->ndevices; i++) {
        stof_options so = {.device = o->devices[i], .no_cache = 1};
        stof_ctx *ctx = NULL;
        int has = 0;
        char why[600] = ""; /* with no GPU, the name says why */
        if (stof_open(&ctx, &so) == STOF_OK)
            stof_device_info(ctx, &has, NULL, 0, why, sizeof why);
        if (!has)
            snprintf(p->msg, sizeof p->msg, "device %d cannot be used: %.2000s", o->devices[i],
                     ctx ? why : stof_last_error(NULL));
        stof_close(ctx);
        if (!has)
            return 0;
    }
    return 1;
}

/* Opening with --arch is what checks that NVRTC knows the arch. */
static int check_arch(const options *o, preflight *p)
{
    stof_options so = {.device = o->devices[0], .no_cache = 1, .arch = o->arch};
    stof_ctx *ctx = NULL;
    if (!o->arch)
        return 1;
    if (stof_open(&ctx, &so) != STOF_OK) {
        snprintf(p->msg, sizeof p->msg, "--arch %s: %.2900s", o->arch, stof_last_error(NULL));
        return 0;
    }
    stof_close(ctx);
    return 1;
}

static void preflight_run(const options *o, preflight *p)
{
    stof_options so = {.device = o->devices[0], .no_cache = 1};
    stof_ctx *ctx = NULL;
    p->code = CLI_EXIT_USAGE;
    if (stof_open(&ctx, &so) != STOF_OK) {
        snprintf(p->msg, sizeof p->msg, "%s", stof_last_error(NULL));
        return;
    }
    /* Without options.arch, the arch is the device's own (or ""); without
     * a GPU, the device's name is why there is none. */
    stof_device_info(ctx, &p->has_device, p->arch, sizeof p->arch, p->device, sizeof p->device);
    if (check_arch(o, p)) {
        p->code = 0;
        decide_mode(o, p, p->device);
    }
    if (!p->code && p->compile_only && o->arch)
        snprintf(p->arch, sizeof p->arch, "%s", o->arch);
    if (!p->code && !p->compile_only && !check_devices(o, p))
        p->code = CLI_EXIT_USAGE;
    if (!p->code && workload_check(ctx, &o->w, p->msg, sizeof p->msg) != STOF_OK)
        p->code = CLI_EXIT_USAGE;
    stof_close(ctx);
    if (p->code)
        return;
    /* Last, so that nothing is created when the run cannot start. */
    stof_options co = {.device = o->devices[0], .cache_path = o->cache_path, .arch = o->arch,
                       .remote_cache = o->remote_url};
    ctx = NULL;
    if (stof_open(&ctx, &co) == STOF_OK && !stof_cache_path(ctx)[0]) {
        p->code = CLI_EXIT_USAGE;
        snprintf(p->msg, sizeof p->msg, "the cache cannot be used: %.2900s", stof_last_error(ctx));
    } else if (ctx && strncmp(stof_last_error(ctx), "remote cache", 12) == 0) {
        snprintf(p->remote_note, sizeof p->remote_note, "%s", stof_last_error(ctx));
    }
    stof_close(ctx);
}

static int preflight_fork(const options *o, preflight *p)
{
    int fd[2];
    memset(p, 0, sizeof *p);
    if (pipe(fd) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(fd[0]);
        preflight r = {0};
        preflight_run(o, &r);
        ssize_t w = write(fd[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fd[1]);
    size_t got = 0;
    while (got < sizeof *p) {
        ssize_t n = read(fd[0], (char *)p + got, sizeof *p - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return got == sizeof *p ? 0 : -1;
}

/* ---- workers ---- */

static stof_status run_mha(stof_ctx *ctx, const workload_case *c, stof_tune tune, int compile_only)
{
    stof_mask *m = NULL;
    stof_status st = stof_mask_parse(ctx, c->mask, c->seq_q, c->seq_k, &m);
    if (st != STOF_OK)
        return st;
    stof_mha_desc d;
    workload_mha_desc(c, tune, &d);
    if (compile_only) {
        st = stof_mha_prepare(ctx, &d, m);
    } else {
        stof_mha_plan *plan = NULL;
        st = stof_mha_plan_create(ctx, &d, m, &plan);
        stof_mha_plan_free(plan);
    }
    stof_mask_free(m);
    return st;
}

static stof_status run_layer(stof_ctx *ctx, const workload_case *c, stof_tune tune,
                             int compile_only)
{
    stof_mask *m = NULL;
    stof_status st = stof_mask_parse(ctx, c->mask, c->seq_q, c->seq_k, &m);
    if (st != STOF_OK)
        return st;
    stof_layer_desc d;
    workload_layer_desc(c, tune, &d);
    st = compile_only ? stof_layer_prepare(ctx, &d, m) : stof_layer_tune(ctx, &d, m);
    stof_mask_free(m);
    return st;
}

static stof_status run_decoder(stof_ctx *ctx, const workload_case *c, stof_tune tune,
                               int compile_only)
{
    stof_decoder_desc d;
    workload_decoder_desc(c, tune, &d);
    return compile_only ? stof_decoder_prepare(ctx, &d) : stof_decoder_tune(ctx, &d);
}

/* A decoding step's plan: its two kernels (no search, no timing), then freed. */
static stof_status run_decode(stof_ctx *ctx, const workload_case *c, int compile_only)
{
    stof_decode_desc d;
    workload_decode_desc(c, &d);
    if (compile_only)
        return stof_decode_prepare(ctx, &d);
    stof_decode_plan *plan = NULL;
    stof_status st = stof_decode_plan_create(ctx, &d, &plan);
    stof_decode_plan_free(plan);
    return st;
}

static stof_status run_case(stof_ctx *ctx, const workload_case *c, stof_tune tune,
                            int compile_only)
{
    if (c->op == WORKLOAD_MHA)
        return run_mha(ctx, c, tune, compile_only);
    if (c->op == WORKLOAD_LAYER)
        return run_layer(ctx, c, tune, compile_only);
    if (c->op == WORKLOAD_DECODER)
        return run_decoder(ctx, c, tune, compile_only);
    if (c->op == WORKLOAD_DECODE)
        return run_decode(ctx, c, compile_only);
    stof_ln_desc d;
    workload_ln_desc(c, &d);
    return stof_bias_residual_layernorm_prepare(ctx, &d);
}

static void send_msg(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void send_msg(int fd, const char *fmt, ...)
{
    char buf[MSG_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf)
        n = (int)sizeof buf - 1;
    buf[n - 1] = '\n';
    ssize_t w;
    do
        w = write(fd, buf, (size_t)n);
    while (w < 0 && errno == EINTR);
}

/* The reason on one line: newlines become \x1f, other controls spaces. */
static void one_line(const char *in, char *out, size_t n)
{
    size_t i = 0;
    for (; *in && i + 1 < n; in++)
        out[i++] = *in == '\n' ? '\x1f' : (unsigned char)*in < 0x20 ? ' ' : *in;
    out[i] = 0;
}

static void report_case(int fd, stof_ctx *ctx, int i, stof_status st, const stof_stats *a,
                        const stof_stats *b, double secs)
{
    char why[MSG_MAX - 200] = "";
    long long unstored = b->cache_write_failures - a->cache_write_failures;
    if (st != STOF_OK) {
        char raw[sizeof why];
        if (st == STOF_ERR_CACHE && unstored > 0)
            snprintf(raw, sizeof raw, "%s: %lld cache write%s failed (the work is done but not "
                     "kept): %s", stof_status_str(st), unstored, unstored == 1 ? "" : "s",
                     stof_last_error(ctx));
        else
            snprintf(raw, sizeof raw, "%s: %s", stof_status_str(st), stof_last_error(ctx));
        one_line(raw, why, sizeof why);
    }
    send_msg(fd, "D %d %d %lld %.3f %lld %.3f %lld %lld %lld %lld %lld %s\n", i, (int)st,
             b->nvrtc_compiles - a->nvrtc_compiles, b->nvrtc_ms - a->nvrtc_ms,
             b->timing_runs - a->timing_runs, secs, b->remote_hits - a->remote_hits,
             b->remote_misses - a->remote_misses, b->remote_rejects - a->remote_rejects,
             b->remote_writes - a->remote_writes, b->remote_errors - a->remote_errors, why);
}

static void worker_main(const options *o, const preflight *p, int w, int nworkers, int fd)
{
    struct sigaction sa = {.sa_handler = on_worker_sigint};
    sigaction(SIGINT, &sa, NULL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    stof_options so = {.device = o->devices[w % o->ndevices], .cache_path = o->cache_path,
                       .arch = p->compile_only ? p->arch : o->arch, .remote_cache = o->remote_url};
    stof_ctx *ctx = NULL;
    stof_status open_st = stof_open(&ctx, &so);
    /* Counts since the context's birth, so that what stof_open did (a remote
     * tier refusing to connect) is in the first case's share. */
    stof_stats seen = {0};
    const int cached = open_st == STOF_OK && stof_cache_path(ctx)[0];
    for (int i = w; i < o->w.n && !g_worker_stop; i += nworkers) {
        send_msg(fd, "S %d\n", i);
        stof_stats a = seen, b = seen;
        double t0 = now();
        stof_status st = open_st;
        if (st == STOF_OK) {
            st = run_case(ctx, &o->w.cases[i], o->tune, p->compile_only);
            stof_get_stats(ctx, &b);
            seen = b;
        }
        /* The work is done but not kept: the case has failed. A cache that
         * went off was found damaged, and stops the run. */
        const int lost = cached && !stof_cache_path(ctx)[0];
        if (st == STOF_OK && (lost || b.cache_write_failures > a.cache_write_failures))
            st = STOF_ERR_CACHE;
        report_case(fd, ctx, i, st, &a, &b, now() - t0);
        if (lost) {
            char why[MSG_MAX - 200];
            one_line(stof_last_error(ctx), why, sizeof why);
            send_msg(fd, "K %s\n", why);
            break;
        }
    }
    stof_close(ctx);
    close(fd);
    _exit(0);
}

/* ---- progress ---- */

static const char *clock_str(double s, char buf[32])
{
    long t = s > 0 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, 32, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, 32, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

static const char *outcome_name(outcome o)
{
    static const char *const names[] = {"pending", "running", "cache hit", "compiled",
                                        "tuned",   "FAILED",  "not run"};
    return names[o];
}

/* "0:42 elapsed, ~1:25 left" */
static void times(const run_state *r, char *out, size_t n)
{
    char a[32], b[32];
    double el = now() - r->start;
    if (r->done > 0 && r->done < r->total)
        snprintf(out, n, "%s elapsed, ~%s left", clock_str(el, a),
                 clock_str(el / r->done * (r->total - r->done), b));
    else
        snprintf(out, n, "%s elapsed", clock_str(el, a));
}

static int term_width(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20)
        return ws.ws_col;
    return 80;
}

static void draw_status(run_state *r)
{
    if (!r->tty || r->o->quiet)
        return;
    char t[96], line[1024];
    times(r, t, sizeof t);
    const char *cur = r->current >= 0 ? r->o->w.cases[r->current].name : "starting";
    snprintf(line, sizeof line, "[%d/%d] %3d%%  %s  %s", r->done, r->total,
             r->total ? 100 * r->done / r->total : 100, t, cur);
    int w = term_width() - 1;
    fprintf(stderr, "\r\033[K%.*s", w, line);
    fflush(stderr);
    r->last_draw = now();
}

/* A finished case: a line of its own (on a terminal, above the status). */
static void print_done(run_state *r, int i)
{
    const case_state *c = &r->cs[i];
    if (r->o->quiet || (r->tty && c->out != OUT_FAILED))
        return;
    char t[96], why[256] = "";
    times(r, t, sizeof t);
    if (c->out == OUT_FAILED && c->reason)
        snprintf(why, sizeof why, ": %.*s", (int)strcspn(c->reason, "\x1f"), c->reason);
    else if (c->compiles)
        snprintf(why, sizeof why, " (%lld kernel%s, %.2f s)", c->compiles,
                 c->compiles == 1 ? "" : "s", c->secs);
    fprintf(stderr, "%s[%d/%d] %s: %s%s  (%s)\n", r->tty ? "\r\033[K" : "", r->done, r->total,
            r->o->w.cases[i].name, outcome_name(c->out), why, t);
}

/* ---- the parent ---- */

static outcome classify(int status, long long compiles, long long timings)
{
    if (status != STOF_OK)
        return OUT_FAILED;
    if (timings > 0)
        return OUT_TUNED;
    return compiles > 0 ? OUT_COMPILED : OUT_HIT;
}

static char *restore_lines(const char *s)
{
    char *d = strdup(s);
    for (char *p = d; p && *p; p++)
        if (*p == '\x1f')
            *p = '\n';
    return d;
}

static void signal_workers(run_state *r, int sig);

static void handle_msg(run_state *r, char *line)
{
    int i, status, used = 0;
    long long compiles, timings;
    double ms, secs;
    if (strncmp(line, "K ", 2) == 0) {
        /* The cache is damaged: the other workers finish their cases. */
        if (!r->cache_lost) {
            r->cache_lost = restore_lines(line + 2);
            signal_workers(r, SIGINT);
        }
        return;
    }
    if (sscanf(line, "S %d", &i) == 1 && i >= 0 && i < r->total) {
        r->cs[i].out = OUT_RUNNING;
        r->current = i;
        draw_status(r);
        return;
    }
    long long rem[5];
    if (sscanf(line, "D %d %d %lld %lf %lld %lf %lld %lld %lld %lld %lld %n", &i, &status,
               &compiles, &ms, &timings, &secs, &rem[0], &rem[1], &rem[2], &rem[3], &rem[4],
               &used) < 11 || i < 0 || i >= r->total)
        return;
    case_state *c = &r->cs[i];
    for (int k = 0; k < 5; k++) {
        c->remote[k] = rem[k];
        r->remote[k] += rem[k];
    }
    c->out = classify(status, compiles, timings);
    c->compiles = compiles;
    c->nvrtc_ms = ms;
    c->secs = secs;
    if (c->out == OUT_FAILED)
        c->reason = restore_lines(used ? line + used : "");
    r->compiles += compiles;
    r->nvrtc_ms += ms;
    r->done++;
    print_done(r, i);
    draw_status(r);
}

/* Splits what arrived into lines; keeps a partial line for later. */
static void drain(run_state *r, int fd, char *buf, size_t *fill, size_t cap, int *eof)
{
    ssize_t n = read(fd, buf + *fill, cap - *fill - 1);
    if (n == 0)
        *eof = 1;
    if (n <= 0)
        return;
    *fill += (size_t)n;
    buf[*fill] = 0;
    char *start = buf, *nl;
    while ((nl = strchr(start, '\n'))) {
        *nl = 0;
        handle_msg(r, start);
        start = nl + 1;
    }
    *fill = strlen(start);
    memmove(buf, start, *fill + 1);
    if (*fill == cap - 1)
        *fill = 0;  /* a line longer than any report: drop it */
}

static void signal_workers(run_state *r, int sig)
{
    for (int w = 0; w < r->nworkers; w++)
        if (r->pids[w] > 0)
            kill(r->pids[w], sig);
}

static void on_interrupts(run_state *r)
{
    if (g_interrupts >= 1 && !r->forwarded) {
        r->forwarded = 1;
        signal_workers(r, SIGINT);
        if (!r->o->quiet)
            fprintf(stderr, "%sstof-warm: interrupted: finishing the current case%s "
                            "(Ctrl-C again abandons %s)\n",
                    r->tty ? "\r\033[K" : "", r->nworkers > 1 ? "s" : "",
                    r->nworkers > 1 ? "them" : "it");
    }
    if (g_interrupts >= 2 && !r->abandoned) {
        r->abandoned = 1;
        signal_workers(r, SIGTERM);
    }
}

static void collect(run_state *r, int fd)
{
    char buf[4 * MSG_MAX];
    size_t fill = 0;
    int eof = 0;
    while (!eof) {
        on_interrupts(r);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, 500);
        if (n > 0)
            drain(r, fd, buf, &fill, sizeof buf, &eof);
        if (r->tty && now() - r->last_draw > 0.5)
            draw_status(r);
    }
}

/* A worker that died leaves its running case failed (or abandoned). */
static void reap(run_state *r)
{
    for (int w = 0; w < r->nworkers; w++) {
        int st = 0;
        while (waitpid(r->pids[w], &st, 0) < 0 && errno == EINTR)
            ;
        int died = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        for (int i = w; i < r->total; i += r->nworkers) {
            case_state *c = &r->cs[i];
            if (c->out == OUT_RUNNING && died && !r->abandoned) {
                char why[128];
                snprintf(why, sizeof why, "the worker process died (%s %d) during this case",
                         WIFSIGNALED(st) ? "signal" : "status",
                         WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
                c->out = OUT_FAILED;
                c->reason = strdup(why);
            } else if (c->out == OUT_RUNNING || c->out == OUT_PENDING) {
                c->out = OUT_NOT_RUN;
            }
        }
    }
}

static int spawn_workers(run_state *r, const preflight *p, int fd[2])
{
    fflush(NULL);
    for (int w = 0; w < r->nworkers; w++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "stof-warm: fork: %s\n", strerror(errno));
            signal_workers(r, SIGTERM);
            r->nworkers = w;
            return -1;
        }
        if (pid == 0) {
            close(fd[0]);
            worker_main(r->o, p, w, r->nworkers, fd[1]);
        }
        r->pids[w] = pid;
    }
    close(fd[1]);
    return 0;
}

/* ---- the summary ---- */

/* What stof-dump recover does, after the command that a cache SQLite finds
 * damaged is given (the library's sentence names it too). */
static const char RECOVER_HOW[] =
    "  copies every entry whose checksum holds into NEW.db and lists what was lost;\n"
    "  then put NEW.db in the cache's place (removing the old file's -wal and -shm) and warm "
    "again\n";

static void count(const run_state *r, int n[7])
{
    memset(n, 0, 7 * sizeof *n);
    for (int i = 0; i < r->total; i++)
        n[r->cs[i].out]++;
}

static void print_failures(const run_state *r)
{
    for (int i = 0; i < r->total; i++) {
        const case_state *c = &r->cs[i];
        if (c->out != OUT_FAILED)
            continue;
        printf("  FAILED %s (%s):\n", r->o->w.cases[i].name, r->o->w.cases[i].origin);
        const char *s = c->reason ? c->reason : "";
        for (int line = 0; *s && line < 6; line++) {
            size_t len = strcspn(s, "\n");
            printf("    %.*s\n", (int)len, s);
            s += len + (s[len] == '\n');
        }
    }
}

static int summary(const run_state *r, const preflight *p)
{
    int n[7];
    count(r, n);
    char t[32];
    if (r->tty && !r->o->quiet)
        fprintf(stderr, "\r\033[K");
    printf("stof-warm: %d case%s in %s: %d cache hit%s, %d compiled, %d tuned, %d failed", r->total,
           r->total == 1 ? "" : "s", clock_str(now() - r->start, t), n[OUT_HIT],
           n[OUT_HIT] == 1 ? "" : "s", n[OUT_COMPILED], n[OUT_TUNED], n[OUT_FAILED]);
    if (n[OUT_NOT_RUN])
        printf(", %d not run", n[OUT_NOT_RUN]);
    printf("\n  NVRTC: %lld kernel%s, %.2f s; %s %s; cache %s\n", r->compiles,
           r->compiles == 1 ? "" : "s", r->nvrtc_ms / 1000.0,
           p->compile_only ? "compiled only, for" : "planned on", p->compile_only ? p->arch : p->device,
           r->o->cache_path);
    if (r->o->push || remote_config_resolve(NULL, 0, &(remote_config){0}))
        printf("  remote tier: %lld hit%s, %lld miss%s, %lld refused, %lld written, %lld failed "
               "exchange%s\n", r->remote[0], r->remote[0] == 1 ? "" : "s", r->remote[1],
               r->remote[1] == 1 ? "" : "es", r->remote[2], r->remote[3], r->remote[4],
               r->remote[4] == 1 ? "" : "s");
    print_failures(r);
    if (r->cache_lost) {
        fflush(stdout);
        fprintf(stderr, "stof-warm: stopped: %s\n%s", r->cache_lost, RECOVER_HOW);
        return CLI_EXIT_USAGE;
    }
    if (g_interrupts) {
        printf("  interrupted: %d case%s not run; run the same command again to resume "
               "(finished cases are cache hits)\n", n[OUT_NOT_RUN], n[OUT_NOT_RUN] == 1 ? "" : "s");
        return CLI_EXIT_INTERRUPTED;
    }
    return n[OUT_FAILED] ? CLI_EXIT_FAILED : 0;
}

static void announce(const run_state *r, const preflight *p)
{
    int ops[WORKLOAD_DECODE + 1] = {0};
    for (int i = 0; i < r->total; i++)
        ops[r->o->w.cases[i].op]++;
    if (r->o->quiet)
        return;
    if (p->note[0])
        fprintf(stderr, "stof-warm: %s\n", p->note);
    if (p->remote_note[0])
        fprintf(stderr, "stof-warm: %s\n", p->remote_note);
    char decode[48] = "";  /* named where there are some: the line stays as it was */
    if (ops[WORKLOAD_DECODE])
        snprintf(decode, sizeof decode, ", %d decode", ops[WORKLOAD_DECODE]);
    fprintf(stderr, "stof-warm: %d case%s (%d attention, %d layer, %d decoder, %d layernorm%s); "
                    "%s %s; %d worker%s; cache %s\n",
            r->total, cli_s(r->total), ops[WORKLOAD_MHA], ops[WORKLOAD_LAYER],
            ops[WORKLOAD_DECODER], ops[WORKLOAD_LN], decode,
            p->compile_only ? "compiling only, for" : "planning on", p->compile_only ? p->arch : p->device,
            r->nworkers, cli_s(r->nworkers), r->o->cache_path);
}

static int warm(const options *o, const preflight *p)
{
    run_state r = {.o = o, .total = o->w.n, .current = -1};
    r.cs = calloc((size_t)r.total, sizeof *r.cs);
    if (!r.cs) {
        fprintf(stderr, "stof-warm: out of memory\n");
        return CLI_EXIT_FAILED;
    }
    int want = o->jobs > o->ndevices ? o->jobs : o->ndevices;
    r.nworkers = want < r.total ? want : r.total;
    r.tty = isatty(STDERR_FILENO);
    announce(&r, p);
    struct sigaction sa = {.sa_handler = on_parent_sigint};
    sigaction(SIGINT, &sa, NULL);
    int fd[2];
    r.start = now();
    if (pipe(fd) != 0 || spawn_workers(&r, p, fd) != 0) {
        reap(&r);
        free(r.cs);
        return CLI_EXIT_FAILED;
    }
    draw_status(&r);
    collect(&r, fd[0]);
    close(fd[0]);
    reap(&r);
    int rc = summary(&r, p);
    for (int i = 0; i < r.total; i++)
        free(r.cs[i].reason);
    free(r.cs);
    free(r.cache_lost);
    return rc;
}

/* ---- --remote ---- */

/* Pushes the cache into the remote tier. A cache others could write is not
 * spread: signing its kernels would vouch for whatever they put there. */
static int push(const options *o)
{
    char why[1600];
    int shared = cache_shared_from_env();
    if (!cache_trusted(o->cache_path, shared, why, sizeof why)) {
        fprintf(stderr, "stof-warm: --remote: not pushing: %s\n", why);
        return CLI_EXIT_USAGE;
    }
    if (cache_admin_probe(o->cache_path, why, sizeof why) != CACHE_PROBE_OK) {
        fprintf(stderr, "stof-warm: --remote: nothing to push: %s\n", why);
        return CLI_EXIT_USAGE;
    }
    remote_config rc;
    stof_options so = {.remote_cache = o->remote_url};
    remote_config_resolve(&so, shared, &rc);
    rc.nvrtc_version = nvrtc_version_string();
    remote *r = NULL;
    remote_open(&rc, &r, why, sizeof why);
    if (!r) {
        fprintf(stderr, "stof-warm: --remote: %s\n", why);
        return CLI_EXIT_USAGE;
    }
    err_record err = {{0}};
    cache *c = NULL;
    int rc_exit = CLI_EXIT_FAILED;
    cache_push_result res;
    if (cache_open(&err, o->cache_path, 0, nvrtc_version_string(), &c) != STOF_OK ||
        cache_admin_push(&err, c, r, &res) != STOF_OK) {
        fprintf(stderr, "stof-warm: --remote: %s\n", err.msg);
    } else {
        const char *said = remote_take_note(r);
        printf("stof-warm: pushed %lld kernel%s and %lld tuning record%s from %s to %s", res.kernels,
               res.kernels == 1 ? "" : "s", res.tuning, res.tuning == 1 ? "" : "s", o->cache_path,
               remote_name(r));
        if (res.skipped)
            printf("; %lld damaged or stale row%s left out", res.skipped,
                   res.skipped == 1 ? "" : "s");
        printf("\n");
        if (res.failed)
            printf("  %lld row%s not stored: %s\n", res.failed, res.failed == 1 ? "" : "s",
                   said ? said : why[0] ? why : "the remote tier did not take them");
        rc_exit = res.failed ? CLI_EXIT_FAILED : 0;
    }
    cache_close(c);
    remote_close(r);
    return rc_exit;
}

int main(int argc, char **argv)
{
    static options o = {.jobs = 1};
    parse_args(&o, argc, argv);
    int rc = 0;
    char why[1400];
    cache_probe_result probe = cache_admin_probe(o.cache_path, why, sizeof why);
    if (probe == CACHE_PROBE_BAD || probe == CACHE_PROBE_DAMAGED) {
        fprintf(stderr, "stof-warm: %s\n", why);
        if (probe == CACHE_PROBE_DAMAGED)
            fprintf(stderr, "stof-warm: to save what is intact: stof-dump --cache '%s' recover "
                            "NEW.db\n%s", o.cache_path, RECOVER_HOW);
        rc = CLI_EXIT_USAGE;
    }
    static preflight p;
    if (!rc && o.w.n && preflight_fork(&o, &p) != 0) {
        fprintf(stderr, "stof-warm: the preflight check could not run: %s\n", strerror(errno));
        rc = CLI_EXIT_USAGE;
    }
    if (!rc && p.code) {
        fprintf(stderr, "stof-warm: %s\n", p.msg);
        rc = p.code;
    }
    if (!rc && o.w.n)
        rc = warm(&o, &p);
    if (!rc && o.push)
        rc = push(&o);
    workload_free(&o.w);
    return rc;
}
