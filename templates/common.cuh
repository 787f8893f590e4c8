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

// ---- Shared by the attention templates -------------------------------------

// The work item of this CTA. The grid is (heads, batch, query groups by
// rank) and CTAs start roughly in linear order, so they take the groups
// heaviest first across all heads: the longest walks start early and the
// short ones fill the tail (measured on causal masks: 6 to 16% faster than
// walking one head after another). work[rank] holds the group, its first
// and end tile and its first tile's key, so that a CTA issues its first
// copies after one 16-byte load, with no division for its coordinates.
struct stof_item {
    int group, t0, t1, key0;
};
__device__ __forceinline__ stof_item stof_work_item(const int *work)
{
    const int4 w = reinterpret_cast<const int4 *>(work)[blockIdx.z];
    return {w.x, w.y, w.z, w.w};
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

// 2^x on the SFU; inputs here are <= 0, where its error is a few ulp.
__device__ __forceinline__ float stof_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

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

// Scores of one m16 row tile as tensor-core accumulators: s[j] holds keys
// 8j + 2t, 8j + 2t + 1 of row g (elements 0, 1) and of row g + 8 (2, 3).
// Masks the keys a partial tile's bitmap rows w0p, w1p (NULL: a full tile)
// leave out and, where edge is set, those key_ok(column) rules out. Each
// word is shifted by 2t once, so a key's bit sits at a constant position.
template <int NB, int WPR, typename KeyOk>
__device__ __forceinline__ void stof_mask_scores(float (&s)[NB][4], const unsigned *w0p,
                                                 const unsigned *w1p, int t, bool edge,
                                                 KeyOk key_ok)
{
    if (w0p) {
        unsigned w0[WPR], w1[WPR];
#pragma unroll
        for (int w = 0; w < WPR; w++)
            w0[w] = w0p[w] >> (2 * t), w1[w] = w1p[w] >> (2 * t);
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const unsigned bit = 1u << ((j % 4) * 8 + e);
                if (!(w0[j / 4] & bit))
                    s[j][e] = -STOF_INF;
                if (!(w1[j / 4] & bit))
                    s[j][2 + e] = -STOF_INF;
            }
    }
    if (edge) {
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (!key_ok(j * 8 + 2 * t + e))
                    s[j][e] = s[j][2 + e] = -STOF_INF;
    }
}

// One online-softmax step, in units of log2, for the two rows a thread holds
// of an m16 tile, leaving O alone: max on raw scores (the scale is
// positive), one FMA per score folds scale and offset, s becomes P (fp32)
// and alpha[h2] the factor that row's O must be rescaled by. Kernels whose
// O is still being accumulated by an asynchronous product rescale it later.
// SUM = false leaves l alone, for a kernel whose products take the row sums.
template <int NB, bool SUM = true>
__device__ __forceinline__ void stof_softmax_p(float (&s)[NB][4], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], float scale_log2)
{
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
        float mx = -STOF_INF;
#pragma unroll
        for (int j = 0; j < NB; j++)
            mx = fmaxf(mx, fmaxf(s[j][2 * h2], s[j][2 * h2 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mnew = fmaxf(m[h2], mx * scale_log2);
        // A row with nothing allowed yet keeps base 0: exp2 never sees inf - inf.
        const float base = mnew == -STOF_INF ? 0.f : mnew;
        alpha[h2] = stof_ex2(m[h2] - base);
        m[h2] = mnew;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < NB; j++) {
            s[j][2 * h2] = stof_ex2(fmaf(s[j][2 * h2], scale_log2, -base));
            s[j][2 * h2 + 1] = stof_ex2(fmaf(s[j][2 * h2 + 1], scale_log2, -base));
            if constexpr (SUM)
                sum += s[j][2 * h2] + s[j][2 * h2 + 1];
        }
        if constexpr (SUM)
            l[h2] = l[h2] * alpha[h2] + sum;
    }
}

// O's rows times the softmax step's factors.
template <int NO>
__device__ __forceinline__ void stof_rescale(float (&o)[NO][4], const float (&alpha)[2])
{
#pragma unroll
    for (int i = 0; i < NO; i++) {
        o[i][0] *= alpha[0];
        o[i][1] *= alpha[0];
        o[i][2] *= alpha[1];
        o[i][3] *= alpha[1];
    }
}

// P in the accumulator layout of S becomes the A operand of the P V product:
// two n8 blocks make one k16.
template <typename Tag, int NB>
__device__ __forceinline__ void stof_pack_p(const float (&p)[NB][4], unsigned (&pf)[NB / 2][4])
{
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++)
            pf[j / 2][(j % 2) * 2 + h2] = Tag::pack2(p[j][2 * h2], p[j][2 * h2 + 1]);
}

// The whole step for kernels that wait for their products: P, O rescaled,
// P packed.
template <typename Tag, int NB, int NO>
__device__ __forceinline__ void stof_softmax_step(float (&s)[NB][4], float (&o)[NO][4], float (&m)[2],
                                                  float (&l)[2], unsigned (&pf)[NB / 2][4],
                                                  float scale_log2)
{
    float alpha[2];
    stof_softmax_p(s, m, l, alpha, scale_log2);
    stof_rescale(o, alpha);
    stof_pack_p<Tag>(s, pf);
}

// Divides a thread's two output rows by their sums and stores them: row h2
// goes to ob + rows[h2] * o_sl (rows[h2] < 0: none). Rows at or past qlim
// and rows that allowed nothing come out as zeros.
template <typename Tag, int NO>
__device__ __forceinline__ void stof_store_rows(float (&o)[NO][4], const float (&l)[2],
                                                unsigned short *ob, long long o_sl,
                                                const int (&rows)[2], int qlim, int t)
{
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
        float sum = l[h2];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int qr = rows[h2];
        const float inv = sum > 0.f && qr < qlim ? 1.f / sum : 0.f;
        if (qr < 0)
            continue;
#pragma unroll
        for (int i = 0; i < NO; i++)
            *reinterpret_cast<unsigned *>(ob + qr * o_sl + i * 8 + 2 * t) =
                Tag::pack2(o[i][2 * h2] * inv, o[i][2 * h2 + 1] * inv);
    }
}
