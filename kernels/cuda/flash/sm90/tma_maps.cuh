/* The host side of the TMA loads (tma_ptx.cuh): tensor maps of the
 * FlashAttention kernels' 16-bit (batch, seq, head dim) tensors, encoded
 * through the driver's entry point (the binary does not link libcuda
 * itself). Include after flash_attn_common.cuh. */
#ifndef TF_TMA_MAPS_CUH
#define TF_TMA_MAPS_CUH

#include <cuda.h>
#include <cudaTypedefs.h>

/* The driver's tensor-map encoder, looked up once. */
static PFN_cuTensorMapEncodeTiled_v12000 tf_tma_encoder(tf_status *st) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (!encode) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess) {
      *st = tf_cuda_error(err, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
      return nullptr;
    }
    if (found != cudaDriverEntryPointSuccess || !fn) {
      *st = tf_fail(TF_ERR_BACKEND, "flash_attention: the CUDA driver has no cuTensorMapEncodeTiled");
      return nullptr;
    }
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  *st = TF_OK;
  return encode;
}

/* A tensor map of 16-bit elements at ptr, rank 3 or 4 (dims[0] the
 * columns, strides in bytes for dims 1..), boxes of box (64 columns: the
 * 128-byte swizzle of wgmma_tiles.cuh's tiles); reads past a dimension
 * land as zeros. */
static tf_status tf_tma_encode(CUtensorMap *map, const void *ptr, cuuint32_t rank, const cuuint64_t *dims,
                               const cuuint64_t *strides, const cuuint32_t *box) {
  tf_status st = TF_OK;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tf_tma_encoder(&st);
  if (!encode) return st;
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, rank, const_cast<void *>(ptr), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return tf_fail(TF_ERR_BACKEND,
                   "flash_attention: cuTensorMapEncodeTiled failed (CUresult %d) for dims (%llu, %llu, %llu, %llu), "
                   "row stride %llu bytes",
                   (int)r, (unsigned long long)dims[0], (unsigned long long)dims[1], (unsigned long long)dims[2],
                   rank > 3 ? (unsigned long long)dims[3] : 1ull, (unsigned long long)strides[rank > 3 ? 1 : 0]);
  return TF_OK;
}

/* A tensor map of `batch` problems of (seq, hd) 16-bit elements at ptr,
 * boxes of 64 columns by `rows` rows; reads past seq (or hd) land as
 * zeros, so a box never reads the next problem's rows. */
static tf_status tf_tma_map_rows(CUtensorMap *map, const void *ptr, int64_t seq, int64_t batch, int hd, int rows) {
  const cuuint64_t dims[3] = {(cuuint64_t)hd, (cuuint64_t)seq, (cuuint64_t)batch};
  const cuuint64_t strides[2] = {(cuuint64_t)hd * 2, (cuuint64_t)(seq * hd * 2)}; /* bytes, dims 1 and 2 */
  const cuuint32_t box[3] = {64, (cuuint32_t)rows, 1};
  return tf_tma_encode(map, ptr, 3, dims, strides, box);
}

/* A tensor map of `batch` problems of (seq, hd) 16-bit elements at ptr in
 * O's layout (rows ld elements apart, group problems side by side in a
 * row; tf_flash_o_layout), as four dimensions (column, problem in its
 * group, row, group): boxes of 64 columns by `rows` rows of one problem,
 * laid out in shared memory as tf_tma_map_rows's. */
static tf_status tf_tma_map_o_rows(CUtensorMap *map, const void *ptr, int64_t seq, int64_t batch, int hd, int rows,
                                   int64_t ld, int64_t group) {
  const cuuint64_t dims[4] = {(cuuint64_t)hd, (cuuint64_t)group, (cuuint64_t)seq, (cuuint64_t)(batch / group)};
  const cuuint64_t strides[3] = {(cuuint64_t)hd * 2, (cuuint64_t)ld * 2, (cuuint64_t)(seq * ld * 2)}; /* bytes */
  const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1};
  return tf_tma_encode(map, ptr, 4, dims, strides, box);
}

/* The tensor maps of the backward kernels: Q and dO (in O's layout) in
 * boxes of br rows, K and V in boxes of bc rows. */
static tf_status tf_tma_map_bwd(CUtensorMap *q, CUtensorMap *dout, CUtensorMap *k, CUtensorMap *v,
                                const tf_cuda_flash_params *p, int br, int bc) {
  TF_TRY(tf_tma_map_rows(q, p->q, p->seq_q, p->batch, p->head_dim, br));
  TF_TRY(tf_tma_map_o_rows(dout, p->dout, p->seq_q, p->batch, p->head_dim, br, p->o_ld, p->o_group));
  TF_TRY(tf_tma_map_rows(k, p->k, p->seq_k, p->batch, p->head_dim, bc));
  return tf_tma_map_rows(v, p->v, p->seq_k, p->batch, p->head_dim, bc);
}

/* A warp-specialised kernel's parameters *a (P: its tensor maps, zeroed
 * for the caller to fill, then p) and its grid of `blocks` blocks a
 * problem. */
template <class P>
static tf_status tf_ws_params_of(const tf_cuda_flash_params *p, int64_t blocks, P *a, unsigned *grid) {
  TF_TRY(tf_flash_grid(p->batch, blocks, grid));
  memset(a, 0, sizeof *a);
  a->p = *p;
  return TF_OK;
}

/* A warp-specialised kernel (384 threads, one block an SM, smem bytes of
 * dynamic shared memory) on `grid` blocks on st's stream, its parameters
 * (tensor maps among them) passed by value. */
template <class P>
static tf_status tf_ws_launch(tf_cuda_state *st, void (*kernel)(P), unsigned grid, int smem, const P &a,
                              const char *what) {
  TF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<grid, 384, smem, st->stream>>>(a);
  return tf_cuda_launched(what);
}

#endif
