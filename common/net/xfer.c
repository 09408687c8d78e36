/* UCX data plane (see xfer.h and docs/DATAPLANE.md).
 *
 * Threading: the worker is created UCS_THREAD_MODE_SINGLE and, once the
 * progress thread runs, only that thread calls UCX.  Public calls validate
 * what they can against immutable state (registered pools), then append a
 * command to `cmds` (mutex + eventfd).  The progress thread:
 *
 *   loop: run commands -> ucp_worker_progress until idle -> handle copied AMs
 *         -> reap failed endpoints -> issue puts (per-endpoint window)
 *         -> advance sends (flush, TransferDone) -> check deadlines
 *         -> spin while operations are outstanding, else arm the worker and
 *            epoll (worker efd + command eventfd) up to the next deadline.
 *
 * UCX callbacks (put/flush/AM completion, endpoint error, AM arrival) only
 * count, mark and copy; everything that may call back into UCX happens in
 * the loop body.  A send is freed only when no UCX request refers to it
 * (n_inflight == 0), so nothing leaks or dangles on failure. */
#include "xfer.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "alloc.h"
#include "hash.h"
#include "log.h"
#include "time_util.h"

enum {
    AM_BEGIN = 0x31,      /* {hdr, addr_len, address}: sender announces a transfer */
    AM_DONE = 0x32,       /* {hdr, first_token, n_sums, cached_tokens, am_bytes, sums[]}: TransferDone */
    AM_ABORT_ACK = 0x33,  /* {hdr}: AbortAck, after the flush */
    AM_DATA = 0x34,       /* header {data hdr}, payload: page bytes (AM write path) */
    AM_PING = 0x35,       /* {hdr}: liveness probe, receiver -> sender of its pending requests */
    AM_PONG = 0x36,       /* {hdr}: answer */
};

#define AM_MAGIC 0x31465844u /* "DXF1" */
#define AM_VERSION 2 /* 2: TransferDone carries cached_tokens */
#define DESC_MAGIC 0x31445844u /* "DXD1" */
#define SPIN_NS 200000ull      /* keep polling this long after the last activity */
#define IDLE_SLEEP_MS 50       /* longest sleep: UCX keepalive runs from progress */
#define DEAD_PEER_KEEP_NS (60ull * 1000000000ull)
#define MAX_BLOB 65536u        /* address / rkey bytes */
#define SUM_SEED 0x6475657400ull /* unit checksums start from SUM_SEED ^ fingerprint */
#define STG_LIST_MAX 4096u     /* entries in one staging copy list */
#define STG_ALIGN 256u         /* staging scratch and slots start at multiples of this */
#define NO_STG_SLOT UINT32_MAX

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint64_t sender_id;
    uint64_t epoch;
    char rid[DUET_XFER_RID_MAX];
} am_hdr_t;

typedef struct {
    am_hdr_t h;
    int32_t first_token;
    uint32_t n_sums;
    uint32_t cached_tokens;   /* prompt tokens the sender served from its prefix cache */
    uint32_t reserved;        /* 0 */
    uint64_t am_bytes;        /* bytes sent as AM_DATA before it (0 on the RMA path) */
    /* uint64_t sums[n_sums] */
} am_done_t;

typedef struct {
    am_hdr_t h;
    uint32_t addr_len;
    uint32_t pad;
    /* uint8_t address[addr_len] */
} am_begin_t;

/* Header of one AM_DATA chunk: bytes [offset, offset + len) of a run of
 * `count` receiver units starting at `unit`, in layer `layer` of `pool`. */
typedef struct {
    am_hdr_t h;
    uint32_t pool;
    uint32_t layer;
    uint32_t unit;
    uint32_t count;
    uint64_t offset;
} am_data_hdr_t;

/* ---- internal objects ---- */

typedef struct {
    int registered;
    int device;               /* DUET_XFER_POOL_DEVICE: the engine reads and writes it only through staging */
    duet_xfer_pool_t spec;
    size_t bytes;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
} pool_reg_t;

typedef enum { PEER_UP = 0, PEER_FAILED, PEER_CLOSING, PEER_DEAD } peer_state_t;

typedef struct peer {
    struct peer *next;
    struct duet_xfer *x;      /* back-pointer for the endpoint error callback */
    uint64_t addr_hash;
    uint64_t remote_id;
    ucp_ep_h ep;
    peer_state_t state;
    duet_status_t fail_status;
    char fail_msg[96];
    uint32_t n_inflight;      /* UCX requests on this endpoint */
    uint32_t n_puts;          /* puts among them (the window) */
    uint64_t last_progress_ns;
    uint64_t last_heard_ns;   /* last message from this peer (receiver side) */
    uint64_t ping_sent_ns;    /* probe outstanding since (0: none) */
    uint32_t n_recvs;         /* pending receives bound to this peer */
    am_hdr_t ping_buf, pong_buf;
    void *close_req;
    uint64_t close_deadline_ns;
    uint64_t dead_since_ns;
    uint32_t refs;            /* sends and receives bound to it */
    int rma_host, rma_cuda;   /* UCX gave the endpoint an RMA lane for host / GPU memory */
    int am_tcp;               /* its active messages go over tcp (am_data) */
    int graceful;             /* close with a flush (engine shutdown), not FORCE */
} peer_t;

typedef struct {
    uint32_t local, remote, count;
} run_t;

typedef struct {
    int8_t pool;
    uint32_t layer;
} job_t;

/* Bytes an active message sends by copy over tcp (am_data): the packed datatype's buffer and
 * state, kept by the operation that sends them until it completes. */
typedef struct {
    const void *p;
    size_t n;
} packed_t;

struct send;
/* One data operation in flight: an AM_DATA header must stay valid until the
 * send completes (UCX 1.13 has no COPY_HEADER), so each lives here. */
typedef struct dop {
    struct dop *next_free;
    struct send *t;
    am_data_hdr_t hdr;
    uint32_t slot;            /* staging slot holding the payload (device pools), or NO_STG_SLOT */
    const uint8_t *src;       /* staged AM data: the device bytes and their length */
    uint64_t len;
    packed_t pk;              /* the payload when it goes by copy (am_data) */
} dop_t;

typedef enum {
    ST_PUTS = 0,    /* issuing queued puts */
    ST_FLUSHING,    /* ep flush outstanding */
    ST_FLUSHED,     /* flush done, message to send */
    ST_MSG,         /* TransferDone / AbortAck outstanding */
    ST_MSG_DONE,    /* message handed to UCX */
} send_stage_t;

typedef struct send {
    struct send *next;
    uint64_t tid, user;
    duet_xfer_desc_t desc;
    int dpi[DUET_POOL_COUNT];          /* kind -> index in desc.pools, -1 if absent */
    ucp_rkey_h rkeys[DUET_POOL_COUNT];
    uint32_t *local_pages;
    uint32_t n_pages, local_slot;
    run_t *runs;
    uint32_t n_runs;
    job_t *jobs;
    uint32_t jobs_head, jobs_len, jobs_cap;
    uint32_t cur_run;
    uint64_t cur_off;
    peer_t *peer;
    send_stage_t stage;
    int finish_req, abort_req, started, event_sent;
    int32_t first_token;
    uint32_t cached_tokens;
    duet_status_t status;
    char msg[160];
    uint32_t n_inflight;
    uint64_t bytes;
    uint64_t flush_deadline_ns;
    uint64_t am_bytes;        /* bytes sent as AM_DATA */
    int use_am;               /* pages go as AM_DATA, not ucp_put_nbx (send_start) */
    uint8_t *begin_buf, *msg_buf;
    size_t begin_len, msg_len;
    packed_t msg_pk;          /* msg_buf when it goes by copy (am_data) */
} send_t;

typedef struct inmsg {
    struct inmsg *next;
    unsigned id;
    size_t len;
    uint8_t data[];
} inmsg_t;

typedef struct recv {
    struct recv *next;
    char rid[DUET_XFER_RID_MAX];
    uint64_t epoch, user;
    uint32_t *pages;
    uint32_t n_pages, slot;
    uint64_t deadline_ns;
    peer_t *peer;
    uint64_t peer_id;
    int cancelled, begun;
    uint8_t *unit_bits;       /* paged units of this request (AM writes are checked against it) */
    uint32_t unit_bits_n;
    uint64_t am_bytes;        /* AM_DATA bytes written */
    inmsg_t *pending_done;    /* TransferDone that arrived before all its data */
    uint32_t cached_tokens;   /* from TransferDone, for the RECV event */
} recv_t;

typedef enum {
    CMD_REGISTER, CMD_SEND_BEGIN, CMD_SEND_PUT, CMD_SEND_FINISH, CMD_SEND_ABORT,
    CMD_RECV_EXPECT, CMD_RECV_CANCEL, CMD_STOP,
} cmd_kind_t;

typedef struct cmd {
    struct cmd *next;
    cmd_kind_t kind;
    uint64_t tid;
    int pool;
    uint32_t layer;
    int32_t first_token;
    uint32_t cached_tokens;
    void *obj;
    char rid[DUET_XFER_RID_MAX];
    uint64_t epoch;
    /* synchronous commands (register) */
    int sync, done;
    duet_status_t result;
    duet_err_t err;
} cmd_t;


typedef struct evnode {
    struct evnode *next;
    duet_xfer_event_t ev;
} evnode_t;

struct duet_xfer {
    duet_xfer_opts_t opts;
    char name[48];
    uint64_t id;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_datatype_t packed_dt; /* bytes packed by copy (am_data); 0 until created, or not wanted */
    ucp_address_t *addr;
    size_t addr_len;
    int cuda_capable;
    int fake_device;          /* DUET_XFER_FAKE_DEVICE=1 (tests): device pools are host memory */
    int path;                 /* DUET_XFER_PATH_* in force */
    duet_status_t thread_status; /* opts.thread_init's result (written before the thread's first command) */
    int worker_efd, cmd_efd, ev_efd, epfd;
    pthread_t thread;
    int thread_started;

    /* pools: written by the progress thread during register, then read-only */
    pool_reg_t pools[DUET_POOL_COUNT];
    uint32_t page_tokens;

    pthread_mutex_t cmd_lock;
    cmd_t *cmd_head, *cmd_tail;
    recv_t *new_recvs;        /* expected receives not yet adopted (under cmd_lock) */
    pthread_mutex_t sync_lock;
    pthread_cond_t sync_cond;

    pthread_mutex_t ev_lock;
    pthread_cond_t ev_cond;
    evnode_t *ev_head, *ev_tail;

    _Atomic uint64_t next_tid;

    /* progress-thread state */
    peer_t *peers;
    send_t *sends;
    recv_t *recvs;
    inmsg_t *in_head, *in_tail;
    int stopping;
    dop_t *dop_free;
    recv_t *last_recv;        /* lookup cache for AM_DATA */

    /* staging for device pools (opts.staging; progress thread only): the
     * bounce buffer's first stg_scratch bytes batch checksum reads and AM data
     * received, the rest is stg_nslots slots of stg_slot_bytes for AM data in flight */
    duet_xfer_staging_t staging;
    int have_staging;
    size_t stg_scratch, stg_slot_bytes;
    uint32_t stg_nslots, stg_nfree;
    uint32_t *stg_free;       /* free slot stack */
    duet_xfer_copy_t *stg_list;
    dop_t **stg_batch;

    struct {
        _Atomic uint64_t puts, put_bytes, sends_ok, sends_failed, sends_aborted, recvs_ok,
            recvs_failed, checksum_failures, stale_messages, bad_messages, peers_failed,
            peers_timed_out, ops_inflight, sends_active, recvs_pending;
    } st;
};

#define STAT_ADD(x, f, n) atomic_fetch_add_explicit(&(x)->st.f, (n), memory_order_relaxed)
#define STAT_SUB(x, f, n) atomic_fetch_sub_explicit(&(x)->st.f, (n), memory_order_relaxed)

static int kind_is_paged(int k)
{
    return k == DUET_POOL_C4_KV || k == DUET_POOL_C4_INDEX_K || k == DUET_POOL_C128_KV;
}

/* ---------------------------------------------------------------- events */

static void emit(duet_xfer_t *x, const duet_xfer_event_t *ev)
{
    evnode_t *n = malloc(sizeof *n);
    if (!n) {
        duet_error("xfer %s: out of memory, event for %s lost", x->name, ev->rid);
        return;
    }
    n->next = NULL;
    n->ev = *ev;
    pthread_mutex_lock(&x->ev_lock);
    if (x->ev_tail)
        x->ev_tail->next = n;
    else
        x->ev_head = n;
    x->ev_tail = n;
    uint64_t one = 1;
    ssize_t w = write(x->ev_efd, &one, sizeof one);
    (void)w;
    pthread_cond_broadcast(&x->ev_cond);
    pthread_mutex_unlock(&x->ev_lock);
}

uint32_t duet_xfer_poll(duet_xfer_t *x, duet_xfer_event_t *ev, uint32_t max)
{
    uint32_t n = 0;
    pthread_mutex_lock(&x->ev_lock);
    while (n < max && x->ev_head) {
        evnode_t *e = x->ev_head;
        x->ev_head = e->next;
        if (!x->ev_head)
            x->ev_tail = NULL;
        ev[n++] = e->ev;
        free(e);
    }
    if (!x->ev_head) {
        uint64_t v;
        ssize_t r = read(x->ev_efd, &v, sizeof v);
        (void)r;
    }
    pthread_mutex_unlock(&x->ev_lock);
    return n;
}

duet_status_t duet_xfer_wait(duet_xfer_t *x, duet_xfer_event_t *ev, uint32_t timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&x->ev_lock);
    while (!x->ev_head) {
        if (pthread_cond_timedwait(&x->ev_cond, &x->ev_lock, &ts) == ETIMEDOUT)
            break;
    }
    int have = x->ev_head != NULL;
    pthread_mutex_unlock(&x->ev_lock);
    if (!have)
        return DUET_ERR_TIMEOUT;
    duet_xfer_poll(x, ev, 1);
    return DUET_OK;
}

int duet_xfer_event_fd(const duet_xfer_t *x)
{
    return x->ev_efd;
}

void duet_xfer_stats(const duet_xfer_t *x, duet_xfer_stats_t *o)
{
    duet_xfer_t *m = (duet_xfer_t *)x;
#define LD(f) o->f = atomic_load_explicit(&m->st.f, memory_order_relaxed)
    LD(puts); LD(put_bytes); LD(sends_ok); LD(sends_failed); LD(sends_aborted); LD(recvs_ok);
    LD(recvs_failed); LD(checksum_failures); LD(stale_messages); LD(bad_messages);
    LD(peers_failed); LD(peers_timed_out); LD(ops_inflight); LD(sends_active); LD(recvs_pending);
#undef LD
}

