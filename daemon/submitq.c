/* submitq.c - see submitq.h; the shared layout and its protocol are proto/submit_queue.h's. */
#include "submitq.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "clock.h"
#include "doorbell.h"
#include "log.h"
#include "submit_queue.h"

_Static_assert(SUBMIT_MESSAGE_MAX == 2032, "take()'s message names the buffer's size");

enum {
    TAKE_PER_PASS = 8,       /* from one queue before looking at the next: no client starves */
    POLLER_NAP_MS = 100,     /* longest sleep: a safety net, since producers wake the poller */
    FULL_WAIT_US = 20,       /* at --max-inflight: how long to wait before looking again */
};

struct queue;

/* One taken request.  Allocated for it: the client may queue its slot again as soon as the
 * record is stored, before the worker that stored it is done with this. */
typedef struct submit_work {
    gcd_work work; /* first: the worker's item is this */
    struct queue *q;
    nng_msg *msg; /* NULL: refused when taken, with `refused` for `why` */
    gcd_status refused;
    const char *why;
    uint64_t id, t_recv;
    uint32_t slot;
} submit_work;

/* One connection's queue. */
typedef struct queue {
    struct queue *next;
    gcd_submitq *sq;
    uint32_t owner;
    gcd_region *region; /* a reference held until the last request of the queue is answered */
    submit_area *area;
    uint64_t head;   /* the next position to take: the poller's alone */
    atomic_int refs; /* the list's, plus one per running request */
    int warned;      /* a rejected cell was logged (the rest are counted) */
} queue;

struct gcd_submitq {
    gcd_daemon *d;
    const gcd_submitq_handler *handler;
    gcd_workers *workers;
    atomic_int *busy;
    const atomic_int *refuse;
    submit_wake *wake;
    int wake_fd; /* the wake page's memfd, handed to clients */
    pthread_mutex_t lock; /* the list; held by the poller while it takes */
    queue *queues;
    atomic_int running; /* taken and not answered, every queue */
    atomic_int stop;
    pthread_t thread;
    int started;
};

static void queue_unref(queue *q)
{
    if (atomic_fetch_sub(&q->refs, 1) == 1) {
        gcd_regions_release(q->sq->d->regions, q->region);
        free(q);
    }
}

/*
 * The answer of a request that was not answered by its record alone: the
 * reply's bytes (if any fit), the record, and reply_id last.  The request's
 * own path may have stored the record already: a client that saw it waits
 * for reply_id, after which nothing of this request touches the slot, so
 * the slot's next request is never overwritten by this one.
 */
static void answer(queue *q, const submit_work *w, nng_msg *reply, gcd_status st)
{
    submit_buffer *b = &q->area->buffers[w->slot];
    size_t len = reply != NULL ? nng_msg_len(reply) : 0;
    if (len > sizeof b->bytes)
        len = 0; /* the status alone; a failure's message is far shorter than a buffer */
    if (len > 0)
        memcpy(b->bytes, nng_msg_body(reply), len);
    b->reply_len = (uint32_t)len;
    gcd_doorbell_ring_record(&q->area->records[w->slot], w->id, st, NULL);
    atomic_store_explicit(&b->reply_id, w->id, memory_order_seq_cst);
}

/* Worker thread: runs a taken request, answers it if its record did not, frees its slot. */
static void work_run(gcd_work *work)
{
    submit_work *w = (submit_work *)work;
    queue *q = w->q;
    gcd_submitq *sq = q->sq;
    gcd_outcome out = {.status = w->refused};
    nng_msg *reply;
    if (w->msg != NULL) {
        reply = sq->handler->serve(sq->d, w->msg, w->t_recv, sq->refuse, &out);
        w->msg = NULL;
    } else {
        atomic_fetch_sub_explicit(&sq->d->stats.queued, 1, memory_order_relaxed);
        reply = sq->handler->error_reply(w->id, out.status, w->why);
    }
    if (!out.by_record)
        answer(q, w, reply, out.status);
    if (reply != NULL)
        nng_msg_free(reply);
    free(w);
    atomic_fetch_sub(&sq->running, 1);
    atomic_fetch_sub(sq->busy, 1);
    queue_unref(q);
}

