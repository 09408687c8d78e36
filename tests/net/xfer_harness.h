/* What the data-plane tests (test_xfer.c, test_xfer_device.c) share: the
 * check macros, a small model config with every pool, page picking, a
 * length-prefixed message channel to a forked peer, bounded waits for
 * processes and engine events, and the case runner (each case in a forked
 * child, killed and failed past CASE_LIMIT_S). */
#ifndef DUET_TESTS_XFER_HARNESS_H
#define DUET_TESTS_XFER_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include "kv_cache.h"
#include "model_config.h"
#include "xfer.h"
#include "../cache_fixture.h" /* tiny_config */

#define TIMEOUT_MS 2000          /* engine timeout_ms in these tests */
#define KEEPALIVE_MS 500
#define CASE_LIMIT_S 40          /* a case still running after this is killed and failed */
#define N_PAGES 96
#define N_SLOTS 4

extern int g_fail; /* CHECK failures in this process */

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, "\n");                                                        \
            g_fail++;                                                                     \
        }                                                                                 \
    } while (0)
#define REQUIRE(cond, ...)                                                                \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "  FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, "\n");                                                        \
            _exit(1);                                                                     \
        }                                                                                 \
    } while (0)

uint64_t xh_splitmix(uint64_t *s);
/* n distinct page ids of N_PAGES in short runs (so transfers coalesce some and not others). */
void xh_pick_pages(uint64_t seed, uint32_t *ids, uint32_t n);

/* A cache over tiny_config (N_PAGES pages, N_SLOTS slots, 256-token pages) whose pools hold
 * seeded bytes. */
duet_kv_cache_t *xh_make_cache(duet_cache_dtype_t kv, duet_cache_dtype_t idx, uint64_t seed);
/* Every byte of every pool of `mine` after a transfer: the units that received one (my_pages[i]
 * from their_pages[i], i < n_pages, and my_slot from their_slot, when `transferred`) equal
 * `theirs`, all others equal `orig` (mine as it was).  Returns the units that differ; prints
 * the first five when `verbose`. */
uint64_t xh_verify_units(duet_kv_cache_t *mine, duet_kv_cache_t *orig, duet_kv_cache_t *theirs,
                         const uint32_t *their_pages, uint32_t their_slot, const uint32_t *my_pages, uint32_t my_slot,
                         uint32_t n_pages, int transferred, int verbose);

/* Receiver: expect a transfer (duet_xfer_recv_expect with a deadline deadline_ms from now) and
 * send its packed descriptor to the sender over fd; fails the case otherwise. */
void xh_expect_and_send_desc(int fd, duet_xfer_t *x, const char *rid, uint64_t epoch, const uint32_t *pages,
                             uint32_t n_pages, uint32_t slot, uint32_t deadline_ms, uint64_t user);

/* Length-prefixed messages over a socket: 0 / -1. */
int xh_send(int fd, const void *buf, uint32_t len);
/* One message (malloc'd) within timeout_ms; NULL on timeout or EOF. */
uint8_t *xh_recv(int fd, uint32_t *len, uint32_t timeout_ms);
/* fork() a child running fn(its end of a socket pair, arg), exiting with its value; *fd: ours. */
pid_t xh_spawn(int (*fn)(int fd, const void *arg), const void *arg, int *fd);
/* The child's exit status (128 + signal when killed), or -1 after killing it at the deadline. */
int xh_reap(pid_t pid, uint32_t timeout_ms);
/* Wait for an event of `kind` (others are skipped) within timeout_ms: 0 / -1. */
int xh_wait_event(duet_xfer_t *x, duet_xfer_event_kind_t kind, duet_xfer_event_t *ev, uint32_t timeout_ms);

typedef struct {
    const char *name;
    void (*fn)(void);
} xh_case_t;

/* Run the cases (argv[1], if given, names the only one), each in a forked child; UCX_TLS
 * defaults to tcp on loopback, logging to errors only unless DUET_LOG_LEVEL is set.
 * `banner` is printed first.  Returns the exit status: 1 if any case failed. */
int xh_run(const xh_case_t *cases, size_t n, int argc, char **argv, const char *banner);

#endif
