/*
 * crowd_bench.c - many RL worker processes sharing one encoder (the
 * dynamic-batching benchmark): the parent uploads one set of NMMO3 weights (bf16,
 * resident, shared by every process of the same user), then forks N worker
 * processes; each connects on its own, keeps its batch of observations and
 * its hidden output in its own shared-memory region, and sends nmmo3_encode
 * requests back to back.  Run it against a daemon with batching off and on.
 *
 * Every reply is checked: the first and last hidden values of the request
 * (set to NaN before it) must have been written.  Times: each worker warms
 * up, then counts the requests it completes in the measured window and keeps
 * their round trips; the parent sums the throughput and takes percentiles
 * over every request of every worker.
 *
 * With --ping 1 the workers send pings instead: the request rate the
 * transport and the daemon's request path carry with no work behind them,
 * which bounds what merged launches can gain.
 *
 * Usage: crowd_bench URL [--workers N] [--batch B] [--hidden H] [--warmup-s S] [--seconds S]
 *                        [--ping 0|1]
 * Prints one line: workers, rows/s, requests/s, p50/p99/max us, mean batch wait us, errors.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpucd.h"
#include "harness.h"

enum { MAX_WORKERS = 1024, MAX_SAMPLES = 1 << 20 };

typedef struct opts {
    const char *url;
    int workers;
    int64_t batch, hidden;
    double warmup_s, seconds;
    int ping; /* pings instead of encodes */
} opts;

/* What a worker reports to the parent through its pipe. */
/* The reply timings' sums over the measured requests: where the time went. */
enum { SPLIT_QUEUE, SPLIT_WAIT, SPLIT_COPY_IN, SPLIT_COMPUTE, SPLIT_COPY_OUT, SPLIT_TOTAL, SPLIT_N };
static const char *const split_names[SPLIT_N] = {"queue", "batch wait", "copy in", "compute",
                                                 "copy out", "daemon total"};

typedef struct worker_result {
    uint64_t requests, errors;
    uint64_t split_us[SPLIT_N];
    uint32_t nsamples; /* followed by nsamples uint32 round trips, us */
} worker_result;

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* The weights, resident, in bf16 (fresh random values; any finite ones will do for timing). */
static int weights_put(gpucd_client *c, int64_t hidden, gpucd_tensor t[7])
{
    const int64_t shapes[7][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128}, {128, 32},
                                  {hidden, GPUCD_NMMO3_FEATURES}, {hidden}};
    const int nd[7] = {4, 1, 4, 1, 2, 2, 1};
    for (int i = 0; i < 7; i++) {
        gpucd_tensor h = gpucd_tensor_host(NULL, GPUCD_BF16, nd[i], shapes[i]);
        int64_t n = gpucd_tensor_numel(&h);
        uint16_t *v = malloc((size_t)n * 2);
        if (v == NULL)
            return GPUCD_ENOMEM;
        th_fill_bf16(v, (size_t)n);
        h.data = v;
        uint64_t id;
        int rv = gpucd_tensor_put(c, &h, &id);
        free(v);
        if (rv < 0)
            return rv;
        t[i] = gpucd_tensor_resident(id, GPUCD_BF16, nd[i], shapes[i]);
    }
    return 0;
}

static int write_all(int fd, const void *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p = (const uint8_t *)p + w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p = (uint8_t *)p + r;
        n -= (size_t)r;
    }
    return 0;
}

/*
 * One worker process: waits for the weights' resident ids on in_fd (nng may
 * not be used across fork, so a worker connects only after it), then its own
 * connection and region, the closed loop, and its results to out_fd.
 */
