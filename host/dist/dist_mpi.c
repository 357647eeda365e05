/* CPU tensors between ranks through MPI: the world is MPI_COMM_WORLD (a
 * duplicate of it for the collectives, another for the checks, so that a
 * check's messages never meet a collective's). f16 and bf16, which MPI has
 * no types for, travel as 2-byte elements reduced by operations of ours
 * that compute in f32 and round once per step, as NCCL does. Built without
 * MPI, every function here fails with a message that says so. */
#include "dist_internal.h"

#ifdef TF_WITH_MPI
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "half.h"

static MPI_Comm tf_mpi_work = MPI_COMM_NULL, tf_mpi_check = MPI_COMM_NULL;
static bool tf_mpi_inited_here;
static MPI_Datatype tf_mpi_half = MPI_DATATYPE_NULL; /* 2 bytes, contiguous */
static MPI_Op tf_mpi_half_ops[2][3];                 /* [bf16?][sum, max, min] */
static char tf_mpi_lib[MPI_MAX_LIBRARY_VERSION_STRING];

struct tf_dist_mpi_req {
  MPI_Request req;
};

static tf_status tf_mpi_fail(int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
  return tf_fail(TF_ERR_BACKEND, "%s failed: %s", what, msg);
}
#define TF_MPI_CHECK(call, what)                     \
  do {                                               \
    int tf_mpi_rc_ = (call);                         \
    if (tf_mpi_rc_ != MPI_SUCCESS) return tf_mpi_fail(tf_mpi_rc_, what); \
  } while (0)

/* The reductions of 2-byte floats: f32 arithmetic, one rounding. */
#define TF_HALF_OP(name, to_f32, from_f32, expr)                                  \
  static void name(void *in, void *inout, int *len, MPI_Datatype *type) {         \
    (void)type;                                                                   \
    const uint16_t *a = in;                                                       \
    uint16_t *b = inout;                                                          \
    for (int i = 0; i < *len; i++) {                                             \
      float x = to_f32(a[i]), y = to_f32(b[i]);                                   \
      b[i] = from_f32(expr);                                                      \
    }                                                                             \
  }
TF_HALF_OP(tf_bf16_sum, tf_bf16_to_f32, tf_f32_to_bf16, x + y)
TF_HALF_OP(tf_bf16_max, tf_bf16_to_f32, tf_f32_to_bf16, x > y || x != x ? x : y)
TF_HALF_OP(tf_bf16_min, tf_bf16_to_f32, tf_f32_to_bf16, x < y || x != x ? x : y)
TF_HALF_OP(tf_f16_sum, tf_f16_to_f32, tf_f32_to_f16, x + y)
TF_HALF_OP(tf_f16_max, tf_f16_to_f32, tf_f32_to_f16, x > y || x != x ? x : y)
TF_HALF_OP(tf_f16_min, tf_f16_to_f32, tf_f32_to_f16, x < y || x != x ? x : y)

tf_status tf_dist_mpi_init(const tf_dist_env *env) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided;
    TF_MPI_CHECK(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    tf_mpi_inited_here = true;
  }
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size != env->world_size || rank != env->rank)
    return tf_fail(TF_ERR_STATE,
                   "tf.dist: MPI sees rank %d of %d where the environment (%s) says rank %d of %d: start the "
                   "ranks with tfhost --nproc, mpirun or srun",
                   rank, size, env->launcher, env->rank, env->world_size);
  TF_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &tf_mpi_work), "MPI_Comm_dup");
  TF_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &tf_mpi_check), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(tf_mpi_work, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(tf_mpi_check, MPI_ERRORS_RETURN);
  TF_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &tf_mpi_half), "MPI_Type_contiguous");
  TF_MPI_CHECK(MPI_Type_commit(&tf_mpi_half), "MPI_Type_commit");
  MPI_User_function *fns[2][3] = {{tf_f16_sum, tf_f16_max, tf_f16_min}, {tf_bf16_sum, tf_bf16_max, tf_bf16_min}};
  for (int b = 0; b < 2; b++)
    for (int o = 0; o < 3; o++) TF_MPI_CHECK(MPI_Op_create(fns[b][o], 1, &tf_mpi_half_ops[b][o]), "MPI_Op_create");
  int len = 0;
  MPI_Get_library_version(tf_mpi_lib, &len);
  char *nl = strchr(tf_mpi_lib, '\n');
  if (nl) *nl = '\0';
  char *comma = strchr(tf_mpi_lib, ',');
  if (comma) *comma = '\0';
  return TF_OK;
}

