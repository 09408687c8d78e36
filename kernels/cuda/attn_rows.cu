/* Shared-KV MQA with sinks, decode form (contract in attn_rows.cuh).
 *
 * attn_part: block (split s, head group, row) takes 8 heads and one slice of
 * the row's keys.  Per 64-key step: each warp computes q·k for its keys and
 * the 8 heads (q in shared memory, keys read as float4); one warp per head
 * updates the running max and sum (online softmax) and turns the logits into
 * weights; every thread then adds weight × key into its float4 accumulators
 * (rescaled by e^(m_old - m_new)).  It writes the unnormalized output, the
 * max and the sum of its slice.
 * attn_combine: per (row, head), the slices and the sink give the final
 * softmax denominator: out = Σ_s e^(m_s - M) o_s / (e^(sink - M) + Σ_s e^(m_s - M) l_s).
 * Bytes: q, keys and out once from memory (keys are re-read from L2 by the
 * head groups); FLOPs: 4*heads*dim per key. */
#include "exact.cuh"
#include "common.cuh"

#define AT_HB 8
#define AT_THREADS 256
#define AT_CH 64
#define AT_MAXD 1024
#define AT_FIXED_SPLIT 8 /* batch-invariant mode: every row's keys in 8 parts */
#define AT_MAXP (AT_HB * AT_MAXD / 4 / AT_THREADS)

__global__ void __launch_bounds__(AT_THREADS) attn_part_kernel(const float *q, int n_heads, int dim,
                                                               const float *keys, const int32_t *key_off,
                                                               const int32_t *n_keys, float scale, int n_split,
                                                               float *o_part, float *ml_part)
{
    duet_pdl_wait();
    extern __shared__ __align__(16) float q_s[]; /* [AT_HB][dim] */
    __shared__ float S[AT_HB][AT_CH];
    __shared__ float m_s[AT_HB], l_s[AT_HB], alpha_s[AT_HB];
    int s = blockIdx.x, h0 = blockIdx.y * AT_HB, b = blockIdx.z;
    int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    int nk = n_keys[b];
    int per = (nk + n_split - 1) / n_split;
    int j0 = s * per, j1 = min(nk, j0 + per);
    const float *kb = keys + (size_t)key_off[b] * dim;
    const float *qb = q + (size_t)b * n_heads * dim;
    int d4 = dim / 4;

    for (int e = t; e < AT_HB * dim; e += AT_THREADS) {
        int h = h0 + e / dim;
        q_s[e] = h < n_heads ? qb[(size_t)h * dim + e % dim] : 0.0f;
    }
    if (t < AT_HB) {
        m_s[t] = -INFINITY;
        l_s[t] = 0.0f;
    }
    float4 acc[AT_MAXP];
#pragma unroll
    for (int i = 0; i < AT_MAXP; i++)
        acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncthreads();

    for (int jc = j0; jc < j1; jc += AT_CH) {
        int cnt = min(AT_CH, j1 - jc);
        /* 1. logits */
        for (int jj = warp; jj < cnt; jj += AT_THREADS / 32) {
            const float *kr = kb + (size_t)(jc + jj) * dim;
            float d[AT_HB];
#pragma unroll
            for (int h = 0; h < AT_HB; h++)
                d[h] = 0.0f;
            for (int col = lane * 4; col < dim; col += 128) {
                float4 kv = __ldg((const float4 *)(kr + col));
#pragma unroll
                for (int h = 0; h < AT_HB; h++) {
                    float4 qv = *(const float4 *)(q_s + h * dim + col);
                    d[h] = fmaf(qv.x, kv.x, d[h]);
                    d[h] = fmaf(qv.y, kv.y, d[h]);
                    d[h] = fmaf(qv.z, kv.z, d[h]);
                    d[h] = fmaf(qv.w, kv.w, d[h]);
                }
            }
#pragma unroll
            for (int h = 0; h < AT_HB; h++) {
                float v = duet_warp_sum(d[h]);
                if (lane == 0)
                    S[h][jj] = v * scale;
            }
        }
        __syncthreads();
        /* 2. online softmax, one warp per head */
        if (warp < AT_HB) {
            int h = warp;
            float mx = -INFINITY;
            for (int jj = lane; jj < cnt; jj += 32)
                mx = fmaxf(mx, S[h][jj]);
            mx = duet_warp_max(mx);
            float m_old = m_s[h], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int jj = lane; jj < cnt; jj += 32) {
                float p = m_new == -INFINITY ? 0.0f : expf(S[h][jj] - m_new);
                S[h][jj] = p;
                sum += p;
            }
            sum = duet_warp_sum(sum);
            float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            if (lane == 0) {
                l_s[h] = l_s[h] * alpha + sum;
                m_s[h] = m_new;
                alpha_s[h] = alpha;
            }
        }
        __syncthreads();
        /* 3. weighted keys */
#pragma unroll
        for (int i = 0; i < AT_MAXP; i++) {
            int p = t + AT_THREADS * i;
            if (p < AT_HB * d4) {
                float a = alpha_s[p / d4];
                acc[i].x *= a;
                acc[i].y *= a;
                acc[i].z *= a;
                acc[i].w *= a;
            }
        }
        for (int jj = 0; jj < cnt; jj++) {
            const float *kr = kb + (size_t)(jc + jj) * dim;
#pragma unroll
            for (int i = 0; i < AT_MAXP; i++) {
                int p = t + AT_THREADS * i;
                if (p < AT_HB * d4) {
                    float pw = S[p / d4][jj];
                    float4 kv = __ldg((const float4 *)(kr + 4 * (p % d4)));
                    acc[i].x = fmaf(pw, kv.x, acc[i].x);
                    acc[i].y = fmaf(pw, kv.y, acc[i].y);
                    acc[i].z = fmaf(pw, kv.z, acc[i].z);
                    acc[i].w = fmaf(pw, kv.w, acc[i].w);
                }
            }
        }
        __syncthreads();
    }
    size_t base = ((size_t)b * n_split + s) * n_heads;
