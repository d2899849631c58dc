/*
 * test_gpu_obs.c - the CUDA observation-path kernels (multihot_encode,
 * embedding_forward, embedding_backward, embedding_bag) against the CPU
 * kernels, then the same ops through a daemon on the CUDA backend.
 *
 * Kernels, on fresh random inputs (the seed is printed; GPUCD_TEST_SEED
 * replays it): multihot for the NMMO3 preset, a custom layout with unused
 * channels and an obs_offset, and a map too large for the shared-memory path,
 * in f32 and bf16, with the output 16-byte aligned and not and the
 * observations at an unaligned address too; embedding forward for
 * u8/i32/i64 indices x f32/bf16 tables, rows of 16-byte multiples (up to 512
 * bytes) and not, a table too large for shared memory; multihot and forward
 * must equal the CPU bitwise.  Embedding backward for every index and dout
 * dtype, tables that fit in shared memory (128 and 300 rows of 32), one that
 * does not and narrow ones, all positions on one row, on the device's SM
 * count, on one SM and with a workspace of one partial table: within 1e-6 of
 * a float64 reference (||gpu - ref|| / ||ref||) and 1e-5 of the CPU, the
 * workspace filled with random bytes before each call; for D = 32, dout off
 * its 16-byte alignment (4 bytes: the general kernel; bf16 also 8 bytes: the
 * quad kernel's 8-byte loads) must give the same bytes.  Embedding bag for
 * f32/bf16 tables, widths from 1 to 1000 elements (one lane a row to 32 and
 * more chunks a lane), 16-byte chunks and single elements (an unaligned
 * output), bags of 1 to 70 ids with padding: bitwise the CPU's.
 * Outputs are poisoned (NaN bytes) first and followed by a guard region
 * that must stay untouched; every run is repeated and must give the same
 * bytes.  Out-of-range observation values and indices fail with GK_ERANGE
 * and exactly the CPU kernels' message, never write past the output, and
 * leave dtable untouched; the next clean call is clean.
 * GPUCD_TEST_KERNELS_ONLY=1 leaves out the daemon test (for compute-sanitizer).
 * Exits 77 (skipped) without a CUDA device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>

#include "gk.h"
#include "gk_bf16.h"
#include "gk_cuda.h"
#include "harness.h"
#include "th_cuda.h"

enum { GUARD = 4096 };
static const size_t WORKSPACE = (size_t)64 << 20;

static cudaStream_t g_stream;

/* Test data moves on the kernels' stream (th_cuda.h says why). */
static cudaError_t upload(void *dst, const void *src, size_t bytes)
{
    return th_cuda_copy_in(g_stream, dst, src, bytes);
}

static cudaError_t fill_bytes(void *dst, int value, size_t bytes)
{
    return th_cuda_fill(g_stream, dst, value, bytes);
}
static void *g_ws;
static int g_sms;

static uint64_t rnd(uint64_t n) { return th_rand_u64() % n; }

/*
 * Random bytes over the start of the workspace (the record, the partial
 * tables and their slots of the 128 x 32 cases): no call may depend on what
 * an earlier one left there.
 */
static void workspace_garbage(void)
{
    enum { BYTES = 4 << 20 };
    uint64_t *h = th_xmalloc(BYTES);
    for (size_t i = 0; i < BYTES / 8; i++)
        h[i] = th_rand_u64();
    TH_CUDA_OK(upload(g_ws, h, BYTES));
    free(h);
}

static gk_cuda_exec exec_make(int sm_count, size_t ws_bytes)
{
    gk_cuda_exec ex = {.stream = g_stream, .workspace = g_ws, .workspace_bytes = ws_bytes,
                       .sm_count = sm_count};
    return ex;
}

/* ---- device buffers: poisoned, at an offset, followed by a guard ------------------ */

typedef struct dbuf {
    uint8_t *base; /* the allocation: off bytes, the buffer, GUARD bytes */
    uint8_t *data;
    size_t bytes, off;
} dbuf;

static dbuf dbuf_new(size_t bytes, size_t off)
{
    dbuf b = {NULL, NULL, bytes, off};
    TH_CUDA_OK(cudaMalloc((void **)&b.base, off + bytes + GUARD));
    TH_CUDA_OK(fill_bytes(b.base, 0xff, off + bytes + GUARD));
    b.data = b.base + off;
    return b;
}

static dbuf dbuf_from(const void *host, size_t bytes)
{
    dbuf b = dbuf_new(bytes, 0);
    TH_CUDA_OK(upload(b.data, host, bytes));
    return b;
}

static void dbuf_poison(dbuf *b) { TH_CUDA_OK(fill_bytes(b->base, 0xff, b->off + b->bytes + GUARD)); }

static void dbuf_get(const dbuf *b, void *host)
{
    TH_CUDA_OK(cudaMemcpy(host, b->data, b->bytes, cudaMemcpyDeviceToHost));
}

