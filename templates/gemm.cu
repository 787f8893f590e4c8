// gemm.cu — out = epilogue(X · Wᵀ), the nn.Linear product on tensor cores
// with bias, activation, residual and an optional row LayerNorm fused after it.
//
// Tiling: a CTA owns BLOCK_M rows x BLOCK_N columns of out; its WARPS_M x
// WARPS_N warps each own a (BLOCK_M / WARPS_M) x (BLOCK_N / WARPS_N) sub-tile
// as m16n8 fp32 accumulators. K is walked BLOCK_K at a time through a
// STAGES-deep cp.async ring in padded shared memory; ldmatrix feeds mma.sync
// m16n8k16. W's rows are the "col" operand as stored: no transpose.
// Epilogue: bias, activation and residual in fp32 registers; then either the
// tile is staged in shared memory (as elements) for 16-byte row stores, or,
// with LN, its fp32 rows are staged so that warps normalise whole rows.
// SwiGLU (ACT 4) stages one element per column pair, a BLOCK_M x BLOCK_N / 2
// tile of out [m, N / 2].
//
// X is [m, K] and W [N, K], out, residual and sum_out [m, N], all row-major;
// bias, gamma and beta [N]. Rows at or past m are zero-filled on load and
// never stored; columns at or past N likewise (N, K multiples of 8). out may
// alias residual (a CTA reads its residual tile before it stores), not x.
//
// Parameters:
//   N, K       out columns and reduction length, multiples of 8
//   BLOCK_M    rows per CTA, a multiple of 16 * WARPS_M
//   BLOCK_N    columns per CTA, a multiple of 16 * WARPS_N; with LN >= N
//   BLOCK_K    K per pipeline stage: 32 or 64
//   WARPS_M    warps along rows
//   WARPS_N    warps along columns
//   STAGES     cp.async pipeline depth, 2 to 4
//   MMA_TYPE   f16 or bf16: operand type of mma.sync and of storage
//   BIAS       1: add bias[n]
//   ACT        after the bias: 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU,
//              4 SwiGLU (gemm_common.cuh)
//   RESIDUAL   1: add residual[m, n] after the activation
//   LN         1: LayerNorm over each row with gamma, beta and eps
//   LN_SUM     1 (with LN): also store the pre-norm row to sum_out

{{>gemm_common.cuh}}

// Enumerators, not constexpr variables: gemm_common.cuh says why.
enum : int {
    BK = {{BLOCK_K}},
    WARPS_M = {{WARPS_M}},
    WARPS_N = {{WARPS_N}},
    HAS_LN = {{LN}},
    HAS_LN_SUM = {{LN_SUM}},

    WARPS = WARPS_M * WARPS_N,
    THREADS = WARPS * 32,
    WTM = BM / WARPS_M,        // a warp's rows
    WTN = BN / WARPS_N,        // a warp's columns
    MI = WTM / 16,             // its m16 tiles
    NI = WTN / 8,              // its n8 tiles
    LDS = BK + 8,              // smem row stride in elements: 16 B of padding
                               // puts ldmatrix's eight rows on distinct banks
    LDC = BN + 8,              // staged output tile, elements
    LDO = BN / 2 + 8,          // SwiGLU's, half as wide
    LDF = BN + 8,              // staged LN rows, floats: a half-warp's
                               // float2 stores of rows g, g + 1 ... on distinct banks
    KT = (K + BK - 1) / BK,    // pipeline steps
};

static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tiles are whole m16 x n16 blocks");
static_assert(THREADS % (BK / 8) == 0, "every thread copies whole chunks");
static_assert(N % 8 == 0 && K % 8 == 0, "rows are whole 16-byte chunks");
static_assert(!HAS_LN || BN >= N, "LayerNorm needs whole rows in one CTA");
static_assert(!SWIGLU || !HAS_LN, "SwiGLU has no LayerNorm");

__device__ __forceinline__ void ldsm_x4(unsigned *r, const elem_t *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(stof_smem_u32(p)));
}

