#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

/* ---- registry ---------------------------------------------------------- */

#define TF_UNARY_ENTRY(CODE, name, kind, formula) \
  {#name, TF_FAMILY_UNARY, TF_OP_##CODE, TF_KIND_##kind##_DTYPES, TF_KIND_##kind##_RULE},
#define TF_BINARY_ENTRY(CODE, name, kind, formula) \
  {#name, TF_FAMILY_BINARY, TF_OP_##CODE, TF_KIND_##kind##_DTYPES, TF_KIND_##kind##_RULE},
static const tf_op_info tf_ops_table[] = {
    TF_UNARY_OPS(TF_UNARY_ENTRY) TF_BINARY_OPS(TF_BINARY_ENTRY)
    {"sum", TF_FAMILY_REDUCE, TF_REDUCE_SUM, TF_DTYPES_ALL, TF_RESULT_SAME},
    {"mean", TF_FAMILY_REDUCE, TF_REDUCE_MEAN, TF_DTYPES_FLOAT, TF_RESULT_SAME},
    {"max", TF_FAMILY_REDUCE, TF_REDUCE_MAX, TF_DTYPES_NUMERIC, TF_RESULT_SAME},
    {"min", TF_FAMILY_REDUCE, TF_REDUCE_MIN, TF_DTYPES_NUMERIC, TF_RESULT_SAME},
    {"matmul", TF_FAMILY_MATMUL, 0, TF_DTYPES_FLOAT, TF_RESULT_SAME},
};
#undef TF_UNARY_ENTRY
#undef TF_BINARY_ENTRY

enum { TF_OPS_COUNT = sizeof tf_ops_table / sizeof tf_ops_table[0] };

const tf_op_info *tf_op_registry(int *count) {
  *count = TF_OPS_COUNT;
  return tf_ops_table;
}

const tf_op_info *tf_op_find(const char *name) {
  for (int i = 0; i < TF_OPS_COUNT; i++)
    if (strcmp(tf_ops_table[i].name, name) == 0) return &tf_ops_table[i];
  return NULL;
}

static const tf_op_info *tf_op_of(tf_op_family family, int code) {
  for (int i = 0; i < TF_OPS_COUNT; i++)
    if (tf_ops_table[i].family == family && tf_ops_table[i].code == code) return &tf_ops_table[i];
  return NULL;
}

const char *tf_op_name(tf_op_family family, int code) {
  const tf_op_info *info = tf_op_of(family, code);
  return info ? info->name : "op";
}

/* ---- helpers ----------------------------------------------------------- */

tf_status tf_wrap_dim(int dim, int ndim, int *out) {
  int n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    return tf_fail(TF_ERR_ARG, "dimension %d out of range for a tensor of %d dimension%s (dimensions count from 0: "
                   "0..%d, or -%d..-1 from the end)", dim, ndim, ndim == 1 ? "" : "s", n - 1, n);
  *out = dim < 0 ? dim + n : dim;
  return TF_OK;
}

static tf_status tf_ctx_of(const tf_tensor *t, tf_device_ctx **ctx) { return tf_device_ctx_get(t->device, ctx); }

static tf_status tf_check_same_device(const char *op, const tf_tensor *a, const tf_tensor *b) {
  if (tf_device_eq(a->device, b->device)) return TF_OK;
  char da[16], db[16];
  tf_device_format(a->device, da, sizeof da);
  tf_device_format(b->device, db, sizeof db);
  return tf_fail(TF_ERR_DEVICE, "%s: operands are on different devices (%s and %s); move one with :to()", op, da, db);
}

static tf_status tf_check_dtype(const tf_op_info *info, tf_dtype d) {
  if (info->dtypes & TF_DTYPE_BIT(d)) return TF_OK;
  return tf_dtype_refusal(info->name, d);
}

/* PyTorch does not promote the 8-bit floats: they meet only their own dtype. */
static tf_status tf_check_fp8_pair(const tf_op_info *info, tf_dtype a, tf_dtype b) {
  if (a == b || !(tf_dtype_is_fp8(a) || tf_dtype_is_fp8(b))) return TF_OK;
  return tf_fail(TF_ERR_ARG, "%s: %s and %s operands (an 8-bit float meets only its own dtype or a number: cast one "
                 "first)", info->name, tf_dtype_name(a), tf_dtype_name(b));
}

/* Ops that take the 8-bit floats (comparisons) compute on their f32 values. */
static tf_dtype tf_compute_dtype(const tf_op_info *info, tf_dtype promoted) {
  if (tf_dtype_is_fp8(promoted)) return TF_F32;
  if (info->rule == TF_RESULT_FLOAT && !tf_dtype_is_float(promoted)) return TF_F32;
  return promoted;
}

/* The output dtype of an elementwise op computed in dtype cd. */
static tf_dtype tf_result_dtype(const tf_op_info *info, tf_dtype cd) {
  return info->rule == TF_RESULT_BOOL ? TF_BOOL : cd;
}

/* A tensor of dtype d with a's values: a itself (retained) when it already is. */
static tf_status tf_as_dtype(const tf_tensor *a, tf_dtype d, tf_tensor **out) {
  if (a->dtype == d) {
    *out = tf_tensor_retain((tf_tensor *)a);
    return TF_OK;
  }
  return tf_to(a, d, a->device, out);
}

static tf_status tf_empty_like_shape(const tf_shape *s, tf_dtype d, tf_device dev, tf_tensor **out) {
  return tf_tensor_empty(s, d, dev, out);
}

/* ---- views ------------------------------------------------------------- */

tf_status tf_expand(const tf_tensor *a, const tf_shape *shape, tf_tensor **out) {
  if (shape->ndim < a->ndim)
    return tf_fail(TF_ERR_ARG, "cannot expand a tensor of %d dimensions to %d", a->ndim, shape->ndim);
  int64_t strides[TF_MAX_DIMS];
  int lead = shape->ndim - a->ndim;
  for (int i = 0; i < shape->ndim; i++) {
    if (i < lead) {
      strides[i] = 0;
      continue;
    }
    int64_t have = a->shape[i - lead], want = shape->dims[i];
    if (have == want)
      strides[i] = a->strides[i - lead];
    else if (have == 1)
      strides[i] = 0;
    else {
      char sa[128], sb[128];
      tf_shape as = tf_tensor_shape(a);
      return tf_fail(TF_ERR_ARG, "cannot expand shape %s to %s: they cannot be broadcast at dimension %d (%lld vs %lld)",
                     tf_shape_format(&as, sa, sizeof sa), tf_shape_format(shape, sb, sizeof sb), i, (long long)have,
                     (long long)want);
    }
  }
  return tf_tensor_view(a, shape, strides, a->offset, out);
}

static tf_status tf_broadcast_shape(const tf_tensor *a, const tf_tensor *b, tf_shape *out) {
  int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
  out->ndim = nd;
  for (int i = 0; i < nd; i++) {
    int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
    int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char sa[128], sb[128];
      tf_shape as = tf_tensor_shape(a), bs = tf_tensor_shape(b);
      return tf_fail(TF_ERR_ARG, "shapes %s and %s cannot be broadcast (dimension %d of the result: %lld vs %lld)",
                     tf_shape_format(&as, sa, sizeof sa), tf_shape_format(&bs, sb, sizeof sb), i,
                     (long long)da, (long long)db);
    }
    out->dims[i] = da == 1 ? db : da;
  }
  return TF_OK;
}

tf_status tf_reshape(const tf_tensor *a, const tf_shape *shape, tf_tensor **out) {
  tf_shape s = *shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.ndim; i++) {
    if (s.dims[i] == -1) {
      if (infer >= 0) return tf_fail(TF_ERR_ARG, "only one dimension can be -1");
      infer = i;
    } else if (s.dims[i] < 0) {
      return tf_fail(TF_ERR_ARG, "invalid dimension %lld", (long long)s.dims[i]);
    } else {
      known *= s.dims[i];
    }
  }
  int64_t numel = tf_tensor_numel(a);
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) goto mismatch;
    s.dims[infer] = numel / known;
  }
  TF_TRY(tf_shape_check(&s));
  if (tf_shape_numel(&s) != numel) goto mismatch;
  tf_tensor *src;
  TF_TRY(tf_contiguous(a, &src));
  int64_t strides[TF_MAX_DIMS];
  tf_contiguous_strides(&s, strides);
  tf_status st = tf_tensor_view(src, &s, strides, src->offset, out);
  tf_tensor_release(src);
  return st;
