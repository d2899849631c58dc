/*
 * internal.h - what the client library's files share; never installed.
 * Internal names carry the gpucdc_ prefix.
 */
#ifndef GPUCDC_INTERNAL_H
#define GPUCDC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/un.h>
#include <time.h>

#include <nng/nng.h>

#include "doorbell_record.h"
#include "fdpass_wire.h"
#include "submit_queue.h"
#include "gpucd.h"
#include "wire.h"

#define GPUCDC_DEFAULT_TIMEOUT_MS 30000
#define GPUCDC_MAX_SPIN_US 1000000
/* The longest a call sleeps on its record before looking again: only a safety net, since the
 * daemon and the reply's callback both wake it. */
#define GPUCDC_BELL_NAP_MS 100
#define GPUCDC_XSTR(x) #x
#define GPUCDC_STR(x) GPUCDC_XSTR(x)

/* ---- errors (error.c) ---------------------------------------------------------- */

/* Formats the calling thread's error message and returns code. */
int gpucdc_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Empties the calling thread's error message (a call that succeeds leaves none). */
void gpucdc_clear_error(void);
/* Maps an nng error to a gpucd code, with a message "op: what: nng reason". */
int gpucdc_fail_nng(int nng_rv, const char *op, const char *what);
/* Maps a daemon status (gpucd.v1.Status) to a code; 0 for OK. */
int gpucdc_status_code(int status);
/* Fails op with GPUCD_EUNTRUSTED: the daemon at the client's URL runs as uid, not trust_uid. */
int gpucdc_fail_untrusted(const gpucd_client *c, const char *op, uint64_t uid);

/* CLOCK_MONOTONIC in microseconds: round trips and polling deadlines. */
static inline uint64_t gpucdc_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- the connection (client.c) -------------------------------------------------- */

/* A tls+tcp:// dialer's TLS from opts and GPUCD_TLS_* (tls.c); 0 or a code with a message. */
int gpucdc_tls_dialer(nng_dialer dialer, const char *url, const gpucd_options *opts);

/* Where a slot's nng operation is. */
enum {
    GPUCDC_SLOT_WAITING,  /* started, not finished */
    GPUCDC_SLOT_DONE,     /* finished: the caller takes the result */
    GPUCDC_SLOT_DETACHED, /* the caller left on the doorbell: the callback ends the slot's
                             canceled receive (or drops an older daemon's reply) */
};

/* One nng context and its aio, used by one call at a time. */
typedef struct gpucdc_slot {
    nng_ctx ctx;
    nng_aio *aio;
    atomic_int state; /* GPUCDC_SLOT_*: set by the caller and the aio's callback */
    uint64_t deadline;     /* the current call's end, gpucdc_now_us; UINT64_MAX: none */
    pthread_mutex_t lock;  /* with `finished`: the caller sleeps until the callback or the */
    pthread_cond_t finished; /* deadline (a monotonic clock's) */
    struct gpucd_client *client;
    int bell; /* its completion record in the client's doorbell region; -1: none */
    const struct gpucd_region *bell_area; /* the area (one a connection) `bell` is a record of */
    struct doorbell_record *bell_rec; /* the current call's record, NULL when it names none */
    struct gpucdc_slot *next_free;
    struct gpucdc_slot *next_all;
} gpucdc_slot;

/* Where the connection's area stands (area.c). */
enum { GPUCDC_AREA_UNTRIED = 0, GPUCDC_AREA_READY = 1, GPUCDC_AREA_UNAVAILABLE = -1 };

/* The connection's area (area.c): its completion records, one per slot, and its submission
 * queue, made before the first call that can use them. */
typedef struct gpucdc_area {
    pthread_mutex_t lock; /* held while making it and while giving out records */
    atomic_int state;     /* GPUCDC_AREA_*: unavailable when no region could be made */
    atomic_uint connection; /* the connection (gpucd_client.connections) state is about */
    _Atomic(struct gpucd_region *) region; /* the area on that connection's daemon */
    struct gpucd_region *retired; /* earlier connections' areas, mapped until close */
    int next; /* the next record of the current area to give a slot */
} gpucdc_area;