/* The bytes before and after the buffer are still the poison. */
static void dbuf_check_guard(const dbuf *b, const char *what)
{
    size_t n = b->off + GUARD;
    uint8_t *h = th_xmalloc(n);
    TH_CUDA_OK(cudaMemcpy(h, b->base, b->off, cudaMemcpyDeviceToHost));
    TH_CUDA_OK(cudaMemcpy(h + b->off, b->data + b->bytes, GUARD, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        if (h[i] != 0xff)
            fail_msg("%s: byte %zu outside the output was written", what, i);
    free(h);
}

static void dbuf_free(dbuf *b) { cudaFree(b->base); }

static void bytes_equal(const void *got, const void *want, size_t n, size_t esize, const char *what)
{
    if (memcmp(got, want, n) == 0)
        return;
    size_t i = 0;
    while (((const uint8_t *)got)[i] == ((const uint8_t *)want)[i])
        i++;
    fail_msg("%s: element %zu differs from the CPU", what, i / esize);
}

static void sync_ok(void) { TH_CUDA_OK(cudaStreamSynchronize(g_stream)); }

static void random_floats(void *p, gk_dtype dt, size_t n)
{
    if (dt == GK_BF16)
        th_fill_bf16(p, n);
    else
        th_fill_f32(p, n);
}

/* ---- multihot --------------------------------------------------------------------- */

static gk_multihot_layout layout_custom(void)
{
    /* Channels 3, 6..9 and 15 belong to no feature; the map starts at byte 7. */
    gk_multihot_layout l = {.height = 3, .width = 5, .nfeat = 3, .obs_offset = 7, .channels = 16,
                            .slots = {3, 5, 2}, .offsets = {0, 10, 4}};
    return l;
}

static gk_multihot_layout layout_large(void)
{
    /* 130 x 1000 tiles of 4 features (1.17 M outputs an agent): too large for the shared path. */
    gk_multihot_layout l = {.height = 130, .width = 1000, .nfeat = 4, .obs_offset = 3,
                            .channels = 9, .slots = {2, 3, 1, 2}, .offsets = {0, 2, 5, 7}};
    return l;
}

static void obs_random(const gk_multihot_layout *l, uint8_t *obs, int64_t batch, int64_t row)
{
    const int64_t map = (int64_t)l->height * l->width * l->nfeat;
    for (int64_t n = 0; n < batch; n++) {
        for (int64_t i = 0; i < row; i++)
            obs[n * row + i] = (uint8_t)rnd(256);
        for (int64_t j = 0; j < map; j++)
            obs[n * row + l->obs_offset + j] = (uint8_t)rnd((uint64_t)l->slots[j % l->nfeat]);
    }
}

/* Independent of the CPU kernel: exactly nfeat hot channels at every pixel, zeros elsewhere. */
static void multihot_count_check(const gk_multihot_layout *l, const void *out, gk_dtype dt,
                                 int64_t batch)
{
    const int64_t tiles = (int64_t)l->height * l->width;
    for (int64_t n = 0; n < batch; n++) {
        for (int64_t t = 0; t < tiles; t++) {
            int hot = 0;
            for (int c = 0; c < l->channels; c++) {
                int64_t i = (n * l->channels + c) * tiles + t;
                float v = dt == GK_BF16 ? gk_bf16_to_f32(((const uint16_t *)out)[i])
                                        : ((const float *)out)[i];
                if (v != 0.0f && v != 1.0f)
                    fail_msg("multihot: agent %lld channel %d tile %lld holds %g", (long long)n, c,
                             (long long)t, (double)v);
                hot += v == 1.0f;
            }
            if (hot != l->nfeat)
                fail_msg("multihot: agent %lld tile %lld has %d hot channels, expected %d",
                         (long long)n, (long long)t, hot, l->nfeat);
        }
    }
}

/* obs_off: the observation tensor starts that many bytes after a 256-byte boundary. */
static void multihot_case(const char *name, const gk_multihot_layout *l, int64_t batch,
                          int64_t row, size_t obs_off)
{
    const int64_t tiles = (int64_t)l->height * l->width, map = tiles * l->nfeat;
    uint8_t *obs = th_xmalloc((size_t)(batch * row));
    obs_random(l, obs, batch, row);
    dbuf dobs = dbuf_new((size_t)(batch * row), obs_off);
    TH_CUDA_OK(upload(dobs.data, obs, (size_t)(batch * row)));
    gk_tensor tobs = gk_tensor_make(dobs.data, GK_U8, 2, TH_SHAPE(batch, row));
    const int64_t oshape[4] = {batch, l->channels, l->height, l->width};
    const gk_dtype dts[2] = {GK_F32, GK_BF16};
    gk_err err;
    for (int d = 0; d < 2; d++) {
        const gk_dtype dt = dts[d];
        const size_t es = gk_dtype_size(dt), bytes = (size_t)(batch * l->channels * tiles) * es;
        void *ref = th_xmalloc(bytes), *got = th_xmalloc(bytes), *again = th_xmalloc(bytes);
        gk_tensor tref = gk_tensor_make(ref, dt, 4, oshape);
        if (gk_cpu_multihot_encode(l, &(gk_tensor){obs, GK_U8, 2, {batch, row}}, &tref, &err))
            fail_msg("CPU multihot: %s", err.msg);
        multihot_count_check(l, ref, dt, batch);
        for (int mis = 0; mis < 2; mis++) {
            for (int one_sm = 0; one_sm < 2; one_sm++) {
                gk_cuda_exec ex = exec_make(one_sm ? 1 : g_sms, WORKSPACE);
                dbuf dout = dbuf_new(bytes, mis ? es : 0);
                gk_tensor tout = gk_tensor_make(dout.data, dt, 4, oshape);
                char what[160];
                snprintf(what, sizeof what, "multihot %s %s%s%s", name, gk_dtype_name(dt),
                         mis ? " unaligned" : "", one_sm ? " 1 SM" : "");
                for (int rep = 0; rep < 2; rep++) {
                    if (rep)
                        dbuf_poison(&dout);
                    if (gk_cuda_multihot_encode(l, &tobs, &tout, &ex, &err))
                        fail_msg("%s: %s", what, err.msg);
                    sync_ok();
                    if (gk_cuda_multihot_status(l, &tobs, &ex, &err))
                        fail_msg("%s: status: %s", what, err.msg);
                    dbuf_get(&dout, rep ? again : got);
                }
                bytes_equal(got, ref, bytes, es, what);
                if (memcmp(got, again, bytes) != 0)
                    fail_msg("%s: two runs differ", what);
                dbuf_check_guard(&dout, what);
                printf("ok %s (B %lld, obs at +%zu)\n", what, (long long)batch, obs_off);
                dbuf_free(&dout);
            }
        }

        /* Out-of-range values: the first one (row-major) is named, as by the CPU kernel. */
        uint8_t *bad = th_xmalloc((size_t)(batch * row));
        memcpy(bad, obs, (size_t)(batch * row));
        int64_t a = (int64_t)rnd((uint64_t)batch), j = (int64_t)rnd((uint64_t)map);
        while (l->slots[j % l->nfeat] >= 256)
            j = (j + 1) % map;
        const int f = (int)(j % l->nfeat);
        bad[a * row + l->obs_offset + j] = (uint8_t)(l->slots[f] + rnd((uint64_t)(256 - l->slots[f])));
        if (a + 1 < batch) /* a later offender, which must not be the one named */
            bad[(a + 1) * row + l->obs_offset] = 255;
        gk_err cpu_err;
        int cpu_rc = gk_cpu_multihot_encode(l, &(gk_tensor){bad, GK_U8, 2, {batch, row}}, &tref,
                                            &cpu_err);
        assert_int_equal(cpu_rc, GK_ERANGE);
        dbuf dbad = dbuf_from(bad, (size_t)(batch * row));
        dbuf dout = dbuf_new(bytes, 0);
        gk_tensor tbad = gk_tensor_make(dbad.data, GK_U8, 2, TH_SHAPE(batch, row));
        gk_tensor tout = gk_tensor_make(dout.data, dt, 4, oshape);
        gk_cuda_exec ex = exec_make(g_sms, WORKSPACE);
        if (gk_cuda_multihot_encode(l, &tbad, &tout, &ex, &err))
            fail_msg("multihot %s: enqueue: %s", name, err.msg);
        sync_ok();
        int rc = gk_cuda_multihot_status(l, &tbad, &ex, &err);
        printf("bad value, %s %s: %s\n", name, gk_dtype_name(dt), err.msg);
        assert_int_equal(rc, GK_ERANGE);
        assert_string_equal(err.msg, cpu_err.msg);
        dbuf_check_guard(&dout, "multihot with a bad value");
        /* A clean run after a failed one: the record was reset. */
        if (gk_cuda_multihot_encode(l, &tobs, &tout, &ex, &err))
            fail_msg("multihot %s: %s", name, err.msg);
        sync_ok();
        if (gk_cuda_multihot_status(l, &tobs, &ex, &err))
            fail_msg("multihot %s after a bad one: %s", name, err.msg);
        dbuf_free(&dbad);
        dbuf_free(&dout);
        free(bad);
        free(ref);
        free(got);
        free(again);
    }
    dbuf_free(&dobs);
    free(obs);
}

static void test_multihot_nmmo3(void **state)
{
    (void)state;
    multihot_case("nmmo3", &gk_nmmo3_layout, 37, GK_NMMO3_OBS_BYTES, 0);
    /* On one multiprocessor (6 blocks of 8-agent groups): 8 groups, so some blocks take two. */
    multihot_case("nmmo3 B=61", &gk_nmmo3_layout, 61, GK_NMMO3_OBS_BYTES, 0);
    multihot_case("nmmo3 B=1", &gk_nmmo3_layout, 1, GK_NMMO3_OBS_BYTES, 0);
    multihot_case("nmmo3 obs unaligned", &gk_nmmo3_layout, 19, GK_NMMO3_OBS_BYTES, 5);
}

static void test_multihot_custom(void **state)
{
    (void)state;
    gk_multihot_layout c = layout_custom(), big = layout_large();
    /* rows of 57 bytes: the staged chunks of the first and last agents reach past the tensor */
    multihot_case("custom", &c, 29, 7 + 3 * 5 * 3 + 5, 0);
    multihot_case("custom obs unaligned", &c, 30, 7 + 3 * 5 * 3 + 5, 9);
    multihot_case("large map", &big, 3, 3 + 130 * 1000 * 4, 0);
}

/* ---- embedding --------------------------------------------------------------------- */

static int64_t idx_get(const void *p, gk_dtype dt, int64_t i)
{
    if (dt == GK_U8)
        return ((const uint8_t *)p)[i];
    if (dt == GK_I32)
        return ((const int32_t *)p)[i];
    return ((const int64_t *)p)[i];
}

static void idx_set(void *p, gk_dtype dt, int64_t i, int64_t v)
{
    if (dt == GK_U8)
        ((uint8_t *)p)[i] = (uint8_t)v;
    else if (dt == GK_I32)
        ((int32_t *)p)[i] = (int32_t)v;
    else
        ((int64_t *)p)[i] = v;
}

/* Indices in [0, vocab); hot: all on one row. */
static void *idx_random(gk_dtype dt, int64_t n, int64_t vocab, int hot)
{
    void *p = th_xmalloc((size_t)n * gk_dtype_size(dt));
    int64_t row = (int64_t)rnd((uint64_t)vocab);
    for (int64_t i = 0; i < n; i++)
        idx_set(p, dt, i, hot ? row : (int64_t)rnd((uint64_t)vocab));
    return p;
}

/* An out-of-range value for this index dtype and vocabulary. */
static int64_t idx_bad_value(gk_dtype dt, int64_t vocab)
{
    if (dt == GK_U8)
        return vocab + (int64_t)rnd((uint64_t)(256 - vocab));
    return rnd(2) ? -1 - (int64_t)rnd(1000) : vocab + (int64_t)rnd(1000);
}

static const gk_dtype idx_dts[3] = {GK_U8, GK_I32, GK_I64};
static const gk_dtype float_dts[2] = {GK_F32, GK_BF16};

static void emb_forward_case(gk_dtype idt, gk_dtype tdt, int ndim, const int64_t *ishape,
                             int64_t vocab, int64_t dim, int misalign)
{
    int64_t n = 1, oshape[GK_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        n *= oshape[i] = ishape[i];
    oshape[ndim] = dim;
    const size_t es = gk_dtype_size(tdt), ibytes = (size_t)n * gk_dtype_size(idt);
    const size_t tbytes = (size_t)(vocab * dim) * es, obytes = (size_t)(n * dim) * es;
    void *idx = idx_random(idt, n, vocab, 0), *table = th_xmalloc(tbytes);
    random_floats(table, tdt, (size_t)(vocab * dim));
    void *ref = th_xmalloc(obytes), *got = th_xmalloc(obytes), *again = th_xmalloc(obytes);
    gk_tensor hi = gk_tensor_make(idx, idt, ndim, ishape);
    gk_tensor ht = gk_tensor_make(table, tdt, 2, TH_SHAPE(vocab, dim));
    gk_tensor ho = gk_tensor_make(ref, tdt, ndim + 1, oshape);
    gk_err err;
    if (gk_cpu_embedding_forward(&hi, &ht, &ho, &err))
        fail_msg("CPU embedding forward: %s", err.msg);
    dbuf di = dbuf_from(idx, ibytes), dt = dbuf_from(table, tbytes);
    dbuf dout = dbuf_new(obytes, misalign ? es : 0);
    gk_tensor ti = gk_tensor_make(di.data, idt, ndim, ishape);
    gk_tensor tt = gk_tensor_make(dt.data, tdt, 2, TH_SHAPE(vocab, dim));
    gk_tensor to = gk_tensor_make(dout.data, tdt, ndim + 1, oshape);
    char what[160];
    snprintf(what, sizeof what, "embedding forward idx %s table %s (%lld x %lld)%s",
             gk_dtype_name(idt), gk_dtype_name(tdt), (long long)vocab, (long long)dim,
             misalign ? " unaligned" : "");
    gk_cuda_exec ex = exec_make(g_sms, WORKSPACE);
    for (int rep = 0; rep < 2; rep++) {
        if (rep)
            dbuf_poison(&dout);
        if (gk_cuda_embedding_forward(&ti, &tt, &to, &ex, &err))
            fail_msg("%s: %s", what, err.msg);
        sync_ok();
        if (gk_cuda_embedding_status(&ti, vocab, &ex, &err))
            fail_msg("%s: status: %s", what, err.msg);
        dbuf_get(&dout, rep ? again : got);
    }
    bytes_equal(got, ref, obytes, es, what);
    if (memcmp(got, again, obytes) != 0)
        fail_msg("%s: two runs differ", what);
    dbuf_check_guard(&dout, what);
    printf("ok %s, %lld rows\n", what, (long long)n);

    /* One index out of range, and a later one: the first is named as by the CPU. */
    int64_t p = (int64_t)rnd((uint64_t)n);
    idx_set(idx, idt, p, idx_bad_value(idt, vocab));
    if (p + 1 < n)
        idx_set(idx, idt, p + 1, idx_bad_value(idt, vocab));
    gk_err cpu_err;
    assert_int_equal(gk_cpu_embedding_forward(&hi, &ht, &ho, &cpu_err), GK_ERANGE);
    TH_CUDA_OK(upload(di.data, idx, ibytes));
    dbuf_poison(&dout);
    if (gk_cuda_embedding_forward(&ti, &tt, &to, &ex, &err))
        fail_msg("%s: %s", what, err.msg);
    sync_ok();
    int rc = gk_cuda_embedding_status(&ti, vocab, &ex, &err);
    printf("bad index, %s: %s\n", what, err.msg);
    assert_int_equal(rc, GK_ERANGE);
    assert_string_equal(err.msg, cpu_err.msg);
    assert_int_equal(idx_get(idx, idt, p) >= 0 && idx_get(idx, idt, p) < vocab, 0);
    dbuf_check_guard(&dout, "embedding forward with a bad index");
    dbuf_free(&di);
    dbuf_free(&dt);
    dbuf_free(&dout);
    free(idx);
    free(table);
    free(ref);
    free(got);
    free(again);
}

static void test_embedding_forward(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < 2; t++) {
            emb_forward_case(idx_dts[i], float_dts[t], 2, TH_SHAPE(301, 47), 128, 32, 0);
            emb_forward_case(idx_dts[i], float_dts[t], 2, TH_SHAPE(301, 47), 128, 32, 1);
            emb_forward_case(idx_dts[i], float_dts[t], 3, TH_SHAPE(5, 7, 3), 200, 7, 0);
        }
    }
    emb_forward_case(GK_I64, GK_F32, 1, TH_SHAPE(1), 1, 4, 0);
    /* 512-byte rows (32 pieces a row), and a table too large to be copied to shared memory */
    emb_forward_case(GK_U8, GK_BF16, 2, TH_SHAPE(40, 9), 8, 256, 0);
    emb_forward_case(GK_I32, GK_F32, 2, TH_SHAPE(64, 33), 3000, 32, 0);
}

/* ---- embedding bag ------------------------------------------------------------------ */

/* B bags of K ids into a (V, D) table, about one in four -1 (padding): bitwise the CPU's. */
static void bag_case(gk_dtype tdt, int64_t B, int64_t K, int64_t V, int64_t D, int misalign)
{
    const size_t es = gk_dtype_size(tdt), ibytes = (size_t)(B * K) * 4;
    const size_t tbytes = (size_t)(V * D) * es, obytes = (size_t)(B * D) * 4;
    int32_t *idx = th_xmalloc(ibytes);
    for (int64_t i = 0; i < B * K; i++)
        idx[i] = rnd(4) == 0 ? -1 : (int32_t)rnd((uint64_t)V);
    void *table = th_xmalloc(tbytes);
    random_floats(table, tdt, (size_t)(V * D));
    float *ref = th_xmalloc(obytes), *got = th_xmalloc(obytes), *again = th_xmalloc(obytes);
    gk_tensor hi = gk_tensor_make(idx, GK_I32, 2, TH_SHAPE(B, K));
    gk_tensor ht = gk_tensor_make(table, tdt, 2, TH_SHAPE(V, D));
    gk_tensor ho = gk_tensor_make(ref, GK_F32, 2, TH_SHAPE(B, D));
    gk_err err;
    if (gk_cpu_embedding_bag(&hi, &ht, &ho, &err))
        fail_msg("CPU embedding bag: %s", err.msg);
    dbuf di = dbuf_from(idx, ibytes), dt = dbuf_from(table, tbytes);
    dbuf dout = dbuf_new(obytes, misalign ? 4 : 0);
    gk_tensor ti = gk_tensor_make(di.data, GK_I32, 2, TH_SHAPE(B, K));
    gk_tensor tt = gk_tensor_make(dt.data, tdt, 2, TH_SHAPE(V, D));
    gk_tensor to = gk_tensor_make(dout.data, GK_F32, 2, TH_SHAPE(B, D));
    char what[160];
    snprintf(what, sizeof what, "embedding bag table %s (%lld x %lld), %lld bags of %lld%s",
             gk_dtype_name(tdt), (long long)V, (long long)D, (long long)B, (long long)K,
             misalign ? ", out unaligned" : "");
    gk_cuda_exec ex = exec_make(g_sms, WORKSPACE);
    for (int rep = 0; rep < 2; rep++) {
        if (rep)
            dbuf_poison(&dout);
        workspace_garbage();
        if (gk_cuda_embedding_bag(&ti, &tt, &to, &ex, &err))
            fail_msg("%s: %s", what, err.msg);
        sync_ok();
        if (gk_cuda_embedding_bag_status(&ti, V, &ex, &err))
            fail_msg("%s: status: %s", what, err.msg);
        dbuf_get(&dout, rep ? again : got);
    }
    bytes_equal(got, ref, obytes, 4, what);
    if (memcmp(got, again, obytes) != 0)
        fail_msg("%s: two runs differ", what);
    dbuf_check_guard(&dout, what);
    printf("ok %s\n", what);

    /* An id out of range, and a later one: the first is named as by the CPU. */
    const int64_t p = (int64_t)rnd((uint64_t)(B * K));
    idx[p] = rnd(2) ? -2 - (int32_t)rnd(1000) : (int32_t)(V + (int64_t)rnd(1000));
    if (p + 1 < B * K)
        idx[p + 1] = (int32_t)V;
    gk_err cpu_err;
    assert_int_equal(gk_cpu_embedding_bag(&hi, &ht, &ho, &cpu_err), GK_ERANGE);
    TH_CUDA_OK(upload(di.data, idx, ibytes));
    dbuf_poison(&dout);
    if (gk_cuda_embedding_bag(&ti, &tt, &to, &ex, &err))
        fail_msg("%s: %s", what, err.msg);
    sync_ok();
    int rc = gk_cuda_embedding_bag_status(&ti, V, &ex, &err);
    printf("bad id, %s: %s\n", what, err.msg);
    assert_int_equal(rc, GK_ERANGE);
    assert_string_equal(err.msg, cpu_err.msg);
    dbuf_check_guard(&dout, "embedding bag with a bad id");
    dbuf_free(&di);
    dbuf_free(&dt);
    dbuf_free(&dout);
    free(idx);
    free(table);
    free(ref);
    free(got);
    free(again);
}

static void test_embedding_bag(void **state)
{
    (void)state;
    static const struct {
        int64_t B, K, V, D;
    } cases[] = {{1, 1, 1, 1},      {300, 8, 128, 32},  {257, 47, 1000, 64}, {64, 70, 50, 7},
                 {33, 3, 10, 4},    {100, 20, 500, 130}, {16, 33, 64, 256},  {9, 5, 3000, 1000}};
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++)
        for (int t = 0; t < 2; t++)
            for (int m = 0; m < 2; m++)
                bag_case(float_dts[t], cases[q].B, cases[q].K, cases[q].V, cases[q].D, m);
}

