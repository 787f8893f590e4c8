// attn_ws.cu — block-sparse masked attention on sm_90a as a persistent,
// warp-specialized kernel: the walk of attn_wg.cu (a group's listed key
// tiles, full tiles unmasked, partial ones by their bitmap, online softmax
// in fp32) with the loads taken off the consumers.
//
// Work: an item is one query group of BLOCK_M rows of one (batch, head),
// {group, first tile, end tile, batch << 16 | head}, one 16-byte load. The
// host deals the items to the CTAs of a persistent grid (heaviest first
// within runs of heads whose K and V share the L2, each to the CTA with
// the least work so far): CTA x walks items first[x] .. first[x + 1] - 1.
//
// Warpgroups: a producer and NC = BLOCK_M / 64 consumers. The producer
// gives most of its registers to the consumers (setmaxnreg); one of its
// warps walks the CTA's items: per item it waits until every consumer is
// done reading Q's buffer (one, or two used in turn with LAG below), loads
// Q (BLOCK_M rows), then each listed tile's K and V
// (BLOCK_N rows each, keys read 32 tiles at a time across the warp) into a
// ring of STAGES stages. Each copy is a TMA box of one swizzle atom's
// columns (SW below) into the swizzled layout wgmma reads (wgmma.cuh), rows
// past the tensor's end read as zeros; K and V have "full" barriers (bytes
// landed) and "empty" barriers (one arrival per consumer warp) of their
// own, so S can start before V lands. The producer also reads the metadata
// for the consumers, who would otherwise wait on those global loads at
// every item and tile: before it arrives on Q's barrier it writes the item
// (group, tiles, batch and head, sequence length) to shared memory, and
// before K's, the tile's first key and bitmap index; a partial tile's
// bitmap (BLOCK_M rows of its words) comes with K by a bulk copy. The
// consumers release K's stage once they have masked with it.
//
// Consumers: warpgroup c owns rows 64c .. 64c + 63 of the item. Tile j's
// step issues S_j = Q K_jᵀ and O += P_{j-1} V_{j-1} back to back, masks
// S_j once it is done and takes its softmax (P_j in fp32, the factor
// alpha); ptxas puts the P V product's wait before the softmax (forcing the
// softmax ahead of it measured slower: the other consumers' products cover
// it). Then it rescales O and packs P_j for the next step: in registers,
// or with P_SMEM in the warpgroup's own shared-memory tile (128-byte
// swizzled atoms of 64 keys), which frees BLOCK_N / 4 registers a thread
// so that 192-row items with 128- and 144-key tiles fit at head_dim 80
// and 96 (the P V product then reads P with a descriptor, as it reads V).
// With three consumers at head_dim 64 and P in registers (SUM_MMA), the
// tensor cores take the row sums too: the P V product runs as m64n72, its
// last 8 columns reading an atom of ones, so O's ninth block holds P's row
// sums, rescaled with O; the softmax then adds nothing up (64 FADDs fewer a
// tile and thread, where these consumers are bound by instruction issue:
// dense and causal L 4096 +1.9% and +1.4% on an H100; with two consumers,
// whose tensor cores are the busier side, 128-row items ran 1.5-4% slower
// with it, so they keep the sums in the softmax). The consumers take turns
// issuing their products (named barriers, round robin), so that one's
// softmax runs while another's products keep the tensor cores busy. With
// LAG, warpgroup 1 starts with an empty turn and so walks a step behind
// warpgroup 0: an item's start (S_0 issued and waited for alone, its
// softmax) and end (the last P V, the epilogue), where a consumer's own
// products cannot cover its softmax, then overlap the other's products
// instead of idling with them. The leader starts an item while the other
// still reads the last one's Q, so Q and the item come in two buffers, used
// in turn. This pays on short walks (window:256 at head_dim 64: 5% on an
// H100) and needs a stage more to keep the loads ahead of the lagging
// consumer's releases: 128-key tiles with 3 or 4 stages only (with 64-key
// tiles it ran 4-12% slower).
//
// With SIT_OUT a consumer whose 64 rows all lie past the tensor's last row
// (the last query group of a length that leaves it a warpgroup or more
// short) takes the item's turns and nothing else: no products, no softmax,
// no store; the producer's warp arrives on each stage's empty barriers for
// it.
//
// The epilogue divides by the row sums, writes the warpgroup's 64 rows into
// its own staging buffer in the swizzled layout and stores it with TMA (rows
// past the sequence length come out as zeros, rows past the tensor's end are
// not written). With P_SMEM the staging buffer is the warpgroup's P tile,
// free once the last P V product is done (O_IN_P): the next item's first P
// waits until the store has read it. The 36 KiB this saves at 192 rows and
// head_dim 96 are what 144-key tiles need.
//
// The launch passes TMA descriptors of Q, K, V and O as 4-D tensors
// (head_dim, length, heads, batch), boxes of SW / 2 columns by BLOCK_M (Q),
// BLOCK_N (K, V) and 64 (O) rows, swizzled over SW bytes.
//
// With GATHER the item's rows and each tile's keys are gathered (the
// gathered kind of attn_tiles: a group's rows are listed in qidx, a tile's
// keys in kidx, -1 for padding), which a TMA box cannot read: all four
// producer warps copy Q, K and V row by row with cp.async into the same
// swizzled layout (zeros for padding and rows past the end) and arrive on
// the "full" barriers as their copies land; the consumers fence those
// generic-proxy writes before wgmma reads them, and store O's rows to
// their places from registers. The rest of the walk is the block kind's.
// (A TMA box of one row per row, issued from one warp, ran 4x slower than
// these copies on an H100: the copy engine's pace is per request.)
//
// With PERIOD > 1 the gathered rows and keys are residue classes read by
// TMA instead: where every group lists rows q0, q0 + PERIOD, q0 + 2 PERIOD
// ... and every tile keys k0, k0 + PERIOD, ... (a dilated mask whose
// lengths PERIOD divides), the descriptors view each tensor as (head_dim,
// length / PERIOD, PERIOD, heads, batch), and a group's rows, a tile's keys
// and O's rows are boxes of that view at (q0 / PERIOD, q0 % PERIOD). The
// host gives each item's first row (q0) in place of its group and each
// tile's first key (k0) in place of its key list; the walk is the block
// kind's, row r of an item being q0 + PERIOD r and key c of a tile k0 +
// PERIOD c.
//
// Parameters:
//   HEAD_DIM   64, 80, 96 or 128
//   BLOCK_M    query rows per item: 64 per consumer warpgroup, 128 or 192
//   BLOCK_N    keys per tile: 64, 96, 128, 144 or 192
//   STAGES     K and V tiles in shared memory, 2 to 4
//   P_SMEM     1: P through shared memory, 0: in registers
//   SIT_OUT    1: consumers whose rows all lie past lq sit the item out
//              (the host deals such items as lighter), 0: lq leaves none
//   GATHER     1: gathered rows and keys (head_dim 64 or 128, BLOCK_M 128, SIT_OUT 0)
//   PERIOD     rows and keys a residue class apart (GATHER 0, SIT_OUT 0), 1: consecutive
//   MMA_TYPE   f16 or bf16 (wgmma.cuh uses it too){{#if GROUP}}
//   GROUP      query heads per KV head (attn_common.cuh): K and V's descriptors
//              (or, with GATHER, their pointers) are of heads / GROUP heads{{/if}}{{#if SOFTCAP}}
//   SOFTCAP    the logit softcap (attn_common.cuh), taken where a tile is masked{{/if}}{{#if VARLEN}}
//   VARLEN     packed variable-length sequences (attn_common.cuh; PERIOD 1): below
//
// VARLEN: q, k, v and out are one batch of the packed rows (the tensor maps'
// batch is 1), and an item's "batch" is its sequence's slot, the host's deal
// being the same for every composition (a query group of the longest
// sequence, a head, a slot). The producer reads the slot's boundaries
// (attn_varlen_span) and publishes, with the item, the buffer row of the
// plan's row 0 and the sequence's rows [qlo, qlim) and keys [klo, klim); an
// item holding none of the sequence's rows (a shorter sequence, a slot past
// the run's nseq) loads nothing and has no tiles (-1): the consumers give Q's
// buffer back and take its turns as an empty item's. Tiles holding none of
// the sequence's keys are not loaded (the item's count is of the others);
// the keys of a loaded tile outside [klo, klim), a neighbour's, are masked.
// A warpgroup's 64 rows go out as a TMA box only where all of them are the
// sequence's (a box writes whole): the box that would cross its first or
// last row is stored row by row from registers, the sequence's rows only.{{/if}}{{#if MODS}}
//   MODS, ALIBI, BIAS   the score modifiers (attn_common.cuh), after the cap{{/if}}

