/* tf.dist's insides, shared by dist.c (arguments, checks, the world of
 * one), dist_env.c, dist_mpi.c (CPU tensors), dist_nccl.c (GPU tensors)
 * and dist_bootstrap.c (NCCL's id over a socket). */
#ifndef TF_DIST_INTERNAL_H
#define TF_DIST_INTERNAL_H

#include "dist.h"

#include <stddef.h>

typedef enum tf_dist_kind {
  TF_DIST_K_BARRIER,
  TF_DIST_K_ALL_REDUCE,
  TF_DIST_K_BROADCAST,
  TF_DIST_K_ALL_GATHER,
  TF_DIST_K_REDUCE_SCATTER,
  TF_DIST_K_SEND,
  TF_DIST_K_RECV,
  TF_DIST_K_GATHER_SHARDS,
  TF_DIST_K_REDUCE_SHARDS,
  TF_DIST_KINDS
} tf_dist_kind;

/* One collective as the transports see it: count is the elements each rank
 * contributes (all_gather: numel(t); reduce_scatter: numel(out)); send and
 * recv point at memory of device. */
typedef struct tf_dist_call {
  tf_dist_kind kind;
  const char *fname; /* for messages: "tf.dist.all_reduce" */
  const void *send;
  void *recv;
  int64_t count;
  tf_dtype dtype;
  tf_device device;
  tf_dist_op op;
  int peer; /* the root of a broadcast, the other rank of send/recv */
} tf_dist_call;

/* ---- dist_common.c ---- */
/* What the ranks compare before a collective. */
enum { TF_DIST_SIG_LEN = 7 };
void tf_dist_signature(const tf_dist_call *c, int64_t sig[TF_DIST_SIG_LEN]);
/* "all_reduce of 1024 f32 on cpu" for a signature, into buf. */
const char *tf_dist_signature_format(const int64_t sig[TF_DIST_SIG_LEN], char *buf, size_t n);

/* ---- dist_mpi.c: MPI (stubs that fail when built without it) ---- */
typedef struct tf_dist_mpi_req tf_dist_mpi_req;
tf_status tf_dist_mpi_init(const tf_dist_env *env);
void tf_dist_mpi_finalize(bool failed);
bool tf_dist_mpi_active(void);
/* Compares sig with every other rank's, waiting at most timeout seconds:
 * on a mismatch or a rank that did not arrive, a message naming the ranks.
 * Point to point, only the receiver waits (for the signature the sender's
 * tf_dist_mpi_start sends ahead of its data), so that sends never block
 * and a ring of sends then receives cannot deadlock. */
tf_status tf_dist_mpi_agree(const tf_dist_call *c, const int64_t sig[TF_DIST_SIG_LEN], double timeout);
/* Starts c on host memory; *req to wait on. */
tf_status tf_dist_mpi_start(const tf_dist_call *c, tf_dist_mpi_req **req);
tf_status tf_dist_mpi_wait(tf_dist_mpi_req *req, double timeout);
bool tf_dist_mpi_test(tf_dist_mpi_req *req);
void tf_dist_mpi_req_free(tf_dist_mpi_req *req);
/* bytes at data from root to everyone (NCCL's id). */
tf_status tf_dist_mpi_bcast_bytes(void *data, size_t n, int root);
tf_status tf_dist_mpi_barrier(double timeout);
const char *tf_dist_mpi_library(void);

/* ---- dist_nccl.c: NCCL on GPU memory (stubs without CUDA) ---- */
/* Queues c on the device's communication stream, after the work queued so
 * far on its own stream (the communicator made on first use, its id handed
 * out within timeout seconds). With event NULL the device's stream waits
 * for the collective at once; else *event is its end, for tf_dist_nccl_join
 * (which work queued after it must follow) or tf_dist_nccl_done. */
tf_status tf_dist_nccl_run(const tf_dist_env *env, const tf_dist_call *c, double timeout, void **event);
tf_status tf_dist_nccl_join(tf_device device, void *event);
bool tf_dist_nccl_done(tf_device device, void *event);
void tf_dist_nccl_shutdown(bool failed);
const char *tf_dist_nccl_loaded_version(void);

/* ---- dist_bootstrap.c: n bytes from rank 0 to every rank over TCP ---- */
/* Rank 0 listens on MASTER_ADDR:MASTER_PORT (port + 1: NCCL's id) and
 * sends data to each rank that connects; the others connect (retrying
 * until timeout) and receive it. */
tf_status tf_dist_tcp_bcast(const tf_dist_env *env, void *data, size_t n, double timeout);

#endif
