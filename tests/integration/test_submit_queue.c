/*
 * test_submit_queue.c - submission queues (proto/submit_queue.h): that the
 * library's record-ending calls go through the queue, right and concurrent,
 * failures with their message; that the socket serves them when the daemon
 * has queues off; that a lost daemon fails a queued call at once and a new
 * one gets a new queue; and, on a
 * bare socket writing the shared memory by hand, every hostile queue and
 * cell: each refused with a clear answer where there is a slot to answer
 * into, counted where there is none, the daemon serving on.
 */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "multihot_calls.h"
#include "raw.h"
#include "submit_queue.h"
#include "wire.h"


enum { B = TH_MH_B, OBS_BYTES = TH_MH_OBS_BYTES };

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- through the library ------------------------------------------------------------ */

enum { THREADS = 6, CALLS = 30 };


static void test_calls_go_through_the_queue(void **state)
{
    (void)state;
    for (int spin = 0; spin <= 100000; spin += 100000) { /* sleeping, then polling callers */
        gpucd_client *c = th_mh_connect(th_group_daemon.ipc_url, spin, 20000);
        gpucd_region *r;
        assert_int_equal(gpucd_region_create(c, THREADS * th_mh_slice_bytes(), &r), 0);
        th_mh_encode_and_check(c, r, 0); /* the first call opens the queue */
        const uint64_t taken = th_mh_stat(c, "submit_taken"), answers = th_mh_stat(c, "record_answers");
        assert_true(th_mh_stat(c, "submit_queues") >= 1);
        th_mh_run_threads(c, r, THREADS, CALLS, th_mh_worker_main);
        assert_int_equal(th_mh_stat(c, "submit_taken") - taken, THREADS * CALLS);
        assert_int_equal(th_mh_stat(c, "record_answers") - answers, THREADS * CALLS);
        assert_int_equal(gpucd_region_destroy(r), 0);
        gpucd_close(c);
    }
}

static void test_failure_comes_back_with_its_message(void **state)
{
    (void)state;
    gpucd_client *c = th_mh_connect(th_group_daemon.ipc_url, 0, 20000);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, th_mh_slice_bytes(), &r), 0);
    th_mh_encode_and_check(c, r, 0);
    const uint64_t taken = th_mh_stat(c, "submit_taken");
    uint8_t *obs = gpucd_region_data(r);
    th_fill_nmmo3_obs(obs, B);
    obs[1707 * 3 + 5] = 200; /* agent 3: a value no feature has */
    gpucd_tensor tobs = gpucd_tensor_region(r, 0, GPUCD_U8, 2, TH_SHAPE(B, 1707));
    gpucd_tensor tout = gpucd_tensor_region(r, th_mh_out_offset(0), GPUCD_F32, 4,
                                            TH_SHAPE(B, 59, 11, 15));
    int rv = gpucd_multihot_encode(c, NULL, &tobs, &tout, NULL);
    if (rv != GPUCD_EOUT_OF_RANGE)
        fail_msg("rv %d (%s), expected GPUCD_EOUT_OF_RANGE", rv, gpucd_errmsg(c));
    if (strstr(gpucd_errmsg(c), "agent 3") == NULL)
        fail_msg("the error does not name the agent: '%s'", gpucd_errmsg(c));
    assert_int_equal(th_mh_stat(c, "submit_taken") - taken, 1);
    th_mh_encode_and_check(c, r, 0); /* the slot serves on */
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
}

/* Threads each alternating a failing call and a good one on the same slot, back to back. */
enum { ALT_THREADS = 4, ALT_ROUNDS = 60 };

