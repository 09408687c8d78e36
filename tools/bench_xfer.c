/* duet-bench-xfer: page transfer bandwidth of the UCX data plane between two
 * processes on this machine, printed beside ucx_perftest's ucp_put_bw over
 * the same transport at the same sizes (`duet bench xfer`).
 *
 *   duet-bench-xfer [--tls tcp] [--devices lo] [--path auto|rma|am]
 *                   [--sizes 4K,16K,64K,256K,1M,4M] [--mib 256] [--reps 3] [--am-chunk 64K]
 *                   [--no-perftest] [--no-pools] [--perftest PATH]
 *
 * Part 1 (page-run sizes): a synthetic pool of 4 KiB pages; a run of k
 * consecutive pages on both sides is one coalesced put of k * 4 KiB; runs are
 * separated by a gap so they cannot merge.  Each measurement moves
 * N * SIZE bytes, N = max(--mib MiB / SIZE, 500) (puts of the same runs
 * repeated), timed from send_begin to the TransferDone completion, window
 * and flush included.  ucx_perftest runs `-t ucp_put_bw -s SIZE -n N
 * -w N/10` with -e (peer error handling, as duet's endpoints) and without it.
 * duet and ucx_perftest alternate; best of --reps for each.
 *
 * Part 2 (pool layouts): a DeepSeek-V4-Flash-shaped cache (43 layers, real
 * layouts from duet_cache_layout_compute, fp8 and bf16), one request of 64
 * pages, every layer of one pool per measurement.
 *
 * GB/s are 10^9 bytes per second; ucx_perftest's MB/s (2^20) are converted.
 *
 * GPU mode (CUDA builds):
 *
 *   duet-bench-xfer --gpu A,B [--tls T] [--path auto|rma|am] [--staging-path auto|rma|am]
 *                   [--sizes ..] [--mib N] [--reps N] [--am-chunk SIZE] [--no-pools] [--ucx-info]
 *
 * The sender process works on cuda:A, the receiver (forked, as above) on
 * cuda:B; the same two parts (page-run sizes, V4-Flash pool layouts) move
 * pages from pools in device memory on A into pools in device memory on B
 * along two paths, each timed from send_begin to the receiver's answer:
 *   direct   the device pools registered with UCX (DUET_XFER_POOL_DEVICE):
 *            ucp_put_nbx device to device (cuda_ipc over NVLink) when UCX
 *            reports CUDA memory support; otherwise one line says so;
 *   staging  host mirror pools in pinned memory registered instead: each
 *            round, one batched page-copy kernel gathers the request's units
 *            device -> pinned host before its puts; the receiver scatters
 *            them pinned host -> device (the same kernel) after TransferDone.
 * Beside them, two ceilings measured in the same run by the sender: a 1 GiB
 * cudaMemcpyPeer A -> B (NVLink where the pair has peer access) and 1 GiB
 * pinned host <-> device copies on A.  The first repetition of each
 * measurement is checked on the receiver: every transferred unit equal to
 * the sender's (both pools are seeded random bytes).  UCX_TLS defaults to
 * sm,self,cuda_copy,cuda_ipc (with UCX_POSIX_ERROR_HANDLING=y); --ucx-info
 * sets UCX_LOG_LEVEL=info, so UCX prints each endpoint's transports
 * ("ep_cfg[..]: rma_bw(cuda_ipc/cuda) ..."). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache_layout.h"
#include "duet_config.h"
#if DUET_HAVE_CUDA
#include "duet_cuda.h"
#endif
#include "kv_cache.h"
#include "log.h"
#include "time_util.h"
#include "xfer.h"

#define RAW_PAGE 4096u
#define RAW_UNITS 32768u          /* 128 MiB raw pool per process */
#define MAX_SIZES 16

typedef struct {
    const char *tls, *devices, *path, *perftest;
    uint64_t sizes[MAX_SIZES];
    int n_sizes;
    uint64_t mib;
    int reps;
    int run_perftest, run_pools;
    int tls_given;
    const char *gpu, *staging_path; /* --gpu A,B and its staging path */
} opts_t;

/* ---------------------------------------------------------------- socket */

static void die(const char *what)
{
    fprintf(stderr, "duet-bench-xfer: %s\n", what);
    exit(1);
}

static void sk_send(int fd, const void *b, uint32_t n)
{
    if (send(fd, &n, 4, MSG_NOSIGNAL) != 4)
        die("peer process gone");
    for (size_t off = 0; off < n;) {
        ssize_t w = send(fd, (const uint8_t *)b + off, n - off, MSG_NOSIGNAL);
        if (w <= 0)
            die("peer process gone");
        off += (size_t)w;
    }
}

static void sk_read(int fd, void *b, size_t n)
{
    for (size_t off = 0; off < n;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 120000) <= 0)
            die("peer process silent for 120 s");
        ssize_t r = read(fd, (uint8_t *)b + off, n - off);
        if (r <= 0)
            die("peer process gone");
        off += (size_t)r;
    }
}

static uint8_t *sk_recv(int fd, uint32_t *n)
{
    sk_read(fd, n, 4);
    uint8_t *b = malloc(*n ? *n : 1);
    if (!b)
        die("out of memory");
    sk_read(fd, b, *n);
    return b;
}

/* One message of exactly `len` bytes into `dst`: anything else ends the run. */
static void sk_recv_into(int fd, void *dst, size_t len)
{
    uint32_t n;
    uint8_t *b = sk_recv(fd, &n);
    if (n != len)
        die("bad message");
    memcpy(dst, b, len);
    free(b);
}

/* ---------------------------------------------------------------- setup */

static void flash_config(duet_model_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->hidden_size = 4096;
    c->num_hidden_layers = 43;
    c->num_key_value_heads = 1;
    c->head_dim = 512;
    c->qk_rope_head_dim = 64;
    c->index_head_dim = 128;
    c->sliding_window = 128;
    int n = 0;
    c->compress_ratios[n++] = 0;
    c->compress_ratios[n++] = 0;
    for (int i = 0; i < 20; i++) {
        c->compress_ratios[n++] = 4;
        c->compress_ratios[n++] = 128;
    }
    c->compress_ratios[n++] = 4;
    c->n_compress_ratios = n;
}

static uint32_t g_am_chunk; /* --am-chunk (0: the engine's default) */

static duet_xfer_t *engine(const char *name, int verify)
{
    duet_xfer_opts_t o = {.name = name, .verify_checksums = verify, .skip_checksums = !verify,
                          .am_chunk_bytes = g_am_chunk};
    duet_xfer_t *x = NULL;
    duet_err_t err;
    duet_err_clear(&err);
    if (duet_xfer_create(&o, &x, &err) != DUET_OK) {
        fprintf(stderr, "duet-bench-xfer: %s\n", duet_err_text(&err));
        exit(1);
    }
    return x;
}