#pragma unroll
    for (int i = 0; i < AT_MAXP; i++) {
        int p = t + AT_THREADS * i;
        int h = h0 + p / d4;
        if (p < AT_HB * d4 && h < n_heads)
            *(float4 *)(o_part + (base + h) * dim + 4 * (p % d4)) = acc[i];
    }
    if (t < AT_HB && h0 + t < n_heads) {
        ml_part[(base + h0 + t) * 2] = m_s[t];
        ml_part[(base + h0 + t) * 2 + 1] = l_s[t];
    }
}

/* One step of a warp reduce-scatter over v[0 .. 2*O): the lane keeps the half selected by bit O of
 * its id, adding the partner's copy of it. */
template <int O>
__device__ __forceinline__ void rs_step(float *v, int lane)
{
    bool up = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < O; i++) {
        float send = up ? v[i] : v[i + O];
        float keep = up ? v[i + O] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}

/* The same for dim in {128, 256, 512, 1024}.  Logits: each warp takes 4 keys at a time, so one
 * read of q from shared memory serves 4 keys, and the 32 sums (4 keys × 8 heads) are reduced
 * with one reduce-scatter (31 shuffles: lane l ends with sum l) instead of 32 reductions.
 * Weighted keys: a thread owns one float4 column slot for HB*dim/1024 heads, so each key
 * float4 is loaded once per thread. */
