/* Shared pieces of the data-plane tests (contract in xfer_harness.h). */
#include "xfer_harness.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "log.h"
#include "time_util.h"

int g_fail;

uint64_t xh_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

duet_kv_cache_t *xh_make_cache(duet_cache_dtype_t kv, duet_cache_dtype_t idx, uint64_t seed)
{
    duet_model_config_t cfg;
    tiny_config(&cfg);
    duet_cache_opts_t o = {.page_tokens = 256, .kv_dtype = kv, .index_k_dtype = idx};
    duet_kv_cache_t *c = NULL;
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_kv_cache_create(&cfg, &o, N_PAGES, N_SLOTS, &c, &err) == DUET_OK, "%s", err.msg);
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        uint8_t *b = duet_kv_cache_pool_base(c, (duet_pool_kind_t)k);
        size_t n = duet_kv_cache_pool_bytes(c, (duet_pool_kind_t)k);
        uint64_t s = seed * 1000003u + (uint64_t)k;
        for (size_t i = 0; i + 8 <= n; i += 8) {
            uint64_t v = xh_splitmix(&s);
            memcpy(b + i, &v, 8);
        }
    }
    return c;
}

uint64_t xh_verify_units(duet_kv_cache_t *mine, duet_kv_cache_t *orig, duet_kv_cache_t *theirs,
                         const uint32_t *their_pages, uint32_t their_slot, const uint32_t *my_pages, uint32_t my_slot,
                         uint32_t n_pages, int transferred, int verbose)
{
    uint64_t bad = 0;
    for (int k = 0; k < DUET_POOL_COUNT; k++) {
        const duet_cache_layout_t *l = duet_kv_cache_layout(mine, (duet_pool_kind_t)k);
        if (l->n_layers == 0)
            continue;
        uint32_t nu = l->paged ? N_PAGES : N_SLOTS;
        const uint8_t *m = duet_kv_cache_pool_base(mine, (duet_pool_kind_t)k);
        const uint8_t *o = duet_kv_cache_pool_base(orig, (duet_pool_kind_t)k);
        const uint8_t *t = duet_kv_cache_pool_base(theirs, (duet_pool_kind_t)k);
        for (uint32_t layer = 0; layer < l->n_layers; layer++)
            for (uint32_t u = 0; u < nu; u++) {
                /* which sender unit (if any) was written into my unit u? */
                int64_t src = -1;
                if (transferred) {
                    if (l->paged) {
                        for (uint32_t i = 0; i < n_pages; i++)
                            if (my_pages[i] == u)
                                src = their_pages[i];
                    } else if (u == my_slot) {
                        src = their_slot;
                    }
                }
                size_t off = ((size_t)layer * nu + u) * l->page_bytes;
                const uint8_t *want = src >= 0 ? t + ((size_t)layer * nu + (size_t)src) * l->page_bytes : o + off;
                if (memcmp(m + off, want, l->page_bytes) != 0) {
                    if (verbose && bad < 5)
                        fprintf(stderr, "  byte mismatch: pool %s layer %u unit %u (source %" PRId64 ")\n",
                                duet_pool_kind_name((duet_pool_kind_t)k), layer, u, src);
                    bad++;
                }
            }
    }
    return bad;
}

void xh_expect_and_send_desc(int fd, duet_xfer_t *x, const char *rid, uint64_t epoch, const uint32_t *pages,
                             uint32_t n_pages, uint32_t slot, uint32_t deadline_ms, uint64_t user)
{
    duet_xfer_desc_t d;
    duet_err_t err;
    duet_err_clear(&err);
    REQUIRE(duet_xfer_recv_expect(x, rid, epoch, pages, n_pages, slot, duet_deadline_after_ms(deadline_ms), user, &d,
                                  &err) == DUET_OK,
            "%s", err.msg);
    uint8_t *buf;
    size_t len;
    REQUIRE(duet_xfer_desc_pack(&d, &buf, &len) == DUET_OK, "pack");
    REQUIRE(xh_send(fd, buf, (uint32_t)len) == 0, "send desc");
    free(buf);
    duet_xfer_desc_fini(&d);
}

