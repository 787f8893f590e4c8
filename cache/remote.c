#include "cache/remote.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/now.h"
#include "cache/hmac.h"
#include "cache/trust.h"

#define DEFAULT_TIMEOUT_MS 200
#define DEFAULT_MAX_VALUE_BYTES (64LL << 20) /* 40x the largest kernel value seen (1.6 MB) */
#define RETRY_S 10.0          /* a tier that failed rests this long before a new try */
#define MIN_KEY_BYTES 16
#define MAX_KEY_BYTES 4096

/* A value: MAGIC, a kind byte ('K' kernel, 'T' tuning record), fields each
 * as a 4-byte big-endian length and its bytes, then the HMAC-SHA256 tag over
 * the Redis key (its length first) and everything before the tag. */
static const char MAGIC[8] = {'S', 'T', 'O', 'F', 'R', 'C', '1', '\n'};
#define TAG_BYTES 32
#define KERNEL_FIELDS 15
#define TUNING_FIELDS 9

/* ---- configuration (no hiredis needed) ---- */

static int env_int(const char *name, int fallback)
{
    const char *e = getenv(name);
    char *end;
    long v = e && *e ? strtol(e, &end, 10) : 0;
    return e && *e && !*end && v > 0 && v <= 600000 ? (int)v : fallback;
}

static const char *env_str(const char *name)
{
    const char *e = getenv(name);
    return e && *e ? e : NULL;
}

int remote_config_resolve(const stof_options *o, int shared, remote_config *out)
{
    memset(out, 0, sizeof *out);
    out->url = o && o->remote_cache ? o->remote_cache : env_str("STOF_REMOTE_CACHE");
    if (!out->url || strcmp(out->url, "off") == 0)
        return 0;
    if (o && (o->remote_key || o->remote_key_file)) {
        out->key = o->remote_key;
        out->key_file = o->remote_key ? NULL : o->remote_key_file;
    } else {
        out->key = env_str("STOF_REMOTE_CACHE_KEY");
        out->key_file = out->key ? NULL : env_str("STOF_REMOTE_CACHE_KEY_FILE");
    }
    out->timeout_ms = o && o->remote_timeout_ms > 0
                          ? o->remote_timeout_ms
                          : env_int("STOF_REMOTE_CACHE_TIMEOUT_MS", DEFAULT_TIMEOUT_MS);
    const char *cap = env_str("STOF_REMOTE_CACHE_MAX_BYTES");
    char *end;
    long long v = cap ? strtoll(cap, &end, 10) : 0;
    out->max_value_bytes = cap && !*end && v > 0 ? v : DEFAULT_MAX_VALUE_BYTES;
    out->shared = shared;
    return 1;
}

/* The NVRTC version the process compiles with, as the last remote_open was
 * told (one compiler a process): keys and values carry it, and a value of
 * another is stale. */
static char nvrtc_version[32] = "?";

/* ---- keys ---- */

void remote_kernel_key(const char *key, const char *arch, const char *nvrtc, char *out,
                       size_t n)
{
    snprintf(out, n, "stof:1:kernel:%s:nvrtc-%s:stof-%s:%s", arch, nvrtc,
             stof_version(), key);
}

/* The readable parts name the record for an operator; the digest of every
 * part keeps two records apart whatever their shape strings hold. */
void remote_tuning_key(const char *op, const char *mask_hash, const char *shape,
                       const char *dtype, const char *arch, const char *nvrtc, char *out,
                       size_t n)
{
    const char *parts[] = {op, mask_hash, shape, dtype, arch, nvrtc,
                           stof_version()};
    hash_sha256 h;
    unsigned char d[32];
    char hex[65];
    hash_init(&h);
    for (int i = 0; i < 7; i++)
        hash_update(&h, parts[i], strlen(parts[i]) + 1);
    hash_final(&h, d);
    hash_to_hex(d, hex);
    snprintf(out, n, "stof:1:tuning:%s:nvrtc-%s:stof-%s:%s:%s:%s", arch, nvrtc,
             stof_version(), op, dtype, hex);
}

/* ---- values ---- */

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
    int oom;
} buf;

