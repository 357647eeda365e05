/* What the decode step's one-row products can read at best: the 2.7B
 * model's 129 products of a decode step at batch 1 (a layer's qkv, output,
 * w1|w3 and w2, then lm_head), each weight its own buffer, launched one
 * after another as the engine launches them, captured into one CUDA graph
 * and replayed; then each shape alone, L launches of it. Three kinds of
 * kernel read the same bytes:
 *   engine      kernels/cuda/gemv.cuh's kernel, as tf_cuda_gemm picks its split
 *   rolling     a grid of a few blocks an SM, a warp a column at a time, the
 *               next chunk of CH rounds asked for before this one is used, x
 *               staged in shared memory
 *   read        rolling's loads and nothing else: the floor for this many
 *               launches of these sizes
 * each plainly and chained (Hopper's programmatic dependent launch, as the
 * engine's decode step runs). docs/performance.md reports the figures.
 *
 *   cmake --build build --target decode_gemv_study
 *   build/decode_gemv_study [--layers 32] [--d-model 2560] [--d-ff 10240]
 *                           [--vocab 10000] [--reps 20] [--json out.json]
 *
 * Prints a markdown table (us a step, TB/s, and each shape's us and TB/s)
 * and the copy rate, and writes the rows with the device, driver, CUDA and
 * the commit as JSON. Before timing it checks that rolling's sums are the
 * engine kernel's within bf16's rounding. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "gemv.cuh"

extern "C" const char *const tf_commit;

#define CHECK(x)                                                                            \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

typedef tf_cuda_dtype<TF_BF16> bf16;

/* rolling (READ_ONLY false) and read (true): columns gw, gw + all warps, ...; a warp's work is a
 * run of chunks (column, CH rounds of 32 16-byte words), the next one's words asked for before
 * this one's are used. */
template <int CH, bool READ_ONLY>
__global__ void __launch_bounds__(256) rolling_kernel(const uint16_t *__restrict__ a, const uint16_t *__restrict__ b,
                                                      uint16_t *__restrict__ c, int n, int k) {
  extern __shared__ uint4 xs[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int all = gridDim.x * 8, gw = blockIdx.x * 8 + warp;
  const int words = k / 8, rounds = (words + 31) / 32, chunks = (rounds + CH - 1) / CH;
  union word8 {
    uint4 word;
    uint16_t v[8];
  };
  word8 A[CH], B[CH];
  auto fetch = [&](int col, int ch, word8 *dst) {
    const uint4 *w = (const uint4 *)(b + (int64_t)col * k);
#pragma unroll
    for (int u = 0; u < CH; u++) {
      const int at = (ch * CH + u) * 32 + lane;
      if (at < words) dst[u].word = __ldcs(w + at);
    }
  };
  int col = gw, ch = 0;
  if (col < n) fetch(col, ch, A);
  tf_chain_next();
  tf_chain_wait();
  for (int i = threadIdx.x; i < words; i += blockDim.x) xs[i] = ((const uint4 *)a)[i];
  __syncthreads();
  if (col >= n) return;
  float acc = 0.0f;
  auto use = [&](int at_ch, const word8 *src) {
#pragma unroll
    for (int u = 0; u < CH; u++) {
      const int at = (at_ch * CH + u) * 32 + lane;
      if (at >= words) continue;
      if (READ_ONLY) {
        acc += __uint_as_float(src[u].word.x ^ src[u].word.y ^ src[u].word.z ^ src[u].word.w);
      } else {
        word8 xv;
        xv.word = xs[at];
#pragma unroll
        for (int j = 0; j < 8; j++) acc += bf16::load(xv.v[j]) * bf16::load(src[u].v[j]);
      }
    }
  };
  auto step = [&](const word8 *cur, word8 *next) {
    int ncol = col, nch = ch + 1;
    if (nch == chunks) nch = 0, ncol += all;
    const bool more = ncol < n;
    if (more) fetch(ncol, nch, next);
    use(ch, cur);
    if (nch == 0) {
      float v = acc;
#pragma unroll
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) c[col] = bf16::store(v);
      acc = 0.0f;
    }
    col = ncol, ch = nch;
    return more;
  };
  while (step(A, B) && step(B, A)) {
  }
}

