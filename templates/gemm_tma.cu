// gemm_tma.cu — out = epilogue(X · Wᵀ) on sm_90a as a persistent,
// warp-specialized kernel: the epilogue of gemm_wg.cu (bias, activation,
// residual) on operands that the tensor-memory accelerator (TMA) brings in.
//
// Warpgroups: one producer and two consumers. The producer's first thread
// walks this CTA's tiles (tile blockIdx.x, then every gridDim.x-th, row
// tiles outermost so that the CTAs working at one time share X's rows) and
// for each of a tile's K steps waits for a free stage, arms its "full"
// barrier with the stage's byte count and issues two TMA copies: BLOCK_M
// rows of X and BLOCK_N rows of W, 64 elements of K each, which the copy
// engine writes in the 128-byte swizzled layout wgmma reads (wgmma.cuh) and
// zero-fills past the ends of X, W and K. The producer gives most of its
// registers to the consumers (setmaxnreg).
// Consumers: with COOP 0 (ping-pong) the two consumer warpgroups take
// alternate tiles of the CTA's walk, each a whole BLOCK_M x BLOCK_N tile, so
// that one's epilogue runs while the other's products keep the tensor cores
// busy; with COOP 1 both share each tile, BLOCK_M / 2 rows each. A consumer
// waits for a stage's full barrier, issues its products, and releases the
// stage through the "empty" barrier (one arrival per consumer warp) once
// the products that read it are done. Stages are used in the producer's
// order, K step after K step, tile after tile, so the stage and phase of a
// K step follow from its place in the walk. A barrier waits for a phase by
// its parity, so no waiter may run two phases ahead: in ping-pong the
// consumers take turns (each starts a tile's K steps once the other has
// waited for all of its previous tile's), which also gives each one the
// tensor cores to itself for its products.
// Epilogue: bias and activation in fp32 on the accumulators; then each warp
// stages 16 rows x 32 columns at a time in fp32 in a buffer of its own and
// reads them back as 8-element row pieces, adds the residual's piece and
// stores it. out must not overlap x, w, bias or residual.
//
// X is [m, K] and W [N, K] (nn.Linear), out and residual [m, N], row-major;
// bias [N]. The launch passes TMA descriptors of X (box 64 x BLOCK_M) and W
// (box 64 x BLOCK_N) with 128-byte swizzling.
//
// Parameters:
//   N, K       out columns (a multiple of 8) and reduction length (of 8)
//   BLOCK_M    rows per tile: 64 or 128 per consumer warpgroup
//   BLOCK_N    columns per tile: 64, 128 or 256
//   STAGES     K steps in shared memory, 2 to 8
//   COOP       0: each consumer warpgroup its own tile; 1: both share one
//   MMA_TYPE   f16 or bf16: operand type of wgmma and of storage
//   BIAS       1: add bias[n]
//   ACT        after the bias: 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU
//   RESIDUAL   1: add residual[m, n] after the activation

constexpr int N = {{N}};
constexpr int K = {{K}};
constexpr int BM = {{BLOCK_M}};
constexpr int BN = {{BLOCK_N}};
constexpr int STAGES = {{STAGES}};
constexpr bool COOP = {{COOP}};
constexpr bool HAS_BIAS = {{BIAS}};
constexpr int ACT = {{ACT}};
constexpr bool HAS_RESIDUAL = {{RESIDUAL}};

constexpr int BK = 64;                      // one 128-byte swizzled row per operand row
constexpr int THREADS = 384;                // producer, two consumers
constexpr int WG_ROWS = COOP ? BM / 2 : BM; // rows of a consumer's products
constexpr int MI = WG_ROWS / 64;            // m64 products per column block
constexpr int WN = BN;                      // columns of one product: m64n64, n128 or n256
constexpr int NB = BN / WN;                 // column blocks
constexpr int KT = (K + BK - 1) / BK;       // K steps per tile
constexpr int NT = (N + BN - 1) / BN;       // column tiles
constexpr int A_BYTES = BM * 128;
constexpr int B_BYTES = BN * 128;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
constexpr int EPI_LD = 36;                  // floats per staged row: 32 and 16 bytes of padding

typedef unsigned short elem_t;
typedef stof_{{MMA_TYPE}}_tag mma_tag;

static_assert(WG_ROWS == 64 || WG_ROWS == 128, "64 or 128 rows per consumer warpgroup");
static_assert(BN == 64 || BN == 128 || BN == 256, "one m64n64, m64n128 or m64n256 product");
static_assert(WG_ROWS * BN / 128 <= 128, "at most 128 accumulators per consumer thread");
static_assert(K % 8 == 0 && N % 8 == 0, "16-byte rows");
static_assert(STAGES >= 2 && STAGES <= 8, "2 to 8 stages");

