/* Command-line flags and config files shared by duet-prefill and duet-decode.
 *
 * Every flag --name VALUE may also be given in a JSON config file
 * (--config FILE) as {"name": value}; flags on the command line win. */
#ifndef DUET_WORKER_OPTS_H
#define DUET_WORKER_OPTS_H

#include <stdint.h>

#include "cache_layout.h"
#include "err.h"

typedef struct {
    const char *role;           /* "prefill" or "decode" */
    char *model;                /* checkpoint directory */
    char *id;                   /* worker id (default: role-pid) */
    char *listen;               /* command socket URL */
    char *events;               /* router's event socket URL (optional for tests); requests may name others */
    uint32_t pages, slots;      /* cache capacity */
    uint32_t max_batch;         /* decode: sequences per step */
    uint32_t token_budget;      /* prefill: tokens per step */
    uint32_t queue_max;         /* prefill: queued requests before OVERLOADED */
    uint32_t wait_timeout_ms;   /* decode: WAITING_FOR_INPUT deadline when Reserve gives none */
    uint32_t heartbeat_ms;
    uint32_t event_idle_ms;     /* an event socket of Reserve/Prefill.event_url unused this long is closed */
    duet_cache_opts_t cache;
    int verify_checksums;
    char *xfer_path;            /* "auto", "rma", "am" */
    /* prefill: HiCache (docs/HICACHE.md); off when both sizes are 0 */
    uint32_t hicache_device_pages;  /* pages of --pages the prefix tree may keep */
    double hicache_host_gib;        /* host tier size in GiB (fractional allowed) */
    int hicache_policy;             /* duet_hicache_policy_t */
    uint32_t hicache_selective_hits;/* write-through-selective: N */
    int device;                     /* where the forward runs: -1 the CPU, N >= 0 CUDA device N */
    uint32_t tp;                    /* tensor-parallel size: devices device .. device+tp-1 */
} duet_worker_opts_t;

/* Defaults, then the config file (if --config), then the flags.  Returns
 * DUET_OK, or an error with a sentence (exit 2 for usage errors). */
duet_status_t duet_worker_opts_parse(duet_worker_opts_t *o, const char *role, int argc, char **argv,
                                     duet_err_t *err);
void duet_worker_opts_fini(duet_worker_opts_t *o);
/* What the options ask of this build: --device cuda needs the CUDA backend, --tp a GPU
 * (DUET_ERR_UNSUPPORTED with the reason). */
duet_status_t duet_worker_opts_check_device(const duet_worker_opts_t *o, duet_err_t *err);
/* "cpu", "cuda:N" or "cuda:N-M" (tensor parallelism) */
const char *duet_worker_device_name(const duet_worker_opts_t *o, char *buf, size_t len);
void duet_worker_opts_usage(const char *role);

#endif