{{>attn_common.cuh}}

// Enumerators, not constexpr variables: gemm_common.cuh says why.
enum : int {
    D = {{HEAD_DIM}},
    BM = {{BLOCK_M}},
    BN = {{BLOCK_N}},
    STAGES = {{STAGES}},
    P_SMEM = {{P_SMEM}},
    NC = BM / 64,                  // consumer warpgroups
    THREADS = 128 * (NC + 1),
    // The head's columns in swizzled atoms of SW bytes a row: 64 columns to an
    // atom (128-byte swizzle) at head_dim 64 and 128, 32 (64-byte) at 80 and
    // 96, so that neither is padded to 128. At 80 the last atom's columns
    // 80-95 are laid out (the loads fill them with zeros) and the products
    // leave them out: S takes five k16 steps, O is m64n80.
    SW = D % 64 == 0 ? 128 : 64,
    AW = SW / 2,                   // columns per atom
    ATOMS = (D + AW - 1) / AW,
    DA = ATOMS * AW,               // columns laid out
    WPR = (BN + 31) / 32,          // bitmap words per tile row
    Q_BYTES = BM * DA * 2, KV_BYTES = BN * DA * 2, O_BYTES = 64 * DA * 2,
    PK = (BN + 63) / 64 * 64,             // keys laid out in P's tile: whole atoms
    P_BYTES = P_SMEM ? 64 * PK * 2 : 0,   // a consumer's P tile
    O_IN_P = P_SMEM && PK >= DA,          // O staged in P's tile (the epilogue)
    BITS_BYTES = BM * WPR * 4,            // a partial tile's bitmap
    SUM_MMA = D == 64 && !P_SMEM && NC == 3,
    ONES_BYTES = SUM_MMA ? BN * 128 : 0,   // BN rows of ones, one atom wide
    NO = D / 8 + SUM_MMA,                  // O's accumulator blocks
    // 65536 registers: the producer keeps few, the consumers share the rest.
    // Gathering rows takes the producer more: its row indices (with 56
    // and 72, head_dim 128 spilled).
    PRODUCER_REGS = NC == 2 ? ({{GATHER}} ? (D == 128 ? 88 : 72) : 40) : 32,
    CONSUMER_REGS = NC == 2 ? ({{GATHER}} ? (D == 128 ? 208 : 216) : 232) : 160,
    // Named barriers: 1 .. NC for the turns, NC + 1 .. 2 NC for each
    // consumer's epilogue.
    BAR_TURN = 1, BAR_EPI = 1 + NC,
    // Two consumers on 128-key tiles with three or more stages: warpgroup 1
    // walks a step behind warpgroup 0 (LAG; see the consumers' comment).
    LAG = NC == 2 && BN == 128 && STAGES >= 3,
    QB = 1 + LAG,
    SIT_OUT = {{SIT_OUT}},
    GATHER = {{GATHER}},
    PERIOD = {{PERIOD}},
    // GATHER: a "full" barrier's phase takes the producer's 128 threads
    // (as their copies land) and thread 0's arrival (with the tile's
    // metadata, and its bitmap's bytes); a TMA load's, one.
    FULL_COUNT = GATHER ? 129 : 1,
    CPR = DA / 8,                  // GATHER: 16-byte chunks per row
    PSTEP = 128 / CPR,             // GATHER: rows the producer copies at once
};
using ring_pos = stof_ring<STAGES>;  // a K and V stage and its round's parity

static_assert(D == 64 || D == 80 || D == 96 || D == 128, "head_dim 64, 80, 96 or 128");
static_assert(NC == 2 || NC == 3, "two or three consumer warpgroups");
static_assert(BN == 64 || BN == 96 || BN == 128 || BN == 144 || BN == 192,
              "one m64n64, n96, n128, n144 or n192 product for S");
static_assert(STAGES >= 2 && STAGES <= 4, "2 to 4 stages");
static_assert(!GATHER || (D % 64 == 0 && NC == 2 && !SIT_OUT),
              "gathered rows: head_dim 64 or 128, two consumers, no sitting out");
