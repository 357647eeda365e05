/* The rank of this process, from the environment its launcher gave it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

/* The integer in variable name (>= min), or -1 when unset; -2 (message
 * recorded) when set to something else. */
static int tf_env_int(const char *name, int min) {
  const char *s = getenv(name);
  if (!s) return -1;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0' || errno == ERANGE || v < min || v > 1 << 20) {
    (void)tf_fail(TF_ERR_ARG, "tf.dist: %s='%s' is not an integer >= %d", name, s, min);
    return -2;
  }
  return (int)v;
}

/* One launcher's variables: rank, size (both needed) and the local ones. */
typedef struct tf_env_names {
  const char *launcher, *rank, *size, *local_rank, *local_size;
  bool mpi;
} tf_env_names;

static const tf_env_names tf_launchers[] = {
    /* torchrun's convention, which tfhost --nproc sets as well (launcher named by TFHOST_LAUNCHER) */
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", true},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", true},
    /* srun sets SLURM_STEP_NUM_TASKS for the tasks of a step, not in the batch script itself */
    {"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", false},
};

tf_status tf_dist_env_read(tf_dist_env *out) {
  *out = (tf_dist_env){.rank = 0, .world_size = 1, .local_rank = 0, .local_world_size = 1, .launcher = "none"};
  for (size_t i = 0; i < sizeof tf_launchers / sizeof tf_launchers[0]; i++) {
    const tf_env_names *e = &tf_launchers[i];
    int rank = tf_env_int(e->rank, 0), size = tf_env_int(e->size, 1);
    if (rank == -2 || size == -2) return TF_ERR_ARG;
    if (rank < 0 && size < 0) continue;
    /* Slurm's batch script has SLURM_PROCID but no step: not a launch */
    if (size < 0 && strcmp(e->launcher, "srun") == 0) continue;
    if (rank < 0 || size < 0)
      return tf_fail(TF_ERR_ARG, "tf.dist: %s is set but %s is not", rank < 0 ? e->size : e->rank,
                     rank < 0 ? e->rank : e->size);
    if (rank >= size) return tf_fail(TF_ERR_ARG, "tf.dist: %s=%d is not below %s=%d", e->rank, rank, e->size, size);
    int local = tf_env_int(e->local_rank, 0), local_size = tf_env_int(e->local_size, 1);
    if (local == -2 || local_size == -2) return TF_ERR_ARG;
    out->rank = rank;
    out->world_size = size;
    out->local_rank = local >= 0 ? local : rank;
    out->local_world_size = local_size >= 0 ? local_size : size;
    if (out->local_rank >= out->local_world_size) out->local_world_size = out->local_rank + 1;
    out->launcher = e->launcher;
    const char *named = getenv("TFHOST_LAUNCHER");
    if (named && strcmp(named, "tfhost") == 0) out->launcher = "tfhost";
    /* tfhost --nproc under MPI sets both conventions; MPI can join them either way */
    out->mpi_launch = e->mpi || getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
    return TF_OK;
  }
  return TF_OK;
}
