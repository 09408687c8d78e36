/* Small queries over a parsed model config (declared in model_config.h).
 * Only the first num_hidden_layers entries of compress_ratios count: the
 * MTP entries that follow them hold no cache pools. */
#include "model_config.h"

static int n_layers_of(const duet_model_config_t *c)
{
    int n = c->num_hidden_layers;
    if (n < 0)
        return 0;
    return n > DUET_MAX_LAYERS ? DUET_MAX_LAYERS : n;
}

/* -1 when `layer` is out of range. */
int duet_cfg_ratio_layer_index(const duet_model_config_t *c, int layer)
{
    if (layer < 0 || layer >= n_layers_of(c))
        return -1;
    int r = c->compress_ratios[layer], idx = 0;
    for (int i = 0; i < layer; i++)
        if (c->compress_ratios[i] == r)
            idx++;
    return idx;
}

int duet_cfg_count_ratio(const duet_model_config_t *c, int r)
{
    int n = 0, nl = n_layers_of(c);
    for (int i = 0; i < nl; i++)
        if (c->compress_ratios[i] == r)
            n++;
    return n;
}
