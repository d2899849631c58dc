/*
 * test_check.c - every class of bad shape, dtype and option is rejected by the
 * gk_*_check functions with its code and a message naming the tensor and the
 * problem, and the CPU kernels (which check again) refuse the same inputs
 * without writing their outputs.
 */
#include "ktest.h"

#include <limits.h>

#define EXPECT(call, code, text)                                                                 \
    do {                                                                                         \
        gk_err err_ = {{0}};                                                                     \
        gk_err *err = &err_;                                                                     \
        int rc_ = (call);                                                                        \
        if (rc_ != (code) || strstr(err_.msg, (text)) == NULL)                                   \
            fail_msg("line %d: %s gave %d '%s', want %d with '%s'", __LINE__, #call, rc_,      \
                     err_.msg, (code), (text));                                                  \
    } while (0)

static gk_tensor tensor_new(gk_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int64_t d)
{
    const int64_t s[4] = {a, b, c, d};
    gk_tensor t = gk_tensor_make(NULL, dt, ndim, s);
    t.data = calloc((size_t)gk_tensor_bytes(&t), 1);
    assert_non_null(t.data);
    return t;
}

/* ---- conv2d ---------------------------------------------------------------- */

typedef struct conv_set {
    gk_conv2d p;
    gk_tensor x, w, b, y, dy, dx, dw, db;
} conv_set;

/* x (2,3,7,9), w (4,3,3,2), stride (2,1), pad (1,0): y (2,4,4,8). */
static conv_set conv_valid(gk_dtype dt)
{
    conv_set s = {.p = {.stride_h = 2, .stride_w = 1, .pad_h = 1, .pad_w = 0, .relu = 1}};
    s.x = tensor_new(dt, 4, 2, 3, 7, 9);
    s.w = tensor_new(dt, 4, 4, 3, 3, 2);
    s.b = tensor_new(dt, 1, 4, 0, 0, 0);
    s.y = tensor_new(dt, 4, 2, 4, 4, 8);
    s.dy = tensor_new(dt, 4, 2, 4, 4, 8);
    s.dx = tensor_new(dt, 4, 2, 3, 7, 9);
    s.dw = tensor_new(dt, 4, 4, 3, 3, 2);
    s.db = tensor_new(dt, 1, 4, 0, 0, 0);
    return s;
}

static void conv_free(conv_set *s)
{
    gk_tensor *all[] = {&s->x, &s->w, &s->b, &s->y, &s->dy, &s->dx, &s->dw, &s->db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]->data);
}

#define FWD(s) gk_conv2d_forward_check(&(s).p, &(s).x, &(s).w, &(s).b, &(s).y, err)
#define BWD(s)                                                                                   \
    gk_conv2d_backward_check(&(s).p, &(s).x, &(s).w, &(s).y, &(s).dy, &(s).dx, &(s).dw, &(s).db, \
                             err)

