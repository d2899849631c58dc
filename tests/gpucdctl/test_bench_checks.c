/*
 * test_bench_checks.c - `gpucdctl bench` must never time a wrong answer.  The
 * bench code runs in this process against a scripted daemon (the client tests'
 * fake, on inproc://) that serves conv2 by running the CPU kernel on the
 * request's own bytes, then misbehaves on purpose:
 *   honest  every answer right: exit 0, no errors;
 *   wrong   every answer off by a little: the check request fails, exit 1;
 *   lazy    the check answered right, every later reply leaves the output
 *           unwritten: each timed request is an error, none is timed, exit 1;
 *   slow    every answer right after 30 ms: windows of 10 ms stretch until they
 *           hold their share of --min-requests, and a level that cannot reach it
 *           before --max-level-s is an error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "bench.h"
#include "fake_daemon.h"
#include "gk.h"

typedef enum fake_mode { HONEST, WRONG, LAZY, SLOW } fake_mode;

typedef struct fake_state {
    fake_mode mode;
    int conv_calls;
    void *resident[4];
    size_t resident_bytes[4];
    int nresident;
} fake_state;

static gk_tensor view_of(const Gpucd__V1__TensorRef *ref, void *data)
{
    return gk_tensor_make(data, (gk_dtype)ref->dtype, (int)ref->n_shape, ref->shape);
}

static void *bytes_of(fake_state *s, const Gpucd__V1__TensorRef *ref, const uint8_t *payload)
{
    if (ref->where_case == GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD)
        return (void *)(payload + ref->payload->offset);
    if (ref->where_case == GPUCD__V1__TENSOR_REF__WHERE_RESIDENT && ref->resident >= 1 &&
        ref->resident <= (uint64_t)s->nresident)
        return s->resident[ref->resident - 1];
    return NULL;
}

static fake_action serve(void *arg, const Gpucd__V1__Request *req, const uint8_t *payload,
                         size_t payload_len, fake_reply *out)
{
    fake_state *s = arg;
    static const uint64_t timings[6] = {3, 0, 40, 0, 0, 50};
    switch (req->op_case) {
    case GPUCD__V1__REQUEST__OP_TENSOR_PUT: {
        const Gpucd__V1__TensorRef *src = req->tensor_put->src;
        gk_tensor t = view_of(src, NULL);
        size_t n = (size_t)gk_tensor_bytes(&t);
        assert_true(s->nresident < 4);
        s->resident[s->nresident] = malloc(n);
        memcpy(s->resident[s->nresident], payload + src->payload->offset, n);
        s->resident_bytes[s->nresident++] = n;
        fake_reply_ok(out, req);
        out->reply.result_case = GPUCD__V1__REPLY__RESULT_TENSOR_ID;
        out->reply.tensor_id = (uint64_t)s->nresident;
        return FAKE_REPLY;
    }
    case GPUCD__V1__REQUEST__OP_TENSOR_FREE:
        fake_reply_ok(out, req);
        return FAKE_REPLY;
    case GPUCD__V1__REQUEST__OP_CONV2D_FORWARD: {
        const Gpucd__V1__Conv2dForward *m = req->conv2d_forward;
        gk_conv2d p = {.stride_h = (int)m->params->stride_h, .stride_w = (int)m->params->stride_w,
                       .pad_h = (int)m->params->pad_h, .pad_w = (int)m->params->pad_w,
                       .relu = m->params->relu};
        gk_tensor x = view_of(m->x, bytes_of(s, m->x, payload));
        gk_tensor w = view_of(m->w, bytes_of(s, m->w, payload));
        gk_tensor b = view_of(m->b, bytes_of(s, m->b, payload));
        gk_tensor y = view_of(m->y, NULL);
        size_t yb = (size_t)gk_tensor_bytes(&y);
        float *ybuf = malloc(yb);
        y.data = ybuf;
        gk_err err;
        assert_int_equal(gk_cpu_conv2d_forward(&p, &x, &w, &b, &y, &err), 0);
        if (s->mode == WRONG)
            for (size_t i = 0; i < yb / 4; i++)
                ybuf[i] += 0.05f;
        if (s->mode == LAZY && s->conv_calls > 0)
            memset(ybuf, 0xff, yb); /* what an unwritten, poisoned buffer looks like */
        if (s->mode == SLOW)
            usleep(30000);
        s->conv_calls++;
        fake_reply_ok(out, req);
        fake_reply_output_payload(out, 0);
        fake_reply_timings(out, timings);
        fake_reply_payload(out, ybuf, yb);
        free(ybuf);
        return FAKE_REPLY;
    }
    default:
        fake_reply_status(out, req, GPUCD__V1__STATUS__UNKNOWN_OPERATION, "not scripted");
        return FAKE_REPLY;
    }
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static double json_number(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (p == NULL)
        fail_msg("no %s in %s", key, json);
    return strtod(p + strlen(pat), NULL);
}

