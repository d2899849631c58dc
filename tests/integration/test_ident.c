/*
 * test_ident.c - who is who: ids that do not survive a daemon's restart, ids of others that
 * read as missing ones, and a client that checks whom it talks to (the daemon's uid, the
 * default socket folder).
 */
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include "harness.h"
#include "raw.h"

enum { ROW = 4, REGION_BYTES = 4096 };

/*
 * This test process only (the daemon is another program): a connection the client closes as
 * nng offers it (a daemon of an untrusted uid) leaves nng 1.5.2's dialer objects behind now and
 * then (seen once under LeakSanitizer in CI: allocations under nng_dialer_create, freed by
 * nobody).  A leak allocated outside nng still fails.
 */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnng.so\n"; }

static gpucd_client *connect_to(const char *url)
{
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 5000;
    gpucd_client *c = NULL;
    int rv = gpucd_connect(url, &o, &c);
    if (rv != 0)
        fail_msg("connect %s: %s", url, gpucd_errmsg(NULL));
    return c;
}

/* A resident (1, ROW) f32 tensor holding v. */
static uint64_t put_row(gpucd_client *c, float v)
{
    float row[ROW];
    for (int i = 0; i < ROW; i++)
        row[i] = v + (float)i;
    gpucd_tensor t = gpucd_tensor_host(row, GPUCD_F32, 2, TH_SHAPE(1, ROW));
    uint64_t id = 0;
    if (gpucd_tensor_put(c, &t, &id) != 0)
        fail_msg("tensor_put: %s", gpucd_errmsg(c));
    return id;
}

/* Resident tensor id holds put_row's v. */
static void expect_row(gpucd_client *c, uint64_t id, float v)
{
    float row[ROW];
    gpucd_tensor t = gpucd_tensor_host(row, GPUCD_F32, 2, TH_SHAPE(1, ROW));
    if (gpucd_tensor_get(c, id, &t) != 0)
        fail_msg("tensor_get %llu: %s", (unsigned long long)id, gpucd_errmsg(c));
    for (int i = 0; i < ROW; i++)
        assert_true(row[i] == v + (float)i);
}

/* An embedding lookup of row 0 of a (ROW, ROW) table in host memory into out. */
static int embed_into(gpucd_client *c, gpucd_tensor *out)
{
    int32_t idx = 0;
    float table[ROW * ROW];
    for (int i = 0; i < ROW * ROW; i++)
        table[i] = -1.0f;
    gpucd_tensor ti = gpucd_tensor_host(&idx, GPUCD_I32, 1, TH_SHAPE(1));
    gpucd_tensor tt = gpucd_tensor_host(table, GPUCD_F32, 2, TH_SHAPE(ROW, ROW));
    return gpucd_embedding_forward(c, &ti, &tt, out, NULL);
}

/*
 * A client keeps its ids across a restart of the daemon at its URL; another client makes its
 * own on the new daemon.  The first client's stale ids name nothing there: each use is
 * NOT_FOUND, and the second client's objects are as it left them.
 */
