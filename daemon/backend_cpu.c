/*
 * backend_cpu.c - the CPU backend: the portable kernels of kernels/cpu/ on host
 * memory.  Every tensor is already in host memory, so there is nothing to copy:
 * copy in and copy out are always zero.  Runs computing at once share the cores
 * (cpu_cores.h); waiting for them is the run's wait (queueing in the reply).
 * Each operation's kernel call is its entry's cpu_run in the operations table
 * (ops/table.h).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "clock.h"
#include "cpu_cores.h"
#include "ops/table.h"
#include "parts.h"

struct gcd_backend {
    gcd_cpu_cores cores;
};

static int cpu_open(const gcd_config *cfg, gcd_backend **out, gk_err *err)
{
    int rc = gcd_op_table_check(gcd_op_families, gcd_op_nfamilies, NULL, err);
    if (rc != 0)
        return rc;
    gcd_backend *b = calloc(1, sizeof *b);
    if (b == NULL)
        return gk_fail(err, GK_ENOMEM, "cannot allocate the CPU backend");
    /* The cores OpenMP may use (its affinity mask); a team as large as OMP_NUM_THREADS allows. */
    if (gcd_cpu_cores_init(&b->cores, (unsigned)omp_get_num_procs(),
                           (unsigned)omp_get_max_threads()) != 0) {
        free(b);
        return gk_fail(err, GK_ENOMEM, "cannot allocate the CPU backend's core sharing");
    }
    *out = b;
    return 0;
}

static void cpu_close(gcd_backend *b)
{
    gcd_cpu_cores_fini(&b->cores);
    free(b);
}

static void cpu_describe(gcd_backend *b, gcd_device_info *out)
{
    memset(out, 0, sizeof *out);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    snprintf(out->name, sizeof out->name, "cpu (%ld cores)", cores);
    out->sm_count = cores > 0 ? (uint32_t)cores : 0;
    out->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

static void *cpu_tensor_alloc(gcd_backend *b, size_t bytes, gk_err *err)
{
    /* 64-byte aligned like every other tensor the kernels see; never 0 bytes. */
    size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n ? n : 64);
    if (p == NULL)
        gk_fail(err, GK_ENOMEM, "cannot allocate %zu bytes of resident tensor memory", bytes);
    return p;
}

static void cpu_tensor_free(gcd_backend *b, void *storage) { free(storage); }

static int cpu_tensor_write(gcd_backend *b, void *storage, const void *host, size_t bytes,
                            gk_err *err)
{
    memcpy(storage, host, bytes);
    return 0;
}

static int cpu_tensor_read(gcd_backend *b, void *host, const void *storage, size_t bytes,
                           gk_err *err)
{
    memcpy(host, storage, bytes);
    return 0;
}

/* The kernels take each tensor in one piece: a merged batch's parts are gathered first. */
static int cpu_run(gcd_backend *b, gcd_op *op, gcd_run_timing *timing, gk_err *err)
{
    uint64_t t0 = gcd_now_us(), wait = 0;
    gcd_op whole = *op;
    void *bufs[GCD_OP_MAX_ARGS];
    int rc = gcd_parts_gather(&whole, bufs, err);
    if (rc == 0) {
        const uint64_t t1 = gcd_now_us();
        const unsigned team = gcd_cpu_cores_take(&b->cores);
        wait = gcd_now_us() - t1;
        omp_set_num_threads((int)team); /* this thread's teams, for this run */
        const gcd_op_entry *e = gcd_op_entry_of(whole.kind);
        rc = e != NULL ? e->cpu_run(&whole, err)
                       : gk_fail(err, GK_EINVAL, "operation %d is not served by the CPU backend",
                                 (int)whole.kind);
        gcd_cpu_cores_give(&b->cores, team);
        gcd_parts_scatter(&whole, bufs); /* a failed run's outputs are undefined anyway */
    }
    *timing = (gcd_run_timing){.wait_us = wait, .compute_us = gcd_now_us() - t0 - wait};
    return rc;
}

static uint64_t cpu_allocations(gcd_backend *b) { return 0; }

static void cpu_threads(gcd_backend *b, unsigned *peak, unsigned *cores)
{
    *peak = gcd_cpu_cores_peak(&b->cores);
    *cores = b->cores.cores;
}

const gcd_backend_ops gcd_backend_cpu = {
    .name = "cpu",
    .open = cpu_open,
    .close = cpu_close,
    .describe = cpu_describe,
    .tensor_alloc = cpu_tensor_alloc,
    .tensor_free = cpu_tensor_free,
    .tensor_write = cpu_tensor_write,
    .tensor_read = cpu_tensor_read,
    .run = cpu_run,
    .allocations = cpu_allocations,
    .cpu_threads = cpu_threads,
};