// A TMA descriptor (CUtensorMap), passed by value.
struct __align__(64) stof_tmap {
    unsigned long long v[16];
};

__device__ __forceinline__ float to_f32(elem_t v) { return stof_{{MMA_TYPE}}_to_f32(v); }

__device__ __forceinline__ float act(float v)
{
    if (ACT == 1)
        return stof_gelu(v);
    if (ACT == 2)
        return stof_gelu_tanh(v);
    if (ACT == 3)
        return stof_relu(v);
    return v;
}

// Arrives on bar and adds bytes to the transfer count its phase waits for.
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

// The box of map at (k0, row0) into shared memory at dst; bar counts its bytes.
__device__ __forceinline__ void tma_load(unsigned dst, const stof_tmap *map, unsigned bar, int k0,
                                         int row0)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
                 "l"((unsigned long long)map), "r"(bar), "r"(k0), "r"(row0)
                 : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
stof_gemm_tma(const __grid_constant__ stof_tmap tx, const __grid_constant__ stof_tmap tw,
              const elem_t *__restrict__ bias, const elem_t *__restrict__ residual,
              elem_t *__restrict__ out, int m)
{
    // The launch gives 1 KiB of slack to align the swizzled tiles.
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (stof_smem_u32(smem_raw) + 1023) & ~1023u;
    // Per stage: X's rows, then W's; both sizes are multiples of 1024.
    // Then the ping-pong turns: turn[c] fires when the other consumer is done
    // waiting for its tile's stages.
    const unsigned bar_full = base + STAGES * STAGE_BYTES, bar_empty = bar_full + STAGES * 8,
                   bar_turn = bar_empty + STAGES * 8;
    const int wg = threadIdx.x / 128, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int tiles = (m + BM - 1) / BM * NT;

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; i++) {
            mbar_init(bar_full + 8 * i, 1);
            mbar_init(bar_empty + 8 * i, COOP ? 8 : 4);
        }
        mbar_init(bar_turn, 4);
        mbar_init(bar_turn + 8, 4);
        // The copy engine sees the initialized barriers.
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x != 0)
            return;
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)&tx) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)&tw) : "memory");
        int it = 0;  // K steps issued
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int m0 = tile / NT * BM, n0 = tile % NT * BN;
            for (int kb = 0; kb < KT; kb++, it++) {
                const int s = it % STAGES;
                if (it >= STAGES)
                    mbar_wait(bar_empty + 8 * s, (it / STAGES - 1) & 1);
                const unsigned st = base + s * STAGE_BYTES;
                mbar_expect(bar_full + 8 * s, STAGE_BYTES);
                tma_load(st, &tx, bar_full + 8 * s, kb * BK, m0);
                tma_load(st + A_BYTES, &tw, bar_full + 8 * s, kb * BK, n0);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1;                      // consumer 0 or 1
    const int g = lane / 4, t = lane % 4;
    const unsigned a_off = COOP ? c * WG_ROWS * 128 : 0;
    // This warp's staging buffer, after the barriers.
    float *const stage = reinterpret_cast<float *>(smem_raw + (base - stof_smem_u32(smem_raw)) +
                                                   STAGES * STAGE_BYTES + 16 * STAGES + 16) +
                         (warp - 4) * 16 * EPI_LD;

    // Local tile i is the CTA's i-th of its walk; its K steps are the walk's
    // i * KT .. i * KT + KT - 1.
    for (int i = COOP ? 0 : c, q = 0;; i += COOP ? 1 : 2, q++) {
        const int tile = blockIdx.x + i * gridDim.x;
        if (tile >= tiles)
            break;
        // Consumer 0's q-th tile follows consumer 1's (q - 1)-th, consumer 1's
        // q-th follows consumer 0's q-th.
        if (!COOP && i > 0)
            mbar_wait(bar_turn + 8 * c, (c == 0 ? q - 1 : q) & 1);
        const int m0 = tile / NT * BM + (COOP ? c * WG_ROWS : 0), n0 = tile % NT * BN;
        // The epilogue's residual tile is brought into the L2 while the
        // products run: 128-byte lines, a couple per thread.
        if (HAS_RESIDUAL) {
            constexpr int LPR = BN / 64;  // lines per row
            for (int l = threadIdx.x % 128; l < WG_ROWS * LPR; l += 128) {
                const int row = m0 + l / LPR, col = n0 + l % LPR * 64;
                if (row < m && col < N)
                    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(residual + (long long)row * N + col));
            }
        }

        float acc[MI][NB][WN / 8][4];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int b = 0; b < NB; b++) {
#pragma unroll
                for (int j = 0; j < WN / 8; j++)
                    acc[mi][b][j][0] = acc[mi][b][j][1] = acc[mi][b][j][2] = acc[mi][b][j][3] = 0.f;
                wg_hold(acc[mi][b]);
            }

        for (int kb = 0; kb < KT; kb++) {
            const int it = i * KT + kb, s = it % STAGES;
            mbar_wait(bar_full + 8 * s, (it / STAGES) & 1);
            const unsigned a_t = base + s * STAGE_BYTES + a_off, b_t = base + s * STAGE_BYTES + A_BYTES;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
#pragma unroll
                    for (int b = 0; b < NB; b++)
                        wg_ss(acc[mi][b], wg_desc(a_t + mi * 64 * 128 + kk * 32, 16, 1024),
                              wg_desc(b_t + b * WN * 128 + kk * 32, 16, 1024), 1);
            wg_commit();
            // The step before's products are done: release its stage.
            wg_wait1();
            if (kb > 0) {
                __syncwarp();
                if (lane == 0)
                    mbar_arrive(bar_empty + 8 * ((it - 1) % STAGES));
            }
        }
        __syncwarp();
        if (!COOP && lane == 0)
            mbar_arrive(bar_turn + 8 * (1 - c));
        wg_wait0();
        __syncwarp();
        if (lane == 0)
            mbar_arrive(bar_empty + 8 * ((i * KT + KT - 1) % STAGES));
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int b = 0; b < NB; b++)
                wg_hold(acc[mi][b]);

        // Of each n8 block j of a product, thread (g, t) holds columns
        // 8j + 2t, 8j + 2t + 1 of rows g (elements 0, 1) and g + 8 of its
        // warp's 16. They go through the warp's staging buffer, 32 columns
        // at a time, bias and activation applied on the way in.
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int cc = 0; cc < BN / 32; cc++) {
                // The chunk's residual is loaded first: its latency passes
                // while the chunk is staged.
                uint4 res[2];
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    const int row = m0 + mi * 64 + (warp % 4) * 16 + lane / 4 + 8 * p;
                    const int col = n0 + cc * 32 + (lane % 4) * 8;
                    if (HAS_RESIDUAL && row < m && (N % BN == 0 || col < N))
                        res[p] = *reinterpret_cast<const uint4 *>(residual + (long long)row * N + col);
                }
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int jj = cc * 4 + q, b = jj * 8 / WN, j = jj % (WN / 8);
                    const int col = n0 + jj * 8 + 2 * t;
                    float b0 = 0.f, b1 = 0.f;
                    if (HAS_BIAS && (N % BN == 0 || col < N)) {
                        const unsigned bb = *reinterpret_cast<const unsigned *>(bias + col);
                        b0 = to_f32((elem_t)(bb & 0xffff));
                        b1 = to_f32((elem_t)(bb >> 16));
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float2 v;
                        v.x = act(acc[mi][b][j][2 * h] + b0);
                        v.y = act(acc[mi][b][j][2 * h + 1] + b1);
                        *reinterpret_cast<float2 *>(stage + (g + 8 * h) * EPI_LD + q * 8 + 2 * t) = v;
                    }
                }
                __syncwarp();
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    const int r = lane / 4 + 8 * p, c8 = lane % 4;
                    const int row = m0 + mi * 64 + (warp % 4) * 16 + r, col = n0 + cc * 32 + c8 * 8;
                    if (row >= m || (N % BN != 0 && col >= N))
                        continue;
                    const float4 lo = *reinterpret_cast<const float4 *>(stage + r * EPI_LD + c8 * 8);
                    const float4 hi = *reinterpret_cast<const float4 *>(stage + r * EPI_LD + c8 * 8 + 4);
                    float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                    const long long at = (long long)row * N + col;
                    if (HAS_RESIDUAL) {
                        const unsigned rw[4] = {res[p].x, res[p].y, res[p].z, res[p].w};
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            v[2 * e] += to_f32((elem_t)(rw[e] & 0xffff));
                            v[2 * e + 1] += to_f32((elem_t)(rw[e] >> 16));
                        }
                    }
                    uint4 o;
                    o.x = mma_tag::pack2(v[0], v[1]);
                    o.y = mma_tag::pack2(v[2], v[3]);
                    o.z = mma_tag::pack2(v[4], v[5]);
                    o.w = mma_tag::pack2(v[6], v[7]);
                    *reinterpret_cast<uint4 *>(out + at) = o;
                }
                __syncwarp();
            }
    }
}
