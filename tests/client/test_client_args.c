/*
 * Client-side validation: every class of bad argument is refused before
 * anything is sent, with GPUCD_EINVAL and a message naming the problem.  The
 * client talks to a fake daemon that counts requests, and none may arrive.
 * Also: error strings, the default URL, dtype and tensor helpers, connect errors.
 */
#include <math.h>
#include <setjmp.h>
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

typedef struct fixture {
    fake_daemon fd;
    gpucd_client *client;
    float host[64];
    gpucd_tensor x; /* a valid host tensor (2, 4, 2, 4) */
} fixture;

static fake_action reply_unexpected(void *arg, const Gpucd__V1__Request *req,
                                    const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    (void)arg;
    (void)payload;
    (void)payload_len;
    fake_reply_status(out, req, GPUCD__V1__STATUS__INTERNAL, "the client sent a request");
    return FAKE_REPLY;
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    fake_daemon_start(&f->fd, reply_unexpected, NULL);
    assert_int_equal(gpucd_connect(f->fd.url, NULL, &f->client), 0);
    const int64_t shape[] = {2, 4, 2, 4};
    for (int i = 0; i < 64; i++)
        f->host[i] = (float)i;
    f->x = gpucd_tensor_host(f->host, GPUCD_F32, 4, shape);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    gpucd_close(f->client);
    fake_daemon_stop(&f->fd);
    assert_int_equal(f->fd.requests, 0);
    free(f);
    return 0;
}

/* rv must be GPUCD_EINVAL and the message must contain `needle`. */
static void expect_einval(int rv, const char *needle)
{
    const char *msg = gpucd_errmsg(NULL);
    if (rv != GPUCD_EINVAL || strstr(msg, needle) == NULL)
        fail_msg("expected GPUCD_EINVAL mentioning '%s', got %d: '%s'", needle, rv, msg);
}

static void test_null_client_and_outputs(void **state)
{
    fixture *f = *state;
    gpucd_tensor y = f->x;
    expect_einval(gpucd_ping(NULL, NULL), "client");
    expect_einval(gpucd_conv2d_forward(NULL, NULL, &f->x, &f->x, NULL, &y, NULL), "client");
    expect_einval(gpucd_info_get(f->client, NULL), "out");
    expect_einval(gpucd_stats_json(f->client, NULL), "json");
    expect_einval(gpucd_tensor_put(f->client, &f->x, NULL), "id");
    expect_einval(gpucd_regions_list(f->client, NULL, NULL), "list");
    expect_einval(gpucd_connect("ipc:///nonexistent", NULL, NULL), "out");
    gpucd_region *r;
    expect_einval(gpucd_region_create(f->client, 0, &r), "size 0");
    expect_einval(gpucd_region_create(NULL, 64, &r), "client");
}

static void test_required_tensors(void **state)
{
    fixture *f = *state;
    gpucd_tensor y = f->x;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, NULL, &f->x, NULL, &y, NULL),
                  "x is required");
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &f->x, &f->x, NULL, NULL, NULL),
                  "y is required");
    expect_einval(gpucd_embedding_forward(f->client, &f->x, NULL, &y, NULL), "table is required");
    expect_einval(gpucd_linear_cross_entropy(f->client, NULL, &f->x, &f->x, NULL, NULL, &y, NULL,
                                             NULL, NULL, NULL, NULL),
                  "targets is required");
    expect_einval(gpucd_tensor_get(f->client, 1, NULL), "dst is required");
    expect_einval(gpucd_multihot_encode(f->client, NULL, &f->x, NULL, NULL), "out is required");
}