/* The synthetic pool of part 1: 4 KiB pages, one layer.  Its layout is a
 * real one with page_bytes replaced (a benchmark buffer, never a cache). */
static void raw_layout(duet_cache_layout_t *l)
{
    duet_model_config_t cfg;
    flash_config(&cfg);
    duet_cache_opts_t co = {.page_tokens = 256, .kv_dtype = DUET_CACHE_FP8, .index_k_dtype = DUET_CACHE_FP8};
    duet_err_t err;
    duet_err_clear(&err);
    if (duet_cache_layout_compute(&cfg, &co, DUET_POOL_C4_KV, l, &err) != DUET_OK)
        die(err.msg);
    l->page_bytes = RAW_PAGE;
    l->n_layers = 1;
    l->fingerprint = 0x62656e6368726177ull; /* "benchraw" */
}

static void raw_register(duet_xfer_t *x, uint8_t **mem)
{
    duet_cache_layout_t l;
    duet_err_t err;
    duet_err_clear(&err);
    raw_layout(&l);
    *mem = aligned_alloc(4096, (size_t)RAW_PAGE * RAW_UNITS);
    if (!*mem)
        die("out of memory");
    memset(*mem, 0x5a, (size_t)RAW_PAGE * RAW_UNITS);
    duet_xfer_pool_t p = {.layout = l, .page_tokens = 256, .base = *mem, .n_units = RAW_UNITS};
    if (duet_xfer_register_pool(x, &p, &err) != DUET_OK)
        die(err.msg);
}

/* Runs of k pages separated by one-page gaps; returns the page count. */
static uint32_t raw_pages(uint32_t k, uint32_t *ids)
{
    uint32_t runs = RAW_UNITS / (k + 1);
    if (runs > 4096)
        runs = 4096;
    uint32_t n = 0;
    for (uint32_t r = 0; r < runs; r++)
        for (uint32_t i = 0; i < k; i++)
            ids[n++] = r * (k + 1) + i;
    return n;
}

static duet_kv_cache_t *flash_cache(duet_cache_dtype_t dt)
{
    duet_model_config_t cfg;
    flash_config(&cfg);
    duet_cache_opts_t co = {.page_tokens = 256, .kv_dtype = dt, .index_k_dtype = dt};
    duet_kv_cache_t *c = NULL;
    duet_err_t err;
    duet_err_clear(&err);
    if (duet_kv_cache_create(&cfg, &co, 64, 2, &c, &err) != DUET_OK)
        die(err.msg);
    return c;
}

/* ---------------------------------------------------------------- receiver */

/* Commands from the sender: {op, a, b}. */
enum { OP_RAW = 1, OP_EXPECT_RAW, OP_POOLS, OP_EXPECT_POOLS, OP_END };

typedef struct {
    uint32_t op, a, b;
} cmdmsg_t;

/* The receiver's side of one transfer: expect it (request `rid`), send the descriptor to the
 * sender, wait (bounded) for the RECV event; returns its status. */
static int32_t expect_and_wait(int fd, duet_xfer_t *x, const char *rid, const uint32_t *ids, uint32_t n, uint32_t slot,
                               uint64_t seq)
{
    duet_xfer_desc_t d;
    duet_err_t err;
    duet_err_clear(&err);
    if (duet_xfer_recv_expect(x, rid, seq, ids, n, slot, duet_deadline_after_ms(120000), seq, &d, &err) != DUET_OK)
        die(err.msg);
    uint8_t *b;
    size_t len;
    if (duet_xfer_desc_pack(&d, &b, &len) != DUET_OK)
        die("pack");
    sk_send(fd, b, (uint32_t)len);
    free(b);
    duet_xfer_desc_fini(&d);
    duet_xfer_event_t ev;
    do {
        if (duet_xfer_wait(x, &ev, 120000) != DUET_OK)
            die("receiver: no event in 120 s");
    } while (ev.kind != DUET_XFER_EV_RECV);
    return ev.status;
}

static void expect_and_reply(int fd, duet_xfer_t *x, const uint32_t *ids, uint32_t n, uint32_t slot, uint64_t seq)
{
    char rid[32];
    snprintf(rid, sizeof rid, "bench-%" PRIu64, seq);
    int32_t st = expect_and_wait(fd, x, rid, ids, n, slot, seq);
    sk_send(fd, &st, sizeof st);
}

static int receiver_main(int fd)
{
    duet_log_set_ident("bench-recv");
    duet_xfer_t *x = NULL;
    duet_kv_cache_t *c = NULL;
    uint8_t *raw = NULL;
    uint32_t *ids = malloc(sizeof(uint32_t) * RAW_UNITS);
    uint64_t seq = 1;
    for (;;) {
        cmdmsg_t m;
        sk_recv_into(fd, &m, sizeof m);
        if (m.op == OP_END)
            break;
        if (m.op == OP_RAW || m.op == OP_POOLS) {
            duet_xfer_destroy(&x);
            duet_kv_cache_destroy(&c);
            free(raw);
            raw = NULL;
            x = engine("bench-recv", 0);
            if (m.op == OP_RAW) {
                raw_register(x, &raw);
            } else {
                c = flash_cache((duet_cache_dtype_t)m.a);
                duet_err_t err;
                duet_err_clear(&err);
                if (duet_xfer_register_cache(x, c, &err) != DUET_OK)
                    die(err.msg);
            }
            int32_t ok = 0;
            sk_send(fd, &ok, sizeof ok);
        } else if (m.op == OP_EXPECT_RAW) {
            uint32_t n = raw_pages(m.a, ids);
            expect_and_reply(fd, x, ids, n, DUET_XFER_NO_SLOT, seq++);
        } else if (m.op == OP_EXPECT_POOLS) {
            for (uint32_t i = 0; i < 64; i++)
                ids[i] = i;
            expect_and_reply(fd, x, ids, 64, 0, seq++);
        }
    }
    duet_xfer_destroy(&x);
    duet_kv_cache_destroy(&c);
    free(raw);
    free(ids);
    return 0;
}

/* ---------------------------------------------------------------- sender */

static void sender_cmd(int fd, uint32_t op, uint32_t a, uint32_t b)
{
    cmdmsg_t m = {op, a, b};
    sk_send(fd, &m, sizeof m);
    if (op == OP_RAW || op == OP_POOLS) {
        uint32_t n;
        free(sk_recv(fd, &n));
    }
}

/* The sender's side of one transfer, in two halves around its puts.  begin: the receiver's
 * descriptor from fd, then duet_xfer_send_begin (*t0: just before it).  end: finish, wait
 * (bounded) for the SEND event and the receiver's status, both OK or exit; *t_event (if not
 * NULL): when the event came; returns the bytes moved. */
