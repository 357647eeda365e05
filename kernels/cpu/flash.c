/* FlashAttention-2 on the CPU: the twin of kernels/cuda/flash/flash_attn.cu and the
 * reference its kernels are tested against. The algorithm is the GPU's,
 * tile for tile: a block of queries meets the key blocks one after another
 * with an online softmax (running max and sum, earlier partial outputs
 * rescaled whenever the max grows), key blocks wholly above the causal
 * diagonal are never visited, and the backward pass recomputes the
 * probabilities from lse instead of storing them. Everything accumulates
 * in double and is rounded once, into the output's dtype.
 *
 * Work is spread over (problem, query block) with OpenMP; the backward pass
 * gives dK and dV to one task per key block and dQ to one task per query
 * block (two passes), so each output has one owner, summed in a fixed
 * order: the results do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu_nn.h"

/* Queries and keys per block: small enough that short test sequences
 * (37, 129) cross several blocks, large enough to amortise a block's setup. */
enum { TF_CPU_FLASH_BR = 32, TF_CPU_FLASH_BC = 32 };
enum { TF_CPU_FLASH_PARALLEL_MIN = 1 << 16 };

/* The problem's sizes and base pointers, shared by the passes. */
typedef struct tf_cpu_flash {
  const tf_flash_args *a;
  tf_dtype d, sd;             /* element dtype, statistics dtype (lse) */
  int64_t sq, sk, hd;         /* seq_q, seq_k, head_dim */
  int64_t q_blocks, k_blocks; /* per problem */
  int64_t o_ld, o_group;      /* O's and dout's row stride, problems sharing a row (tf_flash_o_layout) */
  double *rowdot;             /* backward: D = rowsum(dout * o), (batch, seq_q) */
} tf_cpu_flash;

/* Rows [row0, row0 + n) of a (seq, hd) matrix of problem b, widened to
 * double: row-major, or transposed (hd, TF_CPU_FLASH_BC) for key blocks
 * whose products run along the keys. */
static void tf_cpu_flash_rows(const tf_cpu_flash *f, const void *src, int64_t seq, int64_t b, int64_t row0,
                              int64_t n, double *dst) {
  const int64_t base = (b * seq + row0) * f->hd;
  for (int64_t i = 0; i < n * f->hd; i++) dst[i] = tf_elem_get(src, f->d, base + i);
}

/* Element c of row t of problem b in O's layout (rows o_ld apart, o_group
 * problems side by side in a row): O, and dout in the backward pass. */
static int64_t tf_cpu_flash_o_at(const tf_cpu_flash *f, int64_t b, int64_t t, int64_t c) {
  return ((b / f->o_group) * f->sq + t) * f->o_ld + (b % f->o_group) * f->hd + c;
}

/* Rows [row0, row0 + n) of problem b's dout, in O's layout. */
static void tf_cpu_flash_dout_rows(const tf_cpu_flash *f, int64_t b, int64_t row0, int64_t n, double *dst) {
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < f->hd; c++)
      dst[r * f->hd + c] = tf_elem_get(f->a->dout, f->d, tf_cpu_flash_o_at(f, b, row0 + r, c));
}

static void tf_cpu_flash_rows_t(const tf_cpu_flash *f, const void *src, int64_t seq, int64_t b, int64_t row0,
                                int64_t n, double *dst) {
  const int64_t base = (b * seq + row0) * f->hd;
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < f->hd; c++) dst[c * TF_CPU_FLASH_BC + r] = tf_elem_get(src, f->d, base + r * f->hd + c);
}

/* Rows [row0, row0 + n) of problem b's (seq, hd) output from src, times
 * mul: rows ld elements apart, group problems side by side in a row (hd
 * and 1 but for O under o_row_stride). */
static void tf_cpu_flash_store(const tf_cpu_flash *f, void *dst, int64_t seq, int64_t b, int64_t row0, int64_t n,
                               const double *src, double mul, int64_t ld, int64_t group) {
  const int64_t base = ((b / group) * seq + row0) * ld + (b % group) * f->hd;
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < f->hd; c++) tf_elem_set(dst, f->d, base + r * ld + c, src[r * f->hd + c] * mul);
}

