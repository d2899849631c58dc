/*
 * test_bad_input.c - one test per class of hostile input.  Each request is
 * built by hand on a bare socket, must get an error reply with the right
 * status and a message naming the problem, and the daemon must still answer
 * a ping afterwards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "raw.h"

/*
 * This test process only (the daemon is another program): nng 1.5.2 leaks the
 * objects of an ipc connection that the peer drops while a large message is
 * being sent to it, which the oversize test does on purpose; LeakSanitizer
 * would report them now and then at exit.  A leak allocated outside nng still fails.
 */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnng.so\n"; }

static th_daemon daemon_;
static th_raw raw_;
/*
 * A second client, connected at the start: a connection opened right after
 * the oversize test's connection is dropped by the transport is, rarely
 * (about 1 run in 40 under load, on old and new daemons alike), never
 * accepted by nng 1.5.2: no pipe event at all reaches the daemon.
 */
static th_raw other_;

/* Asserts the reply's status and that its message contains `needle`. */
static void expect(Gpucd__V1__Reply *rep, Gpucd__V1__Status status, const char *needle)
{
    assert_non_null(rep);
    if ((Gpucd__V1__Status)rep->status != status || rep->message == NULL ||
        strstr(rep->message, needle) == NULL) {
        fail_msg("got status %d '%s', expected %d with '%s'", (int)rep->status,
                 rep->message ? rep->message : "", (int)status, needle);
    }
    gpucd__v1__reply__free_unpacked(rep, NULL);
}

static void expect_ping(void)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Ping ping = GPUCD__V1__PING__INIT;
    req.op_case = GPUCD__V1__REQUEST__OP_PING;
    req.ping = &ping;
    Gpucd__V1__Reply *rep = th_raw_call(&raw_, &req, NULL, 0);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    gpucd__v1__reply__free_unpacked(rep, NULL);
}

/* A registered region of 1 MiB for this socket. */
static th_region region_;
static uint64_t region_id_;
static uint8_t *region_base_;
enum { REGION_SIZE = 1 << 20 };

/* conv2d_forward x (2,3,8,8) w (4,3,3,3) y (2,4,6,6), all in the region unless overridden. */
typedef struct conv_req {
    Gpucd__V1__Request req;
    Gpucd__V1__Conv2dForward op;
    Gpucd__V1__Conv2dParams params;
    th_ref x, w, y;
} conv_req;

static void conv_req_init(conv_req *c)
{
    gpucd__v1__request__init(&c->req);
    gpucd__v1__conv2d_forward__init(&c->op);
    gpucd__v1__conv2d_params__init(&c->params);
    c->params.stride_h = c->params.stride_w = 1;
    c->op.params = &c->params;
    c->op.x = th_ref_region(&c->x, GPUCD__V1__DTYPE__F32, region_id_, 0, 4, TH_SHAPE(2, 3, 8, 8));
    c->op.w = th_ref_region(&c->w, GPUCD__V1__DTYPE__F32, region_id_, 4096, 4, TH_SHAPE(4, 3, 3, 3));
    c->op.y = th_ref_region(&c->y, GPUCD__V1__DTYPE__F32, region_id_, 8192, 4, TH_SHAPE(2, 4, 6, 6));
    c->req.op_case = GPUCD__V1__REQUEST__OP_CONV2D_FORWARD;
    c->req.conv2d_forward = &c->op;
    th_fill_f32((float *)region_base_, 8192 / 4);
}

static void test_valid_request_passes(void **state)
{
    conv_req c;
    conv_req_init(&c);
    Gpucd__V1__Reply *rep = th_raw_call(&raw_, &c.req, NULL, 0);
    assert_non_null(rep);
    if (rep->status != 0)
        fail_msg("the valid template failed: %s", rep->message);
    assert_int_equal(rep->n_outputs, 1);
    gpucd__v1__reply__free_unpacked(rep, NULL);
}

