/* The CUDA context: device, stream, cuBLAS(Lt) handles, scratch, errors,
 * device memory and timing (duet_cuda.h). */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <sched.h>

#include <cuda_profiler_api.h>

#include "common.cuh"

#define WORKSPACE_BYTES (32u << 20)
#define ARGS_BYTES (1u << 20)

duet_status_t duet_cuda_fail(duet_cuda_t *c, duet_status_t st, const char *what, const char *file, int line,
                             const char *detail)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (c)
        return duet_err_set(&c->err, st, "%s at %s:%d on device %d: %s", what, base, line, c->device,
                            detail ? detail : "");
    return st;
}

duet_status_t duet_cuda_failf(duet_cuda_t *c, duet_status_t st, const char *fmt, ...)
{
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return duet_err_set(&c->err, st, "%s", buf);
}

struct duet_cuda_phases {
    cudaEvent_t ev[DUET_CUDA_PHASE_MARKS];
    int id[DUET_CUDA_PHASE_MARKS];
    int n_ev;  /* events created */
    int n;     /* marks recorded since the last collection */
    duet_cuda_phase_totals_t t;
};

static void phases_free(duet_cuda_t *c)
{
    if (!c->phases)
        return;
    for (int i = 0; i < c->phases->n_ev; i++)
        cudaEventDestroy(c->phases->ev[i]);
    free(c->phases);
    c->phases = NULL;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

duet_status_t duet_cuda_wait_event(duet_cuda_t *c, cudaEvent_t ev)
{
    if (c->stuck) {
        c->err = c->stuck_err;
        c->err.status = DUET_ERR_CUDA;
        return DUET_ERR_CUDA;
    }
    /* polled, not cudaEventSynchronize: that one has no deadline.  Queries back to back for the
     * first millisecond (a decode step's last wait is short and on its critical path), then
     * yielding the core between them */
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)c->wait_ms * 1000000u;
    for (unsigned i = 0;; i++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) {
            if (i && cudaPeekAtLastError() == cudaErrorNotReady) /* not an error; some runtimes leave it as one */
                (void)cudaGetLastError();
            return DUET_OK;
        }
        if (e != cudaErrorNotReady)
            return duet_cuda_fail(c, DUET_ERR_CUDA, "cudaEventQuery", __FILE__, __LINE__, cudaGetErrorString(e));
        if ((i & 15) != 15)
            continue;
        uint64_t t = now_ns();
        if (t >= until)
            break;
        if (t - t0 > 1000000u)
            sched_yield();
    }
    if (cudaPeekAtLastError() == cudaErrorNotReady)
        (void)cudaGetLastError();
    c->stuck = 1;
    duet_err_set(&c->stuck_err, DUET_ERR_TIMEOUT,
                 "the GPU (device %d) has not finished its queued work within %u ms: taken as stuck", c->device,
                 c->wait_ms);
    c->err = c->stuck_err;
    return DUET_ERR_TIMEOUT;
}

duet_status_t duet_cuda_wait_stream(duet_cuda_t *c)
{
    if (!c->stuck)
        DUET_CUDA_CHECK(c, cudaEventRecord(c->wait_ev, c->stream));
    return duet_cuda_wait_event(c, c->wait_ev);
}

extern "C" void duet_cuda_set_wait_timeout(duet_cuda_t *c, uint32_t ms)
{
    c->wait_ms = ms ? ms : DUET_CUDA_WAIT_MS;
    if (c->side)
        c->side->wait_ms = c->wait_ms;
}

extern "C" int duet_cuda_stuck(const duet_cuda_t *c) { return c->stuck || (c->side && c->side->stuck); }

__global__ void test_hold_kernel(unsigned long long ns)
{
    unsigned long long t0 = d_globaltimer();
    while (d_globaltimer() - t0 < ns)
        __nanosleep(100000);
}

extern "C" duet_status_t duet_cuda_test_hold(duet_cuda_t *c, uint32_t ms)
{
    if (ms > 600000u)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "test hold of %u ms (at most 600000)", ms);
    test_hold_kernel<<<1, 1, 0, c->stream>>>((unsigned long long)ms * 1000000ull);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

