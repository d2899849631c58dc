/*
 * test_double_fetch.c - a client that changes its inputs in shared memory
 * while the daemon computes on them.  One thread of the client flips an index
 * or an observation byte in its region between a valid and an out-of-range
 * value as fast as it can, while other threads send calls that read it.  A
 * daemon that checks a value and then reads it again to use it sees, now and
 * then, a checked value become a bad one, and reads or writes far outside its
 * buffers.  Each call must be answered OK or refused (OUT_OF_RANGE,
 * INVALID_ARGUMENT); afterwards the daemon must answer a ping and a correct
 * call, and exit 0 (under ASan, any stray access it made fails it).
 *
 * Each op gets a daemon of its own, so that one op's crash fails that op's test.
 * The loss, which loaded its targets once already, is raced too, so it stays so.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gk.h"
#include "harness.h"

/*
 * The race runs at least MIN_RUN_MS and until both answers were seen (a call
 * that saw the value valid and one that saw it bad): the flip was exercised
 * either way.  MAX_RUN_MS bounds it on a machine slow enough never to show both.
 */
enum { SENDERS = 3, MIN_RUN_MS = 3000, MAX_RUN_MS = 120000 };

typedef struct race race;
typedef int (*race_call_fn)(race *r, int sender);
typedef void (*race_flip_fn)(race *r, int bad);

struct race {
    th_daemon d;
    gpucd_client *c;
    gpucd_region *region;
    uint8_t *base;
    race_call_fn call;
    race_flip_fn flip;
    void *op; /* the op's own state */
    atomic_int stop;
    atomic_long ok, refused, other;
    pthread_mutex_t lock;
    char first_other[512];
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *flipper_main(void *arg)
{
    race *r = arg;
    while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        r->flip(r, 1);
        r->flip(r, 0);
    }
    return NULL;
}

typedef struct sender {
    race *r;
    int k;
} sender;

static void *sender_main(void *arg)
{
    sender *s = arg;
    race *r = s->r;
    while (!atomic_load(&r->stop)) {
        int rc = r->call(r, s->k);
        if (rc == 0) {
            atomic_fetch_add(&r->ok, 1);
        } else if (rc == GPUCD_EOUT_OF_RANGE || rc == GPUCD_EINVALID_ARGUMENT) {
            atomic_fetch_add(&r->refused, 1);
        } else {
            pthread_mutex_lock(&r->lock);
            if (atomic_fetch_add(&r->other, 1) == 0)
                snprintf(r->first_other, sizeof r->first_other, "sender %d: %s: %s", s->k,
                         gpucd_strerror(rc), gpucd_errmsg(r->c));
            pthread_mutex_unlock(&r->lock);
            atomic_store(&r->stop, 1);
        }
    }
    return NULL;
}

/* A daemon with extra flags (NULL-terminated, may be NULL), a client, a region. */
static void race_start(race *r, size_t region_bytes, const char *const *flags)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->lock, NULL);
    th_daemon_start(&r->d, flags);
    r->c = th_connect(r->d.ipc_url);
    assert_int_equal(gpucd_region_create(r->c, region_bytes, &r->region), 0);
    r->base = gpucd_region_data(r->region);
}

/* Runs the flipper and the senders; then the value is left valid. */
static void race_run(race *r, const char *what)
{
    pthread_t flipper, senders[SENDERS];
    sender args[SENDERS];
    assert_int_equal(pthread_create(&flipper, NULL, flipper_main, r), 0);
    for (int k = 0; k < SENDERS; k++) {
        args[k] = (sender){r, k};
        assert_int_equal(pthread_create(&senders[k], NULL, sender_main, &args[k]), 0);
    }
    const uint64_t t0 = now_ms();
    for (;;) {
        const uint64_t ran = now_ms() - t0;
        if (atomic_load(&r->stop) || ran > MAX_RUN_MS ||
            (ran >= MIN_RUN_MS && atomic_load(&r->ok) > 0 && atomic_load(&r->refused) > 0))
            break;
        usleep(20000);
    }
    atomic_store(&r->stop, 1);
    for (int k = 0; k < SENDERS; k++)
        pthread_join(senders[k], NULL);
    pthread_join(flipper, NULL);
    r->flip(r, 0);
    fprintf(stderr, "%s: %ld answered OK, %ld refused, %ld otherwise in %.1f s\n", what,
            atomic_load(&r->ok), atomic_load(&r->refused), atomic_load(&r->other),
            (double)(now_ms() - t0) / 1000.0);
    if (atomic_load(&r->other) > 0) {
        th_daemon_dump_log(&r->d);
        fail_msg("%s: a call was neither answered nor refused: %s", what, r->first_other);
    }
    if (atomic_load(&r->ok) == 0 || atomic_load(&r->refused) == 0)
        fail_msg("%s: in %d s the calls never saw both a valid and a bad value (%ld OK, %ld "
                 "refused): the race was not exercised",
                 what, MAX_RUN_MS / 1000, atomic_load(&r->ok), atomic_load(&r->refused));
}

