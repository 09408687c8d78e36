/* duet-ucx-tcp-reset: does the UCX in use complete a failed tcp zero-copy send once?
 *
 * UCX 1.13.1's tcp transport (and, by its source, every release since 1.10) completes an
 * active-message zero-copy send twice when the socket fails while the message is only partly
 * written: the endpoint's failure purges it (completion one), then the send path completes it
 * again (two).  A UCX built with assertions, as Debian 12's libucx0 is, aborts the process
 * ("uct_iface.h:884 Assertion comp->count > 0", status ENDPOINT_TIMEOUT); one without them
 * finishes the UCP request twice.  The data plane sends page messages this way over tcp, so a
 * prefill worker on such a UCX could die when a decode worker dies mid-transfer
 * (docs/DATAPLANE.md).  scripts/make-ucx-cuda.sh patches its UCX build.
 *
 * The race is rare on its own: the receive side usually notices a dead peer first.  This
 * program forces it in one process with two UCP workers over tcp on loopback, with
 * tests/sock_fault.h (the same staging as test_xfer's tcp_write_reset): once armed, the first
 * socket write of more than 1 KiB is cut to 4 bytes (so the message stays outstanding) and the
 * next write on that socket fails with ECONNRESET, as if the receiver had been killed.  The
 * scenario runs in a child process, so an abort inside UCX is observed, not suffered.
 *
 *   duet-ucx-tcp-reset [--bytes N] [--quiet]
 *
 * Exit status: 0 the send completed once (with an error), 1 it completed twice or UCX aborted,
 * 2 the scenario could not be staged (no zero-copy write was cut, setup failed). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "../tests/sock_fault.h"

#define AM_ID 11

static int quiet;
static int n_done, n_err_cb;
static ucs_status_t done_status = UCS_INPROGRESS;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    if (quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

static void on_send(void *req, ucs_status_t st, void *user)
{
    (void)req;
    (void)user;
    n_done++;
    done_status = st;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    (void)st;
    n_err_cb++;
}

static ucs_status_t on_am(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                          const ucp_am_recv_param_t *p)
{
    (void)arg;
    (void)hdr;
    (void)hdr_len;
    (void)data;
    (void)len;
    (void)p;
    return UCS_OK; /* eager data is dropped; a rendezvous one is never fetched (the sender fails first) */
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Progress both workers (the receiver only while the socket is intact) for at most `secs`,
 * until stop() says so. */
static void progress(ucp_worker_h w1, ucp_worker_h w2, double secs, int (*stop)(void))
{
    double t_end = now_s() + secs;
    while (now_s() < t_end && !(stop && stop())) {
        ucp_worker_progress(w1);
        if (sock_fault_state() < SOCK_FAULT_CUT)
            ucp_worker_progress(w2);
    }
}

static int sent_once(void) { return n_done > 0; }

#define TRY(call, what)                                                                                            \
    do {                                                                                                           \
        ucs_status_t s_ = (call);                                                                                  \
        if (s_ != UCS_OK) {                                                                                        \
            fprintf(stderr, "duet-ucx-tcp-reset: %s: %s\n", what, ucs_status_string(s_));                         \
            return 2;                                                                                              \
        }                                                                                                          \
    } while (0)

