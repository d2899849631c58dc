/*
 * The completion record (proto/doorbell_record.h) against a fake daemon that
 * maps the client's regions as the real one does and then writes records as
 * each test says, and sometimes never replies: a client must end a call on
 * its own record (a record-only request's success gets no reply), give its
 * context back at once, whether it polls or sleeps on
 * the record (woken by the daemon), never on another request's; wait for
 * the reply of a request that failed (the message is in it), woken by the
 * reply when no record comes; name no record when an output must come
 * back in the reply; and go on over the replies when the daemon refuses the
 * library's own region of records.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "doorbell_record.h"
#include "fake_daemon.h"
#include "gpucd.h"

typedef enum bell_mode {
    RING_NO_REPLY,       /* the record says OK; no reply is ever sent */
    RING_LATE_NO_REPLY,  /* the same, 30 ms later: the caller is asleep by then */
    RING_OTHER_ID,       /* a record with another request's id; no reply */
    RING_FAILED,         /* the record says INVALID_ARGUMENT; so does the reply, with a message */
    REPLY_FAILED_LATE,   /* no record; 30 ms later an INVALID_ARGUMENT reply */
    EXPECT_NO_DOORBELL,  /* the request must name no record; an OK reply with the output */
    STALE_AFTER_TIMEOUT, /* first call: nothing (it times out); second: its record, then the
                            first's, late, where the first named it */
    AREA_REFUSED,        /* every region from now on refused, as a full quota would; the
                            requests must name no record and get OK replies */
} bell_mode;

enum { MAX_REGIONS = 4 };

typedef struct bell_state {
    char failed[256];
    bell_mode mode;
    uint8_t *maps[MAX_REGIONS + 1]; /* by region id */
    size_t sizes[MAX_REGIONS + 1];
    uint64_t next_id;
    int computes;
    int refused; /* AREA_REFUSED: the regions refused */
    Gpucd__V1__RegionSlice first_bell; /* STALE_AFTER_TIMEOUT: the first call's record */
    uint64_t first_id;
    fake_daemon *daemon; /* whose descriptor socket the memfds came over */
} bell_state;

