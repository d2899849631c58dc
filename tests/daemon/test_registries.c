/* test_registries.c - regions and resident tensors: ownership, references, limits. */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ids.h"
#include "region.h"
#include "resident.h"

static gcd_backend *cpu;

/* why with id's decimal digits replaced by '#': refusals of different ids compared. */
static void refusal_text(const char *why, uint64_t id, char out[256])
{
    char digits[24];
    snprintf(digits, sizeof digits, "%llu", (unsigned long long)id);
    const char *at = strstr(why, digits);
    if (at == NULL)
        snprintf(out, 256, "%s", why);
    else
        snprintf(out, 256, "%.*s#%s", (int)(at - why), why, at + strlen(digits));
}

/* The refusal of `id` (someone else's) reads as that of `missing` (never made). */
static void assert_same_refusal(const char *why, uint64_t id, const char *why_missing,
                                uint64_t missing)
{
    char a[256], b[256];
    refusal_text(why, id, a);
    refusal_text(why_missing, missing, b);
    assert_string_equal(a, b);
}

/* A sealed memfd of size bytes, as fdpass.c hands them to the registry. */
static int memfd_make(size_t size)
{
    int fd = memfd_create("regtest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    return fd;
}

typedef struct unregister_call {
    gcd_regions *rs;
    uint64_t id;
    volatile int done;
} unregister_call;

static void *unregister_thread(void *arg)
{
    unregister_call *u = arg;
    char why[256];
    assert_int_equal(gcd_regions_unregister(u->rs, 1, u->id, why, sizeof why), GCD_OK);
    u->done = 1;
    return NULL;
}

static void test_regions(void **state)
{
    gcd_regions *rs;
    assert_int_equal(gcd_regions_init(&rs, cpu, &gcd_backend_cpu), 0);
    char why[256];
    int fd = memfd_make(8192);
    uint64_t id, again;
    assert_int_equal(gcd_regions_register(rs, 1, fd, 8192, &id, why, sizeof why), GCD_OK);
    /* One object is one region, whoever registers it again. */
    assert_int_equal(gcd_regions_register(rs, 2, fd, 8192, &again, why, sizeof why),
                     GCD_INVALID_ARGUMENT);
    assert_non_null(strstr(why, "registered already"));
    assert_int_equal(gcd_regions_has_object(rs, 0, 0, &again), 0);
    close(fd); /* the registry keeps its own mapping */

    /* Another connection's region reads as one never made: no prober learns which exist. */
    gcd_region *r;
    char why_missing[256];
    assert_int_equal(gcd_regions_acquire(rs, 2, id, &r, why, sizeof why), GCD_NOT_FOUND);
    assert_int_equal(gcd_regions_acquire(rs, 1, id + 100, &r, why_missing, sizeof why_missing),
                     GCD_NOT_FOUND);
    assert_same_refusal(why, id, why_missing, id + 100);
    assert_int_equal(gcd_regions_unregister(rs, 2, id, why, sizeof why), GCD_NOT_FOUND);
    assert_same_refusal(why, id, why_missing, id + 100);
    assert_int_equal(gcd_regions_acquire(rs, 1, id, &r, why, sizeof why), GCD_OK);
    r->base[8191] = 42; /* the whole mapping is usable */

    gcd_region_summary list[4];
    assert_int_equal(gcd_regions_list(rs, 1, list, 4), 1);
    assert_int_equal(list[0].users, 1);
    assert_int_equal(gcd_regions_list(rs, 2, list, 4), 0);

    /* Unregistering waits for the request holding it. */
    unregister_call u = {.rs = rs, .id = id};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, unregister_thread, &u), 0);
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    assert_false(u.done);
    assert_int_equal(r->base[8191], 42);
    gcd_regions_release(rs, r);
    pthread_join(t, NULL);
    assert_true(u.done);
    uint64_t count, bytes;
    gcd_regions_totals(rs, &count, &bytes);
    assert_int_equal(count, 0);
    assert_int_equal(bytes, 0);

    /* A departed client's regions go; one still in use goes with its last reference. */
    fd = memfd_make(4096);
    assert_int_equal(gcd_regions_register(rs, 3, fd, 4096, &id, why, sizeof why), GCD_OK);
    close(fd);
    assert_int_equal(gcd_regions_acquire(rs, 3, id, &r, why, sizeof why), GCD_OK);
    gcd_regions_drop_owner(rs, 3);
    assert_int_equal(gcd_regions_list(rs, 3, list, 4), 0);
    gcd_regions_totals(rs, &count, &bytes);
    assert_int_equal(count, 1);
    r->base[0] = 1; /* still mapped */
    gcd_regions_release(rs, r);
    gcd_regions_totals(rs, &count, &bytes);
    assert_int_equal(count, 0);
    gcd_regions_fini(rs);
}

