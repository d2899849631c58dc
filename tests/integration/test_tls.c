/*
 * test_tls.c - tls+tcp:// listeners: a client with a certificate of the daemon's CA is
 * served like a tcp:// one, every other client is refused by the handshake while the
 * daemon goes on serving the good ones; and the listeners a daemon refuses to start
 * with (tls+tcp:// without its files, plain tcp:// beyond loopback without
 * --insecure-tcp).  The certificates are made at test time with the openssl command
 * (the test is skipped, 77, without it).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* Generous: a handshake under valgrind on a loaded 2-core machine takes a while. */
enum { CONNECT_TIMEOUT_MS = 10000, ATTEMPT_LIMIT_S = 60 };

static char certs[64];     /* the temporary folder of the certificates */
static char tls_url[64];   /* the group daemon's tls+tcp:// listener */
static th_daemon tls_daemon;

static void cert_path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", certs, name);
}

/* Runs one shell command in the certificate folder; its output goes to openssl.log. */
static int certs_run(const char *cmd)
{
    char line[1024];
    snprintf(line, sizeof line, "cd '%s' && { %s ; } >>openssl.log 2>&1", certs, cmd);
    int rc = system(line);
    if (rc != 0)
        fprintf(stderr, "certificates: '%s' failed (%d); see %s/openssl.log\n", cmd, rc, certs);
    return rc;
}

#define EC_KEY "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"

/*
 * ca.crt signs the daemon's server.crt (for 127.0.0.1), elsewhere.crt (a server certificate
 * for another host) and the good client.crt;
 * other-ca.crt signs other.crt, a client the daemon must not know; old.crt, of ca.crt,
 * expired in 2020 (openssl ca takes dates in the past, openssl 3.0's x509 -days does not).
 */
static const char *const cert_commands[] = {
    "openssl req -x509 " EC_KEY " -keyout ca.key -out ca.crt -days 30 -subj '/CN=gpucd test CA'",
    "openssl req -x509 " EC_KEY " -keyout other-ca.key -out other-ca.crt -days 30 "
    "-subj '/CN=another CA'",
    "printf 'subjectAltName=DNS:127.0.0.1,IP:127.0.0.1,DNS:localhost\\n"
    "extendedKeyUsage=serverAuth\\n' >server.ext",
    "printf 'extendedKeyUsage=clientAuth\\n' >client.ext",
    "openssl req " EC_KEY " -keyout server.key -out server.csr -subj '/CN=127.0.0.1'",
    "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 "
    "-extfile server.ext -out server.crt",
    "openssl req " EC_KEY " -keyout elsewhere.key -out elsewhere.csr -subj '/CN=elsewhere'",
    "printf 'subjectAltName=DNS:elsewhere\\nextendedKeyUsage=serverAuth\\n' >elsewhere.ext",
    "openssl x509 -req -in elsewhere.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 "
    "-extfile elsewhere.ext -out elsewhere.crt",
    "openssl req " EC_KEY " -keyout client.key -out client.csr -subj '/CN=trainer-1'",
    "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 "
    "-extfile client.ext -out client.crt",
    "openssl req " EC_KEY " -keyout other.key -out other.csr -subj '/CN=intruder'",
    "openssl x509 -req -in other.csr -CA other-ca.crt -CAkey other-ca.key -CAcreateserial "
    "-days 30 -extfile client.ext -out other.crt",
    "mkdir -p db && : >db/index.txt && echo 01 >db/serial && "
    "printf '[ca]\\ndefault_ca = t\\n[t]\\ndatabase = db/index.txt\\nserial = db/serial\\n"
    "new_certs_dir = db\\ndefault_md = sha256\\npolicy = p\\nunique_subject = no\\n"
    "x509_extensions = e\\n[p]\\ncommonName = supplied\\n"
    "[e]\\nextendedKeyUsage = clientAuth\\n' >ca.cnf",
    "openssl req " EC_KEY " -keyout old.key -out old.csr -subj '/CN=trainer-old'",
    "openssl ca -batch -notext -config ca.cnf -cert ca.crt -keyfile ca.key -in old.csr "
    "-out old.crt -startdate 20200101000000Z -enddate 20200201000000Z",
};