static void put_bytes(buf *b, const void *data, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n)
            cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_field(buf *b, const void *data, size_t n)
{
    unsigned char len[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16),
                            (unsigned char)(n >> 8), (unsigned char)n};
    if (n > UINT32_MAX) {
        b->oom = 1;
        return;
    }
    put_bytes(b, len, 4);
    put_bytes(b, data, n);
}

static void put_text(buf *b, const char *s)
{
    put_field(b, s ? s : "", s ? strlen(s) : 0);
}

static void sign(const char *rkey, const unsigned char *key, size_t key_len,
                 const unsigned char *body, size_t n, unsigned char tag[TAG_BYTES])
{
    hmac_sha256 m;
    size_t kn = strlen(rkey);
    unsigned char len[4] = {(unsigned char)(kn >> 24), (unsigned char)(kn >> 16),
                            (unsigned char)(kn >> 8), (unsigned char)kn};
    hmac_init(&m, key, key_len);
    hmac_update(&m, len, 4);
    hmac_update(&m, rkey, kn);
    hmac_update(&m, body, n);
    hmac_final(&m, tag);
}

/* Appends the tag (zeros when key is NULL); NULL on out of memory. */
static unsigned char *finish(buf *b, const char *rkey, const unsigned char *key, size_t key_len,
                             size_t *n)
{
    unsigned char tag[TAG_BYTES] = {0};
    if (!b->oom && key)
        sign(rkey, key, key_len, b->p, b->n, tag);
    put_bytes(b, tag, TAG_BYTES);
    if (b->oom) {
        free(b->p);
        return NULL;
    }
    *n = b->n;
    return b->p;
}

unsigned char *remote_encode_kernel(const cache_kernel *k, const unsigned char *key,
                                    size_t key_len, size_t *n)
{
    char rkey[512], ms[64], created[32];
    remote_kernel_key(k->key, k->arch, nvrtc_version, rkey, sizeof rkey);
    snprintf(ms, sizeof ms, "%.17g", k->compile_ms);
    snprintf(created, sizeof created, "%lld", k->created);
    buf b = {0};
    put_bytes(&b, MAGIC, sizeof MAGIC);
    put_bytes(&b, "K", 1);
    const char *txt[] = {k->key, k->op, k->name, k->entry, k->arch,
                         nvrtc_version, stof_version(), k->options, k->params,
                         k->source, k->log};
    for (int i = 0; i < 11; i++)
        put_text(&b, txt[i]);
    put_field(&b, k->cubin, k->cubin_size);
    put_field(&b, k->ptx, k->ptx_size);
    put_text(&b, ms);
    put_text(&b, created);
    return finish(&b, rkey, key, key_len, n);
}

#ifdef STOF_HAVE_HIREDIS

static unsigned char *encode_tuning(const cache_tuning *t, const unsigned char *key,
                                    size_t key_len, size_t *n, char *rkey, size_t rn)
{
    char created[32];
    remote_tuning_key(t->op, t->mask_hash, t->shape, t->dtype, t->arch, nvrtc_version, rkey,
                      rn);
    snprintf(created, sizeof created, "%lld", t->created);
    buf b = {0};
    put_bytes(&b, MAGIC, sizeof MAGIC);
    put_bytes(&b, "T", 1);
    const char *txt[] = {t->op, t->mask_hash, t->shape, t->dtype, t->arch,
                         nvrtc_version, stof_version(), t->record, created};
    for (int i = 0; i < TUNING_FIELDS; i++)
        put_text(&b, txt[i]);
    return finish(&b, rkey, key, key_len, n);
}

typedef struct field {
    const unsigned char *p;
    size_t n;
} field;

/* Verifies the tag and splits the fields. 0 and why when the value is not
 * one this key signed for rkey, or is malformed. */