/* -------------------------------------------------------------- commands */

static void cmd_push(duet_xfer_t *x, cmd_t *c)
{
    c->next = NULL;
    pthread_mutex_lock(&x->cmd_lock);
    if (x->cmd_tail)
        x->cmd_tail->next = c;
    else
        x->cmd_head = c;
    x->cmd_tail = c;
    pthread_mutex_unlock(&x->cmd_lock);
    uint64_t one = 1;
    ssize_t w = write(x->cmd_efd, &one, sizeof one);
    (void)w;
}

static duet_status_t cmd_run_sync(duet_xfer_t *x, cmd_t *c, duet_err_t *err)
{
    c->sync = 1;
    cmd_push(x, c);
    pthread_mutex_lock(&x->sync_lock);
    while (!c->done)
        pthread_cond_wait(&x->sync_cond, &x->sync_lock);
    pthread_mutex_unlock(&x->sync_lock);
    duet_status_t st = c->result;
    if (st != DUET_OK && err)
        *err = c->err;
    free(c);
    return st;
}

static void cmd_complete_sync(duet_xfer_t *x, cmd_t *c)
{
    pthread_mutex_lock(&x->sync_lock);
    c->done = 1;
    pthread_cond_broadcast(&x->sync_cond);
    pthread_mutex_unlock(&x->sync_lock);
}

static cmd_t *cmd_new(cmd_kind_t kind)
{
    cmd_t *c = DUET_NEW(cmd_t);
    if (c)
        c->kind = kind;
    return c;
}

/* ----------------------------------------------------------------- peers */

static void peer_fail(duet_xfer_t *x, peer_t *p, duet_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Mark a peer failed (callable from UCX callbacks); reap_peers() does the rest. */
static void peer_fail(duet_xfer_t *x, peer_t *p, duet_status_t st, const char *fmt, ...)
{
    if (p->state != PEER_UP)
        return;
    p->state = PEER_FAILED;
    p->fail_status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->fail_msg, sizeof p->fail_msg, fmt, ap);
    va_end(ap);
    STAT_ADD(x, peers_failed, 1);
    if (st == DUET_ERR_TIMEOUT)
        STAT_ADD(x, peers_timed_out, 1);
    duet_warn("xfer %s: peer %016" PRIx64 " failed: %s (%s)", x->name, p->remote_id, p->fail_msg,
              duet_status_code(st));
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    peer_t *p = arg;
    (void)ep;
    peer_fail(p->x, p, DUET_ERR_PEER, "endpoint error: %s", ucs_status_string(status));
}

/* Which hardware RMA lanes UCX gave the endpoint ("rma_bw#" lines of its lane
 * table): one on a CUDA transport (cuda_ipc: GPU memory to GPU memory) sets
 * *cuda, any other (rc, cma, ...) *host.  Without a lane for the memory at hand,
 * UCX 1.13 emulates puts over active messages, and its emulation aborts the
 * target process when the origin dies mid-put (ucp_put_handler -> ucs_fatal
 * "unexpected error") and reads GPU memory with memcpy, so duet then writes
 * pages with its own AM_DATA messages instead. */
static void ep_lanes(ucp_ep_h ep, int *host, int *cuda, int *am_tcp)
{
    char *buf = NULL;
    size_t len = 0;
    *host = *cuda = *am_tcp = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    ucp_ep_print_info(ep, f);
    fclose(f);
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (strstr(line, "rma_bw#")) {
            if (strstr(line, "cuda"))
                *cuda = 1;
            else
                *host = 1;
        }
        /* "lane[0]:  0:tcp/lo.0 md[0] -> md[0]/tcp/sysdev[255] am am_bw#0 wireup" */
        if (strstr(line, "lane[") && strstr(line, ":tcp/") && (strstr(line, " am ") || strstr(line, " am_bw#")))
            *am_tcp = 1;
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
}

/* UCX's tcp transport completes an active-message zero-copy send twice when the socket fails
 * while the message is half written (every release since 1.10; docs/DATAPLANE.md), and a UCX
 * built with assertions, as Debian 12's is, aborts the process on it.  Page data and
 * completion messages to a peer reached over tcp therefore go through a packed datatype,
 * which UCX can only send by copy: the same bytes, one more copy, on the slowest transport
 * (DUET_XFER_TCP_COPY=0 in the environment keeps zero-copy, for a UCX without the defect). */
/* The buffer UCX is handed is the operation's packed_t, which is also the pack state: no
 * allocation a message. */
static void *packed_start(void *ctx, const void *buf, size_t count)
{
    (void)ctx;
    (void)count;
    return (void *)(uintptr_t)buf;
}

static void *packed_start_unpack(void *ctx, void *buf, size_t count)
{
    return packed_start(ctx, buf, count); /* never received this way: receivers take bytes */
}

static size_t packed_size(void *state) { return ((const packed_t *)state)->n; }

static size_t packed_pack(void *state, size_t offset, void *dest, size_t max)
{
    const packed_t *pk = state;
    size_t n = pk->n - offset < max ? pk->n - offset : max;
    memcpy(dest, (const uint8_t *)pk->p + offset, n);
    return n;
}

static ucs_status_t packed_unpack(void *state, size_t offset, const void *src, size_t len)
{
    const packed_t *pk = state;
    if (offset + len > pk->n)
        return UCS_ERR_MESSAGE_TRUNCATED;
    memcpy((uint8_t *)(uintptr_t)pk->p + offset, src, len);
    return UCS_OK;
}

static void packed_finish(void *state) { (void)state; }

static const ucp_generic_dt_ops_t packed_ops = {
    .start_pack = packed_start,
    .start_unpack = packed_start_unpack,
    .packed_size = packed_size,
    .pack = packed_pack,
    .unpack = packed_unpack,
    .finish = packed_finish,
};

/* The data to hand ucp_am_send_nbx for buf (len bytes) to peer p: buf itself, or over tcp pk
 * (kept by the caller's operation until it completes) packed by copy, the memory handle and
 * type then not applying (the copy reads host memory). */
static const void *am_data(duet_xfer_t *x, const peer_t *p, ucp_request_param_t *prm, packed_t *pk,
                           const void *buf, size_t len)
{
    if (!p->am_tcp || !x->packed_dt)
        return buf;
    prm->op_attr_mask &= ~(uint32_t)(UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FIELD_MEMORY_TYPE);
    prm->op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    prm->datatype = x->packed_dt;
    *pk = (packed_t){buf, len};
    return pk;
}

/* Find the live peer at `addr` or connect to it (error-handling mode PEER).
 * A worker address is unique to one process life, so a dead peer stays dead:
 * NULL with its status. */
static peer_t *peer_get(duet_xfer_t *x, const uint8_t *addr, size_t len, uint64_t remote_id,
                        duet_status_t *st, char *msg, size_t msg_len)
{
    uint64_t h = duet_hash64(addr, len, 0x7065657200ull);
    peer_t *dead = NULL;
    for (peer_t *p = x->peers; p; p = p->next) {
        if (p->addr_hash != h)
            continue;
        if (p->state == PEER_UP)
            return p;
        dead = p;
    }
    if (dead) {
        *st = dead->fail_status != DUET_OK ? dead->fail_status : DUET_ERR_PEER;
        snprintf(msg, msg_len, "peer %016" PRIx64 " failed earlier: %s", dead->remote_id,
                 dead->fail_msg);
        return NULL;
    }
    peer_t *p = DUET_NEW(peer_t);
    if (!p) {
        *st = DUET_ERR_NOMEM;
        snprintf(msg, msg_len, "out of memory for a peer");
        return NULL;
    }
    p->x = x;
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_err_cb, .arg = p},
    };
    ucs_status_t s = ucp_ep_create(x->worker, &ep, &p->ep);
    if (s != UCS_OK) {
        free(p);
        *st = DUET_ERR_PEER;
        snprintf(msg, msg_len, "ucp_ep_create: %s", ucs_status_string(s));
        return NULL;
    }
    p->addr_hash = h;
    p->remote_id = remote_id;
    p->state = PEER_UP;
    ep_lanes(p->ep, &p->rma_host, &p->rma_cuda, &p->am_tcp);
    p->last_progress_ns = duet_time_ns();
    p->last_heard_ns = p->last_progress_ns;
    p->next = x->peers;
    x->peers = p;
    duet_debug("xfer %s: endpoint to %016" PRIx64 ", RMA lanes: host %s, GPU %s; active messages over tcp: %s",
               x->name, remote_id, p->rma_host ? "yes" : "no", p->rma_cuda ? "yes" : "no", p->am_tcp ? "yes" : "no");
    return p;
}

/* Account one completed UCX request on a peer. */
static void peer_op_done(duet_xfer_t *x, peer_t *p, int is_put)
{
    p->n_inflight--;
    if (is_put)
        p->n_puts--;
    p->last_progress_ns = duet_time_ns();
    STAT_SUB(x, ops_inflight, 1);
}

static void peer_op_start(duet_xfer_t *x, peer_t *p, int is_put)
{
    if (p->n_inflight == 0)
        p->last_progress_ns = duet_time_ns();
    p->n_inflight++;
    if (is_put)
        p->n_puts++;
    STAT_ADD(x, ops_inflight, 1);
}

/* ----------------------------------------------------------------- sends */

static dop_t *dop_get(duet_xfer_t *x, send_t *t)
{
    dop_t *o = x->dop_free;
    if (o)
        x->dop_free = o->next_free;
    else if (!(o = malloc(sizeof *o)))
        return NULL;
    o->t = t;
    o->slot = NO_STG_SLOT;
    o->src = NULL;
    o->len = 0;
    return o;
}

/* Free a data operation and the staging slot it holds. */
static void dop_put(duet_xfer_t *x, dop_t *o)
{
    if (o->slot != NO_STG_SLOT) {
        x->stg_free[x->stg_nfree++] = o->slot;
        o->slot = NO_STG_SLOT;
    }
    o->next_free = x->dop_free;
    x->dop_free = o;
}

static uint8_t *stg_slot_addr(const duet_xfer_t *x, uint32_t slot)
{
    return (uint8_t *)x->staging.host + x->stg_scratch + (size_t)slot * x->stg_slot_bytes;
}

static void send_set_status(send_t *t, duet_status_t st, const char *msg)
{
    if (t->status != DUET_OK)
        return;
    t->status = st;
    snprintf(t->msg, sizeof t->msg, "%s", msg);
    t->jobs_len = 0;
}

/* Completion of a put or an AM_DATA send. */
static void data_cb(void *request, ucs_status_t status, void *user_data)
{
    dop_t *o = user_data;
    send_t *t = o->t;
    duet_xfer_t *x = t->peer->x;
    dop_put(x, o);
    t->n_inflight--;
    peer_op_done(x, t->peer, 1);
    if (status != UCS_OK && status != UCS_ERR_CANCELED)
        peer_fail(x, t->peer, DUET_ERR_PEER, "page write failed: %s", ucs_status_string(status));
    if (status != UCS_OK)
        send_set_status(t, t->peer->state != PEER_UP ? t->peer->fail_status : DUET_ERR_PEER,
                        "page write did not complete");
    ucp_request_free(request);
}

/* BEGIN, flush and message requests: same accounting, stage moves on success. */
static void begin_cb(void *request, ucs_status_t status, void *user_data)
{
    send_t *t = user_data;
    duet_xfer_t *x = t->peer->x;
    t->n_inflight--;
    peer_op_done(x, t->peer, 0);
    if (status != UCS_OK && status != UCS_ERR_CANCELED)
        peer_fail(x, t->peer, DUET_ERR_PEER, "transfer announcement failed: %s",
                  ucs_status_string(status));
    ucp_request_free(request);
}

/* A flush or the completion message finished: move to `next` or fail the send. */
static void stage_done(void *request, ucs_status_t status, send_t *t, int next, const char *what)
{
    duet_xfer_t *x = t->peer->x;
    t->n_inflight--;
    peer_op_done(x, t->peer, 0);
    if (status == UCS_OK) {
        t->stage = next;
    } else {
        if (status != UCS_ERR_CANCELED)
            peer_fail(x, t->peer, DUET_ERR_PEER, "%s failed: %s", what, ucs_status_string(status));
        char msg[96];
        snprintf(msg, sizeof msg, "%s did not complete", what);
        send_set_status(t, t->peer->state != PEER_UP ? t->peer->fail_status : DUET_ERR_PEER, msg);
    }
    ucp_request_free(request);
}

static void flush_cb(void *request, ucs_status_t status, void *user_data)
{
    stage_done(request, status, user_data, ST_FLUSHED, "flush");
}

static void msg_cb(void *request, ucs_status_t status, void *user_data)
{
    stage_done(request, status, user_data, ST_MSG_DONE, "completion message");
}

/* Start a UCX request on t's endpoint with callback `cb`.  Returns 1 when it
 * is in flight, 0 when it completed at once, -1 on an immediate error (peer
 * marked failed). */
static int send_track(duet_xfer_t *x, send_t *t, ucs_status_ptr_t sp, int is_put, const char *what)
{
    if (sp == NULL)
        return 0;
    if (UCS_PTR_IS_ERR(sp)) {
        ucs_status_t s = UCS_PTR_STATUS(sp);
        peer_fail(x, t->peer, DUET_ERR_PEER, "%s: %s", what, ucs_status_string(s));
        send_set_status(t, t->peer->fail_status, t->peer->fail_msg);
        return -1;
    }
    t->n_inflight++;
    peer_op_start(x, t->peer, is_put);
    return 1;
}

static uint32_t sums_count(const duet_xfer_t *x, uint32_t n_pages, uint32_t slot)
{
    uint32_t n = 0;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        if (!x->pools[k].registered)
            continue;
        n += kind_is_paged(k) ? n_pages : (slot != DUET_XFER_NO_SLOT ? 1u : 0u);
    }
    return n;
}

uint64_t duet_xfer_unit_checksum(const uint8_t *pool_base, const duet_cache_layout_t *layout,
                                 uint32_t n_units, uint32_t unit)
{
    uint64_t h = SUM_SEED ^ layout->fingerprint;
    for (uint32_t l = 0; l < layout->n_layers; l++) {
        const uint8_t *p = pool_base + ((size_t)l * n_units + unit) * layout->page_bytes;
        h = duet_hash64(p, layout->page_bytes, h);
    }
    return h;
}

/* duet_xfer_unit_checksum of `n` units of a device pool: the unit pages
 * (unit-major, then layer) are copied into the staging scratch in batches by
 * the caller's d2h and hashed there, in the same order. */
