/* UCX data plane between real processes on loopback.
 *
 * Every case runs in a process of its own (forked by main, which never
 * touches UCX); a case forks its peers before creating its own engine, and
 * they exchange descriptors over a socketpair.  The transport is whatever
 * UCX_TLS says; when unset the test sets UCX_TLS=tcp and UCX_NET_DEVICES=lo
 * so runs are deterministic (meson runs the suite once over tcp and once over
 * shared memory).
 *
 * Pool contents are a pure function of (seed, pool, byte), so the receiver can
 * rebuild what the sender had and check every byte of every pool: pages in
 * the transfer must equal the sender's, every other byte must be untouched.
 *
 * Bounds checked: peer death is reported within DETECT_BOUND_MS. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../sock_fault.h"
#include "kv_cache.h"
#include "log.h"
#include "time_util.h"
#include "xfer.h"
#include "xfer_harness.h"

#define DETECT_BOUND_MS 4000     /* keepalive + timeout + 1.5 s of slack for a loaded machine */

/* ---------------------------------------------------------------- fixtures */

static duet_xfer_t *make_engine(const char *name, int verify)
{
    duet_xfer_opts_t o = {.name = name, .timeout_ms = TIMEOUT_MS, .keepalive_ms = KEEPALIVE_MS,
                          .verify_checksums = verify};
    duet_xfer_t *x = NULL;
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_create(&o, &x, &err) == DUET_OK, "%s", err.msg);
    return x;
}

/* ---------------------------------------------------------------- receiver */

typedef struct {
    duet_cache_dtype_t kv, idx;
    uint64_t seed;
    uint32_t n_pages;
    uint32_t deadline_ms;
    int verify;
    int hold;            /* stay alive after the end (killed by the runner) */
} recv_args_t;

typedef struct {
    int32_t status;
    int32_t first_token;
    uint32_t cached_tokens;
    int32_t bytes_ok;         /* 1: every byte as expected */
    int32_t cancelled;
    uint64_t mismatches;
    char msg[160];
} recv_result_t;

typedef struct {
    uint64_t seed;
    uint32_t n_pages;
    uint32_t slot;
    uint32_t pages[N_PAGES];
    int32_t sent_layers_all;  /* 0: the sender skipped some puts on purpose */
} sender_info_t;

/* Every byte of every pool: transferred units equal the sender's, others untouched. */
static uint64_t verify_bytes(duet_kv_cache_t *mine, uint64_t my_seed, duet_kv_cache_t *theirs,
                             const sender_info_t *si, const uint32_t *my_pages, uint32_t my_slot,
                             int transferred)
{
    duet_kv_cache_t *orig = xh_make_cache(duet_kv_cache_layout(mine, DUET_POOL_C4_KV)->dtype,
                                          duet_kv_cache_layout(mine, DUET_POOL_C4_INDEX_K)->dtype, my_seed);
    uint64_t bad = xh_verify_units(mine, orig, theirs, si->pages, si->slot, my_pages, my_slot, si->n_pages,
                                   transferred, 1);
    duet_kv_cache_destroy(&orig);
    return bad;
}

static int receiver_main(int fd, const void *argp)
{
    const recv_args_t *a = argp;
    duet_log_set_ident("receiver");
    duet_kv_cache_t *c = xh_make_cache(a->kv, a->idx, a->seed);
    duet_xfer_t *x = make_engine("receiver", a->verify);
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_register_cache(x, c, &err) == DUET_OK, "%s", err.msg);
    uint32_t pages[N_PAGES];
    xh_pick_pages(a->seed ^ 0x5555, pages, a->n_pages);
    uint32_t slot = (uint32_t)(a->seed % N_SLOTS);
    xh_expect_and_send_desc(fd, x, "req-0001", 7, pages, a->n_pages, slot, a->deadline_ms, 42);

    uint32_t n;
    sender_info_t *si = (sender_info_t *)xh_recv(fd, &n, 10000);
    REQUIRE(si && n == sizeof *si, "sender info");

    recv_result_t res = {0};
    duet_xfer_event_t ev;
    int got = xh_wait_event(x, DUET_XFER_EV_RECV, &ev, a->deadline_ms + 5000);
    REQUIRE(got == 0, "no RECV event");
    CHECK(ev.user == 42 && ev.epoch == 7 && strcmp(ev.rid, "req-0001") == 0, "event identity");
    res.status = ev.status;
    res.first_token = ev.first_token;
    res.cached_tokens = ev.cached_tokens;
    res.cancelled = (int32_t)ev.cancelled;
    snprintf(res.msg, sizeof res.msg, "%s", ev.msg);
    duet_kv_cache_t *theirs = xh_make_cache(a->kv, a->idx, si->seed);
    res.mismatches = verify_bytes(c, a->seed, theirs, si, pages, slot, ev.status == DUET_OK);
    res.bytes_ok = res.mismatches == 0;
    duet_kv_cache_destroy(&theirs);
    xh_send(fd, &res, sizeof res);
    if (a->hold)
        pause();
    duet_xfer_destroy(&x);
    duet_kv_cache_destroy(&c);
    free(si);
    return g_fail ? 1 : 0;
}