/* The scenario; its exit status is the program's. */
static int scenario(size_t bytes)
{
    ucp_config_t *cfg;
    TRY(ucp_config_read(NULL, NULL, &cfg), "ucp_config_read");
    TRY(ucp_config_modify(cfg, "TLS", "tcp"), "UCX_TLS=tcp");
    TRY(ucp_config_modify(cfg, "NET_DEVICES", "lo"), "UCX_NET_DEVICES=lo");
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_context_h ctx;
    ucs_status_t st = ucp_init(&prm, cfg, &ctx);
    ucp_config_release(cfg);
    TRY(st, "ucp_init");
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_worker_h w1, w2;
    TRY(ucp_worker_create(ctx, &wp, &w1), "ucp_worker_create");
    TRY(ucp_worker_create(ctx, &wp, &w2), "ucp_worker_create");
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB,
                                 .id = AM_ID, .cb = on_am};
    TRY(ucp_worker_set_am_recv_handler(w2, &hp), "ucp_worker_set_am_recv_handler");
    ucp_address_t *addr;
    size_t addr_len;
    TRY(ucp_worker_get_address(w2, &addr, &addr_len), "ucp_worker_get_address");
    ucp_ep_params_t ep_p = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                          UCP_EP_PARAM_FIELD_ERR_HANDLER,
                            .address = addr,
                            .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                            .err_handler = {.cb = on_ep_error}};
    ucp_ep_h ep;
    TRY(ucp_ep_create(w1, &ep_p, &ep), "ucp_ep_create");

    /* a small message first: the connection and its wireup are done before arming */
    char small[16] = "hello";
    ucp_request_param_t sp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK, .cb.send = on_send};
    void *r = ucp_am_send_nbx(ep, AM_ID, NULL, 0, small, sizeof small, &sp);
    if (UCS_PTR_IS_ERR(r)) {
        fprintf(stderr, "duet-ucx-tcp-reset: first message: %s\n", ucs_status_string(UCS_PTR_STATUS(r)));
        return 2;
    }
    if (UCS_PTR_IS_PTR(r)) {
        progress(w1, w2, 5.0, sent_once);
        if (!n_done || done_status != UCS_OK) {
            fprintf(stderr, "duet-ucx-tcp-reset: first message not sent (%s)\n", ucs_status_string(done_status));
            return 2;
        }
        ucp_request_free(r);
    }
    progress(w1, w2, 0.2, NULL);
    n_done = 0;
    done_status = UCS_INPROGRESS;

    /* the message, as the data plane's page messages go: eager, a header, and data in memory
     * registered with UCX (its handle passed, so UCX may send it zero-copy) */
    char *buf = calloc(1, bytes);
    if (!buf) {
        fprintf(stderr, "duet-ucx-tcp-reset: out of memory\n");
        return 2;
    }
    ucp_mem_map_params_t mm = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = buf,
                               .length = bytes};
    ucp_mem_h memh;
    TRY(ucp_mem_map(ctx, &mm, &memh), "ucp_mem_map");
    uint64_t hdr[4] = {1, 2, 3, 4};
    ucp_request_param_t mp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS |
                                              UCP_OP_ATTR_FIELD_MEMH,
                              .flags = UCP_AM_SEND_FLAG_EAGER,
                              .cb.send = on_send,
                              .memh = memh};
    sock_fault_arm();
    r = ucp_am_send_nbx(ep, AM_ID, hdr, sizeof hdr, buf, bytes, &mp);
    if (UCS_PTR_IS_ERR(r) || r == NULL) {
        fprintf(stderr, "duet-ucx-tcp-reset: the message %s at once; nothing to test\n",
                r == NULL ? "completed" : ucs_status_string(UCS_PTR_STATUS(r)));
        return 2;
    }
    /* the sender alone from here (the receiver's socket is "dead"); then a while longer, to
     * catch a second completion */
    progress(w1, w2, 5.0, sent_once);
    progress(w1, w2, 0.5, NULL);
    say("duet-ucx-tcp-reset: %s; write cut %s, reset %s; send completed %d time%s (%s), endpoint error callback %d\n",
        ucp_get_version_string(), sock_fault_state() >= SOCK_FAULT_CUT ? "yes" : "no",
        sock_fault_state() >= SOCK_FAULT_RESET ? "yes" : "no", n_done,
        n_done == 1 ? "" : "s", ucs_status_string(done_status), n_err_cb);
    if (sock_fault_state() != SOCK_FAULT_RESET)
        return 2; /* no zero-copy write was cut: this UCX or its settings did not take the path */
    return n_done == 1 ? 0 : 1;
}

int main(int argc, char **argv)
{
    size_t bytes = 16384;
    static const struct option lo[] = {{"bytes", required_argument, 0, 'b'}, {"quiet", no_argument, 0, 'q'},
                                       {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'b': {
            char *end;
            unsigned long long v = strtoull(optarg, &end, 0);
            if (*end || v < 2048 || v > (1ull << 30)) {
                fprintf(stderr, "duet-ucx-tcp-reset: --bytes %s: want 2048 .. 2^30\n", optarg);
                return 2;
            }
            bytes = (size_t)v;
            break;
        }
        case 'q': quiet = 1; break;
        case 'h':
            printf("usage: duet-ucx-tcp-reset [--bytes N] [--quiet]\n"
                   "  whether the UCX in use completes a tcp zero-copy send that fails half written once\n"
                   "  (exit 0) or twice / aborts (exit 1); 2: the scenario could not be staged\n");
            return 0;
        default: return 2;
        }
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("duet-ucx-tcp-reset: fork");
        return 2;
    }
    if (pid == 0) {
        alarm(30); /* bounded, whatever UCX does */
        _exit(scenario(bytes));
    }
    int ws;
    while (waitpid(pid, &ws, 0) < 0) {
        if (errno != EINTR) {
            perror("duet-ucx-tcp-reset: waitpid");
            return 2;
        }
    }
    if (WIFEXITED(ws)) {
        int rc = WEXITSTATUS(ws);
        if (!quiet)
            printf("%s\n", rc == 0   ? "ok: the failed send completed once"
                           : rc == 1 ? "FAIL: the failed send completed twice"
                                     : "inconclusive: the scenario could not be staged");
        return rc <= 2 ? rc : 2;
    }
    int sig = WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
    if (!quiet)
        printf("FAIL: the scenario died of signal %d (%s)%s\n", sig, strsignal(sig),
               sig == SIGABRT ? ": UCX aborted, as on the double completion" : "");
    return sig == SIGALRM ? 2 : 1;
}