#define HCHECK(st, cond)                                                                    \
    do {                                                                                    \
        if (!(cond) && (st)->failed[0] == '\0')                                             \
            snprintf((st)->failed, sizeof (st)->failed, "line %d: %s", __LINE__, #cond);    \
    } while (0)

static const uint64_t g_timings[6] = {11, 22, 33, 44, 55, 170};

static fake_action map_region(bell_state *st, const Gpucd__V1__Request *req, fake_reply *out)
{
    int fd = fake_daemon_take_fd(st->daemon, req->region_register->token);
    HCHECK(st, fd >= 0 && st->next_id < MAX_REGIONS);
    if (fd < 0 || st->next_id >= MAX_REGIONS)
        return FAKE_DISCONNECT;
    uint64_t id = ++st->next_id;
    st->sizes[id] = req->region_register->size;
    st->maps[id] = mmap(NULL, st->sizes[id], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    HCHECK(st, st->maps[id] != MAP_FAILED);
    fake_reply_ok(out, req);
    out->reply.result_case = GPUCD__V1__REPLY__RESULT_REGION_ID;
    out->reply.region_id = id;
    return FAKE_REPLY;
}

static void ring(const bell_state *st, const Gpucd__V1__RegionSlice *bell, uint64_t id,
                 Gpucd__V1__Status status)
{
    doorbell_record *r = (doorbell_record *)(st->maps[bell->region_id] + bell->offset);
    r->status = (uint32_t)status;
    r->queue_us = g_timings[0];
    r->copy_in_us = g_timings[1];
    r->compute_us = g_timings[2];
    r->copy_out_us = g_timings[3];
    r->batch_wait_us = g_timings[4];
    r->total_us = g_timings[5];
    atomic_store_explicit(&r->id, id, memory_order_seq_cst);
    doorbell_wake(r);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {0, (long)ms * 1000000};
    nanosleep(&ts, NULL);
}

static fake_action bell_handler(void *arg, const Gpucd__V1__Request *req,
                                const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    bell_state *st = arg;
    (void)payload;
    (void)payload_len;
    if (req->op_case == GPUCD__V1__REQUEST__OP_REGION_REGISTER && st->mode == AREA_REFUSED) {
        int fd = fake_daemon_take_fd(st->daemon, req->region_register->token);
        HCHECK(st, fd >= 0);
        if (fd >= 0)
            close(fd);
        st->refused++;
        fake_reply_status(out, req, GPUCD__V1__STATUS__RESOURCE_EXHAUSTED,
                          "regions per connection: 1 held, 1 asked, limit 1 (--conn-regions)");
        return FAKE_REPLY;
    }
    if (req->op_case == GPUCD__V1__REQUEST__OP_REGION_REGISTER)
        return map_region(st, req, out);
    if (req->op_case == GPUCD__V1__REQUEST__OP_REGION_UNREGISTER) {
        fake_reply_ok(out, req);
        return FAKE_REPLY;
    }
    if (req->op_case == GPUCD__V1__REQUEST__OP_SUBMIT_QUEUE_OPEN) {
        /* A daemon from before submission queues: the calls stay on the socket. */
        fake_reply_status(out, req, GPUCD__V1__STATUS__UNKNOWN_OPERATION, "no such operation");
        return FAKE_REPLY;
    }
    HCHECK(st, req->op_case == GPUCD__V1__REQUEST__OP_MULTIHOT_ENCODE);
    st->computes++;
    const Gpucd__V1__RegionSlice *bell = req->doorbell;
    if (st->mode == EXPECT_NO_DOORBELL || st->mode == AREA_REFUSED) {
        static uint8_t zeros[2 * 59 * 11 * 15 * 4];
        HCHECK(st, bell == NULL);
        HCHECK(st, !req->record_only);
        fake_reply_ok(out, req);
        fake_reply_output_payload(out, 0);
        fake_reply_payload(out, zeros, sizeof zeros);
        fake_reply_timings(out, g_timings);
        return FAKE_REPLY;
    }
    HCHECK(st, bell != NULL);
    if (bell == NULL)
        return FAKE_DISCONNECT;
    HCHECK(st, req->record_only); /* a success is answered by the record alone */
    HCHECK(st, bell->region_id >= 1 && bell->region_id <= st->next_id);
    HCHECK(st, bell->offset % DOORBELL_BYTES == 0);
    HCHECK(st, bell->offset + DOORBELL_BYTES <= st->sizes[bell->region_id]);
    /* Not the region the tensors are in: the library's own. */
    HCHECK(st, req->multihot_encode->out->region->region_id != bell->region_id);
    switch (st->mode) {
    case RING_NO_REPLY:
        ring(st, bell, req->id, GPUCD__V1__STATUS__OK);
        return FAKE_SILENT;
    case RING_LATE_NO_REPLY:
        sleep_ms(30);
        ring(st, bell, req->id, GPUCD__V1__STATUS__OK);
        return FAKE_SILENT;
    case REPLY_FAILED_LATE:
        sleep_ms(30);
        fake_reply_status(out, req, GPUCD__V1__STATUS__INVALID_ARGUMENT,
                          "multihot_encode: refused before any record");
        return FAKE_REPLY;
    case RING_OTHER_ID:
        ring(st, bell, req->id + 1000, GPUCD__V1__STATUS__OK);
        return FAKE_SILENT;
    case STALE_AFTER_TIMEOUT:
        if (st->computes == 1) {
            st->first_bell = *bell;
            st->first_id = req->id;
            return FAKE_SILENT;
        }
        ring(st, bell, req->id, GPUCD__V1__STATUS__OK);
        ring(st, &st->first_bell, st->first_id, GPUCD__V1__STATUS__OK); /* the first, done late */
        return FAKE_SILENT;
    default:
        ring(st, bell, req->id, GPUCD__V1__STATUS__INVALID_ARGUMENT);
        fake_reply_status(out, req, GPUCD__V1__STATUS__INVALID_ARGUMENT,
                          "multihot_encode: the fake daemon says no");
        return FAKE_REPLY;
    }
}

typedef struct fixture {
    bell_state st;
    fake_daemon fd;
    gpucd_client *c;
    gpucd_region *r;
    gpucd_tensor obs, out;
} fixture;

/* timeout_ms: how long a call waits for a reply that never comes, in the tests that need one. */
static void fixture_open(fixture *f, int spin_us, int timeout_ms)
{
    memset(f, 0, sizeof *f);
    f->st.daemon = &f->fd;
    fake_daemon_start_with_regions(&f->fd, bell_handler, &f->st);
    gpucd_options o;
    gpucd_options_init(&o);
    o.spin_us = spin_us;
    o.timeout_ms = timeout_ms;
    assert_int_equal(gpucd_connect(f->fd.url, &o, &f->c), 0);
    assert_int_equal(gpucd_region_create(f->c, 1 << 20, &f->r), 0);
    f->obs = gpucd_tensor_region(f->r, 0, GPUCD_U8, 2, (const int64_t[]){2, 1707});
    f->out = gpucd_tensor_region(f->r, 8192, GPUCD_F32, 4, (const int64_t[]){2, 59, 11, 15});
}

static void fixture_close(fixture *f)
{
    if (f->st.failed[0])
        fail_msg("fake daemon: %s", f->st.failed);
    gpucd_region_destroy(f->r);
    gpucd_close(f->c); /* with replies never sent: must neither hang nor leak */
    fake_daemon_stop(&f->fd);
    for (uint64_t id = 1; id <= f->st.next_id; id++)
        munmap(f->st.maps[id], f->st.sizes[id]);
}

static void test_ends_on_its_record(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, 1000000, 10000);
    f.st.mode = RING_NO_REPLY;
    for (int i = 0; i < 3; i++) { /* one record a context, used again */
        gpucd_timings t;
        int rv = gpucd_multihot_encode(f.c, NULL, &f.obs, &f.out, &t);
        if (rv != 0)
            fail_msg("call %d: %s", i, gpucd_errmsg(f.c));
        assert_int_equal(t.queue_us, g_timings[0]);
        assert_int_equal(t.copy_in_us, g_timings[1]);
        assert_int_equal(t.compute_us, g_timings[2]);
        assert_int_equal(t.copy_out_us, g_timings[3]);
        assert_int_equal(t.batch_wait_us, g_timings[4]);
        assert_int_equal(t.total_us, g_timings[5]);
        assert_true(t.round_trip_us < 10000000); /* not after a timeout */
    }
    assert_int_equal(f.st.computes, 3);
    assert_int_equal(f.st.next_id, 2); /* the caller's region and the library's records */
    fixture_close(&f);
}

/*
 * A record-only request gets no reply, so a context must come back when its
 * call ends on the record, not wait for a reply (here for the 10 s timeout):
 * three times as many calls as the library has records, one after the other,
 * each ending on its record at once (a context still waiting would have left
 * a later call without a record, which the fake daemon refuses).
 */
static void test_contexts_come_back_without_replies(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, 0, 10000);
    f.st.mode = RING_NO_REPLY;
    enum { CALLS = 3 * 4096 / DOORBELL_BYTES };
    for (int i = 0; i < CALLS; i++) {
        gpucd_timings t;
        int rv = gpucd_multihot_encode(f.c, NULL, &f.obs, &f.out, &t);
        if (rv != 0)
            fail_msg("call %d: %s", i, gpucd_errmsg(f.c));
        assert_true(t.round_trip_us < 1000000);
    }
    assert_int_equal(f.st.computes, CALLS);
    fixture_close(&f);
}

