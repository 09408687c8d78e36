/* MoE routing, sort and combination on the GPU (contract in moe_route.cuh). */
#include <climits>

#include "common.cuh"

/* duet_score_fn_t */
#define SCORE_SOFTMAX 0
#define SCORE_SIGMOID 1
#define SCORE_SQRTSOFTPLUS 2

#define ROUTE_THREADS 256
/* at least the static shared memory of moe_route_kernel (the warps' maxima, the picks and one
 * float: 176 bytes on sm_90a), which leaves the scores that much less of the 48 KB a launch may
 * take without opting in */
#define ROUTE_STATIC_SMEM 256
#define SORT_THREADS 1024
#define SORT_SEGMENT 256
/* static shared memory of moe_sort_kernel: the warps' totals of its four scans (the counts and
 * three tile sizes) */
#define SORT_STATIC_SMEM (4 * (SORT_THREADS / 32) * sizeof(int))
static_assert(SORT_THREADS % 32 == 0 && SORT_THREADS <= 1024, "moe_sort scans whole warps, at most 32");

__device__ __forceinline__ float moe_score(int f, float z)
{
    if (f == SCORE_SQRTSOFTPLUS) {
        float sp = z > 20.0f ? z : duet_ref_log1pf(duet_ref_expf(z));
        return __fsqrt_rn(sp);
    }
    if (f == SCORE_SIGMOID)
        return duet_ref_sigmoidf(z);
    return z;
}

/* descending value, then ascending index */
__device__ __forceinline__ bool better(float av, int ai, float bv, int bi)
{
    return av > bv || (av == bv && ai < bi);
}

/* Row r's weights from its scores and picks (ascending ids): summed, normalized and scaled in
 * the CPU's order. */
__device__ void route_weights(const duet_cuda_moe_route_t &p, const float *sc, const int *chosen, int r, int32_t *sel,
                              float *wt)
{
    int E = p.n_experts, K = p.top_k;
    float sum = 0.0f;
    for (int j = 0; j < K; j++) {
        int e = chosen[j];
        sum = __fadd_rn(sum, e >= 0 && e < E ? sc[e] : 0.0f);
    }
    for (int j = 0; j < K; j++) {
        int e = chosen[j];
        float w = e >= 0 && e < E ? sc[e] : 0.0f;
        if (p.norm_topk_prob)
            w = __fdiv_rn(w, __fadd_rn(sum, 1e-20f));
        sel[(size_t)r * K + j] = e;
        wt[(size_t)r * K + j] = __fmul_rn(w, p.routed_scale);
    }
}