/* Runs bench conv2 against the fake in `mode` with the options of `more` (NULL-terminated)
 * after the defaults; returns the exit status, JSON in *json. */
static int bench_with(fake_mode mode, const char *const *more, char **json, fake_state *st)
{
    memset(st, 0, sizeof *st);
    st->mode = mode;
    fake_daemon fd;
    fake_daemon_start(&fd, serve, st);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    char path[] = "/tmp/gpucd-bench-check-XXXXXX";
    int tmp = mkstemp(path);
    assert_true(tmp >= 0);
    close(tmp);
    char *argv[32] = {"bench", "--op", "conv2", "--batch", "3", "--warmup-s", "0.05",
                      "--window-s", "0.05", "--max-windows", "3", "--json", path};
    int argc = 13;
    for (int i = 0; more != NULL && more[i] != NULL && argc < 31; i++)
        argv[argc++] = (char *)more[i];
    argv[argc] = NULL;
    int rc = bench_main(c, fd.url, (uint64_t)geteuid(), argc, argv);
    gpucd_close(c);
    fake_daemon_stop(&fd);
    char *j = slurp(path);
    *json = j != NULL && j[0] != '\0' ? strdup(j) : NULL;
    unlink(path);
    for (int i = 0; i < st->nresident; i++)
        free(st->resident[i]);
    return rc;
}

static int bench_against(fake_mode mode, char **json, fake_state *st)
{
    return bench_with(mode, NULL, json, st);
}

/* The level object's number for key (the first level's). */
static double level_number(const char *json, const char *key)
{
    const char *lv = strstr(json, "\"levels\":[");
    if (lv == NULL)
        fail_msg("no levels in %s", json);
    return json_number(lv, key);
}

/* Each request takes 30 ms, each window 10 ms at least: the windows stretch until each
 * holds 2 requests (a third of 6), so the level measures 6 or more, over 5 requests'
 * time or more (the first may have been sent before its window opened). */
static void test_windows_stretch_to_min_requests(void **state)
{
    fake_state st;
    char *j;
    const char *more[] = {"--window-s", "0.01", "--warmup-s", "0", "--min-requests", "6", NULL};
    assert_int_equal(bench_with(SLOW, more, &j, &st), 0);
    assert_non_null(j);
    double measured = level_number(j, "requests"), seconds = level_number(j, "seconds");
    fprintf(stderr, "slow daemon: %.0f requests measured in %.3f s\n", measured, seconds);
    assert_true(measured >= 6);
    assert_true(seconds >= 5 * 0.030);
    assert_true(json_number(j, "min_requests") == 6);
    assert_non_null(strstr(j, "\"few_samples\":[\"p50\",\"p90\",\"p95\",\"p99\"]"));
    free(j);
}