static int worker_run(const opts *o, int in_fd, int out_fd, int index)
{
    gpucd_tensor w[7];
    if (read_all(in_fd, w, sizeof w) != 0)
        return 1; /* the parent could not upload the weights */
    gpucd_client *c;
    int rv = gpucd_connect(o->url, NULL, &c);
    if (rv < 0) {
        fprintf(stderr, "worker %d: connect: %s\n", index, gpucd_errmsg(NULL));
        return 1;
    }
    const size_t obs_bytes = (size_t)o->batch * GPUCD_NMMO3_OBS_BYTES;
    const size_t hid_at = (obs_bytes + 63) / 64 * 64;
    const size_t hid_n = (size_t)(o->batch * o->hidden);
    gpucd_region *r;
    if ((rv = gpucd_region_create(c, hid_at + hid_n * 2, &r)) < 0) {
        fprintf(stderr, "worker %d: region: %s\n", index, gpucd_errmsg(c));
        return 1;
    }
    uint8_t *base = gpucd_region_data(r);
    th_fill_nmmo3_obs(base, (size_t)o->batch);
    uint16_t *hid = (uint16_t *)(base + hid_at);
    const int64_t s_obs[2] = {o->batch, GPUCD_NMMO3_OBS_BYTES}, s_hid[2] = {o->batch, o->hidden};
    gpucd_tensor obs = gpucd_tensor_region(r, 0, GPUCD_U8, 2, s_obs);
    gpucd_tensor out = gpucd_tensor_region(r, hid_at, GPUCD_BF16, 2, s_hid);
    gpucd_nmmo3_weights nw = {&w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6]};
    uint32_t *samples = malloc(sizeof *samples * MAX_SAMPLES);
    worker_result res = {0};
    if (samples == NULL)
        return 1;
    const uint64_t t0 = now_us(), t_measure = t0 + (uint64_t)(o->warmup_s * 1e6),
                   t_end = t_measure + (uint64_t)(o->seconds * 1e6);
    for (uint64_t t = t0; t < t_end; t = now_us()) {
        hid[0] = hid[hid_n - 1] = 0x7fc0; /* NaN: an unwritten output fails the check */
        gpucd_timings tm;
        uint64_t start = now_us();
        rv = o->ping ? gpucd_ping(c, &tm) : gpucd_nmmo3_encode(c, &nw, &obs, NULL, &out, &tm);
        uint64_t done = now_us();
        int ok = rv == 0 && (o->ping || (hid[0] != 0x7fc0 && hid[hid_n - 1] != 0x7fc0));
        if (start < t_measure)
            continue;
        if (!ok) {
            if (res.errors++ == 0)
                fprintf(stderr, "worker %d: %s\n", index,
                        rv < 0 ? gpucd_errmsg(c) : "an output was left unwritten");
            continue;
        }
        res.requests++;
        const uint64_t split[SPLIT_N] = {tm.queue_us,   tm.batch_wait_us, tm.copy_in_us,
                                         tm.compute_us, tm.copy_out_us,   tm.total_us};
        for (int k = 0; k < SPLIT_N; k++)
            res.split_us[k] += split[k];
        if (res.nsamples < MAX_SAMPLES)
            samples[res.nsamples++] = (uint32_t)(done - start);
    }
    int bad = write_all(out_fd, &res, sizeof res) ||
              write_all(out_fd, samples, sizeof *samples * res.nsamples);
    free(samples);
    gpucd_region_destroy(r);
    gpucd_close(c);
    return bad;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int usage(void)
{
    fprintf(stderr, "usage: crowd_bench URL [--workers N] [--batch B] [--hidden H] "
                    "[--warmup-s S] [--seconds S] [--ping 0|1]\n");
    return 2;
}

