/* Control plane over NNG: live client/server on ipc://, malformed requests
 * answered with typed Error envelopes, deadlines against dead and killed
 * servers, and push/pull events in order.
 *
 * The killed-server tests run the server in a child process started from
 * this executable (`test_ctl --serve URL`), so that kill -9 hits a real
 * process with its own NNG state. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "ctl.h"
#include "log.h"
#include "msg_samples.h"
#include "time_util.h"

/* Deadlines may overrun by this much (NNG's timers, scheduling). */
#define SLACK_MS 200

static char g_dir[64];
static char g_self[4096]; /* this executable, for the child servers */
static int g_slow; /* child server: hold StateDumpRequest{include_requests} until killed */

static void url_for(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "ipc://%s/%s.sock", g_dir, name);
}

static uint64_t elapsed_ms(uint64_t t0) { return (duet_time_ns() - t0) / 1000000u; }

/* ------------------------------------------------------------------ a handler that answers like a worker */

static duet_status_t worker_handler(const duet_envelope_t *req, duet_envelope_t **reply, void *arg)
{
    const char *rid = duet_msg_rid(req);
    duet_msg_origin_t o = {"decode-0", rid, SAMPLE_EPOCH};
    (void)arg;
    switch (req->body_case) {
    case DUET__V1__ENVELOPE__BODY_RESERVE:
        *reply = sample_msg(DUET__V1__ENVELOPE__BODY_RESERVED);
        return DUET_OK;
    case DUET__V1__ENVELOPE__BODY_PREFILL:
        return DUET_ERR_LAYOUT_MISMATCH; /* sent as Error{LAYOUT_MISMATCH} */
    case DUET__V1__ENVELOPE__BODY_ABORT:
        return duet_msg_new_abort_ack(&o, 0, DUET__V1__REQUEST_STATE__REQUEST_STATE_UNSPECIFIED, 0, 0, reply);
    case DUET__V1__ENVELOPE__BODY_STATE_DUMP_REQUEST:
        if (req->state_dump_request->include_requests && g_slow)
            sleep(30); /* the killed-mid-call test kills us here */
        *reply = sample_msg(DUET__V1__ENVELOPE__BODY_STATE_DUMP);
        return DUET_OK;
    case DUET__V1__ENVELOPE__BODY_REJECTED: {
        /* an invalid reply: a Reserved without a descriptor */
        duet_status_t st = duet_msg_create(DUET__V1__ENVELOPE__BODY_RESERVED, &o, reply);
        return st;
    }
    case DUET__V1__ENVELOPE__BODY_HEARTBEAT:
        /* a reply about another request */
        return duet_msg_new_ack(&(duet_msg_origin_t){"decode-0", "someone-else", 1}, reply);
    default:
        return DUET_OK; /* Ack */
    }
}

static duet_ctl_server_t *start_server(const char *url, const duet_msg_limits_t *lim)
{
    duet_ctl_opts_t o = {.url = url, .sender_id = "decode-0", .limits = lim};
    duet_ctl_server_t *s = NULL;
    duet_err_t err = {0};
    if (duet_ctl_server_create(&o, worker_handler, NULL, &s, &err) != DUET_OK)
        fail_msg("server: %s", duet_err_text(&err));
    assert_int_equal(duet_ctl_server_start_thread(s, &err), DUET_OK);
    return s;
}

static duet_ctl_client_t *new_client(const char *url)
{
    duet_ctl_opts_t o = {.url = url};
    duet_ctl_client_t *c = NULL;
    duet_err_t err = {0};
    if (duet_ctl_client_create(&o, &c, &err) != DUET_OK)
        fail_msg("client: %s", duet_err_text(&err));
    return c;
}

/* Call until the server answers (it may still be starting), at most `ms`. */
static void wait_for_server(duet_ctl_client_t *c, uint64_t ms)
{
    uint64_t until = duet_deadline_after_ms(ms);
    duet_envelope_t *req = sample_msg(DUET__V1__ENVELOPE__BODY_ACK), *rep = NULL;
    duet_err_t err = {0};
    while (duet_time_ns() < until) {
        if (duet_ctl_client_call(c, req, duet_deadline_after_ms(200), &rep, &err) == DUET_OK)
            break;
    }
    assert_non_null(rep);
    duet_envelope_free(&rep);
    duet_envelope_free(&req);
}

/* ------------------------------------------------------------------ tests */

static void test_nng_table(void **state)
{
    (void)state;
    assert_int_equal(duet_ctl_status_from_nng(0), DUET_OK);
    assert_int_equal(duet_ctl_status_from_nng(NNG_ETIMEDOUT), DUET_ERR_TIMEOUT);
    assert_int_equal(duet_ctl_status_from_nng(NNG_ECLOSED), DUET_ERR_PEER);
    assert_int_equal(duet_ctl_status_from_nng(NNG_ECONNREFUSED), DUET_ERR_PEER);
    assert_int_equal(duet_ctl_status_from_nng(NNG_ECONNRESET), DUET_ERR_PEER);
    assert_int_equal(duet_ctl_status_from_nng(NNG_EAGAIN), DUET_ERR_BUSY);
    assert_int_equal(duet_ctl_status_from_nng(NNG_EADDRINUSE), DUET_ERR_BUSY);
    assert_int_equal(duet_ctl_status_from_nng(NNG_ENOMEM), DUET_ERR_NOMEM);
    assert_int_equal(duet_ctl_status_from_nng(NNG_EADDRINVAL), DUET_ERR_INVALID);
    assert_int_equal(duet_ctl_status_from_nng(NNG_EMSGSIZE), DUET_ERR_RANGE);
    assert_int_equal(duet_ctl_status_from_nng(NNG_EPROTO), DUET_ERR_PROTOCOL);
    assert_int_equal(duet_ctl_status_from_nng(NNG_ESYSERR | 5), DUET_ERR_IO);
    assert_int_equal(duet_ctl_status_from_nng(12345), DUET_ERR_INTERNAL);
}

static void test_bad_options(void **state)
{
    (void)state;
    duet_ctl_server_t *s = NULL;
    duet_ctl_client_t *c = NULL;
    duet_err_t err = {0};
    duet_ctl_opts_t none = {0};
    duet_ctl_opts_t bad = {.url = "nonsense://x"};
    assert_int_equal(duet_ctl_server_create(&none, worker_handler, NULL, &s, &err), DUET_ERR_INVALID);
    assert_int_equal(duet_ctl_server_create(&bad, NULL, NULL, &s, &err), DUET_ERR_INVALID);
    assert_int_not_equal(duet_ctl_server_create(&bad, worker_handler, NULL, &s, &err), DUET_OK);
    assert_int_not_equal(duet_ctl_client_create(&bad, &c, &err), DUET_OK);
    duet_ctl_opts_t bad_id = {.url = "ipc:///tmp/x", .sender_id = "bad id"};
    assert_int_equal(duet_ctl_client_create(&bad_id, &c, &err), DUET_ERR_INVALID);
    assert_null(s);
    assert_null(c);

    /* the same address twice */
    char url[128];
    url_for(url, sizeof url, "twice");
    duet_ctl_server_t *s1 = start_server(url, NULL);
    duet_ctl_opts_t o = {.url = url};
    assert_int_equal(duet_ctl_server_create(&o, worker_handler, NULL, &s, &err), DUET_ERR_BUSY);
    assert_non_null(strstr(err.msg, url));
    duet_ctl_server_destroy(&s1);
    assert_null(s1);
    duet_ctl_server_destroy(&s1); /* twice is fine */
}

