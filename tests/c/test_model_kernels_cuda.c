/* The Transformer engine on the GPU against its CPU twins, so that one run
 * tells everything (the seed is printed; TF_TEST_SEED repeats a run):
 *   - every kernel of model_kernels.h on the same random inputs on both
 *     backends, f32 / f16 / bf16, at shapes covering each kernel path
 *     (16-byte vectors and scalar fallbacks, misaligned buffers, many short
 *     rows, few long ones), the GEMM through cuBLASLt and through plain
 *     cuBLAS: f32 within 1e-5 relative error, f16/bf16 outputs within 1e-2
 *     (one rounding apart); the embedding's gradient bit-identical;
 *   - whole models, GPU vs CPU from the same seed: identical parameters,
 *     then logits, loss, gradients and two AdamW steps (f32: 1e-5, 1e-5,
 *     1e-4, 1e-5; bf16/f16: logits 2e-2, loss 5e-3, gradients 1e-1 and
 *     parameters 5e-2, where one rounding flip of a tiny gradient moves an
 *     AdamW update by up to 2 lr), both GEMM paths; an FP8 model (logits
 *     0.1, gradients 0.3: e4m3's rounding flips, see model_case);
 *   - FP8 training's amax and cast kernels bit-identical (both formats,
 *     both layouts, zeros, a NaN), and delayed scaling's recording cast
 *     and history step;
 *   - global gradient-norm clipping: the norm kernel's norm and factor
 *     bit-identical, the engine's AdamW reading the factor within 1e-6;
 *   - the GEMM's timed choice of algorithm: the product of a timed call has
 *     the bits of the heuristic's first algorithm, however the clock chose;
 *     a product added into C and a call under capture are not timed;
 *   - bit-identical losses run to run, stable memory across steps, input
 *     errors with the CPU's messages and the GPU usable afterwards;
 *   - a table of the worst errors, then (unless TF_TEST_SMALL is set, for
 *     compute-sanitizer runs) timings of the small preset, batch 4, at
 *     T = 128 and 512, f32 and bf16.
 * Exits 77 without a GPU. */

#include "backend.h"
#include "backends.h"
#include "clock.h"
#include "model.h"
#include "model_kernels.h"
#include "err_table.h"
#include "gpu_twins.h"

static tf_device_ctx *cctx, *gctx;
static const tf_model_kernels *KC, *KG;
static bool small_run;
static const tf_dtype DTYPES[3] = {TF_F32, TF_F16, TF_BF16};

static double tol_of(tf_dtype d) { return d == TF_F32 ? 1e-5 : 1e-2; }

/* ---- the worst error per (check, dtype), printed at the end ------------------------------ */


/* ---- buffers on both devices ------------------------------------------------------------------ */

static flat_pair flat_pair_zeros(int64_t n, tf_dtype d) {
  double *v = values_alloc(n);
  flat_pair p = flat_pair_of(v, n, d, 0);
  free(v);
  return p;
}

static flat_pair flat_pair_ints(int64_t n, int64_t lo, int64_t hi) {
  double *v = values_alloc(n);
  for (int64_t i = 0; i < n; i++) v[i] = (double)rng_int(lo, hi);
  flat_pair p = flat_pair_of(v, n, TF_I64, 0);
  free(v);
  return p;
}

/* GPU values against CPU values (normwise relative error), recorded. */
static bool same_values(const char *op, tf_dtype d, const double *g, const double *c, int64_t n, double tol) {
  double e = rel_error(g, c, n);
  record(op, d, e, tol);
  if (!(e <= tol)) fprintf(stderr, "FAIL %s %s: relative error %.3g > %.3g\n", op, tf_dtype_name(d), e, tol);
  return CHECK(e <= tol);
}

static bool same(const char *op, tf_dtype d, flat_pair p, double tol) {
  double *g = tensor_values(p.g), *c = tensor_values(p.c);
  bool ok = same_values(op, d, g + p.off, c + p.off, p.n, tol);
  free(g), free(c);
  return ok;
}

static bool identical(const char *op, flat_pair p) {
  double *g = tensor_values(p.g), *c = tensor_values(p.c);
  bool ok = memcmp(g, c, sizeof(double) * (size_t)(p.n + p.off)) == 0;
  record(op, p.d, ok ? 0 : INFINITY, 0);
  if (!ok) fprintf(stderr, "FAIL %s: GPU and CPU differ in some bits\n", op);
  free(g), free(c);
  return CHECK(ok);
}

/* n values of two tensors of one dtype, from elements ao and bo, with the
 * same bits (as doubles, which hold every f32, f16 and bf16 value exactly). */
static bool same_bits(const char *op, const tf_tensor *a, int64_t ao, const tf_tensor *b, int64_t bo, int64_t n) {
  double *x = tensor_values(a), *y = tensor_values(b);
  bool ok = memcmp(x + ao, y + bo, sizeof(double) * (size_t)n) == 0;
  if (!ok) fprintf(stderr, "FAIL %s: results differ in some bits\n", op);
  free(x), free(y);
  return CHECK(ok);
}

/* ---- gemm ------------------------------------------------------------------------------------- */

static void gemm_case(tf_dtype d, int64_t batch, int64_t m, int64_t n, int64_t k, int variant, int64_t off, bool lt) {
  const bool ta = variant & 1, tb = variant & 2, acc = variant & 4, c32 = acc || (variant & 8) || d == TF_F32;
  const tf_dtype cd = c32 ? TF_F32 : d;
  const int64_t arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n, pad = 8;
  const int64_t lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
  const int64_t sa = arows * lda, sb = brows * ldb, sc = m * ldc;
  flat_pair a = flat_pair_randn(batch * sa, d, 1.0, off), b = flat_pair_randn(batch * sb, d, 1.0, off),
       c = flat_pair_randn(batch * sc, cd, 1.0, off);
  tf_gemm_args g = {.ab_dtype = d, .c_dtype = cd, .batch = batch, .m = m, .n = n, .k = k, .trans_a = ta,
                    .trans_b = tb, .lda = lda, .ldb = ldb, .ldc = ldc, .batch_a = sa, .batch_b = sb,
                    .batch_c = sc, .accumulate = acc};
  g.a = CP(a), g.b = CP(b), g.c = CP(c);
  CHECK_OK(KC->gemm(cctx, &g));
  g.a = GP(a), g.b = GP(b), g.c = GP(c);
  KG->gemm_use_lt(gctx, lt);
  CHECK_OK(KG->gemm(gctx, &g));
  char op[48];
  snprintf(op, sizeof op, "gemm %s%s%s", lt ? "cublasLt" : "cublas", c32 && d != TF_F32 ? " f32 out" : "",
           acc ? " accumulate" : "");
  same(op, d, c, c32 ? 1e-5 : tol_of(d));
  flat_pair_free(&a), flat_pair_free(&b), flat_pair_free(&c);
}

static void test_gemm(void) {
  const int64_t shapes[][4] = {{1, 64, 96, 128}, {4, 33, 17, 19}, {2, 128, 128, 64}, {24, 16, 16, 64}};
  for (int lt = 0; lt < 2; lt++)
    for (int di = 0; di < 3; di++)
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int variant = 0; variant < 16; variant++) {
          if ((variant & 8) && DTYPES[di] == TF_F32) continue;
          gemm_case(DTYPES[di], shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], variant, 0, lt);
        }
  for (int lt = 0; lt < 2; lt++) /* misaligned operands: Lt must pick a plan for their alignment */
    for (int di = 0; di < 3; di++) gemm_case(DTYPES[di], 2, 40, 24, 32, 5, 1, lt);
  KG->gemm_use_lt(gctx, true);
}

/* The few-rows products of generation's decode step (tf_gemm_args.few_rows):
 * C = A B^T of m <= 16 rows, the GPU's own kernel (one row: 1, 2, 4 or 8
 * warps a column, a stretch a warp) against the CPU's GEMM, launched
 * chained or plainly; a misaligned k (not a multiple of 8) takes the
 * general path. */
static void few_rows_case(tf_dtype d, int64_t m, int64_t n, int64_t k, bool chained) {
  flat_pair a = flat_pair_randn(m * k, d, 1.0, 0), b = flat_pair_randn(n * k, d, 1.0, 0), c = flat_pair_zeros(m * n, d);
  tf_gemm_args g = {.ab_dtype = d, .c_dtype = d, .batch = 1, .m = m, .n = n, .k = k, .trans_b = true, .lda = k,
                    .ldb = k, .ldc = n, .few_rows = true, .chained = chained};
  g.a = CP(a), g.b = CP(b), g.c = CP(c);
  CHECK_OK(KC->gemm(cctx, &g));
  g.a = GP(a), g.b = GP(b), g.c = GP(c);
  CHECK_OK(KG->gemm(gctx, &g));
  same("gemm few rows", d, c, tol_of(d));
  flat_pair_free(&a), flat_pair_free(&b), flat_pair_free(&c);
}

static void test_gemm_few_rows(void) {
  /* one row: 2.7B's qkv and w2 (two and eight warps a column), a last block of columns cut, a last round
   * cut (k 264, 2056), one warp a column (k 768), rows longer than eight rounds a warp (k 40000) */
  const int64_t shapes[][3] = {{1, 7680, 2560}, {1, 2560, 10240}, {1, 1001, 2560}, {1, 33, 264},  {1, 5, 2056},
                               {1, 300, 768},   {1, 7, 40000},    {3, 100, 64},   {4, 33, 264}, {16, 10000, 768},
                               {9, 129, 3072},  {2, 50, 20}};
  for (int di = 1; di < 3; di++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int chained = 0; chained < 2; chained++)
        few_rows_case(DTYPES[di], shapes[s][0], shapes[s][1], shapes[s][2], chained);
}

