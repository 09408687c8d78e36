/* The workers' table of event sockets (common/worker/worker_net.h): events
 * about a request go to the router its Reserve/Prefill named, heartbeats to
 * every router in the table, a held entry is never closed, an unreferenced
 * one is closed when idle or when the table is full, and a new URL is
 * refused while every entry serves live requests.  Pullers stand in for the
 * routers, over inproc://. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ctl.h"
#include "msg.h"
#include "time_util.h"
#include "worker_net.h"

static duet_ctl_puller_t *puller(const char *url)
{
    duet_ctl_opts_t o = {.url = url};
    duet_ctl_puller_t *p = NULL;
    duet_err_t err = {0};
    assert_int_equal(duet_ctl_puller_create(&o, &p, &err), DUET_OK);
    return p;
}

/* The next event's kind at `p` within `ms`, or NOT_SET. */
static duet_msg_kind_t next_kind(duet_ctl_puller_t *p, int ms, char *rid, size_t rid_len)
{
    duet_envelope_t *ev = NULL;
    duet_err_t err = {0};
    if (duet_ctl_puller_recv(p, duet_deadline_after_ms(ms), &ev, &err) != DUET_OK)
        return DUET__V1__ENVELOPE__BODY__NOT_SET;
    duet_msg_kind_t k = duet_msg_kind(ev);
    if (rid)
        snprintf(rid, rid_len, "%s", duet_msg_rid(ev) ? duet_msg_rid(ev) : "");
    duet_envelope_free(&ev);
    return k;
}

static duet_envelope_t *chunk(const char *rid)
{
    duet_msg_origin_t o = {.sender_id = "d0", .rid = rid, .epoch = 1};
    int32_t tok = 7;
    duet_envelope_t *ev = NULL;
    assert_int_equal(duet_msg_new_token_chunk(&o, 0, &tok, 1, &ev), DUET_OK);
    return ev;
}

static duet_envelope_t *heartbeat(void)
{
    duet_msg_origin_t o = {.sender_id = "d0"};
    duet_envelope_t *ev = NULL;
    assert_int_equal(duet_msg_new_heartbeat(&o, DUET__V1__ROLE__ROLE_DECODE, &ev), DUET_OK);
    return ev;
}

static int find_sink(const duet_worker_net_t *n, const char *url)
{
    for (int i = 0; i < DUET_WORKER_MAX_SINKS; i++)
        if (n->sinks[i].push && strcmp(n->sinks[i].url, url) == 0)
            return i;
    return -1;
}

