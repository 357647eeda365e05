/* tfhost.cuh: the header of kernels that scripts compile at run time with
 * tf.cuda.compile (NVRTC). A kernel source includes it as
 *
 *   #include <tfhost.cuh>
 *
 * and gets, in namespace tf:
 *   - view<T, N>: a tensor as a kernel parameter (data, sizes, strides);
 *   - tensor_map: a TMA tensor map (tf.cuda.tensor_map) as a kernel
 *     parameter, declared const __grid_constant__ tf::tensor_map;
 *   - to_float / from_float<T>: float, __half and __nv_bfloat16;
 *   - warp_sum, warp_max, block_sum, block_max: reductions;
 *   - vec<T, N>: N elements moved as one (16-byte) access;
 *   - dynamic_smem<T>(): the launch's dynamic shared memory;
 *   - the tensor-core building blocks of Ampere and Hopper kernels that
 *     issue mma.sync: cp.async (16 and 4 bytes, commit, wait), ldmatrix (x4,
 *     x2, with and without .trans) and the lane offsets it wants, mma.sync
 *     m16n8k16 with f32 accumulators (bf16 or f16 inputs), two floats packed
 *     into a bf16x2 or f16x2 register, and exp2 on the special-function unit.
 *
 * Hopper's wgmma, mbarrier, TMA and setmaxnreg are in <tfhost_sm90.cuh>
 * (target sm_90a), which includes this header. tfhost's own FlashAttention
 * kernels are built from these wrappers too.
 *
 * It needs only CUDA's own device headers (no C or C++ standard header), so
 * it compiles under NVRTC as it does under nvcc. Everything is a
 * __device__ function or a type; nothing here defines a kernel. */
#ifndef TFHOST_CUH
#define TFHOST_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* assert() in device code: NVRTC has no <assert.h>; a failed assert stops the kernel as nvcc's
 * does (cudaErrorAssert) and prints the condition, the file and the line. */
#ifndef assert
extern "C" __device__ void __assertfail(const char *message, const char *file, unsigned int line, const char *function,
                                        size_t char_size);
#define assert(e) ((e) ? (void)0 : __assertfail(#e, __FILE__, __LINE__, __func__, sizeof(char)))
#endif

