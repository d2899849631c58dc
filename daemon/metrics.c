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
#include "multi_gpu.h"
#include "process.h"
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

/*
 * A histogram's samples from per-bucket counts: the bucket lines (cumulative), the sum and the
 * count, labelled op="op" when op is not NULL.
 */
static void histogram(strbuf *b, const char *name, const char *op, const uint64_t *bucket,
                      uint64_t sum_us)
{
    char labels[96] = "", braces[96] = "";
    if (op != NULL) {
        snprintf(labels, sizeof labels, "op=\"%s\",", op);
        snprintf(braces, sizeof braces, "{op=\"%s\"}", op);
    }
    uint64_t cum = 0;
    for (int i = 0; i < GCD_HIST_BUCKETS; i++) {
        cum += bucket[i];
        if (i < GCD_HIST_BUCKETS - 1)
            strbuf_printf(b, "%s_bucket{%sle=\"%g\"} %" PRIu64 "\n", name, labels,
                          gcd_hist_bounds[i], cum);
        else
            strbuf_printf(b, "%s_bucket{%sle=\"+Inf\"} %" PRIu64 "\n", name, labels, cum);
    }
    strbuf_printf(b, "%s_sum%s %.6f\n", name, braces, (double)sum_us * 1e-6);
    strbuf_printf(b, "%s_count%s %" PRIu64 "\n", name, braces, cum);
}

/* Adds h's per-bucket counts and sum to bucket and *sum_us. */
static void hist_add(gcd_hist *h, uint64_t *bucket, uint64_t *sum_us)
{
    for (int i = 0; i < GCD_HIST_BUCKETS; i++)
        bucket[i] += load_u(&h->bucket[i]);
    *sum_us += load_u(&h->sum_us);
}

/* Whether kind k gets latency metrics: a compute operation asked for at least once. */
static int timed(gcd_stats *s, int k)
{
    return gcd_req_kind_computes((gcd_req_kind)k) &&
           load_u(&s->latency[k][GCD_PHASE_TOTAL].count) != 0;
}

/*
 * Latency of compute requests only (control requests take microseconds, and their histograms
 * were most of the document): the whole request by operation, the queue wait of all operations
 * together (saturation), and each phase's time as a counter by operation (for its mean).
 * Operations never asked for are left out: a histogram is 22 lines even of zeros.
 */
static void durations(strbuf *b, gcd_stats *s)
{
    family(b, "gpucd_request_duration_seconds", "histogram",
           "Time of answered compute requests, received to reply built, by operation.");
    uint64_t queue[GCD_HIST_BUCKETS] = {0}, queue_sum = 0;
    for (int k = 0; k < GCD_REQ_KIND_COUNT; k++) {
        if (!timed(s, k))
            continue;
        uint64_t bucket[GCD_HIST_BUCKETS] = {0}, sum = 0;
        hist_add(&s->latency[k][GCD_PHASE_TOTAL], bucket, &sum);
        histogram(b, "gpucd_request_duration_seconds", gcd_req_kind_name((gcd_req_kind)k), bucket,
                  sum);
        hist_add(&s->latency[k][GCD_PHASE_QUEUE], queue, &queue_sum);
    }
    family(b, "gpucd_request_queue_seconds", "histogram",
           "Time answered compute requests waited for a worker (received to started), all "
           "operations together.");
    histogram(b, "gpucd_request_queue_seconds", NULL, queue, queue_sum);
    family(b, "gpucd_request_phase_seconds_total", "counter",
           "Time answered compute requests spent in each phase, by operation: queue (received to "
           "started), copy_in, compute, copy_out; over gpucd_request_duration_seconds_count, "
           "each phase's mean.");
    for (int k = 0; k < GCD_REQ_KIND_COUNT; k++) {
        if (!timed(s, k))
            continue;
        for (int p = 0; p < GCD_PHASE_TOTAL; p++)
            strbuf_printf(b, "gpucd_request_phase_seconds_total{op=\"%s\",phase=\"%s\"} %.6f\n",
                          gcd_req_kind_name((gcd_req_kind)k), gcd_phase_name((gcd_phase)p),
                          (double)load_u(&s->latency[k][p].sum_us) * 1e-6);
    }
}

/* The process_* metrics of every Prometheus client library, under their names and help. */
static void process(strbuf *b)
{
    gcd_process p;
    if (gcd_process_read(&p) != 0)
        return;
    single_f(b, "process_cpu_seconds_total", "counter",
             "Total user and system CPU time spent in seconds.", p.cpu_seconds);
    single_u(b, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
             p.resident_bytes);
    single_u(b, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
             p.virtual_bytes);
    single_u(b, "process_open_fds", "gauge", "Number of open file descriptors.", p.open_fds);
    single_u(b, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
             p.max_fds);
    single_f(b, "process_start_time_seconds", "gauge",
             "Start time of the process since unix epoch in seconds.", p.start_time);
}

static void build_and_state(strbuf *b, gcd_daemon *d, int opened)
{
    family(b, "gpucd_build_info", "gauge", "Always 1; the labels say what is running.");
    strbuf_printf(b, "gpucd_build_info{version=\"%s\",backend=\"", GPUCD_VERSION_STRING);
    strbuf_label_escape(b, opened ? d->ops->name : "");
    strbuf_printf(b, "\",multi_gpu=\"");
    strbuf_label_escape(b, gcd_multi_gpu);
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
}

static void load_and_traffic(strbuf *b, gcd_stats *s)
{
#define METRIC_GAUGE(field, metric, help) single_i(b, metric, "gauge", help, load_i(&s->field));
#define METRIC_COUNTER(field, metric, help)                                                       \
    single_u(b, metric, "counter", help, load_u(&s->field));
#define METRIC(field, kind, metric, help) METRIC_##kind(field, metric, help)
    GCD_STATS_NUMBERS(METRIC)
#undef METRIC
#undef METRIC_COUNTER
#undef METRIC_GAUGE
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
                          gcd_quota_kind_name((gcd_quota_kind)k), scope ? "peer" : "connection",
                          refused[k][scope]);
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
    if (d->cpu_latency.held) /* absent when none is held: no value stands for "none" */
        single_f(b, "gpucd_cpu_latency_limit_seconds", "gauge",
                 "The CPU wake-up latency --cpu-latency-us holds through /dev/cpu_dma_latency.",
                 (double)d->cpu_latency.us * 1e-6);
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
    process(&b);
    return strbuf_finish(&b, len);
}
