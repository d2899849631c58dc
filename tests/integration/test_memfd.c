/*
 * test_memfd.c - regions and the wake page are sealed memfds passed over the
 * descriptor socket (proto/fdpass_wire.h): nobody can resize one under the daemon
 * (which would end it with SIGBUS), every hostile descriptor message is
 * refused with a clear answer and its descriptors closed, one object cannot
 * be two regions, tokens are claimed once and expire, and killed clients and
 * daemons leave nothing in /dev/shm.  After each hostile step a library
 * client's real call must still succeed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fdpass_wire.h"
#include "harness.h"
#include "multihot_calls.h"
#include "raw.h"
#include "submit_queue.h"

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void expect(Gpucd__V1__Reply *rep, Gpucd__V1__Status status, const char *needle)
{
    if (rep == NULL)
        fail_msg("no reply (expected %d with '%s'): the daemon is gone", (int)status, needle);
    if ((Gpucd__V1__Status)rep->status != status || rep->message == NULL ||
        strstr(rep->message, needle) == NULL)
        fail_msg("got status %d '%s', expected %d with '%s'", (int)rep->status,
                 rep->message ? rep->message : "", (int)status, needle);
    gpucd__v1__reply__free_unpacked(rep, NULL);
}

/* A well-behaved library client's real call: the daemon serves on. */
static void expect_served(const char *url)
{
    gpucd_client *c = th_mh_connect(url, 0, 20000);
    gpucd_region *r;
    if (gpucd_region_create(c, th_mh_slice_bytes(), &r) != 0)
        fail_msg("a well-behaved client's region: %s", gpucd_errmsg(c));
    th_mh_encode_and_check(c, r, 0);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(c);
}

/* conv2d_forward x (1,1,4,4) -> y (1,1,2,2) with w (1,1,3,3), all in region id. */
static Gpucd__V1__Reply *conv_in(th_raw *raw, uint64_t id)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Conv2dForward op = GPUCD__V1__CONV2D_FORWARD__INIT;
    Gpucd__V1__Conv2dParams params = GPUCD__V1__CONV2D_PARAMS__INIT;
    params.stride_h = params.stride_w = 1;
    op.params = &params;
    Gpucd__V1__TensorRef t[3];
    Gpucd__V1__RegionSlice s[3];
    int64_t shapes[3][4] = {{1, 1, 4, 4}, {1, 1, 3, 3}, {1, 1, 2, 2}};
    for (int i = 0; i < 3; i++) {
        gpucd__v1__tensor_ref__init(&t[i]);
        gpucd__v1__region_slice__init(&s[i]);
        s[i].region_id = id;
        s[i].offset = (uint64_t)i * 4096;
        t[i].dtype = GPUCD__V1__DTYPE__F32;
        t[i].n_shape = 4;
        t[i].shape = shapes[i];
        t[i].where_case = GPUCD__V1__TENSOR_REF__WHERE_REGION;
        t[i].region = &s[i];
    }
    op.x = &t[0];
    op.w = &t[1];
    op.y = &t[2];
    req.op_case = GPUCD__V1__REQUEST__OP_CONV2D_FORWARD;
    req.conv2d_forward = &op;
    return th_raw_call(raw, &req, NULL, 0);
}

static void test_region_cannot_be_resized(void **state)
{
    (void)state;
    th_raw raw;
    th_raw_open(&raw, th_group_daemon.ipc_url);
    th_region reg;
    th_raw_region(&raw, 3 * 4096, &reg);
    /* What killed the daemon before: the region shrunk under it, then a request on it. */
    errno = 0;
    const int grown = ftruncate(reg.fd, 1 << 20);
    const int grow_errno = errno;
    errno = 0;
    const int shrunk = ftruncate(reg.fd, 0);
    const int shrink_errno = errno;
    Gpucd__V1__Reply *rep = conv_in(&raw, reg.id);
    if (rep == NULL)
        fail_msg("no reply to a request on the region after ftruncate (%d): the daemon died",
                 shrunk);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    assert_int_equal(shrunk, -1);
    assert_int_equal(shrink_errno, EPERM);
    assert_int_equal(grown, -1);
    assert_int_equal(grow_errno, EPERM);
    th_raw_close(&raw);
    th_region_free(&reg);
    expect_served(th_group_daemon.ipc_url);
}

