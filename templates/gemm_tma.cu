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
// busy; with COOP 1 both share each tile, BLOCK_M / 2 rows each, with COOP
// 2 BLOCK_N / 2 columns each (the producer then brings W's tile in two
// boxes of BLOCK_N / 2 rows: a box has at most 256). A consumer
// waits for a stage's full barrier, issues its products, and releases the
// stage through the "empty" barrier (one arrival per consumer warp) once
// the products that read it are done. Stages are used in the producer's
// order, K step after K step, tile after tile, so the stage and phase of a
// K step follow from its place in the walk. A barrier waits for a phase by
// its parity, so no waiter may run two phases ahead: in ping-pong the
// consumers take turns (each starts a tile's K steps once the other has
// waited for all of its previous tile's), which also gives each one the
// tensor cores to itself for its products.
// Epilogue without LN: each consumer has a staging tile of its rows and
// columns in shared memory, in boxes of 64 columns with the 128-byte
// swizzle, where the copy engine brings the residual's tile (issued half
// way through the K steps, once the last tile's store has read the
// staging) and from where it stores the output (TMA, asynchronously: the
// consumer goes on to its next tile while the copy engine writes this one,
// where plain stores held the consumers for 10 to 18% of a BERT product's
// time on an H100). Bias, activation and residual are applied in fp32 on
// the accumulators, in their own layout (conflict-free under the swizzle).
// SwiGLU (ACT 4) writes one element per column pair: its staging tile is
// half as wide, in boxes of 32 columns (64-byte rows) with the 64-byte
// swizzle, stored to out [m, N / 2].
// With LN (whose tiles would lose pipeline stages to a staging tile, on an
// H100 11 to 20% of their rate): each warp stages 16 rows x 32 columns at
// a time in fp32 in a buffer of its own, reads them back as 8-element row
// pieces and adds the residual's piece (16 bytes, loaded a chunk ahead).
// out must not overlap x, w, bias or residual.
//
// LayerNorm (LN 1): a row's N columns are spread over a cluster of
// N / BLOCK_N CTAs, which walk blocks of 64 rows together (CTA rank r takes
// columns r * BLOCK_N ..), the consumers in ping-pong (COOP 0) or each on
// half of the block's columns (COOP 2: a CTA takes twice the columns, a
// row half the CTAs, and a block is one tile, so that BERT-base's 64 blocks
// at 4096 rows fill 128 SMs at once where clusters of 3 took two rounds).
// The row pieces, after bias, activation and residual, stay in registers
// (the staged chunk's accumulators); each consumer takes its rows' mean and
// sum of squared deviations over its columns (two passes over them), sends
// them to the same consumer (COOP 2: to both) of every CTA of the cluster
// (distributed shared memory, one slot per sender, written by st.async so
// that the bytes complete the receiver's barrier phase without fences),
// waits until all have arrived and combines them exactly (Chan et al.). The normalized
// pieces (times gamma, plus beta) go out as 16-byte stores. Slots and
// barriers alternate by row block, so a peer one exchange ahead cannot
// overwrite a slot not yet read.
//
// X is [m, K] and W [N, K] (nn.Linear), out and residual [m, N], row-major;
// bias, gamma, beta [N]. The launch passes TMA descriptors of X (box 64 x
// BLOCK_M), W (box 64 x BLOCK_N; COOP 2: BLOCK_N / 2) and, without LN, out
// and residual (box 64 x a consumer's rows), all with 128-byte swizzling;
// SwiGLU's out is [m, N / 2] in boxes of 32 x a consumer's rows, 64-byte.
//
// Parameters:
//   N, K       out columns (a multiple of 8) and reduction length (of 8)
//   BLOCK_M    rows per tile: 64 or 128 per consumer warpgroup
//   BLOCK_N    columns per tile: 64, 128, 192 or 256
//   STAGES     K steps in shared memory, 2 to 8
//   COOP       0: each consumer warpgroup its own tile; 1: both share one,
//              split by rows; 2: split by columns
//   MMA_TYPE   f16 or bf16: operand type of wgmma and of storage
//   BIAS       1: add bias[n]
//   ACT        after the bias: 0 none, 1 GELU (erf), 2 GELU (tanh), 3 ReLU,
//              4 SwiGLU (gemm_common.cuh; not with LN)
//   RESIDUAL   1: add residual[m, n] after the activation
//   LN         1: LayerNorm over each row (BLOCK_M 64, COOP 0 or 2, cluster N / BLOCK_N)

