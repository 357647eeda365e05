/* The swizzled shared-memory tiles the Hopper FlashAttention kernels
 * (flash_attn_fwd_ws.cu, flash_attn_bwd_ws.cu, flash_attn_dq_ws.cu) share: rows of 64 16-bit
 * elements (128 bytes), the 16-byte chunk c of row r stored at chunk
 * c ^ (r mod 8) (the layout wgmma's 128-byte swizzle mode reads and TMA's
 * writes), head dims above 64 as two such halves ROWS rows apart; tiles
 * on 1024-byte boundaries. Include after flash_attn_common.cuh. */
#ifndef TF_WGMMA_TILES_CUH
#define TF_WGMMA_TILES_CUH

#include <stdint.h>

/* The columns a row of head dim HD takes in shared memory: whole 128-byte
 * (64-column) swizzle rows. */
__host__ __device__ constexpr int tf_wgmma_hds(int hd) { return hd <= 64 ? 64 : 128; }

/* The thread's warpgroup, taken from lane 0 of its warp, so that the
 * compiler knows it is the same across the warp: the shared addresses and
 * wgmma descriptors made from it stay in the uniform registers, where a
 * warpgroup's own threadIdx.x / 128 put them in the ordinary ones and
 * moved them over (R2UR) before each wgmma. */
__device__ __forceinline__ int tf_wgmma_warpgroup() { return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); }

/* The warp-specialised kernels' registers a thread (setmaxnreg): the
 * loading warpgroup's and the two consumers' (24 x 128 + 240 x 256 = 384 x 168). */
constexpr int TF_WS_LOAD_REGS = 24, TF_WS_MMA_REGS = 240;

/* Their dynamic shared memory: the layout up to the barriers at bar_at,
 * n_bars barriers, and the 1024 bytes of slack for the alignment. */
__host__ __device__ constexpr int tf_ws_smem(uint32_t bar_at, int n_bars) { return (int)bar_at + 8 * n_bars + 1024; }

/* The shared memory of a warp-specialised kernel whose block owns BR = 128
 * query rows and walks key blocks (the forward and dQ kernels): head dim HD
 * (64, 80, 96 or 128), HDS its columns in shared memory, BC keys a block,
 * STAGES K/V buffers. From a 1024-byte boundary: ROW_TILES tiles of the
 * block's rows (Q, then dO for the dQ kernel), K STAGES times, V STAGES
 * times (BC rows), then the barriers: one for the rows, BARS_PER_STAGE a
 * buffer. */
template <int HD_, int BC_, int STAGES_, int ROW_TILES, int BARS_PER_STAGE> struct tf_ws_query_cfg {
  static_assert(HD_ == 64 || HD_ == 80 || HD_ == 96 || HD_ == 128, "the head dims the kernels are built for");
  static_assert(STAGES_ >= 2, "S of block j + 1 is issued while block j is in use");
  static constexpr int HD = HD_, HDS = tf_wgmma_hds(HD_), BR = 128, BC = BC_, STAGES = STAGES_;
  static constexpr uint32_t ROWS = BR * HDS * 2, KV = BC * HDS * 2;
  static constexpr uint32_t Q_AT = 0, K_AT = ROW_TILES * ROWS, V_AT = K_AT + STAGES * KV;
  static constexpr uint32_t BAR_AT = V_AT + STAGES * KV;
  static constexpr int N_BARS = 1 + BARS_PER_STAGE * STAGES;
  static constexpr int SMEM = tf_ws_smem(BAR_AT, N_BARS);
  static_assert(SMEM <= 227 * 1024, "one block an SM");
};

/* Byte offset of 16-byte chunk c (of HD / 8) of row r in a swizzled tile of ROWS rows. */
template <int ROWS> __device__ __forceinline__ uint32_t tf_wgmma_chunk(int r, int c) {
  return (uint32_t)((c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* The dynamic shared memory from its first 1024-byte boundary (the
 * kernels ask for 1024 bytes of slack): its shared address and a pointer. */
__device__ __forceinline__ uint32_t tf_wgmma_smem_base(unsigned char **ptr) {
  unsigned char *const raw = tf::dynamic_smem<unsigned char>();
  const uint32_t raw_addr = tf::smem_addr(raw),
                 base = (raw_addr + 1023u) & ~1023u;
  *ptr = raw + (base - raw_addr);
  return base;
}

/* A warp's rows r0 + g and r0 + 8 + g of an accumulator (64 x HD, mma.sync's
 * C layout) times scale[h], rounded to DT, into a swizzled tile of ROWS rows
 * at tile. */
template <int DT, int ROWS, int HD>
__device__ __forceinline__ void tf_wgmma_stage_rows(unsigned char *tile, int r0, const float (&acc)[HD / 2],
                                                    const float (&scale)[2]) {
  const int g = ((int)threadIdx.x & 31) >> 2, t2 = ((int)threadIdx.x & 3) * 2;
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++)
      *reinterpret_cast<uint32_t *>(
          tile + tf_wgmma_chunk<ROWS>(r0 + g + 8 * h, dt) + t2 * 2) =
          tf::pack2<tf_flash_elem<DT>>(acc[4 * dt + 2 * h] * scale[h],
                                       acc[4 * dt + 2 * h + 1] * scale[h]);
}

/* A warpgroup's 64 rows tile_row0.. of a swizzled tile of ROWS rows to
 * global rows row0.. of width hd, ld elements apart (16-byte stores; rows
 * past nrows and columns past hd skipped), after named barrier `bar` over
 * the warpgroup. */
template <int ROWS, int HD>
__device__ __forceinline__ void tf_wgmma_store_rows(uint16_t *dst, const unsigned char *tile, int tile_row0,
                                                    int64_t row0, int64_t nrows, int hd, int64_t ld, int bar) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(bar) : "memory"); /* the warpgroup's rows are written */
  constexpr int CH = HD / 8;
  const int tw = (int)threadIdx.x % 128;
#pragma unroll
  for (int i = 0; i < 64 * CH / 128; i++) {
    const int idx = tw + i * 128, r = idx / CH, c = idx % CH;
    if (row0 + r < nrows && c * 8 < hd)
      *reinterpret_cast<uint4 *>(dst + (row0 + r) * ld + c * 8) =
          *reinterpret_cast<const uint4 *>(tile + tf_wgmma_chunk<ROWS>(tile_row0 + r, c));
  }
}

