/*
 * backend_cuda.c - the CUDA backend: one context on --device, every byte of
 * device and pinned host memory taken in open(), the kernels of kernels/cuda/.
 *
 * Memory, all allocated once, when the backend opens:
 *   - the workspace arena (--workspace-mb), cut into execution slots;
 *   - pinned host staging, one buffer per slot, for inline (payload) tensors;
 *   - the resident pool (--resident-mb), carved by the first-fit allocator of
 *     pool.c, so that tensor_put and tensor_free never reach cudaMalloc.
 * Shared-memory regions are pinned when registered (cudaHostRegister), and
 * copies to and from them go straight to the device at PCIe speed.
 *
 * A run takes an execution slot (a non-blocking stream, a slice of the
 * workspace, a staging buffer, timing events): copies its host inputs into
 * the slice, runs the kernel, copies the outputs back and synchronises only
 * its own stream, so the copies and kernels of requests in different slots
 * overlap.  Resident tensors are used in place.
 *
 * Errors: a CUDA error of one request fails that request (GK_EDEVICE).  A
 * sticky one (the context is unusable, as after an illegal address) marks the
 * backend lost: every later call fails at once and ops->lost tells the daemon
 * to drain and exit non-zero, so that a supervisor restarts it.
 *
 * Each operation's pieces (scratch size, kernels, error records and their
 * verdict) are its CUDA adapter in the operations table (cuda_run.h,
 * ops/table.h); this file is the executor they share.
 *
 * Fault injection, for the test of that path: with GPUCD_CUDA_FAULT_INJECT=1
 * in the environment at start, the first compute request run in one piece
 * (not pipelined) reads its first tensor from an unmapped device address,
 * which makes the context fail for good (cudaErrorIllegalAddress) exactly as
 * a kernel bug would.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "backend.h"
#include "clock.h"
#include "cuda_graphs.h"
#include "cuda_run.h"
#include "gk_cuda.h"
#include "host_phases.h"
#include "log.h"
#include "ops/table.h"
#include "parts.h"
#include "pinned.h"
#include "pool.h"
#include "slot_pool.h"

/*
 * Few slots: two already overlap one request's copies with another's
 * kernels, and each slot is a slice of the workspace, so more slots mean a
 * smaller largest request.
 */
enum { SLOTS_MAX = 4, SLOT_ALIGN = GCD_POOL_ALIGN };
_Static_assert((int)SLOTS_MAX <= (int)GCD_SLOT_POOL_MAX, "the slot pool holds every slot");

/*
 * Encoder forwards a slot keeps as graphs: an RL setup sends a handful of
 * batch sizes, and a pipelined request is one graph a chunk (PIPE_CHUNKS).
 */
enum { GRAPHS_PER_SLOT = 16 };

/* The events of one run: start, inputs on the device, computed, outputs back. */
enum { EV_START, EV_COPIED_IN, EV_COMPUTED, EV_COPIED_OUT, EV_COUNT };

/*
 * A large encoder forward runs as a pipeline of at most PIPE_CHUNKS chunks of
 * at least PIPE_CHUNK_MIN rows (slot_run_pipelined).  The upload bounds it
 * (B = 32768: 56 MB, 1.02 ms at the measured ~55 GB/s), and what follows the
 * last upload is one chunk's compute and copy out: eight chunks keep that to
 * an eighth.
 */
enum { PIPE_CHUNKS = 8, PIPE_CHUNK_MIN = 2048 };

/* Error-record words a slot keeps: the most an op leaves, for each chunk of a pipelined run. */
enum { RECORD_WORDS = GCD_CUDA_RECORDS_MAX * PIPE_CHUNKS };

typedef struct exec_slot {
    cudaStream_t stream;
    cudaEvent_t ev[EV_COUNT];
    cudaStream_t copy_in, copy_out;  /* the pipeline's copies, beside the kernels on stream */
    cudaEvent_t chunk_in[PIPE_CHUNKS], chunk_done[PIPE_CHUNKS];
    uint8_t *ws;      /* device: the slot's slice of the workspace */
    uint8_t *staging; /* pinned host */
    gk_cuda_blas *blas; /* cuBLAS bound to stream, its workspace allocated at open */
    gcd_graph_cache *graphs; /* the encoder forwards this slot replays as graphs */
    uint64_t *records; /* pinned host: the op's device error records, copied back with its outputs,
                        * GCD_CUDA_RECORDS_MAX words for each of PIPE_CHUNKS chunks */
} exec_slot;

struct gcd_backend {
    int device;
    char name[128];
    int sm_count;
    uint64_t memory_bytes;
    uint64_t workspace_mb;

    uint8_t *arena; /* device workspace, nslots * slot_bytes */
    size_t slot_bytes;
    uint8_t *staging; /* pinned host, nslots * staging_bytes */
    size_t staging_bytes;
    uint64_t *records; /* pinned host, RECORD_WORDS a slot */
    exec_slot slots[SLOTS_MAX];
    int nslots;
    gcd_slot_pool free_slots; /* indices into slots */

    uint8_t *resident; /* device, resident_bytes */
    size_t resident_bytes;
    gcd_pool *pool;
    pthread_mutex_t pool_lock;

    gcd_pinned pinned; /* registered regions */

    atomic_uint_fast64_t allocations;
    gcd_phase_sums phases; /* summed by the runs' threads */
    atomic_int lost;     /* 0 healthy; 1 being marked; 2 lost, lost_why final */
    atomic_int fault_armed; /* GPUCD_CUDA_FAULT_INJECT: the next request run faults */
    char lost_why[256];
};

/* ---- errors ------------------------------------------------------------------- */

/* Errors after which the context is unusable: every later call returns them too. */
static int cuda_error_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDeviceUninitialized:
    case cudaErrorDevicesUnavailable:
    case cudaErrorCudartUnloading:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorExternalDevice:
    case cudaErrorUnknown:
        return 1;
    default:
        return 0;
    }
}