static void test_malformed_bytes(void **state)
{
    int err;
    expect(th_raw_send_bytes(&raw_, "hello", 5, &err), GPUCD__V1__STATUS__BAD_MESSAGE,
           "prefix");
    expect(th_raw_send_bytes(&raw_, "XXXX\x04\0\0\0abcd", 12, &err),
           GPUCD__V1__STATUS__BAD_MESSAGE, "magic");
    expect(th_raw_send_bytes(&raw_, "GPCD\xff\xff\0\0abcd", 12, &err),
           GPUCD__V1__STATUS__BAD_MESSAGE, "header length");
    /* A header that is not a protobuf message: a field with a truncated length. */
    uint8_t junk[64 + 8] = {'G', 'P', 'C', 'D', 6, 0, 0, 0, 0x12, 0x7f, 0xff, 0xff, 0xff, 0x0f};
    expect(th_raw_send_bytes(&raw_, junk, 14, &err), GPUCD__V1__STATUS__BAD_MESSAGE,
           "not a valid");
    for (int i = 0; i < 50; i++) { /* random garbage after a valid prefix */
        uint8_t buf[72] = {'G', 'P', 'C', 'D', 64, 0, 0, 0};
        for (int k = 8; k < 72; k++)
            buf[k] = (uint8_t)th_rand_u64();
        Gpucd__V1__Reply *rep = th_raw_send_bytes(&raw_, buf, sizeof buf, &err);
        assert_non_null(rep);
        assert_int_not_equal(rep->status, GPUCD__V1__STATUS__OK);
        gpucd__v1__reply__free_unpacked(rep, NULL);
    }
    expect_ping();
}

static void test_unknown_operation(void **state)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    expect(th_raw_call(&raw_, &req, NULL, 0), GPUCD__V1__STATUS__UNKNOWN_OPERATION,
           "no operation");
    /* Field 99 (an operation from the future) is an unknown field to this daemon. */
    uint8_t buf[64] = {'G', 'P', 'C', 'D', 9, 0, 0, 0, 0x08, 0x01, 0x10, 0x05, 0x9a, 0x06, 0x02,
                       0x08, 0x01};
    int err;
    expect(th_raw_send_bytes(&raw_, buf, 17, &err), GPUCD__V1__STATUS__UNKNOWN_OPERATION,
           "no operation");
    expect_ping();
}

static void test_wrong_version(void **state)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Ping ping = GPUCD__V1__PING__INIT;
    req.op_case = GPUCD__V1__REQUEST__OP_PING;
    req.ping = &ping;
    req.version = 7;
    expect(th_raw_call(&raw_, &req, NULL, 0), GPUCD__V1__STATUS__VERSION_MISMATCH, "version 7");
    expect_ping();
}

static void test_oversize_message(void **state)
{
    /* The daemon runs with --max-message-mb 2.  Just over: a reply naming the limit. */
    size_t n = (2u << 20) + 4096;
    uint8_t *buf = calloc(1, n);
    memcpy(buf, "GPCD\0\0\0\0", 8);
    int err;
    expect(th_raw_send_bytes(&raw_, buf, n, &err), GPUCD__V1__STATUS__RESOURCE_EXHAUSTED,
           "max-message-mb");
    free(buf);
    /*
     * Far over: the transport drops the connection before anything decodes it.
     * The socket is left open: nng 1.5.2's nng_close can wait forever on the
     * pipe the peer dropped mid-send (caught under gdb, about 1 run in 40 under
     * ASan); the process ends soon after and the daemon has let it go.
     */
    th_raw big;
    th_raw_open(&big, daemon_.ipc_url);
    n = 16u << 20;
    buf = calloc(1, n);
    memcpy(buf, "GPCD\0\0\0\0", 8);
    nng_socket_set_ms(big.sock, NNG_OPT_RECVTIMEO, 3000);
    Gpucd__V1__Reply *rep = th_raw_send_bytes(&big, buf, n, &err);
    assert_null(rep);
    free(buf);
    expect_ping();
}

static void test_unknown_region(void **state)
{
    conv_req c;
    conv_req_init(&c);
    c.op.x = th_ref_region(&c.x, GPUCD__V1__DTYPE__F32, 999999, 0, 4, TH_SHAPE(2, 3, 8, 8));
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__NOT_FOUND, "no region 999999");
    expect_ping();
}

