// A TMA tile copy, the kernel tests/lua/test_rtc.lua compiles (and reads the declaration of) and
// tests/lua/test_rtc_cuda.lua runs: the box at (tile x, tile y) of a 2-D map into shared memory by TMA,
// then to out (+1, so that a tile never loaded does not pass for one); with store, written back through
// a second map by TMA.
#include <tfhost_sm90.cuh>
extern "C" __global__ void tma_tile(const __grid_constant__ tf::tensor_map in, float *out, int rows, int cols,
                                    unsigned box_bytes, const __grid_constant__ tf::tensor_map out_map, bool store) {
  __shared__ alignas(128) float tile[32 * 32];
  __shared__ alignas(8) unsigned long long bar;
  const unsigned b = (unsigned)__cvta_generic_to_shared(&bar), t = (unsigned)__cvta_generic_to_shared(tile);
  if (threadIdx.x == 0) {
    tf::mbar_init(b, 1);
    tf::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tf::mbar_arrive_expect_tx(b, box_bytes);
    tf::tma_load_2d(t, &in, 32 * blockIdx.x, 32 * blockIdx.y, b);
  }
  tf::mbar_wait(b, 0);
  if (!store) {
    for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) {
      const int r = 32 * blockIdx.y + i / 32, c = 32 * blockIdx.x + i % 32;
      if (r < rows && c < cols) out[(long long)r * cols + c] = tile[i] + 1.0f;
    }
    return;
  }
  for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) tile[i] += 1.0f;
  tf::fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    tf::tma_store_2d(&out_map, 32 * blockIdx.x, 32 * blockIdx.y, t);
    tf::bulk_commit();
    tf::bulk_wait<0>();
  }
}
