/*
 * bench.h - `gpucdctl bench`: drives a running daemon with one operation at a
 * fixed concurrency, a sweep of concurrencies or a request rate, and reports
 * throughput, latency percentiles and where the time went (from the reply
 * timings).  bench.c runs the measurement; bench_presets.c knows the
 * operations: their tensors, the call, and the CPU reference that checks the
 * daemon's answer once before anything is timed.
 */
#ifndef GPUCD_BENCH_H
#define GPUCD_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gpucd.h"

/* Entry point of the subcommand: argv[0] is "bench"; returns the exit status. */
int bench_main(gpucd_client *client, const char *url, uint64_t trust_uid, int argc,
               char **argv);
/* Checks the options before anything connects: 0, or 2 after a usage error;
 * --help prints the usage and exits 0. */
int bench_check_args(int argc, char **argv);

/* ---- presets (bench_presets.c) ----------------------------------------------- */

enum { BENCH_MAX_TENSORS = 16 };

/* The sizes a preset is run at: its defaults, overridden from the command line. */
typedef struct bench_shape {
    int64_t batch;   /* rows per request (N of the loss) */
    gpucd_dtype dtype;
    int64_t hidden;  /* nmmo3 projection width */
    int64_t dim;     /* loss: D */
    int64_t vocab;   /* loss: V */
} bench_shape;

/* One tensor of a request: its dtype, shape, and whether the daemon writes it. */
typedef struct bench_spec {
    const char *name;
    gpucd_dtype dtype;
    int ndim;
    int64_t shape[4];
    int output;
    float scale; /* inputs: uniform in [-scale, scale) (floats) */
    /* A resident tensor the daemon sizes and keeps between one worker's requests (the
     * training step's saved activations): no host bytes; freed with the worker's tensors. */
    int resident;
} bench_spec;

typedef struct bench_preset {
    const char *name;
    const char *summary;
    bench_shape defaults;
    /* The weights, made resident once; returns how many (<= BENCH_MAX_TENSORS). */
    int (*weights)(const bench_shape *s, bench_spec *out);
    /* The per-request tensors at `batch` rows, inputs then outputs. */
    int (*io)(const bench_shape *s, int64_t batch, bench_spec *out);
    /* One request; w are the resident weights, io the per-request tensors. */
    int (*call)(gpucd_client *c, const bench_shape *s, gpucd_tensor *w, gpucd_tensor *io,
                gpucd_timings *t);
    /* The CPU kernels on the same inputs: writes each output spec into ref[i]
     * (NULL for inputs); 0 or a gk code with msg set. */
    int (*reference)(const bench_shape *s, int64_t batch, void *const *w, void *const *io,
                     void *const *ref, char *msg, size_t msglen);
    /* Rows of the check request: small enough for the CPU reference to be quick. */
    int64_t (*verify_batch)(const bench_shape *s);
    /* --server-side: 1 conv2d forward, 2 conv2d backward, 0 not supported; its params. */
    int server_conv, stride, relu;
} bench_preset;

extern const bench_preset bench_presets[];
extern const int bench_preset_count;

/* ---- progress (bench_progress.c) ----------------------------------------------------- */

/* What a long bench is doing, drawn on out (stderr) by a thread of its own: redrawn in
 * place on a terminal, else a line every 10 s once a phase has run that long. */
typedef struct bench_progress bench_progress;

/* NULL when it cannot start; every call below takes NULL and does nothing. */
bench_progress *bench_progress_start(FILE *out);
/* A new phase, its clock from 0 and no detail; fmt NULL: none (the line is cleared, so
 * that the caller may print). */
void bench_progress_phase(bench_progress *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Where the phase stands, shown from the next redraw on. */
void bench_progress_detail(bench_progress *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void bench_progress_stop(bench_progress *p);

/* ---- server-side timing (bench_server.c) ------------------------------------------ */

typedef struct bench_server_opts {
    int warmup, iterations, repeats;
    uint64_t trust_uid; /* over ipc://, the uid the daemon must run as (gpucd_trusted_uid) */
} bench_server_opts;

typedef struct bench_server_result {
    int done;
    int requests;
    uint32_t iterations_done;          /* per request (the daemon stops early after 10 s) */
    double median_us, min_us, max_us;  /* compute per iteration, over the requests */
    double tflops;                     /* at the median */
} bench_server_result;

/* Uploads every tensor of p as resident on its own connection to url (over ipc://, closed
 * unasked when the daemon is not of so->trust_uid), then sends
 * so->repeats requests of warm-up + iterations, each a phase of prog; 0 or -1 with the
 * reason printed. */
int bench_server_run(const bench_preset *p, const bench_shape *shape, const char *url,
                     int timeout_ms, const bench_server_opts *so, bench_server_result *res,
                     uint64_t *rng, bench_progress *prog);

/* Fills an input tensor's bytes with valid random data (observations in range, targets < V). */
void bench_fill(const bench_spec *spec, const bench_shape *s, void *data, uint64_t *rng);

int64_t bench_spec_numel(const bench_spec *spec);
size_t bench_spec_bytes(const bench_spec *spec);

#endif
