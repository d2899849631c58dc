/* stats.c - counters and histograms; see stats.h. */
#include "stats.h"

#include <string.h>

#include "clock.h"

static const struct {
    const char *name;
    int computes;
} req_kinds[GCD_REQ_KIND_COUNT] = {
#define GCD_REQ_CONTROL_ROW(id, name) [GCD_REQ_##id] = {name, 0},
#define GCD_REQ_COMPUTE_ROW(kind, name, wire, share)                                              \
    GCD_OP_IF_FIRST(share, [GCD_REQ_##wire] = {name, 1}, )
    GCD_REQ_CONTROL_KINDS(GCD_REQ_CONTROL_ROW)
    GCD_OP_MAP(GCD_REQ_COMPUTE_ROW)
#undef GCD_REQ_CONTROL_ROW
#undef GCD_REQ_COMPUTE_ROW
    [GCD_REQ_INVALID] = {"invalid", 0},
};

static const char *const phase_names[GCD_PHASE_COUNT] = {
    "queue", "copy_in", "compute", "copy_out", "total",
};

/* 10 us to 10 s, three buckets a decade: the range from a ping to a large loss. */
const double gcd_hist_bounds[GCD_HIST_BUCKETS - 1] = {
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
    2.5e-2, 5e-2, 1e-1, 2.5e-1, 5e-1, 1.0, 2.5, 5.0, 10.0,
};

const char *gcd_req_kind_name(gcd_req_kind k)
{
    return (unsigned)k < GCD_REQ_KIND_COUNT ? req_kinds[k].name : "invalid";
}

int gcd_req_kind_computes(gcd_req_kind k)
{
    return (unsigned)k < GCD_REQ_KIND_COUNT && req_kinds[k].computes;
}

const char *gcd_phase_name(gcd_phase p)
{
    return (unsigned)p < GCD_PHASE_COUNT ? phase_names[p] : "invalid";
}

void gcd_stats_init(gcd_stats *s)
{
    memset(s, 0, sizeof *s);
    s->start_us = gcd_now_us();
}

void gcd_stats_observe(gcd_stats *s, gcd_req_kind k, gcd_phase p, uint64_t us)
{
    gcd_hist *h = &s->latency[k][p];
    double sec = (double)us * 1e-6;
    int b = 0;
    while (b < GCD_HIST_BUCKETS - 1 && sec > gcd_hist_bounds[b])
        b++;
    atomic_fetch_add_explicit(&h->bucket[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

void gcd_stats_count(gcd_stats *s, gcd_req_kind k, gcd_status status)
{
    unsigned st = (unsigned)status < GCD_STATUS_COUNT ? (unsigned)status : GCD_INTERNAL;
    atomic_fetch_add_explicit(&s->requests[k][st], 1, memory_order_relaxed);
}
