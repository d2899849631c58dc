/* cuda_graphs.c - see cuda_graphs.h. */
#include "cuda_graphs.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A key seen once (candidate), captured (exec set), or refused by CUDA (never again). */
typedef struct graph_entry {
    gcd_graph_key key;
    cudaGraphExec_t exec;
    int refused;
    uint64_t last_use;
} graph_entry;

struct gcd_graph_cache {
    cudaStream_t stream;
    int capacity;
    graph_entry *e;
    uint64_t clock;
    atomic_uint_fast64_t replays, captures; /* read by the stats view while the slot runs */
};

void gcd_graph_key_add(gcd_graph_key *k, uint64_t v)
{
    if (k->n >= 0 && k->n < GCD_GRAPH_KEY_WORDS)
        k->w[k->n++] = v;
    else
        k->n = -1;
}

gcd_graph_cache *gcd_graph_cache_create(cudaStream_t stream, int capacity)
{
    gcd_graph_cache *c = calloc(1, sizeof *c);
    if (c == NULL || (c->e = calloc((size_t)capacity, sizeof *c->e)) == NULL) {
        free(c);
        return NULL;
    }
    c->stream = stream;
    c->capacity = capacity;
    return c;
}

static void entry_clear(graph_entry *e)
{
    if (e->exec != NULL)
        cudaGraphExecDestroy(e->exec);
    memset(e, 0, sizeof *e);
}

void gcd_graph_cache_destroy(gcd_graph_cache *c)
{
    if (c == NULL)
        return;
    for (int i = 0; i < c->capacity; i++)
        entry_clear(&c->e[i]);
    free(c->e);
    free(c);
}

static int key_equal(const gcd_graph_key *a, const gcd_graph_key *b)
{
    return a->n == b->n && memcmp(a->w, b->w, sizeof a->w[0] * (size_t)a->n) == 0;
}

/* Which entry gives way first: an uncaptured one (a key seen once), then the least recently used. */
static int evicts_before(const graph_entry *a, const graph_entry *b)
{
    if ((a->exec == NULL) != (b->exec == NULL))
        return a->exec == NULL;
    return a->last_use < b->last_use;
}

/*
 * The entry of key, or else the victim, cleared and keyed (a candidate): so
 * one-off shapes (merged batches of every size) churn among themselves
 * without evicting the graphs of the shapes that repeat.
 */
static graph_entry *entry_find(gcd_graph_cache *c, const gcd_graph_key *key, int *found)
{
    graph_entry *lru = &c->e[0];
    for (int i = 0; i < c->capacity; i++) {
        graph_entry *e = &c->e[i];
        if (e->key.n > 0 && key_equal(&e->key, key)) {
            *found = 1;
            return e;
        }
        if (evicts_before(e, lru))
            lru = e;
    }
    *found = 0;
    entry_clear(lru);
    lru->key = *key;
    return lru;
}

/* Captures enqueue() into e->exec; CUDA's refusal (not enqueue's own failure) sets e->refused. */
static int capture(gcd_graph_cache *c, graph_entry *e, gcd_graph_enqueue_fn enqueue, void *arg,
                   gk_err *err)
{
    cudaGraph_t g = NULL;
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        e->refused = 1;
        return enqueue(arg, err);
    }
    int rc = enqueue(arg, err);
    cudaError_t ce = cudaStreamEndCapture(c->stream, &g);
    if (rc == 0 && ce == cudaSuccess)
        ce = cudaGraphInstantiate(&e->exec, g, 0);
    if (g != NULL)
        cudaGraphDestroy(g);
    if (rc != 0) /* the request's own error (shapes, workspace): nothing ran */
        return rc;
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        e->exec = NULL;
        e->refused = 1;
        return enqueue(arg, err);
    }
    atomic_fetch_add_explicit(&c->captures, 1, memory_order_relaxed);
    return cudaGraphLaunch(e->exec, c->stream) == cudaSuccess
               ? 0
               : gk_fail(err, GK_EDEVICE, "launching a captured graph: %s",
                         cudaGetErrorString(cudaGetLastError()));
}

int gcd_graph_cache_run(gcd_graph_cache *c, const gcd_graph_key *key, gcd_graph_enqueue_fn enqueue,
                        void *arg, gk_err *err)
{
    if (c == NULL || key->n <= 0)
        return enqueue(arg, err);
    int found;
    graph_entry *e = entry_find(c, key, &found);
    e->last_use = ++c->clock;
    if (!found || e->refused)
        return enqueue(arg, err);
    if (e->exec == NULL)
        return capture(c, e, enqueue, arg, err);
    atomic_fetch_add_explicit(&c->replays, 1, memory_order_relaxed);
    cudaError_t ce = cudaGraphLaunch(e->exec, c->stream);
    return ce == cudaSuccess ? 0
                             : gk_fail(err, GK_EDEVICE, "launching a captured graph: %s",
                                       cudaGetErrorString(ce));
}

void gcd_graph_cache_counts(gcd_graph_cache *c, uint64_t *replays, uint64_t *captures)
{
    *replays += atomic_load_explicit(&c->replays, memory_order_relaxed);
    *captures += atomic_load_explicit(&c->captures, memory_order_relaxed);
}
