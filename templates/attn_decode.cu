// attn_decode.cu — decoding attention: a few new query rows per sequence
// against its KV cache, the cache split among CTAs (flash-decoding).
//
// Tiling: grid (row chunk + row_chunks * split, KV head, batch). A CTA owns 16
// query rows of one KV head's group (row r = query head in the group * seq_q
// + new row, taken 16 at a time) and one split of the sequence's keys: chunk
// keys from the first key any new row may read (0, or the window's start).
// So each K and V tile is read once for all the group's heads. Tiles of
// BLOCK_N keys stream through a STAGES-deep ring of cp.async copies (16
// bytes a thread); each of the BLOCK_N / 16 warps takes 16 keys of every
// tile: S = Q Kᵀ and O += P V on mma.sync m16n8k16 with fp32 accumulation
// and an online softmax of its own, and the warps' states merge at the end.
// With one split the CTA writes out; with several, each writes its rows' O
// (normalized, fp32) and their log2-sum-exp to the plan's workspace, and
// attn_decode_combine.cu merges the splits.
//
// Who copies a tile's rows (WARP_RING). 0: every thread copies some of the
// tile, and a __syncthreads a tile hands the ring on. 1: each warp copies
// the 16 rows it reads itself, so a warp waits for its own copies only and
// no barrier spans the CTA until the merge: a warp stalled on memory holds
// up no other, and the ring's stages stay in flight.
//
// Parameters:
//   HEAD_DIM   32, 64, 80, 96 or 128 (a multiple of 16)
//   BLOCK_N    keys per tile, 16 per warp
//   STAGES     tiles in the ring, 2 to 8
//   MMA_TYPE   f16 or bf16 (operand type of mma.sync and of storage)
//   GROUP      attn_common.cuh's, always "0" here: the group is an argument
//   SOFTCAP    the logit softcap (attn_common.cuh); "0": none
//   WARP_RING  1: each warp copies its own rows of a tile; 0: the CTA does
//   PREFETCH   the L2 prefetch size of the K and V copies: "" (none),
//              ".L2::128B" or ".L2::256B"
//   UNROLL     1: a thread's copies of a tile in a loop of known trip count,
//              unrolled, addressed by steps from its first row in a whole
//              tile, and a warp's keys that every row reads unmasked; 0: a
//              loop to the tile's end, every key tested
//   KFIRST     with UNROLL, 1: all of a tile's K rows are asked for before
//              its V rows; 0: K and V row by row
//   SWIZZLE    1: Q, K and V rows unpadded and swizzled where D is a
//              multiple of 64 (see LDS); 0: padded

{{>attn_common.cuh}}

#define D {{HEAD_DIM}}
#define BN {{BLOCK_N}}
#define STAGES {{STAGES}}
#define KFIRST {{KFIRST}}
#define WARPS (BN / 16)
#define THREADS (WARPS * 32)
#define CH (D / 8)      // 16-byte chunks per row
// Shared rows of Q, K and V, so that an ldmatrix's 8 rows fall on distinct
// banks. SWZ (SWIZZLE, at head_dim 64 and 128): rows of D elements, chunk c
// of row r in place c ^ (r % 8) of its group of 8 chunks (128 bytes). Else
// rows padded by 16 bytes: every odd row then starts mid-sector, and each
// 32-byte sector copied into it costs L2 two requests (1.5x the sectors of
// K and V read; on an H100, 87% of the DRAM bandwidth against 91% swizzled).
#define SWZ ({{SWIZZLE}} && CH % 8 == 0)
#define LDS (SWZ ? D : D + 8)   // smem row stride in elements
static_assert(D % 16 == 0 && BN % 16 == 0 && STAGES >= 2, "tile shape");

// The byte offset of row r's 16-byte chunk c in a tile of Q, K or V.
__device__ __forceinline__ int dec_at(int r, int c)
{
    return 2 * (SWZ ? r * LDS + ((c & ~7) | ((c ^ r) & 7)) * 8 : r * LDS + c * 8);
}

