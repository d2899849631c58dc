/*
 * bench.c - the measurement of `gpucdctl bench` (see bench.h).
 *
 * Each level (a concurrency, or a request rate) runs worker threads that issue
 * the operation on one shared connection, each with its own tensors: in a
 * shared-memory region over ipc://, inline in the messages over tcp://.  After
 * a warm-up (at least one request answered), time is cut into windows, each at
 * least --window-s long and stretched until it holds a third of --min-requests,
 * so that a slow operation is measured as surely as a fast one (NVIDIA's
 * perf_analyzer counts requests as well as time in the same way).  The level
 * ends when three windows in a row agree on throughput within the tolerance
 * (or at the window cap, marked unstable), and its figures come from those
 * last three windows.  A level cut off by --max-level-s with fewer than
 * --min-requests measured is an error, never a row of figures.
 *
 * Every reply is checked: a failed call is an error, and so is an output whose
 * first or last element (poisoned with NaN before the call) was not written.
 * Neither is ever timed.  Before any of that, one request at a small batch is
 * compared in full with the CPU kernels.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "ctl_format.h"
#include "gk_bf16.h"

enum { BENCH_MAX_LEVELS = 64, BENCH_MAX_WORKERS = 1024, BENCH_MAX_WINDOWS = 1000 };

/* A percentile with fewer samples than this beyond it is flagged as rough: p99 wants
 * 1000 requests, p50 20. */
enum { BENCH_TAIL_SAMPLES = 10 };
/* An open-loop level that reached less than this share of --rate did not sustain it. */
#define BENCH_RATE_SUSTAINED 0.9
/* The percentiles reported, with their names. */
#define BENCH_PERCENTILES(X) X(p50, 0.50) X(p90, 0.90) X(p95, 0.95) X(p99, 0.99)
#define BENCH_PCT_ENUM(name, q) BENCH_PCT_##name,
enum { BENCH_PERCENTILES(BENCH_PCT_ENUM) BENCH_NPCT };
#define BENCH_PCT_Q(name, q) q,
static const double bench_pct_q[BENCH_NPCT] = {BENCH_PERCENTILES(BENCH_PCT_Q)};
#define BENCH_PCT_NAME(name, q) #name,
static const char *const bench_pct_name[BENCH_NPCT] = {BENCH_PERCENTILES(BENCH_PCT_NAME)};

typedef struct bench_opts {
    const bench_preset *preset;
    bench_shape shape;
    int levels[BENCH_MAX_LEVELS];
    int nlevels;
    double rate;        /* requests/s; 0: closed loop */
    double warmup_s, window_s, tolerance, max_level_s;
    int max_windows;
    int min_requests; /* measured a level, at least */
    int inline_tensors; /* inline even over ipc:// */
    uint64_t seed;
    const char *json_path, *csv_path;
    bench_server_opts server; /* iterations > 0: --server-side */
} bench_opts;

/* One successful request. */
typedef struct bench_record {
    uint64_t done_us, latency_us;
    int window; /* the window it was counted in; -1 in the warm-up */
    gpucd_timings t;
} bench_record;

/* The per-request tensors of one worker (or of the check request). */
typedef struct bench_ioset {
    int n;
    bench_spec spec[BENCH_MAX_TENSORS];
    gpucd_tensor t[BENCH_MAX_TENSORS];
    void *data[BENCH_MAX_TENSORS];
    gpucd_region *region;
    void *heap;
} bench_ioset;

struct bench_run;

typedef struct bench_worker {
    struct bench_run *run;
    pthread_t thread;
    bench_ioset io;
    bench_record *rec;
    size_t nrec, caprec;
    uint64_t calls, errors, wrong;
    int first_code;
    char first_msg[256];
} bench_worker;

typedef struct bench_run {
    gpucd_client *client;
    const char *url;
    bench_opts *o;
    int use_region;
    int nweights;
    bench_spec wspec[BENCH_MAX_TENSORS];
    gpucd_tensor w[BENCH_MAX_TENSORS];
    bench_worker *workers;
    int nworkers;
    bench_progress *progress;
    /* the level being run */
    atomic_int stop;
    atomic_uint_fast64_t next_k;
    uint64_t t_start;
    double rate;
    /* Under lock: every answered request is counted in the window open when it came
     * (window -1: the warm-up), so that the counts and the records always agree. */
    pthread_mutex_t lock;
    pthread_cond_t counted; /* a window reached `need`, the warm-up its first, or a failure */
    int window;
    uint64_t need, warm_count, failures;
    uint64_t win_count[BENCH_MAX_WINDOWS + 1];
    uint64_t win_start[BENCH_MAX_WINDOWS + 2]; /* window i is [win_start[i], win_start[i+1]) */
} bench_run;

/* How a level ended. */
typedef enum bench_end { BENCH_END_STABLE, BENCH_END_MAX_WINDOWS, BENCH_END_MAX_LEVEL_S } bench_end;
static const char *const bench_end_name[] = {"stable", "max_windows", "max_level_s"};