static uint64_t peer_begin(int fd, duet_xfer_t *x, const uint32_t *local, uint32_t n_local, uint32_t slot,
                           duet_xfer_desc_t *d, double *t0)
{
    uint32_t len;
    uint8_t *b = sk_recv(fd, &len);
    duet_err_t err;
    duet_err_clear(&err);
    if (duet_xfer_desc_unpack(b, len, d, &err) != DUET_OK)
        die(err.msg);
    free(b);
    *t0 = duet_time_s();
    uint64_t tid;
    if (duet_xfer_send_begin(x, d, local, n_local, slot, 0, &tid, &err) != DUET_OK)
        die(duet_err_text(&err));
    return tid;
}

static uint64_t peer_end(int fd, duet_xfer_t *x, uint64_t tid, duet_xfer_desc_t *d, double *t_event)
{
    duet_xfer_send_finish(x, tid, 0, 0);
    duet_xfer_event_t ev;
    do {
        if (duet_xfer_wait(x, &ev, 120000) != DUET_OK)
            die("sender: no event in 120 s");
    } while (ev.kind != DUET_XFER_EV_SEND);
    if (t_event)
        *t_event = duet_time_s();
    if (ev.status != DUET_OK) {
        fprintf(stderr, "duet-bench-xfer: transfer failed: %s %s\n", duet_status_code(ev.status), ev.msg);
        exit(1);
    }
    int32_t rst;
    sk_recv_into(fd, &rst, sizeof rst);
    if (rst != DUET_OK) {
        fprintf(stderr, "duet-bench-xfer: receiver reports %s\n", duet_status_code(rst));
        exit(1);
    }
    duet_xfer_desc_fini(d);
    return ev.bytes;
}

/* One transfer: `rounds` repetitions of put(pool, all layers); seconds from begin to done. */
static double timed_transfer(int fd, duet_xfer_t *x, const uint32_t *local, uint32_t n_local, uint32_t slot,
                             int pool, uint32_t rounds, uint64_t *bytes)
{
    duet_xfer_desc_t d;
    double t0, t1;
    uint64_t tid = peer_begin(fd, x, local, n_local, slot, &d, &t0);
    for (uint32_t r = 0; r < rounds; r++)
        duet_xfer_send_put(x, tid, pool, DUET_XFER_ALL_LAYERS);
    *bytes = peer_end(fd, x, tid, &d, &t1);
    return t1 - t0;
}

/* ---------------------------------------------------------------- ucx_perftest */

/* Bandwidth in GB/s of `ucx_perftest -t ucp_put_bw` (client and server
 * processes on 127.0.0.1), or a negative value when it cannot run. */
static double perftest(const opts_t *o, uint64_t size, uint64_t iters, int errmode)
{
    static int port = 0;
    if (!port)
        port = 20000 + (int)(getpid() % 10000);
    port++;
    char s_size[32], s_iters[32], s_warm[32], s_port[16];
    snprintf(s_size, sizeof s_size, "%" PRIu64, size);
    snprintf(s_iters, sizeof s_iters, "%" PRIu64, iters);
    snprintf(s_warm, sizeof s_warm, "%" PRIu64, iters / 10 + 10);
    snprintf(s_port, sizeof s_port, "%d", port);
    pid_t srv = fork();
    if (srv == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        dup2(nul, 2);
        execlp(o->perftest, o->perftest, "-p", s_port, (char *)NULL);
        _exit(127);
    }
    usleep(400000);
    int pfd[2];
    if (pipe(pfd) != 0)
        return -1;
    pid_t cli = fork();
    if (cli == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 2);
        if (errmode)
            execlp(o->perftest, o->perftest, "127.0.0.1", "-p", s_port, "-t", "ucp_put_bw", "-s", s_size, "-n",
                   s_iters, "-w", s_warm, "-f", "-e", (char *)NULL);
        else
            execlp(o->perftest, o->perftest, "127.0.0.1", "-p", s_port, "-t", "ucp_put_bw", "-s", s_size, "-n",
                   s_iters, "-w", s_warm, "-f", (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    char out[8192];
    size_t n = 0;
    for (;;) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (poll(&p, 1, 120000) <= 0)
            break;
        ssize_t r = read(pfd[0], out + n, sizeof out - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n == sizeof out - 1)
            break;
    }
    out[n] = 0;
    close(pfd[0]);
    kill(cli, SIGKILL);
    waitpid(cli, NULL, 0);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    /* with -f the last line is "iters lat50 lat_avg lat_all bw_avg bw_all rate_avg rate_all" */
    double bw = -1;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        double it, l1, l2, l3, bw_avg, bw_all;
        if (sscanf(line, "%lf %lf %lf %lf %lf %lf", &it, &l1, &l2, &l3, &bw_avg, &bw_all) == 6)
            bw = bw_all * 1048576.0 / 1e9;
    }
    return bw;
}

/* ---------------------------------------------------------------- main */

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k')
        v *= 1024;
    else if (*end == 'M' || *end == 'm')
        v *= 1048576;
    return (uint64_t)v;
}

static void usage(void)
{
    fprintf(stderr, "usage: duet-bench-xfer [--tls T] [--devices D] [--path auto|rma|am] [--sizes 4K,..,4M]\n"
                    "                       [--mib N] [--reps N] [--am-chunk SIZE] [--perftest PATH]\n"
                    "                       [--no-perftest] [--no-pools] [--ucx-info]\n"
                    "                       [--gpu A,B [--staging-path auto|rma|am]]   (CUDA builds)\n");
    exit(2);
}

static const char *fmt_size(uint64_t s, char *b, size_t n)
{
    if (s >= 1048576 && s % 1048576 == 0)
        snprintf(b, n, "%" PRIu64 " MiB", s / 1048576);
    else
        snprintf(b, n, "%" PRIu64 " KiB", s / 1024);
    return b;
}

/* ---------------------------------------------------------------- GPU mode */

#if DUET_HAVE_CUDA

#define G_PAGES 64             /* part 2: pages of the request (and 2 slots per slot pool) */
#define G_SEED_SEND 1000u      /* pool k of the sender is seeded random bytes G_SEED_SEND + k */
#define G_SEED_RECV 2000u
#define G_BOUNCE (32u << 20)   /* the engine's staging buffer (pinned) */
#define G_MAX_UNITS (RAW_UNITS + 64u * 64u)

enum { G_SETUP = 1, G_EXPECT, G_END };

typedef struct {
    uint32_t op;
    uint32_t part;   /* 0: raw 4 KiB pages; 1: V4-Flash pools */
    uint32_t dtype;  /* part 1 */
    uint32_t staged; /* 0: direct (device pools registered); 1: staging (pinned host mirrors registered) */
    uint32_t path;   /* DUET_XFER_PATH_* */
    uint32_t k;      /* part 0: pages per run */
    uint32_t pool;   /* the pool moved */
    uint32_t rounds;
    uint32_t verify; /* check the transferred units after answering */
} gmsg_t;

