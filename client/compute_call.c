/*
 * compute_call.c - a compute operation's call and its route.  A local call
 * whose outputs are all written in place names its slot's completion record
 * (doorbell.c) in the connection's area (area.c, made before the call takes
 * its slot) and ends on it: queued in shared memory when the submission queue
 * can take it (submit.c), else sent on the socket.  Every other call is
 * answered by its reply (call.c), as is any failure.
 */
#include <string.h>

#include "internal.h"

/* How a compute call travels, chosen once per call. */
typedef enum route {
    ROUTE_REPLY,  /* the socket; the reply answers */
    ROUTE_RECORD, /* the socket; the record answers a success, the reply a failure */
    ROUTE_QUEUE,  /* the submission queue; the record answers, a failure's reply beside it */
} route;

static route route_choose(const gpucdc_slot *s, const doorbell_record *bell, size_t len,
                          gpucdc_queue_pass *pass)
{
    if (bell == NULL)
        return ROUTE_REPLY;
    return gpucdc_submit_can_take(s, len, pass) ? ROUTE_QUEUE : ROUTE_RECORD;
}

/* The timings of a call that ended on its record: the record has the daemon's. */
static void timings_from_record(gpucd_timings *t, const doorbell_record *b, uint64_t round_trip)
{
    memset(t, 0, sizeof *t);
    t->queue_us = b->queue_us;
    t->copy_in_us = b->copy_in_us;
    t->compute_us = b->compute_us;
    t->copy_out_us = b->copy_out_us;
    t->batch_wait_us = b->batch_wait_us;
    t->total_us = b->total_us;
    t->round_trip_us = round_trip;
}

int gpucdc_compute_call(gpucdc_request *req, gpucd_timings *t)
{
    const uint64_t start = gpucdc_now_us();
    gpucdc_clear_error();
    gpucd_client *c = req->client;
    /* The area before the slot: making it takes calls of its own. */
    const bool records = gpucdc_doorbell_wanted(c, req) && gpucdc_area_ready(c);
    gpucdc_slot *s;
    int rv = gpucdc_slot_acquire(c, &s);
    if (rv < 0)
        return rv;
    doorbell_record *bell = records ? gpucdc_doorbell_attach(c, s, req) : NULL;
    nng_msg *msg, *reply;
    rv = gpucdc_request_pack(req, &msg);
    if (rv < 0) {
        gpucdc_slot_release(s);
        return rv;
    }
    gpucdc_queue_pass pass;
    doorbell_record rang;
    gpucdc_answer answer;
    switch (route_choose(s, bell, nng_msg_len(msg), &pass)) {
    case ROUTE_QUEUE:
        rv = gpucdc_submit_exchange(s, &pass, req->op, msg, req->msg.id, &rang, &reply, &answer);
        break;
    case ROUTE_RECORD:
        rv = gpucdc_slot_exchange(s, req->op, msg, req->msg.id, bell, &rang, &reply, &answer);
        break;
    case ROUTE_REPLY:
        rv = gpucdc_slot_exchange(s, req->op, msg, req->msg.id, NULL, NULL, &reply, &answer);
        break;
    }
    if (rv < 0)
        return rv;
    if (answer == GPUCDC_ANSWER_RECORD) { /* OK, and every output was in place before it */
        if (t != NULL)
            timings_from_record(t, &rang, gpucdc_now_us() - start);
        return 0;
    }
    return gpucdc_reply_finish(req, reply, start, t, NULL);
}
