#include "tools/dump_cmd.h"

#include <stdio.h>
#include <time.h>

#include "codegen/nvrtc_drv.h"
#include "tools/cli.h"

const char *dump_cmd_bytes(long long n, char buf[32])
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%lld B", n);
    else
        snprintf(buf, 32, "%.1f %s", v, units[u]);
    return buf;
}

const char *dump_cmd_when(long long t, char buf[32])
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (t <= 0 || !localtime_r(&tt, &tm) || !strftime(buf, 32, "%Y-%m-%d %H:%M:%S", &tm))
        snprintf(buf, 32, "-");
    return buf;
}

void dump_cmd_doc(json_out *o, const char *cache_path, const char *list_name)
{
    json_out_init(o, stdout, 1);
    json_begin_object(o);
    json_key(o, "cache");
    json_string(o, cache_path);
    json_key(o, "stof_version");
    json_string(o, stof_version());
    json_key(o, "nvrtc_version");
    json_string(o, nvrtc_version_string());
    if (list_name) {
        json_key(o, list_name);
        json_begin_array(o);
    }
}

int dump_cmd_fail(const dump_cmd *d, const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", DUMP_PROG, what, d->err.msg);
    return CLI_EXIT_USAGE;
}