/* A product timed at its first call (tune) against the same product on the
 * heuristic's first algorithm (a call before it made the plan untimed):
 * the same bits. The plan is new, so the timed call goes through the
 * choice once; a second timed call does not. */
static void gemm_timed_case(tf_dtype d, bool c32, bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  const tf_dtype cd = c32 ? TF_F32 : d;
  flat_pair a = flat_pair_randn(m * k, d, 1.0, 0), b = flat_pair_randn(k * n, d, 1.0, 0);
  flat_pair first = flat_pair_zeros(m * n, cd), timed = flat_pair_zeros(m * n, cd);
  tf_gemm_args g = {.ab_dtype = d, .c_dtype = cd, .batch = 1, .m = m, .n = n, .k = k, .trans_a = ta, .trans_b = tb,
                    .lda = ta ? m : k, .ldb = tb ? k : n, .ldc = n, .a = GP(a), .b = GP(b), .c = GP(first)};
  CHECK_OK(KG->gemm(gctx, &g));
  tf_gemm_tuning before, after, again;
  KG->gemm_tuning(gctx, &before);
  g.tune = true, g.c = GP(timed);
  CHECK_OK(KG->gemm(gctx, &g));
  KG->gemm_tuning(gctx, &after);
  CHECK(after.plans == before.plans + 1);
  CHECK_OK(KG->gemm(gctx, &g));
  KG->gemm_tuning(gctx, &again);
  CHECK(again.plans == after.plans && again.candidates == after.candidates);
  double *x = tensor_values(first.g), *y = tensor_values(timed.g);
  const bool bits = memcmp(x, y, sizeof(double) * (size_t)(m * n)) == 0;
  if (!bits) fprintf(stderr, "FAIL gemm timed %s %lldx%lldx%lld: other bits than the first algorithm's\n",
                     tf_dtype_name(d), (long long)m, (long long)n, (long long)k);
  CHECK(bits);
  printf("gemm timed %-4s %s%s%s %5lld x %5lld x %5lld: %d other algorithms, %d with other bits, %s\n",
         tf_dtype_name(d), c32 ? "f32 out " : "", ta ? "a^T " : "", tb ? "b^T " : "", (long long)m, (long long)n,
         (long long)k, after.candidates - before.candidates, after.other_bits - before.other_bits,
         after.changed > before.changed ? "another chosen" : "the first kept");
  free(x), free(y);
  flat_pair_free(&a), flat_pair_free(&b), flat_pair_free(&first), flat_pair_free(&timed);
}

/* Not timed: a product added into C (it would be added once per
 * candidate), and a call while the stream is captured (the plan is timed
 * at the next eager call instead). */
static void gemm_untimed_cases(void) {
  const int64_t m = 256, n = 384, k = 512;
  flat_pair a = flat_pair_randn(m * k, TF_BF16, 1.0, 0), b = flat_pair_randn(k * n, TF_BF16, 1.0, 0);
  flat_pair c = flat_pair_randn(m * n, TF_F32, 1.0, 0);
  tf_gemm_args g = {.ab_dtype = TF_BF16, .c_dtype = TF_F32, .batch = 1, .m = m, .n = n, .k = k, .trans_b = true,
                    .lda = k, .ldb = k, .ldc = n, .accumulate = true, .tune = true};
  tf_gemm_tuning before, after;
  KG->gemm_tuning(gctx, &before);
  g.a = CP(a), g.b = CP(b), g.c = CP(c);
  CHECK_OK(KC->gemm(cctx, &g));
  g.a = GP(a), g.b = GP(b), g.c = GP(c);
  CHECK_OK(KG->gemm(gctx, &g));
  same("gemm accumulate, tune asked", TF_F32, c, 1e-5);
  KG->gemm_tuning(gctx, &after);
  CHECK(after.plans == before.plans);
  /* under capture: queued on the first algorithm, nothing timed */
  g.accumulate = false, g.m = 320;
  flat_pair c2 = flat_pair_zeros(g.m * n, TF_F32), a2 = flat_pair_randn(g.m * k, TF_BF16, 1.0, 0);
  g.a = GP(a2), g.c = GP(c2);
  CHECK_OK(KG->capture_begin(gctx));
  const tf_status queued = KG->gemm(gctx, &g);
  tf_graph *graph = NULL;
  CHECK_OK(KG->capture_end(gctx, &graph));
  CHECK_OK(queued);
  KG->gemm_tuning(gctx, &after);
  CHECK(after.plans == before.plans);
  if (graph) CHECK_OK(KG->graph_launch(gctx, graph));
  KG->graph_destroy(gctx, graph);
  g.a = CP(a2), g.b = CP(b), g.c = CP(c2);
  CHECK_OK(KC->gemm(cctx, &g));
  same("gemm captured, tune asked", TF_F32, c2, 1e-5);
  g.a = GP(a2), g.b = GP(b), g.c = GP(c2);
  CHECK_OK(KG->gemm(gctx, &g)); /* eager now: timed */
  KG->gemm_tuning(gctx, &after);
  CHECK(after.plans == before.plans + 1);
  same("gemm timed after capture", TF_F32, c2, 1e-5);
  flat_pair_free(&a), flat_pair_free(&b), flat_pair_free(&c), flat_pair_free(&c2), flat_pair_free(&a2);
}

static void test_gemm_timed(void) {
  KG->gemm_use_lt(gctx, true);
  /* the engine's products at small-model sizes and a larger one: forward
   * (b^T), the weight gradient into f32 (a^T) and the input gradient */
  const int64_t shapes[][3] = {{512, 2304, 768}, {768, 768, 512}, {512, 768, 3072}, {2048, 4096, 1024}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    gemm_timed_case(TF_BF16, false, false, true, m, n, k);
    gemm_timed_case(TF_BF16, true, true, false, m, n, k);
    gemm_timed_case(TF_BF16, false, false, false, m, n, k);
  }
  gemm_timed_case(TF_F32, true, false, true, 512, 768, 768);
  gemm_timed_case(TF_F16, false, false, true, 333, 250, 130);
  gemm_untimed_cases();
}

/* ---- rmsnorm ---------------------------------------------------------------------------------- */

/* With ws, the GPU's backward gets the planned workspace (where the shape
 * allows, dx and the gain's gradient then come from one fused pass). */
/* One shape: the forward pass, then the backward pass from the CPU's
 * statistics on both sides, on the GPU once with its workspace kernel and
 * once without (the inputs made once: the CPU side is the slow one). */
static void rmsnorm_case(tf_dtype d, int64_t rows, int64_t dim, bool delta, bool accumulate, int64_t off) {
  flat_pair x = flat_pair_randn(rows * dim, TF_F32, 1.5, off), dl = flat_pair_randn(rows * dim, d, 1.0, off);
  flat_pair g = flat_pair_randn(dim, TF_F32, 1.0, 0);
  flat_pair xo = flat_pair_zeros(rows * dim, TF_F32), h = flat_pair_zeros(rows * dim, d);
  flat_pair rstd = flat_pair_zeros(rows, TF_F32);
  tf_rmsnorm_args a = {.rows = rows, .dim = dim, .eps = 1e-5, .dtype = d};
#define RMS_FWD(P)                                                                             \
  a.x = P(x), a.delta = delta ? P(dl) : NULL, a.x_out = delta ? P(xo) : NULL, a.g = P(g), a.h = P(h), \
  a.rstd = P(rstd)
  RMS_FWD(CP);
  CHECK_OK(KC->rmsnorm(cctx, &a));
  RMS_FWD(GP);
  CHECK_OK(KG->rmsnorm(gctx, &a));
#undef RMS_FWD
  if (delta) same("rmsnorm x + delta", TF_F32, xo, 1e-7);
  same("rmsnorm h", d, h, tol_of(d));
  same("rmsnorm rstd", TF_F32, rstd, 1e-5);
  /* again from each side's kept rstd with the same delta (the backward pass's recomputed norms,
   * rstd_given): each side's x_out and h bits, and h near the other side's */
  {
    flat_pair h2 = flat_pair_zeros(rows * dim, d), xo2 = flat_pair_zeros(rows * dim, TF_F32);
    tf_rmsnorm_args again = {.rows = rows, .dim = dim, .eps = 1e-5, .dtype = d, .rstd_given = true};
#define RMS_AGAIN(P)                                                                                 \
  again.x = P(x), again.delta = delta ? P(dl) : NULL, again.x_out = delta ? P(xo2) : NULL, again.g = P(g), \
  again.h = P(h2), again.rstd = P(rstd)
    RMS_AGAIN(CP);
    CHECK_OK(KC->rmsnorm(cctx, &again));
    RMS_AGAIN(GP);
    CHECK_OK(KG->rmsnorm(gctx, &again));
#undef RMS_AGAIN
    same("rmsnorm h from the kept rstd", d, h2, tol_of(d));
    same_bits("rmsnorm h from the kept rstd (GPU)", h2.g, h2.off, h.g, h.off, h.n);
    same_bits("rmsnorm h from the kept rstd (CPU)", h2.c, h2.off, h.c, h.off, h.n);
    if (delta) {
      same_bits("rmsnorm x + delta from the kept rstd (GPU)", xo2.g, xo2.off, xo.g, xo.off, xo.n);
      same_bits("rmsnorm x + delta from the kept rstd (CPU)", xo2.c, xo2.off, xo.c, xo.off, xo.n);
    }
    flat_pair_free(&h2), flat_pair_free(&xo2);
  }
  /* backward: dres and dg are added to (accumulate) or written, so each GPU run starts from copies of the same
   * values, and its dres_low from zeros */
  double *dres_v = random_values(rows * dim, TF_F32, 1.0), *dg_v = random_values(dim, TF_F32, 1.0);
  flat_pair dh = flat_pair_randn(rows * dim, d, 1.0, off), dres = flat_pair_of(dres_v, rows * dim, TF_F32, off);
  flat_pair low = flat_pair_zeros(rows * dim, d), dg = flat_pair_of(dg_v, dim, TF_F32, 0);
  tf_tensor *rc = NULL;
  CHECK_OK(tf_to(rstd.c, TF_F32, GPU, &rc));
  tf_rmsnorm_args b = {.backward = true, .rows = rows, .dim = dim, .eps = 1e-5, .dtype = d, .accumulate = accumulate};
  flat_pair *xs = delta ? &xo : &x;
  b.x = CP(*xs), b.g = CP(g), b.rstd = CP(rstd), b.dh = CP(dh), b.dres = CP(dres), b.dres_low = CP(low),
  b.dg = CP(dg);
  CHECK_OK(KC->rmsnorm(cctx, &b));
  tf_tensor *xg = NULL;
  CHECK_OK(tf_to(xs->c, TF_F32, GPU, &xg)); /* the CPU's x_out, so both start alike */
  for (int ws = 0; ws < 2; ws++) {
    /* the second run's GPU buffers, paired with the CPU's results */
    flat_pair dres2 = dres, low2 = low, dg2 = dg, fresh[3] = {{0}};
    if (ws) {
      fresh[0] = flat_pair_of(dres_v, rows * dim, TF_F32, off), fresh[1] = flat_pair_zeros(rows * dim, d);
      fresh[2] = flat_pair_of(dg_v, dim, TF_F32, 0);
      dres2.g = fresh[0].g, low2.g = fresh[1].g, dg2.g = fresh[2].g;
    }
    b.x = (float *)tf_tensor_data(xg) + xs->off, b.g = GP(g), b.rstd = tf_tensor_data(rc), b.dh = GP(dh),
    b.dres = GP(dres2), b.dres_low = GP(low2), b.dg = GP(dg2), b.workspace = NULL;
    tf_tensor *work = NULL;
    const size_t work_bytes = ws ? KG->rmsnorm_workspace(gctx, &b) : 0;
    if (work_bytes) {
      const tf_shape ws_shape = {1, {(int64_t)work_bytes}};
      CHECK_OK(tf_tensor_empty(&ws_shape, TF_BOOL, GPU, &work));
      b.workspace = tf_tensor_data(work);
    }
    CHECK_OK(KG->rmsnorm(gctx, &b));
    tf_tensor_release(work);
    same("rmsnorm backward dres", TF_F32, dres2, 1e-5);
    same("rmsnorm backward dres_low", d, low2, tol_of(d));
    same("rmsnorm backward dg", TF_F32, dg2, 2e-5);
    for (int i = 0; i < 3; i++) flat_pair_free(&fresh[i]);
  }
  free(dres_v), free(dg_v);
  tf_tensor_release(rc), tf_tensor_release(xg);
  flat_pair_free(&x), flat_pair_free(&dl), flat_pair_free(&g);
  flat_pair_free(&xo), flat_pair_free(&h), flat_pair_free(&rstd);
  flat_pair_free(&dh), flat_pair_free(&dres), flat_pair_free(&low), flat_pair_free(&dg);
}

