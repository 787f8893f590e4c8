/*
 * fuzz — what the fuzz targets share. Each target (tests/fuzz/fuzz_*.c)
 * is a libFuzzer target: LLVMFuzzerTestOneInput takes one input and
 * returns 0; a failed check aborts (FUZZ_CHECK), which libFuzzer and the
 * plain driver (driver.c, for gcc) report as a finding with the input
 * saved. Built with clang's -fsanitize=fuzzer by `make fuzz`, or with gcc
 * and driver.c, which replays the corpus (`make test`) and mutates it for
 * a fixed time where libFuzzer is not to be had.
 */
#ifndef STOF_FUZZ_H
#define STOF_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

#define FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            abort();                                                            \
        }                                                                       \
    } while (0)

#endif