static void *alternate_main(void *arg)
{
    th_mh_worker *w = arg;
    const uint64_t obs_off = th_mh_obs_offset(w->k);
    uint8_t *obs = (uint8_t *)gpucd_region_data(w->r) + obs_off;
    gpucd_tensor tobs = gpucd_tensor_region(w->r, obs_off, GPUCD_U8, 2, TH_SHAPE(B, 1707));
    gpucd_tensor tout = gpucd_tensor_region(w->r, th_mh_out_offset(w->k), GPUCD_F32, 4,
                                            TH_SHAPE(B, 59, 11, 15));
    for (int i = 0; i < w->calls; i++) {
        th_fill_nmmo3_obs(obs, B);
        obs[5] = 200; /* agent 0: a value no feature has */
        int rv = gpucd_multihot_encode(w->c, NULL, &tobs, &tout, NULL);
        if (rv != GPUCD_EOUT_OF_RANGE)
            fail_msg("round %d: the failing call returned %d (%s)", i, rv, gpucd_errmsg(w->c));
        th_mh_encode_and_check(w->c, w->r, w->k); /* timed out when a late record overwrote its own */
    }
    return NULL;
}

/*
 * A failure's answer is stored in two steps (the record by the request's path, then the
 * reply's bytes and the record again): the next call on the slot must never see the first
 * request's second step over its own record.
 */
static void test_failures_and_successes_alternate(void **state)
{
    (void)state;
    gpucd_client *c = th_mh_connect(th_group_daemon.ipc_url, 0, 5000);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, ALT_THREADS * th_mh_slice_bytes(), &r), 0);
    th_mh_run_threads(c, r, ALT_THREADS, ALT_ROUNDS, alternate_main);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
}

static void test_queues_off_use_the_socket(void **state)
{
    (void)state;
    const char *extra[] = {"--submit-queues", "0", NULL};
    th_daemon off;
    th_daemon_start(&off, extra);
    gpucd_client *c = th_mh_connect(off.ipc_url, 0, 20000);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, th_mh_slice_bytes(), &r), 0);
    for (int i = 0; i < 5; i++)
        th_mh_encode_and_check(c, r, 0);
    assert_int_equal(th_mh_stat(c, "doorbells"), 5); /* still ended on their records */
    assert_int_equal(th_mh_stat(c, "submit_taken"), 0);
    assert_int_equal(th_mh_stat(c, "submit_queues"), 0);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&off), 0);
}

/* ---- a daemon lost while a queued call runs ---------------------------------------- */

/*
 * Calls queued on a daemon that is stopped (SIGSTOP: it takes nothing), then killed: each
 * one was surely in flight when the connection went, whatever the machine's speed.
 */
/* Two rounds of 40: more cut-off calls than an area has records, in few daemon restarts. */
enum { CUT_THREADS = 40, CUT_ROUNDS = 2 };

typedef struct cut_call {
    gpucd_client *c;
    gpucd_region *r;
    int k, rv;
    uint64_t ended_at;
} cut_call;

static void *cut_call_main(void *arg)
{
    cut_call *cc = arg;
    const uint64_t obs_off = th_mh_obs_offset(cc->k);
    th_fill_nmmo3_obs((uint8_t *)gpucd_region_data(cc->r) + obs_off, B);
    gpucd_tensor tobs = gpucd_tensor_region(cc->r, obs_off, GPUCD_U8, 2, TH_SHAPE(B, 1707));
    gpucd_tensor tout = gpucd_tensor_region(cc->r, th_mh_out_offset(cc->k), GPUCD_F32, 4,
                                            TH_SHAPE(B, 59, 11, 15));
    cc->rv = gpucd_multihot_encode(cc->c, NULL, &tobs, &tout, NULL);
    cc->ended_at = now_us();
    return NULL;
}

/*
 * Starts n calls on c (whose queue is open) against daemon d, stopped first; kills d once
 * they wait; returns how many failed with GPUCD_ECLOSED, each within 3 s of the kill.
 */
