/*
 * harness.h - starts a real gpucd for a test and stops it, plus random data.
 *
 * Each test program gets the daemon's path as argv[1] (from ctest), starts its
 * own daemon on a fresh ipc:// path in a private temporary folder and on a
 * free tcp:// loopback port, and stops it with SIGTERM at the end, checking
 * that it exited 0.
 */
#ifndef TH_HARNESS_H
#define TH_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gk.h"
#include "gpucd.h"

typedef struct th_daemon {
    pid_t pid;
    char dir[128];
    char ipc_url[256];
    char tcp_url[64];
    char log_path[200];
} th_daemon;

/* The daemon executable, set by th_init from argv[1]. */
extern const char *th_daemon_exe;

/* Reads argv (argv[1]: the daemon) and seeds the random generator (printed). */
void th_init(int argc, char **argv);
/* Only seeds the random generator (printed), for tests that start no daemon. */
void th_seed(void);

/* The descriptor limit (soft and hard) of the daemons started next; 0: this process's own. */
extern unsigned th_daemon_nofile;
/* Starts a daemon with extra flags (NULL-terminated, may be NULL); waits until it answers. */
void th_daemon_start(th_daemon *d, const char *const *extra);
/* SIGTERM; waits; returns the exit status (or -signal). */
int th_daemon_stop(th_daemon *d);
/* SIGKILL, as a crash would end it (no drain); waits; removes its files. */
void th_daemon_kill(th_daemon *d);
/* th_daemon_stop for a group teardown: 0 when the daemon exited 0, else -1 with a message. */
int th_daemon_stop_checked(th_daemon *d);
/*
 * The daemon of a test group that needs no flags of its own: th_group_daemon_setup starts
 * it, th_group_daemon_teardown stops it and checks that it exited 0 (th_daemon_stop_checked).
 */
extern th_daemon th_group_daemon;
int th_group_daemon_setup(void **state);
int th_group_daemon_teardown(void **state);
/*
 * Runs the daemon with args (NULL-terminated, after "--backend cpu --stats-listen none", which
 * they may override) for a start it should refuse: waits up to 60 s for it to exit (ending the
 * test when it is still running then).  Returns its exit status (-signal when killed by one),
 * its output (stderr and stdout) in text.
 */
int th_daemon_run_refused(const char *const *args, char *text, size_t textlen);
/* The first of needles (NULL-terminated) that text does not contain; NULL when it has them all. */
const char *th_text_lacks(const char *text, const char *const *needles);

/* Prints the daemon's log (for a failing test). */
void th_daemon_dump_log(const th_daemon *d);

gpucd_client *th_connect(const char *url);
/* The client redials on its own: pings until one goes through, 30 s of wall time at most. */
void th_wait_for_reconnect(gpucd_client *c);

/*
 * A daemon at a fixed URL in a fresh folder, restarted as a supervisor would: start each one with
 * th_daemon_start(&d, f.extra).  Removing it also removes what a killed daemon left there.
 */
typedef struct th_fixed_url {
    char dir[32], url[128];
    const char *extra[3];
} th_fixed_url;
void th_fixed_url_init(th_fixed_url *f);
void th_fixed_url_remove(const th_fixed_url *f);

/* A loopback tcp port nothing listens on at the moment (for a listener of the test's own). */
int th_free_tcp_port(void);

/*
 * The reference the daemon's loss is compared with: gk_cpu_lce with params p
 * on E (n x d), C (v x d) and bias (v) of dtype dt, int64 targets, into f32
 * per-row loss and LSE and every gradient (p->reduction must be none).  Ends
 * the test process if the CPU kernel fails.
 */
void th_lce_cpu(const gk_lce *p, gk_dtype dt, int64_t n, int64_t d, int64_t v, const void *E,
                const void *C, const void *bias, const int64_t *targets, float *loss, float *lse,
                float *dE, float *dC, float *dbias);

/*
 * cmocka's group runner with the group's setup and teardown counted: cmocka
 * 1.1 (Debian 12's) prints a failed group teardown but returns 0, so a daemon
 * that exited with an error at the end (valgrind's error exit code, a
 * sanitizer's) passed.  Use instead of cmocka_run_group_tests (tests is the
 * array of tests; setup and teardown may be NULL).
 */
typedef int (*th_group_fn)(void **state);
void th_group_hooks(th_group_fn setup, th_group_fn teardown);
int th_group_setup(void **state);
int th_group_teardown(void **state);
int th_group_verdict(int cmocka_failed);
#define th_run_group_tests(tests, setup, teardown)                                                 \
    (th_group_hooks((setup), (teardown)),                                                          \
     th_group_verdict(cmocka_run_group_tests((tests), th_group_setup, th_group_teardown)))

/* Uniform in [-1, 1); never all zeros. */
/* malloc that fails the test instead of returning NULL (n = 0 allowed). */
void *th_xmalloc(size_t n);
void th_fill_f32(float *p, size_t n);
void th_fill_bf16(uint16_t *p, size_t n);
/* Valid NMMO3 observations (1707 bytes each). */
void th_fill_nmmo3_obs(uint8_t *obs, size_t batch);
uint64_t th_rand_u64(void);

/* The number after key's first occurrence in json (key ends with its colon); UINT64_MAX when
 * absent. */
uint64_t th_json_number(const char *json, const char *key);

/* Shorthand for a tensor shape. */
#define TH_SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define TH_NDIM(...) ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

#endif
