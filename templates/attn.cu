// attn.cu — masked multi-head attention over tiles, FlashAttention-2 style.
//
// Tiling: one CTA per (query group, batch*head). A query group is BLOCK_M
// query rows: consecutive (block-wise) or gathered by index (GATHER_Q, for
// rows that share keys, e.g. one residue of a dilated mask). Each warp owns
// 16 * M_TILES of its rows. The CTA walks only the key tiles listed for its group:
// BLOCK_N keys each, consecutive (block-wise) or gathered by index
// (GATHER_K: the union of the group's keys, compacted). A tile is full (no
// masking) or carries a bitmap of BLOCK_M x BLOCK_N bits. K and V tiles are
// double-buffered in shared memory by cp.async; S = Q·Kᵀ and O += P·V run on
// mma.sync m16n8k16 with fp32 accumulation and an online softmax in fp32.
//
// Parameters:
//   HEAD_DIM   32, 64, 80, 96 or 128 (a multiple of 16)
//   BLOCK_M    query rows per CTA, 16 * M_TILES * warps
//   M_TILES    m16 row tiles per warp (1 or 2): 2 halves the shared-memory
//              reads per product at the price of registers
//   Q_IN_REGS  section flag: Q's fragments stay in registers for the whole walk
//   Q_IN_SMEM  section flag: they are re-read from shared memory per tile (frees
//              registers for two row tiles at large head sizes); one of the two
//   BLOCK_N    keys per tile, a multiple of 16
//   MMA_TYPE   f16 or bf16 (operand type of mma.sync and of storage)
//   GATHER_Q   section flag: query rows come from an index list
//   BLOCK_Q    section flag: query rows are consecutive (exactly one of the two)
//   GATHER_K   section flag: tile keys come from an index list
//   BLOCK_K    section flag: tile keys are consecutive (exactly one of the two){{#if GROUP}}
//   GROUP      query heads per KV head (attn_common.cuh); "0": one each{{/if}}{{#if SOFTCAP}}
//   SOFTCAP    the logit softcap (attn_common.cuh); "0": none{{/if}}{{#if VARLEN}}
//   VARLEN     packed variable-length sequences (attn_common.cuh); "0": a padded batch{{/if}}{{#if MODS}}
//   MODS, ALIBI, BIAS   the score modifiers (attn_common.cuh){{/if}}

{{>attn_common.cuh}}

#define D {{HEAD_DIM}}
#define BM {{BLOCK_M}}
#define BN {{BLOCK_N}}
#define MT {{M_TILES}}            // m16 row tiles per warp
#define WARPS (BM / (16 * MT))
#define THREADS (WARPS * 32)
#define LDS (D + 8)                // smem row stride in elements: 16 B of padding
                                   // keeps ldmatrix rows on distinct banks
#define WPR ((BN + 31) / 32)       // bitmap words per tile row
#define GATHER_Q {{GATHER_Q}}      // 1: query rows from qidx, 0: consecutive
#define GATHER_K {{GATHER_K}}      // 1: tile keys from kidx, 0: consecutive
static_assert(GATHER_Q + {{BLOCK_Q}} == 1 && GATHER_K + {{BLOCK_K}} == 1,
              "rows and keys each gathered or consecutive");

typedef unsigned short elem_t;
typedef stof_{{MMA_TYPE}}_tag mma_tag;

__device__ __forceinline__ void ldsm_x4(unsigned *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(stof_smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(stof_smem_u32(p)));
}

