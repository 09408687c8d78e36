/* A TCP socket write failing half way, staged in this process (test support; include it in
 * exactly one file of a program).
 *
 * send() and sendmsg() are interposed: libuct calls them through the dynamic linker, so the
 * program must export them (link with -Wl,--export-dynamic-symbol=send and =sendmsg; the
 * definitions below have default visibility for builds that hide symbols).  Unarmed they pass
 * through.  Armed (sock_fault_arm), the first write of more than 1 KiB to a TCP socket is cut
 * to 4 bytes and the next write on that socket fails with ECONNRESET: the peer's reset seen by
 * the send side first, with a message half written, the state in which UCX's tcp transport
 * completes a zero-copy send twice and a UCX with assertions aborts (docs/DATAPLANE.md).
 * Other sockets (the tests' own socketpairs) are never touched. */
#ifndef DUET_TESTS_SOCK_FAULT_H
#define DUET_TESTS_SOCK_FAULT_H

#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

enum { SOCK_FAULT_OFF, SOCK_FAULT_ARMED, SOCK_FAULT_CUT, SOCK_FAULT_RESET };

static atomic_int sock_fault_state_v; /* SOCK_FAULT_*; CUT and RESET refer to sock_fault_fd */
static atomic_int sock_fault_fd = -1;

static inline void sock_fault_arm(void) { atomic_store(&sock_fault_state_v, SOCK_FAULT_ARMED); }
static inline void sock_fault_disarm(void) { atomic_store(&sock_fault_state_v, SOCK_FAULT_OFF); }
static inline int sock_fault_state(void) { return atomic_load(&sock_fault_state_v); }

static int sock_fault_inet(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    return getsockname(fd, (struct sockaddr *)&ss, &len) == 0 &&
           (ss.ss_family == AF_INET || ss.ss_family == AF_INET6);
}

/* What to do with a write of n bytes to fd: 0 as asked, 1 cut it, 2 fail it. */
static int sock_fault_action(int fd, size_t n)
{
    int st = atomic_load(&sock_fault_state_v), want = SOCK_FAULT_ARMED;
    if (st == SOCK_FAULT_ARMED && n > 1024 && sock_fault_inet(fd) &&
        atomic_compare_exchange_strong(&sock_fault_state_v, &want, SOCK_FAULT_CUT)) {
        atomic_store(&sock_fault_fd, fd);
        return 1;
    }
    want = SOCK_FAULT_CUT;
    if (st == SOCK_FAULT_CUT && fd == atomic_load(&sock_fault_fd) &&
        atomic_compare_exchange_strong(&sock_fault_state_v, &want, SOCK_FAULT_RESET))
        return 2;
    return 0;
}

__attribute__((visibility("default"))) ssize_t send(int fd, const void *buf, size_t n, int flags)
{
    ssize_t (*real)(int, const void *, size_t, int) =
        (ssize_t(*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
    switch (sock_fault_action(fd, n)) {
    case 1: return real(fd, buf, 4, flags);
    case 2: errno = ECONNRESET; return -1;
    default: return real(fd, buf, n, flags);
    }
}

__attribute__((visibility("default"))) ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    ssize_t (*real)(int, const struct msghdr *, int) =
        (ssize_t(*)(int, const struct msghdr *, int))dlsym(RTLD_NEXT, "sendmsg");
    size_t n = 0;
    for (size_t i = 0; i < (size_t)msg->msg_iovlen; i++)
        n += msg->msg_iov[i].iov_len;
    switch (msg->msg_iovlen > 0 ? sock_fault_action(fd, n) : 0) {
    case 1: {
        struct msghdr m = *msg;
        struct iovec first = msg->msg_iov[0];
        if (first.iov_len > 4)
            first.iov_len = 4;
        m.msg_iov = &first;
        m.msg_iovlen = 1;
        return real(fd, &m, flags);
    }
    case 2: errno = ECONNRESET; return -1;
    default: return real(fd, msg, flags);
    }
}

#endif
