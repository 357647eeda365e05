/* tf.dist's mechanism: arguments checked, the ranks' agreement checked,
 * then the collective handed to MPI (CPU) or NCCL (GPU), or done locally
 * in a world of one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"
#include "half.h"
#include "ops.h"

static struct {
  bool inited;
  tf_status init_status;
  char init_error[512];
  tf_dist_env env;
  bool checks_off;
  double timeout;
  bool broken; /* a check timed out: the ranks can no longer be trusted to meet */
} tf_dist = {.env = {.rank = 0, .world_size = 1, .local_rank = 0, .local_world_size = 1, .launcher = "none"}};

struct tf_dist_work {
  tf_dist_call call;
  tf_tensor *keep[2];
  tf_dist_mpi_req *req; /* MPI's request; NULL: nothing left to wait for */
  void *event;          /* NCCL's end on the communication stream, until joined */
  bool reported;        /* the outcome was returned by a wait */
  tf_status status;
  char error[512];
};

static double tf_default_timeout(void) {
  const char *s = getenv("TF_DIST_TIMEOUT");
  double v = s ? atof(s) : 0;
  return v > 0 ? v : 300.0;
}

tf_status tf_dist_init(void) {
  if (tf_dist.inited) {
    if (tf_dist.init_status != TF_OK) return tf_fail(tf_dist.init_status, "%s", tf_dist.init_error);
    return TF_OK;
  }
  tf_dist.inited = true;
  if (tf_dist.timeout <= 0) tf_dist.timeout = tf_default_timeout();
  tf_dist_env env;
  tf_status st = tf_dist_env_read(&env);
  if (st == TF_OK) {
    tf_dist.env = env;
    if (env.world_size > 1 && env.mpi_launch && tf_dist_mpi_compiled()) st = tf_dist_mpi_init(&env);
  }
  tf_dist.init_status = st;
  if (st != TF_OK) snprintf(tf_dist.init_error, sizeof tf_dist.init_error, "%s", tf_last_error());
  return st;
}

const tf_dist_env *tf_dist_self(void) { return &tf_dist.env; }

void tf_dist_shutdown(bool failed) {
  tf_dist_nccl_shutdown(failed);
  tf_dist_mpi_finalize(failed);
}

const char *tf_dist_mpi_version(void) { return tf_dist_mpi_library(); }
const char *tf_dist_nccl_version(void) { return tf_dist_nccl_loaded_version(); }

void tf_dist_set_checks(bool on) { tf_dist.checks_off = !on; }
bool tf_dist_checks(void) { return !tf_dist.checks_off; }

tf_status tf_dist_set_timeout(double seconds) {
  if (!(seconds > 0 && seconds < 1e7))
    return tf_fail(TF_ERR_ARG, "tf.dist.set_timeout: expected seconds > 0, not %g", seconds);
  tf_dist.timeout = seconds;
  return TF_OK;
}
double tf_dist_timeout(void) { return tf_dist.timeout > 0 ? tf_dist.timeout : tf_default_timeout(); }

/* The world is usable for fname: joined, not broken by a timed-out check. */
static tf_status tf_dist_ready(const char *fname) {
  if (tf_dist_init() != TF_OK) {
    tf_fail_context("%s", fname);
    return TF_ERR_STATE;
  }
  if (tf_dist.broken)
    return tf_fail(TF_ERR_STATE, "%s: an earlier collective timed out; the ranks can no longer be trusted to meet",
                   fname);
  return TF_OK;
}

/* A tensor a collective can read or write in place: live, contiguous, not bool. */
static tf_status tf_dist_check_tensor(const char *fname, const char *what, const tf_tensor *t) {
  if (!t) return tf_fail(TF_ERR_ARG, "%s: %s is missing", fname, what);
  if (t->dtype == TF_BOOL) return tf_fail(TF_ERR_ARG, "%s: %s is a bool tensor (convert it first)", fname, what);
  if (tf_dtype_is_fp8(t->dtype))
    return tf_fail(TF_ERR_ARG, "%s: %s is an %s tensor (cast it first)", fname, what, tf_dtype_name(t->dtype));
  if (!tf_tensor_is_contiguous(t))
    return tf_fail(TF_ERR_ARG, "%s: %s is not contiguous (call :contiguous() first)", fname, what);
  return TF_OK;
}

