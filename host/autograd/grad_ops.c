/* Differentiable elementwise ops, reductions, matmul, linear, casts and views:
 * forward through ops.h, backward written with the same ops. */
#include "grad_ops.h"

#include <math.h>
#include <string.h>

#include "autocast.h"
#include "autograd.h"
#include "temps.h"

/* ---- small helpers ------------------------------------------------------ */

/* o = a op b, o = a op s, o = op(a): the result joins the temporaries. */
static tf_status tf_t2(tf_temps *tt, tf_binary_op op, const tf_tensor *a, const tf_tensor *b, tf_tensor **o) {
  TF_TRY(tf_binary(op, a, b, o));
  tf_temps_keep(tt, *o);
  return TF_OK;
}

static tf_status tf_ts(tf_temps *tt, tf_binary_op op, const tf_tensor *a, double s, tf_scalar_side side,
                       tf_tensor **o) {
  TF_TRY(tf_binary_scalar(op, a, (tf_scalar){s, true}, side, o));
  tf_temps_keep(tt, *o);
  return TF_OK;
}

static tf_status tf_t1(tf_temps *tt, tf_unary_op op, const tf_tensor *a, tf_tensor **o) {
  TF_TRY(tf_unary(op, a, o));
  tf_temps_keep(tt, *o);
  return TF_OK;
}


tf_status tf_sum_to(const tf_tensor *g, const tf_shape *shape, tf_tensor **out) {
  tf_tensor *cur = tf_tensor_retain((tf_tensor *)g), *next;
  int lead = g->ndim - shape->ndim;
  for (int i = 0; i < lead; i++) {
    tf_status st = tf_reduce(TF_REDUCE_SUM, cur, 0, false, false, &next);
    tf_tensor_release(cur);
    if (st != TF_OK) return st;
    cur = next;
  }
  for (int d = 0; d < shape->ndim; d++) {
    if (shape->dims[d] != 1 || cur->shape[d] == 1) continue;
    tf_status st = tf_reduce(TF_REDUCE_SUM, cur, d, false, true, &next);
    tf_tensor_release(cur);
    if (st != TF_OK) return st;
    cur = next;
  }
  *out = cur;
  return TF_OK;
}

/* ---- unary ---------------------------------------------------------------- */

/* Which of x (input) and y (output) each op's backward reads. */
static void tf_unary_saves(tf_unary_op op, bool *x, bool *y) {
  *x = op == TF_OP_ABS || op == TF_OP_SQUARE || op == TF_OP_LOG || op == TF_OP_SILU || op == TF_OP_GELU ||
       op == TF_OP_SIN || op == TF_OP_COS || op == TF_OP_ERF;
  *y = op == TF_OP_RELU || op == TF_OP_EXP || op == TF_OP_SQRT || op == TF_OP_RSQRT || op == TF_OP_SIGMOID ||
       op == TF_OP_TANH;
}

