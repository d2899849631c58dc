/*
 * test_chaos.c - the whole "safe to share" promise at once.  For CHAOS_SECONDS (default 60)
 * well-behaved client processes (CHAOS_CLIENTS, default 8, the last one over tcp://) check
 * every answer against the CPU kernels and re-read resident tensors of known contents, while
 * hostile processes flip their own input bytes mid-request, flood connections and quotas,
 * disconnect mid-request, send garbage and hand-made bad requests, write into and free
 * others' objects by guessed ids, shrink and alias regions, and are SIGKILLed at random
 * moments (and replaced); the daemon is restarted twice at the same URL.  Pass: the daemon
 * never died unasked, every OK answer was right, no stale id reached another client's
 * object, every well-behaved client got an OK answer from the last daemon, and once everyone
 * left the daemon holds no region and no resident tensor.
 *
 * CHAOS_ACTS=flip,flood,... picks the acts (act_names; default all); CHAOS_VERBOSE=1 prints
 * every refusal a well-behaved client gets.  Every process is this program run again with
 * --chaos-role (nng may not be used in a child forked after its parent used it); all share
 * one page of counters (a memfd).  What is checked does not depend on timing: a refusal or a
 * lost call is counted, never a latency.  The last line is the summary.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gk.h"
#include "harness.h"
#include "raw.h"

/*
 * These processes only (the daemon is another program): nng 1.5.2 leaks the objects of a
 * connection closed while a message is in flight, which the hostile processes do on purpose.
 */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libnng.so\n"; }

/* ---- acts and the counters every process shares ------------------------------------ */

/* The acts before ACT_KILL each run as a hostile process of their own; kill and restart are
 * done by the test's main process. */
typedef enum act {
    ACT_FLIP,
    ACT_FLOOD,
    ACT_QUOTA,
    ACT_DISCONNECT,
    ACT_GARBAGE,
    ACT_SHRINK,
    ACT_ALIAS,
    ACT_TRESPASS,
    ACT_KILL,
    ACT_RESTART,
    ACT_COUNT
} act;

static const char *const act_names[ACT_COUNT] = {
    "flip", "flood", "quota", "disconnect", "garbage", "shrink", "alias", "trespass", "kill",
    "restart"};

enum { MAX_CLIENTS = 32 };
/* The least time the daemon started by a restart serves before everyone leaves. */
enum { LAST_DAEMON_MS = 10000 };

typedef struct chaos_shared {
    atomic_uint gen;     /* 2k while the k-th daemon serves, 2k + 1 while it restarts */
    atomic_int tcp_port; /* of the daemon serving now (the ipc:// URL stays) */
    atomic_int stop;
    /* the well-behaved clients' calls */
    atomic_ullong requests, ok, refused, wrong, stale;
    atomic_ullong faults[ACT_COUNT];
    /* per well-behaved client: gen when its last OK call started */
    atomic_uint last_ok_gen[MAX_CLIENTS];
} chaos_shared;

static chaos_shared *sh;
static char ipc_url[200];
static int verbose; /* CHAOS_VERBOSE=1: every refusal of a well-behaved call is printed */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

static unsigned gen_now(void) { return atomic_load(&sh->gen); }

static int stopping(void) { return atomic_load(&sh->stop); }

static void fault(act a) { atomic_fetch_add(&sh->faults[a], 1); }

static void tcp_url(char url[64])
{
    snprintf(url, 64, "tcp://127.0.0.1:%d", atomic_load(&sh->tcp_port));
}

/* A test bug, not a finding: the process ends with 2. */
static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "chaos: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static gpucd_client *connect_to(const char *url, int timeout_ms)
{
    gpucd_options o;
    gpucd_options_init(&o);
    o.timeout_ms = timeout_ms;
    gpucd_client *c = NULL;
    return gpucd_connect(url, &o, &c) == 0 ? c : NULL;
}

static void poison(void *p, size_t n) { memset(p, 0xff, n); }

static void check_ref(int rc, const gk_err *err, const char *what)
{
    if (rc != 0)
        die("the CPU kernel refused %s: %s", what, err->msg);
}

/* ---- a well-behaved client ------------------------------------------------------------- */

enum {
    KNOWN = 3,
    KNOWN_ROWS = 4,
    KNOWN_COLS = 256,
    KNOWN_N = KNOWN_ROWS * KNOWN_COLS,
    MH_B = 4,
    EMB_V = 128,
    EMB_D = 32,
    EMB_L = 47,
    CONV_N = 2,
    CONV_C = 8,
    CONV_OC = 16,
    CONV_K = 3,
    LCE_N = 8,
    LCE_D = 16,
    LCE_V = 64,
    NM_WEIGHTS = 5, /* the encoder without its projection: features out */
};

/* Byte offsets of each operation's tensors in a client's region (a host buffer over tcp). */
enum {
    OFF_MH_OBS = 0,         /* (MH_B, 1707) u8 */
    OFF_MH_OUT = 8192,      /* (MH_B, 59, 11, 15) f32 */
    OFF_EMB_IDX = 172032,   /* (MH_B, EMB_L) i64 */
    OFF_EMB_OUT = 176128,   /* (MH_B, EMB_L, EMB_D) f32 */
    OFF_CONV_X = 204800,    /* (CONV_N, CONV_C, 11, 15) f32 */
    OFF_CONV_Y = 217088,    /* (CONV_N, CONV_OC, 11, 15) f32 */
    OFF_NM_OBS = 241664,    /* (1, 1707) u8 */
    OFF_NM_FEAT = 245760,   /* (1, 1817) f32 */
    OFF_GET = 253952,       /* a known tensor read back */
    AREA_BYTES = 262144,
};

static const int64_t nm_shapes[NM_WEIGHTS][4] = {
    {128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128}, {128, 32}};
static const int nm_ndim[NM_WEIGHTS] = {4, 1, 4, 1, 2};

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/*
 * Element i of known tensor `serial` of client `slot`: a header (magic, slot, serial) that
 * says whose tensor a read-back one is, then integers, exact in f32.
 */
enum { KNOWN_MAGIC = 4242 };
static float known_value(int slot, uint32_t serial, int i)
{
    if (i == 0)
        return (float)KNOWN_MAGIC;
    if (i == 1)
        return (float)slot;
    if (i == 2)
        return (float)serial;
    uint64_t z = mix64(((uint64_t)slot << 48) ^ ((uint64_t)serial << 16) ^ (uint64_t)i);
    return (float)((int)(z % 2001) - 1000);
}

typedef struct good {
    int slot, remote;
    gpucd_client *c;
    unsigned conn_gen; /* gen when c connected */
    unsigned made_gen; /* gen when the objects below were made */
    int ready;
    int stuck; /* a call timed out: the connection is made again */
    gpucd_region *r;
    uint8_t *area; /* the region's bytes, or host_area over tcp */
    uint8_t *host_area;
    uint64_t known[KNOWN];
    uint32_t known_serial[KNOWN], next_serial;
    uint64_t table_id, convw_id, lce_c_id, nm_ids[NM_WEIGHTS];
    float table[EMB_V * EMB_D], convw[CONV_OC * CONV_C * CONV_K * CONV_K], convb[CONV_OC];
    float lce_c[LCE_V * LCE_D];
    float *nm[NM_WEIGHTS];
    size_t nm_n[NM_WEIGHTS];
} good;

/*
 * Counts one call's answer.  What a well-behaved client may be refused: a lost connection,
 * a timeout, a draining daemon or a full one, and (after a restart only) its objects being
 * gone.  Anything else, or an OK with a wrong answer, is a wrong answer.  Returns 0 when the
 * client must make its objects again.
 */
static int good_answer(good *g, int rv, int right, const char *what, unsigned gen0)
{
    atomic_fetch_add(&sh->requests, 1);
    if (rv == 0) {
        if (right) {
            atomic_fetch_add(&sh->ok, 1);
            atomic_store(&sh->last_ok_gen[g->slot], gen0);
            return 1;
        }
        atomic_fetch_add(&sh->wrong, 1);
        fprintf(stderr, "chaos: client %d: %s answered OK, but the answer is wrong (daemon gen %u)\n",
                g->slot, what, gen0);
        return 1;
    }
    atomic_fetch_add(&sh->refused, 1);
    const int restarted = gen_now() != g->made_gen;
    const int expected = rv == GPUCD_ECLOSED || rv == GPUCD_ETIMEDOUT ||
                         rv == GPUCD_ECONNREFUSED || rv == GPUCD_EUNAVAILABLE ||
                         rv == GPUCD_ERESOURCE_EXHAUSTED ||
                         (restarted && (rv == GPUCD_ENOT_FOUND || rv == GPUCD_EPERMISSION_DENIED));
    /* nng 1.5.2 now and then never accepts a connection (see test_bad_input): a client that
     * waited a whole timeout connects again, as a real one would. */
    g->stuck |= rv == GPUCD_ETIMEDOUT;
    /* An id of the old daemon that names another client's object of another shape. */
    if (restarted && rv == GPUCD_EINVALID_ARGUMENT)
        atomic_fetch_add(&sh->stale, 1);
    if (!expected)
        atomic_fetch_add(&sh->wrong, 1);
    if (!expected || verbose)
        fprintf(stderr, "chaos: client %d: %s refused%s: %s: %s (daemon gen %u, now %u)\n",
                g->slot, what, expected ? "" : " unexpectedly", gpucd_strerror(rv),
                gpucd_errmsg(g->c), gen0, gen_now());
    g->ready = 0;
    return 0;
}

