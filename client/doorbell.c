/*
 * doorbell.c - completion records in shared memory: a local call whose
 * outputs are written in place ends when the daemon stores its record (seen
 * by polling, or woken from a sleep on it), not when the reply has crossed
 * the socket (proto/doorbell_record.h says why).  The records are the start
 * of the client's submission area (proto/submit_queue.h), registered as a
 * region at the first call that can use it (again after a reconnect: the
 * daemon may be a new one); each slot (nng context) keeps one record of the
 * area, and the area's buffer of the same number, for as long as the area
 * serves, so two calls in flight never share one.
 */
#include <sched.h>
#include <string.h>

#include "internal.h"

enum { BELLS_COUNT = SUBMIT_SLOTS };
enum { BELLS_UNTRIED = 0, BELLS_READY = 1, BELLS_UNAVAILABLE = -1 };

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

/*
 * Whether the records exist on the current connection's daemon: made at the
 * first call that can use them, and made anew after a reconnect (the daemon
 * may have restarted and know no region of ours; the earlier records stay
 * mapped until close, since a caller may still be reading one).  A failure
 * leaves calls on their replies until the next connection.
 */
static bool bells_ready(gpucd_client *c)
{
    unsigned conn = atomic_load_explicit(&c->connections, memory_order_acquire);
    /* connection first: its store comes after the state's */
    if (atomic_load_explicit(&c->bells.connection, memory_order_acquire) == conn) {
        const int state = atomic_load_explicit(&c->bells.state, memory_order_acquire);
        if (state != BELLS_UNTRIED)
            return state == BELLS_READY;
    }
    pthread_mutex_lock(&c->bells.lock);
    /* Again under the lock: a reconnect may have come while this thread waited for it, and an
     * area stored under an older number would be taken for the current connection's. */
    conn = atomic_load_explicit(&c->connections, memory_order_acquire);
    if (atomic_load_explicit(&c->bells.state, memory_order_relaxed) == BELLS_UNTRIED ||
        atomic_load_explicit(&c->bells.connection, memory_order_relaxed) != conn) {
        gpucd_region *r;
        /* Its own error message must not outlive this: the call that made it goes on. */
        int rv = gpucd_region_create(c, sizeof(submit_area), &r);
        if (rv == 0)
            gpucdc_submit_open(c, r); /* without a queue, calls use the socket */
        gpucdc_clear_error();
        if (rv == 0) {
            gpucd_region *old = atomic_load_explicit(&c->bells.region, memory_order_relaxed);
            if (old != NULL) {
                old->next_retired = c->bells.retired;
                c->bells.retired = old;
            }
            atomic_store_explicit(&c->bells.region, r, memory_order_release);
            c->bells.next = 0; /* every record of the new area is free */
        }
        atomic_store_explicit(&c->bells.state, rv == 0 ? BELLS_READY : BELLS_UNAVAILABLE,
                              memory_order_release);
        atomic_store_explicit(&c->bells.connection, conn, memory_order_release);
    }
    const int state = atomic_load_explicit(&c->bells.state, memory_order_relaxed);
    pthread_mutex_unlock(&c->bells.lock);
    return state == BELLS_READY;
}

doorbell_record *gpucdc_doorbell_attach(gpucd_client *c, gpucdc_slot *s, gpucdc_request *req)
{
    s->bell_rec = NULL;
    /* Compute operations only: the daemon refuses a record on any other. */
    if (!c->local || !wire_op_is_compute(req->msg.op_case) || !outputs_in_place(req) ||
        !bells_ready(c))
        return NULL;
    const gpucd_region *r = atomic_load_explicit(&c->bells.region, memory_order_acquire);
    if (s->bell < 0 || s->bell_area != r) {
        /* None yet, or one of an earlier connection's area: a record of the current area,
         * where a call given up on before a reconnect holds none. */
        pthread_mutex_lock(&c->bells.lock);
        r = atomic_load_explicit(&c->bells.region, memory_order_relaxed);
        s->bell = c->bells.next < BELLS_COUNT ? c->bells.next++ : -1;
        s->bell_area = r;
        pthread_mutex_unlock(&c->bells.lock);
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
    const gpucd_region *r = atomic_load_explicit(&c->bells.region, memory_order_acquire);
    return atomic_load_explicit(&c->bells.state, memory_order_acquire) == BELLS_READY && r != NULL
               ? r->id
               : 0;
}

void gpucdc_doorbell_close(gpucd_client *c)
{
    gpucd_region *r = atomic_load_explicit(&c->bells.region, memory_order_relaxed);
    if (r != NULL)
        gpucdc_region_forget(r);
    for (r = c->bells.retired; r != NULL;) {
        gpucd_region *next = r->next_retired;
        gpucdc_region_forget(r);
        r = next;
    }
    pthread_mutex_destroy(&c->bells.lock);
}
