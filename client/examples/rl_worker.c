/*
 * rl_worker.c - an RL environment worker that encodes its observations on gpucd.
 *
 * Copy this file to start your own worker.  Once at start it connects, uploads
 * the NMMO3 encoder weights as resident tensors (here random; yours come from
 * the learner) and creates one shared-memory region holding the observation
 * batch and the encoder output.  Then every step it writes the batch's
 * observations straight into the region and asks gpucd to encode them: no
 * tensor bytes travel through the socket, only a small request.
 *
 *   cc rl_worker.c $(pkg-config --cflags --libs gpucd) -lm -o rl_worker
 *   ./rl_worker --url ipc:///run/user/1000/gpucd.sock --batch 1024 --steps 200
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpucd.h"

/* NMMO3 observation layout (docs/nmmo3.md). */
enum {
    MAP_H = 11,
    MAP_W = 15,
    MAP_FEATURES = 10,
    PLAYER_OFFSET = 1650,
    PLAYER_COUNT = 47,
    PLAYER_VOCAB = 128,
    REWARD_OFFSET = 1697,
    REWARD_WRITTEN = 9,
};
static const int tile_factors[MAP_FEATURES] = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4};

/* xorshift64*: a small fast generator, good enough for fake observations. */
static uint64_t rng_state;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static float rng_uniform(float scale) /* in [-scale, scale) */
{
    return ((float)(rng_next() >> 40) / (float)(1u << 24) * 2.0f - 1.0f) * scale;
}

/* Stands in for the environment: one valid observation per agent. */
static void observations_write(uint8_t *obs, int batch)
{
    for (int a = 0; a < batch; a++) {
        uint8_t *o = obs + (size_t)a * GPUCD_NMMO3_OBS_BYTES;
        for (int tile = 0; tile < MAP_H * MAP_W; tile++)
            for (int f = 0; f < MAP_FEATURES; f++)
                o[tile * MAP_FEATURES + f] = (uint8_t)(rng_next() % (uint64_t)tile_factors[f]);
        for (int i = 0; i < PLAYER_COUNT; i++)
            o[PLAYER_OFFSET + i] = (uint8_t)(rng_next() % PLAYER_VOCAB);
        for (int i = 0; i < 10; i++)
            o[REWARD_OFFSET + i] = i < REWARD_WRITTEN ? (uint8_t)(rng_next() % 128) : 0;
    }
}

