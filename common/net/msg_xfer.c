/* Wire <-> data-plane transfer descriptors (msg_xfer.h). */
#include "msg_xfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"

_Static_assert(DUET_MSG_NO_SLOT == DUET_XFER_NO_SLOT, "no-slot markers differ");

duet_status_t duet_msg_descriptor_from_xfer(const duet_xfer_desc_t *x, const char *decode_worker_id,
                                            Duet__V1__TransferDescriptor **out)
{
    duet_status_t st = DUET_ERR_NOMEM;
    Duet__V1__TransferDescriptor *d = duet_msg_alloc(&duet__v1__transfer_descriptor__descriptor);
    if (!d)
        return DUET_ERR_NOMEM;
    d->engine_id = x->worker_id;
    d->epoch = x->epoch;
    d->page_tokens = x->page_tokens;
    d->slot = x->slot;
    if (duet_msg_set_str(&d->decode_worker_id, decode_worker_id) ||
        duet_msg_set_bytes(&d->ucx_address, x->address, x->address_len) ||
        duet_msg_set_u32s(&d->page_ids, &d->n_page_ids, x->page_ids, x->n_pages))
        goto err_free;
    if (x->n_pools > DUET_POOL_COUNT) {
        st = DUET_ERR_INVALID;
        goto err_free;
    }
    if (x->n_pools && !(d->pools = duet_calloc(x->n_pools, sizeof *d->pools)))
        goto err_free;
    for (uint32_t i = 0; i < x->n_pools; i++) {
        const duet_xfer_pool_desc_t *xp = &x->pools[i];
        Duet__V1__PoolDescriptor *p = duet_msg_alloc(&duet__v1__pool_descriptor__descriptor);
        if (!p)
            goto err_free;
        d->pools[d->n_pools++] = p;
        p->kind = duet_msg_pool_to_wire(xp->kind);
        p->fingerprint = xp->fingerprint;
        p->remote_base = xp->remote_base;
        p->page_bytes = xp->page_bytes;
        p->n_units = xp->n_units;
        p->n_layers = xp->n_layers;
        p->device_memory = (xp->flags & DUET_XFER_POOL_DEVICE) != 0;
        if (duet_msg_set_bytes(&p->rkey, xp->rkey, xp->rkey_len))
            goto err_free;
    }
    *out = d;
    return DUET_OK;
err_free:
    duet_msg_free(&d->base);
    return st;
}

static void *copy_bytes(const void *src, size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p && n)
        memcpy(p, src, n);
    return p;
}

duet_status_t duet_msg_descriptor_to_xfer(const Duet__V1__TransferDescriptor *d, const char *rid,
                                          duet_xfer_desc_t *out, duet_err_t *err)
{
    duet_xfer_desc_t x;
    memset(&x, 0, sizeof x);
    memset(out, 0, sizeof *out);

    size_t rid_len = rid ? strlen(rid) : 0;
    if (rid_len == 0 || rid_len >= sizeof x.rid)
        return duet_err_set(err, DUET_ERR_RANGE, "descriptor: rid of %zu characters does not fit the data plane's %zu",
                            rid_len, sizeof x.rid - 1);
    if (d->n_pools > DUET_POOL_COUNT || d->n_page_ids > DUET_XFER_MAX_PAGES || d->ucx_address.len > UINT32_MAX)
        return duet_err_set(err, DUET_ERR_RANGE, "descriptor: %zu pools, %zu pages, %zu address bytes", d->n_pools,
                            d->n_page_ids, d->ucx_address.len);
    memcpy(x.rid, rid, rid_len + 1);
    x.worker_id = d->engine_id;
    x.epoch = d->epoch;
    x.page_tokens = d->page_tokens;
    x.slot = d->slot;
    x.address_len = (uint32_t)d->ucx_address.len;
    x.n_pages = (uint32_t)d->n_page_ids;
    if (!(x.address = copy_bytes(d->ucx_address.data, d->ucx_address.len)) ||
        !(x.page_ids = copy_bytes(d->page_ids, d->n_page_ids * sizeof *d->page_ids)))
        goto err_nomem;
    for (size_t i = 0; i < d->n_pools; i++) {
        const Duet__V1__PoolDescriptor *p = d->pools[i];
        duet_xfer_pool_desc_t *xp = &x.pools[i];
        if (duet_msg_pool_from_wire(p->kind, &xp->kind) != DUET_OK) {
            duet_xfer_desc_fini(&x);
            return duet_err_set(err, DUET_ERR_PROTOCOL, "descriptor.pools[%zu].kind: %d is not a pool", i, (int)p->kind);
        }
        if (p->rkey.len > UINT32_MAX) {
            duet_xfer_desc_fini(&x);
            return duet_err_set(err, DUET_ERR_RANGE, "descriptor.pools[%zu].rkey: %zu bytes", i, p->rkey.len);
        }
        xp->fingerprint = p->fingerprint;
        xp->remote_base = p->remote_base;
        xp->page_bytes = p->page_bytes;
        xp->n_units = p->n_units;
        xp->n_layers = p->n_layers;
        xp->flags = p->device_memory ? DUET_XFER_POOL_DEVICE : 0;
        xp->rkey_len = (uint32_t)p->rkey.len;
        if (!(xp->rkey = copy_bytes(p->rkey.data, p->rkey.len)))
            goto err_nomem;
        x.n_pools++;
    }
    *out = x;
    return DUET_OK;
err_nomem:
    duet_xfer_desc_fini(&x);
    return duet_err_set(err, DUET_ERR_NOMEM, "descriptor: out of memory");
}
