#include "err.h"

#include <stdarg.h>
#include <stdio.h>

duet_status_t duet_err_set(duet_err_t *e, duet_status_t st, const char *fmt, ...)
{
    if (!e)
        return st;
    e->status = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return st;
}

void duet_err_clear(duet_err_t *e)
{
    if (e) {
        e->status = DUET_OK;
        e->msg[0] = '\0';
    }
}

const char *duet_err_text(const duet_err_t *e)
{
    static __thread char buf[600];
    snprintf(buf, sizeof buf, "%s: %s", duet_status_code(e->status), e->msg[0] ? e->msg : duet_status_str(e->status));
    return buf;
}
