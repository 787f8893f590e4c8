// layernorm.cu — fused bias + residual add + LayerNorm (or RMSNorm) over
// rows x HIDDEN.
//
// Tiling: a CTA of THREADS_PER_ROW * ROWS_PER_CTA threads; each group of
// THREADS_PER_ROW consecutive threads owns one row and holds it in registers
// (ITEMS vectors of VEC elements per thread), so the row is read once and
// written once; out may alias x or residual (x and residual are therefore
// not __restrict__). Mean, then the sum of squared deviations (two passes over
// registers, not memory) for a variance that does not cancel. RMSNorm (the
// decoder layer's) is the same row with the mean held at zero and no beta:
// out = v * rsqrt(mean(v^2) + eps) * gamma.
//
// Parameters:
//   ELEM             storage type: float, stof_f16 or stof_bf16
//   LOAD / STORE     conversions to and from float: stof_f16_to_f32 ...
//   HIDDEN           row length
//   VEC              elements per vector access (HIDDEN % VEC == 0)
//   THREADS_PER_ROW  power of two; > 32 means a row spans several warps
//   ROWS_PER_CTA     rows per thread block
//   ITEMS            ceil(HIDDEN / (VEC * THREADS_PER_ROW))
//   HAS_BIAS         section flag: add bias[HIDDEN]
//   HAS_RESIDUAL     section flag: add residual[rows, HIDDEN]
//   WRITE_SUM        section flag: also store x + bias + residual to sum_out
//                    (a pre-LN layer keeps it as its residual stream)
//   RMS              1: RMSNorm (no mean, beta unused and may be NULL)

#define HIDDEN {{HIDDEN}}
#define VEC {{VEC}}
#define TPR {{THREADS_PER_ROW}}
#define RPC {{ROWS_PER_CTA}}
#define ITEMS {{ITEMS}}
#define RMS {{RMS}}
#define WARPS_PER_ROW (TPR > 32 ? TPR / 32 : 1)

typedef {{ELEM}} elem_t;
struct __align__(sizeof(elem_t) * VEC) vec_t { elem_t v[VEC]; };

__device__ __forceinline__ void load_vec(const elem_t *p, float *out)
{
    vec_t t = *reinterpret_cast<const vec_t *>(p);
#pragma unroll
    for (int j = 0; j < VEC; j++)
        out[j] = {{LOAD}}(t.v[j]);
}

// Sum over the THREADS_PER_ROW threads of a row; every one gets the total.
__device__ __forceinline__ float row_sum(float v, float *scratch)
{
    v = stof_group_sum<(TPR < 32 ? TPR : 32)>(v);
    if (WARPS_PER_ROW == 1)
        return v;
    const int row = threadIdx.x / TPR, warp = (threadIdx.x % TPR) / 32;
    __syncthreads();  // scratch may still be read from the previous sum
    if (threadIdx.x % 32 == 0)
        scratch[row * WARPS_PER_ROW + warp] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS_PER_ROW; w++)
        s += scratch[row * WARPS_PER_ROW + w];
    return s;
}

extern "C" __global__ void __launch_bounds__(TPR * RPC)
stof_layernorm(const elem_t *x, const elem_t *__restrict__ bias,
               const elem_t *residual, const elem_t *__restrict__ gamma,
               const elem_t *__restrict__ beta, elem_t *out, int rows, float eps,
               elem_t *sum_out)
{
    stof_grid_wait();  // common.cuh: the kernel before this one is done
    __shared__ float scratch[RPC * WARPS_PER_ROW];
    const int lane = threadIdx.x % TPR;
    const long long row = (long long)blockIdx.x * RPC + threadIdx.x / TPR;
    const bool active = row < rows;  // no early return: row_sum may synchronise
    const long long base = row * HIDDEN;

    float v[ITEMS][VEC];
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        const int col = (i * TPR + lane) * VEC;
        if (active && col < HIDDEN) {
            load_vec(x + base + col, v[i]);
{{#if HAS_RESIDUAL}}
            float r[VEC];
            load_vec(residual + base + col, r);
#pragma unroll
            for (int j = 0; j < VEC; j++)
                v[i][j] += r[j];
{{/if}}
{{#if HAS_BIAS}}
            float b[VEC];
            load_vec(bias + col, b);
#pragma unroll
            for (int j = 0; j < VEC; j++)
                v[i][j] += b[j];
{{/if}}
{{#if WRITE_SUM}}
            vec_t t;
#pragma unroll
            for (int j = 0; j < VEC; j++)
                t.v[j] = {{STORE}}(v[i][j]);
            *reinterpret_cast<vec_t *>(sum_out + base + col) = t;
{{/if}}
#pragma unroll
            for (int j = 0; j < VEC; j++)
                sum += v[i][j];
        }
    }
    const float mean = RMS ? 0.f : row_sum(sum, scratch) * (1.f / HIDDEN);

    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        const int col = (i * TPR + lane) * VEC;
        if (active && col < HIDDEN) {
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                const float d = v[i][j] - mean;
                sq += d * d;
            }
        }
    }
    const float rstd = rsqrtf(row_sum(sq, scratch) * (1.f / HIDDEN) + eps);

#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        const int col = (i * TPR + lane) * VEC;
        if (active && col < HIDDEN) {
            float g[VEC], b[VEC] = {};
            load_vec(gamma + col, g);
            if (!RMS)
                load_vec(beta + col, b);
            vec_t t;
#pragma unroll
            for (int j = 0; j < VEC; j++)
                t.v[j] = {{STORE}}((v[i][j] - mean) * rstd * g[j] + b[j]);
            *reinterpret_cast<vec_t *>(out + base + col) = t;
        }
    }
}