/* ---------------------------------------------------------------- sender side helpers */

typedef struct {
    duet_kv_cache_t *c;
    duet_xfer_t *x;
    uint64_t seed;
} sender_t;

static void sender_init(sender_t *s, duet_cache_dtype_t kv, duet_cache_dtype_t idx, uint64_t seed,
                        const char *name)
{
    s->seed = seed;
    s->c = xh_make_cache(kv, idx, seed);
    s->x = make_engine(name, 1);
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_register_cache(s->x, s->c, &err) == DUET_OK, "%s", err.msg);
}

static void sender_fini(sender_t *s)
{
    duet_xfer_destroy(&s->x);
    duet_kv_cache_destroy(&s->c);
}

static void read_desc(int fd, duet_xfer_desc_t *d)
{
    uint32_t n;
    uint8_t *b = xh_recv(fd, &n, 10000);
    REQUIRE(b, "no descriptor from the receiver");
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_desc_unpack(b, n, d, &err) == DUET_OK, "%s", err.msg);
    free(b);
}

/* Begin a transfer of d into the receiver from sender pages picked by seed; tells the receiver. */
static uint64_t begin(sender_t *s, int fd, const duet_xfer_desc_t *d, sender_info_t *si, int all)
{
    memset(si, 0, sizeof *si);
    si->seed = s->seed;
    si->n_pages = d->n_pages;
    si->slot = (uint32_t)((s->seed + 1) % N_SLOTS);
    si->sent_layers_all = all;
    xh_pick_pages(s->seed ^ 0xaaaa, si->pages, d->n_pages);
    REQUIRE(xh_send(fd, si, sizeof *si) == 0, "send info");
    uint64_t tid = 0;
    duet_err_t err;
    duet_err_clear(&err);
    duet_status_t st = duet_xfer_send_begin(s->x, d, si->pages, d->n_pages, si->slot, 9, &tid, &err);
    REQUIRE(st == DUET_OK, "begin: %s", duet_err_text(&err));
    return tid;
}

/* Layer by layer as a prefill would, every pool. */
static void put_layerwise(sender_t *s, uint64_t tid, int skip_one)
{
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(s->c, (duet_pool_kind_t)k);
        for (uint32_t layer = 0; layer < l->n_layers; layer++) {
            if (skip_one && k == DUET_POOL_C4_INDEX_K && layer == 1)
                continue;
            CHECK(duet_xfer_send_put(s->x, tid, k, layer) == DUET_OK, "put");
        }
    }
}

/* A receiver process with ra, and a sender of kv/idx and seed that has its descriptor in *d. */
static pid_t pair_open(const recv_args_t *ra, duet_cache_dtype_t kv, duet_cache_dtype_t idx, uint64_t seed,
                       sender_t *s, int *fd, duet_xfer_desc_t *d)
{
    pid_t r = xh_spawn(receiver_main, ra, fd);
    sender_init(s, kv, idx, seed, "sender");
    read_desc(*fd, d);
    return r;
}

/* ---------------------------------------------------------------- cases */