static void backend_lose(gcd_backend *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void backend_lose(gcd_backend *b, const char *fmt, ...)
{
    int healthy = 0;
    if (!atomic_compare_exchange_strong(&b->lost, &healthy, 1))
        return; /* the first cause is the one reported */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->lost_why, sizeof b->lost_why, fmt, ap);
    va_end(ap);
    atomic_store(&b->lost, 2);
    gcd_log_error("cuda: device %d lost: %s", b->device, b->lost_why);
}

static int backend_check_lost(gcd_backend *b, gk_err *err)
{
    if (atomic_load(&b->lost) == 0)
        return 0;
    return gk_fail(err, GK_EDEVICE, "the CUDA device was lost (%s); the daemon is restarting",
                   atomic_load(&b->lost) == 2 ? b->lost_why : "a sticky error");
}

/*
 * After a failure on slot s (e: what the failing call returned, cudaSuccess
 * when a kernel wrapper reported it): waits for the slot's stream so that the
 * slot can be reused, clears the thread's error so that it is not blamed on
 * the next call, and decides whether the context survived.  Returns 1 when
 * the device is lost.
 */
static int slot_recover(gcd_backend *b, exec_slot *s, cudaError_t e, const char *what)
{
    cudaError_t sync = cudaStreamSynchronize(s->stream);
    cudaError_t last = cudaGetLastError();
    cudaError_t probe = cudaStreamQuery(s->stream);
    cudaError_t worst = cuda_error_sticky(e) ? e : cuda_error_sticky(sync) ? sync : last;
    int sticky = cuda_error_sticky(e) || cuda_error_sticky(sync) || cuda_error_sticky(last) ||
                 (probe != cudaSuccess && probe != cudaErrorNotReady);
    if (sticky)
        backend_lose(b, "%s: %s", what,
                     cudaGetErrorString(worst != cudaSuccess ? worst : probe));
    return sticky;
}

/* Fails a call whose CUDA call returned e, on slot s. */
static int slot_fail(gcd_backend *b, exec_slot *s, cudaError_t e, const char *what, gk_err *err)
{
    int sticky = slot_recover(b, s, e, what);
    return gk_fail(err, GK_EDEVICE, "%s: %s%s", what, cudaGetErrorString(e),
                   sticky ? " (the device is lost; the daemon is restarting)" : "");
}

/*
 * After run_kernel returned rc != 0 on slot s: a kernel wrapper's own failure
 * (shapes, workspace) leaves the device healthy, a launch failure may not
 * have; the error for the request.
 */
static int kernel_fail(gcd_backend *b, exec_slot *s, int rc, const gk_err *err)
{
    return slot_recover(b, s, cudaSuccess, err->msg) && rc != GK_EDEVICE ? GK_EDEVICE : rc;
}

/* ---- slots ---------------------------------------------------------------------- */

static exec_slot *slot_take(gcd_backend *b)
{
    return &b->slots[gcd_slot_pool_take(&b->free_slots)];
}

static void slot_give(gcd_backend *b, exec_slot *s)
{
    gcd_slot_pool_give(&b->free_slots, (int)(s - b->slots));
}

/* ---- pinned regions (pinned.h) ---------------------------------------------------- */

static int resident_contains(const gcd_backend *b, const void *p)
{
    uintptr_t a = (uintptr_t)p, base = (uintptr_t)b->resident;
    return a >= base && a < base + b->resident_bytes;
}

/* gcd_pinned_add's pin: registers a region's pages with the driver. */
static int region_pin(void *ctx, void *base, size_t bytes, gk_err *err)
{
    gcd_backend *b = ctx;
    /* The mapping covers whole pages; pinning whole pages is what the driver does anyway. */
    long page = sysconf(_SC_PAGESIZE);
    size_t pinned = page > 0 ? (bytes + (size_t)page - 1) / (size_t)page * (size_t)page : bytes;
    cudaSetDevice(b->device);
    cudaError_t e = cudaHostRegister(base, pinned, cudaHostRegisterDefault);
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    if (cuda_error_sticky(e))
        backend_lose(b, "cudaHostRegister: %s", cudaGetErrorString(e));
    return gk_fail(err, GK_EDEVICE, "cudaHostRegister of %zu bytes: %s", bytes,
                   cudaGetErrorString(e));
}

static void region_unpin(void *ctx, void *base)
{
    gcd_backend *b = ctx;
    cudaSetDevice(b->device);
    cudaError_t e = cudaHostUnregister(base);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        gcd_log_warn("cuda: cudaHostUnregister: %s", cudaGetErrorString(e));
    }
}

static int cuda_host_register(gcd_backend *b, void *base, size_t bytes, gk_err *err)
{
    if (backend_check_lost(b, err) != 0)
        return -1;
    return gcd_pinned_add(&b->pinned, base, bytes, region_pin, b, err);
}

static void cuda_host_unregister(gcd_backend *b, void *base)
{
    gcd_pinned_remove(&b->pinned, base, region_unpin, b);
}

/* ---- open and close ------------------------------------------------------------- */

static void cuda_close(gcd_backend *b)
{
    if (b == NULL)
        return;
    cudaSetDevice(b->device);
    cudaDeviceSynchronize();
    for (int i = 0; i < b->nslots; i++) {
        exec_slot *s = &b->slots[i];
        gk_cuda_blas_close(s->blas);
        gcd_graph_cache_destroy(s->graphs);
        for (int k = 0; k < EV_COUNT; k++)
            if (s->ev[k] != NULL)
                cudaEventDestroy(s->ev[k]);
        for (int k = 0; k < PIPE_CHUNKS; k++) {
            if (s->chunk_in[k] != NULL)
                cudaEventDestroy(s->chunk_in[k]);
            if (s->chunk_done[k] != NULL)
                cudaEventDestroy(s->chunk_done[k]);
        }
        if (s->copy_in != NULL)
            cudaStreamDestroy(s->copy_in);
        if (s->copy_out != NULL)
            cudaStreamDestroy(s->copy_out);
        if (s->stream != NULL)
            cudaStreamDestroy(s->stream);
    }
    /* Regions the daemon did not unregister (it always does) are left pinned to the process. */
    if (b->arena != NULL)
        cudaFree(b->arena);
    if (b->resident != NULL)
        cudaFree(b->resident);
    if (b->staging != NULL)
        cudaFreeHost(b->staging);
    if (b->records != NULL)
        cudaFreeHost(b->records);
    (void)cudaGetLastError();
    gcd_pool_destroy(b->pool);
    gcd_slot_pool_destroy(&b->free_slots);
    pthread_mutex_destroy(&b->pool_lock);
    gcd_pinned_destroy(&b->pinned);
    free(b);
}

