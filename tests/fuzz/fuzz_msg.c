/* Fuzz target: the input is one encoded duet.v1 Envelope, as it arrives on a
 * control socket or in a UCX active message.  The input is copied to an
 * exact-size heap buffer so sanitizers catch any read past `size`.
 *
 * Invariants checked (abort on violation):
 *   - decode either succeeds or fails with PARSE, VERSION, PROTOCOL or RANGE,
 *     with the status recorded in the error and a sentence;
 *   - an accepted envelope has a header of the current version and a body,
 *     passes the sender-side validation (encode succeeds), and its encoding
 *     decodes and re-encodes to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    duet_envelope_t *e = NULL, *again = NULL;
    duet_err_t err = {0};
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);

    duet_status_t st = duet_msg_decode(copy, size, NULL, &e, &err);
    free(copy);
    if (st != DUET_OK) {
        if (e || err.status != st || !err.msg[0])
            abort();
        if (st != DUET_ERR_PARSE && st != DUET_ERR_VERSION && st != DUET_ERR_PROTOCOL && st != DUET_ERR_RANGE)
            abort();
        return 0;
    }
    if (!e || !e->header || e->header->version != DUET_PROTOCOL_VERSION ||
        e->body_case == DUET__V1__ENVELOPE__BODY__NOT_SET)
        abort();

    uint8_t *enc = NULL, *enc2 = NULL;
    size_t len = 0, len2 = 0;
    if (duet_msg_encode(e, NULL, &enc, &len, &err) != DUET_OK)
        abort(); /* what we accept we would also send */
    if (duet_msg_decode(enc, len, NULL, &again, &err) != DUET_OK)
        abort();
    if (duet_msg_encode(again, NULL, &enc2, &len2, &err) != DUET_OK || len2 != len || memcmp(enc, enc2, len) != 0)
        abort();
    free(enc);
    free(enc2);
    duet_envelope_free(&again);
    duet_envelope_free(&e);
    return 0;
}