/* Every message kind goes through a live server and gets its typed answer. */
static void test_live_every_kind(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "live");
    duet_ctl_server_t *s = start_server(url, NULL);
    duet_ctl_client_t *c = new_client(url);
    wait_for_server(c, 2000);

    for (int i = 0; i < n_sample_kinds; i++) {
        duet_msg_kind_t k = sample_kinds[i];
        duet_envelope_t *req = sample_msg(k), *rep = NULL;
        duet_err_t err = {0};
        duet_status_t st = duet_ctl_client_call(c, req, duet_deadline_after_ms(2000), &rep, &err);
        if (k == DUET__V1__ENVELOPE__BODY_HEARTBEAT) {
            /* the handler answers about another rid: refused by the client */
            assert_int_equal(st, DUET_ERR_PROTOCOL);
            assert_non_null(strstr(err.msg, "someone-else"));
            duet_envelope_free(&req);
            continue;
        }
        if (st)
            fail_msg("%s: %s", duet_msg_kind_name(k), duet_err_text(&err));
        assert_string_equal(rep->header->sender_id, "decode-0");
        switch (k) {
        case DUET__V1__ENVELOPE__BODY_RESERVE:
            assert_int_equal(rep->body_case, DUET__V1__ENVELOPE__BODY_RESERVED);
            assert_int_equal(rep->reserved->descriptor->n_pools, DUET_POOL_COUNT);
            break;
        case DUET__V1__ENVELOPE__BODY_PREFILL:
            assert_int_equal(rep->body_case, DUET__V1__ENVELOPE__BODY_ERROR);
            assert_int_equal(duet_ctl_reply_status(rep, &err), DUET_ERR_LAYOUT_MISMATCH);
            assert_non_null(strstr(err.msg, "decode-0 answered LAYOUT_MISMATCH"));
            assert_string_equal(rep->header->rid, SAMPLE_RID); /* the error is about the request */
            break;
        case DUET__V1__ENVELOPE__BODY_ABORT:
            assert_int_equal(rep->body_case, DUET__V1__ENVELOPE__BODY_ABORT_ACK);
            assert_false(rep->abort_ack->known);
            break;
        case DUET__V1__ENVELOPE__BODY_STATE_DUMP_REQUEST:
            assert_int_equal(rep->body_case, DUET__V1__ENVELOPE__BODY_STATE_DUMP);
            assert_int_equal(rep->state_dump->n_requests, 2);
            break;
        case DUET__V1__ENVELOPE__BODY_REJECTED:
            /* the handler's reply was invalid: replaced by Error INTERNAL */
            assert_int_equal(duet_ctl_reply_status(rep, &err), DUET_ERR_INTERNAL);
            assert_non_null(strstr(rep->error->message, "reserved.descriptor: missing"));
            break;
        default:
            assert_int_equal(rep->body_case, DUET__V1__ENVELOPE__BODY_ACK);
            assert_int_equal(duet_ctl_reply_status(rep, &err), DUET_OK);
            break;
        }
        duet_envelope_free(&rep);
        duet_envelope_free(&req);
    }
    duet_ctl_server_stats_t stats;
    duet_ctl_server_stats(s, &stats);
    assert_int_equal(stats.bad_requests, 0);
    assert_int_equal(stats.handler_errors, 1);
    assert_int_equal(stats.bad_replies, 1);
    duet_ctl_client_destroy(&c);
    duet_ctl_server_destroy(&s);
}

/* Malformed requests are answered with an Error carrying the typed code,
 * the server logs them and keeps serving. */
static int g_warnings;
static void count_warnings(duet_log_level_t level, const char *file, int line, const char *rid, const char *msg,
                           void *arg)
{
    (void)file, (void)line, (void)rid, (void)msg, (void)arg;
    if (level == DUET_LOG_WARN)
        __atomic_add_fetch(&g_warnings, 1, __ATOMIC_SEQ_CST);
}

static void expect_error_reply(duet_ctl_client_t *c, const void *buf, size_t len, duet_status_t want)
{
    duet_envelope_t *rep = NULL;
    duet_err_t err = {0};
    duet_status_t st = duet_ctl_client_call_raw(c, buf, len, duet_deadline_after_ms(2000), &rep, &err);
    if (st)
        fail_msg("raw call of %zu bytes: %s", len, duet_err_text(&err));
    assert_int_equal(rep->body_case, DUET__V1__ENVELOPE__BODY_ERROR);
    assert_int_equal(duet_msg_error_status(rep->error->code), want);
    assert_true(rep->error->message[0] != '\0');
    assert_string_equal(rep->header->rid, ""); /* an undecodable request has no rid */
    duet_envelope_free(&rep);
}

static void test_malformed_requests(void **state)
{
    (void)state;
    char url[128];
    duet_msg_limits_t lim;
    duet_msg_limits_default(&lim);
    lim.max_message_bytes = 4096;
    url_for(url, sizeof url, "malformed");
    duet_ctl_server_t *s = start_server(url, &lim);
    duet_ctl_client_t *c = new_client(url);
    wait_for_server(c, 2000);
    duet_log_set_handler(count_warnings, NULL);

    uint8_t junk[100];
    memset(junk, 0xff, sizeof junk);
    expect_error_reply(c, junk, sizeof junk, DUET_ERR_PARSE);

    size_t len;
    duet_envelope_t *e = sample_msg(DUET__V1__ENVELOPE__BODY_PREFILL);
    uint8_t *buf = sample_pack_raw(e, &len);
    expect_error_reply(c, buf, len / 2, DUET_ERR_PARSE); /* truncated */
    expect_error_reply(c, buf, 0, DUET_ERR_VERSION);     /* empty: no header */
    free(buf);
    e->header->version = 9;
    buf = sample_pack_raw(e, &len);
    expect_error_reply(c, buf, len, DUET_ERR_VERSION);
    free(buf);
    e->header->version = DUET_PROTOCOL_VERSION;
    e->prefill->tokens[0] = -1;
    buf = sample_pack_raw(e, &len);
    expect_error_reply(c, buf, len, DUET_ERR_RANGE);
    free(buf);
    duet_envelope_free(&e);

    uint8_t *big = calloc(1, 5000); /* over the server's 4096-byte limit */
    expect_error_reply(c, big, 5000, DUET_ERR_RANGE);
    free(big);

    /* still serving */
    duet_envelope_t *req = sample_msg(DUET__V1__ENVELOPE__BODY_ABORT), *rep = NULL;
    duet_err_t err = {0};
    assert_int_equal(duet_ctl_client_call(c, req, duet_deadline_after_ms(2000), &rep, &err), DUET_OK);
    assert_int_equal(rep->body_case, DUET__V1__ENVELOPE__BODY_ABORT_ACK);
    duet_envelope_free(&rep);
    duet_envelope_free(&req);

    duet_ctl_server_stats_t stats;
    duet_ctl_server_stats(s, &stats);
    assert_int_equal(stats.bad_requests, 6);
    assert_true(__atomic_load_n(&g_warnings, __ATOMIC_SEQ_CST) >= 6);
    duet_log_set_handler(NULL, NULL);
    duet_ctl_client_destroy(&c);
    duet_ctl_server_destroy(&s);
}