static void test_range_and_overflow(void **state)
{
    conv_req c;
    conv_req_init(&c);
    c.x.region.offset = REGION_SIZE - 64; /* starts inside, ends outside */
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__OUT_OF_RANGE, "outside region");
    conv_req_init(&c);
    c.x.region.offset = UINT64_MAX - 8; /* offset + size wraps around */
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__OUT_OF_RANGE, "outside region");
    conv_req_init(&c);
    c.x.shape[0] = INT64_MAX / 2; /* bytes overflow 64 bits */
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT, "overflows");
    conv_req_init(&c);
    c.x.shape[0] = 0;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "a dimension is 0");
    conv_req_init(&c);
    c.x.shape[0] = -2;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT, "negative");
    /* Inline input beyond the payload. */
    conv_req_init(&c);
    c.op.x = th_ref_payload(&c.x, GPUCD__V1__DTYPE__F32, 0, 4, TH_SHAPE(2, 3, 8, 8));
    static float small[64];
    expect(th_raw_call(&raw_, &c.req, small, sizeof small), GPUCD__V1__STATUS__OUT_OF_RANGE,
           "payload");
    expect_ping();
}

static void test_misaligned(void **state)
{
    conv_req c;
    conv_req_init(&c);
    c.x.region.offset = 2;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "not a multiple of the f32 element size");
    conv_req_init(&c);
    c.op.x = th_ref_payload(&c.x, GPUCD__V1__DTYPE__F32, 4, 4, TH_SHAPE(2, 3, 8, 8));
    static float big[2 * 3 * 8 * 8 + 64];
    expect(th_raw_call(&raw_, &c.req, big, sizeof big), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "not a multiple of 64");
    expect_ping();
}

static void test_wrong_dtype_or_shape(void **state)
{
    conv_req c;
    conv_req_init(&c);
    c.x.t.dtype = 42;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT, "dtype 42");
    conv_req_init(&c);
    c.x.t.dtype = GPUCD__V1__DTYPE__I32; /* a known dtype the op does not take */
    Gpucd__V1__Reply *rep = th_raw_call(&raw_, &c.req, NULL, 0);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__INVALID_ARGUMENT);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    conv_req_init(&c);
    c.x.shape[1] = 5; /* channels differ from w's */
    rep = th_raw_call(&raw_, &c.req, NULL, 0);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__INVALID_ARGUMENT);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    conv_req_init(&c);
    c.x.t.n_shape = 9;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "9 dimensions");
    conv_req_init(&c);
    c.params.stride_h = 0;
    rep = th_raw_call(&raw_, &c.req, NULL, 0);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__INVALID_ARGUMENT);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    conv_req_init(&c);
    c.params.math = 17;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT, "math 17");
    conv_req_init(&c);
    c.op.w = NULL;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "w is required");
    expect_ping();
}

static void test_overlapping_outputs(void **state)
{
    conv_req c;
    conv_req_init(&c);
    c.y.region.offset = 4096 + 64; /* y overlaps w */
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "output y overlaps input w");
    /* Two outputs of one request over the same bytes. */
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Conv2dBackward op = GPUCD__V1__CONV2D_BACKWARD__INIT;
    Gpucd__V1__Conv2dParams params = GPUCD__V1__CONV2D_PARAMS__INIT;
    params.stride_h = params.stride_w = 1;
    th_ref x, w, dy, dw, db;
    op.params = &params;
    op.x = th_ref_region(&x, GPUCD__V1__DTYPE__F32, region_id_, 0, 4, TH_SHAPE(2, 3, 8, 8));
    op.w = th_ref_region(&w, GPUCD__V1__DTYPE__F32, region_id_, 4096, 4, TH_SHAPE(4, 3, 3, 3));
    op.dy = th_ref_region(&dy, GPUCD__V1__DTYPE__F32, region_id_, 8192, 4, TH_SHAPE(2, 4, 6, 6));
    op.dw = th_ref_region(&dw, GPUCD__V1__DTYPE__F32, region_id_, 16384, 4, TH_SHAPE(4, 3, 3, 3));
    op.db = th_ref_region(&db, GPUCD__V1__DTYPE__F32, region_id_, 16384 + 8, 1, TH_SHAPE(4));
    req.op_case = GPUCD__V1__REQUEST__OP_CONV2D_BACKWARD;
    req.conv2d_backward = &op;
    expect(th_raw_call(&raw_, &req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "output dw overlaps output db");
    expect_ping();
}

