/* tfhost_sm90.cuh: the Hopper (sm_90a) building blocks of tfhost's own
 * warp-specialised FlashAttention kernels, for kernels that scripts compile
 * with tf.cuda.compile (the default target on H100/H200 is sm_90a). A kernel
 * source includes it as
 *
 *   #include <tfhost_sm90.cuh>
 *
 * (it includes <tfhost.cuh>) and gets, in namespace tf:
 *   - wgmma: the warpgroup fence, commit and wait; the 128-byte-swizzled
 *     shared-memory matrix descriptor; wgmma_ss / wgmma_rs, the m64nNk16
 *     products with f32 accumulators (tfhost_wgmma.cuh); stmatrix; the fence
 *     that makes ordinary shared-memory stores visible to wgmma and TMA;
 *   - mbarrier: init, arrive (with a transaction count), wait, try_wait;
 *   - TMA: tiled 1-D to 5-D loads from a tensor map (tf.cuda.tensor_map)
 *     into shared memory, 2-D stores back, bulk f32 reductions from shared
 *     into global memory, bulk groups;
 *   - setmaxnreg: a warpgroup's registers lowered or raised.
 *
 * These are the wrappers tfhost's kernels are built from (one copy: the
 * built-in kernels include this header), each one PTX instruction. They
 * follow the PTX ISA's names and rules; where a rule is easy to break, the
 * comment says it. No C or C++ standard header is needed (NVRTC has none). */
#ifndef TFHOST_SM90_CUH
#define TFHOST_SM90_CUH

#include "tfhost.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error                                                                         \
    "tfhost_sm90.cuh needs the target sm_90a (wgmma, setmaxnreg): tf.cuda.compile(src, {target = \"sm_90a\"})"
#endif

namespace tf {

/* ---- wgmma
 * ---------------------------------------------------------------------------
 *
 * A warpgroup (four consecutive warps, threads 128 g .. 128 g + 127) issues
 * wgmma together. Before the first product that reads accumulators written
 * by ordinary instructions: wgmma_fence(); after issuing: wgmma_commit();
 * before reading the results: wgmma_wait<N>() (at most N groups left in
 * flight). Shared memory that ordinary stores (or cp.async, stmatrix) wrote
 * and wgmma reads next needs fence_proxy_async() and a barrier first. */

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Keeps the compiler from moving accesses of an accumulator across the
 * asynchronous products that read and write it (call it after a commit and
 * after a wait). */
template <int R> __device__ __forceinline__ void wgmma_hold(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++)
    asm volatile("" : "+f"(d[i])::"memory");
}

/* ... and of register A operands (fragments) until the products that read them
 * are waited for. */
template <int M, int R>
__device__ __forceinline__ void wgmma_hold_regs(unsigned (&a)[M][R]) {
#pragma unroll
  for (int i = 0; i < M; i++)
#pragma unroll
    for (int j = 0; j < R; j++)
      asm volatile("" : "+r"(a[i][j])::"memory");
}

/* Shared memory written by ordinary stores, stmatrix or cp.async, read next by
 * wgmma or TMA. */
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Four 8x8 matrices of 16-bit elements from a warp's registers to shared
 * memory: register j of lane 4 r + c holds row r, columns 2c and 2c + 1 of
 * matrix j (the mma fragments' layout), and lane 8 j + r gives the
 * address (smem_addr) of row r of matrix j (16 bytes). */
__device__ __forceinline__ void stmatrix_x4(unsigned addr,
                                            const unsigned (&v)[4]) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::
          "r"(addr),
      "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
      : "memory");
}

/* A 128-byte-swizzled matrix descriptor (PTX ISA, "Matrix Descriptor
 * Format"): start address, leading and stride byte offsets. The tile it
 * describes has rows of 128 bytes (64 16-bit elements) in which the 16-byte
 * chunk c of row r is stored at chunk c ^ (r % 8), on a 1024-byte boundary;
 * for a K-major operand the stride offset is 1024 (eight rows) and a
 * product's k16 step moves the start by 32 bytes (wgmma_desc_add). addr
 * (smem_addr) and the offsets are multiples of 16. */
__device__ __forceinline__ unsigned long long
wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((sbo >> 4) | 1u << 30) << 32 |
         ((addr >> 4) | (lbo >> 4) << 16);
}

/* The descriptor d with its start off bytes further on (a multiple of 16,
 * the start still inside the shared window): an add to the 14-bit start
 * field alone, which cannot carry out of it. Cheaper in a loop than a
 * descriptor made from each address (some 12 integer instructions a
 * product, on the chain that issues it). */