static int cut_calls(th_daemon *d, gpucd_client *c, gpucd_region *r, int n)
{
    kill(d->pid, SIGSTOP);
    pthread_t th[CUT_THREADS];
    cut_call cc[CUT_THREADS];
    for (int i = 0; i < n; i++) {
        cc[i] = (cut_call){.c = c, .r = r, .k = i};
        assert_int_equal(pthread_create(&th[i], NULL, cut_call_main, &cc[i]), 0);
    }
    usleep(100000); /* queued, and asleep on their records */
    const uint64_t killed_at = now_us();
    th_daemon_kill(d);
    int cut = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (cc[i].rv != GPUCD_ECLOSED)
            fail_msg("call %d returned %d (%s), expected GPUCD_ECLOSED", i, cc[i].rv,
                     gpucd_errmsg(c));
        /* Not the 20 s timeout: the lost connection ends the wait. */
        assert_true(cc[i].ended_at - killed_at < 3000000);
        cut++;
    }
    return cut;
}

static void test_lost_daemon_fails_a_queued_call_at_once(void **state)
{
    (void)state;
    th_fixed_url f;
    th_fixed_url_init(&f);
    th_daemon first;
    th_daemon_start(&first, f.extra);
    gpucd_client *c = th_mh_connect(f.url, 0, 5000);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, th_mh_slice_bytes(), &r), 0);
    th_mh_encode_and_check(c, r, 0); /* the queue is open from here */
    assert_int_equal(th_mh_stat(c, "submit_queues"), 1);
    assert_int_equal(cut_calls(&first, c, r, 1), 1);

    th_daemon second;
    th_daemon_start(&second, f.extra);
    th_wait_for_reconnect(c);
    assert_int_equal(gpucd_region_destroy(r), GPUCD_ENOT_FOUND); /* unmapped all the same */
    assert_int_equal(gpucd_region_create(c, th_mh_slice_bytes(), &r), 0);
    for (int i = 0; i < 3; i++)
        th_mh_encode_and_check(c, r, 0);
    assert_int_equal(th_mh_stat(c, "submit_taken"), 3); /* through the new daemon's queue */
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&second), 0);
    th_fixed_url_remove(&f);
}

/*
 * Records given up on are given up in their connection's area only: a client whose calls were
 * cut off by daemon restarts, 40 at a time, still has records (and its queue) on the next
 * daemon, after more cut-off calls than an area has records.
 */
static void test_records_come_back_after_reconnects(void **state)
{
    (void)state;
    th_fixed_url f;
    th_fixed_url_init(&f);
    gpucd_client *c = NULL;
    gpucd_region *r = NULL;
    int cut = 0;
    for (int round = 0; round <= CUT_ROUNDS; round++) {
        th_daemon d;
        th_daemon_start(&d, f.extra);
        if (c == NULL) {
            c = th_mh_connect(f.url, 0, 5000);
        } else {
            th_wait_for_reconnect(c);
            assert_int_equal(gpucd_region_destroy(r), GPUCD_ENOT_FOUND);
        }
        assert_int_equal(gpucd_region_create(c, CUT_THREADS * th_mh_slice_bytes(), &r), 0);
        th_mh_encode_and_check(c, r, 0); /* this connection's queue is open from here */
        if (round < CUT_ROUNDS) {
            cut += cut_calls(&d, c, r, CUT_THREADS);
            continue;
        }
        assert_true(cut > SUBMIT_SLOTS);
        th_mh_run_threads(c, r, CUT_THREADS, 2, th_mh_worker_main);
        /* every call through the queue (the first call above too) */
        assert_int_equal(th_mh_stat(c, "submit_taken"), 2 * CUT_THREADS + 1);
        assert_int_equal(gpucd_region_destroy(r), 0);
        gpucd_close(c);
        assert_int_equal(th_daemon_stop(&d), 0);
    }
    th_fixed_url_remove(&f);
}

/* ---- by hand, on a bare socket --------------------------------------------------------- */

