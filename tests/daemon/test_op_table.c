/*
 * test_op_table.c - the operations table's check (ops/table.h): the daemon's
 * own table is whole, and a table with an operation's piece missing, an
 * operation left out or given twice, or two decoders for one wire case is
 * refused with a message naming the operation and the piece.  The backends
 * run this check when they open, so such a daemon does not start.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ops/table.h"

enum { MAX_FAMILIES = 16, MAX_OPS = 8 };

/* A copy of the daemon's families, each entry writable, to break one piece at a time. */
typedef struct table_copy {
    gcd_op_entry ops[MAX_FAMILIES][MAX_OPS];
    gcd_op_family fams[MAX_FAMILIES];
    const gcd_op_family *list[MAX_FAMILIES];
    int n;
} table_copy;

static void table_copy_init(table_copy *t)
{
    assert_true(gcd_op_nfamilies <= MAX_FAMILIES);
    t->n = gcd_op_nfamilies;
    for (int f = 0; f < t->n; f++) {
        const gcd_op_family *src = gcd_op_families[f];
        assert_true(src->nops <= MAX_OPS);
        memcpy(t->ops[f], src->ops, (size_t)src->nops * sizeof src->ops[0]);
        t->fams[f] = *src;
        t->fams[f].ops = t->ops[f];
        t->list[f] = &t->fams[f];
    }
}

/* The writable entry of kind in t. */
static gcd_op_entry *table_copy_entry(table_copy *t, gcd_op_kind kind)
{
    for (int f = 0; f < t->n; f++)
        for (int i = 0; i < t->fams[f].nops; i++)
            if (t->ops[f][i].kind == kind)
                return &t->ops[f][i];
    fail_msg("no entry of kind %d", (int)kind);
    return NULL;
}

/* Checks t expecting a refusal whose message holds each of the words. */
static void assert_refused(table_copy *t, int (*cuda_check)(const gcd_cuda_op *, const char **),
                           const char *word1, const char *word2)
{
    gk_err err = {{0}};
    assert_int_equal(gcd_op_table_check(t->list, t->n, cuda_check, &err), GK_EINVAL);
    if (strstr(err.msg, word1) == NULL || (word2 != NULL && strstr(err.msg, word2) == NULL))
        fail_msg("message \"%s\" lacks \"%s\" or \"%s\"", err.msg, word1,
                 word2 != NULL ? word2 : "");
}

static void test_daemon_table_is_whole(void **state)
{
    gk_err err = {{0}};
    assert_int_equal(gcd_op_table_check(gcd_op_families, gcd_op_nfamilies, NULL, &err), 0);
    for (int k = 0; k < GCD_OP_COUNT; k++) {
        const gcd_op_entry *e = gcd_op_entry_of((gcd_op_kind)k);
        assert_non_null(e);
        assert_int_equal(e->kind, k);
        assert_ptr_equal(gcd_op_desc_of((gcd_op_kind)k), &e->desc);
        for (int j = 0; j < k; j++)
            assert_string_not_equal(gcd_op_name((gcd_op_kind)j), gcd_op_name((gcd_op_kind)k));
    }
    assert_null(gcd_op_entry_of(GCD_OP_COUNT));
    assert_string_equal(gcd_op_name(GCD_OP_COUNT), "invalid");
}

/* A wire case decodes through its first operation's entry, which picks the kind. */
static void test_wire_cases_find_their_first_entry(void **state)
{
    assert_ptr_equal(gcd_op_entry_of_wire(GPUCD__V1__REQUEST__OP_NMMO3_ENCODE),
                     gcd_op_entry_of(GCD_OP_NMMO3_FORWARD));
    assert_int_equal(gcd_op_wire(GCD_OP_NMMO3_BACKWARD), GPUCD__V1__REQUEST__OP_NMMO3_ENCODE);
    assert_ptr_equal(gcd_op_entry_of_wire(GPUCD__V1__REQUEST__OP_CONV2D_BACKWARD),
                     gcd_op_entry_of(GCD_OP_CONV2D_BACKWARD));
    for (int k = 0; k < GCD_OP_COUNT; k++) {
        const gcd_op_entry *e = gcd_op_entry_of_wire(gcd_op_wire((gcd_op_kind)k));
        assert_non_null(e);
        assert_int_equal(gcd_op_wire(e->kind), gcd_op_wire((gcd_op_kind)k));
        assert_true((int)e->kind <= k);
    }
    assert_null(gcd_op_entry_of_wire(GPUCD__V1__REQUEST__OP_HELLO));
    assert_null(gcd_op_entry_of_wire(GPUCD__V1__REQUEST__OP__NOT_SET));
    assert_int_equal(gcd_op_wire(GCD_OP_COUNT), GPUCD__V1__REQUEST__OP__NOT_SET);
}

static void test_missing_cpu_run_is_refused(void **state)
{
    table_copy t;
    table_copy_init(&t);
    table_copy_entry(&t, GCD_OP_EMBEDDING_FORWARD)->cpu_run = NULL;
    assert_refused(&t, NULL, "embedding_forward", "cpu_run");
}

static void test_missing_check_or_decode_is_refused(void **state)
{
    table_copy t;
    table_copy_init(&t);
    table_copy_entry(&t, GCD_OP_CONV2D_BACKWARD)->check = NULL;
    assert_refused(&t, NULL, "conv2d_backward", "check");
    table_copy_init(&t);
    table_copy_entry(&t, GCD_OP_LINEAR_CROSS_ENTROPY)->decode = NULL;
    assert_refused(&t, NULL, "linear_cross_entropy", "decode");
}

