/* FlashAttention-2's CUDA kernels (kernels/cuda/flash/flash_attn*.cu) against the CPU
 * twin (kernels/cpu/flash.c, itself checked against plain attention by
 * test_flash.c), on the same fresh random inputs (the seed is printed;
 * TF_TEST_SEED repeats a run):
 *   - forward o and lse, backward dq, dk, dv (from the CPU's o and lse, so
 *     that only the backward kernels are compared), f32 / f16 / bf16,
 *     causal or not, with and without deterministic, the scale sometimes
 *     negative (the forward kernels then flip q's signs); f32 within 1e-5
 *     relative error, f16/bf16 within 1e-2, lse within 1e-5 (where the
 *     exact gradient is zero, as dq and dk are when every query sees one
 *     key, the GPU's rounding noise is measured against the size of the
 *     terms that cancel instead);
 *   - shapes that reach every kernel path and edge: seq 1, odd lengths,
 *     seq_q above and below seq_k, head dims 1..128 (the tensor-core
 *     kernels take f16/bf16 head dims that are multiples of 8, padded to
 *     16/32/64/96/128; everything else, and buffers that are not 16-byte
 *     aligned, takes the SIMT kernels), then seq 1000 and 2048 with head
 *     dims 64 and 128, batch 3 (skipped when TF_TEST_SMALL is set, e.g.
 *     under compute-sanitizer);
 *   - outputs are filled with NaN first, so an element a kernel forgets to
 *     write fails the comparison; deterministic backward passes run twice
 *     give the same bits, and so do forward passes; D = rowsum(dO * O)
 *     (the workspace's first rows) has the same bits in every backward run
 *     (summed by the warp-specialised dQ kernel when it runs, else by the
 *     row-sum kernel);
 *   - on a 9.0 device (H100/H200) with sm_90a code built in, head dims
 *     40..128 (multiples of 8) take the Hopper kernels ([wgmma-ws]: the
 *     warp-specialised forward kernel; dK/dV with dQ by reductions, or
 *     without dQ after the warp-specialised dQ kernel when deterministic);
 *     those shapes then run a second time with TF_FLASH_WGMMA=0, so the
 *     mma.sync kernels, the path of other GPUs, stay checked on Hopper too,
 *     and the forward kernel's blocks of 192 keys at head dims 80 and 96 a
 *     third time at short lengths (TF_FLASH_FWD_LONG=0);
 *   - a table of the worst error per check, path ([wgmma-ws], [tc] tensor
 *     cores, [simt]) and dtype, and the count of checks.
 * With TF_FLASH_BENCH set it then times (CUDA events, 3 warm-up runs,
 * median of 10) bf16 causal attention at (batch, seq, head dim) = (16,
 * 16384, 64), (16, 16384, 128), (8, 4096, 64) and (1, 16384, 64): forward,
 * backward (float atomics and deterministic) and both, in ms and TFLOP/s
 * (forward 4 B S^2 d / 2 FLOPs under the causal mask, backward 2.5 times
 * that), then the forward pass with the mma.sync kernel in place of the
 * wgmma one, and head dim 80 by the mma.sync kernels (TF_FLASH_BENCH=only:
 * the timings alone, no checks, e.g. under a profiler). No timing is
 * asserted. Exits 77 without a GPU. */
#include "backend.h"
#include "backends.h"
#include "err_table.h"
#include "gpu_twins.h"

static tf_device_ctx *cctx, *gctx;
static bool small_run;

static double tol_of(tf_dtype d) { return d == TF_F32 ? 1e-5 : 1e-2; }
static const double LSE_TOL = 1e-5;

/* ---- buffers on both devices ------------------------------------------------------------- */

/* An output: NaN everywhere until a kernel writes it. */
static flat_pair pair_nan(int64_t n, tf_dtype d, int64_t off) {
  double *v = values_alloc(n);
  for (int64_t i = 0; i < n; i++) v[i] = NAN;
  flat_pair b = flat_pair_of(v, n, d, off);
  free(v);
  return b;
}

/* The CPU side's values on both devices (the CPU's o and lse as backward inputs). */
static flat_pair pair_from_cpu(flat_pair src) {
  double *v = tensor_values(src.c);
  flat_pair b = flat_pair_of(v + src.off, src.n, src.d, src.off);
  free(v);
  return b;
}

/* ---- comparisons ----------------------------------------------------------------------------- */

/* rel_error (normwise, NaNs must match), except against a reference of
 * exact zeros (dq and dk when every query sees a single key: P = 1 and
 * dP = D), where the GPU's rounding noise is measured against zero_scale,
 * the size of the terms that cancel. */
static double flash_error(const double *g, const double *c, int64_t n, double zero_scale) {
  double ref = 0, worst = 0;
  for (int64_t i = 0; i < n; i++)
    if (fabs(c[i]) > ref) ref = fabs(c[i]);
  if (ref > 0) return rel_error(g, c, n);
  for (int64_t i = 0; i < n; i++) {
    if (isnan(g[i]) || isnan(c[i])) return INFINITY;
    if (fabs(g[i] - c[i]) > worst) worst = fabs(g[i] - c[i]);
  }
  return worst / zero_scale;
}

/* Where a failed comparison goes wrong: the first element where one side is
 * NaN or infinite and the other is not, else the largest difference, and
 * how many elements are NaN on each side. */