static tf_status tf_bw_unary(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  tf_unary_op op = (tf_unary_op)n->param[0];
  const tf_tensor *x, *y;
  TF_TRY(tf_node_saved(n, 0, &x));
  TF_TRY(tf_node_saved(n, 1, &y));
  tf_temps tt = {0};
  tf_tensor *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  tf_status st = TF_OK;
  const tf_tensor *factor = NULL; /* gin = g * factor, when set */
  switch (op) {
    case TF_OP_NEG: st = tf_unary(TF_OP_NEG, g, &gin[0]); break;
    case TF_OP_SIGN: st = tf_binary_scalar(TF_OP_MUL, g, (tf_scalar){0.0, true}, TF_SCALAR_RIGHT, &gin[0]); break;
    case TF_OP_ABS: st = tf_t1(&tt, TF_OP_SIGN, x, &a), factor = a; break;
    case TF_OP_RELU: st = tf_t1(&tt, TF_OP_SIGN, y, &a), factor = a; break;
    case TF_OP_SQUARE: st = tf_ts(&tt, TF_OP_MUL, x, 2.0, TF_SCALAR_RIGHT, &a), factor = a; break;
    case TF_OP_EXP: factor = y; break;
    case TF_OP_LOG: st = tf_binary(TF_OP_DIV, g, x, &gin[0]); break;
    case TF_OP_SQRT:
      if ((st = tf_ts(&tt, TF_OP_MUL, y, 2.0, TF_SCALAR_RIGHT, &a)) == TF_OK) st = tf_binary(TF_OP_DIV, g, a, &gin[0]);
      break;
    case TF_OP_RSQRT: /* -0.5 y^3 */
      if ((st = tf_t2(&tt, TF_OP_MUL, y, y, &a)) == TF_OK && (st = tf_t2(&tt, TF_OP_MUL, a, y, &b)) == TF_OK)
        st = tf_ts(&tt, TF_OP_MUL, b, -0.5, TF_SCALAR_RIGHT, &c), factor = c;
      break;
    case TF_OP_SIGMOID: /* y (1 - y) */
      if ((st = tf_ts(&tt, TF_OP_SUB, y, 1.0, TF_SCALAR_LEFT, &a)) == TF_OK) st = tf_t2(&tt, TF_OP_MUL, y, a, &b);
      factor = b;
      break;
    case TF_OP_SILU: /* s (1 + x (1 - s)) */
      if ((st = tf_t1(&tt, TF_OP_SIGMOID, x, &a)) == TF_OK && (st = tf_ts(&tt, TF_OP_SUB, a, 1.0, TF_SCALAR_LEFT, &b)) == TF_OK &&
          (st = tf_t2(&tt, TF_OP_MUL, x, b, &c)) == TF_OK && (st = tf_ts(&tt, TF_OP_ADD, c, 1.0, TF_SCALAR_RIGHT, &d)) == TF_OK)
        st = tf_t2(&tt, TF_OP_MUL, a, d, &c), factor = c;
      break;
    case TF_OP_GELU: /* Phi(x) + x phi(x) = 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi) */
      if ((st = tf_ts(&tt, TF_OP_MUL, x, 0.70710678118654752440, TF_SCALAR_RIGHT, &a)) == TF_OK &&
          (st = tf_t1(&tt, TF_OP_ERF, a, &b)) == TF_OK && (st = tf_ts(&tt, TF_OP_ADD, b, 1.0, TF_SCALAR_RIGHT, &c)) == TF_OK &&
          (st = tf_ts(&tt, TF_OP_MUL, c, 0.5, TF_SCALAR_RIGHT, &d)) == TF_OK && (st = tf_t2(&tt, TF_OP_MUL, x, x, &a)) == TF_OK &&
          (st = tf_ts(&tt, TF_OP_MUL, a, -0.5, TF_SCALAR_RIGHT, &b)) == TF_OK && (st = tf_t1(&tt, TF_OP_EXP, b, &c)) == TF_OK &&
          (st = tf_t2(&tt, TF_OP_MUL, x, c, &a)) == TF_OK &&
          (st = tf_ts(&tt, TF_OP_MUL, a, 0.39894228040143267794, TF_SCALAR_RIGHT, &b)) == TF_OK)
        st = tf_t2(&tt, TF_OP_ADD, d, b, &c), factor = c;
      break;
    case TF_OP_TANH: /* 1 - y^2 */
      if ((st = tf_t2(&tt, TF_OP_MUL, y, y, &a)) == TF_OK) st = tf_ts(&tt, TF_OP_SUB, a, 1.0, TF_SCALAR_LEFT, &b);
      factor = b;
      break;
    case TF_OP_SIN: st = tf_t1(&tt, TF_OP_COS, x, &a), factor = a; break;
    case TF_OP_COS:
      if ((st = tf_t1(&tt, TF_OP_SIN, x, &a)) == TF_OK) st = tf_t1(&tt, TF_OP_NEG, a, &b);
      factor = b;
      break;
    case TF_OP_ERF: /* 2 / sqrt(pi) exp(-x^2) */
      if ((st = tf_t2(&tt, TF_OP_MUL, x, x, &a)) == TF_OK && (st = tf_t1(&tt, TF_OP_NEG, a, &b)) == TF_OK &&
          (st = tf_t1(&tt, TF_OP_EXP, b, &c)) == TF_OK)
        st = tf_ts(&tt, TF_OP_MUL, c, 1.12837916709551257390, TF_SCALAR_RIGHT, &d), factor = d;
      break;
    default: st = tf_fail(TF_ERR_STATE, "no backward for %s", n->name); break;
  }
  if (st == TF_OK && factor) st = tf_binary(TF_OP_MUL, g, factor, &gin[0]);
  tf_temps_drop(&tt);
  return st;
}

static tf_cast_policy tf_unary_policy(tf_unary_op op) {
  return op == TF_OP_EXP || op == TF_OP_LOG || op == TF_OP_RSQRT ? TF_CAST_F32 : TF_CAST_NONE;
}

tf_status tf_ag_unary(tf_unary_op op, tf_tensor *a, tf_tensor **out) {
  tf_tensor *x, *y = NULL;
  TF_TRY(tf_autocast_input(tf_unary_policy(op), a, &x));
  tf_node *node = NULL;
  tf_status st = tf_unary(op, x, &y);
  if (st == TF_OK && tf_dtype_is_float(y->dtype))
    st = tf_node_begin(tf_op_name(TF_FAMILY_UNARY, op), tf_bw_unary, &x, 1, &node);
  if (st == TF_OK && node) {
    bool sx, sy;
    tf_unary_saves(op, &sx, &sy);
    node->param[0] = op;
    st = tf_node_save(node, sx ? x : NULL);
    if (st == TF_OK) st = tf_node_save(node, sy ? y : NULL);
  }
  tf_tensor_release(x);
  return tf_node_complete(st, node, y, out);
}