static void test_check_conv_forward(void **state)
{
    conv_set s = conv_valid(GK_F32), t;
    EXPECT(FWD(s), GK_OK, "");
    t = s, t.x.ndim = 3;
    EXPECT(FWD(t), GK_EINVAL, "x: expected 4 dimensions, got 3");
    t = s, t.x.ndim = 9;
    EXPECT(FWD(t), GK_EINVAL, "x: expected 4 dimensions, got 9");
    t = s, t.x.shape[0] = 0;
    EXPECT(FWD(t), GK_EINVAL, "x: dimension 0 is 0, must be positive");
    t = s, t.x.shape[2] = -7;
    EXPECT(FWD(t), GK_EINVAL, "x: dimension 2 is -7");
    t = s, t.w.shape[3] = 0;
    EXPECT(FWD(t), GK_EINVAL, "w: dimension 3 is 0");
    t = s, t.w.shape[1] = 2;
    EXPECT(FWD(t), GK_EINVAL, "w: dimension 1 is 2, expected 3");
    t = s, t.p.stride_h = 0;
    EXPECT(FWD(t), GK_EINVAL, "stride (0, 1) must be positive");
    t = s, t.p.stride_w = -1;
    EXPECT(FWD(t), GK_EINVAL, "stride (2, -1)");
    t = s, t.p.pad_h = -1;
    EXPECT(FWD(t), GK_EINVAL, "padding (-1, 0) must not be negative");
    t = s, t.w.shape[2] = 10; /* 7 + 2*1 = 9 < 10 */
    EXPECT(FWD(t), GK_EINVAL, "kernel height 10 exceeds the padded input height 9");
    t = s, t.w.shape[3] = 10;
    EXPECT(FWD(t), GK_EINVAL, "kernel width 10 exceeds the padded input width 9");
    t = s, t.y.shape[2] = 5;
    EXPECT(FWD(t), GK_EINVAL, "y: dimension 2 is 5, expected 4");
    t = s, t.y.shape[0] = 3;
    EXPECT(FWD(t), GK_EINVAL, "y: dimension 0 is 3, expected 2");
    t = s, t.y.shape[1] = 5;
    EXPECT(FWD(t), GK_EINVAL, "y: dimension 1 is 5, expected 4");
    t = s, t.b.shape[0] = 5;
    EXPECT(FWD(t), GK_EINVAL, "b: dimension 0 is 5, expected 4");
    t = s, t.b.ndim = 2;
    EXPECT(FWD(t), GK_EINVAL, "b: expected 1 dimensions");
    t = s, t.x.data = NULL;
    EXPECT(FWD(t), GK_EINVAL, "x is required but missing");
    t = s, t.w.data = NULL;
    EXPECT(FWD(t), GK_EINVAL, "w is required");
    t = s, t.y.data = NULL;
    EXPECT(FWD(t), GK_EINVAL, "y is required");
    t = s, t.b.data = NULL; /* the bias is optional */
    EXPECT(FWD(t), GK_OK, "");
    t = s, t.x.dtype = GK_F16;
    EXPECT(FWD(t), GK_EDTYPE, "x: dtype f16 not supported");
    t = s, t.x.dtype = GK_U8;
    EXPECT(FWD(t), GK_EDTYPE, "x: dtype u8 not supported");
    t = s, t.x.dtype = (gk_dtype)42;
    EXPECT(FWD(t), GK_EDTYPE, "x: dtype invalid");
    t = s, t.w.dtype = GK_BF16;
    EXPECT(FWD(t), GK_EDTYPE, "w: dtype bf16, expected f32");
    t = s, t.y.dtype = GK_BF16;
    EXPECT(FWD(t), GK_EDTYPE, "y: dtype bf16, expected f32");
    t = s, t.b.dtype = GK_I32;
    EXPECT(FWD(t), GK_EDTYPE, "b: dtype i32, expected f32");
    t = s, t.p.relu = 2;
    EXPECT(FWD(t), GK_EINVAL, "must be 0 or 1");
    t = s, t.x.shape[0] = INT64_MAX / 4;
    EXPECT(FWD(t), GK_EINVAL, "x: element count overflows int64");
    t = s, t.x.shape[0] = INT64_MAX / (3 * 7 * 9) - 1; /* elements fit, bytes do not */
    EXPECT(FWD(t), GK_EINVAL, "x: byte size overflows int64");
    t = s, t.y.data = (char *)t.x.data + 8;
    EXPECT(FWD(t), GK_EINVAL, "output y overlaps input x");
    t = s, t.y.data = t.b.data;
    EXPECT(FWD(t), GK_EINVAL, "output y overlaps input b");

    conv_set h = conv_valid(GK_BF16);
    EXPECT(FWD(h), GK_OK, "");
    h.p.tf32 = 1;
    EXPECT(FWD(h), GK_EINVAL, "tf32 applies to f32 tensors only");
    s.p.tf32 = 1;
    EXPECT(FWD(s), GK_OK, "");
    s.p.tf32 = 0;

    /* The kernel checks too, and writes nothing when it refuses. */
    t = s, t.y.shape[3] = 7;
    memset(t.y.data, 0x7f, (size_t)gk_tensor_bytes(&s.y));
    EXPECT(gk_cpu_conv2d_forward(&t.p, &t.x, &t.w, &t.b, &t.y, err), GK_EINVAL,
           "y: dimension 3 is 7, expected 8");
    for (int64_t i = 0; i < gk_tensor_bytes(&s.y); i++)
        assert_int_equal(((uint8_t *)s.y.data)[i], 0x7f);
    t = s, t.p.stride_w = 0;
    EXPECT(gk_cpu_conv2d_forward(&t.p, &t.x, &t.w, &t.b, &t.y, err), GK_EINVAL, "stride");
    EXPECT(gk_cpu_conv2d_forward(NULL, &s.x, &s.w, &s.b, &s.y, err), GK_EINVAL,
           "parameters missing");
    conv_free(&s);
    conv_free(&h);
}

