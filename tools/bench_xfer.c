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
 * GB/s are 10^9 bytes per second; ucx_perftest's MB/s (2^20) are converted. */
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
static void raw_register(duet_xfer_t *x, uint8_t **mem)
{
    duet_model_config_t cfg;
    flash_config(&cfg);
    duet_cache_opts_t co = {.page_tokens = 256, .kv_dtype = DUET_CACHE_FP8, .index_k_dtype = DUET_CACHE_FP8};
    duet_cache_layout_t l;
    duet_err_t err;
    duet_err_clear(&err);
    if (duet_cache_layout_compute(&cfg, &co, DUET_POOL_C4_KV, &l, &err) != DUET_OK)
        die(err.msg);
    l.page_bytes = RAW_PAGE;
    l.n_layers = 1;
    l.fingerprint = 0x62656e6368726177ull; /* "benchraw" */
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

static void expect_and_reply(int fd, duet_xfer_t *x, const uint32_t *ids, uint32_t n, uint32_t slot, uint64_t seq)
{
    char rid[32];
    snprintf(rid, sizeof rid, "bench-%" PRIu64, seq);
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
    int32_t st = ev.status;
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
        uint32_t mlen;
        uint8_t *mb = sk_recv(fd, &mlen);
        if (mlen != sizeof m)
            die("bad command");
        memcpy(&m, mb, sizeof m);
        free(mb);
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

/* One transfer: `rounds` repetitions of put(pool, all layers); seconds from begin to done. */
static double timed_transfer(int fd, duet_xfer_t *x, const uint32_t *local, uint32_t n_local, uint32_t slot,
                             int pool, uint32_t rounds, uint64_t *bytes)
{
    uint32_t len;
    uint8_t *b = sk_recv(fd, &len);
    duet_xfer_desc_t d;
    duet_err_t err;
    duet_err_clear(&err);
    if (duet_xfer_desc_unpack(b, len, &d, &err) != DUET_OK)
        die(err.msg);
    free(b);
    double t0 = duet_time_s();
    uint64_t tid;
    if (duet_xfer_send_begin(x, &d, local, n_local, slot, 0, &tid, &err) != DUET_OK)
        die(duet_err_text(&err));
    for (uint32_t r = 0; r < rounds; r++)
        duet_xfer_send_put(x, tid, pool, DUET_XFER_ALL_LAYERS);
    duet_xfer_send_finish(x, tid, 0);
    duet_xfer_event_t ev;
    do {
        if (duet_xfer_wait(x, &ev, 120000) != DUET_OK)
            die("sender: no event in 120 s");
    } while (ev.kind != DUET_XFER_EV_SEND);
    double dt = duet_time_s() - t0;
    if (ev.status != DUET_OK) {
        fprintf(stderr, "duet-bench-xfer: transfer failed: %s %s\n", duet_status_code(ev.status), ev.msg);
        exit(1);
    }
    int32_t rst;
    uint32_t n;
    uint8_t *r = sk_recv(fd, &n);
    memcpy(&rst, r, sizeof rst);
    free(r);
    if (rst != DUET_OK) {
        fprintf(stderr, "duet-bench-xfer: receiver reports %s\n", duet_status_code(rst));
        exit(1);
    }
    *bytes = ev.bytes;
    duet_xfer_desc_fini(&d);
    return dt;
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
                    "                       [--no-perftest] [--no-pools]\n");
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
        else usage();
    }
    char sz[256];
    snprintf(sz, sizeof sz, "%s", sizes);
    for (char *t = strtok(sz, ","); t && o.n_sizes < MAX_SIZES; t = strtok(NULL, ","))
        o.sizes[o.n_sizes++] = parse_size(t);
    if (o.reps < 1)
        o.reps = 1;
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