/* Poll mode: the owner's loop serves; the descriptor wakes it. */
typedef struct {
    const char *url;
    int n_ok;
    char first_err[200]; /* the first failed call's error */
} poll_client_t;

static void *poll_client_main(void *arg)
{
    poll_client_t *pc = arg;
    duet_ctl_client_t *c = new_client(pc->url);
    for (int i = 0; i < 20; i++) {
        duet_envelope_t *req = sample_msg(DUET__V1__ENVELOPE__BODY_RESERVE), *rep = NULL;
        duet_err_t err = {0};
        uint64_t t0 = duet_time_ns();
        duet_status_t st = duet_ctl_client_call(c, req, duet_deadline_after_ms(3000), &rep, &err);
        if (st == DUET_OK && rep->body_case == DUET__V1__ENVELOPE__BODY_RESERVED)
            pc->n_ok++;
        else if (!pc->first_err[0])
            snprintf(pc->first_err, sizeof pc->first_err, "call %d after %llu ms: %s", i,
                     (unsigned long long)elapsed_ms(t0), st ? duet_err_text(&err) : "another reply");
        duet_envelope_free(&rep);
        duet_envelope_free(&req);
    }
    duet_ctl_client_destroy(&c);
    return NULL;
}

static void test_poll_mode(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "poll");
    duet_ctl_opts_t o = {.url = url, .sender_id = "decode-0"};
    duet_ctl_server_t *s = NULL;
    duet_err_t err = {0};
    assert_int_equal(duet_ctl_server_create(&o, worker_handler, NULL, &s, &err), DUET_OK);
    int fd = -1;
    assert_int_equal(duet_ctl_server_fd(s, &fd), DUET_OK);
    assert_true(fd >= 0);

    /* nothing waiting: a poll with a passed deadline returns at once */
    uint32_t n = 99;
    uint64_t t0 = duet_time_ns();
    assert_int_equal(duet_ctl_server_poll(s, 0, &n), DUET_OK);
    assert_int_equal(n, 0);
    assert_true(elapsed_ms(t0) < 50);
    /* and one with a deadline waits for it */
    t0 = duet_time_ns();
    assert_int_equal(duet_ctl_server_poll(s, duet_deadline_after_ms(100), &n), DUET_OK);
    assert_true(elapsed_ms(t0) >= 90 && elapsed_ms(t0) < 100 + SLACK_MS);

    poll_client_t pc = {url, 0, ""};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, poll_client_main, &pc), 0);
    uint32_t total = 0;
    uint64_t until = duet_deadline_after_ms(10000);
    while (total < 20 && duet_time_ns() < until) {
        assert_int_equal(duet_ctl_server_poll(s, duet_deadline_after_ms(50), &n), DUET_OK);
        total += n;
    }
    pthread_join(th, NULL);
    if (total != 20 || pc.n_ok != 20)
        fail_msg("served %u, answered %d of 20 (listener restarts %lu, client redials %lu, timeouts rescued %lu); "
                 "first failure: %s",
                 total, pc.n_ok, duet_ctl_listener_restarts(), duet_ctl_client_redials(), duet_ctl_timeouts_rescued(),
                 pc.first_err);

    /* a threaded server cannot also be polled */
    assert_int_equal(duet_ctl_server_start_thread(s, &err), DUET_OK);
    assert_int_equal(duet_ctl_server_poll(s, 0, &n), DUET_ERR_STATE);
    assert_int_equal(duet_ctl_server_start_thread(s, &err), DUET_ERR_STATE);
    duet_ctl_server_destroy(&s);
}

/* Nobody listens: TIMEOUT within the deadline (+ slack), never a hang. */
static void test_dead_server_timeout(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "nobody");
    duet_ctl_client_t *c = new_client(url);
    duet_envelope_t *req = sample_msg(DUET__V1__ENVELOPE__BODY_RESERVE), *rep = NULL;
    duet_err_t err = {0};
    for (int deadline = 50; deadline <= 400; deadline *= 2) {
        uint64_t t0 = duet_time_ns();
        assert_int_equal(duet_ctl_client_call(c, req, duet_deadline_after_ms((uint64_t)deadline), &rep, &err),
                         DUET_ERR_TIMEOUT);
        uint64_t took = elapsed_ms(t0);
        if (took > (uint64_t)deadline + SLACK_MS || took + 5 < (uint64_t)deadline)
            fail_msg("deadline %d ms: the call took %llu ms", deadline, (unsigned long long)took);
        assert_null(rep);
    }
    /* a deadline already passed: TIMEOUT at once */
    uint64_t t0 = duet_time_ns();
    assert_int_equal(duet_ctl_client_call(c, req, 0, &rep, &err), DUET_ERR_TIMEOUT);
    assert_true(elapsed_ms(t0) < 20);
    duet_envelope_free(&req);
    duet_ctl_client_destroy(&c);
}

/* Clients that connect to the server's ipc path and close at once, before the handshake: with
 * libnng 1.5.2 the listener's accept loop ends on them (docs/PROTOCOL.md).  n raw connections. */
static void connect_and_leave(const char *url, int n)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", url + strlen("ipc://"));
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        assert_true(fd >= 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
            fail_msg("connect %s: %s", a.sun_path, strerror(errno));
        close(fd);
    }
}

/* A call on a fresh client answered within `ms` (a listener that accepts). */
static int fresh_client_answered(const char *url, uint64_t ms)
{
    duet_ctl_client_t *c = new_client(url);
    duet_envelope_t *req = sample_msg(DUET__V1__ENVELOPE__BODY_ACK), *rep = NULL;
    duet_err_t err = {0};
    uint64_t until = duet_deadline_after_ms(ms);
    while (!rep && duet_time_ns() < until)
        duet_ctl_client_call(c, req, duet_deadline_after_ms(200), &rep, &err);
    int ok = rep != NULL;
    duet_envelope_free(&rep);
    duet_envelope_free(&req);
    duet_ctl_client_destroy(&c);
    return ok;
}