static int decode(const unsigned char *v, size_t n, const char *rkey, const unsigned char *key,
                  size_t key_len, char kind, field *f, int nf, const char **why)
{
    if (n < sizeof MAGIC + 1 + TAG_BYTES || memcmp(v, MAGIC, sizeof MAGIC) != 0) {
        *why = "not a stof value (damaged, or written by something else)";
        return 0;
    }
    unsigned char tag[TAG_BYTES];
    size_t body = n - TAG_BYTES;
    sign(rkey, key, key_len, v, body, tag);
    if (!hmac_equal(tag, v + body, TAG_BYTES)) {
        *why = "no valid signature (damaged, or written without the key)";
        return 0;
    }
    /* Signed by a holder of the key: what follows is malformed only if a
     * stof of another format wrote it. */
    size_t at = sizeof MAGIC + 1;
    if (v[sizeof MAGIC] != kind) {
        *why = "foreign: a value of another kind";
        return 0;
    }
    for (int i = 0; i < nf; i++) {
        if (body - at < 4) {
            *why = "foreign: a value of another format";
            return 0;
        }
        size_t len = (size_t)v[at] << 24 | (size_t)v[at + 1] << 16 | (size_t)v[at + 2] << 8 |
                     v[at + 3];
        at += 4;
        if (len > body - at) {
            *why = "foreign: a value of another format";
            return 0;
        }
        f[i].p = v + at;
        f[i].n = len;
        at += len;
    }
    if (at != body) {
        *why = "foreign: a value of another format";
        return 0;
    }
    return 1;
}

static int field_is(const field *f, const char *s)
{
    return f->n == strlen(s) && memcmp(f->p, s, f->n) == 0;
}

static char *field_str(const field *f)
{
    char *s = malloc(f->n + 1);
    if (s) {
        memcpy(s, f->p, f->n);
        s[f->n] = 0;
    }
    return s;
}

/* ---- the connection ---- */

#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

struct remote {
    char host[256], user[256], pass[512], name[600];
    int port, db;
    unsigned char key[MAX_KEY_BYTES];
    size_t key_len;
    struct timeval tv;
    long long max_value;    /* longer values are refused unread */
    int timed_out;          /* the last exchange ran past its deadline */
    redisContext *c;
    double rest_until;      /* monotonic seconds: no try before */
    int dead;               /* refused for good (AUTH, SELECT) */
    int outage_said;        /* the current outage has been noted */
    int refusal_said;
    char note[1200];
    int note_pending;
    cache_remote_counts n;
};

static void note(remote *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note(remote *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->note, sizeof r->note, fmt, ap);
    va_end(ap);
    r->note_pending = 1;
}

/* A write to a server that has gone raises SIGPIPE, whose default ends the
 * process: hold it blocked on this thread around every exchange and take
 * back any that the exchange raised. */
typedef struct pipe_guard {
    sigset_t old;
    int was_pending;
} pipe_guard;

static void guard_on(pipe_guard *g)
{
    sigset_t s, pending;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &s, &g->old);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE);
}

static void guard_off(pipe_guard *g)
{
    if (!g->was_pending) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGPIPE);
        struct timespec zero = {0, 0};
        while (sigtimedwait(&s, NULL, &zero) > 0)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* The server did not answer in time, or went away: rest, and say so once
 * per outage. */
static void outage(remote *r, const char *what)
{
    r->n.errors++;
    if (!r->outage_said)
        note(r, "remote cache %s: %s; going on with the local cache alone (tried again in %.0f s)",
             r->name, what, RETRY_S);
    r->outage_said = 1;
    if (r->c)
        redisFree(r->c);
    r->c = NULL;
    r->rest_until = now_mono_s() + RETRY_S;
}

/* Refused for good: a wrong password or database is not going to mend. */
static void refused(remote *r, const char *what, const char *reply)
{
    r->n.errors++;
    note(r, "remote cache %s: %s: %s; the remote tier is off for this process, the local cache "
            "goes on alone", r->name, what, reply);
    if (r->c)
        redisFree(r->c);
    r->c = NULL;
    r->dead = 1;
}

static int is_auth_error(const char *s)
{
    return strncmp(s, "NOAUTH", 6) == 0 || strncmp(s, "WRONGPASS", 9) == 0 ||
           strncmp(s, "NOPERM", 6) == 0 || strstr(s, "invalid password") ||
           strstr(s, "invalid username-password");
}

/* A reply that is an error: the connection went (NULL: an I/O error or a
 * timeout), or the server refused. 1 when the reply can be read. */
