/* Device pools in the UCX data plane, on CPUs.
 *
 * DUET_XFER_FAKE_DEVICE=1 (set here when unset) makes the engine accept pools
 * flagged DUET_XFER_POOL_DEVICE without CUDA support in UCX: their memory is
 * host memory, registered as host memory, but the engine reads and writes it
 * only through the staging ops it was given.  Here those ops are memcpy,
 * counting calls and bytes, and checking that every entry goes between a
 * pool and the bounce buffer in the right direction.  So the bytes each site
 * moves through staging are known exactly:
 *
 *   sender   d2h = checksum bytes (every unit of the request, every layer)
 *                  + on the AM path, every page byte sent
 *   receiver d2h = checksum bytes (verification); h2d = AM page bytes received
 *
 * and a transfer must deliver the sender's pages bit for bit (every byte of
 * every pool checked, as in test_xfer.c).  Also: registration refused without
 * staging ops wherever the host would touch the pool, a bounce buffer too
 * small, RMA-only device pools (no staging ops) delivering and refusing AM
 * data, a failing staging op ending the transfer with its status, and host
 * pools never calling the ops.
 *
 * Harness as test_xfer.c: every case in a process of its own, peers forked
 * before any UCX call, descriptors over a socketpair, "N passed, N failed". */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_cache.h"
#include "log.h"
#include "time_util.h"
#include "xfer.h"
#include "xfer_harness.h"

/* ---------------------------------------------------------------- fixtures */

static duet_kv_cache_t *make_cache(duet_cache_dtype_t kv, uint64_t seed) { return xh_make_cache(kv, kv, seed); }

static uint64_t max_page_bytes(duet_kv_cache_t *c)
{
    uint64_t m = 0;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(c, (duet_pool_kind_t)k);
        if (l->n_layers && l->page_bytes > m)
            m = l->page_bytes;
    }
    return m;
}

/* Bytes the checksums of a request read: every unit of every pool, every layer. */
static uint64_t checksum_bytes(duet_kv_cache_t *c, uint32_t n_pages, int slot)
{
    uint64_t b = 0;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(c, (duet_pool_kind_t)k);
        uint64_t units = l->paged ? n_pages : (slot ? 1u : 0u);
        b += units * l->n_layers * l->page_bytes;
    }
    return b;
}

/* ---------------------------------------------------------------- staging ops */

/* memcpy staging ops.  Every entry must go between the registered pools and
 * the bounce buffer, in the op's direction; anything else counts as a misuse. */
typedef struct {
    uint8_t *bounce;
    size_t bounce_bytes;
    duet_kv_cache_t *cache;   /* the pools the engine may name */
    _Atomic uint64_t d2h_calls, d2h_bytes, h2d_calls, h2d_bytes, misuse;
    _Atomic int fail_d2h, fail_h2d; /* answer DUET_ERR_CUDA instead of copying */
} stg_t;

static int in_range(const void *p, size_t n, const void *base, size_t len)
{
    const uint8_t *a = p, *b = base;
    return a >= b && n <= len && (size_t)(a - b) <= len - n;
}

static int in_pools(const stg_t *s, const void *p, size_t n)
{
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        size_t len = duet_kv_cache_pool_bytes(s->cache, (duet_pool_kind_t)k);
        if (len && in_range(p, n, duet_kv_cache_pool_base(s->cache, (duet_pool_kind_t)k), len))
            return 1;
    }
    return 0;
}

static duet_status_t stg_d2h(void *ctx, const duet_xfer_copy_t *c, uint32_t n)
{
    stg_t *s = ctx;
    if (atomic_load(&s->fail_d2h))
        return DUET_ERR_CUDA;
    atomic_fetch_add(&s->d2h_calls, 1);
    for (uint32_t i = 0; i < n; i++) {
        if (!in_range(c[i].dst, c[i].bytes, s->bounce, s->bounce_bytes) || !in_pools(s, c[i].src, c[i].bytes))
            atomic_fetch_add(&s->misuse, 1);
        memcpy(c[i].dst, c[i].src, c[i].bytes);
        atomic_fetch_add(&s->d2h_bytes, c[i].bytes);
    }
    return DUET_OK;
}