bool tf_dist_mpi_active(void) { return tf_mpi_work != MPI_COMM_NULL; }
const char *tf_dist_mpi_library(void) { return tf_mpi_lib[0] ? tf_mpi_lib : NULL; }

void tf_dist_mpi_finalize(bool failed) {
  if (!tf_dist_mpi_active()) return;
  /* After a failure the others may be inside a collective: MPI_Finalize
   * would wait for them. The launcher ends the run instead. */
  if (failed || !tf_mpi_inited_here) return;
  for (int b = 0; b < 2; b++)
    for (int o = 0; o < 3; o++) MPI_Op_free(&tf_mpi_half_ops[b][o]);
  MPI_Type_free(&tf_mpi_half);
  MPI_Comm_free(&tf_mpi_work);
  MPI_Comm_free(&tf_mpi_check);
  MPI_Finalize();
}

/* Polls reqs until all are done or timeout seconds pass: spinning first,
 * then sleeping briefly (ranks may share cores). */
static int tf_mpi_poll(int n, MPI_Request *reqs, double timeout, bool *timed_out) {
  int64_t start = tf_clock_ns();
  *timed_out = false;
  for (long spins = 0;; spins++) {
    int done = 0;
    int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || done) return rc;
    if (spins > 1000) {
      if ((double)(tf_clock_ns() - start) > timeout * 1e9) {
        *timed_out = true;
        return MPI_SUCCESS;
      }
      nanosleep(&(struct timespec){0, 50000}, NULL);
    }
  }
}

/* A 31-bit tag per check, the same on every rank (collectives are called in one order). */
static int tf_mpi_check_tag(const tf_dist_call *c, int self) {
  static int64_t collective_seq, pair_seq[2][64];
  if (c->kind == TF_DIST_K_SEND || c->kind == TF_DIST_K_RECV) {
    /* one counter per direction and peer: a's sends meet b's receives */
    int from = c->kind == TF_DIST_K_SEND ? self : c->peer, to = c->kind == TF_DIST_K_SEND ? c->peer : self;
    int64_t *seq = &pair_seq[c->kind == TF_DIST_K_SEND][(from * 31 + to) & 63];
    return (int)(1 + 16384 + ((*seq)++ % 16000));
  }
  return (int)(1 + (collective_seq++ % 16000));
}

/* A send's check: its signature goes ahead of the data, through MPI
 * whichever carries the data (MPI, or NCCL for a GPU tensor), and the
 * receiver's check compares it (a few bytes: sent at once, whether or not
 * the peer is receiving yet). */
static tf_status tf_mpi_send_signature(const tf_dist_call *c, const int64_t sig[TF_DIST_SIG_LEN], int self,
                                       double timeout) {
  MPI_Request req;
  int rc = MPI_Isend(sig, TF_DIST_SIG_LEN, MPI_INT64_T, c->peer, tf_mpi_check_tag(c, self), tf_mpi_check, &req);
  bool timed_out = false;
  if (rc == MPI_SUCCESS) rc = tf_mpi_poll(1, &req, timeout, &timed_out);
  if (rc != MPI_SUCCESS) return tf_mpi_fail(rc, "the check before the send");
  if (timed_out) {
    MPI_Cancel(&req);
    MPI_Request_free(&req);
    return tf_fail(TF_ERR_STATE, "%s on rank %d: rank %d did not arrive within %.0f s (the check of the send)",
                   c->fname, self, c->peer, timeout);
  }
  return TF_OK;
}