static void report_worst(const double *g, const double *c, int64_t n) {
  int64_t at = -1, nan_g = 0, nan_c = 0;
  double worst = -1;
  for (int64_t i = 0; i < n; i++) {
    nan_g += isnan(g[i]), nan_c += isnan(c[i]);
    if (at >= 0 && !isfinite(worst)) continue;
    if (!isfinite(g[i]) != !isfinite(c[i])) at = i, worst = INFINITY;
    else if (isfinite(g[i]) && fabs(g[i] - c[i]) > worst) at = i, worst = fabs(g[i] - c[i]);
  }
  if (at >= 0)
    fprintf(stderr, "  element %lld of %lld: GPU %.9g, CPU %.9g (NaN: GPU %lld, CPU %lld)\n", (long long)at,
            (long long)n, g[at], c[at], (long long)nan_g, (long long)nan_c);
}

static double max_abs(flat_pair b) {
  double *v = tensor_values(b.c), m = 0;
  for (int64_t i = 0; i < b.n; i++)
    if (fabs(v[b.off + i]) > m) m = fabs(v[b.off + i]);
  free(v);
  return m;
}

/* The GPU side of gb against the CPU side of cb, recorded under the
 * problem's dtype dt. */
static bool same_as(const char *op, const char *note, tf_dtype dt, flat_pair gb, flat_pair cb, double tol,
                    double zero_scale) {
  double *g = tensor_values(gb.g), *c = tensor_values(cb.c);
  const double e = flash_error(g + gb.off, c + cb.off, gb.n, zero_scale);
  record(op, dt, e, tol);
  if (!(e <= tol)) {
    fprintf(stderr, "FAIL %s %s: relative error %.3g > %.3g\n", op, note, e, tol);
    report_worst(g + gb.off, c + cb.off, gb.n);
  }
  free(g), free(c);
  return CHECK(e <= tol);
}

static bool same(const char *op, const char *note, tf_dtype dt, flat_pair b, double tol) {
  return same_as(op, note, dt, b, b, tol, 1.0);
}

/* Two GPU results bit for bit, recorded under dt. */
static bool identical(const char *op, const char *note, tf_dtype dt, flat_pair a, flat_pair b) {
  tf_tensor *ca = NULL, *cb = NULL;
  CHECK_OK(tf_to(a.g, a.d, tf_cpu(), &ca));
  CHECK_OK(tf_to(b.g, b.d, tf_cpu(), &cb));
  const bool eq = ca && cb && memcmp(tf_tensor_data(ca), tf_tensor_data(cb), tf_tensor_nbytes(ca)) == 0;
  tf_tensor_release(ca), tf_tensor_release(cb);
  record(op, dt, eq ? 0.0 : INFINITY, 0.0);
  if (!eq) fprintf(stderr, "FAIL %s %s: two runs differ in their bits\n", op, note);
  return CHECK(eq);
}

/* ---- one case -------------------------------------------------------------------------------- */

typedef struct {
  int64_t batch, sq, sk, d;
  bool big; /* skipped when TF_TEST_SMALL is set */
} flash_shape;

static const flash_shape SHAPES[] = {
    {1, 1, 1, 16, false},     {2, 1, 37, 32, false},     {2, 37, 1, 32, false},      {3, 37, 37, 24, false},
    {2, 129, 129, 64, false}, {1, 37, 129, 128, false},  {1, 129, 37, 16, false},    {2, 64, 64, 32, false},
    {1, 100, 70, 128, false}, {2, 33, 95, 7, false},     {1, 50, 50, 1, false},      {2, 200, 300, 96, false},
    {1, 300, 200, 40, false}, {1, 130, 260, 8, false},   {2, 257, 255, 80, false},   {1, 65, 400, 112, false},
    {3, 1000, 1000, 64, true}, {3, 1000, 1000, 128, true}, {3, 2048, 2048, 64, true}, {3, 2048, 2048, 128, true},
    {1, 1000, 2048, 128, true}, {1, 2048, 1000, 64, true},
    /* head dims 72..104: the wgmma kernels at 80 and 96 (and padded to them) */
    {1, 77, 301, 72, false},  {2, 150, 150, 88, false},  {1, 70, 70, 104, false},   {1, 1000, 1000, 80, true},
    {2, 2048, 2048, 96, true}, {1, 500, 1300, 80, true}, {1, 1300, 500, 96, true},
    /* 4096 keys and more: the forward kernel's blocks of 192 keys at 80 and 96 (lengths off 192) */
    {1, 130, 4500, 80, false}, {2, 200, 4100, 96, false}, {1, 300, 4300, 88, false},
};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };

/* Keys off the tiles with every score far below zero (low_scores): run on
 * every path, the tensor-core kernels (d = 32, and 64, 96 where no wgmma
 * kernel takes them) and the wgmma and warp-specialised ones (64, 96). */
static const flash_shape LOW_SHAPES[] = {{2, 37, 5, 32, false}, {2, 37, 5, 64, false}, {1, 70, 21, 96, false}};

