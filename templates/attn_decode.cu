// attn_decode.cu — decoding attention: a few new query rows per sequence
// against its KV cache, the cache split among CTAs (flash-decoding).
//
// Tiling: grid (row chunk + row_chunks * split, KV head, batch). A CTA owns 16
// query rows of one KV head's group (row r = query head in the group * seq_q
// + new row, taken 16 at a time) and one split of the sequence's keys: chunk
// keys from the first key any new row may read (0, or the window's start).
// So each K and V tile is read once for all the group's heads. Tiles of
// BLOCK_N keys stream through a STAGES-deep ring; each of the BLOCK_N / 16
// compute warps takes 16 keys of every tile: S = Q Kᵀ and O += P V on
// mma.sync m16n8k16 with fp32 accumulation and an online softmax of its own,
// and the warps' states merge at the end. With one split the CTA writes out;
// with several, each writes its rows' O (normalized, fp32) and their
// log2-sum-exp to the plan's workspace, and attn_decode_combine.cu merges
// the splits.
//
// The ring is filled one of two ways (BULK). Off: every thread copies 16
// bytes at a time with cp.async, and a __syncthreads a tile hands the ring
// on. On (sm_90): one more warp, the producer, copies whole rows (HEAD_DIM
// x 2 bytes) with the bulk-copy engine (cp.async.bulk, wgmma.cuh's
// bulk_load), each stage's arrival counted on its full barrier by bytes;
// the compute warps release a stage on its empty barrier, and no barrier
// spans the CTA until the merge.
//
// Parameters:
//   HEAD_DIM   32, 64, 80, 96 or 128 (a multiple of 16)
//   BLOCK_N    keys per tile, 16 per compute warp
//   STAGES     tiles in the ring, 2 to 8
//   MMA_TYPE   f16 or bf16 (operand type of mma.sync and of storage)
//   GROUP      attn_common.cuh's, always "0" here: the group is an argument
//   SOFTCAP    the logit softcap (attn_common.cuh); "0": none
//   BULK       1: the ring is filled by a producer warp's bulk copies (the
//              request then carries wgmma.cuh); 0: by cp.async
//   EARLY      1: each CTA lets the stream's next kernel (the combine) launch
//              once its last tile is read (griddepcontrol.launch_dependents);
//              0: the next kernel launches as the CTAs exit
//   FUSE       1: no combine kernel: the CTA that writes a row chunk's last
//              split (counted in sem) merges the chunk's splits itself

{{>attn_common.cuh}}

#define D {{HEAD_DIM}}
#define BN {{BLOCK_N}}
#define STAGES {{STAGES}}
#define BULK {{BULK}}
#define WARPS (BN / 16)            // compute warps
#define THREADS ((WARPS + BULK) * 32)  // and the producer, with BULK
#define LDS (D + 8)     // smem row stride in elements: 16 B of padding keeps
                        // ldmatrix rows on distinct banks
#define CH (D / 8)      // 16-byte chunks per row
static_assert(D % 16 == 0 && BN % 16 == 0 && STAGES >= 2, "tile shape");

typedef unsigned short elem_t;
typedef stof_{{MMA_TYPE}}_tag mma_tag;

