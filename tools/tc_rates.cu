/* tc_rates: the GPU's tensor-core rates for the instruction forms the decode matmuls can use,
 * and whether wgmma and mma.sync give the same bits.
 *
 *   ninja -C build-cuda tools/duet-tc-rates   (meson setup build-cuda -Dcuda=enabled)
 *   build-cuda/tools/duet-tc-rates             (on the GPU machine)
 *
 * Prints mma.sync m16n8k16 (f16 and bf16 in, f32 accumulated, eight independent accumulators a
 * warp) and, on Hopper (compute capability 9.x, the sm_90a code), wgmma m64nNk16 (f16, A from
 * registers, N = 8, 16, 32) in TFLOP/s at 4, 8 and 16 warps an SM, then runs both forms on the
 * same random operands and accumulators (fp16 values of many exponents, zeros now and then) and
 * counts the results whose bits differ; then the wide forms a token tile of 64 to 256 would take
 * (m64nNk16, N = 64, 128, 256, f16 and bf16), timed and compared with mma.sync a tile of 8
 * columns at a time.  docs/PERF.md ("wgmma for the tiles of 32 tokens") holds
 * what it printed on the H200. */
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            printf("%s: %s\n", #x, cudaGetErrorString(e_));                                                            \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

template <int ACC, bool BF> __global__ void mma_sync_k(int iters, float *out)
{
    float d[ACC][4] = {};
    uint32_t a0 = threadIdx.x, a1 = a0 * 3, a2 = a0 * 5, a3 = a0 * 7, b0 = a0 ^ 0x3c003c00u, b1 = b0 + 1;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int j = 0; j < ACC; j++) {
            if (BF)
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
            else
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                             "{%0,%1,%2,%3};"
                             : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
    }
    float s = 0;
    for (int j = 0; j < ACC; j++)
        s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    if (s == 1.2345f)
        out[0] = s;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HAVE_WGMMA 1
#endif

template <int N> __global__ void wgmma_k(int iters, float *out)
{
#ifdef HAVE_WGMMA
    __shared__ __align__(128) uint16_t bs[64 * 16];
    for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x)
        bs[i] = 0x3c00;
    __syncthreads();
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(bs);
    // no swizzle; LBO 128 B, SBO 256 B (values irrelevant for rate, must be legal)
    uint64_t desc = ((uint64_t)((addr & 0x3ffff) >> 4)) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
    float d[2][N / 2] = {};
    uint32_t a0 = threadIdx.x, a1 = a0 * 3, a2 = a0 * 5, a3 = a0 * 7;
    for (int i = 0; i < iters; i++) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int j = 0; j < 2; j++) {
            if constexpr (N == 8)
                asm volatile(
                    "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1, 0;"
                    : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
            else if constexpr (N == 16)
                asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, "
                             "{%8,%9,%10,%11}, %12, 1, 1, 1, 0;"
                             : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3]), "+f"(d[j][4]), "+f"(d[j][5]),
                               "+f"(d[j][6]), "+f"(d[j][7])
                             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
            else if constexpr (N == 32)
                asm volatile(
                    "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
                    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, 1, 1, 1, 0;"
                    : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3]), "+f"(d[j][4]), "+f"(d[j][5]),
                      "+f"(d[j][6]), "+f"(d[j][7]), "+f"(d[j][8]), "+f"(d[j][9]), "+f"(d[j][10]), "+f"(d[j][11]),
                      "+f"(d[j][12]), "+f"(d[j][13]), "+f"(d[j][14]), "+f"(d[j][15])
                    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    float s = 0;
    for (int j = 0; j < 2; j++)
        for (int k = 0; k < N / 2; k++)
            s += d[j][k];
    if (s == 1.2345f)
        out[0] = s;
#endif
}

