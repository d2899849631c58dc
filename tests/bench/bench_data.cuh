/*
 * bench_data.cuh - the benchmarks' inputs on the device: random values whose
 * only duty is to be finite and not zero (zeros can run faster), from one
 * xorshift generator a benchmark, uploaded once.  Needs bench_check.cuh.
 */
#ifndef BENCH_DATA_CUH
#define BENCH_DATA_CUH

#include <stdint.h>
#include <string.h>

#include <vector>

#include "gk.h"

static uint64_t bench_rng_state = 0x2545f4914f6cdd1dull;

/* Uniform in [0, n). */
static inline uint64_t bench_rnd(uint64_t n)
{
    bench_rng_state ^= bench_rng_state << 13;
    bench_rng_state ^= bench_rng_state >> 7;
    bench_rng_state ^= bench_rng_state << 17;
    return bench_rng_state % n;
}

static inline void *bench_upload(const void *h, size_t bytes)
{
    void *d = NULL;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* n values in [-scale, scale) as f32 or bf16 (truncated: any finite value will do). */
static inline void *bench_dev_floats(size_t n, gk_dtype dt, float scale)
{
    const size_t es = gk_dtype_size(dt);
    std::vector<uint8_t> h(n * es);
    for (size_t i = 0; i < n; i++) {
        float f = scale * (float)((double)bench_rnd(1u << 24) / (double)(1u << 23) - 1.0);
        uint32_t u;
        memcpy(&u, &f, 4);
        if (dt == GK_BF16) {
            uint16_t b = (uint16_t)(u >> 16);
            memcpy(&h[i * 2], &b, 2);
        } else {
            memcpy(&h[i * 4], &f, 4);
        }
    }
    return bench_upload(h.data(), h.size());
}

#endif