static int certs_make(void)
{
    snprintf(certs, sizeof certs, "/tmp/gpucd-tls-XXXXXX");
    if (mkdtemp(certs) == NULL) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    for (size_t i = 0; i < sizeof cert_commands / sizeof cert_commands[0]; i++)
        if (certs_run(cert_commands[i]) != 0)
            return -1;
    return 0;
}

static void certs_remove(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", certs);
    if (certs[0] != '\0' && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", certs);
}

/* ---- clients ---------------------------------------------------------------------- */

/* Connects to the TLS daemon trusting ca, showing cert/key (names in certs, or NULL). */
static int tls_connect(const char *ca, const char *cert, const char *key, gpucd_client **out)
{
    char ca_path[128], cert_path_[128], key_path[128];
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = CONNECT_TIMEOUT_MS;
    cert_path(ca_path, sizeof ca_path, ca);
    o.tls_ca = ca_path;
    if (cert != NULL) {
        cert_path(cert_path_, sizeof cert_path_, cert);
        cert_path(key_path, sizeof key_path, key);
        o.tls_cert = cert_path_;
        o.tls_key = key_path;
    }
    *out = NULL;
    return gpucd_connect(tls_url, &o, out);
}

static gpucd_client *good_client(void)
{
    gpucd_client *c;
    int rv = tls_connect("ca.crt", "client.crt", "client.key", &c);
    if (rv != 0)
        fail_msg("a good client could not connect: %s: %s", gpucd_strerror(rv),
                 gpucd_errmsg(NULL));
    return c;
}

typedef struct attempt {
    const char *ca, *cert, *key;
    int connect_rv, ping_rv; /* ping_rv: only when the connection was made */
    char msg[512];
    int done;
    pthread_mutex_t lock;
    pthread_cond_t cond;
} attempt;

static void *attempt_run(void *arg)
{
    attempt *a = arg;
    gpucd_client *c;
    int rv = tls_connect(a->ca, a->cert, a->key, &c);
    int ping_rv = rv == 0 ? gpucd_ping(c, NULL) : 0;
    pthread_mutex_lock(&a->lock);
    a->connect_rv = rv;
    a->ping_rv = ping_rv;
    snprintf(a->msg, sizeof a->msg, "%s", gpucd_errmsg(NULL));
    a->done = 1;
    pthread_cond_signal(&a->cond);
    pthread_mutex_unlock(&a->lock);
    gpucd_close(c);
    return NULL;
}

/*
 * A client the handshake must refuse: its connect fails (or, should nng report the
 * connection before the handshake's end, its first call), within ATTEMPT_LIMIT_S of wall
 * time however its dialer behaves.
 */
static void expect_refused(const char *what, const char *ca, const char *cert, const char *key)
{
    /* On the heap: an attempt that outlives the wait keeps it (and the test fails). */
    attempt *a = calloc(1, sizeof *a);
    assert_non_null(a);
    *a = (attempt){.ca = ca, .cert = cert, .key = key};
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->cond, NULL);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, attempt_run, a), 0);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ATTEMPT_LIMIT_S;
    pthread_mutex_lock(&a->lock);
    while (!a->done && pthread_cond_timedwait(&a->cond, &a->lock, &until) != ETIMEDOUT)
        ;
    int done = a->done;
    pthread_mutex_unlock(&a->lock);
    if (!done)
        fail_msg("%s: the connection attempt did not end within %d s", what, ATTEMPT_LIMIT_S);
    pthread_join(t, NULL);
    int connect_rv = a->connect_rv, ping_rv = a->ping_rv;
    char msg[sizeof a->msg];
    memcpy(msg, a->msg, sizeof msg);
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->cond);
    free(a);
    fprintf(stderr, "%s: connect %s, ping %s: %s\n", what, gpucd_strerror(connect_rv),
            gpucd_strerror(ping_rv), msg);
    if (connect_rv == 0 && ping_rv == 0)
        fail_msg("%s: was served", what);
    int rv = connect_rv != 0 ? connect_rv : ping_rv;
    if (rv != GPUCD_ETRANSPORT && rv != GPUCD_ECLOSED && rv != GPUCD_ETIMEDOUT)
        fail_msg("%s: failed with %s (%s), not a connection error", what, gpucd_strerror(rv),
                 msg);
}