__device__ __forceinline__ uint32_t hsh(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
__device__ __forceinline__ uint16_t rnd_h(uint32_t s, int lo, int span)
{ /* random fp16: sign, exponent field lo..lo+span-1, mantissa; or zero now and then */
    uint32_t h = hsh(s);
    if ((h & 63) == 0)
        return 0;
    uint32_t e = lo + (h >> 8) % span;
    return (uint16_t)(((h >> 6) & 1) << 15 | e << 10 | (h >> 20) & 0x3ff);
}
/* wgmma m64n8k16 (A from registers, B K-major in shared memory, no swizzle) against mma.sync
 * m16n8k16 on the same operands and accumulator: mismatching result bits counted */
__global__ void eq_k(int trials, unsigned long long *bad, unsigned long long *tot)
{
#ifdef HAVE_WGMMA
    __shared__ __align__(128) uint16_t bs[8 * 16];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(bs);
    uint64_t desc = ((uint64_t)((addr & 0x3ffff) >> 4)) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
    unsigned long long nb = 0, nt = 0;
    for (int t = 0; t < trials; t++) {
        uint32_t seed = (blockIdx.x * trials + t) * 7919u;
        int alo = 1 + hsh(seed) % 8, blo = 1 + hsh(seed + 1) % 8; /* exponent ranges vary by trial */
        __syncthreads();
        for (int i = threadIdx.x; i < 128; i += blockDim.x) { /* element (n, k) at (k/8)*64 + n*8 + k%8 */
            int n = (i >> 4), k = i & 15;
            bs[(k >> 3) * 64 + n * 8 + (k & 7)] = rnd_h(seed * 31 + 1000 + i, blo, 22);
        }
        __syncthreads();
        uint32_t a[4];
        for (int r = 0; r < 4; r++) { /* a0: (g, 2tq..), a1: (g+8, 2tq..), a2: (g, 2tq+8..), a3: (g+8, 2tq+8..) */
            int row = 16 * warp + g + 8 * (r & 1), col = 2 * tq + 8 * (r >> 1);
            uint32_t lo = rnd_h(seed * 31 + 5000 + row * 16 + col, alo, 22),
                     hi = rnd_h(seed * 31 + 5000 + row * 16 + col + 1, alo, 22);
            a[r] = lo | hi << 16;
        }
        float c[4], d1[4], d2[4];
        for (int e = 0; e < 4; e++) {
            uint32_t h = hsh(seed * 131 + threadIdx.x * 4 + e);
            c[e] = (h & 7) == 0 ? 0.0f
                                : __uint_as_float((h & 0x80000000u) | ((100 + (h >> 8) % 60) << 23) | (h & 0x7fffff));
            d1[e] = d2[e] = c[e];
        }
        uint32_t b0 = *(const uint32_t *)(bs + 0 * 64 + g * 8 + 2 * tq),
                 b1 = *(const uint32_t *)(bs + 64 + g * 8 + 2 * tq);
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d1[0]), "+f"(d1[1]), "+f"(d1[2]), "+f"(d1[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1, 0;"
                     : "+f"(d2[0]), "+f"(d2[1]), "+f"(d2[2]), "+f"(d2[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        for (int e = 0; e < 4; e++) {
            nt++;
            if (__float_as_uint(d1[e]) != __float_as_uint(d2[e]))
                nb++;
        }
    }
    atomicAdd(bad, nb);
    atomicAdd(tot, nt);
#endif
}

/* wgmma m64nNk16's operands: the accumulator's N/2 registers, A's four, B's descriptor */
#define WG_ACC64                                                                                                       \
    "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%"  \
    "30,%31"
#define WG_ACC128                                                                                                      \
    WG_ACC64 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%"  \
             "57,%58,%59,%60,%61,%62,%63"
#define WG_ACC256                                                                                                      \
    WG_ACC128 ",%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%" \
              "89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%"    \
              "111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define WG_OUTS64                                                                                                      \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),        \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define WG_OUTS128                                                                                                     \
    WG_OUTS64, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),        \
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),        \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WG_OUTS256                                                                                                     \
    WG_OUTS128, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),             \
        "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),        \
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]),        \
        "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]),        \
        "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),     \
        "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),              \
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),              \
        "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]),              \
        "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define WG_REGS64 "{" WG_ACC64 "}, {%32,%33,%34,%35}, %36"
