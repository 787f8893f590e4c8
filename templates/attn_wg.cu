// attn_wg.cu — masked multi-head attention on Hopper's warpgroup MMA (sm_90a).
//
// The same walk as attn.cu — one CTA per (query group, batch*head), only the
// key tiles listed for the group, full tiles unmasked, partial ones by their
// bitmap, online softmax in fp32 — with the products on wgmma: each
// warpgroup (4 warps) owns 64 query rows; S = Q·Kᵀ reads Q and K from shared
// memory through matrix descriptors, O += P·V takes P from registers (the
// accumulator layout of S is already the A operand's) and V, N-major, from
// shared memory. Q, K and V tiles are stored in the 128-byte swizzled layout
// the descriptors name: per 64-column half of the head, rows of 128 bytes
// whose 16-byte chunks are XORed with the row's index mod 8, each half
// 1024-byte aligned. cp.async fills them, STAGES deep, each stage guarded by
// a pair of shared-memory barriers instead of CTA-wide syncs; a proxy fence
// makes those generic-proxy writes visible to the tensor cores. The wgmma
// and barrier wrappers come from wgmma.cuh, the request's part.
//
// Parameters:
//   HEAD_DIM   64 or 128 (whole 128-byte rows per half)
//   BLOCK_M    query rows per CTA: 64 per warpgroup (64, 128 or 192)
//   BLOCK_N    keys per tile: 64 or 128
//   STAGES     K and V tiles in shared memory, 2 to 4: loads run STAGES - 2
//              tiles ahead of the products, and warpgroups up to a tile
//              apart
//   MMA_TYPE   f16 or bf16 (wgmma.cuh uses it too)
//   GATHER_Q / BLOCK_Q, GATHER_K / BLOCK_K   as in attn.cu{{#if GROUP}}
//   GROUP, SOFTCAP   as in attn.cu{{/if}}{{#if SOFTCAP}}
//   (SOFTCAP: the scores capped where the softmax step starts){{/if}}{{#if VARLEN}}
//   VARLEN     as in attn.cu: rows and keys copied row by row, within the sequence{{/if}}{{#if MODS}}
//   MODS, ALIBI, BIAS   the score modifiers (attn_common.cuh), after the cap{{/if}}

{{>attn_common.cuh}}

#define D {{HEAD_DIM}}
#define BM {{BLOCK_M}}
#define BN {{BLOCK_N}}
#define STAGES {{STAGES}}
#define THREADS (BM * 2)           // 128 threads per 64 rows
#define WPR ((BN + 31) / 32)       // bitmap words per tile row
#define HALVES (D / 64)            // 128-byte row halves of the head
#define GATHER_Q {{GATHER_Q}}      // 1: query rows from qidx, 0: consecutive

typedef unsigned short elem_t;
typedef stof_{{MMA_TYPE}}_tag mma_tag;

// ---- the kernel ----------------------------------------------------------------

// Tiles of R rows of D elements go to shared memory in the swizzled layout.
// Thread x copies chunk c = x % CHUNKS of rows r0 + k * STEP, r0 = x / CHUNKS:
// its chunk, and the chunk's swizzled place in a row, stay the same for
// every k (STEP is a multiple of 8), so only the row moves.
#define CHUNKS (D / 8)             // 16-byte chunks per row
#define STEP (THREADS / CHUNKS)    // rows per pass of the CTA

template <int R>
__device__ __forceinline__ unsigned chunk_dst(unsigned dst)
{
    return attn_swizzled<R>(dst, threadIdx.x % CHUNKS, threadIdx.x / CHUNKS);
}