static void test_bad_slots_are_refused(void **state)
{
    table_copy t;
    table_copy_init(&t);
    gcd_op_entry *e = table_copy_entry(&t, GCD_OP_EMBEDDING_BACKWARD);
    e->desc.required |= GCD_SLOT(e->desc.nargs); /* a slot it does not have */
    assert_refused(&t, NULL, "embedding_backward", "masks");
    table_copy_init(&t);
    table_copy_entry(&t, GCD_OP_NMMO3_FORWARD)->output_shape = NULL; /* implied kept */
    assert_refused(&t, NULL, "nmmo3_encode", "output_shape");
    table_copy_init(&t);
    table_copy_entry(&t, GCD_OP_MULTIHOT_ENCODE)->desc.outputs |= GCD_SLOT(0);
    assert_refused(&t, NULL, "multihot_encode", "an input in slot 0");
}

static void test_bad_batching_is_refused(void **state)
{
    table_copy t;
    table_copy_init(&t);
    gcd_op_entry *e = table_copy_entry(&t, GCD_OP_NMMO3_FORWARD);
    e->batch.shared |= e->batch.rows & -e->batch.rows; /* a slot both shared and batch-major */
    assert_refused(&t, NULL, "nmmo3_encode", "batching masks");
    table_copy_init(&t);
    table_copy_entry(&t, GCD_OP_CONV2D_FORWARD)->batch.alone = GCD_SLOT(2); /* b, without rows */
    assert_refused(&t, NULL, "conv2d_forward", "batching masks");
    table_copy_init(&t);
    e = table_copy_entry(&t, GCD_OP_NMMO3_FORWARD);
    e->batch.rows &= e->batch.rows - 1; /* without obs: rows counted from an output */
    assert_refused(&t, NULL, "nmmo3_encode", "a required input first among its batching rows");
    table_copy_init(&t);
    table_copy_entry(&t, GCD_OP_CONV2D_FORWARD)->batch.rows = GCD_SLOT(2); /* b, optional */
    assert_refused(&t, NULL, "conv2d_forward", "a required input first");
}

static void test_operation_left_out_is_refused(void **state)
{
    table_copy t;
    table_copy_init(&t);
    /* Drop the family of the last kind: its operations have no entry. */
    for (int f = 0; f < t.n; f++)
        if (t.fams[f].ops[0].kind == GCD_OP_NMMO3_FORWARD)
            t.list[f] = t.list[--t.n];
    assert_refused(&t, NULL, "no entry", NULL);
}

static void test_operation_twice_is_refused(void **state)
{
    table_copy t;
    table_copy_init(&t);
    t.list[t.n++] = t.list[0];
    assert_refused(&t, NULL, "two entries", NULL);
}

static gcd_status other_decode(const Gpucd__V1__Request *req, gcd_op *op,
                               const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                               size_t whylen)
{
    return GCD_INVALID_ARGUMENT;
}

static void test_one_wire_case_two_decoders_is_refused(void **state)
{
    table_copy t;
    table_copy_init(&t);
    table_copy_entry(&t, GCD_OP_NMMO3_BACKWARD)->decode = other_decode;
    assert_refused(&t, NULL, "share a wire case", NULL);
}

/* A backend's adapter check that finds the enqueue missing. */
static int cuda_check_no_enqueue(const gcd_cuda_op *op, const char **missing)
{
    *missing = "its CUDA enqueue";
    return -1;
}

static int cuda_check_whole(const gcd_cuda_op *op, const char **missing) { return 0; }

static void test_cuda_adapter_is_required_with_the_cuda_backend(void **state)
{
    static const int stand_in = 0; /* the check only asks whether there is an adapter */
    table_copy t;
    table_copy_init(&t);
    for (int f = 0; f < t.n; f++)
        for (int i = 0; i < t.fams[f].nops; i++)
            t.ops[f][i].cuda = (const gcd_cuda_op *)(const void *)&stand_in;
    gk_err err = {{0}};
    assert_int_equal(gcd_op_table_check(t.list, t.n, cuda_check_whole, &err), 0);
    table_copy_entry(&t, GCD_OP_LINEAR_CROSS_ENTROPY)->cuda = NULL;
    assert_refused(&t, cuda_check_whole, "linear_cross_entropy", "a CUDA adapter");
    /* Without the CUDA backend no adapter is needed. */
    assert_int_equal(gcd_op_table_check(t.list, t.n, NULL, &err), 0);
    table_copy_entry(&t, GCD_OP_LINEAR_CROSS_ENTROPY)->cuda =
        (const gcd_cuda_op *)(const void *)&stand_in;
    assert_refused(&t, cuda_check_no_enqueue, "conv2d_forward", "its CUDA enqueue");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_daemon_table_is_whole),
        cmocka_unit_test(test_wire_cases_find_their_first_entry),
        cmocka_unit_test(test_missing_cpu_run_is_refused),
        cmocka_unit_test(test_missing_check_or_decode_is_refused),
        cmocka_unit_test(test_bad_slots_are_refused),
        cmocka_unit_test(test_bad_batching_is_refused),
        cmocka_unit_test(test_operation_left_out_is_refused),
        cmocka_unit_test(test_operation_twice_is_refused),
        cmocka_unit_test(test_one_wire_case_two_decoders_is_refused),
        cmocka_unit_test(test_cuda_adapter_is_required_with_the_cuda_backend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
