// wgmma.cuh — Hopper's warpgroup MMA (sm_90a), the shared-memory barriers
// that stage its operands and the tensor-memory accelerator's (TMA) bulk
// copies that fill them, shared by the templates built on it (attn_wg.cu,
// attn_ws.cu, gemm_wg.cu, gemm_tma.cu). A request names it as its part: it
// is rendered with the request's values and placed between the prelude and
// the template.
//
// Operands in shared memory use the 128-byte swizzled layout: rows of 128
// bytes (64 16-bit elements) whose 16-byte chunks are XORed with the row's
// index mod 8, each tile 1024-byte aligned; wg_desc describes one (and the
// 64-byte form, whose rows are 64 bytes and whose chunks are XORed with
// the row's index / 2 mod 4).
//
// Parameters:
//   MMA_TYPE   f16 or bf16: the operand type of the products

// ---- wgmma -------------------------------------------------------------------

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Waits for all but the most recently committed group.
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous products' issue and wait.
template <int N>
__device__ __forceinline__ void wg_hold(float (&d)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+f"(d[i][e])::"memory");
}

// Descriptor of a swizzled operand at shared address addr: lbo and sbo in
// bytes (K-major: sbo = 8 rows; N-major: lbo = the next swizzle atom's
// columns, sbo = the next 8 rows of K). sw is the swizzle's span in bytes:
// 128 (64 16-bit columns a row, the default) or 64 (32 columns: a head of 96
// columns as three atoms).
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo,
                                                      int sw = 128)
{
    const unsigned long long layout = sw == 128 ? 1 : 2;
    return (unsigned long long)((addr & 0x3ffff) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (layout << 62);
}

// Descriptor d moved on by `bytes` (a multiple of 16; the start address
// stays below 256 KiB): one add to the address field in the low word, where
// a descriptor built from the moved address costs a mask, a shift and an or
// before every product. The GEMMs build their K step's descriptors so (on
// an H100 the ping-pong configs gained 1-4%, BERT's GELU product at 128x128
// 542 -> 563 TF/s); attention does not: with the same change ptxas moved
// its softmax around the P V wait, and 128x192 causal and 192x96 at head_dim
// 96 ran 7% and 10% slower.
__device__ __forceinline__ unsigned long long wg_desc_add(unsigned long long d, unsigned bytes)
{
    unsigned lo, hi;
    asm("mov.b64 {%0, %1}, %2;" : "=r"(lo), "=r"(hi) : "l"(d));
    lo += bytes >> 4;
    asm("mov.b64 %0, {%1, %2};" : "=l"(d) : "r"(lo), "r"(hi));
    return d;
}

// wg_ss: d (m64 x n) {+}= a (desc, K-major) * b (desc, K-major); acc 0
// overwrites d. wg_rs: d += a (registers) * b (desc, N-major). wg_ssn: d +=
// a (desc, K-major) * b (desc, N-major). One overload per n, d[n / 8][4];
// the accumulators' operand lists are spelled once, here, 32 at a time.
#define STOF_ACC4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define STOF_ACC_8(i)                                                                             \
    STOF_ACC4(i), STOF_ACC4(i + 1), STOF_ACC4(i + 2), STOF_ACC4(i + 3), STOF_ACC4(i + 4),         \
        STOF_ACC4(i + 5), STOF_ACC4(i + 6), STOF_ACC4(i + 7)
#define STOF_ACC8 STOF_ACC_8(0)
#define STOF_ACC9 STOF_ACC8, STOF_ACC4(8)
#define STOF_ACC10 STOF_ACC8, STOF_ACC4(8), STOF_ACC4(9)
#define STOF_ACC12 STOF_ACC10, STOF_ACC4(10), STOF_ACC4(11)
#define STOF_ACC16 STOF_ACC8, STOF_ACC_8(8)
#define STOF_ACC18 STOF_ACC16, STOF_ACC4(16), STOF_ACC4(17)
#define STOF_ACC24 STOF_ACC16, STOF_ACC_8(16)
#define STOF_ACC32 STOF_ACC24, STOF_ACC_8(24)
#define STOF_REGS8 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define STOF_REGS9 STOF_REGS8 ", %32, %33, %34, %35"
#define STOF_REGS10 STOF_REGS8 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define STOF_REGS12 STOF_REGS10 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define STOF_REGS16 STOF_REGS8 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define STOF_REGS18 STOF_REGS16 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define STOF_REGS24 STOF_REGS16 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define STOF_REGS32 STOF_REGS24 ", %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// m64nNk16 with NB = N / 8 accumulator blocks; the operands after the
// accumulators: A's descriptor (or its registers A0-A3), B's, the
// accumulate flag P.
#define STOF_WG_SS(NB, N, A, B, P)                                                                \
    __device__ __forceinline__ void wg_ss(float (&d)[NB][4], unsigned long long a,                \
                                          unsigned long long b, int acc)                          \
    {                                                                                             \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                             \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.{{MMA_TYPE}}.{{MMA_TYPE}}\n" \
                     "{" STOF_REGS##NB "},\n%" #A ", %" #B ", p, 1, 1, 0, 0;\n}\n"                \
                     : STOF_ACC##NB                                                               \
                     : "l"(a), "l"(b), "r"(acc));                                                 \
    }
#define STOF_WG_RS(NB, N, A0, A1, A2, A3, B, P)                                                   \
    __device__ __forceinline__ void wg_rs(float (&d)[NB][4], const unsigned (&a)[4],              \
                                          unsigned long long b)                                   \
    {                                                                                             \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                             \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.{{MMA_TYPE}}.{{MMA_TYPE}}\n" \
                     "{" STOF_REGS##NB "},\n{%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B       \
                     ", p, 1, 1, 1;\n}\n"                                                         \
                     : STOF_ACC##NB                                                               \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));               \
    }
#define STOF_WG_SSN(NB, N, A, B, P)                                                               \
    __device__ __forceinline__ void wg_ssn(float (&d)[NB][4], unsigned long long a,               \
                                           unsigned long long b)                                  \
    {                                                                                             \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                             \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.{{MMA_TYPE}}.{{MMA_TYPE}}\n" \
                     "{" STOF_REGS##NB "},\n%" #A ", %" #B ", p, 1, 1, 0, 1;\n}\n"                \
                     : STOF_ACC##NB                                                               \
                     : "l"(a), "l"(b), "r"(1));                                                   \
    }
STOF_WG_SS(8, 64, 32, 33, 34)
STOF_WG_RS(8, 64, 32, 33, 34, 35, 36, 37)
STOF_WG_SSN(8, 64, 32, 33, 34)
STOF_WG_RS(9, 72, 36, 37, 38, 39, 40, 41)
STOF_WG_SSN(9, 72, 36, 37, 38)
STOF_WG_RS(10, 80, 40, 41, 42, 43, 44, 45)
STOF_WG_SSN(10, 80, 40, 41, 42)
STOF_WG_SS(12, 96, 48, 49, 50)
STOF_WG_RS(12, 96, 48, 49, 50, 51, 52, 53)
STOF_WG_SSN(12, 96, 48, 49, 50)
STOF_WG_SS(16, 128, 64, 65, 66)
STOF_WG_RS(16, 128, 64, 65, 66, 67, 68, 69)
STOF_WG_SSN(16, 128, 64, 65, 66)
STOF_WG_SS(18, 144, 72, 73, 74)
STOF_WG_SS(24, 192, 96, 97, 98)
STOF_WG_SS(32, 256, 128, 129, 130)

// S (64 x BN) = Q Kᵀ, committed, not waited for: 64 rows of Q at q, which
// lie in a tile of QR rows, and BN rows of K at k, both stored in swizzled
// atoms of SW bytes a row (SW / 2 columns; a tile's atom a at a * rows * SW
// bytes); 16 columns of the head per product, SW / 32 per atom.
template <int D, int QR, int BN, int SW = 128>
__device__ __forceinline__ void wg_qk(float (&s)[BN / 8][4], unsigned q, unsigned k)
{
    constexpr int KPA = SW / 32;
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wg_ss(s, wg_desc(q + (kk / KPA) * QR * SW + (kk % KPA) * 32, 16, 8 * SW, SW),
              wg_desc(k + (kk / KPA) * BN * SW + (kk % KPA) * 32, 16, 8 * SW, SW), kk > 0);
    wg_commit();
}

// Four 8x8 matrices of 16-bit elements from registers to shared memory:
// register k of thread (g, t) is row g, columns 2t and 2t + 1 of matrix k;
// lane i gives the address of matrix i / 8's row i % 8.
__device__ __forceinline__ void stmatrix4(unsigned addr, const unsigned (&r)[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// ---- shared-memory barriers ---------------------------------------------------

__device__ __forceinline__ void mbar_init(unsigned bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// n arrivals at once (on behalf of threads that will not arrive).
__device__ __forceinline__ void mbar_arrive_n(unsigned bar, unsigned n)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(n) : "memory");
}
// Arrives on bar once this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void cp_arrive_noinc(unsigned bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase with the given parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, int parity)
{
    asm volatile("{\n.reg .pred done;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
// A position in a ring of N stages: the stage and the parity of its
// round, advanced one step at a time. (A quotient by N in a loop, where N is
// not a power of two, cost attention with 3 stages 6-10%.)
template <int N>
struct stof_ring {
    int stage = 0, phase = 0;
    __device__ __forceinline__ void next()
    {
        if (++stage == N) {
            stage = 0;
            phase ^= 1;
        }
    }
    // Step x's position: one quotient, for outside a loop.
    __device__ static __forceinline__ stof_ring at(int x)
    {
        stof_ring r;
        r.stage = x % N;
        r.phase = (x / N) & 1;
        return r;
    }
};

// Arrives on bar and adds bytes to the transfer count its phase waits for.
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}

// Named barriers 1..15 among some warps of the CTA (0 is __syncthreads):
// sync waits for `threads` arrivals, its own included; arrive does not wait.
__device__ __forceinline__ void named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- TMA -----------------------------------------------------------------------

// A TMA descriptor (CUtensorMap), passed by value as a __grid_constant__.
struct __align__(64) stof_tmap {
    unsigned long long v[16];
};

// The box of a 2-D map at (x0, x1) into shared memory at dst; bar counts its bytes.
__device__ __forceinline__ void tma_load(unsigned dst, const stof_tmap *map, unsigned bar, int x0,
                                         int x1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
                 "l"((unsigned long long)map), "r"(bar), "r"(x0), "r"(x1)
                 : "memory");
}

// The same for a 4-D map at (x0, x1, x2, x3).
__device__ __forceinline__ void tma_load4(unsigned dst, const stof_tmap *map, unsigned bar, int x0,
                                          int x1, int x2, int x3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
                 "l"((unsigned long long)map), "r"(bar), "r"(x0), "r"(x1), "r"(x2), "r"(x3)
                 : "memory");
}

// The same for a 5-D map at (x0, x1, x2, x3, x4).
__device__ __forceinline__ void tma_load5(unsigned dst, const stof_tmap *map, unsigned bar, int x0,
                                          int x1, int x2, int x3, int x4)
{
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(dst),
                 "l"((unsigned long long)map), "r"(bar), "r"(x0), "r"(x1), "r"(x2), "r"(x3), "r"(x4)
                 : "memory");
}

// bytes (a multiple of 16) from global src (16-byte aligned) to shared dst;
// bar counts them.
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src, unsigned bytes, unsigned bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"((unsigned long long)src), "r"(bytes), "r"(bar)
                 : "memory");
}