static double grad_value(const void *p, gk_dtype dt, size_t i)
{
    return dt == GK_BF16 ? gk_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static double rel_err(const float *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
}

enum bwd_exec { BWD_ALL_SMS, BWD_ONE_SM, BWD_ONE_TABLE, BWD_EXECS };
static const char *const bwd_exec_name[] = {"all SMs", "1 SM", "one partial table"};

static void emb_backward_case(gk_dtype idt, gk_dtype gdt, int64_t rows, int64_t per_row,
                              int64_t vocab, int64_t dim, int hot)
{
    const int64_t n = rows * per_row, vd = vocab * dim;
    const size_t es = gk_dtype_size(gdt), ibytes = (size_t)n * gk_dtype_size(idt);
    const size_t gbytes = (size_t)(n * dim) * es, tbytes = (size_t)vd * sizeof(float);
    void *idx = idx_random(idt, n, vocab, hot), *dout = th_xmalloc(gbytes);
    random_floats(dout, gdt, (size_t)(n * dim));
    double *ref = calloc((size_t)vd, sizeof(double));
    assert_non_null(ref);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = idx_get(idx, idt, i);
        for (int64_t c = 0; c < dim; c++)
            ref[v * dim + c] += grad_value(dout, gdt, (size_t)(i * dim + c));
    }
    float *cpu = th_xmalloc(tbytes), *got = th_xmalloc(tbytes), *again = th_xmalloc(tbytes);
    gk_tensor hi = gk_tensor_make(idx, idt, 2, TH_SHAPE(rows, per_row));
    gk_tensor hg = gk_tensor_make(dout, gdt, 3, TH_SHAPE(rows, per_row, dim));
    gk_tensor hd = gk_tensor_make(cpu, GK_F32, 2, TH_SHAPE(vocab, dim));
    gk_err err;
    if (gk_cpu_embedding_backward(&hi, &hg, &hd, &err))
        fail_msg("CPU embedding backward: %s", err.msg);
    const double cpu_rel = rel_err(cpu, ref, (size_t)vd);

    dbuf di = dbuf_from(idx, ibytes), dg = dbuf_from(dout, gbytes), dd = dbuf_new(tbytes, 0);
    gk_tensor ti = gk_tensor_make(di.data, idt, 2, TH_SHAPE(rows, per_row));
    gk_tensor tg = gk_tensor_make(dg.data, gdt, 3, TH_SHAPE(rows, per_row, dim));
    gk_tensor td = gk_tensor_make(dd.data, GK_F32, 2, TH_SHAPE(vocab, dim));
    size_t want = 0;
    if (gk_cuda_embedding_backward_workspace_bytes(&ti, &tg, &td, g_sms, &want, &err))
        fail_msg("workspace bytes: %s", err.msg);
    assert_true(want <= WORKSPACE);
    float *all_sms = th_xmalloc(tbytes);
    for (int e = 0; e < BWD_EXECS; e++) {
        /* one partial table: its fp32 elements and its offender slot */
        gk_cuda_exec ex = e == BWD_ONE_SM ? exec_make(1, WORKSPACE)
                          : e == BWD_ONE_TABLE
                              ? exec_make(g_sms, GK_CUDA_OBS_RECORD_BYTES + (size_t)vd * 4 + 4)
                              : exec_make(g_sms, want);
        char what[200];
        snprintf(what, sizeof what, "embedding backward idx %s dout %s (%lld x %lld) %lld rows%s, %s",
                 gk_dtype_name(idt), gk_dtype_name(gdt), (long long)vocab, (long long)dim,
                 (long long)n, hot ? " all on one row" : "", bwd_exec_name[e]);
        for (int rep = 0; rep < 2; rep++) {
            dbuf_poison(&dd);
            workspace_garbage();
            if (gk_cuda_embedding_backward(&ti, &tg, &td, &ex, &err))
                fail_msg("%s: %s", what, err.msg);
            sync_ok();
            if (gk_cuda_embedding_status(&ti, vocab, &ex, &err))
                fail_msg("%s: status: %s", what, err.msg);
            dbuf_get(&dd, rep ? again : got);
        }
        const double rel = rel_err(got, ref, (size_t)vd);
        double num = 0, den = 0;
        for (int64_t i = 0; i < vd; i++) {
            num += ((double)got[i] - cpu[i]) * ((double)got[i] - cpu[i]);
            den += (double)cpu[i] * cpu[i];
        }
        const double vs_cpu = sqrt(num) / (den > 0 ? sqrt(den) : 1.0);
        printf("rel err %s: %.3g vs float64 (CPU %.3g), %.3g vs CPU\n", what, rel, cpu_rel, vs_cpu);
        if (!(rel < 1e-6) || !(vs_cpu < 1e-5))
            fail_msg("%s: rel err %.3g vs float64 (tolerance 1e-6), %.3g vs CPU (1e-5)", what,
                     rel, vs_cpu);
        if (memcmp(got, again, tbytes) != 0)
            fail_msg("%s: two runs differ", what);
        dbuf_check_guard(&dd, what);
        if (e == BWD_ALL_SMS)
            memcpy(all_sms, got, tbytes);
    }

    /*
     * dout 4 bytes off its alignment: D = 32 then takes the general kernel
     * instead of the four-rows-at-once one, which splits the positions and
     * adds them in the same order, so there the bytes must be the same; bf16
     * dout 8 bytes off still takes the four-rows-at-once kernel (8-byte loads).
     */
    dbuf dg_off = dbuf_new(gbytes, 4);
    TH_CUDA_OK(upload(dg_off.data, dout, gbytes));
    gk_tensor tg_off = gk_tensor_make(dg_off.data, gdt, 3, TH_SHAPE(rows, per_row, dim));
    gk_cuda_exec ex_all = exec_make(g_sms, want);
    dbuf_poison(&dd);
    if (gk_cuda_embedding_backward(&ti, &tg_off, &td, &ex_all, &err))
        fail_msg("backward, dout unaligned: %s", err.msg);
    sync_ok();
    if (gk_cuda_embedding_status(&ti, vocab, &ex_all, &err))
        fail_msg("backward, dout unaligned: status: %s", err.msg);
    dbuf_get(&dd, got);
    const double rel_off = rel_err(got, ref, (size_t)vd);
    if (!(rel_off < 1e-6))
        fail_msg("backward idx %s dout %s (%lld x %lld), dout unaligned: rel err %.3g vs float64",
                 gk_dtype_name(idt), gk_dtype_name(gdt), (long long)vocab, (long long)dim, rel_off);
    const int same_split = dim == 32;
    if (same_split && memcmp(got, all_sms, tbytes) != 0)
        fail_msg("backward idx %s dout %s (%lld x %lld): dout unaligned gives other bytes",
                 gk_dtype_name(idt), gk_dtype_name(gdt), (long long)vocab, (long long)dim);
    printf("ok backward idx %s dout %s (%lld x %lld), dout unaligned: rel err %.3g%s\n",
           gk_dtype_name(idt), gk_dtype_name(gdt), (long long)vocab, (long long)dim, rel_off,
           same_split ? ", the same bytes" : "");
    dbuf_free(&dg_off);
    if (same_split && gdt == GK_BF16) {
        dbuf dg_off8 = dbuf_new(gbytes, 8);
        TH_CUDA_OK(upload(dg_off8.data, dout, gbytes));
        gk_tensor tg_off8 = gk_tensor_make(dg_off8.data, gdt, 3, TH_SHAPE(rows, per_row, dim));
        dbuf_poison(&dd);
        if (gk_cuda_embedding_backward(&ti, &tg_off8, &td, &ex_all, &err))
            fail_msg("backward, dout 8 bytes off: %s", err.msg);
        sync_ok();
        if (gk_cuda_embedding_status(&ti, vocab, &ex_all, &err))
            fail_msg("backward, dout 8 bytes off: status: %s", err.msg);
        dbuf_get(&dd, got);
        if (memcmp(got, all_sms, tbytes) != 0)
            fail_msg("backward idx %s dout bf16 (%lld x 32): dout 8 bytes off gives other bytes",
                     gk_dtype_name(idt), (long long)vocab);
        printf("ok backward idx %s dout bf16 (%lld x 32), dout 8 bytes off: the same bytes\n",
               gk_dtype_name(idt), (long long)vocab);
        dbuf_free(&dg_off8);
    }

    /* A bad index: GK_ERANGE with the CPU's message, dtable left as it was (poison). */
    int64_t p = (int64_t)rnd((uint64_t)n);
    idx_set(idx, idt, p, idx_bad_value(idt, vocab));
    gk_err cpu_err;
    assert_int_equal(gk_cpu_embedding_backward(&hi, &hg, &hd, &cpu_err), GK_ERANGE);
    TH_CUDA_OK(upload(di.data, idx, ibytes));
    dbuf_poison(&dd);
    gk_cuda_exec ex = exec_make(g_sms, WORKSPACE);
    if (gk_cuda_embedding_backward(&ti, &tg, &td, &ex, &err))
        fail_msg("backward: %s", err.msg);
    sync_ok();
    int rc = gk_cuda_embedding_status(&ti, vocab, &ex, &err);
    printf("bad index, backward: %s\n", err.msg);
    assert_int_equal(rc, GK_ERANGE);
    assert_string_equal(err.msg, cpu_err.msg);
    dbuf_get(&dd, got);
    for (int64_t i = 0; i < vd; i++)
        if (((const uint32_t *)(const void *)got)[i] != 0xffffffffu)
            fail_msg("backward with a bad index wrote dtable element %lld", (long long)i);
    dbuf_check_guard(&dd, "backward with a bad index");
    /* The next clean call's record says clean (the kernels write it, nothing resets it). */
    idx_set(idx, idt, p, idx_get(idx, idt, (p + 1) % n) % vocab);
    if (idx_get(idx, idt, p) < 0)
        idx_set(idx, idt, p, 0);
    TH_CUDA_OK(upload(di.data, idx, ibytes));
    if (gk_cuda_embedding_backward(&ti, &tg, &td, &ex, &err))
        fail_msg("backward after a bad index: %s", err.msg);
    sync_ok();
    if (gk_cuda_embedding_status(&ti, vocab, &ex, &err))
        fail_msg("backward after a bad index: status: %s", err.msg);
    dbuf_free(&di);
    dbuf_free(&dg);
    dbuf_free(&dd);
    free(idx);
    free(dout);
    free(ref);
    free(cpu);
    free(got);
    free(again);
    free(all_sms);
}