template <int DIM>
__global__ void __launch_bounds__(AT_THREADS) attn_part_fast_kernel(const float *q, int n_heads,
                                                                    const float *keys, const int32_t *key_off,
                                                                    const int32_t *n_keys, float scale,
                                                                    int n_split, float *o_part, float *ml_part)
{
    duet_pdl_wait();
    constexpr int D4 = DIM / 4, HPT = AT_HB * D4 / AT_THREADS, KG = 4, NW = AT_THREADS / 32;
    static_assert(AT_HB * KG == 32, "one sum per lane");
    extern __shared__ __align__(16) float q_s[]; /* [AT_HB][DIM] */
    __shared__ float S[AT_HB][AT_CH];
    __shared__ float m_s[AT_HB], l_s[AT_HB], alpha_s[AT_HB];
    int s = blockIdx.x, h0 = blockIdx.y * AT_HB, b = blockIdx.z;
    int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    int nk = n_keys[b];
    int per = (nk + n_split - 1) / n_split;
    int j0 = s * per, j1 = min(nk, j0 + per);
    const float *kb = keys + (size_t)key_off[b] * DIM;
    const float *qb = q + (size_t)b * n_heads * DIM;

    for (int e = t; e < AT_HB * DIM; e += AT_THREADS) {
        int h = h0 + e / DIM;
        q_s[e] = h < n_heads ? qb[(size_t)h * DIM + e % DIM] : 0.0f;
    }
    if (t < AT_HB) {
        m_s[t] = -INFINITY;
        l_s[t] = 0.0f;
    }
    int slot = t % D4, hb = t / D4;
    float4 acc[HPT];
#pragma unroll
    for (int i = 0; i < HPT; i++)
        acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncthreads();

    for (int jc = j0; jc < j1; jc += AT_CH) {
        int cnt = min(AT_CH, j1 - jc);
        /* 1. logits, 4 keys per warp step */
        for (int jb = warp * KG; jb < cnt; jb += NW * KG) {
            float v[32];
#pragma unroll
            for (int i = 0; i < 32; i++)
                v[i] = 0.0f;
#pragma unroll
            for (int i = 0; i < DIM / 128; i++) {
                int col = lane * 4 + 128 * i;
                float4 kv[KG];
#pragma unroll
                for (int g = 0; g < KG; g++)
                    kv[g] = jb + g < cnt ? __ldg((const float4 *)(kb + (size_t)(jc + jb + g) * DIM + col))
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
                for (int h = 0; h < AT_HB; h++) {
                    float4 qv = *(const float4 *)(q_s + h * DIM + col);
#pragma unroll
                    for (int g = 0; g < KG; g++) {
                        float d = v[g * AT_HB + h];
                        d = fmaf(qv.x, kv[g].x, d);
                        d = fmaf(qv.y, kv[g].y, d);
                        d = fmaf(qv.z, kv[g].z, d);
                        d = fmaf(qv.w, kv[g].w, d);
                        v[g * AT_HB + h] = d;
                    }
                }
            }
            /* reduce-scatter: after the step with offset o a lane keeps the half of its sums
             * selected by bit o of its id; lane l ends with the total of sum l */
            rs_step<16>(v, lane);
            rs_step<8>(v, lane);
            rs_step<4>(v, lane);
            rs_step<2>(v, lane);
            rs_step<1>(v, lane);
            int g = lane / AT_HB, h = lane % AT_HB;
            if (jb + g < cnt)
                S[h][jb + g] = v[0] * scale;
        }
        __syncthreads();
        /* 2. online softmax, one warp per head */
        if (warp < AT_HB) {
            int h = warp;
            float mx = -INFINITY;
            for (int jj = lane; jj < cnt; jj += 32)
                mx = fmaxf(mx, S[h][jj]);
            mx = duet_warp_max(mx);
            float m_old = m_s[h], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int jj = lane; jj < cnt; jj += 32) {
                float p = m_new == -INFINITY ? 0.0f : expf(S[h][jj] - m_new);
                S[h][jj] = p;
                sum += p;
            }
            sum = duet_warp_sum(sum);
            float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            if (lane == 0) {
                l_s[h] = l_s[h] * alpha + sum;
                m_s[h] = m_new;
                alpha_s[h] = alpha;
            }
        }
        __syncthreads();
        /* 3. weighted keys */
#pragma unroll
        for (int i = 0; i < HPT; i++) {
            float a = alpha_s[hb + (AT_THREADS / D4) * i];
            acc[i].x *= a;
            acc[i].y *= a;
            acc[i].z *= a;
            acc[i].w *= a;
        }
#pragma unroll 4
        for (int jj = 0; jj < cnt; jj++) {
            float4 kv = __ldg((const float4 *)(kb + (size_t)(jc + jj) * DIM) + slot);
#pragma unroll
            for (int i = 0; i < HPT; i++) {
                float pw = S[hb + (AT_THREADS / D4) * i][jj];
                acc[i].x = fmaf(pw, kv.x, acc[i].x);
                acc[i].y = fmaf(pw, kv.y, acc[i].y);
                acc[i].z = fmaf(pw, kv.z, acc[i].z);
                acc[i].w = fmaf(pw, kv.w, acc[i].w);
            }
        }
        __syncthreads();
    }
    size_t base = ((size_t)b * n_split + s) * n_heads;
#pragma unroll
    for (int i = 0; i < HPT; i++) {
        int h = h0 + hb + (AT_THREADS / D4) * i;
        if (h < n_heads)
            *(float4 *)(o_part + (base + h) * DIM + 4 * slot) = acc[i];
    }
    if (t < AT_HB && h0 + t < n_heads) {
        ml_part[(base + h0 + t) * 2] = m_s[t];
        ml_part[(base + h0 + t) * 2 + 1] = l_s[t];
    }
}