static void test_stale_ids_after_restart(void **state)
{
    (void)state;
    th_fixed_url f;
    th_fixed_url_init(&f);
    th_daemon first;
    th_daemon_start(&first, f.extra);
    gpucd_client *a = connect_to(f.url);
    gpucd_region *ra;
    assert_int_equal(gpucd_region_create(a, REGION_BYTES, &ra), 0);
    const uint64_t ta = put_row(a, 1.0f);
    assert_int_equal(th_daemon_stop(&first), 0);

    th_daemon second;
    th_daemon_start(&second, f.extra);
    gpucd_client *b = connect_to(f.url);
    gpucd_region *rb;
    assert_int_equal(gpucd_region_create(b, REGION_BYTES, &rb), 0);
    memset(gpucd_region_data(rb), 0x5a, REGION_BYTES);
    const uint64_t tb = put_row(b, 100.0f);
    th_wait_for_reconnect(a);

    float row[ROW];
    gpucd_tensor host = gpucd_tensor_host(row, GPUCD_F32, 2, TH_SHAPE(1, ROW));
    int rv = gpucd_tensor_get(a, ta, &host);
    if (rv != GPUCD_ENOT_FOUND)
        fail_msg("a stale id's tensor_get: %d '%s', read %g (the other client's is %g)", rv,
                 gpucd_errmsg(a), (double)row[0], 100.0);
    gpucd_tensor stale = gpucd_tensor_resident(ta, GPUCD_F32, 2, TH_SHAPE(1, ROW));
    assert_int_equal(embed_into(a, &stale), GPUCD_ENOT_FOUND);
    gpucd_tensor copy = gpucd_tensor_resident(ta, GPUCD_F32, 2, TH_SHAPE(1, ROW));
    uint64_t id;
    assert_int_equal(gpucd_tensor_put(a, &copy, &id), GPUCD_ENOT_FOUND);
    gpucd_tensor in_stale_region = gpucd_tensor_region(ra, 0, GPUCD_F32, 2, TH_SHAPE(1, ROW));
    assert_int_equal(embed_into(a, &in_stale_region), GPUCD_ENOT_FOUND);
    assert_int_equal(gpucd_tensor_free(a, ta), GPUCD_ENOT_FOUND);
    const uint64_t stale_region = gpucd_region_id(ra);
    assert_int_equal(gpucd_region_destroy(ra), GPUCD_ENOT_FOUND);
    assert_true(tb != ta);
    assert_true(gpucd_region_id(rb) != stale_region);

    expect_row(b, tb, 100.0f);
    gpucd_region_info *list;
    size_t n;
    assert_int_equal(gpucd_regions_list(b, &list, &n), 0);
    assert_int_equal(n, 1);
    assert_true(list[0].id == gpucd_region_id(rb));
    free(list);
    const unsigned char *bytes = gpucd_region_data(rb);
    for (size_t i = 0; i < REGION_BYTES; i++)
        assert_int_equal(bytes[i], 0x5a);
    assert_int_equal(gpucd_tensor_free(b, tb), 0);
    assert_int_equal(gpucd_region_destroy(rb), 0);
    gpucd_close(a);
    gpucd_close(b);
    assert_int_equal(th_daemon_stop(&second), 0);
    th_fixed_url_remove(&f);
}

enum { IDS_EACH = 4 };

