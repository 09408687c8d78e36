/* ingest_rates: how fast one launch can bring a decode matmul's weight bytes into its SMs, by the
 * copy paths a matmul can take, cold (L2 flushed) and warm (the bytes already in L2).
 *
 *   ninja -C build-cuda tools/duet-ingest-rates   (meson setup build-cuda -Dcuda=enabled)
 *   build-cuda/tools/duet-ingest-rates [--reps N]  (on the GPU machine)
 *
 * Every form reads T bytes (32 MiB: `wq_b`'s 32768 x 1024 fp8; 8 MiB: a 4096 x 2048 one) and
 * reduces what it read into one word a block, checked against the host's sum of the same bytes,
 * so a form that skipped bytes fails.  The forms:
 *   ldg      threads load 16 bytes each with ld.global.nc, four loads in flight a thread (the
 *            decode kernels' way);
 *   bulk     one lane issues 1D bulk copies (cp.async.bulk) of a contiguous run into S stages of
 *            B bytes, the block's consumer warps read each stage once and give it back;
 *   box      the loading-warp kernel's way: a 2D tensor map over rows of 1024 bytes, a stage one
 *            box of 128 bytes (a unit) by the block's R rows, S stages, units in order;
 *   box2     as box, a stage two units (a box of 256 bytes by R rows);
 *   the loading-warp kernel's forms at the shapes of wq_b, wo_b and the shared expert's w2, with
 *            and without the split x's 16 KB image a stage (a bulk copy beside the box).
 * Each is timed two ways: with events around the one launch (what duet-check-ops --bench does),
 * and from the blocks' own clock (%globaltimer, first block start to last block end: the kernel
 * without its launch).  The copy ceiling is a 2 GiB device copy in the same run. */
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
#include "mbarrier.cuh" /* the loading-warp kernel's own barrier, copy and tensor-map helpers */
#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "ingest-rates: %s: %s\n", #x, cudaGetErrorString(e_));                                    \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

struct span_t {
    unsigned long long t0, t1;
};

__device__ __forceinline__ void span_begin(span_t *sp)
{
    if (threadIdx.x == 0)
        atomicMin(&sp->t0, d_globaltimer());
}
__device__ __forceinline__ void span_end(span_t *sp, uint32_t v, uint32_t *sums)
{
    /* the block's xor of what its threads read */
    __shared__ uint32_t red;
    if (threadIdx.x == 0)
        red = 0;
    __syncthreads();
    atomicXor(&red, v);
    __syncthreads();
    if (threadIdx.x == 0) {
        sums[blockIdx.x] = red;
        atomicMax(&sp->t1, d_globaltimer());
    }
}