/*
 * A call given up on (here a timeout) may still end in the daemon and store
 * its record later; the next call on that context must not have its record
 * overwritten by it (it would wait for a reply that never comes): it takes
 * another record.
 */
static void test_late_record_of_a_timed_out_call(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, 0, 300);
    f.st.mode = STALE_AFTER_TIMEOUT;
    assert_int_equal(gpucd_multihot_encode(f.c, NULL, &f.obs, &f.out, NULL), GPUCD_ETIMEDOUT);
    int rv = gpucd_multihot_encode(f.c, NULL, &f.obs, &f.out, NULL);
    if (rv != 0)
        fail_msg("the call after a timed-out one: %s", gpucd_errmsg(f.c));
    fixture_close(&f);
}

static void test_never_ends_on_another_record(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, 1000, 300);
    f.st.mode = RING_OTHER_ID;
    int rv = gpucd_multihot_encode(f.c, NULL, &f.obs, &f.out, NULL);
    assert_int_equal(rv, GPUCD_ETIMEDOUT);
    fixture_close(&f);
}

static void test_failure_waits_for_the_message(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, 1000000, 10000);
    f.st.mode = RING_FAILED;
    int rv = gpucd_multihot_encode(f.c, NULL, &f.obs, &f.out, NULL);
    assert_int_equal(rv, GPUCD_EINVALID_ARGUMENT);
    if (strstr(gpucd_errmsg(f.c), "the fake daemon says no") == NULL)
        fail_msg("errmsg '%s'", gpucd_errmsg(f.c));
    fixture_close(&f);
}

