/* batcher.c - see batcher.h. */
#include "batcher.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "ops/table.h"

/* One request waiting in a batch; lives on its worker's stack. */
typedef struct batch_entry {
    gcd_op *op;
    int64_t rows;
    uint64_t submitted_us;
    int rc;
    gk_err err;
    gcd_run_timing timing;
    uint64_t wait_us;
    struct batch_entry *next;
} batch_entry;

typedef struct batch {
    const gcd_op *first; /* the key: its weights and output layout */
    batch_entry *head, *tail;
    int64_t rows;
    int entries;
    int closed; /* no more joiners: the leader runs it */
    int done;   /* results are in the entries */
    int readers; /* entries yet to read their result; the last frees the batch */
    pthread_cond_t changed;
    struct batch *next;
} batch;

struct gcd_batcher {
    gcd_daemon *d;
    uint64_t window_us;
    int64_t max_rows;
    pthread_mutex_t lock;
    batch *open;
};

int gcd_batcher_init(gcd_batcher **out, gcd_daemon *d, uint64_t window_us, int64_t max_rows)
{
    gcd_batcher *b = calloc(1, sizeof *b);
    if (b == NULL)
        return -1;
    b->d = d;
    b->window_us = window_us;
    b->max_rows = max_rows;
    pthread_mutex_init(&b->lock, NULL);
    *out = b;
    return 0;
}

void gcd_batcher_fini(gcd_batcher *b)
{
    pthread_mutex_destroy(&b->lock);
    free(b);
}

/* The batching of op's kind; all 0 for a kind that never merges. */
static gcd_op_batching batching_of(const gcd_op *op)
{
    const gcd_op_entry *e = gcd_op_entry_of(op->kind);
    return e != NULL ? e->batch : (gcd_op_batching){0};
}

int gcd_batcher_accepts(const gcd_op *op)
{
    const gcd_op_batching bt = batching_of(op);
    if (bt.rows == 0)
        return 0;
    for (int i = 0; i < op->nargs; i++) {
        const gcd_arg *a = &op->args[i];
        if (a->t.data == NULL)
            continue;
        const uint32_t bit = GCD_SLOT(i);
        if (((bt.rows & bit) && a->resident) || ((bt.shared & bit) && !a->resident) ||
            (bt.alone & bit))
            return 0;
    }
    return 1;
}

/* The batch's key: the same shared tensors, and rows slots alike but for their rows. */
static int same_key(const gcd_op *a, const gcd_op *b)
{
    if (a->kind != b->kind)
        return 0;
    const gcd_op_batching bt = batching_of(a);
    for (int i = 0; i < a->nargs; i++) {
        const gk_tensor *x = &a->args[i].t, *y = &b->args[i].t;
        if ((bt.shared & GCD_SLOT(i)) && x->data != y->data)
            return 0;
        if (!(bt.rows & GCD_SLOT(i)))
            continue;
        if ((x->data == NULL) != (y->data == NULL))
            return 0;
        if (x->data == NULL)
            continue;
        if (x->dtype != y->dtype || x->ndim != y->ndim)
            return 0;
        for (int d = 1; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d])
                return 0;
    }
    return 1;
}

/* The slot whose first dimension counts a request's rows: the lowest rows slot. */
static int rows_slot(const gcd_op *op) { return __builtin_ctz(batching_of(op).rows); }