int main(int argc, char **argv)
{
    opts o = {NULL, 64, 64, 512, 2.0, 4.0, 0};
    if (argc < 2)
        return usage();
    o.url = argv[1];
    th_seed();
    for (int i = 2; i + 1 < argc; i += 2) {
        double v = strtod(argv[i + 1], NULL);
        if (strcmp(argv[i], "--workers") == 0 && v >= 1 && v <= MAX_WORKERS)
            o.workers = (int)v;
        else if (strcmp(argv[i], "--batch") == 0 && v >= 1 && v <= 1 << 20)
            o.batch = (int64_t)v;
        else if (strcmp(argv[i], "--hidden") == 0 && v >= 1 && v <= 1 << 16)
            o.hidden = (int64_t)v;
        else if (strcmp(argv[i], "--warmup-s") == 0 && v >= 0 && v <= 3600)
            o.warmup_s = v;
        else if (strcmp(argv[i], "--seconds") == 0 && v > 0 && v <= 3600)
            o.seconds = v;
        else if (strcmp(argv[i], "--ping") == 0 && (v == 0 || v == 1))
            o.ping = (int)v;
        else
            return usage();
    }
    if ((argc - 2) % 2 != 0)
        return usage();
    /* The workers first: nng must not be initialised in a process that forks. */
    int to_worker[MAX_WORKERS], from_worker[MAX_WORKERS];
    pid_t pids[MAX_WORKERS];
    for (int i = 0; i < o.workers; i++) {
        int in[2], out[2];
        if (pipe(in) != 0 || pipe(out) != 0 || (pids[i] = fork()) < 0) {
            perror("crowd_bench: starting a worker");
            return 1;
        }
        if (pids[i] == 0) {
            close(in[1]), close(out[0]);
            _exit(worker_run(&o, in[0], out[1], i));
        }
        close(in[0]), close(out[1]);
        to_worker[i] = in[1], from_worker[i] = out[0];
    }
    /* Then the shared weights, resident while this connection lasts, and their ids to everyone. */
    gpucd_client *c = NULL;
    gpucd_tensor w[7];
    int rv = gpucd_connect(o.url, NULL, &c);
    if (rv < 0 || (rv = weights_put(c, o.hidden, w)) < 0)
        fprintf(stderr, "crowd_bench: %s\n", gpucd_errmsg(c));
    for (int i = 0; i < o.workers; i++) {
        if (rv == 0)
            (void)write_all(to_worker[i], w, sizeof w);
        close(to_worker[i]); /* without the ids a worker ends at once */
    }
    int *fds = from_worker;
    uint32_t *all = malloc(sizeof *all * (size_t)MAX_SAMPLES * 4);
    size_t nall = 0, cap = (size_t)MAX_SAMPLES * 4;
    uint64_t requests = 0, errors = 0, split_us[SPLIT_N] = {0};
    int failed = all == NULL || rv < 0;
    for (int i = 0; i < o.workers; i++) {
        worker_result res;
        if (read_all(fds[i], &res, sizeof res) != 0) {
            failed = 1;
            continue;
        }
        uint32_t *s = malloc(sizeof *s * (res.nsamples ? res.nsamples : 1));
        if (s == NULL || read_all(fds[i], s, sizeof *s * res.nsamples) != 0)
            failed = 1;
        for (uint32_t k = 0; s != NULL && all != NULL && k < res.nsamples && nall < cap; k++)
            all[nall++] = s[k];
        free(s);
        close(fds[i]);
        requests += res.requests, errors += res.errors;
        for (int k = 0; k < SPLIT_N; k++)
            split_us[k] += res.split_us[k];
    }
    for (int i = 0; i < o.workers; i++) {
        int st;
        if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed = 1;
    }
    gpucd_close(c);
    if (failed || nall == 0) {
        fprintf(stderr, "crowd_bench: %s\n",
                failed ? "a worker failed" : "no request ended inside the measured window");
        free(all);
        return 1;
    }
    qsort(all, nall, sizeof *all, cmp_u32);
    const int64_t rows = o.ping ? 0 : o.batch; /* a ping carries none */
    printf("workers %d %s %lld: %.0f rows/s, %.0f requests/s, p50 %u us, p99 %u us, max %u us, "
           "errors %llu; means:",
           o.workers, o.ping ? "pings, rows" : "batch", (long long)rows,
           (double)requests * (double)rows / o.seconds,
           (double)requests / o.seconds, all[nall / 2], all[(size_t)((double)nall * 0.99)],
           all[nall - 1], (unsigned long long)errors);
    for (int k = 0; k < SPLIT_N; k++)
        printf(" %s %.0f us%s", split_names[k],
               requests ? (double)split_us[k] / (double)requests : 0.0, k + 1 < SPLIT_N ? "," : "\n");
    free(all);
    return errors != 0;
}