/* A cell that names no slot: nothing to answer into.  Logged once a queue, always counted. */
static void reject(queue *q, uint32_t slot)
{
    atomic_fetch_add_explicit(&q->sq->d->stats.submit_rejected, 1, memory_order_relaxed);
    if (!q->warned) {
        gcd_log_warn("client %u's submission queue: a cell names slot %u of %d (not answered; "
                     "more are only counted, in submit_rejected)",
                     q->owner, slot, SUBMIT_SLOTS);
        q->warned = 1;
    }
}

/*
 * With the list locked: takes the cell at q's head, published (seq == head + 1)
 * by the client.  Every field is read once, then checked: the client may be
 * changing them, and the bytes are copied before anything decodes them.
 */
static void take(gcd_submitq *sq, queue *q, submit_cell *cell)
{
    const uint64_t id = *(volatile uint64_t *)&cell->id;
    const uint32_t slot = *(volatile uint32_t *)&cell->slot;
    const uint32_t len = *(volatile uint32_t *)&cell->len;
    atomic_store_explicit(&cell->seq, q->head + SUBMIT_SLOTS, memory_order_release);
    q->head++;
    atomic_fetch_add_explicit(&sq->d->stats.submit_taken, 1, memory_order_relaxed);
    if (slot >= SUBMIT_SLOTS) {
        reject(q, slot);
        return;
    }
    submit_work *w = calloc(1, sizeof *w);
    if (w == NULL) {
        gcd_log_error("no memory for a queued request; its client will time out");
        return;
    }
    w->work.run = work_run;
    w->q = q;
    w->id = id;
    w->slot = slot;
    w->t_recv = gcd_now_us();
    if (len == 0 || len > SUBMIT_MESSAGE_MAX) {
        w->refused = GCD_BAD_MESSAGE;
        w->why = "submission queue: a request's length must be 1 to 2032 bytes (its buffer)";
        atomic_fetch_add_explicit(&sq->d->stats.submit_rejected, 1, memory_order_relaxed);
    } else if (nng_msg_alloc(&w->msg, len) != 0) {
        w->refused = GCD_RESOURCE_EXHAUSTED;
        w->why = "submission queue: no memory for the request";
    } else {
        memcpy(nng_msg_body(w->msg), q->area->buffers[slot].bytes, len);
        nng_msg_set_pipe(w->msg, (nng_pipe){.id = q->owner});
    }
    atomic_fetch_add(&q->refs, 1);
    atomic_fetch_add(&sq->running, 1);
    atomic_fetch_add(sq->busy, 1);
    atomic_fetch_add_explicit(&sq->d->stats.queued, 1, memory_order_relaxed);
    gcd_workers_submit(sq->workers, &w->work);
}

/* With the list locked: the first queue goes last, so each pass starts at another one. */
static void rotate(gcd_submitq *sq)
{
    queue *first = sq->queues;
    if (first == NULL || first->next == NULL)
        return;
    queue *last = first;
    while (last->next != NULL)
        last = last->next;
    sq->queues = first->next;
    first->next = NULL;
    last->next = first;
}

/*
 * Takes what the queues hold, a few from each in turn, starting one queue
 * further each pass (at --max-inflight each pass may take only one: the
 * queues take turns); returns how many.  *full: some were left because
 * --max-inflight requests of the queues run.
 */