/* multihot_encode of 3 fresh valid agents at 0 of the region, out (3,59,11,15) f32 at 8192. */
typedef struct multihot_req {
    Gpucd__V1__Request req;
    Gpucd__V1__MultihotEncode op;
    th_ref obs, out;
} multihot_req;

static void multihot_req_init(multihot_req *m)
{
    gpucd__v1__request__init(&m->req);
    gpucd__v1__multihot_encode__init(&m->op);
    th_fill_nmmo3_obs(region_base_, 3);
    m->op.obs = th_ref_region(&m->obs, GPUCD__V1__DTYPE__U8, region_id_, 0, 2, TH_SHAPE(3, 1707));
    m->op.out = th_ref_region(&m->out, GPUCD__V1__DTYPE__F32, region_id_, 8192, 4,
                           TH_SHAPE(3, 59, 11, 15));
    m->req.op_case = GPUCD__V1__REQUEST__OP_MULTIHOT_ENCODE;
    m->req.multihot_encode = &m->op;
}

static void test_out_of_range_observation(void **state)
{
    multihot_req m;
    multihot_req_init(&m);
    /* agent 2, tile (4, 6): feature 2 has 17 slots */
    region_base_[1707 * 2 + (4 * 15 + 6) * 10 + 2] = 17;
    Gpucd__V1__Reply *rep = th_raw_call(&raw_, &m.req, NULL, 0);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OUT_OF_RANGE);
    assert_non_null(strstr(rep->message, "agent 2"));
    assert_non_null(strstr(rep->message, "feature 2"));
    gpucd__v1__reply__free_unpacked(rep, NULL);
    expect_ping();
}

/* embedding_bag in the region: ids i32 (4, 6) at 0, table f32 (10, 8) at 4096, out (4, 8) at 8192. */
typedef struct bag_req {
    Gpucd__V1__Request req;
    Gpucd__V1__EmbeddingBag op;
    th_ref idx, table, out;
} bag_req;

static void bag_req_init(bag_req *b)
{
    gpucd__v1__request__init(&b->req);
    gpucd__v1__embedding_bag__init(&b->op);
    int32_t *ids = (int32_t *)region_base_;
    for (int i = 0; i < 24; i++)
        ids[i] = i % 4 == 3 ? -1 : i % 10;
    th_fill_f32((float *)(region_base_ + 4096), 80);
    b->op.indices = th_ref_region(&b->idx, GPUCD__V1__DTYPE__I32, region_id_, 0, 2, TH_SHAPE(4, 6));
    b->op.table = th_ref_region(&b->table, GPUCD__V1__DTYPE__F32, region_id_, 4096, 2,
                                TH_SHAPE(10, 8));
    b->op.out = th_ref_region(&b->out, GPUCD__V1__DTYPE__F32, region_id_, 8192, 2, TH_SHAPE(4, 8));
    b->req.op_case = GPUCD__V1__REQUEST__OP_EMBEDDING_BAG;
    b->req.embedding_bag = &b->op;
}

