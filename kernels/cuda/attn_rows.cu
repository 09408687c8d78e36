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

__global__ void attn_combine_kernel(int n_heads, int dim, int n_split, const float *sinks, const float *o_part,
                                    const float *ml_part, float *out)
{
    int b = blockIdx.x, h = blockIdx.y;
    float sink = sinks[h], M = sink;
    for (int s = 0; s < n_split; s++)
        M = fmaxf(M, ml_part[(((size_t)b * n_split + s) * n_heads + h) * 2]);
    float *o = out + ((size_t)b * n_heads + h) * dim;
    if (M == -INFINITY) {
        for (int d = threadIdx.x; d < dim; d += blockDim.x)
            o[d] = 0.0f;
        return;
    }
    float denom = sink == -INFINITY ? 0.0f : expf(sink - M);
    for (int s = 0; s < n_split; s++) {
        const float *ml = ml_part + (((size_t)b * n_split + s) * n_heads + h) * 2;
        if (ml[1] > 0.0f)
            denom += ml[1] * expf(ml[0] - M);
    }
    for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++) {
            size_t r = ((size_t)b * n_split + s) * n_heads + h;
            if (ml_part[r * 2 + 1] > 0.0f)
                acc = fmaf(expf(ml_part[r * 2] - M), o_part[r * dim + d], acc);
        }
        o[d] = denom > 0.0f ? acc / denom : 0.0f;
    }
}

extern "C" duet_status_t duet_cuda_attn_rows(duet_cuda_t *c, const float *q, int n_rows, int n_heads, int dim,
                                             const float *keys, const int32_t *key_off, const int32_t *n_keys,
                                             int max_keys, const float *sinks, float scale, float *out)
{
    if (n_rows <= 0 || n_heads <= 0)
        return DUET_OK;
    if (dim % 4 || dim > AT_MAXD || dim <= 0 || ((uintptr_t)q | (uintptr_t)keys | (uintptr_t)out) % 16)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED,
                               "attn_rows: dim %d (needs a multiple of 4 up to %d, 16-byte aligned buffers)", dim,
                               AT_MAXD);
    if (n_rows > 65535)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "attn_rows: %d rows (at most 65535)", n_rows);
    int groups = (n_heads + AT_HB - 1) / AT_HB;
    int target = 2 * c->info.sm_count;
    int n_split = (target + n_rows * groups - 1) / (n_rows * groups);
    int max_split = max_keys > 0 ? (max_keys + AT_CH - 1) / AT_CH : 1;
    if (n_split > max_split)
        n_split = max_split;
    if (n_split < 1)
        n_split = 1;
    if (c->invariant) /* a row's split (and so its summation order) from its own key count only */
        n_split = AT_FIXED_SPLIT;
    size_t o_floats = (size_t)n_rows * n_split * n_heads * dim, ml_floats = (size_t)n_rows * n_split * n_heads * 2;
    void *scr;
    DUET_TRY(duet_cuda_scratch(c, (o_floats + ml_floats) * sizeof(float), &scr));
    float *o_part = (float *)scr, *ml_part = o_part + o_floats;
    dim3 grid(n_split, groups, n_rows);
    size_t smem = AT_HB * dim * sizeof(float);
    switch (dim) {
    case 128:
        attn_part_fast_kernel<128><<<grid, AT_THREADS, smem, c->stream>>>(q, n_heads, keys, key_off, n_keys, scale,
                                                                         n_split, o_part, ml_part);
        break;
    case 256:
        attn_part_fast_kernel<256><<<grid, AT_THREADS, smem, c->stream>>>(q, n_heads, keys, key_off, n_keys, scale,
                                                                         n_split, o_part, ml_part);
        break;
    case 512:
        attn_part_fast_kernel<512><<<grid, AT_THREADS, smem, c->stream>>>(q, n_heads, keys, key_off, n_keys, scale,
                                                                         n_split, o_part, ml_part);
        break;
    case 1024:
        attn_part_fast_kernel<1024><<<grid, AT_THREADS, smem, c->stream>>>(q, n_heads, keys, key_off, n_keys,
                                                                          scale, n_split, o_part, ml_part);
        break;
    default:
        attn_part_kernel<<<grid, AT_THREADS, smem, c->stream>>>(q, n_heads, dim, keys, key_off, n_keys, scale,
                                                                n_split, o_part, ml_part);
    }
    DUET_CUDA_CHECK_LAUNCH(c);
    attn_combine_kernel<<<dim3(n_rows, n_heads), 128, 0, c->stream>>>(n_heads, dim, n_split, sinks, o_part, ml_part,
                                                                      out);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}