static duet_status_t sums_staged(duet_xfer_t *x, const pool_reg_t *r, const uint32_t *units, uint32_t n,
                                 uint64_t *out)
{
    const duet_cache_layout_t *l = &r->spec.layout;
    size_t pb = (size_t)l->page_bytes;
    size_t per = x->stg_scratch / pb; /* >= 1: checked at registration */
    if (per > STG_LIST_MAX)
        per = STG_LIST_MAX;
    uint8_t *scratch = x->staging.host;
    const uint8_t *base = r->spec.base;
    uint32_t cu = 0, cl = 0; /* next (unit, layer) to copy */
    uint32_t hu = 0, hl = 0; /* next to hash */
    uint64_t h = 0;
    while (cu < n) {
        uint32_t m = 0;
        while (m < per && cu < n) {
            x->stg_list[m] = (duet_xfer_copy_t){
                .dst = scratch + (size_t)m * pb,
                .src = base + ((size_t)cl * r->spec.n_units + units[cu]) * pb,
                .bytes = pb,
            };
            m++;
            if (++cl == l->n_layers) {
                cl = 0;
                cu++;
            }
        }
        duet_status_t st = x->staging.d2h(x->staging.ctx, x->stg_list, m);
        if (st != DUET_OK)
            return st;
        for (uint32_t i = 0; i < m; i++) {
            if (hl == 0)
                h = SUM_SEED ^ l->fingerprint;
            h = duet_hash64(scratch + (size_t)i * pb, pb, h);
            if (++hl == l->n_layers) {
                hl = 0;
                out[hu++] = h;
            }
        }
    }
    return DUET_OK;
}

/* Checksums of the local units, pools in kind order, pages in token order.
 * Host pools are read in place; device pools through the staging ops (whose
 * status is returned when a copy fails). */
static duet_status_t sums_compute(duet_xfer_t *x, const uint32_t *pages, uint32_t n_pages, uint32_t slot,
                                  uint64_t *out)
{
    uint32_t j = 0;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const pool_reg_t *r = &x->pools[k];
        if (!r->registered)
            continue;
        if (r->device) {
            uint32_t n = kind_is_paged(k) ? n_pages : (slot != DUET_XFER_NO_SLOT ? 1u : 0u);
            duet_status_t st = sums_staged(x, r, kind_is_paged(k) ? pages : &slot, n, out + j);
            if (st != DUET_OK)
                return st;
            j += n;
            continue;
        }
        if (kind_is_paged(k)) {
            for (uint32_t i = 0; i < n_pages; i++)
                out[j++] = duet_xfer_unit_checksum(r->spec.base, &r->spec.layout, r->spec.n_units,
                                                   pages[i]);
        } else if (slot != DUET_XFER_NO_SLOT) {
            out[j++] = duet_xfer_unit_checksum(r->spec.base, &r->spec.layout, r->spec.n_units, slot);
        }
    }
    return DUET_OK;
}

static void hdr_fill(const duet_xfer_t *x, am_hdr_t *h, unsigned type, const char *rid, uint64_t epoch)
{
    memset(h, 0, sizeof *h);
    h->magic = AM_MAGIC;
    h->version = AM_VERSION;
    h->type = (uint16_t)type;
    h->sender_id = x->id;
    h->epoch = epoch;
    snprintf(h->rid, sizeof h->rid, "%s", rid);
}

static void send_free(duet_xfer_t *x, send_t *t)
{
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        if (t->rkeys[k])
            ucp_rkey_destroy(t->rkeys[k]);
    if (t->peer)
        t->peer->refs--;
    duet_xfer_desc_fini(&t->desc);
    free(t->local_pages);
    free(t->runs);
    free(t->jobs);
    free(t->begin_buf);
    free(t->msg_buf);
    free(t);
    STAT_SUB(x, sends_active, 1);
}

/* Report the end of t; frees t first when no UCX request refers to it (so a
 * caller that sees the event also sees the engine without it).  Returns 1
 * when t was freed. */
static int send_end(duet_xfer_t *x, send_t *t, duet_status_t st)
{
    duet_xfer_event_t ev = {
        .kind = DUET_XFER_EV_SEND,
        .status = st,
        .tid = t->tid,
        .user = t->user,
        .epoch = t->desc.epoch,
        .first_token = t->first_token,
        .peer_id = t->desc.worker_id,
        .bytes = t->bytes,
    };
    snprintf(ev.rid, sizeof ev.rid, "%s", t->desc.rid);
    snprintf(ev.msg, sizeof ev.msg, "%s", st == DUET_OK ? "transfer done" : t->msg);
    if (st == DUET_OK)
        STAT_ADD(x, sends_ok, 1);
    else if (st == DUET_ERR_ABORTED)
        STAT_ADD(x, sends_aborted, 1);
    else
        STAT_ADD(x, sends_failed, 1);
    t->event_sent = 1;
    int freed = 0;
    if (t->n_inflight == 0) {
        send_free(x, t);
        freed = 1;
    }
    emit(x, &ev);
    return freed;
}

/* Connect, unpack remote keys, announce the transfer. */
static void send_start(duet_xfer_t *x, send_t *t)
{
    duet_status_t st = DUET_OK;
    char msg[160] = "";
    t->started = 1;
    t->peer = peer_get(x, t->desc.address, t->desc.address_len, t->desc.worker_id, &st, msg,
                       sizeof msg);
    if (!t->peer) {
        send_set_status(t, st, msg);
        return;
    }
    t->peer->refs++;
    /* how this transfer writes pages: puts when UCX has an RMA lane for memory of the kind on both
     * sides (GPU to GPU: cuda_ipc; host to host: rc, cma), active messages otherwise -- and always
     * when the two sides' pools are of different kinds (a GPU pool into a host pool or back) */
    int local_dev = 0, remote_dev = 0, mixed = 0;
    for (uint32_t i = 0; i < t->desc.n_pools; i++) {
        const duet_xfer_pool_desc_t *pd = &t->desc.pools[i];
        int ld = x->pools[pd->kind].device, rd = (pd->flags & DUET_XFER_POOL_DEVICE) != 0;
        mixed |= ld != rd;
        local_dev |= ld;
        remote_dev |= rd;
    }
    mixed |= local_dev != remote_dev;
    t->use_am = x->path == DUET_XFER_PATH_AM ||
                (x->path == DUET_XFER_PATH_AUTO &&
                 (mixed || !(local_dev ? t->peer->rma_cuda : t->peer->rma_host)));
    for (uint32_t i = 0; i < t->desc.n_pools; i++) {
        const duet_xfer_pool_desc_t *pd = &t->desc.pools[i];
        ucs_status_t s = ucp_ep_rkey_unpack(t->peer->ep, pd->rkey, &t->rkeys[pd->kind]);
        if (s != UCS_OK) {
            t->rkeys[pd->kind] = NULL;
            snprintf(msg, sizeof msg, "remote key of pool %s: %s", duet_pool_kind_name(pd->kind),
                     ucs_status_string(s));
            send_set_status(t, DUET_ERR_PROTOCOL, msg);
            return;
        }
    }
    t->begin_len = sizeof(am_begin_t) + x->addr_len;
    t->begin_buf = calloc(1, t->begin_len);
    if (!t->begin_buf) {
        send_set_status(t, DUET_ERR_NOMEM, "out of memory");
        return;
    }
    am_begin_t *b = (am_begin_t *)t->begin_buf;
    hdr_fill(x, &b->h, AM_BEGIN, t->desc.rid, t->desc.epoch);
    b->addr_len = (uint32_t)x->addr_len;
    memcpy(t->begin_buf + sizeof *b, x->addr, x->addr_len);
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER,
        .cb.send = begin_cb,
        .user_data = t,
    };
    send_track(x, t, ucp_am_send_nbx(t->peer->ep, AM_BEGIN, NULL, 0, t->begin_buf, t->begin_len, &p),
               0, "announce");
}

static int send_jobs_push(send_t *t, int pool, uint32_t layer)
{
    if (t->jobs_len == t->jobs_cap) {
        uint32_t cap = t->jobs_cap ? t->jobs_cap * 2 : 64;
        job_t *j = duet_malloc_array(cap, sizeof *j);
        if (!j)
            return -1;
        for (uint32_t i = 0; i < t->jobs_len; i++)
            j[i] = t->jobs[(t->jobs_head + i) % t->jobs_cap];
        free(t->jobs);
        t->jobs = j;
        t->jobs_cap = cap;
        t->jobs_head = 0;
    }
    t->jobs[(t->jobs_head + t->jobs_len) % t->jobs_cap] = (job_t){.pool = (int8_t)pool, .layer = layer};
    t->jobs_len++;
    return 0;
}

/* Issue the AM page messages planned from a device pool: one d2h for the
 * whole batch into their staging slots, then the sends from the slots. */
static void send_issue_staged(duet_xfer_t *x, send_t *t, uint32_t n)
{
    peer_t *p = t->peer;
    for (uint32_t i = 0; i < n; i++) {
        dop_t *o = x->stg_batch[i];
        x->stg_list[i] = (duet_xfer_copy_t){.dst = stg_slot_addr(x, o->slot), .src = o->src, .bytes = o->len};
    }
    duet_status_t st = x->staging.d2h(x->staging.ctx, x->stg_list, n);
    if (st != DUET_OK) {
        for (uint32_t i = 0; i < n; i++)
            dop_put(x, x->stg_batch[i]);
        send_set_status(t, st, "page data: staging copy out of device memory failed");
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        dop_t *o = x->stg_batch[i];
        if (t->status != DUET_OK || p->state != PEER_UP) {
            dop_put(x, o);
            continue;
        }
        uint64_t len = o->len;
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS |
                            UCP_OP_ATTR_FIELD_MEMORY_TYPE,
            .flags = UCP_AM_SEND_FLAG_EAGER,
            .cb.send = data_cb,
            .user_data = o,
            .memory_type = UCS_MEMORY_TYPE_HOST, /* the pinned bounce buffer: no detection */
        };
        const void *data = am_data(x, p, &prm, &o->pk, stg_slot_addr(x, o->slot), len);
        ucs_status_ptr_t sp = ucp_am_send_nbx(p->ep, AM_DATA, &o->hdr, sizeof o->hdr, data, len, &prm);
        int tr = send_track(x, t, sp, 1, "page message");
        if (tr <= 0)
            dop_put(x, o);
        if (tr < 0)
            continue;
        t->am_bytes += len;
        t->bytes += len;
        STAT_ADD(x, puts, 1);
        STAT_ADD(x, put_bytes, len);
    }
}

/* Issue queued puts of t while its endpoint's window has room.  AM data from a
 * device pool is planned into staging slots (while slots are free) and issued
 * as one staged batch at the end. */
static void send_issue(duet_xfer_t *x, send_t *t)
{
    peer_t *p = t->peer;
    uint32_t nb = 0; /* staged operations planned */
    while (t->jobs_len > 0 && t->status == DUET_OK && p->state == PEER_UP &&
           p->n_puts + nb < x->opts.max_inflight) {
        job_t *j = &t->jobs[t->jobs_head];
        const pool_reg_t *r = &x->pools[j->pool];
        const duet_xfer_pool_desc_t *pd = &t->desc.pools[t->dpi[j->pool]];
        const run_t *runs = t->runs;
        uint32_t n_runs = t->n_runs;
        run_t slot_run = {t->local_slot, t->desc.slot, 1};
        if (!kind_is_paged(j->pool)) {
            runs = &slot_run;
            n_runs = t->local_slot != DUET_XFER_NO_SLOT ? 1 : 0;
        }
        if (t->cur_run >= n_runs) {
            t->jobs_head = (t->jobs_head + 1) % t->jobs_cap;
            t->jobs_len--;
            t->cur_run = 0;
            t->cur_off = 0;
            continue;
        }
        int staged = t->use_am && r->device;
        if (staged && (x->stg_nfree == 0 || nb == STG_LIST_MAX))
            break; /* every slot is in flight: completions free them */
        const run_t *rn = &runs[t->cur_run];
        uint64_t pb = r->spec.layout.page_bytes;
        uint64_t run_bytes = (uint64_t)rn->count * pb;
        uint64_t len = run_bytes - t->cur_off;
        uint64_t chunk = t->use_am ? x->opts.am_chunk_bytes : x->opts.max_put_bytes;
        if (len > chunk)
            len = chunk;
        uint8_t *laddr = (uint8_t *)r->spec.base +
                         ((uint64_t)j->layer * r->spec.n_units + rn->local) * pb + t->cur_off;
        dop_t *o = dop_get(x, t);
        if (!o) {
            send_set_status(t, DUET_ERR_NOMEM, "out of memory for a data operation");
            break;
        }
        ucs_status_ptr_t sp;
        if (t->use_am) {
            hdr_fill(x, &o->hdr.h, AM_DATA, t->desc.rid, t->desc.epoch);
            o->hdr.pool = (uint32_t)j->pool;
            o->hdr.layer = j->layer;
            o->hdr.unit = rn->remote;
            o->hdr.count = rn->count;
            o->hdr.offset = t->cur_off;
            if (staged) {
                o->slot = x->stg_free[--x->stg_nfree];
                o->src = laddr;
                o->len = len;
                x->stg_batch[nb++] = o;
                t->cur_off += len;
                if (t->cur_off == run_bytes) {
                    t->cur_off = 0;
                    t->cur_run++;
                }
                continue;
            }
            ucp_request_param_t prm = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMH,
                .flags = UCP_AM_SEND_FLAG_EAGER,
                .cb.send = data_cb,
                .user_data = o,
                .memh = r->memh,
            };
            const void *data = am_data(x, p, &prm, &o->pk, laddr, len);
            sp = ucp_am_send_nbx(p->ep, AM_DATA, &o->hdr, sizeof o->hdr, data, len, &prm);
        } else {
            uint64_t raddr = pd->remote_base + ((uint64_t)j->layer * pd->n_units + rn->remote) * pb +
                             t->cur_off;
            ucp_request_param_t prm = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                UCP_OP_ATTR_FIELD_MEMH,
                .cb.send = data_cb,
                .user_data = o,
                .memh = r->memh,
            };
            sp = ucp_put_nbx(p->ep, laddr, len, raddr, t->rkeys[j->pool], &prm);
        }
        int tr = send_track(x, t, sp, 1, t->use_am ? "page message" : "put");
        if (tr <= 0)
            dop_put(x, o);
        if (tr < 0)
            break;
        if (t->use_am)
            t->am_bytes += len;
        t->bytes += len;
        STAT_ADD(x, puts, 1);
        STAT_ADD(x, put_bytes, len);
        t->cur_off += len;
        if (t->cur_off == run_bytes) {
            t->cur_off = 0;
            t->cur_run++;
        }
    }
    if (nb)
        send_issue_staged(x, t, nb);
}

/* Move a send through its stages; frees it once it has ended and no UCX
 * request refers to it.  Returns 1 when t was freed. */