static gpucd_tensor good_tensor(const good *g, int inl, uint64_t off, gpucd_dtype dt, int ndim,
                                const int64_t *shape)
{
    if (g->remote || inl)
        return gpucd_tensor_host(g->area + off, dt, ndim, shape);
    return gpucd_tensor_region(g->r, off, dt, ndim, shape);
}

static int good_put(good *g, const void *data, gpucd_dtype dt, int ndim, const int64_t *shape,
                    uint64_t *id, const char *what)
{
    gpucd_tensor t = gpucd_tensor_host((void *)(uintptr_t)data, dt, ndim, shape);
    unsigned gen0 = gen_now();
    int rv = gpucd_tensor_put(g->c, &t, id);
    if (rv != 0)
        *id = 0;
    return good_answer(g, rv, 1, what, gen0);
}

static int good_put_known(good *g, int k)
{
    float v[KNOWN_N];
    uint32_t serial = g->next_serial++;
    for (int i = 0; i < KNOWN_N; i++)
        v[i] = known_value(g->slot, serial, i);
    g->known_serial[k] = serial;
    return good_put(g, v, GPUCD_F32, 2, TH_SHAPE(KNOWN_ROWS, KNOWN_COLS), &g->known[k],
                    "tensor_put (known)");
}

/* Lets go of the objects; those of a daemon since restarted are gone already, and those of
 * a connection about to be closed go with it. */
static void good_drop(good *g)
{
    const int same_daemon = gen_now() == g->made_gen;
    /* A remote client reconnects after a restart, as one of a restarted daemon would. */
    const int reconnect = g->stuck || (g->remote && gen_now() != g->conn_gen);
    uint64_t *ids[KNOWN + 3 + NM_WEIGHTS];
    int n = 0;
    for (int k = 0; k < KNOWN; k++)
        ids[n++] = &g->known[k];
    ids[n++] = &g->table_id, ids[n++] = &g->convw_id, ids[n++] = &g->lce_c_id;
    for (int k = 0; k < NM_WEIGHTS; k++)
        ids[n++] = &g->nm_ids[k];
    for (int k = 0; k < n; k++) {
        if (*ids[k] != 0 && same_daemon && !reconnect && g->c != NULL)
            gpucd_tensor_free(g->c, *ids[k]);
        *ids[k] = 0;
    }
    if (g->r != NULL)
        gpucd_region_destroy(g->r); /* unmapped whatever the daemon says */
    g->r = NULL;
    g->area = NULL;
    if (g->c != NULL && reconnect) {
        gpucd_close(g->c);
        g->c = NULL;
    }
    g->stuck = 0;
}

static int good_make(good *g)
{
    good_drop(g);
    const unsigned gen0 = gen_now();
    if (gen0 & 1)
        return 0; /* restarting */
    if (g->c == NULL) {
        char url[64];
        if (g->remote)
            tcp_url(url);
        g->c = connect_to(g->remote ? url : ipc_url, 30000);
        if (g->c == NULL)
            return 0;
        g->conn_gen = gen0;
    }
    g->made_gen = gen0;
    if (g->remote) {
        g->area = g->host_area;
    } else {
        int rv = gpucd_region_create(g->c, AREA_BYTES, &g->r);
        if (rv != 0)
            g->r = NULL;
        if (!good_answer(g, rv, 1, "region_create", gen0))
            return 0;
        g->area = gpucd_region_data(g->r);
    }
    for (int k = 0; k < KNOWN; k++)
        if (!good_put_known(g, k))
            return 0;
    if (!good_put(g, g->table, GPUCD_F32, 2, TH_SHAPE(EMB_V, EMB_D), &g->table_id,
                  "tensor_put (table)") ||
        !good_put(g, g->convw, GPUCD_F32, 4, TH_SHAPE(CONV_OC, CONV_C, CONV_K, CONV_K),
                  &g->convw_id, "tensor_put (conv w)") ||
        !good_put(g, g->lce_c, GPUCD_F32, 2, TH_SHAPE(LCE_V, LCE_D), &g->lce_c_id,
                  "tensor_put (lce C)"))
        return 0;
    for (int k = 0; k < NM_WEIGHTS; k++)
        if (!good_put(g, g->nm[k], GPUCD_F32, nm_ndim[k], nm_shapes[k], &g->nm_ids[k],
                      "tensor_put (encoder weight)"))
            return 0;
    g->ready = 1;
    return 1;
}

/* multihot_encode of fresh observations, in the region or inline. */
static int good_multihot(good *g, int inl)
{
    uint8_t *obs = g->area + OFF_MH_OBS;
    float *out = (float *)(g->area + OFF_MH_OUT);
    const size_t n = (size_t)MH_B * 59 * 11 * 15;
    float *want = th_xmalloc(n * 4);
    th_fill_nmmo3_obs(obs, MH_B);
    gk_tensor go = gk_tensor_make(obs, GK_U8, 2, TH_SHAPE(MH_B, 1707));
    gk_tensor gw = gk_tensor_make(want, GK_F32, 4, TH_SHAPE(MH_B, 59, 11, 15));
    gk_err err;
    check_ref(gk_cpu_multihot_encode(&gk_nmmo3_layout, &go, &gw, &err), &err, "multihot");
    poison(out, n * 4);
    gpucd_tensor to = good_tensor(g, inl, OFF_MH_OBS, GPUCD_U8, 2, TH_SHAPE(MH_B, 1707));
    gpucd_tensor tout = good_tensor(g, inl, OFF_MH_OUT, GPUCD_F32, 4, TH_SHAPE(MH_B, 59, 11, 15));
    const unsigned gen0 = gen_now();
    int rv = gpucd_multihot_encode(g->c, NULL, &to, &tout, NULL);
    int right = rv == 0 && memcmp(out, want, n * 4) == 0;
    free(want);
    return good_answer(g, rv, right, inl ? "multihot_encode (inline)" : "multihot_encode", gen0);
}

/* embedding_forward: indices in the region or inline, the table resident. */
static int good_embedding(good *g, int inl)
{
    int64_t *idx = (int64_t *)(g->area + OFF_EMB_IDX);
    float *out = (float *)(g->area + OFF_EMB_OUT);
    const size_t n = (size_t)MH_B * EMB_L * EMB_D;
    float *want = th_xmalloc(n * 4);
    for (int i = 0; i < MH_B * EMB_L; i++)
        idx[i] = (int64_t)(th_rand_u64() % EMB_V);
    gk_tensor gi = gk_tensor_make(idx, GK_I64, 2, TH_SHAPE(MH_B, EMB_L));
    gk_tensor gt = gk_tensor_make(g->table, GK_F32, 2, TH_SHAPE(EMB_V, EMB_D));
    gk_tensor go = gk_tensor_make(want, GK_F32, 3, TH_SHAPE(MH_B, EMB_L, EMB_D));
    gk_err err;
    check_ref(gk_cpu_embedding_forward(&gi, &gt, &go, &err), &err, "embedding");
    poison(out, n * 4);
    gpucd_tensor ti = good_tensor(g, inl, OFF_EMB_IDX, GPUCD_I64, 2, TH_SHAPE(MH_B, EMB_L));
    gpucd_tensor tt = gpucd_tensor_resident(g->table_id, GPUCD_F32, 2, TH_SHAPE(EMB_V, EMB_D));
    gpucd_tensor to = good_tensor(g, inl, OFF_EMB_OUT, GPUCD_F32, 3, TH_SHAPE(MH_B, EMB_L, EMB_D));
    const unsigned gen0 = gen_now();
    int rv = gpucd_embedding_forward(g->c, &ti, &tt, &to, NULL);
    int right = rv == 0 && memcmp(out, want, n * 4) == 0;
    free(want);
    return good_answer(g, rv, right, "embedding_forward", gen0);
}