mismatch: {
  char sa[128], sb[128];
  tf_shape as = tf_tensor_shape(a);
  return tf_fail(TF_ERR_ARG, "cannot reshape a tensor of shape %s (%lld elements) to %s",
                 tf_shape_format(&as, sa, sizeof sa), (long long)numel, tf_shape_format(shape, sb, sizeof sb));
}
}

tf_status tf_transpose(const tf_tensor *a, int dim0, int dim1, tf_tensor **out) {
  int d0 = 0, d1 = 0;
  TF_TRY(tf_wrap_dim(dim0, a->ndim, &d0));
  TF_TRY(tf_wrap_dim(dim1, a->ndim, &d1));
  tf_shape s = tf_tensor_shape(a);
  int64_t strides[TF_MAX_DIMS];
  memcpy(strides, a->strides, sizeof strides);
  if (a->ndim > 0) {
    int64_t t = s.dims[d0];
    s.dims[d0] = s.dims[d1];
    s.dims[d1] = t;
    t = strides[d0];
    strides[d0] = strides[d1];
    strides[d1] = t;
  }
  return tf_tensor_view(a, &s, strides, a->offset, out);
}

tf_status tf_narrow(const tf_tensor *a, int dim, int64_t start, int64_t length, tf_tensor **out) {
  int d = 0;
  if (a->ndim == 0) return tf_fail(TF_ERR_ARG, "cannot narrow a 0-dimensional tensor");
  TF_TRY(tf_wrap_dim(dim, a->ndim, &d));
  if (start < 0 || length < 0 || start + length > a->shape[d])
    return tf_fail(TF_ERR_ARG, "range [%lld, %lld) is outside dimension %d of size %lld", (long long)start,
                   (long long)(start + length), dim, (long long)a->shape[d]);
  tf_shape s = tf_tensor_shape(a);
  s.dims[d] = length;
  return tf_tensor_view(a, &s, a->strides, a->offset + start * a->strides[d], out);
}