static int send_advance(duet_xfer_t *x, send_t *t, uint64_t now)
{
    peer_t *p = t->peer;
    if (t->status == DUET_OK && p && p->state != PEER_UP)
        send_set_status(t, p->fail_status, p->fail_msg);
    if (t->status != DUET_OK) {
        t->jobs_len = 0;
        if (t->n_inflight == 0 || (p && p->state == PEER_DEAD && now > p->close_deadline_ns)) {
            if (!t->event_sent)
                return send_end(x, t, t->status);
            if (t->n_inflight == 0) {
                send_free(x, t);
                return 1;
            }
        }
        return 0;
    }
    if (!t->started)
        return 0;
    send_issue(x, t);
    if (t->status != DUET_OK)
        return 0;
    int ending = t->finish_req || t->abort_req;
    if (t->stage == ST_PUTS && ending && t->jobs_len == 0 && t->n_inflight == 0) {
        /* every put issued has completed locally; the flush makes them land */
        const char *rid = t->desc.rid;
        if (t->abort_req) {
            t->msg_len = sizeof(am_hdr_t);
            t->msg_buf = calloc(1, t->msg_len);
            if (t->msg_buf)
                hdr_fill(x, (am_hdr_t *)t->msg_buf, AM_ABORT_ACK, rid, t->desc.epoch);
        } else {
            uint32_t n = x->opts.skip_checksums ? 0 : sums_count(x, t->n_pages, t->local_slot);
            t->msg_len = sizeof(am_done_t) + (size_t)n * sizeof(uint64_t);
            t->msg_buf = calloc(1, t->msg_len);
            if (t->msg_buf) {
                am_done_t *d = (am_done_t *)t->msg_buf;
                hdr_fill(x, &d->h, AM_DONE, rid, t->desc.epoch);
                d->first_token = t->first_token;
                d->cached_tokens = t->cached_tokens;
                d->n_sums = n;
                d->am_bytes = t->am_bytes;
                duet_status_t cs = DUET_OK;
                if (n)
                    cs = sums_compute(x, t->local_pages, t->n_pages, t->local_slot,
                                      (uint64_t *)(t->msg_buf + sizeof *d));
                if (cs != DUET_OK) {
                    send_set_status(t, cs, "checksums: staging copy out of device memory failed");
                    return 0;
                }
            }
        }
        if (!t->msg_buf) {
            send_set_status(t, DUET_ERR_NOMEM, "out of memory");
            return 0;
        }
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = flush_cb,
            .user_data = t,
        };
        t->stage = ST_FLUSHING;
        t->flush_deadline_ns = now + (uint64_t)x->opts.timeout_ms * 1000000ull;
        int r = send_track(x, t, ucp_ep_flush_nbx(p->ep, &prm), 0, "flush");
        if (r == 0)
            t->stage = ST_FLUSHED;
        if (r < 0)
            return 0;
    }
    if (t->stage == ST_FLUSHING && now > t->flush_deadline_ns) {
        peer_fail(x, p, DUET_ERR_TIMEOUT, "flush did not complete in %u ms", x->opts.timeout_ms);
        send_set_status(t, DUET_ERR_TIMEOUT, p->fail_msg);
        return 0;
    }
    if (t->stage == ST_FLUSHED) {
        unsigned id = t->abort_req ? AM_ABORT_ACK : AM_DONE;
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_FLAGS,
            .flags = UCP_AM_SEND_FLAG_EAGER,
            .cb.send = msg_cb,
            .user_data = t,
        };
        const void *data = am_data(x, p, &prm, &t->msg_pk, t->msg_buf, t->msg_len);
        t->stage = ST_MSG;
        int r = send_track(x, t, ucp_am_send_nbx(p->ep, id, NULL, 0, data, t->msg_len, &prm), 0,
                           "completion message");
        if (r == 0)
            t->stage = ST_MSG_DONE;
        if (r < 0)
            return 0;
    }
    if (t->stage == ST_MSG_DONE && t->n_inflight == 0)
        return send_end(x, t, t->abort_req ? DUET_ERR_ABORTED : DUET_OK);
    return 0;
}

static send_t *send_find(duet_xfer_t *x, uint64_t tid)
{
    for (send_t *t = x->sends; t; t = t->next)
        if (t->tid == tid)
            return t;
    return NULL;
}

/* ------------------------------------------------------------- receives */

static void recv_unlink(duet_xfer_t *x, recv_t *r)
{
    for (recv_t **pp = &x->recvs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    if (r->peer) {
        r->peer->refs--;
        r->peer->n_recvs--;
    }
    if (x->last_recv == r)
        x->last_recv = NULL;
    free(r->pages);
    free(r->unit_bits);
    free(r->pending_done);
    free(r);
    STAT_SUB(x, recvs_pending, 1);
}

/* End a receive with `st` and remove it. */
static void recv_end(duet_xfer_t *x, recv_t *r, duet_status_t st, int32_t first_token, const char *fmt,
                     ...) __attribute__((format(printf, 5, 6)));

static void recv_end(duet_xfer_t *x, recv_t *r, duet_status_t st, int32_t first_token, const char *fmt, ...)
{
    duet_xfer_event_t ev = {
        .kind = DUET_XFER_EV_RECV,
        .status = st,
        .user = r->user,
        .epoch = r->epoch,
        .first_token = first_token,
        .cached_tokens = st == DUET_OK ? r->cached_tokens : 0,
        .cancelled = (uint32_t)r->cancelled,
        .peer_id = r->peer_id,
    };
    snprintf(ev.rid, sizeof ev.rid, "%s", r->rid);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ev.msg, sizeof ev.msg, fmt, ap);
    va_end(ap);
    if (st == DUET_OK)
        STAT_ADD(x, recvs_ok, 1);
    else
        STAT_ADD(x, recvs_failed, 1);
    recv_unlink(x, r);
    emit(x, &ev);
}

static recv_t *recv_find(duet_xfer_t *x, const char *rid, uint64_t epoch, int *rid_seen)
{
    *rid_seen = 0;
    for (recv_t *r = x->recvs; r; r = r->next) {
        if (strcmp(r->rid, rid) != 0)
            continue;
        *rid_seen = 1;
        if (r->epoch == epoch)
            return r;
    }
    return NULL;
}

/* Move receives expected since the last look into x->recvs.  Called before
 * every command batch and whenever a message finds no record, so that a
 * sender answering a fresh descriptor can never outrun its record. */
static void adopt_new_recvs(duet_xfer_t *x)
{
    pthread_mutex_lock(&x->cmd_lock);
    recv_t *r = x->new_recvs;
    x->new_recvs = NULL;
    pthread_mutex_unlock(&x->cmd_lock);
    while (r) {
        recv_t *next = r->next;
        int seen;
        if (recv_find(x, r->rid, r->epoch, &seen)) {
            duet_xfer_event_t ev = {.kind = DUET_XFER_EV_RECV, .status = DUET_ERR_BUSY, .user = r->user,
                                    .epoch = r->epoch};
            snprintf(ev.rid, sizeof ev.rid, "%s", r->rid);
            snprintf(ev.msg, sizeof ev.msg, "(rid, epoch) is already expected");
            free(r->pages);
            free(r->unit_bits);
            free(r);
            STAT_SUB(x, recvs_pending, 1);
            emit(x, &ev);
        } else {
            r->next = x->recvs;
            x->recvs = r;
        }
        r = next;
    }
}

static recv_t *recv_find_adopt(duet_xfer_t *x, const char *rid, uint64_t epoch, int *rid_seen)
{
    recv_t *r = recv_find(x, rid, epoch, rid_seen);
    if (!r) {
        adopt_new_recvs(x);
        r = recv_find(x, rid, epoch, rid_seen);
    }
    return r;
}

/* AM handlers run inside ucp_worker_progress: copy and queue only. */
static ucs_status_t am_queue(duet_xfer_t *x, unsigned id, const void *data, size_t len,
                             const ucp_am_recv_param_t *param)
{
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        STAT_ADD(x, bad_messages, 1);
        return UCS_OK;
    }
    inmsg_t *m = malloc(sizeof *m + len);
    if (!m) {
        duet_error("xfer %s: out of memory, message %u dropped", x->name, id);
        return UCS_OK;
    }
    m->next = NULL;
    m->id = id;
    m->len = len;
    memcpy(m->data, data, len);
    if (x->in_tail)
        x->in_tail->next = m;
    else
        x->in_head = m;
    x->in_tail = m;
    return UCS_OK;
}

#define AM_HANDLER(name, ID)                                                                       \
    static ucs_status_t name(void *arg, const void *header, size_t header_length, void *data,     \
                             size_t length, const ucp_am_recv_param_t *param)                      \
    {                                                                                              \
        (void)header;                                                                              \
        (void)header_length;                                                                       \
        return am_queue(arg, ID, data, length, param);                                             \
    }
AM_HANDLER(am_begin_cb, AM_BEGIN)
AM_HANDLER(am_done_cb, AM_DONE)
AM_HANDLER(am_abort_ack_cb, AM_ABORT_ACK)
AM_HANDLER(am_ping_cb, AM_PING)
AM_HANDLER(am_pong_cb, AM_PONG)

/* Completion of a probe or its answer (no transfer attached). */
static void ctl_cb(void *request, ucs_status_t status, void *user_data)
{
    peer_t *p = user_data;
    peer_op_done(p->x, p, 0);
    if (status != UCS_OK && status != UCS_ERR_CANCELED)
        peer_fail(p->x, p, DUET_ERR_PEER, "liveness probe failed: %s", ucs_status_string(status));
    ucp_request_free(request);
}

static void ctl_send(duet_xfer_t *x, peer_t *p, unsigned id, am_hdr_t *buf, uint64_t seq)
{
    hdr_fill(x, buf, id, "-", seq);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER,
        .cb.send = ctl_cb,
        .user_data = p,
    };
    ucs_status_ptr_t sp = ucp_am_send_nbx(p->ep, id, NULL, 0, buf, sizeof *buf, &prm);
    if (UCS_PTR_IS_ERR(sp))
        peer_fail(x, p, DUET_ERR_PEER, "liveness probe: %s", ucs_status_string(UCS_PTR_STATUS(sp)));
    else if (sp)
        peer_op_start(x, p, 0);
}

static peer_t *peer_by_id(duet_xfer_t *x, uint64_t id)
{
    for (peer_t *p = x->peers; p; p = p->next)
        if (p->remote_id == id && p->state == PEER_UP)
            return p;
    return NULL;
}

static recv_t *recv_lookup(duet_xfer_t *x, const char *rid, uint64_t epoch)
{
    recv_t *r = x->last_recv;
    if (r && r->epoch == epoch && strcmp(r->rid, rid) == 0)
        return r;
    int seen;
    r = recv_find_adopt(x, rid, epoch, &seen);
    if (r)
        x->last_recv = r;
    return r;
}

/* AM data for a device pool: through the staging scratch, in pieces of its size. */
static duet_status_t stage_in(duet_xfer_t *x, uint8_t *dst, const void *data, size_t length)
{
    for (size_t off = 0; off < length;) {
        size_t n = length - off < x->stg_scratch ? length - off : x->stg_scratch;
        memcpy(x->staging.host, (const uint8_t *)data + off, n);
        duet_xfer_copy_t c = {.dst = dst + off, .src = x->staging.host, .bytes = n};
        duet_status_t st = x->staging.h2d(x->staging.ctx, &c, 1);
        if (st != DUET_OK)
            return st;
        off += n;
    }
    return DUET_OK;
}

/* AM write path: check the chunk against the expected request (pool, layer,
 * units that belong to it, bounds) and copy it into place.  Nothing is
 * written for an unknown, ended or cancelled request. */
static ucs_status_t am_data_cb(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    duet_xfer_t *x = arg;
    am_data_hdr_t h;
    if (header_length != sizeof h || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        STAT_ADD(x, bad_messages, 1);
        return UCS_OK;
    }
    memcpy(&h, header, sizeof h);
    if (h.h.magic != AM_MAGIC || h.h.version != AM_VERSION || h.h.type != AM_DATA ||
        !memchr(h.h.rid, 0, sizeof h.h.rid) || h.pool >= DUET_POOL_COUNT) {
        STAT_ADD(x, bad_messages, 1);
        return UCS_OK;
    }
    recv_t *r = recv_lookup(x, h.h.rid, h.h.epoch);
    if (!r || r->cancelled) {
        STAT_ADD(x, stale_messages, 1);
        return UCS_OK;
    }
    const pool_reg_t *pr = &x->pools[h.pool];
    uint64_t pb = pr->spec.layout.page_bytes;
    int ok = pr->registered && h.layer < pr->spec.layout.n_layers && h.count > 0 &&
             h.unit < pr->spec.n_units && h.count <= pr->spec.n_units - h.unit &&
             h.offset <= (uint64_t)h.count * pb && length <= (uint64_t)h.count * pb - h.offset;
    if (ok && length > 0) {
        uint32_t first = h.unit + (uint32_t)(h.offset / pb);
        uint32_t last = h.unit + (uint32_t)((h.offset + length - 1) / pb);
        for (uint32_t u = first; ok && u <= last; u++) {
            if (kind_is_paged((int)h.pool))
                ok = u < r->unit_bits_n && (r->unit_bits[u >> 3] >> (u & 7) & 1);
            else
                ok = u == r->slot;
        }
    }
    if (!ok) {
        /* a sender writing outside the request is broken: nothing is written
         * and the request fails now rather than at its deadline */
        STAT_ADD(x, bad_messages, 1);
        recv_end(x, r, DUET_ERR_PROTOCOL, -1,
                 "page data outside the request refused (pool %u layer %u units %u+%u)", h.pool, h.layer,
                 h.unit, h.count);
        return UCS_OK;
    }
    uint8_t *dst = (uint8_t *)pr->spec.base + ((uint64_t)h.layer * pr->spec.n_units + h.unit) * pb + h.offset;
    if (pr->device && !x->have_staging) {
        /* registered for RMA only (no staging ops), and a sender writes with AM_DATA */
        STAT_ADD(x, bad_messages, 1);
        recv_end(x, r, DUET_ERR_UNSUPPORTED, -1,
                 "page data by active message for device pool %u, and this engine has no staging ops", h.pool);
        return UCS_OK;
    }
    if (pr->device) {
        duet_status_t st = stage_in(x, dst, data, length);
        if (st != DUET_OK) {
            recv_end(x, r, st, -1, "page data: staging copy into device memory failed (pool %u layer %u)",
                     h.pool, h.layer);
            return UCS_OK;
        }
    } else {
        memcpy(dst, data, length);
    }
    r->am_bytes += length;
    if (r->peer)
        r->peer->last_heard_ns = duet_time_ns();
    if (r->pending_done) {
        am_done_t d;
        memcpy(&d, r->pending_done->data, sizeof d);
        if (r->am_bytes >= d.am_bytes) {
            /* its data is all here: hand the TransferDone back to the loop */
            inmsg_t *m = r->pending_done;
            r->pending_done = NULL;
            m->next = NULL;
            if (x->in_tail)
                x->in_tail->next = m;
            else
                x->in_head = m;
            x->in_tail = m;
        }
    }
    return UCS_OK;
}

