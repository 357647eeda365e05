/* The sm_90 asynchronous-copy instructions the warp-specialised Hopper
 * kernels use: shared-memory barriers (mbarrier) with transaction counts,
 * the Tensor Memory Accelerator's tiled loads (cp.async.bulk.tensor) and
 * bulk reductions into global memory (cp.reduce.async.bulk), and the
 * warpgroup register reallocation (setmaxnreg). Compile for sm_90a only.
 *
 * A full/empty barrier pair guards each buffer of a ring: the consumer
 * waits on the phase parity it expects, the producer on the other one
 * (PTX ISA, "Parallel Synchronization and Communication Instructions:
 * mbarrier"). */
#ifndef TF_TMA_PTX_CUH
#define TF_TMA_PTX_CUH

#include <cuda.h>
#include <stdint.h>

/* A barrier at shared address bar expecting `count` arrivals per phase;
 * by one thread, before a fence and a block barrier. */
__device__ __forceinline__ void tf_mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

/* Barrier initialisations visible to the async proxy (TMA) as well. */
__device__ __forceinline__ void tf_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void tf_mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* An arrival that also expects `bytes` more of transactions (copies that
 * signal the barrier as they land) in the current phase. */
__device__ __forceinline__ void tf_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

/* Until the phase of parity `parity` has completed. */
__device__ __forceinline__ void tf_mbar_wait(uint32_t bar, uint32_t parity) {
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

/* Whether the phase of parity `parity` has completed (after a while of waiting in hardware). */
__device__ __forceinline__ bool tf_mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
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

/* tf_mbar_wait for warps that only copy: they sleep between tries, so as
 * not to take issue slots from the computing warps on their scheduler. */
__device__ __forceinline__ void tf_mbar_wait_idle(uint32_t bar, uint32_t parity) {
  while (!tf_mbar_try_wait(bar, parity)) __nanosleep(64);
}

/* The box at coordinates (c0, c1, c2) of a 3-D tensor map into shared
 * memory at dst, signalling barrier bar with its bytes. map is the address
 * of a __grid_constant__ kernel parameter. */
__device__ __forceinline__ void tf_tma_load_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2,
                                               uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

/* ... and the box at (c0, c1, c2, c3) of a 4-D one. */
__device__ __forceinline__ void tf_tma_load_4d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                               uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void tf_tma_prefetch_map(const CUtensorMap *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

/* dst[i] += src[i] (f32) over `bytes` bytes (a multiple of 16; both
 * addresses 16-byte aligned), src in shared memory; in the thread's
 * current bulk group. */
__device__ __forceinline__ void tf_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void tf_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

/* Until at most N of the thread's bulk groups still read their shared source. */
template <int N> __device__ __forceinline__ void tf_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

/* Until at most N of the thread's bulk groups are incomplete (writes done). */
template <int N> __device__ __forceinline__ void tf_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* The warpgroup's registers per thread lowered or raised to N (a multiple
 * of 8, 24..256); every thread of the warpgroup executes it. */
template <int N> __device__ __forceinline__ void tf_setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void tf_setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* Rows row.. of problem prob from two tensor maps into dst_a and dst_b,
 * HALVES 64-column halves each, ROWS rows apart in shared memory,
 * completing on mbarrier bar. */
template <int HALVES, int ROWS>
__device__ __forceinline__ void tf_tma_load_pair(uint32_t dst_a, const CUtensorMap *map_a, uint32_t dst_b,
                                                 const CUtensorMap *map_b, int row, int prob, uint32_t bar) {
#pragma unroll
  for (int h = 0; h < HALVES; h++) {
    tf_tma_load_3d(dst_a + (uint32_t)(h * ROWS * 128), map_a, h * 64, row, prob, bar);
    tf_tma_load_3d(dst_b + (uint32_t)(h * ROWS * 128), map_b, h * 64, row, prob, bar);
  }
}

/* Rows row.. of problem prob of Q (a 3-D map) and of dO (a 4-D map in O's
 * layout, tf_tma_map_o_rows: problem prob at (prob % group, prob / group))
 * into dst_q and dst_do, as tf_tma_load_pair. */
template <int HALVES, int ROWS>
__device__ __forceinline__ void tf_tma_load_q_do(uint32_t dst_q, const CUtensorMap *map_q, uint32_t dst_do,
                                                 const CUtensorMap *map_do, int row, int prob, int group,
                                                 uint32_t bar) {
  const int head = prob % group, outer = prob / group;
#pragma unroll
  for (int h = 0; h < HALVES; h++) {
    tf_tma_load_3d(dst_q + (uint32_t)(h * ROWS * 128), map_q, h * 64, row, prob, bar);
    tf_tma_load_4d(dst_do + (uint32_t)(h * ROWS * 128), map_do, h * 64, head, row, outer, bar);
  }
}

#endif
