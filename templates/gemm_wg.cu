// gemm_wg.cu — out = epilogue(X · Wᵀ) on Hopper's warpgroup MMA (sm_90a):
// gemm.cu's product and epilogue (bias, activation, residual; no LayerNorm)
// with the products on wgmma.
//
// Tiling: a CTA owns BLOCK_M rows x BLOCK_N columns of out; each warpgroup
// (4 warps) owns 64 of the rows and all BLOCK_N columns as fp32
// accumulators, one m64n128 (or m64n64) product per 128 (64) columns. K is
// walked 64 at a time: a stage holds the 64-column slice of the CTA's rows
// of X and of W, one 128-byte swizzled row per operand row (wgmma.cuh), and
// both operands are K-major, as S = Q·Kᵀ is in attn_wg.cu. Every thread
// copies its share of a stage with cp.async and arms the stage's "full"
// barrier; each warp releases a stage through its "empty" barrier once the
// products that read it are done. Tile j's four k16 products are committed
// as one group and left in flight while tile j - 1's group is waited for,
// its stage released and tile j + STAGES - 1 loaded into it.
// Epilogue: bias, activation and residual in fp32 on the accumulators, then
// the tile is staged in shared memory (as elements) for 16-byte row stores;
// SwiGLU (ACT 4) stages one element per column pair, BLOCK_N / 2 columns.
//
// X is [m, K] and W [N, K], out and residual [m, N], all row-major; bias [N].
// Rows at or past m, and W's rows (out's columns) at or past N, are zero-
// filled on load and never stored. out may alias residual (a CTA reads its
// residual tile before it stores), not x. gamma, beta, sum_out and eps are
// in the signature only to match stof_gemm and are not read.
//
// Parameters:
//   N, K       out columns (a multiple of 8) and reduction length (of 64)
//   BLOCK_M    rows per CTA: 64 per warpgroup (64, 128, 192 or 256)
//   BLOCK_N    columns per CTA: 64, 128 or 256
//   STAGES     K tiles in shared memory, 2 to 5; loads run STAGES - 1 ahead
//   MMA_TYPE   f16 or bf16: operand type of wgmma and of storage
//   BIAS       1: add bias[n]
//   ACT        after the bias: 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU,
//              4 SwiGLU (gemm_common.cuh)
//   RESIDUAL   1: add residual[m, n] after the activation

{{>gemm_common.cuh}}

// Enumerators, not constexpr variables: gemm_common.cuh says why.
enum : int {
    BK = 64,                   // one 128-byte swizzled row per operand row
    THREADS = BM * 2,          // a warpgroup (128 threads) per 64 rows
    WN = BN < 128 ? BN : 128,  // columns of one product
    NB = BN / WN,              // products per k16 step
    KT = K / BK,               // pipeline steps
    A_BYTES = BM * 128,        // a stage's X rows
    B_BYTES = BN * 128,        // a stage's W rows
    STAGE_BYTES = A_BYTES + B_BYTES,
    LDC = BN + 8,              // staged output row, elements: 16 B of padding
                               // put a warp's pair stores on distinct banks
    LDO = SWIGLU ? BN / 2 + 8 : LDC, // SwiGLU's: one element a pair
    CHUNKS = BK / 8,           // 16-byte chunks per row
    STEP = THREADS / CHUNKS,   // rows per pass of the CTA
};

static_assert(BM % 64 == 0 && BM <= 256, "64 rows per warpgroup, at most four");
static_assert(BN == 64 || BN == 128 || BN == 256, "whole m64n64 or m64n128 products");
static_assert(K % BK == 0 && N % 8 == 0, "whole 128-byte K rows, 16-byte output chunks");
static_assert(STAGES >= 2 && STAGES <= 5, "2 to 5 stages");
static_assert(STEP % 8 == 0, "a thread's chunk keeps its swizzled place from pass to pass");
static_assert(BM * LDC * 2 <= STAGES * STAGE_BYTES, "the staged tile fits the pipeline's memory");