static int reply_ok(remote *r, redisReply *y, const char *what)
{
    char msg[300];
    if (!y) {
        const char *e = r->c && r->c->errstr[0] ? r->c->errstr : "no answer";
        if (r->timed_out || strstr(e, "temporarily unavailable") || strstr(e, "timed out"))
            snprintf(msg, sizeof msg, "%s: no answer within %ld ms", what,
                     (long)(r->tv.tv_sec * 1000 + r->tv.tv_usec / 1000));
        else
            snprintf(msg, sizeof msg, "%s: %s", what, e);
        outage(r, msg);
        return 0;
    }
    if (y->type == REDIS_REPLY_ERROR) {
        if (is_auth_error(y->str)) {
            refused(r, what, y->str);
        } else {
            r->n.errors++;
            if (!r->outage_said)
                note(r, "remote cache %s: %s: %s; going on with the local cache", r->name, what,
                     y->str);
            r->outage_said = 1;
        }
        freeReplyObject(y);
        return 0;
    }
    return 1;
}

/* Waits until r's socket is ready for events, or the deadline (monotonic
 * seconds) passes; 0 then, with r->timed_out set. */
static int wait_fd(remote *r, short events, double deadline)
{
    for (;;) {
        double left = deadline - now_mono_s();
        if (left <= 0) {
            r->timed_out = 1;
            return 0;
        }
        struct pollfd p = {.fd = r->c->fd, .events = events};
        int n = poll(&p, 1, (int)(left * 1000.0) + 1);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return 0;
    }
}

/* One command and its whole reply within the timeout, counted from now: the
 * socket's own timeout bounds each read, and a value that trickles in read
 * by read would outlast it many times. NULL when the deadline passed
 * (r->timed_out) or the connection broke (r->c->errstr says how). */
static redisReply *exchange(remote *r, const char *fmt, ...)
{
    r->timed_out = 0;
    double deadline = now_mono_s() + (double)r->tv.tv_sec + (double)r->tv.tv_usec * 1e-6;
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAppendCommand(r->c, fmt, ap);
    va_end(ap);
    if (rc != REDIS_OK)
        return NULL;
    int done = 0;
    while (!done)
        if (!wait_fd(r, POLLOUT, deadline) || redisBufferWrite(r->c, &done) != REDIS_OK)
            return NULL;
    for (;;) {
        void *reply = NULL;
        if (redisGetReplyFromReader(r->c, &reply) != REDIS_OK)
            return NULL;
        if (reply)
            return reply;
        if (!wait_fd(r, POLLIN, deadline) || redisBufferRead(r->c) != REDIS_OK)
            return NULL;
    }
}

/* A connection, made now if there is none and the tier is not resting. */
static int ready(remote *r)
{
    if (r->dead)
        return 0;
    if (r->c)
        return 1;
    if (now_mono_s() < r->rest_until)
        return 0;
    pipe_guard g;
    guard_on(&g);
    int ok = 0;
    r->c = redisConnectWithTimeout(r->host, r->port, r->tv);
    if (!r->c || r->c->err) {
        char msg[300];
        snprintf(msg, sizeof msg, "cannot connect: %s", r->c ? r->c->errstr : "out of memory");
        outage(r, msg);
        goto done;
    }
    redisSetTimeout(r->c, r->tv);
    redisReply *y = NULL;
    if (r->pass[0]) {
        y = r->user[0] ? exchange(r, "AUTH %s %s", r->user, r->pass)
                       : exchange(r, "AUTH %s", r->pass);
        if (y && y->type == REDIS_REPLY_ERROR) {
            refused(r, "AUTH was refused", y->str);
            freeReplyObject(y);
            goto done;
        }
        if (!reply_ok(r, y, "AUTH"))
            goto done;
        freeReplyObject(y);
    } else {
        /* A server that wants a password refuses every command: say so now,
         * at open, rather than turn the tier off at the first GET. */
        y = exchange(r, "PING");
        if (y && y->type == REDIS_REPLY_ERROR && is_auth_error(y->str)) {
            refused(r, "the server wants a password (give it as redis://:PASSWORD@HOST, or "
                       "USER:PASSWORD@)", y->str);
            freeReplyObject(y);
            goto done;
        }
        if (!reply_ok(r, y, "PING"))
            goto done;
        freeReplyObject(y);
    }
    if (r->db) {
        y = exchange(r, "SELECT %d", r->db);
        if (y && y->type == REDIS_REPLY_ERROR) {
            char what[64];
            snprintf(what, sizeof what, "SELECT %d was refused", r->db);
            refused(r, what, y->str);
            freeReplyObject(y);
            goto done;
        }
        if (!reply_ok(r, y, "SELECT"))
            goto done;
        freeReplyObject(y);
    }
    ok = 1;
done:
    guard_off(&g);
    return ok;
}

