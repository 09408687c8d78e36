/* Collectives between the GPUs of one tensor-parallel group (docs/CUDA.md,
 * "Tensor parallelism"), over NCCL.
 *
 * One process drives every GPU of its group, one context (duet_cuda_t) and
 * one host thread per GPU; duet_cuda_comm_init_all makes one communicator per
 * context (ncclCommInitAll).  NCCL is loaded when the first group is made
 * (dlopen of libnccl.so.2), so a build or a machine without NCCL still runs
 * everything with one GPU per process; asking for a group there fails with
 * UNSUPPORTED and a sentence that says what is missing.
 *
 * Only all-gather is used: a reduction is an all-gather followed by a sum in
 * rank order on every rank, so its result is the same on every rank, whatever
 * NCCL's algorithm or the message size (the forward's batch invariance holds
 * for any group size).
 *
 * NCCL_NVLS_ENABLE is set to 0 before NCCL loads unless the environment sets
 * it: NVLink multicast stays off by default. */
#ifndef DUET_CUDA_COMM_CUH
#define DUET_CUDA_COMM_CUH

#include "duet_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct duet_cuda_comm duet_cuda_comm_t;

/* Make the context's device (and its primary context) current on the calling thread: every host
 * thread that queues work on a context it did not create, and threads that hand device pointers
 * to libraries using the current context (the data plane's progress thread, whose UCX CUDA
 * transports do), call this once. */
duet_status_t duet_cuda_bind(duet_cuda_t *c);

/* One communicator per context, ranks in the order given (n >= 1, distinct devices).  On
 * failure nothing is returned and err says why (NCCL missing, NCCL's error). */
duet_status_t duet_cuda_comm_init_all(duet_cuda_t *const *ctx, int n, duet_cuda_comm_t **comms, duet_err_t *err);
void duet_cuda_comm_destroy(duet_cuda_comm_t **comm);
/* Abort the communicator: collectives queued or running on it end with an error, so a rank whose
 * peers failed never waits forever.  Safe from any thread, idempotent; the communicator is
 * unusable afterwards. */
void duet_cuda_comm_abort(duet_cuda_comm_t *comm);
int duet_cuda_comm_rank(const duet_cuda_comm_t *comm);
int duet_cuda_comm_size(const duet_cuda_comm_t *comm);

/* recv (size * count floats, device) = every rank's send (count floats), in rank order; queued
 * on c's stream (c: the communicator's context).  Every rank of the group must call it with
 * the same count. */
duet_status_t duet_cuda_comm_allgather(duet_cuda_comm_t *comm, duet_cuda_t *c, const float *send, float *recv,
                                       size_t count);

/* "NCCL 2.27.3" or the reason NCCL is not available. */
void duet_cuda_comm_describe(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