/* ---- binary --------------------------------------------------------------- */

/* The mask of where a wins a maximum (1, 0.5 on ties, 0), or a minimum. */
static tf_status tf_winner_mask(tf_temps *tt, const tf_tensor *diff, bool is_max, tf_tensor **mask) {
  tf_tensor *s;
  TF_TRY(tf_t1(tt, TF_OP_SIGN, diff, &s));
  tf_tensor *m;
  if (is_max)
    TF_TRY(tf_ts(tt, TF_OP_ADD, s, 1.0, TF_SCALAR_RIGHT, &m));
  else
    TF_TRY(tf_ts(tt, TF_OP_SUB, s, 1.0, TF_SCALAR_LEFT, &m));
  return tf_ts(tt, TF_OP_MUL, m, 0.5, TF_SCALAR_RIGHT, mask);
}

static tf_status tf_bw_binary(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  tf_binary_op op = (tf_binary_op)n->param[0];
  const tf_tensor *a, *b, *y;
  TF_TRY(tf_node_saved(n, 0, &a));
  TF_TRY(tf_node_saved(n, 1, &b));
  TF_TRY(tf_node_saved(n, 2, &y));
  tf_temps tt = {0};
  tf_tensor *ga = NULL, *gb = NULL, *t1, *t2, *t3;
  tf_status st = TF_OK;
  bool wa = tf_node_wants(n, 0), wb = tf_node_wants(n, 1);
  switch (op) {
    case TF_OP_ADD:
    case TF_OP_SUB:
      ga = tf_tensor_retain((tf_tensor *)g);
      if (op == TF_OP_ADD)
        gb = tf_tensor_retain((tf_tensor *)g);
      else if (wb)
        st = tf_unary(TF_OP_NEG, g, &gb);
      break;
    case TF_OP_MUL:
      if (wa) st = tf_binary(TF_OP_MUL, g, b, &ga);
      if (st == TF_OK && wb) st = tf_binary(TF_OP_MUL, g, a, &gb);
      break;
    case TF_OP_DIV: /* ga = g / b, gb = -ga a / b */
      st = tf_binary(TF_OP_DIV, g, b, &ga);
      if (st == TF_OK && wb && (st = tf_t2(&tt, TF_OP_MUL, ga, a, &t1)) == TF_OK &&
          (st = tf_t2(&tt, TF_OP_DIV, t1, b, &t2)) == TF_OK)
        st = tf_unary(TF_OP_NEG, t2, &gb);
      break;
    case TF_OP_MAXIMUM:
    case TF_OP_MINIMUM:
      if ((st = tf_t2(&tt, TF_OP_SUB, a, b, &t1)) == TF_OK && (st = tf_winner_mask(&tt, t1, op == TF_OP_MAXIMUM, &t2)) == TF_OK &&
          (st = tf_binary(TF_OP_MUL, g, t2, &ga)) == TF_OK && wb &&
          (st = tf_ts(&tt, TF_OP_SUB, t2, 1.0, TF_SCALAR_LEFT, &t3)) == TF_OK)
        st = tf_binary(TF_OP_MUL, g, t3, &gb);
      break;
    case TF_OP_POW: /* ga = g b a^(b-1), gb = g y log(a) */
      if (wa && (st = tf_ts(&tt, TF_OP_SUB, b, 1.0, TF_SCALAR_RIGHT, &t1)) == TF_OK &&
          (st = tf_t2(&tt, TF_OP_POW, a, t1, &t2)) == TF_OK && (st = tf_t2(&tt, TF_OP_MUL, t2, b, &t3)) == TF_OK)
        st = tf_binary(TF_OP_MUL, g, t3, &ga);
      if (st == TF_OK && wb && (st = tf_t1(&tt, TF_OP_LOG, a, &t1)) == TF_OK && (st = tf_t2(&tt, TF_OP_MUL, y, t1, &t2)) == TF_OK)
        st = tf_binary(TF_OP_MUL, g, t2, &gb);
      break;
    default: st = tf_fail(TF_ERR_STATE, "no backward for %s", n->name); break;
  }
  tf_temps_drop(&tt);
  if (st == TF_OK && wa && ga) st = tf_sum_to(ga, &n->in_shape[0], &gin[0]);
  if (st == TF_OK && wb && gb) st = tf_sum_to(gb, &n->in_shape[1], &gin[1]);
  tf_tensor_release(ga);
  tf_tensor_release(gb);
  return st;
}

