/*
 * backend.h - the pluggable compute backends, as an ops table.
 *
 * A backend owns its device: resident tensor storage, workspace, streams.
 * The daemon calls run() from its worker threads, possibly several at once.
 */
#ifndef GCD_BACKEND_H
#define GCD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "ops.h"

typedef struct gcd_backend gcd_backend;

typedef struct gcd_device_info {
    char name[128];
    uint32_t sm_count;
    uint64_t memory_bytes;
    uint64_t workspace_bytes;
} gcd_device_info;

/* Microseconds spent in each phase of one run; wait is for the backend's own
 * resources (an execution slot), which the reply counts as queueing. */
typedef struct gcd_run_timing {
    uint64_t wait_us, copy_in_us, compute_us, copy_out_us;
} gcd_run_timing;

/*
 * Where the threads that run requests spent their time around the device's
 * work, summed over the successful runs since open: what the reply timings'
 * "other" share is made of on the backend's side.
 */
typedef struct gcd_host_phases {
    uint64_t runs;
    uint64_t prepare_us; /* slot taken to the first copy enqueued: layout, scratch planning */
    uint64_t enqueue_us; /* enqueuing the copies and kernels (graph launches or launches) */
    uint64_t wait_us;    /* everything enqueued to the device done */
    uint64_t finish_us;  /* after the device: error records, timings */
} gcd_host_phases;

typedef struct gcd_backend_ops {
    const char *name;
    /* Opens the backend: allocates buffers and warms kernels; 0 or -1 with err. */
    int (*open)(const gcd_config *cfg, gcd_backend **out, gk_err *err);
    void (*close)(gcd_backend *b);
    void (*describe)(gcd_backend *b, gcd_device_info *out);
    /* Resident tensor storage; alloc returns NULL with err set when out of room. */
    void *(*tensor_alloc)(gcd_backend *b, size_t bytes, gk_err *err);
    void (*tensor_free)(gcd_backend *b, void *storage);
    int (*tensor_write)(gcd_backend *b, void *storage, const void *host, size_t bytes, gk_err *err);
    int (*tensor_read)(gcd_backend *b, void *host, const void *storage, size_t bytes, gk_err *err);
    /* Pins a registered region's pages for fast copies (NULL: nothing to do). */
    int (*host_register)(gcd_backend *b, void *base, size_t bytes, gk_err *err);
    void (*host_unregister)(gcd_backend *b, void *base);
    /* Runs a checked op; returns 0 or a negative gk_code with err set. */
    int (*run)(gcd_backend *b, gcd_op *op, gcd_run_timing *timing, gk_err *err);
    /* Allocations of device memory since open (constant after warm-up: never on the request path). */
    uint64_t (*allocations)(gcd_backend *b);
    /* Requests replayed as captured CUDA graphs, and graphs captured, since open (NULL: none). */
    void (*graphs)(gcd_backend *b, uint64_t *replays, uint64_t *captures);
    /*
     * The OpenMP threads the runs computing at once may use: the most there have been since
     * open, and the cores they share (NULL: the backend runs no OpenMP teams).
     */
    void (*cpu_threads)(gcd_backend *b, unsigned *peak, unsigned *cores);
    /* The host phases of the runs since open (NULL: not measured). */
    void (*host_phases)(gcd_backend *b, gcd_host_phases *out);
    /*
     * NULL while the device works; once an error has lost it for good (a sticky
     * CUDA error: the context is unusable), a message saying why.  The daemon
     * polls it, stops reporting ready, drains and exits non-zero so that a
     * supervisor restarts it.  May be NULL for a backend that cannot be lost.
     */
    const char *(*lost)(gcd_backend *b);
} gcd_backend_ops;

extern const gcd_backend_ops gcd_backend_cpu;
/* NULL when the daemon was built without CUDA. */
extern const gcd_backend_ops *const gcd_backend_cuda;

/*
 * Reports whether CUDA device number device is usable (for --backend auto and cuda): 1, or 0
 * with why it is not in why (the CUDA error, or that the build has no CUDA backend).
 */
int gcd_backend_cuda_usable(int device, char *why, size_t whylen);

#endif