static void roundtrip(duet_cache_dtype_t kv, duet_cache_dtype_t idx, int skip_one)
{
    recv_args_t ra = {.kv = kv, .idx = idx, .seed = 11, .n_pages = 40, .deadline_ms = 15000, .verify = 1};
    int fd;
    sender_t s;
    duet_xfer_desc_t d;
    pid_t r = pair_open(&ra, kv, idx, 22, &s, &fd, &d);
    sender_info_t si;
    uint64_t tid = begin(&s, fd, &d, &si, !skip_one);
    put_layerwise(&s, tid, skip_one);
    CHECK(duet_xfer_send_finish(s.x, tid, 1234, 17) == DUET_OK, "finish");
    duet_xfer_event_t ev;
    REQUIRE(xh_wait_event(s.x, DUET_XFER_EV_SEND, &ev, 10000) == 0, "no SEND event");
    CHECK(ev.status == DUET_OK && ev.tid == tid && ev.user == 9, "send: %s %s",
          duet_status_code(ev.status), ev.msg);
    uint32_t n;
    recv_result_t *res = (recv_result_t *)xh_recv(fd, &n, 10000);
    REQUIRE(res && n == sizeof *res, "no result from the receiver");
    if (!skip_one) {
        CHECK(res->status == DUET_OK, "receiver: %s %s", duet_status_code(res->status), res->msg);
        CHECK(res->first_token == 1234, "first token %d", res->first_token);
        CHECK(res->cached_tokens == 17, "cached tokens %u", res->cached_tokens);
        CHECK(res->bytes_ok, "%" PRIu64 " units differ", res->mismatches);
    } else {
        /* a layer never sent: TransferDone's checksums must catch it */
        CHECK(res->status == DUET_ERR_CHECKSUM, "receiver: %s %s", duet_status_code(res->status), res->msg);
    }
    free(res);
    duet_xfer_stats_t st;
    duet_xfer_stats(s.x, &st);
    CHECK(st.ops_inflight == 0 && st.sends_active == 0, "sender leaks: %" PRIu64 " ops, %" PRIu64 " sends",
          st.ops_inflight, st.sends_active);
    /* coalescing: the runs of the two page lists give fewer puts than pages */
    CHECK(st.puts < (uint64_t)d.n_pages * 13, "puts %" PRIu64, st.puts);
    duet_xfer_desc_fini(&d);
    CHECK(xh_reap(r, 10000) == 0, "receiver exit");
    close(fd);
    sender_fini(&s);
}

static void case_roundtrip_fp8(void) { roundtrip(DUET_CACHE_FP8, DUET_CACHE_FP8, 0); }
static void case_roundtrip_bf16(void) { roundtrip(DUET_CACHE_BF16, DUET_CACHE_BF16, 0); }
static void case_roundtrip_fp8_kv_bf16_index(void) { roundtrip(DUET_CACHE_FP8, DUET_CACHE_BF16, 0); }
static void case_checksum_catches_missing_layer(void) { roundtrip(DUET_CACHE_FP8, DUET_CACHE_FP8, 1); }

/* A descriptor tampered to name pages outside the request: on the AM write
 * path the receiver refuses the data (PROTOCOL) and writes nothing. */
static void case_foreign_pages_refused(void)
{
    recv_args_t ra = {.kv = DUET_CACHE_FP8, .idx = DUET_CACHE_FP8, .seed = 71, .n_pages = 40,
                      .deadline_ms = 15000, .verify = 1};
    int fd;
    sender_t s;
    duet_xfer_desc_t d;
    pid_t r = pair_open(&ra, DUET_CACHE_FP8, DUET_CACHE_FP8, 72, &s, &fd, &d);
    uint8_t used[N_PAGES] = {0};
    for (uint32_t i = 0; i < d.n_pages; i++)
        used[d.page_ids[i]] = 1;
    for (uint32_t i = 0, u = 0; i < d.n_pages; u++)
        if (!used[u])
            d.page_ids[i++] = u;
    sender_info_t si;
    uint64_t tid = begin(&s, fd, &d, &si, 1);
    put_layerwise(&s, tid, 0);
    CHECK(duet_xfer_send_finish(s.x, tid, 5, 0) == DUET_OK, "finish");
    duet_xfer_event_t ev;
    REQUIRE(xh_wait_event(s.x, DUET_XFER_EV_SEND, &ev, 10000) == 0, "no SEND event");
    uint32_t n;
    recv_result_t *res = (recv_result_t *)xh_recv(fd, &n, 10000);
    REQUIRE(res && n == sizeof *res, "no result from the receiver");
    CHECK(res->status == DUET_ERR_PROTOCOL, "receiver: %s %s", duet_status_code(res->status), res->msg);
    CHECK(res->bytes_ok, "receiver memory changed: %" PRIu64 " units", res->mismatches);
    free(res);
    duet_xfer_desc_fini(&d);
    CHECK(xh_reap(r, 10000) == 0, "receiver exit");
    close(fd);
    sender_fini(&s);
}

