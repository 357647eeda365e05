/* GPU tensors between ranks through NCCL, loaded at run time: tfhost
 * builds and runs without it, and finds libnccl.so.2 on the system, beside
 * the binary or in the CUDA Toolkit. One communicator per process, made on
 * the first GPU collective on that process's device; its unique id goes
 * from rank 0 to the others through MPI when the run has it, else over a
 * socket (dist_bootstrap.c). Collectives run on a communication stream of
 * the device's, after the ops queued before them, and the ops queued after
 * a finished (waited for) collective follow it: an asynchronous one runs
 * beside the kernels queued meanwhile (the backward pass of data-parallel
 * training). */
#include "dist_internal.h"

#include <stdio.h>
#include <string.h>

#ifdef TF_WITH_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include "backend.h"

/* NCCL's ABI, as nccl.h declares it (stable since 2.0; avg since 2.10). */
typedef struct tf_nccl_id {
  char internal[128];
} tf_nccl_id;
typedef struct tf_nccl_comm *tf_nccl_comm;
typedef int tf_nccl_result;
enum { TF_NCCL_INT32 = 2, TF_NCCL_INT64 = 4, TF_NCCL_F16 = 6, TF_NCCL_F32 = 7, TF_NCCL_F64 = 8, TF_NCCL_BF16 = 9 };
enum { TF_NCCL_SUM = 0, TF_NCCL_MAX = 2, TF_NCCL_MIN = 3, TF_NCCL_AVG = 4 };

static struct {
  bool tried;
  void *lib;
  char why[256], version[32];
  tf_nccl_result (*get_version)(int *);
  tf_nccl_result (*get_unique_id)(tf_nccl_id *);
  tf_nccl_result (*comm_init_rank)(tf_nccl_comm *, int, tf_nccl_id, int);
  tf_nccl_result (*comm_destroy)(tf_nccl_comm);
  tf_nccl_result (*comm_abort)(tf_nccl_comm);
  const char *(*error_string)(tf_nccl_result);
  tf_nccl_result (*all_reduce)(const void *, void *, size_t, int, int, tf_nccl_comm, void *);
  tf_nccl_result (*broadcast)(const void *, void *, size_t, int, int, tf_nccl_comm, void *);
  tf_nccl_result (*reduce)(const void *, void *, size_t, int, int, int, tf_nccl_comm, void *);
  tf_nccl_result (*all_gather)(const void *, void *, size_t, int, tf_nccl_comm, void *);
  tf_nccl_result (*reduce_scatter)(const void *, void *, size_t, int, int, tf_nccl_comm, void *);
  tf_nccl_result (*send)(const void *, size_t, int, int, tf_nccl_comm, void *);
  tf_nccl_result (*recv)(void *, size_t, int, int, tf_nccl_comm, void *);
  tf_nccl_result (*group_start)(void);
  tf_nccl_result (*group_end)(void);
  tf_nccl_comm comm;
  tf_device device; /* the communicator's */
} tf_nccl;

/* dlopen of libnccl.so.2: the loader's search (LD_LIBRARY_PATH, the
 * binary's RUNPATH, the system), then beside the binary, then the toolkit. */
static void *tf_nccl_open(void) {
  void *lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib) return lib;
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 32);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) {
      strcpy(slash + 1, "libnccl.so.2");
      if ((lib = dlopen(exe, RTLD_NOW | RTLD_LOCAL))) return lib;
    }
  }
  return dlopen("/usr/local/cuda/lib64/libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
}