/* Clients that leave during the handshake do not deafen the server: new clients are answered
 * within 5 s (a new listener, the path a link to it, and a client that dialed the stopped one
 * closes its silent connection after 2 s), also while a client connected before keeps the old
 * listener busy, and that client is served throughout.  (Without the relay, libnng
 * 1.5.2 leaves every later client unanswered; with a restart that waits for idle connections,
 * the new client waits as long as the busy one calls.) */
static void test_listener_deafened(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "deaf");
    const char *path = url + strlen("ipc://");
    duet_ctl_server_t *s = start_server(url, NULL);
    assert_true(fresh_client_answered(url, 3000));

    /* nobody attached: the next client is answered */
    unsigned long replaced = duet_ctl_listener_restarts();
    connect_and_leave(url, 20);
    assert_true(fresh_client_answered(url, 5000));
    /* the listener replaced (or NNG went on by itself): a client connected from now on is on a
     * listener that accepts */
    for (int i = 0; i < 100 && duet_ctl_listener_restarts() == replaced; i++)
        usleep(20 * 1000);

    /* a client attached and calling every 50 ms throughout: a new one is answered meanwhile */
    duet_ctl_client_t *held = new_client(url);
    wait_for_server(held, 3000);
    connect_and_leave(url, 20);
    duet_ctl_client_t *fresh = new_client(url);
    duet_envelope_t *req = sample_msg(DUET__V1__ENVELOPE__BODY_ACK), *rep = NULL;
    duet_err_t err = {0};
    int fresh_ok = 0;
    for (int i = 0; i < 100 && !fresh_ok; i++) { /* 5 s at most */
        assert_int_equal(duet_ctl_client_call(held, req, duet_deadline_after_ms(2000), &rep, &err), DUET_OK);
        duet_envelope_free(&rep);
        if (duet_ctl_client_call(fresh, req, duet_deadline_after_ms(50), &rep, &err) == DUET_OK)
            fresh_ok = 1;
        duet_envelope_free(&rep);
    }
    assert_true(fresh_ok);
    assert_int_equal(duet_ctl_client_call(held, req, duet_deadline_after_ms(2000), &rep, &err), DUET_OK);
    duet_envelope_free(&rep);
    duet_envelope_free(&req);
    duet_ctl_client_destroy(&fresh);
    duet_ctl_client_destroy(&held);
    assert_true(fresh_client_answered(url, 3000));

    /* the path is a link to the current listener; both go with the server */
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    char target[256];
    ssize_t n = readlink(path, target, sizeof target - 1);
    assert_true(n > 0);
    target[n] = 0;
    char full[512];
    snprintf(full, sizeof full, "%.*s%s", (int)(strrchr(path, '/') + 1 - path), path, target);
    assert_int_equal(stat(full, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    duet_ctl_server_destroy(&s);
    assert_int_not_equal(lstat(path, &st), 0);
    assert_int_not_equal(lstat(full, &st), 0);
}

/* The address of a live server is in use for a second one; what a killed one left (a link to a
 * listener file nobody listens on) is taken over. */
static void test_listener_address(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "addr");
    duet_ctl_server_t *s = start_server(url, NULL), *s2 = NULL;
    duet_ctl_opts_t o = {.url = url, .sender_id = "second"};
    duet_err_t err = {0};
    assert_int_not_equal(duet_ctl_server_create(&o, worker_handler, NULL, &s2, &err), DUET_OK);
    assert_null(s2);
    assert_true(fresh_client_answered(url, 3000));
    usleep(300 * 1000); /* a check (the second server's probe may have the listener replaced) */
    assert_true(fresh_client_answered(url, 3000));
    duet_ctl_server_destroy(&s);

    /* a link and a socket file as a kill -9 leaves them */
    const char *path = url + strlen("ipc://");
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    char *stale = a.sun_path;
    assert_true(snprintf(stale, sizeof a.sun_path, "%s.l7", path) < (int)sizeof a.sun_path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    close(fd); /* bound, never listened on: a file nobody accepts on */
    assert_int_equal(symlink(strrchr(stale, '/') + 1, path), 0);
    s = start_server(url, NULL);
    assert_true(fresh_client_answered(url, 3000));
    struct stat st;
    assert_int_not_equal(lstat(stale, &st), 0); /* removed */
    duet_ctl_server_destroy(&s);

    /* a link to a listener that never accepts and whose queue is full (a process whose listener
     * stopped, its clients redialling): a start refuses the address (its owner holds it) at once
     * instead of waiting in connect(2) for room that never comes */
    unlink(path); /* the link the server left, if any */
    unlink(stale);
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(lfd, 0), 0);
    int q[4], nq = 0;
    for (; nq < 4; nq++) { /* fill its queue */
        q[nq] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (connect(q[nq], (struct sockaddr *)&a, sizeof a) != 0) {
            assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
            close(q[nq]);
            break;
        }
    }
    assert_true(nq >= 1 && nq < 4);
    assert_int_equal(symlink(strrchr(stale, '/') + 1, path), 0);
    duet_ctl_opts_t o2 = {.url = url};
    uint64_t t0 = duet_time_ns();
    assert_int_equal(duet_ctl_server_create(&o2, worker_handler, NULL, &s2, &err), DUET_ERR_BUSY);
    assert_true(elapsed_ms(t0) < 3000);
    for (int i = 0; i < nq; i++)
        close(q[i]);
    close(lfd); /* the owner gone: the address is free again */
    s = start_server(url, NULL);
    assert_true(fresh_client_answered(url, 3000));
    duet_ctl_server_destroy(&s);
}