/* The daemon still serves: a ping, then an embedding lookup checked against the CPU kernel. */
static void race_check_daemon(race *r)
{
    enum { V = 16, D = 8, NI = 32 };
    assert_int_equal(gpucd_ping(r->c, NULL), 0);
    float table[V * D], got[NI * D], want[NI * D];
    int32_t idx[NI];
    th_fill_f32(table, V * D);
    for (int i = 0; i < NI; i++)
        idx[i] = (int32_t)(th_rand_u64() % V);
    gpucd_tensor ti = gpucd_tensor_host(idx, GPUCD_I32, 1, TH_SHAPE(NI));
    gpucd_tensor tt = gpucd_tensor_host(table, GPUCD_F32, 2, TH_SHAPE(V, D));
    gpucd_tensor to = gpucd_tensor_host(got, GPUCD_F32, 2, TH_SHAPE(NI, D));
    int rc = gpucd_embedding_forward(r->c, &ti, &tt, &to, NULL);
    if (rc != 0)
        fail_msg("the check call after the race: %s: %s", gpucd_strerror(rc),
                 gpucd_errmsg(r->c));
    gk_tensor gi = gk_tensor_make(idx, GK_I32, 1, TH_SHAPE(NI));
    gk_tensor gt = gk_tensor_make(table, GK_F32, 2, TH_SHAPE(V, D));
    gk_tensor go = gk_tensor_make(want, GK_F32, 2, TH_SHAPE(NI, D));
    gk_err err;
    assert_int_equal(gk_cpu_embedding_forward(&gi, &gt, &go, &err), 0);
    assert_memory_equal(got, want, sizeof want);
}

/* The ping and check call, then the daemon's exit status (0, and ASan-clean). */
static void race_finish(race *r)
{
    race_check_daemon(r);
    assert_int_equal(gpucd_region_destroy(r->region), 0);
    gpucd_close(r->c);
    int st = th_daemon_stop(&r->d);
    if (st != 0)
        fail_msg("the daemon exited with status %d after the race, expected 0", st);
    pthread_mutex_destroy(&r->lock);
}

/* A test that failed part way still ends its daemon. */
static int race_teardown(void **state)
{
    race *r = *state;
    th_daemon_kill(&r->d);
    free(r);
    return 0;
}

static int race_setup(void **state)
{
    *state = th_xmalloc(sizeof(race));
    memset(*state, 0, sizeof(race));
    return 0;
}

/* ---- embedding: one index of a large index tensor flips to INT32_MAX ----------------- */

enum { EMB_V = 32, EMB_D = 8, EMB_N = 1 << 16, EMB_FLIP = EMB_N / 2 };

typedef struct emb_layout {
    size_t idx_off, table_off, out_off[SENDERS]; /* out: the lookup's output or the gradient */
    int backward;
} emb_layout;

static int32_t *emb_idx(race *r) { return (int32_t *)(r->base + ((emb_layout *)r->op)->idx_off); }

static void emb_flip(race *r, int bad)
{
    ((volatile int32_t *)emb_idx(r))[EMB_FLIP] = bad ? INT32_MAX : 3;
}