__device__ __forceinline__ unsigned long long
wgmma_desc_add(unsigned long long d, unsigned off) {
  return (d & 0xFFFFFFFF00000000ull) | (unsigned)((unsigned)d + (off >> 4));
}

/* ---- mbarrier
 * ------------------------------------------------------------------------
 *
 * A barrier in shared memory (8 bytes, 8-byte aligned; pass smem_addr of
 * it) completes a phase when `count` arrivals and the transactions they
 * announced (bytes of TMA copies) have landed. A waiter names the parity of
 * the phase it waits for: a full/empty pair guards each buffer of a ring,
 * the consumer waiting on the parity it expects, the producer on the other. */

/* By one thread, followed by mbar_init_fence() and a block barrier. */
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
               "r"(count)
               : "memory");
}

/* Barrier initialisations visible to the async proxy (TMA) as well. */
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile(
      "mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar)
      : "memory");
}

/* An arrival that also expects `bytes` more of transactions (copies that
 * signal the barrier as they land) in the current phase. */
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar,
                                                      unsigned bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::
          "r"(bar),
      "r"(bytes)
      : "memory");
}

/* Until the phase of parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "TF_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra TF_MBAR_WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

/* Whether the phase of parity `parity` has completed (after a while of waiting
 * in hardware). */
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

/* mbar_wait for warps that only copy: they sleep between tries, so as not
 * to take issue slots from the computing warps on their scheduler. */
__device__ __forceinline__ void mbar_wait_idle(unsigned bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity))
    __nanosleep(64);
}

/* ---- TMA and bulk copies
 * ------------------------------------------------------------- */

/* The box at coordinates (c0, c1, c2) (innermost first, in elements) of a
 * 3-D tensor map into shared memory at dst, signalling barrier bar with its
 * bytes (announce them with mbar_arrive_expect_tx). map is the address of a
 * __grid_constant__ const CUtensorMap kernel parameter, made on the host
 * (cuTensorMapEncodeTiled). */
__device__ __forceinline__ void tma_load_3d(unsigned dst, const void *map,
                                            int c0, int c1, int c2,
                                            unsigned bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::"
               "complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
               "[%5];\n" ::"r"(dst),
               "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
               "r"(c2), "r"(bar)
               : "memory");
}

/* The same for 1-D, 2-D and 5-D maps. */
__device__ __forceinline__ void tma_load_1d(unsigned dst, const void *map, int c0, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2}], "
               "[%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void tma_load_2d(unsigned dst, const void *map, int c0, int c1, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
               "%3}], [%4];\n" ::"r"(dst),
               "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void tma_load_5d(unsigned dst, const void *map, int c0, int c1, int c2, int c3, int c4,
                                            unsigned bar) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
               "%3, %4, %5, %6}], [%7];\n" ::"r"(dst),
               "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
               : "memory");
}

/* The box at (c0, c1) (innermost first) of a 2-D map written from shared
 * memory at src, in the thread's current bulk group (bulk_commit, then
 * bulk_wait before the kernel ends or src is reused); the part of the box
 * outside the tensor is not written. Shared memory that ordinary stores
 * wrote needs fence_proxy_async() first. */
__device__ __forceinline__ void tma_store_2d(const void *map, int c0, int c1, unsigned src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(c0), "r"(c1), "r"(src)
               : "memory");
}

/* ... and the box at (c0, c1, c2, c3) of a 4-D one. */
__device__ __forceinline__ void tma_load_4d(unsigned dst, const void *map,
                                            int c0, int c1, int c2, int c3,
                                            unsigned bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::"
               "complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
               "[%6];\n" ::"r"(dst),
               "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1),
               "r"(c2), "r"(c3), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const void *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map))
               : "memory");
}

/* dst[i] += src[i] (f32) over `bytes` bytes (a multiple of 16; both
 * addresses 16-byte aligned), src in shared memory (smem_addr); in the
 * thread's current bulk group. */
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, unsigned src,
                                                    unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 "
               "[%0], [%1], %2;\n" ::"l"(dst),
               "r"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

/* Until at most N of the thread's bulk groups still read their shared source.
 */
template <int N> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

/* Until at most N of the thread's bulk groups are incomplete (writes done). */
template <int N> __device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- registers
 * ------------------------------------------------------------------------ */

/* The warpgroup's registers per thread lowered or raised to N (a multiple
 * of 8, 24..256); every thread of the warpgroup executes it, and the
 * kernel's launch bounds leave the registers to hand over. */
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

} /* namespace tf */

#include "tfhost_wgmma.cuh"

#endif