/* The server, in a child process. */
static pid_t spawn_server(const char *url, int slow)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(g_self, "test_ctl", "--serve", url, slow ? "slow" : (char *)NULL, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void kill_child(pid_t pid)
{
    int status;
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

/* kill -9 of the server between calls: the next calls fail with PEER at once, not at their
 * deadline (the connection is gone: nothing to send on), and the client takes calls again when
 * a server is back on the address. */
static void test_killed_server(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "killed");
    pid_t pid = spawn_server(url, 0);
    duet_ctl_client_t *c = new_client(url);
    wait_for_server(c, 5000);

    kill_child(pid);
    duet_envelope_t *req = sample_msg(DUET__V1__ENVELOPE__BODY_RESERVE), *rep = NULL;
    duet_err_t err = {0};
    for (int i = 0; i < 3; i++) {
        uint64_t t0 = duet_time_ns();
        duet_status_t st = duet_ctl_client_call(c, req, duet_deadline_after_ms(5000), &rep, &err);
        uint64_t took = elapsed_ms(t0);
        if (st != DUET_ERR_PEER)
            fail_msg("call %d after kill: %s", i, duet_err_text(&err));
        if (took > SLACK_MS)
            fail_msg("call %d after kill took %llu ms (deadline 5000 ms)", i, (unsigned long long)took);
        assert_null(rep);
    }

    /* a new server on the same address: the client reconnects by itself */
    pid = spawn_server(url, 0);
    wait_for_server(c, 5000);
    kill_child(pid);
    duet_envelope_free(&req);
    duet_ctl_client_destroy(&c);
}

/* kill -9 of the server while it holds a call: PEER long before the deadline. */
static void *killer(void *arg)
{
    usleep(300 * 1000);
    kill(*(pid_t *)arg, SIGKILL);
    return NULL;
}

static void test_killed_mid_call(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "midcall");
    pid_t pid = spawn_server(url, 1);
    duet_ctl_client_t *c = new_client(url);
    wait_for_server(c, 5000);

    duet_msg_origin_t o = {"router-0", NULL, 0};
    duet_envelope_t *req = NULL, *rep = NULL;
    duet_err_t err = {0};
    assert_int_equal(duet_msg_new_state_dump_request(&o, 1, &req), DUET_OK); /* the child sleeps on this */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, killer, &pid), 0);
    uint64_t t0 = duet_time_ns();
    duet_status_t st = duet_ctl_client_call(c, req, duet_deadline_after_ms(5000), &rep, &err);
    uint64_t took = elapsed_ms(t0);
    pthread_join(th, NULL);
    int status;
    waitpid(pid, &status, 0);
    if (st != DUET_ERR_PEER)
        fail_msg("want PEER, got %s", duet_err_text(&err));
    assert_true(took < 300 + 1000); /* the broken connection is seen, not the 5 s deadline */
    assert_null(rep);
    duet_envelope_free(&req);
    duet_ctl_client_destroy(&c);
}

static duet_ctl_puller_t *new_puller(const char *url)
{
    duet_ctl_opts_t o = {.url = url};
    duet_ctl_puller_t *p = NULL;
    duet_err_t err = {0};
    if (duet_ctl_puller_create(&o, &p, &err) != DUET_OK)
        fail_msg("puller: %s", duet_err_text(&err));
    return p;
}

static duet_ctl_pusher_t *new_pusher(const char *url, uint32_t queue_len)
{
    duet_ctl_opts_t o = {.url = url, .queue_len = queue_len};
    duet_ctl_pusher_t *p = NULL;
    duet_err_t err = {0};
    if (duet_ctl_pusher_create(&o, &p, &err) != DUET_OK)
        fail_msg("pusher: %s", duet_err_text(&err));
    return p;
}

static void push_chunk(duet_ctl_pusher_t *p, uint32_t index, uint64_t deadline, duet_status_t want)
{
    duet_msg_origin_t o = {"decode-0", SAMPLE_RID, SAMPLE_EPOCH};
    int32_t tok = (int32_t)index * 3;
    duet_envelope_t *e = NULL;
    duet_err_t err = {0};
    assert_int_equal(duet_msg_new_token_chunk(&o, index, &tok, 1, &e), DUET_OK);
    duet_status_t st = duet_ctl_pusher_send(p, e, deadline, &err);
    if (st != want)
        fail_msg("push %u: want %s, got %s", index, duet_status_code(want), duet_err_text(&err));
    duet_envelope_free(&e);
}

static void pull_chunk(duet_ctl_puller_t *p, uint32_t index)
{
    duet_envelope_t *e = NULL;
    duet_err_t err = {0};
    duet_status_t st = duet_ctl_puller_recv(p, duet_deadline_after_ms(3000), &e, &err);
    if (st)
        fail_msg("pull %u: %s", index, duet_err_text(&err));
    assert_int_equal(e->body_case, DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
    assert_int_equal(e->token_chunk->first_index, index);
    assert_int_equal(e->token_chunk->tokens[0], (int32_t)index * 3);
    duet_envelope_free(&e);
}

typedef struct {
    duet_ctl_pusher_t *p;
    uint32_t from, to;
    int failures; /* counted here, asserted on the test's thread */
} pusher_thread_t;

static void *pusher_main(void *arg)
{
    pusher_thread_t *pt = arg;
    duet_msg_origin_t o = {"decode-0", SAMPLE_RID, SAMPLE_EPOCH};
    for (uint32_t i = pt->from; i < pt->to; i++) {
        int32_t tok = (int32_t)i * 3;
        duet_envelope_t *e = NULL;
        duet_err_t err = {0};
        if (duet_msg_new_token_chunk(&o, i, &tok, 1, &e) != DUET_OK ||
            duet_ctl_pusher_send(pt->p, e, duet_deadline_after_ms(3000), &err) != DUET_OK)
            pt->failures++;
        duet_envelope_free(&e);
    }
    return NULL;
}

static void test_push_pull(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "events");

    /* events pushed before the puller exists wait in the queue */
    duet_ctl_pusher_t *p = new_pusher(url, 0);
    for (uint32_t i = 0; i < 10; i++)
        push_chunk(p, i, duet_deadline_after_ms(100), DUET_OK);
    duet_ctl_puller_t *q = new_puller(url);
    for (uint32_t i = 0; i < 10; i++)
        pull_chunk(q, i);

    /* many events from a pushing thread while this one pulls: in order */
    pusher_thread_t pt = {p, 10, 5000, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pusher_main, &pt), 0);
    for (uint32_t i = 10; i < 5000; i++)
        pull_chunk(q, i);
    pthread_join(th, NULL);
    assert_int_equal(pt.failures, 0);

    /* nothing more: TIMEOUT within the deadline */
    duet_envelope_t *e = NULL;
    duet_err_t err = {0};
    uint64_t t0 = duet_time_ns();
    assert_int_equal(duet_ctl_puller_recv(q, duet_deadline_after_ms(100), &e, &err), DUET_ERR_TIMEOUT);
    assert_true(elapsed_ms(t0) <= 100 + SLACK_MS);
    assert_int_equal(duet_ctl_puller_recv(q, 0, &e, &err), DUET_ERR_TIMEOUT);
    /* the descriptor wakes a poll(2) loop when an event waits */
    int fd = -1;
    assert_int_equal(duet_ctl_puller_fd(q, &fd), DUET_OK);
    assert_true(fd >= 0);
    struct pollfd pfd = {fd, POLLIN, 0};
    assert_int_equal(poll(&pfd, 1, 0), 0);
    push_chunk(p, 5000, duet_deadline_after_ms(100), DUET_OK);
    assert_int_equal(poll(&pfd, 1, 2000), 1);
    pull_chunk(q, 5000);

    /* an invalid event is refused by the pusher before it is sent */
    duet_msg_origin_t o = {"decode-0", NULL, 0};
    assert_int_equal(duet_msg_new_token_chunk(&o, 0, NULL, 0, &e), DUET_OK);
    assert_int_equal(duet_ctl_pusher_send(p, e, 0, &err), DUET_ERR_PROTOCOL);
    duet_envelope_free(&e);

    duet_ctl_pusher_destroy(&p);
    duet_ctl_puller_destroy(&q);
}