typedef struct hand {
    th_raw raw;
    th_region area_reg, data_reg;
    uint64_t area_id, data_id;
    submit_area *area;
    uint8_t *data; /* a 64 KiB region for tensors */
    submit_wake *wake;
    uint64_t tail;
} hand;

static Gpucd__V1__Reply *open_queue(th_raw *raw, uint64_t region_id)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__SubmitQueueOpen op = GPUCD__V1__SUBMIT_QUEUE_OPEN__INIT;
    op.region_id = region_id;
    req.op_case = GPUCD__V1__REQUEST__OP_SUBMIT_QUEUE_OPEN;
    req.submit_queue_open = &op;
    return th_raw_call(raw, &req, NULL, 0);
}

static void expect(Gpucd__V1__Reply *rep, Gpucd__V1__Status status, const char *needle)
{
    assert_non_null(rep);
    if ((Gpucd__V1__Status)rep->status != status || rep->message == NULL ||
        strstr(rep->message, needle) == NULL)
        fail_msg("got status %d '%s', expected %d with '%s'", (int)rep->status,
                 rep->message ? rep->message : "", (int)status, needle);
    gpucd__v1__reply__free_unpacked(rep, NULL);
}

static void hand_open(hand *h)
{
    memset(h, 0, sizeof *h);
    th_raw_open(&h->raw, th_group_daemon.ipc_url);
    th_raw_region(&h->raw, sizeof(submit_area), &h->area_reg);
    th_raw_region(&h->raw, 65536, &h->data_reg);
    h->area_id = h->area_reg.id;
    h->area = (submit_area *)h->area_reg.base;
    h->data_id = h->data_reg.id;
    h->data = h->data_reg.base;
    for (uint64_t i = 0; i < SUBMIT_SLOTS; i++)
        atomic_store(&h->area->cells[i].seq, i);
    Gpucd__V1__Reply *rep = open_queue(&h->raw, h->area_id);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    assert_int_equal(rep->result_case, GPUCD__V1__REPLY__RESULT_SUBMIT_QUEUE);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    fdpass_request req = {.magic = FDPASS_MAGIC, .version = FDPASS_VERSION,
                          .op = FDPASS_OP_WAKE};
    fdpass_answer ans;
    int fd;
    assert_int_equal(th_fdpass(h->raw.url, &req, sizeof req, NULL, 0, &ans, &fd), 0);
    assert_int_equal(ans.status, GPUCD__V1__STATUS__OK);
    assert_true(fd >= 0);
    h->wake = mmap(NULL, SUBMIT_WAKE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(h->wake != MAP_FAILED);
}

static void hand_close(hand *h)
{
    th_raw_close(&h->raw);
    munmap(h->wake, SUBMIT_WAKE_BYTES);
    th_region_free(&h->area_reg);
    th_region_free(&h->data_reg);
}

/* Queues slot's buffer as it is, under the cell's claims id and len, and wakes the daemon. */
static void hand_push(hand *h, uint32_t slot, uint32_t len, uint64_t id)
{
    submit_cell *cell = &h->area->cells[h->tail % SUBMIT_SLOTS];
    assert_int_equal(atomic_load(&cell->seq), h->tail); /* the daemon freed it */
    cell->id = id;
    cell->slot = slot;
    cell->len = len;
    atomic_store(&cell->seq, h->tail + 1);
    h->tail++;
    submit_wake_poller(h->wake);
}

/* Frames req into slot's buffer; returns the length. */
static uint32_t hand_frame(hand *h, uint32_t slot, Gpucd__V1__Request *req)
{
    req->version = GPUCD__V1__VERSION__VERSION_CURRENT;
    size_t hl = gpucd__v1__request__get_packed_size(req);
    size_t len = wire_payload_offset(hl);
    assert_true(len <= SUBMIT_MESSAGE_MAX);
    wire_pack_header(h->area->buffers[slot].bytes, &req->base, hl);
    return (uint32_t)len;
}

/* Waits (2 s at most) for slot's record to show id; returns its status. */
static uint32_t hand_record(hand *h, uint32_t slot, uint64_t id)
{
    doorbell_record *r = &h->area->records[slot];
    for (uint64_t until = now_us() + 2000000; atomic_load(&r->id) != id;)
        if (now_us() > until)
            fail_msg("slot %u: no record for request %llu", slot, (unsigned long long)id);
    return r->status;
}

/* The reply in slot's buffer for id, decoded. */
static Gpucd__V1__Reply *hand_reply(hand *h, uint32_t slot, uint64_t id)
{
    submit_buffer *b = &h->area->buffers[slot];
    for (uint64_t until = now_us() + 2000000; atomic_load(&b->reply_id) != id;)
        if (now_us() > until)
            fail_msg("slot %u: no reply for request %llu", slot, (unsigned long long)id);
    const uint8_t *hd, *p;
    size_t hl, pl;
    const char *why;
    assert_true(b->reply_len > 0 && b->reply_len <= SUBMIT_MESSAGE_MAX);
    assert_int_equal(wire_split(b->bytes, b->reply_len, &hd, &hl, &p, &pl, &why), 0);
    Gpucd__V1__Reply *rep = gpucd__v1__reply__unpack(NULL, hl, hd);
    assert_non_null(rep);
    /* id 0: the daemon could not read the request's (as on the socket) */
    assert_true(rep->id == id || (rep->id == 0 && rep->status != GPUCD__V1__STATUS__OK));
    return rep;
}

/* A multihot request on the data region (obs at 0, out at 16384), its record at slot's. */
typedef struct mh {
    Gpucd__V1__Request req;
    Gpucd__V1__MultihotEncode op;
    Gpucd__V1__TensorRef obs, out;
    Gpucd__V1__RegionSlice obs_at, out_at, bell;
    int64_t obs_shape[2], out_shape[4];
} mh;

static void mh_init(mh *m, const hand *h, uint32_t slot, uint64_t id)
{
    gpucd__v1__request__init(&m->req);
    gpucd__v1__multihot_encode__init(&m->op);
    gpucd__v1__tensor_ref__init(&m->obs);
    gpucd__v1__tensor_ref__init(&m->out);
    gpucd__v1__region_slice__init(&m->obs_at);
    gpucd__v1__region_slice__init(&m->out_at);
    gpucd__v1__region_slice__init(&m->bell);
    m->obs_shape[0] = 1;
    m->obs_shape[1] = 1707;
    const int64_t out_shape[4] = {1, 59, 11, 15};
    memcpy(m->out_shape, out_shape, sizeof out_shape);
    m->obs.dtype = GPUCD__V1__DTYPE__U8;
    m->obs.n_shape = 2;
    m->obs.shape = m->obs_shape;
    m->obs.where_case = GPUCD__V1__TENSOR_REF__WHERE_REGION;
    m->obs_at.region_id = h->data_id;
    m->obs.region = &m->obs_at;
    m->out.dtype = GPUCD__V1__DTYPE__F32;
    m->out.n_shape = 4;
    m->out.shape = m->out_shape;
    m->out.where_case = GPUCD__V1__TENSOR_REF__WHERE_REGION;
    m->out_at.region_id = h->data_id;
    m->out_at.offset = 16384;
    m->out.region = &m->out_at;
    m->op.obs = &m->obs;
    m->op.out = &m->out;
    m->req.op_case = GPUCD__V1__REQUEST__OP_MULTIHOT_ENCODE;
    m->req.multihot_encode = &m->op;
    m->req.id = id;
    m->bell.region_id = h->area_id;
    m->bell.offset = (uint64_t)slot * DOORBELL_BYTES;
    m->req.doorbell = &m->bell;
    m->req.record_only = 1;
}

/* Queues a valid record-only multihot request with id in slot and asserts it succeeds. */
static void hand_encode_ok(hand *h, uint32_t slot, uint64_t id)
{
    mh m;
    mh_init(&m, h, slot, id);
    hand_push(h, slot, hand_frame(h, slot, &m.req), id);
    assert_int_equal(hand_record(h, slot, id), GPUCD__V1__STATUS__OK);
}

static void expect_ping(th_raw *raw)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Ping ping = GPUCD__V1__PING__INIT;
    req.op_case = GPUCD__V1__REQUEST__OP_PING;
    req.ping = &ping;
    Gpucd__V1__Reply *rep = th_raw_call(raw, &req, NULL, 0);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    gpucd__v1__reply__free_unpacked(rep, NULL);
}