static void test_rmsnorm(void) {
  /* 1000 x 3000 and 1000 x 4000: 3 and 4 vector steps a thread in the register-held kernels, with
   * more rows than the backward's one-pass kernel has blocks (at most 5 and 4 resident a
   * multiprocessor: 660 and 528 on a GPU of 132; 2200 rows took most of this test's 110 s on an
   * H200, the CPU side being the slow one); then rows of 2 and 3 vector steps a thread in the
   * forward's block-a-row kernel, and past them (the row-group kernels; the backward's one-pass
   * kernel takes up to 4096 columns) */
  const int64_t shapes[][2] = {{37, 768}, {5, 100}, {4096, 64}, {3, 5000}, {600, 1600}, {512, 768}, {300, 2560},
                               {1000, 3000}, {1000, 4000}, {300, 8192}, {3, 8200}, {2, 24576}, {2, 24584}};
  for (int di = 0; di < 3; di++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int v = 0; v < 4; v++) rmsnorm_case(DTYPES[di], shapes[s][0], shapes[s][1], v & 1, v & 2, 0);
  for (int di = 0; di < 3; di++) rmsnorm_case(DTYPES[di], 9, 64, true, true, 1);
}

/* ---- swiglu ---------------------------------------------------------------------------------- */

static void swiglu_case(tf_dtype d, int64_t rows, int64_t f, int64_t off) {
  flat_pair ab = flat_pair_randn(rows * 2 * f, d, 2.0, off), y = flat_pair_zeros(rows * f, d);
  flat_pair dy = flat_pair_randn(rows * f, d, 1.0, off);
  flat_pair dab = flat_pair_zeros(rows * 2 * f, d);
  tf_swiglu_args a = {.rows = rows, .f = f, .dtype = d, .ab = CP(ab), .y = CP(y)};
  CHECK_OK(KC->swiglu(cctx, &a));
  a.ab = GP(ab), a.y = GP(y);
  CHECK_OK(KG->swiglu(gctx, &a));
  same("swiglu", d, y, tol_of(d));
  tf_swiglu_args b = {.backward = true, .rows = rows, .f = f, .dtype = d, .ab = CP(ab), .dy = CP(dy), .dab = CP(dab)};
  CHECK_OK(KC->swiglu(cctx, &b));
  b.ab = GP(ab), b.dy = GP(dy), b.dab = GP(dab);
  CHECK_OK(KG->swiglu(gctx, &b));
  same("swiglu backward", d, dab, tol_of(d));
  /* the engine's form: y again over dy and d[a | b] over [a | b], in one
   * pass; the same values as above, and y with the forward pass's bits */
  double *abv = tensor_values(ab.c), *dyv = tensor_values(dy.c);
  flat_pair io = flat_pair_of(abv + off, rows * 2 * f, d, off), yio = flat_pair_of(dyv + off, rows * f, d, off);
  tf_swiglu_args fu = {.backward = true, .rows = rows, .f = f, .dtype = d, .ab = CP(io), .dy = CP(yio),
                       .dab = CP(io), .y = CP(yio)};
  CHECK_OK(KC->swiglu(cctx, &fu));
  fu.ab = fu.dab = GP(io), fu.dy = fu.y = GP(yio);
  CHECK_OK(KG->swiglu(gctx, &fu));
  same("swiglu backward with y", d, io, tol_of(d));
  same_bits("swiglu backward with y: d[a | b] (GPU)", io.g, io.off, dab.g, dab.off, dab.n);
  same_bits("swiglu backward with y: d[a | b] (CPU)", io.c, io.off, dab.c, dab.off, dab.n);
  same_bits("swiglu backward with y: y (GPU)", yio.g, yio.off, y.g, y.off, y.n);
  same_bits("swiglu backward with y: y (CPU)", yio.c, yio.off, y.c, y.off, y.n);
  free(abv), free(dyv);
  flat_pair_free(&io), flat_pair_free(&yio);
  flat_pair_free(&ab), flat_pair_free(&y), flat_pair_free(&dy), flat_pair_free(&dab);
}

static void test_swiglu(void) {
  for (int di = 0; di < 3; di++) {
    swiglu_case(DTYPES[di], 64, 3072, 0);
    swiglu_case(DTYPES[di], 7, 13, 0);
    swiglu_case(DTYPES[di], 5, 64, 1);
  }
}

/* ---- FP8 training's casts ------------------------------------------------------------------------ */

/* Kernel fn of both backends on args, its pointers set by SET(CP), then SET(GP). */
#define ON_BOTH(fn, args, SET)                 \
  do {                                         \
    SET(CP);                                   \
    CHECK_OK(KC->fn(cctx, &(args)));           \
    SET(GP);                                   \
    CHECK_OK(KG->fn(gctx, &(args)));           \
  } while (0)

/* amax and the current-scaling cast (both layouts, both formats) give the CPU's bits, on random
 * values at the given magnitude, on zeros (amax 0: q = 1), with a NaN (amax NaN, counted) and (3)
 * on every bf16 bit pattern, NaNs and infinities among them (amax NaN: each value cast as it is). */