tf_status tf_select(const tf_tensor *a, int dim, int64_t index, tf_tensor **out) {
  int d = 0;
  if (a->ndim == 0) return tf_fail(TF_ERR_ARG, "cannot index a 0-dimensional tensor");
  TF_TRY(tf_wrap_dim(dim, a->ndim, &d));
  int64_t size = a->shape[d];
  if (index < -size || index >= size)
    return tf_fail(TF_ERR_ARG, "index %lld is out of range for dimension %d of size %lld", (long long)index, dim,
                   (long long)size);
  if (index < 0) index += size;
  tf_shape s = {.ndim = a->ndim - 1};
  int64_t strides[TF_MAX_DIMS];
  for (int i = 0, j = 0; i < a->ndim; i++) {
    if (i == d) continue;
    s.dims[j] = a->shape[i];
    strides[j++] = a->strides[i];
  }
  return tf_tensor_view(a, &s, strides, a->offset + index * a->strides[d], out);
}

/* ---- copies and conversion --------------------------------------------- */

tf_status tf_contiguous(const tf_tensor *a, tf_tensor **out) {
  if (tf_tensor_is_contiguous(a)) {
    *out = tf_tensor_retain((tf_tensor *)a);
    return TF_OK;
  }
  return tf_to(a, a->dtype, a->device, out);
}

tf_status tf_copy_into(tf_tensor *dst, const tf_tensor *src) {
  TF_TRY(tf_check_same_device("copy", dst, src));
  tf_shape ds = tf_tensor_shape(dst), ss = tf_tensor_shape(src);
  if (ds.ndim != ss.ndim || memcmp(ds.dims, ss.dims, sizeof(int64_t) * (size_t)ds.ndim) != 0)
    return tf_fail(TF_ERR_ARG, "copy: shapes differ");
  for (int i = 0; i < dst->ndim; i++)
    if (dst->strides[i] == 0 && dst->shape[i] > 1)
      return tf_fail(TF_ERR_ARG, "copy: the destination is a broadcast view (several elements share memory)");
  if (tf_tensor_numel(dst) == 0) return TF_OK;
  tf_device_ctx *ctx;
  TF_TRY(tf_ctx_of(dst, &ctx));
  return ctx->backend->convert(ctx, src, dst);
}

