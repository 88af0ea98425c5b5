/*
 * whale_dist.h — one training run over several processes (MPI ranks, on one
 * machine or many): `mpirun -np N whale train|sft ...` (docs/distributed.md).
 *
 * The world is process-wide: whale_dist_init joins it once (MPI_Init) when
 * the process was started by an MPI launcher with more than one rank, and
 * does nothing otherwise; the training runs read whale_dist_rank/size. A
 * build without MPI runs every command in one process and refuses a launch
 * of several ranks with one line.
 */
#ifndef WHALE_DIST_H
#define WHALE_DIST_H

#include "whale.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this build has MPI. */
int whale_dist_available(void);

/* The number of ranks and this process's rank as the launcher's environment
 * gives them (Open MPI's OMPI_COMM_WORLD_SIZE/RANK, else PMI_SIZE/RANK as
 * MPICH's and Slurm's launchers set them); 1 and 0 when not launched so. */
int whale_dist_launched_size(void);
int whale_dist_launched_rank(void);

/* Join the world of ranks when launched with more than one (MPI_Init);
 * otherwise nothing. Without MPI in the build, a launch of several ranks is
 * WHALE_ERR_UNSUPPORTED. */
whale_code whale_dist_init(whale_err *err);
/* Leave the world after a successful command (MPI_Finalize). */
void whale_dist_finalize(void);
/* End every rank of the job with this exit status (MPI_Abort): after a
 * failure, the other ranks would wait for this one forever. */
void whale_dist_abort(int status);

/* This process's rank and the number of ranks (0 and 1 outside a world). */
int whale_dist_rank(void);
int whale_dist_size(void);

/* This rank's exchanges so far: seconds moving data, seconds waiting for
 * the other ranks to arrive, bytes sent to them. */
void whale_dist_stats(double *seconds, double *waited, double *bytes_sent);

#ifdef __cplusplus
}
#endif
#endif