static void ctx_release(duet_cuda_t *c)
{
    if (c->side) {
        ctx_release(c->side);
        free(c->side);
        c->side = NULL;
    }
    /* a stuck device: freeing would wait for work that may never end, and the process ends
     * anyway; its memory and handles are left as they are */
    if (c->stuck)
        return;
    cudaSetDevice(c->device);
    if (c->stream && c->wait_ev)
        duet_cuda_wait_stream(c);
    if (c->stuck)
        return;
    for (int i = 0; i < DUET_CUDA_MAX_PLANS; i++) {
        struct duet_lt_plan *p = &c->plans[i];
        if (!p->used)
            continue;
        cublasLtMatrixLayoutDestroy(p->a);
        cublasLtMatrixLayoutDestroy(p->b);
        cublasLtMatrixLayoutDestroy(p->d);
        cublasLtMatmulDescDestroy(p->desc);
    }
    phases_free(c);
    if (c->t0)
        cudaEventDestroy(c->t0);
    if (c->t1)
        cudaEventDestroy(c->t1);
    if (c->args_done)
        cudaEventDestroy(c->args_done);
    if (c->order)
        cudaEventDestroy(c->order);
    if (c->wait_ev)
        cudaEventDestroy(c->wait_ev);
    for (int i = 0; i < DUET_CUDA_FENCES; i++)
        if (c->fence[i])
            cudaEventDestroy(c->fence[i]);
    if (c->args_host)
        cudaFreeHost(c->args_host);
    cudaFree(c->args_dev);
    cudaFree(c->flush_buf);
    cudaFree(c->scratch);
    cudaFree(c->tc_part);
    cudaFree(c->tc_xrec);
    cudaFree(c->tc_count);
    cudaFree(c->workspace);
    if (c->lt)
        cublasLtDestroy(c->lt);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->stream)
        cudaStreamDestroy(c->stream);
}

/* high: the stream at the device's highest priority (a side stream: its blocks placed first as
 * SMs free up, so that its short chain overlaps the main stream's long launches) */
static duet_status_t ctx_open(duet_cuda_t *c, int high)
{
    int n = 0;
    DUET_CUDA_CHECK(c, cudaGetDeviceCount(&n));
    if (c->device < 0 || c->device >= n)
        return duet_cuda_failf(c, DUET_ERR_CUDA, "device %d requested, %d present", c->device, n);
    DUET_CUDA_CHECK(c, cudaSetDevice(c->device));
    cudaDeviceProp prop;
    DUET_CUDA_CHECK(c, cudaGetDeviceProperties(&prop, c->device));
    snprintf(c->info.name, sizeof c->info.name, "%s", prop.name);
    c->info.cc_major = prop.major;
    c->pdl = prop.major >= 9;
    c->info.cc_minor = prop.minor;
    c->info.sm_count = prop.multiProcessorCount;
    c->info.l2_bytes = (size_t)prop.l2CacheSize;
    c->info.mem_bytes = prop.totalGlobalMem;
    DUET_CUDA_CHECK(c, cudaDriverGetVersion(&c->info.driver_version));
    DUET_CUDA_CHECK(c, cudaRuntimeGetVersion(&c->info.runtime_version));
    c->info.cublas_version = (int)cublasLtGetVersion();

    int prio_low = 0, prio_high = 0;
    DUET_CUDA_CHECK(c, cudaDeviceGetStreamPriorityRange(&prio_low, &prio_high));
    DUET_CUDA_CHECK(c, cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking, high ? prio_high : prio_low));
    DUET_CUBLAS_CHECK(c, cublasCreate(&c->blas));
    DUET_CUBLAS_CHECK(c, cublasSetStream(c->blas, c->stream));
    DUET_CUBLAS_CHECK(c, cublasLtCreate(&c->lt));
    c->workspace_bytes = WORKSPACE_BYTES;
    DUET_CUDA_CHECK(c, cudaMalloc(&c->workspace, c->workspace_bytes));
    DUET_CUBLAS_CHECK(c, cublasSetWorkspace(c->blas, c->workspace, c->workspace_bytes));
    c->args_bytes = ARGS_BYTES;
    DUET_CUDA_CHECK(c, cudaHostAlloc(&c->args_host, c->args_bytes, cudaHostAllocDefault));
    DUET_CUDA_CHECK(c, cudaMalloc(&c->args_dev, c->args_bytes));
    DUET_CUDA_CHECK(c, cudaEventCreateWithFlags(&c->args_done, cudaEventDisableTiming));
    DUET_CUDA_CHECK(c, cudaEventCreate(&c->t0));
    DUET_CUDA_CHECK(c, cudaEventCreate(&c->t1));
    DUET_CUDA_CHECK(c, cudaEventCreateWithFlags(&c->order, cudaEventDisableTiming));
    DUET_CUDA_CHECK(c, cudaEventCreateWithFlags(&c->wait_ev, cudaEventDisableTiming));
    if (!c->wait_ms)
        c->wait_ms = DUET_CUDA_WAIT_MS;
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_create(int device, duet_cuda_t **out, duet_err_t *err)
{
    duet_cuda_t *c = (duet_cuda_t *)calloc(1, sizeof *c);
    if (!c)
        return duet_err_set(err, DUET_ERR_NOMEM, "cuda context: out of memory");
    c->device = device;
    duet_status_t st = ctx_open(c, 0);
    if (st != DUET_OK) {
        if (err)
            *err = c->err;
        ctx_release(c);
        free(c);
        return st;
    }
    *out = c;
    return DUET_OK;
}

