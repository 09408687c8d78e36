/* Logging that costs nothing when a level is off: the level is checked before
 * any argument is evaluated.  Every line carries level, file:line and, where
 * known, the request id.  Tests install a handler to capture lines. */
#ifndef DUET_LOG_H
#define DUET_LOG_H

#include <stdarg.h>

typedef enum {
    DUET_LOG_ERROR = 0,
    DUET_LOG_WARN  = 1,
    DUET_LOG_INFO  = 2,
    DUET_LOG_DEBUG = 3,
    DUET_LOG_TRACE = 4,
} duet_log_level_t;

extern duet_log_level_t duet_log_level_current;

typedef void (*duet_log_handler_fn)(duet_log_level_t level, const char *file, int line,
                                    const char *rid, const char *msg, void *arg);

/* Set the level (default INFO, or DUET_LOG_LEVEL=error|warn|info|debug|trace). */
void duet_log_set_level(duet_log_level_t level);
/* Parse a level name; returns -1 when unknown. */
int duet_log_level_parse(const char *name);
/* Read DUET_LOG_LEVEL from the environment. */
void duet_log_init_from_env(void);
/* Replace the output handler (NULL restores stderr). */
void duet_log_set_handler(duet_log_handler_fn fn, void *arg);
/* Name of the process in each line ("duet-prefill"). */
void duet_log_set_ident(const char *ident);

void duet_log_emit(duet_log_level_t level, const char *file, int line, const char *rid,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define DUET_LOG_ENABLED(lvl) ((lvl) <= duet_log_level_current)

#define duet_log_rid(lvl, rid, ...)                                                  \
    do {                                                                             \
        if (DUET_LOG_ENABLED(lvl))                                                   \
            duet_log_emit((lvl), __FILE__, __LINE__, (rid), __VA_ARGS__);            \
    } while (0)

#define duet_error(...) duet_log_rid(DUET_LOG_ERROR, NULL, __VA_ARGS__)
#define duet_warn(...)  duet_log_rid(DUET_LOG_WARN, NULL, __VA_ARGS__)
#define duet_info(...)  duet_log_rid(DUET_LOG_INFO, NULL, __VA_ARGS__)
#define duet_debug(...) duet_log_rid(DUET_LOG_DEBUG, NULL, __VA_ARGS__)
#define duet_trace(...) duet_log_rid(DUET_LOG_TRACE, NULL, __VA_ARGS__)

#endif