static void test_bad_tensors(void **state)
{
    fixture *f = *state;
    gpucd_tensor y = f->x, t;

    t = f->x;
    t.dtype = GPUCD_DTYPE_INVALID;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &t, &f->x, NULL, &y, NULL),
                  "x: unknown dtype 0");
    t.dtype = (gpucd_dtype)7;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &f->x, &t, NULL, &y, NULL),
                  "w: unknown dtype 7");

    t = f->x;
    t.ndim = 9;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &t, &f->x, NULL, &y, NULL),
                  "x: ndim 9 outside 0..8");
    t.ndim = -1;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &t, &f->x, NULL, &y, NULL),
                  "x: ndim -1");

    t = f->x;
    t.shape[2] = -3;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &f->x, &f->x, &t, &y, NULL),
                  "b: dimension 2 is negative");

    t = f->x;
    t.shape[0] = (int64_t)1 << 40;
    t.shape[1] = (int64_t)1 << 40;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &t, &f->x, NULL, &y, NULL),
                  "x: byte size overflows");
    /* the element count fits in int64, the byte count does not */
    t = f->x;
    t.ndim = 1;
    t.shape[0] = INT64_MAX / 2;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &t, &f->x, NULL, &y, NULL),
                  "x: byte size overflows");

    t = f->x;
    t.data = NULL;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &t, &f->x, NULL, &y, NULL),
                  "x: host tensor with a NULL data pointer");

    memset(&t, 0, sizeof t); /* a zeroed struct is not a valid tensor */
    t.dtype = GPUCD_F32;
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &t, &f->x, NULL, &y, NULL),
                  "x: unknown location 0");

    t = gpucd_tensor_new_resident(GPUCD_F32, 4, f->x.shape);
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &t, &f->x, NULL, &y, NULL),
                  "x is an input and cannot be a new resident tensor");

    t = gpucd_tensor_region(NULL, 0, GPUCD_F32, 4, f->x.shape);
    expect_einval(gpucd_conv2d_forward(f->client, NULL, &t, &f->x, NULL, &y, NULL),
                  "x: region tensor with a NULL region");

    expect_einval(gpucd_conv2d_backward(f->client, NULL, &f->x, &f->x, NULL, &f->x, &y, &y, NULL,
                                        NULL),
                  "dw is the same tensor as another output");

    gpucd_tensor dst = gpucd_tensor_new_resident(GPUCD_F32, 4, f->x.shape);
    expect_einval(gpucd_tensor_get(f->client, 1, &dst), "dst must be a host or region tensor");
}

static void test_bad_params(void **state)
{
    fixture *f = *state;
    gpucd_tensor y = f->x;
    gpucd_conv2d_params cp;
    gpucd_conv2d_params_init(&cp);
    cp.stride_w = 0;
    expect_einval(gpucd_conv2d_forward(f->client, &cp, &f->x, &f->x, NULL, &y, NULL),
                  "stride (1, 0) must be at least 1");
    gpucd_conv2d_params_init(&cp);
    cp.pad_h = -1;
    expect_einval(gpucd_conv2d_forward(f->client, &cp, &f->x, &f->x, NULL, &y, NULL),
                  "padding (-1, 0)");
    gpucd_conv2d_params_init(&cp);
    cp.math = (gpucd_math)5;
    expect_einval(gpucd_conv2d_forward(f->client, &cp, &f->x, &f->x, NULL, &y, NULL),
                  "unknown math mode 5");
    gpucd_conv2d_params_init(&cp);
    cp.relu = 1;
    expect_einval(gpucd_conv2d_backward(f->client, &cp, &f->x, &f->x, NULL, &f->x, NULL, &y,
                                        NULL, NULL),
                  "y (the forward output) is required with relu");

    gpucd_lce_params lp;
    gpucd_lce_params_init(&lp);
    assert_int_equal(lp.ignore_index, -100);
    assert_int_equal(lp.reduction, GPUCD_REDUCE_MEAN);
    assert_true(lp.grad_scale == 1.0f);
    assert_int_equal(lp.filter_auto, 0);
    assert_true(lp.filter_eps == 0.0f);
    gpucd_tensor loss = f->x;
    lp.reduction = (gpucd_reduction)3;
    expect_einval(gpucd_linear_cross_entropy(f->client, &lp, &f->x, &f->x, NULL, &f->x, &loss,
                                             NULL, NULL, NULL, NULL, NULL),
                  "unknown reduction 3");
    gpucd_lce_params_init(&lp);
    lp.grad_scale = 0;
    expect_einval(gpucd_linear_cross_entropy(f->client, &lp, &f->x, &f->x, NULL, &f->x, &loss,
                                             NULL, NULL, NULL, NULL, NULL),
                  "grad_scale 0 must be finite and non-zero");
    gpucd_lce_params_init(&lp);
    lp.softcap = NAN;
    expect_einval(gpucd_linear_cross_entropy(f->client, &lp, &f->x, &f->x, NULL, &f->x, &loss,
                                             NULL, NULL, NULL, NULL, NULL),
                  "softcap nan");
    gpucd_lce_params_init(&lp);
    lp.filter_eps = -1;
    expect_einval(gpucd_linear_cross_entropy(f->client, &lp, &f->x, &f->x, NULL, &f->x, &loss,
                                             NULL, NULL, NULL, NULL, NULL),
                  "filter_eps -1");

    gpucd_multihot_layout ml;
    memset(&ml, 0, sizeof ml);
    ml.height = 2;
    ml.width = 2;
    ml.channels = 4;
    expect_einval(gpucd_multihot_encode(f->client, &ml, &f->x, &y, NULL), "nfeat 0 outside 1..64");
    ml.nfeat = 65;
    expect_einval(gpucd_multihot_encode(f->client, &ml, &f->x, &y, NULL), "nfeat 65");
    ml.nfeat = 2;
    ml.slots[0] = 2;
    ml.slots[1] = 0;
    expect_einval(gpucd_multihot_encode(f->client, &ml, &f->x, &y, NULL),
                  "feature 1: slots 0 must be positive");
    ml.slots[1] = 2;
    ml.height = 0;
    expect_einval(gpucd_multihot_encode(f->client, &ml, &f->x, &y, NULL), "height 0");
}