/* conv2d_forward: x in the region, w resident, b inline, y in the region. */
static int good_conv(good *g)
{
    float *x = (float *)(g->area + OFF_CONV_X), *y = (float *)(g->area + OFF_CONV_Y);
    const size_t xn = (size_t)CONV_N * CONV_C * 11 * 15, yn = (size_t)CONV_N * CONV_OC * 11 * 15;
    float *want = th_xmalloc(yn * 4);
    th_fill_f32(x, xn);
    gk_conv2d kp = {.stride_h = 1, .stride_w = 1, .pad_h = 1, .pad_w = 1, .relu = 1};
    gk_tensor gx = gk_tensor_make(x, GK_F32, 4, TH_SHAPE(CONV_N, CONV_C, 11, 15));
    gk_tensor gw = gk_tensor_make(g->convw, GK_F32, 4, TH_SHAPE(CONV_OC, CONV_C, CONV_K, CONV_K));
    gk_tensor gb = gk_tensor_make(g->convb, GK_F32, 1, TH_SHAPE(CONV_OC));
    gk_tensor gy = gk_tensor_make(want, GK_F32, 4, TH_SHAPE(CONV_N, CONV_OC, 11, 15));
    gk_err err;
    check_ref(gk_cpu_conv2d_forward(&kp, &gx, &gw, &gb, &gy, &err), &err, "conv2d");
    poison(y, yn * 4);
    gpucd_conv2d_params p;
    gpucd_conv2d_params_init(&p);
    p.pad_h = p.pad_w = 1;
    p.relu = 1;
    gpucd_tensor tx = good_tensor(g, 0, OFF_CONV_X, GPUCD_F32, 4, TH_SHAPE(CONV_N, CONV_C, 11, 15));
    gpucd_tensor tw = gpucd_tensor_resident(g->convw_id, GPUCD_F32, 4,
                                            TH_SHAPE(CONV_OC, CONV_C, CONV_K, CONV_K));
    gpucd_tensor tb = gpucd_tensor_host(g->convb, GPUCD_F32, 1, TH_SHAPE(CONV_OC));
    gpucd_tensor ty = good_tensor(g, 0, OFF_CONV_Y, GPUCD_F32, 4, TH_SHAPE(CONV_N, CONV_OC, 11, 15));
    const unsigned gen0 = gen_now();
    int rv = gpucd_conv2d_forward(g->c, &p, &tx, &tw, &tb, &ty, NULL);
    int right = rv == 0 && memcmp(y, want, yn * 4) == 0;
    free(want);
    return good_answer(g, rv, right, "conv2d_forward", gen0);
}

/* linear cross entropy, per-row loss and LSE: E and targets inline, C resident. */
static int good_lce(good *g)
{
    float E[LCE_N * LCE_D], loss[LCE_N], lse[LCE_N], wloss[LCE_N], wlse[LCE_N];
    int64_t tg[LCE_N];
    th_fill_f32(E, LCE_N * LCE_D);
    for (int i = 0; i < LCE_N; i++)
        tg[i] = i == 3 ? -100 : (int64_t)(th_rand_u64() % LCE_V);
    gk_lce kp;
    gk_lce_defaults(&kp);
    kp.reduction = GK_REDUCE_NONE;
    gk_tensor ge = gk_tensor_make(E, GK_F32, 2, TH_SHAPE(LCE_N, LCE_D));
    gk_tensor gc = gk_tensor_make(g->lce_c, GK_F32, 2, TH_SHAPE(LCE_V, LCE_D));
    gk_tensor gt = gk_tensor_make(tg, GK_I64, 1, TH_SHAPE(LCE_N));
    gk_tensor gl = gk_tensor_make(wloss, GK_F32, 1, TH_SHAPE(LCE_N));
    gk_tensor gs = gk_tensor_make(wlse, GK_F32, 1, TH_SHAPE(LCE_N));
    gk_tensor none = {0};
    gk_err err;
    check_ref(gk_cpu_lce(&kp, &ge, &gc, &none, &gt, &gl, &gs, &none, &none, &none, &err), &err,
              "lce");
    poison(loss, sizeof loss);
    poison(lse, sizeof lse);
    gpucd_lce_params p;
    gpucd_lce_params_init(&p);
    p.reduction = GPUCD_REDUCE_NONE;
    gpucd_tensor te = gpucd_tensor_host(E, GPUCD_F32, 2, TH_SHAPE(LCE_N, LCE_D));
    gpucd_tensor tc = gpucd_tensor_resident(g->lce_c_id, GPUCD_F32, 2, TH_SHAPE(LCE_V, LCE_D));
    gpucd_tensor tt = gpucd_tensor_host(tg, GPUCD_I64, 1, TH_SHAPE(LCE_N));
    gpucd_tensor tl = gpucd_tensor_host(loss, GPUCD_F32, 1, TH_SHAPE(LCE_N));
    gpucd_tensor ts = gpucd_tensor_host(lse, GPUCD_F32, 1, TH_SHAPE(LCE_N));
    const unsigned gen0 = gen_now();
    int rv = gpucd_linear_cross_entropy(g->c, &p, &te, &tc, NULL, &tt, &tl, &ts, NULL, NULL, NULL,
                                        NULL);
    int right = rv == 0 && memcmp(loss, wloss, sizeof loss) == 0 &&
                memcmp(lse, wlse, sizeof lse) == 0;
    return good_answer(g, rv, right, "linear_cross_entropy", gen0);
}

/* nmmo3_encode of one agent: obs and features in the region, the weights resident. */
static int good_nmmo3(good *g)
{
    uint8_t *obs = g->area + OFF_NM_OBS;
    float *feat = (float *)(g->area + OFF_NM_FEAT), want[1817];
    th_fill_nmmo3_obs(obs, 1);
    gk_nmmo3_weights gw = {0};
    gk_tensor *slots[NM_WEIGHTS] = {&gw.conv1_w, &gw.conv1_b, &gw.conv2_w, &gw.conv2_b,
                                    &gw.embed};
    gpucd_tensor rt[NM_WEIGHTS];
    for (int k = 0; k < NM_WEIGHTS; k++) {
        *slots[k] = gk_tensor_make(g->nm[k], GK_F32, nm_ndim[k], nm_shapes[k]);
        rt[k] = gpucd_tensor_resident(g->nm_ids[k], GPUCD_F32, nm_ndim[k], nm_shapes[k]);
    }
    gk_tensor go = gk_tensor_make(obs, GK_U8, 2, TH_SHAPE(1, 1707));
    gk_tensor gf = gk_tensor_make(want, GK_F32, 2, TH_SHAPE(1, 1817));
    gk_tensor none = {0};
    gk_err err;
    check_ref(gk_cpu_nmmo3_forward(&gw, &go, &gf, &none, &err), &err, "nmmo3");
    poison(feat, sizeof want);
    gpucd_nmmo3_weights w = {&rt[0], &rt[1], &rt[2], &rt[3], &rt[4], NULL, NULL};
    gpucd_tensor to = good_tensor(g, 0, OFF_NM_OBS, GPUCD_U8, 2, TH_SHAPE(1, 1707));
    gpucd_tensor tf = good_tensor(g, 0, OFF_NM_FEAT, GPUCD_F32, 2, TH_SHAPE(1, 1817));
    const unsigned gen0 = gen_now();
    int rv = gpucd_nmmo3_encode(g->c, &w, &to, &tf, NULL, NULL);
    int right = rv == 0 && memcmp(feat, want, sizeof want) == 0;
    return good_answer(g, rv, right, "nmmo3_encode", gen0);
}

/* Reads known tensor k back (into the region or inline) and checks whose it is. */
static int good_known_get(good *g, int k, int inl)
{
    float host[KNOWN_N];
    float *got = g->remote || inl ? host : (float *)(g->area + OFF_GET);
    poison(got, sizeof host);
    gpucd_tensor dst = g->remote || inl
                           ? gpucd_tensor_host(host, GPUCD_F32, 2, TH_SHAPE(KNOWN_ROWS, KNOWN_COLS))
                           : gpucd_tensor_region(g->r, OFF_GET, GPUCD_F32, 2,
                                                 TH_SHAPE(KNOWN_ROWS, KNOWN_COLS));
    const unsigned gen0 = gen_now();
    int rv = gpucd_tensor_get(g->c, g->known[k], &dst);
    int right = 1;
    for (int i = 0; rv == 0 && right && i < KNOWN_N; i++)
        right = got[i] == known_value(g->slot, g->known_serial[k], i);
    if (rv == 0 && !right && got[0] == (float)KNOWN_MAGIC) {
        atomic_fetch_add(&sh->stale, 1);
        fprintf(stderr,
                "chaos: client %d: resident tensor %llu read back with the content of client "
                "%d's tensor %d, not of its own tensor %u (daemon gen %u)\n",
                g->slot, (unsigned long long)g->known[k], (int)got[1], (int)got[2],
                g->known_serial[k], gen0);
    }
    return good_answer(g, rv, right,
                       right || got[0] == (float)KNOWN_MAGIC
                           ? "tensor_get (known)"
                           : "tensor_get (known: its bytes are no longer the ones it put)",
                       gen0);
}