__global__ void __launch_bounds__(ROUTE_THREADS) moe_route_kernel(duet_cuda_moe_route_t p, const float *logits,
                                                                  int32_t *sel, float *wt)
{
    duet_pdl_wait();
    extern __shared__ float sm[];
    int E = p.n_experts, K = p.top_k;
    float *sc = sm, *bv = sm + E;
    unsigned char *taken = (unsigned char *)(sm + 2 * E);
    __shared__ float rv[ROUTE_THREADS / 32];
    __shared__ int chosen[DUET_CUDA_MOE_MAX_K];
    __shared__ float s_red;
    int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const float *lg = logits + (size_t)r * E;
    for (int e = tid; e < E; e += blockDim.x)
        sc[e] = moe_score(p.scoring, lg[e]);
    __syncthreads();
    if (p.scoring == SCORE_SOFTMAX) {
        float mx = -INFINITY;
        for (int e = tid; e < E; e += blockDim.x)
            mx = sc[e] > mx ? sc[e] : mx;
        for (int o = 16; o; o >>= 1) {
            float v = __shfl_xor_sync(0xffffffffu, mx, o);
            mx = v > mx ? v : mx;
        }
        if (lane == 0)
            rv[warp] = mx;
        __syncthreads();
        if (tid == 0) {
            float m = -INFINITY;
            for (int w = 0; w < nw; w++)
                m = rv[w] > m ? rv[w] : m;
            s_red = m;
        }
        __syncthreads();
        mx = s_red;
        for (int e = tid; e < E; e += blockDim.x)
            sc[e] = duet_ref_expf(__fsub_rn(sc[e], mx));
        __syncthreads();
        if (tid == 0) { /* the CPU's sequential sum */
            float s = 0.0f;
            for (int e = 0; e < E; e++)
                s = __fadd_rn(s, sc[e]);
            s_red = s;
        }
        __syncthreads();
        float s = s_red;
        for (int e = tid; e < E; e += blockDim.x)
            sc[e] = __fdiv_rn(sc[e], s);
        __syncthreads();
    }
    if (p.tid2eid) {
        int t = p.tok[r];
        if (tid < K)
            chosen[tid] = (t >= 0 && t < p.vocab) ? p.tid2eid[(size_t)t * K + tid] : -1;
        __syncthreads();
        if (tid == 0)
            route_weights(p, sc, chosen, r, sel, wt);
    } else {
        for (int e = tid; e < E; e += blockDim.x) {
            float b = __fadd_rn(sc[e], p.bias ? p.bias[e] : 0.0f);
            bv[e] = b != b ? -INFINITY : b;
            taken[e] = 0;
        }
        __syncthreads();
        /* the top-k by warp 0 alone: K picks of the best (value, then lowest index) untaken
         * expert, a total order, so the picks are the CPU's whichever lane sees which expert */
        if (warp != 0)
            return;
        for (int k = 0; k < K; k++) {
            float v = -INFINITY;
            int vi = INT_MAX;
            for (int e = lane; e < E; e += 32)
                if (!taken[e] && better(bv[e], e, v, vi)) {
                    v = bv[e];
                    vi = e;
                }
            for (int o = 16; o; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, v, o);
                int oi = __shfl_xor_sync(0xffffffffu, vi, o);
                if (better(ov, oi, v, vi)) {
                    v = ov;
                    vi = oi;
                }
            }
            if (lane == 0) {
                chosen[k] = vi;
                taken[vi] = 1;
            }
            __syncwarp();
        }
        if (tid == 0) /* ascending ids, as duet_cpu_topk */
            for (int i = 1; i < K; i++) {
                int v = chosen[i], j = i - 1;
                while (j >= 0 && chosen[j] > v) {
                    chosen[j + 1] = chosen[j];
                    j--;
                }
                chosen[j + 1] = v;
            }
        if (tid == 0)
            route_weights(p, sc, chosen, r, sel, wt);
    }
}

/* The assignments are cut into ns segments of seg in order, one a warp (ns <= 32): cnt[s][e]
 * counts expert e in segment s, then becomes the place of segment s's first assignment to e
 * (the expert's offset plus its counts in the segments before), so every warp places its own
 * segment at once and the order within an expert stays the assignments' order. */