#define OPEN_CHECK(call, what)                                                                    \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            gk_fail(err, GK_EDEVICE, "device %d: %s: %s", cfg->device, what,                     \
                    cudaGetErrorString(e_));                                                      \
            goto fail;                                                                            \
        }                                                                                         \
    } while (0)

/* gcd_op_table_check's test of an adapter: 0, or nonzero with *missing naming what it lacks. */
static int cuda_op_missing(const gcd_cuda_op *a, const char **missing)
{
    if (a->scratch == NULL)
        *missing = "its CUDA scratch size";
    else if (a->enqueue == NULL)
        *missing = "its CUDA enqueue";
    else if (a->records < 0 || a->records > GCD_CUDA_RECORDS_MAX)
        *missing = "a CUDA record count within GCD_CUDA_RECORDS_MAX";
    else if ((a->records > 0) != (a->status != NULL))
        *missing = "a CUDA status exactly when it leaves records";
    else if ((a->pipe_io != NULL) != (a->npipe_io > 0) || a->npipe_io > GCD_OP_MAX_ARGS)
        *missing = "a CUDA pipe_io list with its length";
    else
        return 0;
    return -1;
}

static int cuda_open(const gcd_config *cfg, gcd_backend **out, gk_err *err)
{
    int rc = gcd_op_table_check(gcd_op_families, gcd_op_nfamilies, cuda_op_missing, err);
    if (rc != 0)
        return rc;
    gcd_backend *b = calloc(1, sizeof *b);
    if (b == NULL)
        return gk_fail(err, GK_ENOMEM, "cannot allocate the CUDA backend");
    b->device = cfg->device;
    b->workspace_mb = cfg->workspace_mb;
    gcd_slot_pool_init(&b->free_slots);
    pthread_mutex_init(&b->pool_lock, NULL);
    gcd_pinned_init(&b->pinned);

    OPEN_CHECK(cudaSetDevice(cfg->device), "cudaSetDevice");
    struct cudaDeviceProp prop;
    OPEN_CHECK(cudaGetDeviceProperties(&prop, cfg->device), "cudaGetDeviceProperties");
    snprintf(b->name, sizeof b->name, "%.96s (device %d, cc %d.%d)", prop.name, cfg->device,
             prop.major, prop.minor);
    b->sm_count = prop.multiProcessorCount;
    b->memory_bytes = prop.totalGlobalMem;

    /* By default 1/16 of the device, within [1, 8] GiB: on an H200 the 8 GiB lets every slot
     * run an encoder batch of 32768 and the loss at its full 1 GB budget. */
    if (b->workspace_mb == GCD_WORKSPACE_AUTO) {
        uint64_t mb = (b->memory_bytes >> 20) / 16;
        b->workspace_mb = mb < 1024 ? 1024 : mb > 8192 ? 8192 : mb;
    }
    b->nslots = cfg->max_inflight < SLOTS_MAX ? (int)cfg->max_inflight : SLOTS_MAX;
    if (b->nslots < 1)
        b->nslots = 1;
    uint64_t workspace = b->workspace_mb << 20;
    b->slot_bytes = (size_t)(workspace / (uint64_t)b->nslots / SLOT_ALIGN * SLOT_ALIGN);
    /* Inline inputs all come in one request and inline outputs all go in one
     * reply, each at most --max-message-mb, and everything staged also lives in
     * the slot's workspace: the smaller of the two bounds what a slot stages. */
    uint64_t message = cfg->max_message_mb << 20;
    b->staging_bytes = message < b->slot_bytes ? (size_t)message : b->slot_bytes;
    b->resident_bytes = (size_t)(cfg->resident_mb << 20);

    OPEN_CHECK(cudaMalloc((void **)&b->arena, b->slot_bytes * (size_t)b->nslots),
               "cudaMalloc of the workspace (--workspace-mb)");
    atomic_fetch_add(&b->allocations, 1);
    OPEN_CHECK(cudaMalloc((void **)&b->resident, b->resident_bytes),
               "cudaMalloc of the resident pool (--resident-mb)");
    atomic_fetch_add(&b->allocations, 1);
    OPEN_CHECK(cudaHostAlloc((void **)&b->staging, b->staging_bytes * (size_t)b->nslots,
                             cudaHostAllocDefault),
               "cudaHostAlloc of the pinned staging buffers");
    atomic_fetch_add(&b->allocations, 1);
    OPEN_CHECK(cudaHostAlloc((void **)&b->records,
                             sizeof *b->records * RECORD_WORDS * (size_t)b->nslots,
                             cudaHostAllocDefault),
               "cudaHostAlloc of the error records");
    atomic_fetch_add(&b->allocations, 1);
    b->pool = gcd_pool_create(b->resident_bytes);
    if (b->pool == NULL) {
        gk_fail(err, GK_ENOMEM, "cannot allocate the resident pool's bookkeeping");
        goto fail;
    }
    for (int i = 0; i < b->nslots; i++) {
        exec_slot *s = &b->slots[i];
        OPEN_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
        for (int k = 0; k < EV_COUNT; k++)
            OPEN_CHECK(cudaEventCreate(&s->ev[k]), "cudaEventCreate");
        OPEN_CHECK(cudaStreamCreateWithFlags(&s->copy_in, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
        OPEN_CHECK(cudaStreamCreateWithFlags(&s->copy_out, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
        for (int k = 0; k < PIPE_CHUNKS; k++) {
            /* Ordering only: no timing, so recording them costs the least. */
            OPEN_CHECK(cudaEventCreateWithFlags(&s->chunk_in[k], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
            OPEN_CHECK(cudaEventCreateWithFlags(&s->chunk_done[k], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags");
        }
        if (gk_cuda_blas_open(s->stream, &s->blas, err) != 0)
            goto fail;
        if ((s->graphs = gcd_graph_cache_create(s->stream, GRAPHS_PER_SLOT)) == NULL) {
            gk_fail(err, GK_ENOMEM, "cannot allocate a slot's graph cache");
            goto fail;
        }
        atomic_fetch_add(&b->allocations, 1);
        s->ws = b->arena + (size_t)i * b->slot_bytes;
        s->staging = b->staging + (size_t)i * b->staging_bytes;
        s->records = b->records + (size_t)i * RECORD_WORDS;
        gcd_slot_pool_give(&b->free_slots, i);
    }
    if (gk_cuda_conv_warmup(err) != 0)
        goto fail;
    /* Touch every slot's stream and events once, so the first request pays for nothing. */
    for (int i = 0; i < b->nslots; i++) {
        exec_slot *s = &b->slots[i];
        OPEN_CHECK(cudaMemsetAsync(s->ws, 0, SLOT_ALIGN, s->stream), "cudaMemsetAsync");
        OPEN_CHECK(cudaMemcpyAsync(s->staging, s->ws, SLOT_ALIGN < b->staging_bytes ? SLOT_ALIGN
                                                                            : b->staging_bytes,
                                   cudaMemcpyDeviceToHost, s->stream),
                   "cudaMemcpyAsync");
        for (int k = 0; k < EV_COUNT; k++)
            OPEN_CHECK(cudaEventRecord(s->ev[k], s->stream), "cudaEventRecord");
    }
    OPEN_CHECK(cudaDeviceSynchronize(), "warm-up");
    const char *inject = getenv("GPUCD_CUDA_FAULT_INJECT");
    if (inject != NULL && strcmp(inject, "1") == 0) {
        atomic_store(&b->fault_armed, 1);
        gcd_log_warn("cuda: GPUCD_CUDA_FAULT_INJECT=1: the first compute request will read an "
                     "invalid device address and lose the device");
    }
    gcd_log_info("cuda: %s, %d SMs, %d execution slots of %zu MiB workspace and %zu MiB pinned "
                 "staging, %zu MiB resident pool",
                 b->name, b->sm_count, b->nslots, b->slot_bytes >> 20, b->staging_bytes >> 20,
                 b->resident_bytes >> 20);
    *out = b;
    return 0;
fail:
    (void)cudaGetLastError();
    cuda_close(b);
    return GK_EDEVICE;
}

static void cuda_describe(gcd_backend *b, gcd_device_info *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", b->name);
    out->sm_count = (uint32_t)b->sm_count;
    out->memory_bytes = b->memory_bytes;
    out->workspace_bytes = (uint64_t)b->slot_bytes * (uint64_t)b->nslots;
}

static uint64_t cuda_allocations(gcd_backend *b) { return atomic_load(&b->allocations); }

static void cuda_graphs(gcd_backend *b, uint64_t *replays, uint64_t *captures)
{
    *replays = *captures = 0;
    for (int i = 0; i < b->nslots; i++)
        gcd_graph_cache_counts(b->slots[i].graphs, replays, captures);
}

static const char *cuda_lost(gcd_backend *b)
{
    return atomic_load(&b->lost) == 2 ? b->lost_why : NULL;
}

/* ---- resident tensors ---------------------------------------------------------------- */

static void *cuda_tensor_alloc(gcd_backend *b, size_t bytes, gk_err *err)
{
    if (backend_check_lost(b, err) != 0)
        return NULL;
    uint64_t off;
    pthread_mutex_lock(&b->pool_lock);
    int rc = gcd_pool_alloc(b->pool, bytes, &off);
    gcd_pool_usage use;
    if (rc != 0)
        gcd_pool_usage_get(b->pool, &use);
    pthread_mutex_unlock(&b->pool_lock);
    if (rc != 0) {
        gk_fail(err, GK_ENOMEM, "the device's resident pool has no free range of %zu bytes "
                                "(largest free %" PRIu64 " of %" PRIu64 ", --resident-mb)",
                bytes, use.largest_free, use.size);
        return NULL;
    }
    return b->resident + off;
}

static void cuda_tensor_free(gcd_backend *b, void *storage)
{
    pthread_mutex_lock(&b->pool_lock);
    int rc = gcd_pool_free(b->pool, (uint64_t)((uint8_t *)storage - b->resident));
    pthread_mutex_unlock(&b->pool_lock);
    if (rc != 0)
        gcd_log_error("cuda: freeing resident storage %p that the pool never handed out",
                      storage);
}

/*
 * Copies between host memory and a resident tensor on a slot's stream:
 * straight from or to a pinned region, else through the slot's staging buffer
 * a piece at a time.  A source that is itself resident is a device copy.
 */
static int resident_copy(gcd_backend *b, uint8_t *dev, uint8_t *host, size_t bytes, int to_device,
                         gk_err *err)
{
    if (backend_check_lost(b, err) != 0)
        return -1;
    exec_slot *s = slot_take(b);
    cudaSetDevice(b->device);
    cudaError_t e = cudaSuccess;
    const char *what = to_device ? "copy to a resident tensor" : "copy from a resident tensor";
    if (to_device && resident_contains(b, host)) {
        e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyDeviceToDevice, s->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(s->stream);
    } else if (gcd_pinned_contains(&b->pinned, host, bytes)) {
        e = to_device ? cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s->stream)
                      : cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(s->stream);
    } else {
        for (size_t off = 0; off < bytes && e == cudaSuccess; off += b->staging_bytes) {
            size_t n = bytes - off < b->staging_bytes ? bytes - off : b->staging_bytes;
            if (to_device) {
                memcpy(s->staging, host + off, n);
                e = cudaMemcpyAsync(dev + off, s->staging, n, cudaMemcpyHostToDevice, s->stream);
                if (e == cudaSuccess)
                    e = cudaStreamSynchronize(s->stream);
            } else {
                e = cudaMemcpyAsync(s->staging, dev + off, n, cudaMemcpyDeviceToHost, s->stream);
                if (e == cudaSuccess)
                    e = cudaStreamSynchronize(s->stream);
                if (e == cudaSuccess)
                    memcpy(host + off, s->staging, n);
            }
        }
    }
    int rc = e == cudaSuccess ? 0 : slot_fail(b, s, e, what, err);
    slot_give(b, s);
    return rc;
}

static int cuda_tensor_write(gcd_backend *b, void *storage, const void *host, size_t bytes,
                             gk_err *err)
{
    return resident_copy(b, storage, (uint8_t *)(uintptr_t)host, bytes, 1, err);
}

static int cuda_tensor_read(gcd_backend *b, void *host, const void *storage, size_t bytes,
                            gk_err *err)
{
    return resident_copy(b, (uint8_t *)(uintptr_t)storage, host, bytes, 0, err);
}

/* ---- compute ---------------------------------------------------------------------------- */

static size_t align_up(size_t n) { return (n + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN; }

static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

static uint64_t elapsed_us(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess || ms < 0) {
        (void)cudaGetLastError();
        return 0;
    }
    return (uint64_t)((double)ms * 1000.0 + 0.5);
}

/* The op's CUDA adapter: every kind has one once cuda_open has checked the table. */
static const gcd_cuda_op *adapter(const gcd_op *op) { return gcd_op_entry_of(op->kind)->cuda; }

/*
 * The kernel's scratch bytes for this run (device views of the arguments in
 * place); avail is what the slot has left after the tensors.
 */
static int run_scratch(const gcd_backend *b, const gcd_op *op, const gcd_arg_place *pl,
                       size_t avail, size_t *scratch, gk_err *err)
{
    return adapter(op)->scratch(op, pl, b->sm_count, avail, scratch, err);
}

/* ---- host tensors, whole or in parts (a merged batch: ops.h) ---------------------------- */

/* Every byte of the argument's host memory lies in pinned (registered) memory. */
static int arg_pinned(gcd_backend *b, const gcd_arg *a, size_t bytes)
{
    if (a->parts == NULL)
        return gcd_pinned_contains(&b->pinned, a->t.data, bytes);
    const size_t row = gcd_arg_row_bytes(a);
    for (int k = 0; k < a->parts->n; k++)
        if (!gcd_pinned_contains(&b->pinned, a->parts->data[k], (size_t)a->parts->rows[k] * row))
            return 0;
    return 1;
}

/*
 * Enqueues the copy between device memory and the argument's pinned host
 * memory.  A merged batch's parts go as batches of copies, one API call per
 * COPY_BATCH parts: a call per part cost about 6 us a part (measured: 44
 * parts of 109 KB took 271 us where their bytes need about 90).
 */
enum { COPY_BATCH = 64 };

static cudaError_t copy_pinned(exec_slot *s, const gcd_arg *a, void *dev, size_t bytes, int to_dev)
{
    if (a->parts == NULL)
        return to_dev ? cudaMemcpyAsync(dev, a->t.data, bytes, cudaMemcpyHostToDevice, s->stream)
                      : cudaMemcpyAsync(a->t.data, dev, bytes, cudaMemcpyDeviceToHost, s->stream);
    const size_t row = gcd_arg_row_bytes(a);
    struct cudaMemcpyAttributes attr = {.srcAccessOrder = cudaMemcpySrcAccessOrderStream};
    size_t attr_at = 0;
    void *dst[COPY_BATCH];
    const void *src[COPY_BATCH];
    size_t len[COPY_BATCH];
    cudaError_t e = cudaSuccess;
    for (int k0 = 0; k0 < a->parts->n && e == cudaSuccess; k0 += COPY_BATCH) {
        size_t n = 0;
        for (int k = k0; k < a->parts->n && n < COPY_BATCH; k++, n++) {
            len[n] = (size_t)a->parts->rows[k] * row;
            dst[n] = to_dev ? dev : a->parts->data[k];
            src[n] = to_dev ? a->parts->data[k] : dev;
            dev = (uint8_t *)dev + len[n];
        }
        e = cudaMemcpyBatchAsync(dst, src, len, n, &attr, &attr_at, 1, s->stream);
    }
    return e;
}

/*
 * Lays the run out in the slot: host tensors get 256-byte-aligned places in
 * the workspace, in slot order, and the kernel's scratch the rest; inline
 * tensors get places in the staging buffer.  Inputs and outputs both start
 * staging at 0: the output copies are ordered after the input copies on the
 * stream, so they never meet.  GK_ENOMEM with the sizes when it does not fit.
 */
static int run_layout(gcd_backend *b, exec_slot *s, gcd_op *op, gcd_arg_place *place,
                      size_t *scratch_off, gk_err *err)
{
    uint64_t ws = 0, staged_in = 0, staged_out = 0;
    for (int i = 0; i < op->nargs; i++) {
        gcd_arg *a = &op->args[i];
        gcd_arg_place *p = &place[i];
        memset(p, 0, sizeof *p);
        p->dev = a->t;
        if (a->t.data == NULL || a->resident)
            continue;
        p->bytes = (size_t)gk_tensor_bytes(&a->t);
        p->copy = 1;
        ws = add_sat(ws, SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
        if (ws <= b->slot_bytes)
            p->dev.data = s->ws + ws;
        ws = add_sat(ws, p->bytes);
        if (!arg_pinned(b, a, p->bytes)) {
            uint64_t *staged = a->output ? &staged_out : &staged_in;
            p->staged = 1;
            *staged = add_sat(*staged, SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
            p->staging_off = (size_t)(*staged < b->staging_bytes ? *staged : 0);
            *staged = add_sat(*staged, p->bytes);
        }
    }
    size_t scratch = 0;
    uint64_t placed = add_sat(ws, SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
    size_t avail = placed < b->slot_bytes ? b->slot_bytes - (size_t)placed : 0;
    int rc = run_scratch(b, op, place, avail, &scratch, err);
    if (rc != 0)
        return rc;
    uint64_t tensors = ws;
    ws = add_sat(add_sat(ws, SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN, scratch);
    if (ws > b->slot_bytes)
        return gk_fail(err, GK_ENOMEM,
                       "needs %" PRIu64 " bytes of device workspace (%" PRIu64 " for its "
                       "tensors in host memory, %zu of kernel scratch) but a request may use "
                       "%zu (--workspace-mb %" PRIu64 " shared by %d execution slots); use "
                       "resident tensors or a smaller batch",
                       ws, tensors, scratch, b->slot_bytes, b->workspace_mb, b->nslots);
    uint64_t staged = staged_in > staged_out ? staged_in : staged_out;
    if (staged > b->staging_bytes)
        return gk_fail(err, GK_ENOMEM,
                       "its inline tensors need %" PRIu64 " bytes of pinned staging but a slot "
                       "has %zu; pass large tensors in a shared-memory region",
                       staged, b->staging_bytes);
    *scratch_off = align_up((size_t)tensors);
    return 0;
}

static gk_cuda_exec run_exec(const gcd_backend *b, const exec_slot *s, size_t scratch_off)
{
    gk_cuda_exec ex = {
        .stream = s->stream,
        .workspace = s->ws + scratch_off,
        .workspace_bytes = b->slot_bytes - scratch_off,
        .sm_count = b->sm_count,
        .blas = s->blas,
    };
    return ex;
}

static int run_kernel(gcd_backend *b, exec_slot *s, gcd_op *op, gcd_arg_place *pl,
                      size_t scratch_off, gk_err *err)
{
    gk_cuda_exec ex = run_exec(b, s, scratch_off);
    return adapter(op)->enqueue(op, pl, &ex, s->graphs, err);
}

/* Enqueues the copy of the op's records into pinned words (the slot's), after its kernels. */
static cudaError_t records_fetch(exec_slot *s, const gcd_op *op, size_t scratch_off, uint64_t *words)
{
    cudaError_t e = cudaSuccess;
    for (int k = 0; k < adapter(op)->records && e == cudaSuccess; k++)
        e = cudaMemcpyAsync(&words[k], s->ws + scratch_off + (size_t)k * GK_CUDA_OBS_RECORD_BYTES,
                            sizeof words[k], cudaMemcpyDeviceToHost, s->stream);
    return e;
}

/* After the stream is synchronised: every record fetched into words says clean. */
static int records_clean(const uint64_t *words, const gcd_op *op)
{
    for (int k = 0; k < adapter(op)->records; k++)
        if (words[k] != UINT64_MAX)
            return 0;
    return 1;
}

/*
 * After the stream is synchronised: the observation kernels' verdict on their
 * data values (GK_ERANGE naming the agent and feature, or the index position).
 */
static int run_status(gcd_backend *b, exec_slot *s, gcd_op *op, gcd_arg_place *pl,
                      size_t scratch_off, gk_err *err)
{
    if (records_clean(s->records, op))
        return 0; /* the common case, without another round trip to the device */
    gk_cuda_exec ex = run_exec(b, s, scratch_off);
    int rc = adapter(op)->status(op, pl, &ex, err); /* records > 0: set (cuda_op_missing) */
    if (rc == GK_EDEVICE)
        (void)slot_recover(b, s, cudaSuccess, err->msg);
    return rc;
}

/* ---- the host's phases of a run (host_phases.h) ------------------------------------------- */

static void cuda_host_phases(gcd_backend *b, gcd_host_phases *out)
{
    gcd_phase_sums_read(&b->phases, out);
}

/* ---- a large encoder forward as a pipeline ------------------------------------------------- */

/* Waits for the pipeline's copy streams, so that the slot's next user finds them idle. */
static void pipe_drain(exec_slot *s)
{
    (void)cudaStreamSynchronize(s->copy_in);
    (void)cudaStreamSynchronize(s->copy_out);
}

/* Fails a pipelined run whose CUDA call returned e. */
static int pipe_fail(gcd_backend *b, exec_slot *s, cudaError_t e, const char *what, gk_err *err)
{
    pipe_drain(s);
    return slot_fail(b, s, e, what, err);
}

/*
 * How many chunks the run goes in: 1 (no pipeline) unless its adapter names
 * batch-major slots of independent rows (pipe_io: an encoder forward), it has
 * at least two PIPE_CHUNK_MIN rows, and those slots are each in device memory
 * already or in one pinned host range (a region), which the copy streams can
 * read and write directly.
 */
static int pipe_chunks(const gcd_op *op, const gcd_arg_place *pl)
{
    const gcd_cuda_op *ad = adapter(op);
    if (ad->pipe_io == NULL)
        return 1;
    for (int i = 0; i < ad->npipe_io; i++) {
        const gcd_arg *a = &op->args[ad->pipe_io[i]];
        if (a->t.data != NULL && (a->parts != NULL || pl[ad->pipe_io[i]].staged))
            return 1;
    }
    const int64_t chunks = op->args[ad->pipe_io[0]].t.shape[0] / PIPE_CHUNK_MIN;
    return chunks < 2 ? 1 : chunks < PIPE_CHUNKS ? (int)chunks : PIPE_CHUNKS;
}

/* Rows [r0, r1) of a batch-major tensor. */
static gk_tensor rows_view(gk_tensor t, int64_t r0, int64_t r1)
{
    const size_t row = t.shape[0] > 0 ? (size_t)gk_tensor_bytes(&t) / (size_t)t.shape[0] : 0;
    t.data = (uint8_t *)t.data + (size_t)r0 * row;
    t.shape[0] = r1 - r0;
    return t;
}

/*
 * Chunk c's observation rows go up on copy_in while chunk c-1 computes on
 * the slot's stream and chunk c-2's outputs come down on copy_out, so the two
 * PCIe directions and the kernels overlap instead of following each other.
 * Rows are independent in the forward (its GEMMs run fixed algorithms), so
 * the bytes are those of the whole batch in one run.  Every chunk's error
 * records are kept; if one is dirty, the whole batch is run again in one
 * piece (every observation is on the device by then) so that the message
 * names the agent by its row in the request.
 *
 * Timings: copy in is the first chunk's upload, copy out what follows the
 * last chunk's kernels, compute everything between: the pipeline's critical
 * path, which is what the request waited for.
 */
static int slot_run_pipelined(gcd_backend *b, exec_slot *s, gcd_op *op, gcd_arg_place *pl,
                              int chunks, size_t scratch_off, gcd_run_clock *clock,
                              gcd_run_timing *timing, gk_err *err)
{
    const int *io = adapter(op)->pipe_io;
    const int nio = adapter(op)->npipe_io, in = io[0];
    const int64_t rows = op->args[in].t.shape[0];
    cudaError_t e;
#define PIPE_CHECK(call, what)                                                                    \
    do {                                                                                          \
        if ((e = (call)) != cudaSuccess)                                                          \
            return pipe_fail(b, s, e, what, err);                                                 \
    } while (0)

    PIPE_CHECK(cudaEventRecord(s->ev[EV_START], s->stream), "cudaEventRecord");
    /* The copies may touch the slot's workspace only after its earlier work. */
    PIPE_CHECK(cudaStreamWaitEvent(s->copy_in, s->ev[EV_START], 0), "cudaStreamWaitEvent");
    for (int c = 0; c < chunks; c++) {
        const int64_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
        gcd_arg_place cpl[GCD_OP_MAX_ARGS];
        memcpy(cpl, pl, sizeof cpl);
        for (int i = 0; i < nio; i++)
            if (op->args[io[i]].t.data != NULL)
                cpl[io[i]].dev = rows_view(pl[io[i]].dev, r0, r1);
        if (pl[in].copy) {
            const gk_tensor host = rows_view(op->args[in].t, r0, r1);
            PIPE_CHECK(cudaMemcpyAsync(cpl[in].dev.data, host.data,
                                       (size_t)gk_tensor_bytes(&host), cudaMemcpyHostToDevice,
                                       s->copy_in),
                       "copy in");
        }
        PIPE_CHECK(cudaEventRecord(s->chunk_in[c], s->copy_in), "cudaEventRecord");
        if (c == 0)
            PIPE_CHECK(cudaEventRecord(s->ev[EV_COPIED_IN], s->copy_in), "cudaEventRecord");
        PIPE_CHECK(cudaStreamWaitEvent(s->stream, s->chunk_in[c], 0), "cudaStreamWaitEvent");
        int rc = run_kernel(b, s, op, cpl, scratch_off, err);
        if (rc != 0) {
            pipe_drain(s);
            return kernel_fail(b, s, rc, err);
        }
        PIPE_CHECK(records_fetch(s, op, scratch_off, s->records + c * GCD_CUDA_RECORDS_MAX),
                   "copying the error records");
        PIPE_CHECK(cudaEventRecord(s->chunk_done[c], s->stream), "cudaEventRecord");
        PIPE_CHECK(cudaStreamWaitEvent(s->copy_out, s->chunk_done[c], 0), "cudaStreamWaitEvent");
        for (int i = 1; i < nio; i++) {
            const int k = io[i];
            if (!pl[k].copy)
                continue;
            const gk_tensor host = rows_view(op->args[k].t, r0, r1);
            PIPE_CHECK(cudaMemcpyAsync(host.data, cpl[k].dev.data, (size_t)gk_tensor_bytes(&host),
                                       cudaMemcpyDeviceToHost, s->copy_out),
                       "copy out");
        }
    }
    PIPE_CHECK(cudaEventRecord(s->ev[EV_COMPUTED], s->stream), "cudaEventRecord");
    PIPE_CHECK(cudaEventRecord(s->ev[EV_COPIED_OUT], s->copy_out), "cudaEventRecord");
    /* The slot's next user starts after the last copy out. */
    PIPE_CHECK(cudaStreamWaitEvent(s->stream, s->ev[EV_COPIED_OUT], 0), "cudaStreamWaitEvent");
    clock->wait = gcd_now_us();
    /* The copies, then the kernels' stream (EV_COMPUTED, read for the timings, is on it). */
    PIPE_CHECK(cudaEventSynchronize(s->ev[EV_COPIED_OUT]), "running the request");
    PIPE_CHECK(cudaStreamSynchronize(s->stream), "running the request");
    clock->done = gcd_now_us();
#undef PIPE_CHECK
    int dirty = 0;
    for (int c = 0; c < chunks; c++)
        dirty |= !records_clean(s->records + c * GCD_CUDA_RECORDS_MAX, op);
    if (dirty) {
        int rc = run_kernel(b, s, op, pl, scratch_off, err);
        if (rc != 0)
            return kernel_fail(b, s, rc, err);
        if ((e = records_fetch(s, op, scratch_off, s->records)) == cudaSuccess)
            e = cudaStreamSynchronize(s->stream);
        if (e != cudaSuccess)
            return slot_fail(b, s, e, "checking the observations", err);
        return run_status(b, s, op, pl, scratch_off, err);
    }
    timing->copy_in_us = elapsed_us(s->ev[EV_START], s->ev[EV_COPIED_IN]);
    timing->compute_us = elapsed_us(s->ev[EV_COPIED_IN], s->ev[EV_COMPUTED]);
    timing->copy_out_us = elapsed_us(s->ev[EV_COMPUTED], s->ev[EV_COPIED_OUT]);
    gcd_phase_sums_add(&b->phases, clock);
    return 0;
}

static int slot_run(gcd_backend *b, exec_slot *s, gcd_op *op, gcd_run_timing *timing,
                    gk_err *err)
{
    gcd_run_clock clock = {.start = gcd_now_us()};
    gcd_arg_place pl[GCD_OP_MAX_ARGS];
    memset(pl, 0, sizeof pl);
    size_t scratch_off = 0;
    int rc = run_layout(b, s, op, pl, &scratch_off, err);
    if (rc != 0)
        return rc;
    clock.enqueue = gcd_now_us();
    const int chunks = pipe_chunks(op, pl);
    if (chunks > 1)
        return slot_run_pipelined(b, s, op, pl, chunks, scratch_off, &clock, timing, err);
    cudaError_t e;
#define RUN_CHECK(call, what)                                                                     \
    do {                                                                                          \
        if ((e = (call)) != cudaSuccess)                                                          \
            return slot_fail(b, s, e, what, err);                                                 \
    } while (0)

    RUN_CHECK(cudaEventRecord(s->ev[EV_START], s->stream), "cudaEventRecord");
    for (int i = 0; i < op->nargs; i++) {
        gcd_arg_place *p = &pl[i];
        if (!p->copy || op->args[i].output)
            continue;
        if (p->staged) {
            gcd_arg_gather(s->staging + p->staging_off, &op->args[i], p->bytes);
            RUN_CHECK(cudaMemcpyAsync(p->dev.data, s->staging + p->staging_off, p->bytes,
                                      cudaMemcpyHostToDevice, s->stream),
                      "copy in");
        } else {
            RUN_CHECK(copy_pinned(s, &op->args[i], p->dev.data, p->bytes, 1), "copy in");
        }
    }
    RUN_CHECK(cudaEventRecord(s->ev[EV_COPIED_IN], s->stream), "cudaEventRecord");
    /* Slot 0 is an input of every operation (gcd_op_table_check): the kernel reads it. */
    if (atomic_load_explicit(&b->fault_armed, memory_order_relaxed) &&
        atomic_exchange(&b->fault_armed, 0))
        pl[0].dev.data = (void *)(uintptr_t)SLOT_ALIGN; /* never mapped */
    if ((rc = run_kernel(b, s, op, pl, scratch_off, err)) != 0)
        return kernel_fail(b, s, rc, err);
    RUN_CHECK(records_fetch(s, op, scratch_off, s->records), "copying the error records");
    RUN_CHECK(cudaEventRecord(s->ev[EV_COMPUTED], s->stream), "cudaEventRecord");
    for (int i = 0; i < op->nargs; i++) {
        gcd_arg_place *p = &pl[i];
        if (!p->copy || !op->args[i].output)
            continue;
        if (p->staged)
            RUN_CHECK(cudaMemcpyAsync(s->staging + p->staging_off, p->dev.data, p->bytes,
                                      cudaMemcpyDeviceToHost, s->stream),
                      "copy out");
        else
            RUN_CHECK(copy_pinned(s, &op->args[i], p->dev.data, p->bytes, 0), "copy out");
    }
    RUN_CHECK(cudaEventRecord(s->ev[EV_COPIED_OUT], s->stream), "cudaEventRecord");
    clock.wait = gcd_now_us();
    RUN_CHECK(cudaEventSynchronize(s->ev[EV_COPIED_OUT]), "running the request");
    clock.done = gcd_now_us();
#undef RUN_CHECK
    if ((rc = run_status(b, s, op, pl, scratch_off, err)) != 0)
        return rc;
    uint64_t t0 = gcd_now_us();
    for (int i = 0; i < op->nargs; i++)
        if (pl[i].copy && pl[i].staged && op->args[i].output)
            gcd_arg_scatter(&op->args[i], s->staging + pl[i].staging_off, pl[i].bytes);
    /* The start event runs as soon as the stream is idle, so copy_in also
     * covers the host's copies into the staging buffer that the uploads wait for. */
    timing->copy_in_us = elapsed_us(s->ev[EV_START], s->ev[EV_COPIED_IN]);
    timing->compute_us = elapsed_us(s->ev[EV_COPIED_IN], s->ev[EV_COMPUTED]);
    timing->copy_out_us = elapsed_us(s->ev[EV_COMPUTED], s->ev[EV_COPIED_OUT]) +
                          (gcd_now_us() - t0);
    gcd_phase_sums_add(&b->phases, &clock);
    return 0;
}

static int cuda_run(gcd_backend *b, gcd_op *op, gcd_run_timing *timing, gk_err *err)
{
    memset(timing, 0, sizeof *timing);
    if (backend_check_lost(b, err) != 0)
        return GK_EDEVICE;
    if (gcd_op_entry_of(op->kind) == NULL)
        return gk_fail(err, GK_EINVAL, "operation %d is not served by the cuda backend",
                       (int)op->kind);
    uint64_t t0 = gcd_now_us();
    exec_slot *s = slot_take(b);
    uint64_t waited = gcd_now_us() - t0;
    cudaSetDevice(b->device);
    int rc = slot_run(b, s, op, timing, err);
    timing->wait_us = waited;
    slot_give(b, s);
    return rc;
}

/* ---- the table ---------------------------------------------------------------------------- */

int gcd_backend_cuda_usable(int device, char *why, size_t whylen)
{
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* A machine without the NVIDIA driver (libcuda) gets cudaErrorInsufficientDriver too. */
        snprintf(why, whylen, "no usable CUDA device: cudaGetDeviceCount: %s (%s%s)",
                 cudaGetErrorString(e), cudaGetErrorName(e),
                 e == cudaErrorInsufficientDriver
                     ? ": no NVIDIA driver is installed, or it is older than this build's CUDA "
                       "runtime"
                     : "");
        return 0;
    }
    if (device < 0 || device >= n) {
        snprintf(why, whylen, "no usable CUDA device: --device %d, and the machine has %d "
                              "(numbered from 0)", device, n);
        return 0;
    }
    return 1;
}

static const gcd_backend_ops cuda_ops = {
    .name = "cuda",
    .open = cuda_open,
    .close = cuda_close,
    .describe = cuda_describe,
    .tensor_alloc = cuda_tensor_alloc,
    .tensor_free = cuda_tensor_free,
    .tensor_write = cuda_tensor_write,
    .tensor_read = cuda_tensor_read,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .run = cuda_run,
    .allocations = cuda_allocations,
    .graphs = cuda_graphs,
    .host_phases = cuda_host_phases,
    .lost = cuda_lost,
};

const gcd_backend_ops *const gcd_backend_cuda = &cuda_ops;