static void test_check_conv_backward(void **state)
{
    conv_set s = conv_valid(GK_BF16), t;
    EXPECT(BWD(s), GK_OK, "");
    t = s, t.y.data = NULL;
    EXPECT(BWD(t), GK_EINVAL, "y (the saved output, needed with relu) is required");
    t = s, t.y.data = NULL, t.p.relu = 0;
    EXPECT(BWD(t), GK_OK, "");
    t = s, t.dw.data = NULL;
    EXPECT(BWD(t), GK_EINVAL, "dw is required");
    t = s, t.dy.data = NULL;
    EXPECT(BWD(t), GK_EINVAL, "dy is required");
    t = s, t.dx.data = NULL, t.db.data = NULL;
    EXPECT(BWD(t), GK_OK, "");
    t = s, t.dy.shape[3] = 9;
    EXPECT(BWD(t), GK_EINVAL, "dy: dimension 3 is 9, expected 8");
    t = s, t.y.shape[1] = 3;
    EXPECT(BWD(t), GK_EINVAL, "y: dimension 1 is 3, expected 4");
    t = s, t.dx.shape[1] = 4;
    EXPECT(BWD(t), GK_EINVAL, "dx: dimension 1 is 4, expected 3");
    t = s, t.dw.shape[0] = 3;
    EXPECT(BWD(t), GK_EINVAL, "dw: dimension 0 is 3, expected 4");
    t = s, t.db.shape[0] = 3;
    EXPECT(BWD(t), GK_EINVAL, "db: dimension 0 is 3, expected 4");
    t = s, t.db.dtype = GK_F32;
    EXPECT(BWD(t), GK_EDTYPE, "db: dtype f32, expected bf16");
    t = s, t.dw.dtype = GK_F32;
    EXPECT(BWD(t), GK_EDTYPE, "dw: dtype f32, expected bf16");
    t = s, t.dy.dtype = GK_F16;
    EXPECT(BWD(t), GK_EDTYPE, "dy: dtype f16, expected bf16");
    t = s, t.p.pad_w = -2;
    EXPECT(BWD(t), GK_EINVAL, "padding");
    t = s, t.w.shape[2] = 12;
    EXPECT(BWD(t), GK_EINVAL, "kernel height 12 exceeds");
    t = s, t.dw.data = t.dx.data;
    EXPECT(BWD(t), GK_EINVAL, "output dx overlaps output dw");
    t = s, t.dx.data = t.dy.data;
    EXPECT(BWD(t), GK_EINVAL, "output dx overlaps input dy");
    t = s, t.dx.shape[0] = 0;
    EXPECT(gk_cpu_conv2d_backward(&t.p, &t.x, &t.w, &t.y, &t.dy, &t.dx, &t.dw, &t.db, err),
           GK_EINVAL, "dx: dimension 0 is 0");
    conv_free(&s);
}

/* ---- multihot -------------------------------------------------------------- */