static void test_embedding_backward(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        for (int g = 0; g < 2; g++)
            emb_backward_case(idx_dts[i], float_dts[g], 1024, 47, 128, 32, 0);
    emb_backward_case(GK_I32, GK_F32, 200, 9, 3000, 40, 0); /* 480 KB table: no shared path */
    emb_backward_case(GK_I64, GK_BF16, 33, 5, 17, 3, 0);
    emb_backward_case(GK_U8, GK_F32, 16, 47, 128, 32, 1);
    emb_backward_case(GK_I32, GK_BF16, 40, 47, 128, 32, 1);
    emb_backward_case(GK_U8, GK_BF16, 7, 3, 5, 32, 0); /* fewer positions than warps */
    /* larger tables of 32 columns: fewer warps (tables) a block */
    emb_backward_case(GK_I32, GK_BF16, 300, 47, 300, 32, 0);
    emb_backward_case(GK_I64, GK_F32, 200, 47, 300, 32, 0);
    /* bf16, 100 rows, four times the positions (longer ranges a warp) */
    emb_backward_case(GK_U8, GK_BF16, 4096, 47, 100, 32, 0);
    /* bf16, 128 rows: the positions ending inside a batch of 64 and exactly on one */
    emb_backward_case(GK_U8, GK_BF16, 1001, 47, 128, 32, 0);
    emb_backward_case(GK_U8, GK_BF16, 1848, 64, 128, 32, 0);
    /* bf16, 1000 rows of 32: one table a warp (the four-rows kernel's fewest) */
    emb_backward_case(GK_I32, GK_BF16, 64, 47, 1000, 32, 0);
}