/* ---- opening ---- */

static int unhex(int c)
{
    return isdigit(c) ? c - '0' : isxdigit(c) ? (tolower(c) - 'a' + 10) : -1;
}

/* Copies n bytes of s, percent-decoded, into out. */
static int decode_part(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%' && i + 2 < n && unhex(s[i + 1]) >= 0 && unhex(s[i + 2]) >= 0) {
            c = unhex(s[i + 1]) * 16 + unhex(s[i + 2]);
            i += 2;
        }
        if (o + 1 >= cap)
            return 0;
        out[o++] = (char)c;
    }
    out[o] = 0;
    return 1;
}

/* redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]; 0 and why when malformed. */
static int parse_url(remote *r, const char *url, char *why, size_t n)
{
    if (strncmp(url, "rediss://", 9) == 0) {
        snprintf(why, n, "TLS (rediss://) is not supported; use redis://");
        return 0;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        snprintf(why, n, "\"%s\" is not a redis://HOST[:PORT][/DB] address", url);
        return 0;
    }
    const char *s = url + 8, *end = s + strcspn(s, "/?#");
    const char *at = NULL;
    for (const char *p = s; p < end; p++)
        if (*p == '@')
            at = p;
    if (at) {
        const char *colon = memchr(s, ':', (size_t)(at - s));
        if (!colon) {
            snprintf(why, n, "write the password as redis://:PASSWORD@HOST (or USER:PASSWORD@)");
            return 0;
        }
        if (!decode_part(s, (size_t)(colon - s), r->user, sizeof r->user) ||
            !decode_part(colon + 1, (size_t)(at - colon - 1), r->pass, sizeof r->pass)) {
            snprintf(why, n, "the user name or password in the address is too long");
            return 0;
        }
        s = at + 1;
    }
    const char *host_end;
    if (*s == '[') {
        host_end = memchr(s, ']', (size_t)(end - s));
        if (!host_end) {
            snprintf(why, n, "\"%s\": an IPv6 address wants a closing ]", url);
            return 0;
        }
        snprintf(r->host, sizeof r->host, "%.*s", (int)(host_end - s - 1), s + 1);
        host_end++;
    } else {
        host_end = s + strcspn(s, ":/?#");
        snprintf(r->host, sizeof r->host, "%.*s", (int)(host_end - s), s);
    }
    r->port = 6379;
    if (host_end < end && *host_end == ':') {
        char *e;
        long p = strtol(host_end + 1, &e, 10);
        if (e != end || p < 1 || p > 65535) {
            snprintf(why, n, "\"%s\": the port is not a number from 1 to 65535", url);
            return 0;
        }
        r->port = (int)p;
    } else if (host_end != end) {
        snprintf(why, n, "\"%s\" is not a redis://HOST[:PORT][/DB] address", url);
        return 0;
    }
    if (!r->host[0]) {
        snprintf(why, n, "\"%s\" names no host", url);
        return 0;
    }
    if (*end == '/' && end[1]) {
        char *e;
        long db = strtol(end + 1, &e, 10);
        if (*e || db < 0 || db > 1000000) {
            snprintf(why, n, "\"%s\": the database is not a number", url);
            return 0;
        }
        r->db = (int)db;
    } else if (*end && strcmp(end, "/") != 0) {
        snprintf(why, n, "\"%s\" is not a redis://HOST[:PORT][/DB] address", url);
        return 0;
    }
    int v6 = strchr(r->host, ':') != NULL;
    snprintf(r->name, sizeof r->name, "redis://%s%s%s%s%s:%d/%d", r->user, r->user[0] ? "@" : "",
             v6 ? "[" : "", r->host, v6 ? "]" : "", r->port, r->db);
    return 1;
}