static void test_check_multihot(void **state)
{
    gk_multihot_layout l = gk_nmmo3_layout, m;
    gk_tensor obs = tensor_new(GK_U8, 2, 3, GK_NMMO3_OBS_BYTES, 0, 0);
    gk_tensor out = tensor_new(GK_BF16, 4, 3, 59, 11, 15);
    EXPECT(gk_multihot_layout_check(&l, err), GK_OK, "");
    EXPECT(gk_multihot_check(&l, &obs, &out, err), GK_OK, "");
    EXPECT(gk_multihot_layout_check(NULL, err), GK_EINVAL, "layout missing");
    m = l, m.nfeat = 0;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "0 features, must be 1..64");
    m = l, m.nfeat = 65;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "65 features");
    m = l, m.height = 0;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "map 0 x 15");
    m = l, m.width = -3;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "map 11 x -3");
    m = l, m.obs_offset = -1;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "obs_offset -1 is negative");
    m = l, m.channels = 0;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "0 channels");
    m = l, m.slots[3] = 0;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "feature 3 has 0 slots");
    m = l, m.slots[3] = -4;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "feature 3 has -4 slots");
    m = l, m.slots[0] = 257, m.offsets[0] = 59, m.channels = 59 + 257;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "feature 0 has 257 slots, must be 1..256");
    m = l, m.channels = 58;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL,
           "feature 9 channels [55, 59) outside the 58 channels");
    m = l, m.offsets[2] = -1;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "feature 2 channels [-1, 16)");
    m = l, m.offsets[1] = 2;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "features 0 and 1 share channels");
    m = l, m.offsets[9] = 10;
    EXPECT(gk_multihot_layout_check(&m, err), GK_EINVAL, "features 2 and 9 share channels");
    m = l, m.slots[1] = 0;
    EXPECT(gk_multihot_check(&m, &obs, &out, err), GK_EINVAL, "feature 1 has 0 slots");

    gk_tensor t = obs;
    t.shape[1] = 1649;
    EXPECT(gk_multihot_check(&l, &t, &out, err), GK_EINVAL, "obs: 1649 bytes a row, the layout reads 1650");
    m = l, m.obs_offset = 100;
    EXPECT(gk_multihot_check(&m, &t, &out, err), GK_EINVAL, "the layout reads 1750");
    t = obs, t.dtype = GK_I32, t.shape[1] = 426;
    EXPECT(gk_multihot_check(&l, &t, &out, err), GK_EDTYPE, "obs: dtype i32, expected u8");
    t = obs, t.ndim = 1;
    EXPECT(gk_multihot_check(&l, &t, &out, err), GK_EINVAL, "obs: expected 2 dimensions");
    t = obs, t.data = NULL;
    EXPECT(gk_multihot_check(&l, &t, &out, err), GK_EINVAL, "obs is required");
    t = out, t.shape[1] = 58;
    EXPECT(gk_multihot_check(&l, &obs, &t, err), GK_EINVAL, "out: dimension 1 is 58, expected 59");
    t = out, t.shape[0] = 4;
    EXPECT(gk_multihot_check(&l, &obs, &t, err), GK_EINVAL, "out: dimension 0 is 4, expected 3");
    t = out, t.shape[3] = 11, t.shape[2] = 15;
    EXPECT(gk_multihot_check(&l, &obs, &t, err), GK_EINVAL, "out: dimension 2 is 15, expected 11");
    t = out, t.dtype = GK_U8;
    EXPECT(gk_multihot_check(&l, &obs, &t, err), GK_EDTYPE, "out: dtype u8 not supported");
    t = out, t.data = obs.data;
    EXPECT(gk_multihot_check(&l, &obs, &t, err), GK_EINVAL, "output out overlaps input obs");
    m = l, m.offsets[4] = 31;
    EXPECT(gk_cpu_multihot_encode(&m, &obs, &out, err), GK_EINVAL, "share channels");
    free(obs.data);
    free(out.data);
}

/* ---- embedding ------------------------------------------------------------- */