static duet_status_t stg_h2d(void *ctx, const duet_xfer_copy_t *c, uint32_t n)
{
    stg_t *s = ctx;
    if (atomic_load(&s->fail_h2d))
        return DUET_ERR_CUDA;
    atomic_fetch_add(&s->h2d_calls, 1);
    for (uint32_t i = 0; i < n; i++) {
        if (!in_range(c[i].src, c[i].bytes, s->bounce, s->bounce_bytes) || !in_pools(s, c[i].dst, c[i].bytes))
            atomic_fetch_add(&s->misuse, 1);
        memcpy(c[i].dst, c[i].src, c[i].bytes);
        atomic_fetch_add(&s->h2d_bytes, c[i].bytes);
    }
    return DUET_OK;
}

/* What one side of a transfer is. */
typedef struct {
    int device;               /* pools registered with DUET_XFER_POOL_DEVICE (and staging ops given) */
    int path;                 /* DUET_XFER_PATH_* */
    uint32_t am_chunk;        /* 0: default */
    size_t bounce_bytes;      /* 0: 2 x max(largest page, 8 AM chunks) */
    int fail_d2h, fail_h2d;
    int rma_only;             /* no staging ops, no checksums either way: what RMA-only device pools allow */
} side_t;

typedef struct {
    duet_kv_cache_t *c;
    duet_xfer_t *x;
    stg_t *stg;
    duet_xfer_staging_t ops;
} end_t;

/* Cache, staging ops (device sides), engine, pools registered. */
static void end_init(end_t *e, const side_t *sd, duet_cache_dtype_t kv, uint64_t seed, const char *name, int verify)
{
    memset(e, 0, sizeof *e);
    e->c = make_cache(kv, seed);
    duet_xfer_opts_t o = {.name = name, .timeout_ms = TIMEOUT_MS, .keepalive_ms = KEEPALIVE_MS,
                          .verify_checksums = verify, .data_path = sd->path, .am_chunk_bytes = sd->am_chunk};
    uint32_t chunk = sd->am_chunk ? sd->am_chunk : 65536u;
    if (sd->rma_only) {
        o.skip_checksums = 1;
        o.verify_checksums = 0;
    } else if (sd->device) {
        e->stg = calloc(1, sizeof *e->stg);
        REQUIRE(e->stg, "out of memory");
        size_t half = max_page_bytes(e->c);
        if (half < 8u * chunk)
            half = 8u * chunk;
        e->stg->bounce_bytes = sd->bounce_bytes ? sd->bounce_bytes : 2 * ((half + 255) / 256 * 256);
        e->stg->bounce = aligned_alloc(4096, (e->stg->bounce_bytes + 4095) / 4096 * 4096);
        REQUIRE(e->stg->bounce, "out of memory");
        e->stg->cache = e->c;
        atomic_store(&e->stg->fail_d2h, sd->fail_d2h);
        atomic_store(&e->stg->fail_h2d, sd->fail_h2d);
        e->ops = (duet_xfer_staging_t){.ctx = e->stg, .d2h = stg_d2h, .h2d = stg_h2d, .host = e->stg->bounce,
                                       .staging_bytes = e->stg->bounce_bytes};
        o.staging = &e->ops;
    }
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_create(&o, &e->x, &err) == DUET_OK, "%s", err.msg);
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(e->c, (duet_pool_kind_t)k);
        if (!l->n_layers)
            continue;
        duet_xfer_pool_t p = {.layout = *l, .page_tokens = 256,
                              .base = duet_kv_cache_pool_base(e->c, (duet_pool_kind_t)k),
                              .n_units = l->paged ? N_PAGES : N_SLOTS,
                              .flags = sd->device ? DUET_XFER_POOL_DEVICE : 0};
        REQUIRE(duet_xfer_register_pool(e->x, &p, &err) == DUET_OK, "%s", duet_err_text(&err));
    }
}

