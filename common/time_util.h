/* Monotonic time.  Deadlines in duet are absolute monotonic nanoseconds. */
#ifndef DUET_TIME_UTIL_H
#define DUET_TIME_UTIL_H

#include <stdint.h>

/* Nanoseconds on CLOCK_MONOTONIC. */
uint64_t duet_time_ns(void);
/* Seconds (double) on CLOCK_MONOTONIC, for timings printed to people. */
double duet_time_s(void);
/* Deadline `ms` milliseconds from now, in monotonic ns. */
uint64_t duet_deadline_after_ms(uint64_t ms);
/* Milliseconds left until a deadline (0 when passed). */
uint64_t duet_deadline_left_ms(uint64_t deadline_ns);
/* Wall-clock microseconds since the epoch (for send times on the wire). */
uint64_t duet_wall_us(void);

#endif
