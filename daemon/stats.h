/*
 * stats.h - every counter the daemon keeps, for the stats operation, /metrics
 * and /stats.  Counting never takes a lock: relaxed atomics only, so the
 * request path pays a few uncontended increments.
 */
#ifndef GCD_STATS_H
#define GCD_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#include "status.h"

/*
 * Request kinds as counted: one per wire operation (NAME is its case in gpucd.proto's Request),
 * then GCD_REQ_INVALID for malformed and unknown ones.  X(NAME, name, compute): compute kinds
 * run a kernel and get latency histograms in /metrics; the others (control: connection, region
 * and resident tensor bookkeeping, stats) are only counted.
 */
#define GCD_REQ_KINDS(X)                                                                           \
    X(HELLO, "hello", 0)                                                                           \
    X(PING, "ping", 0)                                                                             \
    X(REGION_REGISTER, "region_register", 0)                                                       \
    X(REGION_UNREGISTER, "region_unregister", 0)                                                   \
    X(REGION_LIST, "region_list", 0)                                                               \
    X(TENSOR_PUT, "tensor_put", 0)                                                                 \
    X(TENSOR_GET, "tensor_get", 0)                                                                 \
    X(TENSOR_FREE, "tensor_free", 0)                                                               \
    X(STATS, "stats", 0)                                                                           \
    X(SUBMIT_QUEUE_OPEN, "submit_queue_open", 0)                                                   \
    X(CONV2D_FORWARD, "conv2d_forward", 1)                                                         \
    X(CONV2D_BACKWARD, "conv2d_backward", 1)                                                       \
    X(MULTIHOT_ENCODE, "multihot_encode", 1)                                                       \
    X(EMBEDDING_FORWARD, "embedding_forward", 1)                                                   \
    X(EMBEDDING_BACKWARD, "embedding_backward", 1)                                                 \
    X(LINEAR_CROSS_ENTROPY, "linear_cross_entropy", 1)                                             \
    X(NMMO3_ENCODE, "nmmo3_encode", 1)

typedef enum gcd_req_kind {
#define GCD_REQ_KIND_ENUM(id, name, compute) GCD_REQ_##id,
    GCD_REQ_KINDS(GCD_REQ_KIND_ENUM)
#undef GCD_REQ_KIND_ENUM
    GCD_REQ_INVALID, /* undecodable, wrong version or unknown operation */
    GCD_REQ_KIND_COUNT,
} gcd_req_kind;

const char *gcd_req_kind_name(gcd_req_kind k);
/* 1 when requests of kind k run a kernel (see GCD_REQ_KINDS). */
int gcd_req_kind_computes(gcd_req_kind k);

/* The phases of a request whose latency is kept as a histogram. */
typedef enum gcd_phase {
    GCD_PHASE_QUEUE,
    GCD_PHASE_COPY_IN,
    GCD_PHASE_COMPUTE,
    GCD_PHASE_COPY_OUT,
    GCD_PHASE_TOTAL, /* received to reply built; last: the phases before it are its parts */
    GCD_PHASE_COUNT,
} gcd_phase;

const char *gcd_phase_name(gcd_phase p);

/* Upper bounds (seconds) of the histogram buckets; the last bucket is +Inf. */
enum { GCD_HIST_BUCKETS = 20 };
extern const double gcd_hist_bounds[GCD_HIST_BUCKETS - 1];

typedef struct gcd_hist {
    atomic_uint_fast64_t bucket[GCD_HIST_BUCKETS]; /* not cumulative */
    atomic_uint_fast64_t sum_us;
    atomic_uint_fast64_t count;
} gcd_hist;

typedef struct gcd_stats {
    atomic_uint_fast64_t requests[GCD_REQ_KIND_COUNT][GCD_STATUS_COUNT];
    gcd_hist latency[GCD_REQ_KIND_COUNT][GCD_PHASE_COUNT];
    atomic_int_fast64_t inflight;  /* being worked on */
    atomic_int_fast64_t queued;    /* received, waiting for a worker */
    atomic_uint_fast64_t bytes_in, bytes_out;
    atomic_int_fast64_t clients;
    atomic_uint_fast64_t batches, batch_rows;
    atomic_uint_fast64_t doorbells; /* completion records written (proto/doorbell_record.h) */
    atomic_uint_fast64_t record_answers; /* of those, requests answered by the record alone */
    atomic_int_fast64_t submit_queues;   /* submission queues open (submitq.h) */
    atomic_uint_fast64_t submit_taken;   /* cells taken from them */
    atomic_uint_fast64_t submit_rejected; /* of those, refused: a slot or length out of range */
    atomic_uint_fast64_t submit_sleeps;  /* times the queue poller went to sleep */
    atomic_uint_fast64_t listener_restarts; /* stopped listeners re-created (listen_watch.h) */
    uint64_t start_us;
} gcd_stats;

void gcd_stats_init(gcd_stats *s);
void gcd_stats_observe(gcd_stats *s, gcd_req_kind k, gcd_phase p, uint64_t us);
void gcd_stats_count(gcd_stats *s, gcd_req_kind k, gcd_status status);

#endif
