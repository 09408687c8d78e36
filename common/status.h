/* duet status codes: 0 is OK, negative values are errors.
 *
 * Every error that crosses a module boundary is one of these codes; the code
 * is what tests and peers match on, duet_status_str() gives a sentence for
 * people.  Codes from UCX, NNG, hiredis, CUDA and libmicrohttpd are
 * translated where they enter duet. */
#ifndef DUET_STATUS_H
#define DUET_STATUS_H

#define DUET_STATUS_LIST(X)                                                    \
    X(DUET_OK,                    0, "OK", "success")                          \
    X(DUET_ERR_NOMEM,            -1, "NOMEM", "out of memory")                 \
    X(DUET_ERR_INVALID,          -2, "INVALID", "invalid argument")            \
    X(DUET_ERR_IO,               -3, "IO", "input/output error")               \
    X(DUET_ERR_NOT_FOUND,        -4, "NOT_FOUND", "not found")                 \
    X(DUET_ERR_PARSE,            -5, "PARSE", "malformed input")               \
    X(DUET_ERR_TRUNCATED,        -6, "TRUNCATED", "input is truncated")        \
    X(DUET_ERR_UNSUPPORTED,      -7, "UNSUPPORTED", "unsupported feature or dtype") \
    X(DUET_ERR_SHAPE,            -8, "SHAPE", "tensor has the wrong shape")    \
    X(DUET_ERR_DTYPE,            -9, "DTYPE", "tensor has the wrong dtype")    \
    X(DUET_ERR_CONFIG,          -10, "CONFIG", "invalid model configuration")  \
    X(DUET_ERR_RANGE,           -11, "RANGE", "value out of range")            \
    X(DUET_ERR_NO_SPACE,        -12, "NO_SPACE", "no free capacity")           \
    X(DUET_ERR_LAYOUT_MISMATCH, -13, "LAYOUT_MISMATCH", "cache layout fingerprints differ") \
    X(DUET_ERR_TIMEOUT,         -14, "TIMEOUT", "deadline exceeded")           \
    X(DUET_ERR_ABORTED,         -15, "ABORTED", "request aborted")             \
    X(DUET_ERR_STATE,           -16, "STATE", "operation not valid in this state") \
    X(DUET_ERR_PEER,            -17, "PEER", "peer failed or unreachable")     \
    X(DUET_ERR_PROTOCOL,        -18, "PROTOCOL", "protocol violation")         \
    X(DUET_ERR_VERSION,         -19, "VERSION", "unsupported protocol version") \
    X(DUET_ERR_CHECKSUM,        -20, "CHECKSUM", "checksum mismatch")          \
    X(DUET_ERR_BUSY,            -21, "BUSY", "resource busy")                  \
    X(DUET_ERR_CUDA,            -22, "CUDA", "CUDA error")                     \
    X(DUET_ERR_INTERNAL,        -23, "INTERNAL", "internal error")

typedef enum {
#define DUET_STATUS_ENUM(name, value, code, msg) name = value,
    DUET_STATUS_LIST(DUET_STATUS_ENUM)
#undef DUET_STATUS_ENUM
    DUET_STATUS_MIN = -23,
} duet_status_t;

/* Fixed uppercase code ("LAYOUT_MISMATCH"); "UNKNOWN" for values outside the table. */
const char *duet_status_code(duet_status_t st);
/* Sentence for people ("cache layout fingerprints differ"). */
const char *duet_status_str(duet_status_t st);

#endif