/* How many keys of the block starting at k0 (nk of them) query row sees:
 * all of them, or under the causal mask those up to the row itself. */
static int64_t tf_cpu_flash_visible(const tf_cpu_flash *f, int64_t row, int64_t k0, int64_t nk) {
  if (!f->a->causal) return nk;
  int64_t v = row - k0 + 1;
  return v < 0 ? 0 : v < nk ? v : nk;
}

/* Keys a query block [q0, q0 + nq) needs: all, or under the causal mask
 * those up to its last row (later key blocks are wholly masked). */
static int64_t tf_cpu_flash_key_end(const tf_cpu_flash *f, int64_t q0, int64_t nq) {
  if (!f->a->causal) return f->sk;
  return q0 + nq < f->sk ? q0 + nq : f->sk;
}

/* ---- forward ---------------------------------------------------------------------- */

/* One query block of one problem against every key block it sees. scratch
 * holds q (BR, hd), kt (hd, BC), v (BC, hd), acc (BR, hd), s (BC), m and l (BR). */
static void tf_cpu_flash_forward_block(const tf_cpu_flash *f, int64_t b, int64_t qb, double *scratch) {
  const tf_flash_args *a = f->a;
  const int64_t hd = f->hd, q0 = qb * TF_CPU_FLASH_BR;
  const int64_t nq = f->sq - q0 < TF_CPU_FLASH_BR ? f->sq - q0 : TF_CPU_FLASH_BR;
  double *q = scratch, *kt = q + TF_CPU_FLASH_BR * hd, *v = kt + TF_CPU_FLASH_BC * hd;
  double *acc = v + TF_CPU_FLASH_BC * hd, *s = acc + TF_CPU_FLASH_BR * hd, *m = s + TF_CPU_FLASH_BC;
  double *l = m + TF_CPU_FLASH_BR;
  tf_cpu_flash_rows(f, a->q, f->sq, b, q0, nq, q);
  memset(acc, 0, sizeof(double) * (size_t)(nq * hd));
  for (int64_t i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0;
  const int64_t key_end = tf_cpu_flash_key_end(f, q0, nq);
  for (int64_t k0 = 0; k0 < key_end; k0 += TF_CPU_FLASH_BC) {
    const int64_t nk = key_end - k0 < TF_CPU_FLASH_BC ? key_end - k0 : TF_CPU_FLASH_BC;
    tf_cpu_flash_rows_t(f, a->k, f->sk, b, k0, nk, kt);
    tf_cpu_flash_rows(f, a->v, f->sk, b, k0, nk, v);
    for (int64_t i = 0; i < nq; i++) {
      const int64_t vis = tf_cpu_flash_visible(f, q0 + i, k0, nk);
      if (vis == 0) continue;
      const double *qi = q + i * hd;
      for (int64_t j = 0; j < vis; j++) s[j] = 0;
      for (int64_t c = 0; c < hd; c++)
        for (int64_t j = 0; j < vis; j++) s[j] += qi[c] * kt[c * TF_CPU_FLASH_BC + j];
      double mx = m[i];
      for (int64_t j = 0; j < vis; j++) {
        s[j] *= a->scale;
        if (s[j] > mx) mx = s[j];
      }
      /* the running max only grows: earlier terms shrink by exp(old - new) */
      const double alpha = exp(m[i] - mx);
      double sum = 0;
      for (int64_t j = 0; j < vis; j++) sum += s[j] = exp(s[j] - mx);
      l[i] = l[i] * alpha + sum;
      m[i] = mx;
      double *oi = acc + i * hd;
      for (int64_t c = 0; c < hd; c++) oi[c] *= alpha;
      for (int64_t j = 0; j < vis; j++)
        for (int64_t c = 0; c < hd; c++) oi[c] += s[j] * v[j * hd + c];
    }
  }
  /* A row with no key at all (seq_k = 0) has lse -inf and an output of zeros. */
  for (int64_t i = 0; i < nq; i++) {
    const double inv = l[i] > 0 ? 1 / l[i] : 0;
    for (int64_t c = 0; c < hd; c++) acc[i * hd + c] *= inv;
    tf_elem_set(a->lse, f->sd, b * f->sq + q0 + i, m[i] + log(l[i]));
  }
  tf_cpu_flash_store(f, a->o, f->sq, b, q0, nq, acc, 1.0, f->o_ld, f->o_group);
}

/* ---- backward ------------------------------------------------------------------- */

/* P, dP and dS of query row i of a block against key j of another, each
 * widened block row-major: returns p and stores ds = p (dp - D). */
static inline double tf_cpu_flash_ds(const tf_cpu_flash *f, const double *qi, const double *doi, double lse_i,
                                     double d_i, const double *kj, const double *vj, double *ds) {
  double s = 0, dp = 0;
  for (int64_t c = 0; c < f->hd; c++) {
    s += qi[c] * kj[c];
    dp += doi[c] * vj[c];
  }
  const double p = exp(s * f->a->scale - lse_i);
  *ds = p * (dp - d_i);
  return p;
}

/* One key block's dK and dV: every query block at or below the diagonal.
 * scratch holds k, v, dk, dv (BC, hd), q and dO (BR, hd), lse and D (BR). */
static void tf_cpu_flash_dkdv_block(const tf_cpu_flash *f, int64_t b, int64_t kb, double *scratch) {
  const tf_flash_args *a = f->a;
  const int64_t hd = f->hd, k0 = kb * TF_CPU_FLASH_BC;
  const int64_t nk = f->sk - k0 < TF_CPU_FLASH_BC ? f->sk - k0 : TF_CPU_FLASH_BC;
  double *k = scratch, *v = k + TF_CPU_FLASH_BC * hd, *dk = v + TF_CPU_FLASH_BC * hd, *dv = dk + TF_CPU_FLASH_BC * hd;
  double *q = dv + TF_CPU_FLASH_BC * hd, *dO = q + TF_CPU_FLASH_BR * hd, *lse = dO + TF_CPU_FLASH_BR * hd;
  double *dd = lse + TF_CPU_FLASH_BR;
  tf_cpu_flash_rows(f, a->k, f->sk, b, k0, nk, k);
  tf_cpu_flash_rows(f, a->v, f->sk, b, k0, nk, v);
  memset(dk, 0, sizeof(double) * (size_t)(2 * TF_CPU_FLASH_BC * hd));
  /* under the causal mask, queries before k0 see none of these keys */
  const int64_t first = a->causal ? k0 / TF_CPU_FLASH_BR * TF_CPU_FLASH_BR : 0;
  for (int64_t q0 = first; q0 < f->sq; q0 += TF_CPU_FLASH_BR) {
    const int64_t nq = f->sq - q0 < TF_CPU_FLASH_BR ? f->sq - q0 : TF_CPU_FLASH_BR;
    tf_cpu_flash_rows(f, a->q, f->sq, b, q0, nq, q);
    tf_cpu_flash_dout_rows(f, b, q0, nq, dO);
    for (int64_t i = 0; i < nq; i++) {
      lse[i] = tf_elem_get(a->lse, f->sd, b * f->sq + q0 + i);
      dd[i] = f->rowdot[b * f->sq + q0 + i];
    }
    for (int64_t i = 0; i < nq; i++) {
      const int64_t vis = tf_cpu_flash_visible(f, q0 + i, k0, nk);
      const double *qi = q + i * hd, *doi = dO + i * hd;
      for (int64_t j = 0; j < vis; j++) {
        double ds;
        const double p = tf_cpu_flash_ds(f, qi, doi, lse[i], dd[i], k + j * hd, v + j * hd, &ds);
        double *dkj = dk + j * hd, *dvj = dv + j * hd;
        for (int64_t c = 0; c < hd; c++) {
          dvj[c] += p * doi[c];
          dkj[c] += ds * qi[c];
        }
      }
    }
  }
  tf_cpu_flash_store(f, a->dk, f->sk, b, k0, nk, dk, a->scale, f->hd, 1);
  tf_cpu_flash_store(f, a->dv, f->sk, b, k0, nk, dv, 1.0, f->hd, 1);
}

/* One query block's dQ: every key block it sees. scratch holds q, dO, dq
 * (BR, hd), k and v (BC, hd), lse and D (BR). */
static void tf_cpu_flash_dq_block(const tf_cpu_flash *f, int64_t b, int64_t qb, double *scratch) {
  const tf_flash_args *a = f->a;
  const int64_t hd = f->hd, q0 = qb * TF_CPU_FLASH_BR;
  const int64_t nq = f->sq - q0 < TF_CPU_FLASH_BR ? f->sq - q0 : TF_CPU_FLASH_BR;
  double *q = scratch, *dO = q + TF_CPU_FLASH_BR * hd, *dq = dO + TF_CPU_FLASH_BR * hd;
  double *k = dq + TF_CPU_FLASH_BR * hd, *v = k + TF_CPU_FLASH_BC * hd, *lse = v + TF_CPU_FLASH_BC * hd;
  double *dd = lse + TF_CPU_FLASH_BR;
  tf_cpu_flash_rows(f, a->q, f->sq, b, q0, nq, q);
  tf_cpu_flash_dout_rows(f, b, q0, nq, dO);
  memset(dq, 0, sizeof(double) * (size_t)(nq * hd));
  for (int64_t i = 0; i < nq; i++) {
    lse[i] = tf_elem_get(a->lse, f->sd, b * f->sq + q0 + i);
    dd[i] = f->rowdot[b * f->sq + q0 + i];
  }
  const int64_t key_end = tf_cpu_flash_key_end(f, q0, nq);
  for (int64_t k0 = 0; k0 < key_end; k0 += TF_CPU_FLASH_BC) {
    const int64_t nk = key_end - k0 < TF_CPU_FLASH_BC ? key_end - k0 : TF_CPU_FLASH_BC;
    tf_cpu_flash_rows(f, a->k, f->sk, b, k0, nk, k);
    tf_cpu_flash_rows(f, a->v, f->sk, b, k0, nk, v);
    for (int64_t i = 0; i < nq; i++) {
      const int64_t vis = tf_cpu_flash_visible(f, q0 + i, k0, nk);
      const double *qi = q + i * hd, *doi = dO + i * hd;
      double *dqi = dq + i * hd;
      for (int64_t j = 0; j < vis; j++) {
        double ds;
        (void)tf_cpu_flash_ds(f, qi, doi, lse[i], dd[i], k + j * hd, v + j * hd, &ds);
        const double *kj = k + j * hd;
        for (int64_t c = 0; c < hd; c++) dqi[c] += ds * kj[c];
      }
    }
  }
  tf_cpu_flash_store(f, a->dq, f->sq, b, q0, nq, dq, a->scale, f->hd, 1);
}

/* ---- the passes --------------------------------------------------------------------- */

typedef void (*tf_cpu_flash_block_fn)(const tf_cpu_flash *f, int64_t b, int64_t block, double *scratch);

/* Runs fn over every (problem, block) pair, blocks_per problem, in
 * parallel when the work is worth it; each task has its own scratch of
 * `doubles` values. Fails only when scratch memory cannot be had. */
static tf_status tf_cpu_flash_each(const tf_cpu_flash *f, int64_t blocks_per, size_t doubles, tf_cpu_flash_block_fn fn,
                                   const char *what) {
  const int64_t tasks = f->a->batch * blocks_per;
  const int64_t work = f->a->batch * f->sq * f->sk * f->hd;
  int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) if (work > TF_CPU_FLASH_PARALLEL_MIN)
  for (int64_t t = 0; t < tasks; t++) {
    double *scratch = malloc(doubles * sizeof(double));
    if (!scratch) {
#pragma omp atomic write
      failed = 1;
      continue;
    }
    fn(f, t / blocks_per, t % blocks_per, scratch);
    free(scratch);
  }
  if (failed) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for flash_attention's %s blocks", what);
  return TF_OK;
}