/* A warpgroup's 64-row accumulator (warpgroup w of a block whose tile has
 * ROWS rows) times scale[h], rounded to DT, staged through the
 * warpgroup's own rows of the tile (free once its products are waited
 * for), then stored to global rows row0.. of dst (width hd, ld elements
 * apart, rows past nrows skipped) after named barrier bar over the
 * warpgroup. */
template <int DT, int ROWS, int HD>
__device__ __forceinline__ void tf_wgmma_write_rows(uint16_t *dst, unsigned char *tile, int w, const float (&acc)[HD / 2],
                                                    const float (&scale)[2], int64_t row0, int64_t nrows, int hd,
                                                    int64_t ld, int bar) {
  tf_wgmma_stage_rows<DT, ROWS, HD>(tile, w * 64 + (((int)threadIdx.x / 32) % 4) * 16, acc, scale);
  tf_wgmma_store_rows<ROWS, HD>(dst, tile, w * 64, row0, nrows, hd, ld, bar);
}

/* The backward pass's end for a warpgroup's 64 keys, rows w * 64.. of a
 * block of BC keys from k0 in problem b (warp: the thread's warp in its
 * warpgroup, hd: p.head_dim, as the caller has them): dK times scale and
 * dV rounded to DT into the block's K and V tiles (the warpgroup's own rows, free once
 * the caller's barrier has passed), then stored to p.dk and p.dv (rows past
 * seq_k skipped) after named barrier bar over the warpgroup. */
template <int DT, int BC, int HD>
__device__ __forceinline__ void tf_wgmma_bwd_store_dk_dv(const tf_cuda_flash_params &p, int64_t b, int64_t k0, int w,
                                                         int warp, int hd, unsigned char *k_tile, unsigned char *v_tile,
                                                         const float (&dk)[HD / 2], const float (&dv)[HD / 2], int bar) {
  const float dk_scale[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
  tf_wgmma_stage_rows<DT, BC, HD>(k_tile, w * 64 + warp * 16, dk, dk_scale);
  tf_wgmma_stage_rows<DT, BC, HD>(v_tile, w * 64 + warp * 16, dv, one);
  const int64_t key0 = k0 + w * 64;
  tf_wgmma_store_rows<BC, HD>(static_cast<uint16_t *>(p.dk) + b * p.seq_k * hd, k_tile, w * 64, key0, p.seq_k, hd, hd,
                              bar);
  tf_wgmma_store_rows<BC, HD>(static_cast<uint16_t *>(p.dv) + b * p.seq_k * hd, v_tile, w * 64, key0, p.seq_k, hd, hd,
                              bar);
}

/* The barriers of a kernel over query blocks (tf_ws_query_cfg), set up
 * by thread 0 before the block's one barrier: at bar_q the rows' (the
 * loading thread's), then KINDS full barriers of STAGES buffers each (the
 * loading thread, with the copies' bytes), then KINDS empty ones (the
 * consumers' 256 threads), a buffer's of one kind 8 bytes apart. Needs
 * tma_ptx.cuh. */
template <int STAGES, int KINDS> __device__ __forceinline__ void tf_ws_query_bars(uint32_t bar_q) {
  if (threadIdx.x == 0) {
    tf::mbar_init(bar_q, 1);
    for (int s = 0; s < STAGES; s++) {
#pragma unroll
      for (int k = 0; k < KINDS; k++)
        tf::mbar_init(bar_q + 8 + 8 * (k * STAGES + s), 1);
#pragma unroll
      for (int k = 0; k < KINDS; k++)
        tf::mbar_init(bar_q + 8 + 8 * ((KINDS + k) * STAGES + s), 256);
    }
    tf::mbar_init_fence();
  }
  __syncthreads();
}

/* The loading thread's first steps in such a kernel: the K and V maps
 * prefetched, and the rows' barrier told to expect their bytes. */
__device__ __forceinline__ void tf_ws_loader_begin(const CUtensorMap *k, const CUtensorMap *v, uint32_t bar_q,
                                                   uint32_t bytes) {
  tf::tma_prefetch_map(k);
  tf::tma_prefetch_map(v);
  tf::mbar_arrive_expect_tx(bar_q, bytes);
}

#endif