static void fp8_case(tf_dtype d, int64_t rows, int64_t cols, double magnitude, int special) {
  const int64_t n = rows * cols;
  flat_pair x = special == 1 ? flat_pair_zeros(n, d) : flat_pair_randn(n, d, magnitude, 0);
  if (special == 3) {
    double *v = values_alloc(n);
    for (int64_t i = 0; i < n; i++) {
      const uint32_t bits = (uint32_t)(i % 65536) << 16;
      float f;
      memcpy(&f, &bits, sizeof f);
      v[i] = f;
    }
    flat_pair_free(&x);
    x = flat_pair_of(v, n, d, 0);
    free(v);
  }
  if (special == 2) {
    double *v = tensor_values(x.c);
    v[n / 3] = NAN;
    flat_pair_free(&x);
    x = flat_pair_of(v, n, d, 0);
    free(v);
  }
  flat_pair amax = flat_pair_zeros(1, TF_F32), scale = flat_pair_zeros(1, TF_F32), count = flat_pair_zeros(1, TF_I32);
  tf_fp8_amax_args aa = {.count = n, .dtype = d};
#define AMAX_PTRS(P) aa.x = P(x), aa.amax = P(amax)
  ON_BOTH(fp8_amax, aa, AMAX_PTRS);
#undef AMAX_PTRS
  identical("fp8 amax", amax);
  for (int f = 0; f < 2; f++)
    for (int layout = 0; layout < 3; layout++) { /* row-major, transposed, both */
      const tf_dtype fmt = f ? TF_F8E5M2 : TF_F8E4M3;
      flat_pair out = flat_pair_zeros(n, fmt), out_t = flat_pair_zeros(n, fmt);
      tf_fp8_quantize_args q = {.rows = rows, .cols = cols, .dtype = d, .fp8 = fmt};
#define FP8_PTRS(P)                                                                                          \
  q.x = P(x), q.amax = P(amax), q.scale = P(scale), q.nonfinite = P(count), q.out = layout != 1 ? P(out) : NULL, \
  q.out_t = layout != 0 ? P(out_t) : NULL
      ON_BOTH(fp8_quantize, q, FP8_PTRS);
#undef FP8_PTRS
      if (layout != 1) identical(f ? "fp8 quantize e5m2" : "fp8 quantize e4m3", out);
      if (layout != 0) identical(f ? "fp8 quantize e5m2, transposed" : "fp8 quantize e4m3, transposed", out_t);
      identical("fp8 quantize's scale", scale);
      flat_pair_free(&out), flat_pair_free(&out_t);
    }
  { /* delayed scaling's cast records its input's amax as it casts (both layouts at once) */
    flat_pair out = flat_pair_zeros(n, TF_F8E4M3), out_t = flat_pair_zeros(n, TF_F8E4M3);
    flat_pair rec = flat_pair_zeros(1, TF_F32);
    tf_fp8_quantize_args q = {.rows = rows, .cols = cols, .dtype = d, .fp8 = TF_F8E4M3};
#define REC_PTRS(P) \
  q.x = P(x), q.amax = P(amax), q.scale = P(scale), q.out = P(out), q.out_t = P(out_t), q.record = P(rec)
    ON_BOTH(fp8_quantize, q, REC_PTRS);
#undef REC_PTRS
    identical("fp8 quantize recording, e4m3", out);
    identical("fp8 quantize recording, e4m3 transposed", out_t);
    identical("fp8 quantize's recorded amax, both layouts", rec);
    double *ra = tensor_values(amax.c), *rr = tensor_values(rec.g);
    CHECK((isnan(ra[0]) && isnan(rr[0])) || ra[0] == rr[0]); /* the record is the input's amax */
    free(ra), free(rr);
    flat_pair_free(&out), flat_pair_free(&out_t), flat_pair_free(&rec);
  }
  double *cc = tensor_values(count.c), *cg = tensor_values(count.g);
  CHECK(cc[0] == cg[0] && cc[0] == (special >= 2 ? 6 : 0)); /* six casts of a NaN amax counted, none otherwise */
  free(cc), free(cg);
  flat_pair_free(&x), flat_pair_free(&amax), flat_pair_free(&scale), flat_pair_free(&count);
}

/* Delayed scaling's kernels: a cast recording its amax into a word that holds an earlier one, then
 * the history step over sites with overflows, zeros and a NaN: the CPU's bits. */
static void fp8_history_case(void) {
  const int64_t rows = 48, cols = 64, n = rows * cols, sites = 37, len = 5;
  flat_pair x = flat_pair_randn(n, TF_BF16, 2.0, 0), out = flat_pair_zeros(n, TF_F8E4M3);
  flat_pair use = flat_pair_randn(sites, TF_F32, 1.0, 0), newest = flat_pair_randn(sites, TF_F32, 1.0, 0);
  flat_pair hist = flat_pair_randn(sites * len, TF_F32, 1.0, 0), count = flat_pair_zeros(1, TF_I32);
  flat_pair amax = flat_pair_zeros(1, TF_F32), scale = flat_pair_zeros(1, TF_F32);
  double *u = tensor_values(use.c), *w = tensor_values(newest.c), *h = tensor_values(hist.c);
  for (int64_t i = 0; i < sites; i++) u[i] = fabs(u[i]) * (i % 4 == 0 ? 0 : 1), w[i] = fabs(w[i]);
  for (int64_t i = 0; i < sites * len; i++) h[i] = fabs(h[i]);
  w[5] = NAN;
  u[0] = 0.75; /* the cast's scale: x's own amax is larger (an overflow, saturated) */
  flat_pair_free(&use), flat_pair_free(&newest), flat_pair_free(&hist);
  use = flat_pair_of(u, sites, TF_F32, 0), newest = flat_pair_of(w, sites, TF_F32, 0);
  hist = flat_pair_of(h, sites * len, TF_F32, 0);
  free(u), free(w), free(h);
  tf_fp8_quantize_args q = {.rows = rows, .cols = cols, .dtype = TF_BF16, .fp8 = TF_F8E4M3};
#define HIST_Q(P) q.x = P(x), q.amax = P(use), q.out = P(out), q.scale = P(scale), q.nonfinite = NULL, \
                  q.record = (float *)P(newest) + 1
  ON_BOTH(fp8_quantize, q, HIST_Q);
#undef HIST_Q
  identical("fp8 quantize, delayed (saturating)", out);
  identical("fp8 quantize's recorded amax", newest);
  tf_fp8_history_args a = {.sites = sites, .length = len};
#define HIST_A(P) a.history = P(hist), a.use = P(use), a.newest = P(newest), a.overflows = P(count)
  ON_BOTH(fp8_history, a, HIST_A);
#undef HIST_A
  identical("fp8 history", hist);
  identical("fp8 history's use", use);
  identical("fp8 history's newest (zeroed)", newest);
  identical("fp8 history's overflow count", count);
  flat_pair_free(&x), flat_pair_free(&out), flat_pair_free(&use), flat_pair_free(&newest), flat_pair_free(&hist);
  flat_pair_free(&count), flat_pair_free(&amax), flat_pair_free(&scale);
}

static void test_fp8_kernels(void) {
  fp8_history_case();
  const tf_dtype ds[3] = {TF_F32, TF_BF16, TF_F16};
  for (int di = 0; di < 3; di++) {
    fp8_case(ds[di], 64, 96, 1.0, 0);
    fp8_case(ds[di], 37, 50, 1e-3, 0); /* partial tiles, small values */
    fp8_case(ds[di], 33, 65, 1.0, 1);
    fp8_case(ds[di], 40, 16, 3.0, 2);
    /* 16-bit values: the 128 x 64 tile kernel, with partial tiles both ways, a NaN, zeros */
    fp8_case(ds[di], 144, 200, 1.0, 0);
    fp8_case(ds[di], 272, 136, 2.0, 2);
    fp8_case(ds[di], 16, 8, 1.0, 1);
  }
  fp8_case(TF_F32, 1024, 768, 50.0, 0);
  fp8_case(TF_BF16, 4096, 2560, 5.0, 0); /* the 2.7B model's size: amax's threads take several turns */
  fp8_case(TF_BF16, 256, 256, 1.0, 3);
  fp8_case(TF_BF16, 64, 96, 1e-37, 0); /* max / amax overflows: the largest finite multiplier */
}

/* ---- attention's kernels ------------------------------------------------------------------------ */

/* RoPE's (T, hd / 2) cos and sin tables (theta 10000) on both devices. */
static void rope_tables(int64_t T, int64_t hd, flat_pair *pc, flat_pair *ps) {
  const int64_t half = hd / 2;
  double *cs = values_alloc(T * half), *sn = values_alloc(T * half);
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < half; i++) {
      double ang = (double)t * pow(10000.0, -(double)(2 * i) / (double)hd);
      cs[t * half + i] = (float)cos(ang), sn[t * half + i] = (float)sin(ang);
    }
  *pc = flat_pair_of(cs, T * half, TF_F32, 0), *ps = flat_pair_of(sn, T * half, TF_F32, 0);
  free(cs), free(sn);
}

static void rope_heads_case(tf_dtype d, int64_t B, int64_t T, int64_t H, int64_t hd) {
  const int64_t n = B * T * H * hd;
  flat_pair pc, ps;
  rope_tables(T, hd, &pc, &ps);
  flat_pair qkv = flat_pair_randn(3 * n, d, 1.0, 0);
  flat_pair q = flat_pair_zeros(n, d), k = flat_pair_zeros(n, d), v = flat_pair_zeros(n, d);
  tf_rope_heads_args a = {.batch = B, .seq = T, .heads = H, .head_dim = hd, .dtype = d};
#define ROPE_PTRS(P) a.cos = P(pc), a.sin = P(ps), a.qkv = P(qkv), a.q = P(q), a.k = P(k), a.v = P(v)
  ROPE_PTRS(CP);
  CHECK_OK(KC->rope_heads(cctx, &a));
  ROPE_PTRS(GP);
  CHECK_OK(KG->rope_heads(gctx, &a));
  same("rope_heads q", d, q, tol_of(d));
  same("rope_heads k", d, k, tol_of(d));
  same("rope_heads v", d, v, 0);
  /* backward from fresh gradients */
  flat_pair dq = flat_pair_randn(n, d, 1.0, 0), dk = flat_pair_randn(n, d, 1.0, 0), dv = flat_pair_randn(n, d, 1.0, 0);
  flat_pair dqkv = flat_pair_zeros(3 * n, d);
  a.backward = true;
  a.cos = CP(pc), a.sin = CP(ps), a.qkv = CP(dqkv), a.q = CP(dq), a.k = CP(dk), a.v = CP(dv);
  CHECK_OK(KC->rope_heads(cctx, &a));
  a.cos = GP(pc), a.sin = GP(ps), a.qkv = GP(dqkv), a.q = GP(dq), a.k = GP(dk), a.v = GP(dv);
  CHECK_OK(KG->rope_heads(gctx, &a));
#undef ROPE_PTRS
  same("rope_heads backward", d, dqkv, tol_of(d));
  flat_pair_free(&pc), flat_pair_free(&ps), flat_pair_free(&qkv);
  flat_pair_free(&q), flat_pair_free(&k), flat_pair_free(&v);
  flat_pair_free(&dq), flat_pair_free(&dk), flat_pair_free(&dv), flat_pair_free(&dqkv);
}