static int emb_call(race *r, int k)
{
    const emb_layout *l = r->op;
    gpucd_tensor ti = gpucd_tensor_region(r->region, l->idx_off, GPUCD_I32, 1, TH_SHAPE(EMB_N));
    if (l->backward) {
        gpucd_tensor tdout = gpucd_tensor_region(r->region, l->table_off, GPUCD_F32, 2,
                                                 TH_SHAPE(EMB_N, EMB_D));
        gpucd_tensor tdt = gpucd_tensor_region(r->region, l->out_off[k], GPUCD_F32, 2,
                                               TH_SHAPE(EMB_V, EMB_D));
        return gpucd_embedding_backward(r->c, &ti, &tdout, &tdt, NULL);
    }
    gpucd_tensor tt = gpucd_tensor_region(r->region, l->table_off, GPUCD_F32, 2,
                                          TH_SHAPE(EMB_V, EMB_D));
    gpucd_tensor to = gpucd_tensor_region(r->region, l->out_off[k], GPUCD_F32, 2,
                                          TH_SHAPE(EMB_N, EMB_D));
    return gpucd_embedding_forward(r->c, &ti, &tt, &to, NULL);
}

static void embedding_race(race *r, int backward, const char *what)
{
    /* idx, then the table (forward) or dout (backward), then each sender's output. */
    const size_t idx_bytes = (size_t)EMB_N * 4, big = (size_t)EMB_N * EMB_D * 4;
    const size_t table_bytes = backward ? big : (size_t)EMB_V * EMB_D * 4;
    const size_t out_bytes = backward ? (size_t)EMB_V * EMB_D * 4 : big;
    emb_layout l = {.idx_off = 0, .table_off = idx_bytes, .backward = backward};
    size_t at = idx_bytes + table_bytes;
    for (int k = 0; k < SENDERS; k++, at += out_bytes)
        l.out_off[k] = at;
    race_start(r, at, NULL);
    r->op = &l;
    r->call = emb_call;
    r->flip = emb_flip;
    int32_t *idx = emb_idx(r);
    for (int i = 0; i < EMB_N; i++)
        idx[i] = (int32_t)(th_rand_u64() % EMB_V);
    th_fill_f32((float *)(r->base + l.table_off), table_bytes / 4);
    race_run(r, what);
    race_finish(r);
}

static void test_embedding_forward_index_flips(void **state)
{
    embedding_race(*state, 0, "embedding_forward");
}

static void test_embedding_backward_index_flips(void **state)
{
    embedding_race(*state, 1, "embedding_backward");
}

/*
 * ---- multihot: one observation byte flips to 255 -------------------------------------
 * A layout of one two-valued feature on a 1024 x 1024 map: value 255 would set
 * channel 255 of 2, a GiB past the output.
 */

enum { MH_B = 1, MH_H = 1024, MH_W = 1024, MH_TILES = MH_H * MH_W };

typedef struct mh_layout {
    gpucd_multihot_layout layout;
    size_t out_off[SENDERS];
} mh_layout;

static void mh_flip(race *r, int bad)
{
    ((volatile uint8_t *)r->base)[(size_t)(MH_B - 1) * MH_TILES + MH_TILES / 2] = bad ? 255 : 1;
}

static int mh_call(race *r, int k)
{
    const mh_layout *l = r->op;
    gpucd_tensor tobs = gpucd_tensor_region(r->region, 0, GPUCD_U8, 2, TH_SHAPE(MH_B, MH_TILES));
    gpucd_tensor tout = gpucd_tensor_region(r->region, l->out_off[k], GPUCD_F32, 4,
                                            TH_SHAPE(MH_B, 2, MH_H, MH_W));
    return gpucd_multihot_encode(r->c, &l->layout, &tobs, &tout, NULL);
}

static void test_multihot_byte_flips(void **state)
{
    race *r = *state;
    mh_layout l = {.layout = {.height = MH_H, .width = MH_W, .nfeat = 1, .channels = 2}};
    l.layout.slots[0] = 2;
    const size_t obs_bytes = (size_t)MH_B * MH_TILES, out_bytes = (size_t)MH_B * 2 * MH_TILES * 4;
    for (int k = 0; k < SENDERS; k++)
        l.out_off[k] = obs_bytes + (size_t)k * out_bytes;
    race_start(r, obs_bytes + SENDERS * out_bytes, NULL);
    r->op = &l;
    r->call = mh_call;
    r->flip = mh_flip;
    for (size_t i = 0; i < obs_bytes; i++)
        r->base[i] = (uint8_t)(th_rand_u64() % 2);
    race_run(r, "multihot_encode");
    race_finish(r);
}

