/* NCCL for tensor-parallel groups (contract in comm.cuh).  NCCL is opened with
 * dlopen, so only the functions below are needed from it; their types are
 * NCCL's stable C ABI (ncclComm_t is an opaque pointer, ncclResult_t an int). */
#include <dlfcn.h>
#include <pthread.h>
#include <atomic>
#include <stdio.h>
#include <stdlib.h>

#include "common.cuh"
#include "comm.cuh"

typedef void *nccl_comm_t;
typedef int nccl_result_t;
enum { NCCL_FLOAT32 = 7 }; /* ncclFloat32 in nccl.h's ncclDataType_t */

static struct {
    pthread_once_t once;
    void *lib;
    char why[200];
    int version;
    nccl_result_t (*comm_init_all)(nccl_comm_t *, int, const int *);
    nccl_result_t (*all_gather)(const void *, void *, size_t, int, nccl_comm_t, cudaStream_t);
    nccl_result_t (*comm_abort)(nccl_comm_t);
    nccl_result_t (*comm_destroy)(nccl_comm_t);
    nccl_result_t (*get_version)(int *);
    const char *(*error_string)(nccl_result_t);
} nccl = {PTHREAD_ONCE_INIT};

static void nccl_load(void)
{
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    const char *name = getenv("DUET_NCCL_LIBRARY");
    if (!name || !*name)
        name = "libnccl.so.2";
    nccl.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!nccl.lib) {
        snprintf(nccl.why, sizeof nccl.why, "NCCL is not available: %s (put its directory in LD_LIBRARY_PATH or "
                 "name the library in DUET_NCCL_LIBRARY)", dlerror());
        return;
    }
#define SYM(field, sym)                                                                                             \
    do {                                                                                                            \
        *(void **)&nccl.field = dlsym(nccl.lib, sym);                                                               \
        if (!nccl.field) {                                                                                          \
            snprintf(nccl.why, sizeof nccl.why, "NCCL (%s) has no %s", name, sym);                                  \
            dlclose(nccl.lib);                                                                                      \
            nccl.lib = NULL;                                                                                        \
            return;                                                                                                 \
        }                                                                                                           \
    } while (0)
    SYM(comm_init_all, "ncclCommInitAll");
    SYM(all_gather, "ncclAllGather");
    SYM(comm_abort, "ncclCommAbort");
    SYM(comm_destroy, "ncclCommDestroy");
    SYM(get_version, "ncclGetVersion");
    SYM(error_string, "ncclGetErrorString");
#undef SYM
    if (nccl.get_version(&nccl.version) != 0)
        nccl.version = 0;
}

static int nccl_ready(duet_err_t *err)
{
    pthread_once(&nccl.once, nccl_load);
    if (!nccl.lib) {
        duet_err_set(err, DUET_ERR_UNSUPPORTED, "%s", nccl.why);
        return 0;
    }
    return 1;
}

struct duet_cuda_comm {
    nccl_comm_t comm;
    int rank, size;
    std::atomic<int> aborted;
    pthread_mutex_t mu; /* abort vs destroy */
};

extern "C" duet_status_t duet_cuda_bind(duet_cuda_t *c)
{
    DUET_CUDA_CHECK(c, cudaSetDevice(c->device));
    DUET_CUDA_CHECK(c, cudaFree(0)); /* the primary context exists and is current */
    return DUET_OK;
}

extern "C" void duet_cuda_comm_describe(char *buf, size_t len)
{
    pthread_once(&nccl.once, nccl_load);
    if (!nccl.lib)
        snprintf(buf, len, "%s", nccl.why);
    else
        snprintf(buf, len, "NCCL %d.%d.%d", nccl.version / 10000, nccl.version / 100 % 100, nccl.version % 100);
}

extern "C" duet_status_t duet_cuda_comm_init_all(duet_cuda_t *const *ctx, int n, duet_cuda_comm_t **comms,
                                                 duet_err_t *err)
{
    if (n < 1 || n > 64)
        return duet_err_set(err, DUET_ERR_INVALID, "tensor-parallel group of %d GPUs", n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (ctx[i]->device == ctx[j]->device)
                return duet_err_set(err, DUET_ERR_INVALID, "tensor-parallel group names device %d twice",
                                    ctx[i]->device);
    if (!nccl_ready(err))
        return DUET_ERR_UNSUPPORTED;
    int devs[64];
    nccl_comm_t raw[64];
    for (int i = 0; i < n; i++)
        devs[i] = ctx[i]->device;
    nccl_result_t r = nccl.comm_init_all(raw, n, devs);
    if (r != 0)
        return duet_err_set(err, DUET_ERR_CUDA, "ncclCommInitAll over %d GPUs: %s", n, nccl.error_string(r));
    for (int i = 0; i < n; i++) {
        duet_cuda_comm_t *c = (duet_cuda_comm_t *)calloc(1, sizeof *c);
        if (!c) {
            for (int j = 0; j < n; j++) {
                if (j < i) {
                    free(comms[j]);
                    comms[j] = NULL;
                }
                nccl.comm_destroy(raw[j]);
            }
            return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
        }
        c->comm = raw[i];
        c->rank = i;
        c->size = n;
        pthread_mutex_init(&c->mu, NULL);
        comms[i] = c;
    }
    return DUET_OK;
}

extern "C" void duet_cuda_comm_abort(duet_cuda_comm_t *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    if (!c->aborted.exchange(1) && c->comm) {
        nccl.comm_abort(c->comm);
        c->comm = NULL;
    }
    pthread_mutex_unlock(&c->mu);
}

extern "C" void duet_cuda_comm_destroy(duet_cuda_comm_t **pc)
{
    if (!pc || !*pc)
        return;
    duet_cuda_comm_t *c = *pc;
    pthread_mutex_lock(&c->mu);
    if (c->comm)
        nccl.comm_destroy(c->comm);
    c->comm = NULL;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *pc = NULL;
}

extern "C" int duet_cuda_comm_rank(const duet_cuda_comm_t *c) { return c->rank; }
extern "C" int duet_cuda_comm_size(const duet_cuda_comm_t *c) { return c->size; }

extern "C" duet_status_t duet_cuda_comm_allgather(duet_cuda_comm_t *comm, duet_cuda_t *c, const float *send,
                                                  float *recv, size_t count)
{
    if (comm->aborted.load())
        return duet_cuda_failf(c, DUET_ERR_CUDA, "tensor-parallel rank %d: the group was aborted", comm->rank);
    if (count == 0)
        return DUET_OK;
    nccl_result_t r = nccl.all_gather(send, recv, count, NCCL_FLOAT32, comm->comm, c->stream);
    if (r != 0)
        return duet_cuda_failf(c, DUET_ERR_CUDA, "ncclAllGather of %zu floats on rank %d of %d: %s", count,
                               comm->rank, comm->size, nccl.error_string(r));
    return DUET_OK;
}
