/*
 * test_systemd.c - the daemon under systemd, as systemd would see it, without systemd.
 *
 * `test_systemd GPUCD journal`: with JOURNAL_STREAM naming the file its stderr is (as systemd
 * sets it for a service logging to the journal), every line the daemon writes starts with its
 * syslog priority: <6> for the ready line, <4> for a warning, <3> for a failure to start and for
 * bad options; with JOURNAL_STREAM naming another file, no line does.
 *
 * `test_systemd GPUCD notify`: with NOTIFY_SOCKET naming a datagram socket the test bound (as
 * systemd sets it for Type=notify), the daemon sends STATUS while warming up, READY=1 only once
 * its ready line is written and it answers, a STATUS line that follows its clients, WATCHDOG=1
 * when WATCHDOG_USEC is set (and never when it is not), and STOPPING=1 then a draining STATUS on
 * SIGTERM.  Skipped (77) in a build without libsystemd, which sends nothing.
 */
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
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

/* Bounds on waits for what must happen; none is a timing assumption, only a hang's limit. */
enum { WAIT_S = 60 };

typedef struct proc {
    pid_t pid;
    char dir[64];
    char log[128];
    char url[160];
} proc;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void proc_dir(proc *p)
{
    memset(p, 0, sizeof *p);
    snprintf(p->dir, sizeof p->dir, "/tmp/gpucd-systemd-XXXXXX");
    assert_non_null(mkdtemp(p->dir));
    snprintf(p->log, sizeof p->log, "%s/stderr", p->dir);
    snprintf(p->url, sizeof p->url, "ipc://%s/gpucd.sock", p->dir);
}

/*
 * Starts the daemon with stderr on p->log (made by the caller or here), the variables of env
 * ("NAME=VALUE"; "WATCHDOG_PID=" gets the daemon's own pid) and its own ipc:// URL unless
 * extra gives other arguments first.
 */
static void proc_spawn(proc *p, const char *const *env, const char *const *extra)
{
    const char *argv[32] = {th_daemon_exe, "--stats-listen", "none", "--log-level", "debug",
                            "--backend"};
    int argc = 6;
    const char *backend = getenv("GPUCD_TEST_BACKEND");
    argv[argc++] = backend != NULL ? backend : "cpu";
    int listen_given = 0;
    for (int i = 0; extra != NULL && extra[i] != NULL && argc < 28; i++) {
        listen_given |= strcmp(extra[i], "--listen") == 0;
        argv[argc++] = extra[i];
    }
    if (!listen_given) {
        argv[argc++] = "--listen";
        argv[argc++] = p->url;
    }
    argv[argc] = NULL;
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0 || dup2(fd, STDOUT_FILENO) < 0)
            _exit(126);
        for (int i = 0; env != NULL && env[i] != NULL; i++) {
            if (strcmp(env[i], "WATCHDOG_PID=") == 0) {
                char pid[32];
                snprintf(pid, sizeof pid, "%d", (int)getpid());
                setenv("WATCHDOG_PID", pid, 1);
            } else {
                putenv((char *)env[i]);
            }
        }
        execv(th_daemon_exe, (char *const *)argv);
        _exit(127);
    }
}

/* The daemon's stderr so far (free it). */
static char *proc_log(const proc *p)
{
    FILE *f = fopen(p->log, "r");
    assert_non_null(f);
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    assert_non_null(s);
    size_t n;
    while ((n = fread(s + len, 1, cap - 1 - len, f)) > 0) {
        len += n;
        if (len + 1 == cap) {
            cap *= 2;
            s = realloc(s, cap);
            assert_non_null(s);
        }
    }
    fclose(f);
    s[len] = '\0';
    return s;
}

/* Waits for the daemon's exit; its status, or -signal. */
static int proc_wait(proc *p)
{
    int status;
    for (double t0 = now_s(); waitpid(p->pid, &status, WNOHANG) != p->pid;) {
        if (now_s() - t0 > WAIT_S) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            fail_msg("the daemon did not exit in %d s", WAIT_S);
        }
        usleep(10000);
    }
    p->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

/* Waits until the daemon's stderr holds what; fails if it exits first. */
static void proc_wait_log(proc *p, const char *what)
{
    for (double t0 = now_s();;) {
        char *s = proc_log(p);
        const int found = strstr(s, what) != NULL;
        if (!found && (now_s() - t0 > WAIT_S || waitpid(p->pid, NULL, WNOHANG) == p->pid))
            fail_msg("the daemon never wrote '%s'; its stderr:\n%s", what, s);
        free(s);
        if (found)
            return;
        usleep(10000);
    }
}