__global__ void __launch_bounds__(SORT_THREADS) moe_sort_kernel(const int32_t *sel, int n, int K, int E, int ns,
                                                                 int seg, int32_t *offs, int32_t *tiles,
                                                                 int32_t *xrow, int32_t *pos)
{
    duet_pdl_wait();
    extern __shared__ int32_t cnt[]; /* [ns][E] */
    int tid = threadIdx.x, bd = blockDim.x;
    for (int i = tid; i < ns * E; i += bd)
        cnt[i] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += bd) {
        int e = sel[i];
        if (e >= 0 && e < E)
            atomicAdd(&cnt[(i / seg) * E + e], 1);
        else
            pos[i] = -1;
    }
    __syncthreads();
    /* exclusive prefix sums of the counts and of the 8-token, wide and 64-token tiles, blockDim
     * experts a pass (a warp scan, then the warps' totals scanned by warp 0) */
    constexpr int NP = 4; /* counts, then the three tile sizes */
    __shared__ int wsum[NP][SORT_THREADS / 32];
    int lane = tid & 31, warp = tid >> 5, nw = bd >> 5;
    int done[NP] = {0, 0, 0, 0}; /* the passes before */
    for (int e0 = 0; e0 < E; e0 += bd) {
        int e = e0 + tid, c = 0;
        if (e < E)
            for (int s = 0; s < ns; s++)
                c += cnt[s * E + e];
        constexpr int W = DUET_CUDA_MOE_WIDE_TILE, W64 = DUET_CUDA_MOE_WG_TILE;
        const int own[NP] = {c, (c + 7) / 8, (c + W - 1) / W, (c + W64 - 1) / W64};
        int v[NP];
#pragma unroll
        for (int k = 0; k < NP; k++) {
            v[k] = own[k];
#pragma unroll
            for (int sh = 1; sh < 32; sh <<= 1) {
                int t = __shfl_up_sync(0xffffffffu, v[k], sh);
                if (lane >= sh)
                    v[k] += t;
            }
        }
        if (lane == 31)
#pragma unroll
            for (int k = 0; k < NP; k++)
                wsum[k][warp] = v[k];
        __syncthreads();
        if (warp == 0)
#pragma unroll
            for (int k = 0; k < NP; k++) {
                int w = lane < nw ? wsum[k][lane] : 0;
#pragma unroll
                for (int sh = 1; sh < 32; sh <<= 1) {
                    int t = __shfl_up_sync(0xffffffffu, w, sh);
                    if (lane >= sh)
                        w += t;
                }
                if (lane < nw)
                    wsum[k][lane] = w; /* inclusive over the warps */
            }
        __syncthreads();
        if (e < E) {
            int ex[NP]; /* exclusive: this expert's first count and tiles */
#pragma unroll
            for (int k = 0; k < NP; k++)
                ex[k] = done[k] + (warp ? wsum[k][warp - 1] : 0) + v[k] - own[k];
            offs[e] = ex[0];
#pragma unroll
            for (int k = 1; k < NP; k++)
                tiles[(k - 1) * (E + 1) + e] = ex[k];
            int o = ex[0];
            for (int s = 0; s < ns; s++) {
                int t = cnt[s * E + e];
                cnt[s * E + e] = o;
                o += t;
            }
        }
#pragma unroll
        for (int k = 0; k < NP; k++)
            done[k] += wsum[k][nw - 1];
        __syncthreads(); /* wsum is read before the next pass writes it */
    }
    if (tid == 0) {
        offs[E] = done[0];
#pragma unroll
        for (int k = 1; k < NP; k++)
            tiles[(k - 1) * (E + 1) + E] = done[k];
    }
    /* placement, stable: warp s walks segment s 32 assignments at a time, in order; a lane's
     * place is its expert's next one in the segment plus the lanes before it with the same expert
     * (__match_any_sync), and the last of them moves that next place on once all have read it */
    __syncthreads();
    if (warp >= ns)
        return;
    int *next = cnt + warp * E, end = min(n, (warp + 1) * seg);
    for (int base = warp * seg; base < end; base += 32) {
        int i = base + lane;
        int e = i < end ? sel[i] : -1;
        bool ok = e >= 0 && e < E;
        unsigned peers = __match_any_sync(0xffffffffu, ok ? e : -1);
        int f = ok ? next[e] + __popc(peers & ((1u << lane) - 1)) : -1;
        __syncwarp();
        if (ok) {
            xrow[f] = i / K;
            pos[i] = f;
            if (lane == 31 - __clz(peers)) /* the last lane of its expert */
                next[e] = f + 1;
        }
        __syncwarp();
    }
}