static tf_status tf_dist_check_pair(const char *fname, const tf_tensor *out, const tf_tensor *t) {
  TF_TRY(tf_dist_check_tensor(fname, "the output", out));
  TF_TRY(tf_dist_check_tensor(fname, "the input", t));
  if (!tf_device_eq(out->device, t->device)) {
    char a[32], b[32];
    tf_device_format(out->device, a, sizeof a);
    tf_device_format(t->device, b, sizeof b);
    return tf_fail(TF_ERR_DEVICE, "%s: the output is on %s and the input on %s (they must share a device)", fname, a, b);
  }
  if (out->dtype != t->dtype)
    return tf_fail(TF_ERR_ARG, "%s: the output is %s and the input %s (they must share a dtype)", fname,
                   tf_dtype_name(out->dtype), tf_dtype_name(t->dtype));
  return TF_OK;
}

static tf_status tf_dist_check_rank(const char *fname, const char *what, int r, bool self_ok) {
  const tf_dist_env *e = &tf_dist.env;
  if (r < 0 || r >= e->world_size)
    return tf_fail(TF_ERR_ARG, "%s: %s %d is not a rank of this world (0..%d)", fname, what, r, e->world_size - 1);
  if (!self_ok && r == e->rank) return tf_fail(TF_ERR_ARG, "%s: %s %d is this rank itself", fname, what, r);
  return TF_OK;
}

/* The mean from the sum, in place, on the CPU. */
static void tf_dist_divide(const tf_dist_call *c) {
  const double w = tf_dist.env.world_size;
  const int64_t n = c->count;
  void *p = c->recv;
  for (int64_t i = 0; i < n; i++) {
    switch (c->dtype) {
      case TF_F32: ((float *)p)[i] = (float)(((float *)p)[i] / w); break;
      case TF_F64: ((double *)p)[i] /= w; break;
      case TF_BF16: ((uint16_t *)p)[i] = tf_f32_to_bf16(tf_bf16_to_f32(((uint16_t *)p)[i]) / (float)w); break;
      case TF_F16: ((uint16_t *)p)[i] = tf_f32_to_f16(tf_f16_to_f32(((uint16_t *)p)[i]) / (float)w); break;
      default: break;
    }
  }
}

/* Finishes a work: the device's stream follows NCCL's end; MPI's request
 * waited for, an average divided. */
static tf_status tf_dist_finish(tf_dist_work *w) {
  if (w->event) {
    tf_status st = tf_dist_nccl_join(w->call.device, w->event);
    w->event = NULL;
    w->status = st;
    if (st != TF_OK) snprintf(w->error, sizeof w->error, "%s", tf_last_error());
    return st;
  }
  if (!w->req) return w->status;
  tf_status st = tf_dist_mpi_wait(w->req, tf_dist_timeout());
  tf_dist_mpi_req_free(w->req);
  w->req = NULL;
  if (st == TF_OK && w->call.op == TF_DIST_AVG &&
      (w->call.kind == TF_DIST_K_ALL_REDUCE || w->call.kind == TF_DIST_K_REDUCE_SCATTER))
    tf_dist_divide(&w->call);
  if (st == TF_OK && w->call.op == TF_DIST_AVG && w->call.kind == TF_DIST_K_REDUCE_SHARDS) {
    tf_dist_call own = w->call; /* only this rank's shard holds the sum */
    int64_t b, e;
    tf_dist_shard(own.count, tf_dist.env.rank, tf_dist.env.world_size, &b, &e);
    own.recv = (char *)own.recv + (size_t)b * tf_dtype_size(own.dtype);
    own.count = e - b;
    tf_dist_divide(&own);
  }
  w->status = st;
  if (st != TF_OK) snprintf(w->error, sizeof w->error, "%s", tf_last_error());
  return st;
}

/* Runs c across the world (world size > 1): the agreement check (unless
 * unchecked: the model's own collectives, alike on every rank by
 * construction, hundreds a step), then MPI or NCCL. keep: tensors the work
 * holds. */
