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
 * With --nvrtc FILE (NVRTC's CUBIN of flash2.cu, as tfhost compiled it:
 * mod.code, written by own_kernel_compare.sh) it times both builds in this
 * one process instead: the same inputs, the same launches, for each of the
 * forward and the forward with the backward 5 rounds in alternating order
 * of 3 warm-up runs and the median of 20, the median of the rounds; after
 * checking that the two builds' o, lse, dQ, dK and dV are bitwise equal:
 *   {"kernel":"flash2_fwd<128, true>","shape":[...],"nvcc_ms":0.91,"nvrtc_ms":0.92,"ratio":0.99,"equal":true}
 * (ratio: nvcc's time over NVRTC's).
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I kernels/cuda/rtc -I experiments/kernels \
 *        tests/gpu/own_kernel_nvcc.cu -o own_kernel_nvcc
 *   ./own_kernel_nvcc [--nvrtc flash2.cubin] [BxHxTxD ...] */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* NVRTC's build of the kernels of one head dim, loaded from its CUBIN (NULL: nvcc's, linked in). */
template <int D> struct nvrtc_kernels {
  cudaKernel_t fwd = nullptr, prep = nullptr, dkdv = nullptr, dq = nullptr;
};

static cudaLibrary_t nvrtc_library = nullptr;

