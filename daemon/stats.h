/*
 * stats.h - every counter the daemon keeps, for the stats operation, /metrics
 * and /stats.  Counting never takes a lock: relaxed atomics only, so the
 * request path pays a few uncontended increments.
 */
#ifndef GCD_STATS_H
#define GCD_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#include "op_map.h"
#include "status.h"

/*
 * Request kinds as counted: the control operations (connection, region and resident tensor
 * bookkeeping, stats), X(NAME, name) with NAME their case in gpucd.proto's Request, which are
 * only counted; then the compute ones, one per wire case of GCD_OP_MAP (GCD_REQ_<WIRE>), which
 * run a kernel and get latency histograms in /metrics; then GCD_REQ_INVALID for malformed and
 * unknown requests.
 */
#define GCD_REQ_CONTROL_KINDS(X)                                                                   \
    X(HELLO, "hello")                                                                              \
    X(PING, "ping")                                                                                \
    X(REGION_REGISTER, "region_register")                                                          \
    X(REGION_UNREGISTER, "region_unregister")                                                      \
    X(REGION_LIST, "region_list")                                                                  \
    X(TENSOR_PUT, "tensor_put")                                                                    \
    X(TENSOR_GET, "tensor_get")                                                                    \
    X(TENSOR_FREE, "tensor_free")                                                                  \
    X(STATS, "stats")                                                                              \
    X(SUBMIT_QUEUE_OPEN, "submit_queue_open")

typedef enum gcd_req_kind {
#define GCD_REQ_CONTROL_ENUM(id, name) GCD_REQ_##id,
#define GCD_REQ_COMPUTE_ENUM(kind, name, wire, share) GCD_OP_IF_FIRST(share, GCD_REQ_##wire, )
    GCD_REQ_CONTROL_KINDS(GCD_REQ_CONTROL_ENUM)
    GCD_OP_MAP(GCD_REQ_COMPUTE_ENUM)
#undef GCD_REQ_CONTROL_ENUM
#undef GCD_REQ_COMPUTE_ENUM
    GCD_REQ_INVALID, /* undecodable, wrong version or unknown operation */
    GCD_REQ_KIND_COUNT,
} gcd_req_kind;

const char *gcd_req_kind_name(gcd_req_kind k);
/* 1 when requests of kind k run a kernel (the kinds of GCD_OP_MAP). */
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

/*
 * The daemon-wide numbers that are one value each, in the order /stats lists them:
 * X(field, kind, metric, help).  kind: GAUGE (signed, goes up and down) or COUNTER (unsigned,
 * only up); field is also the /stats key, metric the /metrics name.  metrics.c and
 * stats_json.c expand this list: a number added here shows in both.
 */
#define GCD_STATS_NUMBERS(X)                                                                       \
    X(inflight, GAUGE, "gpucd_requests_in_flight", "Requests being worked on by a worker.")       \
    X(queued, GAUGE, "gpucd_requests_queued", "Requests received and waiting for a worker.")      \
    X(clients, GAUGE, "gpucd_clients_connected", "Connections open to the request socket.")       \
    X(bytes_in, COUNTER, "gpucd_received_bytes_total", "Bytes of request messages received.")     \
    X(bytes_out, COUNTER, "gpucd_sent_bytes_total", "Bytes of reply messages sent.")              \
    X(batches, COUNTER, "gpucd_batches_total",                                                     \
      "Batches the backend ran (each compute request is one).")                                   \
    X(batch_rows, COUNTER, "gpucd_batch_rows_total",                                               \
      "Rows of all batches run (rows / batches is the mean batch size).")                         \
    X(doorbells, COUNTER, "gpucd_doorbells_total",                                                 \
      "Completion records written into clients' shared memory.")                                  \
    X(record_answers, COUNTER, "gpucd_record_answers_total",                                       \
      "Requests answered by their completion record alone, with no reply sent.")                  \
    X(submit_queues, GAUGE, "gpucd_submit_queues",                                                 \
      "Submission queues open (local clients' requests through shared memory).")                  \
    X(submit_taken, COUNTER, "gpucd_submit_taken_total", "Requests taken from submission queues.") \
    X(submit_rejected, COUNTER, "gpucd_submit_rejected_total",                                     \
      "Submission queue entries refused (a slot or length out of range).")                        \
    X(submit_sleeps, COUNTER, "gpucd_submit_sleeps_total",                                         \
      "Times the submission queue poller went to sleep.")                                         \
    X(listener_restarts, COUNTER, "gpucd_listener_restarts_total",                                 \
      "Listeners found no longer accepting connections and re-created.")

/* The atomic type of each kind of number. */
typedef atomic_int_fast64_t gcd_stat_GAUGE;
typedef atomic_uint_fast64_t gcd_stat_COUNTER;

typedef struct gcd_stats {
    atomic_uint_fast64_t requests[GCD_REQ_KIND_COUNT][GCD_STATUS_COUNT];
    gcd_hist latency[GCD_REQ_KIND_COUNT][GCD_PHASE_COUNT];
#define GCD_STATS_FIELD(field, kind, metric, help) gcd_stat_##kind field;
    GCD_STATS_NUMBERS(GCD_STATS_FIELD)
#undef GCD_STATS_FIELD
    uint64_t start_us;
} gcd_stats;

void gcd_stats_init(gcd_stats *s);
void gcd_stats_observe(gcd_stats *s, gcd_req_kind k, gcd_phase p, uint64_t us);
void gcd_stats_count(gcd_stats *s, gcd_req_kind k, gcd_status status);

#endif
