/* Token embeddings on the CPU, one lookup and one gradient routine for the
 * eager op (backend.h: embedding) and the engine's token embedding
 * (model_kernels.h: encoder, and its index check): the twin of
 * embedding.cu. The lookup copies rows bit for bit; the gradient adds each
 * id's dout rows in position order (a stable counting sort of the positions
 * by id), from zero into the eager op's gradient (rows of unused ids come
 * out zero), onto the values already there for the engine's. The eager
 * op's sums are taken in double and rounded once; the engine's in f32, the
 * very additions its GPU kernel makes, so both give the same bits. */
#include <stdlib.h>
#include <string.h>

#include "elemio.h"
#include "cpu.h"
#include "cpu_model.h"
#include "cpu_nn.h"

/* ids (n,) of an integer dtype, all already checked to be in [0, vocab). */
typedef struct tf_cpu_ids {
  const void *ids;
  tf_dtype dtype;
  int64_t n, vocab;
} tf_cpu_ids;

static int64_t tf_cpu_id_at(const tf_cpu_ids *ids, int64_t i) { return tf_elem_get_int(ids->ids, ids->dtype, i); }

/* out[i] = weight[ids[i]], rows of row_bytes. */
static void tf_cpu_gather(const tf_cpu_ids *ids, const void *weight, void *out, size_t row_bytes) {
  if (row_bytes == 0) return;
  for (int64_t i = 0; i < ids->n; i++)
    memcpy((char *)out + (size_t)i * row_bytes, (const char *)weight + (size_t)tf_cpu_id_at(ids, i) * row_bytes,
           row_bytes);
}

/* dweight[v] (+)= sum of dout[i] over the positions i with ids[i] == v, in
 * position order; in f32 when f32_sums, else in double. */
static tf_status tf_cpu_scatter_add(const tf_cpu_ids *ids, const void *dout, tf_dtype dd, void *dweight, tf_dtype wd,
                                    int64_t dim, bool add, bool f32_sums, const char *op) {
  const int64_t n = ids->n, vocab = ids->vocab;
  int64_t *start = calloc((size_t)vocab + 1, sizeof *start), *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
  int64_t *fill = malloc((size_t)(vocab > 0 ? vocab : 1) * sizeof *fill);
  double *acc = malloc((size_t)(dim > 0 ? dim : 1) * sizeof *acc);
  if (!start || !order || !fill || !acc) {
    free(start), free(order), free(fill), free(acc);
    return tf_fail(TF_ERR_OOM, "out of memory: no host memory for %s's sort", op);
  }
  for (int64_t i = 0; i < n; i++) start[tf_cpu_id_at(ids, i) + 1]++;
  for (int64_t v = 0; v < vocab; v++) start[v + 1] += start[v];
  if (vocab > 0) memcpy(fill, start, (size_t)vocab * sizeof *fill);
  for (int64_t i = 0; i < n; i++) order[fill[tf_cpu_id_at(ids, i)]++] = i;
  for (int64_t v = 0; v < vocab; v++) {
    if (add && start[v] == start[v + 1]) continue;
    for (int64_t c = 0; c < dim; c++) acc[c] = add ? tf_elem_get(dweight, wd, v * dim + c) : 0.0;
    for (int64_t j = start[v]; j < start[v + 1]; j++) {
      const int64_t base = order[j] * dim;
      for (int64_t c = 0; c < dim; c++) {
        const double g = tf_elem_get(dout, dd, base + c);
        acc[c] = f32_sums ? (double)((float)acc[c] + (float)g) : acc[c] + g;
      }
    }
    for (int64_t c = 0; c < dim; c++) tf_elem_set(dweight, wd, v * dim + c, acc[c]);
  }
  free(start), free(order), free(fill), free(acc);
  return TF_OK;
}

/* The eager op's entry (backend.h): both passes, every id checked before
 * any is used. */
tf_status tf_cpu_embedding(tf_device_ctx *ctx, const tf_embedding_args *a, int64_t *bad) {
  (void)ctx;
  *bad = tf_cpu_first_bad(a->ids, a->n, a->vocab);
  if (*bad >= 0) return TF_OK;
  const tf_cpu_ids ids = {tf_tensor_data(a->ids), a->ids->dtype, a->n, a->vocab};
  if (!a->backward) {
    tf_cpu_gather(&ids, tf_tensor_data(a->weight), tf_tensor_data(a->out),
                  (size_t)a->dim * tf_dtype_size(a->weight->dtype));
    return TF_OK;
  }
  return tf_cpu_scatter_add(&ids, tf_tensor_data(a->dout), a->dout->dtype, tf_tensor_data(a->dweight),
                            a->dweight->dtype, a->dim, false, false, "embedding_backward");
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

/* The engine's entry (model_kernels.h): f32 rows, the gradient added onto
 * dwte in f32; ids were checked before (tf_cpu_index_check). */
tf_status tf_cpu_encoder(tf_device_ctx *ctx, const tf_encoder_args *a) {
  (void)ctx;
  const tf_cpu_ids ids = {a->ids, TF_I64, a->n, a->vocab};
  if (!a->backward) {
    tf_cpu_gather(&ids, a->wte, a->out, (size_t)a->dim * sizeof(float));
    return TF_OK;
  }
  return tf_cpu_scatter_add(&ids, a->dout, TF_F32, a->dwte, TF_F32, a->dim, true, true, "encoder backward");
}