static tf_status tf_dist_run(const tf_dist_call *c, tf_tensor *keep0, tf_tensor *keep1, tf_dist_work **work,
                             bool unchecked) {
  const bool gpu = c->device.type != TF_DEV_CPU;
  if (!gpu && !tf_dist_mpi_active()) {
    const char *why = !tf_dist_mpi_compiled() ? "this tfhost was built without MPI: install libopenmpi-dev and rebuild"
                      : strcmp(tf_dist.env.launcher, "tfhost") == 0
                          ? "tfhost --nproc started the ranks itself: put mpirun on PATH (and unset TFHOST_NO_MPIRUN)"
                          : "the ranks were not started by an MPI launcher: start them with tfhost --nproc, mpirun or srun";
    return tf_fail(TF_ERR_STATE, "%s: CPU tensors travel between ranks through MPI, and this run has none (%s)",
                   c->fname, why);
  }
  if (!unchecked && !tf_dist.checks_off && tf_dist_mpi_active()) {
    int64_t sig[TF_DIST_SIG_LEN];
    tf_dist_signature(c, sig);
    tf_status st = tf_dist_mpi_agree(c, sig, tf_dist_timeout());
    if (st != TF_OK) {
      if (strstr(tf_last_error(), "did not arrive")) tf_dist.broken = true;
      return st;
    }
  }
  if (gpu) {
    tf_dist_work *w = work ? calloc(1, sizeof *w) : NULL;
    if (work && !w) return tf_fail(TF_ERR_OOM, "out of memory in %s", c->fname);
    tf_status st = tf_dist_nccl_run(&tf_dist.env, c, tf_dist_timeout(), w ? &w->event : NULL);
    if (st != TF_OK || !w) {
      free(w);
      return st;
    }
    w->call = *c;
    w->keep[0] = keep0 ? tf_tensor_retain(keep0) : NULL;
    w->keep[1] = keep1 ? tf_tensor_retain(keep1) : NULL;
    *work = w;
    return TF_OK;
  }
  tf_dist_work *w = calloc(1, sizeof *w);
  if (!w) return tf_fail(TF_ERR_OOM, "out of memory in %s", c->fname);
  w->call = *c;
  tf_status st = tf_dist_mpi_start(&w->call, &w->req);
  if (st != TF_OK) {
    free(w);
    return st;
  }
  if (!work) {
    st = tf_dist_finish(w);
    free(w);
    return st;
  }
  w->keep[0] = keep0 ? tf_tensor_retain(keep0) : NULL;
  w->keep[1] = keep1 ? tf_tensor_retain(keep1) : NULL;
  *work = w;
  return TF_OK;
}

/* A work that is already finished (a world of one). */
static tf_status tf_dist_done_work(tf_status st, tf_dist_work **work) {
  if (!work || st != TF_OK) return st;
  *work = calloc(1, sizeof **work);
  return *work ? TF_OK : tf_fail(TF_ERR_OOM, "out of memory in tf.dist");
}

/* dst = src, element by element (the same count, any shapes): all_gather
 * and reduce_scatter in a world of one. */
static tf_status tf_dist_copy_flat(tf_tensor *dst, const tf_tensor *src) {
  tf_tensor *view = NULL;
  tf_shape s = tf_tensor_shape(dst);
  tf_status st = tf_reshape(src, &s, &view);
  if (st == TF_OK) st = tf_copy_into(dst, view);
  tf_tensor_release(view);
  return st;
}

/* A world of one on a GPU still goes through NCCL when it loads. */
static bool tf_dist_local(const tf_dist_call *c) {
  if (tf_dist.env.world_size > 1) return false;
  return c->device.type == TF_DEV_CPU || !tf_dist_nccl_available(NULL, 0);
}

tf_status tf_dist_barrier(void) {
  TF_TRY(tf_dist_ready("tf.dist.barrier"));
  if (tf_dist.env.world_size == 1) return TF_OK;
  if (!tf_dist_mpi_active())
    return tf_fail(TF_ERR_STATE, "tf.dist.barrier: needs MPI (start the run with tfhost --nproc N or mpirun)");
  return tf_dist_mpi_barrier(tf_dist_timeout());
}