{{>gemm_common.cuh}}

// Enumerators, not constexpr variables: gemm_common.cuh says why.
enum : int {
    COOP = {{COOP}},
    LN = {{LN}},

    BK = 64,                      // one 128-byte swizzled row per operand row
    THREADS = 384,                // producer, two consumers
    CL = LN ? N / BN : 1,         // CTAs per cluster
    WG_ROWS = COOP == 1 ? BM / 2 : BM, // rows of a consumer's products
    WG_COLS = COOP == 2 ? BN / 2 : BN, // and columns
    MI = WG_ROWS / 64,            // m64 products per column block
    WN = WG_COLS,                 // columns of one product: m64n64, n128, n192 or n256
    NB = WG_COLS / WN,            // column blocks
    KT = (K + BK - 1) / BK,       // K steps per tile
    NT = (N + BN - 1) / BN,       // column tiles
    A_BYTES = BM * 128,
    B_BYTES = BN * 128,
    W_BOX = COOP == 2 ? BN / 2 : BN, // rows of W per TMA box
    PARTS = COOP == 2 ? 2 * CL : CL, // LN: partial statistics per row
    STAGE_BYTES = A_BYTES + B_BYTES,
    EPI_LD = 36,                  // LN: floats per staged row: 32 and 16 bytes of padding
    OUT_COLS = SWIGLU ? WG_COLS / 2 : WG_COLS, // a consumer's columns of out
    OUT_BOX = SWIGLU ? 32 : 64,   // columns of a staging box: 64 or 128 bytes a row
    OUT_BYTES = LN ? 0 : WG_ROWS * OUT_COLS * 2, // a consumer's staging tile
};

static_assert(WG_ROWS == 64 || WG_ROWS == 128, "64 or 128 rows per consumer warpgroup");
static_assert(WN == 64 || WN == 128 || WN == 192 || WN == 256, "one m64n64, n128, n192 or n256 product");
static_assert(WG_ROWS * WG_COLS / 128 <= 128, "at most 128 accumulators per consumer thread");
static_assert(!LN || (BM == 64 && COOP != 1 && N % BN == 0 && CL <= 8),
              "LN: 64-row blocks, consumers in turn or on half the columns each, at most 8 CTAs a row");
static_assert(K % 8 == 0 && N % 8 == 0, "16-byte rows");
static_assert(!SWIGLU || !LN, "SwiGLU has no LayerNorm");
static_assert(STAGES >= 2 && STAGES <= 8, "2 to 8 stages");

// The CTA's i-th tile of its walk at (m0, n0); false past the end. With LN
// the cluster walks row blocks and this CTA takes its rank's columns.
__device__ __forceinline__ bool walk(int i, int m, int &m0, int &n0)
{
    if (LN) {
        m0 = (blockIdx.x / CL + i * (gridDim.x / CL)) * BM;
        n0 = blockIdx.x % CL * BN;
        return m0 < m;
    }
    const int tile = blockIdx.x + i * gridDim.x;
    m0 = tile / NT * BM;
    n0 = tile % NT * BN;
    return tile < (m + BM - 1) / BM * NT;
}

