/* The PTX the FlashAttention-2 kernels are built from, one wrapper per
 * instruction (cp.async, ldmatrix, mma.sync m16n8k16 with f32
 * accumulators, cvt to 16-bit pairs; ex2 is cuda_common.cuh's), plus the
 * shared-memory address helpers. Included by flash_attn_common.cuh, after
 * cuda_common.cuh (for the dtype enum). */
#ifndef TF_FLASH_ATTN_PTX_CUH
#define TF_FLASH_ATTN_PTX_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t tf_flash_smem_addr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/* The dynamic shared memory of every flash kernel. */
__device__ __forceinline__ unsigned char *tf_flash_dynamic_smem() {
  extern __shared__ __align__(128) unsigned char tf_flash_shared[];
  return tf_flash_shared;
}

/* 16 bytes global -> shared, bypassing L1; zero-filled when !full (src is then not read). */
__device__ __forceinline__ void tf_flash_cp16(uint32_t dst, const void *src, bool full) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(full ? 16 : 0)
               : "memory");
}

/* 4 bytes global -> shared; zero-filled when !full. */
__device__ __forceinline__ void tf_flash_cp4(uint32_t dst, const void *src, bool full) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(full ? 4 : 0) : "memory");
}

__device__ __forceinline__ void tf_flash_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Waits until at most N of this thread's committed groups are in flight. */
template <int N> __device__ __forceinline__ void tf_flash_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Four 8x8 b16 matrices; lane 8i + r gives row r of matrix i. No "memory"
 * clobber (it costs registers): the ordinary shared-memory stores that
 * reuse what ldmatrix read, or that it reads, are separated from it by
 * __syncwarp or __syncthreads, which the compiler does not move memory
 * accesses across. */
__device__ __forceinline__ void tf_flash_ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* The same, each matrix transposed. */
__device__ __forceinline__ void tf_flash_ldsm4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* Two transposed matrices; lanes 0..15 give the rows. */
__device__ __forceinline__ void tf_flash_ldsm2_t(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

/* c += a b, one m16n8k16 tile, f32 accumulators; DT picks f16 or bf16 inputs. */
template <int DT>
__device__ __forceinline__ void tf_flash_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (DT == TF_BF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/* Two floats rounded (to nearest even) into one register of DT: lo in the
 * low half, the element with the smaller index, as the fragments want. */
template <int DT> __device__ __forceinline__ uint32_t tf_flash_pack(float lo, float hi) {
  uint32_t r;
  if constexpr (DT == TF_BF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

#endif
