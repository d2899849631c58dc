/* harness.c - see harness.h. */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gk_bf16.h"

const char *th_daemon_exe;
unsigned th_daemon_nofile;
static uint64_t th_state;

static void th_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void th_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "harness: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

uint64_t th_rand_u64(void)
{
    /* splitmix64: fast, good enough for test data, reproducible from the seed */
    uint64_t z = (th_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void th_init(int argc, char **argv)
{
    if (argc < 2)
        th_die("usage: %s PATH_TO_GPUCD", argv[0]);
    th_daemon_exe = argv[1];
    /* A line at a time: a test that ctest stops at its timeout still shows how far it got. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    th_seed();
}

void th_seed(void)
{
    const char *seed = getenv("GPUCD_TEST_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    th_state = seed != NULL ? strtoull(seed, NULL, 0)
                            : (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                                  ((uint64_t)getpid() << 40);
    fprintf(stderr, "seed: GPUCD_TEST_SEED=%llu\n", (unsigned long long)th_state);
}

void th_fixed_url_init(th_fixed_url *f)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/gpucd-fixed-XXXXXX");
    if (mkdtemp(f->dir) == NULL)
        th_die("mkdtemp %s: %s", f->dir, strerror(errno));
    snprintf(f->url, sizeof f->url, "ipc://%s/fixed.sock", f->dir);
    f->extra[0] = "--listen";
    f->extra[1] = f->url;
    f->extra[2] = NULL;
}

void th_fixed_url_remove(const th_fixed_url *f)
{
    char sock[200];
    snprintf(sock, sizeof sock, "%s/fixed.sock", f->dir);
    unlink(sock);
    snprintf(sock, sizeof sock, "%s/fixed.sock.fd", f->dir); /* the descriptor socket */
    unlink(sock);
    rmdir(f->dir);
}

int th_free_tcp_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        th_die("cannot find a free port: %s", strerror(errno));
    int port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

int th_daemon_run_refused(const char *const *args, char *text, size_t textlen)
{
    char log[] = "/tmp/gpucd-refused-XXXXXX";
    int fd = mkstemp(log);
    if (fd < 0)
        th_die("mkstemp: %s", strerror(errno));
    const char *argv[32] = {th_daemon_exe, "--backend", "cpu", "--stats-listen", "none"};
    int argc = 5;
    for (int i = 0; args[i] != NULL && argc < 31; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        th_die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fd, STDERR_FILENO);
        dup2(fd, STDOUT_FILENO);
        execv(th_daemon_exe, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (waitpid(pid, &status, WNOHANG) != pid) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 60) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            unlink(log);
            th_die("the daemon started (still running after 60 s) with %s", args[0]);
        }
        usleep(10000);
    }
    ssize_t n = pread(fd, text, textlen - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(log);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    fprintf(stderr, "refused (exit %d): %s", code, text);
    return code;
}

const char *th_text_lacks(const char *text, const char *const *needles)
{
    for (int i = 0; needles[i] != NULL; i++)
        if (strstr(text, needles[i]) == NULL)
            return needles[i];
    return NULL;
}

/* Starts it; th_daemon_start then waits until it answers. */
static void daemon_spawn(th_daemon *d, const char *const *extra)
{
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "/tmp/gpucd-test-XXXXXX");
    if (mkdtemp(d->dir) == NULL)
        th_die("mkdtemp: %s", strerror(errno));
    snprintf(d->ipc_url, sizeof d->ipc_url, "ipc://%s/gpucd.sock", d->dir);
    snprintf(d->tcp_url, sizeof d->tcp_url, "tcp://127.0.0.1:%d", th_free_tcp_port());
    snprintf(d->log_path, sizeof d->log_path, "%s/gpucd.log", d->dir);
    const char *argv[64] = {th_daemon_exe, "--listen", d->ipc_url, "--listen", d->tcp_url,
                            "--stats-listen", "none", "--log-level", "debug"};
    int argc = 9;
    const char *backend = getenv("GPUCD_TEST_BACKEND");
    if (backend != NULL) {
        argv[argc++] = "--backend";
        argv[argc++] = backend;
    } else {
        argv[argc++] = "--backend";
        argv[argc++] = "cpu";
    }
    for (int i = 0; extra != NULL && extra[i] != NULL && argc < 62; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        th_die("fork: %s", strerror(errno));
    if (pid == 0) {
        /* A test that crashes must not leave its daemon behind. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(d->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, STDERR_FILENO);
            dup2(fd, STDOUT_FILENO);
        }
        struct rlimit nofile = {th_daemon_nofile, th_daemon_nofile};
        if (th_daemon_nofile != 0 && setrlimit(RLIMIT_NOFILE, &nofile) != 0)
            _exit(126);
        /* GPUCD_TEST_WRAPPER runs the daemon under a tool, e.g. valgrind. */
        const char *wrapper = getenv("GPUCD_TEST_WRAPPER");
        if (wrapper != NULL && *wrapper != '\0') {
            const char *wargv[96];
            int wargc = 0;
            static char words[1024];
            snprintf(words, sizeof words, "%s", wrapper);
            for (char *tok = strtok(words, " "); tok != NULL && wargc < 32;
                 tok = strtok(NULL, " "))
                wargv[wargc++] = tok;
            for (int i = 0; i < argc && wargc < 95; i++)
                wargv[wargc++] = argv[i];
            wargv[wargc] = NULL;
            execvp(wargv[0], (char *const *)wargv);
        } else {
            execv(th_daemon_exe, (char *const *)argv);
        }
        _exit(127);
    }
    d->pid = pid;
}

void th_daemon_start(th_daemon *d, const char *const *extra)
{
    daemon_spawn(d, extra);
    const pid_t pid = d->pid;
    /* Ready when it answers a ping on both URLs; a daemon that died is a failure.  60 s of
     * wall time (valgrind starts slowly), however long each try takes. */
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            th_daemon_dump_log(d);
            th_die("the daemon exited during start (status %d)", status);
        }
        gpucd_options o;
        gpucd_options_init(&o);
        o.timeout_ms = 1000;
        gpucd_client *a = NULL, *b = NULL;
        int ok = gpucd_connect(d->ipc_url, &o, &a) == 0 && gpucd_ping(a, NULL) == 0 &&
                 gpucd_connect(d->tcp_url, &o, &b) == 0 && gpucd_ping(b, NULL) == 0;
        gpucd_close(a);
        gpucd_close(b);
        if (ok)
            return;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 60)
            break;
        usleep(10000);
    }
    th_daemon_dump_log(d);
    th_die("the daemon did not answer within 60 s");
}

