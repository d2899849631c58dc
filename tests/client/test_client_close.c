/*
 * Closing a client right after a call whose reply came as its timeout expired.  nng's
 * expiry thread may then still be about to cancel the call's receive on the context,
 * after the reply has finished it and the caller has gone on: a close that freed the
 * socket first had that thread lock a destroyed mutex (nng panics) or touch freed
 * memory.  The fake daemon's replies sweep across the client's deadline so that many of
 * the calls race their expiry; the loop is bounded by wall time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <cmocka.h>

#include "fake_daemon.h"
#include "gpucd.h"

enum {
    TIMEOUT_MS = 2,
    SWEEP_STEPS = 40, /* reply delays from 1 ms before the deadline to 1 ms after it */
    ROUNDS = 3000,
    WALL_MS = 20000,
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Replies after the delay of the round the test is in. */
static fake_action delayed_handler(void *arg, const Gpucd__V1__Request *req,
                                   const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    const int *round = arg;
    (void)payload;
    (void)payload_len;
    const int step = __atomic_load_n(round, __ATOMIC_RELAXED) % SWEEP_STEPS;
    sleep_us((TIMEOUT_MS - 1) * 1000 + step * 2000 / SWEEP_STEPS);
    fake_reply_ok(out, req);
    return FAKE_REPLY;
}

static void test_close_after_reply_at_deadline(void **state)
{
    (void)state;
    int round = 0;
    fake_daemon fd;
    fake_daemon_start(&fd, delayed_handler, &round);
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = TIMEOUT_MS;
    const uint64_t until = now_ms() + WALL_MS;
    int replied = 0, timed_out = 0;
    for (; round < ROUNDS && now_ms() < until; __atomic_add_fetch(&round, 1, __ATOMIC_RELAXED)) {
        gpucd_client *c;
        assert_int_equal(gpucd_connect(fd.url, &o, &c), 0);
        const int rv = gpucd_ping(c, NULL);
        if (rv == 0)
            replied++;
        else if (rv == GPUCD_ETIMEDOUT)
            timed_out++;
        else
            fail_msg("round %d: ping returned %d: %s", round, rv, gpucd_errmsg(c));
        gpucd_close(c);
    }
    printf("%d rounds: %d replied, %d timed out\n", round, replied, timed_out);
    assert_true(replied + timed_out == round);
    fake_daemon_stop(&fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_close_after_reply_at_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