/* What descriptor fd of this process is, as /proc shows it ("pipe:[123]", "/memfd:..."). */
static void fd_target(int fd, char out[256])
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, out, 255);
    assert_true(n > 0);
    out[n] = '\0';
}

/* How many of the daemon's open descriptors are the object /proc calls target. */
static int daemon_holds(const char *target)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%ld/fd", (long)th_group_daemon.pid);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[400], link[256];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t k = readlink(path, link, sizeof link - 1);
        if (k <= 0)
            continue;
        link[k] = '\0';
        n += strcmp(link, target) == 0;
    }
    closedir(d);
    return n;
}

/* Waits (20 s of wall time at most) until the daemon holds n descriptors of target. */
static void expect_daemon_holds(const char *target, int n, const char *after)
{
    int now = daemon_holds(target);
    for (const uint64_t until = now_us() + 20000000; now != n && now_us() < until;) {
        usleep(20000);
        now = daemon_holds(target);
    }
    if (now != n)
        fail_msg("after %s the daemon holds %d descriptors of %s, not %d", after, now, target, n);
}

static fdpass_request region_request(uint64_t size)
{
    return (fdpass_request){.magic = FDPASS_MAGIC, .version = FDPASS_VERSION,
                            .op = FDPASS_OP_REGION, .size = size};
}

/* Sends msg with fds; the answer must be a refusal with status and needle, carrying no fd. */
static void expect_refused(const void *msg, size_t len, const int *fds, int nfds,
                           Gpucd__V1__Status status, const char *needle)
{
    fdpass_answer ans;
    int fd = -1;
    if (th_fdpass(th_group_daemon.ipc_url, msg, len, fds, nfds, &ans, &fd) != 0)
        fail_msg("no answer (expected '%s'): the daemon closed the descriptor socket", needle);
    ans.message[sizeof ans.message - 1] = '\0';
    if (ans.magic != FDPASS_MAGIC || ans.status != (uint32_t)status || ans.token != 0 ||
        strstr(ans.message, needle) == NULL)
        fail_msg("got status %u '%s' (token %llu), expected %d with '%s'", ans.status,
                 ans.message, (unsigned long long)ans.token, (int)status, needle);
    assert_int_equal(fd, -1);
}

