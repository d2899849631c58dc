/*
 * bench.c - the measurement of `gpucdctl bench` (see bench.h).
 *
 * Each level (a concurrency, or a request rate) runs worker threads that issue
 * the operation on one shared connection, each with its own tensors: in a
 * shared-memory region over ipc://, inline in the messages over tcp://.  After
 * a warm-up, time is cut into windows; the level ends when three windows in a
 * row agree on throughput within the tolerance (or at the window cap, marked
 * unstable), and its figures come from those last three windows.
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
#include "gk_bf16.h"

enum { BENCH_MAX_LEVELS = 64, BENCH_MAX_WORKERS = 1024, BENCH_MAX_WINDOWS = 1000 };

typedef struct bench_opts {
    const bench_preset *preset;
    bench_shape shape;
    int levels[BENCH_MAX_LEVELS];
    int nlevels;
    double rate;        /* requests/s; 0: closed loop */
    double warmup_s, window_s, tolerance;
    int max_windows;
    int inline_tensors; /* inline even over ipc:// */
    uint64_t seed;
    const char *json_path, *csv_path;
    bench_server_opts server; /* iterations > 0: --server-side */
} bench_opts;

/* One successful request. */
typedef struct bench_record {
    uint64_t done_us, latency_us;
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
    /* the level being run */
    atomic_int stop;
    atomic_uint_fast64_t next_k;
    uint64_t t_start, t_measure, window_us;
    double rate;
    atomic_uint_fast64_t win_count[BENCH_MAX_WINDOWS];
} bench_run;

/* What a level measured. */
typedef struct bench_level {
    int concurrency;
    double rate;
    int windows, stable;
    uint64_t requests, errors, wrong;
    double seconds, rps, rows_per_s;
    double p50, p90, p95, p99, max; /* microseconds */
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
            sleep_until_us(t_begin);
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
            continue;
        }
        rec.latency_us = rec.done_us - t_begin; /* from when it was due, under --rate */
        if (rec.done_us >= r->t_measure) {
            uint64_t win = (rec.done_us - r->t_measure) / r->window_us;
            if (win < BENCH_MAX_WINDOWS)
                atomic_fetch_add_explicit(&r->win_count[win], 1, memory_order_relaxed);
        }
        record_push(w, &rec);
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

static int windows_agree(bench_run *r, int last, double tol)
{
    if (last < 2)
        return 0;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = last - 2; i <= last; i++) {
        uint64_t c = atomic_load(&r->win_count[i]);
        lo = c < lo ? c : lo;
        hi = c > hi ? c : hi;
    }
    return lo > 0 && (double)hi <= (double)lo * (1.0 + tol);
}

static int level_run(bench_run *r, int concurrency, double rate, bench_level *lv)
{
    const bench_opts *o = r->o;
    memset(lv, 0, sizeof *lv);
    lv->concurrency = concurrency;
    lv->rate = rate;
    for (int i = 0; i < BENCH_MAX_WINDOWS; i++)
        atomic_store(&r->win_count[i], 0);
    atomic_store(&r->stop, 0);
    atomic_store(&r->next_k, 0);
    r->rate = rate;
    r->window_us = (uint64_t)(o->window_s * 1e6);
    r->t_start = now_us();
    r->t_measure = r->t_start + (uint64_t)(o->warmup_s * 1e6);
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
    int last = -1;
    for (int i = 0; i < o->max_windows; i++) {
        /* a little past the window's end, for the replies landing on its edge */
        sleep_until_us(r->t_measure + (uint64_t)(i + 1) * r->window_us + 2000);
        last = i;
        if (windows_agree(r, i, o->tolerance)) {
            lv->stable = 1;
            break;
        }
    }
    atomic_store(&r->stop, 1);
    for (int i = 0; i < concurrency; i++)
        pthread_join(r->workers[i].thread, NULL);

    lv->windows = last + 1;
    int first = last >= 2 ? last - 2 : 0;
    uint64_t lo = r->t_measure + (uint64_t)first * r->window_us;
    uint64_t hi = r->t_measure + (uint64_t)(last + 1) * r->window_us;
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
            if (rec->done_us < lo || rec->done_us >= hi)
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
    lv->p50 = pct(lat, m, 0.50);
    lv->p90 = pct(lat, m, 0.90);
    lv->p95 = pct(lat, m, 0.95);
    lv->p99 = pct(lat, m, 0.99);
    lv->max = m ? (double)lat[m - 1] : 0;
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
    fprintf(f, "%6s %9s %11s %13s | %8s %8s %8s %8s %8s | %9s %7s %7s %7s %7s %7s %7s | %s\n",
            "conc", "rate", "req/s", "rows/s", "p50", "p90", "p95", "p99", "max", "transport",
            "queue", "batch", "copy_in", "compute", "cp_out", "other", "windows, errors");
    fprintf(f, "%6s %9s %11s %13s | %8s %8s %8s %8s %8s | %9s %7s %7s %7s %7s %7s %7s |\n", "", "",
            "", "", "us", "us", "us", "us", "us", "mean us", "", "", "", "", "", "");
}