/* The receiver uses bf16 index-K, the sender fp8: refused before any byte moves. */
static void case_layout_mismatch(void)
{
    recv_args_t ra = {.kv = DUET_CACHE_FP8, .idx = DUET_CACHE_BF16, .seed = 31, .n_pages = 24,
                      .deadline_ms = 1500, .verify = 1};
    int fd;
    sender_t s;
    duet_xfer_desc_t d;
    pid_t r = pair_open(&ra, DUET_CACHE_FP8, DUET_CACHE_FP8, 32, &s, &fd, &d);
    sender_info_t si = {.seed = 32, .n_pages = 0};
    uint32_t pages[N_PAGES];
    xh_pick_pages(1, pages, d.n_pages);
    uint64_t tid = 0;
    duet_err_t err;
    duet_err_clear(&err);
    duet_status_t st = duet_xfer_send_begin(s.x, &d, pages, d.n_pages, 0, 0, &tid, &err);
    CHECK(st == DUET_ERR_LAYOUT_MISMATCH, "begin: %s", duet_err_text(&err));
    CHECK(strstr(err.msg, "pool ") != NULL, "message names the pool: %s", err.msg);
    /* same layout kinds but one fingerprint changed: refused too */
    duet_xfer_desc_t d2;
    REQUIRE(duet_xfer_desc_copy(&d, &d2) == DUET_OK, "copy");
    for (uint32_t i = 0; i < d2.n_pools; i++)
        d2.pools[i].fingerprint = duet_kv_cache_layout(s.c, d2.pools[i].kind)->fingerprint;
    d2.pools[0].fingerprint ^= 1;
    st = duet_xfer_send_begin(s.x, &d2, pages, d2.n_pages, 0, 0, &tid, &err);
    CHECK(st == DUET_ERR_LAYOUT_MISMATCH, "begin (fingerprint): %s", duet_err_text(&err));
    duet_xfer_desc_fini(&d2);
    duet_xfer_stats_t sts;
    duet_xfer_stats(s.x, &sts);
    CHECK(sts.puts == 0 && sts.sends_active == 0, "a refused descriptor moved bytes");
    REQUIRE(xh_send(fd, &si, sizeof si) == 0, "send info");
    /* the receiver times out on its deadline, and its memory is untouched */
    uint32_t n;
    recv_result_t *res = (recv_result_t *)xh_recv(fd, &n, 10000);
    REQUIRE(res && n == sizeof *res, "no result from the receiver");
    CHECK(res->status == DUET_ERR_TIMEOUT, "receiver: %s", duet_status_code(res->status));
    CHECK(res->bytes_ok, "receiver memory changed: %" PRIu64 " units", res->mismatches);
    free(res);
    duet_xfer_desc_fini(&d);
    CHECK(xh_reap(r, 10000) == 0, "receiver exit");
    close(fd);
    sender_fini(&s);
}

/* Abort after some puts: flush, AbortAck; the receiver learns ABORTED. */
static void case_abort_ack(void)
{
    recv_args_t ra = {.kv = DUET_CACHE_FP8, .idx = DUET_CACHE_FP8, .seed = 41, .n_pages = 16,
                      .deadline_ms = 10000, .verify = 1};
    int fd;
    sender_t s;
    duet_xfer_desc_t d;
    pid_t r = pair_open(&ra, DUET_CACHE_FP8, DUET_CACHE_FP8, 42, &s, &fd, &d);
    sender_info_t si;
    uint64_t tid = begin(&s, fd, &d, &si, 0);
    CHECK(duet_xfer_send_put(s.x, tid, DUET_POOL_SWA_KV, DUET_XFER_ALL_LAYERS) == DUET_OK, "put");
    CHECK(duet_xfer_send_abort(s.x, tid) == DUET_OK, "abort");
    duet_xfer_event_t ev;
    REQUIRE(xh_wait_event(s.x, DUET_XFER_EV_SEND, &ev, 10000) == 0, "no SEND event");
    CHECK(ev.status == DUET_ERR_ABORTED, "send: %s", duet_status_code(ev.status));
    uint32_t n;
    recv_result_t *res = (recv_result_t *)xh_recv(fd, &n, 10000);
    REQUIRE(res && n == sizeof *res, "no result from the receiver");
    CHECK(res->status == DUET_ERR_ABORTED, "receiver: %s %s", duet_status_code(res->status), res->msg);
    free(res);
    duet_xfer_desc_fini(&d);
    CHECK(xh_reap(r, 10000) == 0, "receiver exit");
    close(fd);
    sender_fini(&s);
}