tf_status tf_ag_binary(tf_binary_op op, tf_tensor *a, tf_tensor *b, tf_tensor **out) {
  tf_cast_policy policy = op == TF_OP_POW ? TF_CAST_F32 : TF_CAST_NONE;
  tf_tensor *x = NULL, *z = NULL, *y = NULL;
  TF_TRY(tf_autocast_input(policy, a, &x));
  tf_status st = tf_autocast_input(policy, b, &z);
  tf_node *node = NULL;
  if (st == TF_OK) st = tf_binary(op, x, z, &y);
  tf_tensor *inputs[2] = {x, z};
  if (st == TF_OK && tf_dtype_is_float(y->dtype))
    st = tf_node_begin(tf_op_name(TF_FAMILY_BINARY, op), tf_bw_binary, inputs, 2, &node);
  if (st == TF_OK && node) {
    bool needs_operands = op != TF_OP_ADD && op != TF_OP_SUB;
    node->param[0] = op;
    const tf_tensor *saves[3] = {needs_operands ? x : NULL, needs_operands ? z : NULL, op == TF_OP_POW ? y : NULL};
    st = tf_node_save_all(node, saves, 3);
  }
  tf_tensor_release(x);
  tf_tensor_release(z);
  return tf_node_complete(st, node, y, out);
}

static tf_status tf_bw_binary_scalar(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  tf_binary_op op = (tf_binary_op)n->param[0];
  tf_scalar_side side = (tf_scalar_side)n->param[1];
  double s = n->scalar[0];
  const tf_tensor *a, *y;
  TF_TRY(tf_node_saved(n, 0, &a));
  TF_TRY(tf_node_saved(n, 1, &y));
  tf_temps tt = {0};
  tf_tensor *t1, *t2;
  tf_status st = TF_OK;
  switch (op) {
    case TF_OP_ADD: st = tf_contiguous(g, &gin[0]); break;
    case TF_OP_SUB:
      st = side == TF_SCALAR_RIGHT ? tf_contiguous(g, &gin[0]) : tf_unary(TF_OP_NEG, g, &gin[0]);
      break;
    case TF_OP_MUL: st = tf_binary_scalar(TF_OP_MUL, g, (tf_scalar){s, true}, TF_SCALAR_RIGHT, &gin[0]); break;
    case TF_OP_DIV:
      if (side == TF_SCALAR_RIGHT) {
        st = tf_binary_scalar(TF_OP_DIV, g, (tf_scalar){s, true}, TF_SCALAR_RIGHT, &gin[0]);
      } else if ((st = tf_t2(&tt, TF_OP_MUL, a, a, &t1)) == TF_OK && (st = tf_t2(&tt, TF_OP_DIV, g, t1, &t2)) == TF_OK) {
        st = tf_binary_scalar(TF_OP_MUL, t2, (tf_scalar){-s, true}, TF_SCALAR_RIGHT, &gin[0]);
      }
      break;
    case TF_OP_MAXIMUM:
    case TF_OP_MINIMUM:
      if ((st = tf_ts(&tt, TF_OP_SUB, a, s, TF_SCALAR_RIGHT, &t1)) == TF_OK &&
          (st = tf_winner_mask(&tt, t1, op == TF_OP_MAXIMUM, &t2)) == TF_OK)
        st = tf_binary(TF_OP_MUL, g, t2, &gin[0]);
      break;
    case TF_OP_POW:
      if (side == TF_SCALAR_RIGHT) { /* s a^(s-1) */
        if ((st = tf_ts(&tt, TF_OP_POW, a, s - 1.0, TF_SCALAR_RIGHT, &t1)) == TF_OK &&
            (st = tf_ts(&tt, TF_OP_MUL, t1, s, TF_SCALAR_RIGHT, &t2)) == TF_OK)
          st = tf_binary(TF_OP_MUL, g, t2, &gin[0]);
      } else if ((st = tf_ts(&tt, TF_OP_MUL, y, log(s), TF_SCALAR_RIGHT, &t1)) == TF_OK) { /* y log s */
        st = tf_binary(TF_OP_MUL, g, t1, &gin[0]);
      }
      break;
    default: st = tf_fail(TF_ERR_STATE, "no backward for %s", n->name); break;
  }
  tf_temps_drop(&tt);
  return st;
}