static void test_hostile_descriptors(void **state)
{
    (void)state;
    /* Only the daemon's uid may connect at all. */
    char sock[600];
    struct stat sb;
    snprintf(sock, sizeof sock, "%s" FDPASS_SUFFIX, th_group_daemon.ipc_url + 6);
    assert_int_equal(stat(sock, &sb), 0);
    assert_true(S_ISSOCK(sb.st_mode));
    assert_int_equal(sb.st_mode & 0777, 0600);
    const char *unsealed = "not a sealed memfd (needs F_SEAL_SHRINK|F_SEAL_GROW)";
    fdpass_request req = region_request(4096);
    th_region reg;

    th_memfd_make(&reg, 4096, 0);
    char memfd_target[256], file_target[256], pipe_target[256];
    fd_target(reg.fd, memfd_target); /* every memfd of the test's has this one */
    expect_refused(&req, sizeof req, &reg.fd, 1, GPUCD__V1__STATUS__INVALID_ARGUMENT, unsealed);
    th_region_free(&reg);
    th_memfd_make(&reg, 4096, F_SEAL_SHRINK);
    expect_refused(&req, sizeof req, &reg.fd, 1, GPUCD__V1__STATUS__INVALID_ARGUMENT, unsealed);
    th_region_free(&reg);
    th_memfd_make(&reg, 4096, F_SEAL_GROW);
    expect_refused(&req, sizeof req, &reg.fd, 1, GPUCD__V1__STATUS__INVALID_ARGUMENT, unsealed);
    th_region_free(&reg);

    /* A regular file and a pipe: no seals at all. */
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), 4096), 0);
    int ffd = fileno(f);
    fd_target(ffd, file_target);
    expect_refused(&req, sizeof req, &ffd, 1, GPUCD__V1__STATUS__INVALID_ARGUMENT, unsealed);
    fclose(f);
    int p[2];
    assert_int_equal(pipe(p), 0);
    fd_target(p[0], pipe_target);
    expect_refused(&req, sizeof req, p, 1, GPUCD__V1__STATUS__INVALID_ARGUMENT, unsealed);

    /* A sealed memfd of another size than the one declared; sizes out of range. */
    th_memfd_make(&reg, 4096, F_SEAL_SHRINK | F_SEAL_GROW);
    fdpass_request big = region_request(8192);
    expect_refused(&big, sizeof big, &reg.fd, 1, GPUCD__V1__STATUS__INVALID_ARGUMENT,
                   "is 4096 bytes, not the 8192 declared");
    fdpass_request zero = region_request(0);
    expect_refused(&zero, sizeof zero, &reg.fd, 1, GPUCD__V1__STATUS__INVALID_ARGUMENT,
                   "region size 0 is out of range");

    /* Two descriptors, none, a bad header: each refused, every descriptor closed. */
    int two[2] = {reg.fd, p[0]};
    expect_refused(&req, sizeof req, two, 2, GPUCD__V1__STATUS__BAD_MESSAGE,
                   "exactly one descriptor");
    expect_refused(&req, sizeof req, NULL, 0, GPUCD__V1__STATUS__BAD_MESSAGE,
                   "exactly one descriptor");
    /* More than the daemon takes in one message: the kernel truncates them, the daemon refuses. */
    enum { MANY = 24 };
    int many[MANY];
    for (int i = 0; i < MANY; i++)
        many[i] = reg.fd;
    expect_refused(&req, sizeof req, many, MANY, GPUCD__V1__STATUS__BAD_MESSAGE, "truncated");
    fdpass_request bad = req;
    bad.magic = 0x12345678;
    expect_refused(&bad, sizeof bad, &reg.fd, 1, GPUCD__V1__STATUS__BAD_MESSAGE, "magic");
    bad = req;
    bad.version = 9;
    expect_refused(&bad, sizeof bad, &reg.fd, 1, GPUCD__V1__STATUS__VERSION_MISMATCH,
                   "version 9");
    bad = req;
    bad.op = 77;
    expect_refused(&bad, sizeof bad, &reg.fd, 1, GPUCD__V1__STATUS__UNKNOWN_OPERATION, "op 77");
    expect_refused(&req, 10, &reg.fd, 1, GPUCD__V1__STATUS__BAD_MESSAGE, "24 bytes");
    uint8_t longer[64] = {0};
    memcpy(longer, &req, sizeof req);
    expect_refused(longer, sizeof longer, &reg.fd, 1, GPUCD__V1__STATUS__BAD_MESSAGE, "24 bytes");
    fdpass_request wake = {.magic = FDPASS_MAGIC, .version = FDPASS_VERSION, .op = FDPASS_OP_WAKE};
    expect_refused(&wake, sizeof wake, &reg.fd, 1, GPUCD__V1__STATUS__BAD_MESSAGE,
                   "carries no descriptor");
    close(p[0]);
    close(p[1]);
    th_region_free(&reg);

    /* Connections that send nothing (more than the daemon keeps waiting) delay nobody. */
    enum { IDLE = 48 };
    int idle[IDLE];
    for (int i = 0; i < IDLE; i++)
        idle[i] = th_fdpass_connect(th_group_daemon.ipc_url);
    expect_served(th_group_daemon.ipc_url);
    /* And each is dropped after its deadline (a second): the newest one sees its end too. */
    struct pollfd pfd = {.fd = idle[IDLE - 1], .events = POLLIN};
    if (poll(&pfd, 1, 20000) != 1)
        fail_msg("an idle connection to the descriptor socket was not dropped within 20 s");
    char byte;
    assert_int_equal(recv(idle[IDLE - 1], &byte, 1, 0), 0);
    for (int i = 0; i < IDLE; i++)
        close(idle[i]);
    /* The daemon kept none of what it was sent (the pipe's ends and the file are closed here, so
     * what /proc shows of them on the daemon's side could only be its own leak). */
    expect_daemon_holds(memfd_target, 0, "the hostile descriptor messages");
    expect_daemon_holds(file_target, 0, "the regular file");
    expect_daemon_holds(pipe_target, 0, "the pipe");
}