/* One turn of a sender that keeps a transfer busy: queue puts of everything while fewer than
 * 64 operations are in flight, then take the events; 1 once the SEND event of tid is in *ev
 * (any other event is a failure). */
static int push_turn(sender_t *s, uint64_t tid, duet_xfer_event_t *ev)
{
    duet_xfer_stats_t st;
    duet_xfer_stats(s->x, &st);
    if (st.ops_inflight < 64)
        duet_xfer_send_put(s->x, tid, DUET_XFER_ALL_POOLS, DUET_XFER_ALL_LAYERS);
    while (duet_xfer_poll(s->x, ev, 1) == 1) {
        if (ev->kind == DUET_XFER_EV_SEND && ev->tid == tid)
            return 1;
        CHECK(0, "unexpected event for tid %" PRIu64 ": %s", ev->tid, duet_status_code(ev->status));
    }
    return 0;
}

/* kill -9 of a receiver in the middle of a transfer: the sender reports
 * PEER/TIMEOUT within the bound, while a transfer to a second receiver,
 * running at the same time, completes. */
static void case_kill_receiver(void)
{
    recv_args_t ra1 = {.kv = DUET_CACHE_BF16, .idx = DUET_CACHE_BF16, .seed = 51, .n_pages = N_PAGES,
                       .deadline_ms = 30000, .verify = 1, .hold = 1};
    recv_args_t ra2 = ra1;
    ra2.seed = 52;
    ra2.n_pages = 48;
    ra2.hold = 0;
    int fd1, fd2;
    pid_t r1 = xh_spawn(receiver_main, &ra1, &fd1);
    pid_t r2 = xh_spawn(receiver_main, &ra2, &fd2);
    sender_t s;
    sender_init(&s, DUET_CACHE_BF16, DUET_CACHE_BF16, 53, "sender");
    duet_xfer_desc_t d1, d2;
    read_desc(fd1, &d1);
    read_desc(fd2, &d2);
    sender_info_t si1, si2;
    uint64_t t1 = begin(&s, fd1, &d1, &si1, 0);
    uint64_t t2 = begin(&s, fd2, &d2, &si2, 1);
    put_layerwise(&s, t2, 0);
    /* a long transfer to r1: keep queueing puts of everything */
    uint64_t kill_at = duet_time_ns() + 300000000ull, killed_ns = 0;
    duet_xfer_event_t ev;
    int t1_done = 0;
    while (!t1_done) {
        if (!killed_ns && duet_time_ns() >= kill_at) {
            kill(r1, SIGKILL);
            killed_ns = duet_time_ns();
        }
        if (push_turn(&s, t1, &ev)) {
            t1_done = 1;
            break;
        }
        if (killed_ns && duet_time_ns() - killed_ns > 10000000000ull)
            break;
        usleep(2000);
    }
    REQUIRE(t1_done, "no SEND event after the receiver was killed");
    double ms = (double)(duet_time_ns() - killed_ns) / 1e6;
    CHECK(ev.status == DUET_ERR_PEER || ev.status == DUET_ERR_TIMEOUT, "send to the killed receiver: %s %s",
          duet_status_code(ev.status), ev.msg);
    CHECK(ms <= DETECT_BOUND_MS, "detected after %.0f ms (bound %d ms)", ms, DETECT_BOUND_MS);
    printf("  receiver kill -9 -> sender %s after %.1f ms (%s)\n", duet_status_code(ev.status), ms, ev.msg);
    /* the healthy receiver is still served */
    CHECK(duet_xfer_send_finish(s.x, t2, 77, 0) == DUET_OK, "finish");
    REQUIRE(xh_wait_event(s.x, DUET_XFER_EV_SEND, &ev, 10000) == 0, "no SEND event for r2");
    CHECK(ev.tid == t2 && ev.status == DUET_OK, "send to r2: %s %s", duet_status_code(ev.status), ev.msg);
    uint32_t n;
    recv_result_t *res = (recv_result_t *)xh_recv(fd2, &n, 10000);
    REQUIRE(res && n == sizeof *res, "no result from r2");
    CHECK(res->status == DUET_OK && res->bytes_ok && res->first_token == 77, "r2: %s %s",
          duet_status_code(res->status), res->msg);
    free(res);
    /* and a new transfer to the dead receiver fails at once, typed */
    uint64_t t3;
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_send_begin(s.x, &d1, si1.pages, d1.n_pages, si1.slot, 3, &t3, &err) == DUET_OK, "%s",
            err.msg);
    REQUIRE(xh_wait_event(s.x, DUET_XFER_EV_SEND, &ev, 5000) == 0, "no SEND event for t3");
    CHECK(ev.tid == t3 && (ev.status == DUET_ERR_PEER || ev.status == DUET_ERR_TIMEOUT), "t3: %s",
          duet_status_code(ev.status));
    duet_xfer_stats_t st;
    duet_xfer_stats(s.x, &st);
    CHECK(st.ops_inflight == 0 && st.sends_active == 0, "sender leaks: %" PRIu64 " ops, %" PRIu64 " sends",
          st.ops_inflight, st.sends_active);
    duet_xfer_desc_fini(&d1);
    duet_xfer_desc_fini(&d2);
    xh_reap(r1, 5000);
    CHECK(xh_reap(r2, 10000) == 0, "r2 exit");
    close(fd1);
    close(fd2);
    sender_fini(&s);
}