// Shared memory at src to the box of a 4-D map at (x0, x1, x2, x3); the
// parts of the box outside the tensor are not written. Completes in bulk
// groups: tma_commit closes one, tma_wait_read waits until every closed
// group has read its shared memory.
__device__ __forceinline__ void tma_store4(const stof_tmap *map, unsigned src, int x0, int x1,
                                           int x2, int x3)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
                 ::"l"((unsigned long long)map), "r"(src), "r"(x0), "r"(x1), "r"(x2), "r"(x3)
                 : "memory");
}
// The same for a 5-D map at (x0, x1, x2, x3, x4).
__device__ __forceinline__ void tma_store5(const stof_tmap *map, unsigned src, int x0, int x1,
                                           int x2, int x3, int x4)
{
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group"
                 " [%0, {%2, %3, %4, %5, %6}], [%1];\n"
                 ::"l"((unsigned long long)map), "r"(src), "r"(x0), "r"(x1), "r"(x2), "r"(x3),
                   "r"(x4)
                 : "memory");
}
// The same from shared memory at src to the box of a 2-D map at (x0, x1).
__device__ __forceinline__ void tma_store(const stof_tmap *map, unsigned src, int x0, int x1)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"((unsigned long long)map), "r"(src), "r"(x0), "r"(x1)
                 : "memory");
}
__device__ __forceinline__ void tma_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void tma_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
