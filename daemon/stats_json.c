/*
 * stats_json.c - the daemon's counters as one JSON object (the stats operation
 * and GET /stats): the same numbers as /metrics.  Histogram buckets are listed
 * per bucket (not cumulative), against the bounds in "latency_bounds_seconds".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "clock.h"
#include "metrics.h"
#include "quota.h"
#include "request.h"
#include "strbuf.h"

#ifndef GPUCD_VERSION_STRING
#define GPUCD_VERSION_STRING "unknown"
#endif

static uint64_t load(atomic_uint_fast64_t *v) { return atomic_load_explicit(v, memory_order_relaxed); }

static int64_t load_i(atomic_int_fast64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* What exists only once the backend is open: the device, regions, resident tensors, quotas. */
static void json_backend(strbuf *b, gcd_daemon *d)
{
    uint64_t rc, rb, tc, tb;
    gcd_regions_totals(d->regions, &rc, &rb);
    gcd_residents_totals(d->residents, &tc, &tb);
    strbuf_printf(b, "\"backend\":\"");
    strbuf_json_escape(b, d->ops->name);
    strbuf_printf(b, "\",\"device\":\"");
    strbuf_json_escape(b, d->device.name);
    strbuf_printf(b, "\",\"sm_count\":%u,\"device_memory_bytes\":%" PRIu64
                     ",\"workspace_bytes\":%" PRIu64 ",\"device_allocations\":%" PRIu64 ",",
                  d->device.sm_count, d->device.memory_bytes, d->device.workspace_bytes,
                  d->ops->allocations(d->backend));
    uint64_t replays = 0, captures = 0;
    if (d->ops->graphs != NULL)
        d->ops->graphs(d->backend, &replays, &captures);
    strbuf_printf(b, "\"graphs\":{\"replays\":%" PRIu64 ",\"captures\":%" PRIu64 "},", replays,
                  captures);
    if (d->ops->cpu_threads != NULL) {
        unsigned peak, cores;
        d->ops->cpu_threads(d->backend, &peak, &cores);
        strbuf_printf(b, "\"cpu_threads\":{\"peak\":%u,\"cores\":%u},", peak, cores);
    }
    if (d->ops->host_phases != NULL) {
        gcd_host_phases h;
        d->ops->host_phases(d->backend, &h);
        strbuf_printf(b, "\"host_phases\":{\"runs\":%" PRIu64 ",\"prepare_us\":%" PRIu64
                         ",\"enqueue_us\":%" PRIu64 ",\"wait_us\":%" PRIu64
                         ",\"finish_us\":%" PRIu64 "},",
                      h.runs, h.prepare_us, h.enqueue_us, h.wait_us, h.finish_us);
    }
    strbuf_printf(b, "\"regions\":{\"count\":%" PRIu64 ",\"bytes\":%" PRIu64 "},", rc, rb);
    strbuf_printf(b, "\"resident_tensors\":{\"count\":%" PRIu64 ",\"bytes\":%" PRIu64
                     ",\"limit_bytes\":%" PRIu64 "},",
                  tc, tb, d->cfg.resident_mb << 20);
    gcd_quota_json(d->quota, b);
}

static void json_requests(strbuf *b, gcd_stats *s)
{
    strbuf_printf(b, "\"requests\":{");
    int first_kind = 1;
    for (int k = 0; k < GCD_REQ_KIND_COUNT; k++) {
        int first_status = 1;
        for (int st = 0; st < GCD_STATUS_COUNT; st++) {
            uint64_t n = load(&s->requests[k][st]);
            if (n == 0)
                continue;
            if (first_status)
                strbuf_printf(b, "%s\"%s\":{", first_kind ? "" : ",",
                              gcd_req_kind_name((gcd_req_kind)k));
            strbuf_printf(b, "%s\"%s\":%" PRIu64, first_status ? "" : ",",
                          gcd_status_name((gcd_status)st), n);
            first_status = 0;
            first_kind = 0;
        }
        if (!first_status)
            strbuf_printf(b, "}");
    }
    strbuf_printf(b, "},");
}

static void json_latency(strbuf *b, gcd_stats *s)
{
    strbuf_printf(b, "\"latency_bounds_seconds\":[");
    for (int i = 0; i < GCD_HIST_BUCKETS - 1; i++)
        strbuf_printf(b, "%s%g", i ? "," : "", gcd_hist_bounds[i]);
    strbuf_printf(b, "],\"latency_us\":{");
    int first_kind = 1;
    for (int k = 0; k < GCD_REQ_KIND_COUNT; k++) {
        gcd_hist *total = &s->latency[k][GCD_PHASE_TOTAL];
        if (load(&total->count) == 0)
            continue;
        strbuf_printf(b, "%s\"%s\":{", first_kind ? "" : ",", gcd_req_kind_name((gcd_req_kind)k));
        for (int p = 0; p < GCD_PHASE_COUNT; p++) {
            gcd_hist *h = &s->latency[k][p];
            strbuf_printf(b, "%s\"%s\":{\"count\":%" PRIu64 ",\"sum\":%" PRIu64 ",\"buckets\":[",
                          p ? "," : "", gcd_phase_name((gcd_phase)p), load(&h->count),
                          load(&h->sum_us));
            for (int i = 0; i < GCD_HIST_BUCKETS; i++)
                strbuf_printf(b, "%s%" PRIu64, i ? "," : "", load(&h->bucket[i]));
            strbuf_printf(b, "]}");
        }
        strbuf_printf(b, "}");
        first_kind = 0;
    }
    strbuf_printf(b, "}");
}

char *gcd_stats_json(gcd_daemon *d)
{
    gcd_stats *s = &d->stats;
    strbuf b;
    strbuf_init(&b, 4096);
    strbuf_printf(&b, "{\"version\":\"%s\",\"uptime_seconds\":%.3f,\"ready\":%s,\"draining\":%s,",
                  GPUCD_VERSION_STRING, (double)(gcd_now_us() - s->start_us) * 1e-6,
                  atomic_load(&d->ready) ? "true" : "false",
                  atomic_load(&d->draining) ? "true" : "false");
    if (gcd_daemon_opened(d))
        json_backend(&b, d);
#define JSON_GAUGE(field) strbuf_printf(&b, "\"" #field "\":%" PRId64 ",", load_i(&s->field));
#define JSON_COUNTER(field) strbuf_printf(&b, "\"" #field "\":%" PRIu64 ",", load(&s->field));
#define JSON_NUMBER(field, kind, metric, help) JSON_##kind(field)
    GCD_STATS_NUMBERS(JSON_NUMBER)
#undef JSON_NUMBER
#undef JSON_COUNTER
#undef JSON_GAUGE
    strbuf_printf(&b, "\"spin_us\":%" PRIu64 ",", d->cfg.spin_us);
    if (d->cpu_latency.held)
        strbuf_printf(&b, "\"cpu_latency_us\":%" PRId64 ",", d->cpu_latency.us);
    else
        strbuf_printf(&b, "\"cpu_latency_us\":null,");
    json_requests(&b, s);
    json_latency(&b, s);
    strbuf_printf(&b, "}");
    return strbuf_finish(&b, NULL);
}