/* The log, the socket and the folder of a daemon that has exited. */
static void daemon_remove_files(const th_daemon *d)
{
    unlink(d->log_path);
    char sock[300];
    snprintf(sock, sizeof sock, "%s/gpucd.sock", d->dir);
    unlink(sock);
    snprintf(sock, sizeof sock, "%s/gpucd.sock.fd", d->dir); /* the descriptor socket */
    unlink(sock);
    rmdir(d->dir);
}

int th_daemon_stop(th_daemon *d)
{
    if (d->pid <= 0)
        return -1;
    kill(d->pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < 2000; i++) { /* 20 s */
        pid_t r = waitpid(d->pid, &status, WNOHANG);
        if (r == d->pid)
            break;
        if (i == 1999) {
            th_daemon_dump_log(d);
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &status, 0);
            d->pid = 0;
            return -1000;
        }
        usleep(10000);
    }
    d->pid = 0;
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    if (rc != 0)
        th_daemon_dump_log(d);
    daemon_remove_files(d);
    return rc;
}

void th_daemon_kill(th_daemon *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    d->pid = 0;
    daemon_remove_files(d);
}

th_daemon th_group_daemon;

int th_group_daemon_setup(void **state)
{
    (void)state;
    th_daemon_start(&th_group_daemon, NULL);
    return 0;
}

int th_group_daemon_teardown(void **state)
{
    (void)state;
    return th_daemon_stop_checked(&th_group_daemon);
}

void th_daemon_dump_log(const th_daemon *d)
{
    FILE *f = fopen(d->log_path, "r");
    if (f == NULL)
        return;
    char line[1024];
    fprintf(stderr, "---- daemon log %s ----\n", d->log_path);
    while (fgets(line, sizeof line, f) != NULL)
        fputs(line, stderr);
    fprintf(stderr, "---- end of daemon log ----\n");
    fclose(f);
}

gpucd_client *th_connect(const char *url)
{
    gpucd_client *c;
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = 60000;
    int rc = gpucd_connect(url, &o, &c);
    if (rc != 0)
        th_die("connect %s: %s: %s", url, gpucd_strerror(rc), gpucd_errmsg(NULL));
    return c;
}

