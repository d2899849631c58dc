/* workers.c - see workers.h. */
#include "workers.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "clock.h"

struct gcd_workers {
    pthread_mutex_t lock;
    pthread_cond_t more;
    gcd_work *head, *tail;
    atomic_int pending;  /* queued works: polled without the lock */
    int spinning;        /* a thread polls (under lock: set, cleared, read by submit) */
    int stopping;
    uint64_t spin_us;
    int n;
    pthread_t *threads;
};

/* With the lock held: the next queued work, or NULL. */
static gcd_work *take(gcd_workers *p)
{
    gcd_work *w = p->head;
    if (w != NULL) {
        p->head = w->next;
        if (p->head == NULL)
            p->tail = NULL;
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_relaxed);
    }
    return w;
}

/*
 * Polls for up to spin_us without the lock, if no other thread is polling;
 * returns with the lock held either way.
 */
static void poll_then_lock(gcd_workers *p)
{
    pthread_mutex_lock(&p->lock);
    if (p->spin_us == 0 || p->spinning || p->head != NULL || p->stopping)
        return;
    p->spinning = 1;
    pthread_mutex_unlock(&p->lock);
    const uint64_t until = gcd_now_us() + p->spin_us;
    while (atomic_load_explicit(&p->pending, memory_order_relaxed) == 0 && gcd_now_us() < until)
        sched_yield();
    pthread_mutex_lock(&p->lock);
    p->spinning = 0; /* from here submit signals again: no wake-up is lost */
}

static void *worker_main(void *arg)
{
    gcd_workers *p = arg;
    for (;;) {
        poll_then_lock(p);
        gcd_work *w;
        while ((w = take(p)) == NULL && !p->stopping)
            pthread_cond_wait(&p->more, &p->lock);
        if (w != NULL && p->head != NULL && !p->spinning)
            pthread_cond_signal(&p->more); /* more came while nobody was signalled: pass it on */
        pthread_mutex_unlock(&p->lock);
        if (w == NULL)
            return NULL; /* stopping, and nothing left */
        w->run(w);
    }
}

int gcd_workers_start(gcd_workers **out, int n, uint64_t spin_us)
{
    gcd_workers *p = calloc(1, sizeof *p);
    if (p == NULL || (p->threads = calloc((size_t)n, sizeof *p->threads)) == NULL) {
        free(p);
        return -1;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->more, NULL);
    p->spin_us = spin_us;
    for (; p->n < n; p->n++) {
        if (pthread_create(&p->threads[p->n], NULL, worker_main, p) != 0) {
            gcd_workers_stop(p);
            return -1;
        }
    }
    *out = p;
    return 0;
}

void gcd_workers_submit(gcd_workers *p, gcd_work *w)
{
    w->next = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->tail != NULL)
        p->tail->next = w;
    else
        p->head = w;
    p->tail = w;
    atomic_fetch_add_explicit(&p->pending, 1, memory_order_relaxed);
    if (!p->spinning) /* a polling thread takes it without being woken */
        pthread_cond_signal(&p->more);
    pthread_mutex_unlock(&p->lock);
}

void gcd_workers_stop(gcd_workers *p)
{
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    pthread_cond_broadcast(&p->more);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->more);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p);
}