/* A known tensor replaced by a new one: ids come and go. */
static int good_known_renew(good *g, int k)
{
    const unsigned gen0 = gen_now();
    int rv = gpucd_tensor_free(g->c, g->known[k]);
    g->known[k] = 0;
    if (!good_answer(g, rv, 1, "tensor_free (known)", gen0))
        return 0;
    return good_put_known(g, k);
}

static void role_good(int slot, int clients)
{
    good *g = calloc(1, sizeof *g);
    if (g == NULL)
        die("out of memory");
    g->slot = slot;
    g->remote = clients > 1 && slot == clients - 1;
    g->host_area = aligned_alloc(64, AREA_BYTES);
    if (g->host_area == NULL)
        die("out of memory");
    th_fill_f32(g->table, EMB_V * EMB_D);
    th_fill_f32(g->convw, CONV_OC * CONV_C * CONV_K * CONV_K);
    th_fill_f32(g->convb, CONV_OC);
    th_fill_f32(g->lce_c, LCE_V * LCE_D);
    for (int k = 0; k < NM_WEIGHTS; k++) {
        g->nm_n[k] = 1;
        for (int i = 0; i < nm_ndim[k]; i++)
            g->nm_n[k] *= (size_t)nm_shapes[k][i];
        g->nm[k] = th_xmalloc(g->nm_n[k] * 4);
        th_fill_f32(g->nm[k], g->nm_n[k]);
        for (size_t i = 0; i < g->nm_n[k]; i++)
            g->nm[k][i] *= 0.1f; /* activations in a sensible range */
    }
    while (!stopping()) {
        if (!g->ready && !good_make(g)) {
            sleep_ms(20);
            continue;
        }
        /* Now and then a pause, as a worker's own step: a restart may then pass unseen
         * between two calls, and the next call use the old daemon's ids. */
        if (th_rand_u64() % 64 == 0)
            sleep_ms(100 + (int)(th_rand_u64() % 1500));
        const int pick = (int)(th_rand_u64() % 24);
        if (pick < 6)
            good_multihot(g, 0);
        else if (pick < 8)
            good_multihot(g, 1);
        else if (pick < 11)
            good_embedding(g, pick == 10);
        else if (pick < 14)
            good_conv(g);
        else if (pick < 16)
            good_lce(g);
        else if (pick < 22)
            good_known_get(g, pick % KNOWN, pick == 21);
        else if (pick == 22)
            good_known_renew(g, (int)(th_rand_u64() % KNOWN));
        else
            good_nmmo3(g);
    }
    good_drop(g);
    gpucd_close(g->c);
    for (int k = 0; k < NM_WEIGHTS; k++)
        free(g->nm[k]);
    free(g->host_area);
    free(g);
    exit(0);
}

/* ---- hand-made requests (raw.h) ----------------------------------------------------- */

/* th_raw_open with a send timeout too: a request socket whose daemon is gone for good
 * would wait for it forever. */
static void chaos_raw_open(th_raw *raw, const char *url)
{
    th_raw_open(raw, url); /* exits when nothing listens: the test starts another */
    nng_socket_set_ms(raw->sock, NNG_OPT_SENDTIMEO, 20000);
}

/* The reply's status (and frees it); -1 when none came. */
static int reply_status(Gpucd__V1__Reply *rep)
{
    if (rep == NULL)
        return -1;
    int status = (int)rep->status;
    gpucd__v1__reply__free_unpacked(rep, NULL);
    return status;
}

/* multihot_encode of b agents: obs at obs_off of region obs_id, out at out_off of out_id. */
static Gpucd__V1__Reply *raw_multihot(th_raw *raw, uint64_t obs_id, uint64_t obs_off,
                                      uint64_t out_id, uint64_t out_off, int b)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__MultihotEncode op = GPUCD__V1__MULTIHOT_ENCODE__INIT;
    th_ref obs, out;
    op.obs = th_ref_region(&obs, GPUCD__V1__DTYPE__U8, obs_id, obs_off, 2, TH_SHAPE(b, 1707));
    op.out = th_ref_region(&out, GPUCD__V1__DTYPE__F32, out_id, out_off, 4,
                           TH_SHAPE(b, 59, 11, 15));
    req.op_case = GPUCD__V1__REQUEST__OP_MULTIHOT_ENCODE;
    req.multihot_encode = &op;
    return th_raw_call(raw, &req, NULL, 0);
}

static void raw_unregister(th_raw *raw, uint64_t id)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__RegionUnregister op = GPUCD__V1__REGION_UNREGISTER__INIT;
    op.region_id = id;
    req.op_case = GPUCD__V1__REQUEST__OP_REGION_UNREGISTER;
    req.region_unregister = &op;
    reply_status(th_raw_call(raw, &req, NULL, 0));
}

/* ---- hostile: a byte flipper ---------------------------------------------------------- */

/* Its region: observations and indices that a thread keeps rewriting, then the outputs. */
enum {
    FLIP_B = 8,
    FLIP_OBS = 0,       /* (FLIP_B, 1707) u8 */
    FLIP_IDX = 16384,   /* (FLIP_B, EMB_L) i64 */
    FLIP_OUT = 32768,   /* (FLIP_B, 59, 11, 15) f32 */
    FLIP_EOUT = 352256, /* (FLIP_B, EMB_L, EMB_D) f32 */
    FLIP_BYTES = 409600,
    FLIP_INPUT_BYTES = FLIP_IDX + FLIP_B * EMB_L * 8,
};

typedef struct flipper {
    pthread_mutex_t lock; /* held while area changes and while a burst of flips runs */
    uint8_t *area;        /* NULL while the region is made again */
    atomic_int quit;
    uint64_t rng;
} flipper;

static void *flipper_main(void *arg)
{
    flipper *f = arg;
    while (!atomic_load(&f->quit)) {
        pthread_mutex_lock(&f->lock);
        for (int i = 0; f->area != NULL && i < 256; i++) {
            uint64_t z = mix64(f->rng += 0x9e3779b97f4a7c15ull);
            const size_t at = (size_t)(z % FLIP_INPUT_BYTES);
            if (at >= FLIP_IDX) /* an index: mostly valid, sometimes far out */
                ((int64_t *)(f->area + FLIP_IDX))[(at - FLIP_IDX) / 8] =
                    z & 0x100 ? (int64_t)(z >> 40) : (int64_t)((z >> 20) % EMB_V);
            else
                f->area[at] = (uint8_t)(z >> 56);
        }
        pthread_mutex_unlock(&f->lock);
        sched_yield();
    }
    return NULL;
}

static void role_flip(void)
{
    flipper f = {.rng = th_rand_u64()};
    pthread_mutex_init(&f.lock, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, flipper_main, &f) != 0)
        die("pthread_create failed");
    float *table = th_xmalloc((size_t)EMB_V * EMB_D * 4);
    th_fill_f32(table, (size_t)EMB_V * EMB_D);
    gpucd_client *c = NULL;
    gpucd_region *r = NULL;
    uint64_t table_id = 0;
    while (!stopping()) {
        if (c == NULL && (c = connect_to(ipc_url, 20000)) == NULL) {
            sleep_ms(50);
            continue;
        }
        if (r == NULL) {
            gpucd_tensor t = gpucd_tensor_host(table, GPUCD_F32, 2, TH_SHAPE(EMB_V, EMB_D));
            if (gpucd_region_create(c, FLIP_BYTES, &r) != 0 ||
                gpucd_tensor_put(c, &t, &table_id) != 0) {
                gpucd_region_destroy(r);
                r = NULL;
                sleep_ms(50);
                continue;
            }
            pthread_mutex_lock(&f.lock);
            f.area = gpucd_region_data(r);
            pthread_mutex_unlock(&f.lock);
        }
        /* Valid inputs, which the thread keeps changing while the daemon reads them. */
        pthread_mutex_lock(&f.lock);
        th_fill_nmmo3_obs(f.area + FLIP_OBS, FLIP_B);
        for (int i = 0; i < FLIP_B * EMB_L; i++)
            ((int64_t *)(f.area + FLIP_IDX))[i] = (int64_t)(th_rand_u64() % EMB_V);
        pthread_mutex_unlock(&f.lock);
        int rv;
        fault(ACT_FLIP);
        if (th_rand_u64() % 2) {
            gpucd_tensor to = gpucd_tensor_region(r, FLIP_OBS, GPUCD_U8, 2, TH_SHAPE(FLIP_B, 1707));
            gpucd_tensor tout = gpucd_tensor_region(r, FLIP_OUT, GPUCD_F32, 4,
                                                    TH_SHAPE(FLIP_B, 59, 11, 15));
            rv = gpucd_multihot_encode(c, NULL, &to, &tout, NULL);
        } else {
            gpucd_tensor ti = gpucd_tensor_region(r, FLIP_IDX, GPUCD_I64, 2,
                                                  TH_SHAPE(FLIP_B, EMB_L));
            gpucd_tensor tt = gpucd_tensor_resident(table_id, GPUCD_F32, 2,
                                                    TH_SHAPE(EMB_V, EMB_D));
            gpucd_tensor to = gpucd_tensor_region(r, FLIP_EOUT, GPUCD_F32, 3,
                                                  TH_SHAPE(FLIP_B, EMB_L, EMB_D));
            rv = gpucd_embedding_forward(c, &ti, &tt, &to, NULL);
        }
        /* A refusal of flipped bytes is right; a lost connection means new objects. */
        if (rv == GPUCD_ECLOSED || rv == GPUCD_ETIMEDOUT || rv == GPUCD_ENOT_FOUND ||
            rv == GPUCD_EPERMISSION_DENIED || rv == GPUCD_EUNAVAILABLE) {
            pthread_mutex_lock(&f.lock);
            f.area = NULL;
            pthread_mutex_unlock(&f.lock);
            gpucd_region_destroy(r);
            r = NULL;
            sleep_ms(20);
        }
    }
    atomic_store(&f.quit, 1);
    pthread_join(th, NULL);
    gpucd_region_destroy(r);
    gpucd_close(c);
    free(table);
    exit(0);
}

