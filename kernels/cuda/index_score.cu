/* Lightning-indexer scores on the GPU (contract in index_score.cuh).
 *
 * A block computes 64 keys × 64 heads of q·k as a small fp32 GEMM: 32-column
 * chunks of q and of the keys are staged transposed in shared memory and
 * each thread accumulates a 4 heads × 4 keys tile.  Then relu, × scale ×
 * w[h], and a sum over the heads (across the 16 head-tiles through shared
 * memory).  Bytes: keys once (q, 32 KB a row, is re-read from L2 per tile);
 * FLOPs: 2*heads*dim per key. */
#include "common.cuh"

#define IS_KT 64
#define IS_HT 64
#define IS_DC 32
#define IS_PAD 68

__global__ void __launch_bounds__(256) index_score_kernel(const float *q, const float *w, int n_heads, int dim,
                                                          const float *keys, const int32_t *key_off,
                                                          const int32_t *n_keys, const int32_t *score_off,
                                                          float scale, float *score)
{
    __shared__ __align__(16) float qT[IS_DC][IS_PAD];
    __shared__ __align__(16) float kT[IS_DC][IS_PAD];
    __shared__ float red[16][IS_KT + 1];
    int b = blockIdx.y, key0 = blockIdx.x * IS_KT;
    int nk = n_keys[b];
    if (key0 >= nk)
        return;
    const float *kb = keys + (size_t)key_off[b] * dim;
    const float *qb = q + (size_t)b * n_heads * dim;
    const float *wb = w + (size_t)b * n_heads;
    int t = threadIdx.x, tx = t & 15, ty = t >> 4;
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int h0 = 0; h0 < n_heads; h0 += IS_HT) {
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                acc[i][j] = 0.0f;
        for (int c0 = 0; c0 < dim; c0 += IS_DC) {
            for (int e = t; e < IS_HT * IS_DC; e += 256) {
                int r = e / IS_DC, d = e % IS_DC, cc = c0 + d;
                int h = h0 + r, kk = key0 + r;
                qT[d][r] = (h < n_heads && cc < dim) ? qb[(size_t)h * dim + cc] : 0.0f;
                kT[d][r] = (kk < nk && cc < dim) ? kb[(size_t)kk * dim + cc] : 0.0f;
            }
            __syncthreads();
#pragma unroll 8
            for (int d = 0; d < IS_DC; d++) {
                float4 qa = *(const float4 *)&qT[d][4 * ty];
                float4 ka = *(const float4 *)&kT[d][4 * tx];
                float qv[4] = {qa.x, qa.y, qa.z, qa.w}, kv[4] = {ka.x, ka.y, ka.z, ka.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        acc[i][j] = fmaf(qv[i], kv[j], acc[i][j]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int h = h0 + 4 * ty + i;
            if (h >= n_heads)
                continue;
            float wh = wb[h];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float d = acc[i][j] < 0.0f ? 0.0f : acc[i][j];
                part[j] = __fadd_rn(part[j], __fmul_rn(__fmul_rn(d, scale), wh));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
        red[ty][4 * tx + j] = part[j];
    __syncthreads();
    if (t < IS_KT && key0 + t < nk) {
        float s = 0.0f;
        for (int y = 0; y < 16; y++)
            s += red[y][t];
        score[(size_t)(score_off ? score_off[b] : key_off[b]) + key0 + t] = s;
    }
}

extern "C" duet_status_t duet_cuda_index_score(duet_cuda_t *c, const float *q, const float *w, int n_rows,
                                               int n_heads, int dim, const float *keys, const int32_t *key_off,
                                               const int32_t *n_keys, int max_keys, float scale, float *score)
{
    return duet_cuda_index_score_rows(c, q, w, n_rows, n_heads, dim, keys, key_off, n_keys, NULL, max_keys, scale,
                                      score);
}

extern "C" duet_status_t duet_cuda_index_score_rows(duet_cuda_t *c, const float *q, const float *w, int n_rows,
                                                    int n_heads, int dim, const float *keys, const int32_t *key_off,
                                                    const int32_t *n_keys, const int32_t *score_off, int max_keys,
                                                    float scale, float *score)
{
    if (n_rows <= 0 || max_keys <= 0 || n_heads <= 0 || dim <= 0)
        return DUET_OK;
    if (n_rows > 65535)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "index_score: %d rows (at most 65535)", n_rows);
    dim3 grid(duet_cdiv(max_keys, IS_KT), n_rows);
    index_score_kernel<<<grid, 256, 0, c->stream>>>(q, w, n_heads, dim, keys, key_off, n_keys, score_off, scale,
                                                              score);
    DUET_CUDA_CHECK_LAUNCH(c);
    return DUET_OK;
}