/* ---- the tensor-core form ----
 *
 * attn_part_tc_kernel: block (split s, head tile of 16 heads, row b), W warps; warp w owns the
 * dims [w*DW, (w+1)*DW) of the head dimension (DW = DIM/W, 32 or 64).  Keys come in chunks of
 * TC_CH (32) through shared memory as bf16, two chunks in flight (cp.async for bf16 keys; float
 * keys are converted on their way in, exactly where they are exact in bf16, as every key the
 * engine passes is: a decoded cache entry).  Per chunk:
 *   1. each warp multiplies its dims of q (16 heads) with the chunk's keys: mma m16n8k16 bf16
 *      with fp32 accumulation, q split once into three bf16 parts held in registers (hi + mid +
 *      lo = q exactly), the lo part's products first; its partial logits go to shared memory;
 *   2. a half-warp per head sums the W partials in warp order, scales, masks keys past the
 *      row's count, and updates the running max and sum (online softmax); the weights p, split
 *      the same way into three bf16 parts, go to shared memory;
 *   3. each warp rescales its accumulators and adds p·V for its dims (V = the keys), the
 *      weights' lo part first.
 * A bf16 MMA of 16 keys or dims takes the tensor cores the time of a tf32 one of 8, so 16 dims
 * cost three MMAs where the tf32 hi + lo pairs took four (two steps of two), with chains a
 * quarter shorter and each part exact (tf32's hi + lo kept q to 2^-22).  The sums run in an
 * order fixed by the shapes only, so a row's result never depends on the batch; the fp32
 * accumulation matches the fp32 kernel to its rounding (checked at 2e-5).
 *
 * Fragments (PTX m16n8k16 .bf16; g = lane/4, t = lane%4): A in four words, (row g, columns 2t,
 * 2t+1), (g+8, 2t..), (g, 2t+8, 2t+9), (g+8, 2t+8..); B in two, (k 2t, 2t+1; n g), (k 2t+8,
 * 2t+9; n g); C c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).  Every operand that
 * comes from shared memory is read by ldmatrix: the keys as stored (rows of keys, the B of
 * q·kᵀ), the keys transposed (the B of p·V), the weights as stored (the A of p·V).  Row strides
 * of DIM + 8 and TC_CH + 8 bf16 put a matrix's eight 16-byte rows in distinct banks. */
#define TC_CH 32
#define TC_PAD 8          /* bf16 past a key row's DIM and past a weight row's TC_CH */
#define TC_PS (TC_CH + TC_PAD)
#ifndef TC_SPLIT_KEYS
/* batch-invariant mode: a split every 256 keys of a row (-D for trials; 128 measured 1% slower
 * in decode steps at batches 32 and 128) */
#define TC_SPLIT_KEYS 256
#endif

template <int DIM, int W> struct tc_shape {
    static constexpr int DW = DIM / W, KSTEPS = DW / 16, NT = DW / 8, KS = DIM + TC_PAD, SPS = TC_CH + 8; /* SPS: floats */
    static constexpr size_t KBYTES = 2 * (size_t)2 * TC_CH * KS;   /* [2][TC_CH][KS] bf16 */
    static constexpr size_t PBYTES = 2 * (size_t)3 * 16 * TC_PS;   /* [3][16][TC_PS] bf16 */
    static constexpr size_t SMEM = KBYTES + PBYTES + sizeof(float) * ((size_t)W * 16 * SPS + 3 * 16);
};