static int read_key_file(remote *r, const char *path, int shared, char *why, size_t n)
{
    struct stat st;
    char what[PATH_MAX + 64];
    /* Not a plain fopen: a FIFO there would hold stof_open forever. */
    int fd = cache_open_regular(path, what, sizeof what);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f || fstat(fileno(f), &st) != 0) {
        if (fd < 0 && errno == EINVAL)   /* a FIFO, a device or a folder: `what` says which */
            snprintf(why, n, "the key file %.700s", what);
        else
            snprintf(why, n, "cannot read the key file %s: %s", path, strerror(errno));
        if (f)
            fclose(f);
        else if (fd >= 0)
            close(fd);
        return 0;
    }
    if (st.st_mode & (shared ? S_IRWXO : (S_IRWXG | S_IRWXO))) {
        snprintf(why, n,
                 "the key file %s is open to %s (mode %04o): anyone who reads it can sign "
                 "kernels; chmod 600 it",
                 path, shared ? "every user" : "other users", (unsigned)(st.st_mode & 07777));
        fclose(f);
        return 0;
    }
    r->key_len = fread(r->key, 1, sizeof r->key, f);
    int more = fgetc(f) != EOF;
    fclose(f);
    if (more) {
        snprintf(why, n, "the key file %s is longer than %d bytes", path, MAX_KEY_BYTES);
        return 0;
    }
    if (r->key_len && r->key[r->key_len - 1] == '\n')
        r->key_len--;
    if (r->key_len && r->key[r->key_len - 1] == '\r')
        r->key_len--;
    return 1;
}

void remote_open(const remote_config *cfg, remote **out, char *why, size_t n)
{
    *out = NULL;
    if (cfg->nvrtc_version)
        snprintf(nvrtc_version, sizeof nvrtc_version, "%s", cfg->nvrtc_version);
    why[0] = 0;
    remote *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, n, "remote cache off: out of memory");
        return;
    }
    char msg[800] = "";
    int ok = parse_url(r, cfg->url, msg, sizeof msg);
    if (ok && cfg->key) {
        r->key_len = strlen(cfg->key);
        if (r->key_len > MAX_KEY_BYTES) {
            snprintf(msg, sizeof msg, "the key is longer than %d bytes", MAX_KEY_BYTES);
            ok = 0;
        } else {
            memcpy(r->key, cfg->key, r->key_len);
        }
    } else if (ok && cfg->key_file) {
        ok = read_key_file(r, cfg->key_file, cfg->shared, msg, sizeof msg);
    } else if (ok) {
        snprintf(msg, sizeof msg,
                 "no signing key: set STOF_REMOTE_CACHE_KEY or STOF_REMOTE_CACHE_KEY_FILE "
                 "(stof_options.remote_key, remote_key_file); without one no value could be "
                 "trusted");
        ok = 0;
    }
    if (ok && r->key_len < MIN_KEY_BYTES) {
        snprintf(msg, sizeof msg, "the signing key has %zu bytes; it needs at least %d",
                 r->key_len, MIN_KEY_BYTES);
        ok = 0;
    }
    if (!ok) {
        snprintf(why, n, "remote cache off: %s", msg);
        memset(r, 0, sizeof *r);
        free(r);
        return;
    }
    int ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : DEFAULT_TIMEOUT_MS;
    r->tv.tv_sec = ms / 1000;
    r->tv.tv_usec = (ms % 1000) * 1000;
    r->max_value = cfg->max_value_bytes > 0 ? cfg->max_value_bytes : DEFAULT_MAX_VALUE_BYTES;
    /* Reach the server now: a wrong password is better said at open. */
    ready(r);
    const char *said = remote_take_note(r);
    if (said)
        snprintf(why, n, "%s", said);
    if (r->dead) {
        remote_close(r);
        return;
    }
    *out = r;
}

void remote_close(remote *r)
{
    if (!r)
        return;
    if (r->c)
        redisFree(r->c);
    memset(r->key, 0, sizeof r->key);
    memset(r->pass, 0, sizeof r->pass);
    free(r);
}

const char *remote_name(const remote *r) { return r ? r->name : ""; }

void remote_counts_get(const remote *r, cache_remote_counts *out)
{
    if (r)
        *out = r->n;
    else
        memset(out, 0, sizeof *out);
}

const char *remote_take_note(remote *r)
{
    if (!r || !r->note_pending)
        return NULL;
    r->note_pending = 0;
    return r->note;
}

/* ---- exchanges ---- */

static void refuse(remote *r, const char *rkey, const char *why);