struct gpucd_client {
    nng_socket sock;
    nng_dialer dialer;
    nng_duration timeout_ms;
    uint64_t spin_us; /* gpucd_options.spin_us */
    bool local;       /* ipc:// or inproc://: shared memory reaches the daemon */
    /* the daemon's descriptor socket (ipc:// only); "" when none */
    char fd_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char *client_name;
    atomic_uint_fast64_t next_id;
    pthread_mutex_t lock; /* guards the slot lists; never held while waiting */
    gpucdc_slot *free_slots;
    gpucdc_slot *all_slots;
    atomic_uint connections; /* connections made so far: the daemon may be another after a new one */
    atomic_uint disconnections; /* connections lost so far: a queued call's end without a reply */
    /* A call timed out while its request may still have been being written, on the connection
     * that came before this many disconnections (gpucd_close waits for the write first). */
    atomic_bool unsent_write;
    atomic_uint unsent_write_disconnections;
    gpucdc_area area;
    char *url;          /* for messages */
    uint64_t trust_uid; /* ipc://: the uid each connection's peer must run as */
    /* The uid of the daemon whose connection was refused last (GPUCDC_UID_UNKNOWN when it
     * could not be learnt); GPUCDC_UID_TRUSTED while the last connection was accepted. */
    _Atomic uint64_t refused_uid;
};

#define GPUCDC_UID_TRUSTED UINT64_MAX
#define GPUCDC_UID_UNKNOWN (UINT64_MAX - 1)

/* gpucd_connect without waiting for the first connection: nng dials in the background until
 * one is made (calls meanwhile wait for it), so that a daemon not there yet costs no socket made
 * and closed again and again (nng 1.5.2's close can hang under such churn).  Fails only for
 * what no dial could cure: the URL, the options, memory, the TLS files. */
int gpucdc_connect_lazy(const char *url, const gpucd_options *opts, gpucd_client **out);
/* 1 while the client has a connection to its daemon (made and not lost since). */
bool gpucdc_client_connected(gpucd_client *c);

/* ---- regions (region.c) ---------------------------------------------------------- */

struct gpucd_region {
    gpucd_client *client; /* region ids are per connection */
    void *data;
    size_t size;
    uint64_t id;
    struct gpucd_region *next_retired; /* area.c's list of earlier connections' areas */
    /* The connection's area only (set by area.c, read by submit.c): the daemon's wake page
     * while the queue is open, NULL when calls on this area use the socket. */
    _Atomic(submit_wake *) wake;
};

/*
 * Makes a region of size bytes (1..2^63-1) and registers it with the daemon:
 * gpucd_region_create once its arguments are checked, and the area's maker.
 */
int gpucdc_region_make(gpucd_client *client, size_t size, gpucd_region **out);
/* Unmaps and frees a region without asking the daemon (whose connection is gone). */
void gpucdc_region_forget(gpucd_region *region);

/* ---- the descriptor socket (fdpass.c) ---------------------------------------------- */

/*
 * One exchange on the daemon's descriptor socket: req with fd (-1: none);
 * the answer in *ans and the descriptor it carries in *got (-1: none, else
 * the caller's).  0, or a negative code with the answer's reason.
 */
int gpucdc_fdpass(gpucd_client *c, const char *op, const fdpass_request *req, int fd,
                  fdpass_answer *ans, int *got);

/* ---- requests (request.c) ------------------------------------------------------- */

/* The most tensors an operation names (nmmo3 backward: 7 + obs + dout + 7). */
enum { GPUCDC_MAX_REFS = 20 };

/*
 * A request being built.  Every protobuf sub-message lives inside this struct,
 * so a request costs no allocation until it is packed into an nng message.
 */
typedef struct gpucdc_request {
    gpucd_client *client;
    const char *op;          /* operation name, for error messages */
    Gpucd__V1__Request msg;
    Gpucd__V1__TensorRef refs[GPUCDC_MAX_REFS];
    Gpucd__V1__RegionSlice region_slices[GPUCDC_MAX_REFS];
    Gpucd__V1__InlineSlice inline_slices[GPUCDC_MAX_REFS];
    Gpucd__V1__RegionSlice doorbell; /* msg.doorbell points here when used */
    int64_t shapes[GPUCDC_MAX_REFS][GPUCD_MAX_DIMS];
    int nrefs;
    /* Host inputs, copied into the payload at their offsets when packed. */
    struct {
        const void *data;
        uint64_t offset;
        uint64_t bytes;
    } inputs[GPUCDC_MAX_REFS];
    int ninputs;
    uint64_t payload_bytes;
    /* Outputs in the order the reply lists them. */
    struct {
        gpucd_tensor *tensor;
        uint64_t bytes;
    } outputs[GPUCDC_MAX_REFS];
    int noutputs;
} gpucdc_request;