static_assert(PERIOD >= 1 && (PERIOD == 1 || (!GATHER && !SIT_OUT)),
              "rows a period apart: read by TMA, no sitting out");

typedef unsigned short elem_t;
typedef stof_{{MMA_TYPE}}_tag mma_tag;

// GATHER: R rows into a tile of R rows at dst (swizzled atoms of 64
// columns, as TMA lays them out): producer thread x copies 16-byte chunk
// x % CPR of rows x / CPR + k PSTEP, row r being row ix[k] of base (-1:
// zeros). PSTEP is a multiple of 8, so a thread's chunk keeps its swizzled
// place in every row it copies.
template <int R>
__device__ __forceinline__ void gather_rows(unsigned dst, const elem_t *base, long long stride,
                                            const int (&ix)[R / PSTEP])
{
    const int pc = threadIdx.x % CPR;
    const unsigned d0 = attn_swizzled<R>(dst, pc, threadIdx.x / CPR);
#pragma unroll
    for (int k = 0; k < R / PSTEP; k++)
        stof_cp16(d0 + k * PSTEP * 128, base + (ix[k] >= 0 ? (long long)ix[k] * stride : 0) + pc * 8,
                  ix[k] >= 0 ? 16 : 0);
}
// The indices of this thread's rows of a tile listed at idx, -1 where a
// row is padding or at or past lim.
template <int R>
__device__ __forceinline__ void gather_index(int (&ix)[R / PSTEP], const int *idx, int lim)
{
    const int pr = threadIdx.x / CPR;
#pragma unroll
    for (int k = 0; k < R / PSTEP; k++) {
        const int i = idx[pr + k * PSTEP];
        ix[k] = i < lim ? i : -1;
    }
}{{#if VARLEN}}

enum : int { IREC = 32 };  // the item's bytes in shared memory: two 16-byte words
static_assert(PERIOD == 1, "VARLEN: a sequence's rows are read from its own first row on");

// gather_index for the sequence's rows or keys [lo, lim): -1 below lo too.
template <int R>
__device__ __forceinline__ void gather_index_in(int (&ix)[R / PSTEP], const int *idx, int lo,
                                                int lim)
{
    const int pr = threadIdx.x / CPR;
#pragma unroll
    for (int k = 0; k < R / PSTEP; k++) {
        const int i = idx[pr + k * PSTEP];
        ix[k] = i >= lo && i < lim ? i : -1;
    }
}

// Slot seq's sequence (attn_varlen_span); none past the run's nseq.
__device__ __forceinline__ attn_span ws_span(const int *cu_q, const int *cu_k, int seq, int nseq,
                                             int lq, int lk, long long total_q,
                                             long long total_k, int shift)
{
    if (seq >= nseq)
        return {0, 0, 0, 0, 0, 0};
    return attn_varlen_span(cu_q, cu_k, seq, lq, lk, total_q, total_k, shift);
}

// The first of items i .. i1 - 1 that holds rows of its sequence, else i1
// (the TMA producer's walk). The warp reads 32 items and their sequences'
// spans at once and keeps which hold rows in bits (of items win .. win +
// 31), so that a run's idle items (slots past its sequences, query groups
// past a shorter sequence: most of them where a plan's buckets are far
// above the run's lengths) cost a load a lane. Warp-collective.
__device__ __forceinline__ int ws_next_live(int i, int i1, unsigned &bits, int &win,
                                            const int4 *items, const int *cu_q, const int *cu_k,
                                            int nseq, int lq, int lk, long long total_q,
                                            long long total_k, int shift)
{
    const int lane = threadIdx.x % 32;
    while (i < i1) {
        if (i >= win + 32) {
            win = i;
            bool live = false;
            if (i + lane < i1) {
                const int4 w = items[i + lane];
                const attn_span sp =
                    ws_span(cu_q, cu_k, w.w >> 16, nseq, lq, lk, total_q, total_k, shift);
                live = !attn_group_idle<false, BM>(w.x, sp.qlo, sp.qhi);
            }
            bits = __ballot_sync(0xffffffffu, live);
        }
        const unsigned rest = bits >> (i - win);
        if (rest)
            return i + __ffs(rest) - 1;
        i = win + 32;
    }
    return i1;
}

// Whether a tile's keys kf .. kf + BN - 1 meet the sequence's [klo, klim).
__device__ __forceinline__ bool ws_tile_in(int kf, int klo, int klim)
{
    return klo < klim && kf + BN > klo && kf < klim;
}

// The columns of such a tile that are the sequence's keys, [a, b) as a |
// b << 16: what the consumers mask by (block tiles), in place of its first
// key, so that they keep none of the sequence's bounds in registers.
__device__ __forceinline__ int ws_tile_cols(int kf, int klo, int klim)
{
    return max(0, klo - kf) | min(BN, klim - kf) << 16;
}

// The item for the consumers: its group, its tiles (-1: it holds none of
// the sequence's rows), slot << 16 | head and the buffer row of the plan's
// row 0; then the sequence's rows and keys.
__device__ __forceinline__ void ws_publish(unsigned at, int4 w, int ntiles, const attn_span &sp)
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
                 "st.shared.v4.b32 [%0+16], {%5, %6, %7, %8};\n" ::"r"(at), "r"(w.x),
                 "r"(ntiles), "r"(w.w), "r"((int)sp.q0), "r"(sp.qlo), "r"(sp.qhi), "r"(sp.klo),
                 "r"(sp.khi)
                 : "memory");
}{{/if}}

