/* host_phases.c - see host_phases.h. */
#include "host_phases.h"

#include "clock.h"

void gcd_phase_sums_add(gcd_phase_sums *s, const gcd_run_clock *c)
{
    const uint64_t end = gcd_now_us();
    atomic_fetch_add_explicit(&s->runs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->prepare_us, c->enqueue - c->start, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->enqueue_us, c->wait - c->enqueue, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->wait_us, c->done - c->wait, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->finish_us, end - c->done, memory_order_relaxed);
}

void gcd_phase_sums_read(gcd_phase_sums *s, gcd_host_phases *out)
{
    out->runs = atomic_load_explicit(&s->runs, memory_order_relaxed);
    out->prepare_us = atomic_load_explicit(&s->prepare_us, memory_order_relaxed);
    out->enqueue_us = atomic_load_explicit(&s->enqueue_us, memory_order_relaxed);
    out->wait_us = atomic_load_explicit(&s->wait_us, memory_order_relaxed);
    out->finish_us = atomic_load_explicit(&s->finish_us, memory_order_relaxed);
}