void xh_pick_pages(uint64_t seed, uint32_t *ids, uint32_t n)
{
    uint8_t used[N_PAGES] = {0};
    uint64_t s = seed;
    uint32_t i = 0;
    while (i < n) {
        uint32_t start = (uint32_t)(xh_splitmix(&s) % N_PAGES);
        uint32_t len = 1 + (uint32_t)(xh_splitmix(&s) % 6);
        for (uint32_t j = 0; j < len && i < n && start + j < N_PAGES && !used[start + j]; j++) {
            used[start + j] = 1;
            ids[i++] = start + j;
        }
    }
}

int xh_send(int fd, const void *buf, uint32_t len)
{
    if (send(fd, &len, 4, MSG_NOSIGNAL) != 4)
        return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, (const uint8_t *)buf + off, len - off, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    return 0;
}

static int read_full(int fd, void *buf, size_t len, uint64_t deadline)
{
    size_t off = 0;
    while (off < len) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)duet_deadline_left_ms(deadline);
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return -1;
        ssize_t r = read(fd, (uint8_t *)buf + off, len - off);
        if (r <= 0)
            return -1;
        off += (size_t)r;
    }
    return 0;
}

uint8_t *xh_recv(int fd, uint32_t *len, uint32_t timeout_ms)
{
    uint64_t dl = duet_deadline_after_ms(timeout_ms);
    uint32_t n;
    if (read_full(fd, &n, 4, dl) != 0 || n > (64u << 20))
        return NULL;
    uint8_t *b = malloc(n ? n : 1);
    if (!b || read_full(fd, b, n, dl) != 0) {
        free(b);
        return NULL;
    }
    *len = n;
    return b;
}

pid_t xh_spawn(int (*fn)(int fd, const void *arg), const void *arg, int *fd)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair: %s", strerror(errno));
    pid_t parent = getpid();
    pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        /* a peer dies with the case that spawned it, however that one ends (a receiver told to
         * hold would otherwise outlive a sender killed by an abort) */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(1);
        close(sv[0]);
        exit(fn(sv[1], arg));
    }
    close(sv[1]);
    *fd = sv[0];
    return pid;
}

int xh_reap(pid_t pid, uint32_t timeout_ms)
{
    uint64_t dl = duet_deadline_after_ms(timeout_ms);
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (duet_deadline_left_ms(dl) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(5000);
    }
}

int xh_wait_event(duet_xfer_t *x, duet_xfer_event_kind_t kind, duet_xfer_event_t *ev, uint32_t timeout_ms)
{
    uint64_t dl = duet_deadline_after_ms(timeout_ms);
    for (;;) {
        uint32_t left = (uint32_t)duet_deadline_left_ms(dl);
        if (left == 0)
            return -1;
        if (duet_xfer_wait(x, ev, left) != DUET_OK)
            return -1;
        if (ev->kind == kind)
            return 0;
    }
}

int xh_run(const xh_case_t *cases, size_t n, int argc, char **argv, const char *banner)
{
    signal(SIGPIPE, SIG_IGN);
    if (!getenv("UCX_TLS")) {
        setenv("UCX_TLS", "tcp", 1);
        setenv("UCX_NET_DEVICES", "lo", 1);
    }
    if (!getenv("DUET_LOG_LEVEL"))
        duet_log_set_level(DUET_LOG_ERROR);
    else
        duet_log_init_from_env();
    printf("UCX_TLS=%s UCX_NET_DEVICES=%s%s\n", getenv("UCX_TLS"),
           getenv("UCX_NET_DEVICES") ? getenv("UCX_NET_DEVICES") : "(all)", banner ? banner : "");
    fflush(stdout);
    int passed = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0)
            continue;
        double t0 = duet_time_s();
        pid_t pid = fork();
        if (pid == 0) {
            cases[i].fn();
            fflush(stdout);
            exit(g_fail ? 1 : 0); /* exit, not _exit: leak checkers run at exit */
        }
        int rc = xh_reap(pid, CASE_LIMIT_S * 1000);
        double dt = duet_time_s() - t0;
        if (rc == 0) {
            passed++;
            printf("ok   %s (%.2f s)\n", cases[i].name, dt);
        } else {
            failed++;
            printf("FAIL %s (%s, %.2f s)\n", cases[i].name, rc < 0 ? "timed out" : "failed", dt);
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