/* ---- through a daemon on the CUDA backend ---------------------------------------- */

#define CALL_OK(c, call)                                                                           \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0)                                                                              \
            fail_msg("%s: %s: %s", #call, gpucd_strerror(rc_), gpucd_errmsg(c));                   \
    } while (0)

static void test_daemon_obs(void **state)
{
    (void)state;
    setenv("GPUCD_TEST_BACKEND", "cuda", 1);
    th_daemon d;
    const char *extra[] = {"--workspace-mb", "128", "--resident-mb", "64", NULL};
    th_daemon_start(&d, extra);
    gpucd_client *c = th_connect(d.ipc_url);
    enum { B = 96, P = GK_NMMO3_PLAYER_COUNT, V = 128, D = 32 };
    const gk_multihot_layout *l = &gk_nmmo3_layout;
    uint8_t *obs = th_xmalloc((size_t)B * GK_NMMO3_OBS_BYTES);
    th_fill_nmmo3_obs(obs, B);
    gk_err err;

    /* multihot, the preset, f32 and bf16: bitwise the CPU's. */
    const int64_t mshape[4] = {B, 59, 11, 15};
    for (int d_ = 0; d_ < 2; d_++) {
        gk_dtype dt = float_dts[d_];
        size_t bytes = (size_t)B * 59 * 165 * gk_dtype_size(dt);
        void *ref = th_xmalloc(bytes), *got = th_xmalloc(bytes);
        gk_tensor tr = gk_tensor_make(ref, dt, 4, mshape);
        if (gk_cpu_multihot_encode(l, &(gk_tensor){obs, GK_U8, 2, {B, GK_NMMO3_OBS_BYTES}}, &tr,
                                   &err))
            fail_msg("CPU multihot: %s", err.msg);
        memset(got, 0xff, bytes);
        gpucd_tensor to = gpucd_tensor_host(obs, GPUCD_U8, 2, TH_SHAPE(B, GK_NMMO3_OBS_BYTES));
        gpucd_tensor tg = gpucd_tensor_host(got, (gpucd_dtype)dt, 4, mshape);
        CALL_OK(c, gpucd_multihot_encode(c, NULL, &to, &tg, NULL));
        bytes_equal(got, ref, bytes, gk_dtype_size(dt), "daemon multihot");
        printf("ok daemon multihot %s B %d\n", gk_dtype_name(dt), B);
        free(ref);
        free(got);
    }
    /* A bad value names its agent and feature. */
    uint8_t keep = obs[5 * GK_NMMO3_OBS_BYTES + 3 * 10 + 2];
    obs[5 * GK_NMMO3_OBS_BYTES + 3 * 10 + 2] = 17;
    {
        float *out = th_xmalloc((size_t)B * 59 * 165 * 4);
        gpucd_tensor to = gpucd_tensor_host(obs, GPUCD_U8, 2, TH_SHAPE(B, GK_NMMO3_OBS_BYTES));
        gpucd_tensor tg = gpucd_tensor_host(out, GPUCD_F32, 4, mshape);
        int rc = gpucd_multihot_encode(c, NULL, &to, &tg, NULL);
        printf("daemon, bad value: %s: %s\n", gpucd_strerror(rc), gpucd_errmsg(c));
        assert_int_equal(rc, GPUCD_EOUT_OF_RANGE);
        assert_non_null(strstr(gpucd_errmsg(c), "agent 5, tile (h 0, w 3), feature 2: value 17"));
        free(out);
    }
    obs[5 * GK_NMMO3_OBS_BYTES + 3 * 10 + 2] = keep;

    /* embedding forward and backward on the player bytes as u8 indices. */
    uint8_t idx[B * P];
    for (int b = 0; b < B; b++)
        memcpy(idx + b * P, obs + (size_t)b * GK_NMMO3_OBS_BYTES + GK_NMMO3_PLAYER_OFFSET, P);
    float *table = th_xmalloc(V * D * 4), *ref = th_xmalloc((size_t)B * P * D * 4);
    float *got = th_xmalloc((size_t)B * P * D * 4), *dout = th_xmalloc((size_t)B * P * D * 4);
    float dt_ref[V * D], dt_got[V * D];
    th_fill_f32(table, V * D);
    th_fill_f32(dout, (size_t)B * P * D);
    gk_tensor hi = gk_tensor_make(idx, GK_U8, 2, TH_SHAPE(B, P));
    gk_tensor ht = gk_tensor_make(table, GK_F32, 2, TH_SHAPE(V, D));
    gk_tensor ho = gk_tensor_make(ref, GK_F32, 3, TH_SHAPE(B, P, D));
    gk_tensor hd = gk_tensor_make(dt_ref, GK_F32, 2, TH_SHAPE(V, D));
    if (gk_cpu_embedding_forward(&hi, &ht, &ho, &err) ||
        gk_cpu_embedding_backward(&hi, &(gk_tensor){dout, GK_F32, 3, {B, P, D}}, &hd, &err))
        fail_msg("CPU embedding: %s", err.msg);
    gpucd_tensor ti = gpucd_tensor_host(idx, GPUCD_U8, 2, TH_SHAPE(B, P));
    gpucd_tensor tt = gpucd_tensor_host(table, GPUCD_F32, 2, TH_SHAPE(V, D));
    gpucd_tensor to = gpucd_tensor_host(got, GPUCD_F32, 3, TH_SHAPE(B, P, D));
    gpucd_tensor tdo = gpucd_tensor_host(dout, GPUCD_F32, 3, TH_SHAPE(B, P, D));
    gpucd_tensor tdt = gpucd_tensor_host(dt_got, GPUCD_F32, 2, TH_SHAPE(V, D));
    memset(got, 0xff, (size_t)B * P * D * 4);
    CALL_OK(c, gpucd_embedding_forward(c, &ti, &tt, &to, NULL));
    bytes_equal(got, ref, (size_t)B * P * D * 4, 4, "daemon embedding forward");
    memset(dt_got, 0xff, sizeof dt_got);
    CALL_OK(c, gpucd_embedding_backward(c, &ti, &tdo, &tdt, NULL));
    double num = 0, den = 0;
    for (int i = 0; i < V * D; i++) {
        num += ((double)dt_got[i] - dt_ref[i]) * ((double)dt_got[i] - dt_ref[i]);
        den += (double)dt_ref[i] * dt_ref[i];
    }
    printf("ok daemon embedding forward; backward rel err vs CPU %.3g\n", sqrt(num / den));
    assert_true(sqrt(num / den) < 1e-5);
    /* A bad index names its position. */
    idx[2 * P + 7] = 200;
    int rc = gpucd_embedding_forward(c, &ti, &tt, &to, NULL);
    printf("daemon, bad index: %s: %s\n", gpucd_strerror(rc), gpucd_errmsg(c));
    assert_int_equal(rc, GPUCD_EOUT_OF_RANGE);
    assert_non_null(strstr(gpucd_errmsg(c), "position 101 (2, 7): value 200"));
    rc = gpucd_embedding_backward(c, &ti, &tdo, &tdt, NULL);
    assert_int_equal(rc, GPUCD_EOUT_OF_RANGE);

    /* embedding bag: the players' bytes as bags of P ids, a resident table; bitwise the CPU's. */
    {
        int32_t bag[B * P];
        for (int i = 0; i < B * P; i++)
            bag[i] = i % 5 == 4 ? -1 : (int32_t)(idx[i] % V);
        float *bref = th_xmalloc((size_t)B * D * 4), *bgot = th_xmalloc((size_t)B * D * 4);
        gk_tensor hb = gk_tensor_make(bag, GK_I32, 2, TH_SHAPE(B, P));
        if (gk_cpu_embedding_bag(&hb, &ht, &(gk_tensor){bref, GK_F32, 2, {B, D}}, &err))
            fail_msg("CPU embedding bag: %s", err.msg);
        uint64_t tid = 0;
        CALL_OK(c, gpucd_tensor_put(c, &tt, &tid));
        gpucd_tensor tb = gpucd_tensor_host(bag, GPUCD_I32, 2, TH_SHAPE(B, P));
        gpucd_tensor tr = gpucd_tensor_resident(tid, GPUCD_F32, 2, TH_SHAPE(V, D));
        gpucd_tensor tbo = gpucd_tensor_host(bgot, GPUCD_F32, 2, TH_SHAPE(B, D));
        memset(bgot, 0xff, (size_t)B * D * 4);
        CALL_OK(c, gpucd_embedding_bag(c, &tb, &tr, &tbo, NULL));
        bytes_equal(bgot, bref, (size_t)B * D * 4, 4, "daemon embedding bag");
        printf("ok daemon embedding bag, resident table\n");
        bag[3 * P + 2] = V;
        rc = gpucd_embedding_bag(c, &tb, &tr, &tbo, NULL);
        printf("daemon, bad bag id: %s: %s\n", gpucd_strerror(rc), gpucd_errmsg(c));
        assert_int_equal(rc, GPUCD_EOUT_OF_RANGE);
        char want[96];
        snprintf(want, sizeof want, "position %d (bag 3, 2): value %d", 3 * P + 2, V);
        assert_non_null(strstr(gpucd_errmsg(c), want));
        CALL_OK(c, gpucd_tensor_free(c, tid));
        free(bref);
        free(bgot);
    }
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
    free(obs);
    free(table);
    free(ref);
    free(got);
    free(dout);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (th_cuda_absent())
        return 77;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&g_ws, WORKSPACE) != cudaSuccess) {
        fprintf(stderr, "cannot set up the device\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multihot_nmmo3),   cmocka_unit_test(test_multihot_custom),
        cmocka_unit_test(test_embedding_forward), cmocka_unit_test(test_embedding_backward),
        cmocka_unit_test(test_embedding_bag),     cmocka_unit_test(test_daemon_obs),
    };
    /* GPUCD_TEST_KERNELS_ONLY=1: without the daemon test (for compute-sanitizer, which would not follow it) */
    const char *only = getenv("GPUCD_TEST_KERNELS_ONLY");
    int rc = only != NULL && only[0] == '1'
                 ? _cmocka_run_group_tests("gpu_obs kernels", tests, sizeof tests / sizeof tests[0] - 1,
                                           NULL, NULL)
                 : cmocka_run_group_tests(tests, NULL, NULL);
    cudaFree(g_ws);
    cudaStreamDestroy(g_stream);
    return rc;
}