typedef struct {
    int32_t status;
    char msg[200];
} greply_t;

/* One side: its device, two CUDA contexts (the bench's thread; the engine's
 * progress thread, for the staging ops), its pools and its engine. */
typedef struct {
    int dev;
    const char *name;
    duet_cuda_t *c, *stg;
    duet_cuda_copy_t *list;
    uint32_t list_cap;
    void *bounce;
    duet_xfer_staging_t ops;
    duet_xfer_t *x;
    int staged;
    uint64_t seed;
    int have[DUET_POOL_COUNT];
    duet_cache_layout_t layout[DUET_POOL_COUNT];
    uint32_t n_units[DUET_POOL_COUNT];
    uint8_t *dpool[DUET_POOL_COUNT], *hpool[DUET_POOL_COUNT];
    uint32_t *units;
} gside_t;

static void gdie(duet_cuda_t *c, const char *what)
{
    fprintf(stderr, "duet-bench-xfer: %s: %s\n", what, c ? duet_err_text(duet_cuda_error(c)) : "no CUDA context");
    exit(1);
}

#define GCK(c, expr)                                                                                               \
    do {                                                                                                           \
        if ((expr) != DUET_OK)                                                                                     \
            gdie((c), #expr);                                                                                      \
    } while (0)

/* The engine's staging ops: one copy_list launch for the whole list, then wait. */
static duet_status_t g_copy(void *ctx, const duet_xfer_copy_t *cp, uint32_t n)
{
    gside_t *g = ctx;
    if (n > g->list_cap) {
        duet_cuda_copy_t *l = realloc(g->list, sizeof *l * n);
        if (!l)
            return DUET_ERR_NOMEM;
        g->list = l;
        g->list_cap = n;
    }
    for (uint32_t i = 0; i < n; i++)
        g->list[i] = (duet_cuda_copy_t){.dst = cp[i].dst, .src = cp[i].src, .bytes = cp[i].bytes};
    duet_status_t st = duet_cuda_copy_list(g->stg, g->list, n);
    if (st == DUET_OK)
        st = duet_cuda_sync(g->stg);
    if (st != DUET_OK)
        fprintf(stderr, "duet-bench-xfer: %s: staging copy: %s\n", g->name, duet_err_text(duet_cuda_error(g->stg)));
    return st;
}

static duet_status_t g_bind(void *arg)
{
    gside_t *g = arg;
    return duet_cuda_bind(g->stg);
}

static void g_init(gside_t *g, int dev, const char *name, uint64_t seed)
{
    memset(g, 0, sizeof *g);
    g->dev = dev;
    g->name = name;
    g->seed = seed;
    duet_err_t err;
    duet_err_clear(&err);
    if (duet_cuda_create(dev, &g->c, &err) != DUET_OK || duet_cuda_create(dev, &g->stg, &err) != DUET_OK) {
        fprintf(stderr, "duet-bench-xfer: %s: cuda:%d: %s\n", name, dev, duet_err_text(&err));
        exit(1);
    }
    GCK(g->c, duet_cuda_host_alloc(g->c, &g->bounce, G_BOUNCE));
    g->ops = (duet_xfer_staging_t){.ctx = g, .d2h = g_copy, .h2d = g_copy, .host = g->bounce,
                                   .staging_bytes = G_BOUNCE};
    g->units = malloc(sizeof(uint32_t) * G_MAX_UNITS);
    if (!g->units)
        die("out of memory");
}

static void g_teardown(gside_t *g)
{
    duet_xfer_destroy(&g->x);
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        duet_cuda_free(g->c, g->dpool[k]);
        duet_cuda_host_free(g->c, g->hpool[k]);
        g->dpool[k] = g->hpool[k] = NULL;
        g->have[k] = 0;
    }
}

static void g_fini(gside_t *g)
{
    g_teardown(g);
    duet_cuda_host_free(g->c, g->bounce);
    duet_cuda_destroy(&g->stg);
    duet_cuda_destroy(&g->c);
    free(g->list);
    free(g->units);
}

static size_t g_pool_bytes(const gside_t *g, int k)
{
    return (size_t)g->layout[k].n_layers * g->n_units[k] * g->layout[k].page_bytes;
}

/* Engine and pools for one measurement series: device pools registered as
 * such (direct), or pinned host mirrors registered (staged).  Device pools
 * hold seeded random bytes. */
static duet_status_t g_setup(gside_t *g, const gmsg_t *m, char *msg, size_t msg_len)
{
    g_teardown(g);
    g->staged = (int)m->staged;
    duet_xfer_opts_t o = {.name = g->name, .skip_checksums = 1, .am_chunk_bytes = g_am_chunk,
                          .data_path = (int)m->path, .staging = &g->ops, .thread_init = g_bind,
                          .thread_init_arg = g};
    duet_err_t err;
    duet_err_clear(&err);
    duet_status_t st = duet_xfer_create(&o, &g->x, &err);
    if (st != DUET_OK) {
        snprintf(msg, msg_len, "%s", duet_err_text(&err));
        return st;
    }
    if (!g->staged && !duet_xfer_cuda_capable(g->x)) {
        snprintf(msg, msg_len, "this UCX reports no CUDA memory support (a UCX built with CUDA: cuda_copy, "
                               "cuda_ipc)");
        return DUET_ERR_UNSUPPORTED;
    }
    if (m->part == 0) {
        g->have[DUET_POOL_C4_KV] = 1;
        raw_layout(&g->layout[DUET_POOL_C4_KV]);
        g->n_units[DUET_POOL_C4_KV] = RAW_UNITS;
    } else {
        duet_model_config_t cfg;
        flash_config(&cfg);
        duet_cache_opts_t co = {.page_tokens = 256, .kv_dtype = (duet_cache_dtype_t)m->dtype,
                                .index_k_dtype = (duet_cache_dtype_t)m->dtype};
        for (int k = 0; k < DUET_POOL_COUNT; k++) {
            if (duet_cache_layout_compute(&cfg, &co, (duet_pool_kind_t)k, &g->layout[k], &err) != DUET_OK)
                die(err.msg);
            g->have[k] = g->layout[k].n_layers > 0;
            g->n_units[k] = g->layout[k].paged ? G_PAGES : 2;
        }
    }
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        if (!g->have[k])
            continue;
        size_t bytes = g_pool_bytes(g, k);
        GCK(g->c, duet_cuda_malloc(g->c, (void **)&g->dpool[k], bytes));
        GCK(g->c, duet_cuda_fill_random(g->c, g->dpool[k], bytes, DUET_DT_U8, g->seed + (uint64_t)k));
        if (g->staged) {
            GCK(g->c, duet_cuda_host_alloc(g->c, (void **)&g->hpool[k], bytes));
            memset(g->hpool[k], 0, bytes);
        }
        duet_xfer_pool_t p = {.layout = g->layout[k], .page_tokens = 256,
                              .base = g->staged ? g->hpool[k] : g->dpool[k], .n_units = g->n_units[k],
                              .flags = g->staged ? 0 : DUET_XFER_POOL_DEVICE};
        st = duet_xfer_register_pool(g->x, &p, &err);
        if (st != DUET_OK) {
            snprintf(msg, msg_len, "%s", duet_err_text(&err));
            return st;
        }
    }
    GCK(g->c, duet_cuda_sync(g->c));
    return DUET_OK;
}

