/* Elementwise ops on the CPU: every op of ops.h's lists, instantiated for
 * each dtype it supports. f16/bf16 compute in float, as on the GPU. Ops of
 * the COMPARE kind (result rule TF_RESULT_BOOL) store the formula's truth
 * as a bool byte instead of a value of the input's dtype. */
#include "opmath.h"
#include "cpu.h"

typedef void (*tf_cpu_unary_fn)(void *out, const void *a, int64_t n, int64_t sa);
typedef void (*tf_cpu_binary_fn)(void *out, const void *a, int64_t sa, const void *b, int64_t sb, int64_t n,
                                 double scalar, tf_scalar_side side);

/* o[i] = formula, or ob[i] = its truth for a bool-result kind (a
 * compile-time choice: the other branch folds away). */
#define TF_CPU_PUT(kind, STORE, formula)                                               \
  do {                                                                                 \
    if (TF_KIND_##kind##_RULE == TF_RESULT_BOOL)                                       \
      ob[i] = (formula) != 0;                                                          \
    else                                                                               \
      o[i] = STORE(formula);                                                           \
  } while (0)

#define TF_CPU_UNARY_FN(sfx, DT, ST, CT, LOAD, STORE, name, kind, formula)            \
  static void tf_cpu_unary_##name##_##sfx(void *out, const void *in, int64_t n, int64_t sa) { \
    typedef CT T;                                                                      \
    ST *o = out;                                                                       \
    uint8_t *ob = out;                                                                 \
    const ST *a = in;                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                  \
      T x = LOAD(a[i * sa]);                                                           \
      TF_CPU_PUT(kind, STORE, formula);                                                \
    }                                                                                  \
  }
#define TF_CPU_UNARY_DEFS(CODE, name, kind, formula) \
  TF_CPU_FLOAT_TYPES(TF_CPU_UNARY_FN, name, kind, formula) \
  TF_IF_INTS_##kind(TF_CPU_INT_TYPES(TF_CPU_UNARY_FN, name, kind, formula))
TF_UNARY_OPS(TF_CPU_UNARY_DEFS)

#define TF_CPU_BINARY_FN(sfx, DT, ST, CT, LOAD, STORE, name, kind, formula)                     \
  static void tf_cpu_binary_##name##_##sfx(void *out, const void *ina, int64_t sa, const void *inb, \
                                           int64_t sb, int64_t n, double scalar, tf_scalar_side side) { \
    typedef CT T;                                                                                \
    ST *o = out;                                                                                 \
    uint8_t *ob = out;                                                                           \
    const ST *a = ina, *b = inb;                                                                 \
    if (b) {                                                                                     \
      for (int64_t i = 0; i < n; i++) {                                                          \
        T x = LOAD(a[i * sa]), y = LOAD(b[i * sb]);                                              \
        TF_CPU_PUT(kind, STORE, formula);                                                        \
      }                                                                                          \
    } else if (side == TF_SCALAR_RIGHT) {                                                        \
      T y = (T)scalar;                                                                           \
      for (int64_t i = 0; i < n; i++) {                                                          \
        T x = LOAD(a[i * sa]);                                                                   \
        TF_CPU_PUT(kind, STORE, formula);                                                        \
      }                                                                                          \
    } else {                                                                                     \
      T x = (T)scalar;                                                                           \
      for (int64_t i = 0; i < n; i++) {                                                          \
        T y = LOAD(a[i * sa]);                                                                   \
        TF_CPU_PUT(kind, STORE, formula);                                                        \
      }                                                                                          \
    }                                                                                            \
  }
#define TF_CPU_BINARY_DEFS(CODE, name, kind, formula) \
  TF_CPU_FLOAT_TYPES(TF_CPU_BINARY_FN, name, kind, formula) \
  TF_IF_INTS_##kind(TF_CPU_INT_TYPES(TF_CPU_BINARY_FN, name, kind, formula))
TF_BINARY_OPS(TF_CPU_BINARY_DEFS)