/* ---- hostile: connection floods -------------------------------------------------------- */

enum { FLOOD_QUICK = 32, FLOOD_HELD = 64 };

static void role_flood(void)
{
    gpucd_client *held[FLOOD_HELD];
    while (!stopping()) {
        /* Open and close quickly, over both transports, half of them without a word. */
        for (int i = 0; i < FLOOD_QUICK && !stopping(); i++) {
            char tcp[64];
            tcp_url(tcp);
            gpucd_client *c = connect_to(i % 4 == 3 ? tcp : ipc_url, 5000);
            fault(ACT_FLOOD);
            if (c != NULL && i % 2)
                gpucd_ping(c, NULL);
            gpucd_close(c);
        }
        /* Hold many open at once, each of them having spoken. */
        int n = 0;
        for (; n < FLOOD_HELD && !stopping(); n++) {
            held[n] = connect_to(ipc_url, 5000);
            fault(ACT_FLOOD);
            if (held[n] != NULL)
                gpucd_ping(held[n], NULL);
        }
        sleep_ms(300);
        for (int i = 0; i < n; i++)
            gpucd_close(held[i]);
    }
    exit(0);
}

/* ---- hostile: quota floods ------------------------------------------------------------- */

/* Puts 1 MiB tensors, then registers small regions, each until refused, holds, lets go. */
enum { QUOTA_TENSOR_FLOATS = 1 << 18, QUOTA_MAX_TENSORS = 4096, QUOTA_MAX_REGIONS = 8192 };

static void role_quota(void)
{
    float *data = th_xmalloc((size_t)QUOTA_TENSOR_FLOATS * 4);
    th_fill_f32(data, QUOTA_TENSOR_FLOATS);
    uint64_t *ids = th_xmalloc(QUOTA_MAX_TENSORS * sizeof *ids);
    gpucd_region **regions = th_xmalloc(QUOTA_MAX_REGIONS * sizeof *regions);
    while (!stopping()) {
        gpucd_client *c = connect_to(ipc_url, 20000);
        if (c == NULL) {
            sleep_ms(50);
            continue;
        }
        fault(ACT_QUOTA);
        gpucd_tensor t = gpucd_tensor_host(data, GPUCD_F32, 2, TH_SHAPE(256, 1024));
        int nt = 0, nr = 0;
        while (nt < QUOTA_MAX_TENSORS && !stopping() && gpucd_tensor_put(c, &t, &ids[nt]) == 0)
            nt++;
        while (nr < QUOTA_MAX_REGIONS && !stopping() &&
               gpucd_region_create(c, 4096, &regions[nr]) == 0)
            nr++;
        sleep_ms(200);
        /* Half the tensors freed one by one, the rest left to the disconnect. */
        for (int i = 0; i < nt / 2; i++)
            gpucd_tensor_free(c, ids[i]);
        for (int i = 0; i < nr; i++)
            gpucd_region_destroy(regions[i]);
        gpucd_close(c);
    }
    free(data);
    free(ids);
    free(regions);
    exit(0);
}

/* ---- hostile: disconnects mid-request -------------------------------------------------- */

/*
 * A slow convolution (inline, over either transport, its output inline or a new resident
 * tensor), given up on after a few milliseconds: the connection is closed while it runs.
 */
enum { DISC_N = 2, DISC_C = 59, DISC_OC = 64, DISC_K = 5 };

static void role_disconnect(void)
{
    const size_t xn = (size_t)DISC_N * DISC_C * 11 * 15, wn = (size_t)DISC_OC * DISC_C * 25;
    const size_t yn = (size_t)DISC_N * DISC_OC * 11 * 15;
    float *x = th_xmalloc(xn * 4), *w = th_xmalloc(wn * 4), *y = th_xmalloc(yn * 4);
    th_fill_f32(x, xn);
    th_fill_f32(w, wn);
    while (!stopping()) {
        char tcp[64];
        tcp_url(tcp);
        const int remote = th_rand_u64() % 3 == 0;
        gpucd_client *c = connect_to(remote ? tcp : ipc_url, 1 + (int)(th_rand_u64() % 30));
        if (c == NULL) {
            sleep_ms(50);
            continue;
        }
        gpucd_conv2d_params p;
        gpucd_conv2d_params_init(&p);
        p.pad_h = p.pad_w = 2;
        gpucd_tensor tx = gpucd_tensor_host(x, GPUCD_F32, 4, TH_SHAPE(DISC_N, DISC_C, 11, 15));
        gpucd_tensor tw = gpucd_tensor_host(w, GPUCD_F32, 4,
                                            TH_SHAPE(DISC_OC, DISC_C, DISC_K, DISC_K));
        gpucd_tensor ty = th_rand_u64() % 2
                              ? gpucd_tensor_host(y, GPUCD_F32, 4,
                                                  TH_SHAPE(DISC_N, DISC_OC, 11, 15))
                              : gpucd_tensor_new_resident(GPUCD_F32, 4,
                                                          TH_SHAPE(DISC_N, DISC_OC, 11, 15));
        fault(ACT_DISCONNECT);
        gpucd_conv2d_forward(c, &p, &tx, &tw, NULL, &ty, NULL);
        gpucd_close(c);
    }
    free(x);
    free(w);
    free(y);
    exit(0);
}

/* ---- hostile: garbage and hand-made bad requests ---------------------------------------- */

/* A buffer of random bytes, 64-byte aligned for payloads. */
typedef struct noise {
    uint8_t b[8192] __attribute__((aligned(64)));
} noise;

static void noise_fill(noise *n)
{
    for (size_t i = 0; i < sizeof n->b; i += 8) {
        uint64_t z = th_rand_u64();
        memcpy(n->b + i, &z, 8);
    }
}

/* One bad message on raw; returns 0 when no reply came (the socket is to be opened again). */
static int garbage_send(th_raw *raw)
{
    noise buf;
    noise_fill(&buf);
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    th_ref a, b, o;
    int err = 0;
    Gpucd__V1__Reply *rep = NULL;
    fault(ACT_GARBAGE);
    switch (th_rand_u64() % 4) {
    case 0: /* bytes */
        rep = th_raw_send_bytes(raw, buf.b, th_rand_u64() % 256, &err);
        break;
    case 1: { /* a valid prefix, then anything */
        memcpy(buf.b, "GPCD", 4);
        const uint32_t hl = (uint32_t)(th_rand_u64() % 300);
        memcpy(buf.b + 4, &hl, 4);
        rep = th_raw_send_bytes(raw, buf.b, 8 + th_rand_u64() % 400, &err);
        break;
    }
    case 2: { /* another protocol version */
        Gpucd__V1__Ping ping = GPUCD__V1__PING__INIT;
        req.op_case = GPUCD__V1__REQUEST__OP_PING;
        req.ping = &ping;
        req.version = 2 + (uint32_t)(th_rand_u64() % 100);
        rep = th_raw_call(raw, &req, NULL, 0);
        break;
    }
    default: { /* regions of anyone (small ids), anywhere, of any dtype and shape */
        Gpucd__V1__Conv2dForward op = GPUCD__V1__CONV2D_FORWARD__INIT;
        Gpucd__V1__Conv2dParams params = GPUCD__V1__CONV2D_PARAMS__INIT;
        params.stride_h = params.stride_w = 1;
        op.params = &params;
        const int64_t huge = (int64_t)(th_rand_u64() >> (th_rand_u64() % 64));
        op.x = th_ref_region(&a, (Gpucd__V1__DType)(th_rand_u64() % 9), th_rand_u64() % 64,
                             th_rand_u64() >> (th_rand_u64() % 64), 4, TH_SHAPE(2, 3, 8, huge));
        op.w = th_ref_region(&b, GPUCD__V1__DTYPE__F32, th_rand_u64() % 64, th_rand_u64() % 65536,
                             4, TH_SHAPE(4, 3, 3, 3));
        op.y = th_ref_region(&o, GPUCD__V1__DTYPE__F32, th_rand_u64() % 64, th_rand_u64() % 65536,
                             4, TH_SHAPE(2, 4, 6, 6));
        req.op_case = GPUCD__V1__REQUEST__OP_CONV2D_FORWARD;
        req.conv2d_forward = &op;
        rep = th_raw_call(raw, &req, NULL, 0);
        break;
    }
    }
    return reply_status(rep) >= 0;
}

