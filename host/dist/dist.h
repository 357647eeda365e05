/* Several processes, one model: the ranks of a run and the collectives
 * between them (tf.dist's core, Lua-free).
 *
 * A run of N processes is a "world" of N ranks, started by tfhost --nproc N
 * (host/app/launch.c), mpirun, srun or a torchrun-style launcher; each
 * process learns its rank from its environment (tf_dist_env_read). The
 * collectives move tensors between ranks through the engines clusters use,
 * never an algorithm of tfhost's own:
 *
 *   CPU tensors: MPI (Open MPI), when tfhost was built with it and the run
 *                was started by an MPI launcher (tfhost --nproc does that);
 *   GPU tensors: NCCL, loaded at run time (libnccl.so.2 found on the
 *                system or beside the binary), its unique id handed from
 *                rank 0 to the others through MPI or, without MPI, over a
 *                TCP socket at MASTER_ADDR:MASTER_PORT.
 *
 * A world of size 1 needs neither: every collective is then local (a GPU
 * tensor still goes through NCCL when it can be loaded, so that one GPU
 * exercises the same path as several).
 *
 * Before each collective the ranks compare what they were asked to do
 * (which collective, dtype, element count, device, root) by exchanging a
 * small signature (on by default, tf_dist_set_checks): a mismatch is an
 * error on every rank naming the ranks and what each had, and a rank that
 * does not arrive within the timeout is named by the others, never a hang.
 *
 * Not thread-safe: one thread drives tf.dist. */
#ifndef TF_DIST_H
#define TF_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Who this process is, read from the launcher's environment. */
typedef struct tf_dist_env {
  int rank, world_size;
  int local_rank, local_world_size; /* on this machine */
  const char *launcher;             /* "tfhost", "torchrun", "mpirun", "mpich", "srun" or "none" */
  bool mpi_launch;                  /* started by an MPI launcher: MPI can form the world */
} tf_dist_env;

/* Reads the environment: RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE
 * (torchrun's convention, which tfhost --nproc sets too), else Open MPI's
 * OMPI_COMM_WORLD_*, MPICH's PMI_RANK/PMI_SIZE, Slurm's SLURM_PROCID/
 * SLURM_STEP_NUM_TASKS/SLURM_LOCALID; else a world of one. A malformed or
 * inconsistent value is an error naming the variable. */
tf_status tf_dist_env_read(tf_dist_env *out);

/* Joins the world once (MPI_Init where the run has more than one rank and
 * MPI launched it); later calls return the first result. */
tf_status tf_dist_init(void);
/* This process's place (a world of one before tf_dist_init or when it failed). */
const tf_dist_env *tf_dist_self(void);
/* Leaves the world at a normal end (MPI_Finalize, NCCL freed). After an
 * error that ends the run on this rank alone, call it with failed = true:
 * nothing collective is attempted (the launcher stops the other ranks). */
void tf_dist_shutdown(bool failed);

/* What this build and machine have. */
bool tf_dist_mpi_compiled(void);
/* Whether NCCL can be used (CUDA built, libnccl.so.2 loadable); why not in why. */
bool tf_dist_nccl_available(char *why, size_t n);
/* "Open MPI v4.1.4, ..." or NULL; NCCL's version as "2.28.9" or NULL. */
const char *tf_dist_mpi_version(void);
const char *tf_dist_nccl_version(void);

typedef enum tf_dist_op { TF_DIST_SUM, TF_DIST_AVG, TF_DIST_MAX, TF_DIST_MIN } tf_dist_op;
/* "sum", "avg", "max", "min" -> op. */
tf_status tf_dist_op_parse(const char *name, tf_dist_op *out);

/* An asynchronous collective in flight. Tensors it uses are kept alive
 * until it is freed. On a GPU it runs on the device's communication stream
 * after the ops queued before it, beside those queued after it, until
 * tf_dist_wait makes the device's stream wait for it (the host does not);
 * a blocking collective is waited for so at once. */
typedef struct tf_dist_work tf_dist_work;

/* Every collective below runs to completion when work is NULL, else
 * starts and hands back a work to wait on. Tensors must be contiguous,
 * of a dtype other than bool, and (for the pairs out/t) on one device. */
tf_status tf_dist_barrier(void);
/* t = op over ranks of t, in place. */
tf_status tf_dist_all_reduce(tf_tensor *t, tf_dist_op op, tf_dist_work **work);
/* t = root's t. */
tf_status tf_dist_broadcast(tf_tensor *t, int root, tf_dist_work **work);
/* out (world_size * numel(t) elements) = every rank's t, by rank. */
tf_status tf_dist_all_gather(tf_tensor *out, const tf_tensor *t, tf_dist_work **work);
/* out (numel(t) / world_size elements) = this rank's part of op over ranks of t. */
tf_status tf_dist_reduce_scatter(tf_tensor *out, const tf_tensor *t, tf_dist_op op, tf_dist_work **work);
/* Point to point: t to peer, or t from peer (same dtype and count). */
tf_status tf_dist_send(const tf_tensor *t, int peer, tf_dist_work **work);
tf_status tf_dist_recv(tf_tensor *t, int peer, tf_dist_work **work);

/* Waits for work (a failure is reported once); whether it has finished
 * (never blocks); frees it (NULL is fine; waits first if still running). */
tf_status tf_dist_wait(tf_dist_work *work);
bool tf_dist_done(tf_dist_work *work);
void tf_dist_work_free(tf_dist_work *work);

/* The signature exchange before each collective: on (the default) or off
 * (faster for small messages; a mismatch may then hang or corrupt). */
void tf_dist_set_checks(bool on);
bool tf_dist_checks(void);
/* Seconds a rank waits for the others to arrive at a collective (default
 * 300, or TF_DIST_TIMEOUT). */
tf_status tf_dist_set_timeout(double seconds);
double tf_dist_timeout(void);

/* The fused engine's flat buffers (raw memory on device), unchecked (the
 * engines of every rank call them alike; tf_model_set_data_parallel's
 * checked broadcast has compared their sizes): all-reduce of n
 * elements at data, and the all-gather of shards: rank r's part
 * [r * chunk, min(n, (r + 1) * chunk)), chunk = ceil(n / world), is given
 * to every rank in place. */
tf_status tf_dist_all_reduce_raw(void *data, int64_t n, tf_dtype dtype, tf_device device, tf_dist_op op,
                                 tf_dist_work **work);
tf_status tf_dist_all_gather_shards(void *data, int64_t n, tf_dtype dtype, tf_device device);
/* The reverse: rank r's part becomes op over every rank's (a reduce-scatter
 * in place, into shards of uneven size); the other parts are left as they
 * were or hold partial results. */
tf_status tf_dist_reduce_to_shards(void *data, int64_t n, tf_dtype dtype, tf_device device, tf_dist_op op);
/* The shard [begin, end) of n elements that rank owns (as above). */
void tf_dist_shard(int64_t n, int rank, int world, int64_t *begin, int64_t *end);

#ifdef __cplusplus
}
#endif
#endif
