/*
 * test_multihot.c - gk_cpu_multihot_encode against an independent reference,
 * for random layouts and the NMMO3 preset, f32 and bf16 outputs; a worked
 * case; out-of-range values rejected naming agent, tile and feature, with the
 * output left untouched.
 */
#include "ktest.h"

/* 1.0 where some feature f has offsets[f] + value == c, else 0: a search, not a scatter. */
static double ref_pixel(const gk_multihot_layout *l, const uint8_t *row, int64_t c, int64_t h,
                        int64_t w)
{
    for (int f = 0; f < l->nfeat; f++) {
        uint8_t v = row[l->obs_offset + (h * l->width + w) * l->nfeat + f];
        if (c == l->offsets[f] + (int64_t)v)
            return 1.0;
    }
    return 0.0;
}

static void fill_obs(const gk_multihot_layout *l, uint8_t *obs, int64_t b, int64_t row)
{
    for (int64_t i = 0; i < b * row; i++) /* bytes outside the map are arbitrary */
        obs[i] = (uint8_t)ktest_int(0, 255);
    for (int64_t n = 0; n < b; n++)
        for (int64_t t = 0; t < (int64_t)l->height * l->width; t++)
            for (int f = 0; f < l->nfeat; f++)
                obs[n * row + l->obs_offset + t * l->nfeat + f] =
                    (uint8_t)ktest_int(0, l->slots[f] - 1);
}

static void check_layout(const gk_multihot_layout *l, int64_t b, int64_t row, gk_dtype dt)
{
    uint8_t *obs = malloc((size_t)(b * row));
    fill_obs(l, obs, b, row);
    const int64_t os[2] = {b, row}, outs[4] = {b, l->channels, l->height, l->width};
    gk_tensor tobs = gk_tensor_make(obs, GK_U8, 2, os);
    ktensor out = ktensor_new(dt, 4, outs);
    ktensor_poison(&out);
    gk_err err = {{0}};
    int rc = gk_cpu_multihot_encode(l, &tobs, &out.t, &err);
    ktest_check(rc == GK_OK, "multihot failed: %s", err.msg);
    int64_t i = 0, ones = 0;
    for (int64_t n = 0; n < b; n++)
        for (int64_t c = 0; c < l->channels; c++)
            for (int64_t h = 0; h < l->height; h++)
                for (int64_t w = 0; w < l->width; w++, i++) {
                    double want = ref_pixel(l, obs + n * row, c, h, w), got = ktensor_get(&out, i);
                    ktest_check(got == want, "agent %lld c %lld h %lld w %lld: %g, want %g",
                                (long long)n, (long long)c, (long long)h, (long long)w, got, want);
                    ones += got == 1.0;
                }
    ktest_check(ones == b * l->height * l->width * l->nfeat, "%lld ones", (long long)ones);
    free(obs);
    ktensor_free(&out);
}

static gk_multihot_layout random_layout(void)
{
    gk_multihot_layout l = {.height = (int)ktest_int(1, 9), .width = (int)ktest_int(1, 9),
                            .nfeat = (int)ktest_int(1, 12), .obs_offset = (int)ktest_int(0, 20)};
    /* Features in a shuffled order along the channels, with gaps between some. */
    int order[GK_MULTIHOT_MAX_FEATURES];
    for (int f = 0; f < l.nfeat; f++)
        order[f] = f;
    for (int f = l.nfeat - 1; f > 0; f--) {
        int g = (int)ktest_int(0, f), t = order[f];
        order[f] = order[g], order[g] = t;
    }
    int ch = 0;
    for (int q = 0; q < l.nfeat; q++) {
        int f = order[q];
        ch += (int)ktest_int(0, 2);
        l.slots[f] = (int)ktest_int(1, q == 0 ? 256 : 9);
        l.offsets[f] = ch;
        ch += l.slots[f];
    }
    l.channels = ch + (int)ktest_int(0, 3);
    return l;
}

static void test_multihot_random_layouts(void **state)
{
    for (int t = 0; t < 20; t++) {
        gk_multihot_layout l = random_layout();
        gk_err err;
        assert_int_equal(gk_multihot_layout_check(&l, &err), GK_OK);
        int64_t need = l.obs_offset + (int64_t)l.height * l.width * l.nfeat;
        check_layout(&l, ktest_int(1, 5), need + ktest_int(0, 7), t % 2 ? GK_BF16 : GK_F32);
    }
}