static void deadline_after(struct timespec *ts, uint64_t us)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    uint64_t ns = (uint64_t)ts->tv_nsec + us * 1000u;
    ts->tv_sec += (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

/* Runs one entry alone, counted as a batch of its rows. */
static void run_alone(gcd_batcher *b, batch_entry *e)
{
    e->rc = b->d->ops->run(b->d->backend, e->op, &e->timing, &e->err);
    if (e->rc == 0) {
        atomic_fetch_add_explicit(&b->d->stats.batches, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->d->stats.batch_rows, (uint64_t)e->rows,
                                  memory_order_relaxed);
    }
}

/* Runs every entry on its own: the fallback when the merged run fails. */
static void run_each(gcd_batcher *b, batch *bt)
{
    for (batch_entry *e = bt->head; e != NULL; e = e->next)
        run_alone(b, e);
}

/*
 * The leader's part: one launch over every entry's rows.  The merged op's
 * observations and outputs are parts (ops.h) that stay in each entry's own
 * memory, so the backend copies each straight between the request's region
 * and the device: nobody concatenates or splits rows on the host.
 */
static void batch_execute(gcd_batcher *b, batch *bt, uint64_t start_us)
{
    gcd_stats *s = &b->d->stats;
    for (batch_entry *e = bt->head; e != NULL; e = e->next)
        e->wait_us = start_us - e->submitted_us;
    if (bt->entries == 1) {
        run_alone(b, bt->head);
        return;
    }
    int io[GCD_OP_MAX_ARGS], nio = 0;
    const uint32_t rows_mask = batching_of(bt->first).rows;
    for (int i = 0; i < bt->first->nargs; i++)
        if (rows_mask & GCD_SLOT(i))
            io[nio++] = i;
    const int n = bt->entries;
    void **data = malloc(sizeof *data * (size_t)(nio * n));
    int64_t *rows = malloc(sizeof *rows * (size_t)n);
    if (data == NULL || rows == NULL) {
        run_each(b, bt);
        goto out;
    }
    int k = 0;
    for (batch_entry *e = bt->head; e != NULL; e = e->next, k++) {
        rows[k] = e->rows;
        for (int j = 0; j < nio; j++)
            data[j * n + k] = e->op->args[io[j]].t.data;
    }
    gcd_parts parts[GCD_OP_MAX_ARGS];
    gcd_op merged = *bt->first;
    for (int j = 0; j < nio; j++) {
        gcd_arg *a = &merged.args[io[j]];
        if (a->t.data == NULL)
            continue;
        parts[j] = (gcd_parts){.n = n, .data = data + j * n, .rows = rows};
        a->parts = &parts[j];
        a->t.shape[0] = bt->rows;
    }
    gcd_run_timing timing = {0};
    gk_err err = {{0}};
    if (b->d->ops->run(b->d->backend, &merged, &timing, &err) != 0) {
        run_each(b, bt); /* so that only the request at fault fails, with its own rows named */
        goto out;
    }
    atomic_fetch_add_explicit(&s->batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->batch_rows, (uint64_t)bt->rows, memory_order_relaxed);
    for (batch_entry *e = bt->head; e != NULL; e = e->next) {
        e->rc = 0;
        e->timing = timing;
    }
out:
    free(data);
    free(rows);
}

static void batch_unlist(gcd_batcher *b, batch *bt)
{
    for (batch **p = &b->open; *p != NULL; p = &(*p)->next) {
        if (*p == bt) {
            *p = bt->next;
            return;
        }
    }
}

int gcd_batcher_run(gcd_batcher *b, gcd_op *op, gcd_run_timing *timing, uint64_t *wait_us,
                    gk_err *err)
{
    batch_entry me = {.op = op, .rows = op->args[rows_slot(op)].t.shape[0],
                      .submitted_us = gcd_now_us()};
    pthread_mutex_lock(&b->lock);
    batch *bt = b->open;
    while (bt != NULL && (bt->closed || !same_key(bt->first, op) ||
                          bt->rows + me.rows > b->max_rows))
        bt = bt->next;
    int leader = bt == NULL;
    if (leader) {
        bt = calloc(1, sizeof *bt);
        if (bt == NULL) {
            pthread_mutex_unlock(&b->lock);
            *wait_us = 0;
            return b->d->ops->run(b->d->backend, op, timing, err);
        }
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&bt->changed, &ca);
        pthread_condattr_destroy(&ca);
        bt->first = op;
        bt->next = b->open;
        b->open = bt;
    }
    if (bt->tail != NULL)
        bt->tail->next = &me;
    else
        bt->head = &me;
    bt->tail = &me;
    bt->rows += me.rows;
    bt->entries++;
    bt->readers++;
    if (bt->rows >= b->max_rows) {
        bt->closed = 1;
        batch_unlist(b, bt);
        pthread_cond_broadcast(&bt->changed); /* full: the leader need not wait longer */
    }
    if (leader) {
        struct timespec deadline;
        deadline_after(&deadline, b->window_us);
        while (!bt->closed &&
               pthread_cond_timedwait(&bt->changed, &b->lock, &deadline) != ETIMEDOUT)
            ;
        if (!bt->closed) {
            bt->closed = 1;
            batch_unlist(b, bt);
        }
        pthread_mutex_unlock(&b->lock);
        batch_execute(b, bt, gcd_now_us());
        pthread_mutex_lock(&b->lock);
        bt->done = 1;
        pthread_cond_broadcast(&bt->changed);
    } else {
        while (!bt->done)
            pthread_cond_wait(&bt->changed, &b->lock);
    }
    int last = --bt->readers == 0;
    pthread_mutex_unlock(&b->lock);
    if (last) {
        pthread_cond_destroy(&bt->changed);
        free(bt);
    }
    *timing = me.timing;
    *wait_us = me.wait_us;
    if (me.rc != 0)
        *err = me.err;
    return me.rc;
}