tf_status tf_to(const tf_tensor *a, tf_dtype dtype, tf_device device, tf_tensor **out) {
  tf_shape s = tf_tensor_shape(a);
  tf_tensor *conv;
  TF_TRY(tf_empty_like_shape(&s, dtype, a->device, &conv));
  tf_status st = tf_copy_into(conv, a);
  if (st != TF_OK || tf_device_eq(device, a->device)) {
    if (st != TF_OK) tf_tensor_release(conv);
    else *out = conv;
    return st;
  }
  /* Across devices: bytes go through host memory. */
  tf_tensor *dst = NULL;
  size_t nbytes = tf_tensor_nbytes(conv);
  void *host = NULL;
  st = tf_empty_like_shape(&s, dtype, device, &dst);
  if (st == TF_OK && nbytes > 0) {
    if (a->device.type == TF_DEV_CPU)
      st = tf_tensor_write(dst, tf_tensor_data(conv), nbytes);
    else if (device.type == TF_DEV_CPU)
      st = tf_tensor_read(conv, tf_tensor_data(dst), nbytes);
    else if (!(host = malloc(nbytes)))
      st = tf_fail(TF_ERR_OOM, "out of memory: no host buffer for a device-to-device copy");
    else if ((st = tf_tensor_read(conv, host, nbytes)) == TF_OK)
      st = tf_tensor_write(dst, host, nbytes);
  }
  free(host);
  tf_tensor_release(conv);
  if (st != TF_OK) {
    tf_tensor_release(dst);
    return st;
  }
  *out = dst;
  return TF_OK;
}

tf_status tf_to_saturated(const tf_tensor *a, tf_dtype dtype, tf_tensor **out) {
  if (!tf_dtype_is_fp8(dtype))
    return tf_fail(TF_ERR_ARG, "a saturating cast goes into f8e4m3 or f8e5m2, not %s", tf_dtype_name(dtype));
  tf_device_ctx *ctx;
  TF_TRY(tf_ctx_of(a, &ctx));
  if (!ctx->backend->convert_saturate)
    return tf_fail(TF_ERR_BACKEND, "the %s backend has no saturating cast", ctx->backend->name);
  tf_shape s = tf_tensor_shape(a);
  tf_tensor *res;
  TF_TRY(tf_empty_like_shape(&s, dtype, a->device, &res));
  tf_status st = tf_tensor_numel(res) > 0 ? ctx->backend->convert_saturate(ctx, a, res) : TF_OK;
  if (st != TF_OK) {
    tf_tensor_release(res);
    return st;
  }
  *out = res;
  return TF_OK;
}

/* ---- elementwise ------------------------------------------------------- */

tf_status tf_unary(tf_unary_op op, const tf_tensor *a, tf_tensor **out) {
  const tf_op_info *info = tf_op_of(TF_FAMILY_UNARY, op);
  TF_TRY(tf_check_dtype(info, a->dtype));
  tf_dtype cd = tf_compute_dtype(info, a->dtype);
  tf_device_ctx *ctx;
  TF_TRY(tf_ctx_of(a, &ctx));
  tf_tensor *in, *res = NULL;
  TF_TRY(tf_as_dtype(a, cd, &in));
  tf_shape s = tf_tensor_shape(a);
  tf_status st = tf_tensor_empty(&s, tf_result_dtype(info, cd), a->device, &res);
  if (st == TF_OK && tf_tensor_numel(res) > 0) st = ctx->backend->unary(ctx, op, in, res);
  tf_tensor_release(in);
  if (st != TF_OK) {
    tf_tensor_release(res);
    return st;
  }
  *out = res;
  return TF_OK;
}