static void test_one_object_is_one_region(void **state)
{
    (void)state;
    th_raw raw;
    th_raw_open(&raw, th_group_daemon.ipc_url);
    th_region reg;
    th_raw_region(&raw, 16384, &reg);
    /* Registered: the same object again (and a duplicate of its descriptor) is refused. */
    uint64_t token;
    fdpass_answer ans;
    assert_int_equal(th_fdpass_region(raw.url, &reg, &token, &ans), -1);
    assert_int_equal(ans.status, GPUCD__V1__STATUS__INVALID_ARGUMENT);
    assert_non_null(strstr(ans.message, "is registered already"));
    th_region twin = reg;
    twin.fd = dup(reg.fd);
    assert_int_equal(th_fdpass_region(raw.url, &twin, &token, &ans), -1);
    assert_non_null(strstr(ans.message, "is registered already"));
    close(twin.fd);
    /* Pending: the second pass of one object is refused too, so two ids never alias. */
    th_region other;
    th_memfd_make(&other, 16384, F_SEAL_SHRINK | F_SEAL_GROW);
    uint64_t first;
    assert_int_equal(th_fdpass_region(raw.url, &other, &first, &ans), 0);
    assert_int_equal(th_fdpass_region(raw.url, &other, &token, &ans), -1);
    assert_int_equal(ans.status, GPUCD__V1__STATUS__INVALID_ARGUMENT);
    assert_non_null(strstr(ans.message, "is pending registration already"));
    Gpucd__V1__Reply *rep = th_raw_register(&raw, first, 16384);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    other.id = rep->region_id;
    gpucd__v1__reply__free_unpacked(rep, NULL);
    assert_int_not_equal(other.id, reg.id);
    /* Unregistered, the object may be registered again. */
    Gpucd__V1__Request unreg = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__RegionUnregister un = GPUCD__V1__REGION_UNREGISTER__INIT;
    un.region_id = reg.id;
    unreg.op_case = GPUCD__V1__REQUEST__OP_REGION_UNREGISTER;
    unreg.region_unregister = &un;
    expect(th_raw_call(&raw, &unreg, NULL, 0), GPUCD__V1__STATUS__OK, "");
    assert_int_equal(th_fdpass_region(raw.url, &reg, &token, &ans), 0);
    rep = th_raw_register(&raw, token, 16384);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    th_raw_close(&raw);
    th_region_free(&reg);
    th_region_free(&other);
    expect_served(th_group_daemon.ipc_url);
}

