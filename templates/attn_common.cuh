// attn_common.cuh — what the three attention engines share (attn.cu on
// mma.sync, attn_wg.cu on wgmma, attn_ws.cu warp-specialized): the work
// item and the kernel's parameters and slices of the engines that take one
// item a CTA, the addressing of query rows and of a tile's keys (and of
// their chunks in the swizzled layout of the wgmma engines), the mask bits
// of a partial tile, the online softmax and the store of O's rows. Each
// engine keeps its own loop.
//
// An engine includes it (an include tag, codegen/render.h) ahead of its own
// constants, whose short names (D, BM, BN, WPR ...) would otherwise replace
// names here; its macros name the engine's elem_t and the kernel's
// parameters where they are used. No template parameters.{{#if GROUP}}
//
// GROUP (every engine's; "0" drops what it adds): query heads per KV head, k
// and v holding heads / GROUP heads, query head h reading KV head h / GROUP.{{/if}}{{#if SOFTCAP}}
//
// SOFTCAP (every engine's; "0" drops what it adds): the logit softcap, a
// float literal; each engine calls stof_softcap on a tile's raw scores
// before it masks them.{{/if}}{{#if MODS}}
//
// MODS (every engine's; "0" drops what it adds): "1" where the kernel adds
// score modifiers, each in a section of its own: ALIBI ("1": slope[h] (k -
// p), the slopes read from alibi_slopes) and BIAS (B, the buckets:
// table[h][bucket(p - k)] read from bias_table). The kernel then takes
// both pointers last (the one it does not use NULL), and each engine calls
// stof_score_mods on a tile's raw scores after the softcap and before the
// mask, p being a query row's position among the keys, row + lk - lq
// (bottom-right, as the masks align a KV prefix).{{/if}}{{#if VARLEN}}
//
// VARLEN (attn.cu's and attn_wg.cu's; "0" renders the padded batch): packed
// variable-length sequences. Batch b's sequence is rows cu_q[b] ..
// cu_q[b + 1] - 1 of q and out and rows cu_k[b] .. cu_k[b + 1] - 1 of k and
// v, and it holds the plan's rows [qlo, qlim) and keys [klo, klim): the
// kernel walks the plan's tiles as ever, reads only those rows and keys and
// writes only those rows.{{/if}}

// ---- The work and its addressing --------------------------------------------

// The work item of this CTA. The grid is (heads, batch, query groups by
// rank) and CTAs start roughly in linear order, so they take the groups
// heaviest first across all heads: the longest walks start early and the
// short ones fill the tail (measured on causal masks: 6 to 16% faster than
// walking one head after another). work[rank] holds the group, its first
// and end tile and its first tile's key, so that a CTA issues its first
// copies after one 16-byte load, with no division for its coordinates.
struct stof_item {
    int group, t0, t1, key0;
};
__device__ __forceinline__ stof_item stof_work_item(const int *work)
{
    const int4 w = reinterpret_cast<const int4 *>(work)[blockIdx.z];
    return {w.x, w.y, w.z, w.w};
}

