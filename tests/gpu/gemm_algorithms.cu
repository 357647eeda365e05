/* cuBLASLt's first algorithms for the fused engine's products, timed two
 * ways: in short bursts (about 2 ms of calls after the device has rested,
 * as the engine's timed choice in kernels/cuda/gemm.cu times them) and
 * sustained (after --sustain-ms of the same product, when a GPU at its
 * power limit has lowered its clock). It answers two questions that
 * docs/performance.md reports: how much faster than the heuristic's first
 * choice the fastest of the first eight is, and whether the burst timing
 * picks the algorithm that is fastest under the power limit. The timing
 * compares no bits (the engine only keeps algorithms with the first one's
 * bits); --bits does.
 *
 *   cmake --build build --target gemm_algorithms
 *   build/gemm_algorithms [--tokens 4096] [--d-model 2560] [--d-ff 10240]
 *                         [--vocab 10000] [--layers 32] [--sustain-ms 120]
 *                         [--bits N [--busy-mb 32]] [--json out.json]
 *
 * Prints a markdown table (ms per call) and writes the same rows, with the
 * device, driver, CUDA and cuBLASLt versions and the commit, as JSON.
 *
 * With --bits N it times nothing: it runs each algorithm once alone and N
 * times beside a memory-bound kernel on a low-priority stream (as the
 * engine's AdamW runs beside its backward pass), and prints, for each, its
 * configuration and whether its result had the first algorithm's bits
 * alone and the same bits in every run beside the other kernel. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern "C" const char *const tf_commit;

#define CHECK(x)                                                                 \
  do {                                                                           \
    int e_ = (int)(x);                                                           \
    if (e_) {                                                                    \
      fprintf(stderr, "gemm_algorithms: %s failed (%d) at line %d\n", #x, e_, __LINE__); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

enum { CANDIDATES = 8 };

/* Reproducible bf16 values in [-0.05, 0.05). */
__global__ void fill_kernel(__nv_bfloat16 *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}

/* One product as cuBLASLt sees it (column-major m x n = op(A) m x k times
 * op(B) k x n): the engine's forward y = x W^T, weight gradient dW = dy^T x
 * (f32 out) and input gradient dx = dy W of one weight matrix. */
typedef struct {
  const char *matrix, *pass;
  int m, n, k;
  bool ta, tb, f32_out;
  int per_step;
} product;

typedef struct {
  int index;
  float burst, sustained;
} timing;

typedef struct {
  cublasLtHandle_t lt;
  void *a, *b, *c, *ws;
  size_t ws_bytes;
  cudaEvent_t e0, e1;
  float sustain_ms;
} bench;


/* x as cuBLASLt sees it, and the heuristic's first CANDIDATES algorithms for it. */
typedef struct {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulHeuristicResult_t r[CANDIDATES];
  int found;
} plan;