tf_status tf_binary(tf_binary_op op, const tf_tensor *a, const tf_tensor *b, tf_tensor **out) {
  const tf_op_info *info = tf_op_of(TF_FAMILY_BINARY, op);
  TF_TRY(tf_check_same_device(info->name, a, b));
  TF_TRY(tf_check_dtype(info, a->dtype));
  TF_TRY(tf_check_dtype(info, b->dtype));
  TF_TRY(tf_check_fp8_pair(info, a->dtype, b->dtype));
  tf_shape s;
  TF_TRY(tf_broadcast_shape(a, b, &s));
  tf_dtype cd = tf_compute_dtype(info, tf_dtype_promote(a->dtype, b->dtype));
  tf_device_ctx *ctx;
  TF_TRY(tf_ctx_of(a, &ctx));
  tf_tensor *ca = NULL, *cb = NULL, *ea = NULL, *eb = NULL, *res = NULL;
  tf_status st = tf_as_dtype(a, cd, &ca);
  if (st == TF_OK) st = tf_as_dtype(b, cd, &cb);
  if (st == TF_OK) st = tf_expand(ca, &s, &ea);
  if (st == TF_OK) st = tf_expand(cb, &s, &eb);
  if (st == TF_OK) st = tf_tensor_empty(&s, tf_result_dtype(info, cd), a->device, &res);
  if (st == TF_OK && tf_shape_numel(&s) > 0) st = ctx->backend->binary(ctx, op, ea, eb, 0.0, TF_SCALAR_NONE, res);
  tf_tensor_release(ca);
  tf_tensor_release(cb);
  tf_tensor_release(ea);
  tf_tensor_release(eb);
  if (st != TF_OK) {
    tf_tensor_release(res);
    return st;
  }
  *out = res;
  return TF_OK;
}

tf_status tf_binary_scalar(tf_binary_op op, const tf_tensor *a, tf_scalar s, tf_scalar_side side, tf_tensor **out) {
  const tf_op_info *info = tf_op_of(TF_FAMILY_BINARY, op);
  TF_TRY(tf_check_dtype(info, a->dtype));
  tf_dtype cd = tf_compute_dtype(info, tf_dtype_promote_scalar(a->dtype, s.is_float));
  tf_device_ctx *ctx;
  TF_TRY(tf_ctx_of(a, &ctx));
  tf_tensor *ca = NULL, *res = NULL;
  TF_TRY(tf_as_dtype(a, cd, &ca));
  tf_shape shape = tf_tensor_shape(a);
  tf_status st = tf_tensor_empty(&shape, tf_result_dtype(info, cd), a->device, &res);
  if (st == TF_OK && tf_shape_numel(&shape) > 0) st = ctx->backend->binary(ctx, op, ca, NULL, s.value, side, res);
  tf_tensor_release(ca);
  if (st != TF_OK) {
    tf_tensor_release(res);
    return st;
  }
  *out = res;
  return TF_OK;
}

/* ---- reductions -------------------------------------------------------- */

tf_status tf_reduce(tf_reduce_op op, const tf_tensor *a, int dim, bool all, bool keepdim, tf_tensor **out) {
  const tf_op_info *info = tf_op_of(TF_FAMILY_REDUCE, op);
  TF_TRY(tf_check_dtype(info, a->dtype));
  int d = 0;
  if (!all) TF_TRY(tf_wrap_dim(dim, a->ndim, &d));
  if (a->ndim == 0) all = true;
  int64_t outer = 1, r = 1, inner = 1;
  tf_shape s = {0};
  for (int i = 0; i < a->ndim; i++) {
    if (all || i == d) {
      r *= a->shape[i];
      if (keepdim) s.dims[s.ndim++] = 1;
      continue;
    }
    if (i < d) outer *= a->shape[i];
    else inner *= a->shape[i];
    s.dims[s.ndim++] = a->shape[i];
  }
  if (r == 0 && (op == TF_REDUCE_MAX || op == TF_REDUCE_MIN))
    return tf_fail(TF_ERR_ARG, "%s of an empty tensor has no value", info->name);
  tf_dtype cd = (op == TF_REDUCE_SUM && !tf_dtype_is_float(a->dtype)) ? TF_I64 : a->dtype;
  tf_device_ctx *ctx;
  TF_TRY(tf_ctx_of(a, &ctx));
  tf_tensor *in = NULL, *cin = NULL, *res = NULL;
  tf_status st = tf_as_dtype(a, cd, &cin);
  if (st == TF_OK) st = tf_contiguous(cin, &in);
  if (st == TF_OK) st = tf_tensor_empty(&s, cd, a->device, &res);
  if (st == TF_OK && outer * inner > 0) {
    if (r == 0)
      st = ctx->backend->fill(ctx, res, op == TF_REDUCE_SUM ? 0.0 : NAN);
    else
      st = ctx->backend->reduce(ctx, op, in, outer, r, inner, res);
  }
  tf_tensor_release(cin);
  tf_tensor_release(in);
  if (st != TF_OK) {
    tf_tensor_release(res);
    return st;
  }
  *out = res;
  return TF_OK;
}

