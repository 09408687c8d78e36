/* The transfer descriptor on the wire (duet.v1.TransferDescriptor) and in
 * the data plane (duet_xfer_desc_t, xfer.h): conversions both ways.
 *
 * Decode builds the wire form from the descriptor its engine returns for a
 * reservation (in Reserved); the router copies it into Prefill unchanged;
 * prefill converts it back before duet_xfer_send_begin().  The wire form is
 * validated by duet_msg_decode (msg.h); the struct by duet_xfer_desc_validate. */
#ifndef DUET_NET_MSG_XFER_H
#define DUET_NET_MSG_XFER_H

#include "msg.h"
#include "xfer.h"

/* New wire descriptor from `x` (copied), naming the decode worker.  Free
 * with duet_msg_free(&(*out)->base), or hand it to an envelope (e.g. as
 * env->reserved->descriptor after freeing the builder's empty one). */
duet_status_t duet_msg_descriptor_from_xfer(const duet_xfer_desc_t *x, const char *decode_worker_id,
                                            Duet__V1__TransferDescriptor **out);

/* Fill `out` (overwritten; duet_xfer_desc_fini() it) from a validated wire
 * descriptor and the request id of the envelope that carried it.
 * DUET_ERR_RANGE when the rid does not fit DUET_XFER_RID_MAX or a count does
 * not fit the struct, DUET_ERR_PROTOCOL for a pool kind outside the table,
 * DUET_ERR_NOMEM.  `out` is left zeroed on error. */
duet_status_t duet_msg_descriptor_to_xfer(const Duet__V1__TransferDescriptor *d, const char *rid,
                                          duet_xfer_desc_t *out, duet_err_t *err);

#endif
