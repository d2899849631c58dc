/*
 * process.h - the daemon process's own figures as every Prometheus client library exports them
 * (process_cpu_seconds_total, process_resident_memory_bytes, ...), read from /proc/self.
 */
#ifndef GCD_PROCESS_H
#define GCD_PROCESS_H

#include <stdint.h>

typedef struct gcd_process {
    double cpu_seconds;      /* user and system time */
    double start_time;       /* Unix seconds, to the kernel's clock tick */
    uint64_t resident_bytes; /* resident set */
    uint64_t virtual_bytes;  /* address space */
    uint64_t open_fds;
    uint64_t max_fds;        /* the soft descriptor limit */
} gcd_process;

/* Fills p; returns 0, or -1 when /proc could not be read (p is then undefined). */
int gcd_process_read(gcd_process *p);

#endif
