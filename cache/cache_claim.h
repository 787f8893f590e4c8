/*
 * cache_claim — one compile of a kernel among the processes sharing a cache
 * file. A claim is a row (key, pid, host, expiry) that says "this process is
 * compiling key": a process that misses asks for one and compiles only if
 * it gets it; one that finds another's waits for the kernel instead. A
 * claim stands until released, until its lease lapses, or (on its own host)
 * until its process is gone. Any failure of the claim's own SQL reads as
 * "compile it": a claim never costs more than a compile.
 */
#ifndef STOF_CACHE_CLAIM_H
#define STOF_CACHE_CLAIM_H

#include "cache/cache.h"

typedef enum cache_claim_state {
    CACHE_CLAIM_OURS,    /* compile it here (the claim is ours, or none could be made) */
    CACHE_CLAIM_HELD,    /* another live process is compiling it (only when not waiting) */
    CACHE_CLAIM_STORED   /* its row is in the cache now: look it up */
} cache_claim_state;

/* Claims key for lease_ms. With wait, polls while another process holds it,
 * up to lease_ms in all, and then answers OURS (unclaimed) so the caller
 * compiles after all; never HELD. */
cache_claim_state cache_claim(cache *c, const char *key, int lease_ms, int wait);
/* Drops this process's claim on key (after storing the kernel, or failing
 * to compile it); nothing when it holds none. c may be NULL. */
void cache_release(cache *c, const char *key);

#endif