enum { ENGINE, ROLLING, READ };
struct variant {
  const char *name;
  int kind, ch, blocks_per_sm;
};
struct shape {
  const char *name;
  int n, k;
  std::vector<uint16_t *> w;
};

typedef void (*plain_kernel)(const uint16_t *, const uint16_t *, uint16_t *, int, int);

static int multiprocessors;

static cudaLaunchConfig_t launch_config(cudaStream_t s, unsigned grid, size_t smem, bool chained,
                                        cudaLaunchAttribute *at) {
  cudaLaunchConfig_t cfg = {};
  *at = cudaLaunchAttribute{};
  cfg.gridDim = grid, cfg.blockDim = 256, cfg.dynamicSmemBytes = smem, cfg.stream = s;
  at->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at->val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at, cfg.numAttrs = chained ? 1 : 0;
  return cfg;
}

static plain_kernel rolling_of(int ch, bool read) {
  if (read) return ch == 4 ? rolling_kernel<4, true> : rolling_kernel<8, true>;
  return ch == 4 ? rolling_kernel<4, false> : rolling_kernel<8, false>;
}

/* y = x W^T for W (n, k) by variant v, on stream s. */
static void product(cudaStream_t s, const variant &v, const uint16_t *x, uint16_t *y, const uint16_t *w, int n, int k,
                    bool chained) {
  cudaLaunchAttribute at;
  if (v.kind == ENGINE) { /* tf_cuda_gemm's choice of split and kernel */
    const int split = tf_gemv_split(k);
    const unsigned blocks = (unsigned)((n + TF_GEMV_WARPS / split - 1) / (TF_GEMV_WARPS / split));
    const tf_gemv_then none = {};
    const cudaLaunchConfig_t cfg = launch_config(s, blocks, 0, chained, &at);
    CHECK(cudaLaunchKernelEx(&cfg, tf_gemv_kernel_of<TF_BF16, TF_GEMV_STORE>(split), x, w, y, n, k, (int64_t)k, none));
    return;
  }
  unsigned grid = (unsigned)(multiprocessors * v.blocks_per_sm);
  const unsigned most = (unsigned)((n + 7) / 8);
  if (grid > most) grid = most;
  const cudaLaunchConfig_t cfg = launch_config(s, grid, (size_t)k * 2, chained, &at);
  CHECK(cudaLaunchKernelEx(&cfg, rolling_of(v.ch, v.kind == READ), x, w, y, n, k));
}

/* Microseconds a replay of graph g (reps replays after two). */
static double replay_us(cudaStream_t s, cudaGraphExec_t g, int reps) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 2; i++) CHECK(cudaGraphLaunch(g, s));
  CHECK(cudaEventRecord(e0, s));
  for (int i = 0; i < reps; i++) CHECK(cudaGraphLaunch(g, s));
  CHECK(cudaEventRecord(e1, s));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return ms * 1000.0 / reps;
}

/* The products of list (count of each: its buffers, or `alone` launches of its first) as one graph. */
static double time_graph(cudaStream_t s, const variant &v, const std::vector<shape *> &list, const uint16_t *x,
                         uint16_t *y, bool chained, int layers, int alone, int reps) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  if (alone) {
    for (int l = 0; l < alone; l++)
      product(s, v, x, y, list[0]->w[l % list[0]->w.size()], list[0]->n, list[0]->k, chained);
  } else {
    for (int l = 0; l < layers; l++)
      for (size_t i = 0; i + 1 < list.size(); i++) product(s, v, x, y, list[i]->w[l], list[i]->n, list[i]->k, chained);
    product(s, v, x, y, list.back()->w[0], list.back()->n, list.back()->k, chained);
  }
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double us = replay_us(s, ge, reps);
  CHECK(cudaGraphExecDestroy(ge));
  CHECK(cudaGraphDestroy(g));
  return us;
}

static int int_arg(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) {
    fprintf(stderr, "decode_gemv_study: %s needs a number\n", argv[*i]);
    exit(2);
  }
  const long v = strtol(argv[++*i], NULL, 10);
  if (v < 1 || v > 1 << 20) {
    fprintf(stderr, "decode_gemv_study: %s %s is out of range\n", argv[*i - 1], argv[*i]);
    exit(2);
  }
  return (int)v;
}

