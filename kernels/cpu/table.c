#include <math.h>
#include <pthread.h>

#include "kernels_cpu.h"
#include "model_config.h"

void duet_kernels_init_cpu(duet_kernels_t *k)
{
    k->matmul = duet_cpu_matmul;
    k->rmsnorm = duet_cpu_rmsnorm;
    k->rope = duet_cpu_rope;
    k->cache_store = duet_cache_entry_store;
    k->cache_load = duet_cache_entry_load;
    k->attn_row = duet_cpu_attn_row;
    k->compress_pool = duet_cpu_compress_pool;
    k->index_score = duet_cpu_index_score;
    k->topk = duet_cpu_topk;
    k->hc_pre = duet_cpu_hc_pre;
    k->hc_post = duet_cpu_hc_post;
    k->hc_head = duet_cpu_hc_head;
    k->swiglu = duet_cpu_swiglu;
}

static duet_kernels_t g_kernels;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void kernels_once(void) { duet_kernels_init_cpu(&g_kernels); }

const duet_kernels_t *duet_kernels(void)
{
    pthread_once(&g_once, kernels_once);
    return &g_kernels;
}

duet_kernels_t *duet_kernels_mutable(void)
{
    pthread_once(&g_once, kernels_once);
    return &g_kernels;
}

/* Inverse frequencies computed in float32 in the order transformers uses, so
 * the tables agree with the numerical reference to the last bit where
 * possible.  yarn: the correction range [low, high] from beta_fast/beta_slow,
 * then a linear ramp blending interpolated (1/factor) and extrapolated
 * frequencies; no mscale (the model's compress rope has attention_factor 1). */
void duet_rope_init(duet_rope_t *r, int rope_dim, double theta, const void *yarn_v)
{
    const duet_yarn_t *yarn = yarn_v;
    r->rope_dim = rope_dim;
    int half = rope_dim / 2;
    for (int j = 0; j < half; j++) {
        float expo = (float)(2 * j) / (float)rope_dim;
        float pos_freq = powf((float)theta, expo);
        float extra = 1.0f / pos_freq;
        if (!yarn || !yarn->enabled) {
            r->inv_freq[j] = extra;
            continue;
        }
        float inter = 1.0f / ((float)yarn->factor * pos_freq);
        double L = (double)yarn->original_max_position_embeddings;
        double low = floor(rope_dim * log(L / (yarn->beta_fast * 2 * M_PI)) / (2 * log(theta)));
        double high = ceil(rope_dim * log(L / (yarn->beta_slow * 2 * M_PI)) / (2 * log(theta)));
        if (low < 0)
            low = 0;
        if (high > rope_dim - 1)
            high = rope_dim - 1;
        if (low == high)
            high += 0.001;
        float ramp = ((float)j - (float)low) / ((float)high - (float)low);
        if (ramp < 0.0f)
            ramp = 0.0f;
        if (ramp > 1.0f)
            ramp = 1.0f;
        float extra_factor = 1.0f - ramp;
        r->inv_freq[j] = inter * (1.0f - extra_factor) + extra * extra_factor;
    }
}