/* ---- the group daemon: tls+tcp:// with client certificates required ------------- */

static int tls_setup(void **state)
{
    (void)state;
    snprintf(tls_url, sizeof tls_url, "tls+tcp://127.0.0.1:%d", th_free_tcp_port());
    char cert[128], key[128], ca[128];
    cert_path(cert, sizeof cert, "server.crt");
    cert_path(key, sizeof key, "server.key");
    cert_path(ca, sizeof ca, "ca.crt");
    const char *extra[] = {"--listen", tls_url, "--tls-cert", cert, "--tls-key", key,
                           "--tls-ca", ca, NULL};
    th_daemon_start(&tls_daemon, extra);
    return 0;
}

static int tls_teardown(void **state)
{
    (void)state;
    return th_daemon_stop_checked(&tls_daemon);
}

static void test_good_client_is_served(void **state)
{
    (void)state;
    gpucd_client *c = good_client();
    gpucd_info info;
    assert_int_equal(gpucd_info_get(c, &info), 0);
    assert_int_equal(info.protocol_version, GPUCD_PROTOCOL_VERSION);
    assert_int_equal(gpucd_ping(c, NULL), 0);

    /* A compute call with its tensors inline: rows of a table, looked up. */
    enum { B = 5, S = 3, V = 17, D = 8 };
    int64_t idx[B * S];
    float table[V * D], out[B * S * D];
    for (int i = 0; i < B * S; i++)
        idx[i] = (int64_t)(th_rand_u64() % V);
    th_fill_f32(table, V * D);
    memset(out, 0xff, sizeof out);
    gpucd_tensor ti = gpucd_tensor_host(idx, GPUCD_I64, 2, TH_SHAPE(B, S));
    gpucd_tensor tt = gpucd_tensor_host(table, GPUCD_F32, 2, TH_SHAPE(V, D));
    gpucd_tensor to = gpucd_tensor_host(out, GPUCD_F32, 3, TH_SHAPE(B, S, D));
    int rv = gpucd_embedding_forward(c, &ti, &tt, &to, NULL);
    if (rv != 0)
        fail_msg("embedding_forward over tls+tcp://: %s: %s", gpucd_strerror(rv),
                 gpucd_errmsg(c));
    for (int i = 0; i < B * S; i++)
        assert_memory_equal(&out[i * D], &table[idx[i] * D], D * sizeof(float));
    gpucd_close(c);
}

/* A TLS peer is remote, however it reaches the daemon: no shared memory. */
static void test_tls_client_is_remote(void **state)
{
    (void)state;
    gpucd_client *c = good_client();
    gpucd_region *r = NULL;
    assert_int_equal(gpucd_region_create(c, 4096, &r), GPUCD_EPERMISSION_DENIED);
    assert_null(r);
    assert_int_equal(gpucd_ping(c, NULL), 0);
    gpucd_close(c);
}

static void test_client_without_certificate_is_refused(void **state)
{
    (void)state;
    expect_refused("no client certificate", "ca.crt", NULL, NULL);
}

static void test_client_of_another_ca_is_refused(void **state)
{
    (void)state;
    expect_refused("a certificate of another CA", "ca.crt", "other.crt", "other.key");
}

static void test_expired_client_certificate_is_refused(void **state)
{
    (void)state;
    expect_refused("an expired certificate", "ca.crt", "old.crt", "old.key");
}

/* The client's side: a daemon whose certificate its CA did not sign is not talked to. */
static void test_client_refuses_an_untrusted_daemon(void **state)
{
    (void)state;
    expect_refused("a daemon the client does not trust", "other-ca.crt", "client.crt",
                   "client.key");
}