static bool tf_nccl_load(void) {
  if (tf_nccl.tried) return tf_nccl.lib != NULL;
  tf_nccl.tried = true;
  void *lib = tf_nccl_open();
  if (!lib) {
    snprintf(tf_nccl.why, sizeof tf_nccl.why, "libnccl.so.2 was not found (install NCCL or copy it beside tfhost)");
    return false;
  }
  struct {
    const char *name;
    void **slot;
  } syms[] = {
      {"ncclGetVersion", (void **)&tf_nccl.get_version},
      {"ncclGetUniqueId", (void **)&tf_nccl.get_unique_id},
      {"ncclCommInitRank", (void **)&tf_nccl.comm_init_rank},
      {"ncclCommDestroy", (void **)&tf_nccl.comm_destroy},
      {"ncclCommAbort", (void **)&tf_nccl.comm_abort},
      {"ncclGetErrorString", (void **)&tf_nccl.error_string},
      {"ncclAllReduce", (void **)&tf_nccl.all_reduce},
      {"ncclBroadcast", (void **)&tf_nccl.broadcast},
      {"ncclReduce", (void **)&tf_nccl.reduce},
      {"ncclAllGather", (void **)&tf_nccl.all_gather},
      {"ncclReduceScatter", (void **)&tf_nccl.reduce_scatter},
      {"ncclSend", (void **)&tf_nccl.send},
      {"ncclRecv", (void **)&tf_nccl.recv},
      {"ncclGroupStart", (void **)&tf_nccl.group_start},
      {"ncclGroupEnd", (void **)&tf_nccl.group_end},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
      snprintf(tf_nccl.why, sizeof tf_nccl.why, "libnccl.so.2 has no %s (NCCL older than 2.7?)", syms[i].name);
      dlclose(lib);
      return false;
    }
  }
  int v = 0;
  if (tf_nccl.get_version(&v) == 0) {
    /* 2.9 and later: major * 10000 + minor * 100 + patch */
    snprintf(tf_nccl.version, sizeof tf_nccl.version, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    if (v < 21000) {
      snprintf(tf_nccl.why, sizeof tf_nccl.why, "NCCL %s is older than 2.10 (no avg)", tf_nccl.version);
      dlclose(lib);
      return false;
    }
  }
  tf_nccl.lib = lib;
  return true;
}

bool tf_dist_nccl_available(char *why, size_t n) {
  bool ok = tf_cuda_device_count() > 0 && tf_nccl_load();
  if (!ok && why && n) snprintf(why, n, "%s", tf_cuda_device_count() > 0 ? tf_nccl.why : "no GPU is present");
  return ok;
}

const char *tf_dist_nccl_loaded_version(void) { return tf_nccl.lib ? tf_nccl.version : NULL; }

static tf_status tf_nccl_check(tf_nccl_result r, const char *what) {
  if (r == 0) return TF_OK;
  return tf_fail(TF_ERR_BACKEND, "%s failed: %s", what, tf_nccl.error_string ? tf_nccl.error_string(r) : "?");
}

static tf_status tf_nccl_comm_for(const tf_dist_env *env, tf_device d, const char *fname, double timeout) {
  if (tf_nccl.comm) {
    if (tf_device_eq(d, tf_nccl.device)) return TF_OK;
    char a[32], b[32];
    tf_device_format(d, a, sizeof a);
    tf_device_format(tf_nccl.device, b, sizeof b);
    return tf_fail(TF_ERR_DEVICE, "%s: the tensor is on %s, but this rank's NCCL communicator is on %s", fname, a, b);
  }
  char why[256];
  if (!tf_dist_nccl_available(why, sizeof why)) return tf_fail(TF_ERR_STATE, "%s: NCCL: %s", fname, why);
  tf_nccl_id id;
  memset(&id, 0, sizeof id);
  if (env->rank == 0) TF_TRY(tf_nccl_check(tf_nccl.get_unique_id(&id), "ncclGetUniqueId"));
  if (env->world_size > 1) {
    if (tf_dist_mpi_active())
      TF_TRY(tf_dist_mpi_bcast_bytes(&id, sizeof id, 0));
    else
      TF_TRY(tf_dist_tcp_bcast(env, &id, sizeof id, timeout));
  }
  tf_device_ctx *ctx;
  void *stream;
  TF_TRY(tf_device_ctx_get(d, &ctx));
  TF_TRY(ctx->backend->comm_begin(ctx, &stream)); /* the device made current */
  TF_TRY(tf_nccl_check(tf_nccl.comm_init_rank(&tf_nccl.comm, env->world_size, id, env->rank), "ncclCommInitRank"));
  tf_nccl.device = d;
  return TF_OK;
}

static int tf_nccl_type(tf_dtype d) {
  switch (d) {
    case TF_F32: return TF_NCCL_F32;
    case TF_F64: return TF_NCCL_F64;
    case TF_F16: return TF_NCCL_F16;
    case TF_BF16: return TF_NCCL_BF16;
    case TF_I32: return TF_NCCL_INT32;
    default: return TF_NCCL_INT64;
  }
}

static int tf_nccl_op(tf_dist_op op) {
  return op == TF_DIST_AVG ? TF_NCCL_AVG : op == TF_DIST_MAX ? TF_NCCL_MAX : op == TF_DIST_MIN ? TF_NCCL_MIN : TF_NCCL_SUM;
}

/* One call per rank's shard of c's buffer (tf_dist_shard), in one group:
 * each shard reduced into its rank (reduce), or broadcast from it. */