static void test_residents(void **state)
{
    gcd_residents *rs;
    assert_int_equal(gcd_residents_init(&rs, cpu, &gcd_backend_cpu, 1 << 20), 0);
    char why[256];
    gk_tensor shape = gk_tensor_make(NULL, GK_F32, 2, (const int64_t[]){128, 256});
    gcd_resident *a;
    assert_int_equal(gcd_residents_create(rs, 1, 1000, &shape, &a, why, sizeof why), GCD_OK);
    uint64_t id = a->id;
    memset(a->t.data, 1, a->bytes);
    gcd_residents_release(rs, a);

    gcd_resident *b;
    /* Same uid on another local connection: shared (workers sharing weights). */
    assert_int_equal(gcd_residents_acquire(rs, 2, 1000, id, 0, &b, why, sizeof why), GCD_OK);
    gcd_residents_release(rs, b);
    /* ... for reading: only the connection that made it writes it. */
    assert_int_equal(gcd_residents_acquire(rs, 2, 1000, id, 1, &b, why, sizeof why),
                     GCD_PERMISSION_DENIED);
    assert_non_null(strstr(why, "only the connection that made it"));
    assert_int_equal(gcd_residents_acquire(rs, 1, 1000, id, 1, &b, why, sizeof why), GCD_OK);
    gcd_residents_release(rs, b);
    /* Another uid, or a remote peer: not theirs, and to them it reads as one never made. */
    char why_missing[256];
    assert_int_equal(gcd_residents_acquire(rs, 3, 1001, id + 100, 0, &b, why_missing,
                                           sizeof why_missing),
                     GCD_NOT_FOUND);
    assert_int_equal(gcd_residents_acquire(rs, 3, 1001, id, 0, &b, why, sizeof why), GCD_NOT_FOUND);
    assert_same_refusal(why, id, why_missing, id + 100);
    assert_int_equal(gcd_residents_acquire(rs, 4, GCD_UID_REMOTE, id, 0, &b, why, sizeof why),
                     GCD_NOT_FOUND);
    assert_same_refusal(why, id, why_missing, id + 100);
    assert_int_equal(gcd_residents_free(rs, 3, 1001, id, why, sizeof why), GCD_NOT_FOUND);
    assert_same_refusal(why, id, why_missing, id + 100);
    /* Only the owner frees it; a connection of its uid, which may use it, is told so. */
    assert_int_equal(gcd_residents_free(rs, 2, 1000, id, why, sizeof why),
                     GCD_PERMISSION_DENIED);
    assert_non_null(strstr(why, "only the connection that made it"));

    /* The limit holds across tensors: 128 KiB used of 1 MiB, so 1 MiB more does not fit. */
    gk_tensor big = gk_tensor_make(NULL, GK_F32, 1, (const int64_t[]){1 << 18});
    assert_int_equal(gcd_residents_create(rs, 1, 1000, &big, &b, why, sizeof why),
                     GCD_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(why, "limit"));

    /* Freed while in use: the storage stays until the last user lets go. */
    assert_int_equal(gcd_residents_acquire(rs, 1, 1000, id, 0, &b, why, sizeof why), GCD_OK);
    assert_int_equal(gcd_residents_free(rs, 1, 1000, id, why, sizeof why), GCD_OK);
    assert_int_equal(gcd_residents_acquire(rs, 1, 1000, id, 0, &a, why, sizeof why), GCD_NOT_FOUND);
    uint64_t count, bytes;
    gcd_residents_totals(rs, &count, &bytes);
    assert_int_equal(count, 1);
    assert_int_equal(((unsigned char *)b->t.data)[b->bytes - 1], 1);
    gcd_residents_release(rs, b);
    gcd_residents_totals(rs, &count, &bytes);
    assert_int_equal(count, 0);
    assert_int_equal(bytes, 0);

    /* A departed client's tensors go. */
    assert_int_equal(gcd_residents_create(rs, 7, 1000, &shape, &a, why, sizeof why), GCD_OK);
    gcd_residents_release(rs, a);
    gcd_residents_drop_owner(rs, 7);
    gcd_residents_totals(rs, &count, &bytes);
    assert_int_equal(count, 0);
    gcd_residents_fini(rs);
}