void gpucdc_request_init(gpucdc_request *req, gpucd_client *client, const char *op);

/*
 * Validates t and encodes it as an input (into *slot) or an output (appended
 * to the outputs the reply must describe).  t NULL: absent, which is an
 * error when required.  name names the argument in error messages.
 */
int gpucdc_request_input(gpucdc_request *req, const char *name, const gpucd_tensor *t,
                         bool required, Gpucd__V1__TensorRef **slot);
int gpucdc_request_output(gpucdc_request *req, const char *name, gpucd_tensor *t,
                          bool required, Gpucd__V1__TensorRef **slot);

/* Checks t on its own: location, dtype, ndim, dims and byte size (in *bytes). */
int gpucdc_tensor_check(const char *op, const char *name, const gpucd_tensor *t,
                        uint64_t *bytes);

/* Sets version and id and packs the request and its host inputs into *out. */
int gpucdc_request_pack(gpucdc_request *req, nng_msg **out);

/* ---- slots (slot.c) ------------------------------------------------------------------ */

/* Takes a free context, opening a new one when every context is in use; it names no record. */
int gpucdc_slot_acquire(gpucd_client *c, gpucdc_slot **out);
/* Gives a context back; a detached slot's callback does it when its receive ends. */
void gpucdc_slot_release(gpucdc_slot *s);
/* Closes every context of the client (gpucd_close, before the socket). */
void gpucdc_slots_free(gpucd_client *c);

/* What answered an exchange that reached the daemon. */
typedef enum gpucdc_answer {
    GPUCDC_ANSWER_REPLY,  /* the reply, for the caller to decode */
    GPUCDC_ANSWER_RECORD, /* the completion record alone: a success, every output in place */
} gpucdc_answer;

/*
 * Sends request on slot s and waits for the answer within the client's
 * timeout; releases the slot.  With bell (the slot's record, the request
 * naming it), waits on the record (polling spin_us, then asleep) while the
 * reply travels: when it shows request id with status OK first, answers
 * GPUCDC_ANSWER_RECORD with *reply NULL and the record in *rang, and cancels
 * the receive (the request is record-only: no reply comes).  Else the reply
 * in *reply.  0, or a negative code.
 */
int gpucdc_slot_exchange(gpucdc_slot *s, const char *op, nng_msg *request, uint64_t id,
                         struct doorbell_record *bell, struct doorbell_record *rang,
                         nng_msg **reply, gpucdc_answer *answer);

/* ---- calls answered by their reply (call.c) ---------------------------------------------- */

/* A decoded reply; payload points into msg. */
typedef struct gpucdc_reply {
    nng_msg *msg;
    Gpucd__V1__Reply *reply;
    const uint8_t *payload;
    size_t payload_len;
} gpucdc_reply;

/*
 * Sends req, a control operation, and waits for its reply within the
 * client's timeout.  On success the reply's status was OK, its outputs were
 * delivered to the request's output tensors, t (optional) holds the timings,
 * and *out (optional) holds the reply for the caller to read and
 * gpucdc_reply_free.
 */
int gpucdc_control_call(gpucdc_request *req, gpucd_timings *t, gpucdc_reply *out);
void gpucdc_reply_free(gpucdc_reply *r);

/*
 * Decodes msg (consumed), the reply to req, checks it and delivers its
 * outputs as gpucdc_control_call says; t (optional) gets the timings of a
 * call that began at start (gpucdc_now_us).
 */
int gpucdc_reply_finish(gpucdc_request *req, nng_msg *msg, uint64_t start, gpucd_timings *t,
                        gpucdc_reply *out);

/*
 * Checks a decoded reply against its request (id, status, outputs) and
 * copies host outputs to their tensors; exposed for the unit tests.
 */
int gpucdc_reply_accept(gpucdc_request *req, const gpucdc_reply *r);

/* ---- doorbells (doorbell.c) --------------------------------------------------------- */

/*
 * Whether req can end on a completion record: a compute operation of a
 * local client whose every output is written in place (a region or an
 * existing resident tensor).
 */