static void test_tokens(void **state)
{
    (void)state;
    const char *why = "regions are sealed memfds passed over the descriptor socket";
    th_raw raw, remote, named;
    th_raw_open(&raw, th_group_daemon.ipc_url);
    expect(th_raw_register(&raw, 0x1234567890abcdefull, 4096), GPUCD__V1__STATUS__NOT_FOUND,
           why);
    /* Claimed once only. */
    th_region reg;
    th_memfd_make(&reg, 4096, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    uint64_t token;
    fdpass_answer ans;
    assert_int_equal(th_fdpass_region(raw.url, &reg, &token, &ans), 0);
    assert_int_not_equal(token, 0);
    expect(th_raw_register(&raw, token, 8192), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "was passed with 4096 bytes, not 8192");
    /* That claim took it (and closed the memfd): a client's mistake costs a new pass. */
    expect(th_raw_register(&raw, token, 4096), GPUCD__V1__STATUS__NOT_FOUND, why);
    assert_int_equal(th_fdpass_region(raw.url, &reg, &token, &ans), 0);
    Gpucd__V1__Reply *rep = th_raw_register(&raw, token, 4096);
    assert_non_null(rep);
    assert_int_equal(rep->status, GPUCD__V1__STATUS__OK);
    gpucd__v1__reply__free_unpacked(rep, NULL);
    expect(th_raw_register(&raw, token, 4096), GPUCD__V1__STATUS__NOT_FOUND, why);
    th_region_free(&reg);
    /* Over tcp:// a token means nothing, and it stays unclaimed for the local client. */
    th_memfd_make(&reg, 4096, F_SEAL_SHRINK | F_SEAL_GROW);
    assert_int_equal(th_fdpass_region(raw.url, &reg, &token, &ans), 0);
    th_raw_open(&remote, th_group_daemon.tcp_url);
    expect(th_raw_register(&remote, token, 4096), GPUCD__V1__STATUS__PERMISSION_DENIED,
           "for local (ipc://) clients only");
    th_raw_close(&remote);
    /* A name is refused whatever it names. */
    th_raw_open(&named, th_group_daemon.ipc_url);
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__RegionRegister m = GPUCD__V1__REGION_REGISTER__INIT;
    m.name = "/gpucd-anything";
    m.size = 4096;
    req.op_case = GPUCD__V1__REQUEST__OP_REGION_REGISTER;
    req.region_register = &m;
    expect(th_raw_call(&named, &req, NULL, 0), GPUCD__V1__STATUS__INVALID_ARGUMENT,
           "named shared-memory regions are not accepted; " "regions are sealed memfds passed "
           "over the descriptor socket");
    th_raw_close(&named);
    /* Unclaimed, it expires: the daemon closes the memfd, and the token is unknown. */
    char target[256];
    fd_target(reg.fd, target);
    assert_int_equal(daemon_holds(target), 1);
    expect_daemon_holds(target, 0, "a pending memfd's expiry");
    expect(th_raw_register(&raw, token, 4096), GPUCD__V1__STATUS__NOT_FOUND, why);
    th_region_free(&reg);
    th_raw_close(&raw);
    expect_served(th_group_daemon.ipc_url);
}

static void test_queue_pages_cannot_be_resized(void **state)
{
    (void)state;
    th_raw raw;
    th_raw_open(&raw, th_group_daemon.ipc_url);
    th_region area;
    th_raw_region(&raw, sizeof(submit_area), &area);
    submit_area *a = (submit_area *)area.base;
    for (uint64_t i = 0; i < SUBMIT_SLOTS; i++)
        atomic_store(&a->cells[i].seq, i);
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__SubmitQueueOpen op = GPUCD__V1__SUBMIT_QUEUE_OPEN__INIT;
    op.region_id = area.id;
    req.op_case = GPUCD__V1__REQUEST__OP_SUBMIT_QUEUE_OPEN;
    req.submit_queue_open = &op;
    expect(th_raw_call(&raw, &req, NULL, 0), GPUCD__V1__STATUS__OK, "");
    /* The queue's poller reads the area with no request at all: shrinking it killed the daemon. */
    errno = 0;
    const int shrunk = ftruncate(area.fd, 0);
    const int shrink_errno = errno;
    usleep(300000); /* the poller's next looks, at most its 100 ms nap apart */
    Gpucd__V1__Request ping = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__Ping p = GPUCD__V1__PING__INIT;
    ping.op_case = GPUCD__V1__REQUEST__OP_PING;
    ping.ping = &p;
    if (shrunk == 0 && th_raw_call(&raw, &ping, NULL, 0) == NULL)
        fail_msg("the queue's area was shrunk and the daemon died");
    assert_int_equal(shrunk, -1);
    assert_int_equal(shrink_errno, EPERM);
    /* The wake page: sealed against resizing and against removing the seals. */
    fdpass_request wreq = {.magic = FDPASS_MAGIC, .version = FDPASS_VERSION, .op = FDPASS_OP_WAKE};
    fdpass_answer ans;
    int wfd = -1;
    assert_int_equal(th_fdpass(raw.url, &wreq, sizeof wreq, NULL, 0, &ans, &wfd), 0);
    assert_int_equal(ans.status, GPUCD__V1__STATUS__OK);
    assert_int_equal(ans.size, SUBMIT_WAKE_BYTES);
    assert_true(wfd >= 0);
    const int seals = fcntl(wfd, F_GET_SEALS);
    assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_equal(ftruncate(wfd, 0), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(wfd, 1 << 20), -1);
    assert_int_equal(fcntl(wfd, F_ADD_SEALS, F_SEAL_WRITE), -1);
    /* Nor is it a region (the seals would pass): it is the daemon's. */
    th_region as_region = {.fd = wfd, .size = SUBMIT_WAKE_BYTES};
    uint64_t token;
    assert_int_equal(th_fdpass_region(raw.url, &as_region, &token, &ans), -1);
    assert_non_null(strstr(ans.message, "the daemon's wake page"));
    close(wfd);
    expect(th_raw_call(&raw, &ping, NULL, 0), GPUCD__V1__STATUS__OK, "");
    th_raw_close(&raw);
    th_region_free(&area);
    expect_served(th_group_daemon.ipc_url);
}

/* Entries of /dev/shm whose name starts with prefix. */
static int shm_names(const char *prefix)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            fprintf(stderr, "left in /dev/shm: %s\n", e->d_name);
            n++;
        }
    if (d != NULL)
        closedir(d);
    return n;
}

enum { KILLED = 20 };

/*
 * A child, this program run again (nng is not safe across fork) with "--churn URL": a region
 * and the library's queue, opened by a first record-ending call, then regions made and
 * destroyed until it is killed.  It says it is ready by a byte on its stdout.
 */
