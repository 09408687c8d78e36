/* Ceilings measured in the run (contract in roofline.cuh). */
#include <algorithm>
#include <vector>

#include "common.cuh"

static double median_of(std::vector<float> &v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Median milliseconds of `reps` timed runs of f (after two untimed ones). */
template <typename F>
static duet_status_t time_median(duet_cuda_t *c, int reps, F f, double *ms)
{
    for (int i = 0; i < 2; i++)
        DUET_TRY(f());
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        float m = 0.0f;
        DUET_TRY(duet_cuda_timer_start(c));
        DUET_TRY(f());
        DUET_TRY(duet_cuda_timer_stop(c, &m));
        t.push_back(m);
    }
    *ms = median_of(t);
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_measure_copy(duet_cuda_t *c, size_t bytes, int reps, double *gbps)
{
    void *a = NULL, *b = NULL;
    duet_status_t st = duet_cuda_malloc(c, &a, bytes);
    if (st == DUET_OK)
        st = duet_cuda_malloc(c, &b, bytes);
    if (st == DUET_OK)
        st = duet_cuda_fill_random(c, a, bytes, DUET_DT_U8, 11);
    double ms = 0.0;
    if (st == DUET_OK)
        st = time_median(c, reps, [&]() -> duet_status_t {
            DUET_CUDA_CHECK(c, cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, c->stream));
            return DUET_OK;
        }, &ms);
    duet_cuda_free(c, a);
    duet_cuda_free(c, b);
    if (st == DUET_OK)
        *gbps = 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
    return st;
}

extern "C" duet_status_t duet_cuda_measure_host_copy(duet_cuda_t *c, size_t bytes, int to_device, int reps,
                                                     double *gbps)
{
    void *h = NULL, *d = NULL;
    duet_status_t st = duet_cuda_host_alloc(c, &h, bytes);
    if (st == DUET_OK)
        st = duet_cuda_malloc(c, &d, bytes);
    if (st == DUET_OK)
        memset(h, 0x5a, bytes);
    double ms = 0.0;
    if (st == DUET_OK)
        st = time_median(c, reps, [&]() -> duet_status_t {
            if (to_device)
                DUET_CUDA_CHECK(c, cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, c->stream));
            else
                DUET_CUDA_CHECK(c, cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, c->stream));
            return DUET_OK;
        }, &ms);
    duet_cuda_host_free(c, h);
    duet_cuda_free(c, d);
    if (st == DUET_OK)
        *gbps = (double)bytes / (ms * 1e-3) / 1e9;
    return st;
}