/* four 8x8 bf16 matrices from shared memory, lane 8i + j giving row j of matrix i */
__device__ __forceinline__ void ldsm_x4(uint32_t *r, uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t *r, uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* A chunk's 16-byte piece c of key row r: bf16 keys copied as they are (cp.async), float keys
 * loaded, rounded to bf16 and stored. */
__device__ __forceinline__ void key_piece(uint16_t *dst, const uint16_t *src) { cp_async16(dst, src); }
__device__ __forceinline__ void key_piece(uint16_t *dst, const float *src)
{
    float4 a = *(const float4 *)src, b = *(const float4 *)(src + 4);
    *(uint4 *)dst = make_uint4(duet_d_pack_bf16(a.x, a.y), duet_d_pack_bf16(a.z, a.w), duet_d_pack_bf16(b.x, b.y),
                               duet_d_pack_bf16(b.z, b.w));
}

/* Two blocks an SM (91 KB of shared memory each at DIM 512): the registers are capped at 128. */
template <int DIM, int W, typename KT>
__global__ void __launch_bounds__(W * 32, 2) attn_part_tc_kernel(const float *q, int n_heads, const void *keys,
                                                                 const int32_t *key_off, const int32_t *n_keys,
                                                                 float scale, int n_split, int per,
                                                                 float *o_part, float *ml_part)
{
    duet_pdl_wait();
    typedef tc_shape<DIM, W> S;
    static_assert(S::DW % 32 == 0 && S::DW <= 64, "a warp's dims: one or two groups of 32");
    static_assert(W * 32 == 16 * 16 || W * 32 == 16 * 8, "a half-warp a head in the softmax step");
    extern __shared__ __align__(16) float sm[];
    uint16_t *Ks = reinterpret_cast<uint16_t *>(sm);                     /* [2][TC_CH][KS] */
    uint32_t *Pw = reinterpret_cast<uint32_t *>(sm + S::KBYTES / 4);    /* [3][16][TC_PS / 2] words */
    float *Sp = sm + (S::KBYTES + S::PBYTES) / 4;                        /* [W][16][SPS] partial logits */
    float *m_s = Sp + W * 16 * S::SPS, *l_s = m_s + 16, *alpha_s = l_s + 16;
    constexpr int NT = W * 32;
    int s = blockIdx.x, h0 = blockIdx.y * 16, b = blockIdx.z;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    int nk = n_keys[b]; /* split s: keys [s*per, (s+1)*per), the last split to the end */
    int j0 = min(nk, s * per), j1 = s == n_split - 1 ? nk : min(nk, j0 + per);
    const KT *kb = (const KT *)keys + (size_t)key_off[b] * DIM;
    int dbase = warp * S::DW;
    const uint32_t ks0 = (uint32_t)__cvta_generic_to_shared(Ks), pw0 = (uint32_t)__cvta_generic_to_shared(Pw);
    /* the lane's row of the ldmatrix it addresses: matrix i = lane / 8, row j = lane % 8 */
    const int li = lane >> 3, lj = lane & 7;

    /* q: this warp's dims of the 16 heads as A fragments, in three parts (lo, mid, hi) */
    uint32_t qp[3][S::KSTEPS][4];
    {
        int ha = h0 + g, hb = h0 + g + 8;
        const float *qa = q + ((size_t)b * n_heads + ha) * DIM, *qb = q + ((size_t)b * n_heads + hb) * DIM;
#pragma unroll
        for (int k = 0; k < S::KSTEPS; k++) {
            int d = dbase + 16 * k + 2 * t;
            const float2 z = make_float2(0.0f, 0.0f);
            float2 x[4] = {ha < n_heads ? *(const float2 *)(qa + d) : z, hb < n_heads ? *(const float2 *)(qb + d) : z,
                           ha < n_heads ? *(const float2 *)(qa + d + 8) : z,
                           hb < n_heads ? *(const float2 *)(qb + d + 8) : z};
#pragma unroll
            for (int i = 0; i < 4; i++)
                duet_d_bf16_split3(x[i], qp[2][k][i], qp[1][k][i], qp[0][k][i]);
        }
    }
    float acc[S::NT][4];
#pragma unroll
    for (int n = 0; n < S::NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[n][i] = 0.0f;
    if (tid < 16) {
        m_s[tid] = -INFINITY;
        l_s[tid] = 0.0f;
    }

    /* chunk loads: rows past the split's end are zeros (their logits are masked, their
     * weights 0, and 0 x a stale value could be NaN) */
    auto load_chunk = [&](int jc, int buf) {
        constexpr int PR = DIM / 8; /* 16-byte pieces of a bf16 row */
        int cnt = min(TC_CH, j1 - jc);
        uint16_t *dst = Ks + buf * TC_CH * S::KS;
        for (int e = tid; e < TC_CH * PR; e += NT) {
            int r = e / PR, c = e % PR;
            uint16_t *sp = dst + r * S::KS + 8 * c;
            if (r < cnt)
                key_piece(sp, kb + (size_t)(jc + r) * DIM + 8 * c);
            else
                *(uint4 *)sp = make_uint4(0u, 0u, 0u, 0u);
        }
        cp_commit();
    };
    if (j0 < j1)
        load_chunk(j0, 0);

    int buf = 0;
    for (int jc = j0; jc < j1; jc += TC_CH, buf ^= 1) {
        int cnt = min(TC_CH, j1 - jc);
        cp_wait<0>();
        __syncthreads(); /* the chunk is in; every warp is past the previous chunk */
        if (jc + TC_CH < j1)
            load_chunk(jc + TC_CH, buf ^ 1);
        const uint32_t kc = ks0 + 2u * (uint32_t)(buf * TC_CH * S::KS);

        /* 1. partial logits over this warp's dims: B (dims, keys) from the key rows as stored,
         * matrices (tile 2np, dims lo), (2np, hi), (2np+1, lo), (2np+1, hi) */
        {
            float sc[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    sc[n][i] = 0.0f;
#pragma unroll
            for (int k = 0; k < S::KSTEPS; k++) {
                uint32_t bk[2][4];
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    int key = 8 * (2 * np + (li >> 1)) + lj, d = dbase + 16 * k + 8 * (li & 1);
                    ldsm_x4(bk[np], kc + 2u * (uint32_t)(key * S::KS + d));
                }
#pragma unroll
                for (int part = 0; part < 3; part++)
#pragma unroll
                    for (int n = 0; n < 4; n++)
                        duet_d_mma_bf16(sc[n], qp[part][k], bk[n >> 1][2 * (n & 1)], bk[n >> 1][2 * (n & 1) + 1]);
            }
            float *sp = Sp + warp * 16 * S::SPS;
#pragma unroll
            for (int n = 0; n < 4; n++) {
                *(float2 *)(sp + g * S::SPS + 8 * n + 2 * t) = make_float2(sc[n][0], sc[n][1]);
                *(float2 *)(sp + (g + 8) * S::SPS + 8 * n + 2 * t) = make_float2(sc[n][2], sc[n][3]);
            }
        }
        __syncthreads();
        /* 2. softmax: head r on threads 16r .. 16r+15, keys 2kp and 2kp+1 (W*32/16 heads a pass) */
        for (int r = tid >> 4; r < 16; r += NT / 16) {
            int kp = tid & 15;
            float2 v = make_float2(0.0f, 0.0f);
#pragma unroll
            for (int w = 0; w < W; w++) {
                float2 x = *(const float2 *)(Sp + (w * 16 + r) * S::SPS + 2 * kp);
                v.x += x.x;
                v.y += x.y;
            }
            v.x = 2 * kp < cnt ? v.x * scale : -INFINITY;
            v.y = 2 * kp + 1 < cnt ? v.y * scale : -INFINITY;
            float mx = fmaxf(v.x, v.y);
#pragma unroll
            for (int o = 8; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float m_old = m_s[r], m_new = fmaxf(m_old, mx);
            float p0 = m_new == -INFINITY ? 0.0f : expf(v.x - m_new);
            float p1 = m_new == -INFINITY ? 0.0f : expf(v.y - m_new);
            float sum = p0 + p1;
#pragma unroll
            for (int o = 8; o > 0; o >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            duet_d_bf16_split3(make_float2(p0, p1), Pw[(2 * 16 + r) * (TC_PS / 2) + kp],
                               Pw[(1 * 16 + r) * (TC_PS / 2) + kp], Pw[(0 * 16 + r) * (TC_PS / 2) + kp]);
            __syncwarp();
            if (kp == 0) {
                float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                l_s[r] = l_s[r] * alpha + sum;
                m_s[r] = m_new;
                alpha_s[r] = alpha;
            }
        }
        __syncthreads();
        /* 3. rescale, then p·V over this warp's dims: A (heads, keys) from the weights as stored,
         * matrices (heads lo, keys lo), (hi, lo), (lo, hi), (hi, hi); B (keys, dims) from the key
         * rows transposed, matrices (keys lo, tile 2dp), (hi, 2dp), (lo, 2dp+1), (hi, 2dp+1) */
        {
            float a_lo = alpha_s[g], a_hi = alpha_s[g + 8];
#pragma unroll
            for (int n = 0; n < S::NT; n++) {
                acc[n][0] *= a_lo;
                acc[n][1] *= a_lo;
                acc[n][2] *= a_hi;
                acc[n][3] *= a_hi;
            }
#pragma unroll
            for (int k = 0; k < TC_CH / 16; k++) {
                uint32_t pa[3][4];
#pragma unroll
                for (int part = 0; part < 3; part++)
                    ldsm_x4(pa[part], pw0 + 2u * (uint32_t)((part * 16 + (lane & 15)) * TC_PS + 16 * k + 8 * (lane >> 4)));
#pragma unroll
                for (int dp = 0; dp < S::NT / 2; dp++) {
                    uint32_t bv[4];
                    int key = 16 * k + lj + 8 * (li & 1), d = dbase + 16 * dp + 8 * (li >> 1);
                    ldsm_x4_t(bv, kc + 2u * (uint32_t)(key * S::KS + d));
#pragma unroll
                    for (int part = 0; part < 3; part++) {
                        duet_d_mma_bf16(acc[2 * dp], pa[part], bv[0], bv[1]);
                        duet_d_mma_bf16(acc[2 * dp + 1], pa[part], bv[2], bv[3]);
                    }
                }
            }
        }
    }
    __syncthreads(); /* m_s and l_s final (no chunk: their initial values) */
    size_t base = ((size_t)b * n_split + s) * n_heads;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int h = h0 + g + 8 * half;
        if (h >= n_heads)
            continue;
        float *o = o_part + (base + h) * DIM + dbase + 2 * t;
#pragma unroll
        for (int n = 0; n < S::NT; n++)
            *(float2 *)(o + 8 * n) = make_float2(acc[n][2 * half], acc[n][2 * half + 1]);
    }
    if (tid < 16 && h0 + tid < n_heads) {
        ml_part[(base + h0 + tid) * 2] = m_s[tid];
        ml_part[(base + h0 + tid) * 2 + 1] = l_s[tid];
    }
}

/* out = Σ_s e^(m_s - M) o_s / (e^(sink - M) + Σ_s e^(m_s - M) l_s), M the largest of the sink
 * and the m_s; splits without keys (l_s = 0) left out.  Block (row, head); the split weights once
 * into shared memory (n_split floats), then float4 columns (dim % 4 == 0). */
__global__ void attn_combine_kernel(int n_heads, int dim, int n_split, const float *sinks, const float *o_part,
                                    const float *ml_part, float *out)
{
    duet_pdl_wait();
    extern __shared__ float w_s[]; /* [n_split]: e^(m_s - M), or -1 for a split without keys */
    __shared__ float M_s, denom_s;
    int b = blockIdx.x, h = blockIdx.y;
    const float *ml = ml_part + ((size_t)b * n_split * n_heads + h) * 2; /* split s at ml + s*n_heads*2 */
    size_t sstride = (size_t)n_heads * 2;
    if (threadIdx.x == 0) {
        float sink = sinks[h], M = sink;
        for (int s = 0; s < n_split; s++)
            M = fmaxf(M, ml[s * sstride]);
        float denom = 0.0f;
        if (M != -INFINITY) {
            denom = sink == -INFINITY ? 0.0f : expf(sink - M);
            for (int s = 0; s < n_split; s++)
                if (ml[s * sstride + 1] > 0.0f)
                    denom += ml[s * sstride + 1] * expf(ml[s * sstride] - M);
        }
        M_s = M;
        denom_s = denom;
    }
    __syncthreads();
    float M = M_s, denom = denom_s;
    for (int s = threadIdx.x; s < n_split; s += blockDim.x)
        w_s[s] = M != -INFINITY && ml[s * sstride + 1] > 0.0f ? expf(ml[s * sstride] - M) : -1.0f;
    __syncthreads();
    float4 *o = (float4 *)(out + ((size_t)b * n_heads + h) * dim);
    if (M == -INFINITY) {
        for (int d = threadIdx.x; d < dim / 4; d += blockDim.x)
            o[d] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        return;
    }
    for (int d = threadIdx.x; d < dim / 4; d += blockDim.x) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int s = 0; s < n_split; s++) {
            float w = w_s[s];
            if (w < 0.0f)
                continue;
            float4 v = ((const float4 *)(o_part + (((size_t)b * n_split + s) * n_heads + h) * dim))[d];
            acc.x = fmaf(w, v.x, acc.x);
            acc.y = fmaf(w, v.y, acc.y);
            acc.z = fmaf(w, v.z, acc.z);
            acc.w = fmaf(w, v.w, acc.w);
        }
        o[d] = denom > 0.0f ? make_float4(acc.x / denom, acc.y / denom, acc.z / denom, acc.w / denom)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* The tensor-core form for a head dimension and key type, or NULL (W warps: DIM/W dims a warp,
 * 32 or 64); bit: its flag in c->attn_smem_set. */
typedef void (*tc_kernel_t)(const float *, int, const void *, const int32_t *, const int32_t *, float, int, int,
                            float *, float *);

static tc_kernel_t tc_kernel(int dim, int bf16, size_t *smem, int *warps, int *bit)
{
#define TC_CASE(D, W, B)                                                                                           \
    case D:                                                                                                        \
        *warps = W;                                                                                                \
        *bit = 2 * (B) + (bf16 != 0);                                                                              \
        *smem = tc_shape<D, W>::SMEM;                                                                              \
        return bf16 ? attn_part_tc_kernel<D, W, uint16_t> : attn_part_tc_kernel<D, W, float>;
    switch (dim) {
        TC_CASE(128, 4, 0)
        TC_CASE(256, 8, 1)
        TC_CASE(512, 8, 2)
    }
#undef TC_CASE
    return NULL;
}

extern "C" int duet_cuda_attn_rows_tc_ok(int dim)
{
    size_t smem;
    int warps, bit;
    return tc_kernel(dim, 0, &smem, &warps, &bit) != NULL;
}

extern "C" void duet_cuda_set_attn_tc(duet_cuda_t *c, int on) { c->attn_no_tc = on == 0; }

extern "C" int duet_cuda_attn_rows_bf16_ok(const duet_cuda_t *c, int dim)
{
    return !c->attn_no_tc && !c->exact && duet_cuda_attn_rows_tc_ok(dim);
}

/* keys: floats, or (bf16 != 0) bf16 bits, which only the tensor-core form reads. */
static duet_status_t attn_rows(duet_cuda_t *c, const float *q, int n_rows, int n_heads, int dim, const void *keys,
                               int bf16, const int32_t *key_off, const int32_t *n_keys, int max_keys,
                               const float *sinks, float scale, float *out)
{
    const char *name = bf16 ? "attn_rows_bf16" : "attn_rows";
    if (n_rows <= 0 || n_heads <= 0)
        return DUET_OK;
    if (dim % 4 || dim > AT_MAXD || dim <= 0 || ((uintptr_t)q | (uintptr_t)keys | (uintptr_t)out) % 16)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "%s: dim %d (needs a multiple of 4 up to %d, 16-byte aligned buffers)", name, dim,
                               AT_MAXD);
    if (n_rows > 65535)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: %d rows (at most 65535)", name, n_rows);
    size_t tc_smem = 0;
    int tc_warps = 0, tc_bit = 0;
    tc_kernel_t tck = c->attn_no_tc ? NULL : tc_kernel(dim, bf16, &tc_smem, &tc_warps, &tc_bit);
    if (bf16 && !tck)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "%s: bf16 keys need the tensor-core form (head dim 128, 256 or 512, not turned off)",
                               name);
    int hb = tck ? 16 : AT_HB, ch = tck ? TC_CH : AT_CH;
    int groups = (n_heads + hb - 1) / hb;
    if (groups > 65535)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "%s: %d heads (at most %d)", name, n_heads, 65535 * hb);
    int target = 2 * c->info.sm_count;
    int n_split = (target + n_rows * groups - 1) / (n_rows * groups);
    int max_split = max_keys > 0 ? (max_keys + ch - 1) / ch : 1;
    if (n_split > max_split)
        n_split = max_split;
    if (n_split < 1)
        n_split = 1;
    int per = 0; /* the tensor-core form: keys a split, the same for every row */
    if (tck) {
        per = (int)duet_round_up((size_t)((max_keys + n_split - 1) / n_split), TC_CH);
        if (c->invariant) /* a row's split (and so its summation order) from its own keys only */
            per = TC_SPLIT_KEYS;
        n_split = max_keys > per ? (max_keys + per - 1) / per : 1;
    } else if (c->invariant) {
        n_split = AT_FIXED_SPLIT;
    }
    size_t o_floats = (size_t)n_rows * n_split * n_heads * dim, ml_floats = (size_t)n_rows * n_split * n_heads * 2;
    void *scr;
    DUET_TRY(duet_cuda_scratch(c, (o_floats + ml_floats) * sizeof(float), &scr));
    float *o_part = (float *)scr, *ml_part = o_part + o_floats;
    dim3 grid(n_split, groups, n_rows);
    if (tck) {
        if (!(c->attn_smem_set & (1u << tc_bit))) {
            DUET_CUDA_CHECK(c, cudaFuncSetAttribute(tck, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tc_smem));
            c->attn_smem_set |= 1u << tc_bit;
        }
        DUET_CUDA_CHECK(c, duet_cuda_launch(c, tck, grid, dim3(tc_warps * 32), tc_smem, q, n_heads, keys, key_off,
                                            n_keys, scale, n_split, per, o_part, ml_part));
    } else {
        const float *kf = (const float *)keys;
        size_t smem = AT_HB * dim * sizeof(float);
        switch (dim) {
        case 128:
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, attn_part_fast_kernel<128>, grid, dim3(AT_THREADS), smem, q, n_heads,
                                                kf, key_off, n_keys, scale, n_split, o_part, ml_part));
            break;
        case 256:
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, attn_part_fast_kernel<256>, grid, dim3(AT_THREADS), smem, q, n_heads,
                                                kf, key_off, n_keys, scale, n_split, o_part, ml_part));
            break;
        case 512:
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, attn_part_fast_kernel<512>, grid, dim3(AT_THREADS), smem, q, n_heads,
                                                kf, key_off, n_keys, scale, n_split, o_part, ml_part));
            break;
        case 1024:
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, attn_part_fast_kernel<1024>, grid, dim3(AT_THREADS), smem, q,
                                                n_heads, kf, key_off, n_keys, scale, n_split, o_part, ml_part));
            break;
        default:
            DUET_CUDA_CHECK(c, duet_cuda_launch(c, attn_part_kernel, grid, dim3(AT_THREADS), smem, q, n_heads, dim, kf,
                                                key_off, n_keys, scale, n_split, o_part, ml_part));
        }
    }
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, attn_combine_kernel, dim3(n_rows, n_heads), dim3(128),
                                        n_split * sizeof(float), n_heads, dim, n_split, sinks, o_part, ml_part, out));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_attn_rows(duet_cuda_t *c, const float *q, int n_rows, int n_heads, int dim,
                                             const float *keys, const int32_t *key_off, const int32_t *n_keys,
                                             int max_keys, const float *sinks, float scale, float *out)
{
    if (c->exact)
        return duet_cuda_exact_attn_rows(c, q, n_rows, n_heads, dim, keys, key_off, n_keys, max_keys, sinks, scale,
                                         out);
    return attn_rows(c, q, n_rows, n_heads, dim, keys, 0, key_off, n_keys, max_keys, sinks, scale, out);
}

extern "C" duet_status_t duet_cuda_attn_rows_bf16(duet_cuda_t *c, const float *q, int n_rows, int n_heads, int dim,
                                                  const uint16_t *keys, const int32_t *key_off, const int32_t *n_keys,
                                                  int max_keys, const float *sinks, float scale, float *out)
{
    if (c->exact)
        return DUET_CUDA_NOT_EXACT(c, "attn_rows_bf16");
    return attn_rows(c, q, n_rows, n_heads, dim, keys, 1, key_off, n_keys, max_keys, sinks, scale, out);
}
