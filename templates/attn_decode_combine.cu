// attn_decode_combine.cu — merges the splits of attn_decode.cu: each split
// left a row's O (normalized, fp32) and its log2-sum-exp in the workspace;
// the row is their sum weighted by 2^(lse - max lse), over the weights' sum.
// Splits that read no key for the row left lse = -inf and no O, which is
// never read. A row with no key in any split comes out as zeros.
//
// Tiling: one CTA per (batch, head, new row), in that order; HEAD_DIM
// threads, one column each.
//
// Parameters:
//   HEAD_DIM   32, 64, 80, 96 or 128
//   MMA_TYPE   f16 or bf16 (storage of out)

#define D {{HEAD_DIM}}

typedef unsigned short elem_t;

extern "C" __global__ void __launch_bounds__(D) stof_attn_decode_combine(
    const float *__restrict__ ws_o, const float *__restrict__ ws_lse, elem_t *__restrict__ out,
    long long o_sb, long long o_sh, long long o_sl, int heads, int seq_q, int nsplit)
{
    stof_grid_wait();  // common.cuh: the splits are written
    const int row = blockIdx.x, c = threadIdx.x;
    const int i = row % seq_q, h = row / seq_q % heads, b = row / seq_q / heads;
    const float *lse = ws_lse + (long long)row * nsplit;
    float mx = -STOF_INF;
    for (int s = 0; s < nsplit; s++)
        mx = fmaxf(mx, lse[s]);
    float sum = 0.f, acc = 0.f;
    if (mx != -STOF_INF) {
        for (int s = 0; s < nsplit; s++) {
            const float e = lse[s];
            if (e == -STOF_INF)
                continue;
            float f;
            asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(f) : "f"(e - mx));
            sum += f;
            acc += f * ws_o[((long long)row * nsplit + s) * D + c];
        }
    }
    out[(long long)b * o_sb + (long long)h * o_sh + (long long)i * o_sl + c] =
        stof_f32_to_{{MMA_TYPE}}(sum > 0.f ? acc / sum : 0.f);
}