static void test_multihot_nmmo3(void **state)
{
    const gk_multihot_layout *l = &gk_nmmo3_layout;
    static const int factors[10] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
    gk_err err;
    assert_int_equal(gk_multihot_layout_check(l, &err), GK_OK);
    assert_int_equal(l->height, 11);
    assert_int_equal(l->width, 15);
    assert_int_equal(l->nfeat, 10);
    assert_int_equal(l->channels, 59);
    assert_int_equal(l->obs_offset, 0);
    int off = 0; /* the offsets are the running sums of the factors */
    for (int f = 0; f < 10; f++) {
        assert_int_equal(l->slots[f], factors[f]);
        assert_int_equal(l->offsets[f], off);
        off += factors[f];
    }
    check_layout(l, 1, GK_NMMO3_OBS_BYTES, GK_F32);
    check_layout(l, 7, GK_NMMO3_OBS_BYTES, GK_BF16);
}

/* Map 1x2, features of 2 and 3 slots at channels 3.. and 0..: worked by hand. */
static void test_multihot_hand_worked(void **state)
{
    gk_multihot_layout l = {.height = 1, .width = 2, .nfeat = 2, .obs_offset = 1, .channels = 6,
                            .slots = {2, 3}, .offsets = {3, 0}};
    uint8_t obs[5] = {99, 1, 2, 0, 0}; /* byte 0 skipped by obs_offset */
    float out[12];
    const int64_t os[2] = {1, 5}, outs[4] = {1, 6, 1, 2};
    gk_tensor tobs = gk_tensor_make(obs, GK_U8, 2, os), tout = gk_tensor_make(out, GK_F32, 4, outs);
    gk_err err;
    assert_int_equal(gk_cpu_multihot_encode(&l, &tobs, &tout, &err), GK_OK);
    /* tile 0: feature 0 = 1 -> channel 4, feature 1 = 2 -> channel 2; tile 1: channels 3 and 0 */
    const float want[12] = {0, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0};
    for (int i = 0; i < 12; i++)
        assert_true(out[i] == want[i]);
}

static void test_multihot_out_of_range(void **state)
{
    const gk_multihot_layout *l = &gk_nmmo3_layout;
    const int64_t b = 6;
    uint8_t *obs = malloc((size_t)(b * GK_NMMO3_OBS_BYTES));
    const int64_t os[2] = {b, GK_NMMO3_OBS_BYTES}, outs[4] = {b, 59, 11, 15};
    gk_tensor tobs = gk_tensor_make(obs, GK_U8, 2, os);
    ktensor out = ktensor_new(GK_F32, 4, outs);
    for (int t = 0; t < 10; t++) {
        fill_obs(l, obs, b, GK_NMMO3_OBS_BYTES);
        int64_t n = ktest_int(0, b - 1), h = ktest_int(0, 10), w = ktest_int(0, 14);
        int f = (int)ktest_int(0, 9);
        obs[n * GK_NMMO3_OBS_BYTES + (h * 15 + w) * 10 + f] =
            (uint8_t)(t % 2 ? 255 : l->slots[f]); /* the first value past the slots, and the last */
        ktensor_poison(&out);
        gk_err err = {{0}};
        assert_int_equal(gk_cpu_multihot_encode(l, &tobs, &out.t, &err), GK_ERANGE);
        char want[128];
        snprintf(want, sizeof want, "agent %lld, tile (h %lld, w %lld), feature %d", (long long)n,
                 (long long)h, (long long)w, f);
        ktest_check(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
        for (int64_t i = 0; i < out.n; i++)
            ktest_check(isnan(ktensor_get(&out, i)), "output written at %lld on failure",
                        (long long)i);
    }
    free(obs);
    ktensor_free(&out);
}

int main(void)
{
    ktest_seed_init("kernels_multihot");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multihot_hand_worked),
        cmocka_unit_test(test_multihot_nmmo3),
        cmocka_unit_test(test_multihot_random_layouts),
        cmocka_unit_test(test_multihot_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