static void heads_case(tf_dtype d, int64_t B, int64_t T, int64_t H, int64_t hd) {
  const int64_t n = B * T * H * hd;
  flat_pair src = flat_pair_randn(n, d, 1.0, 0), dst = flat_pair_zeros(n, d), back = flat_pair_zeros(n, d);
  tf_heads_args a = {.batch = B, .seq = T, .heads = H, .head_dim = hd, .dtype = d, .src = CP(src), .dst = CP(dst)};
  CHECK_OK(KC->heads(cctx, &a));
  a.src = GP(src), a.dst = GP(dst);
  CHECK_OK(KG->heads(gctx, &a));
  identical("heads merge", dst);
  a.split = true, a.src = CP(dst), a.dst = CP(back);
  CHECK_OK(KC->heads(cctx, &a));
  a.src = GP(dst), a.dst = GP(back);
  CHECK_OK(KG->heads(gctx, &a));
  identical("heads split", back);
  flat_pair_free(&src), flat_pair_free(&dst), flat_pair_free(&back);
}

static void causal_case(tf_dtype d, int64_t batch, int64_t T, double scale) {
  flat_pair s = flat_pair_randn(batch * T * T, d, 3.0, 0), dp = flat_pair_randn(batch * T * T, d, 1.0, 0);
  tf_causal_softmax_args a = {.batch = batch, .seq = T, .scale = scale, .dtype = d, .s = CP(s)};
  CHECK_OK(KC->causal_softmax(cctx, &a));
  a.s = GP(s);
  CHECK_OK(KG->causal_softmax(gctx, &a));
  same("causal_softmax", d, s, tol_of(d));
  /* backward from the CPU's probabilities on both sides */
  tf_tensor *pg = NULL;
  CHECK_OK(tf_to(s.c, d, GPU, &pg));
  tf_causal_softmax_args b = {.backward = true, .batch = batch, .seq = T, .scale = scale, .dtype = d, .s = CP(dp),
                              .p = CP(s)};
  CHECK_OK(KC->causal_softmax(cctx, &b));
  b.s = GP(dp), b.p = tf_tensor_data(pg);
  CHECK_OK(KG->causal_softmax(gctx, &b));
  same("causal_softmax backward", d, dp, tol_of(d));
  tf_tensor_release(pg);
  flat_pair_free(&s), flat_pair_free(&dp);
}

static void test_attention_kernels(void) {
  for (int di = 0; di < 3; di++) {
    const tf_dtype d = DTYPES[di];
    rope_heads_case(d, 2, 17, 3, 64);
    rope_heads_case(d, 1, 5, 2, 6);
    rope_heads_case(d, 2, 9, 2, 80); /* the 2.7B model's head size: 16-byte words */
    rope_heads_case(d, 3, 12, 32, 80); /* rows in whole groups of 4 in the rows kernel */
    rope_heads_case(d, 2, 1, 4, 64);
    heads_case(d, 2, 33, 12, 64);
    heads_case(d, 1, 3, 2, 5);
    heads_case(d, 2, 4, 3, 2);
    causal_case(d, 24, 128, 0.125);
    causal_case(d, 3, 1024, 0.125);
    causal_case(d, 4, 13, 0.3);
  }
}

/* ---- the loss, the embedding, the index check ---------------------------------------------- */

static void lm_loss_case(tf_dtype d, int64_t rows, int64_t V, bool grad) {
  flat_pair x = flat_pair_randn(rows * V, d, 2.0, 0), t = flat_pair_ints(rows, 0, V);
  flat_pair rl = flat_pair_zeros(rows, TF_F32), loss = flat_pair_zeros(1, TF_F32);
  tf_lm_loss_args a = {.rows = rows, .vocab = V, .dtype = d, .grad = grad};
  a.logits = CP(x), a.targets = CP(t), a.row_loss = CP(rl), a.loss = CP(loss);
  CHECK_OK(KC->lm_loss(cctx, &a));
  a.logits = GP(x), a.targets = GP(t), a.row_loss = GP(rl), a.loss = GP(loss);
  CHECK_OK(KG->lm_loss(gctx, &a));
  same("lm_loss", d, loss, 1e-5);
  same("lm_loss row losses", d, rl, 1e-5);
  if (grad) same("lm_loss gradient (in place)", d, x, tol_of(d));
  flat_pair_free(&x), flat_pair_free(&t), flat_pair_free(&rl), flat_pair_free(&loss);
}

static void test_loss_and_embedding(void) {
  for (int di = 0; di < 3; di++) {
    lm_loss_case(DTYPES[di], 512, 10000, true);
    lm_loss_case(DTYPES[di], 7, 13, true);
    lm_loss_case(DTYPES[di], 33, 100, false);
    /* the block-a-row kernel's 1 to 4 vector steps a thread (f16, bf16: 8 logits a step, 1 to 4 steps
     * at 64, 4096, 6144 and 12288; f32: 4 a step, at 64, 2048, 3072 and 4096), past them (the
     * row-group kernel), and a vocabulary of no whole vectors */
    const int64_t vocabs[] = {64, 2048, 3072, 4096, 4104, 6144, 12288, 16384, 16392, 50257};
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) lm_loss_case(DTYPES[di], 19, vocabs[v], true);
  }
  /* embedding: rows copied exactly; gradients added in position order: the same bits */
  const int64_t n = 4096, dim = 96, V = 500;
  flat_pair ids = flat_pair_ints(n, 0, V), wte = flat_pair_randn(V * dim, TF_F32, 1.0, 0);
  flat_pair out = flat_pair_zeros(n * dim, TF_F32);
  flat_pair dout = flat_pair_randn(n * dim, TF_F32, 1.0, 0), dwte = flat_pair_randn(V * dim, TF_F32, 1.0, 0);
  tf_encoder_args a = {.n = n, .dim = dim, .vocab = V};
  a.ids = CP(ids), a.wte = CP(wte), a.out = CP(out);
  CHECK_OK(KC->encoder(cctx, &a));
  a.ids = GP(ids), a.wte = GP(wte), a.out = GP(out);
  CHECK_OK(KG->encoder(gctx, &a));
  identical("encoder", out);
  tf_encoder_args b = {.backward = true, .n = n, .dim = dim, .vocab = V};
  b.ids = CP(ids), b.dout = CP(dout), b.dwte = CP(dwte);
  CHECK_OK(KC->encoder(cctx, &b));
  b.ids = GP(ids), b.dout = GP(dout), b.dwte = GP(dwte);
  CHECK_OK(KG->encoder(gctx, &b));
  identical("encoder backward (accumulates)", dwte);
  /* index check: the first bad index, whatever the timing */
  double vals[3000];
  for (int i = 0; i < 3000; i++) vals[i] = i % 7;
  vals[2100] = 7, vals[2999] = -4, vals[2500] = 100;
  flat_pair idx = flat_pair_of(vals, 3000, TF_I64, 0);
  int64_t bad = 0;
  CHECK_OK(KG->index_check(gctx, GP(idx), 3000, 7, &bad));
  CHECK_INT(bad, 2100);
  CHECK_OK(KG->index_check(gctx, GP(idx), 2100, 7, &bad));
  CHECK_INT(bad, -1);
  flat_pair_free(&idx);
  flat_pair_free(&ids), flat_pair_free(&wte), flat_pair_free(&out), flat_pair_free(&dout), flat_pair_free(&dwte);
}

/* ---- clipping ---------------------------------------------------------------------------------- */

/* grad_norm on both backends: the same norm and factor in every bit (one fixed order of double
 * additions); then the engine's AdamW reading that factor, p, m and v compared. */
static void clip_case(int64_t n, double max_norm) {
  flat_pair g = flat_pair_randn(n, TF_F32, 1.0, 0), part = flat_pair_zeros(TF_GRAD_NORM_BLOCKS, TF_F64);
  flat_pair out = flat_pair_zeros(TF_GRAD_NORM_OUT, TF_F32);
  tf_grad_norm_args a = {.g = CP(g), .n = n, .max_norm = max_norm, .partial = CP(part), .out = CP(out)};
  CHECK_OK(KC->grad_norm(cctx, &a));
  a.g = GP(g), a.partial = GP(part), a.out = GP(out);
  CHECK_OK(KG->grad_norm(gctx, &a));
  identical("grad_norm: norm and factor", out);
  flat_pair p = flat_pair_randn(n, TF_F32, 1.0, 0), m = flat_pair_randn(n, TF_F32, 0.1, 0);
  flat_pair v = flat_pair_zeros(n, TF_F32), consts = flat_pair_zeros(TF_ADAMW_CONSTS, TF_F32);
  tf_adamw_args args = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .step = 3};
  tf_adamw_update u = {0};
  CHECK_OK(tf_adamw_constants("clip test", &args, &u));
  CHECK_OK(KC->adamw_constants(cctx, CP(consts), &u));
  CHECK_OK(KG->adamw_constants(gctx, GP(consts), &u));
  tf_model_adamw_args w = {.p = CP(p), .m = CP(m), .v = CP(v), .g = CP(g), .n = n, .consts = CP(consts),
                           .grad_scale = CP(out)};
  CHECK_OK(KC->adamw(cctx, &w));
  w.p = GP(p), w.m = GP(m), w.v = GP(v), w.g = GP(g), w.consts = GP(consts), w.grad_scale = GP(out);
  CHECK_OK(KG->adamw(gctx, &w));
  same("adamw, clipped: p", TF_F32, p, 1e-6);
  same("adamw, clipped: m", TF_F32, m, 1e-6);
  same("adamw, clipped: v", TF_F32, v, 1e-6);
  flat_pair all[] = {g, part, out, p, m, v, consts};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tf_tensor_release(all[i].c), tf_tensor_release(all[i].g);
}