static uint64_t rejected(hand *h)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Stats op = GPUCD__V1__STATS__INIT;
    req.op_case = GPUCD__V1__REQUEST__OP_STATS;
    req.stats = &op;
    Gpucd__V1__Reply *rep = th_raw_call(&h->raw, &req, NULL, 0);
    assert_non_null(rep);
    const char *at = strstr(rep->stats->json, "\"submit_rejected\":");
    assert_non_null(at);
    uint64_t n = strtoull(at + strlen("\"submit_rejected\":"), NULL, 10);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    return n;
}

static void test_hostile_queue_opens(void **state)
{
    (void)state;
    th_raw raw;
    th_raw_open(&raw, th_group_daemon.ipc_url);
    expect(open_queue(&raw, 987654), GPUCD__V1__STATUS__NOT_FOUND, "no region 987654");
    th_region small, area;
    th_raw_region(&raw, 4096, &small);
    expect(open_queue(&raw, small.id), GPUCD__V1__STATUS__INVALID_ARGUMENT, "a queue takes");
    th_raw_region(&raw, sizeof(submit_area), &area);
    const uint64_t id = area.id;
    Gpucd__V1__Reply *rep = open_queue(&raw, id);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    expect(open_queue(&raw, id), GPUCD__V1__STATUS__INVALID_ARGUMENT, "has a queue already");
    /* The queue holds its region for as long as the connection lasts: unregistering it would
     * wait for ever (and hold a worker), so it is refused. */
    Gpucd__V1__Request unreg = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__RegionUnregister un = GPUCD__V1__REGION_UNREGISTER__INIT;
    un.region_id = id;
    unreg.op_case = GPUCD__V1__REQUEST__OP_REGION_UNREGISTER;
    unreg.region_unregister = &un;
    expect(th_raw_call(&raw, &unreg, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "is this connection's submission queue");
    /* Another connection's region is not this one's to open, nor to know of. */
    th_raw other;
    th_raw_open(&other, th_group_daemon.ipc_url);
    expect(open_queue(&other, id), GPUCD__V1__STATUS__NOT_FOUND, "no region");
    th_raw_close(&other);
    th_raw remote;
    th_raw_open(&remote, th_group_daemon.tcp_url);
    expect(open_queue(&remote, id), GPUCD__V1__STATUS__PERMISSION_DENIED,
           "for local (ipc://) clients");
    th_raw_close(&remote);
    expect_ping(&raw);
    th_raw_close(&raw);
    th_region_free(&small);
    th_region_free(&area);
}

static void test_hostile_cells(void **state)
{
    (void)state;
    hand h;
    hand_open(&h);
    th_fill_nmmo3_obs(h.data, 1);

    /* Valid, record-only: the record alone answers, the output is right. */
    hand_encode_ok(&h, 3, 1001);
    float *want = th_xmalloc(59 * 11 * 15 * 4);
    gk_tensor gobs = gk_tensor_make(h.data, GK_U8, 2, TH_SHAPE(1, 1707));
    gk_tensor gout = gk_tensor_make(want, GK_F32, 4, TH_SHAPE(1, 59, 11, 15));
    gk_err err;
    assert_int_equal(gk_cpu_multihot_encode(&gk_nmmo3_layout, &gobs, &gout, &err), 0);
    assert_memory_equal(h.data + 16384, want, 59 * 11 * 15 * 4);
    free(want);

    /* Valid without record_only: the reply's bytes are in the buffer too. */
    mh m;
    mh_init(&m, &h, 4, 1002);
    m.req.record_only = 0;
    hand_push(&h, 4, hand_frame(&h, 4, &m.req), 1002);
    assert_int_equal(hand_record(&h, 4, 1002), GPUCD__V1__STATUS__OK);
    Gpucd__V1__Reply *rep = hand_reply(&h, 4, 1002);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    gpucd__v1__reply__free_unpacked(rep, NULL);

    /* Lengths out of range: answered in the slot, naming the limit. */
    const uint32_t bad_len[2] = {0, SUBMIT_MESSAGE_MAX + 1};
    for (int i = 0; i < 2; i++) {
        const uint64_t before = rejected(&h);
        hand_push(&h, 5, bad_len[i], 1003 + (uint64_t)i);
        assert_int_equal(hand_record(&h, 5, 1003 + (uint64_t)i), GPUCD__V1__STATUS__BAD_MESSAGE);
        expect(hand_reply(&h, 5, 1003 + (uint64_t)i), GPUCD__V1__STATUS__BAD_MESSAGE,
               "length must be 1 to 2032 bytes");
        assert_int_equal(rejected(&h) - before, 1);
    }

    /* Bytes that are no request: the same answer a socket gets, under the cell's id. */
    for (int i = 0; i < 300; i++)
        h.area->buffers[6].bytes[i] = (uint8_t)th_rand_u64();
    hand_push(&h, 6, 300, 1005);
    assert_int_equal(hand_record(&h, 6, 1005), GPUCD__V1__STATUS__BAD_MESSAGE);
    rep = hand_reply(&h, 6, 1005);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__BAD_MESSAGE);
    gpucd__v1__reply__free_unpacked(rep, NULL);

    /* A request that fails validation: its message, in the buffer. */
    mh_init(&m, &h, 7, 1006);
    m.obs_at.offset = 65536; /* past the region's end */
    hand_push(&h, 7, hand_frame(&h, 7, &m.req), 1006);
    assert_int_equal(hand_record(&h, 7, 1006), GPUCD__V1__STATUS__OUT_OF_RANGE);
    expect(hand_reply(&h, 7, 1006), GPUCD__V1__STATUS__OUT_OF_RANGE, "outside region");

    /* A slot that does not exist: nothing to answer into; counted, and the queue goes on. */
    uint64_t before = rejected(&h);
    hand_push(&h, SUBMIT_SLOTS, 100, 1007);
    hand_push(&h, UINT32_MAX, 100, 1008);
    hand_encode_ok(&h, 8, 1009);
    assert_int_equal(rejected(&h) - before, 2);

    /* The same slot queued twice at once: both run and answer into it, in either order. */
    mh_init(&m, &h, 9, 1010);
    uint32_t len = hand_frame(&h, 9, &m.req);
    hand_push(&h, 9, len, 1010);
    hand_push(&h, 9, len, 1011);
    doorbell_record *twice = &h.area->records[9];
    for (uint64_t until = now_us() + 2000000;
         atomic_load(&twice->id) != 1010 && atomic_load(&twice->id) != 1011;)
        assert_true(now_us() < until);
    usleep(50000);
    assert_true(atomic_load(&twice->id) == 1010 || atomic_load(&twice->id) == 1011);
    assert_int_equal(twice->status, GPUCD__V1__STATUS__OK);

    /* A cell published out of turn (a sequence number ahead) is not taken until its turn. */
    submit_cell *cell = &h.area->cells[h.tail % SUBMIT_SLOTS];
    mh_init(&m, &h, 10, 1012);
    len = hand_frame(&h, 10, &m.req);
    cell->id = 1012;
    cell->slot = 10;
    cell->len = len;
    atomic_store(&cell->seq, h.tail + 5);
    submit_wake_poller(h.wake);
    usleep(100000);
    assert_int_not_equal(atomic_load(&h.area->records[10].id), 1012);
    atomic_store(&cell->seq, h.tail + 1);
    h.tail++;
    submit_wake_poller(h.wake);
    assert_int_equal(hand_record(&h, 10, 1012), GPUCD__V1__STATUS__OK);

    /* Garbage in the wake word costs the poller some sleep, never a request. */
    atomic_store(&h.wake->sleeping, 0x5a5a5a5a);
    hand_encode_ok(&h, 11, 1013);

    expect_ping(&h.raw);
    hand_close(&h);
}

