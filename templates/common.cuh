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

// The FFN's activations in fp32.
__device__ __forceinline__ float stof_identity(float x) { return x; }
__device__ __forceinline__ float stof_relu(float x) { return fmaxf(x, 0.f); }
// The exact (erf) GELU, x Phi(x), as max(x, 0) - |x| / 2 * erfc(|x| / sqrt 2)
// with erfc(a / sqrt 2) = 2^P(a): P is a degree-6 minimax fit of
// log2 erfc(a / sqrt 2) on [0, 6] (within 6.5e-5), its constant less 1 for
// the 1/2, and a is |x| held at 6, past which the term is below 6e-9. So
// within 5e-5 relative of x Phi(x) up to |x| = 6 and 6e-9 absolute past
// it; on an H100, within 0.59 of a unit in the last place of the exact
// value for every fp16 output and 0.49 for every 64th bf16 one (a
// correctly rounded one: 0.5), where 0.5 x (1 + erff(..)) loses the small
// negative values to the cancellation in 1 + erf. Ten instructions, one of
// them ex2, where erff takes about 25 and a degree-7 fit with a select
// took twelve: the FFN's first GEMM spends them in its epilogue (on an
// H100 its 16384 x 3072 x 768 product ran 1.2% faster than with those
// twelve). A NaN stays NaN (min.NaN keeps it in a).
__device__ __forceinline__ float stof_gelu(float x)
{
    float a;
    asm("min.NaN.f32 %0, %1, 0f40C00000;" : "=f"(a) : "f"(fabsf(x)));  // min(|x|, 6)
    float p = 2.29900324e-05f;
    p = fmaf(p, a, -0.000611100928f);
    p = fmaf(p, a, 0.00719558308f);
    p = fmaf(p, a, -0.0511854365f);
    p = fmaf(p, a, -0.461271673f);
    p = fmaf(p, a, -1.1501745f);
    p = fmaf(p, a, -1.00006473f);
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(p));
    return fmaf(-a, e, fmaxf(x, 0.f));
}
// The tanh GELU, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as
// x / (1 + 2^k), k = -2 sqrt(2 / pi) log2(e) (x + 0.044715 x^3): the same
// function, seven instructions (an ex2 and a reciprocal among them) where
// tanhf took about 20 (the FFN's first product 10% faster on an H100), and
// without the cancellation in 1 + tanh for negative x: within 0.50 of a
// unit in the last place for every fp16 output and 0.47 for every 64th
// bf16 one. For large negative x, 2^k is inf and x / inf is 0.
__device__ __forceinline__ float stof_gelu_tanh(float x)
{
    const float k = x * fmaf(x * x, -0.102943242f, -2.30220819f);
    float e, r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(k));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
    return x * r;
}
// An activation by its number: 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU.
template <int ACT>
__device__ __forceinline__ float stof_act(float x)
{
    if (ACT == 1)
        return stof_gelu(x);
    if (ACT == 2)
        return stof_gelu_tanh(x);
    if (ACT == 3)
        return stof_relu(x);
    return x;
}

// Writes a tile staged in shared memory, ROWS x COLS 16-bit elements at a
// row pitch of LD, to out[m0.., n0..] of an N-column output in whole
// 16-byte row chunks; rows at or past m, and columns past N where COLS does
// not divide it, stay unwritten.
template <int ROWS, int COLS, int LD, int THREADS, int N>
__device__ __forceinline__ void stof_store_tile(unsigned short *out, const unsigned short *Cs,
                                                int m0, int n0, int m)
{
    constexpr int CH = COLS / 8;
#pragma unroll 4
    for (int i = threadIdx.x; i < ROWS * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        const int row = m0 + r, col = n0 + c * 8;
        if (row < m && (N % COLS == 0 || col < N))
            *reinterpret_cast<uint4 *>(out + (long long)row * N + col) =
                *reinterpret_cast<const uint4 *>(Cs + r * LD + c * 8);
    }
}

// Programmatic dependent launch (sm_90 on; jit_launch sets the launch's
// attribute there): a kernel may be launched while the one before it in the
// stream is finishing, so every kernel calls stof_grid_wait before it reads
// or writes memory that another kernel reads or writes; past it, that kernel
// has completed and its writes are visible. Without the attribute it does
// nothing. No kernel signals its dependents early (griddepcontrol.
// launch_dependents): on an H100 that made ping-pong GEMMs 7% slower run
// after run, where the signal at exit made them 1-4.5% faster than plain
// launches.
__device__ __forceinline__ void stof_grid_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ unsigned stof_smem_u32(const void *p)
{
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}

// 16 bytes global -> shared; src_bytes 0 writes zeros and reads nothing.
__device__ __forceinline__ void stof_cp16(unsigned dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void stof_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void stof_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Two floats to one register of two 16-bit values, lo in the low half; the
// tag names the operand type of the tensor-core products.
struct stof_f16_tag {
    static __device__ __forceinline__ unsigned pack2(float lo, float hi)
    {
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
struct stof_bf16_tag {
    static __device__ __forceinline__ unsigned pack2(float lo, float hi)
    {
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