static void test_bad_nmmo3(void **state)
{
    fixture *f = *state;
    gpucd_tensor t = f->x, h = f->x, g[7];
    for (int i = 0; i < 7; i++)
        g[i] = f->x;
    gpucd_nmmo3_weights w = {&t, &t, &t, &t, &t, NULL, NULL};
    gpucd_nmmo3_weights grads = {&g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6]};
    expect_einval(gpucd_nmmo3_encode(f->client, NULL, &t, &h, NULL, NULL), "weights are required");
    expect_einval(gpucd_nmmo3_encode(f->client, &w, &t, NULL, NULL, NULL),
                  "features and hidden are both NULL");
    expect_einval(gpucd_nmmo3_encode(f->client, &w, &t, NULL, &h, NULL),
                  "hidden needs the projection");
    w.proj_w = &t;
    expect_einval(gpucd_nmmo3_encode(f->client, &w, &t, NULL, &h, NULL),
                  "proj_w and proj_b go together");
    w.proj_w = NULL;
    w.embed = NULL;
    expect_einval(gpucd_nmmo3_encode(f->client, &w, &t, &h, NULL, NULL), "embed is required");
    w.embed = &t;
    expect_einval(gpucd_nmmo3_encode_backward(f->client, &w, &t, &t, NULL, NULL),
                  "grads are required");
    expect_einval(gpucd_nmmo3_encode_backward(f->client, &w, &t, &t, &grads, NULL),
                  "projection gradients without a projection");
    grads.proj_w = grads.proj_b = NULL;
    grads.conv2_b = NULL;
    expect_einval(gpucd_nmmo3_encode_backward(f->client, &w, &t, &t, &grads, NULL),
                  "grads.conv2_b is required");

    /* The training step's saved activations: a resident tensor the daemon sizes. */
    gpucd_tensor saved = gpucd_tensor_new_resident(GPUCD_U8, 0, NULL);
    expect_einval(gpucd_nmmo3_encode_save(f->client, &w, &t, &h, NULL, NULL, NULL),
                  "saved is required");
    expect_einval(gpucd_nmmo3_encode_save(f->client, &w, &t, &h, NULL, &h, NULL),
                  "saved must be a resident tensor");
    gpucd_tensor sized = gpucd_tensor_new_resident(GPUCD_U8, 2, (int64_t[]){4, 64});
    expect_einval(gpucd_nmmo3_encode_save(f->client, &w, &t, &h, NULL, &sized, NULL),
                  "sized by the daemon: give ndim 0 (got 2)");
    grads.conv2_b = &g[3];
    expect_einval(gpucd_nmmo3_encode_backward_saved(f->client, &w, &t, NULL, &t, &grads, NULL),
                  "saved is required");
    expect_einval(gpucd_nmmo3_encode_backward_saved(f->client, &w, &t, &saved, &t, &grads, NULL),
                  "saved is an input and cannot be a new resident tensor");
}