/* 1000 requests of 30 ms cannot come in 0.2 s: the level is an error, reported as such. */
static void test_level_cut_off_short_is_an_error(void **state)
{
    fake_state st;
    char *j;
    const char *more[] = {"--warmup-s", "0", "--min-requests", "1000", "--max-level-s", "0.2",
                          NULL};
    assert_int_equal(bench_with(SLOW, more, &j, &st), 1);
    assert_non_null(j);
    assert_true(level_number(j, "requests") < 1000);
    assert_true(json_number(j, "errors") == 0); /* no request failed: the count alone */
    assert_non_null(strstr(j, "\"ended\":\"max_level_s\""));
    assert_non_null(strstr(j, "\"error\":\"fewer than min_requests measured\""));
    free(j);
}

static void test_honest_daemon_passes(void **state)
{
    fake_state st;
    char *j;
    assert_int_equal(bench_against(HONEST, &j, &st), 0);
    assert_non_null(j);
    assert_true(json_number(j, "errors") == 0);
    assert_true(json_number(j, "requests") == st.conv_calls);
    assert_non_null(strstr(j, "\"check\":{\"done\":true"));
    free(j);
}

static void test_wrong_answer_fails_the_check(void **state)
{
    fake_state st;
    char *j;
    assert_int_equal(bench_against(WRONG, &j, &st), 1);
    assert_int_equal(st.conv_calls, 1); /* nothing timed after a wrong check */
    assert_null(j);
}

static void test_unwritten_outputs_are_errors(void **state)
{
    fake_state st;
    char *j;
    assert_int_equal(bench_against(LAZY, &j, &st), 1);
    assert_non_null(j);
    double made = json_number(j, "requests"), errors = json_number(j, "errors");
    fprintf(stderr, "lazy daemon: %.0f requests, %.0f errors\n", made, errors);
    assert_true(made == st.conv_calls);
    assert_true(made > 1);
    assert_true(errors == made - 1); /* every request after the check */
    assert_non_null(strstr(j, "an output was left unwritten"));
    /* none of them was timed: no latency was recorded in any level */
    const char *p = j;
    while ((p = strstr(p, "\"requests_per_s\":")) != NULL) {
        assert_true(strtod(p + strlen("\"requests_per_s\":"), NULL) == 0);
        p++;
    }
    free(j);
}

/*
 * --server-side dials a connection of its own: over ipc:// one to a daemon of another uid
 * than the trusted one is closed before any request goes over it, as the library's are.
 */
static void test_server_side_checks_the_daemons_uid(void **state)
{
    const bench_preset *conv2 = NULL;
    for (int i = 0; i < bench_preset_count; i++)
        if (strcmp(bench_presets[i].name, "conv2") == 0)
            conv2 = &bench_presets[i];
    assert_non_null(conv2);
    bench_shape shape = conv2->defaults;
    shape.batch = 2;
    for (int trusted = 0; trusted < 2; trusted++) {
        fake_state st = {.mode = HONEST};
        fake_daemon fd;
        fake_daemon_start_with_regions(&fd, serve, &st);
        bench_server_opts so = {.warmup = 0, .iterations = 1, .repeats = 1,
                                .trust_uid = (uint64_t)geteuid() + (trusted ? 0 : 1)};
        bench_server_result res;
        uint64_t rng = 1;
        const int rc = bench_server_run(conv2, &shape, fd.url, 2000, &so, &res, &rng, NULL);
        const int requests = fd.requests;
        fake_daemon_stop(&fd);
        for (int i = 0; i < st.nresident; i++)
            free(st.resident[i]);
        if (trusted) {
            assert_true(requests > 0); /* it got through (whatever the fake then answers) */
        } else {
            assert_int_equal(rc, -1);
            assert_int_equal(requests, 0);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_honest_daemon_passes),
        cmocka_unit_test(test_server_side_checks_the_daemons_uid),
        cmocka_unit_test(test_wrong_answer_fails_the_check),
        cmocka_unit_test(test_unwritten_outputs_are_errors),
        cmocka_unit_test(test_windows_stretch_to_min_requests),
        cmocka_unit_test(test_level_cut_off_short_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