/* Options left NULL are taken from GPUCD_TLS_CA, GPUCD_TLS_CERT and GPUCD_TLS_KEY. */
static void test_environment_names_the_files(void **state)
{
    (void)state;
    char ca[128], cert[128], key[128];
    cert_path(ca, sizeof ca, "ca.crt");
    cert_path(cert, sizeof cert, "client.crt");
    cert_path(key, sizeof key, "client.key");
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = CONNECT_TIMEOUT_MS;
    gpucd_client *c = NULL;
    assert_int_equal(gpucd_connect(tls_url, &o, &c), GPUCD_EINVAL);
    assert_non_null(strstr(gpucd_errmsg(NULL), "GPUCD_TLS_CA"));
    assert_null(c);
    setenv("GPUCD_TLS_CA", ca, 1);
    setenv("GPUCD_TLS_CERT", cert, 1);
    assert_int_equal(gpucd_connect(tls_url, &o, &c), GPUCD_EINVAL); /* a certificate, no key */
    assert_non_null(strstr(gpucd_errmsg(NULL), "needs its key"));
    setenv("GPUCD_TLS_KEY", key, 1);
    int rv = gpucd_connect(tls_url, &o, &c);
    if (rv != 0)
        fail_msg("connect with the files from the environment: %s", gpucd_errmsg(NULL));
    assert_int_equal(gpucd_ping(c, NULL), 0);
    gpucd_close(c);
    /* An option wins over its variable. */
    char other[128];
    cert_path(other, sizeof other, "other-ca.crt");
    o.tls_ca = other;
    assert_int_not_equal(gpucd_connect(tls_url, &o, &c), 0);
    unsetenv("GPUCD_TLS_CA");
    unsetenv("GPUCD_TLS_CERT");
    unsetenv("GPUCD_TLS_KEY");
}

typedef struct bad_clients {
    atomic_int stop;
    int attempts, served;
} bad_clients;

/* Not TLS at all: a connection closed at once, the start of a TLS record then garbage, HTTP. */
static void raw_garbage(int kind)
{
    static const char *const bytes[] = {"", "\x16\x03\x01\x01\x50" "garbage",
                                        "GET / HTTP/1.0\r\n\r\n"};
    int port = atoi(strrchr(tls_url, ':') + 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        write(fd, bytes[kind], strlen(bytes[kind])) < 0)
        fprintf(stderr, "raw write: %s\n", strerror(errno));
    if (fd >= 0)
        close(fd);
}

static void *bad_clients_run(void *arg)
{
    bad_clients *b = arg;
    static const char *const who[][3] = {
        {"ca.crt", NULL, NULL},
        {"ca.crt", "other.crt", "other.key"},
        {"ca.crt", "old.crt", "old.key"},
    };
    while (!atomic_load(&b->stop) && b->attempts < 30) {
        const char *const *w = who[b->attempts % 3];
        raw_garbage(b->attempts % 3);
        gpucd_client *c;
        if (tls_connect(w[0], w[1], w[2], &c) == 0) {
            if (gpucd_ping(c, NULL) == 0)
                b->served++;
            gpucd_close(c);
        }
        b->attempts++;
    }
    return NULL;
}

/* Refused handshakes and connections that are no TLS at all, one after another, delay no
 * connected client and turn no new one away. */
static void test_bad_handshakes_leave_good_clients_served(void **state)
{
    (void)state;
    gpucd_client *c = good_client();
    bad_clients b = {.attempts = 0};
    atomic_init(&b.stop, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, bad_clients_run, &b), 0);
    int pings = 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        int rv = gpucd_ping(c, NULL);
        if (rv != 0)
            fail_msg("ping %d during refused handshakes: %s: %s", pings, gpucd_strerror(rv),
                     gpucd_errmsg(c));
        pings++;
        usleep(10000);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (now.tv_sec - t0.tv_sec < 2 || (pings < 20 && now.tv_sec - t0.tv_sec < 60));
    atomic_store(&b.stop, 1);
    pthread_join(t, NULL);
    fprintf(stderr, "%d pings answered during %d refused handshakes\n", pings, b.attempts);
    assert_true(b.attempts > 0);
    assert_int_equal(b.served, 0);
    gpucd_close(c);
    /* And a new good client after them. */
    c = good_client();
    assert_int_equal(gpucd_ping(c, NULL), 0);
    gpucd_close(c);
}