static void test_check_embedding(void **state)
{
    gk_tensor idx = tensor_new(GK_I64, 2, 5, 47, 0, 0), table = tensor_new(GK_F32, 2, 128, 32, 0, 0),
              out = tensor_new(GK_F32, 3, 5, 47, 32, 0),
              dout = tensor_new(GK_BF16, 3, 5, 47, 32, 0),
              dtable = tensor_new(GK_F32, 2, 128, 32, 0, 0), t;
    EXPECT(gk_embedding_forward_check(&idx, &table, &out, err), GK_OK, "");
    EXPECT(gk_embedding_backward_check(&idx, &dout, &dtable, err), GK_OK, "");
    t = idx, t.dtype = GK_F32, t.shape[1] = 94;
    EXPECT(gk_embedding_forward_check(&t, &table, &out, err), GK_EDTYPE,
           "idx: dtype f32 not supported (u8, i32 or i64)");
    t = idx, t.dtype = GK_BF16;
    EXPECT(gk_embedding_backward_check(&t, &dout, &dtable, err), GK_EDTYPE, "idx: dtype bf16");
    t = idx, t.shape[1] = 0;
    EXPECT(gk_embedding_forward_check(&t, &table, &out, err), GK_EINVAL, "idx: dimension 1 is 0");
    t = idx, t.shape[0] = -5;
    EXPECT(gk_embedding_forward_check(&t, &table, &out, err), GK_EINVAL, "idx: dimension 0 is -5");
    t = idx, t.ndim = GK_MAX_DIMS;
    EXPECT(gk_embedding_forward_check(&t, &table, &out, err), GK_EINVAL,
           "idx: 8 dimensions, must be 0..7");
    t = idx, t.ndim = -1;
    EXPECT(gk_embedding_forward_check(&t, &table, &out, err), GK_EINVAL, "idx: -1 dimensions");
    t = idx, t.data = NULL;
    EXPECT(gk_embedding_forward_check(&t, &table, &out, err), GK_EINVAL, "idx is required");
    t = table, t.dtype = GK_I32;
    EXPECT(gk_embedding_forward_check(&idx, &t, &out, err), GK_EDTYPE, "table: dtype i32");
    t = table, t.dtype = GK_F16, t.shape[1] = 64;
    EXPECT(gk_embedding_forward_check(&idx, &t, &out, err), GK_EDTYPE, "table: dtype f16 not supported");
    t = table, t.ndim = 3, t.shape[2] = 1;
    EXPECT(gk_embedding_forward_check(&idx, &t, &out, err), GK_EINVAL, "table: expected 2 dimensions");
    t = table, t.shape[0] = 0;
    EXPECT(gk_embedding_forward_check(&idx, &t, &out, err), GK_EINVAL, "table: dimension 0 is 0");
    t = out, t.shape[2] = 31;
    EXPECT(gk_embedding_forward_check(&idx, &table, &t, err), GK_EINVAL,
           "out: dimension 2 is 31, expected 32");
    t = out, t.shape[1] = 46;
    EXPECT(gk_embedding_forward_check(&idx, &table, &t, err), GK_EINVAL, "out: dimension 1 is 46");
    t = out, t.ndim = 2;
    EXPECT(gk_embedding_forward_check(&idx, &table, &t, err), GK_EINVAL,
           "out: expected 3 dimensions, got 2");
    t = out, t.dtype = GK_BF16;
    EXPECT(gk_embedding_forward_check(&idx, &table, &t, err), GK_EDTYPE, "out: dtype bf16, expected f32");
    t = out, t.data = table.data;
    EXPECT(gk_embedding_forward_check(&idx, &table, &t, err), GK_EINVAL, "output out overlaps input table");
    t = dtable, t.dtype = GK_BF16;
    EXPECT(gk_embedding_backward_check(&idx, &dout, &t, err), GK_EDTYPE,
           "dtable: dtype bf16, expected f32 (gradients accumulate in f32)");
    t = dtable, t.data = NULL;
    EXPECT(gk_embedding_backward_check(&idx, &dout, &t, err), GK_EINVAL, "dtable is required");
    t = dout, t.shape[2] = 16;
    EXPECT(gk_embedding_backward_check(&idx, &t, &dtable, err), GK_EINVAL, "dout: dimension 2 is 16");
    t = dout, t.ndim = 4, t.shape[3] = 1;
    EXPECT(gk_embedding_backward_check(&idx, &t, &dtable, err), GK_EINVAL,
           "dout: expected 3 dimensions (idx shape..., D), got 4");
    t = dout, t.dtype = GK_I32;
    EXPECT(gk_embedding_backward_check(&idx, &t, &dtable, err), GK_EDTYPE, "dout: dtype i32");
    t = dtable, t.data = dout.data;
    EXPECT(gk_cpu_embedding_backward(&idx, &dout, &t, err), GK_EINVAL, "output dtable overlaps input dout");
    t = out, t.shape[0] = 6;
    EXPECT(gk_cpu_embedding_forward(&idx, &table, &t, err), GK_EINVAL, "out: dimension 0 is 6");
    free(idx.data);
    free(table.data);
    free(out.data);
    free(dout.data);
    free(dtable.data);
}