/*
 * One request on others' objects by guessed id: a write into a resident tensor of the
 * well-behaved clients' shape, a free, an unregister.  Returns as garbage_send.
 */
static int trespass_send(th_raw *raw)
{
    noise buf;
    noise_fill(&buf);
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    th_ref a, b, o;
    Gpucd__V1__Reply *rep = NULL;
    fault(ACT_TRESPASS);
    switch (th_rand_u64() % 3) {
    case 0: { /* out (KNOWN_ROWS, KNOWN_COLS): rows of a table of noise */
        Gpucd__V1__EmbeddingForward op = GPUCD__V1__EMBEDDING_FORWARD__INIT;
        int32_t *idx = (int32_t *)buf.b;
        for (int i = 0; i < KNOWN_ROWS; i++)
            idx[i] = i;
        op.indices = th_ref_payload(&a, GPUCD__V1__DTYPE__I32, 0, 1, TH_SHAPE(KNOWN_ROWS));
        op.table = th_ref_payload(&b, GPUCD__V1__DTYPE__F32, 64, 2,
                                  TH_SHAPE(KNOWN_ROWS, KNOWN_COLS));
        op.out = th_ref_resident(&o, GPUCD__V1__DTYPE__F32, 1 + th_rand_u64() % 512, 2,
                                 TH_SHAPE(KNOWN_ROWS, KNOWN_COLS));
        req.op_case = GPUCD__V1__REQUEST__OP_EMBEDDING_FORWARD;
        req.embedding_forward = &op;
        rep = th_raw_call(raw, &req, buf.b, 64 + KNOWN_N * 4);
        break;
    }
    case 1: {
        Gpucd__V1__TensorFree op = GPUCD__V1__TENSOR_FREE__INIT;
        op.id = 1 + th_rand_u64() % 512;
        req.op_case = GPUCD__V1__REQUEST__OP_TENSOR_FREE;
        req.tensor_free = &op;
        rep = th_raw_call(raw, &req, NULL, 0);
        break;
    }
    default: {
        Gpucd__V1__RegionUnregister op = GPUCD__V1__REGION_UNREGISTER__INIT;
        op.region_id = 1 + th_rand_u64() % 512;
        req.op_case = GPUCD__V1__REQUEST__OP_REGION_UNREGISTER;
        req.region_unregister = &op;
        rep = th_raw_call(raw, &req, NULL, 0);
        break;
    }
    }
    return reply_status(rep) >= 0;
}

/* Sends send's messages over ipc:// and now and then tcp://, each socket opened again when
 * its daemon went away. */
static void role_raw(int (*send)(th_raw *))
{
    th_raw ipc, tcp;
    char url[64];
    tcp_url(url);
    chaos_raw_open(&ipc, ipc_url);
    chaos_raw_open(&tcp, url);
    while (!stopping()) {
        if (!send(&ipc)) {
            th_raw_close(&ipc);
            chaos_raw_open(&ipc, ipc_url);
        }
        if (th_rand_u64() % 4 == 0 && !send(&tcp)) {
            th_raw_close(&tcp);
            tcp_url(url);
            chaos_raw_open(&tcp, url);
        }
    }
    th_raw_close(&ipc);
    th_raw_close(&tcp);
    exit(0);
}

/* ---- hostile: a region shrunk under the daemon, and one object registered twice -------- */
enum { SHRINK_B = 16, SHRINK_BYTES = 1 << 20, SHRINK_OUT = 65536 };

/* reg passed over the descriptor socket and claimed on raw; NULL when the daemon refused it. */
static Gpucd__V1__Reply *register_memfd(th_raw *raw, const th_region *reg)
{
    uint64_t token;
    fdpass_answer ans;
    if (th_fdpass_region(raw->url, reg, &token, &ans) != 0)
        return NULL;
    return th_raw_register(raw, token, reg->size);
}

/*
 * Shrink: a region resized after it was registered, then used.  Half the memfds carry the
 * seals the daemon asks for, whose ftruncate must fail; the others, unsealed, must never be
 * registered.  Either way the daemon may not die of a page it lost.
 */
static void act_shrink(th_raw *raw)
{
    const int sealed = (int)(th_rand_u64() % 2);
    th_region reg;
    th_memfd_make(&reg, SHRINK_BYTES, sealed ? F_SEAL_SHRINK | F_SEAL_GROW : 0);
    th_fill_nmmo3_obs(reg.base, SHRINK_B);
    Gpucd__V1__Reply *rep = register_memfd(raw, &reg);
    fault(ACT_SHRINK);
    const int registered = rep != NULL && rep->status == GPUCD__V1__STATUS__OK;
    const int shrunk = ftruncate(reg.fd, th_rand_u64() % 2 ? 0 : SHRINK_OUT / 2) == 0;
    if (registered && shrunk) {
        atomic_fetch_add(&sh->wrong, 1);
        fprintf(stderr, "chaos: shrink: a registered region (%s) could be resized\n",
                sealed ? "sealed" : "unsealed");
    }
    if (registered) {
        const uint64_t id = rep->region_id;
        reply_status(raw_multihot(raw, id, 0, id, SHRINK_OUT, SHRINK_B)); /* any answer */
        raw_unregister(raw, id);
    }
    if (rep != NULL)
        gpucd__v1__reply__free_unpacked(rep, NULL);
    th_region_free(&reg); /* unmapping never touches the pages a shrink took */
}

enum { ALIAS_B = 2, ALIAS_BYTES = 1 << 20 };

/*
 * Alias: one object registered as two regions (the same memfd, or a dup of it), the output in
 * one over the input in the other: a daemon that cannot tell must not answer OK with a wrong
 * answer.  It should refuse the second registration.
 */
static void act_alias(th_raw *raw)
{
    th_region reg;
    th_memfd_make(&reg, ALIAS_BYTES, F_SEAL_SHRINK | F_SEAL_GROW);
    uint8_t obs[ALIAS_B * 1707];
    th_fill_nmmo3_obs(obs, ALIAS_B);
    memcpy(reg.base, obs, sizeof obs);
    th_region again = reg;
    again.fd = th_rand_u64() % 2 ? dup(reg.fd) : reg.fd;
    Gpucd__V1__Reply *a = register_memfd(raw, &reg);
    Gpucd__V1__Reply *b = again.fd >= 0 ? register_memfd(raw, &again) : NULL;
    if (again.fd != reg.fd && again.fd >= 0)
        close(again.fd);
    const int both = a != NULL && a->status == GPUCD__V1__STATUS__OK && b != NULL &&
                     b->status == GPUCD__V1__STATUS__OK;
    fault(ACT_ALIAS);
    if (both) {
        Gpucd__V1__Reply *rep = raw_multihot(raw, a->region_id, 0, b->region_id, 0, ALIAS_B);
        if (rep != NULL && rep->status == GPUCD__V1__STATUS__OK) {
            const size_t n = (size_t)ALIAS_B * 59 * 11 * 15;
            float *want = th_xmalloc(n * 4);
            gk_tensor go = gk_tensor_make(obs, GK_U8, 2, TH_SHAPE(ALIAS_B, 1707));
            gk_tensor gw = gk_tensor_make(want, GK_F32, 4, TH_SHAPE(ALIAS_B, 59, 11, 15));
            gk_err err;
            check_ref(gk_cpu_multihot_encode(&gk_nmmo3_layout, &go, &gw, &err), &err, "multihot");
            if (memcmp(reg.base, want, n * 4) != 0) {
                atomic_fetch_add(&sh->wrong, 1);
                fprintf(stderr, "chaos: alias: the output over its own input in an alias region "
                                "answered OK, but the answer is wrong\n");
            }
            free(want);
        }
        reply_status(rep);
    }
    if (a != NULL && a->status == GPUCD__V1__STATUS__OK)
        raw_unregister(raw, a->region_id);
    if (b != NULL && b->status == GPUCD__V1__STATUS__OK)
        raw_unregister(raw, b->region_id);
    reply_status(a);
    reply_status(b);
    th_region_free(&reg);
}

