/* The CPU backend's row visitor (cpu.h), spread over the cores: the rows
 * (or, when rows are long, pieces of rows) are cut into pieces of about
 * TF_CPU_PIECE elements, and each piece is visited by one thread. Every
 * element is computed by the same code whatever the thread count. */
#include "iter.h"
#include "cpu.h"

enum { TF_CPU_PIECE = 1 << 14 };

/* Rows r0..r1 - 1, columns c0..c1 - 1 of each. */
static void tf_cpu_visit(const tf_iter *it, int64_t r0, int64_t r1, int64_t c0, int64_t c1, tf_cpu_row_fn fn,
                         void *ud) {
  const int nd = it->ndim;
  const int64_t *so = it->stride[0], *s0 = it->stride[1], *s1 = it->stride[2];
  int64_t idx[TF_MAX_DIMS] = {0}, oo = it->offset[0], o0 = it->offset[1], o1 = it->offset[2];
  int64_t rest = r0;
  for (int d = nd - 2; d >= 0; d--) { /* row r0's index over the outer dims */
    idx[d] = rest % it->shape[d];
    rest /= it->shape[d];
    oo += idx[d] * so[d], o0 += idx[d] * s0[d], o1 += idx[d] * s1[d];
  }
  const int64_t l = nd - 1;
  for (int64_t r = r0; r < r1; r++) {
    fn(ud, oo + c0 * so[l], o0 + c0 * s0[l], o1 + c0 * s1[l], c1 - c0, s0[l], s1[l]);
    for (int d = nd - 2; d >= 0; d--) {
      idx[d]++;
      o0 += s0[d], o1 += s1[d], oo += so[d];
      if (idx[d] < it->shape[d]) break;
      o0 -= s0[d] * it->shape[d], o1 -= s1[d] * it->shape[d], oo -= so[d] * it->shape[d];
      idx[d] = 0;
    }
  }
}

void tf_cpu_for_rows(const tf_tensor *out, const tf_tensor *in0, const tf_tensor *in1, tf_cpu_row_fn fn, void *ud) {
  tf_iter it;
  tf_iter_init(&it, out, in0, in1);
  const int64_t n = it.shape[it.ndim - 1], rows = it.numel / (n ? n : 1);
  if (it.numel <= TF_CPU_PARALLEL_MIN || tf_cpu_threads() == 1) {
    tf_cpu_visit(&it, 0, rows, 0, n, fn, ud);
    return;
  }
  if (n >= TF_CPU_PIECE) { /* long rows: pieces of one row */
    const int64_t per_row = (n + TF_CPU_PIECE - 1) / TF_CPU_PIECE;
#pragma omp parallel for schedule(static)
    for (int64_t q = 0; q < rows * per_row; q++) {
      const int64_t r = q / per_row, c0 = q % per_row * TF_CPU_PIECE;
      tf_cpu_visit(&it, r, r + 1, c0, c0 + TF_CPU_PIECE < n ? c0 + TF_CPU_PIECE : n, fn, ud);
    }
    return;
  }
  const int64_t per_piece = TF_CPU_PIECE / n; /* short rows: several a piece */
#pragma omp parallel for schedule(static)
  for (int64_t q = 0; q < (rows + per_piece - 1) / per_piece; q++) {
    const int64_t r0 = q * per_piece;
    tf_cpu_visit(&it, r0, r0 + per_piece < rows ? r0 + per_piece : rows, 0, n, fn, ud);
  }
}
