/*
 * half — host conversions between float and the 16-bit storage types
 * (IEEE fp16 and bfloat16), round-to-nearest-even, used by references,
 * tests and benchmarks.
 */
#ifndef STOF_HALF_H
#define STOF_HALF_H

#include <stdint.h>
#include "stof.h"

float half_to_float(uint16_t h);
uint16_t half_from_float(float f);
float bf16_to_float(uint16_t h);
uint16_t bf16_from_float(float f);

/* Element i of a buffer of dtype t, as a double; and the reverse. */
double dtype_load(stof_dtype t, const void *p, size_t i);
void dtype_store(stof_dtype t, void *p, size_t i, double v);

#endif