tf_status tf_dist_all_reduce(tf_tensor *t, tf_dist_op op, tf_dist_work **work) {
  const char *fname = "tf.dist.all_reduce";
  TF_TRY(tf_dist_ready(fname));
  TF_TRY(tf_dist_check_tensor(fname, "the tensor", t));
  if (op == TF_DIST_AVG && !tf_dtype_is_float(t->dtype))
    return tf_fail(TF_ERR_ARG, "%s: avg needs a floating-point tensor, not %s (use sum)", fname, tf_dtype_name(t->dtype));
  tf_dist_call c = {.kind = TF_DIST_K_ALL_REDUCE, .fname = fname, .send = tf_tensor_data(t), .recv = tf_tensor_data(t),
                    .count = tf_tensor_numel(t), .dtype = t->dtype, .device = t->device, .op = op};
  if (tf_dist_local(&c)) return tf_dist_done_work(TF_OK, work);
  TF_TRY(tf_dist_run(&c, t, NULL, work, false));
  t->storage->version++;
  return TF_OK;
}

tf_status tf_dist_broadcast(tf_tensor *t, int root, tf_dist_work **work) {
  const char *fname = "tf.dist.broadcast";
  TF_TRY(tf_dist_ready(fname));
  TF_TRY(tf_dist_check_tensor(fname, "the tensor", t));
  TF_TRY(tf_dist_check_rank(fname, "root", root, true));
  tf_dist_call c = {.kind = TF_DIST_K_BROADCAST, .fname = fname, .send = tf_tensor_data(t), .recv = tf_tensor_data(t),
                    .count = tf_tensor_numel(t), .dtype = t->dtype, .device = t->device, .peer = root};
  if (tf_dist_local(&c)) return tf_dist_done_work(TF_OK, work);
  TF_TRY(tf_dist_run(&c, t, NULL, work, false));
  t->storage->version++;
  return TF_OK;
}

tf_status tf_dist_all_gather(tf_tensor *out, const tf_tensor *t, tf_dist_work **work) {
  const char *fname = "tf.dist.all_gather";
  TF_TRY(tf_dist_ready(fname));
  TF_TRY(tf_dist_check_pair(fname, out, t));
  const int64_t n = tf_tensor_numel(t), w = tf_dist.env.world_size;
  if (tf_tensor_numel(out) != n * w)
    return tf_fail(TF_ERR_ARG, "%s: the output has %lld elements; it needs world_size (%lld) x %lld = %lld", fname,
                   (long long)tf_tensor_numel(out), (long long)w, (long long)n, (long long)(n * w));
  tf_dist_call c = {.kind = TF_DIST_K_ALL_GATHER, .fname = fname, .send = tf_tensor_data(t), .recv = tf_tensor_data(out),
                    .count = n, .dtype = t->dtype, .device = t->device};
  if (tf_dist_local(&c)) return tf_dist_done_work(tf_dist_copy_flat(out, t), work);
  TF_TRY(tf_dist_run(&c, out, (tf_tensor *)t, work, false));
  out->storage->version++;
  return TF_OK;
}

tf_status tf_dist_reduce_scatter(tf_tensor *out, const tf_tensor *t, tf_dist_op op, tf_dist_work **work) {
  const char *fname = "tf.dist.reduce_scatter";
  TF_TRY(tf_dist_ready(fname));
  TF_TRY(tf_dist_check_pair(fname, out, t));
  if (op == TF_DIST_AVG && !tf_dtype_is_float(t->dtype))
    return tf_fail(TF_ERR_ARG, "%s: avg needs a floating-point tensor, not %s (use sum)", fname, tf_dtype_name(t->dtype));
  const int64_t n = tf_tensor_numel(out), w = tf_dist.env.world_size;
  if (tf_tensor_numel(t) != n * w)
    return tf_fail(TF_ERR_ARG, "%s: the input has %lld elements; it needs world_size (%lld) x the output's %lld = %lld",
                   fname, (long long)tf_tensor_numel(t), (long long)w, (long long)n, (long long)(n * w));
  tf_dist_call c = {.kind = TF_DIST_K_REDUCE_SCATTER, .fname = fname, .send = tf_tensor_data(t),
                    .recv = tf_tensor_data(out), .count = n, .dtype = t->dtype, .device = t->device, .op = op};
  if (tf_dist_local(&c)) return tf_dist_done_work(tf_dist_copy_flat(out, t), work);
  TF_TRY(tf_dist_run(&c, out, (tf_tensor *)t, work, false));
  out->storage->version++;
  return TF_OK;
}

