/* Work with known shapes and durations for the profiler's GPU test
 * (tests/c/test_prof_cuda.c): a kernel that busy-waits on the GPU's
 * nanosecond clock, and plain memset/memcpy calls of given sizes. Not part
 * of the user API: only that test declares these functions. */
#include "cuda_common.cuh"

#include <stdlib.h>

enum { TF_PROF_SPIN_SCRATCH = 256 };

static __device__ __forceinline__ uint64_t tf_prof_globaltimer(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Every block spins for ns nanoseconds of the global timer. The static
 * scratch (1 KiB) and the dynamic shared memory (when there is any) are
 * used, so both show in the kernel's record; sink (NULL in the test) keeps
 * the stores alive. */
__global__ void tf_prof_spin_kernel(uint64_t ns, bool has_dynamic, int *sink) {
  __shared__ int scratch[TF_PROF_SPIN_SCRATCH];
  extern __shared__ int dynamic[];
  uint64_t start = tf_prof_globaltimer();
  int spins = 0;
  while (tf_prof_globaltimer() - start < ns) spins++;
  unsigned t = threadIdx.x + threadIdx.y * blockDim.x;
  scratch[t % TF_PROF_SPIN_SCRATCH] = spins;
  if (has_dynamic) dynamic[0] = (int)t;
  __syncthreads();
  if (sink && t == 0) *sink = scratch[(spins & 0xff) % TF_PROF_SPIN_SCRATCH] + (has_dynamic ? dynamic[0] : 0);
}

/* Launches the spin kernel on ctx's stream: grid (gx, gy), block (bx, by),
 * dynamic_shared bytes of dynamic shared memory. */
extern "C" tf_status tf_prof_test_spin(tf_device_ctx *ctx, int64_t ns, int gx, int gy, int bx, int by,
                                       int dynamic_shared) {
  TF_TRY(tf_cuda_use_device(ctx));
  dim3 grid((unsigned)gx, (unsigned)gy), block((unsigned)bx, (unsigned)by);
  bool has_dynamic = dynamic_shared >= (int)sizeof(int);
  tf_prof_spin_kernel<<<grid, block, (size_t)dynamic_shared, tf_cuda_state_of(ctx)->stream>>>((uint64_t)ns,
                                                                                              has_dynamic, NULL);
  return tf_cuda_launched("tf_prof_spin_kernel");
}

/* On ctx's stream: one memset of memset_bytes, one host-to-device copy of
 * h2d_bytes and one device-to-host copy of d2h_bytes (pageable host memory),
 * then waits for them. */
extern "C" tf_status tf_prof_test_memops(tf_device_ctx *ctx, size_t memset_bytes, size_t h2d_bytes,
                                         size_t d2h_bytes) {
  TF_TRY(tf_cuda_use_device(ctx));
  cudaStream_t stream = tf_cuda_state_of(ctx)->stream;
  size_t most = memset_bytes > h2d_bytes ? memset_bytes : h2d_bytes;
  if (d2h_bytes > most) most = d2h_bytes;
  void *dev = NULL;
  unsigned char *host = (unsigned char *)calloc(most ? most : 1, 1);
  if (!host) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for the test copies");
  cudaError_t err = cudaMalloc(&dev, most ? most : 1);
  if (err == cudaSuccess) err = cudaMemsetAsync(dev, 0x5a, memset_bytes, stream);
  if (err == cudaSuccess) err = cudaMemcpyAsync(dev, host, h2d_bytes, cudaMemcpyHostToDevice, stream);
  if (err == cudaSuccess) err = cudaMemcpyAsync(host, dev, d2h_bytes, cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  tf_status st = err == cudaSuccess ? TF_OK : tf_cuda_error(err, "tf_prof_test_memops");
  if (dev) tf_cuda_report(cudaFree(dev), "cudaFree");
  free(host);
  return st;
}