extern "C" void duet_cuda_destroy(duet_cuda_t **pc)
{
    if (!pc || !*pc)
        return;
    ctx_release(*pc);
    free(*pc);
    *pc = NULL;
}

extern "C" duet_cuda_t *duet_cuda_side(duet_cuda_t *c)
{
    if (!c->side) {
        duet_cuda_t *s = (duet_cuda_t *)calloc(1, sizeof *s);
        if (!s) {
            duet_cuda_failf(c, DUET_ERR_NOMEM, "side stream: out of memory");
            return NULL;
        }
        s->device = c->device;
        s->wait_ms = c->wait_ms;
        if (ctx_open(s, 1) != DUET_OK) {
            duet_err_set(&c->err, DUET_ERR_CUDA, "side stream: %s", s->err.msg);
            ctx_release(s);
            free(s);
            return NULL;
        }
        c->side = s;
    }
    duet_cuda_t *s = c->side; /* the settings that choose kernels and decompositions, as c has them */
    s->invariant = c->invariant;
    s->exact = c->exact;
    s->pdl = c->pdl;
    s->tc_presplit = c->tc_presplit;
    s->attn_no_tc = c->attn_no_tc;
    s->fp8_scale_layout = c->fp8_scale_layout;
    return s;
}

/* Work queued on `to` from now on starts after all that `from` has queued so far; failures
 * recorded in c. */
