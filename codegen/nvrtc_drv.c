#include "codegen/nvrtc_drv.h"

#include <ctype.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/now.h"

/* ptxas -v puts each kernel's registers and spills in the compile log;
 * -lineinfo (on request) keeps source lines in SASS for a profiler. */
#define OPT_STD "-std=c++17"
#define OPT_VERBOSE "--ptxas-options=-v"
#define OPT_LINEINFO "-lineinfo"
static const char *const OPTS[] = {OPT_STD, OPT_VERBOSE, OPT_LINEINFO};
#define NOPTS (int)(sizeof OPTS / sizeof OPTS[0])

static int lineinfo(void)
{
    const char *e = getenv("STOF_LINEINFO");
    return e && *e && strcmp(e, "0") != 0;
}

const char *nvrtc_options(void)
{
    return lineinfo() ? OPT_STD " " OPT_VERBOSE " " OPT_LINEINFO : OPT_STD " " OPT_VERBOSE;
}

const char *nvrtc_version_string(void)
{
    static char v[32];
    int major = 0, minor = 0;
    if (!v[0]) {
        if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS)
            return "unknown";
        snprintf(v, sizeof v, "%d.%d", major, minor);
    }
    return v;
}

/* "sm_" then 2 or 3 digits then an optional "a", and nothing else. */
static int parse_arch(const char *arch, int *num, int *specific)
{
    if (!arch || strncmp(arch, "sm_", 3) != 0)
        return 0;
    const char *p = arch + 3;
    int digits = 0;
    *num = 0;
    while (isdigit((unsigned char)*p) && digits < 4) {
        *num = *num * 10 + (*p++ - '0');
        digits++;
    }
    *specific = *p == 'a';
    if (*specific)
        p++;
    return digits >= 2 && digits <= 3 && *p == 0;
}

stof_status nvrtc_check_arch(err_record *err, const char *arch)
{
    int n = 0, want = 0, specific = 0;
    if (!parse_arch(arch, &want, &specific))
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG,
                        "unknown architecture \"%s\": expected sm_NN or sm_NNa, e.g. sm_90a",
                        arch ? arch : "(null)");
    /* Arch-specific targets ("a") begin with Hopper. */
    if (specific && want < 90)
        return ERR_FAIL(err, STOF_ERR_INVALID_ARG,
                        "architecture %s does not exist: only sm_90 and newer have an \"a\" variant",
                        arch);
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 || n > 256)
        return ERR_FAIL(err, STOF_ERR_COMPILE, "nvrtcGetNumSupportedArchs failed");
    int archs[256];
    if (nvrtcGetSupportedArchs(archs) != NVRTC_SUCCESS)
        return ERR_FAIL(err, STOF_ERR_COMPILE, "nvrtcGetSupportedArchs failed");
    for (int i = 0; i < n; i++)
        if (archs[i] == want)
            return want >= 80 ? STOF_OK
                              : ERR_FAIL(err, STOF_ERR_UNSUPPORTED,
                                         "architecture %s: stof needs sm_80 or newer", arch);
    return ERR_FAIL(err, STOF_ERR_INVALID_ARG, "architecture %s is not one NVRTC %s can compile for",
                    arch, nvrtc_version_string());
}

/* The first lines of a log, for an error message. */
static void log_head(const char *log, char *out, size_t n, int lines)
{
    size_t i = 0;
    for (const char *p = log; *p && i + 1 < n && lines > 0; p++) {
        out[i++] = *p;
        lines -= *p == '\n';
    }
    out[i] = 0;
}

#define NVRTC_TRY(call)                                                                  \
    do {                                                                                 \
        nvrtcResult r_ = (call);                                                         \
        if (r_ != NVRTC_SUCCESS) {                                                       \
            st = ERR_FAIL(err, STOF_ERR_COMPILE, "%s: %s failed: %s", name, #call,      \
                          nvrtcGetErrorString(r_));                                      \
            goto done;                                                                   \
        }                                                                                \
    } while (0)

stof_status nvrtc_compile(err_record *err, const char *name, const char *source, const char *arch,
                          nvrtc_output *out)
{
    memset(out, 0, sizeof *out);
    TRY(nvrtc_check_arch(err, arch));
    stof_status st = STOF_OK;
    nvrtcProgram prog = NULL;
    char archopt[64];
    snprintf(archopt, sizeof archopt, "-arch=%s", arch);
    const char *opts[NOPTS + 1];
    int nopts = lineinfo() ? NOPTS : NOPTS - 1;
    for (int i = 0; i < nopts; i++)
        opts[i] = OPTS[i];
    opts[nopts] = archopt;

    double t0 = now_mono_ms();
    NVRTC_TRY(nvrtcCreateProgram(&prog, source, name, 0, NULL, NULL));
    nvrtcResult cr = nvrtcCompileProgram(prog, nopts + 1, opts);
    size_t logn = 0;
    NVRTC_TRY(nvrtcGetProgramLogSize(prog, &logn));
    if (!(out->log = malloc(logn + 1))) {
        st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory for the compile log");
        goto done;
    }
    out->log[0] = 0;
    if (logn)
        NVRTC_TRY(nvrtcGetProgramLog(prog, out->log));
    out->log[logn] = 0;
    if (cr != NVRTC_SUCCESS) {
        char head[1200];
        log_head(out->log, head, sizeof head, 8);
        st = ERR_FAIL(err, STOF_ERR_COMPILE, "NVRTC could not compile %s for %s (%s):\n%s", name,
                      arch, nvrtcGetErrorString(cr), head);
        goto done;
    }
    NVRTC_TRY(nvrtcGetCUBINSize(prog, &out->cubin_size));
    NVRTC_TRY(nvrtcGetPTXSize(prog, &out->ptx_size));
    out->cubin = malloc(out->cubin_size ? out->cubin_size : 1);
    out->ptx = malloc(out->ptx_size + 1);
    if (!out->cubin || !out->ptx) {
        st = ERR_FAIL(err, STOF_ERR_NO_MEMORY, "out of memory for the compiled %s", name);
        goto done;
    }
    NVRTC_TRY(nvrtcGetCUBIN(prog, out->cubin));
    NVRTC_TRY(nvrtcGetPTX(prog, out->ptx));
    out->ptx[out->ptx_size] = 0;
    /* NVRTC counts the PTX's NUL in its size. */
    out->ptx_size = strlen(out->ptx);
    if (out->cubin_size == 0)
        st = ERR_FAIL(err, STOF_ERR_COMPILE, "NVRTC produced no CUBIN for %s (%s)", name, arch);
done:
    out->ms = now_mono_ms() - t0;
    if (prog)
        nvrtcDestroyProgram(&prog);
    if (st != STOF_OK) {
        /* Keep the log for the caller; drop the rest. */
        char *log = out->log;
        out->log = NULL;
        nvrtc_output_free(out);
        out->log = log;
    }
    return st;
}

void nvrtc_output_free(nvrtc_output *o)
{
    free(o->cubin);
    free(o->ptx);
    free(o->log);
    memset(o, 0, sizeof *o);
}