static void end_fini(end_t *e)
{
    duet_xfer_destroy(&e->x);
    duet_kv_cache_destroy(&e->c);
    if (e->stg) {
        free(e->stg->bounce);
        free(e->stg);
    }
}

/* ---------------------------------------------------------------- receiver */

typedef struct {
    side_t side;
    duet_cache_dtype_t kv;
    uint64_t seed;
    uint32_t n_pages;
    uint32_t deadline_ms;
} recv_args_t;

typedef struct {
    int32_t status;
    int32_t first_token;
    int32_t bytes_ok;
    uint64_t mismatches;
    uint64_t d2h_calls, d2h_bytes, h2d_calls, h2d_bytes, misuse;
    uint64_t checksum_bytes;  /* what verification reads, by the receiver's layouts */
    char msg[160];
} recv_result_t;

typedef struct {
    uint64_t seed;
    uint32_t n_pages;
    uint32_t slot;
    uint32_t pages[N_PAGES];
} sender_info_t;

/* Every byte of every pool: transferred units equal the sender's, others untouched. */
static uint64_t verify_bytes(duet_kv_cache_t *mine, duet_cache_dtype_t kv, uint64_t my_seed,
                             const sender_info_t *si, const uint32_t *my_pages, uint32_t my_slot, int transferred,
                             int verbose)
{
    duet_kv_cache_t *orig = make_cache(kv, my_seed), *theirs = make_cache(kv, si->seed);
    uint64_t bad = xh_verify_units(mine, orig, theirs, si->pages, si->slot, my_pages, my_slot, si->n_pages,
                                   transferred, verbose);
    duet_kv_cache_destroy(&orig);
    duet_kv_cache_destroy(&theirs);
    return bad;
}

static int receiver_main(int fd, const void *argp)
{
    const recv_args_t *a = argp;
    duet_log_set_ident("receiver");
    end_t e;
    end_init(&e, &a->side, a->kv, a->seed, "receiver", 1);
    uint32_t pages[N_PAGES];
    xh_pick_pages(a->seed ^ 0x5555, pages, a->n_pages);
    uint32_t slot = (uint32_t)(a->seed % N_SLOTS);
    xh_expect_and_send_desc(fd, e.x, "req-dev", 3, pages, a->n_pages, slot, a->deadline_ms, 17);
    uint32_t n;
    sender_info_t *si = (sender_info_t *)xh_recv(fd, &n, 10000);
    REQUIRE(si && n == sizeof *si, "sender info");
    recv_result_t res = {0};
    duet_xfer_event_t ev;
    REQUIRE(xh_wait_event(e.x, DUET_XFER_EV_RECV, &ev, a->deadline_ms + 5000) == 0, "no RECV event");
    CHECK(ev.user == 17 && ev.epoch == 3 && strcmp(ev.rid, "req-dev") == 0, "event identity");
    res.status = ev.status;
    res.first_token = ev.first_token;
    snprintf(res.msg, sizeof res.msg, "%s", ev.msg);
    /* after a TIMEOUT, pages put before the sender failed have landed: not reported */
    res.mismatches = verify_bytes(e.c, a->kv, a->seed, si, pages, slot, ev.status == DUET_OK,
                                  ev.status != DUET_ERR_TIMEOUT);
    res.bytes_ok = res.mismatches == 0;
    res.checksum_bytes = checksum_bytes(e.c, a->n_pages, 1);
    if (e.stg) {
        res.d2h_calls = atomic_load(&e.stg->d2h_calls);
        res.d2h_bytes = atomic_load(&e.stg->d2h_bytes);
        res.h2d_calls = atomic_load(&e.stg->h2d_calls);
        res.h2d_bytes = atomic_load(&e.stg->h2d_bytes);
        res.misuse = atomic_load(&e.stg->misuse);
    }
    duet_xfer_stats_t st;
    duet_xfer_stats(e.x, &st);
    CHECK(st.recvs_pending == 0, "receiver still has %" PRIu64 " pending", st.recvs_pending);
    xh_send(fd, &res, sizeof res);
    end_fini(&e);
    free(si);
    return g_fail ? 1 : 0;
}

/* ---------------------------------------------------------------- one transfer */

