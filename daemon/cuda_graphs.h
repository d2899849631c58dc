/*
 * cuda_graphs.h - replaying a request's kernels as one CUDA graph.
 *
 * A request of a shape the daemon serves again and again (an RL worker's
 * rollout batch) enqueues the same kernels with the same arguments every
 * time: its tensors land at the same places of its execution slot and its
 * weights are resident.  The cache captures that sequence once, on the
 * second request with the same key, and replays it as one graph launch from
 * then on, which saves the host-side cost of every kernel launch.
 *
 * The key must name everything the enqueued work depends on (every device
 * pointer, shape, dtype and option): two requests with equal keys must
 * enqueue identical work.  One cache belongs to one stream and is run by one
 * thread at a time (an execution slot serves one request at a time); only
 * its counters may be read from elsewhere.
 */
#ifndef GCD_CUDA_GRAPHS_H
#define GCD_CUDA_GRAPHS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "gk.h"

/* The most 64-bit words of a key. */
enum { GCD_GRAPH_KEY_WORDS = 96 };

typedef struct gcd_graph_key {
    int n;
    uint64_t w[GCD_GRAPH_KEY_WORDS];
} gcd_graph_key;

/* Appends one word; a key that overflows is marked unusable (never cached). */
void gcd_graph_key_add(gcd_graph_key *k, uint64_t v);

typedef struct gcd_graph_cache gcd_graph_cache;

/* A cache of at most capacity graphs for the work enqueued on stream. */
gcd_graph_cache *gcd_graph_cache_create(cudaStream_t stream, int capacity);
void gcd_graph_cache_destroy(gcd_graph_cache *c);

/* The enqueuing of one request's work on the cache's stream: 0 or a gk error code. */
typedef int (*gcd_graph_enqueue_fn)(void *arg, gk_err *err);

/*
 * Enqueues the request's work on the stream: a replay of the graph cached
 * for key, or a capture of enqueue() that is then replayed (the key's second
 * sighting), or enqueue() itself.  What enqueue() fails with is returned
 * as is; a capture CUDA refuses falls back to enqueue() and marks the key so
 * that it is never tried again.
 */
int gcd_graph_cache_run(gcd_graph_cache *c, const gcd_graph_key *key, gcd_graph_enqueue_fn enqueue,
                        void *arg, gk_err *err);

/* Adds the cache's replays and captures since create to the counters (thread-safe). */
void gcd_graph_cache_counts(gcd_graph_cache *c, uint64_t *replays, uint64_t *captures);

#endif
