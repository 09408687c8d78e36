/* DeepSeek-V4 model configuration, read from an official config.json.
 *
 * Field names follow the official checkpoint's config.json (V4-Flash,
 * V4-Pro); transformers' renamed keys (layer_types, mlp_layer_types,
 * rope_parameters) are accepted as well.  docs/CHECKPOINT.md lists each key. */
#ifndef DUET_MODEL_CONFIG_H
#define DUET_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define DUET_MAX_LAYERS 256

typedef enum {
    DUET_SCORE_SOFTMAX = 0,
    DUET_SCORE_SIGMOID,
    DUET_SCORE_SQRTSOFTPLUS,
} duet_score_fn_t;

typedef struct {
    int enabled;                   /* rope_scaling type yarn */
    double factor;
    double beta_fast, beta_slow;
    double mscale, mscale_all_dim;
    int64_t original_max_position_embeddings;
} duet_yarn_t;

typedef struct {
    int vocab_size;
    int hidden_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;       /* must be 1 (shared-KV MQA) */
    int head_dim;                  /* 512 */
    int qk_rope_head_dim;          /* 64; nope = head_dim - rope */
    int q_lora_rank;
    int o_lora_rank;
    int o_groups;
    /* MoE */
    int n_routed_experts;
    int n_shared_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    duet_score_fn_t scoring_func;
    int topk_method_noaux_tc;      /* 1 when topk_method == noaux_tc (bias-corrected selection) */
    double routed_scaling_factor;
    int norm_topk_prob;
    double swiglu_limit;           /* <= 0: no clamp */
    int num_hash_layers;
    /* hyper-connections */
    int hc_mult;
    int hc_sinkhorn_iters;
    double hc_eps;
    /* attention */
    int sliding_window;
    int compress_ratios[DUET_MAX_LAYERS + 1]; /* per layer (+ MTP entries ignored) */
    int n_compress_ratios;
    double rope_theta;
    double compress_rope_theta;
    duet_yarn_t yarn;              /* applied to the compressed layers' rope (and indexer) */
    int yarn_on_main;              /* also applied to ratio-0 layers */
    int index_n_heads;
    int index_head_dim;
    int index_topk;
    double rms_norm_eps;
    int64_t max_position_embeddings;
    int bos_token_id, eos_token_id;
    int num_nextn_predict_layers;
    /* quantization */
    int weights_fp8;               /* quantization_config.quant_method == fp8 */
    int weight_block_size[2];      /* [128, 128] */
    int scale_ue8m0;               /* scale_fmt == ue8m0 */
    int experts_fp4;               /* expert_dtype == fp4 */
} duet_model_config_t;

/* Parse config.json at `path`.  Missing required fields, wrong types and
 * inconsistent values (head_dim not > rope dims, num_key_value_heads != 1,
 * compress_ratios shorter than the layer count, a ratio other than 0/4/128,
 * heads not divisible by o_groups, ...) give DUET_ERR_CONFIG naming the file
 * and the field. */
duet_status_t duet_model_config_load(const char *path, duet_model_config_t *out, duet_err_t *err);
/* Same from a JSON string (`origin` names it in messages). */
duet_status_t duet_model_config_parse(const char *json, size_t len, const char *origin,
                                      duet_model_config_t *out, duet_err_t *err);

static inline int duet_cfg_ratio(const duet_model_config_t *c, int layer) { return c->compress_ratios[layer]; }
static inline int duet_cfg_nope_dim(const duet_model_config_t *c) { return c->head_dim - c->qk_rope_head_dim; }
/* Index of `layer` among the layers of the same ratio (the pool's layer slot). */
int duet_cfg_ratio_layer_index(const duet_model_config_t *c, int layer);
/* Number of layers with compress ratio r. */
int duet_cfg_count_ratio(const duet_model_config_t *c, int r);

#endif