// TMA boxes of rows from `row` on at column x: with PERIOD > 1 every
// PERIOD-th row, through the view (length / PERIOD, PERIOD).
__device__ __forceinline__ void load_rows(unsigned dst, const stof_tmap *map, unsigned bar, int x,
                                          int row, int h, int b)
{
    if constexpr (PERIOD > 1)
        tma_load5(dst, map, bar, x, row / PERIOD, row % PERIOD, h, b);
    else
        tma_load4(dst, map, bar, x, row, h, b);
}
__device__ __forceinline__ void store_rows(const stof_tmap *map, unsigned src, int x, int row, int h,
                                           int b)
{
    if constexpr (PERIOD > 1)
        tma_store5(map, src, x, row / PERIOD, row % PERIOD, h, b);
    else
        tma_store4(map, src, x, row, h, b);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
stof_attn(const __grid_constant__ stof_tmap tq, const __grid_constant__ stof_tmap tk,
          const __grid_constant__ stof_tmap tv, const __grid_constant__ stof_tmap to,
          int lq, int lk, const int *__restrict__ {{#unless VARLEN}}seq_lens{{/if}}{{#if VARLEN}}cu_q{{/if}}, const int4 *__restrict__ items,
          const int *__restrict__ first, const int *__restrict__ tile_key, const int *__restrict__ tile_bits,
          const unsigned *__restrict__ bits, float scale_log2,
          const elem_t *__restrict__ gq, const elem_t *__restrict__ gk,
          const elem_t *__restrict__ gv, elem_t *__restrict__ gout,
          long long q_sb, long long q_sh, long long q_sl, long long k_sb, long long k_sh,
          long long k_sl, long long v_sb, long long v_sh, long long v_sl, long long o_sb,
          long long o_sh, long long o_sl, const int *__restrict__ qidx,
          const int *__restrict__ kidx{{#if MODS}}, const float *__restrict__ alibi_slopes,
          const float *__restrict__ bias_table{{/if}}{{#if VARLEN}}, const int *__restrict__ cu_k,
          long long total_q, long long total_k, int shift, int nseq{{/if}})
{
    // The launch gives 1 KiB of slack to align the swizzled tiles. Q, the K
    // stages, the V stages, each consumer's O (unless O_IN_P), each
    // consumer's P (P_SMEM), each stage's bitmap, the ones (SUM_MMA), the
    // item (group, tiles, batch << 16 | head, length), each stage's tile
    // (bitmap or -1, first key), then the barriers.
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = stof_smem_u32(smem_raw), Qs = (base + 1023) & ~1023u;
    const unsigned Ks = Qs + QB * Q_BYTES, Vs = Ks + STAGES * KV_BYTES, Os = Vs + STAGES * KV_BYTES;
    const unsigned Ps = Os + (O_IN_P ? 0 : NC * O_BYTES), Bs = Ps + NC * P_BYTES;
    const unsigned Ones = Bs + STAGES * BITS_BYTES, Is = Ones + ONES_BYTES, Ts = Is + {{#unless VARLEN}}16{{/if}}{{#if VARLEN}}IREC{{/if}} * QB;
    const unsigned q_full = Ts + 8 * STAGES, q_empty = q_full + 8 * QB;
    const unsigned k_full = q_empty + 8 * QB, k_empty = k_full + 8 * STAGES;
    const unsigned v_full = k_empty + 8 * STAGES, v_empty = v_full + 8 * STAGES;
    const int wg = threadIdx.x / 128, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int i0 = first[blockIdx.x], i1 = first[blockIdx.x + 1];

    if (threadIdx.x == 0) {
        for (int q = 0; q < QB; q++) {
            mbar_init(q_full + 8 * q, FULL_COUNT);
            mbar_init(q_empty + 8 * q, NC * 4);
        }
        for (int s = 0; s < STAGES; s++) {
            mbar_init(k_full + 8 * s, FULL_COUNT);
            mbar_init(k_empty + 8 * s, NC * 4);
            mbar_init(v_full + 8 * s, FULL_COUNT);
            mbar_init(v_empty + 8 * s, NC * 4);
        }
        // The copy engine sees the initialized barriers.
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if constexpr (SUM_MMA) {
        // All ones, so the swizzle does not matter; wgmma reads them
        // through the async proxy.
        const unsigned one2 = mma_tag::pack2(1.f, 1.f);
        for (int i = threadIdx.x; i < ONES_BYTES / 16; i += THREADS)
            asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(Ones + 16 * i), "r"(one2)
                         : "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    stof_grid_wait();  // common.cuh: the kernel before this one is done

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"((int)PRODUCER_REGS));
        if constexpr (GATHER) {
            // All four warps walk the items and tiles, each thread copying
            // its share of a tile's rows (gather_rows) and arriving on the
            // tile's barrier as its copies land; a warp's lane 0 waits for
            // the buffer, thread 0 publishes the item and each tile and
            // loads the bitmaps. A tile's indices are read before its stage
            // is free.
            ring_pos at;
            const bool lead = threadIdx.x == 0;
            auto wait_free = [&](unsigned bar, int parity) {
                if (lane == 0)
                    mbar_wait(bar, parity);
                __syncwarp();
            };
            int n = 0, it = 0;
            for (int i = i0; i < i1; i++, n++) {
                const int4 w = items[i];{{#unless VARLEN}}
                const int b = w.w >> 16, h = w.w & 0xffff;{{/if}}{{#if VARLEN}}
                const int seq = w.w >> 16, h = w.w & 0xffff, b = 0;  // one batch of packed rows
                const attn_span sp =
                    ws_span(cu_q, cu_k, seq, nseq, lq, lk, total_q, total_k, shift);
                const bool live = !attn_group_idle<true, BM>(w.x, sp.qlo, sp.qhi);{{/if}}
                const int qb = n % QB;
                int qx[BM / PSTEP];{{#unless VARLEN}}
                gather_index<BM>(qx, qidx + (long long)w.x * BM, lq);{{/if}}{{#if VARLEN}}
                // An idle item's Q: zeros, read from nowhere.
                gather_index_in<BM>(qx, qidx + (long long)w.x * BM, sp.qlo,
                                    live ? sp.qhi : 0);{{/if}}
                if (n >= QB)
                    wait_free(q_empty + 8 * qb, (n / QB - 1) & 1);
                gather_rows<BM>(Qs + qb * Q_BYTES, gq + b * q_sb + h * q_sh{{#if VARLEN}} + sp.q0 * q_sl{{/if}}, q_sl, qx);
                cp_arrive_noinc(q_full + 8 * qb);
                if (lead) {
{{#if VARLEN}}                    ws_publish(Is + IREC * qb, w, live ? w.z - w.y : -1, sp);
{{/if}}{{#unless VARLEN}}                    const int len = attn_seq_len(seq_lens, b);
                    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(Is + 16 * qb),
                                 "r"(w.x), "r"(w.z - w.y), "r"(w.w), "r"(len)
                                 : "memory");{{/if}}
                    mbar_arrive(q_full + 8 * qb);
                }{{#if VARLEN}}
                if (!live)
                    continue;{{/if}}
                const elem_t *kb = gk + b * k_sb + h * k_sh, *vb = gv + b * v_sb + h * v_sh;{{#if GROUP}}
                kb = gk + b * k_sb + h / {{GROUP}} * k_sh;  // the group's KV head
                vb = gv + b * v_sb + h / {{GROUP}} * v_sh;{{/if}}{{#if VARLEN}}
                kb += sp.k0 * k_sl;  // the buffer row of the plan's key 0
                vb += sp.k0 * v_sl;{{/if}}
                for (int j = w.y; j < w.z; j++, it++, at.next()) {
                    const int kf = tile_key[j], bm = tile_bits[j], s = at.stage;
                    int kx[BN / PSTEP];{{#unless VARLEN}}
                    gather_index<BN>(kx, kidx + (long long)kf * BN, lk);{{/if}}{{#if VARLEN}}
                    gather_index_in<BN>(kx, kidx + (long long)kf * BN, sp.klo, sp.khi);{{/if}}
                    if (it >= STAGES)
                        wait_free(k_empty + 8 * s, at.phase ^ 1);
                    gather_rows<BN>(Ks + s * KV_BYTES, kb, k_sl, kx);
                    cp_arrive_noinc(k_full + 8 * s);
                    if (lead) {
                        asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(Ts + 8 * s), "r"(bm),
                                     "r"(kf)
                                     : "memory");
                        if (bm >= 0) {
                            mbar_expect(k_full + 8 * s, BITS_BYTES);
                            bulk_load(Bs + s * BITS_BYTES, bits + (long long)bm * BM * WPR,
                                      BITS_BYTES, k_full + 8 * s);
                        } else {
                            mbar_arrive(k_full + 8 * s);
                        }
                    }
                    if (it >= STAGES)
                        wait_free(v_empty + 8 * s, at.phase ^ 1);
                    gather_rows<BN>(Vs + s * KV_BYTES, vb, v_sl, kx);
                    cp_arrive_noinc(v_full + 8 * s);
                    if (lead)
                        mbar_arrive(v_full + 8 * s);
                }
            }{{#if VARLEN}}
            {  // the end record (-2 tiles): the consumers walk until it
                const int qb = n % QB;
                if (n >= QB)
                    wait_free(q_empty + 8 * qb, (n / QB - 1) & 1);
                cp_arrive_noinc(q_full + 8 * qb);
                if (lead) {
                    ws_publish(Is + IREC * qb, make_int4(0, 0, 0, 0), -2, attn_span{});
                    mbar_arrive(q_full + 8 * qb);
                }
            }{{/if}}
            stof_cp_wait<0>();  // nothing in flight when the warps leave
            return;
        }
        if (warp != 0)
            return;
        if (lane == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)&tq) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)&tk) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)&tv) : "memory");
        }
        int it = 0;       // tiles issued by this CTA
        ring_pos at;      // where tile `it` goes
        int n = 0;        // items published{{#if VARLEN}}
        unsigned live_bits = 0;  // which of items win .. win + 31 hold rows (ws_next_live)
        int win = i0 - 32;{{/if}}
        for (int i = i0; i < i1; i++, n++) {
{{#if VARLEN}}
            // Idle items are skipped unpublished: the consumers see the live
            // ones, then the end record.
            i = ws_next_live(i, i1, live_bits, win, items, cu_q, cu_k, nseq, lq, lk, total_q,
                             total_k, shift);
            if (i >= i1)
                break;
{{/if}}
            const int4 w = items[i];{{#unless VARLEN}}
            const int b = w.w >> 16, h = w.w & 0xffff;
            const int len = attn_seq_len(seq_lens, b);{{/if}}{{#if VARLEN}}
            const int seq = w.w >> 16, h = w.w & 0xffff, b = 0;  // one batch of packed rows
            const attn_span sp = ws_span(cu_q, cu_k, seq, nseq, lq, lk, total_q, total_k, shift);
            const bool live = !attn_group_idle<false, BM>(w.x, sp.qlo, sp.qhi);
            // The tiles that hold keys of the sequence, counted across the warp.
            int ntiles = live ? w.z - w.y : -1;
            if (live && (sp.klo > 0 || sp.khi < lk)) {
                ntiles = 0;
                for (int t0 = w.y; t0 < w.z; t0 += 32) {
                    const bool in =
                        t0 + lane < w.z && ws_tile_in(tile_key[t0 + lane], sp.klo, sp.khi);
                    ntiles += __popc(__ballot_sync(0xffffffffu, in));
                }
            }{{/if}}
            const int qb = n % QB;  // Q's buffer, used for the (n / QB)th time
            // With SIT_OUT, the warps of consumers with no row before lq
            // arrive on no stage's barrier: this warp does.
            const unsigned idle =
                SIT_OUT ? 4 * (NC - max(1, min(NC, (lq - w.x * BM + 63) / 64))) : 0;
            if (lane == 0) {
                if (n >= QB)
                    mbar_wait(q_empty + 8 * qb, (n / QB - 1) & 1);
                // The item for the consumers, published by the arrival.{{#unless VARLEN}}
                asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(Is + 16 * qb), "r"(w.x),
                             "r"(w.z - w.y), "r"(w.w), "r"(len)
                             : "memory");{{/if}}{{#if VARLEN}}
                ws_publish(Is + IREC * qb, w, ntiles, sp);  // an idle item: no Q bytes{{/if}}
                mbar_expect(q_full + 8 * qb, {{#if VARLEN}}live ? Q_BYTES : 0{{/if}}{{#unless VARLEN}}Q_BYTES{{/if}});
#pragma unroll
                for (int a = 0; a < ATOMS{{#if VARLEN}} && live{{/if}}; a++)
                    load_rows(Qs + qb * Q_BYTES + a * BM * SW, &tq, q_full + 8 * qb, a * AW,
                              {{#if VARLEN}}(int)sp.q0 + w.x * BM{{/if}}{{#unless VARLEN}}PERIOD > 1 ? w.x : w.x * BM{{/if}}, h, b);
            }{{#if VARLEN}}
            if (!live)
                continue;{{/if}}
            for (int t0 = w.y; t0 < w.z; t0 += 32) {
                const bool in = t0 + lane < w.z;
                const int key = in ? tile_key[t0 + lane] : 0, tb = in ? tile_bits[t0 + lane] : -1;
                const int cnt = min(32, w.z - t0);
                for (int k = 0; k < cnt; k++{{#unless VARLEN}}, it++, at.next(){{/if}}) {
                    const int kf = __shfl_sync(0xffffffffu, key, k);
                    const int bm = __shfl_sync(0xffffffffu, tb, k);
                    if (lane != 0)
                        continue;{{#if VARLEN}}
                    // Lane 0 alone keeps the count of tiles issued and their stages.
                    if (!ws_tile_in(kf, sp.klo, sp.khi))
                        continue;  // none of the sequence's keys: not loaded{{/if}}
                    // K (with the tile's first key, and its bitmap if it is
                    // partial), then V, into stage s once its last use (the
                    // previous round's) is done.
                    const int s = at.stage;
                    if (it >= STAGES)
                        mbar_wait(k_empty + 8 * s, at.phase ^ 1);
                    asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(Ts + 8 * s), "r"(bm),
                                 "r"({{#if VARLEN}}ws_tile_cols(kf, sp.klo, sp.khi){{/if}}{{#unless VARLEN}}kf{{/if}})
                                 : "memory");
                    mbar_expect(k_full + 8 * s, KV_BYTES + (bm >= 0 ? BITS_BYTES : 0));
#pragma unroll
                    for (int a = 0; a < ATOMS; a++)
                        load_rows(Ks + s * KV_BYTES + a * BN * SW, &tk, k_full + 8 * s, a * AW, {{#if VARLEN}}(int)sp.k0 + {{/if}}kf,
                                  h{{#if GROUP}} / {{GROUP}}{{/if}}, b);
                    if (bm >= 0)
                        bulk_load(Bs + s * BITS_BYTES, bits + (long long)bm * BM * WPR, BITS_BYTES,
                                  k_full + 8 * s);
                    if (idle)
                        mbar_arrive_n(k_empty + 8 * s, idle);
                    if (it >= STAGES)
                        mbar_wait(v_empty + 8 * s, at.phase ^ 1);
                    mbar_expect(v_full + 8 * s, KV_BYTES);
#pragma unroll
                    for (int a = 0; a < ATOMS; a++)
                        load_rows(Vs + s * KV_BYTES + a * BN * SW, &tv, v_full + 8 * s, a * AW, {{#if VARLEN}}(int)sp.k0 + {{/if}}kf,
                                  h{{#if GROUP}} / {{GROUP}}{{/if}}, b);
                    if (idle)
                        mbar_arrive_n(v_empty + 8 * s, idle);{{#if VARLEN}}
                    it++;
                    at.next();{{/if}}
                }
            }
        }{{#if VARLEN}}
        if (lane == 0) {  // the end record (-2 tiles): the consumers walk until it
            const int qb = n % QB;
            if (n >= QB)
                mbar_wait(q_empty + 8 * qb, (n / QB - 1) & 1);
            ws_publish(Is + IREC * qb, make_int4(0, 0, 0, 0), -2, attn_span{});
            mbar_expect(q_full + 8 * qb, 0);
        }{{/if}}
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"((int)CONSUMER_REGS));
    const int c = wg - 1;
    const int g = lane / 4, t = lane % 4;
    const int wrow = c * 64 + (warp % 4) * 16;  // this warp's first row in the item
    unsigned q_wg = Qs + c * 64 * SW;           // this warpgroup's rows, in each atom
    const unsigned p_wg = Ps + c * P_BYTES, o_wg = O_IN_P ? p_wg : Os + c * O_BYTES;
    // One warp of a warpgroup arrives for all four on an "empty" barrier.
    auto release = [&](unsigned bar) {
        __syncwarp();
        if (lane == 0)
            mbar_arrive(bar);
    };
    // Turns: warpgroup c issues its products once warpgroup c - 1 has
    // issued its own (c = 0 after the last one), then hands the turn on.
    auto turn_wait = [&]() { named_sync(BAR_TURN + c, 256); };
    auto turn_pass = [&]() { named_arrive(BAR_TURN + (c + 1) % NC, 256); };
    if (c == NC - 1)
        turn_pass();
    if (LAG && c > 0) {  // an empty turn: a step behind warpgroup 0
        turn_wait();
        turn_pass();
    }

    // S = Q Kᵀ for the tile in stage st; committed, not waited for.
    auto issue_s = [&](float (&s)[BN / 8][4], int st) {
        wg_qk<D, BM, BN, SW>(s, q_wg, Ks + st * KV_BYTES);
    };
    // O += P V for the tile in stage st (V's rows are the keys, read
    // N-major; with SUM_MMA the ones lie one atom stride past V's columns);
    // committed, not waited for.
    auto issue_pv = [&](float (&o)[NO][4], const unsigned (&pf)[BN / 16][4], int st) {
        const unsigned vt = Vs + st * KV_BYTES;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const unsigned long long vd =
                wg_desc(vt + kk * 16 * SW, SUM_MMA ? Ones - vt : BN * SW, 8 * SW, SW);
            if constexpr (P_SMEM)
                wg_ssn(o, wg_desc(p_wg + (kk / 4) * 64 * 128 + (kk % 4) * 32, 16, 8 * 128), vd);
            else
                wg_rs(o, pf[kk], vd);
        }
        wg_commit();
    };
    // P_j from S's accumulators into the operand of the next P V product:
    // packed in pf, and with P_SMEM stored from there into the warpgroup's
    // P tile (lane i writes row i % 8 of 8x8 matrix i / 8: rows 8 (i / 8 % 2)
    // on of the warp's 16, key block 2 kk + i / 16), fenced for the async
    // proxy that wgmma reads it through, once all four warps have stored.
    const int prow = (warp % 4) * 16 + (lane / 8 % 2) * 8 + lane % 8;
    auto put_p = [&](const float (&s)[BN / 8][4], unsigned (&pf)[BN / 16][4]) {
        stof_pack_p<mma_tag>(s, pf);
        if constexpr (P_SMEM) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                const int j = 2 * kk + lane / 16;
                stmatrix4(p_wg + (j / 8) * 64 * 128 + prow * 128 + (((j % 8) ^ (lane % 8)) << 4),
                          pf[kk]);
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            named_sync(BAR_EPI + c, 128);
        }
    };
    // Waits for a "full" barrier; with GATHER, makes the producer's
    // generic-proxy copies visible to wgmma's async proxy.
    auto landed = [&](unsigned bar, int parity) {
        mbar_wait(bar, parity);
        if constexpr (GATHER)
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    };
    // The tile in stage st: its bitmap (-1: full) and first key (GATHER:
    // its place in kidx, in tiles), as the producer left them.
    auto tile_of = [&](int st, int &bm, int &kfirst) {
        asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n"
                     : "=r"(bm), "=r"(kfirst)
                     : "r"(Ts + 8 * st)
                     : "memory");
    };
{{#if MODS}}    // The item's head's modifiers, the positions of the thread's rows among
    // the keys (set as each item starts; the zeros only keep NVRTC from
    // warning that the tile function may read them first).
    stof_mods mods;
    int mpos[2] = {0, 0};
{{/if}}    // Masks the scores of the tile in stage st where needed: a partial
    // tile's bitmap (in the stage's shared memory), keys at or past klim.
    // GATHER: padding keys are in no bitmap and full tiles have none, so
    // only a shortened sequence needs the tile's keys read.{{#if VARLEN}}
    // VARLEN: keys below klo are not the sequence's either; block tiles
    // come with the columns that are (ws_tile_cols) in place of kfirst.
    int klo = 0;{{/if}}
    auto mask = [&](float (&s)[BN / 8][4], int st, int bm, int kfirst, int klim) {
        const bool edge = GATHER ? {{#if VARLEN}}klo > 0 || {{/if}}klim < lk : {{#if VARLEN}}(kfirst & 0xffff) > 0 || kfirst >> 16 < BN{{/if}}{{#unless VARLEN}}kfirst + PERIOD * (BN - 1) >= klim{{/if}};{{#if SOFTCAP}}
        stof_softcap(s, scale_log2);{{/if}}{{#if MODS}}
        stof_score_mods(s, mods, mpos[0], mpos[1], t, [&](int col) {
            return GATHER ? kidx[(long long)kfirst * BN + col] : kfirst + PERIOD * col;
        });{{/if}}
        if (bm >= 0 || edge) {
            const unsigned *w0 = bm < 0 ? nullptr
                                        : reinterpret_cast<const unsigned *>(
                                              smem_raw + (Bs - base) + st * BITS_BYTES) +
                                              (wrow + g) * WPR;
            const int *kix = kidx + (long long)kfirst * BN;
            stof_mask_scores<BN / 8, WPR>(s, w0, w0 ? w0 + 8 * WPR : nullptr, t, edge, [&](int col) {
                if constexpr (GATHER) {
                    const int x = kix[col];
                    return x >= {{#if VARLEN}}klo{{/if}}{{#unless VARLEN}}0{{/if}} && x < klim;
                } else {
                    return {{#if VARLEN}}col >= (kfirst & 0xffff) && col < kfirst >> 16{{/if}}{{#unless VARLEN}}kfirst + PERIOD * col < klim{{/if}};
                }
            });
        }
    };

    ring_pos cur;  // where the next tile to consume lies, in the producer's order
{{#if VARLEN}}
    (void)i1;
    for (int n = 0;; n++) {  // the published items, to the producer's end record
{{/if}}{{#unless VARLEN}}
    for (int i = i0, n = 0; i < i1; i++, n++) {
{{/if}}
        float o[NO][4];
        float m[2] = {-STOF_INF, -STOF_INF}, l[2] = {0.f, 0.f}, alpha[2];
#pragma unroll
        for (int j = 0; j < NO; j++)
            o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
        const int qb = n % QB;
        q_wg = Qs + qb * Q_BYTES + c * 64 * SW;
        landed(q_full + 8 * qb, (n / QB) & 1);{{#if VARLEN}}
        // The item and its sequence, as the producer published them (ws_publish).
        int group, ntiles, bh, q0, qlo, qlim, klim;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%8];\n"
                     "ld.shared.v4.b32 {%4, %5, %6, %7}, [%8+16];\n"
                     : "=r"(group), "=r"(ntiles), "=r"(bh), "=r"(q0), "=r"(qlo), "=r"(qlim),
                       "=r"(klo), "=r"(klim)
                     : "r"(Is + IREC * qb)
                     : "memory");
        const int b = 0, h = bh & 0xffff;  // one batch of packed rows
        if (ntiles == -2)
            break;  // the end record
        if (ntiles < 0) {  // none of the sequence's rows: as an empty item, nothing stored
            release(q_empty + 8 * qb);
            if (LAG) {
                turn_wait();
                turn_pass();
            }
            continue;
        }{{/if}}{{#unless VARLEN}}
        int group, ntiles, bh, len;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(group), "=r"(ntiles), "=r"(bh), "=r"(len)
                     : "r"(Is + 16 * qb)
                     : "memory");
        const int b = bh >> 16, h = bh & 0xffff;
        const int qlim = min(lq, len), klim = min(lk, len);{{/if}}
        const int row0 = PERIOD > 1 ? group : group * BM;  // the item's first row{{#if MODS}}
        mods = stof_mods_of(h, scale_log2, alibi_slopes, bias_table);
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) {
            const int r = wrow + g + 8 * h2;
            mpos[h2] = (GATHER ? qidx[(long long)group * BM + r] : row0 + PERIOD * r) + lk - lq;
        }{{/if}}
        // SIT_OUT: a consumer whose rows all lie at or past lq (warpgroup 0
        // never does) takes the item's turns and nothing else.
        if (SIT_OUT && c > 0 && group * BM + c * 64 >= lq) {
            release(q_empty + 8 * qb);
            for (int j = {{#if VARLEN}}ntiles == 0 ? LAG - 1 : {{/if}}ntiles; j >= 0; j--) {
                turn_wait();
                turn_pass();
            }
            const int x = cur.stage + ntiles;  // past the item's tiles
            cur.stage = x % STAGES;
            cur.phase ^= (x / STAGES) & 1;
            continue;
        }
        if (ntiles == 0) {
            release(q_empty + 8 * qb);
            // With LAG an item with no tile still takes a turn: the leader's
            // next turn is what lets the other finish its last item, and it
            // must not wait for a Q buffer that the other frees only then.
            if (LAG) {
                turn_wait();
                turn_pass();
            }
        } else {
            float s[BN / 8][4];
            unsigned pf[BN / 16][4];
            // Tile 0: S alone.
            ring_pos p = cur;  // tile j's position
            int st = p.stage, bm, kfirst;
            landed(k_full + 8 * st, p.phase);
            tile_of(st, bm, kfirst);
            turn_wait();
            issue_s(s, st);
            turn_pass();
            wg_wait0();
            wg_hold(s);
            if (ntiles == 1)
                release(q_empty + 8 * qb);
            mask(s, st, bm, kfirst, klim);
            release(k_empty + 8 * st);
            stof_softmax_p<BN / 8, !SUM_MMA>(s, m, l, alpha, scale_log2);
            if (O_IN_P && !GATHER && n > 0) {  // the last item's O store has read P's tile
                if (threadIdx.x % 128 == 0)
                    tma_wait_read();
                named_sync(BAR_EPI + c, 128);
            }
            put_p(s, pf);
            // Tile j: S_j and P_{j-1} V_{j-1}, then S_j's softmax (after the
            // latter's wait, where ptxas puts it).
            for (int j = 1; j < ntiles; j++) {
                const int sp = st, vph = p.phase;
                p.next();
                st = p.stage;
                landed(k_full + 8 * st, p.phase);
                tile_of(st, bm, kfirst);
                turn_wait();
                issue_s(s, st);
                landed(v_full + 8 * sp, vph);
                issue_pv(o, pf, sp);
                turn_pass();
                wg_wait1();
                wg_hold(s);
                if (j == ntiles - 1)
                    release(q_empty + 8 * qb);
                mask(s, st, bm, kfirst, klim);
                release(k_empty + 8 * st);
                stof_softmax_p<BN / 8, !SUM_MMA>(s, m, l, alpha, scale_log2);
                wg_wait0();
                wg_hold(o);
                release(v_empty + 8 * sp);
                stof_rescale(o, alpha);
                put_p(s, pf);
            }
            // The last tile's P V.
            landed(v_full + 8 * st, p.phase);
            turn_wait();
            issue_pv(o, pf, st);
            turn_pass();
            wg_wait0();
            wg_hold(o);
            release(v_empty + 8 * st);
            p.next();
            cur = p;
        }

        // GATHER: each row of O / l to its place (rows at or past the
        // sequence length as zeros, padding rows nowhere), from registers.
        if constexpr (GATHER) {
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {
                float sum = l[h2];  // two consumers: the softmax keeps the sums
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const int qi = qidx[(long long)group * BM + c * 64 + (warp % 4) * 16 + g + 8 * h2];
                if ({{#unless VARLEN}}qi < 0 || qi >= lq{{/if}}{{#if VARLEN}}qi < qlo || qi >= qlim{{/if}})
                    continue;
                const float inv = sum > 0.f && qi < qlim ? 1.f / sum : 0.f;
                elem_t *orow = gout + b * o_sb + h * o_sh + {{#if VARLEN}}(long long)(q0 + qi){{/if}}{{#unless VARLEN}}qi{{/if}} * o_sl;
#pragma unroll
                for (int j = 0; j < D / 8; j++)
                    *reinterpret_cast<unsigned *>(orow + 8 * j + 2 * t) =
                        mma_tag::pack2(o[j][2 * h2] * inv, o[j][2 * h2 + 1] * inv);
            }
            continue;
        }
        // Epilogue: O / l into this warpgroup's staging buffer once its last
        // store has read it, then one TMA store per swizzle atom. Thread
        // (g, t) holds columns 8j + 2t, 8j + 2t + 1 of rows r and r + 8.{{#if VARLEN}}
        // VARLEN: rows that would cross the sequence's first or last row go
        // one by one from registers, the sequence's rows only (a box writes
        // whole, a neighbour's rows too).
        if (row0 + c * 64 < qlo || row0 + c * 64 + 64 > qlim) {
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {
                float sum = l[h2];
                if constexpr (SUM_MMA) {
                    sum = o[D / 8][2 * h2];
                } else {
                    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                }
                const int qi = row0 + c * 64 + (warp % 4) * 16 + g + 8 * h2;
                if (qi < qlo || qi >= qlim)
                    continue;
                const float inv = sum > 0.f ? 1.f / sum : 0.f;
                elem_t *orow = gout + h * o_sh + (long long)(q0 + qi) * o_sl;
#pragma unroll
                for (int j = 0; j < D / 8; j++)
                    *reinterpret_cast<unsigned *>(orow + 8 * j + 2 * t) =
                        mma_tag::pack2(o[j][2 * h2] * inv, o[j][2 * h2 + 1] * inv);
            }
            continue;
        }{{/if}}
        if (threadIdx.x % 128 == 0)
            tma_wait_read();
        named_sync(BAR_EPI + c, 128);
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) {
            float sum = l[h2];
            if constexpr (SUM_MMA) {
                sum = o[D / 8][2 * h2];  // every column of the block holds it
            } else {
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            }
            const int r = (warp % 4) * 16 + g + 8 * h2;
            const float inv = sum > 0.f && row0 + PERIOD * (c * 64 + r) < qlim ? 1.f / sum : 0.f;
#pragma unroll
            for (int j = 0; j < D / 8; j++) {
                // 16-byte chunk j of the row: chunk j % CPA of atom j / CPA,
                // XORed with the address bits above the 128-byte line.
                constexpr int CPA = SW / 16;
                const unsigned at = o_wg + (j / CPA) * 64 * SW + r * SW +
                                    (((j % CPA) ^ ((r * SW >> 7) & (CPA - 1))) << 4) + 4 * t;
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at),
                             "r"(mma_tag::pack2(o[j][2 * h2] * inv, o[j][2 * h2 + 1] * inv))
                             : "memory");
            }
        }
        // The copy engine reads what the generic proxy wrote.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_sync(BAR_EPI + c, 128);
        if (threadIdx.x % 128 == 0) {
#pragma unroll
            for (int a = 0; a < ATOMS; a++)
                store_rows(&to, o_wg + a * 64 * SW, a * AW, {{#if VARLEN}}q0 + {{/if}}row0 + PERIOD * c * 64, h, b);
            tma_commit();
        }
    }
    // Warpgroup 0 takes the last turn handed to it, so that no arrival is
    // left on a barrier; the staging buffers stay until their stores read them.
    if (c == 0) {
        turn_wait();
        if (LAG) {  // and the other's last turn, a step behind
            turn_pass();
            turn_wait();
        }
    }
    if (threadIdx.x % 128 == 0)
        tma_wait_read();
}