static void handle_msg(duet_xfer_t *x, const inmsg_t *m)
{
    am_hdr_t h;
    if (m->len < sizeof h) {
        STAT_ADD(x, bad_messages, 1);
        duet_warn("xfer %s: message %u of %zu bytes is truncated", x->name, m->id, m->len);
        return;
    }
    memcpy(&h, m->data, sizeof h);
    if (h.magic != AM_MAGIC || h.version != AM_VERSION || h.type != m->id ||
        memchr(h.rid, 0, sizeof h.rid) == NULL || h.rid[0] == 0) {
        STAT_ADD(x, bad_messages, 1);
        duet_warn("xfer %s: message %u with a bad header (magic %08x version %u)", x->name, m->id,
                  h.magic, h.version);
        return;
    }
    if (m->id == AM_PING || m->id == AM_PONG) {
        peer_t *p = peer_by_id(x, h.sender_id);
        if (!p)
            return; /* no endpoint to answer on: the prober's deadline decides */
        if (m->id == AM_PING) {
            ctl_send(x, p, AM_PONG, &p->pong_buf, h.epoch);
        } else {
            p->ping_sent_ns = 0;
            p->last_heard_ns = duet_time_ns();
        }
        return;
    }
    int rid_seen;
    recv_t *r = recv_find_adopt(x, h.rid, h.epoch, &rid_seen);
    if (r && r->peer)
        r->peer->last_heard_ns = duet_time_ns();
    if (!r) {
        STAT_ADD(x, stale_messages, 1);
        duet_log_rid(DUET_LOG_DEBUG, h.rid, "xfer %s: %s message %u for epoch %" PRIu64 " dropped",
                     x->name, rid_seen ? "stale-epoch" : "unexpected", m->id, h.epoch);
        return;
    }
    if (m->id == AM_BEGIN) {
        am_begin_t b;
        if (m->len < sizeof b) {
            STAT_ADD(x, bad_messages, 1);
            return;
        }
        memcpy(&b, m->data, sizeof b);
        if (b.addr_len == 0 || b.addr_len > MAX_BLOB || m->len != sizeof b + b.addr_len) {
            STAT_ADD(x, bad_messages, 1);
            return;
        }
        if (r->begun)
            return;
        r->begun = 1;
        r->peer_id = h.sender_id;
        duet_status_t st = DUET_OK;
        char msg[160] = "";
        peer_t *p = peer_get(x, m->data + sizeof b, b.addr_len, h.sender_id, &st, msg, sizeof msg);
        if (!p) {
            recv_end(x, r, st, -1, "sender unreachable: %s", msg);
            return;
        }
        r->peer = p;
        p->refs++;
        p->n_recvs++;
        duet_xfer_event_t ev = {
            .kind = DUET_XFER_EV_RECV_BEGUN,
            .status = DUET_OK,
            .user = r->user,
            .epoch = r->epoch,
            .peer_id = h.sender_id,
            .cancelled = (uint32_t)r->cancelled,
        };
        snprintf(ev.rid, sizeof ev.rid, "%s", r->rid);
        snprintf(ev.msg, sizeof ev.msg, "transfer started");
        emit(x, &ev);
        return;
    }
    if (m->id == AM_ABORT_ACK) {
        recv_end(x, r, DUET_ERR_ABORTED, -1, "sender aborted the transfer (AbortAck)");
        return;
    }
    /* TransferDone */
    am_done_t d;
    if (m->len < sizeof d) {
        STAT_ADD(x, bad_messages, 1);
        return;
    }
    memcpy(&d, m->data, sizeof d);
    r->cached_tokens = d.cached_tokens;
    if (r->cancelled) {
        /* The sender flushed before this message, and page messages for a cancelled receive are
         * dropped unwritten: nothing more can land in the pages, so the receive ends here. */
        recv_end(x, r, DUET_ERR_ABORTED, d.first_token, "transfer done after the receiver cancelled it");
        return;
    }
    if (r->am_bytes < d.am_bytes) {
        /* page messages may travel on other lanes: wait for them (the deadline bounds this) */
        inmsg_t *c = malloc(sizeof *c + m->len);
        if (!c) {
            recv_end(x, r, DUET_ERR_NOMEM, -1, "out of memory");
            return;
        }
        memcpy(c, m, sizeof *c + m->len);
        free(r->pending_done);
        r->pending_done = c;
        return;
    }
    if (r->am_bytes > d.am_bytes) {
        STAT_ADD(x, bad_messages, 1);
        recv_end(x, r, DUET_ERR_PROTOCOL, -1, "received %" PRIu64 " page bytes, sender counted %" PRIu64,
                 r->am_bytes, d.am_bytes);
        return;
    }
    uint32_t want = sums_count(x, r->n_pages, r->slot);
    if (d.n_sums == 0 && want > 0 && m->len == sizeof d) {
        if (x->opts.verify_checksums) {
            STAT_ADD(x, checksum_failures, 1);
            recv_end(x, r, DUET_ERR_CHECKSUM, d.first_token, "TransferDone carries no checksums");
        } else {
            recv_end(x, r, DUET_OK, d.first_token, "transfer done (sender sent no checksums)");
        }
        return;
    }
    if (d.n_sums != want || m->len != sizeof d + (size_t)d.n_sums * sizeof(uint64_t)) {
        STAT_ADD(x, bad_messages, 1);
        recv_end(x, r, DUET_ERR_PROTOCOL, -1, "TransferDone carries %u checksums, expected %u",
                 d.n_sums, want);
        return;
    }
    if (x->opts.verify_checksums && want > 0) {
        uint64_t *mine = duet_malloc_array(want, sizeof *mine);
        if (!mine) {
            recv_end(x, r, DUET_ERR_NOMEM, -1, "out of memory for checksums");
            return;
        }
        duet_status_t cs = sums_compute(x, r->pages, r->n_pages, r->slot, mine);
        if (cs != DUET_OK) {
            free(mine);
            recv_end(x, r, cs, d.first_token, "checksum verification: staging copy out of device memory failed");
            return;
        }
        const uint8_t *theirs = m->data + sizeof d;
        for (uint32_t i = 0; i < want; i++) {
            uint64_t v;
            memcpy(&v, theirs + (size_t)i * 8, 8);
            if (v != mine[i]) {
                free(mine);
                STAT_ADD(x, checksum_failures, 1);
                recv_end(x, r, DUET_ERR_CHECKSUM, d.first_token,
                         "checksum %u of %u differs (received pages are not what was sent)", i, want);
                return;
            }
        }
        free(mine);
    }
    recv_end(x, r, DUET_OK, d.first_token, "transfer done%s",
             x->opts.verify_checksums ? ", checksums verified" : "");
}

/* ------------------------------------------------------- progress thread */

static void run_command(duet_xfer_t *x, cmd_t *c);

static void register_pool_now(duet_xfer_t *x, cmd_t *c)
{
    const duet_xfer_pool_t *sp = c->obj;
    pool_reg_t *r = &x->pools[sp->layout.kind];
    size_t bytes = (size_t)sp->layout.n_layers * sp->n_units * sp->layout.page_bytes;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = sp->base,
        .length = bytes,
        /* DUET_XFER_FAKE_DEVICE: the "device" pool is host memory, registered as such */
        .memory_type = (sp->flags & DUET_XFER_POOL_DEVICE) && !x->fake_device ? UCS_MEMORY_TYPE_CUDA
                                                                              : UCS_MEMORY_TYPE_HOST,
    };
    ucp_mem_h memh;
    ucs_status_t s = ucp_mem_map(x->ctx, &mp, &memh);
    if (s != UCS_OK) {
        c->result = duet_err_set(&c->err, DUET_ERR_IO, "ucp_mem_map of pool %s (%zu bytes): %s",
                                 duet_pool_kind_name(sp->layout.kind), bytes, ucs_status_string(s));
        return;
    }
    void *rb;
    size_t rl;
    s = ucp_rkey_pack(x->ctx, memh, &rb, &rl);
    if (s != UCS_OK) {
        ucp_mem_unmap(x->ctx, memh);
        c->result = duet_err_set(&c->err, DUET_ERR_IO, "ucp_rkey_pack of pool %s: %s",
                                 duet_pool_kind_name(sp->layout.kind), ucs_status_string(s));
        return;
    }
    r->spec = *sp;
    r->device = (sp->flags & DUET_XFER_POOL_DEVICE) != 0;
    r->bytes = bytes;
    r->memh = memh;
    r->rkey_buf = rb;
    r->rkey_len = rl;
    r->registered = 1;
    c->result = DUET_OK;
}

static void run_command(duet_xfer_t *x, cmd_t *c)
{
    send_t *t;
    switch (c->kind) {
    case CMD_REGISTER:
        if (x->thread_status != DUET_OK)
            c->result = duet_err_set(&c->err, x->thread_status,
                                     "register: the progress thread's initialisation (opts.thread_init) failed");
        else
            register_pool_now(x, c);
        break;
    case CMD_SEND_BEGIN:
        t = c->obj;
        t->next = x->sends;
        x->sends = t;
        send_start(x, t);
        break;
    case CMD_SEND_PUT:
        t = send_find(x, c->tid);
        if (!t || t->status != DUET_OK || t->finish_req || t->abort_req)
            break;
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            if (!x->pools[k].registered || (c->pool != DUET_XFER_ALL_POOLS && c->pool != k))
                continue;
            uint32_t lo = c->layer == DUET_XFER_ALL_LAYERS ? 0 : c->layer;
            uint32_t hi = c->layer == DUET_XFER_ALL_LAYERS ? x->pools[k].spec.layout.n_layers : c->layer + 1;
            for (uint32_t l = lo; l < hi; l++)
                if (send_jobs_push(t, k, l) != 0) {
                    send_set_status(t, DUET_ERR_NOMEM, "out of memory for put jobs");
                    break;
                }
        }
        break;
    case CMD_SEND_FINISH:
        t = send_find(x, c->tid);
        if (t && !t->abort_req && !t->finish_req) {
            t->finish_req = 1;
            t->first_token = c->first_token;
            t->cached_tokens = c->cached_tokens;
        }
        break;
    case CMD_SEND_ABORT:
        t = send_find(x, c->tid);
        if (t && !t->abort_req && !t->finish_req) {
            t->abort_req = 1;
            t->jobs_len = 0;
            snprintf(t->msg, sizeof t->msg, "aborted by the sender");
        }
        break;
    case CMD_RECV_EXPECT: /* records travel through new_recvs */
        break;
    case CMD_RECV_CANCEL: {
        int seen;
        recv_t *r = recv_find(x, c->rid, c->epoch, &seen);
        if (r) {
            r->cancelled = 1;
            if (r->pending_done) /* its TransferDone already arrived, after the sender's flush */
                recv_end(x, r, DUET_ERR_ABORTED, -1, "cancelled after the sender finished");
        }
        break;
    }
    case CMD_STOP:
        x->stopping = 1;
        break;
    }
}

static int run_commands(duet_xfer_t *x)
{
    adopt_new_recvs(x);
    pthread_mutex_lock(&x->cmd_lock);
    cmd_t *c = x->cmd_head;
    x->cmd_head = x->cmd_tail = NULL;
    pthread_mutex_unlock(&x->cmd_lock);
    int n = 0;
    while (c) {
        cmd_t *next = c->next;
        run_command(x, c);
        if (c->sync)
            cmd_complete_sync(x, c); /* the caller frees it */
        else
            free(c);
        c = next;
        n++;
    }
    return n;
}

/* Fail what depends on failed peers, close their endpoints, drop old dead ones. */
static void reap_peers(duet_xfer_t *x, uint64_t now)
{
    for (peer_t **pp = &x->peers; *pp;) {
        peer_t *p = *pp;
        if (p->state == PEER_FAILED) {
            for (send_t *t = x->sends; t; t = t->next)
                if (t->peer == p)
                    send_set_status(t, p->fail_status, p->fail_msg);
            for (recv_t *r = x->recvs, *n; r; r = n) {
                n = r->next;
                if (r->peer == p)
                    recv_end(x, r, p->fail_status, -1, "sender failed: %s", p->fail_msg);
            }
            ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                       .flags = p->graceful ? 0u : (uint32_t)UCP_EP_CLOSE_FLAG_FORCE};
            ucs_status_ptr_t sp = ucp_ep_close_nbx(p->ep, &prm);
            p->ep = NULL;
            p->close_deadline_ns = now + (uint64_t)x->opts.timeout_ms * 1000000ull;
            if (UCS_PTR_IS_PTR(sp)) {
                p->close_req = sp;
                p->state = PEER_CLOSING;
            } else {
                p->state = PEER_DEAD;
                p->dead_since_ns = now;
            }
        }
        if (p->state == PEER_CLOSING) {
            ucs_status_t s = ucp_request_check_status(p->close_req);
            if (s != UCS_INPROGRESS || now > p->close_deadline_ns) {
                if (s == UCS_INPROGRESS)
                    duet_warn("xfer %s: closing endpoint to %016" PRIx64 " did not finish in %u ms",
                              x->name, p->remote_id, x->opts.timeout_ms);
                ucp_request_free(p->close_req);
                p->close_req = NULL;
                p->state = PEER_DEAD;
                p->dead_since_ns = now;
            }
        }
        if (p->state == PEER_DEAD && p->refs == 0 && p->n_inflight == 0 &&
            now - p->dead_since_ns > DEAD_PEER_KEEP_NS) {
            *pp = p->next;
            free(p);
            continue;
        }
        pp = &p->next;
    }
}

static void check_deadlines(duet_xfer_t *x, uint64_t now)
{
    uint64_t limit = (uint64_t)x->opts.timeout_ms * 1000000ull;
    for (peer_t *p = x->peers; p; p = p->next)
        if (p->state == PEER_UP && p->n_inflight > 0 && now > p->last_progress_ns + limit)
            peer_fail(x, p, DUET_ERR_TIMEOUT, "no progress on %u operations for %u ms", p->n_inflight,
                      x->opts.timeout_ms);
    /* A receiver probes the senders it waits on: shared memory has no socket to
     * reset and a dead host sends no RST, so this is what bounds detection. */
    uint64_t every = (uint64_t)x->opts.keepalive_ms * 1000000ull;
    for (peer_t *p = x->peers; p; p = p->next) {
        if (p->state != PEER_UP || p->n_recvs == 0)
            continue;
        if (p->ping_sent_ns && now > p->ping_sent_ns + limit)
            peer_fail(x, p, DUET_ERR_TIMEOUT, "no answer to liveness probes for %u ms", x->opts.timeout_ms);
        else if (!p->ping_sent_ns && now > p->last_heard_ns + every) {
            p->ping_sent_ns = now;
            ctl_send(x, p, AM_PING, &p->ping_buf, now);
        }
    }
    for (recv_t *r = x->recvs, *n; r; r = n) {
        n = r->next;
        if (now > r->deadline_ns)
            recv_end(x, r, DUET_ERR_TIMEOUT, -1, "no TransferDone before the deadline%s",
                     r->begun ? " (transfer had started)" : "");
    }
}