typedef struct {
    duet_xfer_event_t send_ev;
    recv_result_t recv;
    uint64_t d2h_calls, d2h_bytes, h2d_calls, h2d_bytes, misuse;
    uint64_t checksum_bytes;
} outcome_t;

/* A sender `snd` pushes a 40-page request with its slot, layer by layer, to a
 * receiver `rcv` in a process of its own; both outcomes come back. */
static void transfer(const side_t *snd, const side_t *rcv, duet_cache_dtype_t kv, uint32_t deadline_ms, outcome_t *out)
{
    memset(out, 0, sizeof *out);
    recv_args_t ra = {.side = *rcv, .kv = kv, .seed = 11, .n_pages = 40, .deadline_ms = deadline_ms};
    int fd;
    pid_t r = xh_spawn(receiver_main, &ra, &fd);
    end_t e;
    end_init(&e, snd, kv, 22, "sender", 1);
    uint32_t n;
    uint8_t *b = xh_recv(fd, &n, 10000);
    REQUIRE(b, "no descriptor from the receiver");
    duet_xfer_desc_t d;
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_desc_unpack(b, n, &d, &err) == DUET_OK, "%s", err.msg);
    free(b);
    sender_info_t si = {.seed = 22, .n_pages = d.n_pages, .slot = 2};
    xh_pick_pages(22 ^ 0xaaaa, si.pages, d.n_pages);
    REQUIRE(xh_send(fd, &si, sizeof si) == 0, "send info");
    uint64_t tid = 0;
    REQUIRE(duet_xfer_send_begin(e.x, &d, si.pages, d.n_pages, si.slot, 9, &tid, &err) == DUET_OK, "begin: %s",
            duet_err_text(&err));
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(e.c, (duet_pool_kind_t)k);
        for (uint32_t layer = 0; layer < l->n_layers; layer++)
            CHECK(duet_xfer_send_put(e.x, tid, k, layer) == DUET_OK, "put");
    }
    CHECK(duet_xfer_send_finish(e.x, tid, 321, 0) == DUET_OK, "finish");
    REQUIRE(xh_wait_event(e.x, DUET_XFER_EV_SEND, &out->send_ev, 10000) == 0, "no SEND event");
    recv_result_t *res = (recv_result_t *)xh_recv(fd, &n, deadline_ms + 10000);
    REQUIRE(res && n == sizeof *res, "no result from the receiver");
    out->recv = *res;
    free(res);
    if (e.stg) {
        out->d2h_calls = atomic_load(&e.stg->d2h_calls);
        out->d2h_bytes = atomic_load(&e.stg->d2h_bytes);
        out->h2d_calls = atomic_load(&e.stg->h2d_calls);
        out->h2d_bytes = atomic_load(&e.stg->h2d_bytes);
        out->misuse = atomic_load(&e.stg->misuse);
    }
    out->checksum_bytes = checksum_bytes(e.c, d.n_pages, 1);
    duet_xfer_stats_t st;
    duet_xfer_stats(e.x, &st);
    CHECK(st.ops_inflight == 0 && st.sends_active == 0, "sender leaks: %" PRIu64 " ops, %" PRIu64 " sends",
          st.ops_inflight, st.sends_active);
    duet_xfer_desc_fini(&d);
    CHECK(xh_reap(r, 10000) == 0, "receiver exit");
    close(fd);
    end_fini(&e);
}

/* Delivered bit for bit (and verified by checksums when `verified`). */
static void check_delivered(const outcome_t *o, int verified)
{
    CHECK(o->send_ev.status == DUET_OK && o->send_ev.user == 9, "send: %s %s", duet_status_code(o->send_ev.status),
          o->send_ev.msg);
    CHECK(o->recv.status == DUET_OK, "receiver: %s %s", duet_status_code(o->recv.status), o->recv.msg);
    CHECK(o->recv.first_token == 321, "first token %d", o->recv.first_token);
    CHECK(!verified || strstr(o->recv.msg, "checksums verified") != NULL, "receiver did not verify: %s",
          o->recv.msg);
    CHECK(o->recv.bytes_ok, "%" PRIu64 " units differ", o->recv.mismatches);
    CHECK(o->misuse == 0 && o->recv.misuse == 0, "staging entries outside pools/bounce: sender %" PRIu64
          ", receiver %" PRIu64, o->misuse, o->recv.misuse);
}