// LN: sends this thread's rows' (mean, M2) over this consumer's columns,
// s0 for its first row and s1 for the one 8 below (the row's 4 threads hold
// the same), to slot `slot` of the exchange buffer buf in every CTA of the
// cluster with st.async, whose bytes complete the phase of bar there; waits
// for the local phase and returns each row's mean and M2 over all N
// columns (Chan et al.: M2 = sum M2_i + WG_COLS sum (mean_i - mean)^2).
// buf is [PARTS][32] float4, one per row pair (tid32 = warp % 4 * 8 + g);
// a phase of bar takes one local arrival (arm: this consumer gives it),
// which arms it for all PARTS * 512 bytes.
__device__ __forceinline__ void cluster_stats(float2 &s0, float2 &s1, unsigned buf, unsigned bar,
                                              int parity, int slot, int tid32, bool arm)
{
    if (threadIdx.x % 4 == 0) {
        const unsigned a = buf + (slot * 32 + tid32) * 16;
#pragma unroll
        for (int r = 0; r < CL; r++) {
            unsigned ra, rb;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(r));
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rb) : "r"(bar), "r"(r));
            asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32"
                         " [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(ra), "f"(s0.x), "f"(s0.y),
                         "f"(s1.x), "f"(s1.y), "r"(rb) : "memory");
        }
    }
    if (arm && threadIdx.x % 128 == 0)
        mbar_expect(bar, PARTS * 32 * 16);
    mbar_wait(bar, parity);
    float4 part[PARTS];
#pragma unroll
    for (int sl = 0; sl < PARTS; sl++)
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(part[sl].x), "=f"(part[sl].y), "=f"(part[sl].z), "=f"(part[sl].w)
                     : "r"(buf + (sl * 32 + tid32) * 16) : "memory");
    float mean0 = 0.f, mean1 = 0.f, m20 = 0.f, m21 = 0.f;
#pragma unroll
    for (int sl = 0; sl < PARTS; sl++) {
        mean0 += part[sl].x;
        mean1 += part[sl].z;
    }
    mean0 *= 1.f / PARTS;
    mean1 *= 1.f / PARTS;
#pragma unroll
    for (int sl = 0; sl < PARTS; sl++) {
        const float d0 = part[sl].x - mean0, d1 = part[sl].z - mean1;
        m20 += part[sl].y + WG_COLS * d0 * d0;
        m21 += part[sl].w + WG_COLS * d1 * d1;
    }
    s0 = make_float2(mean0, m20);
    s1 = make_float2(mean1, m21);
}

#if {{LN}}
#define STOF_CLUSTER __cluster_dims__(CL, 1, 1)
#else
#define STOF_CLUSTER
#endif