/* TF_FLASH_SANITIZE=tiny: one shape at each Hopper head dim, 64, 72 (80),
 * 88 (96) and 128, with several blocks and lengths off the tiles, for
 * racecheck of every kernel (which did not get through the small shapes
 * of TF_FLASH_SANITIZE=1 in 200 s on an H200; with only the
 * warp-specialised backward kernel instrumented they take 8-9 s). */
static bool tiny_run;
static bool tiny_shape(const flash_shape *s) {
  static const int64_t pick[4][4] = {{2, 129, 129, 64}, {1, 37, 129, 128}, {1, 77, 301, 72}, {2, 150, 150, 88}};
  for (int i = 0; i < 4; i++)
    if (s->batch == pick[i][0] && s->sq == pick[i][1] && s->sk == pick[i][2] && s->d == pick[i][3]) return true;
  return false;
}

/* Whether the forward pass may take the wgmma kernel: a 9.0 device and a
 * build with sm_90a code; TF_FLASH_WGMMA=0 turns it off (the second pass). */
static bool wgmma_device;

static bool wgmma_on(void) {
  const char *env = getenv("TF_FLASH_WGMMA");
  return wgmma_device && !(env && strcmp(env, "0") == 0);
}

/* Whether the wgmma kernels take head dim d (a multiple of 8, padded to
 * 64, 80, 96 or 128). */
static bool wgmma_dim(int64_t d) { return d > 32 && d <= 128; }

/* Which kernels the GPU runs, by the backend's rule (flash_attn.cu's
 * table): [wgmma-ws] the Hopper (warp-specialised) kernels, [tc] the
 * mma.sync ones, [simt] the SIMT ones; the same for both passes. */
static const char *path_of(tf_dtype dt, int64_t d, int64_t off) {
  const bool tc = (dt == TF_F16 || dt == TF_BF16) && d % 8 == 0 && d <= 128 && off == 0;
  if (!tc) return "simt";
  return wgmma_on() && wgmma_dim(d) ? "wgmma-ws" : "tc";
}

/* Whether a backward pass adds dQ up by reductions into an f32
 * accumulator (flash_attn.cu's rule): tensor cores and not deterministic. */
static bool dq_by_reductions(const tf_flash_args *a) {
  return a->dtype != TF_F32 && a->head_dim % 8 == 0 && !a->deterministic;
}

static tf_flash_args args_of(const flash_shape *s, tf_dtype dt, bool causal, double scale) {
  return (tf_flash_args){.causal = causal, .dtype = dt, .batch = s->batch, .seq_q = s->sq, .seq_k = s->sk,
                         .head_dim = s->d, .scale = scale};
}

/* The backward pass on the GPU into dq/dk/dv with its own workspace; D
 * (the workspace's first batch * seq_q floats) into d when not NULL. */
static tf_status gpu_backward(tf_flash_args a, flat_pair dq, flat_pair dk, flat_pair dv, float *d) {
  a.dq = GP(dq), a.dk = GP(dk), a.dv = GP(dv);
  const size_t bytes = gctx->backend->flash_workspace(gctx, &a);
  const size_t rows = (size_t)(a.batch * a.seq_q);
  CHECK(bytes >= rows * sizeof(float));
  /* the f32 dQ accumulator is asked for exactly when dQ is added up by reductions; else only D's
   * rows (rounded up to 256 bytes) */
  CHECK(dq_by_reductions(&a) ? bytes >= rows * (size_t)(1 + a.head_dim) * sizeof(float) : bytes < rows * sizeof(float) + 256);
  tf_block *ws = NULL;
  tf_status st = bytes ? tf_alloc(&gctx->alloc, bytes, &ws) : TF_OK;
  if (st != TF_OK) return st;
  a.workspace = ws ? ws->ptr : NULL;
  if (ws) { /* NaN bits everywhere first: a row of D that no kernel writes fails the check of D */
    void *nan_bits = malloc(bytes);
    st = nan_bits ? TF_OK : tf_fail(TF_ERR_OOM, "no host memory");
    if (nan_bits) memset(nan_bits, 0xff, bytes), st = gctx->backend->copy(gctx, ws->ptr, nan_bits, bytes, TF_COPY_H2D);
    free(nan_bits);
  }
  if (st == TF_OK) st = gctx->backend->flash_attention(gctx, &a);
  if (st == TF_OK) st = tf_device_sync(GPU);
  if (st == TF_OK && d && ws) st = gctx->backend->copy(gctx, d, ws->ptr, rows * sizeof(float), TF_COPY_D2H);
  if (ws) tf_alloc_free(&gctx->alloc, ws);
  return st;
}

/* The forward pass again with O's problems side by side in each row
 * (o_row_stride = batch * head_dim: the merged (1, seq, batch, head_dim)
 * layout) on both devices: each device's O, moved, bit for bit. */