// c += a (16x16, row) * b (16x8, col)
__device__ __forceinline__ void mma(float *c, const unsigned *a, unsigned b0, unsigned b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.{{MMA_TYPE}}.{{MMA_TYPE}}.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ROWS x BK elements of src (row stride K) from (row0, k0) into a stage;
// rows at or past `limit` and columns at or past K become zeros. A thread
// copies one 16-byte column chunk of every STEP-th row, so its addresses
// differ by constants and need no registers of their own.
template <int ROWS>
__device__ __forceinline__ void load_tile(elem_t *dst, const elem_t *src, int row0, int limit, int k0)
{
    constexpr int CH = BK / 8;           // 16-byte chunks per row
    constexpr int STEP = THREADS / CH;   // rows per pass of all threads
    const int r = threadIdx.x / CH, c = threadIdx.x % CH;
    const bool k_ok = K % BK == 0 || k0 + c * 8 < K;
    const elem_t *p = src + (long long)(row0 + r) * K + k0 + c * 8;
    const unsigned d = stof_smem_u32(dst + r * LDS + c * 8);
#pragma unroll
    for (int j = 0; j < (ROWS + STEP - 1) / STEP; j++) {
        if (ROWS % STEP == 0 || r + j * STEP < ROWS) {
            const bool ok = k_ok && row0 + r + j * STEP < limit;
            stof_cp16(d + j * STEP * LDS * 2, ok ? p + (long long)j * STEP * K : src, ok ? 16 : 0);
        }
    }
}

// The warp's accumulators into the CTA's staging tile (row pitch LD) as
// element pairs (T elem_t) or fp32 pairs (T float). Thread (g, t) holds, of
// each m16n8 tile, columns 2t, 2t + 1 of rows g (elements 0, 1) and g + 8.
template <int LD, typename T>
__device__ __forceinline__ void stage_acc(T *buf, const float (&acc)[MI][NI][4], int wr, int wc,
                                          int g, int t)
{
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if constexpr (sizeof(T) == 4)
                    *reinterpret_cast<float2 *>(buf + (wr + i * 16 + g + 8 * h) * LD + wc + j * 8 +
                                                2 * t) =
                        make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                else
                    *reinterpret_cast<unsigned *>(buf + (wr + i * 16 + g + 8 * h) * LD + wc +
                                                  j * 8 + 2 * t) =
                        mma_tag::pack2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
            }
}

// SwiGLU: thread (g, t)'s pair of columns 2t, 2t + 1 of each m16n8 tile is
// column t of the staged tile's 4-column slice of it (row pitch LDO).
__device__ __forceinline__ void stage_swiglu(elem_t *buf, const float (&acc)[MI][NI][4], int wr,
                                             int wc, int g, int t)
{
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                buf[(wr + i * 16 + g + 8 * h) * LDO + (wc + j * 8) / 2 + t] =
                    swiglu_out(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
}

extern "C" __global__ void __launch_bounds__(THREADS)
stof_gemm(const elem_t *x, const elem_t *w, const elem_t *bias, const elem_t *residual,
          const elem_t *gamma, const elem_t *beta, elem_t *out, elem_t *sum_out, int m, float eps)
{
    stof_grid_wait();  // common.cuh: the kernel before this one is done
    extern __shared__ __align__(16) unsigned char smem_raw[];
    elem_t *As = reinterpret_cast<elem_t *>(smem_raw);  // STAGES x BM x LDS
    elem_t *Bs = As + STAGES * BM * LDS;                 // STAGES x BN x LDS

    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wr = (warp / WARPS_N) * WTM, wc = (warp % WARPS_N) * WTN;
    const int g = lane / 4, t = lane % 4;

    auto load_stage = [&](int kt) {
        const int s = kt % STAGES;
        load_tile<BM>(As + s * BM * LDS, x, m0, m, kt * BK);
        load_tile<BN>(Bs + s * BN * LDS, w, n0, N, kt * BK);
    };

    // Prologue: STAGES - 1 steps in flight; one commit group per step, even
    // an empty one, so that wait_group counts steps.
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < KT)
            load_stage(s);
        stof_cp_commit();
    }

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
            acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

    for (int kt = 0; kt < KT; kt++) {
        stof_cp_wait<STAGES - 2>();
        // Step kt has landed for every thread, and every warp is done with
        // step kt - 1, whose stage the prefetch below overwrites.
        __syncthreads();
        if (kt + STAGES - 1 < KT)
            load_stage(kt + STAGES - 1);
        stof_cp_commit();

        const elem_t *At = As + (kt % STAGES) * BM * LDS;
        const elem_t *Bt = Bs + (kt % STAGES) * BN * LDS;
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            unsigned a[MI][4];
#pragma unroll
            for (int i = 0; i < MI; i++)
                ldsm_x4(a[i], At + (wr + i * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * LDS +
                                  kk * 16 + 8 * (lane / 16));
            // B's fragments one n16 pair at a time: wide warp tiles would
            // otherwise hold all of them next to the accumulators.
#pragma unroll
            for (int j = 0; j < NI / 2; j++) {
                unsigned b[4];
                ldsm_x4(b, Bt + (wc + j * 16 + (lane % 8) + 8 * (lane / 16)) * LDS + kk * 16 +
                               8 * ((lane / 8) % 2));
#pragma unroll
                for (int i = 0; i < MI; i++) {
                    mma(acc[i][2 * j], a[i], b[0], b[1]);
                    mma(acc[i][2 * j + 1], a[i], b[2], b[3]);
                }
            }
        }
    }
    stof_cp_wait<0>();
    __syncthreads();  // the pipeline's buffer now holds the epilogue's tile

    // Bias, activation, residual in fp32. Thread (g, t) holds, of each m16n8
    // tile, columns 2t, 2t + 1 of rows g (elements 0, 1) and g + 8 (2, 3).