static tf_status tf_dist_p2p(tf_dist_kind kind, tf_tensor *t, int peer, tf_dist_work **work) {
  const char *fname = kind == TF_DIST_K_SEND ? "tf.dist.send" : "tf.dist.recv";
  TF_TRY(tf_dist_ready(fname));
  TF_TRY(tf_dist_check_tensor(fname, "the tensor", t));
  if (tf_dist.env.world_size == 1)
    return tf_fail(TF_ERR_ARG, "%s: a world of one rank has no peer to %s", fname,
                   kind == TF_DIST_K_SEND ? "send to" : "receive from");
  TF_TRY(tf_dist_check_rank(fname, "peer", peer, false));
  tf_dist_call c = {.kind = kind, .fname = fname, .send = tf_tensor_data(t), .recv = tf_tensor_data(t),
                    .count = tf_tensor_numel(t), .dtype = t->dtype, .device = t->device, .peer = peer};
  TF_TRY(tf_dist_run(&c, t, NULL, work, false));
  if (kind == TF_DIST_K_RECV) t->storage->version++;
  return TF_OK;
}

tf_status tf_dist_send(const tf_tensor *t, int peer, tf_dist_work **work) {
  return tf_dist_p2p(TF_DIST_K_SEND, (tf_tensor *)t, peer, work);
}
tf_status tf_dist_recv(tf_tensor *t, int peer, tf_dist_work **work) { return tf_dist_p2p(TF_DIST_K_RECV, t, peer, work); }

tf_status tf_dist_wait(tf_dist_work *w) {
  if (!w) return TF_OK;
  tf_status st = tf_dist_finish(w);
  if (st != TF_OK && w->reported) return tf_fail(st, "tf.dist: this work failed earlier: %s", w->error);
  w->reported = true;
  return st;
}

bool tf_dist_done(tf_dist_work *w) {
  if (!w) return true;
  if (w->event) return tf_dist_nccl_done(w->call.device, w->event);
  if (!w->req) return true;
  return tf_dist_mpi_test(w->req);
}

void tf_dist_work_free(tf_dist_work *w) {
  if (!w) return;
  if (w->req || w->event) (void)tf_dist_finish(w); /* MPI or NCCL may still write into the tensors */
  tf_tensor_release(w->keep[0]);
  tf_tensor_release(w->keep[1]);
  free(w);
}

tf_status tf_dist_all_reduce_raw(void *data, int64_t n, tf_dtype dtype, tf_device device, tf_dist_op op,
                                 tf_dist_work **work) {
  const char *fname = "tf.dist (model gradients)";
  TF_TRY(tf_dist_ready(fname));
  tf_dist_call c = {.kind = TF_DIST_K_ALL_REDUCE, .fname = fname, .send = data, .recv = data, .count = n,
                    .dtype = dtype, .device = device, .op = op};
  if (tf_dist_local(&c) || n == 0) return tf_dist_done_work(TF_OK, work);
  return tf_dist_run(&c, NULL, NULL, work, true);
}

tf_status tf_dist_reduce_to_shards(void *data, int64_t n, tf_dtype dtype, tf_device device, tf_dist_op op) {
  const char *fname = "tf.dist (model gradient shards)";
  TF_TRY(tf_dist_ready(fname));
  tf_dist_call c = {.kind = TF_DIST_K_REDUCE_SHARDS, .fname = fname, .send = data, .recv = data, .count = n,
                    .dtype = dtype, .device = device, .op = op};
  if (tf_dist_local(&c)) return TF_OK;
  return tf_dist_run(&c, NULL, NULL, NULL, true);
}

tf_status tf_dist_all_gather_shards(void *data, int64_t n, tf_dtype dtype, tf_device device) {
  const char *fname = "tf.dist (model parameter shards)";
  TF_TRY(tf_dist_ready(fname));
  tf_dist_call c = {.kind = TF_DIST_K_GATHER_SHARDS, .fname = fname, .send = data, .recv = data, .count = n,
                    .dtype = dtype, .device = device};
  if (tf_dist_local(&c)) return TF_OK;
  return tf_dist_run(&c, NULL, NULL, NULL, true);
}