static void merged_case(const char *note, const char *fpath, tf_dtype dt, tf_flash_args ac, tf_flash_args ag,
                        flat_pair o, int64_t off) {
  const int64_t G = ac.batch, T = ac.seq_q, d = ac.head_dim, n = G * T * d;
  flat_pair om = pair_nan(n, dt, off), lm = pair_nan(G * T, TF_F32, 0);
  ac.o = CP(om), ac.lse = CP(lm), ac.o_row_stride = G * d;
  ag.o = GP(om), ag.lse = GP(lm), ag.o_row_stride = G * d;
  if (CHECK_OK(cctx->backend->flash_attention(cctx, &ac)) && CHECK_OK(gctx->backend->flash_attention(gctx, &ag))) {
    tf_tensor *sides[2][2] = {{o.c, om.c}, {o.g, om.g}};
    for (int side = 0; side < 2; side++) {
      double *plain = tensor_values(sides[side][0]), *merged = tensor_values(sides[side][1]);
      bool eq = true;
      for (int64_t b = 0; b < G && eq; b++)
        for (int64_t t = 0; t < T && eq; t++)
          eq = memcmp(plain + off + (b * T + t) * d, merged + off + (t * G + b) * d, sizeof(double) * (size_t)d) == 0;
      free(plain), free(merged);
      char op[64];
      snprintf(op, sizeof op, "forward o merged (%s) [%s]", side ? "GPU" : "CPU", fpath);
      record(op, dt, eq ? 0.0 : INFINITY, 0.0);
      if (!eq) fprintf(stderr, "FAIL %s %s: O in the merged layout differs from O\n", op, note);
      CHECK(eq);
    }
  }
  flat_pair_free(&om), flat_pair_free(&lm);
}

/* The backward pass's outputs, in the order the cases keep them. */
static const char *const GRAD_NAMES[3] = {"dq", "dk", "dv"};

/* x's values, a (G, T, d) tensor, on both devices in the merged layout
 * (1, T, G, d) (o_row_stride = G d): problem b's row t at t G + b. */
static flat_pair pair_merged(flat_pair x, int64_t G, int64_t T, int64_t d) {
  double *v = tensor_values(x.c), *m = values_alloc(x.n);
  for (int64_t b = 0; b < G; b++)
    for (int64_t t = 0; t < T; t++)
      memcpy(m + (t * G + b) * d, v + x.off + (b * T + t) * d, sizeof(double) * (size_t)d);
  flat_pair p = flat_pair_of(m, x.n, x.d, x.off);
  free(v), free(m);
  return p;
}

/* The backward pass again with O and dO in the merged layout on the GPU:
 * deterministic, the bits of the plain layout's deterministic pass (det);
 * with dQ by reductions, near the CPU's plain result (cpu). */
static void merged_backward_case(const char *note, const char *path, tf_dtype dt, tf_flash_args bg, flat_pair oin,
                                 flat_pair dout, flat_pair det[3], flat_pair cpu[3], const double zero[3]) {
  const int64_t G = bg.batch, T = bg.seq_q, d = bg.head_dim;
  flat_pair om = pair_merged(oin, G, T, d), dm = pair_merged(dout, G, T, d), g[2][3];
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 3; i++) g[r][i] = pair_nan(det[i].n, dt, det[i].off);
  bg.o = GP(om), bg.dout = GP(dm), bg.o_row_stride = G * d;
  char op[64];
  for (int r = 0; r < 2; r++) {
    tf_flash_args b = bg;
    b.deterministic = r == 1;
    if (!CHECK_OK(gpu_backward(b, g[r][0], g[r][1], g[r][2], NULL))) break;
    for (int i = 0; i < 3; i++) {
      snprintf(op, sizeof op, "backward o, do merged %s%s [%s]", GRAD_NAMES[i], r ? " deterministic" : "", path);
      if (r) identical(op, note, dt, g[r][i], det[i]);
      else same_as(op, note, dt, g[r][i], cpu[i], tol_of(dt), zero[i] > 0 ? zero[i] : 1.0);
    }
  }
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 3; i++) flat_pair_free(&g[r][i]);
  flat_pair_free(&om), flat_pair_free(&dm);
}

/* q and k of a low-scores case: each key of a problem a random row u
 * plus noise (u + n / 2), each query -4 u + m / 2 (n, m standard normal),
 * so that every score is near -4 |u|^2 (about -4 d; the case's scale is
 * 1/sqrt(d)) and exp(-lse) is past f16's range, while dQ = scale dS K, whose
 * dS sums to zero over the keys, still has the noise's size. A backward
 * kernel that gives a key past seq_k (a zero row of the tile) P = exp(0 -
 * lse) instead of 0 then has dS overflow to infinity there in f16, and dQ
 * turns NaN (infinity times the zero row); randn inputs reach such rows
 * rarely (one H200 run in some dozens: seed 1795868642590370, d = 32). */
static void low_scores(const flash_shape *s, tf_dtype dt, int64_t off, flat_pair *q, flat_pair *k) {
  const int64_t d = s->d, nq = s->batch * s->sq * d, nk = s->batch * s->sk * d;
  double *u = random_values(s->batch * d, dt, 1.0), *qv = random_values(nq, dt, 0.5), *kv = random_values(nk, dt, 0.5);
  for (int64_t b = 0; b < s->batch; b++)
    for (int64_t i = 0; i < d; i++) {
      for (int64_t t = 0; t < s->sq; t++) qv[(b * s->sq + t) * d + i] -= 4 * u[b * d + i];
      for (int64_t t = 0; t < s->sk; t++) kv[(b * s->sk + t) * d + i] += u[b * d + i];
    }
  *q = flat_pair_of(qv, nq, dt, off), *k = flat_pair_of(kv, nk, dt, off);
  free(u), free(qv), free(kv);
}

