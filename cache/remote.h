/*
 * remote — the optional second tier behind the SQLite cache: a Redis server
 * (through hiredis) that a fleet shares, holding kernel binaries and tuning
 * records under keys that carry everything the local keys carry.
 *
 * Every value is signed with HMAC-SHA256 under the fleet's key, over the
 * Redis key it is stored at and everything in it; a value whose signature,
 * format, key, arch or versions do not check out is refused (counted, said
 * once) and never used, and the caller's recompile overwrites it. Redis
 * being down, slow or refusing costs one short timeout, which bounds each
 * exchange as a whole (the command out and its reply in), not each read: the
 * tier then rests for a while (RETRY_S) and every call goes on with the
 * local tier alone. A value longer than the cap is refused before it is read
 * (only cap + 1 bytes are asked for) and replaced like any refused value.
 * Nothing here fails a caller.
 */
#ifndef STOF_REMOTE_H
#define STOF_REMOTE_H

#include <stddef.h>

#include "cache/record.h"
#include "stof.h"

typedef struct remote remote;

typedef struct remote_config {
    const char *url;        /* redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] */
    const char *key;        /* the signing key's bytes, or NULL ... */
    const char *key_file;   /* ... a file holding them (one trailing newline dropped) */
    int timeout_ms;         /* connect timeout, and each exchange's deadline */
    long long max_value_bytes; /* longer values are refused unread; 0: 64 MiB */
    int shared;             /* a group-readable key file is accepted */
    const char *nvrtc_version; /* the process's compiler ("13.0"), which keys and values
                                  carry: the opener knows it, the resolve leaves it NULL */
} remote_config;

/* Options first, then $STOF_REMOTE_CACHE, $STOF_REMOTE_CACHE_KEY,
 * $STOF_REMOTE_CACHE_KEY_FILE, $STOF_REMOTE_CACHE_TIMEOUT_MS and
 * $STOF_REMOTE_CACHE_MAX_BYTES. Returns 0
 * when no remote tier is asked for (none named, or "off"). */
int remote_config_resolve(const stof_options *o, int shared, remote_config *out);

/* *out is NULL when the tier is off for good (a bad URL, no usable key, a
 * stof built without hiredis), with note saying why. A server that does not
 * answer now still gives a remote (it is tried again later); note says so.
 * note is "" when all is well. */
void remote_open(const remote_config *cfg, remote **out, char *note, size_t n);
void remote_close(remote *r);

/* "redis://host:port/db", without the password. */
const char *remote_name(const remote *r);

/* 1 and *out filled (fields as cache_get_kernel gives them) when Redis holds
 * a sound value for kernel `key` compiled for arch; else 0. */
int remote_get_kernel(remote *r, const char *key, const char *arch, cache_kernel *out);
int remote_get_tuning(remote *r, const char *op, const char *mask_hash, const char *shape,
                      const char *dtype, const char *arch, cache_tuning *out);
/* Best effort, bounded by the timeout; 1 when stored. k's versions must be
 * this stof's and NVRTC's (the caller's rows are). */
int remote_put_kernel(remote *r, const cache_kernel *k);
int remote_put_tuning(remote *r, const cache_tuning *t);

void remote_counts_get(const remote *r, cache_remote_counts *out);

/* A sentence not yet given to the caller (the tier went down, or a value
 * was refused), or NULL; each is given once. */
const char *remote_take_note(remote *r);

/* The Redis keys of a kernel and of a tuning record for NVRTC version nvrtc
 * (exposed for tests and tools). */
void remote_kernel_key(const char *key, const char *arch, const char *nvrtc, char *out,
                       size_t n);
void remote_tuning_key(const char *op, const char *mask_hash, const char *shape,
                       const char *dtype, const char *arch, const char *nvrtc, char *out,
                       size_t n);

/* The signed value remote_put_kernel stores for k, in a new buffer of *n
 * bytes (NULL when out of memory); with key NULL, the same value unsigned
 * (a zero tag), which readers refuse. For tests and tools. */
unsigned char *remote_encode_kernel(const cache_kernel *k, const unsigned char *key,
                                    size_t key_len, size_t *n);

#endif