static void test_strerror(void **state)
{
    (void)state;
    const int codes[] = {GPUCD_OK, GPUCD_EINVAL, GPUCD_ENOMEM, GPUCD_ETIMEDOUT, GPUCD_ECONNREFUSED,
                         GPUCD_ECLOSED, GPUCD_ESYSTEM, GPUCD_EPROTO, GPUCD_ETRANSPORT,
                         GPUCD_EADDRESS, GPUCD_EUNTRUSTED};
    const int n = (int)(sizeof codes / sizeof codes[0]);
    const char *seen[32];
    int nseen = 0;
    for (int i = 0; i < n; i++)
        seen[nseen++] = gpucd_strerror(codes[i]);
    for (int s = 1; s <= 12; s++) /* every daemon status of gpucd.proto */
        seen[nseen++] = gpucd_strerror(-(GPUCD_EDAEMON_BASE + s));
    for (int i = 0; i < nseen; i++) {
        assert_non_null(seen[i]);
        assert_true(strlen(seen[i]) > 3);
        assert_string_not_equal(seen[i], gpucd_strerror(-99)); /* the fallbacks */
        assert_string_not_equal(seen[i], gpucd_strerror(-199));
        for (int j = 0; j < i; j++)
            assert_string_not_equal(seen[i], seen[j]);
    }
    assert_int_equal(GPUCD_EINVALID_ARGUMENT, -(GPUCD_EDAEMON_BASE + 4));
    assert_int_equal(GPUCD_EPERMISSION_DENIED, -(GPUCD_EDAEMON_BASE + 7));
    assert_non_null(strstr(gpucd_strerror(-150), "unknown"));
    assert_non_null(strstr(gpucd_strerror(-50), "unknown"));
    assert_non_null(strstr(gpucd_strerror(3), "unknown"));
}

static void test_default_url(void **state)
{
    (void)state;
    char buf[256], want[256];
    setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
    assert_int_equal(gpucd_default_url(buf, sizeof buf), 0);
    assert_string_equal(buf, "ipc:///run/user/4242/gpucd.sock");
    /* exactly fits (with the NUL), then one byte short */
    assert_int_equal(gpucd_default_url(buf, strlen("ipc:///run/user/4242/gpucd.sock") + 1), 0);
    assert_int_equal(gpucd_default_url(buf, strlen("ipc:///run/user/4242/gpucd.sock")),
                     GPUCD_EINVAL);
    assert_int_equal(gpucd_default_url(NULL, 10), GPUCD_EINVAL);

    snprintf(want, sizeof want, "ipc:///tmp/gpucd-%lu/gpucd.sock", (unsigned long)getuid());
    setenv("XDG_RUNTIME_DIR", "relative/dir", 1); /* ignored, as the XDG spec says */
    assert_int_equal(gpucd_default_url(buf, sizeof buf), 0);
    assert_string_equal(buf, want);
    setenv("XDG_RUNTIME_DIR", "", 1);
    assert_int_equal(gpucd_default_url(buf, sizeof buf), 0);
    assert_string_equal(buf, want);
    unsetenv("XDG_RUNTIME_DIR");
    assert_int_equal(gpucd_default_url(buf, sizeof buf), 0);
    assert_string_equal(buf, want);
}

/* GPUCD_URL, when set and not empty, is the default, whatever XDG_RUNTIME_DIR says. */
static void test_default_url_from_environment(void **state)
{
    (void)state;
    char buf[256];
    setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
    setenv("GPUCD_URL", "ipc:///run/gpucd/gpucd.sock", 1);
    assert_int_equal(gpucd_default_url(buf, sizeof buf), 0);
    assert_string_equal(buf, "ipc:///run/gpucd/gpucd.sock");
    assert_int_equal(gpucd_default_url(buf, strlen("ipc:///run/gpucd/gpucd.sock")), GPUCD_EINVAL);
    setenv("GPUCD_URL", "tls+tcp://gpu7:9465", 1);
    assert_int_equal(gpucd_default_url(buf, sizeof buf), 0);
    assert_string_equal(buf, "tls+tcp://gpu7:9465");
    setenv("GPUCD_URL", "", 1); /* empty: as if unset */
    assert_int_equal(gpucd_default_url(buf, sizeof buf), 0);
    assert_string_equal(buf, "ipc:///run/user/4242/gpucd.sock");
    /* connecting to the default goes where it names: a URL of a scheme never served fails */
    setenv("GPUCD_URL", "http://127.0.0.1:1", 1);
    gpucd_client *c = NULL;
    assert_int_equal(gpucd_connect(NULL, NULL, &c), GPUCD_EADDRESS);
    assert_null(c);
    unsetenv("GPUCD_URL");
    unsetenv("XDG_RUNTIME_DIR");
}

