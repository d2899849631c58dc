/*
 * doorbell.c - completion records in shared memory: a local call whose
 * outputs are written in place ends when the daemon stores its record (seen
 * by polling, or woken from a sleep on it), not when the reply has crossed
 * the socket (proto/doorbell_record.h says why).  The records are the start
 * of the connection's area (area.c); each slot (nng context) keeps one record
 * of the area, and the area's buffer of the same number, for as long as the
 * area serves, so two calls in flight never share one.
 */
#include <sched.h>
#include <string.h>

#include "internal.h"

enum { BELLS_COUNT = SUBMIT_SLOTS };

/* Every output written in place: the reply has nothing the caller needs. */
static bool outputs_in_place(const gpucdc_request *req)
{
    for (int i = 0; i < req->noutputs; i++) {
        gpucd_location w = req->outputs[i].tensor->where;
        if (w != GPUCD_REGION && w != GPUCD_RESIDENT)
            return false;
    }
    return req->noutputs > 0;
}

bool gpucdc_doorbell_wanted(const gpucd_client *c, const gpucdc_request *req)
{
    /* Compute operations only: the daemon refuses a record on any other. */
    return c->local && wire_op_is_compute(req->msg.op_case) && outputs_in_place(req);
}

doorbell_record *gpucdc_doorbell_attach(gpucd_client *c, gpucdc_slot *s, gpucdc_request *req)
{
    const gpucd_region *r = atomic_load_explicit(&c->area.region, memory_order_acquire);
    if (s->bell < 0 || s->bell_area != r) {
        /* None yet, or one of an earlier connection's area: a record of the current area,
         * where a call given up on before a reconnect holds none. */
        pthread_mutex_lock(&c->area.lock);
        r = atomic_load_explicit(&c->area.region, memory_order_relaxed);
        s->bell = c->area.next < BELLS_COUNT ? c->area.next++ : -1;
        s->bell_area = r;
        pthread_mutex_unlock(&c->area.lock);
        if (s->bell < 0)
            return NULL; /* more slots than records: this one waits for its replies */
    }
    gpucd__v1__region_slice__init(&req->doorbell);
    req->doorbell.region_id = r->id;
    req->doorbell.offset = (uint64_t)s->bell * DOORBELL_BYTES;
    req->msg.doorbell = &req->doorbell;
    req->msg.record_only = 1; /* the caller ends on the record: a success needs no reply */
    s->bell_rec = (doorbell_record *)((char *)r->data + (size_t)s->bell * DOORBELL_BYTES);
    return s->bell_rec;
}

int gpucdc_record_wait(const gpucd_client *c, doorbell_record *bell, uint64_t id,
                       uint64_t deadline, int (*stop)(void *arg), void *arg,
                       doorbell_record *rang)
{
    const uint64_t spin_until = gpucdc_now_us() + c->spin_us;
    for (;;) {
        if (atomic_load_explicit(&bell->id, memory_order_seq_cst) == id) {
            memcpy((char *)rang + sizeof rang->id, (const char *)bell + sizeof bell->id,
                   sizeof *rang - sizeof rang->id);
            atomic_init(&rang->id, id);
            return 0;
        }
        int rv = stop(arg);
        if (rv != 0)
            return rv;
        const uint64_t now = gpucdc_now_us();
        if (now < spin_until) {
            sched_yield(); /* a crowded machine's daemon may need this core */
            continue;
        }
        /* Announce the sleep, then look again: either this sees the id (or what stop
         * watches) or the waker sees the announcement (doorbell_record.h). */
        atomic_store_explicit(&bell->sleeper, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&bell->id, memory_order_seq_cst) == id || stop(arg) != 0)
            continue;
        const uint64_t left_ms =
            deadline == UINT64_MAX ? GPUCDC_BELL_NAP_MS : (deadline - now + 999) / 1000;
        doorbell_sleep(bell, left_ms < GPUCDC_BELL_NAP_MS ? (int)left_ms : GPUCDC_BELL_NAP_MS);
    }
}

uint64_t gpucdc_doorbell_region_id(gpucd_client *c)
{
    const gpucd_region *r = atomic_load_explicit(&c->area.region, memory_order_acquire);
    return atomic_load_explicit(&c->area.state, memory_order_acquire) == GPUCDC_AREA_READY && r != NULL
               ? r->id
               : 0;
}