/* ---- matmul ------------------------------------------------------------ */

/* How BLAS can read the last two dims of t (rows x cols) without a copy. */
static bool tf_matrix_layout(const tf_tensor *t, bool *trans, int64_t *ld) {
  int n = t->ndim;
  int64_t rows = t->shape[n - 2], cols = t->shape[n - 1];
  int64_t rs = t->strides[n - 2], cs = t->strides[n - 1];
  if ((cs == 1 || cols == 1) && (rs >= (cols > 1 ? cols : 1) || rows == 1)) {
    *trans = false;
    *ld = rows == 1 ? (cols > 1 ? cols : 1) : rs;
    return *ld >= (cols > 1 ? cols : 1);
  }
  if ((rs == 1 || rows == 1) && (cs >= (rows > 1 ? rows : 1) || cols == 1)) {
    *trans = true;
    *ld = cols == 1 ? (rows > 1 ? rows : 1) : cs;
    return *ld >= (rows > 1 ? rows : 1);
  }
  return false;
}

/* The batch dims (all but the last two) as a single stride, if possible. */
static bool tf_batch_stride(const tf_tensor *t, int64_t *stride) {
  int nb = t->ndim - 2;
  int64_t st = 0;
  bool first = true;
  for (int i = nb - 1; i >= 0; i--) {
    if (t->shape[i] == 1) continue;
    if (first) {
      st = t->strides[i];
      first = false;
      continue;
    }
    /* dims must nest: stride[i] == stride[i+1] * shape[i+1] (or all zero) */
    int j = i + 1;
    while (j < nb && t->shape[j] == 1) j++;
    if (t->strides[i] != t->strides[j] * t->shape[j]) return false;
  }
  *stride = st;
  return true;
}

static tf_status tf_matmul_operand(const tf_tensor *t, tf_tensor **use, bool *trans, int64_t *ld, int64_t *bstride) {
  if (tf_matrix_layout(t, trans, ld) && tf_batch_stride(t, bstride)) {
    *use = tf_tensor_retain((tf_tensor *)t);
    return TF_OK;
  }
  tf_tensor *c;
  TF_TRY(tf_to(t, t->dtype, t->device, &c));
  tf_matrix_layout(c, trans, ld);
  tf_batch_stride(c, bstride);
  *use = c;
  return TF_OK;
}