static void test_routing_and_heartbeats(void **state)
{
    (void)state;
    duet_ctl_puller_t *main_p = puller("inproc://we-main"), *r1 = puller("inproc://we-r1");
    duet_worker_net_t n;
    memset(&n, 0, sizeof n);
    duet_worker_opts_t o = {.heartbeat_ms = 100000};
    duet_err_t err = {0};
    assert_int_equal(duet_worker_net_open_events(&n, "inproc://we-main", 60000, &err), DUET_OK);
    assert_int_equal(duet_worker_net_sink_count(&n), 1);

    int s = -1;
    assert_int_equal(duet_worker_net_sink_acquire(&n, NULL, "reserve.event_url", &s, &err), DUET_OK);
    assert_int_equal(s, DUET_WORKER_SINK_EVENTS);
    assert_int_equal(duet_worker_net_sink_acquire(&n, "inproc://we-main", "reserve.event_url", &s, &err), DUET_OK);
    assert_int_equal(s, DUET_WORKER_SINK_EVENTS);
    assert_int_equal(duet_worker_net_sink_acquire(&n, "http://router:1", "reserve.event_url", &s, &err),
                     DUET_ERR_INVALID);
    assert_non_null(strstr(err.msg, "reserve.event_url"));
    assert_int_equal(duet_worker_net_sink_count(&n), 1);

    int a = -1, b = -1;
    assert_int_equal(duet_worker_net_sink_acquire(&n, "inproc://we-r1", "prefill.event_url", &a, &err), DUET_OK);
    assert_int_equal(duet_worker_net_sink_acquire(&n, "inproc://we-r1", "prefill.event_url", &b, &err), DUET_OK);
    assert_true(a > 0 && a == b);
    assert_int_equal(n.sinks[a].refs, 2);
    assert_int_equal(duet_worker_net_sink_count(&n), 2);

    /* a request's events go to its router only */
    char rid[80];
    duet_worker_net_push_to(&n, a, chunk("req-r1"));
    duet_worker_net_push_to(&n, DUET_WORKER_SINK_EVENTS, chunk("req-main"));
    assert_int_equal(next_kind(r1, 2000, rid, sizeof rid), DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
    assert_string_equal(rid, "req-r1");
    assert_int_equal(next_kind(main_p, 2000, rid, sizeof rid), DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
    assert_string_equal(rid, "req-main");
    assert_int_equal(next_kind(r1, 50, NULL, 0), DUET__V1__ENVELOPE__BODY__NOT_SET);

    /* a new entry gets a heartbeat at once; heartbeats go to every entry */
    assert_int_equal(duet_worker_net_heartbeat_due(&n, &o), 1);
    assert_int_equal(duet_worker_net_heartbeat_due(&n, &o), 0);
    duet_worker_net_broadcast(&n, heartbeat());
    assert_int_equal(next_kind(r1, 2000, NULL, 0), DUET__V1__ENVELOPE__BODY_HEARTBEAT);
    assert_int_equal(next_kind(main_p, 2000, NULL, 0), DUET__V1__ENVELOPE__BODY_HEARTBEAT);

    /* a sink out of range means --events */
    duet_worker_net_push_to(&n, 99, chunk("req-x"));
    assert_int_equal(next_kind(main_p, 2000, rid, sizeof rid), DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
    assert_string_equal(rid, "req-x");

    duet_worker_net_sink_release(&n, a);
    duet_worker_net_sink_release(&n, b);
    assert_int_equal(n.sinks[a].refs, 0);
    duet_worker_net_close(&n);
    duet_ctl_puller_destroy(&r1);
    duet_ctl_puller_destroy(&main_p);
}

static void test_full_table_and_idle(void **state)
{
    (void)state;
    duet_worker_net_t n;
    memset(&n, 0, sizeof n);
    duet_worker_opts_t o = {.heartbeat_ms = 100000};
    duet_err_t err = {0};
    /* no --events: requests that name a router still reach it */
    assert_int_equal(duet_worker_net_open_events(&n, NULL, 150, &err), DUET_OK);
    assert_int_equal(duet_worker_net_heartbeat_due(&n, &o), 0); /* nobody to tell */
    int held[DUET_WORKER_MAX_SINKS];
    char url[64];
    for (int i = 1; i < DUET_WORKER_MAX_SINKS; i++) {
        snprintf(url, sizeof url, "inproc://we-full-%d", i);
        assert_int_equal(duet_worker_net_sink_acquire(&n, url, "reserve.event_url", &held[i], &err), DUET_OK);
    }
    assert_int_equal(duet_worker_net_sink_count(&n), DUET_WORKER_MAX_SINKS - 1);
    /* every entry serves a live request: a new router is refused, none is closed */
    int s = -1;
    assert_int_equal(duet_worker_net_sink_acquire(&n, "inproc://we-full-new", "reserve.event_url", &s, &err),
                     DUET_ERR_BUSY);
    assert_int_equal(duet_worker_net_sink_count(&n), DUET_WORKER_MAX_SINKS - 1);
    /* the least recently used unreferenced entry gives way */
    duet_worker_net_sink_release(&n, held[5]);
    nanosleep(&(struct timespec){0, 2000000}, NULL);
    duet_worker_net_sink_release(&n, held[3]);
    assert_int_equal(duet_worker_net_sink_acquire(&n, "inproc://we-full-new", "reserve.event_url", &s, &err), DUET_OK);
    assert_int_equal(s, held[5]);
    assert_int_equal(find_sink(&n, "inproc://we-full-5"), -1);
    assert_true(find_sink(&n, "inproc://we-full-3") > 0);
    /* held entries outlive the idle time; an unreferenced one is closed after it */
    assert_int_equal(duet_worker_net_heartbeat_due(&n, &o), 1); /* greet the new one */
    nanosleep(&(struct timespec){0, 250000000}, NULL);
    duet_worker_net_heartbeat_due(&n, &o);
    assert_int_equal(find_sink(&n, "inproc://we-full-3"), -1);
    assert_true(find_sink(&n, "inproc://we-full-4") > 0);
    assert_true(find_sink(&n, "inproc://we-full-new") > 0);
    assert_int_equal(duet_worker_net_sink_count(&n), DUET_WORKER_MAX_SINKS - 2);
    /* reusing a URL takes the same entry */
    int again = -1;
    assert_int_equal(duet_worker_net_sink_acquire(&n, "inproc://we-full-4", "reserve.event_url", &again, &err), DUET_OK);
    assert_int_equal(again, held[4]);
    duet_worker_net_close(&n);
    assert_int_equal(duet_worker_net_sink_count(&n), 0);
}

typedef struct {
    duet_ctl_puller_t *p;
    int kinds[3];
} take_t;

static void *take_three(void *arg)
{
    take_t *t = arg;
    for (int i = 0; i < 3; i++)
        t->kinds[i] = (int)next_kind(t->p, 3000, NULL, 0);
    return NULL;
}

/* A worker that is about to end flushes its sinks: the count of sinks whose events did not go out
 * by the deadline (the router away), then 0 once a router has taken every one. */
static void test_flush(void **state)
{
    (void)state;
    duet_worker_net_t n;
    memset(&n, 0, sizeof n);
    duet_err_t err = {0};
    assert_int_equal(duet_worker_net_open_events(&n, "inproc://we-flush", 60000, &err), DUET_OK);
    assert_int_equal(duet_worker_net_flush(&n, duet_deadline_after_ms(1000)), 0); /* nothing queued */
    for (int i = 0; i < 3; i++)
        duet_worker_net_push(&n, chunk("r-flush"));
    uint64_t t0 = duet_time_ns();
    assert_int_equal(duet_worker_net_flush(&n, duet_deadline_after_ms(100)), 1);
    assert_true(duet_time_ns() - t0 < 1000000000ull);
    take_t t = {puller("inproc://we-flush"), {0}};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, take_three, &t), 0);
    assert_int_equal(duet_worker_net_flush(&n, duet_deadline_after_ms(5000)), 0);
    pthread_join(th, NULL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(t.kinds[i], DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
    duet_worker_net_close(&n);
    duet_ctl_puller_destroy(&t.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routing_and_heartbeats),
        cmocka_unit_test(test_full_table_and_idle),
        cmocka_unit_test(test_flush),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
