/*
 * nng_echo.c - the transport's floor: nng req/rep over ipc between processes,
 * no gpucd code, so that end-to-end figures can be split into what any nng
 * client pays on the machine and what gpucd adds.  The parent
 * echoes through 64 rep contexts, each answering from nng's own callback
 * (the least a server can do); CLIENTS forked processes each send 200-byte
 * messages back to back for SECONDS and report their round trips.  Prints
 * the summed request rate and the round trip's p50, p90 and p99 over every
 * request.  With HOLD_US the server busy-waits that long before each reply,
 * as a daemon computing does, and the figures are the round trip less
 * HOLD_US: what the transport costs when both ends have been idle that long.
 *
 * Usage: nng_echo [CLIENTS [SECONDS [HOLD_US]]]   (default 1 client, 2 s, 0)
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAX_CLIENTS = 256, SERVER_CONTEXTS = 64, MAX_SAMPLES = 1 << 18 };

static double g_hold_us; /* the server's busy wait before each reply */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static int fail(const char *what, int rv)
{
    fprintf(stderr, "nng_echo: %s: %s\n", what, nng_strerror(rv));
    return 1;
}

/* A client: round trips for `seconds`, their times written to fd as floats (us). */
static int client(const char *url, double seconds, int fd)
{
    nng_socket s;
    int rv;
    if ((rv = nng_req0_open(&s)) != 0)
        return fail("nng_req0_open", rv);
    /* The parent may not listen yet: retry for a second. */
    for (int i = 0; (rv = nng_dial(s, url, NULL, 0)) != 0 && i < 100; i++)
        usleep(10000);
    if (rv != 0)
        return fail("nng_dial", rv);
    float *rtt = malloc(sizeof *rtt * MAX_SAMPLES);
    if (rtt == NULL)
        return 1;
    uint32_t n = 0;
    const double end = now_us() + seconds * 1e6;
    for (double t = now_us(); t < end && n < MAX_SAMPLES;) {
        nng_msg *m;
        if ((rv = nng_msg_alloc(&m, 200)) != 0)
            return fail("nng_msg_alloc", rv);
        if ((rv = nng_sendmsg(s, m, 0)) != 0 || (rv = nng_recvmsg(s, &m, 0)) != 0)
            return fail("round trip", rv);
        const double t1 = now_us();
        rtt[n++] = (float)(t1 - t - g_hold_us);
        t = t1;
        nng_msg_free(m);
    }
    int ok = write(fd, &n, sizeof n) == (ssize_t)sizeof n &&
             write(fd, rtt, n * sizeof *rtt) == (ssize_t)(n * sizeof *rtt);
    free(rtt);
    nng_close(s);
    return ok ? 0 : 1;
}

/* One rep context of the server: receive, send the message back, receive again. */
typedef struct echo_ctx {
    nng_ctx ctx;
    nng_aio *aio;
    int sending;
} echo_ctx;

static void echo_done(void *arg)
{
    echo_ctx *e = arg;
    if (nng_aio_result(e->aio) != 0) {
        if (e->sending)
            nng_msg_free(nng_aio_get_msg(e->aio));
        if (nng_aio_result(e->aio) == NNG_ECLOSED)
            return;
        e->sending = 0;
        nng_ctx_recv(e->ctx, e->aio);
        return;
    }
    e->sending = !e->sending;
    if (e->sending && g_hold_us > 0)
        for (const double until = now_us() + g_hold_us; now_us() < until;)
            ;
    if (e->sending)
        nng_ctx_send(e->ctx, e->aio); /* the received message goes back as it is */
    else
        nng_ctx_recv(e->ctx, e->aio);
}

/* Reads every client's samples (client c's from fds[c]); prints the rate and the percentiles. */
static int report(const int *fds, int clients, double seconds)
{
    float *all = malloc(sizeof *all * (size_t)MAX_SAMPLES * (size_t)clients);
    if (all == NULL)
        return 1;
    size_t total = 0;
    for (int c = 0; c < clients; c++) {
        uint32_t n;
        if (read(fds[c], &n, sizeof n) != (ssize_t)sizeof n || n > MAX_SAMPLES)
            return 1;
        for (size_t got = 0; got < n * sizeof(float);) {
            ssize_t r = read(fds[c], (char *)(all + total) + got, n * sizeof(float) - got);
            if (r <= 0)
                return 1;
            got += (size_t)r;
        }
        total += n;
    }
    if (total == 0)
        return 1;
    qsort(all, total, sizeof *all, by_value);
    printf("nng req/rep ipc, %d client process(es), 200-byte messages, server holding each %.0f "
           "us: %.0f requests/s; round trip less the hold p50 %.1f us, p90 %.1f us, p99 %.1f us "
           "(%zu requests)\n",
           clients, g_hold_us, (double)total / seconds, all[total / 2], all[total * 9 / 10],
           all[total * 99 / 100], total);
    free(all);
    return 0;
}

int main(int argc, char **argv)
{
    const int clients = argc > 1 ? atoi(argv[1]) : 1;
    const double seconds = argc > 2 ? atof(argv[2]) : 2.0;
    g_hold_us = argc > 3 ? atof(argv[3]) : 0.0;
    if (clients < 1 || clients > MAX_CLIENTS || !(seconds > 0 && seconds <= 60) ||
        !(g_hold_us >= 0 && g_hold_us <= 100000)) {
        fprintf(stderr, "usage: nng_echo [CLIENTS 1..%d [SECONDS [HOLD_US 0..100000]]]\n",
                MAX_CLIENTS);
        return 2;
    }
    char url[128];
    snprintf(url, sizeof url, "ipc:///tmp/gpucd-nng-echo-%d.sock", (int)getpid());
    /* Fork before touching nng, which is not fork-safe; a pipe a client for its samples. */
    pid_t pids[MAX_CLIENTS];
    int fds[MAX_CLIENTS];
    for (int c = 0; c < clients; c++) {
        int p[2];
        if (pipe(p) != 0 || (pids[c] = fork()) < 0)
            return 1;
        if (pids[c] == 0) {
            close(p[0]);
            _exit(client(url, seconds, p[1]));
        }
        close(p[1]);
        fds[c] = p[0];
    }
    nng_socket s;
    static echo_ctx ctxs[SERVER_CONTEXTS];
    int rv;
    if ((rv = nng_rep0_open(&s)) != 0 || (rv = nng_listen(s, url, NULL, 0)) != 0) {
        for (int c = 0; c < clients; c++)
            kill(pids[c], SIGKILL);
        return fail("listening", rv);
    }
    for (int i = 0; i < SERVER_CONTEXTS; i++) {
        if ((rv = nng_ctx_open(&ctxs[i].ctx, s)) != 0 ||
            (rv = nng_aio_alloc(&ctxs[i].aio, echo_done, &ctxs[i])) != 0)
            return fail("a server context", rv);
        nng_ctx_recv(ctxs[i].ctx, ctxs[i].aio);
    }
    int rc = report(fds, clients, seconds);
    for (int c = 0; c < clients; c++) {
        int status = 0;
        waitpid(pids[c], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            rc = 1;
    }
    nng_close(s); /* before the contexts' aios go: their callbacks see NNG_ECLOSED */
    for (int i = 0; i < SERVER_CONTEXTS; i++)
        nng_aio_free(ctxs[i].aio);
    return rc;
}
