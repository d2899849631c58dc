/*
 * device_usage.h - live device memory and utilisation, for /metrics.
 *
 * The backends describe a device once at start (gcd_device_info); what changes
 * while the daemon runs comes from here.  For the cuda backend it is NVML,
 * loaded at run time (dlopen) so that the daemon neither links nor needs it:
 * with no NVML, or on the cpu backend, nothing is reported rather than a guess.
 * NVML numbers devices in PCI order, which is CUDA's only when
 * CUDA_DEVICE_ORDER=PCI_BUS_ID or one device is visible; a cuda backend that
 * knows its device's PCI bus id is the place to match them exactly.
 */
#ifndef GCD_DEVICE_USAGE_H
#define GCD_DEVICE_USAGE_H

#include <stdint.h>

typedef struct gcd_device_usage {
    uint64_t memory_total_bytes;
    uint64_t memory_used_bytes;
    double utilization; /* 0..1: the fraction of the last sample period a kernel ran */
} gcd_device_usage;

/* Fills out for backend `backend` ("cuda", "cpu") device `device`; 0, or -1 when unknown. */
int gcd_device_usage_get(const char *backend, int device, gcd_device_usage *out);

#endif