// c += a (16x16, row) * b (16x8, col)
__device__ __forceinline__ void mma(float *c, const unsigned *a, unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{{MMA_TYPE}}.{{MMA_TYPE}}.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Loads BN rows of D elements (row indices from rows(), -1 = none) into smem.
template <typename RowFn>
__device__ __forceinline__ void load_rows(elem_t *dst, const elem_t *base, long long stride,
                                          int nrows, RowFn rows)
{
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < nrows * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        const int src = rows(r);
        const elem_t *p = base + (src >= 0 ? (long long)src * stride : 0) + c * 8;
        stof_cp16(stof_smem_u32(dst + r * LDS + c * 8), p, src >= 0 ? 16 : 0);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) stof_attn(ATTN_ITEM_PARAMS)
{
    stof_grid_wait();  // common.cuh: the kernel before this one is done
    extern __shared__ __align__(16) unsigned char smem_raw[];
    elem_t *Qs = reinterpret_cast<elem_t *>(smem_raw);
    elem_t *Ks = Qs + BM * LDS;            // 2 stages
    elem_t *Vs = Ks + 2 * BN * LDS;        // 2 stages
{{#if GATHER_K}}
    int *Kix = reinterpret_cast<int *>(Vs + 2 * BN * LDS);  // 2 x BN key indices
{{/if}}

    const stof_item item = stof_work_item(work);{{#unless VARLEN}}
    const int group = item.group, t0 = item.t0, t1 = item.t1;{{/if}}{{#if VARLEN}}
    const int group = item.group;
    int t0 = item.t0, t1 = item.t1;  // cut to the sequence's keys below{{/if}}
    const int b = blockIdx.y, h = blockIdx.x;
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
{{#unless VARLEN}}
    auto qrow = [&](int r) -> int { return attn_row<GATHER_Q>(qidx, group * BM, r, lq); };{{/if}}{{#if VARLEN}}
    // Only the sequence's own rows are read and written, never a neighbour's.
    auto qrow = [&](int r) -> int {
        return attn_from(attn_row<GATHER_Q>(qidx, group * BM, r, qlim), qlo);
    };{{/if}}

    // The first tile's key comes with the work item.
    auto load_tile = [&](int it, int stage) {
        const int key = it == {{#if VARLEN}}item.{{/if}}t0 ? item.key0 : tile_key[it];{{#unless VARLEN}}
        auto row = [&](int r) -> int { return attn_key<GATHER_K, BN>(kidx, key, r, lk); };{{/if}}{{#if VARLEN}}
        auto row = [&](int r) -> int {
            return attn_from(attn_key<GATHER_K, BN>(kidx, key, r, klim), klo);
        };{{/if}}
{{#if GATHER_K}}
        if (threadIdx.x < BN)
            Kix[stage * BN + threadIdx.x] = row(threadIdx.x);
{{/if}}
        load_rows(Ks + stage * BN * LDS, kb, k_sl, BN, row);
        load_rows(Vs + stage * BN * LDS, vb, v_sl, BN, row);
    };

    // Prologue: Q and the first tile in flight together.
    load_rows(Qs, qb, q_sl, BM, qrow);
    if (t0 < t1)
        load_tile(t0, 0);
    stof_cp_commit();

    // Each warp owns MT m16 tiles of rows, so every K and V fragment it
    // loads from shared memory feeds MT products.
    float o[MT][D / 8][4];
    float m[MT][2], l[MT][2];
{{#if Q_IN_REGS}}
    unsigned qf[MT][D / 16][4];
{{/if}}
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < D / 8; i++)
            o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
        m[mt][0] = m[mt][1] = -STOF_INF;
        l[mt][0] = l[mt][1] = 0.f;
    }
    const int wrow = warp * 16 * MT;  // this warp's first row in the group{{#if MODS}}
    const stof_mods mods = stof_mods_of(h, scale_log2, alibi_slopes, bias_table);
    int mpos[MT][2];  // the positions of the thread's rows among the keys
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++)
            mpos[mt][h2] = qrow(wrow + mt * 16 + g + 8 * h2) + lk - lq;{{/if}}

    for (int it = t0; it < t1; it++) {
        const int stage = (it - t0) & 1;
        if (it + 1 < t1) {
            load_tile(it + 1, stage ^ 1);
            stof_cp_commit();
            stof_cp_wait<1>();
        } else {
            stof_cp_wait<0>();
        }
        __syncthreads();
{{#if Q_IN_REGS}}
        if (it == t0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++)
                    ldsm_x4(qf[mt][kk], Qs + (wrow + mt * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * LDS +
                                            kk * 16 + 8 * (lane / 16));
        }
{{/if}}
        const elem_t *Kt = Ks + stage * BN * LDS;
        const elem_t *Vt = Vs + stage * BN * LDS;

        // S = Q Kᵀ for this warp's rows and the tile's BN keys.
        float s[MT][BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
                s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
{{#if Q_IN_SMEM}}
            // Q's fragments are read again for every tile: registers go to S and O.
            unsigned qk[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldsm_x4(qk[mt], Qs + (wrow + mt * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * LDS +
                                    kk * 16 + 8 * (lane / 16));
{{/if}}
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                unsigned bfr[4];
                ldsm_x4(bfr, Kt + (np * 16 + (lane % 8) + 8 * (lane / 16)) * LDS + kk * 16 +
                                 8 * ((lane / 8) % 2));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
{{#if Q_IN_REGS}}
                    const unsigned *a = qf[mt][kk];
{{/if}}
{{#if Q_IN_SMEM}}
                    const unsigned *a = qk[mt];
{{/if}}
                    mma(s[mt][2 * np], a, bfr[0], bfr[1]);
                    mma(s[mt][2 * np + 1], a, bfr[2], bfr[3]);
                }
            }
        }

        // Mask, only where needed: a partial tile's bitmap, keys past the
        // valid length. Full tiles inside the sequence skip it entirely.
        const int bm = tile_bits[it];{{#if SOFTCAP}}
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            stof_softcap(s[mt], scale_log2);{{/if}}
{{#if GATHER_K}}
        const int *kix = Kix + stage * BN;
        // Padding keys (-1) are never in a bitmap and full tiles have none:
        // only a shortened sequence needs the keys checked.
        const bool edge = {{#if VARLEN}}klo > 0 || {{/if}}klim < lk;
{{/if}}
{{#if BLOCK_K}}
        const int kfirst = tile_key[it];
        const bool edge = {{#if VARLEN}}kfirst < klo || {{/if}}kfirst + BN > klim;
{{/if}}{{#if MODS}}
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            stof_score_mods(s[mt], mods, mpos[mt][0], mpos[mt][1], t, [&](int c) {
                return {{#if GATHER_K}}kix[c]{{/if}}{{#if BLOCK_K}}kfirst + c{{/if}};
            });{{/if}}
        if (bm >= 0 || edge) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int r0 = wrow + mt * 16 + g;
                const unsigned *w0 = bm < 0 ? nullptr : bits + ((long long)bm * BM + r0) * WPR;
{{#if GATHER_K}}
                auto key_ok = [&](int c) { return kix[c] >= 0 && kix[c] < klim; };
{{/if}}
{{#if BLOCK_K}}
                auto key_ok = [&](int c) { return {{#if VARLEN}}kfirst + c >= klo && {{/if}}kfirst + c < klim; };
{{/if}}
                stof_mask_scores<BN / 8, WPR>(s[mt], w0, w0 ? w0 + 8 * WPR : nullptr, t, edge,
                                              key_ok);
            }
        }

        // Online softmax; P's fragments come out ready for the next product.
        unsigned pf[MT][BN / 16][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            stof_softmax_step<mma_tag>(s[mt], o[mt], m[mt], l[mt], pf[mt], scale_log2);

        // O += P V
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                unsigned bfr[4];
                ldsm_x4_t(bfr, Vt + (kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * LDS +
                                   dp * 16 + 8 * (lane / 16));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma(o[mt][2 * dp], pf[mt][kk], bfr[0], bfr[1]);
                    mma(o[mt][2 * dp + 1], pf[mt][kk], bfr[2], bfr[3]);
                }
            }
        }
        __syncthreads();  // the stage just read is the next prefetch's target
    }
    stof_cp_wait<0>();  // nothing in flight at exit, even with no tile to walk

#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int r0 = wrow + mt * 16 + g;
        const int rows[2] = {qrow(r0), qrow(r0 + 8)};
        stof_store_rows<mma_tag>(o[mt], l[mt], ob, o_sl, rows, qlim, t);
    }
}