/*
 * A caller that does not poll sleeps on its record: the daemon's wake ends
 * the call, well before the 100 ms nap after which it would look again.
 */
static void test_sleeping_caller_is_woken_by_the_record(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, 0, 10000);
    f.st.mode = RING_LATE_NO_REPLY;
    gpucd_timings t;
    int rv = gpucd_multihot_encode(f.c, NULL, &f.obs, &f.out, &t);
    if (rv != 0)
        fail_msg("%s", gpucd_errmsg(f.c));
    if (t.round_trip_us < 30000 || t.round_trip_us >= 90000)
        fail_msg("round trip %llu us: the record came after 30 ms, the nap is 100",
                 (unsigned long long)t.round_trip_us);
    fixture_close(&f);
}

/* A request refused before any record: its reply wakes the sleeping caller. */
static void test_reply_wakes_a_sleeping_caller(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, 0, 10000);
    f.st.mode = REPLY_FAILED_LATE;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(gpucd_multihot_encode(f.c, NULL, &f.obs, &f.out, NULL),
                     GPUCD_EINVALID_ARGUMENT);
    clock_gettime(CLOCK_MONOTONIC, &b);
    const double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
    if (ms >= 90.0)
        fail_msg("%.1f ms: the reply came after 30 ms, the nap is 100", ms);
    if (strstr(gpucd_errmsg(f.c), "refused before any record") == NULL)
        fail_msg("errmsg '%s'", gpucd_errmsg(f.c));
    fixture_close(&f);
}

/* An output that comes back in the reply: the reply is needed, so no record is named. */
static void test_no_record_for_outputs_in_the_reply(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, 1000000, 10000);
    f.st.mode = EXPECT_NO_DOORBELL;
    static float out[2 * 59 * 11 * 15];
    gpucd_tensor host_out =
        gpucd_tensor_host(out, GPUCD_F32, 4, (const int64_t[]){2, 59, 11, 15});
    assert_int_equal(gpucd_multihot_encode(f.c, NULL, &f.obs, &host_out, NULL), 0);
    assert_int_equal(f.st.next_id, 1); /* no records' region either */
    fixture_close(&f);
}

/*
 * A daemon that refuses the library's region of records (its regions quota
 * full, an older daemon): calls whose outputs are in place go on over the
 * socket, answered by their replies, with no record named and nothing of the
 * refusal left in the message; the region is not asked for again on the same
 * connection.
 */
static void test_refused_area_leaves_calls_on_their_replies(void **state)
{
    (void)state;
    fixture f;
    fixture_open(&f, 0, 10000);
    f.st.mode = AREA_REFUSED;
    for (int i = 0; i < 3; i++) {
        gpucd_timings t;
        if (gpucd_multihot_encode(f.c, NULL, &f.obs, &f.out, &t) != 0)
            fail_msg("call %d: %s", i, gpucd_errmsg(f.c));
        assert_string_equal(gpucd_errmsg(f.c), "");
        assert_int_equal(t.total_us, g_timings[5]); /* the reply's timings */
    }
    assert_int_equal(f.st.computes, 3);
    assert_int_equal(f.st.refused, 1);
    assert_int_equal(f.st.next_id, 1); /* the caller's region alone */
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ends_on_its_record),
        cmocka_unit_test(test_contexts_come_back_without_replies),
        cmocka_unit_test(test_late_record_of_a_timed_out_call),
        cmocka_unit_test(test_never_ends_on_another_record),
        cmocka_unit_test(test_failure_waits_for_the_message),
        cmocka_unit_test(test_sleeping_caller_is_woken_by_the_record),
        cmocka_unit_test(test_reply_wakes_a_sleeping_caller),
        cmocka_unit_test(test_no_record_for_outputs_in_the_reply),
        cmocka_unit_test(test_refused_area_leaves_calls_on_their_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