static void test_clip(void) {
  const int64_t sizes[] = {1, 255, 4097, 262144 + 3, 3000001};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    clip_case(sizes[i], 1.0);      /* clipped */
    clip_case(sizes[i], 1e9);      /* under the max: factor 1 */
    clip_case(sizes[i], INFINITY); /* measuring */
  }
}

/* ---- whole models ------------------------------------------------------------------------------- */

/* precision TF_F8E4M3 stands for precision "fp8": a bf16 model with FP8 products, e5m2 gradients. */
static tf_model *make(const tf_model_config *cfg, tf_device dev, tf_dtype precision, uint64_t seed) {
  tf_seed_all(seed);
  tf_model *m = NULL;
  const bool fp8 = precision == TF_F8E4M3;
  if (!CHECK_OK(tf_model_create(cfg, dev, fp8 ? TF_BF16 : precision, &m))) exit(1);
  if (fp8 && !CHECK_OK(tf_model_set_fp8(m, TF_F8E5M2))) exit(1);
  return m;
}

static tf_tensor *batch_ids(int64_t b, int64_t t, int64_t V, tf_device dev) {
  double *v = values_alloc(b * t);
  for (int64_t i = 0; i < b * t; i++) v[i] = (double)rng_int(0, V);
  tf_tensor *c = tensor_from(v, SHAPE(b, t), TF_I64), *g = NULL;
  free(v);
  if (dev.type == TF_DEV_CPU) return c;
  CHECK_OK(tf_to(c, TF_I64, dev, &g));
  tf_tensor_release(c);
  return g;
}

static bool model_same(const char *what, tf_dtype d, const tf_tensor *g, const tf_tensor *c, double tol) {
  double *gv = tensor_values(g), *cv = tensor_values(c);
  bool ok = same_values(what, d, gv, cv, tf_tensor_numel(c), tol);
  free(gv), free(cv);
  return ok;
}

/* A few-rows product followed by SwiGLU's gate (then_swiglu) or the KV
 * cache's append of one token (then_append), as the decode step asks: on
 * the GPU at one row done in the one-row kernel, with the bits of the
 * product then the gate's or the append's own kernel; against the CPU's.
 * At two rows the GPU runs the two apart. */
static void few_rows_gate_case(tf_dtype d, int64_t m, int64_t f, int64_t k) {
  flat_pair a = flat_pair_randn(m * k, d, 1.0, 0), b = flat_pair_randn(2 * f * k, d, 1.0, 0);
  flat_pair ab = flat_pair_zeros(m * 2 * f, d), y = flat_pair_zeros(m * f, d), y2 = flat_pair_zeros(m * f, d);
  tf_swiglu_args sw = {.rows = m, .f = f, .dtype = d};
  tf_gemm_args g = {.ab_dtype = d, .c_dtype = d, .batch = 1, .m = m, .n = 2 * f, .k = k, .trans_b = true, .lda = k,
                    .ldb = k, .ldc = 2 * f, .few_rows = true, .chained = true, .then_swiglu = &sw};
  g.a = CP(a), g.b = CP(b), sw.ab = g.c = CP(ab), sw.y = CP(y);
  CHECK_OK(KC->gemm(cctx, &g));
  g.a = GP(a), g.b = GP(b), sw.ab = g.c = GP(ab), sw.y = GP(y);
  CHECK_OK(KG->gemm(gctx, &g));
  same("gemm few rows then swiglu", d, y, tol_of(d));
  g.then_swiglu = NULL, sw.y = GP(y2);
  CHECK_OK(KG->gemm(gctx, &g));
  CHECK_OK(KG->swiglu(gctx, &sw));
  same_bits("gemm few rows then swiglu: the two kernels' bits", y.g, 0, y2.g, 0, m * f);
  flat_pair *all[] = {&a, &b, &ab, &y, &y2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) flat_pair_free(all[i]);
}

static void few_rows_append_case(tf_dtype d, int64_t H, int64_t hd, int64_t k, int64_t max_len, int64_t pos) {
  const int64_t n = 3 * H * hd, cache = H * max_len * hd;
  flat_pair pc, ps;
  rope_tables(max_len, hd, &pc, &ps);
  double posv[1] = {(double)pos};
  flat_pair pp = flat_pair_of(posv, 1, TF_I64, 0);
  flat_pair a = flat_pair_randn(k, d, 1.0, 0), b = flat_pair_randn(n * k, d, 1.0, 0), qkv = flat_pair_zeros(n, d);
  flat_pair q = flat_pair_zeros(H * hd, d), kc = flat_pair_randn(cache, d, 1.0, 0), vc = flat_pair_randn(cache, d, 1.0, 0);
  flat_pair q2 = flat_pair_zeros(H * hd, d), kc2 = flat_pair_randn(cache, d, 1.0, 0), vc2 = flat_pair_randn(cache, d, 1.0, 0);
  tf_kv_append_args kv = {.batch = 1, .seq = 1, .heads = H, .head_dim = hd, .max_len = max_len, .dtype = d};
  tf_gemm_args g = {.ab_dtype = d, .c_dtype = d, .batch = 1, .m = 1, .n = n, .k = k, .trans_b = true, .lda = k,
                    .ldb = k, .ldc = n, .few_rows = true, .chained = true, .then_append = &kv};
#define APPEND_PTRS(P, Q, K, V) g.a = P(a), g.b = P(b), kv.qkv = g.c = P(qkv), kv.cos = P(pc), kv.sin = P(ps), \
                                kv.pos = P(pp), kv.q = P(Q), kv.k_cache = P(K), kv.v_cache = P(V)
  APPEND_PTRS(CP, q, kc, vc);
  CHECK_OK(KC->gemm(cctx, &g));
  APPEND_PTRS(GP, q, kc, vc);
  CHECK_OK(KG->gemm(gctx, &g));
  same("gemm few rows then kv_append q", d, q, tol_of(d));
  same("gemm few rows then kv_append k", d, kc, tol_of(d));
  same("gemm few rows then kv_append v", d, vc, tol_of(d));
  /* the two kernels on caches of the same start (the unwritten rows random in both) */
  CHECK_OK(gctx->backend->copy(gctx, GP(kc2), GP(kc), (size_t)cache * tf_dtype_size(d), TF_COPY_D2D));
  CHECK_OK(gctx->backend->copy(gctx, GP(vc2), GP(vc), (size_t)cache * tf_dtype_size(d), TF_COPY_D2D));
  APPEND_PTRS(GP, q2, kc2, vc2);
#undef APPEND_PTRS
  g.then_append = NULL;
  CHECK_OK(KG->gemm(gctx, &g));
  CHECK_OK(KG->kv_append(gctx, &kv));
  same_bits("gemm few rows then kv_append q: the two kernels' bits", q.g, 0, q2.g, 0, H * hd);
  same_bits("gemm few rows then kv_append k: the two kernels' bits", kc.g, 0, kc2.g, 0, cache);
  same_bits("gemm few rows then kv_append v: the two kernels' bits", vc.g, 0, vc2.g, 0, cache);
  flat_pair *all[] = {&pc, &ps, &pp, &a, &b, &qkv, &q, &kc, &vc, &q2, &kc2, &vc2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) flat_pair_free(all[i]);
}

static void test_gemm_few_rows_then(void) {
  for (int di = 1; di < 3; di++) {
    few_rows_gate_case(DTYPES[di], 1, 10240, 2560); /* 2.7B's w13 */
    few_rows_gate_case(DTYPES[di], 1, 37, 264);     /* a last block of gate columns cut */
    few_rows_gate_case(DTYPES[di], 1, 50, 40000);   /* rows of eight warps a column: the product, then the gate */
    few_rows_gate_case(DTYPES[di], 2, 64, 256);     /* two rows: cuBLASLt, then the gate */
    few_rows_append_case(DTYPES[di], 32, 80, 2560, 300, 211); /* 2.7B's qkv */
    few_rows_append_case(DTYPES[di], 3, 10, 64, 20, 19);      /* the cache's last position, a last block cut */
  }
}

/* ---- generation: the KV cache's append and the decode attention ---------------------- */

/* kv_append of seq tokens at position pos into (B, H, max_len, hd) caches,
 * then decode_attention of B H queries over pos + seq keys, on random
 * caches (the positions before pos hold random keys and values). */