__device__ __forceinline__ void dec_ldsm_x4(unsigned *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(stof_smem_u32(p)));
}
__device__ __forceinline__ void dec_ldsm_x4_t(unsigned *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(stof_smem_u32(p)));
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
    const int *__restrict__ seqused, int nsplit, int chunk, int row_chunks, float scale_log2,
    unsigned *__restrict__ sem)
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
    };{{#if FUSE}}

    // With several splits, each CTA counts itself in its row chunk's sem
    // once its rows are in the workspace; the last of the chunk's nsplit
    // CTAs sets sem back to 0 (for the next run) and merges the splits as
    // attn_decode_combine.cu does, the weights staged in the ring's space.
    __shared__ int last_split;
    auto merge_splits = [&]() {
        __syncthreads();  // this CTA's rows are written; the ring is free
        if (threadIdx.x == 0) {
            unsigned *cnt = sem + ((long long)b * gridDim.y + kvh) * row_chunks + rc;
            __threadfence();
            last_split = atomicAdd(cnt, 1u) == (unsigned)nsplit - 1;
            if (last_split)
                *cnt = 0;
        }
        __syncthreads();
        if (!last_split)
            return;
        __threadfence();
        float *wt = reinterpret_cast<float *>(ring), *inv = wt + 16 * nsplit;
        for (int x = threadIdx.x; x < 16 * nsplit; x += THREADS) {
            const int r = x / nsplit, gr = rc * 16 + r;
            wt[x] = gr < rows ? __ldcg(ws_lse + ws_row(kvh * group + gr / seq_q, gr % seq_q) -
                                       split + x % nsplit)
                              : -STOF_INF;
        }
        __syncthreads();
        if (threadIdx.x < 16) {
            float *e = wt + threadIdx.x * nsplit;
            float mx = -STOF_INF, sum = 0.f;
            for (int sp = 0; sp < nsplit; sp++)
                mx = fmaxf(mx, e[sp]);
            for (int sp = 0; sp < nsplit; sp++) {
                e[sp] = mx == -STOF_INF || e[sp] == -STOF_INF ? 0.f : stof_ex2(e[sp] - mx);
                sum += e[sp];
            }
            inv[threadIdx.x] = sum > 0.f ? 1.f / sum : 0.f;
        }
        __syncthreads();
        for (int x = threadIdx.x; x < 16 * D; x += THREADS) {
            const int r = x / D, c = x % D, gr = rc * 16 + r;
            if (gr >= rows)
                continue;
            const int hq = kvh * group + gr / seq_q, i = gr % seq_q;
            const long long w0 = ws_row(hq, i) - split;
            float acc = 0.f;
            for (int sp = 0; sp < nsplit; sp++) {
                const float f = wt[r * nsplit + sp];
                if (f > 0.f)
                    acc += f * __ldcg(ws_o + (w0 + sp) * D + c);
            }
            out_row(hq, i)[c] = stof_f32_to_{{MMA_TYPE}}(acc * inv[r]);
        }
    };{{/if}}

    if (kbeg >= kend) {
        // Nothing to read: a split past the sequence's keys, or no keys at all.
        for (int x = threadIdx.x; x < 16 * D; x += THREADS) {
            const int r = x / D, c = x % D, gr = rc * 16 + r;
            if (gr >= rows)
                continue;
            const int hq = kvh * group + gr / seq_q, i = gr % seq_q;
            if (nsplit == 1)
                out_row(hq, i)[c] = 0;
            else if (c == 0)
                ws_lse[ws_row(hq, i)] = -STOF_INF;
        }{{#if FUSE}}
        if (nsplit > 1)
            merge_splits();{{/if}}
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
        stof_cp16(stof_smem_u32(Qs + r * LDS + c * 8), src + c * 8, ok ? 16 : 0);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
{{#if BULK}}
    // Each stage's full barrier (one arrival, the producer's, and the
    // stage's bytes) and empty barrier (one arrival per compute warp).
    unsigned long long *bars = reinterpret_cast<unsigned long long *>(red + WARPS * 16 * 2);
    const unsigned full0 = stof_smem_u32(bars), empty0 = full0 + STAGES * 8;
    if (threadIdx.x == 0) {
        for (int st = 0; st < STAGES; st++) {
            mbar_init(full0 + st * 8, 1);
            mbar_init(empty0 + st * 8, WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    stof_cp_commit();
    stof_cp_wait<0>();
    __syncthreads();  // Q is in, the barriers are set up

    if (warp == WARPS) {
        // The producer: lane x copies rows x, x + 32, ... of K and of V.
        // Keys at or past kend copy row kbeg (in the sequence, so finite):
        // their scores are masked to -inf, so P is 0 there and 0 x V is 0.
        stof_ring<STAGES> rp;
#pragma unroll 1
        for (int it = 0; it < ntiles; it++, rp.next()) {
            mbar_wait(empty0 + rp.stage * 8, rp.phase ^ 1);
            const unsigned full = full0 + rp.stage * 8;
            if (lane == 0)
                mbar_expect(full, 2u * BN * D * 2);
            __syncwarp();
            elem_t *Kt = ring + rp.stage * 2 * BN * LDS, *Vt = Kt + BN * LDS;
            const int key0 = kbeg + it * BN;
#pragma unroll
            for (int r = lane; r < BN; r += 32) {
                const int key = key0 + r < kend ? key0 + r : kbeg;
                bulk_load(stof_smem_u32(Kt + r * LDS),
                          dec_kv_row(k, b, kvh, key, kv_sb, kv_sh, kv_sl), D * 2, full);
                bulk_load(stof_smem_u32(Vt + r * LDS),
                          dec_kv_row(v, b, kvh, key, kv_sb, kv_sh, kv_sl), D * 2, full);
            }
        }
    }
{{/if}}{{#unless BULK}}
    // Keys at or past kend come in as zeros (a zero V row times P's zero).
    auto load_tile = [&](int it) {
        elem_t *Kt = ring + (it % STAGES) * 2 * BN * LDS, *Vt = Kt + BN * LDS;
        const int key0 = kbeg + it * BN;
        for (int x = threadIdx.x; x < BN * CH; x += THREADS) {
            const int r = x / CH, c = x % CH, key = key0 + r;
            const bool ok = key < kend;
            const int at = ok ? key : kbeg;
            stof_cp16(stof_smem_u32(Kt + r * LDS + c * 8),
                      dec_kv_row(k, b, kvh, at, kv_sb, kv_sh, kv_sl) + c * 8, ok ? 16 : 0);
            stof_cp16(stof_smem_u32(Vt + r * LDS + c * 8),
                      dec_kv_row(v, b, kvh, at, kv_sb, kv_sh, kv_sl) + c * 8, ok ? 16 : 0);
        }
    };
    // Q goes with the first tile's group; a group is committed every step,
    // empty or not, so that waiting for STAGES - 2 pending means tile it is in.
#pragma unroll 1
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ntiles)
            load_tile(s);
        stof_cp_commit();
    }
{{/if}}

    const int g = lane / 4, t = lane % 4;
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

{{#if BULK}}
    stof_ring<STAGES> rp;
#pragma unroll 1
    for (int it = 0; warp < WARPS && it < ntiles; it++, rp.next()) {
        mbar_wait(full0 + rp.stage * 8, rp.phase);  // tile it is in
        const elem_t *Kt = ring + rp.stage * 2 * BN * LDS, *Vt = Kt + BN * LDS;
{{/if}}{{#unless BULK}}
#pragma unroll 1
    for (int it = 0; it < ntiles; it++) {
        stof_cp_wait<STAGES - 2>();
        __syncthreads();  // tile it is in for every thread; tile it - 1 is done with
        if (it + STAGES - 1 < ntiles)
            load_tile(it + STAGES - 1);
        stof_cp_commit();
        const elem_t *Kt = ring + (it % STAGES) * 2 * BN * LDS, *Vt = Kt + BN * LDS;
{{/if}}

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
            dec_ldsm_x4(qf, Qs + ((lane % 8) + 8 * ((lane / 8) % 2)) * LDS + kk * 16 +
                                8 * (lane / 16));
            dec_ldsm_x4(bfr, Kt + (warp * 16 + (lane % 8) + 8 * (lane / 16)) * LDS + kk * 16 +
                                 8 * ((lane / 8) % 2));
            dec_mma(s[0], qf, bfr[0], bfr[1]);
            dec_mma(s[1], qf, bfr[2], bfr[3]);
        }{{#if SOFTCAP}}
        stof_softcap(s, scale_log2);{{/if}}

        // s[j][e] holds key 8j + 2t + (e % 2) of the warp's 16, row g (e < 2)
        // or g + 8: past the split, past the row's position, before its window.
        const int key0 = kbeg + it * BN + warp * 16;
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

        unsigned pf[1][4];
        stof_softmax_step<mma_tag>(s, o, m, l, pf, scale_log2);

        // O += P V over the warp's 16 keys.
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            unsigned bfr[4];
            dec_ldsm_x4_t(bfr, Vt + (warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * LDS +
                                   dp * 16 + 8 * (lane / 16));
            dec_mma(o[2 * dp], pf[0], bfr[0], bfr[1]);
            dec_mma(o[2 * dp + 1], pf[0], bfr[2], bfr[3]);
        }{{#if BULK}}
        __syncwarp();
        if (lane == 0)
            mbar_arrive(empty0 + rp.stage * 8);  // this warp is done with the stage{{/if}}
    }{{#if EARLY}}
#if __CUDA_ARCH__ >= 900
    // This CTA reads no more of K and V: the combine may launch (it waits
    // for this grid's end and writes before it reads: stof_grid_wait).
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif{{/if}}{{#unless BULK}}
    stof_cp_wait<0>();{{/if}}
    __syncthreads();  // the ring is drained and read: its space takes the warps' O

    // The warps merge: each row's max over the warps, its sum and O rescaled to it.
    float *Os = reinterpret_cast<float *>(ring);  // WARPS x 16 x D
#pragma unroll
    for (int h2 = 0; warp < WARPS && h2 < 2; h2++) {
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
    }{{#if FUSE}}
    if (nsplit > 1)
        merge_splits();{{/if}}
}
