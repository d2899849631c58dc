/* clock.h - a monotonic microsecond clock for request timings. */
#ifndef GCD_CLOCK_H
#define GCD_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t gcd_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

#endif
