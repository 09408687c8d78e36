/* Error detail: a status code plus a sentence naming what failed (file,
 * tensor, field).  Functions that can fail for outside reasons take a
 * `duet_err_t *` (may be NULL) and return the status they stored in it. */
#ifndef DUET_ERR_H
#define DUET_ERR_H

#include "status.h"

typedef struct {
    duet_status_t status;
    char msg[512];
} duet_err_t;

/* Record `st` and a formatted message in `e` (if non-NULL); returns st. */
duet_status_t duet_err_set(duet_err_t *e, duet_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Clear to OK. */
void duet_err_clear(duet_err_t *e);
/* "CODE: message" for printing; valid until `e` changes. */
const char *duet_err_text(const duet_err_t *e);

/* Return early on a non-OK status. */
#define DUET_TRY(expr)                                                                                             \
    do {                                                                                                           \
        duet_status_t st_ = (expr);                                                                                \
        if (st_ != DUET_OK)                                                                                        \
            return st_;                                                                                            \
    } while (0)

#endif
