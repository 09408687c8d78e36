/* The data plane: a UCX (ucp) engine that pushes cache pages from a prefill
 * process into a decode process's pools (DESIGN §3, §5; docs/DATAPLANE.md).
 *
 * One engine per process: one ucp context, one worker, and one progress
 * thread that owns the worker.  Every UCX call after creation happens on that
 * thread.  Callers talk to it through a command queue (a mutex held for a
 * list append, then an eventfd write) and read results from an event queue
 * (duet_xfer_poll never blocks; an eventfd makes it pollable).  So neither
 * the decode loop nor the prefill loop ever waits on UCX.
 *
 * Sender (prefill) side of one request:
 *   duet_xfer_send_begin(desc, local pages, local slot)  checks layouts, returns a tid
 *   duet_xfer_send_put(tid, pool, layer) ...            as each layer is computed
 *   duet_xfer_send_finish(tid, first_token, cached)     puts, flush, then TransferDone
 *   -> one DUET_XFER_EV_SEND event with the outcome
 * Receiver (decode) side:
 *   duet_xfer_recv_expect(rid, epoch, pages, slot, deadline) -> descriptor to hand to P
 *   -> DUET_XFER_EV_RECV_BEGUN when P starts, then one DUET_XFER_EV_RECV event:
 *      OK (checksums verified when enabled), CHECKSUM, ABORTED (P's AbortAck),
 *      PEER (P died), TIMEOUT (deadline).
 *
 * Bounds: every outstanding UCX operation has a deadline (opts.timeout_ms
 * without progress on its endpoint); an endpoint that misses it is closed
 * and fails with DUET_ERR_TIMEOUT.  Endpoint errors (peer killed, connection
 * reset, keepalive miss) fail every transfer on that endpoint with
 * DUET_ERR_PEER; other peers are not affected.  A receiver probes the
 * senders it waits on (every keepalive_ms without traffic; no answer within
 * timeout_ms: TIMEOUT), so peer death is reported within
 * keepalive_ms + timeout_ms on any transport. */
#ifndef DUET_NET_XFER_H
#define DUET_NET_XFER_H

#include <stddef.h>
#include <stdint.h>

#include "cache_layout.h"
#include "err.h"
#include "kv_cache.h"

typedef struct duet_xfer duet_xfer_t;

#define DUET_XFER_RID_MAX     65           /* request id bytes with the NUL: the control plane allows 64 */
#define DUET_XFER_NO_SLOT     UINT32_MAX   /* descriptor without slot pools' unit */
#define DUET_XFER_ALL_LAYERS  UINT32_MAX   /* duet_xfer_send_put: every layer of the pool */
#define DUET_XFER_ALL_POOLS   (-1)         /* duet_xfer_send_put: every pool */
#define DUET_XFER_MAX_PAGES   (1u << 20)   /* pages in one descriptor */

/* A pool lives in device memory.  Registered directly with UCX (memory type
 * CUDA) when UCX reports CUDA memory support (duet_xfer_cuda_capable); page
 * writes on the RMA path then go device to device (cuda_ipc over NVLink) and
 * the engine never reads the pool.  Where the engine itself would touch pool
 * bytes from the host -- the sender's TransferDone checksums, the receiver's
 * verification, the AM write path on either side -- it goes through the
 * caller's staging ops (opts.staging) and their pinned bounce buffer.
 * Without staging ops a device pool is accepted only when none of those can
 * happen (skip_checksums, no verify_checksums, data_path RMA); otherwise, and
 * without CUDA support in UCX, registration answers UNSUPPORTED.
 *
 * Test only: DUET_XFER_FAKE_DEVICE=1 in the environment at duet_xfer_create
 * makes the engine accept DEVICE pools without CUDA support in UCX.  Their
 * memory is then host memory and is registered as host memory, but the
 * engine treats it as device memory everywhere else (every host access goes
 * through the staging ops), so the staging logic runs on CPUs with memcpy
 * staging ops (tests/net/test_xfer_device.c).  Never set it in a service. */
#define DUET_XFER_POOL_DEVICE 0x1u

/* One entry of a batched device<->host copy list. */
typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} duet_xfer_copy_t;

/* Staging ops for device pools.  Both ops are called on the engine's progress
 * thread only (never two at once), with entries that never overlap; each
 * copies every entry as one batch (one kernel for the list: duet_cuda_copy_list
 * in CUDA builds) and returns when the copies are complete.  A non-OK status
 * fails the transfer concerned with that status (SEND or RECV event).  The
 * ops' context must not be used by another thread at the same time (CUDA: a
 * duet_cuda_t of its own). */