static uint64_t next_deadline(const duet_xfer_t *x)
{
    uint64_t d = UINT64_MAX;
    for (const recv_t *r = x->recvs; r; r = r->next)
        if (r->deadline_ns < d)
            d = r->deadline_ns;
    return d;
}

static int ucx_busy(const duet_xfer_t *x)
{
    if (atomic_load_explicit(&x->st.ops_inflight, memory_order_relaxed) > 0)
        return 1;
    for (const send_t *t = x->sends; t; t = t->next)
        if (t->jobs_len > 0 || t->status != DUET_OK || t->finish_req || t->abort_req)
            return 1;
    for (const peer_t *p = x->peers; p; p = p->next)
        if (p->state == PEER_FAILED || p->state == PEER_CLOSING)
            return 1;
    return 0;
}

static void progress_once(duet_xfer_t *x, int *activity)
{
    unsigned n, total = 0;
    while ((n = ucp_worker_progress(x->worker)) != 0 && total < 4096)
        total += n;
    if (total)
        *activity = 1;
    while (x->in_head) {
        inmsg_t *m = x->in_head;
        x->in_head = m->next;
        if (!x->in_head)
            x->in_tail = NULL;
        handle_msg(x, m);
        free(m);
        *activity = 1;
    }
    uint64_t now = duet_time_ns();
    reap_peers(x, now);
    for (send_t **pp = &x->sends; *pp;) {
        send_t *t = *pp;
        send_t *next = t->next;
        if (send_advance(x, t, now))
            *pp = next;
        else
            pp = &t->next;
    }
    check_deadlines(x, now);
}

static void shutdown_all(duet_xfer_t *x)
{
    for (send_t *t = x->sends; t; t = t->next)
        send_set_status(t, DUET_ERR_ABORTED, "engine stopped");
    while (x->recvs)
        recv_unlink(x, x->recvs);
    for (peer_t *p = x->peers; p; p = p->next)
        if (p->state == PEER_UP) {
            p->state = PEER_FAILED;
            p->graceful = 1;
            p->fail_status = DUET_ERR_ABORTED;
            snprintf(p->fail_msg, sizeof p->fail_msg, "engine stopped");
        }
    uint64_t deadline = duet_time_ns() + (uint64_t)x->opts.timeout_ms * 1000000ull;
    for (;;) {
        int act = 0;
        progress_once(x, &act);
        int pending = x->sends != NULL;
        for (peer_t *p = x->peers; p; p = p->next)
            pending |= p->state == PEER_CLOSING || p->state == PEER_FAILED;
        if (!pending || duet_time_ns() > deadline)
            break;
    }
    /* sends whose requests never completed are left (their callbacks may still refer to them) */
}

static void *progress_main(void *arg)
{
    duet_xfer_t *x = arg;
    if (x->opts.thread_init) {
        x->thread_status = x->opts.thread_init(x->opts.thread_init_arg);
        if (x->thread_status != DUET_OK)
            duet_error("xfer %s: progress thread initialisation failed (%s)", x->name,
                       duet_status_code(x->thread_status));
    }
    uint64_t last_activity = duet_time_ns();
    for (;;) {
        int activity = run_commands(x) > 0;
        if (x->stopping)
            break;
        progress_once(x, &activity);
        uint64_t now = duet_time_ns();
        if (activity || ucx_busy(x)) {
            last_activity = now;
            continue;
        }
        if (now - last_activity < SPIN_NS)
            continue;
        ucs_status_t s = ucp_worker_arm(x->worker);
        if (s == UCS_ERR_BUSY)
            continue;
        uint64_t nd = next_deadline(x);
        int timeout = IDLE_SLEEP_MS;
        if (nd != UINT64_MAX) {
            uint64_t left = nd > now ? (nd - now) / 1000000ull + 1 : 0;
            if (left < (uint64_t)timeout)
                timeout = (int)left;
        }
        struct epoll_event evs[2];
        int r = epoll_wait(x->epfd, evs, 2, timeout);
        for (int i = 0; i < r; i++)
            if (evs[i].data.fd == x->cmd_efd) {
                uint64_t v;
                ssize_t rd = read(x->cmd_efd, &v, sizeof v);
                (void)rd;
            }
    }
    shutdown_all(x);
    return NULL;
}

/* ------------------------------------------------------------- lifecycle */

static uint64_t random_id(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v || v == 0)
        v = duet_time_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
    return v;
}

duet_status_t duet_xfer_create(const duet_xfer_opts_t *opts, duet_xfer_t **out, duet_err_t *err)
{
    duet_xfer_opts_t o = opts ? *opts : (duet_xfer_opts_t){0};
    if (!o.max_inflight)
        o.max_inflight = 32;
    if (!o.max_put_bytes)
        o.max_put_bytes = 8u << 20;
    if (!o.timeout_ms)
        o.timeout_ms = 5000;
    if (!o.keepalive_ms)
        o.keepalive_ms = 1000;
    if (!o.am_chunk_bytes)
        o.am_chunk_bytes = 64u << 10;
    if (o.staging) {
        const duet_xfer_staging_t *sg = o.staging;
        if (!sg->d2h || !sg->h2d || !sg->host)
            return duet_err_set(err, DUET_ERR_INVALID, "staging ops without d2h, h2d or a host buffer");
        size_t slot = ((size_t)o.am_chunk_bytes + STG_ALIGN - 1) / STG_ALIGN * STG_ALIGN;
        if (sg->staging_bytes / 2 < slot)
            return duet_err_set(err, DUET_ERR_INVALID,
                                "staging buffer of %zu bytes: it must hold two AM chunks of %u bytes",
                                sg->staging_bytes, o.am_chunk_bytes);
    }
    duet_xfer_t *x = DUET_NEW(duet_xfer_t);
    if (!x)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    x->opts = o;
    if (o.staging) {
        x->staging = *o.staging;
        x->opts.staging = &x->staging;
        x->have_staging = 1;
        x->stg_slot_bytes = ((size_t)o.am_chunk_bytes + STG_ALIGN - 1) / STG_ALIGN * STG_ALIGN;
        x->stg_scratch = x->staging.staging_bytes / 2 / STG_ALIGN * STG_ALIGN;
        size_t slots = (x->staging.staging_bytes - x->stg_scratch) / x->stg_slot_bytes;
        x->stg_nslots = slots > STG_LIST_MAX ? STG_LIST_MAX : (uint32_t)slots;
        x->stg_free = duet_malloc_array(x->stg_nslots, sizeof *x->stg_free);
        x->stg_list = duet_malloc_array(STG_LIST_MAX, sizeof *x->stg_list);
        x->stg_batch = duet_malloc_array(STG_LIST_MAX, sizeof *x->stg_batch);
        if (!x->stg_free || !x->stg_list || !x->stg_batch) {
            free(x->stg_free);
            free(x->stg_list);
            free(x->stg_batch);
            free(x);
            return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
        }
        for (uint32_t i = 0; i < x->stg_nslots; i++)
            x->stg_free[i] = x->stg_nslots - 1 - i;
        x->stg_nfree = x->stg_nslots;
    }
    const char *fake = getenv("DUET_XFER_FAKE_DEVICE");
    x->fake_device = fake && strcmp(fake, "1") == 0;
    x->id = o.id ? o.id : random_id();
    snprintf(x->name, sizeof x->name, "%s", o.name ? o.name : "xfer");
    x->opts.name = NULL;
    x->path = o.data_path;
    const char *pe = getenv("DUET_XFER_PATH");
    if (x->path == DUET_XFER_PATH_AUTO && pe) {
        if (strcmp(pe, "rma") == 0)
            x->path = DUET_XFER_PATH_RMA;
        else if (strcmp(pe, "am") == 0)
            x->path = DUET_XFER_PATH_AM;
    }
    x->worker_efd = x->cmd_efd = x->ev_efd = x->epfd = -1;
    atomic_init(&x->next_tid, 1);
    pthread_mutex_init(&x->cmd_lock, NULL);
    pthread_mutex_init(&x->sync_lock, NULL);
    pthread_cond_init(&x->sync_cond, NULL);
    pthread_mutex_init(&x->ev_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&x->ev_cond, &ca);
    pthread_condattr_destroy(&ca);

    duet_status_t st;
    ucp_config_t *cfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        st = duet_err_set(err, DUET_ERR_IO, "ucp_config_read: %s", ucs_status_string(s));
        goto err_free;
    }
    if (!getenv("UCX_KEEPALIVE_INTERVAL")) {
        char v[32];
        snprintf(v, sizeof v, "%ums", o.keepalive_ms);
        if (ucp_config_modify(cfg, "KEEPALIVE_INTERVAL", v) != UCS_OK)
            duet_warn("xfer %s: could not set UCX KEEPALIVE_INTERVAL", x->name);
    }
    ucp_params_t up = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 0,
        .name = x->name,
    };
    s = ucp_init(&up, cfg, &x->ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) {
        st = duet_err_set(err, DUET_ERR_IO, "ucp_init: %s", ucs_status_string(s));
        goto err_free;
    }
    ucp_context_attr_t ca2 = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(x->ctx, &ca2) == UCS_OK)
        x->cuda_capable = (ca2.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    const char *tcp_copy = getenv("DUET_XFER_TCP_COPY"); /* 0: zero-copy over tcp (a UCX with the fix) */
    if (!(tcp_copy && strcmp(tcp_copy, "0") == 0) &&
        ucp_dt_create_generic(&packed_ops, NULL, &x->packed_dt) != UCS_OK) {
        x->packed_dt = 0;
        duet_warn("xfer %s: no packed datatype: active messages over tcp go zero-copy (docs/DATAPLANE.md)", x->name);
    }
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    s = ucp_worker_create(x->ctx, &wp, &x->worker);
    if (s != UCS_OK) {
        st = duet_err_set(err, DUET_ERR_IO, "ucp_worker_create: %s", ucs_status_string(s));
        goto err_ctx;
    }
    s = ucp_worker_get_address(x->worker, &x->addr, &x->addr_len);
    if (s != UCS_OK) {
        st = duet_err_set(err, DUET_ERR_IO, "ucp_worker_get_address: %s", ucs_status_string(s));
        goto err_worker;
    }
    s = ucp_worker_get_efd(x->worker, &x->worker_efd);
    if (s != UCS_OK) {
        st = duet_err_set(err, DUET_ERR_IO, "ucp_worker_get_efd: %s", ucs_status_string(s));
        goto err_addr;
    }
    static const struct {
        unsigned id;
        ucp_am_recv_callback_t cb;
    } handlers[] = {{AM_BEGIN, am_begin_cb}, {AM_DONE, am_done_cb}, {AM_ABORT_ACK, am_abort_ack_cb},
                    {AM_DATA, am_data_cb}, {AM_PING, am_ping_cb}, {AM_PONG, am_pong_cb}};
    for (size_t i = 0; i < sizeof handlers / sizeof handlers[0]; i++) {
        ucp_am_handler_param_t hp = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                          UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
            .id = handlers[i].id,
            .cb = handlers[i].cb,
            .arg = x,
            .flags = UCP_AM_FLAG_WHOLE_MSG,
        };
        s = ucp_worker_set_am_recv_handler(x->worker, &hp);
        if (s != UCS_OK) {
            st = duet_err_set(err, DUET_ERR_IO, "ucp_worker_set_am_recv_handler: %s",
                              ucs_status_string(s));
            goto err_addr;
        }
    }
    x->cmd_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    x->ev_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    x->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (x->cmd_efd < 0 || x->ev_efd < 0 || x->epfd < 0) {
        st = duet_err_set(err, DUET_ERR_IO, "eventfd/epoll: %s", strerror(errno));
        goto err_fds;
    }
    struct epoll_event e1 = {.events = EPOLLIN, .data.fd = x->worker_efd};
    struct epoll_event e2 = {.events = EPOLLIN, .data.fd = x->cmd_efd};
    if (epoll_ctl(x->epfd, EPOLL_CTL_ADD, x->worker_efd, &e1) != 0 ||
        epoll_ctl(x->epfd, EPOLL_CTL_ADD, x->cmd_efd, &e2) != 0) {
        st = duet_err_set(err, DUET_ERR_IO, "epoll_ctl: %s", strerror(errno));
        goto err_fds;
    }
    int rc = pthread_create(&x->thread, NULL, progress_main, x);
    if (rc != 0) {
        st = duet_err_set(err, DUET_ERR_IO, "pthread_create: %s", strerror(rc));
        goto err_fds;
    }
    x->thread_started = 1;
    duet_info("xfer %s: engine %016" PRIx64 " up (worker address %zu bytes, CUDA memory %s)", x->name,
              x->id, x->addr_len, x->cuda_capable ? "yes" : "no");
    if (x->fake_device)
        duet_warn("xfer %s: DUET_XFER_FAKE_DEVICE=1: device pools are host memory (a test mode)", x->name);
    *out = x;
    return DUET_OK;

err_fds:
    if (x->epfd >= 0)
        close(x->epfd);
    if (x->cmd_efd >= 0)
        close(x->cmd_efd);
    if (x->ev_efd >= 0)
        close(x->ev_efd);
err_addr:
    ucp_worker_release_address(x->worker, x->addr);
err_worker:
    ucp_worker_destroy(x->worker);
err_ctx:
    if (x->packed_dt)
        ucp_dt_destroy(x->packed_dt);
    ucp_cleanup(x->ctx);
err_free:
    free(x->stg_free);
    free(x->stg_list);
    free(x->stg_batch);
    pthread_mutex_destroy(&x->cmd_lock);
    pthread_mutex_destroy(&x->sync_lock);
    pthread_cond_destroy(&x->sync_cond);
    pthread_mutex_destroy(&x->ev_lock);
    pthread_cond_destroy(&x->ev_cond);
    free(x);
    return st;
}