static void decode_case(tf_dtype d, int64_t B, int64_t H, int64_t hd, int64_t max_len, int64_t seq, int64_t pos,
                        int64_t splits, bool general) {
  const int64_t cache = B * H * max_len * hd;
  flat_pair pc, ps;
  rope_tables(max_len, hd, &pc, &ps);
  double posv[1] = {(double)pos}, lastv[1] = {(double)(pos + seq - 1)};
  flat_pair pp = flat_pair_of(posv, 1, TF_I64, 0), pl = flat_pair_of(lastv, 1, TF_I64, 0);
  flat_pair qkv = flat_pair_randn(B * seq * 3 * H * hd, d, 1.0, 0), q = flat_pair_zeros(B * H * seq * hd, d);
  flat_pair kc = flat_pair_randn(cache, d, 1.0, 0), vc = flat_pair_randn(cache, d, 1.0, 0);
  tf_kv_append_args a = {.batch = B, .seq = seq, .heads = H, .head_dim = hd, .max_len = max_len, .dtype = d};
#define KV_PTRS(P) a.cos = P(pc), a.sin = P(ps), a.pos = P(pp), a.qkv = P(qkv), a.q = P(q), a.k_cache = P(kc), \
                   a.v_cache = P(vc)
  KV_PTRS(CP);
  CHECK_OK(KC->kv_append(cctx, &a));
  KV_PTRS(GP);
  CHECK_OK(KG->kv_append(gctx, &a));
#undef KV_PTRS
  same("kv_append q", d, q, tol_of(d));
  same("kv_append k", d, kc, tol_of(d));
  same("kv_append v", d, vc, 0);
  /* one query a row and head: the first token's turned queries */
  flat_pair qd = flat_pair_randn(B * H * hd, d, 1.0, 0), out = flat_pair_zeros(B * H * hd, d);
  flat_pair part = flat_pair_zeros(B * H * splits * (hd + 2), TF_F32);
  tf_decode_attention_args at = {.batch = B, .heads = H, .head_dim = hd, .max_len = max_len, .splits = splits,
                                 .scale = 1.0 / sqrt((double)hd), .dtype = d, .general = general};
#define AT_PTRS(P) at.pos = P(pl), at.q = P(qd), at.k_cache = P(kc), at.v_cache = P(vc), at.out = P(out), \
                   at.partial = P(part)
  AT_PTRS(CP);
  CHECK_OK(KC->decode_attention(cctx, &at));
  AT_PTRS(GP);
  CHECK_OK(KG->decode_attention(gctx, &at));
#undef AT_PTRS
  same("decode_attention", d, out, tol_of(d));
  /* the stretches merged by the last of them to end (done's counters), twice: the second call finds the
   * counters zero again; the bits of the two-kernel form */
  flat_pair done = flat_pair_zeros(B * H, TF_I32), out2 = flat_pair_zeros(B * H * hd, d);
  at.done = (unsigned *)GP(done), at.out = GP(out2);
  for (int rep = 0; rep < 2; rep++) {
    CHECK_OK(KG->decode_attention(gctx, &at));
    same_bits("decode_attention merged by its last stretch", out.g, 0, out2.g, 0, B * H * hd);
    identical("decode_attention's counters back to zero", done);
  }
  flat_pair *all[] = {&pc, &ps, &pp, &pl, &qkv, &q, &kc, &vc, &qd, &out, &part, &done, &out2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) flat_pair_free(all[i]);
}

static void test_decode_kernels(void) {
  /* each case by the tiled kernel (where the head's rows are whole 16-byte words) and by the general one */
  for (int i = 0; i < 3; i++)
    for (int general = 0; general < 2; general++) {
      const tf_dtype d = DTYPES[i];
      decode_case(d, 1, 4, 64, 64, 1, 0, 2, general);     /* the first position: one key, the other stretches empty */
      decode_case(d, 1, 32, 80, 300, 1, 211, 8, general); /* 2.7B's head size, a stretch cut mid-way */
      decode_case(d, 3, 4, 128, 96, 5, 17, 3, general);   /* a prefill's append of 5 tokens */
      decode_case(d, 16, 12, 64, 128, 1, 127, 1, general); /* the last position, one stretch: one whole tile */
      decode_case(d, 1, 4, 64, 70, 1, 68, 1, general);    /* 69 keys: a last group of eight cut to five */
      decode_case(d, 1, 2, 64, 700, 1, 650, 2, general);  /* stretches of three tiles, the last cut */
      decode_case(d, 2, 3, 36, 50, 1, 44, 2, general);    /* f32: rows of nine words; bf16, f16: the general kernel */
      decode_case(d, 1, 2, 256, 64, 1, 40, 1, general);   /* the longest head: rows longer than a thread holds */
      if (!small_run) decode_case(d, 2, 8, 256, 1024, 1, 1000, 16, general);
    }
}

/* Generation on both devices from one seed: the prefill's and each decode
 * step's logits (the GPU's step eager, captured, then replayed) alike. */
static void decode_model_case(const tf_model_config *cfg, tf_dtype precision, int64_t B, int64_t T, int steps) {
  tf_model *mc = make(cfg, tf_cpu(), precision, 91), *mg = make(cfg, GPU, precision, 91);
  tf_tensor *ids = batch_ids(B, T, cfg->vocab_size, tf_cpu()), *lc = NULL, *lg = NULL;
  CHECK_OK(tf_model_prefill(mc, ids, T + steps, &lc));
  CHECK_OK(tf_model_prefill(mg, ids, T + steps, &lg));
  const double tol = precision == TF_F32 ? 1e-4 : 3e-2;
  char what[64];
  snprintf(what, sizeof what, "decode model prefill");
  model_same(what, precision, lg, lc, tol);
  int64_t *next = calloc((size_t)B, sizeof *next);
  for (int s = 0; s < steps; s++) {
    for (int64_t b = 0; b < B; b++) next[b] = rng_int(0, cfg->vocab_size);
    tf_tensor_release(lc), tf_tensor_release(lg);
    lc = lg = NULL;
    CHECK_OK(tf_model_decode_step(mc, next, &lc));
    CHECK_OK(tf_model_decode_step(mg, next, &lg));
    model_same("decode model step", precision, lg, lc, tol);
  }
  tf_model_graph_stats gs = tf_model_graphs(mg);
  if (gs.on) CHECK(gs.replays >= (uint64_t)(steps - 2));
  free(next);
  tf_tensor_release(ids), tf_tensor_release(lc), tf_tensor_release(lg);
  tf_model_free(mc), tf_model_free(mg);
}

/* Both models from one seed: the same parameters; then a forward pass, a
 * loss, backward and two AdamW steps on the same batch, compared. */
static void model_case(const tf_model_config *cfg, tf_dtype precision, int64_t B, int64_t T, bool lt) {
  tf_model *mc = make(cfg, tf_cpu(), precision, 77), *mg = make(cfg, GPU, precision, 77);
  KG->gemm_use_lt(gctx, lt);
  const int nt = tf_model_num_tensors(mc);
  bool params_same = true;
  for (int i = 0; i < nt; i++) {
    double *a = tensor_values(tf_model_param(mc, i)), *b = tensor_values(tf_model_param(mg, i));
    params_same &= memcmp(a, b, sizeof(double) * (size_t)tf_tensor_numel(tf_model_param(mc, i))) == 0;
    free(a), free(b);
  }
  record("model init: the same parameters", TF_F32, params_same ? 0 : INFINITY, 0);
  CHECK(params_same);
  tf_tensor *ic = batch_ids(B, T, cfg->vocab_size, tf_cpu()), *tc = batch_ids(B, T, cfg->vocab_size, tf_cpu());
  tf_tensor *ig = NULL, *tg = NULL, *lc = NULL, *lg = NULL;
  CHECK_OK(tf_to(ic, TF_I64, GPU, &ig));
  CHECK_OK(tf_to(tc, TF_I32, GPU, &tg)); /* i32 targets on the GPU, i64 on the CPU */
  const bool f32 = precision == TF_F32;
  /* An FP8 model's casts give the CPU's bytes for the same input (test_fp8_kernels), but a value that
   * bf16's last bit moves across a rounding boundary of e4m3 (3 mantissa bits) moves by 1/16: the
   * whole model agrees to what those flips make (on the H200: logits 0.05, gradients up to 0.19) */
  const bool fp8 = precision == TF_F8E4M3;
  const double logits_tol = f32 ? 1e-5 : fp8 ? 0.1 : 2e-2, grads_tol = f32 ? 1e-4 : fp8 ? 0.3 : 1e-1;
  char what[64];
  const char *path = lt ? "lt" : "cublas";
#define NAME(s) (snprintf(what, sizeof what, "model %s (%s)", s, path), what)
  CHECK_OK(tf_model_forward(mc, ic, false, &lc));
  CHECK_OK(tf_model_forward(mg, ig, false, &lg));
  model_same(NAME("logits"), precision, lg, lc, logits_tol);
  tf_tensor_release(lc), tf_tensor_release(lg);
  CHECK_OK(tf_model_loss(mc, ic, tc, &lc));
  CHECK_OK(tf_model_loss(mg, ig, tg, &lg));
  model_same(NAME("loss"), precision, lg, lc, f32 ? 1e-5 : fp8 ? 2e-2 : 5e-3);
  CHECK_OK(tf_model_backward(mc));
  CHECK_OK(tf_model_backward(mg));
  for (int i = 0; i < nt; i++) {
    const char *nm = tf_model_tensor_name(mc, i);
    const char *kind = strstr(nm, "ln") ? "norm gains" : strstr(nm, "token_emb") ? "embedding" : "matmul weights";
    char g[48];
    snprintf(g, sizeof g, "gradients: %s", kind);
    if (!model_same(NAME(g), precision, tf_model_grad(mg, i), tf_model_grad(mc, i), grads_tol))
      fprintf(stderr, "  (%s)\n", nm);
  }
  tf_adamw_args args = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
  for (int step = 1; step <= 2; step++) {
    args.step = step;
    CHECK_OK(tf_model_adamw_step(mc, &args));
    CHECK_OK(tf_model_adamw_step(mg, &args));
  }
  /* AdamW divides by sqrt(v): where a gradient is near zero, its last-bit
   * differences between backends become full-size differences of the update
   * (about lr), so whole parameter tensors agree to ~1e-3, not 1e-5. The
   * AdamW kernel itself is checked to 1e-5 in test_nnops_cuda.c. */
  for (int i = 0; i < nt; i++)
    model_same(NAME("parameters after 2 AdamW steps"), precision, tf_model_param(mg, i), tf_model_param(mc, i),
               f32 ? 2e-3 : 5e-2);
#undef NAME
  tf_tensor_release(lc), tf_tensor_release(lg);
  tf_tensor_release(ic), tf_tensor_release(tc), tf_tensor_release(ig), tf_tensor_release(tg);
  tf_model_free(mc), tf_model_free(mg);
  KG->gemm_use_lt(gctx, true);
}

static double loss_value(const tf_tensor *t) {
  double *v = tensor_values(t), x = v[0];
  free(v);
  return x;
}

