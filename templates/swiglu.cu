// swiglu.cu — the decoder MLP's gated activation as a pass of its own:
// out[r, j] = silu(gate[r, j]) * up[r, j] for j < FFN, with
// silu(g) = g / (1 + e^-g), in fp32.
//
// Tiling: each thread owns VEC consecutive j of a row (one 16-byte access
// where FFN allows) in a grid-stride loop. gate and up are rows of IN_STRIDE
// elements: FFN when two GEMMs wrote them apart, 2 FFN when one GEMM over
// the stacked weight [gate_proj; up_proj] wrote [rows, 2 FFN] and up is
// gate + FFN. With PAIRS, one GEMM over the interleaved weight wrote gate_j
// and up_j side by side (columns 2j, 2j + 1 of rows of IN_STRIDE = 2 FFN):
// a thread reads its VEC pairs from gate as two accesses, up unread.
// out [rows, FFN] must not overlap them.
//
// Parameters:
//   ELEM          storage type: stof_f16 or stof_bf16
//   LOAD / STORE  conversions to and from float: stof_f16_to_f32 ...
//   FFN           output row length (a multiple of VEC)
//   IN_STRIDE     elements from one input row to the next
//   VEC           elements per access
//   PAIRS         1: gate and up interleaved in gate's rows

#define FFN {{FFN}}
#define IN_STRIDE {{IN_STRIDE}}
#define VEC {{VEC}}
#define PAIRS {{PAIRS}}

typedef {{ELEM}} elem_t;
struct __align__(sizeof(elem_t) * VEC) vec_t { elem_t v[VEC]; };

extern "C" __global__ void __launch_bounds__(256)
stof_swiglu(const elem_t *__restrict__ gate, const elem_t *__restrict__ up,
            elem_t *__restrict__ out, long long rows)
{
    stof_grid_wait();  // common.cuh: the kernel before this one is done
    const long long n = rows * (FFN / VEC);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / (FFN / VEC);
        vec_t o;
        if (PAIRS) {
            // Pairs 2 VEC (i % (FFN / VEC)) .. of the row: two accesses.
            const long long in = row * IN_STRIDE + (i % (FFN / VEC)) * 2 * VEC;
            const vec_t p[2] = {*reinterpret_cast<const vec_t *>(gate + in),
                                *reinterpret_cast<const vec_t *>(gate + in + VEC)};
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                const float x = {{LOAD}}(p[j * 2 / VEC].v[j * 2 % VEC]);
                const float u = {{LOAD}}(p[(j * 2 + 1) / VEC].v[(j * 2 + 1) % VEC]);
                o.v[j] = {{STORE}}(x / (1.f + __expf(-x)) * u);
            }
        } else {
            const long long in = row * IN_STRIDE + (i % (FFN / VEC)) * VEC;
            const vec_t g = *reinterpret_cast<const vec_t *>(gate + in);
            const vec_t u = *reinterpret_cast<const vec_t *>(up + in);
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                const float x = {{LOAD}}(g.v[j]);
                o.v[j] = {{STORE}}(x / (1.f + __expf(-x)) * {{LOAD}}(u.v[j]));
            }
        }
        reinterpret_cast<vec_t *>(out)[i] = o;
    }
}