void duet_xfer_destroy(duet_xfer_t **xp)
{
    if (!xp || !*xp)
        return;
    duet_xfer_t *x = *xp;
    *xp = NULL;
    if (x->thread_started) {
        cmd_t *c = cmd_new(CMD_STOP);
        if (c) {
            cmd_push(x, c);
        } else {
            /* no memory for a command: the flag is read by the thread after its next wake */
            x->stopping = 1;
            uint64_t one = 1;
            ssize_t w = write(x->cmd_efd, &one, sizeof one);
            (void)w;
        }
        pthread_join(x->thread, NULL);
    }
    /* Sends whose requests never completed are leaked on purpose: UCX may
     * still call back into them until the worker is destroyed. */
    int leaked = 0;
    for (send_t *t = x->sends, *n; t; t = n) {
        n = t->next;
        if (t->n_inflight == 0)
            send_free(x, t);
        else
            leaked++;
    }
    if (leaked)
        duet_warn("xfer %s: %d sends still had UCX requests at shutdown", x->name, leaked);
    for (peer_t *p = x->peers, *n; p; p = n) {
        n = p->next;
        free(p);
    }
    while (x->dop_free) {
        dop_t *o = x->dop_free;
        x->dop_free = o->next_free;
        free(o);
    }
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        pool_reg_t *r = &x->pools[k];
        if (!r->registered)
            continue;
        ucp_rkey_buffer_release(r->rkey_buf);
        ucp_mem_unmap(x->ctx, r->memh);
    }
    while (x->in_head) {
        inmsg_t *m = x->in_head;
        x->in_head = m->next;
        free(m);
    }
    while (x->new_recvs) {
        recv_t *r = x->new_recvs;
        x->new_recvs = r->next;
        free(r->pages);
        free(r->unit_bits);
        free(r);
    }
    evnode_t *e = x->ev_head;
    while (e) {
        evnode_t *n = e->next;
        free(e);
        e = n;
    }
    cmd_t *c = x->cmd_head;
    while (c) {
        cmd_t *n = c->next;
        free(c);
        c = n;
    }
    close(x->epfd);
    close(x->cmd_efd);
    close(x->ev_efd);
    ucp_worker_release_address(x->worker, x->addr);
    ucp_worker_destroy(x->worker);
    if (x->packed_dt)
        ucp_dt_destroy(x->packed_dt);
    ucp_cleanup(x->ctx);
    pthread_mutex_destroy(&x->cmd_lock);
    pthread_mutex_destroy(&x->sync_lock);
    pthread_cond_destroy(&x->sync_cond);
    pthread_mutex_destroy(&x->ev_lock);
    pthread_cond_destroy(&x->ev_cond);
    free(x->stg_free);
    free(x->stg_list);
    free(x->stg_batch);
    free(x);
}

uint64_t duet_xfer_id(const duet_xfer_t *x)
{
    return x->id;
}

const uint8_t *duet_xfer_address(const duet_xfer_t *x, size_t *len)
{
    if (len)
        *len = x->addr_len;
    return (const uint8_t *)x->addr;
}

int duet_xfer_cuda_capable(const duet_xfer_t *x)
{
    return x->cuda_capable;
}

/* ----------------------------------------------------------- registration */

duet_status_t duet_xfer_register_pool(duet_xfer_t *x, const duet_xfer_pool_t *pool, duet_err_t *err)
{
    if (!pool || (int)pool->layout.kind < 0 || pool->layout.kind >= DUET_POOL_COUNT)
        return duet_err_set(err, DUET_ERR_INVALID, "register: bad pool kind");
    const char *kn = duet_pool_kind_name(pool->layout.kind);
    if (!pool->base || pool->n_units == 0 || pool->layout.n_layers == 0 || pool->layout.page_bytes == 0)
        return duet_err_set(err, DUET_ERR_INVALID, "register: pool %s is empty", kn);
    if (pool->page_tokens == 0)
        return duet_err_set(err, DUET_ERR_INVALID, "register: pool %s without page_tokens", kn);
    if ((uint32_t)kind_is_paged(pool->layout.kind) != pool->layout.paged)
        return duet_err_set(err, DUET_ERR_INVALID, "register: pool %s paged flag is wrong", kn);
    size_t bytes;
    if (duet_mul_size((size_t)pool->layout.n_layers * pool->n_units, pool->layout.page_bytes, &bytes) != 0)
        return duet_err_set(err, DUET_ERR_RANGE, "register: pool %s size overflows", kn);
    if (x->pools[pool->layout.kind].registered)
        return duet_err_set(err, DUET_ERR_INVALID, "register: pool %s registered twice", kn);
    if (x->page_tokens && x->page_tokens != pool->page_tokens)
        return duet_err_set(err, DUET_ERR_INVALID, "register: pool %s page_tokens %u, others %u", kn,
                            pool->page_tokens, x->page_tokens);
    if (pool->flags & DUET_XFER_POOL_DEVICE) {
        if (!x->cuda_capable && !x->fake_device)
            return duet_err_set(err, DUET_ERR_UNSUPPORTED,
                                "register: pool %s is device memory and this UCX has no CUDA memory support "
                                "(a UCX built with CUDA, cuda_copy and cuda_ipc, is needed to map it)", kn);
        /* where the engine may read or write the pool from the host, it needs the staging ops */
        int host_access = !x->opts.skip_checksums || x->opts.verify_checksums || x->path != DUET_XFER_PATH_RMA;
        if (host_access && !x->have_staging)
            return duet_err_set(err, DUET_ERR_UNSUPPORTED,
                                "register: pool %s is device memory and no staging ops were given: %s", kn,
                                !x->opts.skip_checksums ? "the sender's checksums read it from the host"
                                : x->opts.verify_checksums ? "checksum verification reads it from the host"
                                                           : "the AM write path copies it from the host");
        if (x->have_staging && x->stg_scratch < pool->layout.page_bytes)
            return duet_err_set(err, DUET_ERR_INVALID,
                                "register: pool %s pages of %" PRIu64 " bytes do not fit half of the %zu-byte "
                                "staging buffer", kn, pool->layout.page_bytes, x->staging.staging_bytes);
    }
    cmd_t *c = cmd_new(CMD_REGISTER);
    if (!c)
        return duet_err_set(err, DUET_ERR_NOMEM, "out of memory");
    c->obj = (void *)pool;
    duet_status_t st = cmd_run_sync(x, c, err);
    if (st == DUET_OK)
        x->page_tokens = pool->page_tokens;
    return st;
}

duet_status_t duet_xfer_register_cache(duet_xfer_t *x, const duet_kv_cache_t *cache, duet_err_t *err)
{
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(cache, (duet_pool_kind_t)k);
        uint8_t *base = duet_kv_cache_pool_base(cache, (duet_pool_kind_t)k);
        if (!l || l->n_layers == 0 || !base)
            continue;
        duet_xfer_pool_t p = {
            .layout = *l,
            .page_tokens = (uint32_t)duet_kv_cache_opts(cache)->page_tokens,
            .base = base,
            .n_units = l->paged ? duet_kv_cache_n_pages(cache) : duet_kv_cache_n_slots(cache),
        };
        duet_status_t st = duet_xfer_register_pool(x, &p, err);
        if (st != DUET_OK)
            return st;
    }
    return DUET_OK;
}

/* ------------------------------------------------------------ receiving */

static int rid_ok(const char *rid)
{
    return rid && rid[0] && strlen(rid) < DUET_XFER_RID_MAX;
}

duet_status_t duet_xfer_recv_expect(duet_xfer_t *x, const char *rid, uint64_t epoch,
                                    const uint32_t *pages, uint32_t n_pages, uint32_t slot,
                                    uint64_t deadline_ns, uint64_t user, duet_xfer_desc_t *desc,
                                    duet_err_t *err)
{
    if (!rid_ok(rid))
        return duet_err_set(err, DUET_ERR_INVALID, "expect: bad request id");
    if (n_pages > DUET_XFER_MAX_PAGES || (n_pages && !pages))
        return duet_err_set(err, DUET_ERR_INVALID, "expect: %u pages", n_pages);
    int have = 0;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const pool_reg_t *r = &x->pools[k];
        if (!r->registered)
            continue;
        have = 1;
        if (kind_is_paged(k)) {
            for (uint32_t i = 0; i < n_pages; i++)
                if (pages[i] >= r->spec.n_units)
                    return duet_err_set(err, DUET_ERR_INVALID, "expect: page %u out of range (%u pages)",
                                        pages[i], r->spec.n_units);
        } else if (slot != DUET_XFER_NO_SLOT && slot >= r->spec.n_units) {
            return duet_err_set(err, DUET_ERR_INVALID, "expect: slot %u out of range (%u slots)", slot,
                                r->spec.n_units);
        }
    }
    if (!have)
        return duet_err_set(err, DUET_ERR_STATE, "expect: no pool registered");

    duet_xfer_desc_t d = {0};
    recv_t *r = DUET_NEW(recv_t);
    cmd_t *c = cmd_new(CMD_RECV_EXPECT);
    d.address = malloc(x->addr_len);
    d.page_ids = duet_malloc_array(n_pages ? n_pages : 1, sizeof(uint32_t));
    if (r)
        r->pages = duet_malloc_array(n_pages ? n_pages : 1, sizeof(uint32_t));
    if (!r || !c || !d.address || !d.page_ids || !r->pages)
        goto nomem;
    d.worker_id = x->id;
    snprintf(d.rid, sizeof d.rid, "%s", rid);
    d.epoch = epoch;
    d.page_tokens = x->page_tokens;
    d.address_len = (uint32_t)x->addr_len;
    memcpy(d.address, x->addr, x->addr_len);
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const pool_reg_t *pr = &x->pools[k];
        if (!pr->registered)
            continue;
        duet_xfer_pool_desc_t *pd = &d.pools[d.n_pools++];
        pd->kind = (duet_pool_kind_t)k;
        pd->fingerprint = pr->spec.layout.fingerprint;
        pd->remote_base = (uint64_t)(uintptr_t)pr->spec.base;
        pd->page_bytes = pr->spec.layout.page_bytes;
        pd->n_units = pr->spec.n_units;
        pd->n_layers = pr->spec.layout.n_layers;
        pd->flags = pr->device ? DUET_XFER_POOL_DEVICE : 0;
        pd->rkey_len = (uint32_t)pr->rkey_len;
        pd->rkey = malloc(pr->rkey_len);
        if (!pd->rkey)
            goto nomem;
        memcpy(pd->rkey, pr->rkey_buf, pr->rkey_len);
    }
    d.n_pages = n_pages;
    if (n_pages)
        memcpy(d.page_ids, pages, (size_t)n_pages * sizeof(uint32_t));
    d.slot = slot;

    uint32_t nb = 0;
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        if (x->pools[k].registered && kind_is_paged(k) && x->pools[k].spec.n_units > nb)
            nb = x->pools[k].spec.n_units;
    r->unit_bits = calloc((size_t)nb / 8 + 1, 1);
    if (!r->unit_bits)
        goto nomem;
    r->unit_bits_n = nb;
    for (uint32_t i = 0; i < n_pages; i++)
        r->unit_bits[pages[i] >> 3] |= (uint8_t)(1u << (pages[i] & 7));
    snprintf(r->rid, sizeof r->rid, "%s", rid);
    r->epoch = epoch;
    r->user = user;
    if (n_pages)
        memcpy(r->pages, pages, (size_t)n_pages * sizeof(uint32_t));
    r->n_pages = n_pages;
    r->slot = slot;
    r->deadline_ns = deadline_ns;
    STAT_ADD(x, recvs_pending, 1);
    pthread_mutex_lock(&x->cmd_lock);
    r->next = x->new_recvs;
    x->new_recvs = r;
    pthread_mutex_unlock(&x->cmd_lock);
    cmd_push(x, c); /* wakes the thread */
    *desc = d;
    return DUET_OK;

nomem:
    duet_xfer_desc_fini(&d);
    if (r) {
        free(r->pages);
        free(r->unit_bits);
    }
    free(r);
    free(c);
    return duet_err_set(err, DUET_ERR_NOMEM, "expect: out of memory");
}

duet_status_t duet_xfer_recv_cancel(duet_xfer_t *x, const char *rid, uint64_t epoch)
{
    if (!rid_ok(rid))
        return DUET_ERR_INVALID;
    cmd_t *c = cmd_new(CMD_RECV_CANCEL);
    if (!c)
        return DUET_ERR_NOMEM;
    snprintf(c->rid, sizeof c->rid, "%s", rid);
    c->epoch = epoch;
    cmd_push(x, c);
    return DUET_OK;
}

/* --------------------------------------------------------------- sending */

/* The descriptor's pools must be exactly the sender's pools, layout for layout. */
static duet_status_t check_layouts(const duet_xfer_t *x, const duet_xfer_desc_t *d, duet_err_t *err)
{
    int seen[DUET_POOL_COUNT] = {0};
    if (d->page_tokens != x->page_tokens)
        return duet_err_set(err, DUET_ERR_LAYOUT_MISMATCH, "page_tokens %u, the sender's %u",
                            d->page_tokens, x->page_tokens);
    for (uint32_t i = 0; i < d->n_pools; i++) {
        const duet_xfer_pool_desc_t *pd = &d->pools[i];
        const pool_reg_t *r = &x->pools[pd->kind];
        const char *kn = duet_pool_kind_name(pd->kind);
        seen[pd->kind] = 1;
        if (!r->registered)
            return duet_err_set(err, DUET_ERR_LAYOUT_MISMATCH, "pool %s: the sender has no such pool", kn);
        if (pd->fingerprint != r->spec.layout.fingerprint)
            return duet_err_set(err, DUET_ERR_LAYOUT_MISMATCH,
                                "pool %s: fingerprint %016" PRIx64 ", the sender's %016" PRIx64, kn,
                                pd->fingerprint, r->spec.layout.fingerprint);
        if (pd->page_bytes != r->spec.layout.page_bytes || pd->n_layers != r->spec.layout.n_layers)
            return duet_err_set(err, DUET_ERR_LAYOUT_MISMATCH,
                                "pool %s: %" PRIu64 " bytes x %u layers, the sender's %" PRIu64 " x %u",
                                kn, pd->page_bytes, pd->n_layers, r->spec.layout.page_bytes,
                                r->spec.layout.n_layers);
    }
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        if (x->pools[k].registered && !seen[k])
            return duet_err_set(err, DUET_ERR_LAYOUT_MISMATCH, "pool %s: the receiver has no such pool",
                                duet_pool_kind_name((duet_pool_kind_t)k));
    return DUET_OK;
}