/* Ids that are neither -1 nor a table row, and every malformed tensor, are refused by name. */
static void test_hostile_embedding_bag(void **state)
{
    bag_req b;
    bag_req_init(&b);
    Gpucd__V1__Reply *rep = th_raw_call(&raw_, &b.req, NULL, 0);
    assert_non_null(rep);
    if (rep->status != 0)
        fail_msg("the valid embedding_bag template failed: %s", rep->message);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    const struct {
        int pos;
        int32_t value;
        const char *needle;
    } bad[] = {{7, -2, "position 7 (bag 1, 1): value -2"},
               {23, 10, "position 23 (bag 3, 5): value 10"},
               {0, INT32_MIN, "position 0 (bag 0, 0): value -2147483648"},
               {12, INT32_MAX, "position 12 (bag 2, 0): value 2147483647"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bag_req_init(&b);
        ((int32_t *)region_base_)[bad[i].pos] = bad[i].value;
        expect(th_raw_call(&raw_, &b.req, NULL, 0), GPUCD__V1__STATUS__OUT_OF_RANGE,
               bad[i].needle);
    }
    bag_req_init(&b);
    b.idx.t.dtype = GPUCD__V1__DTYPE__I64; /* ids are i32 */
    expect(th_raw_call(&raw_, &b.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "idx: dtype i64, expected i32");
    bag_req_init(&b);
    b.idx.t.n_shape = 1; /* bags are the rows of a 2-d tensor */
    expect(th_raw_call(&raw_, &b.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "idx: expected 2 dimensions");
    bag_req_init(&b);
    b.out.t.dtype = GPUCD__V1__DTYPE__BF16; /* sums are f32 */
    expect(th_raw_call(&raw_, &b.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "out: dtype bf16, expected f32");
    bag_req_init(&b);
    b.out.shape[1] = 7; /* not the table's D */
    expect(th_raw_call(&raw_, &b.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "out: dimension 1 is 7, expected 8");
    bag_req_init(&b);
    b.out.shape[0] = 5; /* not idx's B */
    expect(th_raw_call(&raw_, &b.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "out: dimension 0 is 5, expected 4");
    bag_req_init(&b);
    b.out.region.offset = 4096 + 64; /* out over the table */
    expect(th_raw_call(&raw_, &b.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "output out overlaps input table");
    bag_req_init(&b);
    b.op.table = NULL;
    expect(th_raw_call(&raw_, &b.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "embedding_bag: tensor table is required");
    expect_ping();
}

/* RegionRegister by name, as clients registered regions before they were memfds. */
static Gpucd__V1__Reply *register_name(const char *name)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__RegionRegister reg = GPUCD__V1__REGION_REGISTER__INIT;
    reg.name = (char *)name;
    reg.size = 4096;
    req.op_case = GPUCD__V1__REQUEST__OP_REGION_REGISTER;
    req.region_register = &reg;
    return th_raw_call(&raw_, &req, NULL, 0);
}

static void test_hostile_regions(void **state)
{
    /* A memfd of another size than declared (test_memfd has every other hostile descriptor). */
    th_region reg;
    th_memfd_make(&reg, 4096, F_SEAL_SHRINK | F_SEAL_GROW);
    fdpass_request pass = {.magic = FDPASS_MAGIC, .version = FDPASS_VERSION,
                           .op = FDPASS_OP_REGION, .size = 8192};
    fdpass_answer ans;
    assert_int_equal(th_fdpass(raw_.url, &pass, sizeof pass, &reg.fd, 1, &ans, NULL), 0);
    assert_int_equal(ans.status, GPUCD__V1__STATUS__INVALID_ARGUMENT);
    assert_non_null(strstr(ans.message, "not the 8192 declared"));
    th_region_free(&reg);
    /* Names, whatever they try (escapes, objects that do not exist): none is opened. */
    const char *named = "named shared-memory regions are not accepted";
    expect(register_name("/gpucd-../../etc/passwd"), GPUCD__V1__STATUS__INVALID_ARGUMENT, named);
    expect(register_name("/dev/shm/x"), GPUCD__V1__STATUS__INVALID_ARGUMENT, named);
    expect(register_name("/gpucd-does-not-exist"), GPUCD__V1__STATUS__INVALID_ARGUMENT, named);
    /* A token nobody was given. */
    expect(th_raw_register(&raw_, 42, 4096), GPUCD__V1__STATUS__NOT_FOUND, "no memfd is pending");
    /* Another connection's region is not ours to use, nor to know of. */
    conv_req c;
    conv_req_init(&c);
    expect(th_raw_call(&other_, &c.req, NULL, 0), GPUCD__V1__STATUS__NOT_FOUND, "x: no region");
    expect_ping();
}

/* The completion record (Request.doorbell): every place it may not go, then what a valid one gets. */
static void test_hostile_doorbell(void **state)
{
    (void)state;
    Gpucd__V1__RegionSlice bell = GPUCD__V1__REGION_SLICE__INIT;
    bell.region_id = region_id_;
    bell.offset = 65536;
    Gpucd__V1__Request ping_req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Ping ping = GPUCD__V1__PING__INIT;
    ping_req.op_case = GPUCD__V1__REQUEST__OP_PING;
    ping_req.ping = &ping;
    ping_req.doorbell = &bell;
    expect(th_raw_call(&raw_, &ping_req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "doorbell applies to compute operations only");

    conv_req c;
    conv_req_init(&c);
    /* record_only: only with a record to answer by */
    c.req.record_only = 1;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "record_only needs a doorbell");
    ping_req.doorbell = NULL;
    ping_req.record_only = 1;
    expect(th_raw_call(&raw_, &ping_req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "record_only needs a doorbell");
    c.req.record_only = 0;
    c.req.doorbell = &bell;
    bell.region_id = 999999;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__NOT_FOUND,
           "doorbell: no region 999999");
    bell.region_id = region_id_;
    bell.offset = 65536 + 8;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "doorbell: offset 65544 is not a multiple of 64");
    bell.offset = REGION_SIZE;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__OUT_OF_RANGE,
           "doorbell: bytes [1048576, +64) lie outside region");
    bell.offset = UINT64_MAX - 63; /* a multiple of 64 whose end would wrap */
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__OUT_OF_RANGE, "lie outside");
    bell.offset = 8192 + 64; /* inside the output y */
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "doorbell: bytes [8256, +64) overlap y");
    bell.offset = 0; /* on the input x */
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT, "overlap x");
    bell.offset = 65536;
    th_raw remote;
    th_raw_open(&remote, daemon_.tcp_url);
    expect(th_raw_call(&remote, &c.req, NULL, 0), GPUCD__V1__STATUS__PERMISSION_DENIED,
           "for local (ipc://) clients");
    th_raw_close(&remote);

    /* Valid: the record carries the request's id, its status and the reply's timings. */
    uint8_t *rec = region_base_ + 65536;
    memset(rec, 0xa5, 64);
    conv_req_init(&c);
    c.req.doorbell = &bell;
    c.req.id = 0x123456789abcULL;
    Gpucd__V1__Reply *rep = th_raw_call(&raw_, &c.req, NULL, 0);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    uint64_t words[8];
    memcpy(words, rec, sizeof words);
    assert_int_equal(words[0], 0x123456789abcULL);
    assert_int_equal(words[1], GPUCD__V1__STATUS__OK); /* status 0, reserved 0 */
    assert_int_equal(words[2], rep->timings->queue_us);
    assert_int_equal(words[4], rep->timings->compute_us);
    assert_int_equal(words[7], rep->timings->total_us);
    assert_true(words[7] > 0);
    gpucd__v1__reply__free_unpacked(rep, NULL);

    /* A request that fails while running: the record says so, as the reply does,
       also for a record-only request (its message is in the reply). */
    multihot_req m;
    multihot_req_init(&m);
    region_base_[1707 + 5] = 200; /* agent 1, a value no feature has */
    bell.offset = 262144; /* past the multihot output */
    rec = region_base_ + bell.offset;
    m.req.doorbell = &bell;
    m.req.record_only = 1;
    m.req.id = 0x55aa;
    expect(th_raw_call(&raw_, &m.req, NULL, 0), GPUCD__V1__STATUS__OUT_OF_RANGE, "agent 1");
    memcpy(words, rec, sizeof words);
    assert_int_equal(words[0], 0x55aa);
    assert_int_equal(words[1], GPUCD__V1__STATUS__OUT_OF_RANGE);
    expect_ping();
}

static void test_hostile_resident(void **state)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__TensorFree fr = GPUCD__V1__TENSOR_FREE__INIT;
    fr.id = 424242;
    req.op_case = GPUCD__V1__REQUEST__OP_TENSOR_FREE;
    req.tensor_free = &fr;
    expect(th_raw_call(&raw_, &req, NULL, 0), GPUCD__V1__STATUS__NOT_FOUND, "no resident");
    /* new_resident as an input is meaningless. */
    conv_req c;
    conv_req_init(&c);
    c.x.t.where_case = GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT;
    c.x.t.new_resident = 1;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "only for outputs");
    /* A resident referenced with the wrong shape. */
    Gpucd__V1__Request put = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__TensorPut tp = GPUCD__V1__TENSOR_PUT__INIT;
    th_ref src;
    tp.src = th_ref_region(&src, GPUCD__V1__DTYPE__F32, region_id_, 4096, 4, TH_SHAPE(4, 3, 3, 3));
    put.op_case = GPUCD__V1__REQUEST__OP_TENSOR_PUT;
    put.tensor_put = &tp;
    Gpucd__V1__Reply *rep = th_raw_call(&raw_, &put, NULL, 0);
    assert_int_equal(rep->status, 0);
    uint64_t id = rep->tensor_id;
    gpucd__v1__reply__free_unpacked(rep, NULL);
    conv_req_init(&c);
    gpucd__v1__tensor_ref__init(&c.w.t);
    c.w.t.dtype = GPUCD__V1__DTYPE__F32;
    c.w.t.n_shape = 4;
    c.w.t.shape = c.w.shape;
    c.w.shape[0] = 2; /* the tensor is (4, 3, 3, 3) */
    c.w.t.where_case = GPUCD__V1__TENSOR_REF__WHERE_RESIDENT;
    c.w.t.resident = id;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "differs from resident");
    /* Writing the output into the input's own resident tensor. */
    c.w.shape[0] = 4;
    c.op.y = &c.w.t;
    rep = th_raw_call(&raw_, &c.req, NULL, 0);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__INVALID_ARGUMENT);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    expect_ping();
}