/* ---- NMMO3 ----------------------------------------------------------------- */

static gk_nmmo3_weights nmmo3_set(gk_dtype dt, int64_t hidden)
{
    gk_nmmo3_weights w = {
        .conv1_w = tensor_new(dt, 4, 128, 59, 5, 5),
        .conv1_b = tensor_new(dt, 1, 128, 0, 0, 0),
        .conv2_w = tensor_new(dt, 4, 128, 128, 3, 3),
        .conv2_b = tensor_new(dt, 1, 128, 0, 0, 0),
        .embed = tensor_new(dt, 2, 128, 32, 0, 0),
    };
    if (hidden > 0) {
        w.proj_w = tensor_new(dt, 2, hidden, GK_NMMO3_FEATURES, 0, 0);
        w.proj_b = tensor_new(dt, 1, hidden, 0, 0, 0);
    }
    return w;
}

static void nmmo3_set_free(gk_nmmo3_weights *w)
{
    gk_tensor *all[] = {&w->conv1_w, &w->conv1_b, &w->conv2_w, &w->conv2_b,
                        &w->embed,   &w->proj_w,  &w->proj_b};
    for (int i = 0; i < 7; i++)
        free(all[i]->data);
}

static void test_check_nmmo3(void **state)
{
    gk_nmmo3_weights w = nmmo3_set(GK_BF16, 64), g = nmmo3_set(GK_F32, 64), v, h;
    gk_tensor obs = tensor_new(GK_U8, 2, 4, GK_NMMO3_OBS_BYTES, 0, 0),
              feat = tensor_new(GK_BF16, 2, 4, GK_NMMO3_FEATURES, 0, 0),
              hid = tensor_new(GK_BF16, 2, 4, 64, 0, 0), none = {0}, t;
    EXPECT(gk_nmmo3_forward_check(&w, &obs, &feat, &hid, err), GK_OK, "");
    EXPECT(gk_nmmo3_forward_check(&w, &obs, &none, &hid, err), GK_OK, "");
    EXPECT(gk_nmmo3_backward_check(&w, &obs, &hid, &g, err), GK_OK, "");
    EXPECT(gk_nmmo3_forward_check(NULL, &obs, &feat, &hid, err), GK_EINVAL, "weights missing");
    v = w, v.conv1_w.shape[3] = 4;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EINVAL,
           "weights.conv1_w: dimension 3 is 4, expected 5");
    v = w, v.conv1_w.shape[1] = 60;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EINVAL,
           "weights.conv1_w: dimension 1 is 60, expected 59");
    v = w, v.conv2_w.shape[0] = 64;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EINVAL, "weights.conv2_w: dimension 0");
    v = w, v.embed.data = NULL;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EINVAL, "weights.embed is required");
    v = w, v.conv1_b.shape[0] = 127;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EINVAL, "weights.conv1_b: dimension 0 is 127");
    v = w, v.conv2_w.dtype = GK_F32;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EDTYPE,
           "weights.conv2_w: dtype f32, expected bf16");
    v = w, v.conv1_w.dtype = GK_F16;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EDTYPE, "weights.conv1_w: dtype f16 not supported");
    v = w, v.proj_w.shape[1] = 1816;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EINVAL,
           "weights.proj_w: dimension 1 is 1816, expected 1817");
    v = w, v.proj_b.shape[0] = 32;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EINVAL, "weights.proj_b: dimension 0 is 32, expected 64");
    v = w, v.proj_b.data = NULL;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EINVAL, "weights.proj_b is required");
    v = w, v.proj_w.data = NULL;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &none, err), GK_EINVAL,
           "weights.proj_b given without a projection");
    v = w, v.proj_w.data = NULL, v.proj_b.data = NULL;
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &none, err), GK_OK, "");
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &feat, &hid, err), GK_EINVAL, "hidden given without a projection");
    EXPECT(gk_nmmo3_forward_check(&v, &obs, &none, &none, err), GK_EINVAL,
           "features (needed without a projection) is required");
    EXPECT(gk_nmmo3_forward_check(&w, &obs, &feat, &none, err), GK_EINVAL, "hidden (needed with proj_w) is required");
    t = obs, t.shape[1] = 1706;
    EXPECT(gk_nmmo3_forward_check(&w, &t, &feat, &hid, err), GK_EINVAL, "obs: dimension 1 is 1706, expected 1707");
    t = obs, t.dtype = GK_I32, t.shape[0] = 1;
    EXPECT(gk_nmmo3_forward_check(&w, &t, &feat, &hid, err), GK_EDTYPE, "obs: dtype i32, expected u8");
    t = obs, t.shape[0] = 0;
    EXPECT(gk_nmmo3_forward_check(&w, &t, &feat, &hid, err), GK_EINVAL, "obs: dimension 0 is 0");
    t = feat, t.shape[1] = 1816;
    EXPECT(gk_nmmo3_forward_check(&w, &obs, &t, &hid, err), GK_EINVAL, "features: dimension 1 is 1816, expected 1817");
    t = feat, t.dtype = GK_F32;
    EXPECT(gk_nmmo3_forward_check(&w, &obs, &t, &hid, err), GK_EDTYPE, "features: dtype f32, expected bf16");
    t = hid, t.shape[0] = 3;
    EXPECT(gk_nmmo3_forward_check(&w, &obs, &feat, &t, err), GK_EINVAL, "hidden: dimension 0 is 3, expected 4");
    t = hid, t.data = w.embed.data;
    EXPECT(gk_nmmo3_forward_check(&w, &obs, &feat, &t, err), GK_EINVAL, "output hidden overlaps input embed");

    /* backward */
    t = hid, t.shape[1] = 65;
    EXPECT(gk_nmmo3_backward_check(&w, &obs, &t, &g, err), GK_EINVAL, "dout: dimension 1 is 65, expected 64");
    EXPECT(gk_nmmo3_backward_check(&w, &obs, &none, &g, err), GK_EINVAL, "dout is required");
    EXPECT(gk_nmmo3_backward_check(&w, &obs, &hid, NULL, err), GK_EINVAL, "gradients missing");
    h = g, h.conv1_w.dtype = GK_BF16;
    EXPECT(gk_nmmo3_backward_check(&w, &obs, &hid, &h, err), GK_EDTYPE,
           "grads.conv1_w: dtype bf16, expected f32");
    h = g, h.proj_w.data = NULL;
    EXPECT(gk_nmmo3_backward_check(&w, &obs, &hid, &h, err), GK_EINVAL, "grads.proj_w is required");
    h = g, h.embed.shape[1] = 33;
    EXPECT(gk_nmmo3_backward_check(&w, &obs, &hid, &h, err), GK_EINVAL, "grads.embed: dimension 1 is 33");
    h = g, h.conv2_b.data = w.conv1_w.data;
    EXPECT(gk_nmmo3_backward_check(&w, &obs, &hid, &h, err), GK_EINVAL,
           "output grads.conv2_b overlaps input conv1_w");
    v = w, v.proj_w.data = NULL, v.proj_b.data = NULL;
    EXPECT(gk_nmmo3_backward_check(&v, &obs, &hid, &g, err), GK_EINVAL, "dout: dimension 1 is 64, expected 1817");
    EXPECT(gk_nmmo3_backward_check(&v, &obs, &feat, &g, err), GK_EINVAL,
           "grads.proj_w given without a projection");
    h = g, h.proj_w.data = NULL, h.proj_b.data = NULL;
    EXPECT(gk_nmmo3_backward_check(&v, &obs, &feat, &h, err), GK_OK, "");
    EXPECT(gk_cpu_nmmo3_backward(&w, &obs, &hid, &h, err), GK_EINVAL, "grads.proj_w is required");
    t = feat, t.shape[0] = 5;
    EXPECT(gk_cpu_nmmo3_forward(&w, &obs, &t, &hid, err), GK_EINVAL, "features: dimension 0 is 5");
    nmmo3_set_free(&w);
    nmmo3_set_free(&g);
    free(obs.data);
    free(feat.data);
    free(hid.data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_conv_forward),
        cmocka_unit_test(test_check_conv_backward),
        cmocka_unit_test(test_check_multihot),
        cmocka_unit_test(test_check_embedding),
        cmocka_unit_test(test_check_nmmo3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