// The kernel's parameters in the engines that take one work item a CTA
// (attn.cu, attn_wg.cu), as mha.c passes them: q, k, v and out with their
// batch, head and row strides (elements), the lengths, each sequence's
// length (NULL: lq and lk), the work list, the gathered groups' query rows,
// each tile's key (its first, or its offset into kidx in tiles) and bitmap
// (-1: full), the gathered tiles' keys, the bitmaps and the scale in log2
// units.
#define ATTN_ITEM_PARAMS                                                                    \
    const elem_t *__restrict__ q, const elem_t *__restrict__ k,                             \
        const elem_t *__restrict__ v, elem_t *__restrict__ out, long long q_sb,             \
        long long q_sh, long long q_sl, long long k_sb, long long k_sh, long long k_sl,     \
        long long v_sb, long long v_sh, long long v_sl, long long o_sb, long long o_sh,     \
        long long o_sl, int lq, int lk, const int *__restrict__ {{#unless VARLEN}}seq_lens{{/if}}{{#if VARLEN}}cu_q{{/if}},                    \
        const int *__restrict__ work, const int *__restrict__ qidx,                          \
        const int *__restrict__ tile_key, const int *__restrict__ tile_bits,                 \
        const int *__restrict__ kidx, const unsigned *__restrict__ bits, float scale_log2{{#if MODS}}, \
        const float *__restrict__ alibi_slopes, const float *__restrict__ bias_table{{/if}}{{#if VARLEN}} \
        , const int *__restrict__ cu_k, long long total_q, long long total_k, int shift{{/if}}

{{#unless VARLEN}}// The length of sequence b: rows and keys at or past it are masked out.
__device__ __forceinline__ int attn_seq_len(const int *seq_lens, int b)
{
    return seq_lens ? seq_lens[b] : 0x7fffffff;
}

// Declares, from ATTN_ITEM_PARAMS, the limits of batch b's sequence (len,
// qlim, klim) and the (batch b, head h) slices of q, k, v and out (qb, kb,
// vb, ob).
#define ATTN_ITEM_SLICES(b, h)                                   \
    const int len = attn_seq_len(seq_lens, (b));                 \
    const int qlim = min(lq, len), klim = min(lk, len);          \
    const elem_t *qb = q + (b) * q_sb + (h) * q_sh;              \
    const elem_t *kb = k + (b) * k_sb + (h){{#if GROUP}} / {{GROUP}}{{/if}} * k_sh;              \
    const elem_t *vb = v + (b) * v_sb + (h){{#if GROUP}} / {{GROUP}}{{/if}} * v_sh;              \
    elem_t *ob = out + (b) * o_sb + (h) * o_sh
{{/if}}{{#if VARLEN}}
// VARLEN: sequence b's rows and keys in the buffers, clamped to them (the
// ends read on the device are not checked), and its lengths, clamped to the
// plan's (a longer sequence keeps its first lq rows and lk keys). Its
// queries are its last rows among its keys, as the plan's are: where its
// offset nk - nq differs from the plan's lk - lq and shift is set (a mask
// that depends on q - k alone), it stands on the plan's mask moved along the
// diagonal, rows down by d or keys right by -d; else it takes the mask's
// top-left corner. q0 and k0: the buffer rows of the plan's row and key 0,
// which may lie before the sequence (never read there).
struct attn_span {
    long long q0, k0;
    int qlo, qhi, klo, khi;
};
__device__ __forceinline__ long long attn_clamp(long long x, long long lo, long long hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}
__device__ __forceinline__ attn_span attn_varlen_span(const int *cu_q, const int *cu_k, int b,
                                                      int lq, int lk, long long total_q,
                                                      long long total_k, int shift)
{
    const long long q0 = attn_clamp(cu_q[b], 0, total_q);
    const long long q1 = attn_clamp(cu_q[b + 1], q0, total_q);
    const long long k0 = attn_clamp(cu_k[b], 0, total_k);
    const long long k1 = attn_clamp(cu_k[b + 1], k0, total_k);
    const int nq = (int)attn_clamp(q1 - q0, 0, lq), nk = (int)attn_clamp(k1 - k0, 0, lk);
    const int d = shift ? (nk - nq) - (lk - lq) : 0;
    const int s = d > 0 ? d : 0, t = d < 0 ? -d : 0;
    return {q0 - s, k0 - t, s, s + nq, t, t + nk};
}

// Declares, from ATTN_ITEM_PARAMS, the plan's rows [qlo, qlim) and keys
// [klo, klim) that batch b's sequence holds, and the head h slices of q, k,
// v and out (qb, kb, vb, ob), addressed by the plan's rows and keys.
#define ATTN_ITEM_SLICES(b, h)                                                          \
    const attn_span span =                                                              \
        attn_varlen_span(cu_q, cu_k, (b), lq, lk, total_q, total_k, shift);             \
    const int qlo = span.qlo, qlim = span.qhi, klo = span.klo, klim = span.khi;        \
    const elem_t *qb = q + span.q0 * q_sl + (h) * q_sh;                                \
    const elem_t *kb = k + span.k0 * k_sl + (h){{#if GROUP}} / {{GROUP}}{{/if}} * k_sh; \
    const elem_t *vb = v + span.k0 * v_sl + (h){{#if GROUP}} / {{GROUP}}{{/if}} * v_sh; \
    elem_t *ob = out + span.q0 * o_sl + (h) * o_sh

// A row or key index (attn_row, attn_key: -1 or below the upper limit)
// that the sequence holds: -1 below lo too.
__device__ __forceinline__ int attn_from(int i, int lo)
{
    return i >= lo ? i : -1;
}

// The part of a group's block tiles t0 .. t1 - 1 (in increasing key order,
// as mask_build_blocks lists them) whose keys key .. key + BN - 1 meet the
// sequence's [klo, klim): the tiles before and after it hold none of its
// keys and are not walked. The CTA's threads count them together, a tile
// each per pass; a sequence holding all lk keys reads nothing.
template <int BN>
__device__ __forceinline__ int2 attn_tiles_within(const int *tile_key, int t0, int t1, int klo,
                                                  int klim, int lk)
{
    if (klo >= klim)
        return make_int2(t0, t0);
    if (klo == 0 && klim >= lk)
        return make_int2(t0, t1);
    int before = 0, after = 0;
    for (int i = t0; i < t1; i += blockDim.x) {
        const int j = i + threadIdx.x;
        const int key = j < t1 ? tile_key[j] : 0;
        before += __syncthreads_count(j < t1 && key + BN <= klo);
        after += __syncthreads_count(j < t1 && key >= klim);
    }
    return make_int2(t0 + before, max(t0 + before, t1 - after));
}

// Whether query group `group` of ROWS rows (consecutive unless GATHER)
// holds none of the sequence's rows: its CTA exits before any copy.
template <bool GATHER, int ROWS>
__device__ __forceinline__ bool attn_group_idle(int group, int qlo, int qlim)
{
    return qlo >= qlim || (!GATHER && (group * ROWS >= qlim || group * ROWS + ROWS <= qlo));
}
{{/if}}
// Row r of a query group whose rows are consecutive from `first`, or listed
// at idx[first ..] (GATHER, -1 for padding): its index, or -1 where it is
// padding or at or past lim.
template <bool GATHER>
__device__ __forceinline__ int attn_row(const int *idx, int first, int r, int lim)
{
    const int i = GATHER ? idx[first + r] : first + r;
    return i >= 0 && i < lim ? i : -1;
}

// Key r of a tile of KEYS keys: consecutive from `key`, or (GATHER) listed
// in kidx from key * KEYS on (key: the tile's offset, in tiles; -1 for
// padding); -1 where it is padding or at or past lk.
template <bool GATHER, int KEYS>
__device__ __forceinline__ int attn_key(const int *kidx, int key, int r, int lk)
{
    if (GATHER) {
        const int *ix = kidx + (long long)key * KEYS;
        return attn_row<true>(ix, 0, r, lk);
    }
    const int i = key + r;
    return i < lk ? i : -1;
}

// Where 16-byte chunk c of row r of an R-row tile at dst lies in the
// 128-byte swizzled layout (wgmma.cuh): 8 chunks (64 columns) to an atom,
// atoms R rows apart, a chunk XORed with the row's index mod 8.
template <int R>
__device__ __forceinline__ unsigned attn_swizzled(unsigned dst, int c, int r)
{
    return dst + (c / 8) * R * 128 + r * 128 + (((c % 8) ^ (r % 8)) << 4);
}

// ---- Masks, the online softmax, O's rows --------------------------------------

// 2^x on the SFU; inputs here are <= 0, where its error is a few ulp.
__device__ __forceinline__ float stof_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}{{#if SOFTCAP}}

// The logit softcap (Gemma-2) on one m16 row tile's raw scores, before any
// masking (tanh would turn a masked -inf into -cap): the softmax multiplies a
// raw score by scale_log2 = scale log2(e), so s becomes cap tanh(s scale / cap)
// / scale, the capped score in natural units over the scale that multiplies
// it back. tanh x = 1 - 2 / (1 + e^2x) on the SFU: what the softmax sees is
// the capped logit's absolute error, here about cap * 2^-22 (tanh.approx's
// relative 2^-11 would be cap * 2^-11 near the cap). tanhf spilled more
// registers; so did capping inside the softmax step, as each score is read.
template <int NB>
__device__ __forceinline__ void stof_softcap(float (&s)[NB][4], float scale_log2)
{
    constexpr float cap = {{SOFTCAP}};
    const float to = scale_log2 * (0.6931471805599453f / cap);  // tanh's argument: s to
    const float to2 = 2.f * 1.4426950408889634f * to, back = 1.f / to;
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            s[j][e] = (1.f - __fdividef(2.f, 1.f + stof_ex2(s[j][e] * to2))) * back;
}{{/if}}{{#if MODS}}

// Head h's score modifiers in raw units, as the scores are kept until the
// softmax multiplies them by scale_log2 = scale log2(e): a modifier x of the
// logit adds x / scale = x log2(e) / scale_log2 to a raw score.
struct stof_mods {
    float slope;      // ALIBI: head h's slope in raw units
    const float *row; // BIAS: head h's buckets (logit units)
    float to_raw;     // log2(e) / scale_log2
};
__device__ __forceinline__ stof_mods stof_mods_of(int h, float scale_log2, const float *slopes,
                                                  const float *table)
{
    const float to_raw = 1.4426950408889634f / scale_log2;
    stof_mods m = {0.f, nullptr, to_raw};{{#if ALIBI}}
    m.slope = __ldg(slopes + h) * to_raw;{{/if}}{{#if BIAS}}
    m.row = table + (long long)h * {{BIAS}};{{/if}}
    return m;
}{{#if BIAS}}

// The bucket of distance d = p - k among BIAS buckets (stof.h).
__device__ __forceinline__ int stof_bucket(int d)
{
    constexpr int B = {{BIAS}};
    return min(max(d, -(B / 2)), B - 1 - B / 2) + B / 2;
}{{/if}}

// The score modifiers on one m16 row tile's raw scores (after the softcap,
// before the mask): p0, p1 the positions of the thread's rows g and g + 8,
// key_at(c) the key of the tile's column c (garbage for a padding column:
// the mask drops it, and a bucket is clamped into the table).
template <int NB, typename KeyAt>
__device__ __forceinline__ void stof_score_mods(float (&s)[NB][4], const stof_mods &m, int p0,
                                                int p1, int t, KeyAt key_at)
{
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int k = key_at(j * 8 + 2 * t + e);{{#if ALIBI}}
            s[j][e] = fmaf(m.slope, (float)(k - p0), s[j][e]);
            s[j][2 + e] = fmaf(m.slope, (float)(k - p1), s[j][2 + e]);{{/if}}{{#if BIAS}}
            s[j][e] = fmaf(__ldg(m.row + stof_bucket(p0 - k)), m.to_raw, s[j][e]);
            s[j][2 + e] = fmaf(__ldg(m.row + stof_bucket(p1 - k)), m.to_raw, s[j][2 + e]);{{/if}}
        }
}{{/if}}

// Scores of one m16 row tile as tensor-core accumulators: s[j] holds keys
// 8j + 2t, 8j + 2t + 1 of row g (elements 0, 1) and of row g + 8 (2, 3).
// Masks the keys a partial tile's bitmap rows w0p, w1p (NULL: a full tile)
// leave out and, where edge is set, those key_ok(column) rules out. Each
// word is shifted by 2t once, so a key's bit sits at a constant position.
template <int NB, int WPR, typename KeyOk>
__device__ __forceinline__ void stof_mask_scores(float (&s)[NB][4], const unsigned *w0p,
                                                 const unsigned *w1p, int t, bool edge,
                                                 KeyOk key_ok)
{
    if (w0p) {
        unsigned w0[WPR], w1[WPR];
#pragma unroll
        for (int w = 0; w < WPR; w++)
            w0[w] = w0p[w] >> (2 * t), w1[w] = w1p[w] >> (2 * t);
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const unsigned bit = 1u << ((j % 4) * 8 + e);
                if (!(w0[j / 4] & bit))
                    s[j][e] = -STOF_INF;
                if (!(w1[j / 4] & bit))
                    s[j][2 + e] = -STOF_INF;
            }
    }
    if (edge) {
#pragma unroll
        for (int j = 0; j < NB; j++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (!key_ok(j * 8 + 2 * t + e))
                    s[j][e] = s[j][2 + e] = -STOF_INF;
    }
}

// One online-softmax step, in units of log2, for the two rows a thread holds
// of an m16 tile, leaving O alone: max on raw scores (the scale is
// positive), one FMA per score folds scale and offset, s becomes P (fp32)
// and alpha[h2] the factor that row's O must be rescaled by. Kernels whose
// O is still being accumulated by an asynchronous product rescale it later.
// SUM = false leaves l alone, for a kernel whose products take the row sums.
template <int NB, bool SUM = true>
__device__ __forceinline__ void stof_softmax_p(float (&s)[NB][4], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], float scale_log2)
{
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
        float mx = -STOF_INF;
#pragma unroll
        for (int j = 0; j < NB; j++)
            mx = fmaxf(mx, fmaxf(s[j][2 * h2], s[j][2 * h2 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mnew = fmaxf(m[h2], mx * scale_log2);
        // A row with nothing allowed yet keeps base 0: exp2 never sees inf - inf.
        const float base = mnew == -STOF_INF ? 0.f : mnew;
        alpha[h2] = stof_ex2(m[h2] - base);
        m[h2] = mnew;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < NB; j++) {
            s[j][2 * h2] = stof_ex2(fmaf(s[j][2 * h2], scale_log2, -base));
            s[j][2 * h2 + 1] = stof_ex2(fmaf(s[j][2 * h2 + 1], scale_log2, -base));
            if constexpr (SUM)
                sum += s[j][2 * h2] + s[j][2 * h2 + 1];
        }
        if constexpr (SUM)
            l[h2] = l[h2] * alpha[h2] + sum;
    }
}

// O's rows times the softmax step's factors.
template <int NO>
__device__ __forceinline__ void stof_rescale(float (&o)[NO][4], const float (&alpha)[2])
{
#pragma unroll
    for (int i = 0; i < NO; i++) {
        o[i][0] *= alpha[0];
        o[i][1] *= alpha[0];
        o[i][2] *= alpha[1];
        o[i][3] *= alpha[1];
    }
}

// P in the accumulator layout of S becomes the A operand of the P V product:
// two n8 blocks make one k16.
template <typename Tag, int NB>
__device__ __forceinline__ void stof_pack_p(const float (&p)[NB][4], unsigned (&pf)[NB / 2][4])
{
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++)
            pf[j / 2][(j % 2) * 2 + h2] = Tag::pack2(p[j][2 * h2], p[j][2 * h2 + 1]);
}

// The whole step for kernels that wait for their products: P, O rescaled,
// P packed.
template <typename Tag, int NB, int NO>
__device__ __forceinline__ void stof_softmax_step(float (&s)[NB][4], float (&o)[NO][4],
                                                  float (&m)[2], float (&l)[2],
                                                  unsigned (&pf)[NB / 2][4], float scale_log2)
{
    float alpha[2];
    stof_softmax_p(s, m, l, alpha, scale_log2);
    stof_rescale(o, alpha);
    stof_pack_p<Tag>(s, pf);
}

// Divides a thread's two output rows by their sums and stores them: row h2
// goes to ob + rows[h2] * o_sl (rows[h2] < 0: none). Rows at or past qlim
// and rows that allowed nothing come out as zeros.
template <typename Tag, int NO>
__device__ __forceinline__ void stof_store_rows(float (&o)[NO][4], const float (&l)[2],
                                                unsigned short *ob, long long o_sl,
                                                const int (&rows)[2], int qlim, int t)
{
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
        float sum = l[h2];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const int qr = rows[h2];
        const float inv = sum > 0.f && qr < qlim ? 1.f / sum : 0.f;
        if (qr < 0)
            continue;
#pragma unroll
        for (int i = 0; i < NO; i++)
            *reinterpret_cast<unsigned *>(ob + qr * o_sl + i * 8 + 2 * t) =
                Tag::pack2(o[i][2 * h2] * inv, o[i][2 * h2 + 1] * inv);
    }
}