// Gathered rows: row r is rows(r) of base, -1 = zeros.
template <int R, typename RowFn>
__device__ __forceinline__ void load_rows(unsigned dst, const elem_t *base, long long stride, RowFn rows)
{
    const int c = threadIdx.x % CHUNKS, r0 = threadIdx.x / CHUNKS;
    const unsigned d0 = chunk_dst<R>(dst);
#pragma unroll
    for (int k = 0; k < (R + STEP - 1) / STEP; k++) {
        const int r = r0 + k * STEP;
        if (R % STEP != 0 && r >= R)
            break;
        const int src = rows(r);
        const elem_t *p = base + (src >= 0 ? (long long)src * stride : 0) + c * 8;
        stof_cp16(d0 + k * STEP * 128, p, src >= 0 ? 16 : 0);
    }
}

// Consecutive rows first, first + 1, ... of base, those at or past lim as
// zeros: one address product per tile, then a step per pass.
template <int R>
__device__ __forceinline__ void load_block(unsigned dst, const elem_t *base, long long stride,
                                           int first, int lim)
{
    const int c = threadIdx.x % CHUNKS, r0 = threadIdx.x / CHUNKS;
    const unsigned d0 = chunk_dst<R>(dst);
    const elem_t *p = base + (long long)(first + r0) * stride + c * 8;
#pragma unroll
    for (int k = 0; k < (R + STEP - 1) / STEP; k++) {
        const int r = r0 + k * STEP;
        if (R % STEP != 0 && r >= R)
            break;
        const bool ok = first + r < lim;
        stof_cp16(d0 + k * STEP * 128, ok ? p : base, ok ? 16 : 0);
        p += STEP * stride;
    }
}
{{#if VARLEN}}
// load_block for a sequence's rows [lo, lim): rows outside it (a
// neighbour's) as zeros; a tile wholly inside copies as load_block does.
template <int R>
__device__ __forceinline__ void load_span(unsigned dst, const elem_t *base, long long stride,
                                          int first, int lo, int lim)
{
    const int c = threadIdx.x % CHUNKS, r0 = threadIdx.x / CHUNKS;
    const unsigned d0 = chunk_dst<R>(dst);
    const elem_t *p = base + (long long)(first + r0) * stride + c * 8;
#pragma unroll
    for (int k = 0; k < (R + STEP - 1) / STEP; k++) {
        const int r = r0 + k * STEP;
        if (R % STEP != 0 && r >= R)
            break;
        const bool ok = first + r >= lo && first + r < lim;
        stof_cp16(d0 + k * STEP * 128, ok ? p : base, ok ? 16 : 0);
        p += STEP * stride;
    }
}
{{/if}}
extern "C" __global__ void __launch_bounds__(THREADS) stof_attn(ATTN_ITEM_PARAMS)
{
    stof_grid_wait();  // common.cuh: the kernel before this one is done
    // The launch gives 1 KiB of slack to align the swizzled tiles.
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned raw = stof_smem_u32(smem_raw);
    const unsigned Qs = (raw + 1023) & ~1023u;
    const unsigned Ks = Qs + BM * D * 2;            // STAGES tiles of BN * D
    const unsigned Vs = Ks + STAGES * BN * D * 2;
    // Per stage: "full" (every thread's copies landed) and "empty" (every
    // warp done reading) barriers.
    const unsigned bar_full = Vs + STAGES * BN * D * 2, bar_empty = bar_full + STAGES * 8;

    const stof_item item = stof_work_item(work);{{#unless VARLEN}}
    const int group = item.group, t0 = item.t0, t1 = item.t1;{{/if}}{{#if VARLEN}}
    const int group = item.group;
    int t0 = item.t0, t1 = item.t1;  // cut to the sequence's keys below{{/if}}
    const int b = blockIdx.y, h = blockIdx.x;
    // The rest of the tile list into L1 while the first copies fly.
    if (threadIdx.x == 0 && t1 > t0 + 1)
        asm volatile("prefetch.global.L1 [%0];\n"
                     "prefetch.global.L1 [%1];\n" ::"l"(tile_key + t0 + 1), "l"(tile_bits + t0 + 1));
    ATTN_ITEM_SLICES(b, h);  // qlim, klim; qb, kb, vb, ob{{#if VARLEN}}
    if (attn_group_idle<GATHER_Q, BM>(group, qlo, qlim))
        return;  // the sequence is shorter: nothing to read, nothing to write{{/if}}{{#if VARLEN}}{{#if BLOCK_K}}
    {  // tiles wholly outside the sequence's keys are not walked
        const int2 w = attn_tiles_within<BN>(tile_key, t0, t1, klo, klim, lk);
        t0 = w.x;
        t1 = w.y;
    }{{/if}}{{/if}}

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int wg = warp / 4;           // warpgroup: rows 64 wg .. 64 wg + 63
    const int wrow = warp * 16;        // this warp's first row in the group
{{#unless VARLEN}}
    auto qrow = [&](int r) -> int { return attn_row<GATHER_Q>(qidx, group * BM, r, lq); };{{/if}}{{#if VARLEN}}
    // Only the sequence's own rows are read and written, never a neighbour's.
    auto qrow = [&](int r) -> int {
        return attn_from(attn_row<GATHER_Q>(qidx, group * BM, r, qlim), qlo);
    };{{/if}}

    // The first tile's key comes with the work item.
    auto load_tile = [&](int it, int stage) {
        const int key = it == {{#if VARLEN}}item.{{/if}}t0 ? item.key0 : tile_key[it];
{{#if GATHER_K}}
        const int *ix = kidx + (long long)key * BN;  // key: the tile's offset into kidx, in tiles{{#unless VARLEN}}
        auto row = [&](int r) -> int { return attn_row<true>(ix, 0, r, lk); };{{/if}}{{#if VARLEN}}
        auto row = [&](int r) -> int { return attn_from(attn_row<true>(ix, 0, r, klim), klo); };{{/if}}
        load_rows<BN>(Ks + stage * BN * D * 2, kb, k_sl, row);
        load_rows<BN>(Vs + stage * BN * D * 2, vb, v_sl, row);
{{/if}}
{{#if BLOCK_K}}
        // key is the tile's first key.{{#unless VARLEN}}
        load_block<BN>(Ks + stage * BN * D * 2, kb, k_sl, key, lk);
        load_block<BN>(Vs + stage * BN * D * 2, vb, v_sl, key, lk);{{/if}}{{#if VARLEN}}
        load_span<BN>(Ks + stage * BN * D * 2, kb, k_sl, key, klo, klim);
        load_span<BN>(Vs + stage * BN * D * 2, vb, v_sl, key, klo, klim);{{/if}}
{{/if}}
    };

    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; i++) {
            mbar_init(bar_full + 8 * i, THREADS);
            mbar_init(bar_empty + 8 * i, THREADS / 32);
        }
    }
    __syncthreads();

    // Tile j of the walk (tile t0 + j) lives in stage j mod STAGES. Every
    // thread copies its share and arms the stage's full barrier to fire when
    // its copies land; the stage is reused only once every warp has released
    // tile j - STAGES. Tiles are issued STAGES - 2 ahead, so one warpgroup
    // can run up to a tile ahead of another (its products overlapping their
    // softmax) instead of meeting them at a CTA barrier every tile.
    const int ntiles = t1 - t0;
    stof_ring<STAGES> iss, cons;  // the next tile issued's stage, the next consumed's
    auto issue = [&](int j) {     // j: 0, 1, 2, ... in turn
        const int stage = iss.stage;
        if (j >= STAGES)
            mbar_wait(bar_empty + 8 * stage, iss.phase ^ 1);
        iss.next();
        if (j == 0) {
{{#if GATHER_Q}}
            load_rows<BM>(Qs, qb, q_sl, qrow);
{{/if}}
{{#if BLOCK_Q}}{{#unless VARLEN}}
            load_block<BM>(Qs, qb, q_sl, group * BM, lq);{{/if}}{{#if VARLEN}}
            load_span<BM>(Qs, qb, q_sl, group * BM, qlo, qlim);{{/if}}
{{/if}}
        }
        load_tile(t0 + j, stage);
        cp_arrive_noinc(bar_full + 8 * stage);
    };
#pragma unroll
    for (int j = 0; j < STAGES - 2; j++)
        if (j < ntiles)
            issue(j);
    float o[D / 8][4];
    float m[2] = {-STOF_INF, -STOF_INF}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    const unsigned q_wg = Qs + wg * 64 * 128;  // this warpgroup's rows, in each half{{#if MODS}}
    const stof_mods mods = stof_mods_of(h, scale_log2, alibi_slopes, bias_table);
    // The positions of the thread's rows among the keys.
    const int mpos0 = qrow(wrow + g) + lk - lq, mpos1 = qrow(wrow + g + 8) + lk - lq;{{/if}}


    // Masks tile it's scores (only where needed: a partial tile's bitmap,
    // keys past the valid length), runs the softmax step, and issues
    // O += P V (V's rows are the keys, read N-major), committed, not waited for.
    auto softmax_pv = [&](float (&s)[BN / 8][4], int it, int stage) {
        const int bm = tile_bits[it];{{#if SOFTCAP}}
        stof_softcap(s, scale_log2);{{/if}}
{{#if GATHER_K}}
        const int *kix = kidx + (long long)tile_key[it] * BN;
        // Padding keys (-1) are never in a bitmap and full tiles have none:
        // only a shortened sequence needs the keys checked.
        const bool edge = {{#if VARLEN}}klo > 0 || {{/if}}klim < lk;
        auto key_ok = [&](int c) { return kix[c] >= {{#if VARLEN}}klo{{/if}}{{#unless VARLEN}}0{{/if}} && kix[c] < klim; };
{{/if}}
{{#if BLOCK_K}}
        const int kfirst = tile_key[it];
        const bool edge = {{#if VARLEN}}kfirst < klo || {{/if}}kfirst + BN > klim;
        auto key_ok = [&](int c) { return {{#if VARLEN}}kfirst + c >= klo && {{/if}}kfirst + c < klim; };
{{/if}}{{#if MODS}}
        stof_score_mods(s, mods, mpos0, mpos1, t, [&](int c) {
            return {{#if GATHER_K}}kix[c]{{/if}}{{#if BLOCK_K}}kfirst + c{{/if}};
        });{{/if}}
        if (bm >= 0 || edge) {
            const unsigned *w0 = bm < 0 ? nullptr : bits + ((long long)bm * BM + wrow + g) * WPR;
            stof_mask_scores<BN / 8, WPR>(s, w0, w0 ? w0 + 8 * WPR : nullptr, t, edge, key_ok);
        }
        unsigned pf[BN / 16][4];
        stof_softmax_step<mma_tag>(s, o, m, l, pf, scale_log2);
        const unsigned vt = Vs + stage * BN * D * 2;
        wg_hold(o);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wg_rs(o, pf[kk], wg_desc(vt + kk * 16 * 128, BN * 128, 1024));
        wg_commit();
    };

    for (int j = 0; j < ntiles; j++, cons.next()) {
        const int stage = cons.stage, it = t0 + j;
        if (j + STAGES - 2 < ntiles)
            issue(j + STAGES - 2);
        mbar_wait(bar_full + 8 * stage, cons.phase);
        // cp.async wrote through the generic proxy; wgmma reads through the async one.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        float s[BN / 8][4];
        wg_qk<D, BM, BN>(s, q_wg, Ks + stage * BN * D * 2);
        wg_wait0();
        wg_hold(s);
        softmax_pv(s, it, stage);
        wg_wait0();
        wg_hold(o);
        __syncwarp();
        if (lane == 0)
            mbar_arrive(bar_empty + 8 * stage);
    }
    stof_cp_wait<0>();  // nothing in flight at exit, even with no tile to walk

    const int rows[2] = {qrow(wrow + g), qrow(wrow + g + 8)};
    stof_store_rows<mma_tag>(o, l, ob, o_sl, rows, qlim, t);
}