extern "C" __global__ void STOF_CLUSTER __launch_bounds__(THREADS, 1)
stof_gemm_tma(const __grid_constant__ stof_tmap tx, const __grid_constant__ stof_tmap tw,
              const __grid_constant__ stof_tmap to, const __grid_constant__ stof_tmap tr,
              const elem_t *__restrict__ bias, const elem_t *__restrict__ residual,
              const elem_t *__restrict__ gamma, const elem_t *__restrict__ beta,
              elem_t *__restrict__ out, int m, float eps)
{
    // The launch gives 1 KiB of slack to align the swizzled tiles.
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (stof_smem_u32(smem_raw) + 1023) & ~1023u;
    // Per stage: X's rows, then W's; both sizes are multiples of 1024. Then
    // the consumers' staging tiles (without LN). Then the barriers: full
    // and empty per stage; the ping-pong turns (turn[c] fires when the
    // other consumer is done waiting for its tile's stages); LN's exchange
    // per consumer and row-block parity; the residual's per consumer. Then,
    // with LN, 8 warps' staging buffers and its slots,
    // [consumer][parity][CL][32] float4.
    const unsigned out_at = base + STAGES * STAGE_BYTES, bar_full = out_at + 2 * OUT_BYTES,
                   bar_empty = bar_full + STAGES * 8, bar_turn = bar_empty + STAGES * 8,
                   bar_ln = bar_turn + 16, bar_res = bar_ln + 32;
    const unsigned stage_at = bar_res + 16, xbuf = stage_at + 8 * 16 * EPI_LD * 4;
    // The warpgroup, with 128-row tiles as lane 0 has it: ptxas then knows it is the same in
    // every lane and keeps what derives from it (stages, descriptors) in uniform registers.
    // On an H100 that made ping-pong 128x128 with the GELU 3-4% faster and the 64-row configs
    // (LN's included) 2-3% slower, so those keep the plain index.
    const int wg = BM >= 128 ? __shfl_sync(0xffffffffu, threadIdx.x / 128, 0) : threadIdx.x / 128;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; i++) {
            mbar_init(bar_full + 8 * i, 1);
            mbar_init(bar_empty + 8 * i, COOP ? 8 : 4);
        }
        mbar_init(bar_turn, 4);
        mbar_init(bar_turn + 8, 4);
        // LN's exchange: one local arrival per phase (with the byte count).
        for (int i = 0; i < 4; i++)
            mbar_init(bar_ln + 8 * i, 1);
        // The residual's tile: the issuing thread's arrival with its bytes.
        mbar_init(bar_res, 1);
        mbar_init(bar_res + 8, 1);
        // The copy engine and the cluster see the initialized barriers.
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (LN)  // no CTA arrives on a peer's barriers before they exist
        asm volatile("barrier.cluster.arrive.release.aligned;\n"
                     "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    stof_grid_wait();  // common.cuh: the kernel before this one is done

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x != 0)
            return;
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)&tx) : "memory");
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)&tw) : "memory");
        if (!LN)
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)&to) : "memory");
        int it = 0;               // K steps issued
        stof_ring<STAGES> at;     // where step it goes
        int m0, n0;
        for (int i = 0; walk(i, m, m0, n0); i++)
            for (int kb = 0; kb < KT; kb++, it++, at.next()) {
                const int s = at.stage;
                if (it >= STAGES)
                    mbar_wait(bar_empty + 8 * s, at.phase ^ 1);
                const unsigned st = base + s * STAGE_BYTES;
                mbar_expect(bar_full + 8 * s, STAGE_BYTES);
                tma_load(st, &tx, bar_full + 8 * s, kb * BK, m0);
#pragma unroll
                for (int h = 0; h < BN / W_BOX; h++)
                    tma_load(st + A_BYTES + h * W_BOX * 128, &tw, bar_full + 8 * s, kb * BK,
                             n0 + h * W_BOX);
            }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1;                      // consumer 0 or 1
    const int g = lane / 4, t = lane % 4;
    const int wrow = (warp % 4) * 16 + g;      // of each m64 block, elements 0, 1; + 8: 2, 3
    const unsigned a_off = COOP == 1 ? c * WG_ROWS * 128 : 0;
    const unsigned b_off = COOP == 2 ? c * WG_COLS * 128 : 0;
    // Without LN, this consumer's staging tile.
    const unsigned ob = out_at + c * OUT_BYTES;
    // With LN, this warp's fp32 staging buffer.
    float *const stage =
        reinterpret_cast<float *>(smem_raw + (stage_at - stof_smem_u32(smem_raw))) +
        (warp - 4) * 16 * EPI_LD;

    // Local tile i is the CTA's i-th of its walk; its K steps are the walk's
    // i * KT .. i * KT + KT - 1.
    int m0, n0;
    for (int i = COOP ? 0 : c, q = 0; walk(i, m, m0, n0); i += COOP ? 1 : 2, q++) {
        // Consumer 0's q-th tile follows consumer 1's (q - 1)-th, consumer 1's
        // q-th follows consumer 0's q-th.
        if (!COOP && i > 0)
            mbar_wait(bar_turn + 8 * c, (c == 0 ? q - 1 : q) & 1);
        // This consumer's part of the tile.
        if (COOP == 1)
            m0 += c * WG_ROWS;
        if (COOP == 2)
            n0 += c * WG_COLS;
        // LN: the epilogue's residual tile is brought into the L2 while the
        // products run: 128-byte lines, a couple per thread.
        if (LN && HAS_RESIDUAL) {
            constexpr int LPR = WG_COLS / 64;  // lines per row
            for (int l = threadIdx.x % 128; l < WG_ROWS * LPR; l += 128) {
                const int row = m0 + l / LPR, col = n0 + l % LPR * 64;
                const elem_t *line = residual + (long long)row * N + col;
                if (row < m && col < N)
                    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(line));
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

        // K step i * KT + kb's stage: one quotient a tile, none a step.
        stof_ring<STAGES> p = stof_ring<STAGES>::at(i * KT);
        int prev = 0;  // the step before's stage
        for (int kb = 0; kb < KT; kb++, p.next()) {
            const int s = p.stage;
            mbar_wait(bar_full + 8 * s, p.phase);
            const unsigned long long ad = wg_desc(base + s * STAGE_BYTES + a_off, 16, 1024),
                                     bd = wg_desc(base + s * STAGE_BYTES + A_BYTES + b_off, 16, 1024);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
                for (int mi = 0; mi < MI; mi++)
#pragma unroll
                    for (int b = 0; b < NB; b++)
                        wg_ss(acc[mi][b], wg_desc_add(ad, mi * 64 * 128 + kk * 32),
                              wg_desc_add(bd, b * WN * 128 + kk * 32), 1);
            wg_commit();
            // Without LN, half way: the residual's tile into the staging
            // tile, once the last tile's store has read it.
            if (!LN && HAS_RESIDUAL && kb == KT / 2 && threadIdx.x % 128 == 0) {
                tma_wait_read();
                mbar_expect(bar_res + 8 * c, OUT_BYTES);
#pragma unroll
                for (int bx = 0; bx < WG_COLS / 64; bx++)
                    tma_load(ob + bx * WG_ROWS * 128, &tr, bar_res + 8 * c, n0 + bx * 64, m0);
            }
            // The step before's products are done: release its stage.
            wg_wait1();
            if (kb > 0) {
                __syncwarp();
                if (lane == 0)
                    mbar_arrive(bar_empty + 8 * prev);
            }
            prev = s;
        }
        __syncwarp();
        if (!COOP && lane == 0)
            mbar_arrive(bar_turn + 8 * (1 - c));
        wg_wait0();
        __syncwarp();
        if (lane == 0)
            mbar_arrive(bar_empty + 8 * prev);
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int b = 0; b < NB; b++)
                wg_hold(acc[mi][b]);

        if (!LN) {
            // The staging tile is free (the last store has read it) and,
            // with a residual, holds this tile's residual.
            if (HAS_RESIDUAL) {
                mbar_wait(bar_res + 8 * c, q & 1);
            } else {
                if (threadIdx.x % 128 == 0)
                    tma_wait_read();
                named_sync(1 + c, 128);
            }
            // Thread (g, t) holds, of each n8 block j of a product, columns
            // 8j + 2t and 8j + 2t + 1 of rows wrow (elements 0, 1) and
            // wrow + 8 (2, 3): 4 bytes at the swizzled 16-byte chunk of
            // column 8j of its 64-column box. SwiGLU: the pair is out's
            // column 4j + t, 2 bytes in its 32-column box, whose 64-byte
            // rows swizzle their 4 chunks by (row / 2) % 4.
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int b = 0; b < NB; b++)
#pragma unroll
                    for (int j = 0; j < WN / 8; j++) {
                        const int cl = b * WN + j * 8;
                        const float2 bv = bias_pair(bias, n0 + cl + 2 * t);
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int r = mi * 64 + wrow + 8 * h;
                            float v0 = stof_act<ACT>(acc[mi][b][j][2 * h] + bv.x),
                                  v1 = stof_act<ACT>(acc[mi][b][j][2 * h + 1] + bv.y);
                            if (SWIGLU) {
                                const int oc = cl / 2 + t;
                                const unsigned so = ob + oc / 32 * WG_ROWS * 64 + r * 64 +
                                                    (((oc % 32) / 8) ^ ((r / 2) % 4)) * 16 +
                                                    (oc % 8) * 2;
                                asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(so),
                                             "h"(swiglu_out(v0, v1)));
                                continue;
                            }
                            const unsigned at = ob + cl / 64 * WG_ROWS * 128 + r * 128 +
                                                (((cl % 64) / 8) ^ (r % 8)) * 16 + 4 * t;
                            if (HAS_RESIDUAL) {
                                unsigned rw;
                                asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(rw) : "r"(at));
                                v0 += to_f32((elem_t)(rw & 0xffff));
                                v1 += to_f32((elem_t)(rw >> 16));
                            }
                            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at),
                                         "r"(mma_tag::pack2(v0, v1)));
                        }
                    }
            // Once every thread's pieces are in, the copy engine stores the
            // tile, a box at a time, leaving out the rows and columns past
            // the ends.
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            named_sync(1 + c, 128);
            if (threadIdx.x % 128 == 0) {
#pragma unroll
                for (int bx = 0; bx < OUT_COLS / OUT_BOX; bx++)
                    tma_store(&to, ob + bx * WG_ROWS * OUT_BOX * 2,
                              (SWIGLU ? n0 / 2 : n0) + bx * OUT_BOX, m0);
                tma_commit();
            }
            continue;
        }

        // LN: of each n8 block j of a product, thread (g, t) holds columns
        // 8j + 2t, 8j + 2t + 1 of rows wrow (elements 0, 1) and wrow + 8.
        // They go through the warp's staging buffer, 32 columns of its 16
        // rows at a time, bias and activation applied on the way in, and
        // come back as 8-element row pieces: lane l takes columns
        // 8 (l % 4) .. of rows l / 4 and l / 4 + 8 (p = 0, 1), the same
        // rows as before, so that a row's 4 threads are still a quad. The
        // residual's pieces are loaded a chunk ahead, 16 bytes each. The
        // pieces stay in the chunk's (now free) accumulators until the
        // row's statistics are in.
        constexpr int CHUNKS = WG_COLS / 32;
        uint4 res_next[2];
        const auto load_res = [&](int mi, int cc, uint4 (&r)[2]) {
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const int row = m0 + mi * 64 + (warp % 4) * 16 + lane / 4 + 8 * p;
                const int col = n0 + cc * 32 + (lane % 4) * 8;
                if (HAS_RESIDUAL && row < m && (N % BN == 0 || col < N))
                    r[p] = *reinterpret_cast<const uint4 *>(residual + (long long)row * N + col);
            }
        };
        load_res(0, 0, res_next);
        float2 part = make_float2(0.f, 0.f);  // LN: the rows' sums
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int cc = 0; cc < CHUNKS; cc++) {
                uint4 res[2] = {res_next[0], res_next[1]};
                if (cc + 1 < CHUNKS)
                    load_res(mi, cc + 1, res_next);
                else if (mi + 1 < MI)
                    load_res(mi + 1, 0, res_next);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int jj = cc * 4 + q, b = jj * 8 / WN, j = jj % (WN / 8);
                    const float2 bv = bias_pair(bias, n0 + jj * 8 + 2 * t);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float2 v;
                        v.x = stof_act<ACT>(acc[mi][b][j][2 * h] + bv.x);
                        v.y = stof_act<ACT>(acc[mi][b][j][2 * h + 1] + bv.y);
                        *reinterpret_cast<float2 *>(stage + (g + 8 * h) * EPI_LD + q * 8 + 2 * t) = v;
                    }
                }
                __syncwarp();
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    const int r = lane / 4 + 8 * p, c8 = lane % 4;
                    const int row = m0 + mi * 64 + (warp % 4) * 16 + r, col = n0 + cc * 32 + c8 * 8;
                    const float4 lo = *reinterpret_cast<const float4 *>(stage + r * EPI_LD + c8 * 8);
                    const float4 hi = *reinterpret_cast<const float4 *>(stage + r * EPI_LD + c8 * 8 + 4);
                    float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                    if (HAS_RESIDUAL && row < m && (N % BN == 0 || col < N)) {
                        const unsigned rw[4] = {res[p].x, res[p].y, res[p].z, res[p].w};
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            v[2 * e] += to_f32((elem_t)(rw[e] & 0xffff));
                            v[2 * e + 1] += to_f32((elem_t)(rw[e] >> 16));
                        }
                    }
                    // Piece p of chunk cc in the chunk's accumulators (MI =
                    // NB = 1), 4 per n8 block.
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        acc[0][0][cc * 4 + 2 * p + k / 4][k % 4] = v[k];
                        (p ? part.y : part.x) += v[k];
                    }
                }
                __syncwarp();
            }
        if (LN) {
            // This CTA's mean and squared deviations of each row (over the
            // row's 4 threads), then the cluster's; then the pieces
            // normalized, times gamma, plus beta.
            part.x = stof_group_sum<4>(part.x) * (1.f / WG_COLS);
            part.y = stof_group_sum<4>(part.y) * (1.f / WG_COLS);
            float2 dev = make_float2(0.f, 0.f);
#pragma unroll
            for (int cc = 0; cc < CHUNKS; cc++)
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float d0 = acc[0][0][cc * 4 + k / 4][k % 4] - part.x;
                    const float d1 = acc[0][0][cc * 4 + 2 + k / 4][k % 4] - part.y;
                    dev.x += d0 * d0;
                    dev.y += d1 * d1;
                }
            float2 s0 = make_float2(part.x, stof_group_sum<4>(dev.x)),
                   s1 = make_float2(part.y, stof_group_sum<4>(dev.y));
            // Double-buffered by row block: a peer's next exchange can reach
            // this CTA only after this one's, which follows its reads here.
            // COOP 2: the consumers share the buffers (consumer 0 arms them).
            const int pb = (COOP == 2 ? 0 : c * 2) + (q & 1);
            cluster_stats(s0, s1, xbuf + pb * PARTS * 512, bar_ln + 8 * pb, (q >> 1) & 1,
                          COOP == 2 ? blockIdx.x % CL * 2 + c : blockIdx.x % CL, warp % 4 * 8 + g,
                          COOP != 2 || c == 0);
            const float mean[2] = {s0.x, s1.x};
            const float rstd[2] = {rsqrtf(s0.y * (1.f / N) + eps), rsqrtf(s1.y * (1.f / N) + eps)};
