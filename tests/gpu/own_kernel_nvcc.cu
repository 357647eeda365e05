/* experiments/kernels/flash2.cu built by nvcc instead of NVRTC, timed on
 * the same shapes as experiments/own_kernel.lua times the NVRTC build, so
 * that tests/gpu/own_kernel_compare.sh can set the two side by side. For
 * each shape BxHxTxD (D 64 or 128), causal, it times flash2_fwd alone and
 * the forward pass with the whole backward pass (prep, dK/dV, dQ), with
 * CUDA events: 3 warm-up runs, then the median of 20, one JSON line each:
 *   {"kernel":"flash2_fwd<64, true>","shape":[4,16,1024,64],"ms":0.123}
 *   {"kernel":"flash2_fwd+bwd<64, true>","shape":[4,16,1024,64],"ms":0.456}
 * Inputs are bf16 from a host LCG (uniform in [-1, 1)). Any CUDA error
 * ends it with exit 1, naming the call.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels/cuda/rtc -I experiments/kernels \
 *        tests/gpu/own_kernel_nvcc.cu -o own_kernel_nvcc
 *   ./own_kernel_nvcc [BxHxTxD ...] */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "flash2.cu"

#define CHECK(call)                                                                             \
  do {                                                                                          \
    cudaError_t err_ = (call);                                                                  \
    if (err_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "own_kernel_nvcc: %s: %s (%s:%d)\n", #call, cudaGetErrorString(err_), __FILE__, __LINE__); \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

enum { WARMUP = 3, ITERS = 20 };

struct shape {
  int b, h, t, d;
};

/* A bf16 buffer of n uniform values in [-1, 1) from the LCG state *seed, on the device. */
static __nv_bfloat16 *random_bf16(size_t n, uint64_t *seed) {
  std::vector<__nv_bfloat16> host(n);
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    const float u = (float)(*seed >> 40) / (float)(1ull << 24); /* [0, 1) */
    host[i] = __float2bfloat16(2.f * u - 1.f);
  }
  __nv_bfloat16 *dev = nullptr;
  CHECK(cudaMalloc(&dev, n * sizeof(__nv_bfloat16)));
  CHECK(cudaMemcpy(dev, host.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  return dev;
}

/* The median time of `run` in ms over ITERS timed runs after WARMUP untimed ones. */
template <class F> static float median_ms(F run) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < WARMUP; i++) run();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> ms(ITERS);
  for (int i = 0; i < ITERS; i++) {
    CHECK(cudaEventRecord(start));
    run();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaGetLastError());
    CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ITERS % 2 ? ms[ITERS / 2] : 0.5f * (ms[ITERS / 2 - 1] + ms[ITERS / 2]);
}

template <int D> static void time_shape(const shape &s, uint64_t *seed) {
  using dims = flash2::dims<D>;
  const size_t n = (size_t)s.b * s.h * s.t * D, rows = (size_t)s.b * s.h * s.t;
  __nv_bfloat16 *q = random_bf16(n, seed), *k = random_bf16(n, seed), *v = random_bf16(n, seed);
  __nv_bfloat16 *dout = random_bf16(n, seed), *o, *dq, *dk, *dv;
  float *lse, *delta;
  CHECK(cudaMalloc(&o, n * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&dq, n * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&dk, n * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&dv, n * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&lse, rows * sizeof(float)));
  CHECK(cudaMalloc(&delta, rows * sizeof(float)));
  CHECK(cudaFuncSetAttribute(flash2_fwd<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, dims::FWD_SMEM));
  CHECK(cudaFuncSetAttribute(flash2_bwd_dkdv<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, dims::DKDV_SMEM));
  CHECK(cudaFuncSetAttribute(flash2_bwd_dq<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, dims::DQ_SMEM));

  const int bh = s.b * s.h, t = s.t;
  const float scale = 1.f / sqrtf((float)D);
  auto fwd = [&] {
    flash2_fwd<D, true><<<dim3((t + 127) / 128, bh), 128, dims::FWD_SMEM>>>(q, k, v, o, lse, t, scale);
  };
  auto fwd_bwd = [&] {
    fwd();
    flash2_bwd_prep<D><<<dim3((t + 7) / 8, bh), 256>>>(o, dout, delta, t);
    flash2_bwd_dkdv<D, true><<<dim3((t + 63) / 64, bh), 128, dims::DKDV_SMEM>>>(q, k, v, dout, lse, delta, dk, dv, t, scale);
    flash2_bwd_dq<D, true><<<dim3((t + 63) / 64, bh), 128, dims::DQ_SMEM>>>(q, k, v, dout, lse, delta, dq, t, scale);
  };
  const float fwd_ms = median_ms(fwd), both_ms = median_ms(fwd_bwd);
  printf("{\"kernel\":\"flash2_fwd<%d, true>\",\"shape\":[%d,%d,%d,%d],\"ms\":%.4f}\n", D, s.b, s.h, s.t, s.d, fwd_ms);
  printf("{\"kernel\":\"flash2_fwd+bwd<%d, true>\",\"shape\":[%d,%d,%d,%d],\"ms\":%.4f}\n", D, s.b, s.h, s.t, s.d, both_ms);
  fflush(stdout);
  for (void *p : {(void *)q, (void *)k, (void *)v, (void *)dout, (void *)o, (void *)dq, (void *)dk, (void *)dv,
                  (void *)lse, (void *)delta})
    CHECK(cudaFree(p));
}

int main(int argc, char **argv) {
  static const char *defaults[] = {"4x16x1024x64", "4x16x4096x64", "4x16x4096x128", "1x16x16384x128"};
  std::vector<const char *> specs(argv + 1, argv + argc);
  if (specs.empty()) specs.assign(defaults, defaults + sizeof defaults / sizeof *defaults);
  uint64_t seed = 20240601;
  for (const char *spec : specs) {
    shape s;
    char tail;
    if (sscanf(spec, "%dx%dx%dx%d%c", &s.b, &s.h, &s.t, &s.d, &tail) != 4 || s.b < 1 || s.h < 1 || s.t < 1) {
      fprintf(stderr, "own_kernel_nvcc: a shape is BxHxTxD, not '%s'\n", spec);
      return 2;
    }
    if (s.d == 64)
      time_shape<64>(s, &seed);
    else if (s.d == 128)
      time_shape<128>(s, &seed);
    else {
      fprintf(stderr, "own_kernel_nvcc: head dim %d (the kernels take 64 and 128)\n", s.d);
      return 2;
    }
  }
  CHECK(cudaDeviceSynchronize());
  return 0;
}