static void flash_case_with(const flash_shape *s, tf_dtype dt, bool causal, int64_t off, bool low) {
  const char *fpath = path_of(dt, s->d, off), *path = fpath;
  char note[160], op[48];
  snprintf(note, sizeof note, "%s %s B=%lld Sq=%lld Sk=%lld d=%lld%s%s [forward %s, backward %s]", tf_dtype_name(dt),
           causal ? "causal" : "full", (long long)s->batch, (long long)s->sq, (long long)s->sk, (long long)s->d,
           off ? " misaligned" : "", low ? " low scores" : "", fpath, path);
  /* 1/sqrt(d), sometimes sharper (the running max then moves more), sometimes negative (the
   * forward kernels then flip the signs of their copy of q) */
  double scale = (rng_uniform() < 0.5 ? 1.0 : 2.5) / sqrt((double)s->d) * (rng_uniform() < 0.2 ? -1.0 : 1.0);
  const int64_t nq = s->batch * s->sq * s->d, nk = s->batch * s->sk * s->d, rows = s->batch * s->sq;
  flat_pair q, k;
  if (low) low_scores(s, dt, off, &q, &k), scale = 1 / sqrt((double)s->d);
  else q = flat_pair_randn(nq, dt, 1.0, off), k = flat_pair_randn(nk, dt, 1.0, off);
  flat_pair v = flat_pair_randn(nk, dt, 1.0, off);
  flat_pair dout = flat_pair_randn(nq, dt, 1.0, off);
  flat_pair o = pair_nan(nq, dt, off), o2 = pair_nan(nq, dt, off);
  flat_pair lse = pair_nan(rows, TF_F32, 0), lse2 = pair_nan(rows, TF_F32, 0);
  const double tol = tol_of(dt);

  /* forward */
  tf_flash_args a = args_of(s, dt, causal, scale), ac = a, ag = a;
  ac.q = CP(q), ac.k = CP(k), ac.v = CP(v), ac.o = CP(o), ac.lse = CP(lse);
  ag.q = GP(q), ag.k = GP(k), ag.v = GP(v), ag.o = GP(o), ag.lse = GP(lse);
  bool ok = CHECK_OK(cctx->backend->flash_attention(cctx, &ac)) && CHECK_OK(gctx->backend->flash_attention(gctx, &ag));
  if (ok) {
    snprintf(op, sizeof op, "forward o [%s]", fpath);
    same(op, note, dt, o, tol);
    snprintf(op, sizeof op, "forward lse [%s]", fpath);
    same(op, note, dt, lse, LSE_TOL);
    tf_flash_args again = ag;
    again.o = GP(o2), again.lse = GP(lse2);
    if (CHECK_OK(gctx->backend->flash_attention(gctx, &again))) {
      snprintf(op, sizeof op, "forward twice o [%s]", fpath);
      identical(op, note, dt, o, o2);
      snprintf(op, sizeof op, "forward twice lse [%s]", fpath);
      identical(op, note, dt, lse, lse2);
    }
    if (s->batch > 1) merged_case(note, fpath, dt, ac, ag, o, off);
  }

  /* backward from the CPU's o and lse; float atomics, then deterministic twice */
  flat_pair oin = pair_from_cpu(o), lin = pair_from_cpu(lse);
  flat_pair g[3][3]; /* run x (dq, dk, dv) */
  for (int r = 0; r < 3; r++)
    g[r][0] = pair_nan(nq, dt, off), g[r][1] = pair_nan(nk, dt, off), g[r][2] = pair_nan(nk, dt, off);
  tf_flash_args bc = ac, bg = ag;
  bc.backward = bg.backward = true;
  bc.o = CP(oin), bc.lse = CP(lin), bc.dout = CP(dout);
  bg.o = GP(oin), bg.lse = GP(lin), bg.dout = GP(dout);
  bc.dq = CP(g[0][0]), bc.dk = CP(g[0][1]), bc.dv = CP(g[0][2]);
  CHECK_INT(cctx->backend->flash_workspace(cctx, &bc), 0);
  ok = ok && CHECK_OK(cctx->backend->flash_attention(cctx, &bc));
  /* D of each run: deterministic on a 9.0 device the dQ kernel sums it, else the row-sum kernel */
  float *dsum[3];
  for (int r = 0; r < 3; r++) dsum[r] = calloc((size_t)rows, sizeof(float));
  for (int r = 0; r < 3 && ok; r++) {
    tf_flash_args b = bg;
    b.deterministic = r > 0;
    ok = CHECK_OK(gpu_backward(b, g[r][0], g[r][1], g[r][2], dsum[r]));
  }
  for (int r = 1; r < 3 && ok; r++) {
    snprintf(op, sizeof op, "backward D deterministic [%s]", path);
    const bool eq = memcmp(dsum[r], dsum[0], (size_t)rows * sizeof(float)) == 0;
    record(op, dt, eq ? 0.0 : INFINITY, 0.0);
    if (!eq) fprintf(stderr, "FAIL %s %s: run %d's D differs in its bits from the pass with reductions\n", op, note, r);
    CHECK(eq);
  }
  for (int r = 0; r < 3; r++) free(dsum[r]);
  if (ok) {
    /* the size of one term of dq = scale dS K, dk = scale dS^T Q, dv = P^T dO */
    const double dp = max_abs(dout) * max_abs(v), zero[3] = {fabs(scale) * dp * max_abs(k), fabs(scale) * dp * max_abs(q),
                                                            max_abs(dout)};
    for (int r = 0; r < 2; r++)
      for (int i = 0; i < 3; i++) { /* the CPU's result is run 0's CPU side */
        snprintf(op, sizeof op, "backward %s%s [%s]", GRAD_NAMES[i], r ? " deterministic" : "", path);
        same_as(op, note, dt, g[r][i], g[0][i], tol, zero[i] > 0 ? zero[i] : 1.0);
      }
    for (int i = 0; i < 3; i++) {
      snprintf(op, sizeof op, "deterministic twice %s [%s]", GRAD_NAMES[i], path);
      identical(op, note, dt, g[1][i], g[2][i]);
    }
    if (s->batch > 1) merged_backward_case(note, path, dt, bg, oin, dout, g[1], g[0], zero);
  }

  for (int r = 0; r < 3; r++)
    for (int i = 0; i < 3; i++) flat_pair_free(&g[r][i]);
  flat_pair *all[] = {&q, &k, &v, &dout, &o, &o2, &lse, &lse2, &oin, &lin};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) flat_pair_free(all[i]);
}

