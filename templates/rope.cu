// rope.cu — rotary position embeddings, Hugging Face's rotate-half form, in
// place over the decoder layer's packed qkv [rows, (H + 2 KVH) * HEAD_DIM]:
// the first ROT_HEADS heads of a row (q's H, then k's KVH) are rotated, v's
// are left. For i < HEAD_DIM / 2 and angle a = pos * inv_freq[i]:
//   x'[i] = x[i] cos a - x[i + HEAD_DIM/2] sin a
//   x'[i + HEAD_DIM/2] = x[i + HEAD_DIM/2] cos a + x[i] sin a
//
// Tiling: each thread owns VEC consecutive i of one head of one row (one
// 16-byte access in each half where the sizes allow), in a grid-stride loop.
// The angle is the fp32 product, as Hugging Face forms it; it is reduced
// modulo 2 pi in three steps (Cody-Waite) before the SFU's sine and cosine,
// so that no table of the library's sincosf lands in device memory and a
// position of a million keeps its accuracy. The position of a row is
// positions[row] when given (packed sequences), else offset + row % seq.
//
// Parameters:
//   ELEM          storage type: stof_f16 or stof_bf16
//   LOAD / STORE  conversions to and from float: stof_f16_to_f32 ...
//   HEAD_DIM      even; HEAD_DIM / 2 a multiple of VEC
//   ROT_HEADS     heads rotated from the row's start: heads + kv_heads
//   ROW           elements of a row: (heads + 2 kv_heads) * HEAD_DIM
//   VEC           elements per access

#define HEAD_DIM {{HEAD_DIM}}
#define HALF (HEAD_DIM / 2)
#define ROT_HEADS {{ROT_HEADS}}
#define ROW {{ROW}}
#define VEC {{VEC}}
#define CHUNKS (HALF / VEC)

typedef {{ELEM}} elem_t;
struct __align__(sizeof(elem_t) * VEC) vec_t { elem_t v[VEC]; };

// a - k 2 pi for the k nearest a / 2 pi, with 2 pi as three floats whose sum
// is it to within 1e-18: within a few units of 1e-7 of the exact remainder
// while k stays below 2^20.
__device__ __forceinline__ float rope_reduce(float a)
{
    const float k = rintf(a * 1.591549367e-01f);
    float r = fmaf(-k, 6.28125f, a);
    r = fmaf(-k, 1.935307169e-03f, r);
    return fmaf(-k, 1.025313168e-11f, r);
}

extern "C" __global__ void __launch_bounds__(256)
stof_rope(elem_t *qkv, long long rows, int seq, int offset, const int *__restrict__ positions,
          const float *__restrict__ inv_freq)
{
    stof_grid_wait();  // common.cuh: the kernel before this one is done
    const long long n = rows * (ROT_HEADS * CHUNKS);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / (ROT_HEADS * CHUNKS);
        const int rest = (int)(i % (ROT_HEADS * CHUNKS));
        const int head = rest / CHUNKS, c = (rest % CHUNKS) * VEC;
        const int pos = positions ? positions[row] : offset + (int)(row % seq);
        elem_t *p = qkv + row * ROW + head * HEAD_DIM + c;
        vec_t a = *reinterpret_cast<const vec_t *>(p);
        vec_t b = *reinterpret_cast<const vec_t *>(p + HALF);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float s, co;
            __sincosf(rope_reduce((float)pos * inv_freq[c + j]), &s, &co);
            const float x1 = {{LOAD}}(a.v[j]), x2 = {{LOAD}}(b.v[j]);
            a.v[j] = {{STORE}}(x1 * co - x2 * s);
            b.v[j] = {{STORE}}(x2 * co + x1 * s);
        }
        *reinterpret_cast<vec_t *>(p) = a;
        *reinterpret_cast<vec_t *>(p + HALF) = b;
    }
}