/* Unit indices (layer * n_units + unit) of a request's units in pool k, every layer. */
static uint32_t g_units(gside_t *g, int k, const uint32_t *ids, uint32_t n, uint32_t slot)
{
    const duet_cache_layout_t *l = &g->layout[k];
    uint32_t cnt = 0;
    for (uint32_t layer = 0; layer < l->n_layers; layer++) {
        if (l->paged) {
            for (uint32_t i = 0; i < n && cnt < G_MAX_UNITS; i++)
                g->units[cnt++] = layer * g->n_units[k] + ids[i];
        } else if (cnt < G_MAX_UNITS) {
            g->units[cnt++] = layer * g->n_units[k] + slot;
        }
    }
    return cnt;
}

/* The request of a measurement: part 0 runs of k pages (both sides the same
 * ids, no slot); part 1 pages 0..63 and the sender's slot 1 into the receiver's 0. */
static uint32_t g_request(const gmsg_t *m, uint32_t *ids, uint32_t *slot, int sender)
{
    if (m->part == 0) {
        *slot = DUET_XFER_NO_SLOT;
        return raw_pages(m->k, ids);
    }
    for (uint32_t i = 0; i < G_PAGES; i++)
        ids[i] = i;
    *slot = sender ? 1 : 0;
    return G_PAGES;
}

/* Receiver: units of pool k that were transferred differ from the sender's? */
static uint64_t g_verify(gside_t *g, const gmsg_t *m, const uint32_t *ids, uint32_t n, uint32_t slot)
{
    int k = (int)m->pool;
    size_t bytes = g_pool_bytes(g, k);
    uint64_t pb = g->layout[k].page_bytes;
    uint8_t *ref_d = NULL, *ref = malloc(bytes), *got = malloc(bytes);
    if (!ref || !got)
        die("out of memory");
    GCK(g->c, duet_cuda_malloc(g->c, (void **)&ref_d, bytes));
    GCK(g->c, duet_cuda_fill_random(g->c, ref_d, bytes, DUET_DT_U8, G_SEED_SEND + (uint64_t)k));
    GCK(g->c, duet_cuda_sync(g->c));
    GCK(g->c, duet_cuda_download(g->c, ref, ref_d, bytes));
    GCK(g->c, duet_cuda_download(g->c, got, g->dpool[k], bytes));
    duet_cuda_free(g->c, ref_d);
    uint32_t sslot = m->part == 0 ? DUET_XFER_NO_SLOT : 1;
    uint64_t bad = 0;
    for (uint32_t layer = 0; layer < g->layout[k].n_layers; layer++) {
        uint32_t cnt = g->layout[k].paged ? n : 1;
        for (uint32_t i = 0; i < cnt; i++) {
            uint32_t mine = g->layout[k].paged ? ids[i] : slot, theirs = g->layout[k].paged ? ids[i] : sslot;
            size_t a = ((size_t)layer * g->n_units[k] + mine) * pb, b = ((size_t)layer * g->n_units[k] + theirs) * pb;
            if (memcmp(got + a, ref + b, pb) != 0)
                bad++;
        }
    }
    free(ref);
    free(got);
    return bad;
}

static int gpu_receiver_main(int fd, int dev)
{
    duet_log_set_ident("bench-recv");
    gside_t g;
    g_init(&g, dev, "bench-recv", G_SEED_RECV);
    uint32_t *ids = malloc(sizeof(uint32_t) * RAW_UNITS);
    if (!ids)
        die("out of memory");
    uint64_t seq = 1;
    for (;;) {
        gmsg_t m;
        sk_recv_into(fd, &m, sizeof m);
        if (m.op == G_END)
            break;
        if (m.op == G_SETUP) {
            greply_t r = {0};
            r.status = g_setup(&g, &m, r.msg, sizeof r.msg);
            sk_send(fd, &r, sizeof r);
            continue;
        }
        if (m.op != G_EXPECT || m.pool >= DUET_POOL_COUNT || !g.have[m.pool] || !g.x)
            die("bad command");
        uint32_t slot, n = g_request(&m, ids, &slot, 0);
        char rid[32];
        snprintf(rid, sizeof rid, "gpu-%" PRIu64, seq);
        int32_t st = expect_and_wait(fd, g.x, rid, ids, n, slot, seq);
        seq++;
        if (st == DUET_OK && g.staged) {
            /* pinned host -> device, every round's bytes, after TransferDone (as decode does) */
            int k = (int)m.pool;
            uint32_t cnt = g_units(&g, k, ids, n, slot);
            for (uint32_t r = 0; r < m.rounds && st == DUET_OK; r++)
                st = duet_cuda_pages_copy(g.c, g.dpool[k], g.units, g.hpool[k], g.units, cnt,
                                          g.layout[k].page_bytes);
            if (st == DUET_OK)
                st = duet_cuda_sync(g.c);
            if (st != DUET_OK)
                fprintf(stderr, "duet-bench-xfer: receiver: %s\n", duet_err_text(duet_cuda_error(g.c)));
        }
        sk_send(fd, &st, sizeof st);
        if (m.verify) {
            uint64_t bad = st == DUET_OK ? g_verify(&g, &m, ids, n, slot) : UINT64_MAX;
            sk_send(fd, &bad, sizeof bad);
        }
    }
    g_fini(&g);
    free(ids);
    return 0;
}

/* Both sides set up for a series; 0 with a line printed when it cannot run. */
static int g_setup_both(int fd, gside_t *g, const gmsg_t *m, const char *what)
{
    char msg[200] = "";
    duet_status_t st = g_setup(g, m, msg, sizeof msg);
    if (st != DUET_OK) {
        printf("%s: not measured: sender: %s\n", what, msg);
        fflush(stdout);
        g_teardown(g);
        return 0;
    }
    sk_send(fd, m, sizeof *m);
    greply_t r;
    sk_recv_into(fd, &r, sizeof r);
    int ok = r.status == DUET_OK;
    if (!ok) {
        printf("%s: not measured: receiver: %s\n", what, r.msg);
        fflush(stdout);
        g_teardown(g);
    }
    return ok;
}

/* One timed transfer of `m->rounds` rounds of pool m->pool (all layers); GB/s.
 * Staged: each round gathers the units device -> pinned host before its put. */