void th_wait_for_reconnect(gpucd_client *c)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (gpucd_ping(c, NULL) != 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 30)
            th_die("no ping through the restarted daemon within 30 s: %s", gpucd_errmsg(c));
        usleep(20000);
    }
}

static float th_uniform(void) { return (float)((double)(th_rand_u64() >> 11) * 0x1p-53 * 2.0 - 1.0); }

void *th_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        th_die("out of memory for %zu bytes", n);
    return p;
}

void th_fill_f32(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = th_uniform();
}

void th_fill_bf16(uint16_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = gk_f32_to_bf16(th_uniform());
}

void th_fill_nmmo3_obs(uint8_t *obs, size_t batch)
{
    static const int factors[10] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};
    for (size_t b = 0; b < batch; b++) {
        uint8_t *o = obs + b * 1707;
        for (int t = 0; t < 11 * 15; t++)
            for (int f = 0; f < 10; f++)
                o[t * 10 + f] = (uint8_t)(th_rand_u64() % (uint64_t)factors[f]);
        for (int i = 0; i < 47; i++)
            o[1650 + i] = (uint8_t)(th_rand_u64() % 128);
        for (int i = 0; i < 10; i++)
            o[1697 + i] = i < 9 ? (uint8_t)(th_rand_u64() % 256) : 0;
    }
}

int th_daemon_stop_checked(th_daemon *d)
{
    int rc = th_daemon_stop(d);
    if (rc != 0)
        fprintf(stderr, "daemon exit status %d, expected 0\n", rc);
    return rc != 0 ? -1 : 0;
}

void th_lce_cpu(const gk_lce *p, gk_dtype dt, int64_t n, int64_t d, int64_t v, const void *E,
                const void *C, const void *bias, const int64_t *targets, float *loss, float *lse,
                float *dE, float *dC, float *dbias)
{
    gk_tensor ge = gk_tensor_make((void *)(uintptr_t)E, dt, 2, TH_SHAPE(n, d));
    gk_tensor gc = gk_tensor_make((void *)(uintptr_t)C, dt, 2, TH_SHAPE(v, d));
    gk_tensor gb = gk_tensor_make((void *)(uintptr_t)bias, dt, 1, TH_SHAPE(v));
    gk_tensor gt = gk_tensor_make((void *)(uintptr_t)targets, GK_I64, 1, TH_SHAPE(n));
    gk_tensor gl = gk_tensor_make(loss, GK_F32, 1, TH_SHAPE(n));
    gk_tensor gs = gk_tensor_make(lse, GK_F32, 1, TH_SHAPE(n));
    gk_tensor gde = gk_tensor_make(dE, GK_F32, 2, TH_SHAPE(n, d));
    gk_tensor gdc = gk_tensor_make(dC, GK_F32, 2, TH_SHAPE(v, d));
    gk_tensor gdb = gk_tensor_make(dbias, GK_F32, 1, TH_SHAPE(v));
    gk_err err;
    if (gk_cpu_lce(p, &ge, &gc, &gb, &gt, &gl, &gs, &gde, &gdc, &gdb, &err) != 0)
        th_die("the CPU loss failed: %s", err.msg);
}

/* ---- group setup and teardown, counted (harness.h) ---------------------------- */

static th_group_fn group_setup_fn, group_teardown_fn;
/* Raised before each hook and lowered when it returns 0: a hook left by a failed assertion
 * (cmocka jumps out of it) counts as failed too. */
static int group_failures;

void th_group_hooks(th_group_fn setup, th_group_fn teardown)
{
    group_setup_fn = setup;
    group_teardown_fn = teardown;
    group_failures = 0;
}

static int group_hook_run(th_group_fn fn, void **state)
{
    group_failures++;
    int rc = fn != NULL ? fn(state) : 0;
    if (rc == 0)
        group_failures--;
    return rc;
}

int th_group_setup(void **state) { return group_hook_run(group_setup_fn, state); }

int th_group_teardown(void **state) { return group_hook_run(group_teardown_fn, state); }

int th_group_verdict(int cmocka_failed)
{
    if (cmocka_failed != 0)
        return cmocka_failed;
    if (group_failures != 0)
        fprintf(stderr, "harness: the group's setup or teardown failed\n");
    return group_failures != 0;
}

uint64_t th_json_number(const char *json, const char *key)
{
    const char *p = strstr(json, key);
    return p != NULL ? strtoull(p + strlen(key), NULL, 10) : UINT64_MAX;
}