tf_status tf_matmul(const tf_tensor *a, const tf_tensor *b, tf_tensor **out) {
  const tf_op_info *info = tf_op_find("matmul");
  TF_TRY(tf_check_same_device("matmul", a, b));
  TF_TRY(tf_check_dtype(info, a->dtype));
  if (a->dtype != b->dtype)
    return tf_fail(TF_ERR_ARG, "matmul: operands have different dtypes (%s and %s)", tf_dtype_name(a->dtype),
                   tf_dtype_name(b->dtype));
  if (a->ndim == 0 || b->ndim == 0) return tf_fail(TF_ERR_ARG, "matmul: operands must have at least 1 dimension");
  /* 1-D operands become matrices, and the added dim is dropped at the end. */
  tf_shape as = tf_tensor_shape(a), bs = tf_tensor_shape(b);
  bool a_vec = a->ndim == 1, b_vec = b->ndim == 1;
  if (a_vec) as = (tf_shape){2, {1, a->shape[0]}};
  if (b_vec) bs = (tf_shape){2, {b->shape[0], 1}};
  int64_t m = as.dims[as.ndim - 2], k = as.dims[as.ndim - 1], n = bs.dims[bs.ndim - 1];
  if (bs.dims[bs.ndim - 2] != k) {
    char sa[128], sb[128];
    return tf_fail(TF_ERR_ARG, "matmul: shapes %s and %s do not fit (inner dimensions %lld and %lld)",
                   tf_shape_format(&as, sa, sizeof sa), tf_shape_format(&bs, sb, sizeof sb), (long long)k,
                   (long long)bs.dims[bs.ndim - 2]);
  }
  /* Broadcast the batch dims. */
  int nba = as.ndim - 2, nbb = bs.ndim - 2, nb = nba > nbb ? nba : nbb;
  tf_shape batch = {.ndim = nb};
  for (int i = 0; i < nb; i++) {
    int ia = i - (nb - nba), ib = i - (nb - nbb);
    int64_t da = ia >= 0 ? as.dims[ia] : 1, db = ib >= 0 ? bs.dims[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char sa[128], sb[128];
      return tf_fail(TF_ERR_ARG, "matmul: the batch dimensions of %s and %s cannot be broadcast (dimension %d of the "
                     "result: %lld vs %lld)", tf_shape_format(&as, sa, sizeof sa), tf_shape_format(&bs, sb, sizeof sb),
                     i, (long long)da, (long long)db);
    }
    batch.dims[i] = da == 1 ? db : da;
  }
  tf_shape full_a = batch, full_b = batch, os = batch;
  full_a.ndim = full_b.ndim = os.ndim = nb + 2;
  full_a.dims[nb] = m, full_a.dims[nb + 1] = k;
  full_b.dims[nb] = k, full_b.dims[nb + 1] = n;
  os.dims[nb] = m, os.dims[nb + 1] = n;
  int64_t nbatch = tf_shape_numel(&batch);

  tf_tensor *va = NULL, *vb = NULL, *ea = NULL, *eb = NULL, *ua = NULL, *ub = NULL, *res = NULL;
  int64_t va_strides[TF_MAX_DIMS], vb_strides[TF_MAX_DIMS];
  memcpy(va_strides, a->strides, sizeof va_strides);
  memcpy(vb_strides, b->strides, sizeof vb_strides);
  if (a_vec) va_strides[1] = a->strides[0], va_strides[0] = 0;
  if (b_vec) vb_strides[0] = b->strides[0], vb_strides[1] = 0;
  tf_matmul_args args = {.dtype = a->dtype, .batch = nbatch, .m = m, .n = n, .k = k};
  tf_device_ctx *ctx;
  tf_status st = tf_ctx_of(a, &ctx);
  if (st == TF_OK) st = tf_tensor_view(a, &as, va_strides, a->offset, &va);
  if (st == TF_OK) st = tf_tensor_view(b, &bs, vb_strides, b->offset, &vb);
  if (st == TF_OK) st = tf_expand(va, &full_a, &ea);
  if (st == TF_OK) st = tf_expand(vb, &full_b, &eb);
  if (st == TF_OK) st = tf_matmul_operand(ea, &ua, &args.trans_a, &args.lda, &args.batch_a);
  if (st == TF_OK) st = tf_matmul_operand(eb, &ub, &args.trans_b, &args.ldb, &args.batch_b);
  if (st == TF_OK) st = tf_tensor_empty(&os, a->dtype, a->device, &res);
  if (st == TF_OK && tf_tensor_numel(res) > 0) {
    if (k == 0) {
      st = ctx->backend->fill(ctx, res, 0.0);
    } else {
      args.a = tf_tensor_data(ua);
      args.b = tf_tensor_data(ub);
      args.c = tf_tensor_data(res);
      args.ldc = n;
      args.batch_c = m * n;
      args.allow_tf32 = ctx->allow_tf32;
      st = ctx->backend->matmul(ctx, &args);
    }
  }
  tf_tensor *views[] = {va, vb, ea, eb, ua, ub};
  for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) tf_tensor_release(views[i]);
  if (st != TF_OK) {
    tf_tensor_release(res);
    return st;
  }
  if (a_vec || b_vec) {
    /* Drop the dims that 1-D operands added. */
    tf_shape fs = batch;
    if (!a_vec) fs.dims[fs.ndim++] = m;
    if (!b_vec) fs.dims[fs.ndim++] = n;
    tf_tensor *r2;
    st = tf_reshape(res, &fs, &r2);
    tf_tensor_release(res);
    if (st != TF_OK) return st;
    res = r2;
  }
  *out = res;
  return TF_OK;
}

