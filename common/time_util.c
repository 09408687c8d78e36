#include "time_util.h"

#include <time.h>

uint64_t duet_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double duet_time_s(void) { return (double)duet_time_ns() * 1e-9; }

uint64_t duet_deadline_after_ms(uint64_t ms) { return duet_time_ns() + ms * 1000000ull; }

uint64_t duet_deadline_left_ms(uint64_t deadline_ns)
{
    uint64_t now = duet_time_ns();
    return deadline_ns > now ? (deadline_ns - now) / 1000000ull : 0;
}

uint64_t duet_wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000ull;
}