/* ldg: block b reads bytes [b * per, (b + 1) * per) */
__global__ void __launch_bounds__(512) ldg_k(const uint4 *src, size_t per16, span_t *sp, uint32_t *sums)
{
    span_begin(sp);
    const uint4 *p = src + blockIdx.x * per16;
    uint32_t v = 0;
    size_t i = threadIdx.x;
    for (; i + 3 * blockDim.x < per16; i += 4 * blockDim.x) {
        uint4 a[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(a[k].x), "=r"(a[k].y), "=r"(a[k].z), "=r"(a[k].w)
                         : "l"(p + i + k * blockDim.x));
#pragma unroll
        for (int k = 0; k < 4; k++)
            v ^= a[k].x ^ a[k].y ^ a[k].z ^ a[k].w;
    }
    for (; i < per16; i += blockDim.x) {
        uint4 a = p[i];
        v ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    span_end(sp, v, sums);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define HAVE_TMA 1
#endif

/* The stage pipeline: warp W (its lane 0) fills S stages of B (+ X) bytes a unit, in unit order;
 * warps 0 .. W - 1 wait for a stage, each lane xors the 16-byte words lane, lane + 32, ... of it,
 * and the warp gives it back.  MODE 0: unit u of block b is the contiguous run at (b * units + u)
 * * B; MODE 1: a box of B / R bytes by R rows of the 2D map (rows of rowb bytes), block b the row
 * block b % rbk of the 1024-column chunk b / rbk, unit u the chunk's columns u * B / R on; with X >
 * 0 the stage also gets X bytes of an x image (xs + (chunk * units + u) * X, the same for every row
 * block, so mostly read from L2) by a bulk copy, as the loading-warp kernel's split x. */
template <int MODE>
__global__ void __launch_bounds__(544)
    pipe_k(const uint8_t *src, const __grid_constant__ CUtensorMap map, const uint8_t *xs, int S, int B, int X, int R,
           int rbk, int units, int W, span_t *sp, uint32_t *sums)
{
    uint32_t v = 0;
    span_begin(sp);
#ifdef HAVE_TMA
    extern __shared__ __align__(128) uint8_t smem_[];
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(smem_);
    const uint32_t st0 = (bar0 + 256 + 127) & ~127u; /* the stages from a 128-byte boundary */
    const int SB = B + X, bx = (int)blockIdx.x % rbk, ch = (int)blockIdx.x / rbk;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mb_init(bar0 + 8 * s, 1);
            mb_init(bar0 + 8 * (16 + s), W);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == W) {
        if (lane == 0)
            for (int u = 0; u < units; u++) {
                int s = u % S;
                if (u >= S)
                    mb_wait(bar0 + 8 * (16 + s), (unsigned)(u / S - 1) & 1u);
                uint32_t dst = st0 + s * SB, full = bar0 + 8 * s;
                mb_expect(full, SB);
                if (MODE == 0)
                    bulk_g2s(dst, src + ((size_t)blockIdx.x * units + u) * B, B, full);
                else
                    tma_2d(dst, &map, ch * 1024 + u * (B / R), bx * R, full);
                if (X > 0)
                    bulk_g2s(dst + B, xs + ((size_t)ch * units + u) * X, X, full);
            }
    } else if (warp < W) {
        for (int u = 0; u < units; u++) {
            int s = u % S;
            mb_wait(bar0 + 8 * s, (unsigned)(u / S) & 1u);
            const uint4 *st = reinterpret_cast<const uint4 *>(smem_ + (st0 - bar0) + (size_t)s * SB);
            for (int i = warp * 32 + lane; i < SB / 16; i += 32 * W) {
                uint4 a = st[i];
                v ^= a.x ^ a.y ^ a.z ^ a.w;
            }
            __syncwarp();
            if (lane == 0)
                mb_arrive(bar0 + 8 * (16 + s));
        }
    }
#endif
    span_end(sp, v, sums);
}

/* the L2 emptied of the source by reading (not writing: dirty lines would be written back while
 * the timed launch reads) a buffer of ten times its size */
__global__ void flush_k(const uint4 *p, size_t n16, uint32_t *sink)
{
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldcg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u)
        *sink = acc;
}

struct form_t {
    const char *name;
    int mode; /* -1 ldg, 0 bulk, 1 box */
    int S, B, R, W, blocks_per_sm_hint;
    int X;         /* the x image's bytes a stage (box forms) */
    size_t T;      /* bytes of weights (0: the table's sizes) */
    int rowb;      /* a weight row's bytes (box forms; 0: 1024) */
};

