/* tfhost --nproc N: one process per rank on this machine. */
#ifndef TF_LAUNCH_H
#define TF_LAUNCH_H

/* Runs argv (tfhost's own command line with --nproc N taken out: argv[0],
 * options, script, arguments) as nproc ranks and returns the run's exit
 * code (exit_codes.h): TF_EXIT_OK when every rank ended well, else the
 * first failing rank's code (TF_EXIT_SIGNAL + signal for a rank killed by
 * one) after the others were stopped; TF_EXIT_USAGE for a count out of
 * 1..256 or above the GPUs; TF_EXIT_SIGNAL + signal when interrupted.
 *
 * With MPI in the build and mpirun on PATH, mpirun starts the ranks (MPI
 * then joins them: CPU tensors can travel); otherwise tfhost forks them
 * itself (GPU tensors through NCCL only). Either way each rank finds RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
 * (or MPI's equivalents) and, on a machine with GPUs, uses GPU LOCAL_RANK.
 *
 * Output: rank 0's lines as they are, other ranks' lines prefixed with
 * "[rank R] "; every rank's standard error prefixed likewise. */
int tf_launch(int nproc, int argc, char **argv);

#endif