/* The ids a fresh client gets from a fresh daemon: IDS_EACH regions, then IDS_EACH tensors. */
static void ids_of_a_daemon(uint64_t ids[2 * IDS_EACH])
{
    th_daemon d;
    th_daemon_start(&d, NULL);
    gpucd_client *c = connect_to(d.ipc_url);
    gpucd_region *r[IDS_EACH];
    for (int i = 0; i < IDS_EACH; i++) {
        assert_int_equal(gpucd_region_create(c, REGION_BYTES, &r[i]), 0);
        ids[i] = gpucd_region_id(r[i]);
    }
    for (int i = 0; i < IDS_EACH; i++)
        ids[IDS_EACH + i] = put_row(c, (float)i);
    for (int i = 0; i < IDS_EACH; i++)
        assert_int_equal(gpucd_region_destroy(r[i]), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
}

/* Two daemons in a row hand out different ids (but for a 2^-32 chance of the same epoch). */
static void test_ids_differ_between_daemons(void **state)
{
    (void)state;
    uint64_t one[2 * IDS_EACH], two[2 * IDS_EACH];
    ids_of_a_daemon(one);
    ids_of_a_daemon(two);
    for (int i = 0; i < 2 * IDS_EACH; i++)
        for (int j = 0; j < 2 * IDS_EACH; j++)
            if (one[i] == two[j])
                fail_msg("id %llu came from both daemons", (unsigned long long)one[i]);
}

/* msg with id's decimal digits replaced by '#': refusals of different ids compared. */
static void refusal_text(const char *msg, uint64_t id, char out[512])
{
    char digits[24];
    snprintf(digits, sizeof digits, "%llu", (unsigned long long)id);
    const char *at = strstr(msg, digits);
    if (at == NULL)
        snprintf(out, 512, "%s", msg);
    else
        snprintf(out, 512, "%.*s#%s", (int)(at - msg), msg, at + strlen(digits));
}

/* The refusal of `id` (someone else's) reads as that of `missing` (never made). */
static void expect_same_refusal(int rv, const char *msg, uint64_t id, int rv_missing,
                                const char *msg_missing, uint64_t missing)
{
    char a[512], b[512];
    refusal_text(msg, id, a);
    refusal_text(msg_missing, missing, b);
    if (rv != rv_missing || strcmp(a, b) != 0)
        fail_msg("someone else's id: %d '%s'; a never-made id: %d '%s'", rv, msg, rv_missing,
                 msg_missing);
    assert_int_equal(rv_missing, GPUCD_ENOT_FOUND);
}

/* A call's code and the thread's message after it. */
typedef struct outcome {
    int rv;
    char msg[512];
} outcome;

static outcome tensor_get_outcome(gpucd_client *c, uint64_t id)
{
    float row[ROW];
    gpucd_tensor t = gpucd_tensor_host(row, GPUCD_F32, 2, TH_SHAPE(1, ROW));
    outcome o;
    o.rv = gpucd_tensor_get(c, id, &t);
    snprintf(o.msg, sizeof o.msg, "%s", gpucd_errmsg(c));
    return o;
}

static outcome tensor_free_outcome(gpucd_client *c, uint64_t id)
{
    outcome o;
    o.rv = gpucd_tensor_free(c, id);
    snprintf(o.msg, sizeof o.msg, "%s", gpucd_errmsg(c));
    return o;
}

/* A hand-made request's status and message. */
static outcome raw_outcome(th_raw *raw, Gpucd__V1__Request *req)
{
    Gpucd__V1__Reply *rep = th_raw_call(raw, req, NULL, 0);
    assert_non_null(rep);
    outcome o;
    o.rv = rep->status == GPUCD__V1__STATUS__OK ? 0 : -(GPUCD_EDAEMON_BASE + (int)rep->status);
    snprintf(o.msg, sizeof o.msg, "%s", rep->message != NULL ? rep->message : "");
    gpucd__v1__reply__free_unpacked(rep, NULL);
    return o;
}

static outcome unregister_outcome(th_raw *raw, uint64_t region_id)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__RegionUnregister un = GPUCD__V1__REGION_UNREGISTER__INIT;
    un.region_id = region_id;
    req.op_case = GPUCD__V1__REQUEST__OP_REGION_UNREGISTER;
    req.region_unregister = &un;
    return raw_outcome(raw, &req);
}

static outcome queue_open_outcome(th_raw *raw, uint64_t region_id)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__SubmitQueueOpen op = GPUCD__V1__SUBMIT_QUEUE_OPEN__INIT;
    op.region_id = region_id;
    req.op_case = GPUCD__V1__REQUEST__OP_SUBMIT_QUEUE_OPEN;
    req.submit_queue_open = &op;
    return raw_outcome(raw, &req);
}

/*
 * Another connection's region, and a resident tensor of another peer (a tcp:// client may use
 * only its own), get exactly the refusal of an id never made: nobody learns which ids exist.
 */
static void test_others_ids_read_as_missing(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, NULL);
    gpucd_client *owner = connect_to(d.ipc_url);
    gpucd_region *r;
    assert_int_equal(gpucd_region_create(owner, REGION_BYTES, &r), 0);
    const uint64_t region = gpucd_region_id(r), tensor = put_row(owner, 7.0f);
    /* ids of the same daemon that were never handed out */
    const uint64_t no_region = region + 1000, no_tensor = tensor + 1000;

    gpucd_client *remote = connect_to(d.tcp_url);
    outcome got = tensor_get_outcome(remote, tensor), none = tensor_get_outcome(remote, no_tensor);
    expect_same_refusal(got.rv, got.msg, tensor, none.rv, none.msg, no_tensor);
    got = tensor_free_outcome(remote, tensor);
    none = tensor_free_outcome(remote, no_tensor);
    expect_same_refusal(got.rv, got.msg, tensor, none.rv, none.msg, no_tensor);
    gpucd_close(remote);

    th_raw other;
    th_raw_open(&other, d.ipc_url);
    got = unregister_outcome(&other, region);
    none = unregister_outcome(&other, no_region);
    expect_same_refusal(got.rv, got.msg, region, none.rv, none.msg, no_region);
    got = queue_open_outcome(&other, region);
    none = queue_open_outcome(&other, no_region);
    expect_same_refusal(got.rv, got.msg, region, none.rv, none.msg, no_region);
    th_raw_close(&other);

    expect_row(owner, tensor, 7.0f); /* the owner's are untouched */
    assert_int_equal(gpucd_tensor_free(owner, tensor), 0);
    assert_int_equal(gpucd_region_destroy(r), 0);
    gpucd_close(owner);
    assert_int_equal(th_daemon_stop(&d), 0);
}