static void role_regions(void (*act_fn)(th_raw *))
{
    th_raw raw;
    chaos_raw_open(&raw, ipc_url);
    while (!stopping()) {
        act_fn(&raw);
        /* a socket that lost its daemon is opened again */
        Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
        Gpucd__V1__Ping ping = GPUCD__V1__PING__INIT;
        req.op_case = GPUCD__V1__REQUEST__OP_PING;
        req.ping = &ping;
        if (reply_status(th_raw_call(&raw, &req, NULL, 0)) < 0) {
            th_raw_close(&raw);
            chaos_raw_open(&raw, ipc_url);
        }
        sleep_ms(10);
    }
    th_raw_close(&raw);
    exit(0);
}

/* ---- the test: the processes, the daemon, the verdict ---------------------------------- */

static int role_main(char **argv)
{
    /* argv: self daemon --chaos-role ROLE SLOT CLIENTS FD SEED URL */
    const int role = atoi(argv[3]), slot = atoi(argv[4]), clients = atoi(argv[5]);
    setenv("GPUCD_TEST_SEED", argv[7], 1);
    verbose = getenv("CHAOS_VERBOSE") != NULL && atoi(getenv("CHAOS_VERBOSE")) != 0;
    th_seed();
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, atoi(argv[6]), 0);
    if (sh == MAP_FAILED)
        die("cannot map the shared counters: %s", strerror(errno));
    snprintf(ipc_url, sizeof ipc_url, "%s", argv[8]);
    switch (role) {
    case -1:
        role_good(slot, clients);
        break;
    case ACT_FLIP:
        role_flip();
        break;
    case ACT_FLOOD:
        role_flood();
        break;
    case ACT_QUOTA:
        role_quota();
        break;
    case ACT_DISCONNECT:
        role_disconnect();
        break;
    case ACT_GARBAGE:
        role_raw(garbage_send);
        break;
    case ACT_TRESPASS:
        role_raw(trespass_send);
        break;
    case ACT_SHRINK:
        role_regions(act_shrink);
        break;
    case ACT_ALIAS:
        role_regions(act_alias);
        break;
    }
    die("no role %d", role);
}

/* A child: a well-behaved client (role -1) or a hostile act. */
typedef struct proc {
    pid_t pid;
    int role, slot;
} proc;

static int shared_fd, n_clients;
/* Every process started, for the shared-memory names a killed one may have left. */
enum { MAX_SPAWNED = 1 << 14 };
static pid_t spawned[MAX_SPAWNED];
static int n_spawned;

static void proc_spawn(proc *p)
{
    char role[16], slot[16], clients[16], fd[16], seed[32];
    snprintf(role, sizeof role, "%d", p->role);
    snprintf(slot, sizeof slot, "%d", p->slot);
    snprintf(clients, sizeof clients, "%d", n_clients);
    snprintf(fd, sizeof fd, "%d", shared_fd);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)th_rand_u64());
    const char *argv[] = {"test_chaos", th_daemon_exe, "--chaos-role", role, slot, clients, fd,
                          seed, ipc_url, NULL};
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* none outlives the test */
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    p->pid = pid;
    if (n_spawned < MAX_SPAWNED)
        spawned[n_spawned++] = pid;
}

/* Objects named in /dev/shm by a process of this test: there must be none (regions and queue
 * pages are memfds), however it ended.  Counts them, removing each. */
static int shm_leftovers(void)
{
    int n = 0;
    DIR *dir = opendir("/dev/shm");
    for (struct dirent *e; dir != NULL && (e = readdir(dir)) != NULL;) {
        if (strncmp(e->d_name, "gpucd-", 6) != 0)
            continue;
        char *end;
        const long pid = strtol(e->d_name + 6, &end, 10);
        if (end == e->d_name + 6 || *end != '-')
            continue;
        for (int i = 0; i < n_spawned; i++)
            if (spawned[i] == (pid_t)pid) {
                char path[300];
                snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
                unlink(path);
                n++;
                break;
            }
    }
    if (dir != NULL)
        closedir(dir);
    return n;
}

static const char *proc_name(const proc *p)
{
    return p->role < 0 ? "well-behaved client" : act_names[p->role];
}

static void describe_status(int status, char *buf, size_t len)
{
    if (WIFSIGNALED(status))
        snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, len, "exit status %d", WEXITSTATUS(status));
}

static int failures;

static void failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failure(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "chaos: FAILURE: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    failures++;
}

/* 0 while the daemon runs; a daemon that exited unasked is a failure (and is forgotten). */
static int daemon_died(th_daemon *d)
{
    int status;
    if (d->pid <= 0)
        return 1;
    if (waitpid(d->pid, &status, WNOHANG) != d->pid)
        return 0;
    char how[96];
    describe_status(status, how, sizeof how);
    th_daemon_dump_log(d);
    failure("the daemon died unasked (%s)", how);
    d->pid = 0;
    return 1;
}

static void daemon_serve(th_daemon *d, const char *const *extra) { th_daemon_start(d, extra); }

/* The test's restart, as a supervisor would: SIGTERM, then a fresh daemon at the same URL. */
static void daemon_restart(th_daemon *d, const char *const *extra)
{
    atomic_fetch_add(&sh->gen, 1);
    fault(ACT_RESTART);
    /* 4: the drain's deadline cut requests off (a hostile client's reply it never reads holds
     * its request until the connection closes), which the daemon reports truthfully. */
    const int rc = th_daemon_stop(d);
    if (rc != 0 && rc != 4)
        failure("the daemon exited with %d on SIGTERM at a restart (-1000: not within 20 s)", rc);
    daemon_serve(d, extra);
    atomic_fetch_add(&sh->gen, 1);
}

/* Reaps the children that ended: a hostile one is replaced, a well-behaved one may not end
 * before it is told to. */
static void procs_reap(proc *procs, int n, int replace)
{
    for (int i = 0; i < n; i++) {
        int status;
        if (procs[i].pid <= 0 || waitpid(procs[i].pid, &status, WNOHANG) != procs[i].pid)
            continue;
        procs[i].pid = 0;
        if (procs[i].role >= 0) {
            if (replace)
                proc_spawn(&procs[i]);
            continue;
        }
        if (!replace && WIFEXITED(status) && WEXITSTATUS(status) == 0)
            continue;
        char how[96];
        describe_status(status, how, sizeof how);
        failure("well-behaved client %d ended: %s", procs[i].slot, how);
    }
}

static void kill_a_hostile(proc *procs, int n)
{
    int hostile[ACT_COUNT], k = 0;
    for (int i = 0; i < n; i++)
        if (procs[i].role >= 0 && procs[i].pid > 0)
            hostile[k++] = i;
    if (k == 0)
        return;
    kill(procs[hostile[th_rand_u64() % (uint64_t)k]].pid, SIGKILL);
    fault(ACT_KILL);
}

/* "key":{"count":C,"bytes":B in the stats. */
static int stats_pair(const char *json, const char *key, uint64_t *count, uint64_t *bytes)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":{\"count\":", key);
    const char *at = strstr(json, k);
    if (at == NULL)
        return -1;
    char *end;
    *count = strtoull(at + strlen(k), &end, 10);
    const char *b = strstr(end, "\"bytes\":");
    if (b == NULL)
        return -1;
    *bytes = strtoull(b + strlen("\"bytes\":"), NULL, 10);
    return 0;
}

/*
 * Once everyone left, the daemon holds nothing of theirs: waits 120 s of wall time for it,
 * on a new connection after each failed try (see good_answer).
 */
static void expect_nothing_held(void)
{
    uint64_t rc = 0, rb = 0, tc = 0, tb = 0;
    int got = 0, tries = 0;
    char why[256] = "";
    for (const uint64_t until = now_ms() + 120000; now_ms() < until; sleep_ms(200)) {
        gpucd_client *c = connect_to(ipc_url, 10000);
        char *json = NULL;
        tries++;
        if (c == NULL || gpucd_stats_json(c, &json) != 0) {
            snprintf(why, sizeof why, "%s", gpucd_errmsg(c));
            gpucd_close(c);
            continue;
        }
        gpucd_close(c);
        got = stats_pair(json, "regions", &rc, &rb) == 0 &&
              stats_pair(json, "resident_tensors", &tc, &tb) == 0;
        free(json);
        if (got && rc == 0 && rb == 0 && tc == 0 && tb == 0)
            break;
    }
    if (tries > 1)
        printf("chaos: the stats at the end took %d tries\n", tries);
    if (!got)
        failure("no stats from the daemon at the end: %s", why);
    else if (rc != 0 || rb != 0 || tc != 0 || tb != 0)
        failure("120 s after everyone left the daemon still holds %llu regions (%llu bytes) and "
                "%llu resident tensors (%llu bytes)",
                (unsigned long long)rc, (unsigned long long)rb, (unsigned long long)tc,
                (unsigned long long)tb);
}

