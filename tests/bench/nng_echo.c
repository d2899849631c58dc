/*
 * nng_echo.c - the transport's floor: a bare nng req/rep echo over ipc
 * between two processes, no gpucd code, so that end-to-end latencies can be
 * split into what any nng client pays on the machine and what gpucd adds
 * (issue 6's B = 1024 target).  The parent listens and echoes; a forked
 * child dials and sends COUNT 200-byte messages one after another, then
 * prints the round trip's p50, p90 and p99.
 *
 * Usage: nng_echo [COUNT]   (default 20000)
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(const char *what, int rv)
{
    fprintf(stderr, "nng_echo: %s: %s\n", what, nng_strerror(rv));
    return 1;
}

/* The child: COUNT round trips, then the percentiles. */
static int client(const char *url, int count)
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
    double *rtt = malloc(sizeof *rtt * (size_t)count);
    if (rtt == NULL)
        return 1;
    for (int i = 0; i < count; i++) {
        nng_msg *m;
        if ((rv = nng_msg_alloc(&m, 200)) != 0)
            return fail("nng_msg_alloc", rv);
        double t0 = now_us();
        if ((rv = nng_sendmsg(s, m, 0)) != 0 || (rv = nng_recvmsg(s, &m, 0)) != 0)
            return fail("round trip", rv);
        rtt[i] = now_us() - t0;
        nng_msg_free(m);
    }
    qsort(rtt, (size_t)count, sizeof *rtt, by_value);
    printf("nng req/rep ipc round trip, %d messages of 200 bytes: p50 %.1f us, p90 %.1f us, "
           "p99 %.1f us\n",
           count, rtt[count / 2], rtt[(size_t)count * 9 / 10], rtt[(size_t)count * 99 / 100]);
    fflush(stdout); /* the child leaves by _exit, which flushes nothing */
    free(rtt);
    nng_close(s);
    return 0;
}

int main(int argc, char **argv)
{
    int count = argc > 1 ? atoi(argv[1]) : 20000;
    if (count < 100) {
        fprintf(stderr, "usage: nng_echo [COUNT >= 100]\n");
        return 2;
    }
    char url[128];
    snprintf(url, sizeof url, "ipc:///tmp/gpucd-nng-echo-%d.sock", (int)getpid());
    /* Fork before either side touches nng, which is not fork-safe. */
    pid_t child = fork();
    if (child < 0)
        return 1;
    if (child == 0)
        _exit(client(url, count));
    nng_socket s;
    int rv;
    if ((rv = nng_rep0_open(&s)) != 0 || (rv = nng_listen(s, url, NULL, 0)) != 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        return fail("listening", rv);
    }
    /* Echo until the child is done: a receive timeout lets the loop notice. */
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 100);
    int status = 0;
    while (waitpid(child, &status, WNOHANG) == 0) {
        nng_msg *m;
        if (nng_recvmsg(s, &m, 0) != 0)
            continue;
        if (nng_sendmsg(s, m, 0) != 0)
            nng_msg_free(m);
    }
    nng_close(s);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
