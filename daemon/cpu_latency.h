/*
 * cpu_latency.h - holding the CPUs' wake-up latency down while the daemon
 * runs (--cpu-latency-us), through the kernel's PM QoS file
 * /dev/cpu_dma_latency.
 *
 * Why: a request's path wakes several sleeping threads (the transport's
 * poller, a worker, the client's), and on machines with cpuidle states a CPU
 * that sleeps longer sleeps deeper and wakes slower.  (The H200 test machine
 * is a VM without a cpuidle driver: there the setting changes nothing; see
 * tests/bench/E2E_RESULTS.md.)  The request applies to the whole machine
 * and lasts while the file stays open (the kernel drops it when the process
 * exits), so it is the operator's choice, off by default.
 */
#ifndef GCD_CPU_LATENCY_H
#define GCD_CPU_LATENCY_H

#include <stddef.h>
#include <stdint.h>

/* Zeroed: nothing held. */
typedef struct gcd_cpu_latency {
    int held;    /* fd is open and holds us */
    int fd;      /* the open PM QoS file */
    int64_t us;  /* the latency requested */
} gcd_cpu_latency;

/* us < 0: holds nothing.  Else 0, or -errno with a message in err (nothing held). */
int gcd_cpu_latency_hold(gcd_cpu_latency *l, int64_t us, char *err, size_t errlen);

/* Gives the request back (closes the file). */
void gcd_cpu_latency_release(gcd_cpu_latency *l);

#endif