/* ---- creation ---------------------------------------------------------- */

tf_status tf_full(const tf_shape *shape, double value, tf_dtype dtype, tf_device device, tf_tensor **out) {
  tf_tensor *t;
  TF_TRY(tf_tensor_empty(shape, dtype, device, &t));
  tf_device_ctx *ctx;
  tf_status st = tf_ctx_of(t, &ctx);
  if (st == TF_OK && tf_tensor_numel(t) > 0) st = ctx->backend->fill(ctx, t, value);
  if (st != TF_OK) {
    tf_tensor_release(t);
    return st;
  }
  *out = t;
  return TF_OK;
}

tf_status tf_arange(double start, double stop, double step, tf_dtype dtype, tf_device device, tf_tensor **out) {
  if (step == 0 || !isfinite(step) || !isfinite(start) || !isfinite(stop))
    return tf_fail(TF_ERR_ARG, "arange needs finite bounds and a non-zero step");
  if ((stop - start) * step < 0)
    return tf_fail(TF_ERR_ARG, "arange: the step %g goes away from the end (start %g, end %g)", step, start, stop);
  double count = ceil((stop - start) / step);
  if (count > 9.0e15) return tf_fail(TF_ERR_ARG, "arange: too many elements");
  tf_shape s = {1, {(int64_t)count}};
  tf_tensor *t;
  TF_TRY(tf_tensor_empty(&s, dtype, device, &t));
  tf_device_ctx *ctx;
  tf_status st = tf_ctx_of(t, &ctx);
  if (st == TF_OK && s.dims[0] > 0) st = ctx->backend->arange(ctx, t, start, step);
  if (st != TF_OK) {
    tf_tensor_release(t);
    return st;
  }
  *out = t;
  return TF_OK;
}

tf_status tf_random(tf_random_kind kind, const tf_shape *shape, double a, double b, tf_dtype dtype,
                    tf_device device, tf_tensor **out) {
  if (tf_dtype_is_fp8(dtype))
    return tf_fail(TF_ERR_ARG, "random numbers are not drawn in %s: draw f32 and cast", tf_dtype_name(dtype));
  if (kind != TF_RANDOM_INT && !tf_dtype_is_float(dtype))
    return tf_fail(TF_ERR_ARG, "random floats need a floating dtype, not %s", tf_dtype_name(dtype));
  if (kind == TF_RANDOM_INT) {
    if (dtype == TF_BOOL) return tf_fail(TF_ERR_ARG, "randint cannot produce bool");
    if (!(b > a)) return tf_fail(TF_ERR_ARG, "randint needs low < high (got %g and %g)", a, b);
    if (b - a > 4294967296.0) return tf_fail(TF_ERR_ARG, "randint: the range high - low must be at most 2^32");
  }
  if (kind == TF_RANDOM_NORMAL && !(b >= 0)) return tf_fail(TF_ERR_ARG, "randn: std must be >= 0");
  if (kind == TF_RANDOM_TRUNC_NORMAL && !(a >= 0 && b > 0))
    return tf_fail(TF_ERR_ARG, "trunc_normal: std must be >= 0 and the cut > 0");
  tf_tensor *t;
  TF_TRY(tf_tensor_empty(shape, dtype, device, &t));
  tf_device_ctx *ctx;
  tf_status st = tf_ctx_of(t, &ctx);
  int64_t n = tf_tensor_numel(t);
  if (st == TF_OK && n > 0) {
    tf_random_args args = {kind, a, b, ctx->rng_seed, ctx->rng_offset};
    /* one Philox block per 4 elements; 4 blocks per element for truncated normals */
    ctx->rng_offset += kind == TF_RANDOM_TRUNC_NORMAL ? (uint64_t)n * 4 : (uint64_t)(n + 3) / 4;
    st = ctx->backend->random(ctx, t, &args);
  }
  if (st != TF_OK) {
    tf_tensor_release(t);
    return st;
  }
  *out = t;
  return TF_OK;
}