/* ---------------------------------------------------------------- a socket write failing half way */

/* Over tcp, a page message's socket write cut short and the next one reset: the sender reports
 * the peer's failure, typed, and lives; nothing stays in flight; the receiver's transfer ends in
 * an error.  Run on its own (`test_xfer tcp_write_reset`, UCX_TLS=tcp). */
static void case_tcp_write_reset(void)
{
    const char *tls = getenv("UCX_TLS");
    REQUIRE(tls && strcmp(tls, "tcp") == 0, "tcp_write_reset needs UCX_TLS=tcp (it is %s)", tls ? tls : "unset");
    recv_args_t ra = {.kv = DUET_CACHE_BF16, .idx = DUET_CACHE_BF16, .seed = 61, .n_pages = N_PAGES,
                      .deadline_ms = 30000, .verify = 1, .hold = 1};
    int fd;
    sender_t s;
    duet_xfer_desc_t d;
    pid_t r = pair_open(&ra, DUET_CACHE_BF16, DUET_CACHE_BF16, 62, &s, &fd, &d);
    sender_info_t si;
    uint64_t tid = begin(&s, fd, &d, &si, 0);
    sock_fault_arm();
    uint64_t t0 = duet_time_ns();
    duet_xfer_event_t ev;
    int done = 0;
    while (!done && duet_time_ns() - t0 < 10000000000ull) {
        done = push_turn(&s, tid, &ev);
        if (!done)
            usleep(2000);
    }
    int reached = sock_fault_state();
    sock_fault_disarm();
    REQUIRE(done, "no SEND event after the write failed (injection state %d)", reached);
    CHECK(reached == SOCK_FAULT_RESET, "the injected reset was not reached (state %d)", reached);
    CHECK(ev.status == DUET_ERR_PEER || ev.status == DUET_ERR_TIMEOUT || ev.status == DUET_ERR_IO,
          "send after the reset: %s %s", duet_status_code(ev.status), ev.msg);
    printf("  write cut, then reset -> sender %s (%s)\n", duet_status_code(ev.status), ev.msg);
    duet_xfer_stats_t st;
    for (int i = 0; i < 200; i++) {
        duet_xfer_stats(s.x, &st);
        if (st.ops_inflight == 0 && st.sends_active == 0)
            break;
        usleep(10000);
    }
    CHECK(st.ops_inflight == 0 && st.sends_active == 0, "sender leaks: %" PRIu64 " ops, %" PRIu64 " sends",
          st.ops_inflight, st.sends_active);
    uint32_t n;
    recv_result_t *res = (recv_result_t *)xh_recv(fd, &n, 40000);
    REQUIRE(res && n == sizeof *res, "no result from the receiver");
    CHECK(res->status != DUET_OK, "the receiver's transfer ended well after the sender's failed");
    printf("  receiver -> %s (%s)\n", duet_status_code(res->status), res->msg);
    free(res);
    kill(r, SIGKILL);
    xh_reap(r, 5000);
    close(fd);
    duet_xfer_desc_fini(&d);
    sender_fini(&s);
}