#pragma unroll
    for (int j = 0; j < NI; j++) {
        const int col = n0 + wc + j * 8 + 2 * t;
        const bool col_ok = N % BN == 0 || col < N;
        const float2 bv = bias_pair(bias, col);
#pragma unroll
        for (int i = 0; i < MI; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float v0 = stof_act<ACT>(acc[i][j][2 * h] + bv.x),
                      v1 = stof_act<ACT>(acc[i][j][2 * h + 1] + bv.y);
                const int row = m0 + wr + i * 16 + g + 8 * h;
                if (HAS_RESIDUAL && col_ok && row < m) {
                    const float2 r = residual_pair(residual, row, col);
                    v0 += r.x;
                    v1 += r.y;
                }
                acc[i][j][2 * h] = v0;
                acc[i][j][2 * h + 1] = v1;
            }
    }

    if (SWIGLU) {
        // One element a pair, then whole 16-byte chunks of out's rows.
        elem_t *Cs = reinterpret_cast<elem_t *>(smem_raw);
        stage_swiglu(Cs, acc, wr, wc, g, t);
        __syncthreads();
        stof_store_tile<BM, BN / 2, LDO, THREADS, OUT_N>(out, Cs, m0, n0 / 2, m);
        return;
    }
    if (!HAS_LN) {
        // Stage the tile as elements, then write whole 16-byte row chunks.
        elem_t *Cs = reinterpret_cast<elem_t *>(smem_raw);
        stage_acc<LDC>(Cs, acc, wr, wc, g, t);
        __syncthreads();
        stof_store_tile<BM, BN, LDC, THREADS, N>(out, Cs, m0, n0, m);
        return;
    }

    // LayerNorm: the CTA's rows in fp32, then one warp per row at a time,
    // eight consecutive columns per lane; mean first, then the squared
    // deviations from it, so the variance does not cancel.
    float *Fs = reinterpret_cast<float *>(smem_raw);
    stage_acc<LDF>(Fs, acc, wr, wc, g, t);
    __syncthreads();

    constexpr int CPL = (N + 255) / 256;  // 8-column chunks per lane
    for (int r = warp; r < BM; r += WARPS) {
        const int row = m0 + r;
        if (row >= m)
            break;
        float v[CPL][8];
        float sum = 0.f;
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            const int col = (c * 32 + lane) * 8;
            if (N % 256 == 0 || col < N) {
                const float4 lo = *reinterpret_cast<const float4 *>(Fs + r * LDF + col);
                const float4 hi = *reinterpret_cast<const float4 *>(Fs + r * LDF + col + 4);
                v[c][0] = lo.x, v[c][1] = lo.y, v[c][2] = lo.z, v[c][3] = lo.w;
                v[c][4] = hi.x, v[c][5] = hi.y, v[c][6] = hi.z, v[c][7] = hi.w;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    sum += v[c][e];
            }
        }
        const float mean = stof_group_sum<32>(sum) * (1.f / N);
        float sq = 0.f;
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            const int col = (c * 32 + lane) * 8;
            if (N % 256 == 0 || col < N)
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float d = v[c][e] - mean;
                    sq += d * d;
                }
        }
        const float rstd = rsqrtf(stof_group_sum<32>(sq) * (1.f / N) + eps);
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            const int col = (c * 32 + lane) * 8;
            if (N % 256 == 0 || col < N) {
                const long long at = (long long)row * N + col;
                if (HAS_LN_SUM) {
                    uint4 s;
                    s.x = mma_tag::pack2(v[c][0], v[c][1]);
                    s.y = mma_tag::pack2(v[c][2], v[c][3]);
                    s.z = mma_tag::pack2(v[c][4], v[c][5]);
                    s.w = mma_tag::pack2(v[c][6], v[c][7]);
                    *reinterpret_cast<uint4 *>(sum_out + at) = s;
                }
                const uint4 gv = *reinterpret_cast<const uint4 *>(gamma + col);
                const uint4 bv = *reinterpret_cast<const uint4 *>(beta + col);
                const unsigned gw[4] = {gv.x, gv.y, gv.z, gv.w}, bw[4] = {bv.x, bv.y, bv.z, bv.w};
                unsigned o[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float y0 = (v[c][2 * e] - mean) * rstd * to_f32((elem_t)(gw[e] & 0xffff)) +
                                     to_f32((elem_t)(bw[e] & 0xffff));
                    const float y1 = (v[c][2 * e + 1] - mean) * rstd * to_f32((elem_t)(gw[e] >> 16)) +
                                     to_f32((elem_t)(bw[e] >> 16));
                    o[e] = mma_tag::pack2(y0, y1);
                }
                *reinterpret_cast<uint4 *>(out + at) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        }
    }
}