static double g_transfer(int fd, gside_t *g, const gmsg_t *m, uint64_t *moved)
{
    static uint32_t ids[RAW_UNITS];
    uint32_t slot, n = g_request(m, ids, &slot, 1);
    int k = (int)m->pool;
    uint32_t cnt = g_units(g, k, ids, n, slot);
    sk_send(fd, m, sizeof *m);
    duet_xfer_desc_t d;
    double t0;
    uint64_t tid = peer_begin(fd, g->x, ids, n, slot, &d, &t0);
    for (uint32_t r = 0; r < m->rounds; r++) {
        if (g->staged) {
            GCK(g->c, duet_cuda_pages_copy(g->c, g->hpool[k], g->units, g->dpool[k], g->units, cnt,
                                           g->layout[k].page_bytes));
            GCK(g->c, duet_cuda_sync(g->c));
        }
        duet_xfer_send_put(g->x, tid, k, DUET_XFER_ALL_LAYERS);
    }
    uint64_t bytes = peer_end(fd, g->x, tid, &d, NULL);
    double dt = duet_time_s() - t0; /* the receiver's status included */
    if (m->verify) {
        uint64_t bad;
        sk_recv_into(fd, &bad, sizeof bad);
        if (bad) {
            fprintf(stderr, "duet-bench-xfer: %s: %" PRIu64 " units on cuda:B differ from the sender's\n",
                    g->staged ? "staging" : "direct", bad);
            exit(1);
        }
    }
    *moved = bytes;
    return (double)bytes / dt / 1e9;
}

/* Best of reps; the first repetition is verified. */
static double g_best(int fd, gside_t *g, gmsg_t m, int reps, uint64_t *moved)
{
    double best = 0;
    for (int r = 0; r < reps; r++) {
        m.verify = r == 0;
        double v = g_transfer(fd, g, &m, moved);
        if (v > best)
            best = v;
    }
    return best;
}

static int parse_path(const char *s)
{
    if (!strcmp(s, "auto"))
        return DUET_XFER_PATH_AUTO;
    if (!strcmp(s, "rma"))
        return DUET_XFER_PATH_RMA;
    if (!strcmp(s, "am"))
        return DUET_XFER_PATH_AM;
    usage();
    return 0;
}

static void g_cell(char *b, size_t n, double v, double ceil)
{
    if (v > 0 && ceil > 0)
        snprintf(b, n, "%.2f (%3.0f%%)", v, 100.0 * v / ceil);
    else if (v > 0)
        snprintf(b, n, "%.2f", v);
    else
        snprintf(b, n, "-");
}

