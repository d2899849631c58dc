/*
 * submit.c - calls through the submission queue (proto/submit_queue.h says
 * why and how): a call that ends on its record and whose request fits its
 * slot's buffer is queued in shared memory instead of sent on the socket;
 * its answer is the record, and for a failure the reply's bytes in the same
 * buffer.  Every other call, and every call while the queue is not open on
 * the current connection (area.c opens it with the area), uses the socket.
 */
#include <sched.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum { REPLY_POLL_NS = 20000 };

void gpucdc_submit_disconnected(gpucd_client *c)
{
    atomic_fetch_add_explicit(&c->disconnections, 1, memory_order_seq_cst);
    gpucd_region *r = atomic_load_explicit(&c->area.region, memory_order_acquire);
    if (r == NULL)
        return;
    submit_area *a = r->data;
    for (int i = 0; i < SUBMIT_SLOTS; i++)
        doorbell_wake(&a->records[i]);
}

/* Where a queued call stands: what ends its wait besides its record. */
typedef struct queued_call {
    gpucd_client *c;
    const char *op;
    unsigned drops; /* the client's lost connections when it was queued */
    uint64_t deadline;
} queued_call;

/* 0 while the call may go on waiting; else its failure (the connection lost, the time up). */
static int queued_call_ended(void *arg)
{
    const queued_call *q = arg;
    if (atomic_load_explicit(&q->c->disconnections, memory_order_seq_cst) != q->drops)
        return gpucdc_fail_nng(NNG_ECONNRESET, q->op, "waiting for the completion record");
    if (gpucdc_now_us() >= q->deadline)
        return gpucdc_fail_nng(NNG_ETIMEDOUT, q->op, "waiting for the completion record");
    return 0;
}

/*
 * After a failed record: the reply's bytes, whose reply_id the daemon stores
 * last (the record may come first, from the request's own path).
 */
static int reply_take(queued_call *q, submit_buffer *b, uint64_t id, uint32_t status,
                      nng_msg **reply)
{
    while (atomic_load_explicit(&b->reply_id, memory_order_acquire) != id) {
        int rv = queued_call_ended(q);
        if (rv < 0)
            return rv;
        nanosleep(&(struct timespec){0, REPLY_POLL_NS}, NULL);
    }
    const uint32_t len = b->reply_len;
    if (len == 0 || len > SUBMIT_MESSAGE_MAX) {
        int code = gpucdc_status_code((int)status);
        return gpucdc_fail(code, "%s: %s", q->op, gpucd_strerror(code));
    }
    if (nng_msg_alloc(reply, len) != 0)
        return gpucdc_fail(GPUCD_ENOMEM, "%s: out of memory for the reply", q->op);
    memcpy(nng_msg_body(*reply), b->bytes, len);
    return 0;
}

bool gpucdc_submit_can_take(const gpucdc_slot *s, size_t len, gpucdc_queue_pass *pass)
{
    gpucd_client *c = s->client;
    /* The queue must be the current connection's, and that connection up. */
    const unsigned conn = atomic_load_explicit(&c->connections, memory_order_acquire);
    const unsigned drops = atomic_load_explicit(&c->disconnections, memory_order_seq_cst);
    gpucd_region *r = atomic_load_explicit(&c->area.region, memory_order_acquire);
    if (r == NULL || drops + 1 != conn ||
        atomic_load_explicit(&c->area.connection, memory_order_acquire) != conn)
        return false;
    submit_wake *wake = atomic_load_explicit(&r->wake, memory_order_acquire);
    submit_area *a = r->data;
    if (wake == NULL || len > SUBMIT_MESSAGE_MAX || s->bell < 0 ||
        s->bell_rec != &a->records[s->bell])
        return false;
    *pass = (gpucdc_queue_pass){.area = a, .wake = wake, .drops = drops};
    return true;
}

int gpucdc_submit_exchange(gpucdc_slot *s, const gpucdc_queue_pass *pass, const char *op,
                           nng_msg *msg, uint64_t id, doorbell_record *rang, nng_msg **reply,
                           gpucdc_answer *answer)
{
    gpucd_client *c = s->client;
    submit_area *a = pass->area;
    const size_t len = nng_msg_len(msg);
    *reply = NULL;
    queued_call q = {
        .c = c,
        .op = op,
        .drops = pass->drops,
        .deadline = c->timeout_ms == NNG_DURATION_INFINITE
                        ? UINT64_MAX
                        : gpucdc_now_us() + (uint64_t)c->timeout_ms * 1000u,
    };
    const uint32_t slot = (uint32_t)s->bell;
    memcpy(a->buffers[slot].bytes, nng_msg_body(msg), len);
    nng_msg_free(msg);

    /* A cell is always free here: each slot has at most one request queued, and there are as
     * many cells as slots (submit_queue.h). */
    const uint64_t pos = atomic_fetch_add_explicit(&a->tail, 1, memory_order_relaxed);
    submit_cell *cell = &a->cells[pos % SUBMIT_SLOTS];
    int rv = 0;
    while (atomic_load_explicit(&cell->seq, memory_order_acquire) != pos && rv == 0)
        if ((rv = queued_call_ended(&q)) == 0)
            sched_yield();
    if (rv == 0) {
        cell->id = id;
        cell->slot = slot;
        cell->len = (uint32_t)len;
        atomic_store_explicit(&cell->seq, pos + 1, memory_order_seq_cst);
        submit_wake_poller(pass->wake);
        /* A lost connection wakes the record (gpucdc_submit_disconnected). */
        rv = gpucdc_record_wait(c, s->bell_rec, id, q.deadline, queued_call_ended, &q, rang);
    }
    if (rv == 0 && rang->status != GPUCD__V1__STATUS__OK)
        rv = reply_take(&q, &a->buffers[slot], id, rang->status, reply);
    if (rv == GPUCD_ETIMEDOUT || rv == GPUCD_ECLOSED) {
        /* Given up on, the request may still run and answer into this slot's record and
         * buffer later: the slot takes others, these are left alone for good. */
        s->bell = -1;
    }
    gpucdc_slot_release(s);
    if (rv < 0)
        return rv;
    *answer = *reply == NULL ? GPUCDC_ANSWER_RECORD : GPUCDC_ANSWER_REPLY;
    return 0;
}