typedef struct {
    void *ctx;
    /* device -> pinned host (dst in `host`) */
    duet_status_t (*d2h)(void *ctx, const duet_xfer_copy_t *copies, uint32_t n);
    /* pinned host (src in `host`) -> device */
    duet_status_t (*h2d)(void *ctx, const duet_xfer_copy_t *copies, uint32_t n);
    /* The bounce buffer: staging_bytes of pinned host memory the caller allocated
     * (cudaHostAlloc, mapped, so that a copy kernel reaches it) and keeps until the
     * engine is destroyed.  Half of it batches checksum reads and AM page data
     * received; the other half is cut into am_chunk_bytes slots for AM page data
     * in flight.  It must hold two am_chunk_bytes slots and twice the largest
     * page of any device pool; 32 MiB is plenty. */
    void *host;
    size_t staging_bytes;
} duet_xfer_staging_t;

/* How a sender writes pages into a receiver.
 *   RMA: ucp_put_nbx into the registered pools (one-sided; the design's path on
 *        transports with a hardware RMA lane: InfiniBand/RoCE, cuda_ipc).
 *   AM:  AM_DATA messages that the receiver's progress thread checks against the
 *        expected request and copies into place.  Used where UCX has no RMA lane
 *        under peer error handling (tcp, shared memory), because UCX 1.13's
 *        software put emulation aborts the target process when the origin dies.
 *   AUTO: per endpoint, RMA when UCX selected an RMA lane for it, else AM. */
enum { DUET_XFER_PATH_AUTO = 0, DUET_XFER_PATH_RMA = 1, DUET_XFER_PATH_AM = 2 };

typedef struct {
    uint64_t id;              /* engine id carried in messages; 0: random */
    const char *name;         /* for log lines ("prefill-0") */
    uint32_t max_inflight;    /* puts in flight per endpoint; 0: 32 */
    uint64_t max_put_bytes;   /* a coalesced run is split above this; 0: 8 MiB */
    uint32_t timeout_ms;      /* an endpoint whose operations make no progress for this
                                 long is closed with TIMEOUT; 0: 5000 */
    uint32_t keepalive_ms;    /* UCX keepalive interval unless UCX_KEEPALIVE_INTERVAL is
                                 set; 0: 1000 */
    int verify_checksums;     /* receiver verifies TransferDone checksums */
    int skip_checksums;       /* sender sends TransferDone without checksums (benchmarks);
                                 a verifying receiver answers CHECKSUM */
    int data_path;            /* DUET_XFER_PATH_*; AUTO also reads DUET_XFER_PATH=rma|am */
    uint32_t am_chunk_bytes;  /* AM write path: page bytes per message; 0: 64 KiB */
    const duet_xfer_staging_t *staging; /* device pools: host accesses go through these (copied) */
    /* Called first on the progress thread, before it makes any UCX call.  UCX's
     * CUDA transports need the device's context current on the thread that
     * drives them: a CUDA caller makes it current here (duet_cuda_bind).
     * A failure is logged and every later registration answers its status. */
    duet_status_t (*thread_init)(void *arg);
    void *thread_init_arg;
} duet_xfer_opts_t;

/* A pool to register: `layout` and `n_units` describe memory at `base` of
 * layout.n_layers * n_units * layout.page_bytes bytes (unit u of layer l at
 * base + (l * n_units + u) * page_bytes). */
typedef struct {
    duet_cache_layout_t layout;
    uint32_t page_tokens;
    void *base;
    uint32_t n_units;         /* pages (paged pools) or slots */
    uint32_t flags;           /* DUET_XFER_POOL_* */
} duet_xfer_pool_t;

/* Descriptor of one receiving request (DESIGN §2 step 3): what a sender needs
 * to write into the receiver's pages.  Arrays are owned by the descriptor and
 * freed by duet_xfer_desc_fini().  The control plane converts it to and from
 * the proto TransferDescriptor. */
typedef struct {
    duet_pool_kind_t kind;
    uint64_t fingerprint;     /* the receiver's duet_cache_layout_t.fingerprint */
    uint64_t remote_base;     /* address of the pool's memory in the receiver */
    uint64_t page_bytes;
    uint32_t n_units;
    uint32_t n_layers;
    uint32_t rkey_len;
    uint8_t *rkey;            /* packed ucp rkey */
    uint32_t flags;           /* DUET_XFER_POOL_DEVICE: the receiver's pool is device memory */
} duet_xfer_pool_desc_t;

