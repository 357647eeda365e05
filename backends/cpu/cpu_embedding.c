/* Token embeddings on the CPU, forward and backward: the eager op
 * (nnops.h: embedding) and the engine's encoder and index check
 * (model_kernels.h). The references of backends/cuda/embedding.cu and
 * model_encoder.cu. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

/* ---- embedding --------------------------------------------------------------- */

/* out[i] = weight[ids[i]]: rows copied bit for bit. */
static tf_status tf_cpu_embedding_forward(const tf_embedding_args *a, int64_t *bad) {
  *bad = tf_cpu_first_bad(a->ids, a->n, a->vocab);
  if (*bad >= 0) return TF_OK;
  size_t row = (size_t)a->dim * tf_dtype_size(a->weight->dtype);
  const char *w = tf_tensor_data(a->weight);
  char *out = tf_tensor_data(a->out);
  if (row == 0) return TF_OK;
  for (int64_t i = 0; i < a->n; i++) memcpy(out + (size_t)i * row, w + (size_t)tf_cpu_index(a->ids, i) * row, row);
  return TF_OK;
}

/* dweight[v] = sum of dout[i] over the positions i with ids[i] == v, in
 * position order: a stable counting sort of the positions by id, then one
 * double accumulator row per id. Rows of unused ids are zero. */
static tf_status tf_cpu_embedding_backward(const tf_embedding_args *a, int64_t *bad) {
  *bad = tf_cpu_first_bad(a->ids, a->n, a->vocab);
  if (*bad >= 0) return TF_OK;
  const int64_t n = a->n, dim = a->dim, vocab = a->vocab;
  int64_t *start = calloc((size_t)vocab + 1, sizeof *start), *order = malloc((size_t)n * sizeof *order);
  double *acc = malloc((size_t)(dim > 0 ? dim : 1) * sizeof *acc);
  if (!start || !order || !acc) {
    free(start), free(order), free(acc);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for embedding_backward's sort");
  }
  for (int64_t i = 0; i < n; i++) start[tf_cpu_index(a->ids, i) + 1]++;
  for (int64_t v = 0; v < vocab; v++) start[v + 1] += start[v];
  int64_t *fill = malloc((size_t)vocab * sizeof *fill);
  if (!fill && vocab > 0) {
    free(start), free(order), free(acc);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for embedding_backward's sort");
  }
  if (vocab > 0) memcpy(fill, start, (size_t)vocab * sizeof *fill);
  for (int64_t i = 0; i < n; i++) order[fill[tf_cpu_index(a->ids, i)]++] = i;
  free(fill);
  const void *dout = tf_tensor_data(a->dout);
  void *dw = tf_tensor_data(a->dweight);
  tf_dtype dd = a->dout->dtype, wd = a->dweight->dtype;
  for (int64_t v = 0; v < vocab; v++) {
    for (int64_t c = 0; c < dim; c++) acc[c] = 0;
    for (int64_t j = start[v]; j < start[v + 1]; j++) {
      int64_t base = order[j] * dim;
      for (int64_t c = 0; c < dim; c++) acc[c] += tf_elem_get(dout, dd, base + c);
    }
    for (int64_t c = 0; c < dim; c++) tf_elem_set(dw, wd, v * dim + c, acc[c]);
  }
  free(start), free(order), free(acc);
  return TF_OK;
}

/* The backend entry of both passes; each checks every id before using any. */
tf_status tf_cpu_embedding(tf_device_ctx *ctx, const tf_embedding_args *a, int64_t *bad) {
  (void)ctx;
  return a->backward ? tf_cpu_embedding_backward(a, bad) : tf_cpu_embedding_forward(a, bad);
}

/* The first bad index, as the GPU's atomicMin reports it. */
tf_status tf_cpu_index_check(tf_device_ctx *ctx, const int64_t *idx, int64_t n, int64_t limit, int64_t *bad) {
  (void)ctx;
  *bad = -1;
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= limit) {
      *bad = i;
      break;
    }
  return TF_OK;
}

/* ---- embedding -------------------------------------------------------------------- */

/* Forward copies rows; backward adds rows in position order, in f32. */
tf_status tf_cpu_encoder(tf_device_ctx *ctx, const tf_encoder_args *a) {
  (void)ctx;
  const int64_t dim = a->dim;
  if (!a->backward) {
    for (int64_t i = 0; i < a->n; i++)
      memcpy(a->out + i * dim, a->wte + tf_cpu_id(a->ids, i, a->vocab) * dim, (size_t)dim * sizeof(float));
    return TF_OK;
  }
  for (int64_t i = 0; i < a->n; i++) {
    float *row = a->dwte + tf_cpu_id(a->ids, i, a->vocab) * dim;
    const float *g = a->dout + i * dim;
    for (int64_t c = 0; c < dim; c++) row[c] += g[c];
  }
  return TF_OK;
}

