/* stats_json.c - the daemon's counters as one JSON object (the stats operation and /stats). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "clock.h"
#include "request.h"

/* A growing string; on allocation failure it stays failed and the result is NULL. */
typedef struct strbuf {
    char *s;
    size_t len, cap;
    int failed;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(strbuf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *s = realloc(b->s, cap);
        if (s == NULL) {
            b->failed = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

static uint64_t load(atomic_uint_fast64_t *v) { return atomic_load_explicit(v, memory_order_relaxed); }

char *gcd_stats_json(gcd_daemon *d)
{
    gcd_stats *s = &d->stats;
    strbuf b = {.s = malloc(4096), .cap = 4096};
    if (b.s == NULL)
        return NULL;
    b.s[0] = '\0';
    uint64_t rc, rb, tc, tb;
    gcd_regions_totals(d->regions, &rc, &rb);
    gcd_residents_totals(d->residents, &tc, &tb);
    sb_printf(&b, "{\"uptime_seconds\":%.3f,\"ready\":%s,\"draining\":%s,\"backend\":\"%s\","
                  "\"device\":\"%s\",\"device_allocations\":%" PRIu64 ",",
              (double)(gcd_now_us() - s->start_us) * 1e-6,
              atomic_load(&d->ready) ? "true" : "false",
              atomic_load(&d->draining) ? "true" : "false", d->ops->name, d->device.name,
              d->ops->allocations(d->backend));
    sb_printf(&b, "\"inflight\":%" PRIdFAST64 ",\"queued\":%" PRIdFAST64 ",\"clients\":%" PRIdFAST64
                  ",\"bytes_in\":%" PRIu64 ",\"bytes_out\":%" PRIu64 ",",
              atomic_load(&s->inflight), atomic_load(&s->queued), atomic_load(&s->clients),
              load(&s->bytes_in), load(&s->bytes_out));
    sb_printf(&b, "\"batches\":%" PRIu64 ",\"batch_rows\":%" PRIu64 ",", load(&s->batches),
              load(&s->batch_rows));
    sb_printf(&b, "\"regions\":{\"count\":%" PRIu64 ",\"bytes\":%" PRIu64 "},", rc, rb);
    sb_printf(&b, "\"resident_tensors\":{\"count\":%" PRIu64 ",\"bytes\":%" PRIu64 "},", tc, tb);
    sb_printf(&b, "\"requests\":{");
    int first_kind = 1;
    for (int k = 0; k < GCD_REQ_KIND_COUNT; k++) {
        int first_status = 1;
        for (int st = 0; st < GCD_STATUS_COUNT; st++) {
            uint64_t n = load(&s->requests[k][st]);
            if (n == 0)
                continue;
            if (first_status)
                sb_printf(&b, "%s\"%s\":{", first_kind ? "" : ",",
                          gcd_req_kind_name((gcd_req_kind)k));
            sb_printf(&b, "%s\"%s\":%" PRIu64, first_status ? "" : ",",
                      gcd_status_name((gcd_status)st), n);
            first_status = 0;
            first_kind = 0;
        }
        if (!first_status)
            sb_printf(&b, "}");
    }
    sb_printf(&b, "},\"latency_us\":{");
    first_kind = 1;
    for (int k = 0; k < GCD_REQ_KIND_COUNT; k++) {
        gcd_hist *total = &s->latency[k][GCD_PHASE_TOTAL];
        if (load(&total->count) == 0)
            continue;
        sb_printf(&b, "%s\"%s\":{", first_kind ? "" : ",", gcd_req_kind_name((gcd_req_kind)k));
        for (int p = 0; p < GCD_PHASE_COUNT; p++) {
            gcd_hist *h = &s->latency[k][p];
            sb_printf(&b, "%s\"%s\":{\"count\":%" PRIu64 ",\"sum\":%" PRIu64 "}", p ? "," : "",
                      gcd_phase_name((gcd_phase)p), load(&h->count), load(&h->sum_us));
        }
        sb_printf(&b, "}");
        first_kind = 0;
    }
    sb_printf(&b, "}}");
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