tf_status tf_ag_binary_scalar(tf_binary_op op, tf_tensor *a, tf_scalar s, tf_scalar_side side, tf_tensor **out) {
  tf_tensor *x, *y = NULL;
  TF_TRY(tf_autocast_input(op == TF_OP_POW ? TF_CAST_F32 : TF_CAST_NONE, a, &x));
  tf_node *node = NULL;
  tf_status st = tf_binary_scalar(op, x, s, side, &y);
  if (st == TF_OK && tf_dtype_is_float(y->dtype))
    st = tf_node_begin(tf_op_name(TF_FAMILY_BINARY, op), tf_bw_binary_scalar, &x, 1, &node);
  if (st == TF_OK && node) {
    node->param[0] = op;
    node->param[1] = side;
    node->scalar[0] = s.value;
    bool needs_a = op == TF_OP_DIV || op == TF_OP_MAXIMUM || op == TF_OP_MINIMUM || op == TF_OP_POW;
    const tf_tensor *saves[2] = {needs_a ? x : NULL, op == TF_OP_POW ? y : NULL};
    st = tf_node_save_all(node, saves, 2);
  }
  tf_tensor_release(x);
  return tf_node_complete(st, node, y, out);
}

/* ---- reductions ------------------------------------------------------------ */

/* t (a reduction's output or its gradient) viewed with the reduced dims
 * back as size 1, then expanded to the input's shape. */
static tf_status tf_unreduce(const tf_tensor *t, const tf_node *n, tf_tensor **out) {
  const tf_shape *in = &n->in_shape[0];
  int dim = (int)n->param[1];
  bool all = n->param[2], keepdim = n->param[3];
  tf_shape kept = *in;
  for (int i = 0; i < in->ndim; i++)
    if (all || i == dim) kept.dims[i] = 1;
  tf_tensor *k;
  if (keepdim) {
    k = tf_tensor_retain((tf_tensor *)t);
  } else {
    TF_TRY(tf_reshape(t, &kept, &k));
  }
  tf_status st = tf_expand(k, in, out);
  tf_tensor_release(k);
  return st;
}

static tf_status tf_bw_reduce(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  tf_reduce_op op = (tf_reduce_op)n->param[0];
  tf_temps tt = {0};
  tf_tensor *ge, *t1, *t2, *t3, *t4, *ye, *cnt;
  tf_status st = tf_unreduce(g, n, &ge);
  if (st != TF_OK) return st;
  tf_temps_keep(&tt, ge);
  int64_t r = n->param[4];
  if (op == TF_REDUCE_SUM) {
    st = tf_contiguous(ge, &gin[0]);
  } else if (op == TF_REDUCE_MEAN) {
    st = tf_binary_scalar(TF_OP_MUL, ge, (tf_scalar){1.0 / (double)r, true}, TF_SCALAR_RIGHT, &gin[0]);
  } else { /* max/min: the gradient goes to every element equal to the result, shared evenly */
    const tf_tensor *x, *y;
    if ((st = tf_node_saved(n, 0, &x)) == TF_OK && (st = tf_node_saved(n, 1, &y)) == TF_OK &&
        (st = tf_unreduce(y, n, &ye)) == TF_OK) {
      tf_temps_keep(&tt, ye);
      if ((st = tf_t2(&tt, TF_OP_SUB, x, ye, &t1)) == TF_OK && (st = tf_t1(&tt, TF_OP_ABS, t1, &t2)) == TF_OK &&
          (st = tf_t1(&tt, TF_OP_SIGN, t2, &t3)) == TF_OK &&
          (st = tf_ts(&tt, TF_OP_SUB, t3, 1.0, TF_SCALAR_LEFT, &t4)) == TF_OK &&
          (st = tf_reduce(TF_REDUCE_SUM, t4, (int)n->param[1], n->param[2], true, &cnt)) == TF_OK) {
        tf_temps_keep(&tt, cnt);
        if ((st = tf_t2(&tt, TF_OP_MUL, ge, t4, &t1)) == TF_OK) st = tf_binary(TF_OP_DIV, t1, cnt, &gin[0]);
      }
    }
  }
  tf_temps_drop(&tt);
  return st;
}

tf_status tf_ag_reduce(tf_reduce_op op, tf_tensor *a, int dim, bool all, bool keepdim, tf_tensor **out) {
  tf_tensor *x, *y = NULL;
  TF_TRY(tf_autocast_input(op == TF_REDUCE_SUM ? TF_CAST_F32 : TF_CAST_NONE, a, &x));
  tf_node *node = NULL;
  tf_status st = tf_reduce(op, x, dim, all, keepdim, &y);
  static const char *names[] = {"sum", "mean", "max", "min"};
  if (st == TF_OK && tf_dtype_is_float(y->dtype)) st = tf_node_begin(names[op], tf_bw_reduce, &x, 1, &node);
  if (st == TF_OK && node) {
    int d = 0;
    if (!all && x->ndim > 0) tf_wrap_dim(dim, x->ndim, &d);
    node->param[0] = op;
    node->param[1] = d;
    node->param[2] = all || x->ndim == 0;
    node->param[3] = keepdim;
    node->param[4] = (all || x->ndim == 0) ? tf_tensor_numel(x) : x->shape[d];
    bool extremum = op == TF_REDUCE_MAX || op == TF_REDUCE_MIN;
    const tf_tensor *saves[2] = {extremum ? x : NULL, extremum ? y : NULL};
    st = tf_node_save_all(node, saves, 2);
  }
  tf_tensor_release(x);
  return tf_node_complete(st, node, y, out);
}