/* ---------------------------------------------------------------- cases */

/* RMA between device pools: the puts never touch the host; the sender's
 * checksums and the receiver's verification go through d2h, nothing else. */
static void rma(duet_cache_dtype_t kv)
{
    side_t s = {.device = 1, .path = DUET_XFER_PATH_RMA};
    outcome_t o;
    transfer(&s, &s, kv, 15000, &o);
    check_delivered(&o, 1);
    CHECK(o.d2h_calls > 0 && o.d2h_bytes == o.checksum_bytes, "sender d2h %" PRIu64 " bytes in %" PRIu64
          " calls, checksums read %" PRIu64, o.d2h_bytes, o.d2h_calls, o.checksum_bytes);
    CHECK(o.h2d_calls == 0, "sender h2d %" PRIu64 " calls", o.h2d_calls);
    CHECK(o.recv.d2h_calls > 0 && o.recv.d2h_bytes == o.recv.checksum_bytes,
          "receiver d2h %" PRIu64 " bytes, verification reads %" PRIu64, o.recv.d2h_bytes, o.recv.checksum_bytes);
    CHECK(o.recv.h2d_calls == 0, "receiver h2d %" PRIu64 " calls on the RMA path", o.recv.h2d_calls);
    printf("  sender d2h %" PRIu64 " calls / %" PRIu64 " B; receiver d2h %" PRIu64 " calls / %" PRIu64 " B\n",
           o.d2h_calls, o.d2h_bytes, o.recv.d2h_calls, o.recv.d2h_bytes);
}

static void case_rma_fp8(void) { rma(DUET_CACHE_FP8); }
static void case_rma_bf16(void) { rma(DUET_CACHE_BF16); }

/* AM between device pools, 16 KiB chunks and a bounce buffer of 256 KiB:
 * half of it is 8 slots, fewer than the window of 32, so sends wait for
 * slots.  Page data leaves the sender through d2h and lands through h2d,
 * every byte of it. */
static void case_am(void)
{
    side_t s = {.device = 1, .path = DUET_XFER_PATH_AM, .am_chunk = 16384, .bounce_bytes = 256u << 10};
    outcome_t o;
    transfer(&s, &s, DUET_CACHE_FP8, 15000, &o);
    check_delivered(&o, 1);
    uint64_t sent = o.send_ev.bytes;
    CHECK(sent > 0, "nothing sent");
    CHECK(o.d2h_bytes == o.checksum_bytes + sent, "sender d2h %" PRIu64 " bytes, expected %" PRIu64
          " (checksums) + %" PRIu64 " (page data)", o.d2h_bytes, o.checksum_bytes, sent);
    CHECK(o.h2d_calls == 0, "sender h2d %" PRIu64 " calls", o.h2d_calls);
    CHECK(o.recv.h2d_bytes == sent && o.recv.h2d_calls > 0, "receiver h2d %" PRIu64 " bytes, sent %" PRIu64,
          o.recv.h2d_bytes, sent);
    CHECK(o.recv.d2h_bytes == o.recv.checksum_bytes, "receiver d2h %" PRIu64 " bytes, verification reads %" PRIu64,
          o.recv.d2h_bytes, o.recv.checksum_bytes);
    printf("  %" PRIu64 " B sent; sender d2h %" PRIu64 " calls; receiver h2d %" PRIu64 " calls, d2h %" PRIu64
           " calls\n", sent, o.d2h_calls, o.recv.h2d_calls, o.recv.d2h_calls);
}

/* Host pools on one side: that side never calls staging (it has no ops), the
 * device side stages exactly its own accesses. */
