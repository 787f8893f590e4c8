// bias_act.cu — the elementwise rest of a GEMM's group:
// out[r, c] = ACT(x[r, c] + bias[c]) + residual[r, c] over rows x COLS.
//
// Tiling: each thread owns VEC consecutive elements of a row (one 16-byte
// access where COLS allows), in a grid-stride loop over the whole matrix;
// bias is read per vector and stays in L1. out may alias x or residual.
//
// Parameters:
//   ELEM          storage type: stof_f16 or stof_bf16
//   LOAD / STORE  conversions to and from float: stof_f16_to_f32 ...
//   COLS          row length (a multiple of VEC)
//   VEC           elements per access
//   ACT           stof_identity, stof_gelu, stof_gelu_tanh or stof_relu
//   HAS_BIAS      section flag: add bias[COLS] before ACT
//   HAS_RESIDUAL  section flag: add residual[rows, COLS] after ACT

#define COLS {{COLS}}
#define VEC {{VEC}}

typedef {{ELEM}} elem_t;
struct __align__(sizeof(elem_t) * VEC) vec_t { elem_t v[VEC]; };

extern "C" __global__ void __launch_bounds__(256)
stof_bias_act(const elem_t *x, const elem_t *__restrict__ bias, const elem_t *residual,
              elem_t *out, long long rows)
{
    stof_grid_wait();  // common.cuh: the kernel before this one is done
    const long long n = rows * (COLS / VEC);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int col = (int)(i % (COLS / VEC)) * VEC;
        vec_t a = reinterpret_cast<const vec_t *>(x)[i];
{{#if HAS_BIAS}}
        const vec_t b = *reinterpret_cast<const vec_t *>(bias + col);
{{/if}}
{{#if HAS_RESIDUAL}}
        const vec_t r = reinterpret_cast<const vec_t *>(residual)[i];
{{/if}}
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float v = {{LOAD}}(a.v[j]);
{{#if HAS_BIAS}}
            v += {{LOAD}}(b.v[j]);
{{/if}}
            v = {{ACT}}(v);
{{#if HAS_RESIDUAL}}
            v += {{LOAD}}(r.v[j]);
{{/if}}
            a.v[j] = {{STORE}}(v);
        }
        reinterpret_cast<vec_t *>(out)[i] = a;
    }
}