/* The sender process for case_kill_sender: begins and keeps pushing forever. */
static int endless_sender_main(int fd, const void *arg)
{
    (void)arg;
    sender_t s;
    sender_init(&s, DUET_CACHE_FP8, DUET_CACHE_FP8, 62, "sender");
    duet_xfer_desc_t d;
    read_desc(fd, &d);
    sender_info_t si;
    uint64_t tid = begin(&s, fd, &d, &si, 0);
    for (;;) {
        duet_xfer_stats_t st;
        duet_xfer_stats(s.x, &st);
        if (st.ops_inflight < 64)
            duet_xfer_send_put(s.x, tid, DUET_XFER_ALL_POOLS, DUET_XFER_ALL_LAYERS);
        duet_xfer_event_t ev;
        if (duet_xfer_poll(s.x, &ev, 1) == 1 && ev.kind == DUET_XFER_EV_SEND)
            return 3; /* ended without being killed */
        usleep(2000);
    }
}

/* kill -9 of the sender mid-transfer: the receiver's pending request fails
 * with PEER (its endpoint to the sender errors) within the bound. */
static void case_kill_sender(void)
{
    int fd;
    pid_t sp = xh_spawn(endless_sender_main, NULL, &fd);
    duet_kv_cache_t *c = xh_make_cache(DUET_CACHE_FP8, DUET_CACHE_FP8, 61);
    duet_xfer_t *x = make_engine("receiver", 1);
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_register_cache(x, c, &err) == DUET_OK, "%s", err.msg);
    uint32_t pages[N_PAGES];
    xh_pick_pages(5, pages, N_PAGES);
    xh_expect_and_send_desc(fd, x, "req-kill", 3, pages, N_PAGES, 1, 30000, 5);
    duet_xfer_event_t ev;
    REQUIRE(xh_wait_event(x, DUET_XFER_EV_RECV_BEGUN, &ev, 10000) == 0, "transfer never started");
    CHECK(ev.peer_id != 0, "begun without a peer id");
    usleep(300000); /* mid-transfer */
    kill(sp, SIGKILL);
    uint64_t killed_ns = duet_time_ns();
    REQUIRE(xh_wait_event(x, DUET_XFER_EV_RECV, &ev, 10000) == 0, "no RECV event after the sender was killed");
    double ms = (double)(duet_time_ns() - killed_ns) / 1e6;
    CHECK(ev.status == DUET_ERR_PEER || ev.status == DUET_ERR_TIMEOUT, "recv: %s %s",
          duet_status_code(ev.status), ev.msg);
    CHECK(ms <= DETECT_BOUND_MS, "detected after %.0f ms (bound %d ms)", ms, DETECT_BOUND_MS);
    printf("  sender kill -9 -> receiver %s after %.1f ms (%s)\n", duet_status_code(ev.status), ms, ev.msg);
    duet_xfer_stats_t st;
    duet_xfer_stats(x, &st);
    CHECK(st.recvs_pending == 0, "receiver still has %" PRIu64 " pending", st.recvs_pending);
    xh_reap(sp, 5000);
    close(fd);
    duet_xfer_destroy(&x);
    duet_kv_cache_destroy(&c);
}