static void case_am_mixed(void)
{
    side_t host = {.device = 0, .path = DUET_XFER_PATH_AM}, dev = {.device = 1, .path = DUET_XFER_PATH_AM};
    outcome_t o;
    transfer(&host, &dev, DUET_CACHE_BF16, 15000, &o);
    check_delivered(&o, 1);
    CHECK(o.recv.h2d_bytes == o.send_ev.bytes, "host -> device: receiver h2d %" PRIu64 " bytes, sent %" PRIu64,
          o.recv.h2d_bytes, o.send_ev.bytes);
    CHECK(o.recv.d2h_bytes == o.recv.checksum_bytes, "host -> device: receiver d2h %" PRIu64, o.recv.d2h_bytes);
    transfer(&dev, &host, DUET_CACHE_BF16, 15000, &o);
    check_delivered(&o, 1);
    CHECK(o.d2h_bytes == o.checksum_bytes + o.send_ev.bytes, "device -> host: sender d2h %" PRIu64,
          o.d2h_bytes);
    CHECK(o.recv.d2h_calls == 0 && o.recv.h2d_calls == 0, "host receiver called staging");
}

/* The automatic path (DUET_XFER_PATH_AUTO): puts only where UCX has an RMA lane for the memory
 * on both sides.  These transports (tcp, shared memory) have no GPU lane, so device pools go as
 * active messages -- every page byte through the staging ops -- and so does a device pool into a
 * host pool or back, whatever lanes there are. */
static void case_auto_path(void)
{
    side_t dev = {.device = 1, .path = DUET_XFER_PATH_AUTO}, host = {.device = 0, .path = DUET_XFER_PATH_AUTO};
    outcome_t o;
    transfer(&dev, &dev, DUET_CACHE_FP8, 15000, &o);
    check_delivered(&o, 1);
    CHECK(o.send_ev.bytes > 0 && o.d2h_bytes == o.checksum_bytes + o.send_ev.bytes,
          "device -> device: sender d2h %" PRIu64 " bytes, checksums %" PRIu64 " + sent %" PRIu64, o.d2h_bytes,
          o.checksum_bytes, o.send_ev.bytes);
    CHECK(o.recv.h2d_bytes == o.send_ev.bytes, "device -> device: receiver h2d %" PRIu64, o.recv.h2d_bytes);
    transfer(&dev, &host, DUET_CACHE_BF16, 15000, &o);
    check_delivered(&o, 1);
    CHECK(o.d2h_bytes == o.checksum_bytes + o.send_ev.bytes, "device -> host: sender d2h %" PRIu64, o.d2h_bytes);
    transfer(&host, &dev, DUET_CACHE_BF16, 15000, &o);
    check_delivered(&o, 1);
    CHECK(o.recv.h2d_bytes == o.send_ev.bytes, "host -> device: receiver h2d %" PRIu64 " bytes, sent %" PRIu64,
          o.recv.h2d_bytes, o.send_ev.bytes);
}

/* Device pools registered for RMA only (no staging ops, no checksums): the
 * RMA path delivers; a sender writing with AM_DATA is refused (UNSUPPORTED),
 * nothing written. */
static void case_rma_only(void)
{
    side_t snd = {.device = 1, .path = DUET_XFER_PATH_RMA, .rma_only = 1};
    side_t rcv = {.device = 1, .path = DUET_XFER_PATH_RMA, .rma_only = 1};
    outcome_t o;
    transfer(&snd, &rcv, DUET_CACHE_FP8, 15000, &o);
    check_delivered(&o, 0);
    side_t am = {.device = 0, .path = DUET_XFER_PATH_AM};
    transfer(&am, &rcv, DUET_CACHE_FP8, 15000, &o);
    CHECK(o.recv.status == DUET_ERR_UNSUPPORTED, "receiver: %s %s", duet_status_code(o.recv.status), o.recv.msg);
    CHECK(o.recv.bytes_ok, "receiver memory changed: %" PRIu64 " units", o.recv.mismatches);
}

