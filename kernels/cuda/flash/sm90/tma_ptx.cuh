/* The TMA loads of the warp-specialised Hopper FlashAttention kernels: a
 * block's rows of two tensors (Q and K, K and V, Q and dO) in 64-column
 * halves, built on rtc/tfhost_sm90.cuh's tma_load_3d / tma_load_4d (the
 * public header of Hopper kernels; mbarrier, TMA, bulk reductions and
 * setmaxnreg are there). Compile for sm_90a only. */
#ifndef TF_TMA_PTX_CUH
#define TF_TMA_PTX_CUH

#include <cuda.h>
#include <stdint.h>

#include "rtc/tfhost_sm90.cuh"

/* Rows row.. of problem prob from two tensor maps into dst_a and dst_b,
 * HALVES 64-column halves each, ROWS rows apart in shared memory,
 * completing on mbarrier bar. */
template <int HALVES, int ROWS>
__device__ __forceinline__ void tf_tma_load_pair(uint32_t dst_a, const CUtensorMap *map_a, uint32_t dst_b,
                                                 const CUtensorMap *map_b, int row, int prob, uint32_t bar) {
#pragma unroll
  for (int h = 0; h < HALVES; h++) {
    tf::tma_load_3d(dst_a + (uint32_t)(h * ROWS * 128), map_a, h * 64, row,
                    prob, bar);
    tf::tma_load_3d(dst_b + (uint32_t)(h * ROWS * 128), map_b, h * 64, row,
                    prob, bar);
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
    tf::tma_load_3d(dst_q + (uint32_t)(h * ROWS * 128), map_q, h * 64, row,
                    prob, bar);
    tf::tma_load_4d(dst_do + (uint32_t)(h * ROWS * 128), map_do, h * 64, head,
                    row, outer, bar);
  }
}

#endif