static unsigned acts_parse(void)
{
    const char *s = getenv("CHAOS_ACTS");
    if (s == NULL || *s == '\0' || strcmp(s, "all") == 0)
        return (1u << ACT_COUNT) - 1;
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        int a = 0;
        while (a < ACT_COUNT && strcmp(tok, act_names[a]) != 0)
            a++;
        if (a == ACT_COUNT)
            die("CHAOS_ACTS: no act '%s'", tok);
        mask |= 1u << a;
    }
    return mask;
}

static int env_int(const char *name, int def, int lo, int hi)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0')
        return def;
    int v = atoi(s);
    if (v < lo || v > hi)
        die("%s=%s: expected %d..%d", name, s, lo, hi);
    return v;
}

int main(int argc, char **argv)
{
    if (argc >= 9 && strcmp(argv[2], "--chaos-role") == 0) {
        th_daemon_exe = argv[1];
        return role_main(argv);
    }
    th_init(argc, argv);
    /* Clients disconnect mid-reply by design: nng 1.5.2 loses such a reply (the file says how). */
    setenv("LSAN_OPTIONS", "suppressions=" CHAOS_LSAN_SUPPRESSIONS ":print_suppressions=0", 1);
    const int seconds = env_int("CHAOS_SECONDS", 60, 1, 3600);
    n_clients = env_int("CHAOS_CLIENTS", 8, 1, MAX_CLIENTS);
    const unsigned acts = acts_parse();
    printf("chaos: %d s, %d well-behaved clients, acts:", seconds, n_clients);
    for (int a = 0; a < ACT_COUNT; a++)
        if (acts & (1u << a))
            printf(" %s", act_names[a]);
    printf("\n");

    shared_fd = memfd_create("gpucd-chaos", 0); /* inherited by every process */
    if (shared_fd < 0 || ftruncate(shared_fd, sizeof *sh) != 0)
        die("memfd: %s", strerror(errno));
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, shared_fd, 0);
    if (sh == MAP_FAILED)
        die("mmap: %s", strerror(errno));
    for (int i = 0; i < MAX_CLIENTS; i++)
        atomic_store(&sh->last_ok_gen[i], UINT32_MAX);

    char dir[64] = "/tmp/gpucd-chaos-XXXXXX";
    if (mkdtemp(dir) == NULL)
        die("mkdtemp: %s", strerror(errno));
    snprintf(ipc_url, sizeof ipc_url, "ipc://%s/chaos.sock", dir);
    /* Every daemon at the same tcp:// port too, as a supervisor's would be: a remote client's
     * call made while the daemon restarts then reaches the new one, rather than waiting out its
     * timeout for a port nobody listens on any more. */
    atomic_store(&sh->tcp_port, th_free_tcp_port());
    char tcp_fixed[64];
    tcp_url(tcp_fixed);
    /* A small resident limit: the quota flood reaches it in a few puts. */
    const char *const extra[] = {"--listen", ipc_url, "--listen", tcp_fixed, "--resident-mb", "64",
                                 NULL};
    th_daemon d;
    daemon_serve(&d, extra);

    proc procs[MAX_CLIENTS + ACT_COUNT];
    int n = 0;
    for (int i = 0; i < n_clients; i++)
        procs[n++] = (proc){.role = -1, .slot = i};
    for (int a = 0; a < ACT_KILL; a++)
        if (acts & (1u << a)) {
            procs[n] = (proc){.role = a, .slot = n};
            n++;
        }
    for (int i = 0; i < n; i++)
        proc_spawn(&procs[i]);

    const uint64_t t0 = now_ms();
    uint64_t end = t0 + (uint64_t)seconds * 1000;
    uint64_t next_kill = t0 + 300 + th_rand_u64() % 1200;
    int restarts = 0;
    while (now_ms() < end && !daemon_died(&d)) {
        sleep_ms(50);
        procs_reap(procs, n, 1);
        if ((acts & (1u << ACT_KILL)) && now_ms() >= next_kill) {
            kill_a_hostile(procs, n);
            next_kill = now_ms() + 200 + th_rand_u64() % 1000;
        }
        if ((acts & (1u << ACT_RESTART)) && restarts < 2 &&
            now_ms() >= t0 + (uint64_t)(restarts + 1) * seconds * 1000 / 3) {
            printf("chaos: restart %d of the daemon at %.1f s\n", restarts + 1,
                   (double)(now_ms() - t0) / 1000);
            daemon_restart(&d, extra);
            restarts++;
            /* A restart waits out the drain (up to its deadline, while hostile clients hold
             * replies): the last daemon still gets its time, in which every well-behaved client
             * must get an OK from it. */
            if (end < now_ms() + LAST_DAEMON_MS)
                end = now_ms() + LAST_DAEMON_MS;
        }
    }
    printf("chaos: everyone leaves at %.1f s\n", (double)(now_ms() - t0) / 1000);
    atomic_store(&sh->stop, 1);
    if (d.pid <= 0) /* died: the clients' calls may wait for it for good */
        for (int i = 0; i < n; i++)
            if (procs[i].pid > 0) {
                kill(procs[i].pid, SIGKILL);
                waitpid(procs[i].pid, NULL, 0);
                procs[i].pid = 0;
            }
    /*
     * Well-behaved clients must end; a hostile one is given 15 s and then killed: what it does to
     * itself is not the daemon's promise (a "disconnect" process can hang in nng 1.5.2's
     * nng_close, its reaper stuck stopping a pipe's receive), only what it does to the others.
     */
    const uint64_t stopped = now_ms();
    for (; now_ms() < stopped + 120000; sleep_ms(50)) {
        procs_reap(procs, n, 0);
        daemon_died(&d);
        int clients_left = 0, hostile_left = 0;
        for (int i = 0; i < n; i++) {
            clients_left += procs[i].pid > 0 && procs[i].role < 0;
            hostile_left += procs[i].pid > 0 && procs[i].role >= 0;
        }
        if (clients_left == 0 && (hostile_left == 0 || now_ms() >= stopped + 15000))
            break;
    }
    int hostile_hung = 0;
    for (int i = 0; i < n; i++) {
        if (procs[i].pid <= 0)
            continue;
        if (procs[i].role < 0)
            failure("%s %d did not end within 120 s of being told to", proc_name(&procs[i]),
                    procs[i].slot);
        else
            hostile_hung++;
        kill(procs[i].pid, SIGKILL);
        waitpid(procs[i].pid, NULL, 0);
        procs[i].pid = 0;
    }
    if (hostile_hung > 0)
        printf("chaos: %d hostile process%s did not end within 15 s: killed\n", hostile_hung,
               hostile_hung == 1 ? "" : "es");
    const int died = daemon_died(&d);
    if (!died) {
        expect_nothing_held();
        const int rc = th_daemon_stop(&d);
        if (rc != 0)
            failure("the daemon exited with %d on SIGTERM at the end", rc);
    }
    const int leftovers = shm_leftovers();
    if (leftovers != 0)
        failure("%d objects named in /dev/shm by the test's processes", leftovers);
    char sock[128];
    snprintf(sock, sizeof sock, "%s/chaos.sock", dir);
    unlink(sock);
    snprintf(sock, sizeof sock, "%s/chaos.sock.fd", dir);
    unlink(sock);
    rmdir(dir);

    const unsigned last_gen = atomic_load(&sh->gen);
    for (int i = 0; i < n_clients && !died; i++)
        if (atomic_load(&sh->last_ok_gen[i]) != last_gen)
            failure("well-behaved client %d got no OK answer from the last daemon", i);
    const unsigned long long wrong = atomic_load(&sh->wrong), stale = atomic_load(&sh->stale);
    if (stale != 0)
        failure("%llu resident tensors read back with another client's content", stale);
    if (wrong != 0)
        failure("%llu wrong answers", wrong);
    printf("chaos: %s: requests %llu, OK %llu, refused %llu, faults injected:",
           failures ? "FAIL" : "PASS", (unsigned long long)atomic_load(&sh->requests),
           (unsigned long long)atomic_load(&sh->ok), (unsigned long long)atomic_load(&sh->refused));
    for (int a = 0; a < ACT_COUNT; a++)
        printf(" %s %llu%s", act_names[a], (unsigned long long)atomic_load(&sh->faults[a]),
               a + 1 < ACT_COUNT ? "," : ";");
    printf(" stale ids %llu, wrong answers: %llu\n", stale, wrong);
    return failures ? 1 : 0;
}