// ROWS x 64 elements of src (row stride K) from (row0, k0) into the swizzled
// tile at dst; rows at or past lim become zeros. Thread x copies chunk
// c = x % CHUNKS of rows r0 + i * STEP, r0 = x / CHUNKS: STEP is a multiple of
// 8, so the chunk's swizzled place is the same in every pass.
template <int ROWS>
__device__ __forceinline__ void load_tile(unsigned dst, const elem_t *src, int row0, int lim, int k0)
{
    const int c = threadIdx.x % CHUNKS, r0 = threadIdx.x / CHUNKS;
    const unsigned d = dst + r0 * 128 + ((c ^ (r0 % 8)) << 4);
    const elem_t *p = src + (long long)(row0 + r0) * K + k0 + c * 8;
#pragma unroll
    for (int i = 0; i < (ROWS + STEP - 1) / STEP; i++) {
        const int r = r0 + i * STEP;
        if (ROWS % STEP != 0 && r >= ROWS)
            break;
        const bool ok = row0 + r < lim;
        stof_cp16(d + i * STEP * 128, ok ? p : src, ok ? 16 : 0);
        p += (long long)STEP * K;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
stof_gemm_wg(const elem_t *x, const elem_t *w, const elem_t *bias, const elem_t *residual,
             const elem_t *gamma, const elem_t *beta, elem_t *out, elem_t *sum_out, int m, float eps)
{
    stof_grid_wait();  // common.cuh: the kernel before this one is done
    // The launch gives 1 KiB of slack to align the swizzled tiles.
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (stof_smem_u32(smem_raw) + 1023) & ~1023u;
    // Per stage: X's rows, then W's; both sizes are multiples of 1024.
    const unsigned bar_full = base + STAGES * STAGE_BYTES, bar_empty = bar_full + STAGES * 8;

    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int wg = warp / 4;  // warpgroup: rows 64 wg .. 64 wg + 63 of the tile

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; i++) {
            mbar_init(bar_full + 8 * i, THREADS);
            mbar_init(bar_empty + 8 * i, THREADS / 32);
        }
    }
    __syncthreads();

    // Tile j lives in stage j mod STAGES. Every thread copies its share and
    // arms the full barrier to fire when its copies land; a stage is
    // refilled only once every warp has released the tile before.
    stof_ring<STAGES> iss, cons;  // the next tile issued's stage, the next consumed's
    auto issue = [&](int j) {     // j: 0, 1, 2, ... in turn
        const int s = iss.stage;
        if (j >= STAGES)
            mbar_wait(bar_empty + 8 * s, iss.phase ^ 1);
        iss.next();
        const unsigned st = base + s * STAGE_BYTES;
        load_tile<BM>(st, x, m0, m, j * BK);
        load_tile<BN>(st + A_BYTES, w, n0, N, j * BK);
        cp_arrive_noinc(bar_full + 8 * s);
    };
#pragma unroll
    for (int j = 0; j < STAGES - 1; j++)
        if (j < KT)
            issue(j);

    float acc[NB][WN / 8][4];
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int i = 0; i < WN / 8; i++)
            acc[b][i][0] = acc[b][i][1] = acc[b][i][2] = acc[b][i][3] = 0.f;
#pragma unroll
    for (int b = 0; b < NB; b++)
        wg_hold(acc[b]);  // the zeros are written before the first fence

    int prev = 0;  // tile j - 1's stage
    for (int j = 0; j < KT; j++, cons.next()) {
        const int s = cons.stage;
        mbar_wait(bar_full + 8 * s, cons.phase);
        // cp.async wrote through the generic proxy; wgmma reads through the async one.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const unsigned long long ad = wg_desc(base + s * STAGE_BYTES + wg * 64 * 128, 16, 1024),
                                 bd = wg_desc(base + s * STAGE_BYTES + A_BYTES, 16, 1024);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
            for (int b = 0; b < NB; b++)
                wg_ss(acc[b], wg_desc_add(ad, kk * 32), wg_desc_add(bd, b * WN * 128 + kk * 32), 1);
        wg_commit();
        // Tile j - 1's products are done: release its stage, which tile
        // j + STAGES - 1 refills.
        wg_wait1();
        if (j > 0) {
            __syncwarp();
            if (lane == 0)
                mbar_arrive(bar_empty + 8 * prev);
        }
        prev = s;
        if (j + STAGES - 1 < KT)
            issue(j + STAGES - 1);
    }
    wg_wait0();
#pragma unroll
    for (int b = 0; b < NB; b++)
        wg_hold(acc[b]);

    // Bias, activation, residual in fp32. Of each n8 block i of a product,
    // thread (g, t) of warp w holds columns 8i + 2t, 8i + 2t + 1 of rows
    // 16 (w % 4) + g (elements 0, 1) and + 8 (elements 2, 3).
    const int row0 = warp * 16 + g;  // in the tile; the warpgroup's 64 rows included
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int i = 0; i < WN / 8; i++) {
            const int col = n0 + b * WN + i * 8 + 2 * t;
            const bool col_ok = N % BN == 0 || col < N;
            const float2 bv = bias_pair(bias, col);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float v0 = stof_act<ACT>(acc[b][i][2 * h] + bv.x),
                      v1 = stof_act<ACT>(acc[b][i][2 * h + 1] + bv.y);
                const int row = m0 + row0 + 8 * h;
                if (HAS_RESIDUAL && col_ok && row < m) {
                    const float2 r = residual_pair(residual, row, col);
                    v0 += r.x;
                    v1 += r.y;
                }
                acc[b][i][2 * h] = v0;
                acc[b][i][2 * h + 1] = v1;
            }
        }

    // Every warpgroup's products are done before the pipeline's memory holds
    // the output tile; then whole 16-byte row chunks go out.
    __syncthreads();
    elem_t *Cs = reinterpret_cast<elem_t *>(smem_raw + (base - stof_smem_u32(smem_raw)));
#pragma unroll
    for (int b = 0; b < NB; b++)
#pragma unroll
        for (int i = 0; i < WN / 8; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (SWIGLU)  // the pair is column (b WN + 8 i) / 2 + t of out's tile
                    Cs[(row0 + 8 * h) * LDO + (b * WN + i * 8) / 2 + t] =
                        swiglu_out(acc[b][i][2 * h], acc[b][i][2 * h + 1]);
                else
                    *reinterpret_cast<unsigned *>(Cs + (row0 + 8 * h) * LDC + b * WN + i * 8 +
                                                  2 * t) =
                        mma_tag::pack2(acc[b][i][2 * h], acc[b][i][2 * h + 1]);
            }
    __syncthreads();
    if (SWIGLU)
        stof_store_tile<BM, BN / 2, LDO, THREADS, OUT_N>(out, Cs, m0, n0 / 2, m);
    else
        stof_store_tile<BM, BN, LDC, THREADS, N>(out, Cs, m0, n0, m);
}