/* What a level measured. */
typedef struct bench_level {
    int concurrency;
    double rate;
    int windows, stable;
    bench_end ended;
    int few[BENCH_NPCT];  /* the percentile has fewer than BENCH_TAIL_SAMPLES beyond it */
    int too_few;          /* fewer than --min-requests measured: an error */
    int rate_sustained;   /* under --rate: at least BENCH_RATE_SUSTAINED of it reached */
    uint64_t requests, errors, wrong;
    double seconds, rps, rows_per_s;
    double pct[BENCH_NPCT], max; /* microseconds */
    double transport, queue, batch_wait, copy_in, compute, copy_out, server_other; /* means, us */
    double overhead_p50, overhead_p99; /* the daemon's own time a request: queue + other, us */
    char first_error[256];
} bench_level;

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void sleep_until_us(uint64_t t)
{
    struct timespec ts = {.tv_sec = (time_t)(t / 1000000u), .tv_nsec = (long)(t % 1000000u) * 1000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

/* ---- tensors ------------------------------------------------------------------------ */

static int is_float(gpucd_dtype dt) { return dt == GPUCD_F32 || dt == GPUCD_BF16 || dt == GPUCD_F16; }

static double element(const void *data, gpucd_dtype dt, int64_t i)
{
    switch (dt) {
    case GPUCD_F32: return ((const float *)data)[i];
    case GPUCD_BF16: return gk_bf16_to_f32(((const uint16_t *)data)[i]);
    case GPUCD_F16: return gk_f16_to_f32(((const uint16_t *)data)[i]);
    default: return 0;
    }
}

/* NaN in the first and last element of an output, so that one left unwritten shows. */
static void canary_set(const bench_spec *sp, void *data)
{
    int64_t n = bench_spec_numel(sp);
    size_t es = gpucd_dtype_size(sp->dtype);
    if (!is_float(sp->dtype) || n == 0)
        return;
    memset(data, 0xff, es);
    memset((char *)data + (size_t)(n - 1) * es, 0xff, es);
}

static int canary_ok(const bench_spec *sp, const void *data)
{
    int64_t n = bench_spec_numel(sp);
    if (!is_float(sp->dtype) || n == 0)
        return 1;
    return isfinite(element(data, sp->dtype, 0)) && isfinite(element(data, sp->dtype, n - 1));
}

static void ioset_free(gpucd_client *client, bench_ioset *s)
{
    for (int i = 0; i < s->n; i++)
        if (s->spec[i].resident && s->t[i].where == GPUCD_RESIDENT)
            gpucd_tensor_free(client, s->t[i].resident);
    if (s->region != NULL)
        gpucd_region_destroy(s->region);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

/* Lays out the preset's tensors at `batch` rows in one region (ipc) or heap block, inputs filled. */
static int ioset_alloc(bench_run *r, bench_ioset *s, int64_t batch, uint64_t *rng)
{
    memset(s, 0, sizeof *s);
    s->n = r->o->preset->io(&r->o->shape, batch, s->spec);
    size_t total = 64;
    for (int i = 0; i < s->n; i++)
        total += align64(bench_spec_bytes(&s->spec[i]));
    char *base;
    if (r->use_region) {
        int rc = gpucd_region_create(r->client, total, &s->region);
        if (rc < 0) {
            fprintf(stderr, "gpucdctl bench: cannot create a %zu-byte region: %s (%s)\n", total,
                    gpucd_errmsg(r->client), gpucd_strerror(rc));
            return rc;
        }
        base = gpucd_region_data(s->region);
    } else {
        s->heap = aligned_alloc(64, align64(total));
        if (s->heap == NULL) {
            fprintf(stderr, "gpucdctl bench: out of memory for %zu bytes of tensors\n", total);
            return GPUCD_ENOMEM;
        }
        base = s->heap;
    }
    size_t off = 0;
    for (int i = 0; i < s->n; i++) {
        const bench_spec *sp = &s->spec[i];
        if (sp->resident) { /* created by the first request that writes it */
            s->t[i] = gpucd_tensor_new_resident(sp->dtype, 0, NULL);
            continue;
        }
        s->data[i] = base + off;
        s->t[i] = r->use_region ? gpucd_tensor_region(s->region, off, sp->dtype, sp->ndim, sp->shape)
                                : gpucd_tensor_host(s->data[i], sp->dtype, sp->ndim, sp->shape);
        if (!sp->output)
            bench_fill(sp, &r->o->shape, s->data[i], rng);
        off += align64(bench_spec_bytes(sp));
    }
    return 0;
}

/* ---- weights and the check request ----------------------------------------------------- */

static int weights_upload(bench_run *r, void **host, uint64_t *rng)
{
    const bench_opts *o = r->o;
    r->nweights = o->preset->weights(&o->shape, r->wspec);
    for (int i = 0; i < r->nweights; i++) {
        const bench_spec *sp = &r->wspec[i];
        size_t bytes = bench_spec_bytes(sp);
        host[i] = malloc(bytes ? bytes : 1);
        if (host[i] == NULL) {
            fprintf(stderr, "gpucdctl bench: out of memory for weight %s\n", sp->name);
            return GPUCD_ENOMEM;
        }
        bench_fill(sp, &o->shape, host[i], rng);
        gpucd_tensor src;
        gpucd_region *reg = NULL;
        int rc = 0;
        if (r->use_region) { /* weights may exceed the message limit: put them from a region */
            rc = gpucd_region_create(r->client, bytes, &reg);
            if (rc == 0) {
                memcpy(gpucd_region_data(reg), host[i], bytes);
                src = gpucd_tensor_region(reg, 0, sp->dtype, sp->ndim, sp->shape);
            }
        } else {
            src = gpucd_tensor_host(host[i], sp->dtype, sp->ndim, sp->shape);
        }
        uint64_t id = 0;
        if (rc == 0)
            rc = gpucd_tensor_put(r->client, &src, &id);
        if (reg != NULL)
            gpucd_region_destroy(reg);
        if (rc < 0) {
            fprintf(stderr, "gpucdctl bench: uploading weight %s: %s (%s)\n", sp->name,
                    gpucd_errmsg(r->client), gpucd_strerror(rc));
            return rc;
        }
        r->w[i] = gpucd_tensor_resident(id, sp->dtype, sp->ndim, sp->shape);
    }
    return 0;
}

static void weights_free(bench_run *r)
{
    for (int i = 0; i < r->nweights; i++)
        gpucd_tensor_free(r->client, r->w[i].resident);
}

typedef struct bench_check {
    int done;
    int64_t batch;
    double worst; /* largest relative L2 error over the outputs */
    char worst_name[32];
} bench_check;

/* ||a - b|| / ||b|| over n elements. */
static double rel_err(const void *got, const void *want, gpucd_dtype dt, int64_t n, int *nonfinite)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = element(got, dt, i), w = element(want, dt, i);
        if (!isfinite(g))
            *nonfinite = 1;
        num += (g - w) * (g - w);
        den += w * w;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/*
 * One request at a small batch with every output poisoned, compared with the CPU
 * kernels: f32 outputs of an f32 operation within 1e-4 (the daemon may sum in another
 * order); everything of a bf16/f16 operation within 2e-2, f32 outputs too: a bf16
 * step's f32 weight gradients sum products of bf16-rounded values, which the GPU rounds
 * at other points than the CPU (measured on the H200: 1.7e-3 to 2.8e-3).
 */
static int check_once(bench_run *r, void *const *whost, bench_check *chk, uint64_t *rng)
{
    const bench_preset *p = r->o->preset;
    memset(chk, 0, sizeof *chk);
    if (p->reference == NULL)
        return 0;
    chk->batch = p->verify_batch(&r->o->shape);
    bench_ioset s;
    int rc = ioset_alloc(r, &s, chk->batch, rng);
    if (rc < 0)
        return rc;
    void *ref[BENCH_MAX_TENSORS] = {0};
    for (int i = 0; i < s.n; i++)
        if (s.spec[i].output) {
            size_t bytes = bench_spec_bytes(&s.spec[i]);
            memset(s.data[i], 0xff, bytes);
            ref[i] = malloc(bytes ? bytes : 1);
            if (ref[i] == NULL) {
                rc = GPUCD_ENOMEM;
                goto out;
            }
            memset(ref[i], 0xff, bytes);
        }
    gpucd_timings t;
    rc = p->call(r->client, &r->o->shape, r->w, s.t, &t);
    if (rc < 0) {
        fprintf(stderr, "gpucdctl bench: the check request (%s, batch %" PRId64 ") failed: %s (%s)\n",
                p->name, chk->batch, gpucd_errmsg(r->client), gpucd_strerror(rc));
        goto out;
    }
    char msg[256] = "";
    if (p->reference(&r->o->shape, chk->batch, whost, s.data, ref, msg, sizeof msg) != 0) {
        fprintf(stderr, "gpucdctl bench: the CPU reference refused the check inputs: %s\n", msg);
        rc = GPUCD_EINVAL;
        goto out;
    }
    for (int i = 0; i < s.n; i++) {
        const bench_spec *sp = &s.spec[i];
        if (!sp->output || !is_float(sp->dtype))
            continue;
        int nonfinite = 0;
        double e = rel_err(s.data[i], ref[i], sp->dtype, bench_spec_numel(sp), &nonfinite);
        double tol = sp->dtype == GPUCD_F32 && r->o->shape.dtype == GPUCD_F32 ? 1e-4 : 2e-2;
        if (e > chk->worst || chk->worst_name[0] == '\0') {
            chk->worst = e;
            snprintf(chk->worst_name, sizeof chk->worst_name, "%s", sp->name);
        }
        if (nonfinite || !(e <= tol)) {
            fprintf(stderr, "gpucdctl bench: WRONG RESULT: %s output %s differs from the CPU "
                            "kernels: relative L2 error %.3g (tolerance %.0e)%s\n",
                    p->name, sp->name, e, tol, nonfinite ? ", with non-finite values" : "");
            rc = GPUCD_EPROTO;
        }
    }
    chk->done = rc == 0;
out:
    for (int i = 0; i < s.n; i++)
        free(ref[i]);
    ioset_free(r->client, &s);
    return rc;
}

/* ---- the workers -------------------------------------------------------------------- */

static void record_push(bench_worker *w, const bench_record *rec)
{
    if (w->nrec == w->caprec) {
        size_t cap = w->caprec ? w->caprec * 2 : 4096;
        bench_record *n = realloc(w->rec, cap * sizeof *n);
        if (n == NULL)
            return; /* counted in the windows all the same; only its latency is lost */
        w->rec = n;
        w->caprec = cap;
    }
    w->rec[w->nrec++] = *rec;
}

/* A request failed or came back wrong: the level's windows stop waiting for counts. */
static void run_failed(bench_run *r)
{
    pthread_mutex_lock(&r->lock);
    r->failures++;
    pthread_cond_signal(&r->counted);
    pthread_mutex_unlock(&r->lock);
}

/* Counts an answered request in the window open now, and keeps it. */
static void run_counted(bench_run *r, bench_worker *w, bench_record *rec)
{
    pthread_mutex_lock(&r->lock);
    rec->window = r->window;
    if (rec->window < 0) {
        if (r->warm_count++ == 0)
            pthread_cond_signal(&r->counted);
    } else if (++r->win_count[rec->window] == r->need) {
        pthread_cond_signal(&r->counted);
    }
    pthread_mutex_unlock(&r->lock);
    record_push(w, rec);
}

static void *worker_main(void *arg)
{
    bench_worker *w = arg;
    bench_run *r = w->run;
    const bench_preset *p = r->o->preset;
    while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        uint64_t t_begin = 0;
        if (r->rate > 0) { /* open loop: request k is due at t_start + k/rate */
            uint64_t k = atomic_fetch_add(&r->next_k, 1);
            t_begin = r->t_start + (uint64_t)((double)k * 1e6 / r->rate);
            /* in steps of 0.1 s at most: the level's end must not wait for a request due
             * long after it (at a low rate, 16 workers hold the next 16 due times) */
            uint64_t now;
            while ((now = now_us()) < t_begin &&
                   !atomic_load_explicit(&r->stop, memory_order_relaxed))
                sleep_until_us(t_begin - now > 100000 ? now + 100000 : t_begin);
            if (atomic_load_explicit(&r->stop, memory_order_relaxed))
                break;
        }
        for (int i = 0; i < w->io.n; i++)
            if (w->io.spec[i].output)
                canary_set(&w->io.spec[i], w->io.data[i]);
        uint64_t t0 = now_us();
        if (r->rate <= 0)
            t_begin = t0;
        bench_record rec = {0};
        int rc = p->call(r->client, &r->o->shape, r->w, w->io.t, &rec.t);
        rec.done_us = now_us();
        w->calls++;
        if (rc < 0) {
            if (w->errors++ == 0) {
                w->first_code = rc;
                snprintf(w->first_msg, sizeof w->first_msg, "%s (%s)", gpucd_errmsg(r->client),
                         gpucd_strerror(rc));
            }
            run_failed(r);
            continue;
        }
        int ok = 1;
        for (int i = 0; i < w->io.n; i++)
            if (w->io.spec[i].output && !canary_ok(&w->io.spec[i], w->io.data[i]))
                ok = 0;
        if (!ok) {
            if (w->errors++ == 0)
                snprintf(w->first_msg, sizeof w->first_msg, "an output was left unwritten");
            w->wrong++;
            run_failed(r);
            continue;
        }
        rec.latency_us = rec.done_us - t_begin; /* from when it was due, under --rate */
        run_counted(r, w, &rec);
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const uint64_t *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)ceil(q * (double)n);
    return (double)v[i == 0 ? 0 : (i > n ? n : i) - 1];
}

/* Requests a level needs for percentile q to have BENCH_TAIL_SAMPLES beyond it. */
static uint64_t pct_samples_needed(double q)
{
    return (uint64_t)llround(BENCH_TAIL_SAMPLES / (1.0 - q));
}

/* With r->lock held: windows last-2..last (all closed) agree on requests a second. */
static int windows_agree(const bench_run *r, int last, double tol)
{
    if (last < 2)
        return 0;
    double lo = INFINITY, hi = 0;
    for (int i = last - 2; i <= last; i++) {
        uint64_t us = r->win_start[i + 1] - r->win_start[i];
        double rate = us > 0 ? (double)r->win_count[i] / (double)us : 0;
        lo = rate < lo ? rate : lo;
        hi = rate > hi ? rate : hi;
    }
    return lo > 0 && hi <= lo * (1.0 + tol);
}

/* With r->lock held: sleeps until time t (us) or a signal, a quarter second at most so
 * that the progress line moves. */
static void level_wait(bench_run *r, uint64_t t)
{
    uint64_t now = now_us();
    if (now >= t)
        return;
    uint64_t until = t - now > 250000 ? now + 250000 : t;
    struct timespec ts = {.tv_sec = (time_t)(until / 1000000u),
                          .tv_nsec = (long)(until % 1000000u) * 1000};
    pthread_cond_timedwait(&r->counted, &r->lock, &ts);
}

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/*
 * With r->lock held, the workers running: the warm-up, then the windows, until three
 * agree, --max-windows or --max-level-s.  Returns the last window; sets lv's end.
 */
static int level_windows(bench_run *r, bench_level *lv)
{
    const bench_opts *o = r->o;
    const uint64_t window_us = (uint64_t)(o->window_s * 1e6);
    const uint64_t deadline = r->t_start + (uint64_t)(o->max_level_s * 1e6);
    /* The warm-up: its time, then until something is answered (a first request pays for
     * what later ones find made: connections, resident tensors, the device's caches). */
    const uint64_t warm_end = min_u64(r->t_start + (uint64_t)(o->warmup_s * 1e6), deadline);
    bench_progress_detail(r->progress, "warming up");
    while (now_us() < warm_end)
        level_wait(r, warm_end);
    while (o->warmup_s > 0 && r->warm_count == 0 && r->failures == 0 && now_us() < deadline)
        level_wait(r, deadline);
    r->window = 0;
    r->win_start[0] = now_us();
    lv->ended = BENCH_END_MAX_WINDOWS;
    int last = 0;
    for (int i = 0; i < o->max_windows; i++) {
        const uint64_t end = min_u64(r->win_start[i] + window_us, deadline);
        uint64_t now;
        while ((now = now_us()) < end || (r->win_count[i] < r->need && r->failures == 0 &&
                                          now < deadline)) {
            bench_progress_detail(r->progress, "window %d: %" PRIu64 " of %" PRIu64 " requests",
                                  i + 1, r->win_count[i], r->need);
            level_wait(r, now < end ? end : deadline);
        }
        r->window = i + 1; /* later answers are counted past the measurement */
        r->win_start[i + 1] = now;
        last = i;
        if (now >= deadline) {
            lv->ended = BENCH_END_MAX_LEVEL_S;
            break;
        }
        if (windows_agree(r, i, o->tolerance)) {
            lv->ended = BENCH_END_STABLE;
            break;
        }
    }
    return last;
}

static int level_run(bench_run *r, int concurrency, double rate, bench_level *lv)
{
    const bench_opts *o = r->o;
    memset(lv, 0, sizeof *lv);
    lv->concurrency = concurrency;
    lv->rate = rate;
    atomic_store(&r->stop, 0);
    atomic_store(&r->next_k, 0);
    r->rate = rate;
    r->window = -1;
    r->need = ((uint64_t)o->min_requests + 2) / 3; /* the level's figures come from 3 windows */
    r->warm_count = r->failures = 0;
    memset(r->win_count, 0, sizeof r->win_count);
    r->t_start = now_us();
    for (int i = 0; i < concurrency; i++) {
        bench_worker *w = &r->workers[i];
        w->nrec = 0;
        w->calls = w->errors = w->wrong = 0;
        w->first_msg[0] = '\0';
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            fprintf(stderr, "gpucdctl bench: cannot start worker thread %d\n", i);
            atomic_store(&r->stop, 1);
            for (int j = 0; j < i; j++)
                pthread_join(r->workers[j].thread, NULL);
            return GPUCD_ESYSTEM;
        }
    }
    pthread_mutex_lock(&r->lock);
    int last = level_windows(r, lv);
    pthread_mutex_unlock(&r->lock);
    bench_progress_detail(r->progress, "waiting for the requests in flight");
    atomic_store(&r->stop, 1);
    for (int i = 0; i < concurrency; i++)
        pthread_join(r->workers[i].thread, NULL);

    lv->windows = last + 1;
    lv->stable = lv->ended == BENCH_END_STABLE;
    int first = last >= 2 ? last - 2 : 0;
    uint64_t lo = r->win_start[first], hi = r->win_start[last + 1];
    size_t n = 0;
    for (int i = 0; i < concurrency; i++) {
        bench_worker *w = &r->workers[i];
        n += w->nrec;
        lv->errors += w->errors;
        lv->wrong += w->wrong;
        if (w->errors > 0 && lv->first_error[0] == '\0')
            snprintf(lv->first_error, sizeof lv->first_error, "%s", w->first_msg);
    }
    uint64_t *lat = malloc((n ? n : 1) * sizeof *lat);
    uint64_t *overhead = malloc((n ? n : 1) * sizeof *overhead);
    if (lat == NULL || overhead == NULL) {
        free(lat);
        free(overhead);
        return GPUCD_ENOMEM;
    }
    size_t m = 0;
    double sums[7] = {0};
    for (int i = 0; i < concurrency; i++) {
        bench_worker *w = &r->workers[i];
        for (size_t j = 0; j < w->nrec; j++) {
            const bench_record *rec = &w->rec[j];
            if (rec->window < first || rec->window > last)
                continue;
            lat[m++] = rec->latency_us;
            const gpucd_timings *t = &rec->t;
            uint64_t parts = t->queue_us + t->batch_wait_us + t->copy_in_us + t->compute_us +
                             t->copy_out_us;
            sums[0] += t->round_trip_us > t->total_us ? (double)(t->round_trip_us - t->total_us) : 0;
            sums[1] += (double)t->queue_us;
            sums[2] += (double)t->copy_in_us;
            sums[3] += (double)t->compute_us;
            sums[4] += (double)t->copy_out_us;
            const uint64_t other = t->total_us > parts ? t->total_us - parts : 0;
            sums[5] += (double)other;
            sums[6] += (double)t->batch_wait_us;
            overhead[m - 1] = t->queue_us + other;
        }
    }
    qsort(lat, m, sizeof *lat, cmp_u64);
    qsort(overhead, m, sizeof *overhead, cmp_u64);
    lv->overhead_p50 = pct(overhead, m, 0.50);
    lv->overhead_p99 = pct(overhead, m, 0.99);
    lv->requests = m;
    lv->seconds = (double)(hi - lo) * 1e-6;
    lv->rps = lv->seconds > 0 ? (double)m / lv->seconds : 0;
    lv->rows_per_s = lv->rps * (double)o->shape.batch;
    for (int k = 0; k < BENCH_NPCT; k++) {
        lv->pct[k] = pct(lat, m, bench_pct_q[k]);
        lv->few[k] = m < pct_samples_needed(bench_pct_q[k]);
    }
    lv->max = m ? (double)lat[m - 1] : 0;
    lv->too_few = m < (size_t)o->min_requests;
    lv->rate_sustained = rate <= 0 || lv->rps >= BENCH_RATE_SUSTAINED * rate;
    double *means[7] = {&lv->transport, &lv->queue,    &lv->copy_in,   &lv->compute,
                        &lv->copy_out,  &lv->server_other, &lv->batch_wait};
    for (int k = 0; k < 7; k++)
        *means[k] = m ? sums[k] / (double)m : 0;
    free(lat);
    free(overhead);
    return 0;
}

/* ---- reports ------------------------------------------------------------------------ */

static void print_header(FILE *f)
{
    fprintf(f, "%6s %9s %11s %13s | %9s %9s %9s %9s %9s | %9s %9s %9s %9s %9s %9s %9s | %s\n",
            "conc", "rate", "req/s", "rows/s", "p50", "p90", "p95", "p99", "max", "transport",
            "queue", "batch", "copy_in", "compute", "cp_out", "other", "windows, errors");
}

/* The level's row on stdout; what makes its figures rough or wrong, on stderr. */
static void print_level(FILE *f, const bench_opts *o, const bench_level *lv)
{
    char rate[16], p[BENCH_NPCT][16], mx[16], split[7][16];
    if (lv->rate > 0)
        snprintf(rate, sizeof rate, "%.0f", lv->rate);
    else
        snprintf(rate, sizeof rate, "-");
    const double none = -1; /* "-": no request measured, no time to show */
    for (int k = 0; k < BENCH_NPCT; k++) {
        ctl_format_us(lv->requests ? lv->pct[k] : none, p[k], sizeof p[k] - 1);
        if (lv->few[k] && lv->requests > 0)
            strcat(p[k], "*");
    }
    const double means[7] = {lv->transport, lv->queue,    lv->batch_wait,  lv->copy_in,
                             lv->compute,   lv->copy_out, lv->server_other};
    for (int k = 0; k < 7; k++)
        ctl_format_us(lv->requests ? means[k] : none, split[k], sizeof split[k]);
    fprintf(f, "%6d %9s %11.1f %13.0f | %9s %9s %9s %9s %9s | %9s %9s %9s %9s %9s %9s %9s | "
               "%d%s, %" PRIu64 "\n",
            lv->concurrency, rate, lv->rps, lv->rows_per_s, p[0], p[1], p[2], p[3],
            ctl_format_us(lv->requests ? lv->max : none, mx, sizeof mx), split[0], split[1],
            split[2], split[3], split[4], split[5], split[6], lv->windows,
            lv->ended == BENCH_END_STABLE        ? ""
            : lv->ended == BENCH_END_MAX_WINDOWS ? " (unstable)"
                                                 : " (cut off)",
            lv->errors);
    char o50[16], o99[16];
    if (lv->requests > 0)
        fprintf(f, "       daemon overhead (queue + other) a request: p50 %s, p99 %s\n",
                ctl_format_us(lv->overhead_p50, o50, sizeof o50),
                ctl_format_us(lv->overhead_p99, o99, sizeof o99));
    int nfew = 0, worst = 0;
    for (int k = 0; k < BENCH_NPCT; k++)
        if (lv->few[k] && lv->requests > 0) {
            fprintf(f, "%s%s*", nfew++ ? ", " : "       ", bench_pct_name[k]);
            worst = k;
        }
    if (nfew > 0)
        fprintf(f, " from fewer than %d samples beyond it: rough (%" PRIu64 " requests measured; "
                   "%s needs %" PRIu64 ": --min-requests)\n",
                BENCH_TAIL_SAMPLES, lv->requests, bench_pct_name[worst],
                pct_samples_needed(bench_pct_q[worst]));
    if (lv->errors > 0)
        fprintf(f, "       errors: %" PRIu64 " (%" PRIu64 " with unwritten outputs); first: %s\n",
                lv->errors, lv->wrong, lv->first_error);
    fflush(f);
    char level[64];
    if (lv->rate > 0)
        snprintf(level, sizeof level, "concurrency %d, rate %s", lv->concurrency, rate);
    else
        snprintf(level, sizeof level, "concurrency %d", lv->concurrency);
    if (lv->too_few) {
        char took[16];
        fprintf(stderr, "gpucdctl bench: ERROR: the level at %s measured %" PRIu64
                        " request%s, fewer than the minimum of %d (--min-requests)",
                level, lv->requests, lv->requests == 1 ? "" : "s", o->min_requests);
        if (lv->ended == BENCH_END_MAX_LEVEL_S)
            fprintf(stderr, ": cut off by --max-level-s %g", o->max_level_s);
        if (lv->errors > 0)
            fprintf(stderr, "; %" PRIu64 " requests failed", lv->errors);
        else if (lv->requests > 0)
            fprintf(stderr, "; a request took %s at p50: lower --min-requests or raise "
                            "--max-level-s",
                    ctl_format_us(lv->pct[BENCH_PCT_p50], took, sizeof took));
        fprintf(stderr, "\n");
    }
    if (!lv->rate_sustained)
        fprintf(stderr, "gpucdctl bench: warning: the daemon did not sustain --rate %s at %s: "
                        "%.1f requests/s reached; requests waited in gpucdctl for one of the %d "
                        "outstanding, and their latencies count from when each was due "
                        "(lower --rate or raise --concurrency)\n",
                rate, level, lv->rps, lv->concurrency);
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

typedef struct bench_summary {
    uint64_t requests, errors;
    const bench_check *check;
    const bench_server_result *server; /* NULL: no --server-side */
    const bench_server_opts *server_opts;
} bench_summary;

static int write_json(const char *path, const bench_run *r, const bench_level *lv, int n,
                      const bench_summary *sum)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "gpucdctl bench: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    const bench_opts *o = r->o;
    fprintf(f, "{\"url\":");
    json_string(f, r->url);
    fprintf(f, ",\"op\":\"%s\",\"tensors\":\"%s\",\"batch\":%" PRId64 ",\"dtype\":\"%s\","
               "\"seed\":%" PRIu64 ",\"warmup_s\":%g,\"window_s\":%g,\"tolerance\":%g,"
               "\"min_requests\":%d,\"max_level_s\":%g,",
            o->preset->name, r->use_region ? "region" : "inline", o->shape.batch,
            gpucd_dtype_name(o->shape.dtype), o->seed, o->warmup_s, o->window_s, o->tolerance,
            o->min_requests, o->max_level_s);
    fprintf(f, "\"check\":{\"done\":%s,\"batch\":%" PRId64 ",\"worst_rel_err\":%.3g,"
               "\"worst_output\":\"%s\"},",
            sum->check->done ? "true" : "false", sum->check->batch, sum->check->worst,
            sum->check->worst_name);
    if (sum->server != NULL) {
        const bench_server_result *sv = sum->server;
        fprintf(f, "\"server_side\":{\"warmup\":%d,\"iterations\":%d,\"iterations_done\":%u,"
                   "\"timed_requests\":%d,\"compute_us\":{\"median\":%.3f,\"min\":%.3f,"
                   "\"max\":%.3f},\"tflops\":%.4f},",
                sum->server_opts->warmup, sum->server_opts->iterations, sv->iterations_done,
                sv->requests, sv->median_us, sv->min_us, sv->max_us, sv->tflops);
    }
    fprintf(f, "\"requests\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"levels\":[", sum->requests,
            sum->errors);
    for (int i = 0; i < n; i++) {
        const bench_level *l = &lv[i];
        fprintf(f, "%s{\"concurrency\":%d,\"rate\":%g,\"windows\":%d,\"stable\":%s,"
                   "\"ended\":\"%s\",\"requests\":%" PRIu64 ",\"errors\":%" PRIu64 ","
                   "\"seconds\":%.3f,\"requests_per_s\":%.2f,\"rows_per_s\":%.1f,",
                i ? "," : "", l->concurrency, l->rate, l->windows, l->stable ? "true" : "false",
                bench_end_name[l->ended], l->requests, l->errors, l->seconds, l->rps,
                l->rows_per_s);
        if (l->rate > 0)
            fprintf(f, "\"rate_sustained\":%s,", l->rate_sustained ? "true" : "false");
        if (l->too_few)
            fprintf(f, "\"error\":\"fewer than min_requests measured\",");
        fprintf(f, "\"latency_us\":{");
        for (int k = 0; k < BENCH_NPCT; k++)
            fprintf(f, "\"%s\":%.0f,", bench_pct_name[k], l->pct[k]);
        fprintf(f, "\"max\":%.0f},\"few_samples\":[", l->max);
        for (int k = 0, nfew = 0; k < BENCH_NPCT; k++)
            if (l->few[k])
                fprintf(f, "%s\"%s\"", nfew++ ? "," : "", bench_pct_name[k]);
        fprintf(f, "],");
        fprintf(f, "\"split_us\":{\"client_transport\":%.2f,\"server_queue\":%.2f,"
                   "\"batch_wait\":%.2f,\"copy_in\":%.2f,\"compute\":%.2f,\"copy_out\":%.2f,"
                   "\"server_other\":%.2f},\"daemon_overhead_us\":{\"p50\":%.0f,\"p99\":%.0f}",
                l->transport, l->queue, l->batch_wait, l->copy_in, l->compute, l->copy_out,
                l->server_other, l->overhead_p50, l->overhead_p99);
        if (l->errors > 0) {
            fprintf(f, ",\"first_error\":");
            json_string(f, l->first_error);
        }
        fprintf(f, "}");
    }
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? 0 : -1;
}

static int write_csv(const char *path, const bench_run *r, const bench_level *lv, int n)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "gpucdctl bench: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "op,tensors,batch,dtype,concurrency,rate,windows,stable,requests,errors,"
               "requests_per_s,rows_per_s,p50_us,p90_us,p95_us,p99_us,max_us,client_transport_us,"
               "server_queue_us,batch_wait_us,copy_in_us,compute_us,copy_out_us,server_other_us,"
               "overhead_p50_us,overhead_p99_us,ended,few_samples,rate_sustained\n");
    for (int i = 0; i < n; i++) {
        const bench_level *l = &lv[i];
        char few[32] = "";
        for (int k = 0; k < BENCH_NPCT; k++)
            if (l->few[k])
                snprintf(few + strlen(few), sizeof few - strlen(few), "%s%s", few[0] ? " " : "",
                         bench_pct_name[k]);
        fprintf(f, "%s,%s,%" PRId64 ",%s,%d,%g,%d,%d,%" PRIu64 ",%" PRIu64 ",%.2f,%.1f,%.0f,%.0f,"
                   "%.0f,%.0f,%.0f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.0f,%.0f,%s,%s,%d\n",
                r->o->preset->name, r->use_region ? "region" : "inline", r->o->shape.batch,
                gpucd_dtype_name(r->o->shape.dtype), l->concurrency, l->rate, l->windows,
                l->stable, l->requests, l->errors, l->rps, l->rows_per_s, l->pct[BENCH_PCT_p50],
                l->pct[BENCH_PCT_p90], l->pct[BENCH_PCT_p95], l->pct[BENCH_PCT_p99], l->max,
                l->transport, l->queue, l->batch_wait, l->copy_in, l->compute, l->copy_out,
                l->server_other, l->overhead_p50, l->overhead_p99, bench_end_name[l->ended], few,
                l->rate_sustained);
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* ---- options ------------------------------------------------------------------------ */

static void bench_usage(FILE *out)
{
    fprintf(out,
            "usage: gpucdctl [--url URL] bench [options]\n"
            "\n"
            "Drives the daemon with one operation and reports throughput, latency percentiles\n"
            "and the split of each request's time (from the reply timings).  Over ipc://\n"
            "tensors live in shared-memory regions; over tcp:// and tls+tcp:// they travel\n"
            "inline.\n"
            "\n"
            "  --op NAME             the operation (default ping); see the list below\n"
            "  --batch N             rows per request (the loss: N) instead of the preset's\n"
            "  --dtype f32|bf16      tensor dtype instead of the preset's\n"
            "  --hidden N            nmmo3 projection width (default 256)\n"
            "  --dim D --vocab V     the loss's D and V\n"
            "  --concurrency SPEC    N, or a sweep A:B:xK (multiply) or A:B:+K (add); default 1\n"
            "  --rate R              open loop: R requests/s, at most --concurrency outstanding\n"
            "                        (default 16); latency counts from when a request was due\n"
            "  --warmup-s S          warm-up per level, and until a request is answered (default 1;\n"
            "                        0: none)\n"
            "  --window-s S          shortest measurement window (default 1)\n"
            "  --min-requests N      requests a level must measure (default 50): each of its three\n"
            "                        windows stretches until it holds a third of N\n"
            "  --max-level-s S       longest a level may run, warm-up included (default 300); one\n"
            "                        cut off with fewer than --min-requests measured is an error\n"
            "  --max-windows N       windows before a level is reported unstable (default 10)\n"
            "  --tolerance F         windows agree when max/min - 1 <= F on requests/s (default\n"
            "                        0.10)\n"
            "  --inline              send tensors inline even over ipc://\n"
            "  --seed N              random inputs from this seed (default: from the clock)\n"
            "  --json FILE, --csv FILE   also write the results there\n"
            "  --server-side N       instead of the levels: the daemon runs the op, warm-up\n"
            "                        then N timed iterations (conv presets; N <= 10000), and\n"
            "                        reports its device time per iteration\n"
            "  --server-warmup W     warm-up runs before the timed ones (default 10)\n"
            "  --server-repeats R    requests of N iterations; the median is reported (default 5)\n"
            "\n"
            "A level ends when three windows in a row agree; its figures come from them.\n"
            "A percentile marked * has fewer than 10 samples beyond it (p99 needs 1000\n"
            "requests measured): read it as rough.  Under --rate, a level that reached less\n"
            "than 90%% of the rate is warned of: its latencies include time queued in gpucdctl.\n"
            "Progress goes to stderr: redrawn on a terminal, else a line every 10 s.\n"
            "Latency split (means): transport = client round trip - daemon total (both ways\n"
            "through the socket, or the submission queue and the completion record, and the\n"
            "client library); queue, batch (waiting to be merged\n"
            "with other requests), copy in, compute, copy out as the daemon timed them; other =\n"
            "the rest of the daemon's total (decode, validation, reply).  Exit status 1 when\n"
            "any request failed, a result was wrong or a level measured fewer than\n"
            "--min-requests.\n"
            "\n"
            "operations:\n");
    for (int i = 0; i < bench_preset_count; i++)
        fprintf(out, "  %-16s %s\n", bench_presets[i].name, bench_presets[i].summary);
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_f64(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

/* N, A:B:xK or A:B:+K (A:B means A:B:x2). */
static int parse_levels(const char *spec, bench_opts *o)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", spec);
    char *a = buf, *b = strchr(a, ':'), *step = NULL;
    int64_t lo, hi, k = 2;
    int mul = 1;
    if (b != NULL) {
        *b++ = '\0';
        step = strchr(b, ':');
        if (step != NULL) {
            *step++ = '\0';
            if (*step == 'x')
                mul = 1;
            else if (*step == '+')
                mul = 0;
            else
                return -1;
            if (parse_i64(step + 1, mul ? 2 : 1, BENCH_MAX_WORKERS, &k) != 0)
                return -1;
        }
    }
    if (parse_i64(a, 1, BENCH_MAX_WORKERS, &lo) != 0)
        return -1;
    hi = lo;
    if (b != NULL && (parse_i64(b, lo, BENCH_MAX_WORKERS, &hi) != 0))
        return -1;
    o->nlevels = 0;
    for (int64_t c = lo; c <= hi && o->nlevels < BENCH_MAX_LEVELS; c = mul ? c * k : c + k)
        o->levels[o->nlevels++] = (int)c;
    return 0;
}

static int parse_opts(int argc, char **argv, bench_opts *o)
{
    enum { O_OP = 256, O_BATCH, O_DTYPE, O_HIDDEN, O_DIM, O_VOCAB, O_CONC, O_RATE, O_WARMUP,
           O_WINDOW, O_MAXWIN, O_TOL, O_INLINE, O_SEED, O_JSON, O_CSV, O_SERVER, O_SWARMUP,
           O_SREPEATS, O_MINREQ, O_MAXLEVEL, O_HELP };
    static const struct option longopts[] = {
        {"op", required_argument, NULL, O_OP},
        {"batch", required_argument, NULL, O_BATCH},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"hidden", required_argument, NULL, O_HIDDEN},
        {"dim", required_argument, NULL, O_DIM},
        {"vocab", required_argument, NULL, O_VOCAB},
        {"concurrency", required_argument, NULL, O_CONC},
        {"rate", required_argument, NULL, O_RATE},
        {"warmup-s", required_argument, NULL, O_WARMUP},
        {"window-s", required_argument, NULL, O_WINDOW},
        {"max-windows", required_argument, NULL, O_MAXWIN},
        {"min-requests", required_argument, NULL, O_MINREQ},
        {"max-level-s", required_argument, NULL, O_MAXLEVEL},
        {"tolerance", required_argument, NULL, O_TOL},
        {"inline", no_argument, NULL, O_INLINE},
        {"seed", required_argument, NULL, O_SEED},
        {"json", required_argument, NULL, O_JSON},
        {"csv", required_argument, NULL, O_CSV},
        {"server-side", required_argument, NULL, O_SERVER},
        {"server-warmup", required_argument, NULL, O_SWARMUP},
        {"server-repeats", required_argument, NULL, O_SREPEATS},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    const char *op = "ping", *conc = NULL, *dtype = NULL;
    int64_t batch = -1, hidden = -1, dim = -1, vocab = -1, v;
    int rate_set = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o->seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    o->warmup_s = 1;
    o->window_s = 1;
    o->tolerance = 0.10;
    o->max_windows = 10;
    o->min_requests = 50;
    o->max_level_s = 300;
    o->server.warmup = 10;
    o->server.repeats = 5;
    optind = 0; /* 0, not 1: glibc then rescans from scratch (bench parses twice) */
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case O_OP: op = optarg; break;
        case O_BATCH: if (parse_i64(optarg, 1, INT64_C(1) << 31, &batch)) bad = "--batch"; break;
        case O_DTYPE: dtype = optarg; break;
        case O_HIDDEN: if (parse_i64(optarg, 1, 1 << 16, &hidden)) bad = "--hidden"; break;
        case O_DIM: if (parse_i64(optarg, 1, 1 << 20, &dim)) bad = "--dim"; break;
        case O_VOCAB: if (parse_i64(optarg, 1, INT64_C(1) << 31, &vocab)) bad = "--vocab"; break;
        case O_CONC: conc = optarg; break;
        case O_RATE: if (parse_f64(optarg, 0.001, 1e7, &o->rate)) bad = "--rate"; rate_set = 1; break;
        case O_WARMUP: if (parse_f64(optarg, 0, 3600, &o->warmup_s)) bad = "--warmup-s"; break;
        case O_WINDOW: if (parse_f64(optarg, 0.01, 3600, &o->window_s)) bad = "--window-s"; break;
        case O_MAXWIN:
            if (parse_i64(optarg, 3, BENCH_MAX_WINDOWS, &v)) bad = "--max-windows";
            else o->max_windows = (int)v;
            break;
        case O_MINREQ:
            if (parse_i64(optarg, 1, 1000000000, &v)) bad = "--min-requests";
            else o->min_requests = (int)v;
            break;
        case O_MAXLEVEL:
            if (parse_f64(optarg, 0.01, 86400, &o->max_level_s)) bad = "--max-level-s";
            break;
        case O_TOL: if (parse_f64(optarg, 0, 10, &o->tolerance)) bad = "--tolerance"; break;
        case O_INLINE: o->inline_tensors = 1; break;
        case O_SEED: if (parse_i64(optarg, 0, INT64_MAX, &v)) bad = "--seed"; else o->seed = (uint64_t)v; break;
        case O_JSON: o->json_path = optarg; break;
        case O_CSV: o->csv_path = optarg; break;
        case O_SERVER:
            if (parse_i64(optarg, 1, 10000, &v)) bad = "--server-side";
            else o->server.iterations = (int)v;
            break;
        case O_SWARMUP:
            if (parse_i64(optarg, 0, 1000, &v)) bad = "--server-warmup";
            else o->server.warmup = (int)v;
            break;
        case O_SREPEATS:
            if (parse_i64(optarg, 1, 1000, &v)) bad = "--server-repeats";
            else o->server.repeats = (int)v;
            break;
        case O_HELP: case 'h': bench_usage(stdout); return 1;
        default: bench_usage(stderr); return -1;
        }
        if (bad != NULL) {
            fprintf(stderr, "gpucdctl bench: %s '%s' is not a valid value\n", bad, optarg);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gpucdctl bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    for (int i = 0; i < bench_preset_count; i++)
        if (strcmp(op, bench_presets[i].name) == 0)
            o->preset = &bench_presets[i];
    if (o->preset == NULL) {
        fprintf(stderr, "gpucdctl bench: unknown --op '%s' (see gpucdctl bench --help)\n", op);
        return -1;
    }
    o->shape = o->preset->defaults;
    if (batch > 0 && o->preset->io != NULL && strcmp(op, "ping") != 0)
        o->shape.batch = batch;
    if (hidden > 0)
        o->shape.hidden = hidden;
    if (dim > 0)
        o->shape.dim = dim;
    if (vocab > 0)
        o->shape.vocab = vocab;
    if (dtype != NULL) {
        if (strcmp(dtype, "f32") == 0)
            o->shape.dtype = GPUCD_F32;
        else if (strcmp(dtype, "bf16") == 0)
            o->shape.dtype = GPUCD_BF16;
        else {
            fprintf(stderr, "gpucdctl bench: --dtype '%s': expected f32 or bf16\n", dtype);
            return -1;
        }
    }
    if (o->server.iterations > 0 && o->preset->server_conv == 0) {
        fprintf(stderr, "gpucdctl bench: --server-side runs the conv presets (conv1, conv2, "
                        "conv1_backward, conv2_backward), not %s\n",
                o->preset->name);
        return -1;
    }
    if (conc != NULL && parse_levels(conc, o) != 0) {
        fprintf(stderr, "gpucdctl bench: --concurrency '%s': expected N, A:B:xK or A:B:+K with "
                        "1 <= A <= B <= %d\n",
                conc, BENCH_MAX_WORKERS);
        return -1;
    }
    if (conc == NULL) {
        o->nlevels = 1;
        o->levels[0] = rate_set ? 16 : 1;
    }
    return 0;
}

/* ---- main --------------------------------------------------------------------------- */

int bench_check_args(int argc, char **argv)
{
    static bench_opts o;
    memset(&o, 0, sizeof o);
    int saved = optind; /* the caller's: gpucdctl finds the command's arguments by it */
    int rc = parse_opts(argc, argv, &o);
    optind = saved;
    if (rc > 0)
        exit(0); /* --help was printed: nothing to connect for */
    return rc < 0 ? 2 : 0;
}

int bench_main(gpucd_client *client, const char *url, uint64_t trust_uid, int argc,
               char **argv)
{
    static bench_opts o; /* the levels array is large-ish; one bench per process */
    memset(&o, 0, sizeof o);
    int prc = parse_opts(argc, argv, &o);
    if (prc != 0)
        return prc > 0 ? 0 : 2;
    o.server.trust_uid = trust_uid;
    char default_url[512];
    if (url == NULL) {
        if (gpucd_default_url(default_url, sizeof default_url) < 0)
            snprintf(default_url, sizeof default_url, "(default)");
        url = default_url;
    }
    bench_run r = {.client = client, .url = url, .o = &o};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* level_wait's clock, now_us's */
    pthread_mutex_init(&r.lock, NULL);
    pthread_cond_init(&r.counted, &ca);
    pthread_condattr_destroy(&ca);
    r.progress = bench_progress_start(stderr);
    r.use_region = strncmp(url, "ipc://", 6) == 0 && !o.inline_tensors;
    int maxc = 0;
    for (int i = 0; i < o.nlevels; i++)
        maxc = o.levels[i] > maxc ? o.levels[i] : maxc;
    uint64_t rng = o.seed;
    void *whost[BENCH_MAX_TENSORS] = {0};
    bench_level *levels = calloc((size_t)o.nlevels, sizeof *levels);
    r.workers = calloc((size_t)maxc, sizeof *r.workers);
    int status = 1, rc;
    if (levels == NULL || r.workers == NULL) {
        fprintf(stderr, "gpucdctl bench: out of memory\n");
        goto out;
    }
    printf("bench %s on %s: batch %" PRId64 ", %s, tensors %s, seed %" PRIu64 "\n", o.preset->name,
           url, o.shape.batch, gpucd_dtype_name(o.shape.dtype),
           o.server.iterations > 0 ? "resident (--server-side)"
           : r.use_region          ? "in shared-memory regions"
                                   : "inline",
           o.seed);
    bench_progress_phase(r.progress, "uploading the weights");
    rc = weights_upload(&r, whost, &rng);
    bench_progress_phase(r.progress, NULL);
    if (rc < 0)
        goto out;
    bench_check chk;
    bench_progress_phase(r.progress, "checking a request against the CPU kernels");
    rc = check_once(&r, whost, &chk, &rng);
    bench_progress_phase(r.progress, NULL);
    for (int i = 0; i < BENCH_MAX_TENSORS; i++) {
        free(whost[i]); /* only the check needs the host copies (the loss's C is large) */
        whost[i] = NULL;
    }
    if (rc < 0)
        goto out;
    if (chk.done)
        printf("checked against the CPU kernels at batch %" PRId64 ": worst relative L2 error "
               "%.2g (%s)\n",
               chk.batch, chk.worst, chk.worst_name);
    uint64_t total_requests = chk.done ? 1 : 0, total_errors = 0;
    if (o.server.iterations > 0) {
        bench_server_result sv;
        rc = bench_server_run(o.preset, &o.shape, url, 300000, &o.server, &sv, &rng, r.progress);
        if (rc != 0)
            goto out;
        char med[16], lo[16], hi[16];
        printf("server-side %s: %s per iteration on the daemon's device (median of %d "
               "requests of %d warm-up + %u timed iterations; min %s, max %s), %.2f TFLOP/s\n",
               o.preset->name, ctl_format_us(sv.median_us, med, sizeof med), sv.requests,
               o.server.warmup, sv.iterations_done, ctl_format_us(sv.min_us, lo, sizeof lo),
               ctl_format_us(sv.max_us, hi, sizeof hi), sv.tflops);
        bench_summary sum = {total_requests + (uint64_t)sv.requests, 0, &chk, &sv, &o.server};
        status = o.json_path != NULL && write_json(o.json_path, &r, levels, 0, &sum) != 0 ? 1 : 0;
        goto out;
    }
    for (int i = 0; i < maxc; i++) {
        r.workers[i].run = &r;
        uint64_t wrng = o.seed + 0x1000u * (uint64_t)(i + 1);
        if ((rc = ioset_alloc(&r, &r.workers[i].io, o.shape.batch, &wrng)) < 0) {
            r.nworkers = i;
            goto out;
        }
        r.nworkers = i + 1;
    }
    print_header(stdout);
    fflush(stdout);
    int done = 0, too_few = 0;
    for (int i = 0; i < o.nlevels; i++) {
        if (o.rate > 0)
            bench_progress_phase(r.progress, "level %d/%d (concurrency %d, rate %g)", i + 1,
                                 o.nlevels, o.levels[i], o.rate);
        else
            bench_progress_phase(r.progress, "level %d/%d (concurrency %d)", i + 1, o.nlevels,
                                 o.levels[i]);
        rc = level_run(&r, o.levels[i], o.rate, &levels[i]);
        bench_progress_phase(r.progress, NULL);
        if (rc < 0)
            break;
        for (int j = 0; j < o.levels[i]; j++)
            total_requests += r.workers[j].calls;
        total_errors += levels[i].errors;
        too_few += levels[i].too_few;
        print_level(stdout, &o, &levels[i]);
        done = i + 1;
    }
    printf("requests: %" PRIu64 " %s (check, warm-up and measurement), errors: %" PRIu64 "\n",
           total_requests, o.preset->name, total_errors);
    bench_summary sum = {total_requests, total_errors, &chk, NULL, NULL};
    int wrc = 0;
    if (o.json_path != NULL)
        wrc |= write_json(o.json_path, &r, levels, done, &sum);
    if (o.csv_path != NULL)
        wrc |= write_csv(o.csv_path, &r, levels, done);
    status = rc == 0 && done == o.nlevels && total_errors == 0 && too_few == 0 && wrc == 0 ? 0 : 1;
out:
    bench_progress_stop(r.progress);
    pthread_cond_destroy(&r.counted);
    pthread_mutex_destroy(&r.lock);
    for (int i = 0; i < r.nworkers; i++) {
        ioset_free(r.client, &r.workers[i].io);
        free(r.workers[i].rec);
    }
    weights_free(&r);
    for (int i = 0; i < BENCH_MAX_TENSORS; i++)
        free(whost[i]);
    free(r.workers);
    free(levels);
    return status;
}