static void flash_case(const flash_shape *s, tf_dtype dt, bool causal, int64_t off) {
  flash_case_with(s, dt, causal, off, false);
}

/* LOW_SHAPES in f16, causal or not, on the kernels the run picks. f16 is
 * the dtype whose range exp(-lse) overflows; bf16 has f32's range, and its
 * 8-bit mantissa, with the sharper softmax of these inputs (the scores of
 * a row spread about twice as wide as randn's), puts the kernels' rounding
 * of P and dS past the 1e-2 tolerance on dK in some draws: an H200 run
 * measured 0.0108 (seed 1795873131603811, d = 96), and an emulation of that
 * rounding in numpy (P and dS rounded to bf16, f32 sums) over 3000 draws
 * put 1.7 % of them past 1e-2 at d = 96 and 3.9 % at d = 32, against none
 * for randn inputs and none in f16 (worst 0.006). Not f32: its tolerance
 * (1e-5) is for inputs of ordinary size, and with scores near -4 d the
 * rounding of the scores alone moves P by about that much (the H200
 * measured 1.1e-5 to 1.6e-5 on the SIMT kernels, which mask keys past
 * seq_k as the CPU does). */
static void low_checks(void) {
  for (int i = 0; i < (int)(sizeof LOW_SHAPES / sizeof LOW_SHAPES[0]); i++)
    for (int causal = 0; causal < 2; causal++) flash_case_with(&LOW_SHAPES[i], TF_F16, causal, 0, true);
}

/* ---- timings ------------------------------------------------------------------------------------ */

typedef enum { RUN_FORWARD, RUN_BACKWARD, RUN_BOTH } bench_run;