tf_status tf_dist_mpi_agree(const tf_dist_call *c, const int64_t sig[TF_DIST_SIG_LEN], double timeout) {
  int self = 0, size = 1;
  MPI_Comm_rank(tf_mpi_check, &self);
  MPI_Comm_size(tf_mpi_check, &size);
  const bool p2p = c->kind == TF_DIST_K_SEND || c->kind == TF_DIST_K_RECV;
  if (c->kind == TF_DIST_K_SEND) return tf_mpi_send_signature(c, sig, self, timeout);
  const int tag = tf_mpi_check_tag(c, self);
  int64_t *theirs = calloc((size_t)size * TF_DIST_SIG_LEN, sizeof(int64_t));
  MPI_Request *reqs = calloc((size_t)size * 2, sizeof(MPI_Request));
  int *from = calloc((size_t)size, sizeof(int));
  if (!theirs || !reqs || !from) {
    free(theirs), free(reqs), free(from);
    return tf_fail(TF_ERR_OOM, "out of memory in %s's check", c->fname);
  }
  int n = 0, nrecv = 0;
  /* receives first, then sends; a pair checks only between its two ranks */
  for (int r = 0; r < size; r++) {
    if (r == self || (p2p && r != c->peer)) continue;
    from[nrecv++] = r;
    MPI_Irecv(theirs + (size_t)r * TF_DIST_SIG_LEN, TF_DIST_SIG_LEN, MPI_INT64_T, r, tag, tf_mpi_check, &reqs[n++]);
  }
  for (int r = 0; r < size && !p2p; r++) {
    if (r == self) continue;
    MPI_Isend(sig, TF_DIST_SIG_LEN, MPI_INT64_T, r, tag, tf_mpi_check, &reqs[n++]);
  }
  bool timed_out;
  int rc = tf_mpi_poll(n, reqs, timeout, &timed_out);
  tf_status st = TF_OK;
  char mine[96], other[96];
  tf_dist_signature_format(sig, mine, sizeof mine);
  if (rc != MPI_SUCCESS) {
    st = tf_mpi_fail(rc, "the check before the collective");
  } else if (timed_out) {
    char missing[256] = "";
    size_t used = 0;
    for (int i = 0; i < nrecv; i++) {
      int flag = 0;
      MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
      if (!flag && used + 12 < sizeof missing)
        used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d", used ? ", " : "", from[i]);
    }
    st = tf_fail(TF_ERR_STATE,
                 "%s (%s) on rank %d: rank(s) %s did not arrive within %.0f s (they are stopped, or running "
                 "other collectives); the ranks can no longer talk",
                 c->fname, mine, self, missing, timeout);
  } else {
    for (int i = 0; i < nrecv && st == TF_OK; i++) {
      const int64_t *t = theirs + (size_t)from[i] * TF_DIST_SIG_LEN;
      if (p2p) { /* the peer's send is a receive here: compare all but the kind and the peer */
        if (t[1] != sig[1] || t[2] != sig[2] || t[3] != sig[3])
          st = tf_fail(TF_ERR_ARG, "%s: rank %d has %s; its peer rank %d has %s", c->fname, self, mine, from[i],
                       tf_dist_signature_format(t, other, sizeof other));
      } else if (memcmp(t, sig, sizeof(int64_t) * TF_DIST_SIG_LEN) != 0) {
        st = tf_fail(TF_ERR_ARG, "%s: the ranks disagree: rank %d has %s; rank %d has %s", c->fname, self, mine,
                     from[i], tf_dist_signature_format(t, other, sizeof other));
      }
    }
  }
  free(theirs), free(reqs), free(from);
  return st;
}

