/*
 * Shared-memory regions against a fake daemon that does what the real one
 * does with a RegionRegister: takes the memfd its token names, checks it,
 * maps it.  Checked: the seals (no shrinking, growing or new seals), the
 * size, that both mappings share bytes, that the library keeps no
 * descriptor and names nothing in /dev/shm whether the daemon accepts or
 * refuses, and unregistering.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
    fake_daemon *daemon;    /* whose descriptor socket the memfds came over */
    int registered;         /* RegionRegisters seen */
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
    st->registered++;
    HCHECK(st, req->region_register->name == NULL || req->region_register->name[0] == '\0');
    int fd = fake_daemon_take_fd(st->daemon, req->region_register->token);
    HCHECK(st, fd >= 0);
    if (fd < 0)
        return FAKE_DISCONNECT;
    if (st->refuse) {
        close(fd);
        fake_reply_status(out, req, GPUCD__V1__STATUS__PERMISSION_DENIED,
                          "regions need a local connection");
        return FAKE_REPLY;
    }
    const int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    HCHECK(st, (fcntl(fd, F_GET_SEALS) & want) == want);
    struct stat sb;
    HCHECK(st, fstat(fd, &sb) == 0);
    HCHECK(st, S_ISREG(sb.st_mode));
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

/*
 * This process's descriptors of the library's memfds: none once region_create returns, accepted
 * or refused (the fake daemon closes what it takes before it answers).
 */
static int region_memfds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[300], link[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, link, sizeof link - 1);
        if (k <= 0)
            continue;
        link[k] = '\0';
        n += strncmp(link, "/memfd:gpucd-region", 19) == 0;
    }
    closedir(d);
    return n;
}

/* Entries of /dev/shm named for this process: region_create makes none. */
static int shm_names_of_mine(void)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "gpucd-%ld-", (long)getpid());
    DIR *d = opendir("/dev/shm");
    int n = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d != NULL)
        closedir(d);
    return n;
}

static void test_region_create_and_share(void **state)
{
    (void)state;
    region_state st;
    memset(&st, 0, sizeof st);
    fake_daemon fd;
    st.daemon = &fd;
    fake_daemon_start_with_regions(&fd, region_handler, &st);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);

    const size_t size = 3 * 4096 + 100; /* not a multiple of the page size */
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(c, size, &r), 0);
    assert_int_equal(region_memfds(), 0);
    assert_int_equal(shm_names_of_mine(), 0);
    if (st.failed[0])
        fail_msg("fake daemon: %s", st.failed);
    assert_int_equal(gpucd_region_size(r), size);
    assert_int_equal(gpucd_region_id(r), 1);
    assert_int_equal(st.size, size);

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

    /* a second region is another object */
    gpucd_region *r2;
    assert_int_equal(gpucd_region_create(c, 64, &r2), 0);
    if (st.failed[0])
        fail_msg("fake daemon: %s", st.failed);
    st.mapping[0] = 1;
    assert_int_not_equal(((uint8_t *)gpucd_region_data(r))[0], 0x5a);
    ((uint8_t *)gpucd_region_data(r))[0] = 0x5a;
    assert_int_equal(st.mapping[0], 1);
    munmap(st.mapping, st.size);

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
    st.daemon = &fd;
    fake_daemon_start_with_regions(&fd, region_handler, &st);
    gpucd_client *c;
    assert_int_equal(gpucd_connect(fd.url, NULL, &c), 0);
    gpucd_region *r = (gpucd_region *)&r;
    assert_int_equal(gpucd_region_create(c, 8192, &r), GPUCD_EPERMISSION_DENIED);
    assert_null(r);
    assert_string_equal(gpucd_errmsg(c), "regions need a local connection");
    assert_int_equal(st.registered, 1);
    assert_int_equal(region_memfds(), 0); /* nothing left behind */
    assert_int_equal(shm_names_of_mine(), 0);
    gpucd_close(c);
    fake_daemon_stop(&fd);
}

static void test_region_bad_sizes(void **state)
{
    (void)state;
    region_state st;
    memset(&st, 0, sizeof st);
    fake_daemon fd;
    st.daemon = &fd;
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
    st.daemon = &fd;
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