typedef struct {
    uint64_t worker_id;       /* the receiving engine's id */
    char rid[DUET_XFER_RID_MAX];
    uint64_t epoch;
    uint32_t page_tokens;
    uint32_t address_len;
    uint8_t *address;         /* the receiver's ucp worker address */
    uint32_t n_pools;
    duet_xfer_pool_desc_t pools[DUET_POOL_COUNT];
    uint32_t n_pages;
    uint32_t *page_ids;       /* the receiver's page ids, in token order */
    uint32_t slot;            /* the receiver's slot, or DUET_XFER_NO_SLOT */
} duet_xfer_desc_t;

typedef enum {
    DUET_XFER_EV_SEND = 1,       /* a send reached its end (status says how) */
    DUET_XFER_EV_RECV = 2,       /* an expected receive reached its end */
    DUET_XFER_EV_RECV_BEGUN = 3, /* a sender announced the transfer (not an end) */
} duet_xfer_event_kind_t;

typedef struct {
    duet_xfer_event_kind_t kind;
    duet_status_t status;     /* OK, ABORTED, PEER, TIMEOUT, CHECKSUM, LAYOUT_MISMATCH, ... */
    uint64_t tid;             /* send: the transfer id */
    uint64_t user;            /* the caller's value from begin/expect */
    char rid[DUET_XFER_RID_MAX];
    uint64_t epoch;
    int32_t first_token;      /* RECV OK: from TransferDone */
    uint32_t cached_tokens;   /* RECV OK: prompt tokens the sender served from its prefix cache (TransferDone) */
    uint32_t cancelled;       /* RECV: duet_xfer_recv_cancel() was called */
    uint64_t peer_id;         /* the other engine's id (0 when unknown) */
    uint64_t bytes;           /* SEND: bytes put */
    char msg[160];            /* detail for people */
} duet_xfer_event_t;

typedef struct {
    uint64_t puts, put_bytes;
    uint64_t sends_ok, sends_failed, sends_aborted;
    uint64_t recvs_ok, recvs_failed;
    uint64_t checksum_failures, stale_messages, bad_messages;
    uint64_t peers_failed, peers_timed_out;
    uint64_t ops_inflight;     /* UCX requests outstanding now */
    uint64_t sends_active, recvs_pending;
} duet_xfer_stats_t;

/* Create the engine: ucp context (RMA + AM + WAKEUP), worker, progress thread.
 * UCX_* variables in the environment are honoured; defaults set here
 * (KEEPALIVE_INTERVAL) apply only when the variable is unset.  Must be called
 * after any fork().  Out pointer written only on success. */
duet_status_t duet_xfer_create(const duet_xfer_opts_t *opts, duet_xfer_t **out, duet_err_t *err);
/* Stop the thread, fail what is still pending (ABORTED, not reported),
 * close endpoints (bounded by timeout_ms), unmap memory.  NULL-safe; sets *x to NULL. */
void duet_xfer_destroy(duet_xfer_t **x);

uint64_t duet_xfer_id(const duet_xfer_t *x);
/* The worker address (valid for the engine's life). */
const uint8_t *duet_xfer_address(const duet_xfer_t *x, size_t *len);
/* 1 when UCX can register CUDA memory directly (never with Debian's UCX).
 * DUET_XFER_FAKE_DEVICE does not change the answer. */
int duet_xfer_cuda_capable(const duet_xfer_t *x);

/* Register a pool (once per kind, before any transfer; memory stays the
 * caller's and must outlive the engine).  Blocks until the progress thread
 * has mapped it.  INVALID for a bad spec, a kind registered twice or a
 * staging buffer too small for the pool's pages; UNSUPPORTED for device
 * memory without CUDA support in UCX, or without staging ops where the
 * engine may have to read or write it from the host (DUET_XFER_POOL_DEVICE). */
duet_status_t duet_xfer_register_pool(duet_xfer_t *x, const duet_xfer_pool_t *pool, duet_err_t *err);
/* Register every non-empty pool of a cache (host memory). */
duet_status_t duet_xfer_register_cache(duet_xfer_t *x, const duet_kv_cache_t *cache, duet_err_t *err);

/* ---- receiver ---- */

/* Expect a transfer into `pages` (n_pages, token order) and `slot` for
 * (rid, epoch) until `deadline_ns` (monotonic), and fill `desc` (fini it).
 * The record is visible to arriving messages before this returns.  The
 * pages must stay the caller's until the RECV event.  INVALID for ids out of
 * range; an (rid, epoch) already expected ends the new record at once with a
 * RECV event of status BUSY. */
