/*
 * backend_cpu.c - the CPU backend: the portable kernels of kernels/cpu/ on host
 * memory.  Every tensor is already in host memory, so there is nothing to copy:
 * copy in and copy out are always zero.  Runs computing at once share the cores
 * (cpu_cores.h); waiting for them is the run's wait (queueing in the reply).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "clock.h"
#include "cpu_cores.h"
#include "parts.h"

struct gcd_backend {
    gcd_cpu_cores cores;
};

static int cpu_open(const gcd_config *cfg, gcd_backend **out, gk_err *err)
{
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

static const gk_tensor *arg(const gcd_op *op, int i) { return &op->args[i].t; }

static int cpu_run_whole(gcd_op *op, gk_err *err)
{
    switch (op->kind) {
    case GCD_OP_CONV2D_FORWARD:
        return gk_cpu_conv2d_forward(&op->p.conv, arg(op, CONV_FWD_X), arg(op, CONV_FWD_W),
                                     arg(op, CONV_FWD_B), arg(op, CONV_FWD_Y), err);
    case GCD_OP_CONV2D_BACKWARD:
        return gk_cpu_conv2d_backward(&op->p.conv, arg(op, CONV_BWD_X), arg(op, CONV_BWD_W),
                                      arg(op, CONV_BWD_Y), arg(op, CONV_BWD_DY),
                                      arg(op, CONV_BWD_DX), arg(op, CONV_BWD_DW),
                                      arg(op, CONV_BWD_DB), err);
    case GCD_OP_MULTIHOT_ENCODE:
        return gk_cpu_multihot_encode(&op->p.multihot, arg(op, MULTIHOT_OBS),
                                      arg(op, MULTIHOT_OUT), err);
    case GCD_OP_EMBEDDING_FORWARD:
        return gk_cpu_embedding_forward(arg(op, EMB_FWD_IDX), arg(op, EMB_FWD_TABLE),
                                        arg(op, EMB_FWD_OUT), err);
    case GCD_OP_EMBEDDING_BACKWARD:
        return gk_cpu_embedding_backward(arg(op, EMB_BWD_IDX), arg(op, EMB_BWD_DOUT),
                                         arg(op, EMB_BWD_DTABLE), err);
    case GCD_OP_LINEAR_CROSS_ENTROPY:
        return gk_cpu_lce(&op->p.lce, arg(op, LCE_E), arg(op, LCE_C), arg(op, LCE_BIAS),
                          arg(op, LCE_TARGETS), arg(op, LCE_LOSS), arg(op, LCE_LSE),
                          arg(op, LCE_DE), arg(op, LCE_DC), arg(op, LCE_DBIAS), err);
    case GCD_OP_NMMO3_FORWARD: {
        gk_nmmo3_weights w = gcd_op_nmmo3_weights(op, NMMO3_W0);
        if (arg(op, NMMO3_FWD_SAVED)->data != NULL)
            return gk_cpu_nmmo3_forward_save(&w, arg(op, NMMO3_OBS), arg(op, NMMO3_FWD_FEATURES),
                                             arg(op, NMMO3_FWD_HIDDEN), arg(op, NMMO3_FWD_SAVED),
                                             err);
        return gk_cpu_nmmo3_forward(&w, arg(op, NMMO3_OBS), arg(op, NMMO3_FWD_FEATURES),
                                    arg(op, NMMO3_FWD_HIDDEN), err);
    }
    case GCD_OP_NMMO3_BACKWARD: {
        gk_nmmo3_weights w = gcd_op_nmmo3_weights(op, NMMO3_W0);
        gk_nmmo3_weights g = gcd_op_nmmo3_weights(op, NMMO3_BWD_G0);
        if (arg(op, NMMO3_BWD_SAVED)->data != NULL)
            return gk_cpu_nmmo3_backward_saved(&w, arg(op, NMMO3_OBS), arg(op, NMMO3_BWD_SAVED),
                                               arg(op, NMMO3_BWD_DOUT), &g, err);
        return gk_cpu_nmmo3_backward(&w, arg(op, NMMO3_OBS), arg(op, NMMO3_BWD_DOUT), &g, err);
    }
    case GCD_OP_COUNT: /* no default: -Wswitch names an operation left out */
        break;
    }
    return gk_fail(err, GK_EINVAL, "operation %d is not served by the CPU backend", op->kind);
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
        rc = cpu_run_whole(&whole, err);
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