/*
 * Another connection of the same uid may read a resident tensor (workers share a learner's
 * weights) but not write it: an operation's output naming it is refused and the bytes stay.
 */
static void test_others_tensors_are_read_only(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, NULL);
    gpucd_client *owner = connect_to(d.ipc_url), *other = connect_to(d.ipc_url);
    const uint64_t tensor = put_row(owner, 7.0f);
    expect_row(other, tensor, 7.0f); /* reading is sharing */
    gpucd_tensor out = gpucd_tensor_resident(tensor, GPUCD_F32, 2, TH_SHAPE(1, ROW));
    assert_int_equal(embed_into(other, &out), GPUCD_EPERMISSION_DENIED);
    if (strstr(gpucd_errmsg(other), "only the connection that made it") == NULL)
        fail_msg("refusal does not say why: %s", gpucd_errmsg(other));
    expect_row(owner, tensor, 7.0f);
    assert_int_equal(embed_into(owner, &out), 0); /* the owner still writes it */
    float row[ROW];
    gpucd_tensor back = gpucd_tensor_host(row, GPUCD_F32, 2, TH_SHAPE(1, ROW));
    assert_int_equal(gpucd_tensor_get(other, tensor, &back), 0);
    for (int i = 0; i < ROW; i++)
        assert_true(row[i] == -1.0f); /* row 0 of embed_into's table */
    gpucd_close(other);
    gpucd_close(owner);
    assert_int_equal(th_daemon_stop(&d), 0);
}

/* gpucd_connect's code and message; the client closed again. */
static outcome connect_outcome(const char *url, const gpucd_options *opts)
{
    gpucd_client *c = (gpucd_client *)&c; /* must come back NULL on a failure */
    outcome o;
    o.rv = gpucd_connect(url, opts, &c);
    snprintf(o.msg, sizeof o.msg, "%s", gpucd_errmsg(NULL));
    if (o.rv == 0) {
        if (gpucd_ping(c, NULL) != 0)
            fail_msg("connected to %s, but no ping: %s", url ? url : "the default", gpucd_errmsg(c));
        gpucd_close(c);
    } else {
        assert_null(c);
    }
    return o;
}

static void expect_connects(const char *url, const gpucd_options *opts)
{
    outcome o = connect_outcome(url, opts);
    if (o.rv != 0)
        fail_msg("connect %s: %d '%s'", url ? url : "(default)", o.rv, o.msg);
}

/* Refused with GPUCD_EUNTRUSTED and a message holding each of the needles. */
static void expect_untrusted(const char *url, const gpucd_options *opts, const char *needle1,
                             const char *needle2)
{
    outcome o = connect_outcome(url, opts);
    if (o.rv != GPUCD_EUNTRUSTED || strstr(o.msg, needle1) == NULL ||
        strstr(o.msg, needle2) == NULL)
        fail_msg("connect %s: %d '%s', expected GPUCD_EUNTRUSTED with '%s' and '%s'",
                 url ? url : "(default)", o.rv, o.msg, needle1, needle2);
}

/*
 * Over ipc:// the client checks the daemon's uid (the peer's credentials on the socket) against
 * the one it trusts: its own, or GPUCD_TRUST_UID's, or gpucd_options.trust_uid's.  A daemon of
 * another uid cannot be started here without root's help, so the trusted uid is made another.
 */