int main(int argc, char **argv)
{
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: duet-ingest-rates [--reps N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 100) {
        fprintf(stderr, "ingest-rates: --reps takes 1 to 100\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int sms = prop.multiProcessorCount;
    printf("device %s, %d SMs, L2 %d MiB, compute %d.%d\n", prop.name, sms, prop.l2CacheSize >> 20, prop.major,
           prop.minor);
    if (prop.major < 9) {
        fprintf(stderr, "ingest-rates: the bulk copies need compute capability 9.0 or later\n");
        return 1;
    }
    auto enc = tma_encoder();
    if (!enc) {
        fprintf(stderr, "ingest-rates: the driver has no cuTensorMapEncodeTiled\n");
        return 1;
    }
    const size_t big = (size_t)2 << 30, maxT = (size_t)32 << 20, flushN = (size_t)512 << 20;
    const size_t xmax = (size_t)1 << 20; /* the x images: up to 8 chunks of 8 units of 16 KB */
    uint8_t *a, *b, *fl;
    CK(cudaMalloc(&a, big));
    CK(cudaMalloc(&b, big));
    CK(cudaMalloc(&fl, flushN));
    span_t *sp;
    uint32_t *sums;
    CK(cudaMalloc(&sp, sizeof(span_t)));
    CK(cudaMalloc(&sums, 4096 * sizeof(uint32_t)));
    /* the source: seeded bytes (32 MiB of weights, then the x images), so each form's sums can be
     * checked */
    std::vector<uint8_t> host(maxT + xmax);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < maxT + xmax; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        host[i] = (uint8_t)s;
    }
    CK(cudaMemcpy(a, host.data(), maxT + xmax, cudaMemcpyHostToDevice));
    CK(cudaMemset(fl, 0x3c, flushN));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    /* the copy ceiling: 2 GiB device to device, best of three */
    float best = 1e30f;
    for (int i = 0; i < 3; i++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(b, a, big, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        best = ms < best ? ms : best;
    }
    double copy_gbs = 2.0 * big / (best * 1e-3) / 1e9;
    printf("copy ceiling: 2 GiB device to device, %.1f GB/s (bytes read + written)\n\n", copy_gbs);
    CK(cudaFuncSetAttribute(pipe_k<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
    CK(cudaFuncSetAttribute(pipe_k<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));

    const size_t MiB = (size_t)1 << 20;
    const form_t forms[] = {
        {"ldg 512 thr, 1 blk/SM", -1, 0, 0, 0, 0, 1, 0, 0, 0},
        {"ldg 512 thr, 2 blk/SM", -1, 0, 0, 0, 0, 2, 0, 0, 0},
        {"ldg 512 thr, 4 blk/SM", -1, 0, 0, 0, 0, 4, 0, 0, 0},
        {"bulk S4 x 32K", 0, 4, 32768, 0, 4, 1, 0, 0, 0},
        {"bulk S8 x 16K", 0, 8, 16384, 0, 4, 1, 0, 0, 0},
        {"bulk S3 x 32K, 2 blk/SM", 0, 3, 32768, 0, 4, 2, 0, 0, 0},
        {"bulk S6 x 16K, 2 blk/SM", 0, 6, 16384, 0, 4, 2, 0, 0, 0},
        {"box 128B x 256 rows S4", 1, 4, 32768, 256, 4, 1, 0, 0, 0},
        {"box 128B x 128 rows S6, 2 blk/SM", 1, 6, 16384, 128, 4, 2, 0, 0, 0},
        {"box 128B x 64 rows S4", 1, 4, 8192, 64, 4, 1, 0, 0, 0},
        {"box 128B x 64 rows S8", 1, 8, 8192, 64, 4, 1, 0, 0, 0},
        {"box2 256B x 128 rows S3, 2 blk/SM", 1, 3, 32768, 128, 4, 2, 0, 0, 0},
        /* the loading-warp kernel's forms at their launches' shapes, weights and the split x */
        {"wq_b form: 256 rows + x, S4", 1, 4, 32768, 256, 16, 1, 16384, 32 * MiB, 1024},
        {"wq_b form: 256 rows, no x, S4", 1, 4, 32768, 256, 16, 1, 0, 32 * MiB, 1024},
        {"wq_b paired: 128 rows + x, S3, 2 blk/SM", 1, 3, 16384, 128, 8, 2, 16384, 32 * MiB, 1024},
        {"wo_b paired: 128 rows + x, S3, 2 blk/SM", 1, 3, 16384, 128, 8, 2, 16384, 32 * MiB, 8192},
        {"wo_b paired: 128 rows, no x, S3, 2 blk/SM", 1, 3, 16384, 128, 8, 2, 0, 32 * MiB, 8192},
        {"w2 form: 64 rows + x, S4", 1, 4, 8192, 64, 4, 1, 16384, 8 * MiB, 2048},
        {"w2 form: 64 rows, no x, S4", 1, 4, 8192, 64, 4, 1, 0, 8 * MiB, 2048},
        {"w2 as 2 wg: 128 rows + x, S4", 1, 4, 16384, 128, 8, 1, 16384, 8 * MiB, 2048},
        {"w2 as 4 wg: 256 rows + x, S4", 1, 4, 32768, 256, 16, 1, 16384, 8 * MiB, 2048},
    };
    const size_t sizes[] = {32 * MiB, 8 * MiB};
    printf("| form | bytes | blocks | cold µs (events) | cold µs (kernel) | cold TB/s (kernel) | of copy | warm µs "
           "(events) | warm µs (kernel) | warm TB/s (kernel) |\n|---|---|---|---|---|---|---|---|---|---|\n");
    int bad = 0;
    for (size_t T0 : sizes)
        for (const form_t &f : forms) {
            if (f.T && f.T != T0)
                continue;
            size_t T = T0;
            int blocks, units = 0, threads, rbk = 1;
            size_t smem = 0;
            CUtensorMap map;
            memset(&map, 0, sizeof map);
            if (f.mode < 0) {
                blocks = sms * f.blocks_per_sm_hint;
                threads = 512;
                /* whole 16-byte words a block */
                T = T / (16 * (size_t)blocks) * 16 * blocks;
            } else {
                threads = 32 * (f.W + 1);
                smem = 384 + (size_t)f.S * (f.B + f.X);
                if (smem > 220 * 1024 || (f.blocks_per_sm_hint == 2 && 2 * (smem + 1024) > 228 * 1024)) {
                    printf("| %s | — | — | does not fit | | | | | | |\n", f.name);
                    continue;
                }
                if (f.mode == 0) {
                    blocks = sms * f.blocks_per_sm_hint;
                    units = (int)(T / ((size_t)blocks * f.B));
                    T = (size_t)blocks * units * f.B;
                } else {
                    int rowb = f.rowb ? f.rowb : 1024, rows = (int)(T / rowb);
                    rbk = rows / f.R;
                    blocks = rbk * (rowb / 1024);
                    units = 1024 / (f.B / f.R);
                    cuuint64_t dims[2] = {(cuuint64_t)rowb, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)rowb};
                    cuuint32_t box[2] = {(cuuint32_t)(f.B / f.R), (cuuint32_t)f.R}, es[2] = {1, 1};
                    CUresult r = enc(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, a, dims, strides, box, es,
                                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
                    if (r != CUDA_SUCCESS) {
                        printf("| %s | — | — | tensor map error %d | | | | | | |\n", f.name, (int)r);
                        bad++;
                        continue;
                    }
                }
            }
            const uint8_t *xs = a + maxT;
            auto launch = [&]() {
                if (f.mode < 0)
                    ldg_k<<<blocks, threads>>>(reinterpret_cast<const uint4 *>(a), T / 16 / blocks, sp, sums);
                else if (f.mode == 0)
                    pipe_k<0><<<blocks, threads, smem>>>(a, map, xs, f.S, f.B, 0, f.R, 1, units, f.W, sp, sums);
                else
                    pipe_k<1><<<blocks, threads, smem>>>(a, map, xs, f.S, f.B, f.X, f.R, rbk, units, f.W, sp, sums);
            };
            double ev[2] = {1e30, 1e30}, kn[2] = {1e30, 1e30};
            for (int rep = 0; rep < reps; rep++)
                for (int warm = 0; warm < 2; warm++) {
                    if (!warm) {
                        flush_k<<<4 * sms, 512>>>(reinterpret_cast<const uint4 *>(fl), flushN / 16, sums + 4095);
                        CK(cudaGetLastError());
                    } else
                        launch(); /* brings the bytes into L2 */
                    span_t init = {~0ull, 0ull};
                    CK(cudaMemcpyAsync(sp, &init, sizeof init, cudaMemcpyHostToDevice));
                    CK(cudaMemsetAsync(sums, 0, 4096 * sizeof(uint32_t)));
                    CK(cudaEventRecord(e0));
                    launch();
                    CK(cudaEventRecord(e1));
                    CK(cudaGetLastError());
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    span_t got;
                    CK(cudaMemcpy(&got, sp, sizeof got, cudaMemcpyDeviceToHost));
                    ev[warm] = ms * 1e3 < ev[warm] ? ms * 1e3 : ev[warm];
                    double k = (got.t1 - got.t0) * 1e-3;
                    kn[warm] = k < kn[warm] ? k : kn[warm];
                }
            /* the check: the xor of every block's word is the xor of the T bytes' 32-bit words, and
             * of the x image's units each block read */
            std::vector<uint32_t> hs(blocks);
            CK(cudaMemcpy(hs.data(), sums, blocks * sizeof(uint32_t), cudaMemcpyDeviceToHost));
            uint32_t got = 0, want = 0;
            for (int i = 0; i < blocks; i++)
                got ^= hs[i];
            auto xor_words = [&](size_t off, size_t n) {
                uint32_t x = 0;
                for (size_t i = 0; i < n; i += 4) {
                    uint32_t w;
                    memcpy(&w, &host[off + i], 4);
                    x ^= w;
                }
                return x;
            };
            want = xor_words(0, T);
            if (f.mode == 1 && f.X > 0)
                for (int b = 0; b < blocks; b++)
                    want ^= xor_words(maxT + (size_t)(b / rbk) * units * f.X, (size_t)units * f.X);
            const char *mark = got == want ? "" : " **WRONG SUM**";
            bad += got != want;
            printf("| %s%s | %.1f MiB | %d | %.2f | %.2f | %.2f | %.0f%% | %.2f | %.2f | %.2f |\n", f.name, mark,
                   T / 1048576.0, blocks, ev[0], kn[0], T / (kn[0] * 1e-6) / 1e12,
                   100.0 * (T / (kn[0] * 1e-6) / 1e9) / copy_gbs, ev[1], kn[1], T / (kn[1] * 1e-6) / 1e12);
            fflush(stdout);
        }
    printf("\n%s\n", bad ? "SOME FORMS FAILED" : "every form's sum checked");
    return bad ? 1 : 0;
}