/* D(m, n) bf16 = op(A) · B with A (k x m, transposed) and B (k x n); fp8 adds block scales. */
static duet_status_t gemm_measure(duet_cuda_t *c, int fp8, int m, int n, int k, int reps, double *tflops)
{
    cudaDataType_t ab = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    size_t el = fp8 ? 1 : 2;
    void *A = NULL, *B = NULL, *D = NULL, *sa = NULL, *sb = NULL;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int nres = 0;
    double ms = 0.0;
    duet_status_t st = DUET_OK;
    cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    size_t ws = c->workspace_bytes;
    const float one = 1.0f, zero = 0.0f;
#define G_TRY(expr)                                                                                                \
    do {                                                                                                           \
        st = (expr);                                                                                               \
        if (st != DUET_OK)                                                                                         \
            goto out;                                                                                              \
    } while (0)
#define G_BLAS(stmt)                                                                                               \
    do {                                                                                                           \
        cublasStatus_t s_ = (stmt);                                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                         \
            st = duet_cuda_fail(c, DUET_ERR_CUDA, #stmt, __FILE__, __LINE__, cublasGetStatusString(s_));          \
            goto out;                                                                                              \
        }                                                                                                          \
    } while (0)
    G_TRY(duet_cuda_malloc(c, &A, (size_t)m * k * el));
    G_TRY(duet_cuda_malloc(c, &B, (size_t)n * k * el));
    G_TRY(duet_cuda_malloc(c, &D, (size_t)m * n * 2));
    G_TRY(duet_cuda_fill_random(c, A, (size_t)m * k, fp8 ? DUET_DT_F8_E4M3 : DUET_DT_BF16, 21));
    G_TRY(duet_cuda_fill_random(c, B, (size_t)n * k, fp8 ? DUET_DT_F8_E4M3 : DUET_DT_BF16, 22));
    G_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    G_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
    G_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
    if (fp8) {
        size_t na = (size_t)((m + 127) / 128) * ((k / 128 + 3) / 4 * 4), nb = (size_t)(k / 128) * n;
        G_TRY(duet_cuda_malloc(c, &sa, na * 4));
        G_TRY(duet_cuda_malloc(c, &sb, nb * 4));
        std::vector<float> ones(na > nb ? na : nb, 1.0f / 64.0f);
        G_TRY(duet_cuda_upload(c, sa, ones.data(), na * 4));
        G_TRY(duet_cuda_upload(c, sb, ones.data(), nb * 4));
        int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        G_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
        G_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
        G_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
        G_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    }
    G_BLAS(cublasLtMatrixLayoutCreate(&la, ab, (uint64_t)k, (uint64_t)m, k));
    G_BLAS(cublasLtMatrixLayoutCreate(&lb, ab, (uint64_t)k, (uint64_t)n, k));
    G_BLAS(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, (uint64_t)m, (uint64_t)n, m));
    G_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    G_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    G_BLAS(cublasLtMatmulAlgoGetHeuristic(c->lt, desc, la, lb, ld, ld, pref, 1, &res, &nres));
    if (nres == 0) {
        st = duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "cuBLASLt has no %s GEMM algorithm here",
                             fp8 ? "block-scaled fp8" : "bf16");
        goto out;
    }
    G_TRY(time_median(c, reps, [&]() -> duet_status_t {
        DUET_CUBLAS_CHECK(c, cublasLtMatmul(c->lt, desc, &one, A, la, B, lb, &zero, D, ld, D, ld, &res.algo,
                                            c->workspace, c->workspace_bytes, c->stream));
        return DUET_OK;
    }, &ms));
    *tflops = 2.0 * m * n * (double)k / (ms * 1e-3) / 1e12;
out:
#undef G_TRY
#undef G_BLAS
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (desc)
        cublasLtMatmulDescDestroy(desc);
    duet_status_t drained = duet_cuda_wait_stream(c);
    if (st == DUET_OK)
        st = drained;
    if (duet_cuda_stuck(c))
        return st; /* freeing would wait for the device: the buffers stay */
    duet_cuda_free(c, A);
    duet_cuda_free(c, B);
    duet_cuda_free(c, D);
    duet_cuda_free(c, sa);
    duet_cuda_free(c, sb);
    return st;
}

extern "C" duet_status_t duet_cuda_measure_gemm_bf16(duet_cuda_t *c, int m, int n, int k, int reps, double *tflops)
{
    return gemm_measure(c, 0, m, n, k, reps, tflops);
}

extern "C" duet_status_t duet_cuda_measure_gemm_fp8(duet_cuda_t *c, int m, int n, int k, int reps, double *tflops)
{
    return gemm_measure(c, 1, m, n, k, reps, tflops);
}

__global__ void fma_kernel(float *out, int iters, float a, float b)
{
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        x[i] = threadIdx.x * 1e-3f + i;
    for (int it = 0; it < iters; it++)
#pragma unroll
        for (int i = 0; i < 8; i++)
            x[i] = fmaf(x[i], a, b);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++)
        s += x[i];
    if (s == 1234.5f) /* never: keeps the chains alive */
        out[threadIdx.x] = s;
}

extern "C" duet_status_t duet_cuda_measure_fma(duet_cuda_t *c, int reps, double *tflops)
{
    float *out = NULL;
    DUET_TRY(duet_cuda_malloc(c, (void **)&out, 4096));
    const int iters = 4096, threads = 256;
    int blocks = c->info.sm_count * 8;
    double ms = 0.0;
    duet_status_t st = time_median(c, reps, [&]() -> duet_status_t {
        fma_kernel<<<blocks, threads, 0, c->stream>>>(out, iters, 0.999f, 1e-3f);
        DUET_CUDA_CHECK_LAUNCH(c);
        return DUET_OK;
    }, &ms);
    duet_cuda_free(c, out);
    if (st == DUET_OK)
        *tflops = 2.0 * 8.0 * iters * (double)threads * blocks / (ms * 1e-3) / 1e12;
    return st;
}

__global__ void flush_kernel(const uint4 *p, size_t n, uint32_t *sink)
{
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldcg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) /* practically never: keeps the loads */
        *sink = acc;
}

