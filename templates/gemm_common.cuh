// gemm_common.cuh — what the three GEMM engines share (gemm.cu on
// mma.sync, gemm_wg.cu on wgmma fed by cp.async, gemm_tma.cu
// warp-specialized on TMA): the product's and the epilogue's common
// parameters as constants, the storage type, and the epilogue's pieces
// (the bias of a column pair, the residual of one). An engine includes it
// (an include tag, codegen/render.h) ahead of its own constants, which
// build on these; each engine's comment says what its values may be.
//
// Parameters:
//   N, K       out columns and reduction length
//   BLOCK_M    rows per tile
//   BLOCK_N    columns per tile
//   STAGES     K steps in shared memory
//   MMA_TYPE   f16 or bf16: operand type of the products and of storage
//   BIAS       1: add bias[n]
//   ACT        after the bias: 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU,
//              4 SwiGLU (columns 2j, 2j + 1 are gate_j, up_j; out is [m, N / 2])
//   RESIDUAL   1: add residual[m, n] after the activation (not with SwiGLU)

// Constants, not macros: the prelude's templates use these short names too.
// Enumerators, not constexpr variables: NVRTC makes each such variable a
// device global, which the driver allocates and fills whenever it loads the
// module (on an H100, 0.13-0.5 ms a load against 0.02-0.07 without).
enum : int {
    N = {{N}},
    K = {{K}},
    BM = {{BLOCK_M}},
    BN = {{BLOCK_N}},
    STAGES = {{STAGES}},
    HAS_BIAS = {{BIAS}},
    ACT = {{ACT}},
    HAS_RESIDUAL = {{RESIDUAL}},

    SWIGLU = ACT == 4,            // stof_act<4> is the identity: the pair is joined at the store
    OUT_N = SWIGLU ? N / 2 : N,   // out's columns
};

static_assert(!SWIGLU || (N % 16 == 0 && !HAS_RESIDUAL),
              "SwiGLU: out's N / 2 columns in 16-byte rows, no residual");

typedef unsigned short elem_t;
typedef stof_{{MMA_TYPE}}_tag mma_tag;

__device__ __forceinline__ float to_f32(elem_t v) { return stof_{{MMA_TYPE}}_to_f32(v); }

// The bias of columns col and col + 1 (0 without a bias or past N).
__device__ __forceinline__ float2 bias_pair(const elem_t *bias, int col)
{
    if (!HAS_BIAS || (N % BN != 0 && col >= N))
        return make_float2(0.f, 0.f);
    const unsigned bb = *reinterpret_cast<const unsigned *>(bias + col);
    return make_float2(to_f32((elem_t)(bb & 0xffff)), to_f32((elem_t)(bb >> 16)));
}

// The residual of columns col and col + 1 of row `row`.
__device__ __forceinline__ float2 residual_pair(const elem_t *residual, int row, int col)
{
    const unsigned rr = *reinterpret_cast<const unsigned *>(residual + (long long)row * N + col);
    return make_float2(to_f32((elem_t)(rr & 0xffff)), to_f32((elem_t)(rr >> 16)));
}

// SwiGLU's output of a thread's column pair (gate_j, up_j): silu(gate) * up
// in fp32, silu(x) = x sigmoid(x) as Hugging Face's, written as swiglu.cu's
// pass writes it, so that the fused and the unfused forms agree.
__device__ __forceinline__ elem_t swiglu_out(float gate, float up)
{
    return stof_f32_to_{{MMA_TYPE}}(gate / (1.f + __expf(-gate)) * up);
}
