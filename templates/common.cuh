// common.cuh — the prelude of every stof kernel: 16-bit storage types as raw
// bits with conversions through PTX, so that kernels need no toolkit headers
// at run time. No template parameters.

typedef unsigned short stof_f16;   // IEEE half, raw bits
typedef unsigned short stof_bf16;  // bfloat16, raw bits

__device__ __forceinline__ float stof_f32_to_f32(float x) { return x; }
__device__ __forceinline__ float stof_f16_to_f32(stof_f16 h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ stof_f16 stof_f32_to_f16(float f)
{
    stof_f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float stof_bf16_to_f32(stof_bf16 h)
{
    return __uint_as_float(((unsigned)h) << 16);
}
__device__ __forceinline__ stof_bf16 stof_f32_to_bf16(float f)
{
    stof_bf16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Sum over groups of WIDTH consecutive lanes (WIDTH a power of two <= 32).
template <int WIDTH>
__device__ __forceinline__ float stof_group_sum(float v)
{
#pragma unroll
    for (int o = WIDTH / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o, WIDTH);
    return v;
}

// No math headers at run time: infinity by its bits.
#define STOF_INF __int_as_float(0x7f800000)