__global__ void moe_combine_kernel(const int32_t *sel, const float *wt, const int32_t *pos, int K, const float *y,
                                   const float *shared, int dim, float *out)
{
    duet_pdl_wait();
    __shared__ int ps[DUET_CUDA_MOE_MAX_K];
    __shared__ float ws[DUET_CUDA_MOE_MAX_K];
    __shared__ int np;
    int r = blockIdx.x;
    if (threadIdx.x == 0) {
        int ke[DUET_CUDA_MOE_MAX_K], m = 0;
        for (int j = 0; j < K; j++) { /* valid assignments, ascending expert id then j (insertion: stable) */
            int p = pos[(size_t)r * K + j];
            if (p < 0)
                continue;
            int e = sel[(size_t)r * K + j], i = m - 1;
            while (i >= 0 && ke[i] > e) {
                ke[i + 1] = ke[i];
                ps[i + 1] = ps[i];
                ws[i + 1] = ws[i];
                i--;
            }
            ke[i + 1] = e;
            ps[i + 1] = p;
            ws[i + 1] = wt[(size_t)r * K + j];
            m++;
        }
        np = m;
    }
    __syncthreads();
    int m = np;
    for (int d = blockIdx.y * blockDim.x + threadIdx.x; d < dim; d += gridDim.y * blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < m; i++)
            acc = __fadd_rn(acc, __fmul_rn(y[(size_t)ps[i] * dim + d], ws[i]));
        if (shared)
            acc = __fadd_rn(acc, shared[(size_t)r * dim + d]);
        out[(size_t)r * dim + d] = acc;
    }
}

extern "C" duet_status_t duet_cuda_moe_route(duet_cuda_t *c, const duet_cuda_moe_route_t *p, const float *logits,
                                             int n_rows, int32_t *sel, float *wt)
{
    if (p->n_experts <= 0 || p->top_k <= 0 || p->top_k > DUET_CUDA_MOE_MAX_K || p->top_k > p->n_experts ||
        (p->tid2eid && !p->tok))
        return duet_cuda_failf(c, DUET_ERR_INVALID, "moe_route: %d experts, top-%d (at most %d)", p->n_experts,
                               p->top_k, DUET_CUDA_MOE_MAX_K);
    if (n_rows <= 0)
        return DUET_OK;
    size_t smem = (size_t)p->n_experts * (2 * sizeof(float) + 1);
    if (smem > 48 * 1024 - ROUTE_STATIC_SMEM)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "moe_route: %d experts (shared memory)", p->n_experts);
    DUET_CUDA_CHECK(
        c, duet_cuda_launch(c, moe_route_kernel, dim3(n_rows), dim3(ROUTE_THREADS), smem, *p, logits, sel, wt));
    return DUET_OK;
}

extern "C" int duet_cuda_moe_wide_tile(void) { return DUET_CUDA_MOE_WIDE_TILE; }
extern "C" int duet_cuda_moe_wg_tile(void) { return DUET_CUDA_MOE_WG_TILE; }

extern "C" duet_status_t duet_cuda_moe_sort(duet_cuda_t *c, const int32_t *sel, int n_rows, int top_k,
                                            int n_experts, int32_t *offs, int32_t *tiles, int32_t *xrow,
                                            int32_t *pos)
{
    if (n_experts <= 0 || top_k <= 0)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "moe_sort: %d experts, top-%d", n_experts, top_k);
    const size_t smem_max = 48 * 1024 - SORT_STATIC_SMEM, row = (size_t)n_experts * sizeof(int32_t);
    if (row > smem_max)
        return duet_cuda_failf(c, DUET_ERR_UNSUPPORTED, "moe_sort: %d experts (shared memory)", n_experts);
    /* a segment a warp, each of at least SORT_SEGMENT assignments (fewer and the segments'
     * counts cost more than the walk they save), as many as shared memory holds */
    int n = n_rows * top_k, ns = n / SORT_SEGMENT;
    ns = ns < SORT_THREADS / 32 ? ns : SORT_THREADS / 32;
    ns = (size_t)ns * row <= smem_max ? ns : (int)(smem_max / row);
    ns = ns > 1 ? ns : 1;
    int seg = (n + ns - 1) / ns;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, moe_sort_kernel, dim3(1), dim3(SORT_THREADS), (size_t)ns * row, sel, n,
                                        top_k, n_experts, ns, seg, offs, tiles, xrow, pos));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_moe_combine(duet_cuda_t *c, const int32_t *sel, const float *wt,
                                               const int32_t *pos, int n_rows, int top_k, const float *y,
                                               const float *shared, int dim, float *out)
{
    if (top_k <= 0 || top_k > DUET_CUDA_MOE_MAX_K)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "moe_combine: top-%d", top_k);
    if (n_rows <= 0 || dim <= 0)
        return DUET_OK;
    dim3 grid(n_rows, duet_cdiv(dim, 256) < 8 ? duet_cdiv(dim, 256) : 8);
    DUET_CUDA_CHECK(
        c, duet_cuda_launch(c, moe_combine_kernel, grid, dim3(256), 0, sel, wt, pos, top_k, y, shared, dim, out));
    return DUET_OK;
}

