/* duet-bench-agents: shared types of the load generator (bench_agents.c) and
 * of the checks and reports that follow the load (bench_agents_check.c).
 * docs/BENCH.md describes the tool. */
#ifndef DUET_BENCH_AGENTS_H
#define DUET_BENCH_AGENTS_H

#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define BA_MAX_WORKERS 16
#define BA_MAX_CHAOS 4

/* A growable text buffer, always NUL-terminated; running out of memory ends the bench. */
typedef struct {
    char *s;
    size_t n, cap;
} ba_buf_t;

void ba_buf_add(ba_buf_t *b, const char *s, size_t n);

typedef enum { BA_COMPARE_EXACT, BA_COMPARE_NONE } ba_compare_t;

typedef struct {
    const char *url;        /* router base URL, no trailing slash */
    const char *model;      /* checkpoint for the references */
    const char *generate;   /* duet-generate */
    const char *ref_device; /* duet-generate --device for the references: cpu (default) or cuda[:N] */
    int ref_tp;             /* duet-generate --tp for the references (GPU; 1 by default) */
    const char *driver;     /* duet-driver */
    const char *kv_dtype, *index_k_dtype;
    const char *cache_dir;  /* reference cache */
    const char *json_path, *plot_path;
    const char *scenario;
    const char *workers[BA_MAX_WORKERS]; /* decode workers' control URLs (--worker) */
    int n_workers;
    int concurrency;        /* closed loop: sessions at once */
    double rate;            /* open loop: sessions per second (0: closed loop) */
    int sessions, turns, context, max_tokens, n_tools;
    int thinking, stream;
    double temperature;
    double timeout_s;       /* per request */
    uint64_t seed;
    ba_compare_t compare;
    int jobs;               /* reference processes at once */
    double slo_ttft_ms, slo_itl_ms;
    double settle_s;        /* bound on the wait for idle workers after the load */
    double disconnect_fraction;
    /* chaos: decode worker and Redis */
    double kill_decode_at, redis_restart_at; /* seconds after the start; < 0: off */
    const char *kill_cmd, *restart_cmd, *redis_kill_cmd, *redis_restart_cmd;
    int decode_pid;
    double restart_delay_s; /* between the kill and the restart command */
    double chaos_grace_s;   /* the chaos window lasts this long past the cluster being ready again */
    int test_corrupt_reference; /* hidden: alter this many references (tests the detector) */
    int progress;           /* 1: \r progress line (a terminal); 0: a line every 10 s */
} ba_opts_t;

typedef enum {
    BA_OK = 0,         /* completed (a finish_reason and, streamed, [DONE]) */
    BA_DISCONNECTED,   /* dropped by the bench on purpose (--disconnect-fraction) */
    BA_TIMEOUT,        /* the bench's per-request timeout fired */
    BA_HTTP_ERROR,     /* a status other than 200 */
    BA_STREAM_ERROR,   /* 200, then an SSE error event */
    BA_CONN_ERROR,     /* connection failed or cut before the end */
} ba_outcome_t;

typedef enum { BA_DISC_NONE, BA_DISC_BEFORE_FIRST, BA_DISC_MID_STREAM } ba_disc_t;

typedef struct {
    int session, turn;
    uint64_t seed;
    double t_start, t_first, t_last, t_end; /* seconds since the run began; t_first < 0: no token seen */
    int http_status;
    ba_outcome_t outcome;
    int chaos;              /* failed while a chaos event was under way */
    int32_t *prompt, *out;
    int n_prompt, n_out, cap_out;
    double *gaps;           /* inter-token gaps (s), streamed */
    int n_gaps, cap_gaps;
    char finish[16];
    char dsml_code[48];     /* the first DSML_* warning code, "" when none */
    char rid[64];
    char err[200];
    ba_disc_t disc_plan, disc_done;
    double disc_at;         /* BA_DISC_BEFORE_FIRST: drop at t_start + disc_at unless a token came first */
    int disc_after;         /* BA_DISC_MID_STREAM: drop after this many tokens */
    /* filled by the check */
    int ref_state;          /* 0 not compared, 1 equal, 2 differs, 3 reference failed */
    int first_diff;
    int32_t *ref;
    int n_ref;
} ba_req_t;

typedef struct {
    char kind[24];          /* kill-decode | restart-redis */
    double at_s, killed_s, restarted_s, ready_s; /* < 0: not reached */
    double window_end_s;    /* failures overlapping [killed_s, window_end_s] are caused by it */
    int kill_rc, restart_rc;
    char note[160];
} ba_chaos_t;

typedef struct {
    char name[160];         /* id or URL */
    long pages_used, pages_quarantined, slots_used, slots_quarantined, requests;
    int ok;                 /* the state was read */
} ba_worker_state_t;

typedef struct {
    const char *source;     /* "duet-driver state" or "router /v1/workers" */
    int settled;
    double settle_s;
    ba_worker_state_t w[BA_MAX_WORKERS];
    int n;
    long router_requests;   /* requests the router still holds on workers (GET /v1/workers); -1: unknown */
    char err[200];
} ba_workers_t;

typedef struct {
    ba_opts_t *o;
    ba_req_t **reqs;
    size_t n_reqs, cap_reqs;
    double duration_s;      /* the load phase */
    double t0_wall;         /* wall clock at the start (for the report) */
    ba_chaos_t chaos[BA_MAX_CHAOS];
    int n_chaos;
    ba_workers_t workers;
    int sessions_started, sessions_done;
    long growth_checked, growth_violations; /* prompt length grows from turn to turn */
    /* check results */
    long compared, equal, corrupted, ref_failed, ref_cached, ref_run;
    double ref_s;
} ba_run_t;

/* bench_agents_check.c */
/* Set by SIGINT/SIGTERM: the load stops, and so do the references (those not run count as
 * requests without a reference), and the report is still written. */
extern volatile sig_atomic_t g_stop;

/* Run the references for every completed request and compare. */
duet_status_t ba_check_references(ba_run_t *run, duet_err_t *err);
/* Wait (bounded by o->settle_s) until every decode worker holds nothing; record what they hold. */
void ba_read_workers(ba_run_t *run);
/* Table on stdout, JSON and plot files; returns the exit status (0 clean, 1 not). */
int ba_report(ba_run_t *run);
/* HTTP GET into a malloc'd string (NUL-terminated); NULL on failure. */
char *ba_http_get(const char *url, long timeout_ms, long *status);
/* Run `sh -c cmd` with a deadline; returns its exit status, -1 when it could not run or was killed. */
int ba_run_shell(const char *cmd, double deadline_s);

#endif
