#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

duet_log_level_t duet_log_level_current = DUET_LOG_INFO;

static duet_log_handler_fn log_handler;
static void *log_handler_arg;
static const char *log_ident = "duet";
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

void duet_log_set_level(duet_log_level_t level) { duet_log_level_current = level; }

int duet_log_level_parse(const char *name)
{
    for (int i = 0; i < 5; i++)
        if (strcasecmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

void duet_log_init_from_env(void)
{
    const char *env = getenv("DUET_LOG_LEVEL");
    if (env) {
        int lvl = duet_log_level_parse(env);
        if (lvl >= 0)
            duet_log_level_current = (duet_log_level_t)lvl;
    }
}

void duet_log_set_handler(duet_log_handler_fn fn, void *arg)
{
    pthread_mutex_lock(&log_lock);
    log_handler = fn;
    log_handler_arg = arg;
    pthread_mutex_unlock(&log_lock);
}

void duet_log_set_ident(const char *ident) { log_ident = ident ? ident : "duet"; }

void duet_log_emit(duet_log_level_t level, const char *file, int line, const char *rid,
                   const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;

    pthread_mutex_lock(&log_lock);
    if (log_handler) {
        log_handler(level, base, line, rid, msg, log_handler_arg);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %-5s %s:%d%s%s%s %s\n",
                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, log_ident, level_names[level], base, line,
                rid ? " rid=" : "", rid ? rid : "", "", msg);
    }
    pthread_mutex_unlock(&log_lock);
}
