/* Compressor state rows (contract in compress_rows.cuh): one thread per (descriptor, column). */
#include "common.cuh"

__global__ void comp_gather_kernel(duet_comp_geom_t g, const float *state, const float *pkv, const float *pgate,
                                   const float *ape, const duet_comp_slot_t *desc, int n, float *kv_out,
                                   float *gate_out)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * g.dim)
        return;
    size_t e = i / g.dim;
    int col = (int)(i % g.dim);
    duet_comp_slot_t d = desc[e];
    int cc = d.half * g.dim + col;
    float kv, gt;
    if (d.row == -2) {
        kv = 0.0f;
        gt = -INFINITY;
    } else if (d.row >= 0) {
        kv = pkv[(size_t)d.row * g.width + cc];
        gt = __fadd_rn(pgate[(size_t)d.row * g.width + cc], ape[(size_t)(d.pos % g.ratio) * g.width + cc]);
    } else {
        const float *r = state + (size_t)d.slot * g.slot_floats + (size_t)(d.pos % g.ring) * g.stride + g.row_off;
        kv = r[cc];
        gt = r[g.width + cc];
    }
    kv_out[i] = kv;
    gate_out[i] = gt;
}

__global__ void comp_state_write_kernel(duet_comp_geom_t g, float *state, const float *pkv, const float *pgate,
                                        const float *ape, const duet_comp_slot_t *desc, int n)
{
    duet_pdl_wait();
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * g.width)
        return;
    size_t e = i / g.width;
    int col = (int)(i % g.width);
    duet_comp_slot_t d = desc[e];
    float *r = state + (size_t)d.slot * g.slot_floats + (size_t)(d.pos % g.ring) * g.stride + g.row_off;
    r[col] = pkv[(size_t)d.row * g.width + col];
    r[g.width + col] = __fadd_rn(pgate[(size_t)d.row * g.width + col], ape[(size_t)(d.pos % g.ratio) * g.width + col]);
}

extern "C" duet_status_t duet_cuda_comp_gather(duet_cuda_t *c, const duet_comp_geom_t *g, const float *state,
                                               const float *pkv, const float *pgate, const float *ape,
                                               const duet_comp_slot_t *desc, int n, float *kv_out, float *gate_out)
{
    size_t total = (size_t)n * g->dim;
    if (!total)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, comp_gather_kernel, dim3(duet_cdiv(total, 256)), dim3(256), 0, *g, state,
                                        pkv, pgate, ape, desc, n, kv_out, gate_out));
    return DUET_OK;
}

extern "C" duet_status_t duet_cuda_comp_state_write(duet_cuda_t *c, const duet_comp_geom_t *g, float *state,
                                                    const float *pkv, const float *pgate, const float *ape,
                                                    const duet_comp_slot_t *desc, int n)
{
    size_t total = (size_t)n * g->width;
    if (!total)
        return DUET_OK;
    DUET_CUDA_CHECK(c, duet_cuda_launch(c, comp_state_write_kernel, dim3(duet_cdiv(total, 256)), dim3(256), 0, *g,
                                        state, pkv, pgate, ape, desc, n));
    return DUET_OK;
}
