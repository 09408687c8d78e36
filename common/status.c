#include "status.h"

const char *duet_status_code(duet_status_t st)
{
    switch (st) {
#define DUET_STATUS_CODE(name, value, code, msg) case name: return code;
    DUET_STATUS_LIST(DUET_STATUS_CODE)
#undef DUET_STATUS_CODE
    default: return "UNKNOWN";
    }
}

const char *duet_status_str(duet_status_t st)
{
    switch (st) {
#define DUET_STATUS_MSG(name, value, code, msg) case name: return msg;
    DUET_STATUS_LIST(DUET_STATUS_MSG)
#undef DUET_STATUS_MSG
    default: return "unknown status";
    }
}