static void proc_remove(const proc *p)
{
    char path[200];
    static const char *const files[] = {"stderr", "gpucd.sock", "gpucd.sock.fd", "notify.sock"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", p->dir, files[i]);
        unlink(path);
    }
    rmdir(p->dir);
}

/* "JOURNAL_STREAM=DEV:INO" of path, in out. */
static void journal_stream_of(const char *path, char *out, size_t len)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    snprintf(out, len, "JOURNAL_STREAM=%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
}

/* Every line of text starts with "<N>" (prefixed) or with none (plain). */
static void assert_lines(const char *text, int prefixed)
{
    for (const char *line = text; *line != '\0';) {
        const char *nl = strchr(line, '\n');
        assert_non_null(nl);
        const int has = line[0] == '<' && line[1] >= '0' && line[1] <= '7' && line[2] == '>';
        if (has != prefixed)
            fail_msg("%s priority: %.*s", prefixed ? "a line without its" : "a line with a",
                     (int)(nl - line), line);
        line = nl + 1;
    }
}

static void make_log(proc *p)
{
    int fd = open(p->log, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
}

static void test_journal_priorities(void **state)
{
    proc p;
    proc_dir(&p);
    make_log(&p);
    char js[96];
    journal_stream_of(p.log, js, sizeof js);
    const char *env[] = {js, NULL};
    /* more connections than descriptors: a warning at start */
    const char *extra[] = {"--max-connections", "16777216", NULL};
    proc_spawn(&p, env, extra);
    proc_wait_log(&p, "<6>info: ready: ");
    gpucd_client *c = th_connect(p.url);
    assert_int_equal(gpucd_ping(c, NULL), 0);
    gpucd_close(c);
    kill(p.pid, SIGTERM);
    assert_int_equal(proc_wait(&p), 0);
    char *text = proc_log(&p);
    assert_lines(text, 1);
    if (strstr(text, "<4>warn: ") == NULL || strstr(text, "<7>debug: ") == NULL ||
        strstr(text, "<6>info: stopped") == NULL)
        fail_msg("a warning, a debug line and the stop expected:\n%s", text);
    free(text);
    proc_remove(&p);
}

static void test_journal_errors(void **state)
{
    /* a listener that cannot be made: exit 1, with the reason at priority 3 */
    proc p;
    proc_dir(&p);
    make_log(&p);
    char js[96];
    journal_stream_of(p.log, js, sizeof js);
    const char *env[] = {js, NULL};
    const char *no_dir[] = {"--listen", "ipc:///nonexistent-gpucd-dir/gpucd.sock", NULL};
    proc_spawn(&p, env, no_dir);
    assert_int_equal(proc_wait(&p), 1);
    char *text = proc_log(&p);
    assert_lines(text, 1);
    assert_non_null(strstr(text, "<3>error: "));
    free(text);
    /* bad options: exit 2, priority 3 */
    unlink(p.log);
    make_log(&p);
    journal_stream_of(p.log, js, sizeof js);
    const char *bad[] = {"--frobnicate", NULL};
    proc_spawn(&p, env, bad);
    assert_int_equal(proc_wait(&p), 2);
    text = proc_log(&p);
    assert_lines(text, 1);
    assert_non_null(strstr(text, "<3>error: unknown option '--frobnicate'"));
    free(text);
    proc_remove(&p);
}

/* JOURNAL_STREAM of another file (stderr redirected since systemd set it): plain lines. */
static void test_not_the_journal(void **state)
{
    proc p;
    proc_dir(&p);
    make_log(&p);
    char js[96];
    journal_stream_of(p.dir, js, sizeof js);
    const char *env[] = {js, NULL};
    proc_spawn(&p, env, NULL);
    proc_wait_log(&p, "info: ready: ");
    kill(p.pid, SIGTERM);
    assert_int_equal(proc_wait(&p), 0);
    char *text = proc_log(&p);
    assert_lines(text, 0);
    free(text);
    proc_remove(&p);
}

/* ---- notifications ---------------------------------------------------------------------- */

typedef struct notify_sock {
    int fd;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char env[160];
    int watchdogs; /* WATCHDOG=1 received so far */
} notify_sock;

static void notify_bind(notify_sock *n, const proc *p)
{
    memset(n, 0, sizeof *n);
    snprintf(n->path, sizeof n->path, "%s/notify.sock", p->dir);
    snprintf(n->env, sizeof n->env, "NOTIFY_SOCKET=%s", n->path);
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(n->fd >= 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", n->path);
    assert_int_equal(bind(n->fd, (struct sockaddr *)&sa, sizeof sa), 0);
}

/* The next message (NUL-terminated in buf); fails after WAIT_S or when the daemon exited. */
static void notify_next(notify_sock *n, proc *p, char *buf, size_t len)
{
    for (double t0 = now_s();;) {
        /* whether it had exited before the poll (then all it sent is queued already); not
         * reaped, so that proc_wait still reads its status */
        siginfo_t si = {0};
        const int exited =
            waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid != 0;
        struct pollfd pfd = {.fd = n->fd, .events = POLLIN};
        if (poll(&pfd, 1, exited ? 0 : 100) == 1) {
            ssize_t r = recv(n->fd, buf, len - 1, 0);
            assert_true(r >= 0);
            buf[r] = '\0';
            n->watchdogs += strcmp(buf, "WATCHDOG=1") == 0;
            return;
        }
        if (exited)
            fail_msg("the daemon exited before its next notification");
        if (now_s() - t0 > WAIT_S)
            fail_msg("no notification in %d s", WAIT_S);
    }
}

/* Receives messages until one starting with prefix; returns in buf. */
static void notify_until(notify_sock *n, proc *p, const char *prefix, char *buf, size_t len)
{
    do
        notify_next(n, p, buf, len);
    while (strncmp(buf, prefix, strlen(prefix)) != 0);
}

static void test_notify_ready_status_watchdog_stopping(void **state)
{
    proc p;
    proc_dir(&p);
    notify_sock n;
    notify_bind(&n, &p);
    const char *env[] = {n.env, "WATCHDOG_USEC=200000", "WATCHDOG_PID=", NULL};
    proc_spawn(&p, env, NULL);

    char msg[512];
    notify_next(&n, &p, msg, sizeof msg);
    assert_string_equal(msg, "STATUS=warming up the backend");
    char last_status[512] = "";
    do {
        notify_next(&n, &p, msg, sizeof msg);
        if (strncmp(msg, "STATUS=", 7) == 0)
            snprintf(last_status, sizeof last_status, "%s", msg);
    } while (strcmp(msg, "READY=1") != 0);
    /* the watchdog starts with the service: none while warming up */
    assert_int_equal(n.watchdogs, 0);
    /* READY=1 came after the ready line was written, and the daemon answers */
    char *text = proc_log(&p);
    if (strstr(text, "info: ready: ") == NULL)
        fail_msg("READY=1 before the ready line:\n%s", text);
    free(text);
    if (strncmp(last_status, "STATUS=serving 0 clients", 24) != 0)
        fail_msg("the status with READY=1: '%s'", last_status);
    gpucd_client *c = th_connect(p.url);
    assert_int_equal(gpucd_ping(c, NULL), 0);

    /* the status follows the clients; each status tick pings the watchdog first */
    notify_until(&n, &p, "STATUS=serving 1 clients", msg, sizeof msg);
    assert_true(n.watchdogs >= 1);
    while (n.watchdogs < 3)
        notify_next(&n, &p, msg, sizeof msg);
    gpucd_close(c);

    kill(p.pid, SIGTERM);
    notify_until(&n, &p, "STOPPING=1", msg, sizeof msg);
    notify_until(&n, &p, "STATUS=", msg, sizeof msg);
    if (strncmp(msg, "STATUS=draining", 15) != 0)
        fail_msg("the status after STOPPING=1: '%s'", msg);
    assert_int_equal(proc_wait(&p), 0);
    close(n.fd);
    proc_remove(&p);
}

/* No WATCHDOG_USEC: no WATCHDOG=1, from start to exit. */
static void test_notify_without_watchdog(void **state)
{
    proc p;
    proc_dir(&p);
    notify_sock n;
    notify_bind(&n, &p);
    const char *env[] = {n.env, NULL};
    proc_spawn(&p, env, NULL);
    char msg[512];
    notify_until(&n, &p, "READY=1", msg, sizeof msg);
    kill(p.pid, SIGTERM);
    notify_until(&n, &p, "STOPPING=1", msg, sizeof msg);
    assert_int_equal(proc_wait(&p), 0);
    /* everything it sent before it exited is queued on the socket */
    struct pollfd pfd = {.fd = n.fd, .events = POLLIN};
    while (poll(&pfd, 1, 0) == 1)
        notify_next(&n, &p, msg, sizeof msg);
    assert_int_equal(n.watchdogs, 0);
    close(n.fd);
    proc_remove(&p);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    if (argc > 2 && strcmp(argv[2], "notify") == 0) {
#ifndef GPUCD_HAVE_SYSTEMD
        fprintf(stderr, "built without libsystemd (GPUCD_SYSTEMD): no notifications; skipped\n");
        return 77;
#endif
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_notify_ready_status_watchdog_stopping),
            cmocka_unit_test(test_notify_without_watchdog),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_journal_priorities),
        cmocka_unit_test(test_journal_errors),
        cmocka_unit_test(test_not_the_journal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