static tf_status tf_cpu_flash_forward(const tf_cpu_flash *f) {
  const size_t hd = (size_t)f->hd;
  const size_t doubles = 2 * TF_CPU_FLASH_BR * hd + 2 * TF_CPU_FLASH_BC * hd + TF_CPU_FLASH_BC + 2 * TF_CPU_FLASH_BR;
  return tf_cpu_flash_each(f, f->q_blocks, doubles, tf_cpu_flash_forward_block, "query");
}

/* D = rowsum(dout * o) once, then dK/dV per key block, then dQ per query block. */
static tf_status tf_cpu_flash_backward(tf_cpu_flash *f) {
  const tf_flash_args *a = f->a;
  const int64_t rows = a->batch * f->sq, hd = f->hd;
  f->rowdot = malloc((size_t)(rows > 0 ? rows : 1) * sizeof(double));
  if (!f->rowdot) return tf_fail(TF_ERR_OOM, "out of memory: no host memory for flash_attention's row sums");
#pragma omp parallel for schedule(static) if (rows * hd > TF_CPU_FLASH_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++) {
    double sum = 0;
    for (int64_t c = 0; c < hd; c++) {
      const int64_t at = tf_cpu_flash_o_at(f, r / f->sq, r % f->sq, c);
      sum += tf_elem_get(a->dout, f->d, at) * tf_elem_get(a->o, f->d, at);
    }
    f->rowdot[r] = sum;
  }
  const size_t per = 2 * TF_CPU_FLASH_BR * hd + 4 * TF_CPU_FLASH_BC * hd + 2 * TF_CPU_FLASH_BR;
  tf_status st = TF_OK;
  if (f->sk > 0) st = tf_cpu_flash_each(f, f->k_blocks, per, tf_cpu_flash_dkdv_block, "key");
  if (st == TF_OK) {
    const size_t per_q = 3 * TF_CPU_FLASH_BR * hd + 2 * TF_CPU_FLASH_BC * hd + 2 * TF_CPU_FLASH_BR;
    st = tf_cpu_flash_each(f, f->q_blocks, per_q, tf_cpu_flash_dq_block, "query");
  }
  free(f->rowdot);
  f->rowdot = NULL;
  return st;
}