static void test_tensor_helpers(void **state)
{
    (void)state;
    const struct {
        gpucd_dtype dt;
        size_t size;
        const char *name;
    } dts[] = {{GPUCD_F32, 4, "f32"}, {GPUCD_BF16, 2, "bf16"}, {GPUCD_F16, 2, "f16"},
               {GPUCD_U8, 1, "u8"},   {GPUCD_I32, 4, "i32"},   {GPUCD_I64, 8, "i64"}};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        assert_int_equal(gpucd_dtype_size(dts[i].dt), dts[i].size);
        assert_string_equal(gpucd_dtype_name(dts[i].dt), dts[i].name);
    }
    assert_int_equal(gpucd_dtype_size(GPUCD_DTYPE_INVALID), 0);
    assert_int_equal(gpucd_dtype_size((gpucd_dtype)99), 0);
    assert_string_equal(gpucd_dtype_name((gpucd_dtype)99), "invalid");

    const int64_t shape[] = {3, 5, 7};
    gpucd_tensor t = gpucd_tensor_host(NULL, GPUCD_BF16, 3, shape);
    assert_int_equal(gpucd_tensor_numel(&t), 105);
    assert_int_equal(gpucd_tensor_bytes(&t), 210);
    t.ndim = 0; /* a scalar */
    assert_int_equal(gpucd_tensor_numel(&t), 1);
    t = gpucd_tensor_resident(42, GPUCD_I64, 2, shape);
    assert_int_equal(t.where, GPUCD_RESIDENT);
    assert_int_equal(t.resident, 42);
    assert_int_equal(gpucd_tensor_bytes(&t), 15 * 8);
    t.shape[1] = -1;
    assert_int_equal(gpucd_tensor_numel(&t), -1);
    const int64_t shape12[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    t = gpucd_tensor_new_resident(GPUCD_U8, 12, shape12); /* ndim kept: it fails at call time */
    assert_int_equal(t.shape[7], 8);
    assert_int_equal(t.ndim, 12);
    assert_int_equal(gpucd_tensor_numel(&t), -1);
    assert_int_equal(gpucd_tensor_numel(NULL), -1);
    t = gpucd_tensor_host(NULL, (gpucd_dtype)0, 1, shape);
    assert_int_equal(gpucd_tensor_bytes(&t), -1);
}

static void test_connect_errors(void **state)
{
    (void)state;
    gpucd_client *c = (gpucd_client *)&c;
    assert_int_equal(gpucd_connect("http://localhost/", NULL, &c), GPUCD_EADDRESS);
    assert_null(c);
    assert_non_null(strstr(gpucd_errmsg(NULL), "http://localhost/"));
    char path[128];
    snprintf(path, sizeof path, "ipc:///tmp/gpucd-test-nobody-%ld.sock", (long)getpid());
    assert_int_equal(gpucd_connect(path, NULL, &c), GPUCD_ECONNREFUSED);
    assert_null(c);
    assert_non_null(strstr(gpucd_errmsg(NULL), path));
    assert_int_equal(gpucd_connect("tcp://127.0.0.1:1", NULL, &c), GPUCD_ECONNREFUSED);
    assert_int_equal(gpucd_connect("tcp://", NULL, &c), GPUCD_EADDRESS);
    gpucd_close(NULL);
    assert_int_equal(gpucd_region_destroy(NULL), 0);
    assert_string_equal(gpucd_version_string(), "0.1.0");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_null_client_and_outputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_required_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_nmmo3, setup, teardown),
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_default_url),
        cmocka_unit_test(test_default_url_from_environment),
        cmocka_unit_test(test_tensor_helpers),
        cmocka_unit_test(test_connect_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
