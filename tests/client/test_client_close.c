/*
 * A client closed after a call that timed out while its request, large and inline, was still
 * being written to the daemon's socket.  nng 1.5.2 (Debian 12's) loses that write if the
 * socket closes between two of its partial writes: the connection's teardown then waits for
 * the write forever, and gpucd_close never returns.  gpucd_close must return.
 *
 * The server here reads at full speed and never answers compute requests, so each call times
 * out (1 ms) with most of its 16 MiB still to write, and the close comes while partial writes
 * complete (without the library's wait, 3 runs in 3 hung within 100 rounds).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_daemon.h"
#include "gpucd.h"

enum { ROUNDS = 100, ROWS = 4096, DIM = 1024, WATCHDOG_S = 60 };

static fake_action silent_handler(void *arg, const Gpucd__V1__Request *req,
                                  const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    (void)arg;
    (void)payload;
    (void)payload_len;
    if (req->op_case == GPUCD__V1__REQUEST__OP_REGION_REGISTER) {
        fake_reply_status(out, req, GPUCD__V1__STATUS__UNAVAILABLE, "no regions here");
        return FAKE_REPLY;
    }
    if (req->op_case == GPUCD__V1__REQUEST__OP_PING) {
        fake_reply_ok(out, req);
        return FAKE_REPLY;
    }
    return FAKE_SILENT;
}

static void watchdog(int sig)
{
    (void)sig;
    static const char msg[] = "test_client_close: gpucd_close did not return within 60 s\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static void test_close_after_a_large_request_timed_out(void **state)
{
    (void)state;
    fake_daemon fd;
    fake_daemon_start_with_regions(&fd, silent_handler, NULL);
    float *table = calloc((size_t)ROWS * DIM, sizeof *table);
    assert_non_null(table);
    int32_t idx[4] = {0, 1, 2, 3};
    float out[4 * DIM];
    const int64_t table_shape[2] = {ROWS, DIM}, idx_shape[1] = {4}, out_shape[2] = {4, DIM};
    gpucd_tensor t_table = gpucd_tensor_host(table, GPUCD_F32, 2, table_shape);
    gpucd_tensor t_idx = gpucd_tensor_host(idx, GPUCD_I32, 1, idx_shape);
    gpucd_tensor t_out = gpucd_tensor_host(out, GPUCD_F32, 2, out_shape);
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 1;
    signal(SIGALRM, watchdog);
    alarm(WATCHDOG_S);
    for (int round = 0; round < ROUNDS; round++) {
        gpucd_client *c;
        assert_int_equal(gpucd_connect(fd.url, &o, &c), 0);
        int rv = gpucd_embedding_forward(c, &t_idx, &t_table, &t_out, NULL);
        if (rv != GPUCD_ETIMEDOUT)
            fail_msg("round %d: the call returned %d, not a timeout: %s", round, rv,
                     gpucd_errmsg(c));
        gpucd_close(c);
        /* The close's own wait leaves the caller's last error alone. */
        if (strstr(gpucd_errmsg(NULL), "Timed out") == NULL)
            fail_msg("round %d: after the close the error reads \"%s\"", round, gpucd_errmsg(NULL));
    }
    alarm(0);
    free(table);
    fake_daemon_stop(&fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_close_after_a_large_request_timed_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
