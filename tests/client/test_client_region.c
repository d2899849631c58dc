/*
 * Shared-memory regions against a fake daemon that does what the real one
 * does with a RegionRegister: opens the named object, checks it, maps it.
 * Checked: the name's form and entropy, O_EXCL/0600 ownership, the size, that
 * both mappings share bytes, that the name is unlinked whether the daemon
 * accepts or refuses, and unregistering.
 */
#include <errno.h>
#include <fcntl.h>
#include <regex.h>
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

#include "fake_daemon.h"
#include "gpucd.h"

typedef struct region_state {
    char failed[256];
    bool refuse;            /* answer PERMISSION_DENIED, as a tcp:// daemon does */
    char names[4][256];     /* names registered, in order */
    int nnames;
    uint8_t *mapping;       /* the "daemon's" mapping of the last region */
    size_t size;
    uint64_t next_id;
    uint64_t unregistered[4];
    int nunregistered;
} region_state;

#define HCHECK(st, cond)                                                                    \
    do {                                                                                    \
        if (!(cond) && (st)->failed[0] == '\0')                                             \
            snprintf((st)->failed, sizeof (st)->failed, "line %d: %s", __LINE__, #cond);    \
    } while (0)

static fake_action region_handler(void *arg, const Gpucd__V1__Request *req,
                                  const uint8_t *payload, size_t payload_len, fake_reply *out)
{
    region_state *st = arg;
    (void)payload;
    (void)payload_len;
    if (req->op_case == GPUCD__V1__REQUEST__OP_REGION_UNREGISTER) {
        st->unregistered[st->nunregistered++] = req->region_unregister->region_id;
        if (req->region_unregister->region_id == 999)
            fake_reply_status(out, req, GPUCD__V1__STATUS__NOT_FOUND, "no region 999");
        else
            fake_reply_ok(out, req);
        return FAKE_REPLY;
    }
    HCHECK(st, req->op_case == GPUCD__V1__REQUEST__OP_REGION_REGISTER);
    if (req->op_case != GPUCD__V1__REQUEST__OP_REGION_REGISTER)
        return FAKE_DISCONNECT;
    const char *name = req->region_register->name;
    snprintf(st->names[st->nnames++], sizeof st->names[0], "%s", name);
    if (st->refuse) {
        fake_reply_status(out, req, GPUCD__V1__STATUS__PERMISSION_DENIED,
                          "regions need a local connection");
        return FAKE_REPLY;
    }
    int fd = shm_open(name, O_RDWR, 0);
    HCHECK(st, fd >= 0);
    if (fd < 0)
        return FAKE_DISCONNECT;
    struct stat sb;
    HCHECK(st, fstat(fd, &sb) == 0);
    HCHECK(st, (sb.st_mode & 0777) == 0600);
    HCHECK(st, sb.st_uid == getuid());
    HCHECK(st, (uint64_t)sb.st_size == req->region_register->size);
    st->size = req->region_register->size;
    st->mapping = mmap(NULL, st->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    HCHECK(st, st->mapping != MAP_FAILED);
    fake_reply_ok(out, req);
    out->reply.result_case = GPUCD__V1__REPLY__RESULT_REGION_ID;
    out->reply.region_id = ++st->next_id;
    return FAKE_REPLY;
}

static void assert_unlinked(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd >= 0) {
        close(fd);
        shm_unlink(name);
        fail_msg("%s still exists after region_create returned", name);
    }
    assert_int_equal(errno, ENOENT);
}

static void test_region_create_and_share(void **state)
{
    (void)state;
    region_state st;
    memset(&st, 0, sizeof st);
    fake_daemon fd;
    fake_daemon_start_with_regions(&fd, region_handler, &st);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);

    const size_t size = 3 * 4096 + 100; /* not a multiple of the page size */
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, size, &r), 0);
    if (st.failed[0])
        fail_msg("fake daemon: %s", st.failed);
    assert_int_equal(gpucd_region_size(r), size);
    assert_int_equal(gpucd_region_id(r), 1);
    assert_int_equal(st.size, size);

    /* "/gpucd-<pid>-<32 hex digits>" */
    char pattern[64];
    snprintf(pattern, sizeof pattern, "^/gpucd-%ld-[0-9a-f]{32}$", (long)getpid());
    regex_t re;
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    assert_int_equal(regexec(&re, st.names[0], 0, NULL, 0), 0);
    assert_unlinked(st.names[0]);

    /* bytes written by either side are seen by the other */
    uint8_t *data = gpucd_region_data(r);
    uint64_t x = (uint64_t)time(NULL) | 1;
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        data[i] = (uint8_t)x;
    }
    assert_memory_equal(st.mapping, data, size);
    for (size_t i = 0; i < size; i++)
        st.mapping[i] = (uint8_t)~st.mapping[i];
    assert_memory_equal(data, st.mapping, size);
    munmap(st.mapping, st.size);

    /* a second region gets a different name */
    gpucd_region *r2;
    assert_int_equal(gpucd_region_create(c, 64, &r2), 0);
    assert_int_equal(regexec(&re, st.names[1], 0, NULL, 0), 0);
    assert_string_not_equal(st.names[0], st.names[1]);
    assert_unlinked(st.names[1]);
    munmap(st.mapping, st.size);
    regfree(&re);

    assert_int_equal(gpucd_region_destroy(r2), 0);
    assert_int_equal(gpucd_region_destroy(r), 0);
    assert_int_equal(st.nunregistered, 2);
    assert_int_equal(st.unregistered[0], 2);
    assert_int_equal(st.unregistered[1], 1);
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

static void test_region_refused(void **state)
{
    (void)state;
    region_state st;
    memset(&st, 0, sizeof st);
    st.refuse = true;
    fake_daemon fd;
    fake_daemon_start_with_regions(&fd, region_handler, &st);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    gpucd_region *r = (gpucd_region *)&r;
    assert_int_equal(gpucd_region_create(c, 8192, &r), GPUCD_EPERMISSION_DENIED);
    assert_null(r);
    assert_string_equal(gpucd_errmsg(c), "regions need a local connection");
    assert_int_equal(st.nnames, 1);
    assert_unlinked(st.names[0]); /* nothing left behind */
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

static void test_region_bad_sizes(void **state)
{
    (void)state;
    region_state st;
    memset(&st, 0, sizeof st);
    fake_daemon fd;
    fake_daemon_start_with_regions(&fd, region_handler, &st);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, 0, &r), GPUCD_EINVAL);
    assert_int_equal(gpucd_region_create(c, SIZE_MAX, &r), GPUCD_EINVAL);
    assert_non_null(strstr(gpucd_errmsg(c), "outside 1..2^63-1"));
    assert_int_equal(fd.requests, 0);
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

static void test_region_unregister_refused(void **state)
{
    (void)state;
    region_state st;
    memset(&st, 0, sizeof st);
    st.next_id = 998; /* the region gets id 999, which the fake then does not know */
    fake_daemon fd;
    fake_daemon_start_with_regions(&fd, region_handler, &st);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, 4096, &r), 0);
    munmap(st.mapping, st.size);
    /* the daemon's error comes back, and the region is freed all the same (ASan checks) */
    assert_int_equal(gpucd_region_destroy(r), GPUCD_ENOT_FOUND);
    assert_string_equal(gpucd_errmsg(c), "no region 999");
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_region_create_and_share),
        cmocka_unit_test(test_region_refused),
        cmocka_unit_test(test_region_bad_sizes),
        cmocka_unit_test(test_region_unregister_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
