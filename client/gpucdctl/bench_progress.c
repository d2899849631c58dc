/*
 * bench_progress.c - what a long `gpucdctl bench` is doing, on stderr (see
 * bench.h).  A thread of its own draws it, so that a request that blocks for
 * seconds (a --server-side run, a slow level) still shows time passing.
 *
 * On a terminal the line is redrawn in place twice a second, and at once when
 * a phase begins; elsewhere (a log file, a pipe) a line comes once a phase has
 * run 10 s and every 10 s after, so that short runs add nothing to a log.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

enum { PROGRESS_TTY_MS = 500, PROGRESS_LOG_S = 10 };

struct bench_progress {
    FILE *out;
    int tty;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int quit, drawn; /* drawn: a line on the terminal that a redraw or clear replaces */
    char phase[160], detail[160];
    struct timespec phase_start, last_line;
};

static double since_s(const struct timespec *t)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) * 1e-9;
}

/* With the lock held. */
static void progress_clear(bench_progress *p)
{
    if (p->tty && p->drawn) {
        fputs("\r\033[K", p->out);
        fflush(p->out);
    }
    p->drawn = 0;
}

/* With the lock held. */
static void progress_draw(bench_progress *p)
{
    if (p->phase[0] == '\0')
        return;
    fprintf(p->out, "%sgpucdctl bench: %s%s%s [%.0f s]%s", p->tty ? "\r\033[K" : "", p->phase,
            p->detail[0] != '\0' ? ": " : "", p->detail, since_s(&p->phase_start),
            p->tty ? "" : "\n");
    fflush(p->out);
    p->drawn = p->tty;
    clock_gettime(CLOCK_MONOTONIC, &p->last_line);
}

static void *progress_main(void *arg)
{
    bench_progress *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->quit) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += PROGRESS_TTY_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&p->wake, &p->lock, &until);
        if (p->quit || p->phase[0] == '\0')
            continue;
        if (p->tty || (since_s(&p->phase_start) >= PROGRESS_LOG_S &&
                       since_s(&p->last_line) >= PROGRESS_LOG_S))
            progress_draw(p);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

bench_progress *bench_progress_start(FILE *out)
{
    bench_progress *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->out = out;
    p->tty = isatty(fileno(out));
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&p->thread, NULL, progress_main, p) != 0) {
        pthread_cond_destroy(&p->wake);
        pthread_mutex_destroy(&p->lock);
        free(p);
        return NULL; /* the bench runs all the same, silently */
    }
    return p;
}

void bench_progress_phase(bench_progress *p, const char *fmt, ...)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    progress_clear(p);
    p->phase[0] = p->detail[0] = '\0';
    if (fmt != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->phase, sizeof p->phase, fmt, ap);
        va_end(ap);
    }
    clock_gettime(CLOCK_MONOTONIC, &p->phase_start);
    p->last_line = p->phase_start;
    if (p->tty)
        progress_draw(p);
    pthread_mutex_unlock(&p->lock);
}

void bench_progress_detail(bench_progress *p, const char *fmt, ...)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->detail, sizeof p->detail, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&p->lock);
}

void bench_progress_stop(bench_progress *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    progress_clear(p);
    p->quit = 1;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