/* ---- matmul and linear ------------------------------------------------------- */

/* A 1-D operand as the matrix matmul used: (1, k) on the left, (k, 1) on the right. */
static tf_status tf_as_matrix(const tf_tensor *t, bool left, tf_tensor **out) {
  if (t->ndim != 1) {
    *out = tf_tensor_retain((tf_tensor *)t);
    return TF_OK;
  }
  tf_shape s = left ? (tf_shape){2, {1, t->shape[0]}} : (tf_shape){2, {t->shape[0], 1}};
  return tf_reshape(t, &s, out);
}

/* The shape of a2 @ b2 for matrices (batch dims broadcast). */
static tf_shape tf_matmul_shape(const tf_tensor *a2, const tf_tensor *b2) {
  int na = a2->ndim - 2, nb = b2->ndim - 2, nbat = na > nb ? na : nb;
  tf_shape s = {.ndim = nbat + 2};
  for (int i = 0; i < nbat; i++) {
    int ia = i - (nbat - na), ib = i - (nbat - nb);
    int64_t da = ia >= 0 ? a2->shape[ia] : 1, db = ib >= 0 ? b2->shape[ib] : 1;
    s.dims[i] = da == 1 ? db : da;
  }
  s.dims[nbat] = a2->shape[a2->ndim - 2];
  s.dims[nbat + 1] = b2->shape[b2->ndim - 1];
  return s;
}

/* grad = sum_to(x @ y) reshaped to shape: one operand's gradient. */
static tf_status tf_matmul_grad(const tf_tensor *x, const tf_tensor *y, const tf_tensor *like2, const tf_shape *shape,
                                tf_tensor **out) {
  tf_tensor *p, *summed;
  TF_TRY(tf_matmul(x, y, &p));
  tf_shape s2 = tf_tensor_shape(like2);
  tf_status st = tf_sum_to(p, &s2, &summed);
  tf_tensor_release(p);
  if (st != TF_OK) return st;
  st = tf_reshape(summed, shape, out);
  tf_tensor_release(summed);
  return st;
}

static tf_status tf_bw_matmul(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *a, *b;
  TF_TRY(tf_node_saved(n, 0, &a));
  TF_TRY(tf_node_saved(n, 1, &b));
  tf_temps tt = {0};
  tf_tensor *a2, *b2, *g2, *t;
  tf_status st = tf_as_matrix(a, true, &a2);
  if (st == TF_OK && (st = tf_as_matrix(b, false, &b2)) == TF_OK) {
    tf_temps_keep(&tt, a2);
    tf_temps_keep(&tt, b2);
    tf_shape full = tf_matmul_shape(a2, b2);
    if ((st = tf_reshape(g, &full, &g2)) == TF_OK) {
      tf_temps_keep(&tt, g2);
      if (tf_node_wants(n, 0) && (st = tf_transpose(b2, -1, -2, &t)) == TF_OK) {
        tf_temps_keep(&tt, t);
        st = tf_matmul_grad(g2, t, a2, &n->in_shape[0], &gin[0]);
      }
      if (st == TF_OK && tf_node_wants(n, 1) && (st = tf_transpose(a2, -1, -2, &t)) == TF_OK) {
        tf_temps_keep(&tt, t);
        st = tf_matmul_grad(t, g2, b2, &n->in_shape[1], &gin[1]);
      }
    }
  } else if (st == TF_OK) {
    tf_tensor_release(a2);
  }
  tf_temps_drop(&tt);
  return st;
}

tf_status tf_ag_matmul(tf_tensor *a, tf_tensor *b, tf_tensor **out) {
  tf_tensor *x = NULL, *z = NULL, *y = NULL;
  TF_TRY(tf_autocast_input(TF_CAST_LOW, a, &x));
  tf_status st = tf_autocast_input(TF_CAST_LOW, b, &z);
  tf_node *node = NULL;
  if (st == TF_OK) st = tf_matmul(x, z, &y);
  tf_tensor *inputs[2] = {x, z};
  if (st == TF_OK) st = tf_node_begin("matmul", tf_bw_matmul, inputs, 2, &node);
  if (st == TF_OK && node) {
    const tf_tensor *saves[2] = {x, z};
    st = tf_node_save_all(node, saves, 2);
  }
  tf_tensor_release(x);
  tf_tensor_release(z);
  return tf_node_complete(st, node, y, out);
}