static int gpu_main(const opts_t *o)
{
    int da = -1, db = -1;
    if (sscanf(o->gpu, "%d,%d", &da, &db) != 2 || da < 0 || db < 0 || da == db) {
        fprintf(stderr, "duet-bench-xfer: --gpu A,B: two different device numbers\n");
        return 2;
    }
    int dpath = parse_path(o->path), spath = parse_path(o->staging_path ? o->staging_path : "auto");
    setenv("UCX_TLS", o->tls_given ? o->tls : "sm,self,cuda_copy,cuda_ipc", 1);
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    if (o->devices)
        setenv("UCX_NET_DEVICES", o->devices, 1);
    unsetenv("DUET_XFER_PATH");        /* each engine is given its path */
    unsetenv("DUET_XFER_FAKE_DEVICE"); /* a test hook: device memory here is real */
    signal(SIGPIPE, SIG_IGN);
    duet_log_set_level(DUET_LOG_ERROR);
    if (getenv("DUET_LOG_LEVEL"))
        duet_log_init_from_env();

    /* the receiver is forked before this process touches CUDA */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        die("socketpair");
    fflush(stdout);
    pid_t rp = fork();
    if (rp < 0)
        die("fork");
    if (rp == 0) {
        close(sv[0]);
        _exit(gpu_receiver_main(sv[1], db));
    }
    close(sv[1]);
    int fd = sv[0];

    gside_t g;
    g_init(&g, da, "bench-send", G_SEED_SEND);
    duet_cuda_info_t ia;
    duet_cuda_info(g.c, &ia);
    printf("duet-bench-xfer --gpu %d,%d: sender cuda:%d, receiver cuda:%d (%s); UCX_TLS=%s, direct path %s, "
           "staging path %s, best of %d\n",
           da, db, da, db, ia.name, getenv("UCX_TLS"), o->path, o->staging_path ? o->staging_path : "auto", o->reps);

    /* ceilings */
    double nvl = 0, h2d = 0, d2h = 0;
    int p2p = 0;
    GCK(g.c, duet_cuda_measure_peer_copy(g.c, db, (size_t)1 << 30, 10, &nvl, &p2p));
    GCK(g.c, duet_cuda_measure_host_copy(g.c, (size_t)1 << 30, 1, 5, &h2d));
    GCK(g.c, duet_cuda_measure_host_copy(g.c, (size_t)1 << 30, 0, 5, &d2h));
    double pinned = h2d < d2h ? h2d : d2h;
    printf("ceilings: device copy cuda:%d -> cuda:%d (cudaMemcpyPeer, 1 GiB) %.1f GB/s (peer access %s); "
           "pinned host copies on cuda:%d (1 GiB) H2D %.1f GB/s, D2H %.1f GB/s\n",
           da, db, nvl, p2p ? "yes: NVLink/P2P" : "no: through the host", da, h2d, d2h);
    printf("direct = device pools registered with UCX; staging = device -> pinned host kernel, UCX host put, "
           "pinned host -> device kernel.  (%%) of the peer copy for direct, of the slower pinned copy for staging\n");
    fflush(stdout);

    /* part 1: page-run sizes */
    double dres[MAX_SIZES] = {0}, sres[MAX_SIZES] = {0};
    uint64_t dmoved[MAX_SIZES] = {0}, smoved[MAX_SIZES] = {0};
    uint32_t rounds[MAX_SIZES] = {0}, kk[MAX_SIZES] = {0};
    static uint32_t ids[RAW_UNITS];
    for (int si = 0; si < o->n_sizes; si++) {
        uint32_t k = (uint32_t)(o->sizes[si] / RAW_PAGE);
        if (k == 0 || k >= RAW_UNITS / 2) {
            fprintf(stderr, "size %" PRIu64 " out of range (4 KiB multiple up to %u KiB)\n", o->sizes[si],
                    RAW_UNITS / 2 * 4);
            continue;
        }
        uint64_t region = (uint64_t)raw_pages(k, ids) * RAW_PAGE;
        uint64_t iters = (o->mib << 20) / o->sizes[si];
        if (iters < 500)
            iters = 500;
        kk[si] = k;
        rounds[si] = (uint32_t)((iters * o->sizes[si] + region - 1) / region);
    }
    int direct_ok = 1; /* once the direct path cannot be set up, it is not tried again */
    for (int staged = 0; staged < 2; staged++) {
        gmsg_t m = {.op = G_SETUP, .part = 0, .staged = (uint32_t)staged,
                    .path = (uint32_t)(staged ? spath : dpath)};
        if (!g_setup_both(fd, &g, &m, staged ? "staging path" : "direct path")) {
            if (!staged)
                direct_ok = 0;
            continue;
        }
        m.op = G_EXPECT;
        m.pool = DUET_POOL_C4_KV;
        for (int si = 0; si < o->n_sizes; si++) {
            if (!kk[si])
                continue;
            m.k = kk[si];
            m.rounds = rounds[si];
            if (staged)
                sres[si] = g_best(fd, &g, m, o->reps, &smoved[si]);
            else
                dres[si] = g_best(fd, &g, m, o->reps, &dmoved[si]);
        }
    }
    printf("\n%-9s %10s %18s %18s\n", "run size", "MiB moved", "direct GB/s", "staging GB/s");
    for (int si = 0; si < o->n_sizes; si++) {
        if (!kk[si])
            continue;
        char b[32], c1[32], c2[32];
        g_cell(c1, sizeof c1, dres[si], nvl);
        g_cell(c2, sizeof c2, sres[si], pinned);
        uint64_t mv = dmoved[si] ? dmoved[si] : smoved[si];
        printf("%-9s %10.0f %18s %18s\n", fmt_size(o->sizes[si], b, sizeof b), (double)mv / 1048576.0, c1, c2);
    }
    fflush(stdout);

    /* part 2: pool layouts */
    if (o->run_pools) {
        printf("\n%-12s %-5s %8s %12s %10s %18s %18s\n", "pool", "dtype", "layers", "bytes/put", "MiB moved",
               "direct GB/s", "staging GB/s");
        const duet_cache_dtype_t dts[2] = {DUET_CACHE_FP8, DUET_CACHE_BF16};
        for (int di = 0; di < 2; di++) {
            double pd[DUET_POOL_COUNT] = {0}, ps[DUET_POOL_COUNT] = {0};
            uint64_t pm[DUET_POOL_COUNT] = {0};
            duet_cache_layout_t lay[DUET_POOL_COUNT];
            int have[DUET_POOL_COUNT] = {0};
            for (int staged = !direct_ok; staged < 2; staged++) {
                gmsg_t m = {.op = G_SETUP, .part = 1, .dtype = (uint32_t)dts[di], .staged = (uint32_t)staged,
                            .path = (uint32_t)(staged ? spath : dpath)};
                char what[64];
                snprintf(what, sizeof what, "%s pools, %s path", duet_cache_dtype_name(dts[di]),
                         staged ? "staging" : "direct");
                if (!g_setup_both(fd, &g, &m, what)) {
                    if (!staged)
                        direct_ok = 0;
                    continue;
                }
                m.op = G_EXPECT;
                for (int k = 0; k < DUET_POOL_COUNT; k++) {
                    if (!g.have[k])
                        continue;
                    if (di == 1 && (k == DUET_POOL_STATE_C4 || k == DUET_POOL_STATE_C128))
                        continue; /* fp32 either way */
                    const duet_cache_layout_t *l = &g.layout[k];
                    lay[k] = *l;
                    have[k] = 1;
                    uint64_t per = (uint64_t)l->n_layers * l->page_bytes * (l->paged ? G_PAGES : 1);
                    m.pool = (uint32_t)k;
                    m.rounds = (uint32_t)(((o->mib << 20) + per - 1) / per);
                    double v = g_best(fd, &g, m, o->reps, &pm[k]);
                    if (staged)
                        ps[k] = v;
                    else
                        pd[k] = v;
                }
            }
            for (int k = 0; k < DUET_POOL_COUNT; k++) {
                if (!have[k])
                    continue;
                char c1[32], c2[32];
                g_cell(c1, sizeof c1, pd[k], nvl);
                g_cell(c2, sizeof c2, ps[k], pinned);
                printf("%-12s %-5s %8u %12" PRIu64 " %10.0f %18s %18s\n", duet_pool_kind_name((duet_pool_kind_t)k),
                       duet_cache_dtype_name(lay[k].dtype), lay[k].n_layers,
                       lay[k].page_bytes * (lay[k].paged ? G_PAGES : 1), (double)pm[k] / 1048576.0, c1, c2);
            }
            fflush(stdout);
        }
    }
    gmsg_t end = {.op = G_END};
    sk_send(fd, &end, sizeof end);
    waitpid(rp, NULL, 0);
    g_fini(&g);
    return 0;
}

#endif /* DUET_HAVE_CUDA */