static float bf16_value(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

int main(int argc, char **argv) {
  int layers = 32, d = 2560, f = 10240, vocab = 10000, reps = 20;
  const char *json = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--layers")) layers = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--d-model")) d = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--d-ff")) f = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--vocab")) vocab = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--reps")) reps = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--layers N] [--d-model N] [--d-ff N] [--vocab N] [--reps N] [--json PATH]\n",
              argv[0]);
      return 2;
    }
  }
  if (d % 8 != 0 || f % 8 != 0) {
    fprintf(stderr, "decode_gemv_study: d_model and d_ff must be multiples of 8 (rows of 16-byte words)\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  multiprocessors = prop.multiProcessorCount;
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);

  shape qkv{"qkv", 3 * d, d, {}}, out{"out", d, d, {}}, w13{"w13", 2 * f, d, {}}, w2{"w2", d, f, {}};
  shape head{"lm_head", vocab, d, {}};
  std::vector<shape *> step = {&qkv, &out, &w13, &w2, &head};
  size_t biggest = 0; /* the largest weight, in values */
  for (shape *sh : step) biggest = (size_t)sh->n * sh->k > biggest ? (size_t)sh->n * sh->k : biggest;
  std::vector<uint16_t> host(biggest);
  uint64_t r = 88172645463325252ull;
  for (auto &e : host) { /* uniform in [-1, 1) as bf16 */
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    const float v = (float)(r >> 40) / 16777216.0f * 2.0f - 1.0f;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    e = (uint16_t)(u >> 16);
  }
  size_t bytes = 0;
  for (shape *sh : step)
    for (int l = 0; l < (sh == &head ? 1 : layers); l++) {
      uint16_t *p = NULL;
      const size_t size = (size_t)sh->n * sh->k * 2;
      CHECK(cudaMalloc(&p, size));
      CHECK(cudaMemcpy(p, host.data(), size, cudaMemcpyHostToDevice));
      sh->w.push_back(p);
      bytes += size;
    }
  int most_k = 0, most_n = 0; /* the longest row and the most outputs */
  for (shape *sh : step) most_k = sh->k > most_k ? sh->k : most_k, most_n = sh->n > most_n ? sh->n : most_n;
  uint16_t *x = NULL, *y = NULL;
  CHECK(cudaMalloc(&x, (size_t)most_k * 2));
  CHECK(cudaMalloc(&y, (size_t)most_n * 2));
  {
    std::vector<uint16_t> xs(most_k);
    for (int i = 0; i < most_k; i++) {
      const float v = sinf((float)i * 0.37f) * 0.5f;
      uint32_t u;
      memcpy(&u, &v, sizeof u);
      xs[i] = (uint16_t)(u >> 16);
    }
    CHECK(cudaMemcpy(x, xs.data(), (size_t)most_k * 2, cudaMemcpyHostToDevice));
  }
  for (int ch : {4, 8})
    for (bool read : {false, true})
      CHECK(cudaFuncSetAttribute(rolling_of(ch, read), cudaFuncAttributeMaxDynamicSharedMemorySize, most_k * 2));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const variant variants[] = {{"engine", ENGINE, 8, 0},     {"rolling 8 x 2", ROLLING, 8, 2},
                              {"rolling 4 x 4", ROLLING, 4, 4}, {"rolling 4 x 8", ROLLING, 4, 8},
                              {"read 8 x 2", READ, 8, 2},     {"read 4 x 4", READ, 4, 4}};
  /* rolling's sums against the engine kernel's, each shape: within a few bf16 steps of the largest */
  int bad = 0;
  for (const variant &v : variants) {
    if (v.kind != ROLLING) continue;
    for (shape *sh : step) {
      std::vector<uint16_t> e(sh->n), o(sh->n);
      product(s, variants[0], x, y, sh->w[0], sh->n, sh->k, false);
      CHECK(cudaStreamSynchronize(s));
      CHECK(cudaMemcpy(e.data(), y, (size_t)sh->n * 2, cudaMemcpyDeviceToHost));
      CHECK(cudaMemset(y, 0, (size_t)sh->n * 2));
      product(s, v, x, y, sh->w[0], sh->n, sh->k, false);
      CHECK(cudaStreamSynchronize(s));
      CHECK(cudaMemcpy(o.data(), y, (size_t)sh->n * 2, cudaMemcpyDeviceToHost));
      double worst = 0, top = 0;
      for (int i = 0; i < sh->n; i++) {
        worst = fmax(worst, fabs((double)bf16_value(e[i]) - bf16_value(o[i])));
        top = fmax(top, fabs((double)bf16_value(e[i])));
      }
      if (!(worst <= 2e-2 * top)) {
        fprintf(stderr, "decode_gemv_study: %s's %s differs from the engine kernel's by %g (largest %g)\n", v.name,
                sh->name, worst, top);
        bad = 1;
      }
    }
  }
  if (bad) return 1;

  FILE *js = json ? fopen(json, "w") : NULL;
  if (json && !js) {
    fprintf(stderr, "decode_gemv_study: cannot write %s\n", json);
    return 1;
  }
  if (js)
    fprintf(js, "{\"env\": {\"device\": \"%s\", \"driver\": %d, \"cuda_runtime\": %d, \"commit\": \"%s\", "
                "\"options\": {\"layers\": %d, \"d_model\": %d, \"d_ff\": %d, \"vocab\": %d, \"reps\": %d}}, "
                "\"step_bytes\": %zu, \"rows\": [",
            prop.name, driver, runtime, tf_commit, layers, d, f, vocab, reps, bytes);
  printf("# One-row bf16 products of a decode step, %s (commit %s): %d layers, %.3f GB of weights a step\n\n",
         prop.name, tf_commit, layers, bytes / 1e9);
  printf("| kernel | launch | us a step | TB/s |");
  for (shape *sh : step) printf(" %s us | TB/s |", sh->name);
  printf("\n|---|---|---|---|");
  for (size_t i = 0; i < step.size(); i++) printf("---|---|");
  printf("\n");
  bool first = true;
  for (const variant &v : variants)
    for (int chained = 0; chained < 2; chained++) {
      const double us = time_graph(s, v, step, x, y, chained, layers, 0, reps);
      printf("| %s | %s | %.1f | %.3f |", v.name, chained ? "chained" : "plain", us, bytes / (us * 1e-6) / 1e12);
      if (js)
        fprintf(js, "%s{\"kernel\": \"%s\", \"chained\": %s, \"step_us\": %.2f, \"shapes\": {", first ? "" : ", ",
                v.name, chained ? "true" : "false", us);
      first = false;
      for (size_t i = 0; i < step.size(); i++) {
        shape *sh = step[i];
        const int count = sh == &head ? 8 : layers;
        const double one = time_graph(s, v, {sh}, x, y, chained, layers, count, reps) / count;
        const double tbs = (double)sh->n * sh->k * 2 / (one * 1e-6) / 1e12;
        printf(" %.2f | %.2f |", one, tbs);
        if (js) fprintf(js, "%s\"%s\": {\"us\": %.3f, \"tb_per_s\": %.3f}", i ? ", " : "", sh->name, one, tbs);
      }
      printf("\n");
      if (js) fprintf(js, "}}");
      fflush(stdout);
    }
  /* the copy rate, for scale: cudaMemcpy of 2 GiB on the device, read + write */
  uint8_t *p0 = NULL, *p1 = NULL;
  const size_t n = (size_t)1 << 31;
  CHECK(cudaMalloc(&p0, n));
  CHECK(cudaMalloc(&p1, n));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaMemcpyAsync(p1, p0, n, cudaMemcpyDeviceToDevice, s));
  CHECK(cudaEventRecord(e0, s));
  for (int i = 0; i < 5; i++) CHECK(cudaMemcpyAsync(p1, p0, n, cudaMemcpyDeviceToDevice, s));
  CHECK(cudaEventRecord(e1, s));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const double copy = 2.0 * n * 5 / (ms * 1e-3) / 1e12;
  printf("\nCopy rate %.3f TB/s (a device-to-device copy's reads and writes).\n", copy);
  if (js) {
    fprintf(js, "], \"copy_tb_per_s\": %.3f}\n", copy);
    fclose(js);
    printf("wrote %s\n", json);
  }
  return 0;
}