/* A failing staging op ends the transfer concerned with its status. */
static void case_staging_failure(void)
{
    /* the receiver's h2d fails on the first AM chunk: RECV CUDA, nothing else breaks */
    side_t snd = {.device = 1, .path = DUET_XFER_PATH_AM};
    side_t rcv = {.device = 1, .path = DUET_XFER_PATH_AM, .fail_h2d = 1};
    outcome_t o;
    transfer(&snd, &rcv, DUET_CACHE_FP8, 15000, &o);
    CHECK(o.recv.status == DUET_ERR_CUDA, "receiver: %s %s", duet_status_code(o.recv.status), o.recv.msg);
    CHECK(strstr(o.recv.msg, "staging") != NULL, "message: %s", o.recv.msg);
    CHECK(o.recv.bytes_ok, "receiver memory changed: %" PRIu64 " units", o.recv.mismatches);
    /* the receiver's process ends once its receive has failed, so the sender's last operations may
     * meet a closed endpoint: it ends OK, PEER or TIMEOUT, never hangs and never reports CUDA */
    CHECK(o.send_ev.status == DUET_OK || o.send_ev.status == DUET_ERR_PEER || o.send_ev.status == DUET_ERR_TIMEOUT,
          "sender: %s", duet_status_code(o.send_ev.status));
    /* the sender's d2h fails when it computes the checksums (RMA path): SEND CUDA;
     * no TransferDone, so the receiver ends at its deadline */
    side_t snd2 = {.device = 1, .path = DUET_XFER_PATH_RMA, .fail_d2h = 1};
    side_t rcv2 = {.device = 1, .path = DUET_XFER_PATH_RMA};
    transfer(&snd2, &rcv2, DUET_CACHE_FP8, 1500, &o);
    CHECK(o.send_ev.status == DUET_ERR_CUDA, "sender: %s %s", duet_status_code(o.send_ev.status), o.send_ev.msg);
    CHECK(strstr(o.send_ev.msg, "staging") != NULL, "message: %s", o.send_ev.msg);
    CHECK(o.recv.status == DUET_ERR_TIMEOUT, "receiver: %s", duet_status_code(o.recv.status));
}

static duet_status_t try_register(const duet_xfer_opts_t *o, duet_kv_cache_t *c, uint32_t flags, duet_err_t *err)
{
    duet_xfer_t *x = NULL;
    duet_err_clear(err);
    REQUIRE(duet_xfer_create(o, &x, err) == DUET_OK, "%s", err->msg);
    const duet_cache_layout_t *l = duet_kv_cache_layout(c, DUET_POOL_SWA_KV);
    duet_xfer_pool_t p = {.layout = *l, .page_tokens = 256, .base = duet_kv_cache_pool_base(c, DUET_POOL_SWA_KV),
                          .n_units = N_SLOTS, .flags = flags};
    duet_status_t st = duet_xfer_register_pool(x, &p, err);
    duet_xfer_destroy(&x);
    return st;
}

/* Device pools without staging ops are refused wherever the engine would
 * touch them from the host; a bounce buffer too small is refused; host
 * pools need nothing; without the test hook and without CUDA in UCX a device
 * pool is refused whatever is given. */