/* x as rows: (N, last dim). */
static tf_status tf_as_rows(const tf_tensor *x, tf_tensor **out) {
  tf_shape s = {2, {-1, x->ndim ? x->shape[x->ndim - 1] : 1}};
  return tf_reshape(x, &s, out);
}

static tf_status tf_bw_linear(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  const tf_tensor *x, *w;
  TF_TRY(tf_node_saved(n, 0, &x));
  TF_TRY(tf_node_saved(n, 1, &w));
  tf_temps tt = {0};
  tf_tensor *g2, *x2, *gt;
  tf_status st = TF_OK;
  if (tf_node_wants(n, 0)) st = tf_matmul(g, w, &gin[0]); /* (..., out) @ (out, in) */
  if (st == TF_OK && (tf_node_wants(n, 1) || tf_node_wants(n, 2)) && (st = tf_as_rows(g, &g2)) == TF_OK) {
    tf_temps_keep(&tt, g2);
    if (tf_node_wants(n, 1) && (st = tf_as_rows(x, &x2)) == TF_OK && (st = tf_transpose(g2, 0, 1, &gt)) == TF_OK) {
      tf_temps_keep(&tt, x2);
      tf_temps_keep(&tt, gt);
      st = tf_matmul(gt, x2, &gin[1]); /* (out, N) @ (N, in) */
    }
    if (st == TF_OK && tf_node_wants(n, 2)) st = tf_reduce(TF_REDUCE_SUM, g2, 0, false, false, &gin[2]);
  }
  tf_temps_drop(&tt);
  return st;
}