/*
 * ---- nmmo3: a map byte and a player byte of the last agent flip to 255 -----------------
 * Weights resident; obs and each sender's outputs in the region; no projection.
 */

enum { N3_B = 64, N3_FEAT = 1817, N3_FLIP_AGENT = N3_B - 1 };

typedef struct n3_state {
    gpucd_tensor w[5], g[SENDERS][5];
    size_t out_off[SENDERS]; /* features (forward) or dout (backward) */
    int backward;
} n3_state;

static void n3_flip(race *r, int bad)
{
    volatile uint8_t *o = r->base + (size_t)N3_FLIP_AGENT * GK_NMMO3_OBS_BYTES;
    o[(11 * 15 - 1) * 10] = bad ? 255 : 0;             /* the last pixel's first feature */
    o[GK_NMMO3_PLAYER_OFFSET + 46] = bad ? 255 : 7;    /* the last player value */
}

static int n3_call(race *r, int k)
{
    n3_state *s = r->op;
    gpucd_nmmo3_weights w = {&s->w[0], &s->w[1], &s->w[2], &s->w[3], &s->w[4], NULL, NULL};
    gpucd_tensor tobs = gpucd_tensor_region(r->region, 0, GPUCD_U8, 2,
                                            TH_SHAPE(N3_B, GPUCD_NMMO3_OBS_BYTES));
    gpucd_tensor tf = gpucd_tensor_region(r->region, s->out_off[k], GPUCD_F32, 2,
                                          TH_SHAPE(N3_B, N3_FEAT));
    if (!s->backward)
        return gpucd_nmmo3_encode(r->c, &w, &tobs, &tf, NULL, NULL);
    gpucd_tensor *g = s->g[k];
    gpucd_nmmo3_weights grads = {&g[0], &g[1], &g[2], &g[3], &g[4], NULL, NULL};
    return gpucd_nmmo3_encode_backward(r->c, &w, &tobs, &tf, &grads, NULL);
}

static void nmmo3_race(race *r, int backward, const char *const *flags, const char *what)
{
    static const int64_t shapes[5][4] = {{128, 59, 5, 5}, {128}, {128, 128, 3, 3}, {128},
                                         {128, 32}};
    static const int nd[5] = {4, 1, 4, 1, 2};
    n3_state s = {.backward = backward};
    const size_t obs_bytes = ((size_t)N3_B * GK_NMMO3_OBS_BYTES + 63) / 64 * 64;
    const size_t feat_bytes = (size_t)N3_B * N3_FEAT * 4;
    for (int k = 0; k < SENDERS; k++)
        s.out_off[k] = obs_bytes + (size_t)k * feat_bytes;
    race_start(r, obs_bytes + SENDERS * feat_bytes, flags);
    for (int i = 0; i < 5; i++) {
        size_t n = 1;
        for (int d = 0; d < nd[i]; d++)
            n *= (size_t)shapes[i][d];
        float *h = th_xmalloc(n * 4);
        th_fill_f32(h, n);
        for (size_t j = 0; j < n; j++)
            h[j] *= 0.1f;
        gpucd_tensor t = gpucd_tensor_host(h, GPUCD_F32, nd[i], shapes[i]);
        uint64_t id;
        assert_int_equal(gpucd_tensor_put(r->c, &t, &id), 0);
        s.w[i] = gpucd_tensor_resident(id, GPUCD_F32, nd[i], shapes[i]);
        free(h);
        for (int k = 0; k < SENDERS; k++) /* gradients inline, into host memory */
            s.g[k][i] = gpucd_tensor_host(th_xmalloc(n * 4), GPUCD_F32, nd[i], shapes[i]);
    }
    r->op = &s;
    r->call = n3_call;
    r->flip = n3_flip;
    th_fill_nmmo3_obs(r->base, N3_B);
    for (int k = 0; k < SENDERS; k++)
        th_fill_f32((float *)(r->base + s.out_off[k]), feat_bytes / 4);
    race_run(r, what);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(gpucd_tensor_free(r->c, s.w[i].resident), 0);
        for (int k = 0; k < SENDERS; k++)
            free(s.g[k][i].data);
    }
    race_finish(r);
}