duet_status_t duet_xfer_recv_expect(duet_xfer_t *x, const char *rid, uint64_t epoch,
                                    const uint32_t *pages, uint32_t n_pages, uint32_t slot,
                                    uint64_t deadline_ns, uint64_t user, duet_xfer_desc_t *desc,
                                    duet_err_t *err);
/* The receiver gave up on (rid, epoch): the record stays until the sender's
 * AbortAck or TransferDone, the sender's death or the deadline, and that
 * RECV event has `cancelled` set (DESIGN §3: quarantine until then). */
duet_status_t duet_xfer_recv_cancel(duet_xfer_t *x, const char *rid, uint64_t epoch);

/* ---- sender ---- */

/* Start pushing into a receiver: check that every pool of `desc` has the
 * sender's own layout (same kinds, fingerprints, page bytes, layer counts and
 * page_tokens; DUET_ERR_LAYOUT_MISMATCH otherwise, before anything is sent),
 * that page ids are in range on both sides and that n_pages matches
 * (DUET_ERR_RANGE / INVALID).  The descriptor is copied.  On OK writes the
 * transfer id; the transfer ends with exactly one DUET_XFER_EV_SEND. */
duet_status_t duet_xfer_send_begin(duet_xfer_t *x, const duet_xfer_desc_t *desc,
                                   const uint32_t *local_pages, uint32_t n_pages,
                                   uint32_t local_slot, uint64_t user, uint64_t *tid,
                                   duet_err_t *err);
/* Queue puts of one layer (or DUET_XFER_ALL_LAYERS) of one pool (or
 * DUET_XFER_ALL_POOLS): contiguous runs (local and remote ids both
 * consecutive) become one put each.  INVALID for a pool or layer the engine
 * does not have. */
duet_status_t duet_xfer_send_put(duet_xfer_t *x, uint64_t tid, int pool, uint32_t layer);
/* After every queued put completes: flush the endpoint, then send
 * TransferDone{rid, epoch, first_token, cached_tokens, checksums}.  SEND event OK when it
 * has been handed to UCX.  cached_tokens (the prompt tokens served from the sender's prefix
 * cache) reaches the receiver's RECV event, so what it reports after the transfer carries it. */
duet_status_t duet_xfer_send_finish(duet_xfer_t *x, uint64_t tid, int32_t first_token, uint32_t cached_tokens);
/* Stop issuing puts, wait for those in flight, flush, then send AbortAck.
 * SEND event with status ABORTED. */
duet_status_t duet_xfer_send_abort(duet_xfer_t *x, uint64_t tid);

/* ---- events ---- */

/* Take up to `max` events; never blocks.  Returns the number taken. */
uint32_t duet_xfer_poll(duet_xfer_t *x, duet_xfer_event_t *ev, uint32_t max);
/* Wait up to timeout_ms for one event (tools and tests); DUET_ERR_TIMEOUT when none. */
duet_status_t duet_xfer_wait(duet_xfer_t *x, duet_xfer_event_t *ev, uint32_t timeout_ms);
/* Readable while events are queued (an eventfd; poll it, then duet_xfer_poll). */
int duet_xfer_event_fd(const duet_xfer_t *x);

void duet_xfer_stats(const duet_xfer_t *x, duet_xfer_stats_t *out);

/* ---- descriptors ---- */

/* Free the descriptor's arrays; safe on a zeroed descriptor. */
void duet_xfer_desc_fini(duet_xfer_desc_t *d);
/* Deep copy (dst is overwritten, fini it). */
duet_status_t duet_xfer_desc_copy(const duet_xfer_desc_t *src, duet_xfer_desc_t *dst);
/* Structure checks only (sizes, counts, ids against n_units, overflow). */
duet_status_t duet_xfer_desc_validate(const duet_xfer_desc_t *d, duet_err_t *err);
/* A flat little-endian form for processes of the same build (tests, the
 * bench); services use the proto TransferDescriptor.  pack: *buf malloc'd.
 * unpack validates; on failure `d` is left empty (nothing to fini). */
duet_status_t duet_xfer_desc_pack(const duet_xfer_desc_t *d, uint8_t **buf, size_t *len);
duet_status_t duet_xfer_desc_unpack(const uint8_t *buf, size_t len, duet_xfer_desc_t *d, duet_err_t *err);

/* Checksum of one unit of one pool over all its layers (what TransferDone
 * carries): h = seed; for l in layers: h = xxh3(unit bytes of layer l, h).
 * Reads pool_base directly: host memory only (device pools are checksummed
 * by the engine through its staging ops). */
uint64_t duet_xfer_unit_checksum(const uint8_t *pool_base, const duet_cache_layout_t *layout,
                                 uint32_t n_units, uint32_t unit);

#endif