int main(int argc, char **argv)
{
    opts_t o = {.tls = "tcp", .path = "auto", .perftest = "ucx_perftest", .mib = 256, .reps = 3,
                .run_perftest = 1, .run_pools = 1};
    const char *sizes = "4K,16K,64K,256K,1M,4M";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tls") && v) o.tls = v, i++;
        else if (!strcmp(a, "--devices") && v) o.devices = v, i++;
        else if (!strcmp(a, "--path") && v) o.path = v, i++;
        else if (!strcmp(a, "--sizes") && v) sizes = v, i++;
        else if (!strcmp(a, "--mib") && v) o.mib = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--reps") && v) o.reps = atoi(v), i++;
        else if (!strcmp(a, "--am-chunk") && v) g_am_chunk = (uint32_t)parse_size(v), i++;
        else if (!strcmp(a, "--perftest") && v) o.perftest = v, i++;
        else if (!strcmp(a, "--no-perftest")) o.run_perftest = 0;
        else if (!strcmp(a, "--no-pools")) o.run_pools = 0;
        else if (!strcmp(a, "--gpu") && v) o.gpu = v, i++;
        else if (!strcmp(a, "--staging-path") && v) o.staging_path = v, i++;
        else if (!strcmp(a, "--ucx-info")) setenv("UCX_LOG_LEVEL", "info", 0);
        else usage();
        if (!strcmp(a, "--tls"))
            o.tls_given = 1;
    }
    char sz[256];
    snprintf(sz, sizeof sz, "%s", sizes);
    for (char *t = strtok(sz, ","); t && o.n_sizes < MAX_SIZES; t = strtok(NULL, ","))
        o.sizes[o.n_sizes++] = parse_size(t);
    if (o.reps < 1)
        o.reps = 1;
    if (o.gpu || o.staging_path) {
#if DUET_HAVE_CUDA
        if (!o.gpu)
            usage();
        return gpu_main(&o);
#else
        fprintf(stderr, "duet-bench-xfer: UNSUPPORTED: this build has no CUDA backend (--gpu)\n");
        return 2;
#endif
    }
    if (!o.devices && !strcmp(o.tls, "tcp"))
        o.devices = "lo";
    setenv("UCX_TLS", o.tls, 1);
    if (o.devices)
        setenv("UCX_NET_DEVICES", o.devices, 1);
    setenv("DUET_XFER_PATH", o.path, 1);
    signal(SIGPIPE, SIG_IGN);
    duet_log_set_level(DUET_LOG_ERROR);
    if (getenv("DUET_LOG_LEVEL"))
        duet_log_init_from_env();
    if (o.run_perftest) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", o.perftest);
        if (system(cmd) != 0) {
            fprintf(stderr, "duet-bench-xfer: %s not found (Debian package ucx-utils); running without it\n",
                    o.perftest);
            o.run_perftest = 0;
        }
    }

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        die("socketpair");
    pid_t rp = fork();
    if (rp == 0) {
        close(sv[0]);
        _exit(receiver_main(sv[1]));
    }
    close(sv[1]);
    int fd = sv[0];

    char cpu[128] = "unknown CPU";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[256];
        while (fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) {
                    snprintf(cpu, sizeof cpu, "%s", c + 2);
                    cpu[strcspn(cpu, "\n")] = 0;
                }
                break;
            }
        fclose(ci);
    }
    printf("duet-bench-xfer: UCX_TLS=%s%s%s, write path %s, %ld CPUs (%s), best of %d\n", o.tls,
           o.devices ? " UCX_NET_DEVICES=" : "", o.devices ? o.devices : "", o.path, sysconf(_SC_NPROCESSORS_ONLN),
           cpu, o.reps);

    /* part 1: page-run sizes */
    duet_xfer_t *x = engine("bench-send", 0);
    uint8_t *raw;
    raw_register(x, &raw);
    sender_cmd(fd, OP_RAW, 0, 0);
    uint32_t *ids = malloc(sizeof(uint32_t) * RAW_UNITS);
    printf("\n%-9s %10s %12s %14s %16s %8s\n", "run size", "MiB moved", "duet GB/s", "perftest -e", "perftest (no -e)",
           "ratio");
    for (int si = 0; si < o.n_sizes; si++) {
        uint64_t size = o.sizes[si];
        uint32_t k = (uint32_t)(size / RAW_PAGE);
        if (k == 0 || k >= RAW_UNITS / 2) {
            fprintf(stderr, "size %" PRIu64 " out of range (4 KiB multiple up to %u KiB)\n", size,
                    RAW_UNITS / 2 * 4);
            continue;
        }
        uint32_t n = raw_pages(k, ids);
        uint64_t region = (uint64_t)n * RAW_PAGE;
        /* at least 500 operations of this size: ucx_perftest's first
         * operations include connection set-up and are far slower */
        uint64_t iters = (o.mib << 20) / size;
        if (iters < 500)
            iters = 500;
        uint64_t want = iters * size;
        uint32_t rounds = (uint32_t)((want + region - 1) / region);
        /* duet and ucx_perftest alternate, so that load from elsewhere on the
         * machine falls on both; the best of --reps is kept for each */
        double best = 0, pe = -1, pn = -1;
        uint64_t moved = 0;
        for (int r = 0; r < o.reps; r++) {
            sender_cmd(fd, OP_EXPECT_RAW, k, 0);
            uint64_t bytes;
            double dt = timed_transfer(fd, x, ids, n, DUET_XFER_NO_SLOT, DUET_POOL_C4_KV, rounds, &bytes);
            double gbs = (double)bytes / dt / 1e9;
            if (gbs > best)
                best = gbs;
            moved = bytes;
            if (o.run_perftest) {
                double v = perftest(&o, size, iters, 1);
                if (v > pe)
                    pe = v;
                v = perftest(&o, size, iters, 0);
                if (v > pn)
                    pn = v;
            }
        }
        char b[32], c1[32] = "-", c2[32] = "-", c3[32] = "-";
        if (pe > 0) {
            snprintf(c1, sizeof c1, "%.3f", pe);
            snprintf(c3, sizeof c3, "%.2f", best / pe);
        }
        if (pn > 0)
            snprintf(c2, sizeof c2, "%.3f", pn);
        printf("%-9s %10.0f %12.3f %14s %16s %8s\n", fmt_size(size, b, sizeof b), (double)moved / 1048576.0, best,
               c1, c2, c3);
        fflush(stdout);
    }
    duet_xfer_destroy(&x);
    free(raw);

    /* part 2: pool layouts */
    if (o.run_pools) {
        printf("\n%-12s %-5s %8s %12s %10s %12s\n", "pool", "dtype", "layers", "bytes/put", "MiB moved", "duet GB/s");
        const duet_cache_dtype_t dts[2] = {DUET_CACHE_FP8, DUET_CACHE_BF16};
        for (int di = 0; di < 2; di++) {
            duet_kv_cache_t *c = flash_cache(dts[di]);
            x = engine("bench-send", 0);
            duet_err_t err;
            duet_err_clear(&err);
            if (duet_xfer_register_cache(x, c, &err) != DUET_OK)
                die(err.msg);
            sender_cmd(fd, OP_POOLS, (uint32_t)dts[di], 0);
            for (uint32_t i = 0; i < 64; i++)
                ids[i] = i;
            for (int k = 0; k < DUET_POOL_COUNT; k++) {
                const duet_cache_layout_t *l = duet_kv_cache_layout(c, (duet_pool_kind_t)k);
                if (l->n_layers == 0)
                    continue;
                if (di == 1 && (k == DUET_POOL_STATE_C4 || k == DUET_POOL_STATE_C128))
                    continue; /* fp32 either way */
                uint64_t per = (uint64_t)l->n_layers * l->page_bytes * (l->paged ? 64 : 1);
                uint32_t rounds = (uint32_t)(((o.mib << 20) + per - 1) / per);
                double best = 0;
                uint64_t moved = 0;
                for (int r = 0; r < o.reps; r++) {
                    sender_cmd(fd, OP_EXPECT_POOLS, 0, 0);
                    uint64_t bytes;
                    double dt = timed_transfer(fd, x, ids, 64, 1, k, rounds, &bytes);
                    double g = (double)bytes / dt / 1e9;
                    if (g > best)
                        best = g;
                    moved = bytes;
                }
                printf("%-12s %-5s %8u %12" PRIu64 " %10.0f %12.3f\n", duet_pool_kind_name((duet_pool_kind_t)k),
                       duet_cache_dtype_name(l->dtype), l->n_layers, l->page_bytes * (l->paged ? 64 : 1),
                       (double)moved / 1048576.0, best);
                fflush(stdout);
            }
            duet_xfer_destroy(&x);
            duet_kv_cache_destroy(&c);
        }
    }
    sender_cmd(fd, OP_END, 0, 0);
    waitpid(rp, NULL, 0);
    free(ids);
    return 0;
}
