// attn_decode_combine.cu — merges the splits of attn_decode.cu: each split
// left a row's O (normalized, fp32) and its log2-sum-exp in the workspace;
// the row is their sum weighted by 2^(lse - max lse), over the weights' sum.
// Splits that read no key for the row left lse = -inf and zeros, whose
// weight is 0. A row with no key in any split comes out as zeros.
//
// Tiling: one CTA per (batch, head, new row), in that order; HEAD_DIM
// threads, one column each. A thread asks for its column of the first
// EARLY splits' O with the splits' lse (a thread each, into shared memory),
// so that a row waits for about one load's latency: the rest, unrolled,
// after the weights.
//
// Parameters:
//   HEAD_DIM   32, 64, 80, 96 or 128
//   MMA_TYPE   f16 or bf16 (storage of out)
//   MAX_SPLITS the most splits a run cuts a sequence into

#define D {{HEAD_DIM}}

typedef unsigned short elem_t;

extern "C" __global__ void __launch_bounds__(D) stof_attn_decode_combine(
    const float *__restrict__ ws_o, const float *__restrict__ ws_lse, elem_t *__restrict__ out,
    long long o_sb, long long o_sh, long long o_sl, int heads, int seq_q, int nsplit)
{
    __shared__ float wt[{{MAX_SPLITS}}];
    __shared__ float inv;
    stof_grid_wait();  // common.cuh: the splits are written
    const int row = blockIdx.x, c = threadIdx.x;
    const int i = row % seq_q, h = row / seq_q % heads, b = row / seq_q / heads;
    const float *col = ws_o + (long long)row * nsplit * D + c;
    constexpr int EARLY = 16;
    float x[EARLY];
#pragma unroll
    for (int s = 0; s < EARLY; s++)
        x[s] = s < nsplit ? __ldcg(col + (long long)s * D) : 0.f;
    for (int s = c; s < nsplit; s += D)
        wt[s] = __ldcg(ws_lse + (long long)row * nsplit + s);
    __syncthreads();
    if (c < 32) {
        // The weights 2^(lse - max), and 1 / their sum, by the first warp.
        float mx = -STOF_INF;
        for (int s = c; s < nsplit; s += 32)
            mx = fmaxf(mx, wt[s]);
        for (int o = 16; o > 0; o /= 2)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.f;
        for (int s = c; s < nsplit; s += 32) {
            float f = 0.f;
            if (mx != -STOF_INF && wt[s] != -STOF_INF)
                asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(f) : "f"(wt[s] - mx));
            wt[s] = f;  // 0 for a split that read no key of the row
            sum += f;
        }
        for (int o = 16; o > 0; o /= 2)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (c == 0)
            inv = sum > 0.f ? 1.f / sum : 0.f;
    }
    __syncthreads();
    float acc = 0.f;
#pragma unroll
    for (int s = 0; s < EARLY; s++)
        acc += wt[s < nsplit ? s : 0] * x[s];   // x is 0 past nsplit
#pragma unroll 8
    for (int s = EARLY; s < nsplit; s++) {
        const float f = wt[s];
        const float x = f > 0.f ? __ldcg(col + (long long)s * D) : 0.f;
        acc += f * x;
    }
    out[(long long)b * o_sb + (long long)h * o_sh + (long long)i * o_sl + c] =
        stof_f32_to_{{MMA_TYPE}}(acc * inv);
}