/*
 * --tls-client-auth optional and none let a client without a certificate in (optional checks
 * one that is shown, but nng 1.5 lets a failed check through too: the README says so), and
 * the client still checks the daemon's.
 */
static void test_client_auth_optional_and_none_admit_anyone(void **state)
{
    (void)state;
    static const char *const modes[] = {"optional", "none"};
    char saved[sizeof tls_url];
    snprintf(saved, sizeof saved, "%s", tls_url);
    for (size_t i = 0; i < 2; i++) {
        char cert[128], key[128], ca[128];
        cert_path(cert, sizeof cert, "server.crt");
        cert_path(key, sizeof key, "server.key");
        cert_path(ca, sizeof ca, "ca.crt");
        snprintf(tls_url, sizeof tls_url, "tls+tcp://127.0.0.1:%d", th_free_tcp_port());
        const char *extra[] = {"--listen", tls_url, "--tls-cert", cert, "--tls-key", key,
                               "--tls-ca", ca, "--tls-client-auth", modes[i], NULL};
        th_daemon d;
        th_daemon_start(&d, extra);
        gpucd_client *c;
        int rv = tls_connect("ca.crt", NULL, NULL, &c);
        if (rv != 0)
            fail_msg("--tls-client-auth %s: a client without a certificate: %s", modes[i],
                     gpucd_errmsg(NULL));
        assert_int_equal(gpucd_ping(c, NULL), 0);
        gpucd_close(c);
        expect_refused("a daemon the client does not trust", "other-ca.crt", NULL, NULL);
        assert_int_equal(th_daemon_stop(&d), 0);
    }
    snprintf(tls_url, sizeof tls_url, "%s", saved);
}

/* The client expects the URL's host in the daemon's certificate, whoever signed it. */
static void test_client_refuses_a_certificate_for_another_host(void **state)
{
    (void)state;
    char saved[sizeof tls_url];
    snprintf(saved, sizeof saved, "%s", tls_url);
    char cert[128], key[128], ca[128];
    cert_path(cert, sizeof cert, "elsewhere.crt");
    cert_path(key, sizeof key, "elsewhere.key");
    cert_path(ca, sizeof ca, "ca.crt");
    snprintf(tls_url, sizeof tls_url, "tls+tcp://127.0.0.1:%d", th_free_tcp_port());
    const char *extra[] = {"--listen", tls_url, "--tls-cert", cert, "--tls-key", key,
                           "--tls-ca", ca, NULL};
    th_daemon d;
    th_daemon_start(&d, extra);
    expect_refused("a daemon certified for another host", "ca.crt", "client.crt", "client.key");
    assert_int_equal(th_daemon_stop(&d), 0);
    snprintf(tls_url, sizeof tls_url, "%s", saved);
}

/* ---- which listeners a daemon starts with --------------------------------------- */

/*
 * Runs the daemon with args (NULL-terminated) and expects it to refuse to start: it must
 * exit non-zero with a message on stderr containing each of the needles (NULL-terminated).
 */
static void expect_start_refused(const char *const *args, const char *const *needles)
{
    char text[4096];
    const int status = th_daemon_run_refused(args, text, sizeof text);
    if (status <= 0)
        fail_msg("the daemon did not exit with an error (status %d); its output: %s", status,
                 text);
    const char *lacks = th_text_lacks(text, needles);
    if (lacks != NULL)
        fail_msg("the daemon's message does not mention '%s': %s", lacks, text);
}

