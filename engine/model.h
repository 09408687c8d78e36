/* A loaded DeepSeek-V4 model: config, weights (mmap'd where their stored
 * dtype is used as is), RoPE tables.  Tensor names are the official
 * checkpoint's (docs/CHECKPOINT.md). */
#ifndef DUET_MODEL_H
#define DUET_MODEL_H

#include <stdint.h>

#include "err.h"
#include "kernels.h"
#include "model_config.h"
#include "safetensors.h"

typedef struct {
    duet_weight_t w1, w2, w3; /* gate [inter, D], down [D, inter], up [inter, D] */
} duet_expert_t;

typedef struct {
    duet_weight_t wkv, wgate;   /* [coff*dim, D] */
    float *ape;                 /* (ratio, coff*dim) */
    float *norm;                /* (dim) */
    int dim, coff, ratio;
} duet_compressor_t;

typedef struct {
    int ratio;
    int is_hash;
    float *attn_norm, *ffn_norm;          /* (D) */
    float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;  /* (mix, hc*D), (mix), (3) */
    float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    float *attn_sink;                      /* (H) */
    duet_weight_t wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm;               /* (q_lora), (head_dim) */
    duet_compressor_t comp;                /* ratio 4 / 128 */
    duet_compressor_t icomp;               /* indexer's compressor (ratio 4) */
    duet_weight_t idx_wq_b, idx_weights_proj;
    duet_weight_t gate;                    /* [E, D] */
    float *gate_bias;                      /* (E) or NULL on hash layers */
    int32_t *tid2eid;                      /* (vocab, top_k) on hash layers */
    duet_expert_t *experts;                /* E */
    duet_expert_t shared;                  /* n_shared_experts == 1 */
} duet_layer_weights_t;

typedef struct duet_model {
    duet_model_config_t cfg;
    duet_st_checkpoint_t *ck;
    duet_weight_t embed;                   /* [V, D] */
    duet_weight_t head;                    /* [V, D] */
    float *norm;                           /* (D) */
    float *hc_head_fn, *hc_head_base;      /* (hc, hc*D), (hc) */
    float hc_head_scale;
    duet_layer_weights_t *layers;
    duet_rope_t rope_main, rope_compress;
    char *dir;
} duet_model_t;

/* Load config.json and the checkpoint in `dir`, validating every tensor's
 * presence, dtype and shape (errors name the tensor and its file). */
duet_status_t duet_model_load(const char *dir, duet_model_t **out, duet_err_t *err);
void duet_model_destroy(duet_model_t **m);

/* The rope table a layer's attention uses (main for ratio 0, compress otherwise). */
static inline const duet_rope_t *duet_model_layer_rope(const duet_model_t *m, int layer)
{
    return m->cfg.compress_ratios[layer] ? &m->rope_compress : &m->rope_main;
}

#endif