static void plan_make(const bench *B, const product *x, plan *P) {
  CHECK(cublasLtMatmulDescCreate(&P->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t oa = x->ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = x->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CHECK(cublasLtMatmulDescSetAttribute(P->op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
  CHECK(cublasLtMatmulDescSetAttribute(P->op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
  CHECK(cublasLtMatrixLayoutCreate(&P->la, CUDA_R_16BF, x->ta ? x->k : x->m, x->ta ? x->m : x->k,
                                   x->ta ? x->k : x->m));
  CHECK(cublasLtMatrixLayoutCreate(&P->lb, CUDA_R_16BF, x->tb ? x->n : x->k, x->tb ? x->k : x->n,
                                   x->tb ? x->n : x->k));
  CHECK(cublasLtMatrixLayoutCreate(&P->lc, x->f32_out ? CUDA_R_32F : CUDA_R_16BF, x->m, x->n, x->m));
  cublasLtMatmulPreference_t pref;
  CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &B->ws_bytes,
                                             sizeof B->ws_bytes));
  P->found = 0;
  CHECK(cublasLtMatmulAlgoGetHeuristic(B->lt, P->op, P->la, P->lb, P->lc, P->lc, pref, CANDIDATES, P->r, &P->found));
  cublasLtMatmulPreferenceDestroy(pref);
}

static void plan_free(plan *P) {
  cublasLtMatrixLayoutDestroy(P->la), cublasLtMatrixLayoutDestroy(P->lb), cublasLtMatrixLayoutDestroy(P->lc);
  cublasLtMatmulDescDestroy(P->op);
}

/* One call of algo on P's operands (queued on stream s). */
static cublasStatus_t plan_run(const bench *B, const plan *P, const cublasLtMatmulAlgo_t *algo, cudaStream_t s) {
  const float alpha = 1, beta = 0;
  return cublasLtMatmul(B->lt, P->op, &alpha, B->a, P->la, B->b, P->lb, &beta, B->c, P->lc, B->c, P->lc, algo, B->ws,
                        B->ws_bytes, s);
}

/* Milliseconds a call takes on algo, the mean of calls calls. */
static float clock_calls(bench *B, const plan *P, const cublasLtMatmulAlgo_t *algo, int calls) {
  CHECK(cudaEventRecord(B->e0));
  for (int i = 0; i < calls; i++) CHECK(plan_run(B, P, algo, 0));
  CHECK(cudaEventRecord(B->e1));
  CHECK(cudaEventSynchronize(B->e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, B->e0, B->e1));
  return ms / (float)calls;
}

/* The first CANDIDATES algorithms the heuristic offers for x, each timed in
 * a burst and sustained; returns how many could run. */
static int time_product(bench *B, const product *x, timing *t) {
  plan P;
  plan_make(B, x, &P);
  int n = 0;
  for (int i = 0; i < P.found; i++) {
    if (P.r[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (plan_run(B, &P, &P.r[i].algo, 0) != CUBLAS_STATUS_SUCCESS) continue;
    /* a burst after the device has rested, as after the engine's synchronisation */
    CHECK(cudaDeviceSynchronize());
    usleep(200000);
    const float once = clock_calls(B, &P, &P.r[i].algo, 1);
    int calls = once > 0 ? (int)(2.0f / once) : 50;
    calls = calls < 3 ? 3 : calls > 50 ? 50 : calls;
    t[n].burst = clock_calls(B, &P, &P.r[i].algo, calls);
    /* sustained: sustain_ms of the same product, then some 40 ms timed */
    int heat = (int)(B->sustain_ms / t[n].burst), timed = (int)(40.0f / t[n].burst);
    if (heat > 0) (void)clock_calls(B, &P, &P.r[i].algo, heat);
    t[n].sustained = clock_calls(B, &P, &P.r[i].algo, timed < 10 ? 10 : timed);
    t[n].index = i;
    n++;
  }
  plan_free(&P);
  return n;
}

/* What runs beside a product in --bits: --busy-mb MiB of f32 read and
 * written, as an optimizer's update does. */
__global__ void busy_kernel(float *p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = p[i] * 0.999f + 1e-3f;
}

/* A hash of C's bytes (read back to the host). */
static unsigned long long print_of(const bench *B, size_t bytes, unsigned char *host) {
  CHECK(cudaMemcpy(host, B->c, bytes, cudaMemcpyDeviceToHost));
  unsigned long long h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ host[i]) * 1099511628211ull;
  return h;
}

/* --bits: each of the first CANDIDATES algorithms for x once alone and runs
 * times beside busy_kernel, one row each. */
static void bits_product(bench *B, const product *x, int runs, float *spare, size_t spare_n, FILE *js, int *rows) {
  plan P;
  plan_make(B, x, &P);
  int lo = 0, hi = 0;
  CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t main_s, side_s;
  CHECK(cudaStreamCreateWithPriority(&main_s, cudaStreamNonBlocking, hi));
  CHECK(cudaStreamCreateWithPriority(&side_s, cudaStreamNonBlocking, lo));
  const size_t bytes = (size_t)x->m * x->n * (x->f32_out ? 4 : 2);
  unsigned char *host = (unsigned char *)malloc(bytes);
  CHECK(host == NULL);
  unsigned long long want = 0;
  for (int i = 0; i < P.found; i++) {
    if (P.r[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (plan_run(B, &P, &P.r[i].algo, main_s) != CUBLAS_STATUS_SUCCESS) continue;
    CHECK(cudaStreamSynchronize(main_s));
    const unsigned long long alone = print_of(B, bytes, host);
    if (i == 0) want = alone;
    int differ = 0;
    for (int run = 0; run < runs; run++) {
      busy_kernel<<<264 + run % 7 * 64, 256, 0, side_s>>>(spare, spare_n);
      CHECK(cudaGetLastError());
      CHECK(plan_run(B, &P, &P.r[i].algo, main_s));
      CHECK(cudaDeviceSynchronize());
      if (print_of(B, bytes, host) != alone) differ++;
    }
    /* the configuration, each attribute read into a zeroed 64-bit word */
    const cublasLtMatmulAlgoConfigAttributes_t attrs[8] = {
        CUBLASLT_ALGO_CONFIG_ID,           CUBLASLT_ALGO_CONFIG_TILE_ID,       CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
        CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION,
        CUBLASLT_ALGO_CONFIG_STAGES_ID,    CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID};
    unsigned long long v[8];
    for (int a = 0; a < 8; a++) {
      size_t written = 0;
      v[a] = 0;
      size_t size = attrs[a] == CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID ? 2 : 4;
      if (cublasLtMatmulAlgoConfigGetAttribute(&P.r[i].algo, attrs[a], &v[a], size, &written)) v[a] = ~0ull;
    }
    printf("| %s | %s | #%d | %llu | %llu | %llu | %llu | %llu | %llu | %llu | %llu | %s | %d of %d |\n", x->matrix,
           x->pass, i, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], alone == want ? "same" : "other", differ, runs);
    if (js)
      fprintf(js, "%s\n  {\"matrix\": \"%s\", \"product\": \"%s\", \"index\": %d, \"algo_id\": %llu, \"tile\": %llu, "
                  "\"splitk\": %llu, \"reduction\": %llu, \"swizzle\": %llu, \"custom\": %llu, \"stages\": %llu, "
                  "\"cluster\": %llu, \"bits_as_first\": %s, \"runs\": %d, \"runs_with_other_bits\": %d}",
              (*rows)++ ? "," : "", x->matrix, x->pass, i, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7],
              alone == want ? "true" : "false", runs, differ);
  }
  free(host);
  CHECK(cudaStreamDestroy(main_s));
  CHECK(cudaStreamDestroy(side_s));
  plan_free(&P);
}

static int int_arg(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) {
    fprintf(stderr, "gemm_algorithms: %s needs a value\n", argv[*i]);
    exit(2);
  }
  char *end = NULL;
  long v = strtol(argv[++*i], &end, 10);
  if (!end || *end || v <= 0 || v > 1 << 20) {
    fprintf(stderr, "gemm_algorithms: %s expects a positive integer, not '%s'\n", argv[*i - 1], argv[*i]);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char **argv) {
  int tokens = 4096, d = 2560, f = 10240, vocab = 10000, layers = 32;
  float sustain = 120;
  int bits = 0, busy_mb = 32;
  const char *json = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--tokens")) tokens = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--d-model")) d = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--d-ff")) f = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--vocab")) vocab = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--layers")) layers = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--sustain-ms")) sustain = (float)int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--bits")) bits = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--busy-mb")) busy_mb = int_arg(argc, argv, &i);
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--tokens N] [--d-model N] [--d-ff N] [--vocab N] [--layers N] [--sustain-ms N] "
                      "[--bits N] [--busy-mb N] [--json PATH]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    fprintf(stderr, "gemm_algorithms: no CUDA device\n");
    return 1;
  }
  /* the engine's weight matrices: (out, in) and how many of each a model has */
  const char *names[5] = {"qkv", "out", "w13", "w2", "lm_head"};
  const int outs[5] = {3 * d, d, 2 * f, d, vocab}, ins[5] = {d, d, d, f, d};
  const int counts[5] = {layers, layers, layers, layers, 1};
  product xs[15];
  size_t most_ab = 0, most_c = 0; /* elements of the largest operand and result */
  for (int w = 0; w < 5; w++) {
    const int o = outs[w], in = ins[w], c = counts[w];
    xs[3 * w + 0] = (product){names[w], "forward", o, tokens, in, true, false, false, c};
    xs[3 * w + 1] = (product){names[w], "weight gradient", in, o, tokens, false, true, true, c};
    xs[3 * w + 2] = (product){names[w], "input gradient", in, tokens, o, false, false, false, c};
  }
  for (int s = 0; s < 15; s++) {
    const size_t m = (size_t)xs[s].m, n = (size_t)xs[s].n, k = (size_t)xs[s].k;
    if (m * k > most_ab) most_ab = m * k;
    if (k * n > most_ab) most_ab = k * n;
    if (m * n > most_c) most_c = m * n;
  }
  bench B;
  memset(&B, 0, sizeof B);
  B.sustain_ms = sustain;
  B.ws_bytes = (size_t)32 << 20; /* the engine's workspace */
  CHECK(cublasLtCreate(&B.lt));
  CHECK(cudaMalloc(&B.ws, B.ws_bytes));
  CHECK(cudaMalloc(&B.a, most_ab * 2));
  CHECK(cudaMalloc(&B.b, most_ab * 2));
  CHECK(cudaMalloc(&B.c, most_c * 4));
  fill_kernel<<<1024, 256>>>((__nv_bfloat16 *)B.a, most_ab, 1);
  fill_kernel<<<1024, 256>>>((__nv_bfloat16 *)B.b, most_ab, 2);
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaEventCreate(&B.e0));
  CHECK(cudaEventCreate(&B.e1));

  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  if (bits) {
    const size_t spare_n = (size_t)busy_mb << 18; /* floats in busy_mb MiB */
    float *spare = NULL;
    CHECK(cudaMalloc(&spare, spare_n * sizeof *spare));
    CHECK(cudaMemset(spare, 0, spare_n * sizeof *spare));
    FILE *js = json ? fopen(json, "w") : NULL;
    if (js)
      fprintf(js, "{\"env\": {\"device\": \"%s\", \"driver\": %d, \"cuda_runtime\": %d, \"cublaslt\": %zu, "
                  "\"commit\": \"%s\", \"options\": {\"tokens\": %d, \"d_model\": %d, \"d_ff\": %d, \"vocab\": %d, "
                  "\"bits\": %d}},\n \"results\": [",
              prop.name, driver, runtime, cublasLtGetVersion(), tf_commit, tokens, d, f, vocab, bits);
    printf("# cuBLASLt's first %d algorithms, bf16, %s (commit %s): bits alone and beside a memory-bound kernel\n\n"
           "| matrix | product | algorithm | id | tile | split-K | reduction | swizzle | custom | stages | cluster "
           "| bits alone vs the first | runs beside with other bits |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
           CANDIDATES, prop.name, tf_commit);
    int rows = 0;
    for (int s = 0; s < 15; s++) bits_product(&B, &xs[s], bits, spare, spare_n, js, &rows);
    if (js) fprintf(js, "]}\n"), fclose(js);
    return 0;
  }
  printf("# cuBLASLt's first %d algorithms, bf16, %s (commit %s)\n\n", CANDIDATES, prop.name, tf_commit);
  printf("| matrix | product | m | n | k | first, burst | first, sustained | fastest in bursts | its sustained "
         "| fastest sustained | its sustained | sustained / burst |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  FILE *js = json ? fopen(json, "w") : NULL;
  if (json && !js) {
    fprintf(stderr, "gemm_algorithms: cannot write %s\n", json);
    return 1;
  }
  if (js)
    fprintf(js, "{\"env\": {\"device\": \"%s\", \"driver\": %d, \"cuda_runtime\": %d, \"cublaslt\": %zu, "
                "\"commit\": \"%s\", \"options\": {\"tokens\": %d, \"d_model\": %d, \"d_ff\": %d, \"vocab\": %d, "
                "\"layers\": %d, \"sustain_ms\": %g, \"candidates\": %d}},\n \"results\": [",
            prop.name, driver, runtime, cublasLtGetVersion(), tf_commit, tokens, d, f, vocab, layers, sustain,
            CANDIDATES);
  double step_first = 0, step_burst = 0, step_sustained = 0;
  for (int s = 0; s < 15; s++) {
    const product *x = &xs[s];
    timing t[CANDIDATES];
    const int n = time_product(&B, x, t);
    if (n == 0) {
      printf("| %s | %s | %d | %d | %d | no algorithm ran | | | | | | |\n", x->matrix, x->pass, x->m, x->n, x->k);
      continue;
    }
    int bb = 0, bs = 0; /* the burst choice keeps the first unless 2 % faster, as the engine does */
    for (int j = 1; j < n; j++) {
      if (t[j].burst < 0.98f * t[bb].burst) bb = j;
      if (t[j].sustained < t[bs].sustained) bs = j;
    }
    printf("| %s | %s | %d | %d | %d | %.4f | %.4f | #%d | %.4f | #%d | %.4f | %.3f |\n", x->matrix, x->pass, x->m,
           x->n, x->k, t[0].burst, t[0].sustained, t[bb].index, t[bb].sustained, t[bs].index, t[bs].sustained,
           t[0].sustained / t[0].burst);
    step_first += t[0].sustained * x->per_step;
    step_burst += t[bb].sustained * x->per_step;
    step_sustained += t[bs].sustained * x->per_step;
    if (js) {
      fprintf(js, "%s\n  {\"matrix\": \"%s\", \"product\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"per_step\": %d, "
                  "\"burst_chosen\": %d, \"sustained_best\": %d, \"algorithms\": [", s ? "," : "", x->matrix, x->pass,
              x->m, x->n, x->k, x->per_step, t[bb].index, t[bs].index);
      for (int j = 0; j < n; j++)
        fprintf(js, "%s{\"index\": %d, \"burst_ms\": %.5f, \"sustained_ms\": %.5f}", j ? ", " : "", t[j].index,
                t[j].burst, t[j].sustained);
      fprintf(js, "]}");
    }
  }
  printf("\nA step's products (each matrix's three once a layer), sustained: the heuristic's first choices %.2f ms, "
         "the burst timing's choices %.2f ms, the fastest sustained %.2f ms.\n", step_first, step_burst,
         step_sustained);
  if (js) {
    fprintf(js, "],\n \"step_ms\": {\"first\": %.4f, \"burst_chosen\": %.4f, \"sustained_best\": %.4f}}\n", step_first,
            step_burst, step_sustained);
    fclose(js);
    printf("wrote %s\n", json);
  }
  return 0;
}