/* A kernel of the NVRTC CUBIN by its mangled name (the names flash2.cu's templates have under both compilers). */
static cudaKernel_t nvrtc_kernel(const char *fmt, int d, int smem) {
  char name[256];
  snprintf(name, sizeof name, fmt, d);
  cudaKernel_t k = nullptr;
  cudaError_t err = cudaLibraryGetKernel(&k, nvrtc_library, name);
  if (err != cudaSuccess) {
    fprintf(stderr, "own_kernel_nvcc: the NVRTC CUBIN has no kernel %s: %s\n", name, cudaGetErrorString(err));
    exit(1);
  }
  if (smem) CHECK(cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  return k;
}

template <int D> static nvrtc_kernels<D> load_nvrtc() {
  using dims = flash2::dims<D>;
  nvrtc_kernels<D> k;
  k.fwd = nvrtc_kernel("_Z10flash2_fwdILi%dELb1EEvPK13__nv_bfloat16S2_S2_PS0_Pfif", D, dims::FWD_SMEM);
  k.prep = nvrtc_kernel("_Z15flash2_bwd_prepILi%dEEvPK13__nv_bfloat16S2_Pfi", D, 0);
  k.dkdv = nvrtc_kernel("_Z15flash2_bwd_dkdvILi%dELb1EEvPK13__nv_bfloat16S2_S2_S2_PKfS4_PS0_S5_if", D,
                        dims::DKDV_SMEM);
  k.dq = nvrtc_kernel("_Z13flash2_bwd_dqILi%dELb1EEvPK13__nv_bfloat16S2_S2_S2_PKfS4_PS0_if", D, dims::DQ_SMEM);
  return k;
}

/* A launch of an NVRTC kernel with these arguments. */
template <class... A> static void launch_nvrtc(cudaKernel_t k, dim3 grid, int block, int smem, A... args) {
  void *params[] = {(void *)&args...};
  CHECK(cudaLaunchKernel((const void *)k, grid, dim3(block), params, (size_t)smem, 0));
}

/* The device buffer's bytes, on the host. */
static std::vector<char> bytes_of(const void *dev, size_t n) {
  std::vector<char> host(n);
  CHECK(cudaMemcpy(host.data(), dev, n, cudaMemcpyDeviceToHost));
  return host;
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
  if (nvrtc_library) {
    const nvrtc_kernels<D> nk = load_nvrtc<D>();
    auto nfwd = [&] {
      launch_nvrtc(nk.fwd, dim3((t + 127) / 128, bh), 128, dims::FWD_SMEM, (const __nv_bfloat16 *)q,
                   (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, o, lse, t, scale);
    };
    auto nfwd_bwd = [&] {
      nfwd();
      launch_nvrtc(nk.prep, dim3((t + 7) / 8, bh), 256, 0, (const __nv_bfloat16 *)o, (const __nv_bfloat16 *)dout,
                   delta, t);
      launch_nvrtc(nk.dkdv, dim3((t + 63) / 64, bh), 128, dims::DKDV_SMEM, (const __nv_bfloat16 *)q,
                   (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, (const __nv_bfloat16 *)dout,
                   (const float *)lse, (const float *)delta, dk, dv, t, scale);
      launch_nvrtc(nk.dq, dim3((t + 63) / 64, bh), 128, dims::DQ_SMEM, (const __nv_bfloat16 *)q,
                   (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, (const __nv_bfloat16 *)dout,
                   (const float *)lse, (const float *)delta, dq, t, scale);
    };
    /* the two builds' results, bitwise */
    std::vector<std::vector<char>> results[2];
    for (int b = 0; b < 2; b++) {
      if (b)
        nfwd_bwd();
      else
        fwd_bwd();
      CHECK(cudaDeviceSynchronize());
      results[b] = {bytes_of(o, n * 2), bytes_of(lse, rows * 4), bytes_of(dq, n * 2), bytes_of(dk, n * 2),
                    bytes_of(dv, n * 2)};
    }
    const bool equal = results[0] == results[1];
    const char *what[2] = {"flash2_fwd", "flash2_fwd+bwd"};
    for (int w = 0; w < 2; w++) {
      std::vector<float> ms[2];
      for (int r = 0; r < 5; r++)
        for (int i = 0; i < 2; i++) {
          const int b = r % 2 ? 1 - i : i; /* alternating which build runs first */
          ms[b].push_back(b ? (w ? median_ms(nfwd_bwd) : median_ms(nfwd)) : (w ? median_ms(fwd_bwd) : median_ms(fwd)));
        }
      for (auto &m : ms) std::sort(m.begin(), m.end());
      const float nvcc_ms = ms[0][2], nvrtc_ms = ms[1][2];
      printf("{\"kernel\":\"%s<%d, true>\",\"shape\":[%d,%d,%d,%d],\"nvcc_ms\":%.4f,\"nvrtc_ms\":%.4f,"
             "\"ratio\":%.4f,\"equal\":%s}\n",
             what[w], D, s.b, s.h, s.t, s.d, nvcc_ms, nvrtc_ms, nvcc_ms / nvrtc_ms, equal ? "true" : "false");
    }
    fflush(stdout);
  } else {
  const float fwd_ms = median_ms(fwd), both_ms = median_ms(fwd_bwd);
  printf("{\"kernel\":\"flash2_fwd<%d, true>\",\"shape\":[%d,%d,%d,%d],\"ms\":%.4f}\n", D, s.b, s.h, s.t, s.d, fwd_ms);
  printf("{\"kernel\":\"flash2_fwd+bwd<%d, true>\",\"shape\":[%d,%d,%d,%d],\"ms\":%.4f}\n", D, s.b, s.h, s.t, s.d, both_ms);
  fflush(stdout);
  }
  for (void *p : {(void *)q, (void *)k, (void *)v, (void *)dout, (void *)o, (void *)dq, (void *)dk, (void *)dv,
                  (void *)lse, (void *)delta})
    CHECK(cudaFree(p));
}

int main(int argc, char **argv) {
  static const char *defaults[] = {"4x16x1024x64", "4x16x4096x64", "4x16x4096x128", "1x16x16384x128"};
  std::vector<const char *> specs(argv + 1, argv + argc);
  if (specs.size() >= 2 && strcmp(specs[0], "--nvrtc") == 0) {
    FILE *f = fopen(specs[1], "rb");
    if (!f) {
      fprintf(stderr, "own_kernel_nvcc: cannot read %s\n", specs[1]);
      return 2;
    }
    std::vector<char> image;
    char buf[1 << 16];
    for (size_t got; (got = fread(buf, 1, sizeof buf, f)) > 0;) image.insert(image.end(), buf, buf + got);
    fclose(f);
    CHECK(cudaLibraryLoadData(&nvrtc_library, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    specs.erase(specs.begin(), specs.begin() + 2);
  }
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