#pragma unroll
            for (int cc = 0; cc < CHUNKS; cc++) {
                const int col = n0 + cc * 32 + (lane % 4) * 8;
                const uint4 gg = *reinterpret_cast<const uint4 *>(gamma + col);
                const uint4 be = *reinterpret_cast<const uint4 *>(beta + col);
                const unsigned gw[4] = {gg.x, gg.y, gg.z, gg.w}, bw[4] = {be.x, be.y, be.z, be.w};
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    const int row = m0 + (warp % 4) * 16 + lane / 4 + 8 * p;
                    if (row >= m)
                        continue;
                    unsigned o[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float v0 = acc[0][0][cc * 4 + 2 * p + e / 2][(2 * e) % 4],
                                    v1 = acc[0][0][cc * 4 + 2 * p + e / 2][(2 * e + 1) % 4];
                        o[e] = mma_tag::pack2(
                            (v0 - mean[p]) * rstd[p] * to_f32((elem_t)(gw[e] & 0xffff)) +
                                to_f32((elem_t)(bw[e] & 0xffff)),
                            (v1 - mean[p]) * rstd[p] * to_f32((elem_t)(gw[e] >> 16)) +
                                to_f32((elem_t)(bw[e] >> 16)));
                    }
                    *reinterpret_cast<uint4 *>(out + (long long)row * N + col) =
                        make_uint4(o[0], o[1], o[2], o[3]);
                }
            }
        }
    }
    // The last store has read its staging tile before the CTA leaves.
    if (!LN && threadIdx.x % 128 == 0)
        tma_wait_read();
}