static duet_status_t stream_after(duet_cuda_t *c, duet_cuda_t *to, duet_cuda_t *from)
{
    DUET_CUDA_CHECK(c, cudaEventRecord(from->order, from->stream));
    DUET_CUDA_CHECK(c, cudaStreamWaitEvent(to->stream, from->order, 0));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_fork(duet_cuda_t *c)
{
    if (!c->side)
        return duet_cuda_failf(c, DUET_ERR_STATE, "fork: the context has no side stream (duet_cuda_side)");
    return stream_after(c, c->side, c);
}

extern "C" duet_status_t duet_cuda_join(duet_cuda_t *c)
{
    if (!c->side)
        return duet_cuda_failf(c, DUET_ERR_STATE, "join: the context has no side stream (duet_cuda_side)");
    return stream_after(c, c, c->side);
}

extern "C" void duet_cuda_set_invariant(duet_cuda_t *c, int on) { c->invariant = on != 0; }

extern "C" int duet_cuda_get_invariant(const duet_cuda_t *c) { return c->invariant; }

extern "C" void duet_cuda_set_exact(duet_cuda_t *c, int on)
{
    c->exact = on != 0;
    if (c->side)
        c->side->exact = c->exact;
}

extern "C" int duet_cuda_get_exact(const duet_cuda_t *c) { return c->exact; }

extern "C" int duet_cuda_set_pdl(duet_cuda_t *c, int on)
{
    c->pdl = on && c->info.cc_major >= 9;
    return c->pdl;
}

extern "C" const duet_err_t *duet_cuda_error(const duet_cuda_t *c) { return &c->err; }

extern "C" void duet_cuda_info(const duet_cuda_t *c, duet_cuda_info_t *info) { *info = c->info; }

extern "C" duet_status_t duet_cuda_sync(duet_cuda_t *c)
{
    DUET_TRY(duet_cuda_wait_stream(c));
    DUET_CUDA_CHECK(c, cudaGetLastError());
    return DUET_OK;
}

static duet_status_t fence_slot(duet_cuda_t *c, int slot)
{
    if (slot < 0 || slot >= DUET_CUDA_FENCES)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "fence slot %d (0..%d)", slot, DUET_CUDA_FENCES - 1);
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_fence(duet_cuda_t *c, int slot)
{
    DUET_TRY(fence_slot(c, slot));
    if (!c->fence[slot])
        DUET_CUDA_CHECK(c, cudaEventCreateWithFlags(&c->fence[slot], cudaEventDisableTiming));
    DUET_CUDA_CHECK(c, cudaEventRecord(c->fence[slot], c->stream));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_fence_passed(duet_cuda_t *c, int slot, int *passed)
{
    *passed = 0;
    DUET_TRY(fence_slot(c, slot));
    cudaError_t e = c->fence[slot] ? cudaEventQuery(c->fence[slot]) : cudaSuccess;
    if (e == cudaErrorNotReady) {
        /* not an error; some runtimes still leave it as the last error, which later checks must not see */
        if (cudaPeekAtLastError() == cudaErrorNotReady)
            (void)cudaGetLastError();
        return DUET_OK;
    }
    DUET_CUDA_CHECK(c, e);
    DUET_CUDA_CHECK(c, cudaGetLastError());
    *passed = 1;
    return DUET_OK;
}

duet_status_t duet_cuda_scratch(duet_cuda_t *c, size_t bytes, void **p)
{
    if (bytes > c->scratch_bytes) {
        /* queued work may still read the old buffer */
        DUET_TRY(duet_cuda_wait_stream(c));
        DUET_CUDA_CHECK(c, cudaFree(c->scratch));
        c->scratch = NULL;
        c->scratch_bytes = 0;
        size_t want = duet_round_up(bytes + bytes / 4, 1u << 20);
        DUET_CUDA_CHECK(c, cudaMalloc(&c->scratch, want));
        c->scratch_bytes = want;
    }
    *p = c->scratch;
    return DUET_OK;
}

duet_status_t duet_cuda_args(duet_cuda_t *c, const void *host, size_t bytes, void **dev)
{
    if (bytes > c->args_bytes) {
        DUET_TRY(duet_cuda_wait_stream(c));
        DUET_CUDA_CHECK(c, cudaFreeHost(c->args_host));
        DUET_CUDA_CHECK(c, cudaFree(c->args_dev));
        c->args_host = NULL;
        c->args_dev = NULL;
        c->args_bytes = 0;
        size_t want = duet_round_up(bytes, 1u << 20);
        DUET_CUDA_CHECK(c, cudaHostAlloc(&c->args_host, want, cudaHostAllocDefault));
        DUET_CUDA_CHECK(c, cudaMalloc(&c->args_dev, want));
        c->args_bytes = want;
    }
    /* the previous copy out of the pinned buffer must be done before it is rewritten;
     * kernels reading args_dev are ordered after the new copy on the same stream */
    DUET_TRY(duet_cuda_wait_event(c, c->args_done));
    memcpy(c->args_host, host, bytes);
    DUET_CUDA_CHECK(c, cudaMemcpyAsync(c->args_dev, c->args_host, bytes, cudaMemcpyHostToDevice, c->stream));
    DUET_CUDA_CHECK(c, cudaEventRecord(c->args_done, c->stream));
    *dev = c->args_dev;
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_malloc(duet_cuda_t *c, void **p, size_t bytes)
{
    *p = NULL;
    DUET_CUDA_CHECK(c, cudaMalloc(p, bytes ? bytes : 1));
    return DUET_OK;
}

extern "C" void duet_cuda_free(duet_cuda_t *c, void *p)
{
    (void)c;
    cudaFree(p);
}

extern "C" duet_status_t duet_cuda_upload(duet_cuda_t *c, void *dst, const void *src, size_t bytes)
{
    DUET_CUDA_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    DUET_TRY(duet_cuda_wait_stream(c));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_download(duet_cuda_t *c, void *dst, const void *src, size_t bytes)
{
    DUET_CUDA_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    DUET_TRY(duet_cuda_wait_stream(c));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_memset(duet_cuda_t *c, void *p, int byte, size_t bytes)
{
    DUET_CUDA_CHECK(c, cudaMemsetAsync(p, byte, bytes, c->stream));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_memcpy(duet_cuda_t *c, void *dst, const void *src, size_t bytes)
{
    DUET_CUDA_CHECK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->stream));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_host_alloc(duet_cuda_t *c, void **p, size_t bytes)
{
    *p = NULL;
    DUET_CUDA_CHECK(c, cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable));
    return DUET_OK;
}

extern "C" void duet_cuda_host_free(duet_cuda_t *c, void *p)
{
    (void)c;
    if (p)
        cudaFreeHost(p);
}

extern "C" duet_status_t duet_cuda_host_register(duet_cuda_t *c, void *p, size_t bytes, void **dev)
{
    *dev = NULL;
    if (!p || !bytes)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "host_register: empty range");
    DUET_CUDA_CHECK(c, cudaSetDevice(c->device));
    DUET_CUDA_CHECK(c, cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    cudaError_t e = cudaHostGetDevicePointer(dev, p, 0);
    if (e != cudaSuccess) {
        cudaHostUnregister(p);
        *dev = NULL;
        return duet_cuda_failf(c, DUET_ERR_CUDA, "cudaHostGetDevicePointer() on device %d: %s", c->device,
                               cudaGetErrorString(e));
    }
    return DUET_OK;
}

extern "C" void duet_cuda_host_unregister(duet_cuda_t *c, void *p)
{
    (void)c;
    if (p)
        cudaHostUnregister(p);
}

extern "C" duet_status_t duet_cuda_timer_start(duet_cuda_t *c)
{
    DUET_CUDA_CHECK(c, cudaEventRecord(c->t0, c->stream));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_timer_stop(duet_cuda_t *c, float *ms)
{
    DUET_CUDA_CHECK(c, cudaEventRecord(c->t1, c->stream));
    DUET_TRY(duet_cuda_wait_event(c, c->t1));
    DUET_CUDA_CHECK(c, cudaEventElapsedTime(ms, c->t0, c->t1));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_phases_enable(duet_cuda_t *c, int on)
{
    if (!on) {
        DUET_TRY(duet_cuda_wait_stream(c));
        phases_free(c);
        return DUET_OK;
    }
    if (!c->phases) {
        c->phases = (struct duet_cuda_phases *)calloc(1, sizeof *c->phases);
        if (!c->phases)
            return duet_cuda_failf(c, DUET_ERR_NOMEM, "phase timing: out of memory");
    }
    memset(&c->phases->t, 0, sizeof c->phases->t);
    c->phases->n = 0;
    return DUET_OK;
}

extern "C" int duet_cuda_phases_enabled(const duet_cuda_t *c) { return c->phases != NULL; }

extern "C" duet_status_t duet_cuda_profile_span(duet_cuda_t *c, int on)
{
    DUET_TRY(duet_cuda_wait_stream(c));
    DUET_CUDA_CHECK(c, on ? cudaProfilerStart() : cudaProfilerStop());
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_phase(duet_cuda_t *c, int id)
{
    struct duet_cuda_phases *p = c->phases;
    if (!p)
        return DUET_OK;
    if (id != DUET_CUDA_PHASE_END && (id < 0 || id >= DUET_CUDA_PHASE_IDS))
        return duet_cuda_failf(c, DUET_ERR_INVALID, "phase timing: id %d outside 0..%d", id, DUET_CUDA_PHASE_IDS - 1);
    if (p->n == DUET_CUDA_PHASE_MARKS) {
        p->t.dropped++;
        return DUET_OK;
    }
    if (p->n == p->n_ev) {
        DUET_CUDA_CHECK(c, cudaEventCreate(&p->ev[p->n_ev]));
        p->n_ev++;
    }
    DUET_CUDA_CHECK(c, cudaEventRecord(p->ev[p->n], c->stream));
    p->id[p->n++] = id;
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_phase_collect(duet_cuda_t *c)
{
    struct duet_cuda_phases *p = c->phases;
    if (!p || p->n == 0)
        return DUET_OK;
    int n = p->n;
    p->n = 0;
    DUET_TRY(duet_cuda_wait_event(c, p->ev[n - 1]));
    for (int i = 0; i + 1 < n; i++) {
        if (p->id[i] == DUET_CUDA_PHASE_END)
            continue;
        float ms = 0;
        DUET_CUDA_CHECK(c, cudaEventElapsedTime(&ms, p->ev[i], p->ev[i + 1]));
        p->t.ms[p->id[i]] += ms;
        p->t.count[p->id[i]]++;
    }
    p->t.collections++;
    return DUET_OK;
}

extern "C" void duet_cuda_phase_totals(duet_cuda_t *c, duet_cuda_phase_totals_t *t, int reset)
{
    if (!c->phases) {
        memset(t, 0, sizeof *t);
        return;
    }
    *t = c->phases->t;
    if (reset) {
        memset(&c->phases->t, 0, sizeof c->phases->t);
        c->phases->n = 0;
    }
}

/* Normal(0,1) from two uniforms (Box-Muller), from the hash of (seed, i). */
__device__ __forceinline__ float rand_normal(uint64_t seed, size_t i)
{
    uint64_t h = duet_mix64(seed ^ duet_mix64((uint64_t)i));
    float u1 = ((float)(uint32_t)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
    float u2 = (float)(uint32_t)(h & 0xffffffu) * (1.0f / 16777216.0f);
    return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

__global__ void fill_random_kernel(void *p, size_t n, int dtype, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        switch (dtype) {
        case DUET_DT_F32: ((float *)p)[i] = rand_normal(seed, i); break;
        case DUET_DT_BF16: ((uint16_t *)p)[i] = duet_d_f32_to_bf16(rand_normal(seed, i)); break;
        case DUET_DT_F8_E4M3: {
            uint8_t b = (uint8_t)duet_mix64(seed ^ duet_mix64((uint64_t)i));
            if ((b & 0x7f) == 0x7f)
                b ^= 1; /* no NaN */
            ((uint8_t *)p)[i] = b;
            break;
        }
        default: ((uint8_t *)p)[i] = (uint8_t)duet_mix64(seed ^ duet_mix64((uint64_t)i)); break;
        }
    }
}

extern "C" duet_status_t duet_cuda_fill_random(duet_cuda_t *c, void *p, size_t n, duet_dtype_t dtype, uint64_t seed)
{
    if (dtype != DUET_DT_F32 && dtype != DUET_DT_BF16 && dtype != DUET_DT_F8_E4M3 && dtype != DUET_DT_U8)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "fill_random: dtype %s", duet_dtype_name(dtype));
    if (!n)
        return DUET_OK;
    unsigned blocks = duet_cdiv(n, 256);
    if (blocks > 65536)
        blocks = 65536;
    fill_random_kernel<<<blocks, 256, 0, c->stream>>>(p, n, (int)dtype, seed);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}