typedef struct {
    duet_ctl_puller_t *q;
    uint32_t want, got;
    int failures;
} puller_thread_t;

static void *puller_main(void *arg)
{
    puller_thread_t *pt = arg;
    for (uint32_t i = 0; i < pt->want; i++) {
        duet_envelope_t *e = NULL;
        duet_err_t err = {0};
        if (duet_ctl_puller_recv(pt->q, duet_deadline_after_ms(3000), &e, &err) != DUET_OK) {
            pt->failures++;
            break;
        }
        if (e->body_case != DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK || e->token_chunk->first_index != i)
            pt->failures++;
        duet_envelope_free(&e);
        pt->got++;
    }
    return NULL;
}

/* A flush waits for the queued events to be taken: at once when none are, TIMEOUT at its deadline
 * while the puller is away, DUET_OK once the puller has answered every one (a worker that ends after
 * a lost GPU sends its requests' errors this way). */
static void test_push_flush(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "flush");
    duet_ctl_pusher_t *p = new_pusher(url, 64);
    duet_err_t err = {0};
    uint64_t t0 = duet_time_ns();
    assert_int_equal(duet_ctl_pusher_flush(p, duet_deadline_after_ms(1000), &err), DUET_OK);
    assert_true(elapsed_ms(t0) < 20);

    for (uint32_t i = 0; i < 20; i++)
        push_chunk(p, i, 0, DUET_OK);
    t0 = duet_time_ns();
    assert_int_equal(duet_ctl_pusher_flush(p, duet_deadline_after_ms(100), &err), DUET_ERR_TIMEOUT);
    assert_true(elapsed_ms(t0) >= 90 && elapsed_ms(t0) <= 100 + SLACK_MS);
    assert_non_null(strstr(err.msg, "not delivered"));

    duet_ctl_puller_t *q = new_puller(url);
    puller_thread_t pt = {q, 20, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, puller_main, &pt), 0);
    t0 = duet_time_ns();
    assert_int_equal(duet_ctl_pusher_flush(p, duet_deadline_after_ms(5000), &err), DUET_OK);
    assert_true(elapsed_ms(t0) < 5000);
    pthread_join(th, NULL);
    assert_int_equal(pt.failures, 0);
    assert_int_equal(pt.got, 20);
    duet_ctl_pusher_destroy(&p);
    duet_ctl_puller_destroy(&q);
}

/* A pusher whose puller is away fills its queue: BUSY, at once or at the
 * deadline.  (One more event waits outside the queue for a connection.) */
static void test_push_busy(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "busy");
    duet_ctl_pusher_t *p = new_pusher(url, 4);
    duet_msg_origin_t o = {"decode-0", SAMPLE_RID, SAMPLE_EPOCH};
    uint32_t accepted = 1;
    duet_status_t st = DUET_OK;
    push_chunk(p, 0, 0, DUET_OK);
    usleep(50 * 1000); /* the sending thread takes it out of the queue and waits for a puller */
    while (accepted < 10) {
        int32_t tok = (int32_t)accepted * 3;
        duet_envelope_t *e = NULL;
        duet_err_t err = {0};
        assert_int_equal(duet_msg_new_token_chunk(&o, accepted, &tok, 1, &e), DUET_OK);
        st = duet_ctl_pusher_send(p, e, 0, &err);
        duet_envelope_free(&e);
        if (st != DUET_OK)
            break;
        accepted++;
    }
    assert_int_equal(st, DUET_ERR_BUSY);
    assert_int_equal(accepted, 5); /* 4 queued, 1 waiting to be sent */
    uint64_t t0 = duet_time_ns();
    push_chunk(p, accepted, 0, DUET_ERR_BUSY);
    assert_true(elapsed_ms(t0) < 20);
    t0 = duet_time_ns();
    push_chunk(p, accepted, duet_deadline_after_ms(100), DUET_ERR_BUSY);
    assert_true(elapsed_ms(t0) >= 90 && elapsed_ms(t0) <= 100 + SLACK_MS);

    /* the puller arrives: the queue drains in order and there is room again */
    duet_ctl_puller_t *q = new_puller(url);
    for (uint32_t i = 0; i < accepted; i++)
        pull_chunk(q, i);
    push_chunk(p, accepted, duet_deadline_after_ms(1000), DUET_OK);
    pull_chunk(q, accepted);
    duet_ctl_pusher_destroy(&p);
    duet_ctl_puller_destroy(&q);
}

/* Garbage arriving at a puller: a typed error for that event (and an Error
 * answer to its sender), then the next event. */
static void raw_send(nng_socket raw, const void *buf, size_t len)
{
    assert_int_equal(nng_send(raw, (void *)buf, len, 0), 0);
}

static void raw_expect_answer(nng_socket raw, duet_status_t want)
{
    void *buf = NULL;
    size_t len = 0;
    duet_envelope_t *e = NULL;
    duet_err_t err = {0};
    assert_int_equal(nng_recv(raw, &buf, &len, NNG_FLAG_ALLOC), 0);
    assert_int_equal(duet_msg_decode(buf, len, NULL, &e, &err), DUET_OK);
    nng_free(buf, len);
    assert_int_equal(duet_ctl_reply_status(e, &err), want);
    duet_envelope_free(&e);
}