#define WG_REGS128 "{" WG_ACC128 "}, {%64,%65,%66,%67}, %68"
#define WG_REGS256 "{" WG_ACC256 "}, {%128,%129,%130,%131}, %132"
#define WG_WIDE(N, TY)                                                                                                 \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " WG_REGS##N ", 1, 1, 1, 0;"            \
                 : WG_OUTS##N                                                                                          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))

/* wgmma m64nNk16 for the wide token tiles (N = 64, 128, 256), f16 or bf16 in, A from registers,
 * d the accumulator in mma.sync's layout a tile of 8 columns after another (d[4 t + e]: row
 * 16 warp + g + 8 (e >> 1), column 8 t + 2 tq + (e & 1)) */
template <int N, bool BF> __device__ __forceinline__ void wg_wide(float *d, const uint32_t (&a)[4], uint64_t desc)
{
#ifdef HAVE_WGMMA
    if constexpr (N == 64 && BF)
        WG_WIDE(64, "bf16");
    else if constexpr (N == 64)
        WG_WIDE(64, "f16");
    else if constexpr (N == 128 && BF)
        WG_WIDE(128, "bf16");
    else if constexpr (N == 128)
        WG_WIDE(128, "f16");
    else if constexpr (N == 256 && BF)
        WG_WIDE(256, "bf16");
    else
        WG_WIDE(256, "f16");
#endif
}

/* random bf16: sign, exponent field lo..lo+span-1, mantissa; or zero now and then */
__device__ __forceinline__ uint16_t rnd_b(uint32_t s, int lo, int span)
{
    uint32_t h = hsh(s);
    if ((h & 63) == 0)
        return 0;
    uint32_t e = lo + (h >> 8) % span;
    return (uint16_t)(((h >> 6) & 1) << 15 | e << 7 | (h >> 20) & 0x7f);
}

/* wgmma m64nNk16 against mma.sync m16n8k16 a tile of 8 columns at a time, on the same operands
 * and accumulators (B K-major in shared memory, no swizzle: element (n, k) at (k / 8) N 8 + n 8 +
 * k % 8, so the leading byte offset is 16 N and the stride 128): mismatching result bits counted.
 * Whether a token's bits stay the same in a tile of N tokens as in one of 8 or 32. */