// dec_at(r, c + j) from at = dec_at(r, c), where c < 8 and c + j's low three
// bits are c's and j's with no carry (here c is 0 or 1 and j even): the
// swizzle's XOR then moves with j, one operation and no register a step.
__device__ __forceinline__ int dec_step(int at, int j)
{
    return SWZ ? (at ^ ((j & 7) << 4)) + ((j & ~7) << 4) : at + j * 16;
}

typedef unsigned short elem_t;
typedef stof_{{MMA_TYPE}}_tag mma_tag;

__device__ __forceinline__ void dec_ldsm_x4(unsigned *r, unsigned p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(p));
}
__device__ __forceinline__ void dec_ldsm_x4_t(unsigned *r, unsigned p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(p));
}

// 16 bytes of a K or V row (src_bytes 0: zeros), with PREFETCH's L2 hint.
__device__ __forceinline__ void dec_cp16(unsigned dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global{{PREFETCH}} [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes));
}

// c += a (16x16, row) * b (16x8, col)
__device__ __forceinline__ void dec_mma(float *c, const unsigned *a, unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{{MMA_TYPE}}.{{MMA_TYPE}}.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Row `key` of KV head kvh of sequence b in k or v (strides in elements).
// Every K and V row the kernel reads is addressed here, so that a paged
// cache (a block table) changes this function alone.
__device__ __forceinline__ const elem_t *dec_kv_row(const elem_t *base, int b, int kvh, int key,
                                                   long long sb, long long sh, long long sl)
{
    return base + (long long)b * sb + (long long)kvh * sh + (long long)key * sl;
}

// q and out share their layout (q_s*); k and v theirs (kv_s*). cap: rows
// allocated per sequence; seqused: each sequence's keys (NULL: cap), the
// new rows included, clamped to [0, cap]; window: 0, or W (a row reads the
// last W keys up to its own). Split s of a sequence reads keys
// [lo + s * chunk, lo + (s + 1) * chunk) of [lo, len).
extern "C" __global__ void __launch_bounds__(THREADS) stof_attn_decode(
    const elem_t *__restrict__ q, const elem_t *__restrict__ k, const elem_t *__restrict__ v,
    elem_t *__restrict__ out, float *__restrict__ ws_o, float *__restrict__ ws_lse,
    long long q_sb, long long q_sh, long long q_sl, long long kv_sb, long long kv_sh,
    long long kv_sl, int heads, int group, int seq_q, int cap, int window,
    const int *__restrict__ seqused, int nsplit, int chunk, int row_chunks, float scale_log2)
{
    stof_grid_wait();  // common.cuh: the kernel before this one is done
    extern __shared__ __align__(16) unsigned char smem_raw[];
    elem_t *Qs = reinterpret_cast<elem_t *>(smem_raw);            // 16 rows
    elem_t *ring = Qs + 16 * LDS;                                  // STAGES x (K, V)
    float *red = reinterpret_cast<float *>(ring + STAGES * 2 * BN * LDS);  // WARPS x 16 x 2

    const int rc = blockIdx.x % row_chunks, split = blockIdx.x / row_chunks;
    const int kvh = blockIdx.y, b = blockIdx.z;
    const int rows = group * seq_q;
    const int len = seqused ? min(max(seqused[b], 0), cap) : cap;
    const int lo = window > 0 ? max(0, len - seq_q - window + 1) : 0;
    const int kbeg = lo + split * chunk, kend = min(len, kbeg + chunk);

    // The workspace row of (query head, new row): (b, head, i), split-major.
    auto ws_row = [&](int hq, int i) -> long long {
        return (((long long)b * heads + hq) * seq_q + i) * nsplit + split;
    };
    auto out_row = [&](int hq, int i) -> elem_t * {
        return out + (long long)b * q_sb + (long long)hq * q_sh + (long long)i * q_sl;
    };

    if (kbeg >= kend) {
        // Nothing to read: a split past the sequence's keys, or no keys at all.
        for (int x = threadIdx.x; x < 16 * D; x += THREADS) {
            const int r = x / D, c = x % D, gr = rc * 16 + r;
            if (gr >= rows)
                continue;
            const int hq = kvh * group + gr / seq_q, i = gr % seq_q;
            if (nsplit == 1) {
                out_row(hq, i)[c] = 0;
            } else {
                // zeros, which the combine reads at weight 0
                ws_o[ws_row(hq, i) * D + c] = 0.f;
                if (c == 0)
                    ws_lse[ws_row(hq, i)] = -STOF_INF;
            }
        }
        return;
    }

    const int ntiles = (kend - kbeg + BN - 1) / BN;
    for (int x = threadIdx.x; x < 16 * CH; x += THREADS) {
        const int r = x / CH, c = x % CH, gr = rc * 16 + r;
        const bool ok = gr < rows;
        const elem_t *src = q;
        if (ok)
            src += (long long)b * q_sb + (long long)(kvh * group + gr / seq_q) * q_sh +
                   (long long)(gr % seq_q) * q_sl;
        stof_cp16(stof_smem_u32(Qs) + dec_at(r, c), src + c * 8, ok ? 16 : 0);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // Keys at or past kend come in as zeros (a zero V row times P's zero).
    // Chunk x of a tile is row x / CH's 16-byte column x % CH; with
    // WARP_RING a warp copies chunks [warp * 16 * CH, (warp + 1) * 16 * CH):
    // its own 16 rows.
{{#if WARP_RING}}
    const int x0 = warp * 16 * CH + lane, x1 = (warp + 1) * 16 * CH, xs = 32;
{{/if}}{{#unless WARP_RING}}
    const int x0 = threadIdx.x, x1 = BN * CH, xs = THREADS;
{{/if}}
    auto load_tile = [&](int it) {
        elem_t *Kt = ring + (it % STAGES) * 2 * BN * LDS, *Vt = Kt + BN * LDS;
        const int key0 = kbeg + it * BN;
        // Chunk x of K (kk), of V (vv) or of both.
        auto chunk = [&](int x, bool kk, bool vv) {
            const int r = x / CH, c = x % CH, key = key0 + r;
            const bool ok = key < kend;
            const int at = ok ? key : kbeg;
            if (kk)
                dec_cp16(stof_smem_u32(Kt) + dec_at(r, c),
                         dec_kv_row(k, b, kvh, at, kv_sb, kv_sh, kv_sl) + c * 8, ok ? 16 : 0);
            if (vv)
                dec_cp16(stof_smem_u32(Vt) + dec_at(r, c),
                         dec_kv_row(v, b, kvh, at, kv_sb, kv_sh, kv_sl) + c * 8, ok ? 16 : 0);
        };
{{#if UNROLL}}
        // In either ring a thread has CH / 2 chunks, x0 + i * xs (x0 < xs,
        // x1 - x0 = CH / 2 * xs). Where xs is a multiple of CH they are rows
        // r0 + i * (xs / CH) of column c0: in a tile wholly before kend the
        // thread addresses its first row through dec_kv_row and steps from
        // it (a tile's keys lie in one span of the cache: a paged cache's
        // pages would hold whole tiles), with no division and no bound per
        // chunk. KFIRST: the tile's K rows all go first.
        static_assert(CH % 2 == 0, "an even count of 16-byte chunks a row");
        (void)x1;
        constexpr int XS = {{#if WARP_RING}}32{{/if}}{{#unless WARP_RING}}THREADS{{/if}};
        if (XS % CH == 0 && key0 + BN <= kend) {
            constexpr int RS = XS % CH == 0 ? XS / CH : 1;
            const int r0 = x0 / CH, c0 = x0 % CH;
            const elem_t *kr = dec_kv_row(k, b, kvh, key0 + r0, kv_sb, kv_sh, kv_sl) + c0 * 8;
            const elem_t *vr = dec_kv_row(v, b, kvh, key0 + r0, kv_sb, kv_sh, kv_sl) + c0 * 8;
            // RS rows a step: a multiple of 8 keeps the swizzle's place.
            constexpr int RSTEP = !SWZ || RS % 8 == 0 ? RS * LDS * 2 : 0;
            const unsigned ks = stof_smem_u32(Kt) + dec_at(r0, c0),
                           vs = stof_smem_u32(Vt) + dec_at(r0, c0);
            auto dst = [&](unsigned base, int i) -> unsigned {
                return RSTEP ? base + i * RSTEP
                             : base - dec_at(r0, c0) + dec_at(r0 + i * RS, c0);
            };
            const long long gstep = RS * kv_sl;
#pragma unroll
            for (int i = 0; i < CH / 2; i++) {
                dec_cp16(dst(ks, i), kr + i * gstep, 16);
                if (!KFIRST)
                    dec_cp16(dst(vs, i), vr + i * gstep, 16);
            }
            if (KFIRST) {
#pragma unroll
                for (int i = 0; i < CH / 2; i++)
                    dec_cp16(dst(vs, i), vr + i * gstep, 16);
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < CH / 2; i++)
            chunk(x0 + i * xs, true, !KFIRST);
        if (KFIRST) {
#pragma unroll
            for (int i = 0; i < CH / 2; i++)
                chunk(x0 + i * xs, false, true);
        }
{{/if}}{{#unless UNROLL}}
        for (int x = x0; x < x1; x += xs)
            chunk(x, true, true);
{{/if}}
    };
    // Q goes with the first tile's group; a group is committed every step,
    // empty or not, so that waiting for STAGES - 2 pending means tile it is in.
#pragma unroll 1
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ntiles)
            load_tile(s);
        stof_cp_commit();
    }

    const int g = lane / 4, t = lane % 4;
    // Each lane's ldmatrix rows, chunk 0 or 1 (dec_step adds the rest): of
    // Q, of this warp's 16 keys of a K tile, and of a V tile (transposed).
    const int q_at = dec_at((lane % 8) + 8 * ((lane / 8) % 2), lane / 16),
              k_at = dec_at(warp * 16 + (lane % 8) + 8 * (lane / 16), (lane / 8) % 2),
              v_at = dec_at(warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2), lane / 16);
    const unsigned q_s = stof_smem_u32(Qs);
    // The key positions of this thread's two rows (g, g + 8): a row reads
    // keys up to its own, and with a window the last `window` of them;
    // padding rows, and rows past a sequence shorter than seq_q, read none.
    int pos[2];
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
        const int gr = rc * 16 + g + 8 * h2;
        pos[h2] = gr < rows ? len - seq_q + gr % seq_q : -1;
    }

    float o[D / 8][4];
    float m[2] = {-STOF_INF, -STOF_INF}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < D / 8; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

#pragma unroll 1
    for (int it = 0; it < ntiles; it++) {
        stof_cp_wait<STAGES - 2>();
{{#if WARP_RING}}
        if (it == 0)
            __syncthreads();  // Q, in every thread's first group, is in for all
        else
            __syncwarp();     // this warp's rows of tile it are in; of tile it - 1, read
{{/if}}{{#unless WARP_RING}}
        __syncthreads();  // tile it is in for every thread; tile it - 1 is done with
{{/if}}
        if (it + STAGES - 1 < ntiles)
            load_tile(it + STAGES - 1);
        stof_cp_commit();
        const unsigned k_s = stof_smem_u32(ring + (it % STAGES) * 2 * BN * LDS),
                       v_s = k_s + BN * LDS * 2;

        // S = Q Kᵀ: the 16 rows against this warp's 16 keys of the tile. Q's
        // fragments are read again each tile: kept in registers (32 more at
        // head_dim 128) the kernel spilled, and shared memory has time to spare.
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            unsigned qf[4], bfr[4];
            dec_ldsm_x4(qf, q_s + dec_step(q_at, kk * 2));
            dec_ldsm_x4(bfr, k_s + dec_step(k_at, kk * 2));
            dec_mma(s[0], qf, bfr[0], bfr[1]);
            dec_mma(s[1], qf, bfr[2], bfr[3]);
        }{{#if SOFTCAP}}
        stof_softcap(s, scale_log2);{{/if}}

        // s[j][e] holds key 8j + 2t + (e % 2) of the warp's 16, row g (e < 2)
        // or g + 8: past the split, past the row's position, before its window.
        const int key0 = kbeg + it * BN + warp * 16;
        // With UNROLL, a warp's 16 keys that every row reads whole skip the
        // test: before kend, at or before the lowest row's position (len -
        // seq_q; padding rows are never written) and past the highest row's
        // window start. Uniform across the warp.
        bool whole = false;
{{#if UNROLL}}
        whole = key0 + 16 <= kend && key0 + 15 <= len - seq_q &&
                (window == 0 || key0 > len - 1 - window);
{{/if}}
        if (!whole) {
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = key0 + 8 * j + 2 * t + e;
#pragma unroll
                    for (int h2 = 0; h2 < 2; h2++) {
                        const int p = pos[h2];
                        if (key >= kend || key > p || (window > 0 && key <= p - window))
                            s[j][2 * h2 + e] = -STOF_INF;
                    }
                }
        }

        unsigned pf[1][4];
        stof_softmax_step<mma_tag>(s, o, m, l, pf, scale_log2);

        // O += P V over the warp's 16 keys.
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            unsigned bfr[4];
            dec_ldsm_x4_t(bfr, v_s + dec_step(v_at, dp * 2));
            dec_mma(o[2 * dp], pf[0], bfr[0], bfr[1]);
            dec_mma(o[2 * dp + 1], pf[0], bfr[2], bfr[3]);
        }
    }
    stof_cp_wait<0>();
    __syncthreads();  // the ring is drained and read: its space takes the warps' O

    // The warps merge: each row's max over the warps, its sum and O rescaled to it.
    float *Os = reinterpret_cast<float *>(ring);  // WARPS x 16 x D
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
        float sum = l[h2];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int r = g + 8 * h2;
        if (t == 0) {
            red[(warp * 16 + r) * 2] = m[h2];
            red[(warp * 16 + r) * 2 + 1] = sum;
        }
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            Os[(warp * 16 + r) * D + 8 * i + 2 * t] = o[i][2 * h2];
            Os[(warp * 16 + r) * D + 8 * i + 2 * t + 1] = o[i][2 * h2 + 1];
        }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < 16 * D; x += THREADS) {
        const int r = x / D, c = x % D, gr = rc * 16 + r;
        if (gr >= rows)
            continue;
        float mx = -STOF_INF;
#pragma unroll
        for (int w = 0; w < WARPS; w++)
            mx = fmaxf(mx, red[(w * 16 + r) * 2]);
        float sum = 0.f, acc = 0.f;
        if (mx != -STOF_INF) {
#pragma unroll
            for (int w = 0; w < WARPS; w++) {
                const float f = stof_ex2(red[(w * 16 + r) * 2] - mx);  // 0 for a warp with none
                sum += f * red[(w * 16 + r) * 2 + 1];
                acc += f * Os[(w * 16 + r) * D + c];
            }
        }
        const int hq = kvh * group + gr / seq_q, i = gr % seq_q;
        const float val = sum > 0.f ? acc / sum : 0.f;
        if (nsplit == 1) {
            out_row(hq, i)[c] = stof_f32_to_{{MMA_TYPE}}(val);
        } else {
            const long long w = ws_row(hq, i);
            ws_o[w * D + c] = val;
            if (c == 0)
                ws_lse[w] = sum > 0.f ? mx + __log2f(sum) : -STOF_INF;
        }
    }
}