/* Ids carry a per-registry random epoch: two daemons' ids differ (but for a 2^-32 chance). */
static void test_ids_differ_between_registries(void **state)
{
    (void)state;
    gcd_regions *ra, *rb;
    assert_int_equal(gcd_regions_init(&ra, cpu, &gcd_backend_cpu), 0);
    assert_int_equal(gcd_regions_init(&rb, cpu, &gcd_backend_cpu), 0);
    char why[256];
    uint64_t ida, idb;
    int fa = memfd_make(4096), fb = memfd_make(4096);
    assert_int_equal(gcd_regions_register(ra, 1, fa, 4096, &ida, why, sizeof why), GCD_OK);
    assert_int_equal(gcd_regions_register(rb, 1, fb, 4096, &idb, why, sizeof why), GCD_OK);
    close(fa);
    close(fb);
    assert_true(ida != idb);
    gcd_region *r;
    assert_int_equal(gcd_regions_acquire(rb, 1, ida, &r, why, sizeof why), GCD_NOT_FOUND);
    gcd_regions_fini(ra);
    gcd_regions_fini(rb);

    gcd_residents *ta, *tb;
    assert_int_equal(gcd_residents_init(&ta, cpu, &gcd_backend_cpu, 1 << 20), 0);
    assert_int_equal(gcd_residents_init(&tb, cpu, &gcd_backend_cpu, 1 << 20), 0);
    gk_tensor shape = gk_tensor_make(NULL, GK_F32, 1, (const int64_t[]){16});
    gcd_resident *a, *b;
    assert_int_equal(gcd_residents_create(ta, 1, 1000, &shape, &a, why, sizeof why), GCD_OK);
    assert_int_equal(gcd_residents_create(tb, 1, 1000, &shape, &b, why, sizeof why), GCD_OK);
    assert_true(a->id != b->id);
    gcd_residents_release(ta, a);
    gcd_residents_release(tb, b);
    assert_int_equal(gcd_residents_acquire(tb, 1, 1000, a->id, 0, &b, why, sizeof why),
                     GCD_NOT_FOUND);
    gcd_residents_fini(ta);
    gcd_residents_fini(tb);
}

/* The counter stops before it would wrap into the epoch. */
static void test_ids_never_wrap(void **state)
{
    (void)state;
    gcd_ids ids;
    assert_int_equal(gcd_ids_init(&ids), 0);
    uint64_t id;
    assert_int_equal(gcd_ids_next(&ids, &id), 0);
    assert_true(id == (ids.epoch | 1));
    ids.next = GCD_IDS_COUNTER_MAX;
    assert_int_equal(gcd_ids_next(&ids, &id), 0);
    assert_true(id == (ids.epoch | GCD_IDS_COUNTER_MAX));
    assert_int_equal(gcd_ids_next(&ids, &id), -1);
    assert_int_equal(gcd_ids_next(&ids, &id), -1);
}

int main(void)
{
    gcd_config cfg;
    gcd_config_defaults(&cfg);
    gk_err err;
    if (gcd_backend_cpu.open(&cfg, &cpu, &err) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regions),
        cmocka_unit_test(test_residents),
        cmocka_unit_test(test_ids_differ_between_registries),
        cmocka_unit_test(test_ids_never_wrap),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gcd_backend_cpu.close(cpu);
    return rc;
}
