/*
 * test_aliased.c - outputs that are the same memory as the indices or
 * observations, seen through a second mapping: what a client gets by
 * registering one memory as two regions, so that no address comparison sees
 * the overlap.  Writing the output then changes the input as the kernel runs,
 * deterministically: a kernel that checks a value and later reads it again to
 * use it reads what it wrote instead (and indexes far out of its buffers).
 * Each result must be the one computed from the inputs as they were when the
 * call began.
 */
#include "ktest.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

/* Two views, a and b, of the same bytes. */
typedef struct alias {
    uint8_t *a, *b;
    size_t bytes;
} alias;

static alias alias_map(size_t bytes)
{
    alias m = {.bytes = bytes};
    int fd = memfd_create("gk-test-alias", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
    m.a = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    m.b = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(m.a != MAP_FAILED && m.b != MAP_FAILED);
    m.a[0] = 1; /* the same bytes, not copies */
    assert_int_equal(m.b[0], 1);
    return m;
}

static void alias_unmap(alias *m)
{
    munmap(m->a, m->bytes);
    munmap(m->b, m->bytes);
}

/*
 * Table values of 1000 and more: as int32 bits (an index the output wrote
 * over) they are above 10^9, rows far outside the table.
 */
enum { EMB_N = 64, EMB_V = 8, EMB_D = 4 };

static void emb_table_fill(float *table)
{
    for (int i = 0; i < EMB_V * EMB_D; i++)
        table[i] = 1000.0f + (float)ktest_int(0, 1000);
}

static void emb_idx_fill(int32_t *idx)
{
    for (int i = 0; i < EMB_N; i++)
        idx[i] = (int32_t)ktest_int(0, EMB_V - 1);
}

/* out (N, D) over idx: row 0 of the lookup overwrites idx[0..3]. */
static void test_embedding_forward_output_over_indices(void **state)
{
    (void)state;
    alias m = alias_map((size_t)EMB_N * EMB_D * sizeof(float));
    int32_t orig[EMB_N];
    float table[EMB_V * EMB_D], want[EMB_N * EMB_D];
    emb_idx_fill(orig);
    emb_table_fill(table);
    for (int i = 0; i < EMB_N; i++)
        memcpy(want + i * EMB_D, table + orig[i] * EMB_D, sizeof(float) * EMB_D);
    memcpy(m.a, orig, sizeof orig);
    gk_tensor ti = gk_tensor_make(m.a, GK_I32, 1, (const int64_t[]){EMB_N});
    gk_tensor tt = gk_tensor_make(table, GK_F32, 2, (const int64_t[]){EMB_V, EMB_D});
    gk_tensor to = gk_tensor_make(m.b, GK_F32, 2, (const int64_t[]){EMB_N, EMB_D});
    gk_err err;
    int rc = gk_cpu_embedding_forward(&ti, &tt, &to, &err);
    ktest_check(rc == GK_OK, "embedding forward: %d %s", rc, err.msg);
    ktest_check(memcmp(m.b, want, sizeof want) == 0,
                "embedding forward: the output is not the lookup of the indices as given");
    alias_unmap(&m);
}

/* dtable (V, D) over idx: zeroing it and adding rows into it overwrites idx[0..31]. */
static void test_embedding_backward_gradient_over_indices(void **state)
{
    (void)state;
    alias m = alias_map((size_t)EMB_N * sizeof(int32_t));
    int32_t orig[EMB_N];
    float dout[EMB_N * EMB_D], want[EMB_V * EMB_D] = {0};
    emb_idx_fill(orig);
    for (int i = 0; i < EMB_N * EMB_D; i++)
        dout[i] = 1000.0f + (float)ktest_int(0, 1000);
    for (int i = 0; i < EMB_N; i++) /* the kernel's order: ascending positions, in f32 */
        for (int c = 0; c < EMB_D; c++)
            want[orig[i] * EMB_D + c] += dout[i * EMB_D + c];
    memcpy(m.a, orig, sizeof orig);
    gk_tensor ti = gk_tensor_make(m.a, GK_I32, 1, (const int64_t[]){EMB_N});
    gk_tensor td = gk_tensor_make(dout, GK_F32, 2, (const int64_t[]){EMB_N, EMB_D});
    gk_tensor tg = gk_tensor_make(m.b, GK_F32, 2, (const int64_t[]){EMB_V, EMB_D});
    gk_err err;
    int rc = gk_cpu_embedding_backward(&ti, &td, &tg, &err);
    ktest_check(rc == GK_OK, "embedding backward: %d %s", rc, err.msg);
    ktest_check(memcmp(m.b, want, sizeof want) == 0,
                "embedding backward: the gradient is not that of the indices as given");
    alias_unmap(&m);
}

/*
 * One two-valued feature on a 16 x 16 map; out (B, 2, 16, 16) over obs: the
 * first agent's image overwrites every observation byte with 0s, then with
 * the bytes of 1.0f (0x80, 0x3f: channels 128 and 63 of 2).
 */
enum { MH_B = 4, MH_TILES = 16 * 16 };

static void test_multihot_output_over_observations(void **state)
{
    (void)state;
    const gk_multihot_layout l = {.height = 16, .width = 16, .nfeat = 1, .channels = 2,
                                  .slots = {2}};
    const size_t out_floats = (size_t)MH_B * 2 * MH_TILES;
    alias m = alias_map(out_floats * sizeof(float));
    uint8_t orig[MH_B * MH_TILES];
    float *want = calloc(out_floats, sizeof *want);
    assert_non_null(want);
    for (int i = 0; i < MH_B * MH_TILES; i++)
        orig[i] = (uint8_t)ktest_int(0, 1);
    for (int n = 0; n < MH_B; n++)
        for (int t = 0; t < MH_TILES; t++)
            want[(n * 2 + orig[n * MH_TILES + t]) * MH_TILES + t] = 1.0f;
    memcpy(m.a, orig, sizeof orig);
    gk_tensor tobs = gk_tensor_make(m.a, GK_U8, 2, (const int64_t[]){MH_B, MH_TILES});
    gk_tensor tout = gk_tensor_make(m.b, GK_F32, 4, (const int64_t[]){MH_B, 2, 16, 16});
    gk_err err;
    int rc = gk_cpu_multihot_encode(&l, &tobs, &tout, &err);
    ktest_check(rc == GK_OK, "multihot: %d %s", rc, err.msg);
    ktest_check(memcmp(m.b, want, out_floats * sizeof(float)) == 0,
                "multihot: the output is not the encoding of the observations as given");
    free(want);
    alias_unmap(&m);
}

/*
 * nmmo3 forward of two chunks of 64 agents, one thread (so the chunks run in
 * order), features over obs: the first chunk's features overwrite the second
 * chunk's observations before it is encoded.
 */
enum { N3_B = 128 };

static void test_nmmo3_features_over_observations(void **state)
{
    (void)state;
    static const int64_t shapes[5][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128},
                                         {128, 32}};
    static const int nd[5] = {4, 1, 4, 1, 2};
    static const int factors[10] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
    gk_nmmo3_weights w;
    memset(&w, 0, sizeof w);
    gk_tensor *wt[5] = {&w.conv1_w, &w.conv1_b, &w.conv2_w, &w.conv2_b, &w.embed};
    ktensor k[5];
    for (int i = 0; i < 5; i++) {
        k[i] = ktensor_new(GK_F32, nd[i], shapes[i]);
        ktensor_fill(&k[i], -0.1, 0.1);
        *wt[i] = k[i].t;
    }
    const size_t obs_bytes = (size_t)N3_B * GK_NMMO3_OBS_BYTES;
    const size_t feat_bytes = (size_t)N3_B * GK_NMMO3_FEATURES * sizeof(float);
    uint8_t *orig = malloc(obs_bytes);
    float *want = malloc(feat_bytes);
    assert_non_null(orig);
    assert_non_null(want);
    for (int n = 0; n < N3_B; n++) {
        uint8_t *o = orig + (size_t)n * GK_NMMO3_OBS_BYTES;
        for (int t = 0; t < 11 * 15; t++)
            for (int f = 0; f < 10; f++)
                o[t * 10 + f] = (uint8_t)ktest_int(0, factors[f] - 1);
        for (int i = 0; i < GK_NMMO3_PLAYER_COUNT; i++)
            o[GK_NMMO3_PLAYER_OFFSET + i] = (uint8_t)ktest_int(0, GK_NMMO3_EMBED_VOCAB - 1);
        for (int i = 0; i < GK_NMMO3_REWARD_COUNT; i++)
            o[GK_NMMO3_REWARD_OFFSET + i] = (uint8_t)ktest_int(0, 255);
    }
    const int64_t obs_shape[2] = {N3_B, GK_NMMO3_OBS_BYTES}, feat_shape[2] = {N3_B,
                                                                           GK_NMMO3_FEATURES};
    gk_tensor none;
    memset(&none, 0, sizeof none);
    gk_tensor tobs = gk_tensor_make(orig, GK_U8, 2, obs_shape);
    gk_tensor tf = gk_tensor_make(want, GK_F32, 2, feat_shape);
    gk_err err;
    int rc = gk_cpu_nmmo3_forward(&w, &tobs, &tf, &none, &err);
    ktest_check(rc == GK_OK, "nmmo3 reference: %d %s", rc, err.msg);

    alias m = alias_map(feat_bytes);
    memcpy(m.a, orig, obs_bytes);
    tobs.data = m.a;
    tf.data = m.b;
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    rc = gk_cpu_nmmo3_forward(&w, &tobs, &tf, &none, &err);
    omp_set_num_threads(threads);
    ktest_check(rc == GK_OK, "nmmo3 over its observations: %d %s", rc, err.msg);
    ktest_check(memcmp(m.b, want, feat_bytes) == 0,
                "nmmo3: the features are not those of the observations as given");
    alias_unmap(&m);
    free(orig);
    free(want);
    for (int i = 0; i < 5; i++)
        ktensor_free(&k[i]);
}

int main(void)
{
    ktest_seed_init("test_aliased");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_forward_output_over_indices),
        cmocka_unit_test(test_embedding_backward_gradient_over_indices),
        cmocka_unit_test(test_multihot_output_over_observations),
        cmocka_unit_test(test_nmmo3_features_over_observations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