static void churn(const char *url)
{
    const int ready = 1;
    gpucd_client *c;
    gpucd_region *r;
    if (gpucd_connect(url, NULL, &c) != 0 || gpucd_region_create(c, th_mh_slice_bytes(), &r) != 0)
        _exit(2);
    gpucd_tensor obs = gpucd_tensor_region(r, th_mh_obs_offset(0), GPUCD_U8, 2,
                                           TH_SHAPE(TH_MH_B, 1707));
    gpucd_tensor out = gpucd_tensor_region(r, th_mh_out_offset(0), GPUCD_F32, 4,
                                           TH_SHAPE(TH_MH_B, 59, 11, 15));
    th_fill_nmmo3_obs(gpucd_region_data(r), TH_MH_B);
    if (gpucd_multihot_encode(c, NULL, &obs, &out, NULL) != 0 || write(ready, "r", 1) != 1)
        _exit(3);
    for (;;) {
        gpucd_region *more;
        if (gpucd_region_create(c, 4096, &more) == 0)
            gpucd_region_destroy(more);
    }
}

static void test_killed_sides_leave_no_names(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, NULL);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t kids[KILLED];
    for (int i = 0; i < KILLED; i++) {
        kids[i] = fork();
        assert_true(kids[i] >= 0);
        if (kids[i] == 0) {
            dup2(ready[1], 1);
            execl("/proc/self/exe", "test_memfd", "--churn", d.ipc_url, (char *)NULL);
            _exit(4);
        }
    }
    close(ready[1]);
    for (int i = 0; i < KILLED; i++) {
        char b;
        if (read(ready[0], &b, 1) != 1)
            fail_msg("only %d of %d clients made their region and queue", i, KILLED);
    }
    close(ready[0]);
    usleep(100000); /* each in its churn of regions */
    for (int i = 0; i < KILLED; i++)
        kill(kids[i], SIGKILL);
    for (int i = 0; i < KILLED; i++)
        waitpid(kids[i], NULL, 0);
    const long daemon_pid = (long)d.pid;
    th_daemon_kill(&d);
    char prefix[64];
    int left = 0;
    for (int i = 0; i < KILLED; i++) {
        snprintf(prefix, sizeof prefix, "gpucd-%ld-", (long)kids[i]);
        left += shm_names(prefix);
    }
    snprintf(prefix, sizeof prefix, "gpucd-wake-%ld-", daemon_pid);
    left += shm_names(prefix);
    assert_int_equal(left, 0);
}

/*
 * An ipc:// path that fits a Unix socket, but not with ".fd" after it: the daemon refuses to
 * start, naming the descriptor socket, instead of serving local clients that cannot pass it
 * their regions.
 */
static void test_descriptor_path_too_long(void **state)
{
    (void)state;
    char dir[32] = "/tmp/gpucd-long-XXXXXX", path[200], url[220], log[64];
    assert_non_null(mkdtemp(dir));
    const size_t sun_max = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
    int n = snprintf(path, sizeof path, "%s/", dir);
    while ((size_t)n < sun_max - 1) /* the nng socket's path fits, with a byte to spare */
        path[n++] = 's';
    path[n] = '\0';
    snprintf(url, sizeof url, "ipc://%s", path);
    snprintf(log, sizeof log, "%s/log", dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 2);
        execl(th_daemon_exe, th_daemon_exe, "--listen", url, "--stats-listen", "none",
              "--backend", "cpu", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    pid_t got = 0;
    for (const uint64_t until = now_us() + 60000000; got == 0 && now_us() < until;) {
        got = waitpid(pid, &status, WNOHANG);
        if (got == 0)
            usleep(20000);
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("the daemon at a %zu-byte ipc:// path still runs after 60 s", strlen(path));
    }
    char text[4096] = {0};
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = '\0';
    fclose(f);
    unlink(log);
    unlink(path);
    rmdir(dir);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    if (strstr(text, "the descriptor socket's path is") == NULL)
        fail_msg("the daemon's error does not name the descriptor socket: %s", text);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--churn") == 0)
        churn(argv[2]);
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_region_cannot_be_resized),
        cmocka_unit_test(test_hostile_descriptors),
        cmocka_unit_test(test_one_object_is_one_region),
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_queue_pages_cannot_be_resized),
        cmocka_unit_test(test_killed_sides_leave_no_names),
        cmocka_unit_test(test_descriptor_path_too_long),
    };
    return th_run_group_tests(tests, th_group_daemon_setup, th_group_daemon_teardown);
}