static void test_tls_listener_needs_its_files(void **state)
{
    (void)state;
    char url[64], cert[128], key[128];
    snprintf(url, sizeof url, "tls+tcp://127.0.0.1:%d", th_free_tcp_port());
    cert_path(cert, sizeof cert, "server.crt");
    cert_path(key, sizeof key, "server.key");
    expect_start_refused((const char *[]){"--listen", url, NULL},
                         (const char *[]){url, "--tls-cert", "--tls-key", NULL});
    expect_start_refused((const char *[]){"--listen", url, "--tls-cert", cert, NULL},
                         (const char *[]){"--tls-key", NULL});
    expect_start_refused(
        (const char *[]){"--listen", url, "--tls-cert", cert, "--tls-key", key, NULL},
        (const char *[]){"--tls-ca", NULL});
    /* Files that are not there, or no certificate. */
    expect_start_refused((const char *[]){"--listen", url, "--tls-cert", "/nonexistent/s.crt",
                                          "--tls-key", key, "--tls-ca", cert, NULL},
                         (const char *[]){"/nonexistent/s.crt", NULL});
    expect_start_refused((const char *[]){"--listen", url, "--tls-cert", key, "--tls-key", key,
                                          "--tls-ca", cert, NULL},
                         (const char *[]){"certificate", NULL});
}

static void test_plain_tcp_beyond_loopback_is_refused(void **state)
{
    (void)state;
    char url[64];
    snprintf(url, sizeof url, "tcp://0.0.0.0:%d", th_free_tcp_port());
    expect_start_refused((const char *[]){"--listen", url, NULL},
                         (const char *[]){url, "tls+tcp://", "--insecure-tcp", NULL});
}

static void test_plain_tcp_beyond_loopback_with_insecure_tcp_starts(void **state)
{
    (void)state;
    int port = th_free_tcp_port();
    char url[64], local[64];
    snprintf(url, sizeof url, "tcp://0.0.0.0:%d", port);
    snprintf(local, sizeof local, "tcp://127.0.0.1:%d", port);
    th_daemon d;
    th_daemon_start(&d, (const char *[]){"--listen", url, "--insecure-tcp", NULL});
    gpucd_client *c = th_connect(local);
    assert_int_equal(gpucd_ping(c, NULL), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
}

/* The harness's own daemons listen on tcp://127.0.0.1 with no flag (test_config: ::1, localhost). */
static void test_plain_tcp_on_loopback_starts(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, NULL);
    gpucd_client *c = th_connect(d.tcp_url);
    assert_int_equal(gpucd_ping(c, NULL), 0);
    gpucd_close(c);
    assert_int_equal(th_daemon_stop(&d), 0);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (system("openssl version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: no openssl command to make the test certificates with\n");
        return 77;
    }
    if (certs_make() != 0) {
        certs_remove();
        return 1;
    }
    const struct CMUnitTest listeners[] = {
        cmocka_unit_test(test_plain_tcp_beyond_loopback_is_refused),
        cmocka_unit_test(test_tls_listener_needs_its_files),
        cmocka_unit_test(test_plain_tcp_on_loopback_starts),
        cmocka_unit_test(test_plain_tcp_beyond_loopback_with_insecure_tcp_starts),
    };
    const struct CMUnitTest tls[] = {
        cmocka_unit_test(test_good_client_is_served),
        cmocka_unit_test(test_tls_client_is_remote),
        cmocka_unit_test(test_environment_names_the_files),
        cmocka_unit_test(test_client_without_certificate_is_refused),
        cmocka_unit_test(test_client_of_another_ca_is_refused),
        cmocka_unit_test(test_expired_client_certificate_is_refused),
        cmocka_unit_test(test_client_refuses_an_untrusted_daemon),
        cmocka_unit_test(test_client_refuses_a_certificate_for_another_host),
        cmocka_unit_test(test_bad_handshakes_leave_good_clients_served),
        cmocka_unit_test(test_client_auth_optional_and_none_admit_anyone),
    };
    int failed = th_run_group_tests(listeners, NULL, NULL);
    failed += th_run_group_tests(tls, tls_setup, tls_teardown);
    certs_remove();
    return failed != 0;
}