namespace tf {

/* ---- tensors ------------------------------------------------------------------------- */

/* A TMA tensor map made on the host by tf.cuda.tensor_map (the driver's
 * CUtensorMap: 128 opaque bytes, 64-byte aligned). Declare the parameter
 * const __grid_constant__ tf::tensor_map m and hand &m to the TMA
 * instructions (tfhost_sm90.cuh's tma_load_*d): TMA reads the map where the
 * kernel's parameters are, so a copy of it would not do. */
struct alignas(64) tensor_map {
  unsigned long long opaque[16];
};

/* A tensor as a kernel parameter. When a kernel parameter is declared
 * tf::view<T, N>, the launcher passes a tensor of N dims and element type T
 * as its data pointer, then its sizes, then its strides (in elements, not
 * bytes), in exactly this layout. v(i, j, ...) is the element at those
 * indices (no bounds check). */
template <typename T, int N> struct view {
  static_assert(N >= 1, "a view has at least one dimension");
  T *data;
  long long size[N];
  long long stride[N];

  template <typename... I> __device__ __forceinline__ T &operator()(I... index) const {
    static_assert(sizeof...(I) == N, "one index per dimension");
    const long long at[N] = {static_cast<long long>(index)...};
    long long offset = 0;
#pragma unroll
    for (int d = 0; d < N; d++) offset += at[d] * stride[d];
    return data[offset];
  }

  __device__ __forceinline__ long long numel() const {
    long long n = 1;
#pragma unroll
    for (int d = 0; d < N; d++) n *= size[d];
    return n;
  }

  /* Whether the elements lie row-major without gaps (dims of size 1 may have any stride). */
  __device__ __forceinline__ bool contiguous() const {
    long long expected = 1;
#pragma unroll
    for (int d = N - 1; d >= 0; d--) {
      if (size[d] != 1 && stride[d] != expected) return false;
      expected *= size[d];
    }
    return true;
  }
};

/* N elements of T that are read or written as one access: N * sizeof(T) is
 * 2, 4, 8 or 16 bytes, and the address must be a multiple of it.
 *   tf::vec<__nv_bfloat16, 8> x = *reinterpret_cast<const tf::vec<__nv_bfloat16, 8> *>(p);   // one 16-byte load */
template <typename T, int N> struct alignas(sizeof(T) * N) vec {
  T v[N];
};

/* The launch's dynamic shared memory (the launch's `shared` bytes), 128-byte aligned. */
template <typename T> __device__ __forceinline__ T *dynamic_smem() {
  extern __shared__ __align__(128) unsigned char tf_dynamic_smem_bytes[];
  return reinterpret_cast<T *>(tf_dynamic_smem_bytes);
}

/* ---- conversions and constants ------------------------------------------------------- */

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/* f rounded to the nearest T (ties to even): tf::from_float<__nv_bfloat16>(x). */
template <typename T> __device__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ __half from_float<__half>(float f) { return __float2half_rn(f); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}

constexpr float log2e = 1.4426950408889634f; /* exp(x) = exp2(x log2e) */
constexpr float ln2 = 0.6931471805599453f;   /* log(x) = log2(x) ln2 */

__device__ __forceinline__ float infinity() { return __int_as_float(0x7f800000); }

/* 2^x on the special-function unit (ex2.approx.ftz: about 2 ulp, exp2(-inf)
 * = 0, results below 2^-126 flush to 0). exp(x) is fast_exp2(x * log2e). */
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* ---- reductions ---------------------------------------------------------------------- */

/* The sum (max) over each group of WIDTH consecutive lanes (WIDTH a power of
 * two up to 32), returned to every lane of the group; the whole warp must
 * call it. WIDTH 4 reduces the four lanes that share a row of an mma
 * accumulator (below). */
template <int WIDTH = 32> __device__ __forceinline__ float warp_sum(float v) {
  static_assert(WIDTH >= 1 && WIDTH <= 32 && (WIDTH & (WIDTH - 1)) == 0, "WIDTH is a power of two, at most 32");
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int WIDTH = 32> __device__ __forceinline__ float warp_max(float v) {
  static_assert(WIDTH >= 1 && WIDTH <= 32 && (WIDTH & (WIDTH - 1)) == 0, "WIDTH is a power of two, at most 32");
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

struct sum_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct max_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* The reduction over a block of BLOCK threads (BLOCK a multiple of 32, the
 * block's size), returned to every thread; every thread must call it. It
 * may be called again straight away (it synchronises before reusing its
 * shared memory). */
template <int BLOCK, typename Op> __device__ __forceinline__ float block_reduce(float v, Op op) {
  static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK is a multiple of 32, at most 1024");
  constexpr int WARPS = BLOCK / 32;
  __shared__ float partial[WARPS];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (WARPS == 1) return v;
  __syncthreads(); /* every thread has read the partials of the previous call */
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  v = partial[0];
#pragma unroll
  for (int w = 1; w < WARPS; w++) v = op(v, partial[w]);
  return v;
}

template <int BLOCK> __device__ __forceinline__ float block_sum(float v) { return block_reduce<BLOCK>(v, sum_op()); }
template <int BLOCK> __device__ __forceinline__ float block_max(float v) { return block_reduce<BLOCK>(v, max_op()); }

/* ---- tensor cores through mma.sync (sm_80 and later) --------------------------------------
 *
 * mma.sync.m16n8k16 multiplies a 16 x 16 A by a 16 x 8 B into a 16 x 8 f32
 * C, one warp together. With lane = 4 g + t (g = lane / 4, t = lane % 4), a
 * lane holds (PTX ISA, "Matrix fragments for mma.m16n8k16"):
 *   A (4 registers, two 16-bit values each, the lower index in the low half):
 *     a[0] = A[g][2t, 2t+1],   a[1] = A[g+8][2t, 2t+1],
 *     a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9];
 *   B (2 registers): b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g];
 *   C (4 floats): c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1].
 * So the C tiles of columns 16 kk .. 16 kk + 15 (two n-tiles), packed in
 * pairs, are the A operand of a next product whose k runs along those
 * columns: a = {pack(c0[0], c0[1]), pack(c0[2], c0[3]), pack(c1[0], c1[1]),
 * pack(c1[2], c1[3])} (how FlashAttention's P feeds P V in registers).
 *
 * ldmatrix loads 8 x 8 16-bit matrices from shared memory; in an x4 load,
 * lane 8 i + r gives the address of row r of matrix i, and register i
 * receives matrix i in the layout above (row g, columns 2t, 2t + 1; with
 * .trans, the matrix transposed). For a tile of row-major rows of ld
 * elements at p, the lanes' addresses are:
 *   p + frag_a_offset(lane, ld): an x4 load is the A operand of the 16 x 16
 *     tile at p; with .trans, of a [k][n] tile (16 k rows, 16 n columns), it
 *     is the B operands of two n-tiles: {r[0], r[1]} columns 0..7, {r[2],
 *     r[3]} columns 8..15;
 *   p + frag_b_offset(lane, ld): an x4 load of a [n][k] tile (16 n rows, 16
 *     k columns; B^T row-major, as K is in Q K^T) is the B operands of two
 *     n-tiles, {r[0], r[1]} rows 0..7, {r[2], r[3]} rows 8..15.
 * Row addresses must be 16-byte aligned; rows ld elements apart with ld *
 * 2 bytes an odd multiple of 16 (ld = width + 8) keep the eight rows of each
 * matrix in distinct banks. */

/* A shared-memory pointer as the 32-bit address cp.async and ldmatrix take. */
__device__ __forceinline__ unsigned smem_addr(const void *p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ int frag_a_offset(int lane, int ld) { return (lane & 15) * ld + (lane >> 4) * 8; }
__device__ __forceinline__ int frag_b_offset(int lane, int ld) {
  return ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8;
}

/* 16 bytes from global to shared memory, asynchronously (through L2 only,
 * which is asked to fetch the whole 128-byte line: tiles are read in rows
 * of that). With full false nothing is read and the 16 bytes are zeroes
 * (src must still be a valid address: pass any in-bounds one). Both
 * addresses are 16-byte aligned. */
__device__ __forceinline__ void cp_async16(unsigned dst, const void *src, bool full = true) {
  asm volatile(
      "cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(dst),
      "l"(src), "r"(full ? 16 : 0)
      : "memory");
}

/* 4 bytes, the same way (through L1), 4-byte aligned. */
__device__ __forceinline__ void cp_async4(unsigned dst, const void *src, bool full = true) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(full ? 4 : 0) : "memory");
}

/* Closes the group of this thread's cp.async issued since the last commit. */
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* Waits until at most N of this thread's committed groups are still in
 * flight. Other threads' copies are visible after a __syncthreads that
 * follows their own wait. */
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* ldmatrix has no "memory" clobber (it would cost registers): separate it
 * from plain shared stores to the same bytes by __syncwarp or __syncthreads. */
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* Two matrices: lanes 0..15 give the addresses (those of the others are ignored). */
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2_trans(unsigned (&r)[2], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

template <typename A, typename B> constexpr bool same_type = false;
template <typename A> constexpr bool same_type<A, A> = true;

/* c += a b, one m16n8k16 tile with f32 accumulators; T (__nv_bfloat16 or
 * __half) is the type of a and b. */
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  static_assert(same_type<T, __nv_bfloat16> || same_type<T, __half>, "mma_16816 takes __nv_bfloat16 or __half");
  if constexpr (same_type<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/* Two floats rounded to nearest even into one 32-bit register: lo (the
 * element of lower index) in the low half, as the fragments want. */
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi) {
  static_assert(same_type<T, __nv_bfloat16> || same_type<T, __half>, "pack2 makes __nv_bfloat16 or __half pairs");
  if constexpr (same_type<T, __nv_bfloat16>)
    return pack_bf16x2(lo, hi);
  else
    return pack_half2(lo, hi);
}

} /* namespace tf */

#endif