static void test_daemon_uid_checked(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, NULL);
    const unsigned me = (unsigned)geteuid(), other = me + 1;
    char mine[16], others[16], expected[96];
    snprintf(mine, sizeof mine, "%u", me);
    snprintf(others, sizeof others, "%u", other);
    snprintf(expected, sizeof expected, "runs as uid %u, expected %u", me, other);

    /* What is accepted first: a connection right after one the client closed at once (a
     * refused one) is, rarely, never accepted by the daemon's nng 1.5.2 (see test_bad_input). */
    unsetenv("GPUCD_TRUST_UID");
    expect_connects(d.ipc_url, NULL);
    assert_int_equal(setenv("GPUCD_TRUST_UID", mine, 1), 0);
    expect_connects(d.ipc_url, NULL);
    assert_int_equal(setenv("GPUCD_TRUST_UID", others, 1), 0);
    expect_connects(d.tcp_url, NULL); /* no peer uid to check */
    gpucd_options o;
    gpucd_options_init(&o);
    o.trust_uid_set = 1;
    o.trust_uid = me; /* the caller's word over the environment's */
    expect_connects(d.ipc_url, &o);

    expect_untrusted(d.ipc_url, NULL, d.ipc_url, expected);
    unsetenv("GPUCD_TRUST_UID");
    o.trust_uid = other;
    expect_untrusted(d.ipc_url, &o, d.ipc_url, expected);
    assert_int_equal(setenv("GPUCD_TRUST_UID", "12x", 1), 0);
    outcome bad = connect_outcome(d.ipc_url, NULL);
    assert_int_equal(bad.rv, GPUCD_EINVAL);
    assert_non_null(strstr(bad.msg, "GPUCD_TRUST_UID"));
    assert_int_equal(th_daemon_stop(&d), 0);
}

/*
 * The default socket folder ($XDG_RUNTIME_DIR here, /tmp/gpucd-<uid> without it) is dialed
 * into only when it is the user's own, as the daemon requires to listen there.
 */