static void case_refused_without_staging(void)
{
    duet_kv_cache_t *c = make_cache(DUET_CACHE_FP8, 5);
    duet_err_t err;
    duet_xfer_opts_t o = {.name = "refuse", .verify_checksums = 1};
    CHECK(try_register(&o, c, DUET_XFER_POOL_DEVICE, &err) == DUET_ERR_UNSUPPORTED, "verify: %s",
          duet_err_text(&err));
    CHECK(strstr(err.msg, "staging") != NULL, "message: %s", err.msg);
    o = (duet_xfer_opts_t){.name = "refuse"}; /* the sender's checksums */
    CHECK(try_register(&o, c, DUET_XFER_POOL_DEVICE, &err) == DUET_ERR_UNSUPPORTED, "checksums: %s",
          duet_err_text(&err));
    o = (duet_xfer_opts_t){.name = "refuse", .skip_checksums = 1, .data_path = DUET_XFER_PATH_AM};
    CHECK(try_register(&o, c, DUET_XFER_POOL_DEVICE, &err) == DUET_ERR_UNSUPPORTED, "AM: %s", duet_err_text(&err));
    o = (duet_xfer_opts_t){.name = "refuse", .skip_checksums = 1, .data_path = DUET_XFER_PATH_AUTO};
    CHECK(try_register(&o, c, DUET_XFER_POOL_DEVICE, &err) == DUET_ERR_UNSUPPORTED, "AUTO may pick AM: %s",
          duet_err_text(&err));
    /* RMA only, no checksums: no host access, accepted */
    o = (duet_xfer_opts_t){.name = "refuse", .skip_checksums = 1, .data_path = DUET_XFER_PATH_RMA};
    CHECK(try_register(&o, c, DUET_XFER_POOL_DEVICE, &err) == DUET_OK, "RMA without checksums: %s",
          duet_err_text(&err));
    /* host pools: as ever */
    o = (duet_xfer_opts_t){.name = "refuse", .verify_checksums = 1};
    CHECK(try_register(&o, c, 0, &err) == DUET_OK, "host pool: %s", duet_err_text(&err));
    /* staging ops that cannot work are refused at creation */
    static uint8_t bounce[1u << 15] __attribute__((aligned(4096)));
    duet_xfer_staging_t ops = {.d2h = stg_d2h, .h2d = stg_h2d, .host = NULL, .staging_bytes = sizeof bounce};
    o = (duet_xfer_opts_t){.name = "refuse", .staging = &ops};
    duet_xfer_t *x = NULL;
    CHECK(duet_xfer_create(&o, &x, &err) == DUET_ERR_INVALID && !x, "no host buffer: %s", duet_err_text(&err));
    ops.host = bounce;
    ops.staging_bytes = 4096; /* less than two 64 KiB AM chunks */
    CHECK(duet_xfer_create(&o, &x, &err) == DUET_ERR_INVALID && !x, "tiny buffer: %s", duet_err_text(&err));
    /* a page larger than half the buffer */
    ops.staging_bytes = sizeof bounce;
    o.am_chunk_bytes = 4096;
    o.verify_checksums = 1;
    const duet_cache_layout_t *l = duet_kv_cache_layout(c, DUET_POOL_SWA_KV);
    REQUIRE(l->page_bytes > sizeof bounce / 2, "the SWA page (%" PRIu64 " B) fits; pick a smaller buffer",
            l->page_bytes);
    CHECK(try_register(&o, c, DUET_XFER_POOL_DEVICE, &err) == DUET_ERR_INVALID, "page > half: %s",
          duet_err_text(&err));
    /* without the test hook: only a CUDA-capable UCX maps device memory */
    unsetenv("DUET_XFER_FAKE_DEVICE");
    REQUIRE(duet_xfer_create(&o, &x, &err) == DUET_OK, "%s", err.msg);
    int capable = duet_xfer_cuda_capable(x);
    duet_xfer_destroy(&x);
    if (!capable) {
        o = (duet_xfer_opts_t){.name = "refuse", .skip_checksums = 1, .data_path = DUET_XFER_PATH_RMA};
        CHECK(try_register(&o, c, DUET_XFER_POOL_DEVICE, &err) == DUET_ERR_UNSUPPORTED, "no CUDA in UCX: %s",
              duet_err_text(&err));
        CHECK(strstr(err.msg, "CUDA") != NULL, "message: %s", err.msg);
    }
    setenv("DUET_XFER_FAKE_DEVICE", "1", 1);
    duet_kv_cache_destroy(&c);
}

/* ---------------------------------------------------------------- main */

static const xh_case_t cases[] = {
    {"refused_without_staging", case_refused_without_staging},
    {"rma_fp8", case_rma_fp8},
    {"rma_bf16", case_rma_bf16},
    {"am", case_am},
    {"am_mixed", case_am_mixed},
    {"auto_path", case_auto_path},
    {"rma_only", case_rma_only},
    {"staging_failure", case_staging_failure},
};

int main(int argc, char **argv)
{
    if (!getenv("DUET_XFER_FAKE_DEVICE"))
        setenv("DUET_XFER_FAKE_DEVICE", "1", 1);
    return xh_run(cases, sizeof cases / sizeof cases[0], argc, argv, " DUET_XFER_FAKE_DEVICE=1");
}