/* The value at rkey, at most the cap: 1 and *reply (to free) when a value is
 * there. Only cap + 1 bytes are asked for (GETRANGE), so that an oversized
 * value costs no more than that to see; it is refused, and the caller's
 * recompile replaces it. A missing key reads as "" there, as no value does. */
static int get(remote *r, const char *rkey, redisReply **reply)
{
    *reply = NULL;
    if (!ready(r))
        return 0;
    pipe_guard g;
    guard_on(&g);
    redisReply *y = exchange(r, "GETRANGE %b 0 %lld", rkey, strlen(rkey), r->max_value);
    guard_off(&g);
    if (!reply_ok(r, y, "GET"))
        return 0;
    r->outage_said = 0;
    if (y->type != REDIS_REPLY_STRING || y->len == 0) {
        freeReplyObject(y);
        r->n.misses++;
        return 0;
    }
    if ((long long)y->len > r->max_value) {
        freeReplyObject(y);
        char why[96];
        snprintf(why, sizeof why, "oversized: longer than the cap of %lld bytes", r->max_value);
        refuse(r, rkey, why);
        return 0;
    }
    *reply = y;
    return 1;
}

static int set(remote *r, const char *rkey, const unsigned char *v, size_t n)
{
    if (!ready(r))
        return 0;
    pipe_guard g;
    guard_on(&g);
    redisReply *y = exchange(r, "SET %b %b", rkey, strlen(rkey), v, n);
    guard_off(&g);
    if (!reply_ok(r, y, "SET"))
        return 0;
    r->outage_said = 0;
    freeReplyObject(y);
    r->n.written++;
    return 1;
}

static void refuse(remote *r, const char *rkey, const char *why)
{
    r->n.refused++;
    if (!r->refusal_said)
        note(r, "remote cache %s: refused the value at %s: %s; compiling instead, and the new "
                "value replaces it", r->name, rkey, why);
    r->refusal_said = 1;
}

/* 1 when a value's versions (fields 5 and 6) are this stof's and its NVRTC's. */
static int fields_current(const field *f)
{
    return field_is(&f[5], nvrtc_version) && field_is(&f[6], stof_version());
}

/* Ends a get and frees its reply: a value taken counts a hit, and one
 * refused goes to refuse with why (one lost to memory is neither); ok. */
static int get_done(remote *r, redisReply *y, const char *rkey, int ok, const char *why)
{
    if (ok)
        r->n.hits++;
    else if (why)
        refuse(r, rkey, why);
    freeReplyObject(y);
    return ok;
}

int remote_get_kernel(remote *r, const char *key, const char *arch, cache_kernel *out)
{
    char rkey[512];
    redisReply *y;
    memset(out, 0, sizeof *out);
    remote_kernel_key(key, arch, nvrtc_version, rkey, sizeof rkey);
    if (!r || !get(r, rkey, &y))
        return 0;
    field f[KERNEL_FIELDS];
    const char *why = NULL;
    int ok = decode((const unsigned char *)y->str, y->len, rkey, r->key, r->key_len, 'K', f,
                    KERNEL_FIELDS, &why);
    if (ok && !(field_is(&f[0], key) && field_is(&f[4], arch))) {
        why = "foreign: it is for another kernel";
        ok = 0;
    }
    if (ok && !(ok = fields_current(f)))
        why = "stale: another stof or NVRTC wrote it";
    if (ok && f[11].n == 0) {
        why = "damaged: no binary";
        ok = 0;
    }
    if (ok) {
        snprintf(out->key, sizeof out->key, "%s", key);
        char **txt[] = {&out->op, &out->name, &out->entry, &out->arch, &out->nvrtc_version,
                        &out->stof_version, &out->options, &out->params, &out->source, &out->log};
        for (int i = 0; i < 10; i++)
            ok &= (*txt[i] = field_str(&f[i + 1])) != NULL;
        out->cubin = field_str(&f[11]);
        out->cubin_size = f[11].n;
        out->ptx = field_str(&f[12]);
        out->ptx_size = f[12].n;
        char *ms = field_str(&f[13]), *created = field_str(&f[14]);
        ok &= out->cubin && out->ptx && ms && created;
        if (ok) {
            out->compile_ms = strtod(ms, NULL);
            out->created = strtoll(created, NULL, 10);
            cache_checksum(out->cubin, out->cubin_size, out->ptx, out->ptx_size, out->checksum);
        }
        free(ms);
        free(created);
        if (!ok)
            cache_kernel_free(out);   /* out of memory: as if absent */
    }
    return get_done(r, y, rkey, ok, why);
}