/*
 * Only the encoder forward's saved activations may be sent without a shape,
 * and the daemon sizes them only from valid weights and obs.
 */
static void test_output_shape_left_to_daemon(void **state)
{
    (void)state;
    conv_req c;
    conv_req_init(&c);
    gpucd__v1__tensor_ref__init(&c.y.t);
    c.y.t.where_case = GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT;
    c.y.t.new_resident = 1;
    expect(th_raw_call(&raw_, &c.req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "only the encoder forward's saved activations");

    /*
     * An encoder forward, everything in the region: 2 agents, bf16 weights of
     * the right shapes (zeros), hidden 8 out, saved as a new resident tensor.
     */
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Nmmo3Encode m = GPUCD__V1__NMMO3_ENCODE__INIT;
    Gpucd__V1__Nmmo3Weights w = GPUCD__V1__NMMO3_WEIGHTS__INIT;
    th_ref obs, wt[7], hidden, saved;
    const Gpucd__V1__DType bf = GPUCD__V1__DTYPE__BF16;
    memset(region_base_, 0, 750000);
    th_fill_nmmo3_obs(region_base_, 2);
    m.obs = th_ref_region(&obs, GPUCD__V1__DTYPE__U8, region_id_, 0, 2, TH_SHAPE(2, 1707));
    w.conv1_w = th_ref_region(&wt[0], bf, region_id_, 4096, 4, TH_SHAPE(128, 59, 5, 5));
    w.conv1_b = th_ref_region(&wt[1], bf, region_id_, 385024, 1, TH_SHAPE(128));
    w.conv2_w = th_ref_region(&wt[2], bf, region_id_, 389120, 4, TH_SHAPE(128, 128, 3, 3));
    w.conv2_b = th_ref_region(&wt[3], bf, region_id_, 688128, 1, TH_SHAPE(128));
    w.embed = th_ref_region(&wt[4], bf, region_id_, 692224, 2, TH_SHAPE(128, 32));
    w.proj_w = th_ref_region(&wt[5], bf, region_id_, 704512, 2, TH_SHAPE(8, 1817));
    w.proj_b = th_ref_region(&wt[6], bf, region_id_, 737280, 1, TH_SHAPE(8));
    m.weights = &w;
    m.hidden = th_ref_region(&hidden, bf, region_id_, 741376, 2, TH_SHAPE(2, 8));
    gpucd__v1__tensor_ref__init(&saved.t);
    saved.t.where_case = GPUCD__V1__TENSOR_REF__WHERE_NEW_RESIDENT;
    saved.t.new_resident = 1;
    m.saved = &saved.t;
    req.op_case = GPUCD__V1__REQUEST__OP_NMMO3_ENCODE;
    req.nmmo3_encode = &m;
    /* With no dtype either, the daemon makes it: u8, a row of whole 16-byte units an agent. */
    Gpucd__V1__Reply *rep = th_raw_call(&raw_, &req, NULL, 0);
    assert_non_null(rep);
    if (rep->status != GPUCD__V1__STATUS__OK)
        fail_msg("a forward saving its activations: status %d '%s'", (int)rep->status,
                 rep->message ? rep->message : "");
    assert_int_equal(rep->n_outputs, 2);
    const Gpucd__V1__TensorRef *made = rep->outputs[1];
    assert_int_equal(made->where_case, GPUCD__V1__TENSOR_REF__WHERE_RESIDENT);
    assert_int_equal(made->dtype, GPUCD__V1__DTYPE__U8);
    assert_int_equal(made->n_shape, 2);
    assert_int_equal(made->shape[0], 2);
    assert_true(made->shape[1] > 0 && made->shape[1] % 16 == 0);
    Gpucd__V1__Request fr = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__TensorFree tf = GPUCD__V1__TENSOR_FREE__INIT;
    tf.id = made->resident;
    fr.op_case = GPUCD__V1__REQUEST__OP_TENSOR_FREE;
    fr.tensor_free = &tf;
    gpucd__v1__reply__free_unpacked(rep, NULL);
    rep = th_raw_call(&raw_, &fr, NULL, 0);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    /* A dtype other than the one the daemon gives it. */
    saved.t.dtype = GPUCD__V1__DTYPE__F32;
    expect(th_raw_call(&raw_, &req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "saved: dtype 1 given, but this output is u8");
    saved.t.dtype = GPUCD__V1__DTYPE__DTYPE_UNSPECIFIED;
    /* conv1_w of the wrong shape: the weights say nothing about a row's size. */
    wt[0].t.n_shape = 2;
    wt[0].shape[0] = wt[0].shape[1] = 2;
    expect(th_raw_call(&raw_, &req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "saved: the daemon cannot size it: weights.conv1_w");
    /* As the backward's input, saved must exist: new_resident is for outputs. */
    th_ref dout;
    m.hidden = NULL;
    m.dout = th_ref_region(&dout, GPUCD__V1__DTYPE__BF16, region_id_, 65536, 2, TH_SHAPE(2, 8));
    saved.t.n_shape = 2;
    saved.t.shape = saved.shape;
    saved.shape[0] = 2, saved.shape[1] = 64;
    saved.t.dtype = GPUCD__V1__DTYPE__U8;
    expect(th_raw_call(&raw_, &req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "only for outputs");
    expect_ping();
}

static int group_setup(void **state)
{
    static const char *const extra[] = {"--max-message-mb", "2", NULL};
    th_daemon_start(&daemon_, extra);
    th_raw_open(&raw_, daemon_.ipc_url);
    th_raw_open(&other_, daemon_.ipc_url);
    th_raw_region(&raw_, REGION_SIZE, &region_);
    region_base_ = region_.base;
    region_id_ = region_.id;
    return 0;
}

static int group_teardown(void **state)
{
    th_raw_close(&other_);
    th_raw_close(&raw_);
    th_region_free(&region_);
    return th_daemon_stop_checked(&daemon_);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_request_passes),
        cmocka_unit_test(test_malformed_bytes),
        cmocka_unit_test(test_unknown_operation),
        cmocka_unit_test(test_wrong_version),
        cmocka_unit_test(test_oversize_message),
        cmocka_unit_test(test_unknown_region),
        cmocka_unit_test(test_range_and_overflow),
        cmocka_unit_test(test_misaligned),
        cmocka_unit_test(test_wrong_dtype_or_shape),
        cmocka_unit_test(test_overlapping_outputs),
        cmocka_unit_test(test_out_of_range_observation),
        cmocka_unit_test(test_hostile_embedding_bag),
        cmocka_unit_test(test_hostile_regions),
        cmocka_unit_test(test_hostile_doorbell),
        cmocka_unit_test(test_hostile_resident),
        cmocka_unit_test(test_output_shape_left_to_daemon),
    };
    return th_run_group_tests(tests, group_setup, group_teardown);
}