static void test_default_dir_checked(void **state)
{
    (void)state;
    char dir[32], listen[96], sock[96], link[48];
    snprintf(dir, sizeof dir, "/tmp/gpucd-id-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(listen, sizeof listen, "ipc://%s/gpucd.sock", dir);
    snprintf(sock, sizeof sock, "%s/gpucd.sock", dir);
    snprintf(link, sizeof link, "%s-link", dir);
    const char *extra[] = {"--listen", listen, NULL};
    th_daemon d;
    th_daemon_start(&d, extra);

    unsetenv("GPUCD_URL"); /* the built-in default is under test */
    assert_int_equal(setenv("XDG_RUNTIME_DIR", dir, 1), 0);
    expect_connects(NULL, NULL);
    assert_int_equal(chmod(dir, 0777), 0);
    expect_untrusted(NULL, NULL, dir, "mode 0777");
    expect_untrusted(listen, NULL, dir, "mode 0777"); /* the default URL, spelled out */
    assert_int_equal(chmod(dir, 0700), 0);
    expect_connects(NULL, NULL);
    assert_int_equal(symlink(dir, link), 0);
    assert_int_equal(setenv("XDG_RUNTIME_DIR", link, 1), 0);
    expect_untrusted(NULL, NULL, link, "symbolic link");

    assert_int_equal(th_daemon_stop(&d), 0);
    unlink(link);
    unlink(sock);
    rmdir(dir);
}

enum { NOBODY = 65534 };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char self_exe[4096]; /* this program, for the impostor (not /proc/self/exe: valgrind's) */

/*
 * Another user's server at url (`test_ident --impostor URL`, a process of its own: nng does not
 * survive a fork): run as uid NOBODY, it echoes every request, and writes a byte for each to
 * file descriptor 3.
 */
static int impostor_main(const char *url)
{
    nng_socket s;
    if (setgid(NOBODY) != 0 || setuid(NOBODY) != 0)
        return 3;
    /* The change of uid cleared the parent-death signal: a stopped test must not leave it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1 || nng_rep0_open(&s) != 0 ||
        nng_listen(s, url, NULL, 0) != 0)
        return 3;
    for (;;) {
        nng_msg *m;
        if (nng_recvmsg(s, &m, 0) != 0)
            continue;
        if (write(3, "r", 1) != 1)
            return 4;
        if (nng_sendmsg(s, m, 0) != 0)
            nng_msg_free(m);
    }
}

/* Starts the impostor at url; returns once its socket is there.  *served: the read end of
 * its count. */
static pid_t impostor_start(const char *url, const char *sock, int *served)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (dup2(fds[1], 3) == 3)
            execl(self_exe, self_exe, "--impostor", url, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    *served = fds[0];
    struct stat st;
    for (const double until = now_s() + 30; !(stat(sock, &st) == 0 && st.st_uid == NOBODY);) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            fail_msg("the impostor at %s exited (status %d)", url, status);
        if (now_s() > until)
            fail_msg("the impostor made no socket at %s within 30 s", sock);
        usleep(10000);
    }
    return pid;
}

/*
 * The daemon at a client's URL goes and another user's server takes its address: the client
 * redials by itself, but sends it nothing, and its calls fail with GPUCD_EUNTRUSTED.  Needs
 * root, to run the impostor as another uid.
 */
static void test_impostor_refused(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "test_impostor_refused: not root, so no server of another uid can be "
                        "started: skipped\n");
        return;
    }
    th_fixed_url f;
    th_fixed_url_init(&f);
    char sock[200], expected[96];
    snprintf(sock, sizeof sock, "%s/fixed.sock", f.dir);
    snprintf(expected, sizeof expected, "runs as uid %d, expected 0", NOBODY);
    th_daemon d;
    th_daemon_start(&d, f.extra);
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 2000;
    gpucd_client *c = NULL;
    assert_int_equal(gpucd_connect(f.url, &o, &c), 0);
    assert_int_equal(gpucd_ping(c, NULL), 0);
    assert_int_equal(th_daemon_stop(&d), 0);

    assert_int_equal(chown(f.dir, NOBODY, NOBODY), 0);
    unlink(sock);
    int served;
    const pid_t impostor = impostor_start(f.url, sock, &served);

    int rv = -1;
    for (const double until = now_s() + 30; rv != GPUCD_EUNTRUSTED;) {
        rv = gpucd_ping(c, NULL);
        if (rv == 0)
            fail_msg("a ping went through the impostor");
        if (now_s() > until)
            fail_msg("no refusal within 30 s: the last ping got %d '%s'", rv, gpucd_errmsg(c));
        if (rv != GPUCD_EUNTRUSTED)
            usleep(20000);
    }
    if (strstr(gpucd_errmsg(c), expected) == NULL || strstr(gpucd_errmsg(c), f.url) == NULL)
        fail_msg("refused with '%s', expected the URL and '%s'", gpucd_errmsg(c), expected);
    expect_untrusted(f.url, &o, f.url, expected);
    gpucd_close(c);

    kill(impostor, SIGKILL);
    waitpid(impostor, NULL, 0);
    char byte;
    assert_int_equal(read(served, &byte, 1), 0); /* no request reached it */
    close(served);
    th_fixed_url_remove(&f);
}

/* Nothing a failed test set reaches the next: the harness's own connections use the defaults. */
static int environment_reset(void **state)
{
    (void)state;
    unsetenv("GPUCD_TRUST_UID");
    unsetenv("XDG_RUNTIME_DIR");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--impostor") == 0)
        return impostor_main(argv[2]);
    if (realpath(argv[0], self_exe) == NULL)
        return 1;
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stale_ids_after_restart),
        cmocka_unit_test(test_ids_differ_between_daemons),
        cmocka_unit_test(test_others_ids_read_as_missing),
        cmocka_unit_test(test_others_tensors_are_read_only),
        cmocka_unit_test_teardown(test_daemon_uid_checked, environment_reset),
        cmocka_unit_test_teardown(test_default_dir_checked, environment_reset),
        cmocka_unit_test(test_impostor_refused),
    };
    return th_run_group_tests(tests, NULL, NULL);
}