static tf_nccl_result tf_nccl_per_shard(const tf_dist_env *env, const tf_dist_call *c, bool reduce, int t, int op,
                                        tf_nccl_comm comm, void *s) {
  const size_t esize = tf_dtype_size(c->dtype);
  tf_nccl_result r = tf_nccl.group_start();
  for (int i = 0; i < env->world_size && r == 0; i++) {
    int64_t b, e;
    tf_dist_shard(c->count, i, env->world_size, &b, &e);
    char *p = (char *)c->recv + (size_t)b * esize;
    if (e > b)
      r = reduce ? tf_nccl.reduce(p, p, (size_t)(e - b), t, op, i, comm, s)
                 : tf_nccl.broadcast(p, p, (size_t)(e - b), t, i, comm, s);
  }
  tf_nccl_result g = tf_nccl.group_end();
  return r == 0 ? g : r;
}

tf_status tf_dist_nccl_run(const tf_dist_env *env, const tf_dist_call *c, double timeout, void **event) {
  TF_TRY(tf_nccl_comm_for(env, c->device, c->fname, timeout));
  tf_device_ctx *ctx;
  void *s;
  TF_TRY(tf_device_ctx_get(c->device, &ctx));
  TF_TRY(ctx->backend->comm_begin(ctx, &s));
  const size_t n = (size_t)c->count;
  const int t = tf_nccl_type(c->dtype), op = tf_nccl_op(c->op);
  tf_nccl_comm comm = tf_nccl.comm;
  tf_nccl_result r = 0;
  switch (c->kind) {
    case TF_DIST_K_ALL_REDUCE: r = tf_nccl.all_reduce(c->send, c->recv, n, t, op, comm, s); break;
    case TF_DIST_K_BROADCAST: r = tf_nccl.broadcast(c->send, c->recv, n, t, c->peer, comm, s); break;
    case TF_DIST_K_ALL_GATHER: r = tf_nccl.all_gather(c->send, c->recv, n, t, comm, s); break;
    case TF_DIST_K_REDUCE_SCATTER: r = tf_nccl.reduce_scatter(c->send, c->recv, n, t, op, comm, s); break;
    case TF_DIST_K_SEND: r = tf_nccl.send(c->send, n, t, c->peer, comm, s); break;
    case TF_DIST_K_RECV: r = tf_nccl.recv(c->recv, n, t, c->peer, comm, s); break;
    case TF_DIST_K_REDUCE_SHARDS: r = tf_nccl_per_shard(env, c, true, t, op, comm, s); break;
    case TF_DIST_K_GATHER_SHARDS: r = tf_nccl_per_shard(env, c, false, t, op, comm, s); break;
    default: return tf_fail(TF_ERR_STATE, "%s: not a collective NCCL runs", c->fname);
  }
  TF_TRY(tf_nccl_check(r, c->fname));
  void *done;
  TF_TRY(ctx->backend->comm_end(ctx, &done));
  if (event) {
    *event = done;
    return TF_OK;
  }
  return ctx->backend->comm_join(ctx, done);
}

tf_status tf_dist_nccl_join(tf_device device, void *event) {
  tf_device_ctx *ctx;
  TF_TRY(tf_device_ctx_get(device, &ctx));
  return ctx->backend->comm_join(ctx, event);
}

bool tf_dist_nccl_done(tf_device device, void *event) {
  tf_device_ctx *ctx;
  return tf_device_ctx_get(device, &ctx) != TF_OK || ctx->backend->comm_done(ctx, event);
}

void tf_dist_nccl_shutdown(bool failed) {
  if (!tf_nccl.comm) return;
  if (failed)
    (void)tf_nccl.comm_abort(tf_nccl.comm);
  else
    (void)tf_nccl.comm_destroy(tf_nccl.comm);
  tf_nccl.comm = NULL;
}

#else /* a CPU-only build: no GPU tensors, so no NCCL */

bool tf_dist_nccl_available(char *why, size_t n) {
  if (why && n) snprintf(why, n, "this tfhost was built without CUDA");
  return false;
}
const char *tf_dist_nccl_loaded_version(void) { return NULL; }
tf_status tf_dist_nccl_run(const tf_dist_env *env, const tf_dist_call *c, double timeout, void **event) {
  (void)env, (void)timeout, (void)event;
  return tf_fail(TF_ERR_STATE, "%s: this tfhost was built without CUDA, so it has no NCCL", c->fname);
}
tf_status tf_dist_nccl_join(tf_device device, void *event) {
  (void)device, (void)event;
  return TF_OK;
}
bool tf_dist_nccl_done(tf_device device, void *event) {
  (void)device, (void)event;
  return true;
}
void tf_dist_nccl_shutdown(bool failed) { (void)failed; }
#endif
