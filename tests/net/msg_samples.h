/* One valid, fully populated envelope of every body kind, shared by the
 * message tests, the control-plane tests and the fuzz corpus generator. */
#ifndef DUET_TEST_MSG_SAMPLES_H
#define DUET_TEST_MSG_SAMPLES_H

#include "msg.h"

#define SAMPLE_RID "0f8fad5b-d9cb-469f-a165-70867728950e"
#define SAMPLE_EPOCH 7u
#define SAMPLE_EVENT_URL "ipc:///run/duet/router-0-events.sock" /* Reserve/Prefill.event_url */
#define SAMPLE_SENDER "decode-0"

/* Every body kind, in field order. */
extern const duet_msg_kind_t sample_kinds[];
extern const int n_sample_kinds;

/* A new valid envelope of `kind` (NULL for kinds outside sample_kinds). */
duet_envelope_t *sample_msg(duet_msg_kind_t kind);

/* Encode without validation (for tests that corrupt fields); malloc'd. */
uint8_t *sample_pack_raw(const duet_envelope_t *e, size_t *len);

#endif