/* Uploads a random f32 weight of the given shape, scaled by 1/sqrt(fan_in). */
static int weight_upload(gpucd_client *c, int ndim, const int64_t *shape, int64_t fan_in,
                         gpucd_tensor *out)
{
    gpucd_tensor host = gpucd_tensor_host(NULL, GPUCD_F32, ndim, shape);
    int64_t n = gpucd_tensor_numel(&host);
    float *data = malloc((size_t)n * sizeof *data);
    if (data == NULL)
        return GPUCD_ENOMEM;
    float scale = 1.0f / sqrtf((float)fan_in);
    for (int64_t i = 0; i < n; i++)
        data[i] = rng_uniform(scale);
    host.data = data;
    uint64_t id;
    int rv = gpucd_tensor_put(c, &host, &id);
    free(data);
    if (rv == 0)
        *out = gpucd_tensor_resident(id, GPUCD_F32, ndim, shape);
    return rv;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t percentile(const uint64_t *sorted, int n, double p)
{
    int i = (int)ceil(p / 100.0 * n) - 1;
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static int fail(const char *what, int code)
{
    fprintf(stderr, "rl_worker: %s: %s (%s)\n", what, gpucd_errmsg(NULL), gpucd_strerror(code));
    return 1;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: rl_worker [--url URL] [--batch N] [--steps N] [--hidden N] [--seed N]\n"
                 "  --url URL     the daemon (default: the daemon's default ipc:// socket)\n"
                 "  --batch N     agents per step (default 1024)\n"
                 "  --steps N     steps to run (default 100)\n"
                 "  --hidden N    encoder output width (default 256)\n"
                 "  --seed N      random seed (default: from the clock)\n");
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "rl_worker: %s '%s' is not a number in %ld..%ld\n", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"url", required_argument, NULL, 'u'},   {"batch", required_argument, NULL, 'b'},
        {"steps", required_argument, NULL, 's'}, {"hidden", required_argument, NULL, 'H'},
        {"seed", required_argument, NULL, 'r'},  {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *url = NULL;
    long batch = 1024, steps = 100, hidden_dim = 256, seed = (long)time(NULL);
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'u': url = optarg; break;
        case 'b': bad = parse_int("--batch", optarg, 1, 1 << 20, &batch); break;
        case 's': bad = parse_int("--steps", optarg, 1, 1 << 24, &steps); break;
        case 'H': bad = parse_int("--hidden", optarg, 1, 1 << 16, &hidden_dim); break;
        case 'r': bad = parse_int("--seed", optarg, 0, 1L << 30, &seed); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad)
            return 2;
    }
    rng_state = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;

    gpucd_options opts;
    gpucd_options_init(&opts);
    opts.client_name = "rl_worker example";
    /* A worker waiting for its features has nothing else to do: poll, so that each step
     * ends the moment the daemon has written the output (the completion record), not when
     * the reply has woken this thread. */
    opts.spin_us = 5000;
    gpucd_client *client;
    int rv = gpucd_connect(url, &opts, &client);
    if (rv < 0)
        return fail("connect", rv);
    gpucd_info info;
    if ((rv = gpucd_info_get(client, &info)) < 0)
        return fail("info", rv);
    printf("gpucd %s, backend %s on %s; batch %ld, hidden %ld, %ld steps, seed %ld\n",
           info.server_version, info.backend, info.device_name, batch, hidden_dim, steps, seed);

    /* Weights: uploaded once, then named by id in every request. */
    const int64_t H = hidden_dim;
    const int64_t s_conv1_w[] = {128, 59, 5, 5}, s_conv1_b[] = {128};
    const int64_t s_conv2_w[] = {128, 128, 3, 3}, s_conv2_b[] = {128};
    const int64_t s_embed[] = {128, 32}, s_proj_w[] = {H, GPUCD_NMMO3_FEATURES}, s_proj_b[] = {H};
    gpucd_tensor conv1_w, conv1_b, conv2_w, conv2_b, embed, proj_w, proj_b;
    if ((rv = weight_upload(client, 4, s_conv1_w, 59 * 25, &conv1_w)) < 0 ||
        (rv = weight_upload(client, 1, s_conv1_b, 59 * 25, &conv1_b)) < 0 ||
        (rv = weight_upload(client, 4, s_conv2_w, 128 * 9, &conv2_w)) < 0 ||
        (rv = weight_upload(client, 1, s_conv2_b, 128 * 9, &conv2_b)) < 0 ||
        (rv = weight_upload(client, 2, s_embed, 1, &embed)) < 0 ||
        (rv = weight_upload(client, 2, s_proj_w, GPUCD_NMMO3_FEATURES, &proj_w)) < 0 ||
        (rv = weight_upload(client, 1, s_proj_b, GPUCD_NMMO3_FEATURES, &proj_b)) < 0)
        return fail("uploading the weights", rv);
    gpucd_nmmo3_weights weights = {&conv1_w, &conv1_b, &conv2_w, &conv2_b, &embed, &proj_w, &proj_b};

    /* One region: observations first, then the hidden output, 64-byte aligned. */
    size_t obs_bytes = (size_t)batch * GPUCD_NMMO3_OBS_BYTES;
    size_t hidden_offset = (obs_bytes + 63) / 64 * 64;
    size_t region_bytes = hidden_offset + (size_t)batch * (size_t)H * sizeof(float);
    gpucd_region *region;
    if ((rv = gpucd_region_create(client, region_bytes, &region)) < 0)
        return fail("creating the region", rv);
    uint8_t *obs_data = gpucd_region_data(region);
    const float *hidden_data = (const float *)(obs_data + hidden_offset);
    const int64_t s_obs[] = {batch, GPUCD_NMMO3_OBS_BYTES}, s_hidden[] = {batch, H};
    gpucd_tensor obs = gpucd_tensor_region(region, 0, GPUCD_U8, 2, s_obs);
    gpucd_tensor hidden = gpucd_tensor_region(region, hidden_offset, GPUCD_F32, 2, s_hidden);

    uint64_t *round_trip = malloc((size_t)steps * sizeof *round_trip);
    uint64_t *compute = malloc((size_t)steps * sizeof *compute);
    if (round_trip == NULL || compute == NULL) {
        fprintf(stderr, "rl_worker: out of memory\n");
        return 1;
    }
    double checksum = 0;
    for (long step = 0; step < steps; step++) {
        observations_write(obs_data, (int)batch); /* the environment steps here */
        gpucd_timings t;
        if ((rv = gpucd_nmmo3_encode(client, &weights, &obs, NULL, &hidden, &t)) < 0)
            return fail("nmmo3_encode", rv);
        round_trip[step] = t.round_trip_us;
        compute[step] = t.compute_us;
        /* The policy head would read hidden here; the ReLU output is never negative. */
        for (int64_t i = 0; i < batch * H; i++) {
            if (!(hidden_data[i] >= 0.0f)) {
                fprintf(stderr, "rl_worker: step %ld: hidden[%lld] = %g is not a ReLU output\n",
                        step, (long long)i, (double)hidden_data[i]);
                return 1;
            }
            checksum += hidden_data[i];
        }
    }
    qsort(round_trip, (size_t)steps, sizeof *round_trip, cmp_u64);
    qsort(compute, (size_t)steps, sizeof *compute, cmp_u64);
    int n = (int)steps;
    printf("round trip us: p50 %llu  p90 %llu  p99 %llu  max %llu\n",
           (unsigned long long)percentile(round_trip, n, 50),
           (unsigned long long)percentile(round_trip, n, 90),
           (unsigned long long)percentile(round_trip, n, 99),
           (unsigned long long)round_trip[n - 1]);
    printf("daemon compute us: p50 %llu  p99 %llu; %.0f agents/s at p50; mean hidden %.6f\n",
           (unsigned long long)percentile(compute, n, 50),
           (unsigned long long)percentile(compute, n, 99),
           (double)batch * 1e6 / (double)(percentile(round_trip, n, 50) + 1),
           checksum / ((double)steps * (double)batch * (double)H));

    free(round_trip);
    free(compute);
    int status = 0;
    if ((rv = gpucd_region_destroy(region)) < 0)
        status = fail("destroying the region", rv);
    gpucd_tensor *all[] = {&conv1_w, &conv1_b, &conv2_w, &conv2_b, &embed, &proj_w, &proj_b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if ((rv = gpucd_tensor_free(client, all[i]->resident)) < 0)
            status = fail("freeing a weight", rv);
    }
    gpucd_close(client);
    return status;
}
