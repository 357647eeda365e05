/* The wgmma (sm_90a) instructions the Hopper FlashAttention kernels use:
 * warpgroup fences, commit and wait, the shared-memory matrix descriptor,
 * and (wgmma_products.cuh, generated) the products with f32 accumulators in
 * registers. Include after flash_attn_common.cuh; compile for sm_90a only. */
#ifndef TF_WGMMA_PTX_CUH
#define TF_WGMMA_PTX_CUH

#include <stdint.h>

__device__ __forceinline__ void tf_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void tf_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void tf_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Keeps the compiler from moving accesses of an accumulator across the
 * asynchronous products that read and write it. */
template <int R> __device__ __forceinline__ void tf_wgmma_hold(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* ... and of register A operands (fragments) until the products that read them are waited for. */
template <int M, int R> __device__ __forceinline__ void tf_wgmma_hold_regs(uint32_t (&a)[M][R]) {
#pragma unroll
  for (int i = 0; i < M; i++)
#pragma unroll
    for (int j = 0; j < R; j++) asm volatile("" : "+r"(a[i][j])::"memory");
}

/* Four 8x8 matrices of 16-bit elements from a warp's registers to shared
 * memory: register j of lane 4 r + c holds row r, columns 2c and 2c + 1 of
 * matrix j (the mma fragments' layout), and lane 8 j + r gives the
 * address of row r of matrix j (16 bytes). */
__device__ __forceinline__ void tf_stmatrix_x4(uint32_t addr, const uint32_t (&v)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3])
               : "memory");
}

/* Shared memory written by ordinary stores, stmatrix or cp.async, read next by wgmma. */
__device__ __forceinline__ void tf_wgmma_fence_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* A 128-byte-swizzled matrix descriptor: start address, leading and stride
 * byte offsets (PTX ISA, "Matrix Descriptor Format"). addr is a shared-window
 * address (below 256 KiB) and, as the offsets, a multiple of 16. */
__device__ __forceinline__ uint64_t tf_wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((sbo >> 4) | 1u << 30) << 32 | ((addr >> 4) | (lbo >> 4) << 16);
}

/* The descriptor d with its start off bytes further on (a multiple of 16, the
 * start still inside the window): an add to the 14-bit start field alone,
 * which cannot carry out of it. The products' loops take their descriptors
 * so, from one made before the loop: a descriptor made from each address
 * cost some 12 integer instructions a wgmma (mask, shift, or, moves to the
 * uniform registers), on the chain that issues it. */
__device__ __forceinline__ uint64_t tf_wgmma_desc_add(uint64_t d, uint32_t off) {
  return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (off >> 4));
}

#include "wgmma_products.cuh"

#endif