static void test_nmmo3_forward_byte_flips(void **state)
{
    nmmo3_race(*state, 0, NULL, "nmmo3_encode");
}

/* Merged forwards read copies; a merged run that fails runs each request alone, on its region. */
static void test_nmmo3_batched_forward_byte_flips(void **state)
{
    static const char *const flags[] = {"--batch-window-us", "2000", NULL};
    nmmo3_race(*state, 0, flags, "nmmo3_encode, batched");
}

static void test_nmmo3_backward_byte_flips(void **state)
{
    nmmo3_race(*state, 1, NULL, "nmmo3_encode_backward");
}

/* ---- linear cross entropy: one target flips to far past the vocabulary ------------------ */

enum { LCE_N = 512, LCE_D = 32, LCE_V = 1024, LCE_FLIP = LCE_N / 2 };

typedef struct lce_layout {
    size_t e_off, c_off, t_off, loss_off[SENDERS];
} lce_layout;

static void lce_flip(race *r, int bad)
{
    const lce_layout *l = r->op;
    ((volatile int64_t *)(r->base + l->t_off))[LCE_FLIP] = bad ? INT64_MAX / 2 : 5;
}

static int lce_call(race *r, int k)
{
    const lce_layout *l = r->op;
    gpucd_tensor te = gpucd_tensor_region(r->region, l->e_off, GPUCD_F32, 2,
                                          TH_SHAPE(LCE_N, LCE_D));
    gpucd_tensor tc = gpucd_tensor_region(r->region, l->c_off, GPUCD_F32, 2,
                                          TH_SHAPE(LCE_V, LCE_D));
    gpucd_tensor tt = gpucd_tensor_region(r->region, l->t_off, GPUCD_I64, 1, TH_SHAPE(LCE_N));
    gpucd_tensor tl = gpucd_tensor_region(r->region, l->loss_off[k], GPUCD_F32, 0, NULL);
    return gpucd_linear_cross_entropy(r->c, NULL, &te, &tc, NULL, &tt, &tl, NULL, NULL, NULL,
                                      NULL, NULL);
}

static void test_lce_target_flips(void **state)
{
    race *r = *state;
    lce_layout l = {.e_off = 0, .c_off = (size_t)LCE_N * LCE_D * 4};
    l.t_off = l.c_off + (size_t)LCE_V * LCE_D * 4;
    for (int k = 0; k < SENDERS; k++)
        l.loss_off[k] = l.t_off + (size_t)LCE_N * 8 + (size_t)k * 64;
    race_start(r, l.loss_off[SENDERS - 1] + 64, NULL);
    r->op = &l;
    r->call = lce_call;
    r->flip = lce_flip;
    th_fill_f32((float *)r->base, (size_t)(LCE_N + LCE_V) * LCE_D);
    int64_t *t = (int64_t *)(r->base + l.t_off);
    for (int i = 0; i < LCE_N; i++)
        t[i] = (int64_t)(th_rand_u64() % LCE_V);
    race_run(r, "linear_cross_entropy");
    race_finish(r);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_embedding_forward_index_flips, race_setup,
                                        race_teardown),
        cmocka_unit_test_setup_teardown(test_embedding_backward_index_flips, race_setup,
                                        race_teardown),
        cmocka_unit_test_setup_teardown(test_multihot_byte_flips, race_setup, race_teardown),
        cmocka_unit_test_setup_teardown(test_nmmo3_forward_byte_flips, race_setup,
                                        race_teardown),
        cmocka_unit_test_setup_teardown(test_nmmo3_batched_forward_byte_flips, race_setup,
                                        race_teardown),
        cmocka_unit_test_setup_teardown(test_nmmo3_backward_byte_flips, race_setup,
                                        race_teardown),
        cmocka_unit_test_setup_teardown(test_lce_target_flips, race_setup, race_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