static MPI_Datatype tf_mpi_type(tf_dtype d) {
  switch (d) {
    case TF_F32: return MPI_FLOAT;
    case TF_F64: return MPI_DOUBLE;
    case TF_I32: return MPI_INT32_T;
    case TF_I64: return MPI_INT64_T;
    case TF_F16:
    case TF_BF16: return tf_mpi_half;
    default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op tf_mpi_op(tf_dist_op op, tf_dtype d) {
  int o = op == TF_DIST_MAX ? 1 : op == TF_DIST_MIN ? 2 : 0; /* avg: a sum, divided afterwards */
  if (d == TF_F16 || d == TF_BF16) return tf_mpi_half_ops[d == TF_BF16][o];
  return o == 1 ? MPI_MAX : o == 2 ? MPI_MIN : MPI_SUM;
}

tf_status tf_dist_mpi_start(const tf_dist_call *c, tf_dist_mpi_req **out) {
  if (!tf_dist_mpi_active()) return tf_fail(TF_ERR_STATE, "%s: MPI is not initialised", c->fname);
  if (c->count > INT32_MAX)
    return tf_fail(TF_ERR_ARG, "%s: %lld elements are more than MPI's int count allows", c->fname,
                   (long long)c->count);
  tf_dist_mpi_req *r = calloc(1, sizeof *r);
  if (!r) return tf_fail(TF_ERR_OOM, "out of memory in %s", c->fname);
  const int n = (int)c->count;
  MPI_Datatype t = tf_mpi_type(c->dtype);
  MPI_Op op = tf_mpi_op(c->op, c->dtype);
  int rc = MPI_SUCCESS;
  switch (c->kind) {
    case TF_DIST_K_ALL_REDUCE: rc = MPI_Iallreduce(MPI_IN_PLACE, c->recv, n, t, op, tf_mpi_work, &r->req); break;
    case TF_DIST_K_BROADCAST: rc = MPI_Ibcast(c->recv, n, t, c->peer, tf_mpi_work, &r->req); break;
    case TF_DIST_K_ALL_GATHER: rc = MPI_Iallgather(c->send, n, t, c->recv, n, t, tf_mpi_work, &r->req); break;
    case TF_DIST_K_REDUCE_SCATTER:
      rc = MPI_Ireduce_scatter_block(c->send, c->recv, n, t, op, tf_mpi_work, &r->req);
      break;
    case TF_DIST_K_SEND: rc = MPI_Isend(c->send, n, t, c->peer, 7, tf_mpi_work, &r->req); break;
    case TF_DIST_K_RECV: rc = MPI_Irecv(c->recv, n, t, c->peer, 7, tf_mpi_work, &r->req); break;
    case TF_DIST_K_REDUCE_SHARDS: { /* each shard summed into its rank: one reduce per rank */
      int size = 1, self = 0;
      MPI_Comm_size(tf_mpi_work, &size);
      MPI_Comm_rank(tf_mpi_work, &self);
      const size_t esize = tf_dtype_size(c->dtype);
      for (int i = 0; i < size && rc == MPI_SUCCESS; i++) {
        int64_t b, e;
        tf_dist_shard(c->count, i, size, &b, &e);
        char *p = (char *)c->recv + (size_t)b * esize;
        if (e > b) rc = MPI_Reduce(i == self ? MPI_IN_PLACE : p, p, (int)(e - b), t, op, i, tf_mpi_work);
      }
      r->req = MPI_REQUEST_NULL;
      break;
    }
    case TF_DIST_K_GATHER_SHARDS: {
      int size = 1;
      MPI_Comm_size(tf_mpi_work, &size);
      int *counts = calloc((size_t)size * 2, sizeof(int));
      if (!counts) {
        free(r);
        return tf_fail(TF_ERR_OOM, "out of memory in %s", c->fname);
      }
      for (int i = 0; i < size; i++) {
        int64_t b, e;
        tf_dist_shard(c->count, i, size, &b, &e);
        counts[i] = (int)(e - b);
        counts[size + i] = (int)b;
      }
      rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c->recv, counts, counts + size, t, tf_mpi_work);
      free(counts);
      r->req = MPI_REQUEST_NULL;
      break;
    }
    default: rc = MPI_ERR_OTHER;
  }
  if (rc != MPI_SUCCESS) {
    free(r);
    return tf_mpi_fail(rc, c->fname);
  }
  *out = r;
  return TF_OK;
}

tf_status tf_dist_mpi_wait(tf_dist_mpi_req *r, double timeout) {
  bool timed_out;
  int rc = tf_mpi_poll(1, &r->req, timeout, &timed_out);
  if (rc != MPI_SUCCESS) return tf_mpi_fail(rc, "waiting for a collective");
  if (timed_out)
    return tf_fail(TF_ERR_STATE, "tf.dist: a collective did not finish within %.0f s (a rank stopped?)", timeout);
  return TF_OK;
}

bool tf_dist_mpi_test(tf_dist_mpi_req *r) {
  int flag = 0;
  MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE);
  return flag != 0;
}

