/* The tests' small model config for cache and transfer tests: every layer kind (compress
 * ratios [0, 4, 128, 4, 0]), so all six pools exist, with small widths.  Only the fields the
 * cache layouts read are set. */
#ifndef DUET_TESTS_CACHE_FIXTURE_H
#define DUET_TESTS_CACHE_FIXTURE_H

#include <string.h>

#include "model_config.h"

static inline void tiny_config(duet_model_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->hidden_size = 256;
    c->num_hidden_layers = 5;
    c->num_key_value_heads = 1;
    c->head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->index_head_dim = 64;
    c->sliding_window = 128;
    const int r[5] = {0, 4, 128, 4, 0};
    for (int i = 0; i < 5; i++)
        c->compress_ratios[i] = r[i];
    c->n_compress_ratios = 5;
}

#endif
