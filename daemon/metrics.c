/*
 * metrics.c - see metrics.h.  gcd_stats holds per-bucket (not cumulative)
 * histogram counts; the exposition format wants cumulative buckets, so they
 * are summed here, and the +Inf bucket and _count are that same sum so that
 * one scrape is always self-consistent while requests keep arriving.
 */
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "clock.h"
#include "device_usage.h"
#include "quota.h"
#include "strbuf.h"

#ifndef GPUCD_VERSION_STRING
#define GPUCD_VERSION_STRING "unknown"
#endif

int gcd_daemon_opened(gcd_daemon *d)
{
    return atomic_load(&d->ready) || atomic_load(&d->draining);
}

static uint64_t load_u(atomic_uint_fast64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

static int64_t load_i(atomic_int_fast64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

static void family(strbuf *b, const char *name, const char *type, const char *help)
{
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A family of one sample without labels. */
static void single_u(strbuf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    family(b, name, type, help);
    strbuf_printf(b, "%s %" PRIu64 "\n", name, v);
}

static void single_i(strbuf *b, const char *name, const char *type, const char *help, int64_t v)
{
    family(b, name, type, help);
    strbuf_printf(b, "%s %" PRId64 "\n", name, v);
}

static void single_f(strbuf *b, const char *name, const char *type, const char *help, double v)
{
    family(b, name, type, help);
    strbuf_printf(b, "%s %.6f\n", name, v);
}

static void requests_total(strbuf *b, gcd_stats *s)
{
    family(b, "gpucd_requests_total", "counter",
           "Requests answered, by operation and reply status (the schema's Status names).");
    for (int k = 0; k < GCD_REQ_KIND_COUNT; k++)
        for (int st = 0; st < GCD_STATUS_COUNT; st++) {
            uint64_t n = load_u(&s->requests[k][st]);
            /* OK is always present so that rates exist before the first request
             * (but an undecodable request is never OK). */
            if (n == 0 && (st != GCD_OK || k == GCD_REQ_INVALID))
                continue;
            strbuf_printf(b, "gpucd_requests_total{op=\"%s\",status=\"%s\"} %" PRIu64 "\n",
                          gcd_req_kind_name((gcd_req_kind)k), gcd_status_name((gcd_status)st), n);
        }
}

static void durations(strbuf *b, gcd_stats *s)
{
    family(b, "gpucd_request_duration_seconds", "histogram",
           "Time of answered requests by operation and phase: queue (received to started), "
           "copy_in, compute, copy_out, and total (received to reply built).");
    for (int k = 0; k < GCD_REQ_KIND_COUNT; k++) {
        if (load_u(&s->latency[k][GCD_PHASE_TOTAL].count) == 0)
            continue; /* operations never asked for would be ~100 lines of zeros each */
        const char *op = gcd_req_kind_name((gcd_req_kind)k);
        for (int p = 0; p < GCD_PHASE_COUNT; p++) {
            gcd_hist *h = &s->latency[k][p];
            const char *phase = gcd_phase_name((gcd_phase)p);
            uint64_t cum = 0;
            for (int i = 0; i < GCD_HIST_BUCKETS; i++) {
                cum += load_u(&h->bucket[i]);
                if (i < GCD_HIST_BUCKETS - 1)
                    strbuf_printf(b, "gpucd_request_duration_seconds_bucket{op=\"%s\",phase=\"%s\","
                                     "le=\"%g\"} %" PRIu64 "\n",
                                  op, phase, gcd_hist_bounds[i], cum);
                else
                    strbuf_printf(b, "gpucd_request_duration_seconds_bucket{op=\"%s\",phase=\"%s\","
                                     "le=\"+Inf\"} %" PRIu64 "\n",
                                  op, phase, cum);
            }
            strbuf_printf(b, "gpucd_request_duration_seconds_sum{op=\"%s\",phase=\"%s\"} %.6f\n",
                          op, phase, (double)load_u(&h->sum_us) * 1e-6);
            strbuf_printf(b, "gpucd_request_duration_seconds_count{op=\"%s\",phase=\"%s\"} %" PRIu64
                             "\n",
                          op, phase, cum);
        }
    }
}

/*
 * The wall-clock start, derived once from the first scrape and kept, so that
 * it never jitters between scrapes (changes() of it counts restarts).
 */
static double start_time_seconds(double uptime)
{
    static atomic_uint_fast64_t start_ms;
    uint64_t ms = atomic_load(&start_ms);
    if (ms == 0) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        ms = (uint64_t)((double)now.tv_sec * 1e3 + (double)now.tv_nsec * 1e-6 - uptime * 1e3);
        uint_fast64_t expected = 0;
        if (!atomic_compare_exchange_strong(&start_ms, &expected, ms))
            ms = expected;
    }
    return (double)ms * 1e-3;
}

static void build_and_state(strbuf *b, gcd_daemon *d, int opened)
{
    family(b, "gpucd_build_info", "gauge", "Always 1; the labels say what is running.");
    strbuf_printf(b, "gpucd_build_info{version=\"%s\",backend=\"", GPUCD_VERSION_STRING);
    strbuf_label_escape(b, opened ? d->ops->name : "");
    strbuf_printf(b, "\"} 1\n");
    if (opened) {
        family(b, "gpucd_device_info", "gauge", "Always 1; the device the backend serves on.");
        strbuf_printf(b, "gpucd_device_info{backend=\"");
        strbuf_label_escape(b, d->ops->name);
        strbuf_printf(b, "\",device=\"%d\",name=\"", d->cfg.device);
        strbuf_label_escape(b, d->device.name);
        strbuf_printf(b, "\",sm_count=\"%u\"} 1\n", d->device.sm_count);
    }
    single_u(b, "gpucd_ready", "gauge",
             "1 when the kernels are warm, the buffers allocated and the daemon not draining.",
             (uint64_t)(atomic_load(&d->ready) != 0));
    single_u(b, "gpucd_draining", "gauge", "1 while the daemon drains after SIGTERM or SIGINT.",
             (uint64_t)(atomic_load(&d->draining) != 0));
    double up = (double)(gcd_now_us() - d->stats.start_us) * 1e-6;
    single_f(b, "gpucd_uptime_seconds", "gauge", "Seconds since the daemon started.", up);
    single_f(b, "gpucd_start_time_seconds", "gauge", "When the daemon started, in Unix seconds.",
             start_time_seconds(up));
}

static void load_and_traffic(strbuf *b, gcd_stats *s)
{
    single_i(b, "gpucd_requests_in_flight", "gauge", "Requests being worked on by a worker.",
             load_i(&s->inflight));
    single_i(b, "gpucd_requests_queued", "gauge", "Requests received and waiting for a worker.",
             load_i(&s->queued));
    single_i(b, "gpucd_clients_connected", "gauge", "Connections open to the request socket.",
             load_i(&s->clients));
    single_u(b, "gpucd_received_bytes_total", "counter", "Bytes of request messages received.",
             load_u(&s->bytes_in));
    single_u(b, "gpucd_sent_bytes_total", "counter", "Bytes of reply messages sent.",
             load_u(&s->bytes_out));
    single_u(b, "gpucd_batches_total", "counter",
             "Batches the backend ran (each compute request is one).", load_u(&s->batches));
    single_u(b, "gpucd_batch_rows_total", "counter",
             "Rows of all batches run (rows / batches is the mean batch size).",
             load_u(&s->batch_rows));
    single_u(b, "gpucd_doorbells_total", "counter",
             "Completion records written into clients' shared memory.", load_u(&s->doorbells));
    single_u(b, "gpucd_record_answers_total", "counter",
             "Requests answered by their completion record alone, with no reply sent.",
             load_u(&s->record_answers));
    single_i(b, "gpucd_submit_queues", "gauge",
             "Submission queues open (local clients' requests through shared memory).",
             load_i(&s->submit_queues));
    single_u(b, "gpucd_submit_taken_total", "counter",
             "Requests taken from submission queues.", load_u(&s->submit_taken));
    single_u(b, "gpucd_submit_rejected_total", "counter",
             "Submission queue entries refused (a slot or length out of range).",
             load_u(&s->submit_rejected));
    single_u(b, "gpucd_submit_sleeps_total", "counter",
             "Times the submission queue poller went to sleep.", load_u(&s->submit_sleeps));
    single_u(b, "gpucd_listener_restarts_total", "counter",
             "Listeners found no longer accepting connections and re-created.",
             load_u(&s->listener_restarts));
}

static void memory(strbuf *b, gcd_daemon *d)
{
    uint64_t rc, rb, tc, tb;
    gcd_regions_totals(d->regions, &rc, &rb);
    gcd_residents_totals(d->residents, &tc, &tb);
    single_u(b, "gpucd_regions", "gauge", "Shared-memory regions mapped, all clients.", rc);
    single_u(b, "gpucd_region_bytes", "gauge", "Bytes of the shared-memory regions mapped.", rb);
    single_u(b, "gpucd_resident_tensors", "gauge", "Resident tensors held, all clients.", tc);
    single_u(b, "gpucd_resident_tensor_bytes", "gauge", "Bytes of the resident tensors held.", tb);
    single_u(b, "gpucd_resident_limit_bytes", "gauge",
             "Most bytes resident tensors may hold (--resident-mb).", d->cfg.resident_mb << 20);
    uint64_t refused[GCD_QUOTA_KINDS][2], refused_connections;
    gcd_quota_refusals(d->quota, refused, &refused_connections);
    family(b, "gpucd_quota_refusals_total", "counter",
           "Requests refused RESOURCE_EXHAUSTED by a quota of their connection or peer.");
    for (int k = 0; k < GCD_QUOTA_KINDS; k++)
        for (int scope = 0; scope < 2; scope++)
            strbuf_printf(b, "gpucd_quota_refusals_total{quota=\"%s\",per=\"%s\"} %" PRIu64 "\n",
                          gcd_quota_kind_name((gcd_quota_kind)k), scope ? "peer" : "connection", refused[k][scope]);
    single_u(b, "gpucd_connections_refused_total", "counter",
             "Connections closed as they came: past --max-connections or --peer-connections.",
             refused_connections);
    single_u(b, "gpucd_workspace_bytes", "gauge",
             "Device workspace the backend preallocated at start.", d->device.workspace_bytes);
    single_u(b, "gpucd_device_allocations_total", "counter",
             "Device memory allocations since start; constant after warm-up.",
             d->ops->allocations(d->backend));
    if (d->ops->graphs != NULL) {
        uint64_t replays, captures;
        d->ops->graphs(d->backend, &replays, &captures);
        single_u(b, "gpucd_graph_replays_total", "counter",
                 "Requests whose kernels ran as one replayed CUDA graph.", replays);
        single_u(b, "gpucd_graph_captures_total", "counter",
                 "CUDA graphs captured (a request shape seen a second time).", captures);
    }
    if (d->ops->host_phases != NULL) {
        gcd_host_phases h;
        d->ops->host_phases(d->backend, &h);
        single_u(b, "gpucd_host_phase_runs_total", "counter",
                 "Successful backend runs whose host phases are counted below.", h.runs);
        family(b, "gpucd_host_phase_seconds_total", "counter",
               "Time the threads running requests spent around the device's work: prepare (slot "
               "to first enqueue), enqueue, wait (for the device), finish (records, timings).");
        const struct {
            const char *name;
            uint64_t us;
        } phase[] = {{"prepare", h.prepare_us},
                     {"enqueue", h.enqueue_us},
                     {"wait", h.wait_us},
                     {"finish", h.finish_us}};
        for (size_t i = 0; i < sizeof phase / sizeof phase[0]; i++)
            strbuf_printf(b, "gpucd_host_phase_seconds_total{phase=\"%s\"} %.6f\n", phase[i].name,
                          (double)phase[i].us * 1e-6);
    }
    single_i(b, "gpucd_cpu_latency_held_microseconds", "gauge",
             "The CPU wake-up latency --cpu-latency-us holds through /dev/cpu_dma_latency; -1: none.",
             d->cpu_latency.held ? d->cpu_latency.us : -1);
    if (d->ops->lost != NULL)
        single_u(b, "gpucd_device_lost", "gauge",
                 "1 once the device failed for good; the daemon then drains and exits 3.",
                 (uint64_t)(d->ops->lost(d->backend) != NULL));
    gcd_device_usage u;
    if (gcd_device_usage_get(d->ops->name, d->cfg.device, &u) == 0) {
        single_u(b, "gpucd_device_memory_total_bytes", "gauge", "Device memory, from NVML.",
                 u.memory_total_bytes);
        single_u(b, "gpucd_device_memory_used_bytes", "gauge",
                 "Device memory in use by every process, from NVML.", u.memory_used_bytes);
        single_f(b, "gpucd_device_utilization_ratio", "gauge",
                 "Fraction of the last NVML sample period in which a kernel ran.", u.utilization);
    } else {
        /* What the backend reported at start; no live use is known, so none is given. */
        single_u(b, "gpucd_device_memory_total_bytes", "gauge",
                 "Memory of the backend's device as it reported it at start.",
                 d->device.memory_bytes);
    }
}

char *gcd_metrics_text(gcd_daemon *d, size_t *len)
{
    strbuf b;
    strbuf_init(&b, 16384);
    int opened = gcd_daemon_opened(d);
    build_and_state(&b, d, opened);
    load_and_traffic(&b, &d->stats);
    if (opened)
        memory(&b, d);
    requests_total(&b, &d->stats);
    durations(&b, &d->stats);
    return strbuf_finish(&b, len);
}