/* The backend entry. Shapes come checked from the dispatcher; any head dim
 * works here, and f64 as well as f32, f16 and bf16. */
tf_status tf_cpu_flash_attention(tf_device_ctx *ctx, const tf_flash_args *a) {
  (void)ctx;
  if (a->dtype != TF_F32 && a->dtype != TF_F64 && a->dtype != TF_F16 && a->dtype != TF_BF16)
    return tf_fail(TF_ERR_ARG, "flash_attention: the CPU backend takes f32, f64, f16 or bf16, not %s",
                   tf_dtype_name(a->dtype));
  if (a->batch <= 0 || a->seq_q <= 0 || a->head_dim <= 0) return TF_OK;
  tf_cpu_flash f = {.a = a,
                    .d = a->dtype,
                    .sd = a->dtype == TF_F64 ? TF_F64 : TF_F32,
                    .sq = a->seq_q,
                    .sk = a->seq_k > 0 ? a->seq_k : 0,
                    .hd = a->head_dim};
  TF_TRY(tf_flash_o_layout(a, &f.o_ld, &f.o_group));
  f.q_blocks = (f.sq + TF_CPU_FLASH_BR - 1) / TF_CPU_FLASH_BR;
  f.k_blocks = (f.sk + TF_CPU_FLASH_BC - 1) / TF_CPU_FLASH_BC;
  return a->backward ? tf_cpu_flash_backward(&f) : tf_cpu_flash_forward(&f);
}

size_t tf_cpu_flash_workspace(tf_device_ctx *ctx, const tf_flash_args *args) {
  (void)ctx, (void)args;
  return 0;
}