tf_status tf_ag_linear(tf_tensor *x, tf_tensor *w, tf_tensor *b, tf_tensor **out) {
  if (w->ndim != 2) return tf_fail(TF_ERR_ARG, "linear: the weight must be (out, in), not %d-dimensional", w->ndim);
  if (x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
    return tf_fail(TF_ERR_ARG, "linear: the input's last dimension (%lld) must equal the weight's in features (%lld)",
                   (long long)(x->ndim ? x->shape[x->ndim - 1] : 0), (long long)w->shape[1]);
  if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
    return tf_fail(TF_ERR_ARG, "linear: the bias must have shape (%lld,)", (long long)w->shape[0]);
  tf_tensor *cx = NULL, *cw = NULL, *cb = NULL, *wt = NULL, *p = NULL, *y = NULL;
  tf_status st = tf_autocast_input(TF_CAST_LOW, x, &cx);
  if (st == TF_OK) st = tf_autocast_input(TF_CAST_LOW, w, &cw);
  if (st == TF_OK) st = tf_autocast_input(TF_CAST_LOW, b, &cb);
  if (st == TF_OK) st = tf_transpose(cw, 0, 1, &wt);
  if (st == TF_OK) st = tf_matmul(cx, wt, &p);
  if (st == TF_OK && cb) {
    st = tf_binary(TF_OP_ADD, p, cb, &y);
  } else if (st == TF_OK) {
    y = p;
    p = NULL;
  }
  tf_tensor *inputs[3] = {cx, cw, cb};
  tf_node *node = NULL;
  if (st == TF_OK) st = tf_node_begin("linear", tf_bw_linear, inputs, 3, &node);
  if (st == TF_OK && node) {
    const tf_tensor *saves[2] = {cx, cw};
    st = tf_node_save_all(node, saves, 2);
  }
  tf_tensor *temps[] = {cx, cw, cb, wt, p};
  for (size_t i = 0; i < sizeof temps / sizeof temps[0]; i++) tf_tensor_release(temps[i]);
  return tf_node_complete(st, node, y, out);
}

/* ---- conversion and views ------------------------------------------------------ */

static tf_status tf_bw_to(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  tf_device dev = {(int)n->param[0], (int)n->param[1]};
  return tf_to(g, n->in_dtype[0], dev, &gin[0]);
}

tf_status tf_ag_to(tf_tensor *a, tf_dtype dtype, tf_device device, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_node *node = NULL;
  tf_status st = tf_to(a, dtype, device, &y);
  /* a cast into an 8-bit float ends the graph: nothing differentiates there */
  if (st == TF_OK && tf_dtype_is_float(dtype) && !tf_dtype_is_fp8(dtype))
    st = tf_node_begin("to", tf_bw_to, &a, 1, &node);
  if (st == TF_OK && node) {
    node->param[0] = a->device.type;
    node->param[1] = a->device.index;
  }
  return tf_node_complete(st, node, y, out);
}

static tf_status tf_bw_reshape(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  return tf_reshape(g, &n->in_shape[0], &gin[0]);
}

/* A view op's result y of a, with backward bw. */
static tf_status tf_ag_view_done(const char *name, tf_backward_fn bw, tf_tensor *a, tf_status st, tf_tensor *y,
                                 const int64_t *params, int nparams, tf_tensor **out) {
  tf_node *node = NULL;
  if (st == TF_OK) st = tf_node_begin(name, bw, &a, 1, &node);
  if (st == TF_OK && node)
    for (int i = 0; i < nparams; i++) node->param[i] = params[i];
  return tf_node_complete(st, node, y, out);
}

tf_status tf_ag_contiguous(tf_tensor *a, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_status st = tf_contiguous(a, &y);
  if (st == TF_OK && y == a) { /* already contiguous: the same tensor, no new node */
    *out = y;
    return TF_OK;
  }
  return tf_ag_view_done("contiguous", tf_bw_reshape, a, st, y, NULL, 0, out);
}

tf_status tf_ag_reshape(tf_tensor *a, const tf_shape *shape, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_status st = tf_reshape(a, shape, &y);
  return tf_ag_view_done("reshape", tf_bw_reshape, a, st, y, NULL, 0, out);
}

tf_status tf_ag_alias(tf_tensor *a, const tf_shape *shape, const int64_t *strides, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_status st = tf_tensor_view(a, shape, strides, a->offset, &y);
  return tf_ag_view_done("view", tf_bw_reshape, a, st, y, NULL, 0, out);
}

static tf_status tf_bw_transpose(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  return tf_transpose(g, (int)n->param[0], (int)n->param[1], &gin[0]);
}

tf_status tf_ag_transpose(tf_tensor *a, int dim0, int dim1, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_status st = tf_transpose(a, dim0, dim1, &y);
  int64_t params[2] = {dim0, dim1};
  return tf_ag_view_done("transpose", tf_bw_transpose, a, st, y, params, 2, out);
}

static tf_status tf_bw_expand(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  return tf_sum_to(g, &n->in_shape[0], &gin[0]);
}

tf_status tf_ag_expand(tf_tensor *a, const tf_shape *shape, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_status st = tf_expand(a, shape, &y);
  return tf_ag_view_done("expand", tf_bw_expand, a, st, y, NULL, 0, out);
}

/* The gradient of a slice: zeros of the input's shape, g written into the
 * slice (narrow when param[0] is 0, select when 1). */
static tf_status tf_bw_slice(tf_node *n, const tf_tensor *g, tf_tensor **gin) {
  tf_tensor *z, *view;
  TF_TRY(tf_full(&n->in_shape[0], 0.0, g->dtype, g->device, &z));
  tf_status st = n->param[0] == 0 ? tf_narrow(z, (int)n->param[1], n->param[2], n->param[3], &view)
                                  : tf_select(z, (int)n->param[1], n->param[2], &view);
  if (st == TF_OK) {
    st = tf_copy_into(view, g);
    tf_tensor_release(view);
  }
  if (st != TF_OK) {
    tf_tensor_release(z);
    return st;
  }
  gin[0] = z;
  return TF_OK;
}

tf_status tf_ag_narrow(tf_tensor *a, int dim, int64_t start, int64_t length, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_status st = tf_narrow(a, dim, start, length, &y);
  int64_t params[4] = {0, dim, start, length};
  return tf_ag_view_done("narrow", tf_bw_slice, a, st, y, params, 4, out);
}

tf_status tf_ag_select(tf_tensor *a, int dim, int64_t index, tf_tensor **out) {
  tf_tensor *y = NULL;
  tf_status st = tf_select(a, dim, index, &y);
  int d = 0;
  if (st == TF_OK) tf_wrap_dim(dim, a->ndim, &d);
  int64_t params[3] = {1, d, index < 0 && st == TF_OK ? index + a->shape[d] : index};
  return tf_ag_view_done("select", tf_bw_slice, a, st, y, params, 3, out);
}

/* Here rather than in autocast.c: the cast it makes is the op above. */
tf_status tf_autocast_input(tf_cast_policy policy, tf_tensor *t, tf_tensor **out) {
  int region = tf_autocast_dtype();
  tf_dtype want = policy == TF_CAST_LOW ? (tf_dtype)region : TF_F32;
  bool eligible = t && region >= 0 && policy != TF_CAST_NONE && tf_dtype_is_float(t->dtype) && t->dtype != TF_F64;
  if (!eligible || t->dtype == want) {
    *out = t ? tf_tensor_retain(t) : NULL;
    return TF_OK;
  }
  bool cacheable = t->requires_grad && !t->grad_fn && tf_grad_enabled();
  tf_tensor *hit = cacheable ? tf_autocast_cached(t, want) : NULL;
  if (hit) {
    *out = tf_tensor_retain(hit);
    return TF_OK;
  }
  TF_TRY(tf_ag_to(t, want, t->device, out));
  if (cacheable) tf_autocast_remember(t, *out);
  return TF_OK;
}