template <int N, bool BF> __global__ void eq_wide_k(int trials, unsigned long long *bad, unsigned long long *tot)
{
#ifdef HAVE_WGMMA
    __shared__ __align__(128) uint16_t bs[N * 16];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(bs);
    uint64_t desc =
        ((uint64_t)((addr & 0x3ffff) >> 4)) | ((uint64_t)(16 * N >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
    unsigned long long nb = 0, nt = 0;
    for (int t = 0; t < trials; t++) {
        uint32_t seed = (blockIdx.x * trials + t) * 7919u + N * 131u + (BF ? 17u : 0u);
        int alo = BF ? 110 + hsh(seed) % 20 : 1 + hsh(seed) % 8,
            blo = BF ? 110 + hsh(seed + 1) % 20 : 1 + hsh(seed + 1) % 8;
        int span = BF ? 20 : 22;
        __syncthreads();
        for (int i = threadIdx.x; i < N * 16; i += blockDim.x) {
            int n = i >> 4, k = i & 15;
            uint32_t sd = seed * 31 + 1000 + i;
            bs[(k >> 3) * N * 8 + n * 8 + (k & 7)] = BF ? rnd_b(sd, blo, span) : rnd_h(sd, blo, span);
        }
        __syncthreads();
        uint32_t a[4];
        for (int r = 0; r < 4; r++) {
            int row = 16 * warp + g + 8 * (r & 1), col = 2 * tq + 8 * (r >> 1);
            uint32_t s0 = seed * 31 + 50000 + row * 16 + col;
            uint32_t lo = BF ? rnd_b(s0, alo, span) : rnd_h(s0, alo, span);
            uint32_t hi = BF ? rnd_b(s0 + 1, alo, span) : rnd_h(s0 + 1, alo, span);
            a[r] = lo | hi << 16;
        }
        float d[N / 2];
        for (int j = 0; j < N / 2; j++) {
            uint32_t h = hsh(seed * 131 + threadIdx.x * (N / 2) + j);
            d[j] = (h & 7) == 0 ? 0.0f
                                : __uint_as_float((h & 0x80000000u) | ((100 + (h >> 8) % 60) << 23) | (h & 0x7fffff));
        }
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wg_wide<N, BF>(d, a, desc);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        for (int tl = 0; tl < N / 8; tl++) {
            float c[4];
            for (int e = 0; e < 4; e++) {
                uint32_t h = hsh(seed * 131 + threadIdx.x * (N / 2) + 4 * tl + e);
                c[e] = (h & 7) == 0
                           ? 0.0f
                           : __uint_as_float((h & 0x80000000u) | ((100 + (h >> 8) % 60) << 23) | (h & 0x7fffff));
            }
            uint32_t b0 = *(const uint32_t *)(bs + (8 * tl + g) * 8 + 2 * tq),
                     b1 = *(const uint32_t *)(bs + N * 8 + (8 * tl + g) * 8 + 2 * tq);
            if (BF)
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
            else
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                             "{%8,%9}, {%0,%1,%2,%3};"
                             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
            for (int e = 0; e < 4; e++) {
                nt++;
                nb += __float_as_uint(c[e]) != __float_as_uint(d[4 * tl + e]);
            }
        }
    }
    atomicAdd(bad, nb);
    atomicAdd(tot, nt);
#endif
}

/* the rate of wgmma m64nNk16 (f16, A from registers), two accumulators a warpgroup */
template <int N> __global__ void wgmma_wide_k(int iters, float *out)
{
#ifdef HAVE_WGMMA
    __shared__ __align__(128) uint16_t bs[N * 16];
    for (int i = threadIdx.x; i < N * 16; i += blockDim.x)
        bs[i] = 0x3c00;
    __syncthreads();
    uint32_t addr = (uint32_t)__cvta_generic_to_shared(bs);
    uint64_t desc =
        ((uint64_t)((addr & 0x3ffff) >> 4)) | ((uint64_t)(16 * N >> 4) << 16) | ((uint64_t)(128 >> 4) << 32);
    float d[N / 2] = {};
    uint32_t a[4] = {threadIdx.x, threadIdx.x * 3, threadIdx.x * 5, threadIdx.x * 7};
    for (int i = 0; i < iters; i++) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wg_wide<N, false>(d, a, desc);
        wg_wide<N, false>(d, a, desc);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    float s = 0;
    for (int j = 0; j < N / 2; j++)
        s += d[j];
    if (s == 1.2345f)
        out[0] = s;
#endif
}

template <class K> static float run(K k, int blocks, int threads, int iters, float *out)
{
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    k<<<blocks, threads>>>(iters / 10, out);
    cudaEventRecord(e0);
    k<<<blocks, threads>>>(iters, out);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms;
}

int main()
{
    float *out;
    CK(cudaMalloc(&out, 4));
    int sms;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    int iters = 20000;
    for (int wps : {4, 8, 16}) { // warps an SM
        int blocks = sms * wps / 4;
        double flop = 2.0 * 16 * 8 * 16 * 8 * (double)iters * blocks * 4;
        float ms = run(mma_sync_k<8, false>, blocks, 128, iters, out);
        float msb = run(mma_sync_k<8, true>, blocks, 128, iters, out);
        printf("mma.sync m16n8k16 f32 acc, %2d warps/SM, 8 acc: f16 %.1f TFLOP/s (%.2f clk/MMA/SMSP at 1.98 GHz), bf16 "
               "%.1f TFLOP/s\n",
               wps, flop / ms / 1e9, (ms * 1e-3 * 1.98e9) / ((double)iters * 8 * blocks * 4 / (sms * 4)),
               flop / msb / 1e9);
    }
    CK(cudaGetLastError());
    int major = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major != 9) {
        printf("wgmma: not measured, compute capability %d.x (the wgmma forms are Hopper's, sm_90a)\n", major);
        return 0;
    }
    for (int wps : {4, 8, 16}) {
        int blocks = sms * wps / 4;
        double mm8 = 2.0 * 64 * 8 * 16 * 2 * (double)iters * blocks;
        float t8 = run(wgmma_k<8>, blocks, 128, iters, out);
        float t16 = run(wgmma_k<16>, blocks, 128, iters, out);
        float t32 = run(wgmma_k<32>, blocks, 128, iters, out);
        printf("wgmma m64nNk16 f16 A regs, %2d warps/SM: N=8 %.1f, N=16 %.1f, N=32 %.1f TFLOP/s\n", wps, mm8 / t8 / 1e9,
               2 * mm8 / t16 / 1e9, 4 * mm8 / t32 / 1e9);
    }
    CK(cudaGetLastError());

    unsigned long long *cnt;
    CK(cudaMalloc(&cnt, 16));
    CK(cudaMemset(cnt, 0, 16));
    eq_k<<<264, 128>>>(2000, cnt, cnt + 1);
    CK(cudaDeviceSynchronize());
    unsigned long long h[2];
    CK(cudaMemcpy(h, cnt, 16, cudaMemcpyDeviceToHost));
    printf("wgmma m64n8k16 vs mma.sync m16n8k16, same operands and accumulator: %llu of %llu results differ in their "
           "bits\n",
           h[0], h[1]);
    CK(cudaDeviceSynchronize());
    /* the wide token tiles: rates, and the same bits as mma.sync a tile of 8 columns at a time */
    for (int wps : {4, 8}) {
        int blocks = sms * wps / 4;
        double base = 2.0 * 64 * 16 * 2 * (double)(iters / 4) * blocks;
        float t64 = run(wgmma_wide_k<64>, blocks, 128, iters / 4, out);
        float t128 = run(wgmma_wide_k<128>, blocks, 128, iters / 4, out);
        float t256 = run(wgmma_wide_k<256>, blocks, 128, iters / 4, out);
        printf("wgmma m64nNk16 f16 A regs, %2d warps/SM: N=64 %.1f, N=128 %.1f, N=256 %.1f TFLOP/s\n", wps,
               64 * base / t64 / 1e9, 128 * base / t128 / 1e9, 256 * base / t256 / 1e9);
    }
    CK(cudaGetLastError());
    struct {
        void (*k)(int, unsigned long long *, unsigned long long *);
        const char *name;
    } wide[] = {{eq_wide_k<64, false>, "m64n64k16 f16"},   {eq_wide_k<128, false>, "m64n128k16 f16"},
                {eq_wide_k<256, false>, "m64n256k16 f16"}, {eq_wide_k<64, true>, "m64n64k16 bf16"},
                {eq_wide_k<128, true>, "m64n128k16 bf16"}, {eq_wide_k<256, true>, "m64n256k16 bf16"}};
    for (auto &w : wide) {
        CK(cudaMemset(cnt, 0, 16));
        w.k<<<264, 128>>>(200, cnt, cnt + 1);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h, cnt, 16, cudaMemcpyDeviceToHost));
        printf("wgmma %s vs mma.sync m16n8k16 a tile of 8 columns at a time, same operands and accumulators: %llu of "
               "%llu results differ in their bits\n",
               w.name, h[0], h[1]);
    }
    return 0;
}
