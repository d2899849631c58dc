/*
 * multihot_calls.h - what the tests of calls that end on their completion
 * record share (test_doorbell, test_submit_queue): multihot encodes of fresh
 * observations on slices of a region, checked byte for byte against the CPU
 * kernel as soon as the call returns, and the daemon's counters.  Static
 * inline: each test includes it once and uses what it needs.
 */
#ifndef TH_MULTIHOT_CALLS_H
#define TH_MULTIHOT_CALLS_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

enum { TH_MH_B = 4, TH_MH_OBS_BYTES = TH_MH_B * 1707, TH_MH_OUT_FLOATS = TH_MH_B * 59 * 11 * 15 };

/* A slice: the observations, then (64-byte aligned) the f32 output. */
static inline size_t th_mh_slice_bytes(void)
{
    return (TH_MH_OBS_BYTES + TH_MH_OUT_FLOATS * 4 + 64) / 64 * 64 + 64;
}

static inline uint64_t th_mh_obs_offset(int k) { return (uint64_t)k * th_mh_slice_bytes(); }

static inline uint64_t th_mh_out_offset(int k)
{
    return (th_mh_obs_offset(k) + TH_MH_OBS_BYTES + 63) / 64 * 64;
}

/* One encode of fresh observations in slice k of r, its output checked against the CPU. */
static inline void th_mh_encode_and_check(gpucd_client *c, gpucd_region *r, int k)
{
    const uint64_t obs_off = th_mh_obs_offset(k), out_off = th_mh_out_offset(k);
    uint8_t *obs = (uint8_t *)gpucd_region_data(r) + obs_off;
    float *out = (float *)((uint8_t *)gpucd_region_data(r) + out_off);
    th_fill_nmmo3_obs(obs, TH_MH_B);
    memset(out, 0xff, TH_MH_OUT_FLOATS * 4); /* NaN: an unwritten element fails */
    gpucd_tensor tobs = gpucd_tensor_region(r, obs_off, GPUCD_U8, 2, TH_SHAPE(TH_MH_B, 1707));
    gpucd_tensor tout =
        gpucd_tensor_region(r, out_off, GPUCD_F32, 4, TH_SHAPE(TH_MH_B, 59, 11, 15));
    gpucd_timings t;
    int rv = gpucd_multihot_encode(c, NULL, &tobs, &tout, &t);
    if (rv != 0)
        fail_msg("slice %d: %s", k, gpucd_errmsg(c));
    assert_true(t.total_us > 0 && t.round_trip_us >= t.total_us);
    float *want = th_xmalloc(TH_MH_OUT_FLOATS * 4);
    gk_tensor gobs = gk_tensor_make(obs, GK_U8, 2, TH_SHAPE(TH_MH_B, 1707));
    gk_tensor gout = gk_tensor_make(want, GK_F32, 4, TH_SHAPE(TH_MH_B, 59, 11, 15));
    gk_err err;
    assert_int_equal(gk_cpu_multihot_encode(&gk_nmmo3_layout, &gobs, &gout, &err), 0);
    if (memcmp(out, want, TH_MH_OUT_FLOATS * 4) != 0)
        fail_msg("slice %d: the output differs from the CPU kernel's", k);
    free(want);
}

/* A counter of the daemon's stats ("key":N). */
static inline uint64_t th_mh_stat(gpucd_client *c, const char *key)
{
    char *json = NULL, quoted[64];
    assert_int_equal(gpucd_stats_json(c, &json), 0);
    snprintf(quoted, sizeof quoted, "\"%s\":", key);
    const char *at = strstr(json, quoted);
    if (at == NULL)
        fail_msg("no %s in the stats", key);
    uint64_t n = strtoull(at + strlen(quoted), NULL, 10);
    free(json);
    return n;
}

/* A client polling its records spin_us (0: asleep on them) with this timeout. */
static inline gpucd_client *th_mh_connect(const char *url, int spin_us, int timeout_ms)
{
    gpucd_options o;
    gpucd_options_init(&o);
    o.spin_us = spin_us;
    o.timeout_ms = timeout_ms;
    gpucd_client *c = NULL;
    if (gpucd_connect(url, &o, &c) != 0)
        fail_msg("connect %s: %s", url, gpucd_errmsg(NULL));
    return c;
}

/* Threads of one client, each encoding on its own slice. */
typedef struct th_mh_worker {
    gpucd_client *c;
    gpucd_region *r;
    int k, calls;
} th_mh_worker;

static inline void *th_mh_worker_main(void *arg)
{
    th_mh_worker *w = arg;
    for (int i = 0; i < w->calls; i++)
        th_mh_encode_and_check(w->c, w->r, w->k);
    return NULL;
}

enum { TH_MH_MAX_THREADS = 64 };

/* n threads of c, thread k running main (th_mh_worker_main: `calls` encodes) on slice k of r;
 * returns when every one is done. */
static inline void th_mh_run_threads(gpucd_client *c, gpucd_region *r, int n, int calls,
                                     void *(*main)(void *))
{
    pthread_t th[TH_MH_MAX_THREADS];
    th_mh_worker w[TH_MH_MAX_THREADS];
    assert_true(n <= TH_MH_MAX_THREADS);
    for (int i = 0; i < n; i++) {
        w[i] = (th_mh_worker){.c = c, .r = r, .k = i, .calls = calls};
        assert_int_equal(pthread_create(&th[i], NULL, main, &w[i]), 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

#endif
