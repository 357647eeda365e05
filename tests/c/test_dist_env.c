/* tf.dist's C pieces that need no MPI or GPU: the rank from each launcher's
 * environment, the shards of a flat buffer, the signatures the ranks
 * compare, and NCCL's id handed from rank 0 to the others over TCP (the
 * path of GPU runs without MPI), between this process and forked ranks. */
#define _DEFAULT_SOURCE /* setenv, unsetenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "dist_internal.h"

static const char *const tf_all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE",
    "TFHOST_LAUNCHER", "PMIX_RANK"};

static void clear_env(void) {
  for (size_t i = 0; i < sizeof tf_all_vars / sizeof tf_all_vars[0]; i++) unsetenv(tf_all_vars[i]);
}

static void check_env(void) {
  tf_dist_env e;
  clear_env();
  CHECK_OK(tf_dist_env_read(&e));
  CHECK(e.rank == 0 && e.world_size == 1 && strcmp(e.launcher, "none") == 0 && !e.mpi_launch);

  setenv("OMPI_COMM_WORLD_RANK", "3", 1), setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1), setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  CHECK_OK(tf_dist_env_read(&e));
  CHECK(e.rank == 3 && e.world_size == 8 && e.local_rank == 1 && e.local_world_size == 2);
  CHECK(strcmp(e.launcher, "mpirun") == 0 && e.mpi_launch);

  clear_env();
  setenv("SLURM_PROCID", "5", 1), setenv("SLURM_STEP_NUM_TASKS", "6", 1), setenv("SLURM_LOCALID", "1", 1);
  CHECK_OK(tf_dist_env_read(&e));
  CHECK(e.rank == 5 && e.world_size == 6 && e.local_rank == 1 && strcmp(e.launcher, "srun") == 0);

  clear_env(); /* Slurm's batch script itself: no step, a world of one */
  setenv("SLURM_PROCID", "0", 1);
  CHECK_OK(tf_dist_env_read(&e));
  CHECK(e.world_size == 1 && strcmp(e.launcher, "none") == 0);

  clear_env();
  setenv("RANK", "1", 1), setenv("WORLD_SIZE", "2", 1), setenv("TFHOST_LAUNCHER", "tfhost", 1);
  CHECK_OK(tf_dist_env_read(&e));
  CHECK(e.rank == 1 && e.world_size == 2 && e.local_rank == 1 && strcmp(e.launcher, "tfhost") == 0 && !e.mpi_launch);
  setenv("WORLD_SIZE", "1", 1);
  CHECK_INT(tf_dist_env_read(&e), TF_ERR_ARG);
  CHECK(strstr(tf_last_error(), "RANK=1 is not below WORLD_SIZE=1") != NULL);
  setenv("WORLD_SIZE", "2x", 1);
  CHECK_INT(tf_dist_env_read(&e), TF_ERR_ARG);
  CHECK(strstr(tf_last_error(), "WORLD_SIZE='2x' is not an integer") != NULL);
  clear_env();
}

static void check_shards(void) {
  int64_t b, e, covered = 0;
  for (int r = 0; r < 3; r++) { /* 10 elements over 3 ranks: 4, 4, 2 */
    tf_dist_shard(10, r, 3, &b, &e);
    CHECK_INT(b, covered);
    covered = e;
  }
  CHECK_INT(covered, 10);
  tf_dist_shard(2, 3, 4, &b, &e); /* more ranks than elements: empty shards at the end */
  CHECK(b == 2 && e == 2);
}

static void check_signature(void) {
  tf_dist_call c = {.kind = TF_DIST_K_BROADCAST, .count = 12, .dtype = TF_BF16, .device = {TF_DEV_CPU, 0}, .peer = 1};
  int64_t sig[TF_DIST_SIG_LEN];
  char text[96];
  tf_dist_signature(&c, sig);
  CHECK(strcmp(tf_dist_signature_format(sig, text, sizeof text), "broadcast of 12 bf16 on cpu, root 1") == 0);
  c = (tf_dist_call){.kind = TF_DIST_K_ALL_REDUCE, .count = 3, .dtype = TF_F32, .device = {TF_DEV_CUDA, 0},
                     .op = TF_DIST_AVG};
  tf_dist_signature(&c, sig);
  CHECK(strcmp(tf_dist_signature_format(sig, text, sizeof text), "all_reduce of 3 f32 on cuda, avg") == 0);
}

/* Rank 0 (this process) hands 128 bytes to ranks 1..3 (forked), as NCCL's id. */
static void check_tcp_bcast(void) {
  char port[16];
  snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000));
  setenv("MASTER_ADDR", "127.0.0.1", 1), setenv("MASTER_PORT", port, 1);
  enum { WORLD = 4 };
  pid_t kids[WORLD];
  for (int r = 1; r < WORLD; r++) {
    if ((kids[r] = fork()) == 0) {
      tf_dist_env e = {.rank = r, .world_size = WORLD};
      char got[128] = {0}, want[128];
      for (int i = 0; i < 128; i++) want[i] = (char)(i * 7 + 1);
      _exit(tf_dist_tcp_bcast(&e, got, sizeof got, 20) == TF_OK && memcmp(got, want, sizeof got) == 0 ? 0 : 1);
    }
  }
  tf_dist_env e = {.rank = 0, .world_size = WORLD};
  char id[128];
  for (int i = 0; i < 128; i++) id[i] = (char)(i * 7 + 1);
  CHECK_OK(tf_dist_tcp_bcast(&e, id, sizeof id, 20));
  for (int r = 1; r < WORLD; r++) {
    int status = 0;
    waitpid(kids[r], &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  /* a rank 0 that nobody reaches says so after the timeout */
  tf_dist_env lonely = {.rank = 0, .world_size = 2};
  snprintf(port, sizeof port, "%d", 40000 + (int)(getpid() % 20000));
  setenv("MASTER_PORT", port, 1);
  CHECK_INT(tf_dist_tcp_bcast(&lonely, id, sizeof id, 0.3), TF_ERR_STATE);
  CHECK(strstr(tf_last_error(), "only 1 of 2 ranks connected to rank 0") != NULL);
}

int main(void) {
  check_env();
  check_shards();
  check_signature();
  check_tcp_bcast();
  return tf_check_done();
}