static int scan(gcd_submitq *sq, int *full)
{
    const int cap = (int)sq->d->cfg.max_inflight;
    int took = 0;
    *full = 0;
    pthread_mutex_lock(&sq->lock);
    rotate(sq);
    for (queue *q = sq->queues; q != NULL; q = q->next) {
        for (int k = 0; k < TAKE_PER_PASS; k++) {
            submit_cell *cell = &q->area->cells[q->head % SUBMIT_SLOTS];
            if (atomic_load_explicit(&cell->seq, memory_order_seq_cst) != q->head + 1)
                break;
            if (atomic_load(&sq->running) >= cap) {
                *full = 1;
                break;
            }
            take(sq, q, cell);
            took++;
        }
    }
    pthread_mutex_unlock(&sq->lock);
    return took;
}

static void futex_sleep(_Atomic uint32_t *word, uint32_t val, long ns)
{
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    syscall(SYS_futex, (void *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

/*
 * The poller: takes while requests come, polls for --spin-us after the last,
 * then sleeps until a producer wakes it (submit_queue.h says why none is lost).
 */
static void *poller_main(void *arg)
{
    gcd_submitq *sq = arg;
    const uint64_t spin_us = sq->d->cfg.spin_us;
    uint64_t idle_since = gcd_now_us();
    while (!atomic_load(&sq->stop)) {
        int full;
        if (scan(sq, &full) > 0) {
            idle_since = gcd_now_us();
            continue;
        }
        if (full) { /* a running request ends soon: nothing would wake a sleep */
            nanosleep(&(struct timespec){0, FULL_WAIT_US * 1000L}, NULL);
            continue;
        }
        if (gcd_now_us() - idle_since < spin_us) {
            sched_yield();
            continue;
        }
        atomic_store_explicit(&sq->wake->sleeping, 1, memory_order_seq_cst);
        if (scan(sq, &full) == 0 && !full && !atomic_load(&sq->stop)) {
            atomic_fetch_add_explicit(&sq->d->stats.submit_sleeps, 1, memory_order_relaxed);
            futex_sleep(&sq->wake->sleeping, 1, POLLER_NAP_MS * 1000000L);
        }
        atomic_store_explicit(&sq->wake->sleeping, 0, memory_order_relaxed);
        idle_since = gcd_now_us();
    }
    return NULL;
}

/*
 * A memfd sealed against resizing and against taking the seals off (clients
 * get it over the descriptor socket, fdpass.h): no client can shrink it
 * under the poller, and it has no name to leave behind.
 */
static int wake_create(gcd_submitq *sq, char *err, size_t errlen)
{
    int fd = memfd_create("gpucd-wake", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    void *p = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, SUBMIT_WAKE_BYTES) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        p = mmap(NULL, SUBMIT_WAKE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "submission queues: making the wake page: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    sq->wake = p;
    sq->wake_fd = fd;
    return 0;
}

int gcd_submitq_start(gcd_submitq **out, gcd_daemon *d, const gcd_submitq_handler *handler,
                      gcd_workers *workers, atomic_int *busy, const atomic_int *refuse, char *err,
                      size_t errlen)
{
    gcd_submitq *sq = calloc(1, sizeof *sq);
    if (sq == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    sq->d = d;
    sq->handler = handler;
    sq->workers = workers;
    sq->busy = busy;
    sq->refuse = refuse;
    sq->wake_fd = -1;
    pthread_mutex_init(&sq->lock, NULL);
    if (wake_create(sq, err, errlen) != 0) {
        gcd_submitq_free(sq);
        return -1;
    }
    if (pthread_create(&sq->thread, NULL, poller_main, sq) != 0) {
        snprintf(err, errlen, "cannot start the submission queue poller");
        gcd_submitq_free(sq);
        return -1;
    }
    sq->started = 1;
    *out = sq;
    return 0;
}

/* A queue taken off the list (NULL: none was): no longer open, the list's reference dropped. */
static void queue_dropped(gcd_submitq *sq, queue *q)
{
    if (q == NULL)
        return;
    atomic_fetch_sub_explicit(&sq->d->stats.submit_queues, 1, memory_order_relaxed);
    queue_unref(q);
}

/*
 * Takes off the list the queue q, or (q NULL) the queue of connection owner;
 * returns it, or NULL when it is not there (another thread took it first).
 */
static queue *queue_unlink(gcd_submitq *sq, const queue *q, uint32_t owner)
{
    pthread_mutex_lock(&sq->lock);
    queue **pp = &sq->queues;
    while (*pp != NULL && (q != NULL ? *pp != q : (*pp)->owner != owner))
        pp = &(*pp)->next;
    queue *found = *pp;
    if (found != NULL)
        *pp = found->next;
    pthread_mutex_unlock(&sq->lock);
    return found;
}

gcd_status gcd_submitq_open(gcd_submitq *sq, uint32_t owner, uint64_t region_id, char *why,
                            size_t whylen)
{
    gcd_region *r;
    gcd_status st = gcd_regions_acquire(sq->d->regions, owner, region_id, &r, why, whylen);
    if (st != GCD_OK)
        return st;
    if (r->size < sizeof(submit_area)) {
        snprintf(why, whylen, "submit_queue_open: region %llu has %zu bytes; a queue takes %zu",
                 (unsigned long long)region_id, r->size, sizeof(submit_area));
        gcd_regions_release(sq->d->regions, r);
        return GCD_INVALID_ARGUMENT;
    }
    queue *q = calloc(1, sizeof *q);
    if (q == NULL) {
        snprintf(why, whylen, "submit_queue_open: out of memory");
        gcd_regions_release(sq->d->regions, r);
        return GCD_RESOURCE_EXHAUSTED;
    }
    q->sq = sq;
    q->owner = owner;
    q->region = r;
    q->area = (submit_area *)r->base;
    atomic_init(&q->refs, 1);
    pthread_mutex_lock(&sq->lock);
    for (queue *o = sq->queues; o != NULL; o = o->next) {
        if (o->owner == owner) {
            pthread_mutex_unlock(&sq->lock);
            snprintf(why, whylen, "submit_queue_open: this connection has a queue already "
                                  "(region %llu)",
                     (unsigned long long)o->region->id);
            queue_unref(q);
            return GCD_INVALID_ARGUMENT;
        }
    }
    q->next = sq->queues;
    sq->queues = q;
    pthread_mutex_unlock(&sq->lock);
    atomic_fetch_add_explicit(&sq->d->stats.submit_queues, 1, memory_order_relaxed);
    /*
     * Listed after the queue is: had the connection gone (its regions are dropped before
     * its queue) or the region been unregistered meanwhile, nothing would ever drop it.
     */
    if (!gcd_regions_mark_queue(sq->d->regions, r)) {
        queue_dropped(sq, queue_unlink(sq, q, 0));
        snprintf(why, whylen, "submit_queue_open: region %llu was unregistered, or its "
                              "connection closed",
                 (unsigned long long)region_id);
        return GCD_NOT_FOUND;
    }
    return GCD_OK;
}

int gcd_submitq_wake_fd(const gcd_submitq *sq) { return sq->wake_fd; }

void gcd_submitq_drop_owner(gcd_submitq *sq, uint32_t owner)
{
    queue_dropped(sq, queue_unlink(sq, NULL, owner));
}

void gcd_submitq_stop(gcd_submitq *sq)
{
    if (!sq->started)
        return;
    atomic_store(&sq->stop, 1);
    atomic_store(&sq->wake->sleeping, 0);
    syscall(SYS_futex, (void *)&sq->wake->sleeping, FUTEX_WAKE, 1, NULL, NULL, 0);
    pthread_join(sq->thread, NULL);
    sq->started = 0;
}

void gcd_submitq_free(gcd_submitq *sq)
{
    gcd_submitq_stop(sq);
    while (sq->queues != NULL)
        queue_dropped(sq, queue_unlink(sq, sq->queues, 0));
    if (sq->wake != NULL) {
        munmap(sq->wake, SUBMIT_WAKE_BYTES);
        close(sq->wake_fd);
    }
    pthread_mutex_destroy(&sq->lock);
    free(sq);
}