duet_status_t duet_xfer_send_begin(duet_xfer_t *x, const duet_xfer_desc_t *desc,
                                   const uint32_t *local_pages, uint32_t n_pages,
                                   uint32_t local_slot, uint64_t user, uint64_t *tid,
                                   duet_err_t *err)
{
    duet_status_t st = duet_xfer_desc_validate(desc, err);
    if (st != DUET_OK)
        return st;
    st = check_layouts(x, desc, err);
    if (st != DUET_OK) {
        duet_log_rid(DUET_LOG_WARN, desc->rid, "xfer %s: descriptor refused: %s", x->name,
                     err ? err->msg : "layout mismatch");
        return st;
    }
    if (n_pages != desc->n_pages || (n_pages && !local_pages))
        return duet_err_set(err, DUET_ERR_INVALID, "begin: %u local pages for %u remote pages", n_pages,
                            desc->n_pages);
    if ((local_slot == DUET_XFER_NO_SLOT) != (desc->slot == DUET_XFER_NO_SLOT))
        return duet_err_set(err, DUET_ERR_INVALID, "begin: slot given on one side only");
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const pool_reg_t *r = &x->pools[k];
        if (!r->registered)
            continue;
        if (kind_is_paged(k)) {
            for (uint32_t i = 0; i < n_pages; i++)
                if (local_pages[i] >= r->spec.n_units)
                    return duet_err_set(err, DUET_ERR_RANGE, "begin: local page %u out of range (%u)",
                                        local_pages[i], r->spec.n_units);
        } else if (local_slot != DUET_XFER_NO_SLOT && local_slot >= r->spec.n_units) {
            return duet_err_set(err, DUET_ERR_RANGE, "begin: local slot %u out of range (%u)",
                                local_slot, r->spec.n_units);
        }
    }
    send_t *t = DUET_NEW(send_t);
    cmd_t *c = cmd_new(CMD_SEND_BEGIN);
    if (!t || !c)
        goto nomem;
    if (duet_xfer_desc_copy(desc, &t->desc) != DUET_OK)
        goto nomem;
    t->local_pages = duet_malloc_array(n_pages ? n_pages : 1, sizeof(uint32_t));
    t->runs = duet_malloc_array(n_pages ? n_pages : 1, sizeof(run_t));
    if (!t->local_pages || !t->runs)
        goto nomem;
    if (n_pages)
        memcpy(t->local_pages, local_pages, (size_t)n_pages * sizeof(uint32_t));
    t->n_pages = n_pages;
    t->local_slot = local_slot;
    /* contiguous runs: local and remote ids both consecutive */
    for (uint32_t i = 0; i < n_pages;) {
        uint32_t j = i + 1;
        while (j < n_pages && local_pages[j] == local_pages[j - 1] + 1 &&
               desc->page_ids[j] == desc->page_ids[j - 1] + 1)
            j++;
        t->runs[t->n_runs++] = (run_t){local_pages[i], desc->page_ids[i], j - i};
        i = j;
    }
    for (int k = 0; k < DUET_POOL_COUNT; k++)
        t->dpi[k] = -1;
    for (uint32_t i = 0; i < desc->n_pools; i++)
        t->dpi[desc->pools[i].kind] = (int)i;
    t->tid = atomic_fetch_add(&x->next_tid, 1);
    t->user = user;
    t->first_token = -1;
    c->obj = t;
    STAT_ADD(x, sends_active, 1);
    *tid = t->tid;
    cmd_push(x, c);
    return DUET_OK;

nomem:
    if (t) {
        duet_xfer_desc_fini(&t->desc);
        free(t->local_pages);
        free(t->runs);
    }
    free(t);
    free(c);
    return duet_err_set(err, DUET_ERR_NOMEM, "begin: out of memory");
}

duet_status_t duet_xfer_send_put(duet_xfer_t *x, uint64_t tid, int pool, uint32_t layer)
{
    if (pool != DUET_XFER_ALL_POOLS) {
        if (pool < 0 || pool >= DUET_POOL_COUNT || !x->pools[pool].registered)
            return DUET_ERR_INVALID;
        if (layer != DUET_XFER_ALL_LAYERS && layer >= x->pools[pool].spec.layout.n_layers)
            return DUET_ERR_INVALID;
    } else if (layer != DUET_XFER_ALL_LAYERS) {
        return DUET_ERR_INVALID; /* one layer index means different layers in different pools */
    }
    cmd_t *c = cmd_new(CMD_SEND_PUT);
    if (!c)
        return DUET_ERR_NOMEM;
    c->tid = tid;
    c->pool = pool;
    c->layer = layer;
    cmd_push(x, c);
    return DUET_OK;
}

duet_status_t duet_xfer_send_finish(duet_xfer_t *x, uint64_t tid, int32_t first_token, uint32_t cached_tokens)
{
    cmd_t *c = cmd_new(CMD_SEND_FINISH);
    if (!c)
        return DUET_ERR_NOMEM;
    c->tid = tid;
    c->first_token = first_token;
    c->cached_tokens = cached_tokens;
    cmd_push(x, c);
    return DUET_OK;
}

duet_status_t duet_xfer_send_abort(duet_xfer_t *x, uint64_t tid)
{
    cmd_t *c = cmd_new(CMD_SEND_ABORT);
    if (!c)
        return DUET_ERR_NOMEM;
    c->tid = tid;
    cmd_push(x, c);
    return DUET_OK;
}

/* ----------------------------------------------------------- descriptors */

void duet_xfer_desc_fini(duet_xfer_desc_t *d)
{
    if (!d)
        return;
    free(d->address);
    free(d->page_ids);
    for (uint32_t i = 0; i < DUET_POOL_COUNT; i++)
        free(d->pools[i].rkey);
    memset(d, 0, sizeof *d);
}

duet_status_t duet_xfer_desc_copy(const duet_xfer_desc_t *s, duet_xfer_desc_t *d)
{
    *d = *s;
    d->address = NULL;
    d->page_ids = NULL;
    for (uint32_t i = 0; i < DUET_POOL_COUNT; i++)
        d->pools[i].rkey = NULL;
    d->address = malloc(s->address_len ? s->address_len : 1);
    d->page_ids = duet_malloc_array(s->n_pages ? s->n_pages : 1, sizeof(uint32_t));
    if (!d->address || !d->page_ids)
        goto nomem;
    if (s->address_len)
        memcpy(d->address, s->address, s->address_len);
    if (s->n_pages)
        memcpy(d->page_ids, s->page_ids, (size_t)s->n_pages * sizeof(uint32_t));
    for (uint32_t i = 0; i < s->n_pools && i < DUET_POOL_COUNT; i++) {
        d->pools[i].rkey = malloc(s->pools[i].rkey_len ? s->pools[i].rkey_len : 1);
        if (!d->pools[i].rkey)
            goto nomem;
        if (s->pools[i].rkey_len)
            memcpy(d->pools[i].rkey, s->pools[i].rkey, s->pools[i].rkey_len);
    }
    return DUET_OK;
nomem:
    duet_xfer_desc_fini(d);
    return DUET_ERR_NOMEM;
}

duet_status_t duet_xfer_desc_validate(const duet_xfer_desc_t *d, duet_err_t *err)
{
    if (!d)
        return duet_err_set(err, DUET_ERR_INVALID, "descriptor: NULL");
    if (!memchr(d->rid, 0, sizeof d->rid) || d->rid[0] == 0)
        return duet_err_set(err, DUET_ERR_INVALID, "descriptor: bad request id");
    if (!d->address || d->address_len == 0 || d->address_len > MAX_BLOB)
        return duet_err_set(err, DUET_ERR_INVALID, "descriptor: worker address of %u bytes", d->address_len);
    if (d->n_pools == 0 || d->n_pools > DUET_POOL_COUNT)
        return duet_err_set(err, DUET_ERR_INVALID, "descriptor: %u pools", d->n_pools);
    if (d->n_pages > DUET_XFER_MAX_PAGES || (d->n_pages && !d->page_ids))
        return duet_err_set(err, DUET_ERR_INVALID, "descriptor: %u pages", d->n_pages);
    int seen[DUET_POOL_COUNT] = {0};
    for (uint32_t i = 0; i < d->n_pools; i++) {
        const duet_xfer_pool_desc_t *p = &d->pools[i];
        if ((int)p->kind < 0 || p->kind >= DUET_POOL_COUNT || seen[p->kind])
            return duet_err_set(err, DUET_ERR_INVALID, "descriptor: pool %u has a bad or repeated kind", i);
        seen[p->kind] = 1;
        const char *kn = duet_pool_kind_name(p->kind);
        if (!p->rkey || p->rkey_len == 0 || p->rkey_len > MAX_BLOB)
            return duet_err_set(err, DUET_ERR_INVALID, "descriptor: pool %s remote key of %u bytes", kn,
                                p->rkey_len);
        if (p->page_bytes == 0 || p->n_units == 0 || p->n_layers == 0)
            return duet_err_set(err, DUET_ERR_INVALID, "descriptor: pool %s is empty", kn);
        uint64_t units = (uint64_t)p->n_layers * p->n_units;
        if (p->page_bytes > UINT64_MAX / units || p->remote_base > UINT64_MAX - units * p->page_bytes)
            return duet_err_set(err, DUET_ERR_RANGE, "descriptor: pool %s extent overflows", kn);
        if (kind_is_paged(p->kind)) {
            for (uint32_t j = 0; j < d->n_pages; j++)
                if (d->page_ids[j] >= p->n_units)
                    return duet_err_set(err, DUET_ERR_RANGE, "descriptor: page %u out of range in pool %s (%u)",
                                        d->page_ids[j], kn, p->n_units);
        } else if (d->slot != DUET_XFER_NO_SLOT && d->slot >= p->n_units) {
            return duet_err_set(err, DUET_ERR_RANGE, "descriptor: slot %u out of range in pool %s (%u)",
                                d->slot, kn, p->n_units);
        }
    }
    return DUET_OK;
}

/* flat form */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    int bad;
} wbuf_t;

static void w_bytes(wbuf_t *w, const void *src, size_t n)
{
    if (w->bad)
        return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *p = realloc(w->p, cap);
        if (!p) {
            w->bad = 1;
            return;
        }
        w->p = p;
        w->cap = cap;
    }
    memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void w_u32(wbuf_t *w, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    w_bytes(w, b, 4);
}

static void w_u64(wbuf_t *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    w_bytes(w, b, 8);
}

duet_status_t duet_xfer_desc_pack(const duet_xfer_desc_t *d, uint8_t **buf, size_t *len)
{
    wbuf_t w = {0};
    w_u32(&w, DESC_MAGIC);
    w_u64(&w, d->worker_id);
    w_bytes(&w, d->rid, sizeof d->rid);
    w_u64(&w, d->epoch);
    w_u32(&w, d->page_tokens);
    w_u32(&w, d->address_len);
    w_bytes(&w, d->address, d->address_len);
    w_u32(&w, d->n_pools);
    for (uint32_t i = 0; i < d->n_pools && i < DUET_POOL_COUNT; i++) {
        const duet_xfer_pool_desc_t *p = &d->pools[i];
        w_u32(&w, (uint32_t)p->kind);
        w_u64(&w, p->fingerprint);
        w_u64(&w, p->remote_base);
        w_u64(&w, p->page_bytes);
        w_u32(&w, p->n_units);
        w_u32(&w, p->n_layers);
        w_u32(&w, p->flags);
        w_u32(&w, p->rkey_len);
        w_bytes(&w, p->rkey, p->rkey_len);
    }
    w_u32(&w, d->n_pages);
    for (uint32_t i = 0; i < d->n_pages; i++)
        w_u32(&w, d->page_ids[i]);
    w_u32(&w, d->slot);
    if (w.bad) {
        free(w.p);
        return DUET_ERR_NOMEM;
    }
    *buf = w.p;
    *len = w.len;
    return DUET_OK;
}

typedef struct {
    const uint8_t *p;
    size_t len, off;
    int bad;
} rbuf_t;

static const uint8_t *r_take(rbuf_t *r, size_t n)
{
    if (r->bad || n > r->len - r->off) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}

static uint32_t r_u32(rbuf_t *r)
{
    const uint8_t *b = r_take(r, 4);
    uint32_t v = 0;
    for (int i = 0; b && i < 4; i++)
        v |= (uint32_t)b[i] << (8 * i);
    return v;
}

static uint64_t r_u64(rbuf_t *r)
{
    const uint8_t *b = r_take(r, 8);
    uint64_t v = 0;
    for (int i = 0; b && i < 8; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static uint8_t *r_blob(rbuf_t *r, uint32_t n)
{
    if (n == 0 || n > MAX_BLOB) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *s = r_take(r, n);
    if (!s)
        return NULL;
    uint8_t *p = malloc(n);
    if (!p) {
        r->bad = 1;
        return NULL;
    }
    memcpy(p, s, n);
    return p;
}

duet_status_t duet_xfer_desc_unpack(const uint8_t *buf, size_t len, duet_xfer_desc_t *d, duet_err_t *err)
{
    rbuf_t r = {.p = buf, .len = len};
    memset(d, 0, sizeof *d);
    if (r_u32(&r) != DESC_MAGIC)
        return duet_err_set(err, DUET_ERR_PARSE, "descriptor: bad magic");
    d->worker_id = r_u64(&r);
    const uint8_t *rid = r_take(&r, sizeof d->rid);
    if (rid)
        memcpy(d->rid, rid, sizeof d->rid);
    d->epoch = r_u64(&r);
    d->page_tokens = r_u32(&r);
    d->address_len = r_u32(&r);
    d->address = r_blob(&r, d->address_len);
    d->n_pools = r_u32(&r);
    if (d->n_pools > DUET_POOL_COUNT)
        r.bad = 1;
    for (uint32_t i = 0; !r.bad && i < d->n_pools; i++) {
        duet_xfer_pool_desc_t *p = &d->pools[i];
        p->kind = (duet_pool_kind_t)r_u32(&r);
        p->fingerprint = r_u64(&r);
        p->remote_base = r_u64(&r);
        p->page_bytes = r_u64(&r);
        p->n_units = r_u32(&r);
        p->n_layers = r_u32(&r);
        p->flags = r_u32(&r);
        p->rkey_len = r_u32(&r);
        p->rkey = r_blob(&r, p->rkey_len);
    }
    d->n_pages = r_u32(&r);
    if (d->n_pages > DUET_XFER_MAX_PAGES || (size_t)d->n_pages * 4 > len)
        r.bad = 1;
    if (!r.bad) {
        d->page_ids = duet_malloc_array(d->n_pages ? d->n_pages : 1, sizeof(uint32_t));
        if (!d->page_ids)
            r.bad = 1;
        for (uint32_t i = 0; !r.bad && i < d->n_pages; i++)
            d->page_ids[i] = r_u32(&r);
    }
    d->slot = r_u32(&r);
    if (r.bad || r.off != len) {
        duet_xfer_desc_fini(d);
        return duet_err_set(err, DUET_ERR_TRUNCATED, "descriptor: truncated or trailing bytes");
    }
    duet_status_t st = duet_xfer_desc_validate(d, err);
    if (st != DUET_OK)
        duet_xfer_desc_fini(d); /* on failure the descriptor is left empty */
    return st;
}