static void print_level(FILE *f, const bench_level *lv)
{
    char rate[16];
    if (lv->rate > 0)
        snprintf(rate, sizeof rate, "%.0f", lv->rate);
    else
        snprintf(rate, sizeof rate, "-");
    fprintf(f, "%6d %9s %11.1f %13.0f | %8.0f %8.0f %8.0f %8.0f %8.0f | %9.1f %7.1f %7.1f %7.1f "
               "%7.1f %7.1f %7.1f | %d%s, %" PRIu64 "\n",
            lv->concurrency, rate, lv->rps, lv->rows_per_s, lv->p50, lv->p90, lv->p95, lv->p99,
            lv->max, lv->transport, lv->queue, lv->batch_wait, lv->copy_in, lv->compute,
            lv->copy_out, lv->server_other, lv->windows, lv->stable ? "" : " (unstable)",
            lv->errors);
    fprintf(f, "       daemon overhead (queue + other) a request: p50 %.0f us, p99 %.0f us\n",
            lv->overhead_p50, lv->overhead_p99);
    if (lv->errors > 0)
        fprintf(f, "       errors: %" PRIu64 " (%" PRIu64 " with unwritten outputs); first: %s\n",
                lv->errors, lv->wrong, lv->first_error);
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
               "\"seed\":%" PRIu64 ",\"warmup_s\":%g,\"window_s\":%g,\"tolerance\":%g,",
            o->preset->name, r->use_region ? "region" : "inline", o->shape.batch,
            gpucd_dtype_name(o->shape.dtype), o->seed, o->warmup_s, o->window_s, o->tolerance);
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
                   "\"requests\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"seconds\":%.3f,"
                   "\"requests_per_s\":%.2f,\"rows_per_s\":%.1f,",
                i ? "," : "", l->concurrency, l->rate, l->windows, l->stable ? "true" : "false",
                l->requests, l->errors, l->seconds, l->rps, l->rows_per_s);
        fprintf(f, "\"latency_us\":{\"p50\":%.0f,\"p90\":%.0f,\"p95\":%.0f,\"p99\":%.0f,"
                   "\"max\":%.0f},",
                l->p50, l->p90, l->p95, l->p99, l->max);
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
               "overhead_p50_us,overhead_p99_us\n");
    for (int i = 0; i < n; i++) {
        const bench_level *l = &lv[i];
        fprintf(f, "%s,%s,%" PRId64 ",%s,%d,%g,%d,%d,%" PRIu64 ",%" PRIu64 ",%.2f,%.1f,%.0f,%.0f,"
                   "%.0f,%.0f,%.0f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.0f,%.0f\n",
                r->o->preset->name, r->use_region ? "region" : "inline", r->o->shape.batch,
                gpucd_dtype_name(r->o->shape.dtype), l->concurrency, l->rate, l->windows,
                l->stable, l->requests, l->errors, l->rps, l->rows_per_s, l->p50, l->p90, l->p95,
                l->p99, l->max, l->transport, l->queue, l->batch_wait, l->copy_in, l->compute,
                l->copy_out, l->server_other, l->overhead_p50, l->overhead_p99);
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
            "  --warmup-s S          warm-up per level (default 1)\n"
            "  --window-s S          measurement window (default 1)\n"
            "  --max-windows N       windows before a level is reported unstable (default 10)\n"
            "  --tolerance F         windows agree when max/min - 1 <= F (default 0.10)\n"
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
            "Latency split (means): transport = client round trip - daemon total (both ways\n"
            "through the socket, or the submission queue and the completion record, and the\n"
            "client library); queue, batch (waiting to be merged\n"
            "with other requests), copy in, compute, copy out as the daemon timed them; other =\n"
            "the rest of the daemon's total (decode, validation, reply).  Exit status 1 when\n"
            "any request failed or a result was wrong.\n"
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
           O_SREPEATS, O_HELP };
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

int bench_main(gpucd_client *client, const char *url, int argc, char **argv)
{
    static bench_opts o; /* the levels array is large-ish; one bench per process */
    memset(&o, 0, sizeof o);
    int prc = parse_opts(argc, argv, &o);
    if (prc != 0)
        return prc > 0 ? 0 : 2;
    char default_url[512];
    if (url == NULL) {
        if (gpucd_default_url(default_url, sizeof default_url) < 0)
            snprintf(default_url, sizeof default_url, "(default)");
        url = default_url;
    }
    bench_run r = {.client = client, .url = url, .o = &o};
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
    if ((rc = weights_upload(&r, whost, &rng)) < 0)
        goto out;
    bench_check chk;
    rc = check_once(&r, whost, &chk, &rng);
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
        rc = bench_server_run(o.preset, &o.shape, url, 300000, &o.server, &sv, &rng);
        if (rc != 0)
            goto out;
        printf("server-side %s: %.2f us per iteration on the daemon's device (median of %d "
               "requests of %d warm-up + %u timed iterations; min %.2f, max %.2f), %.2f TFLOP/s\n",
               o.preset->name, sv.median_us, sv.requests, o.server.warmup, sv.iterations_done,
               sv.min_us, sv.max_us, sv.tflops);
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
    int done = 0;
    for (int i = 0; i < o.nlevels; i++) {
        if ((rc = level_run(&r, o.levels[i], o.rate, &levels[i])) < 0)
            break;
        for (int j = 0; j < o.levels[i]; j++)
            total_requests += r.workers[j].calls;
        total_errors += levels[i].errors;
        print_level(stdout, &levels[i]);
        fflush(stdout);
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
    status = rc == 0 && done == o.nlevels && total_errors == 0 && wrc == 0 ? 0 : 1;
out:
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
