/*
 * testutil — what every suite shares: a seeded random source whose seed is
 * printed (set STOF_SEED to replay), temporary folders, the kernel cache
 * the variant sweeps share, reading a whole command's output, and for the
 * GPU suites device buffers (uploaded or poisoned), random tensors and
 * their relative L2 error.
 */
#ifndef STOF_TESTUTIL_H
#define STOF_TESTUTIL_H

#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "gpu/jit.h"

/* The run's seed: $STOF_SEED or the clock, printed once by the runner. */
uint64_t test_seed(void);
/* xorshift64* stream; each test starts its own from test_seed() ^ salt. */
typedef struct test_rng { uint64_t s; } test_rng;
test_rng test_rng_make(uint64_t salt);
uint64_t test_rng_next(test_rng *r);
double test_rng_uniform(test_rng *r);          /* [0, 1) */
int test_rng_int(test_rng *r, int lo, int hi);  /* [lo, hi] */

/* A fresh empty folder under $TMPDIR; the caller owns the string. */
char *test_tmpdir(void);
/* The integer the query's first row holds, from the SQLite file at path
 * (which must exist); fails the test on any error. */
long long test_sql_int(const char *path, const char *query);
void test_rmtree(const char *path);
/* Copies the file at from to to, with its mode; fails the test if it cannot. */
void test_copy_file(const char *from, const char *to);

/* The kernel cache shared by tests that need kernels compiled and their
 * logs, but not a compile of their own: cache.db in test_kernels_dir(),
 * kept across runs. Its keys cover the rendered source, the options, the
 * architecture and NVRTC's version, so what a test finds there is what a
 * compile now would give; removing the folder makes the next run compile
 * everything afresh. Tests of cold compiles or of the cache itself keep a
 * cache of their own. */
const char *test_kernel_cache(void);
/* Its folder: $STOF_TEST_KERNELS, else $STOF_BUILD/test-kernels. make
 * sanitize points it at the plain build's, whose kernels are the same (NVRTC
 * is not instrumented), so that the sweeps compile nothing twice. */
const char *test_kernels_dir(void);

/* Runs sh -c cmd; returns its exit status and its stdout+stderr (malloc'd). */
int test_run(const char *cmd, char **output);
/* The whole file at path (malloc'd), *n its size; fails the test if unreadable. */
char *test_slurp(const char *path, size_t *n);
/* test_run of the command built from fmt; fails the test if it cannot run. */
int test_sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The first variable at module scope of a PTX text that lives in global or
 * constant memory, which the driver allocates and fills whenever it loads
 * the module (on an H100 that made a load 3 to 7 times slower): its line,
 * cut to fit line[n], and 1; 0 when there is none. */
int test_ptx_global(const char *ptx, char *line, size_t n);

/* Path of a built program: $STOF_BUILD/name (STOF_BUILD defaults to build). */
const char *test_build_path(const char *name);

/* Runs fn(arg) on as many threads as there are CPUs, at most 8, and waits
 * for them; returns how many ran. fn shares out the work itself. */
int test_on_threads(void *(*fn)(void *), void *arg);
/* The next of n work items for such a thread (*next counts them out under
 * lock), or -1 when none is left. */
int test_take(pthread_mutex_t *lock, int *next, int n);

/* 1 when a GPU can be used (decided once by the runner). */
int test_have_gpu(void);

/* ---- for the GPU suites (each call fails the test on any error) ---- */

/* A context whose kernel cache is dir/cache.db. */
stof_ctx *test_open_in(const char *dir);
/* bytes of device memory holding a copy of host, or where host is NULL
 * poisoned with 0xff bytes (NaN in fp16 and bf16); ctx pushed and popped. */
CUdeviceptr test_upload(stof_ctx *ctx, const void *host, size_t bytes);
/* n values of dtype t at p, each offset + scale * u with u uniform in [-1, 1). */
void test_fill_uniform(test_rng *r, stof_dtype t, void *p, size_t n, double offset, double scale);
/* The relative L2 error of n values of dtype t at got against ref;
 * INFINITY where one of them is NaN or infinite (unwritten or overflowed). */
double test_rel_l2(stof_dtype t, const void *got, const double *ref, size_t n);

#endif