/* Descriptors: pack/unpack round trip; truncated and garbage input refused. */
static void case_descriptor_codec(void)
{
    duet_kv_cache_t *c = xh_make_cache(DUET_CACHE_FP8, DUET_CACHE_BF16, 1);
    duet_xfer_t *x = make_engine("codec", 0);
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_register_cache(x, c, &err) == DUET_OK, "%s", err.msg);
    uint32_t pages[5] = {3, 4, 5, 9, 1};
    duet_xfer_desc_t d, e;
    REQUIRE(duet_xfer_recv_expect(x, "req-codec", 1, pages, 5, 2, duet_deadline_after_ms(100), 0, &d, &err) ==
                DUET_OK, "%s", err.msg);
    CHECK(d.n_pools == DUET_POOL_COUNT, "%u pools", d.n_pools);
    uint8_t *buf;
    size_t len;
    REQUIRE(duet_xfer_desc_pack(&d, &buf, &len) == DUET_OK, "pack");
    CHECK(duet_xfer_desc_unpack(buf, len, &e, &err) == DUET_OK, "%s", err.msg);
    CHECK(e.n_pages == 5 && e.page_ids[3] == 9 && e.slot == 2 && e.epoch == 1 &&
              strcmp(e.rid, "req-codec") == 0 && e.address_len == d.address_len &&
              memcmp(e.address, d.address, d.address_len) == 0,
          "round trip");
    for (uint32_t i = 0; i < d.n_pools; i++)
        CHECK(e.pools[i].fingerprint == d.pools[i].fingerprint && e.pools[i].rkey_len == d.pools[i].rkey_len &&
                  memcmp(e.pools[i].rkey, d.pools[i].rkey, d.pools[i].rkey_len) == 0,
              "pool %u", i);
    duet_xfer_desc_fini(&e);
    for (size_t cut = 0; cut < len; cut += 7) {
        duet_status_t st = duet_xfer_desc_unpack(buf, cut, &e, &err);
        CHECK(st != DUET_OK, "truncated at %zu accepted", cut);
        duet_xfer_desc_fini(&e);
    }
    uint64_t s = 9;
    for (int i = 0; i < 200; i++) {
        uint8_t *g = malloc(len);
        memcpy(g, buf, len);
        g[xh_splitmix(&s) % len] ^= (uint8_t)(1 + xh_splitmix(&s) % 255);
        if (duet_xfer_desc_unpack(g, len, &e, &err) == DUET_OK)
            duet_xfer_desc_fini(&e); /* a flipped fingerprint or id in range is still well-formed */
        free(g);
    }
    /* out-of-range ids are refused by validation */
    d.page_ids[0] = N_PAGES;
    CHECK(duet_xfer_desc_validate(&d, &err) == DUET_ERR_RANGE, "range: %s", duet_err_text(&err));
    free(buf);
    duet_xfer_desc_fini(&d);
    /* expect refuses ids out of range; device pools are refused without CUDA in UCX */
    pages[0] = N_PAGES + 1;
    CHECK(duet_xfer_recv_expect(x, "req-bad", 1, pages, 5, 2, 0, 0, &d, &err) == DUET_ERR_INVALID, "range");
    duet_xfer_pool_t p = {.layout = *duet_kv_cache_layout(c, DUET_POOL_C4_KV), .page_tokens = 256,
                          .base = buf, .n_units = 1, .flags = DUET_XFER_POOL_DEVICE};
    if (!duet_xfer_cuda_capable(x))
        CHECK(duet_xfer_register_pool(x, &p, &err) != DUET_OK, "device pool accepted");
    duet_xfer_destroy(&x);
    duet_kv_cache_destroy(&c);
}

/* ---------------------------------------------------------------- main */

static const xh_case_t cases[] = {
    {"descriptor_codec", case_descriptor_codec},
    {"roundtrip_fp8", case_roundtrip_fp8},
    {"roundtrip_bf16", case_roundtrip_bf16},
    {"roundtrip_fp8_kv_bf16_index", case_roundtrip_fp8_kv_bf16_index},
    {"checksum_catches_missing_layer", case_checksum_catches_missing_layer},
    {"layout_mismatch", case_layout_mismatch},
    {"foreign_pages_refused", case_foreign_pages_refused},
    {"abort_ack", case_abort_ack},
    {"kill_receiver", case_kill_receiver},
    {"kill_sender", case_kill_sender},
};

/* Not in the default list: it needs tcp (the other runs are over shared memory too). */
static const xh_case_t tcp_cases[] = {
    {"tcp_write_reset", case_tcp_write_reset},
};

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], tcp_cases[0].name) == 0)
        return xh_run(tcp_cases, sizeof tcp_cases / sizeof tcp_cases[0], argc, argv, NULL);
    return xh_run(cases, sizeof cases / sizeof cases[0], argc, argv, NULL);
}