/* Tensor parallelism: the tile prefix sums (DUET_CUDA_MOE_TILE_ROWS, E+1) restricted to experts [e0, e1): t'[e] =
 * t[clamp(e, e0, e1)] - t[e0], so the grouped matmul's tiles cover this rank's experts only,
 * at their usual sorted positions. */
__global__ void moe_tiles_own_kernel(int32_t *tiles, int E, int e0, int e1)
{
    duet_pdl_wait();
    extern __shared__ int32_t st[];
    int n = DUET_CUDA_MOE_TILE_ROWS * (E + 1);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        st[i] = tiles[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int h = i / (E + 1), e = i % (E + 1);
        const int32_t *t = st + h * (E + 1);
        int ce = e < e0 ? e0 : e > e1 ? e1 : e;
        tiles[i] = t[ce] - t[e0];
    }
}

/* y[p] = recv[owner(p)][p]: each sorted position from the rank holding its expert. */
__global__ void moe_pick_kernel(float *y, const float *recv, size_t stride, int dim, const int32_t *offs, int E,
                                int T)
{
    duet_pdl_wait();
    __shared__ int owner;
    int p = blockIdx.x;
    if (threadIdx.x == 0) {
        int r = -1;
        if (p < offs[E]) {
            int lo = 0, hi = E - 1; /* the last expert whose first position is <= p */
            while (lo < hi) {
                int mid = (lo + hi + 1) >> 1;
                if (offs[mid] <= p)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            r = T - 1;
            while (r > 0 && (int)((long long)E * r / T) > lo)
                r--;
        }
        owner = r;
    }
    __syncthreads();
    if (owner < 0)
        return;
    const float4 *src = (const float4 *)(recv + (size_t)owner * stride + (size_t)p * dim);
    float4 *dst = (float4 *)(y + (size_t)p * dim);
    for (int d = threadIdx.x; d < dim / 4; d += blockDim.x)
        dst[d] = src[d];
}

extern "C" duet_status_t duet_cuda_moe_tiles_own(duet_cuda_t *c, int32_t *tiles, int n_experts, int e0, int e1)
{
    if (n_experts <= 0 || e0 < 0 || e1 > n_experts || e0 > e1)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "moe_tiles_own: experts [%d, %d) of %d", e0, e1, n_experts);
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, moe_tiles_own_kernel, dim3(1), dim3(256),
                                        sizeof(int32_t) * DUET_CUDA_MOE_TILE_ROWS * (size_t)(n_experts + 1), tiles,
                                        n_experts, e0, e1));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_moe_pick(duet_cuda_t *c, float *y, const float *recv, int n_assign, int dim,
                                            const int32_t *offs, int n_experts, int n_ranks)
{
    if (dim % 4 || n_ranks < 1 || n_experts < 1)
        return duet_cuda_failf(c, DUET_ERR_INVALID, "moe_pick: dim %d, %d experts, %d ranks", dim, n_experts, n_ranks);
    if (n_assign <= 0)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, moe_pick_kernel, dim3(n_assign), dim3(128), 0, y, recv,
                                        (size_t)n_assign * dim, dim, offs, n_experts, n_ranks));
    return DUET_OK;
}