/* Another client clearing the daemon's wake word while its poller sleeps. */
typedef struct wake_thief {
    submit_wake *wake;
    atomic_int stop;
} wake_thief;

static void *wake_thief_main(void *arg)
{
    wake_thief *t = arg;
    while (!atomic_load(&t->stop)) {
        if (atomic_load(&t->wake->sleeping) == 1)
            atomic_store(&t->wake->sleeping, 0); /* "awake": others need not wake it */
        sched_yield();
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Calls of an honest client while another one lies in the wake word: none waits for a nap. */
static void test_wake_word_lies_delay_nobody(void **state)
{
    (void)state;
    hand h;
    hand_open(&h);
    wake_thief t = {.wake = h.wake};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wake_thief_main, &t), 0);
    gpucd_client *c = th_mh_connect(th_group_daemon.ipc_url, 0, 20000);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, th_mh_slice_bytes(), &r), 0);
    enum { CALLS_N = 15 };
    uint64_t us[CALLS_N];
    for (int i = 0; i < CALLS_N; i++) {
        usleep(20000); /* the poller goes to sleep in between */
        const uint64_t t0 = now_us();
        th_mh_encode_and_check(c, r, 0);
        us[i] = now_us() - t0;
    }
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    qsort(us, CALLS_N, sizeof us[0], cmp_u64);
    /* The poller's nap is 100 ms: a median call that waited for it would show. */
    if (us[CALLS_N / 2] > 50000)
        fail_msg("median call %llu us: calls waited for the poller's nap",
                 (unsigned long long)us[CALLS_N / 2]);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
    hand_close(&h);
}