/* Same seed, same batch: the same bits; memory flat across steps; errors. */
static void test_model_behaviour(const tf_model_config *cfg) {
  tf_tensor *ids = batch_ids(4, 32, cfg->vocab_size, GPU), *targets = batch_ids(4, 32, cfg->vocab_size, GPU);
  double losses[2][4];
  size_t allocated[4] = {0};
  uint64_t segments[4] = {0};
  for (int run = 0; run < 2; run++) {
    tf_model *m = NULL;
    for (int pass = 0; pass < 2; pass++) {
      tf_model_free(m);
      m = make(cfg, GPU, run ? TF_BF16 : TF_F32, 5);
      for (int s = 0; s < 4; s++) {
        tf_tensor *l = NULL;
        CHECK_OK(tf_model_loss(m, ids, targets, &l));
        CHECK_OK(tf_model_backward(m));
        tf_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01, .step = s + 1};
        CHECK_OK(tf_model_adamw_step(m, &a));
        CHECK_OK(tf_model_zero_grad(m));
        double v = loss_value(l);
        tf_tensor_release(l);
        if (pass == 0) losses[run][s] = v;
        else {
          record(run ? "bf16 losses bit-identical run to run" : "f32 losses bit-identical run to run", TF_F32,
                 v == losses[run][s] ? 0 : INFINITY, 0);
          CHECK(v == losses[run][s]);
        }
        allocated[s] = gctx->alloc.stats.allocated;
        segments[s] = gctx->alloc.stats.num_segment_allocs;
      }
      CHECK(allocated[1] == allocated[0] && allocated[3] == allocated[0]);
      CHECK(segments[3] == segments[1]);
    }
    CHECK(losses[run][3] < losses[run][0]);
    /* errors on the GPU read as on the CPU, and the model keeps working */
    double vals[8] = {1, 2, 3, 4, 5, 6, 7, (double)cfg->vocab_size};
    tf_tensor *bc = tensor_from(vals, SHAPE(2, 4), TF_I64), *bg = NULL, *out = NULL;
    CHECK_OK(tf_to(bc, TF_I64, GPU, &bg));
    CHECK_INT(tf_model_forward(m, bg, false, &out), TF_ERR_ARG);
    CHECK(strstr(tf_last_error(), "at position [1, 3] is out of range") != NULL);
    CHECK_INT(tf_model_forward(m, bc, false, &out), TF_ERR_ARG); /* CPU ids, GPU model */
    tf_tensor_release(bg), tf_tensor_release(bc);
    CHECK_OK(tf_model_forward(m, ids, false, &out));
    tf_tensor_release(out);
    tf_model_free(m);
  }
  tf_tensor_release(ids), tf_tensor_release(targets);
}

/* ---- timings ---------------------------------------------------------------------------------- */

static double now_ms(void) { return (double)tf_clock_ns() * 1e-6; }

static void bench_model(tf_dtype precision, int64_t B, int64_t T, bool lt) {
  const tf_model_config small = {10000, 1024, 768, 12, 12, 3072, 10000.0};
  tf_model *m = NULL;
  tf_seed_all(1);
  tf_alloc_empty_cache(&gctx->alloc);
  tf_alloc_reset_peak(&gctx->alloc);
  if (tf_model_create(&small, GPU, precision, &m) != TF_OK) {
    printf("small %-4s T=%-4lld: could not be created: %s\n", tf_dtype_name(precision), (long long)T, tf_last_error());
    return;
  }
  KG->gemm_use_lt(gctx, lt);
  tf_tensor *ids = batch_ids(B, T, small.vocab_size, GPU), *targets = batch_ids(B, T, small.vocab_size, GPU);
  tf_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
  enum { WARMUP = 3, ITERS = 10 };
  double fwd = 0, step = 0;
  tf_status st = TF_OK;
  for (int i = 0; i < WARMUP + ITERS && st == TF_OK; i++) {
    tf_tensor *out = NULL;
    CHECK_OK(tf_device_sync(GPU));
    double t0 = now_ms();
    st = tf_model_forward(m, ids, false, &out);
    CHECK_OK(tf_device_sync(GPU));
    double t1 = now_ms();
    tf_tensor_release(out);
    out = NULL;
    if (st == TF_OK) st = tf_model_loss(m, ids, targets, &out);
    if (st == TF_OK) st = tf_model_backward(m);
    a.step = i + 1;
    if (st == TF_OK) st = tf_model_adamw_step(m, &a);
    if (st == TF_OK) st = tf_model_zero_grad(m);
    CHECK_OK(tf_device_sync(GPU));
    double t2 = now_ms();
    tf_tensor_release(out);
    if (i >= WARMUP) fwd += t1 - t0, step += t2 - t1;
  }
  if (st != TF_OK) {
    printf("small %-4s T=%-4lld: %s\n", tf_dtype_name(precision), (long long)T, tf_last_error());
  } else {
    fwd /= ITERS, step /= ITERS;
    const double P = (double)tf_model_config_parameters(&small), tokens = (double)(B * T);
    const double flops = 6 * P * tokens + 12.0 * 12 * (double)B * (double)(T * T) * 768;
    tf_model_memory mem = tf_model_memory_use(m);
    printf("small %-4s B=%lld T=%-4lld %-7s  forward %8.2f ms   train step %8.2f ms  %9.0f tok/s  %6.1f TFLOP/s"
           "  activations %7.1f MiB  peak %7.1f MiB\n",
           tf_dtype_name(precision), (long long)B, (long long)T, lt ? "Lt" : "cuBLAS", fwd, step, tokens / step * 1e3,
           flops / step * 1e-9, (double)mem.activations / 1048576.0,
           (double)gctx->alloc.stats.peak_allocated / 1048576.0);
  }
  tf_tensor_release(ids), tf_tensor_release(targets);
  tf_model_free(m);
  KG->gemm_use_lt(gctx, true);
}

/* each part's wall time, so that a slow run says where its time went */
/* Runs a part, timed; with TF_TEST_ONLY set, only the parts whose names contain it (a quick check
 * of one family on the GPU machine). */
#define TIMED(what, call)                                                     \
  do {                                                                        \
    const char *only_ = getenv("TF_TEST_ONLY");                               \
    if (only_ && !strstr(what, only_)) break;                                 \
    double t0_ = now_ms();                                                    \
    call;                                                                     \
    fprintf(stderr, "time: %-36s %7.2f s\n", what, (now_ms() - t0_) * 1e-3); \
  } while (0)

int main(void) {
  setenv("TF_GEMM_TUNE", "1", 0); /* the timed choice (off by default) for test_gemm_timed, before the first GEMM */
  tf_backends_init();
  small_run = gpu_test_begin();
  if (!CHECK_OK(tf_device_ctx_get(tf_cpu(), &cctx)) || !CHECK_OK(tf_device_ctx_get(GPU, &gctx))) return 1;
  KC = cctx->backend->model;
  KG = gctx->backend->model;
  if (!CHECK(KC && KG && KG->gemm_use_lt && KG->gemm_tuning)) return tf_check_done();
  TIMED("gemm", test_gemm());
  TIMED("gemm, timed choice", test_gemm_timed());
  TIMED("gemm, few rows", test_gemm_few_rows());
  TIMED("rmsnorm", test_rmsnorm());
  TIMED("swiglu", test_swiglu());
  TIMED("attention kernels", test_attention_kernels());
  TIMED("loss and embedding", test_loss_and_embedding());
  TIMED("gradient clipping", test_clip());
  TIMED("decode kernels", test_decode_kernels());
  TIMED("gemm few rows then", test_gemm_few_rows_then());
  TIMED("fp8 kernels", test_fp8_kernels());
  /* tiny: every row a multiple of 8 (vector paths); mid: d_ff and vocab that are not (scalar paths) */
  const tf_model_config tiny = {64, 16, 32, 2, 4, 64, 10000.0}, mid = {1001, 128, 128, 3, 4, 350, 10000.0};
  for (int lt = 0; lt < 2; lt++) {
    const char *lib = lt ? "cublasLt" : "cublas";
    char what[64];
    snprintf(what, sizeof what, "model tiny f32 (%s)", lib);
    TIMED(what, model_case(&tiny, TF_F32, 2, 8, lt));
    snprintf(what, sizeof what, "model mid f32 (%s)", lib);
    TIMED(what, model_case(&mid, TF_F32, 3, 64, lt));
    snprintf(what, sizeof what, "model mid bf16 (%s)", lib);
    TIMED(what, model_case(&mid, TF_BF16, 3, 64, lt));
    snprintf(what, sizeof what, "model mid f16 (%s)", lib);
    TIMED(what, model_case(&mid, TF_F16, 2, 128, lt));
  }
  TIMED("model tiny fp8", model_case(&tiny, TF_F8E4M3, 2, 8, true));
  TIMED("model behaviour", test_model_behaviour(&mid));
  TIMED("decode model f32", decode_model_case(&mid, TF_F32, 2, 7, 6));
  TIMED("decode model bf16", decode_model_case(&mid, TF_BF16, 3, 9, 6));
  CHECK_OK(tf_device_sync(GPU));
  print_table();
  CHECK_INT(gctx->alloc.stats.active_blocks, 0);
  if (!small_run) {
    printf("\ntimings (mean of 10 after 3 warm-up; forward = inference; train step = loss, backward, AdamW, zero_grad)\n");
    const int64_t seqs[2] = {128, 512};
    const tf_dtype precs[2] = {TF_F32, TF_BF16};
    for (int s = 0; s < 2; s++)
      for (int p = 0; p < 2; p++)
        for (int lt = 1; lt >= 0; lt--) bench_model(precs[p], 4, seqs[s], lt);
  }
  return tf_check_done();
}