/* Dispatch tables [op][dtype]; NULL where an op has no kernel for a dtype. */
#define TF_CPU_UNARY_CELL(sfx, DT, ST, CT, LOAD, STORE, name, kind, formula) [DT] = tf_cpu_unary_##name##_##sfx,
#define TF_CPU_UNARY_ROW(CODE, name, kind, formula)              \
  [TF_OP_##CODE] = {TF_CPU_FLOAT_TYPES(TF_CPU_UNARY_CELL, name, kind, formula) \
                        TF_IF_INTS_##kind(TF_CPU_INT_TYPES(TF_CPU_UNARY_CELL, name, kind, formula))},
static const tf_cpu_unary_fn tf_cpu_unary_table[TF_UNARY_COUNT][TF_NDTYPES] = {TF_UNARY_OPS(TF_CPU_UNARY_ROW)};

#define TF_CPU_BINARY_CELL(sfx, DT, ST, CT, LOAD, STORE, name, kind, formula) [DT] = tf_cpu_binary_##name##_##sfx,
#define TF_CPU_BINARY_ROW(CODE, name, kind, formula)              \
  [TF_OP_##CODE] = {TF_CPU_FLOAT_TYPES(TF_CPU_BINARY_CELL, name, kind, formula) \
                        TF_IF_INTS_##kind(TF_CPU_INT_TYPES(TF_CPU_BINARY_CELL, name, kind, formula))},
static const tf_cpu_binary_fn tf_cpu_binary_table[TF_BINARY_COUNT][TF_NDTYPES] = {TF_BINARY_OPS(TF_CPU_BINARY_ROW)};

typedef struct {
  tf_cpu_unary_fn fn;
  char *out, *a;
  size_t elsize, out_elsize; /* the output's differs for bool results */
} tf_cpu_unary_job;

static void tf_cpu_unary_rows(void *ud, int64_t oo, int64_t o0, int64_t o1, int64_t n, int64_t s0, int64_t s1) {
  (void)o1, (void)s1;
  tf_cpu_unary_job *j = ud;
  j->fn(j->out + oo * (int64_t)j->out_elsize, j->a + o0 * (int64_t)j->elsize, n, s0);
}

static tf_status tf_cpu_no_kernel(const char *family, int op, tf_dtype d) {
  return tf_fail(TF_ERR_ARG, "the CPU backend has no %s kernel %d for dtype %s", family, op, tf_dtype_name(d));
}

tf_status tf_cpu_unary(tf_device_ctx *ctx, tf_unary_op op, const tf_tensor *a, tf_tensor *out) {
  (void)ctx;
  tf_cpu_unary_fn fn = tf_cpu_unary_table[op][a->dtype];
  if (!fn) return tf_cpu_no_kernel("unary", op, a->dtype);
  tf_cpu_unary_job job = {fn, out->storage->data, a->storage->data, tf_dtype_size(a->dtype),
                          tf_dtype_size(out->dtype)};
  tf_cpu_for_rows(out, a, NULL, tf_cpu_unary_rows, &job);
  return TF_OK;
}

typedef struct {
  tf_cpu_binary_fn fn;
  char *out, *a, *b;
  size_t elsize, out_elsize; /* the output's differs for bool results */
  double scalar;
  tf_scalar_side side;
} tf_cpu_binary_job;

static void tf_cpu_binary_rows(void *ud, int64_t oo, int64_t o0, int64_t o1, int64_t n, int64_t s0, int64_t s1) {
  tf_cpu_binary_job *j = ud;
  int64_t es = (int64_t)j->elsize;
  j->fn(j->out + oo * (int64_t)j->out_elsize, j->a + o0 * es, s0, j->b ? j->b + o1 * es : NULL, s1, n, j->scalar,
        j->side);
}

tf_status tf_cpu_binary(tf_device_ctx *ctx, tf_binary_op op, const tf_tensor *a, const tf_tensor *b, double scalar,
                        tf_scalar_side side, tf_tensor *out) {
  (void)ctx;
  tf_cpu_binary_fn fn = tf_cpu_binary_table[op][a->dtype];
  if (!fn) return tf_cpu_no_kernel("binary", op, a->dtype);
  tf_cpu_binary_job job = {fn, out->storage->data, a->storage->data, b ? b->storage->data : NULL,
                           tf_dtype_size(a->dtype), tf_dtype_size(out->dtype), scalar, side};
  tf_cpu_for_rows(out, a, b, tf_cpu_binary_rows, &job);
  return TF_OK;
}