extern "C" duet_status_t duet_cuda_flush_l2(duet_cuda_t *c)
{
    if (!c->flush_buf) {
        size_t want = 2 * c->info.l2_bytes;
        if (want < (64u << 20))
            want = 64u << 20;
        DUET_CUDA_CHECK(c, cudaMalloc(&c->flush_buf, want + 256));
        DUET_CUDA_CHECK(c, cudaMemsetAsync(c->flush_buf, 0x3c, want + 256, c->stream));
        c->flush_bytes = want;
    }
    flush_kernel<<<c->info.sm_count * 4, 512, 0, c->stream>>>(
        (const uint4 *)c->flush_buf, c->flush_bytes / 16, (uint32_t *)((uint8_t *)c->flush_buf + c->flush_bytes));
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

__global__ void busy_kernel(unsigned long long ns)
{
    unsigned long long t0 = d_globaltimer();
    do
        __nanosleep(500);
    while (d_globaltimer() - t0 < ns);
}

extern "C" duet_status_t duet_cuda_busy_us(duet_cuda_t *c, uint32_t us)
{
    if (us > 100000)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "busy_us: %u us (at most 100000)", us);
    busy_kernel<<<1, 1, 0, c->stream>>>((unsigned long long)us * 1000ull);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}

/* A warp's step u: chunk k = 32 j + lane of its 2 KB is row k*16 / run of the warp's rows, bytes
 * (k*16) % run of that row's run u. */
__global__ void __launch_bounds__(128) runs_kernel(const uint8_t *buf, int run, uint32_t *sum)
{
    constexpr int UNITS = 32;
    __shared__ __align__(16) uint8_t sm[2][4][2048];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t row_bytes = (size_t)UNITS * run, w0 = ((size_t)blockIdx.x * 4 + warp) * 2048 / run; /* the warp's first row */
    auto load = [&](int u, int slot) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int k = 32 * j + lane;
            cp_async16(&sm[slot][warp][16 * k],
                       buf + (w0 + (size_t)(k * 16 / run)) * row_bytes + (size_t)u * run + (k * 16) % run);
        }
    };
    load(0, 0);
    cp_commit();
    uint32_t acc = 0;
    for (int u = 0; u < UNITS; u++) {
        if (u + 1 < UNITS)
            load(u + 1, (u + 1) & 1);
        cp_commit();
        cp_wait<1>();
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint4 v = *reinterpret_cast<const uint4 *>(&sm[u & 1][warp][16 * (32 * j + lane)]);
            acc += v.x + v.y + v.z + v.w;
        }
        __syncwarp(); /* the slot is read before the next step's copy overwrites it */
    }
    acc = __reduce_add_sync(0xffffffffu, acc);
    if (lane == 0)
        atomicAdd(sum, acc);
}

extern "C" duet_status_t duet_cuda_measure_runs(duet_cuda_t *c, const void *buf, size_t bytes, int run, int reps,
                                                double *gbps, uint32_t *sum)
{
    if (run < 16 || run > 2048 || (run & (run - 1)) || bytes % ((size_t)256 << 10) || !buf)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "measure_runs: run %d, %zu bytes (runs of 16 to 2048 bytes, a "
                               "power of two; a multiple of 256 KiB)", run, bytes);
    unsigned blocks = (unsigned)(bytes / (4 * 32 * 2048));
    uint32_t *dsum = NULL;
    DUET_TRY(duet_cuda_malloc(c, (void **)&dsum, sizeof(uint32_t)));
    auto once = [&]() -> duet_status_t {
        DUET_CUDA_CHECK(c, cudaMemsetAsync(dsum, 0, sizeof(uint32_t), c->stream));
        runs_kernel<<<blocks, 128, 0, c->stream>>>((const uint8_t *)buf, run, dsum);
        DUET_CUDA_CHECK_LAUNCH(c);
        return DUET_OK;
    };
    double ms = 0.0;
    duet_status_t st = reps > 0 ? time_median(c, reps, once, &ms) : once();
    if (st == DUET_OK)
        st = duet_cuda_download(c, sum, dsum, sizeof(uint32_t));
    duet_cuda_free(c, dsum);
    if (st == DUET_OK && gbps)
        *gbps = reps > 0 ? (double)bytes / (ms * 1e-3) / 1e9 : 0.0;
    return st;
}