void tf_dist_mpi_req_free(tf_dist_mpi_req *r) { free(r); }

tf_status tf_dist_mpi_bcast_bytes(void *data, size_t n, int root) {
  TF_MPI_CHECK(MPI_Bcast(data, (int)n, MPI_BYTE, root, tf_mpi_check), "MPI_Bcast");
  return TF_OK;
}

tf_status tf_dist_mpi_barrier(double timeout) {
  MPI_Request req;
  TF_MPI_CHECK(MPI_Ibarrier(tf_mpi_work, &req), "MPI_Ibarrier");
  bool timed_out;
  int rc = tf_mpi_poll(1, &req, timeout, &timed_out);
  if (rc != MPI_SUCCESS) return tf_mpi_fail(rc, "MPI_Ibarrier");
  if (timed_out) return tf_fail(TF_ERR_STATE, "tf.dist.barrier: not every rank arrived within %.0f s", timeout);
  return TF_OK;
}

#else /* built without MPI */

static tf_status tf_no_mpi(void) {
  return tf_fail(TF_ERR_STATE,
                 "tf.dist: this tfhost was built without MPI, so CPU tensors cannot travel between ranks "
                 "(install libopenmpi-dev and rebuild; GPU tensors use NCCL)");
}
tf_status tf_dist_mpi_init(const tf_dist_env *env) {
  (void)env;
  return tf_no_mpi();
}
void tf_dist_mpi_finalize(bool failed) { (void)failed; }
bool tf_dist_mpi_active(void) { return false; }
const char *tf_dist_mpi_library(void) { return NULL; }
tf_status tf_dist_mpi_agree(const tf_dist_call *c, const int64_t sig[TF_DIST_SIG_LEN], double timeout) {
  (void)c, (void)sig, (void)timeout;
  return tf_no_mpi();
}
tf_status tf_dist_mpi_start(const tf_dist_call *c, tf_dist_mpi_req **req) {
  (void)c, (void)req;
  return tf_no_mpi();
}
tf_status tf_dist_mpi_wait(tf_dist_mpi_req *req, double timeout) {
  (void)req, (void)timeout;
  return tf_no_mpi();
}
bool tf_dist_mpi_test(tf_dist_mpi_req *req) {
  (void)req;
  return true;
}
void tf_dist_mpi_req_free(tf_dist_mpi_req *req) { (void)req; }
tf_status tf_dist_mpi_bcast_bytes(void *data, size_t n, int root) {
  (void)data, (void)n, (void)root;
  return tf_no_mpi();
}
tf_status tf_dist_mpi_barrier(double timeout) {
  (void)timeout;
  return tf_no_mpi();
}
#endif

bool tf_dist_mpi_compiled(void) {
#ifdef TF_WITH_MPI
  return true;
#else
  return false;
#endif
}