static tf_status bench_once(tf_flash_args fwd, tf_flash_args bwd, bench_run what) {
  tf_status st = TF_OK;
  if (what != RUN_BACKWARD) st = gctx->backend->flash_attention(gctx, &fwd);
  if (st == TF_OK && what != RUN_FORWARD) st = gctx->backend->flash_attention(gctx, &bwd);
  return st;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of 10 timed runs after 3 warm-up runs, in ms (negative on failure). */
static double bench_ms(tf_flash_args fwd, tf_flash_args bwd, bench_run what) {
  enum { WARMUP = 3, ITERS = 10 };
  double ms[ITERS];
  for (int i = 0; i < WARMUP + ITERS; i++) {
    tf_event *e0 = NULL, *e1 = NULL;
    double t = -1;
    tf_status st = gctx->backend->event_record(gctx, &e0);
    if (st == TF_OK) st = bench_once(fwd, bwd, what);
    if (st == TF_OK) st = gctx->backend->event_record(gctx, &e1);
    if (st == TF_OK) st = gctx->backend->event_elapsed_ms(gctx, e0, e1, &t);
    gctx->backend->event_destroy(gctx, e0);
    gctx->backend->event_destroy(gctx, e1);
    if (!CHECK_OK(st)) return -1;
    if (i >= WARMUP) ms[i - WARMUP] = t;
  }
  qsort(ms, ITERS, sizeof ms[0], cmp_double);
  return (ms[ITERS / 2 - 1] + ms[ITERS / 2]) / 2;
}

static tf_tensor *gpu_tensor(tf_shape s, tf_dtype d, bool random) {
  tf_tensor *t = NULL;
  tf_status st = random ? tf_random(TF_RANDOM_NORMAL, &s, 0.0, 1.0, d, GPU, &t) : tf_tensor_empty(&s, d, GPU, &t);
  return CHECK_OK(st) ? t : NULL;
}

/* Forward, backward and both; forward alone when forward_only, its row
 * starting with label. */
static void bench_run_shape(int64_t B, int64_t S, int64_t d, bool forward_only, const char *label) {
  const tf_shape x = SHAPE(B, S, d), rows = SHAPE(B, S);
  tf_tensor *q = gpu_tensor(x, TF_BF16, true), *k = gpu_tensor(x, TF_BF16, true), *v = gpu_tensor(x, TF_BF16, true);
  tf_tensor *dout = gpu_tensor(x, TF_BF16, true), *o = gpu_tensor(x, TF_BF16, false);
  tf_tensor *lse = gpu_tensor(rows, TF_F32, false), *dq = gpu_tensor(x, TF_BF16, false);
  tf_tensor *dk = gpu_tensor(x, TF_BF16, false), *dv = gpu_tensor(x, TF_BF16, false);
  tf_tensor *ts[] = {q, k, v, dout, o, lse, dq, dk, dv};
  bool have = true;
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) have = have && ts[i];
  tf_block *ws = NULL;
  tf_flash_args fwd = {.causal = true, .dtype = TF_BF16, .batch = B, .seq_q = S, .seq_k = S, .head_dim = d,
                       .scale = 1.0 / sqrt((double)d)};
  tf_flash_args bwd = fwd;
  if (have) {
    fwd.q = bwd.q = tf_tensor_data(q), fwd.k = bwd.k = tf_tensor_data(k), fwd.v = bwd.v = tf_tensor_data(v);
    fwd.o = bwd.o = tf_tensor_data(o), fwd.lse = bwd.lse = tf_tensor_data(lse);
    bwd.backward = true;
    bwd.dout = tf_tensor_data(dout), bwd.dq = tf_tensor_data(dq), bwd.dk = tf_tensor_data(dk), bwd.dv = tf_tensor_data(dv);
    have = CHECK_OK(tf_alloc(&gctx->alloc, gctx->backend->flash_workspace(gctx, &bwd), &ws));
    bwd.workspace = ws ? ws->ptr : NULL;
  }
  if (have && forward_only) {
    const double flops = 4.0 * (double)B * (double)S * (double)S * (double)d / 2, f = bench_ms(fwd, bwd, RUN_FORWARD);
    printf("%sbf16 causal B=%-3lld S=%-5lld d=%-3lld  forward %7.3f ms %6.1f TFLOP/s\n", label, (long long)B,
           (long long)S, (long long)d, f, flops / f * 1e-9);
  } else if (have) {
    const double fwd_flops = 4.0 * (double)B * (double)S * (double)S * (double)d / 2, bwd_flops = 2.5 * fwd_flops;
    const double f = bench_ms(fwd, bwd, RUN_FORWARD), b = bench_ms(fwd, bwd, RUN_BACKWARD),
                 fb = bench_ms(fwd, bwd, RUN_BOTH);
    tf_flash_args bdet = bwd;
    bdet.deterministic = true;
    const double bd = bench_ms(fwd, bdet, RUN_BACKWARD), fbd = bench_ms(fwd, bdet, RUN_BOTH);
    printf("bf16 causal B=%-2lld S=%-5lld d=%-3lld  forward %7.3f ms %6.1f TFLOP/s | backward %7.3f ms %6.1f TFLOP/s"
           " | both %7.3f ms %6.1f TFLOP/s\n",
           (long long)B, (long long)S, (long long)d, f, fwd_flops / f * 1e-9, b, bwd_flops / b * 1e-9, fb,
           (fwd_flops + bwd_flops) / fb * 1e-9);
    printf("%42s deterministic: backward %7.3f ms %6.1f TFLOP/s | both %7.3f ms %6.1f TFLOP/s\n", "", bd,
           bwd_flops / bd * 1e-9, fbd, (fwd_flops + bwd_flops) / fbd * 1e-9);
  }
  if (ws) tf_alloc_free(&gctx->alloc, ws);
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tf_tensor_release(ts[i]);
}

static void bench_shape(int64_t B, int64_t S, int64_t d) { bench_run_shape(B, S, d, false, ""); }
static void bench_forward(int64_t B, int64_t S, int64_t d) { bench_run_shape(B, S, d, true, ""); }

/* An environment variable set for a pass: env_set keeps its value, sets it
 * and returns what was kept; env_restore puts it back (or unsets it). */
typedef struct saved_env {
  const char *name;
  char *value; /* NULL: it was unset */
} saved_env;

static saved_env env_set(const char *name, const char *value) {
  const char *old = getenv(name);
  saved_env s = {name, old ? strdup(old) : NULL};
  setenv(name, value, 1);
  return s;
}

static void env_restore(saved_env *s) {
  if (s->value) setenv(s->name, s->value, 1);
  else unsetenv(s->name);
  free(s->value);
  s->value = NULL;
}

/* The warp-specialised forward kernel's blocks of 192 keys at head dims
 * 80 and 96, which it takes from 4096 keys on: at every length here
 * (TF_FLASH_FWD_LONG=0), on the shapes of head dims 72..104 (tiny: the
 * tiny ones, bf16), so that lengths off 192 and racecheck stay cheap. */
static void fwd_long_pass(bool only_small) {
  static const tf_dtype dts[2] = {TF_F16, TF_BF16};
  saved_env fwd_long = env_set("TF_FLASH_FWD_LONG", "0");
  for (int di = tiny_run ? 1 : 0; di < 2; di++)
    for (int i = 0; i < N_SHAPES; i++) {
      const flash_shape *sh = &SHAPES[i];
      if ((only_small && sh->big) || sh->d < 72 || sh->d > 104 || sh->d % 8 != 0) continue;
      if (tiny_run && !tiny_shape(sh)) continue;
      for (int causal = 0; causal < 2; causal++) flash_case(sh, dts[di], causal, 0);
    }
  env_restore(&fwd_long);
}