int remote_get_tuning(remote *r, const char *op, const char *mask_hash, const char *shape,
                      const char *dtype, const char *arch, cache_tuning *out)
{
    char rkey[512];
    redisReply *y;
    memset(out, 0, sizeof *out);
    remote_tuning_key(op, mask_hash, shape, dtype, arch, nvrtc_version, rkey, sizeof rkey);
    if (!r || !get(r, rkey, &y))
        return 0;
    field f[TUNING_FIELDS];
    const char *why = NULL;
    int ok = decode((const unsigned char *)y->str, y->len, rkey, r->key, r->key_len, 'T', f,
                    TUNING_FIELDS, &why);
    const char *want[] = {op, mask_hash, shape, dtype, arch};
    for (int i = 0; ok && i < 5; i++)
        if (!field_is(&f[i], want[i])) {
            why = "foreign: it is for another case";
            ok = 0;
        }
    if (ok && !(ok = fields_current(f)))
        why = "stale: another stof or NVRTC wrote it";
    if (ok) {
        char *created = field_str(&f[8]);
        out->op = strdup(op);
        out->mask_hash = strdup(mask_hash);
        out->shape = strdup(shape);
        out->dtype = strdup(dtype);
        out->arch = strdup(arch);
        out->record = field_str(&f[7]);
        ok = out->op && out->mask_hash && out->shape && out->dtype && out->arch && out->record &&
             created;
        out->created = created ? strtoll(created, NULL, 10) : 0;
        free(created);
        if (!ok)
            cache_tuning_free(out);
    }
    return get_done(r, y, rkey, ok, why);
}

/* Stores v (n bytes, NULL when encoding ran out of memory) under rkey and
 * frees it; 1 when stored. */
static int put_value(remote *r, const char *rkey, unsigned char *v, size_t n)
{
    int ok = v && set(r, rkey, v, n);
    free(v);
    return ok;
}

int remote_put_kernel(remote *r, const cache_kernel *k)
{
    if (!r || r->dead)
        return 0;
    char rkey[512];
    size_t n = 0;
    remote_kernel_key(k->key, k->arch, nvrtc_version, rkey, sizeof rkey);
    unsigned char *v = remote_encode_kernel(k, r->key, r->key_len, &n);
    return put_value(r, rkey, v, n);
}

int remote_put_tuning(remote *r, const cache_tuning *t)
{
    if (!r || r->dead)
        return 0;
    char rkey[512];
    size_t n = 0;
    unsigned char *v = encode_tuning(t, r->key, r->key_len, &n, rkey, sizeof rkey);
    return put_value(r, rkey, v, n);
}

#else /* no hiredis: the tier is configured, but off, and says so */

struct remote {
    int unused;
};

void remote_open(const remote_config *cfg, remote **out, char *why, size_t n)
{
    (void)cfg;
    *out = NULL;
    snprintf(why, n, "remote cache off: this stof was built without hiredis (install "
                     "libhiredis-dev and rebuild)");
}

void remote_close(remote *r) { (void)r; }
const char *remote_name(const remote *r) { (void)r; return ""; }
void remote_counts_get(const remote *r, cache_remote_counts *out)
{
    (void)r;
    memset(out, 0, sizeof *out);
}
const char *remote_take_note(remote *r) { (void)r; return NULL; }
int remote_get_kernel(remote *r, const char *key, const char *arch, cache_kernel *out)
{
    (void)r; (void)key; (void)arch;
    memset(out, 0, sizeof *out);
    return 0;
}
int remote_get_tuning(remote *r, const char *op, const char *mask_hash, const char *shape,
                      const char *dtype, const char *arch, cache_tuning *out)
{
    (void)r; (void)op; (void)mask_hash; (void)shape; (void)dtype; (void)arch;
    memset(out, 0, sizeof *out);
    return 0;
}
int remote_put_kernel(remote *r, const cache_kernel *k) { (void)r; (void)k; return 0; }
int remote_put_tuning(remote *r, const cache_tuning *t) { (void)r; (void)t; return 0; }

#endif