static void test_puller_garbage(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "garbage");
    duet_ctl_puller_t *q = new_puller(url);
    nng_socket raw;
    assert_int_equal(nng_req0_open(&raw), 0);
    assert_int_equal(nng_socket_set_ms(raw, NNG_OPT_RECVTIMEO, 3000), 0);
    assert_int_equal(nng_socket_set_ms(raw, NNG_OPT_SENDTIMEO, 3000), 0); /* no send waits for ever */
    assert_int_equal(nng_dial(raw, url, NULL, 0), 0);
    duet_envelope_t *e = NULL;
    duet_err_t err = {0};

    uint8_t junk[32];
    memset(junk, 0xff, sizeof junk);
    raw_send(raw, junk, sizeof junk);
    assert_int_equal(duet_ctl_puller_recv(q, duet_deadline_after_ms(2000), &e, &err), DUET_ERR_PARSE);
    assert_null(e);
    raw_expect_answer(raw, DUET_ERR_PARSE);

    size_t len;
    e = sample_msg(DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
    e->header->version = 3;
    uint8_t *buf = sample_pack_raw(e, &len);
    duet_envelope_free(&e);
    raw_send(raw, buf, len);
    free(buf);
    assert_int_equal(duet_ctl_puller_recv(q, duet_deadline_after_ms(2000), &e, &err), DUET_ERR_VERSION);
    raw_expect_answer(raw, DUET_ERR_VERSION);

    e = sample_msg(DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
    buf = sample_pack_raw(e, &len);
    duet_envelope_free(&e);
    raw_send(raw, buf, len);
    free(buf);
    assert_int_equal(duet_ctl_puller_recv(q, duet_deadline_after_ms(2000), &e, &err), DUET_OK);
    assert_int_equal(e->body_case, DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
    duet_envelope_free(&e);
    raw_expect_answer(raw, DUET_OK);
    nng_close(raw);
    duet_ctl_puller_destroy(&q);
}

/* Pullers come and go while a pusher sends without pause: each puller is a
 * child process that takes 20 events, checks their order and is killed
 * with SIGKILL.  The pushing process keeps running (NNG 1.5.2's push socket
 * crashed here when its puller went away), and its sends only ever answer
 * OK or BUSY. */
typedef struct {
    duet_ctl_pusher_t *p;
    int stop;
    int bad; /* statuses other than OK/BUSY */
    uint32_t sent;
} churn_t;

static void *churn_pusher(void *arg)
{
    churn_t *c = arg;
    duet_msg_origin_t o = {"decode-0", SAMPLE_RID, SAMPLE_EPOCH};
    while (!__atomic_load_n(&c->stop, __ATOMIC_SEQ_CST)) {
        int32_t tok = 1;
        duet_envelope_t *e = NULL;
        duet_err_t err = {0};
        if (duet_msg_new_token_chunk(&o, c->sent, &tok, 1, &e) != DUET_OK) {
            c->bad++;
            break;
        }
        duet_status_t st = duet_ctl_pusher_send(c->p, e, duet_deadline_after_ms(2), &err);
        duet_envelope_free(&e);
        if (st == DUET_OK)
            c->sent++;
        else if (st != DUET_ERR_BUSY)
            c->bad++;
    }
    return NULL;
}

/* A dialer that stopped (as libnng 1.5.2's does after an attempt that ends in NNG_ECLOSED, which
 * test_puller_churn met under load) is followed by a new one after a second without a
 * connection: a client's calls are answered again, and a pusher's queued event reaches a puller
 * that starts after the stop.  (Without the new dialer neither ever happens.  The client first:
 * closing the pusher's socket at the end can hold libnng's reaper, docs/PROTOCOL.md.) */
static void test_dialer_revived(void **state)
{
    (void)state;
    char url[128], surl[128];
    duet_err_t err = {0};
    url_for(surl, sizeof surl, "revive-srv");
    duet_ctl_server_t *s = start_server(surl, NULL);
    duet_ctl_client_t *c = new_client(surl);
    wait_for_server(c, 3000);
    duet_ctl_client_test_stop_dialer(c);
    duet_envelope_t *req = sample_msg(DUET__V1__ENVELOPE__BODY_ACK), *rep = NULL;
    int ok = 0;
    for (uint64_t until = duet_deadline_after_ms(8000); !ok && duet_time_ns() < until;) {
        if (duet_ctl_client_call(c, req, duet_deadline_after_ms(200), &rep, &err) == DUET_OK) {
            ok = 1;
            duet_envelope_free(&rep);
        } else {
            nanosleep(&(struct timespec){0, 20000000}, NULL);
        }
    }
    duet_envelope_free(&req);
    if (!ok)
        fail_msg("no call answered in 8 s after the client's dialer stopped: %s", duet_err_text(&err));
    duet_ctl_client_destroy(&c);
    duet_ctl_server_destroy(&s);

    url_for(url, sizeof url, "revive");
    duet_ctl_pusher_t *p = new_pusher(url, 0);
    duet_ctl_pusher_test_stop_dialer(p);
    push_chunk(p, 7, duet_deadline_after_ms(1000), DUET_OK);
    duet_ctl_puller_t *q = new_puller(url);
    duet_envelope_t *e = NULL;
    if (duet_ctl_puller_recv(q, duet_deadline_after_ms(8000), &e, &err) != DUET_OK)
        fail_msg("the event did not come in 8 s after the pusher's dialer stopped: %s", duet_err_text(&err));
    assert_int_equal(e->token_chunk->first_index, 7);
    duet_envelope_free(&e);
    duet_ctl_pusher_destroy(&p);
    duet_ctl_puller_destroy(&q);
}

static void test_puller_churn(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "churn");
    churn_t c = {new_pusher(url, 64), 0, 0, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, churn_pusher, &c), 0);
    /* a failed round ends the loop; the pusher's thread is stopped before the test fails (a
     * failure leaving it running crashed the process at its exit) */
    int failed_round = -1;
    char failed_verdict = 0;
    for (int round = 0; round < 10 && failed_round < 0; round++) {
        int fds[2];
        if (pipe(fds) != 0) {
            failed_round = round;
            failed_verdict = 'p';
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            close(fds[0]);
            close(fds[1]);
            failed_round = round;
            failed_verdict = 'f';
            break;
        }
        if (pid == 0) {
            dup2(fds[1], 1);
            execl(g_self, "test_ctl", "--pull", url, (char *)NULL);
            _exit(127);
        }
        close(fds[1]);
        struct pollfd pfd = {fds[0], POLLIN, 0};
        char verdict = 0;
        if (poll(&pfd, 1, 10000) != 1 || read(fds[0], &verdict, 1) != 1)
            verdict = '?';
        close(fds[0]);
        kill_child(pid);
        if (verdict != 'k') {
            failed_round = round;
            failed_verdict = verdict;
        }
    }
    __atomic_store_n(&c.stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    if (failed_round >= 0) {
        duet_ctl_pusher_destroy(&c.p);
        fail_msg("round %d: the puller child answered '%c' (k: 20 events in order; t: none for 5 s; "
                 "p, f: no pipe or fork here)",
                 failed_round, failed_verdict);
    }
    assert_int_equal(c.bad, 0);
    assert_true(c.sent >= 200);
    duet_ctl_pusher_destroy(&c.p);
}

/* `test_ctl --pull URL`: take 20 events, say 'k' if they came in order
 * ('o' if not, 't' on a timeout), then wait to be killed. */
static int pull_until_killed(const char *url)
{
    duet_ctl_opts_t o = {.url = url};
    duet_ctl_puller_t *q = NULL;
    duet_err_t err = {0};
    char verdict = 'k';
    if (duet_ctl_puller_create(&o, &q, &err) != DUET_OK)
        verdict = 'c';
    uint64_t t0 = duet_time_ns();
    for (int k = 0, have = 0, last = 0; verdict == 'k' && k < 20; k++) {
        duet_envelope_t *e = NULL;
        if (duet_ctl_puller_recv(q, duet_deadline_after_ms(5000), &e, &err) != DUET_OK) {
            verdict = 't';
            fprintf(stderr, "puller child: %d events, then none for 5 s (%.0f ms after it started): %s\n", k,
                    (double)(duet_time_ns() - t0) / 1e6, duet_err_text(&err));
            break;
        }
        int idx = (int)e->token_chunk->first_index;
        if (have && idx <= last)
            verdict = 'o';
        last = idx;
        have = 1;
        duet_envelope_free(&e);
    }
    if (write(1, &verdict, 1) != 1)
        return 1;
    for (;;)
        pause();
}

/* `test_ctl --serve URL`: a server for the kill tests, until killed. */
static int serve_forever(const char *url)
{
    duet_ctl_opts_t o = {.url = url, .sender_id = "decode-0"};
    duet_ctl_server_t *s = NULL;
    duet_err_t err = {0};
    if (duet_ctl_server_create(&o, worker_handler, NULL, &s, &err) != DUET_OK) {
        fprintf(stderr, "serve: %s\n", duet_err_text(&err));
        return 1;
    }
    for (;;)
        duet_ctl_server_poll(s, duet_deadline_after_ms(1000), NULL);
}

/* The same for the puller's listener (the router's events socket): after clients that left
 * during the handshake, a new pusher's events arrive (the puller's receives, made in short
 * slices as the router makes them, restart the listener). */
static void test_puller_deafened(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "deaf-events");
    duet_ctl_puller_t *q = new_puller(url);
    connect_and_leave(url, 20);
    duet_envelope_t *e = NULL;
    duet_err_t err = {0};
    for (int i = 0; i < 5; i++) /* slices, as the router's event loop */
        duet_ctl_puller_recv(q, duet_deadline_after_ms(100), &e, &err);
    assert_null(e);
    duet_ctl_pusher_t *p = new_pusher(url, 0);
    push_chunk(p, 7, duet_deadline_after_ms(100), DUET_OK);
    uint64_t until = duet_deadline_after_ms(3000);
    while (!e && duet_time_ns() < until)
        duet_ctl_puller_recv(q, duet_deadline_after_ms(100), &e, &err);
    assert_non_null(e);
    assert_int_equal(e->body_case, DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
    assert_int_equal(e->token_chunk->first_index, 7);
    duet_envelope_free(&e);
    duet_ctl_pusher_destroy(&p);
    duet_ctl_puller_destroy(&q);
}

/* A pusher that dials while the puller's listener is stopped, and while another pusher keeps
 * that listener busy: its connection is taken and never read, until the pusher closes it as
 * silent and its event goes again, through the link, to the new listener: delivered once, within
 * 5 s, while the busy pusher's events flow throughout. */
static void test_pusher_silent(void **state)
{
    (void)state;
    char url[128];
    url_for(url, sizeof url, "silent-events");
    duet_ctl_puller_t *q = new_puller(url);
    duet_ctl_pusher_t *busy = new_pusher(url, 0);
    duet_envelope_t *e = NULL;
    duet_err_t err = {0};
    push_chunk(busy, 0, duet_deadline_after_ms(1000), DUET_OK);
    uint64_t until = duet_deadline_after_ms(3000);
    while (!e && duet_time_ns() < until)
        duet_ctl_puller_recv(q, duet_deadline_after_ms(100), &e, &err);
    assert_non_null(e);
    duet_envelope_free(&e);

    connect_and_leave(url, 20);
    duet_ctl_pusher_t *late = new_pusher(url, 0);
    push_chunk(late, 1000, duet_deadline_after_ms(100), DUET_OK);
    int late_seen = 0, busy_seen = 0;
    until = duet_deadline_after_ms(5000);
    for (uint32_t i = 1; duet_time_ns() < until && !(late_seen && busy_seen > 5); i++) {
        push_chunk(busy, i, duet_deadline_after_ms(100), DUET_OK);
        uint64_t slice = duet_deadline_after_ms(50);
        while (duet_ctl_puller_recv(q, slice, &e, &err) == DUET_OK && e) {
            assert_int_equal(e->body_case, DUET__V1__ENVELOPE__BODY_TOKEN_CHUNK);
            if (e->token_chunk->first_index == 1000)
                late_seen++;
            else
                busy_seen++;
            duet_envelope_free(&e);
        }
    }
    assert_int_equal(late_seen, 1);
    assert_true(busy_seen > 5);
    duet_ctl_pusher_destroy(&late);
    duet_ctl_pusher_destroy(&busy);
    duet_ctl_puller_destroy(&q);
}

/* The watchdog behind NNG's timeouts: an operation NNG never ends is cancelled at its watch
 * deadline and reported as a timeout; concurrent ones each at their own. */
typedef struct {
    uint32_t ms;
    duet_status_t st;
    uint64_t took_ns;
} watch_case_t;

static void *watch_case_main(void *arg)
{
    watch_case_t *w = arg;
    w->st = duet_ctl_watchdog_selftest(w->ms, &w->took_ns);
    return NULL;
}

static void test_watchdog(void **state)
{
    (void)state;
    unsigned long before = duet_ctl_timeouts_rescued();
    watch_case_t w[3] = {{300, 0, 0}, {100, 0, 0}, {200, 0, 0}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, watch_case_main, &w[i]), 0);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].st, DUET_ERR_TIMEOUT);
        uint64_t took = w[i].took_ns / 1000000u;
        if (took + 5 < w[i].ms || took > w[i].ms + SLACK_MS)
            fail_msg("watch %u ms: ended after %llu ms", w[i].ms, (unsigned long long)took);
    }
    assert_int_equal(duet_ctl_timeouts_rescued() - before, 3);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--pull") == 0)
        return pull_until_killed(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "--serve") == 0) {
        g_slow = argc == 4 && strcmp(argv[3], "slow") == 0;
        return serve_forever(argv[2]);
    }

    /* read before any fork: under valgrind, exec of /proc/self/exe would name valgrind */
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (n <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    g_self[n] = '\0';
    snprintf(g_dir, sizeof g_dir, "/tmp/duet-test-ctl-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nng_table),       cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_live_every_kind), cmocka_unit_test(test_malformed_requests),
        cmocka_unit_test(test_poll_mode),       cmocka_unit_test(test_dead_server_timeout),
        cmocka_unit_test(test_killed_server),   cmocka_unit_test(test_killed_mid_call),
        cmocka_unit_test(test_push_pull),       cmocka_unit_test(test_push_busy),
        cmocka_unit_test(test_push_flush),      cmocka_unit_test(test_puller_garbage),
        cmocka_unit_test(test_puller_churn),    cmocka_unit_test(test_listener_deafened), cmocka_unit_test(test_listener_address),
        cmocka_unit_test(test_puller_deafened), cmocka_unit_test(test_pusher_silent),
        cmocka_unit_test(test_watchdog),        cmocka_unit_test(test_dialer_revived),
    };
    const char *only = getenv("DUET_TEST_FILTER"); /* one test by name (cmocka's pattern), to repeat it */
    if (only && *only)
        cmocka_set_test_filter(only);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    if (rc == 0) /* a failed test may leave sockets open (its asserts jump out), whose teardown
                    nng_fini would wait for: once it held a run 600 s */
        nng_fini();
    return rc;
}