/* Every check: each dtype and shape, causal or not, on the kernels the
 * device picks, then the kernels the wgmma ones replace, then the
 * forward kernel's long-sequence blocks, then misaligned buffers. */
static void all_checks(void) {
  static const tf_dtype dts[3] = {TF_F32, TF_F16, TF_BF16};
  for (int di = 0; di < 3; di++)
    for (int i = 0; i < N_SHAPES; i++) {
      if (small_run && SHAPES[i].big) continue;
      for (int causal = 0; causal < 2; causal++) flash_case(&SHAPES[i], dts[di], causal, 0);
    }
  low_checks();
  /* where the wgmma kernel ran, the mma.sync kernel it replaced on the same shapes */
  if (wgmma_device) {
    setenv("TF_FLASH_WGMMA", "0", 1);
    for (int di = 1; di < 3; di++)
      for (int i = 0; i < N_SHAPES; i++) {
        if ((small_run && SHAPES[i].big) || !wgmma_dim(SHAPES[i].d) || SHAPES[i].d % 8 != 0) continue;
        for (int causal = 0; causal < 2; causal++) flash_case(&SHAPES[i], dts[di], causal, 0);
      }
    low_checks();
    unsetenv("TF_FLASH_WGMMA");
  }
  if (wgmma_device) fwd_long_pass(small_run);
  /* buffers off a 16-byte boundary: the SIMT kernels for every dtype */
  for (int di = 0; di < 3; di++)
    for (int causal = 0; causal < 2; causal++) {
      flash_case(&SHAPES[4], dts[di], causal, 1);
      flash_case(&SHAPES[11], dts[di], causal, 1);
    }
  CHECK_OK(tf_device_sync(GPU));
  print_table();
  CHECK_INT(gctx->alloc.stats.active_blocks, 0);
}

int main(void) {
  tf_backends_init();
  small_run = gpu_test_begin();
  if (!CHECK_OK(tf_device_ctx_get(tf_cpu(), &cctx)) || !CHECK_OK(tf_device_ctx_get(GPU, &gctx))) return 1;
  if (!CHECK(gctx->backend->flash_attention && gctx->backend->flash_workspace)) return tf_check_done();

  tf_device_info info = {0};
  if (CHECK_OK(gctx->backend->info(gctx, &info))) {
#ifdef TF_WITH_SM90A
    wgmma_device = info.cc_major == 9 && info.cc_minor == 0;
#endif
    printf("device %s (%d.%d): %s the wgmma kernels for head dims 40..128\n", info.name, info.cc_major,
           info.cc_minor, wgmma_device ? "checks" : "has no");
  }
  const char *san = getenv("TF_FLASH_SANITIZE");
  if (san) {
    /* under a sanitizer's race checks (slow): the small shapes the tensor-core kernels take, bf16;
       with TF_FLASH_SANITIZE=tiny one shape a Hopper head dim (tiny_shape) */
    tiny_run = strcmp(san, "tiny") == 0;
    printf("TF_FLASH_SANITIZE: bf16, head dims that are multiples of 8, %s\n",
           tiny_run ? "one small shape a Hopper head dim" : "small shapes only");
    for (int i = 0; i < N_SHAPES; i++)
      if (!SHAPES[i].big && SHAPES[i].d % 8 == 0 && (!tiny_run || tiny_shape(&SHAPES[i])))
        for (int causal = 0; causal < 2; causal++) {
          flash_case(&SHAPES[i], TF_BF16, causal, 0);
          printf("  done: (%lld, %lld, %lld, %lld)%s\n", (long long)SHAPES[i].batch, (long long)SHAPES[i].sq,
                 (long long)SHAPES[i].sk, (long long)SHAPES[i].d, causal ? " causal" : "");
          fflush(stdout);
        }
    if (wgmma_device) low_checks(), fwd_long_pass(true);
    CHECK_INT(gctx->alloc.stats.active_blocks, 0);
    return tf_check_done();
  }
  const char *bench = getenv("TF_FLASH_BENCH");
  if (!(bench && strcmp(bench, "only") == 0)) all_checks();
  if (bench) {
    printf("\ntimings (CUDA events, median of 10 after 3 warm-up runs; PyTorch's side of the same shapes:"
           " tests/reference/torch_attention.py --leaderboard, and --flash --batch 16 --seq 16384)\n");
    bench_shape(16, 16384, 64);
    bench_shape(16, 16384, 128);
    bench_shape(8, 4096, 64);
    bench_shape(1, 16384, 64);
    bench_shape(128, 4096, 80);
    bench_shape(128, 1024, 80);
    bench_shape(16, 16384, 96);
    if (wgmma_device) {
      printf("\nforward, the mma.sync kernel (TF_FLASH_WGMMA=0) in place of the wgmma one\n");
      setenv("TF_FLASH_WGMMA", "0", 1);
      bench_forward(16, 16384, 64);
      bench_forward(16, 16384, 128);
      printf("\nhead dim 80, the mma.sync kernels (TF_FLASH_WGMMA=0; padded to 96 there)\n");
      bench_shape(128, 4096, 80);
      unsetenv("TF_FLASH_WGMMA");
    }
  }
  return tf_check_done();
}