/* A client that leaves with requests queued and running: the daemon serves the next one. */
static void test_client_leaves_with_requests_queued(void **state)
{
    (void)state;
    for (int round = 0; round < 3; round++) {
        hand h;
        hand_open(&h);
        th_fill_nmmo3_obs(h.data, 1);
        for (uint32_t s = 0; s < 20; s++) {
            mh m;
            mh_init(&m, &h, s, 2000 + s);
            hand_push(&h, s, hand_frame(&h, s, &m.req), 2000 + s);
        }
        hand_close(&h); /* the regions go with the connection, the requests may still run */
    }
    hand h;
    hand_open(&h);
    th_fill_nmmo3_obs(h.data, 1);
    hand_encode_ok(&h, 0, 3000);
    hand_close(&h);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calls_go_through_the_queue),
        cmocka_unit_test(test_failure_comes_back_with_its_message),
        cmocka_unit_test(test_failures_and_successes_alternate),
        cmocka_unit_test(test_queues_off_use_the_socket),
        cmocka_unit_test(test_lost_daemon_fails_a_queued_call_at_once),
        cmocka_unit_test(test_records_come_back_after_reconnects),
        cmocka_unit_test(test_hostile_queue_opens),
        cmocka_unit_test(test_hostile_cells),
        cmocka_unit_test(test_wake_word_lies_delay_nobody),
        cmocka_unit_test(test_client_leaves_with_requests_queued),
    };
    return th_run_group_tests(tests, th_group_daemon_setup, th_group_daemon_teardown);
}