bool gpucdc_doorbell_wanted(const gpucd_client *c, const gpucdc_request *req);
/*
 * Names slot s's completion record in req, the current area being ready
 * (gpucdc_area_ready).  Returns the record (also in s->bell_rec), or NULL
 * when the slot has none (more slots than records).
 */
struct doorbell_record *gpucdc_doorbell_attach(gpucd_client *c, gpucdc_slot *s,
                                               gpucdc_request *req);
/*
 * Waits until record bell shows request id, then copies it into *rang and
 * returns 0: polls for the client's spin_us, then sleeps on the record
 * (doorbell_record.h), a nap at most and not past deadline (us; UINT64_MAX:
 * none).  Before each look and each sleep, stop(arg) may end the wait: its
 * nonzero value is returned.  Whoever changes what stop watches wakes the
 * record.
 */
int gpucdc_record_wait(const gpucd_client *c, struct doorbell_record *bell, uint64_t id,
                       uint64_t deadline, int (*stop)(void *arg), void *arg,
                       struct doorbell_record *rang);
/* The id of the client's area, 0 if it has none (hidden from regions_list). */
uint64_t gpucdc_doorbell_region_id(gpucd_client *c);

/* ---- the connection's area (area.c) -------------------------------------------------- */

/*
 * Whether the current connection has its area, making and registering it
 * (with its submission queue) when this connection has not tried yet.  A
 * failure, its message cleared, leaves calls on their replies until the next
 * connection.
 */
bool gpucdc_area_ready(gpucd_client *c);
/* Unmaps every area (the socket is closed: the daemon dropped them). */
void gpucdc_area_close(gpucd_client *c);

/* ---- submission queues (submit.c) ----------------------------------------------------- */

/* What a queued call keeps of the connection its queue was chosen on. */
typedef struct gpucdc_queue_pass {
    submit_area *area;
    submit_wake *wake;
    unsigned drops; /* the client's lost connections then */
} gpucdc_queue_pass;

/*
 * Whether a call on slot s whose request (len bytes) names the slot's record
 * can go through the queue: the queue of the current connection is open and
 * the request fits its buffer.  Fills *pass when it can.
 */
bool gpucdc_submit_can_take(const gpucdc_slot *s, size_t len, gpucdc_queue_pass *pass);

/*
 * Queues msg (consumed) for slot s, as gpucdc_submit_can_take allowed, and
 * waits for its record (polling spin_us, then asleep); releases the slot.
 * 0 with GPUCDC_ANSWER_RECORD (OK: *rang holds the record) or
 * GPUCDC_ANSWER_REPLY (a failure: *reply is its reply), or a negative code
 * (a timeout, a lost connection).
 */
int gpucdc_submit_exchange(gpucdc_slot *s, const gpucdc_queue_pass *pass, const char *op,
                           nng_msg *msg, uint64_t id, struct doorbell_record *rang,
                           nng_msg **reply, gpucdc_answer *answer);

/* nng thread: the connection dropped; wakes every call waiting on a record of the area. */
void gpucdc_submit_disconnected(gpucd_client *c);

/* ---- compute calls (compute_call.c) ------------------------------------------------------ */

/*
 * Calls req, a compute operation, as gpucdc_control_call does without a
 * reply kept: through the submission queue, or on the socket ending on its
 * completion record, or answered by its reply, whichever its outputs and the
 * connection allow.
 */
int gpucdc_compute_call(gpucdc_request *req, gpucd_timings *t);

/* ---- the pool (pool.c) ---------------------------------------------------------------- */

/* The client a gpucd_pool_run callback of this thread runs on, NULL outside one: what is asked
 * of it must be something any daemon of the pool may run, again. */
extern _Thread_local const gpucd_client *gpucdc_retrying;
/* For a request on gpucdc_retrying: 0 when tensor t (argument name) is GPUCD_HOST, else
 * GPUCD_EINVAL with a message. */
int gpucdc_retry_check_tensor(const gpucdc_request *req, const char *name, const gpucd_tensor *t);
/* Likewise for the operation: a compute operation, info, ping or stats. */
int gpucdc_retry_check_op(const gpucdc_request *req);
/* Likewise for what is not a request (op: a region). */
int gpucdc_retry_refuse(const char *op);

#endif /* GPUCDC_INTERNAL_H */
