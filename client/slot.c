/*
 * slot.c - the connection's contexts (nng contexts with their aio, one call at a time each) and
 * one exchange on a context: send a request, wait for its reply or its completion record.
 */
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

#include <nng/protocol/reqrep0/req.h>

/*
 * The aio goes first, while its context and the socket still stand: aio_free cancels
 * what is pending on it, a cancel that locks the socket (a freed one's mutex, were the
 * socket closed before), and waits for its callback (a detached slot's release is over
 * after it).
 */
static void slot_destroy(gpucdc_slot *s)
{
    nng_aio_free(s->aio);
    nng_ctx_close(s->ctx);
    pthread_cond_destroy(&s->finished);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void gpucdc_slots_free(gpucd_client *c)
{
    gpucdc_slot *s = c->all_slots;
    while (s != NULL) {
        gpucdc_slot *next = s->next_all;
        slot_destroy(s);
        s = next;
    }
}

/*
 * The aio's callback, on an nng thread: the operation is over (nng_aio_wait
 * still syncs with it).  If the caller already left on the doorbell, the
 * reply is nobody's: drop it and give the slot back.
 */
static void slot_done(void *arg)
{
    gpucdc_slot *s = arg;
    int expected = GPUCDC_SLOT_WAITING;
    if (atomic_compare_exchange_strong_explicit(&s->state, &expected, GPUCDC_SLOT_DONE,
                                                memory_order_seq_cst, memory_order_seq_cst)) {
        pthread_mutex_lock(&s->lock);
        pthread_cond_signal(&s->finished);
        pthread_mutex_unlock(&s->lock);
        if (s->bell_rec != NULL) /* the caller may sleep on its record: the reply came instead */
            doorbell_wake(s->bell_rec);
        return;
    }
    if (nng_aio_result(s->aio) == 0)
        nng_msg_free(nng_aio_get_msg(s->aio));
    nng_aio_set_msg(s->aio, NULL);
    gpucdc_slot_release(s);
}

/*
 * Waits for the slot's operation until the call's deadline and returns its result.  With
 * spin_us the caller first polls the callback's flag: when the reply comes within that
 * time, the caller is running already and no thread has to wake it.
 *
 * The deadline is kept here, not as the aio's timeout: nng's expiry thread may run its
 * cancel late, after a reply finished the operation, and so end the slot's next one (or,
 * after gpucd_close, lock a freed socket).  The cancel from this thread is over when it
 * returns, before the slot is used again.
 */
static int slot_wait(const gpucd_client *c, gpucdc_slot *s)
{
    if (c->spin_us > 0) {
        const uint64_t until = gpucdc_now_us() + c->spin_us;
        while (atomic_load_explicit(&s->state, memory_order_acquire) == GPUCDC_SLOT_WAITING &&
               gpucdc_now_us() < until)
            sched_yield(); /* a crowded machine's daemon may need this core */
    }
    bool late = false;
    if (s->deadline != UINT64_MAX) {
        pthread_mutex_lock(&s->lock);
        while (atomic_load_explicit(&s->state, memory_order_acquire) == GPUCDC_SLOT_WAITING) {
            if (gpucdc_now_us() >= s->deadline) {
                late = true;
                break;
            }
            const struct timespec until = {(time_t)(s->deadline / 1000000u),
                                           (long)(s->deadline % 1000000u) * 1000};
            pthread_cond_timedwait(&s->finished, &s->lock, &until);
        }
        pthread_mutex_unlock(&s->lock);
        if (late)
            nng_aio_cancel(s->aio);
    }
    nng_aio_wait(s->aio);
    const int rv = nng_aio_result(s->aio);
    return late && rv == NNG_ECANCELED ? NNG_ETIMEDOUT : rv;
}

/* gpucdc_record_wait's stop for a call whose reply may come first: 1 once it has (its
 * callback wakes the record), or once the call's time is up (slot_wait then ends it). */
static int reply_came(void *slot)
{
    const gpucdc_slot *s = slot;
    return atomic_load_explicit(&s->state, memory_order_seq_cst) != GPUCDC_SLOT_WAITING ||
           gpucdc_now_us() >= s->deadline;
}

int gpucdc_slot_acquire(gpucd_client *c, gpucdc_slot **out)
{
    pthread_mutex_lock(&c->lock);
    gpucdc_slot *s = c->free_slots;
    if (s != NULL) {
        c->free_slots = s->next_free;
        pthread_mutex_unlock(&c->lock);
        s->bell_rec = NULL; /* a call names a record only once gpucdc_doorbell_attach gives one */
        *out = s;
        return 0;
    }
    pthread_mutex_unlock(&c->lock);

    s = calloc(1, sizeof *s);
    if (s == NULL)
        return gpucdc_fail(GPUCD_ENOMEM, "out of memory for a context");
    s->client = c;
    s->bell = -1;
    int rv = nng_ctx_open(&s->ctx, c->sock);
    if (rv != 0) {
        free(s);
        return gpucdc_fail_nng(rv, "gpucd", "opening a context");
    }
    /* Contexts copy the resend time at creation; set it here too to be sure. */
    if ((rv = nng_ctx_set_ms(s->ctx, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_aio_alloc(&s->aio, slot_done, s)) != 0) {
        nng_ctx_close(s->ctx);
        free(s);
        return gpucdc_fail_nng(rv, "gpucd", "setting up a context");
    }
    /* No nng timeout ever (slot_wait keeps the deadline), nor the context's default. */
    nng_aio_set_timeout(s->aio, NNG_DURATION_INFINITE);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* gpucdc_now_us's */
    pthread_cond_init(&s->finished, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_lock(&c->lock);
    s->next_all = c->all_slots;
    c->all_slots = s;
    pthread_mutex_unlock(&c->lock);
    *out = s;
    return 0;
}

void gpucdc_slot_release(gpucdc_slot *s)
{
    gpucd_client *c = s->client;
    pthread_mutex_lock(&c->lock);
    s->next_free = c->free_slots;
    c->free_slots = s;
    pthread_mutex_unlock(&c->lock);
}

/* A call given up on: its request may still be being written (gpucd_close waits for it). */
static void note_unsent_write(gpucd_client *c)
{
    atomic_store_explicit(&c->unsent_write_disconnections,
                          atomic_load_explicit(&c->disconnections, memory_order_acquire),
                          memory_order_relaxed);
    atomic_store_explicit(&c->unsent_write, true, memory_order_release);
}

int gpucdc_slot_exchange(gpucdc_slot *s, const char *op, nng_msg *request, uint64_t id,
                         doorbell_record *bell, doorbell_record *rang, nng_msg **reply,
                         gpucdc_answer *answer)
{
    gpucd_client *c = s->client;
    *reply = NULL;
    *answer = GPUCDC_ANSWER_REPLY;
    /* Only a daemon of another uid answers now: waiting for the real one would end in a
     * timeout that says nothing of why. */
    const uint64_t refused = atomic_load_explicit(&c->refused_uid, memory_order_acquire);
    if (refused != GPUCDC_UID_TRUSTED) {
        nng_msg_free(request);
        gpucdc_slot_release(s);
        return gpucdc_fail_untrusted(c, op, refused);
    }
    s->deadline = c->timeout_ms == NNG_DURATION_INFINITE
                      ? UINT64_MAX
                      : gpucdc_now_us() + (uint64_t)c->timeout_ms * 1000u;
    nng_aio_set_msg(s->aio, request);
    atomic_store_explicit(&s->state, GPUCDC_SLOT_WAITING, memory_order_relaxed);
    nng_ctx_send(s->ctx, s->aio);
    int rv = slot_wait(c, s);
    if (rv == NNG_ETIMEDOUT)
        note_unsent_write(c);
    if (rv != 0) {
        nng_msg *unsent = nng_aio_get_msg(s->aio); /* a failed send hands it back */
        if (unsent != NULL)
            nng_msg_free(unsent);
        nng_aio_set_msg(s->aio, NULL);
        gpucdc_slot_release(s);
        return gpucdc_fail_nng(rv, op, "sending the request");
    }
    atomic_store_explicit(&s->state, GPUCDC_SLOT_WAITING, memory_order_relaxed);
    nng_ctx_recv(s->ctx, s->aio);
    if (bell != NULL && gpucdc_record_wait(c, bell, id, s->deadline, reply_came, s, rang) == 0 &&
        rang->status == GPUCD__V1__STATUS__OK) {
        /*
         * The record is the answer, and a record-only request that succeeded
         * gets no reply: end the receive (an older daemon's reply is then
         * dropped by nng).  The cancel's callback gives the slot back, unless
         * the callback ran already (a reply that came first): then it is this
         * thread's to give back.
         */
        *answer = GPUCDC_ANSWER_RECORD;
        nng_aio_cancel(s->aio);
        int expected = GPUCDC_SLOT_WAITING;
        if (atomic_compare_exchange_strong_explicit(&s->state, &expected, GPUCDC_SLOT_DETACHED,
                                                    memory_order_acq_rel, memory_order_acquire))
            return 0; /* the slot is the callback's now */
        nng_aio_wait(s->aio);
        if (nng_aio_result(s->aio) == 0)
            nng_msg_free(nng_aio_get_msg(s->aio));
        nng_aio_set_msg(s->aio, NULL);
        gpucdc_slot_release(s);
        return 0;
    }
    rv = slot_wait(c, s);
    if (rv == NNG_ETIMEDOUT)
        note_unsent_write(c);
    *reply = rv == 0 ? nng_aio_get_msg(s->aio) : NULL;
    nng_aio_set_msg(s->aio, NULL);
    if (rv != 0 && bell != NULL) {
        /*
         * Given up on (a timeout, a lost connection), the request may still
         * run and store its record later: over the record of this slot's next
         * call, which, being record-only, would then wait for a reply that
         * never comes.  The slot takes another record; this one is left alone.
         */
        s->bell = -1;
    }
    gpucdc_slot_release(s);
    if (rv != 0)
        return gpucdc_fail_nng(rv, op, "waiting for the reply");
    return 0;
}
