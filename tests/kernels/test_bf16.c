/*
 * test_bf16.c - bf16 rounding as the kernels do it (gk_bf16.h): nearest,
 * ties to even, NaN kept quiet, overflow to infinity; and the CPU kernels'
 * bf16 outputs rounded exactly that way (ties of a convolution's sum).
 */
#include "ktest.h"

static float f32_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Nearest-even rounding written out with doubles: the two bf16 neighbours, then the choice. */
static uint16_t bf16_by_hand(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* truncated and next (same sign) */
    double dl = fabs((double)f - (double)gk_bf16_to_f32(lo));
    /* Past the largest finite bf16 the next neighbour is 2^128, as if the exponent went on. */
    double vh = (hi & 0x7fffu) == 0x7f80u ? copysign(0x1p128, (double)f) : gk_bf16_to_f32(hi);
    double dh = fabs(vh - (double)f);
    if ((u & 0xffffu) == 0)
        return lo;
    if (dl < dh)
        return lo;
    if (dh < dl)
        return hi;
    return (lo & 1u) ? hi : lo;
}

static void test_bf16_rounding(void **state)
{
    /* Exact values survive. */
    assert_int_equal(gk_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(gk_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(gk_f32_to_bf16(0.0f), 0x0000);
    assert_int_equal(gk_f32_to_bf16(-0.0f), 0x8000);
    /* Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even 1.0. */
    assert_int_equal(gk_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3*2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up. */
    assert_int_equal(gk_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    /* Just above a tie rounds up, just below rounds down. */
    assert_int_equal(gk_f32_to_bf16(f32_bits(0x3f808001u)), 0x3f81);
    assert_int_equal(gk_f32_to_bf16(f32_bits(0x3f807fffu)), 0x3f80);
    /* Negative ties mirror positive ones. */
    assert_int_equal(gk_f32_to_bf16(-(1.0f + 0x1p-8f)), 0xbf80);
    assert_int_equal(gk_f32_to_bf16(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
    /* The largest finite float rounds to infinity; infinities stay. */
    assert_int_equal(gk_f32_to_bf16(f32_bits(0x7f7fffffu)), 0x7f80);
    assert_int_equal(gk_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(gk_f32_to_bf16(-INFINITY), 0xff80);
    /* NaN stays NaN (quiet), sign kept, even with a payload only in the low bits. */
    uint16_t n = gk_f32_to_bf16(NAN);
    assert_true(isnan(gk_bf16_to_f32(n)));
    assert_true((n & 0x0040u) != 0);
    n = gk_f32_to_bf16(f32_bits(0xff800001u)); /* signalling NaN, payload below bit 16 */
    assert_true(isnan(gk_bf16_to_f32(n)));
    assert_int_equal(n & 0x8000u, 0x8000u);
    /* Subnormals round like everything else. */
    assert_int_equal(gk_f32_to_bf16(f32_bits(0x00008000u)), 0x0000); /* tie to even 0 */
    assert_int_equal(gk_f32_to_bf16(f32_bits(0x00018000u)), 0x0002); /* tie to even 2 */
}

static void test_bf16_random_against_hand(void **state)
{
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)ktest_u64();
        if ((u & 0x7f800000u) == 0x7f800000u)
            continue; /* infinities and NaN are covered above */
        float f = f32_bits(u);
        uint16_t want = bf16_by_hand(f);
        if ((want & 0x7f80u) == 0x7f80u)
            want = (uint16_t)((want & 0x8000u) | 0x7f80u); /* rounded past the largest: infinity */
        ktest_check(gk_f32_to_bf16(f) == want, "0x%08x -> 0x%04x, want 0x%04x", u,
                    gk_f32_to_bf16(f), want);
    }
}

/*
 * A 1x1 convolution y = x*1 + b with bf16 tensors: the f32 sum x + b is a
 * tie in bf16, and the stored y must be the even neighbour.
 */
static void test_bf16_kernel_ties(void **state)
{
    const float xs[4] = {1.0f, 1.0f + 0x1p-7f, -1.0f, 256.0f};
    const float bs = 0x1p-8f; /* half a bf16 step at 1.0 */
    uint16_t x[4], w = gk_f32_to_bf16(1.0f), b = gk_f32_to_bf16(bs), y[4], out[4];
    for (int i = 0; i < 4; i++)
        x[i] = gk_f32_to_bf16(xs[i]);
    const int64_t xshape[4] = {4, 1, 1, 1}, wshape[4] = {1, 1, 1, 1}, bshape[1] = {1};
    gk_tensor tx = gk_tensor_make(x, GK_BF16, 4, xshape), tw = gk_tensor_make(&w, GK_BF16, 4, wshape),
              tb = gk_tensor_make(&b, GK_BF16, 1, bshape), ty = gk_tensor_make(y, GK_BF16, 4, xshape);
    gk_conv2d p = {.stride_h = 1, .stride_w = 1};
    gk_err err;
    assert_int_equal(gk_cpu_conv2d_forward(&p, &tx, &tw, &tb, &ty, &err), GK_OK);
    out[0] = 0x3f80; /* 1 + 2^-8: tie, to even 1.0 */
    out[1] = 0x3f82; /* 1 + 3*2^-8: tie, to even 1 + 2^-6 */
    out[2] = 0xbf7f; /* -1 + 2^-8 = -(1 - 2^-8): exact in bf16 (spacing 2^-8 below 1) */
    out[3] = 0x4380; /* 256 + 2^-8: far below half a step, 256 */
    for (int i = 0; i < 4; i++)
        ktest_check(y[i] == out[i], "y[%d] = 0x%04x, want 0x%04x", i, y[i], out[i]);

    /* NaN in, NaN out. */
    x[0] = gk_f32_to_bf16(NAN);
    assert_int_equal(gk_cpu_conv2d_forward(&p, &tx, &tw, &tb, &ty, &err), GK_OK);
    assert_true(isnan(gk_bf16_to_f32(y[0])));
}

int main(void)
{
    ktest_seed_init("kernels_bf16");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_bf16_random_against_hand),
        cmocka_unit_test(test_bf16_kernel_ties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
