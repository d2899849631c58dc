/*
 * gpucd.h - the client library of gpucd, the persistent GPU compute daemon.
 *
 * One connection (gpucd_client) talks to one daemon over nng (ipc://,
 * tls+tcp:// or tcp://).  Every operation is a blocking call with the connection's timeout;
 * any number of threads may call at once on the same client (each call uses
 * its own nng context, and no lock is held while waiting for a reply).
 *
 * Conventions (libuv style): functions return 0 or a negative GPUCD_E* code;
 * gpucd_strerror(code) names the code and gpucd_errmsg(client) gives the
 * calling thread's last error message (the daemon's own message when the
 * daemon refused the request; empty after a call to the daemon succeeds).
 * Every struct is caller-owned: the library keeps no pointer to it after the
 * call returns.
 *
 * Tensors: a gpucd_tensor is a dtype, a shape and where its bytes are:
 *   GPUCD_HOST          caller memory; input bytes travel in the request,
 *                       output bytes come back in the reply and are copied to
 *                       the caller's pointer (the only choice over tcp://
 *                       and tls+tcp://);
 *   GPUCD_REGION        a byte offset in a shared-memory region created with
 *                       gpucd_region_create (local daemons only; no copies);
 *   GPUCD_RESIDENT      a tensor that lives on the daemon's device across
 *                       requests, named by its id (weights, saved activations);
 *   GPUCD_NEW_RESIDENT  outputs only: the daemon creates a resident tensor and
 *                       the call stores its id in the tensor's `resident`
 *                       field (and sets `where` to GPUCD_RESIDENT); an
 *                       output whose size the daemon decides (the encoder's
 *                       saved activations) is passed with ndim 0 and gets
 *                       its dtype and shape from the reply.
 * An absent optional tensor is passed as NULL.
 */
#ifndef GPUCD_H
#define GPUCD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPUCD_EXPORT __attribute__((visibility("default")))
#else
#define GPUCD_EXPORT
#endif

#define GPUCD_VERSION_MAJOR 0
#define GPUCD_VERSION_MINOR 1
#define GPUCD_VERSION_PATCH 0
/* The wire protocol version this library speaks (gpucd.proto VERSION_CURRENT). */
#define GPUCD_PROTOCOL_VERSION 1

/* "0.1.0": the version of the library actually loaded. */
GPUCD_EXPORT const char *gpucd_version_string(void);

/* ---- errors ------------------------------------------------------------------ */

typedef enum gpucd_code {
    GPUCD_OK = 0,

    /* Detected by the client library itself. */
    GPUCD_EINVAL = -1,         /* an argument is invalid (NULL, bad dtype, shape, range...) */
    GPUCD_ENOMEM = -2,         /* out of memory in the client */
    GPUCD_ETIMEDOUT = -3,      /* no reply within the timeout */
    GPUCD_ECONNREFUSED = -4,   /* no daemon listens at the URL */
    GPUCD_ECLOSED = -5,        /* the connection was lost, or the client is closing */
    GPUCD_ESYSTEM = -6,        /* a system call failed (memfd_create, mmap...); see errmsg */
    GPUCD_EPROTO = -7,         /* the reply is malformed, or its id does not match */
    GPUCD_ETRANSPORT = -8,     /* another nng failure; see errmsg */
    GPUCD_EADDRESS = -9,       /* the URL is malformed or of an unsupported scheme */
    GPUCD_EUNTRUSTED = -10,    /* the daemon at an ipc:// URL runs as a uid not trusted
                                  (gpucd_options.trust_uid), or the default socket folder
                                  could be another user's; see errmsg */

    /* The daemon refused the request: -(GPUCD_EDAEMON_BASE + gpucd.v1.Status). */
    GPUCD_EDAEMON_BASE = 100,
    GPUCD_EBAD_MESSAGE = -101,        /* the daemon could not decode the request */
    GPUCD_EVERSION_MISMATCH = -102,   /* the daemon speaks another protocol version */
    GPUCD_EUNKNOWN_OPERATION = -103,  /* the daemon does not know the operation */
    GPUCD_EINVALID_ARGUMENT = -104,   /* shapes, dtypes, options or their combination */
    GPUCD_EOUT_OF_RANGE = -105,       /* a byte range or a data value out of range */
    GPUCD_ENOT_FOUND = -106,          /* unknown region or resident tensor */
    GPUCD_EPERMISSION_DENIED = -107,  /* region of another uid, or regions remotely */
    GPUCD_ERESOURCE_EXHAUSTED = -108, /* workspace, message size, in-flight, memory or a quota */
    GPUCD_EUNAVAILABLE = -109,        /* the daemon is draining or not ready */
    GPUCD_EDEVICE = -110,             /* the device failed while running the request */
    GPUCD_EINTERNAL = -111,           /* a daemon bug */
    GPUCD_EMESSAGE_TOO_LARGE = -112,  /* the reply would exceed the daemon's message limit */
} gpucd_code;

/* A short static description of a code ("timed out", "invalid argument (daemon)"). */
GPUCD_EXPORT const char *gpucd_strerror(int code);

/* ---- dtypes and tensors --------------------------------------------------------- */

typedef enum gpucd_dtype {
    GPUCD_DTYPE_INVALID = 0,
    GPUCD_F32 = 1,
    GPUCD_BF16 = 2,
    GPUCD_F16 = 3,
    GPUCD_U8 = 4,
    GPUCD_I32 = 5,
    GPUCD_I64 = 6,
} gpucd_dtype;

enum { GPUCD_MAX_DIMS = 8 };

/* Bytes per element, or 0 for an unknown dtype. */
GPUCD_EXPORT size_t gpucd_dtype_size(gpucd_dtype dt);
/* "f32", "bf16", ...; "invalid" for an unknown dtype. */
GPUCD_EXPORT const char *gpucd_dtype_name(gpucd_dtype dt);

typedef struct gpucd_region gpucd_region;

typedef enum gpucd_location {
    GPUCD_LOC_INVALID = 0, /* a zeroed struct is rejected, not guessed at */
    GPUCD_HOST = 1,
    GPUCD_REGION = 2,
    GPUCD_RESIDENT = 3,
    GPUCD_NEW_RESIDENT = 4,
} gpucd_location;

typedef struct gpucd_tensor {
    gpucd_dtype dtype;
    int ndim;                      /* 0..GPUCD_MAX_DIMS; 0 is a scalar */
    int64_t shape[GPUCD_MAX_DIMS]; /* each >= 0 */
    gpucd_location where;
    void *data;                    /* GPUCD_HOST: the caller's bytes (read for inputs) */
    gpucd_region *region;          /* GPUCD_REGION: the region ... */
    uint64_t offset;               /* ... and the byte offset of the tensor in it */
    uint64_t resident;             /* GPUCD_RESIDENT: the id; set by GPUCD_NEW_RESIDENT */
} gpucd_tensor;

/* Builders; each copies ndim entries of shape (ndim is clamped to 0..8 and
 * checked again at call time, so a bad ndim still fails with a clear message). */
GPUCD_EXPORT gpucd_tensor gpucd_tensor_host(void *data, gpucd_dtype dt, int ndim,
                                            const int64_t *shape);
GPUCD_EXPORT gpucd_tensor gpucd_tensor_region(gpucd_region *region, uint64_t offset,
                                              gpucd_dtype dt, int ndim, const int64_t *shape);
GPUCD_EXPORT gpucd_tensor gpucd_tensor_resident(uint64_t id, gpucd_dtype dt, int ndim,
                                                const int64_t *shape);
GPUCD_EXPORT gpucd_tensor gpucd_tensor_new_resident(gpucd_dtype dt, int ndim,
                                                    const int64_t *shape);

/* Element count / byte size, or -1 when ndim, a dimension or the dtype is
 * invalid or the product overflows int64. */
GPUCD_EXPORT int64_t gpucd_tensor_numel(const gpucd_tensor *t);
GPUCD_EXPORT int64_t gpucd_tensor_bytes(const gpucd_tensor *t);

/* ---- connection ------------------------------------------------------------------ */

typedef struct gpucd_client gpucd_client;

typedef struct gpucd_options {
    int timeout_ms;           /* per call; 0: the default 30000; < 0: wait forever */
    size_t max_reply_bytes;   /* largest reply accepted (0: unlimited); nng drops the
                                 connection on a larger one: that call fails with
                                 GPUCD_ECLOSED and the client reconnects */
    const char *client_name;  /* sent with gpucd_info; NULL: "libgpucd" */
    int spin_us;              /* a call polls for its end this long before it sleeps
                                 (0, the default: sleeps at once).  Over ipc://, a call
                                 whose outputs are all written in place (regions, existing
                                 resident tensors) waits on a completion record the daemon
                                 writes into shared memory (and wakes it from), not for the
                                 reply to cross the socket, and is itself queued in shared
                                 memory when the daemon allows (its submission queues: the
                                 socket is not used at all).  Polling saves the wake-up for
                                 up to that much of a core a call (it yields to other
                                 threads): for callers that have nothing else to do */
    /* tls+tcp:// only (ignored otherwise): PEM files; NULL takes the environment's
     * GPUCD_TLS_CA, GPUCD_TLS_CERT, GPUCD_TLS_KEY.  The daemon's certificate must be
     * signed by tls_ca (required) and name the URL's host; tls_cert and its unencrypted
     * tls_key are this client's own, which a daemon requiring client certificates (its
     * default) checks against its CA.  A refused handshake fails gpucd_connect with
     * GPUCD_ETRANSPORT, or GPUCD_ECLOSED when the daemon hangs up instead. */
    const char *tls_ca;
    const char *tls_cert;
    const char *tls_key;
    int trust_uid_set;        /* 1: the daemon at an ipc:// URL must run as trust_uid.  0 (the
                                 default): as the uid in $GPUCD_TRUST_UID when that is set,
                                 else as this process's own uid.  A connection to a daemon of
                                 another uid (a socket put there by another user) is closed
                                 before any request goes over it: gpucd_connect, and calls
                                 made while only such a daemon answers, fail with
                                 GPUCD_EUNTRUSTED.  tcp:// has no peer uid to check */
    unsigned trust_uid;
} gpucd_options;

/* Fills the defaults (30 s timeout, unlimited replies, no client name, no polling, the
 * daemon's uid checked against $GPUCD_TRUST_UID or this process's). */
GPUCD_EXPORT void gpucd_options_init(gpucd_options *opts);

/* The uid a daemon at an ipc:// URL must run as under opts (NULL: the defaults), as
 * gpucd_connect checks it: for a program that also dials the daemon by other means.
 * 0, or GPUCD_EINVAL when $GPUCD_TRUST_UID is no uid. */
GPUCD_EXPORT int gpucd_trusted_uid(const gpucd_options *opts, uint64_t *uid);

/*
 * Writes the daemon's default URL into buf: $GPUCD_URL when it is set and not empty (the
 * system service's clients set GPUCD_URL=ipc:///run/gpucd/gpucd.sock), else
 * ipc://$XDG_RUNTIME_DIR/gpucd.sock when XDG_RUNTIME_DIR is an absolute path, else
 * ipc:///tmp/gpucd-<uid>/gpucd.sock.  The daemon listens there when given no --listen.
 * Returns 0, or GPUCD_EINVAL when buf is NULL or too small (256 bytes always do
 * unless XDG_RUNTIME_DIR is very long).
 */
GPUCD_EXPORT int gpucd_default_url(char *buf, size_t len);

/*
 * Connects to the daemon at url (NULL: gpucd_default_url; ipc://, tls+tcp:// or tcp://,
 * and inproc:// for a server in the same process) and stores the client in *out.  opts may be NULL for the defaults.  Fails with
 * GPUCD_ECONNREFUSED when nothing listens at the URL, GPUCD_EUNTRUSTED when the daemon at an
 * ipc:// URL runs as a uid not trusted (gpucd_options.trust_uid) or the default URL's folder
 * could be another user's.  Should the connection
 * drop later, calls in flight fail with GPUCD_ECLOSED and the client
 * reconnects by itself; regions and resident tensors do not survive that
 * (make them again), the library's own completion records and submission
 * queue are made again by itself.
 */
GPUCD_EXPORT int gpucd_connect(const char *url, const gpucd_options *opts, gpucd_client **out);

/* Closes the connection and frees the client.  No other thread may still be
 * using it.  Regions must be destroyed first (gpucd_region_destroy): a region
 * left open keeps its mapping until the process exits.  NULL is a no-op. */
GPUCD_EXPORT void gpucd_close(gpucd_client *client);

/* The calling thread's last error message ("" when none).  Thread-local, so
 * valid until this thread's next gpucd call; client may be NULL. */
GPUCD_EXPORT const char *gpucd_errmsg(const gpucd_client *client);

/* ---- timings --------------------------------------------------------------------- */

/* Filled by every call that takes one (may be NULL); microseconds. */
typedef struct gpucd_timings {
    uint64_t queue_us;      /* waiting for a worker in the daemon */
    uint64_t copy_in_us;    /* inputs to the device */
    uint64_t compute_us;
    uint64_t copy_out_us;   /* outputs from the device */
    uint64_t batch_wait_us; /* waiting to be batched with other requests */
    uint64_t total_us;      /* receive to reply sent, as the daemon saw it */
    uint64_t round_trip_us; /* measured by the client: request built to reply decoded */
} gpucd_timings;

/* ---- control operations ---------------------------------------------------------- */

enum { GPUCD_INFO_MAX_OPS = 32, GPUCD_INFO_NAME_LEN = 48 };

/* What the daemon reports.  Strings are copied in, truncated to fit, NUL-terminated. */
typedef struct gpucd_info {
    uint32_t protocol_version;
    char server_version[32];
    char backend[16];            /* "cpu" or "cuda" */
    char device_name[128];
    uint32_t sm_count;
    uint64_t device_memory_bytes;
    uint64_t max_message_bytes;  /* limits */
    uint32_t max_inflight;
    uint64_t workspace_bytes;
    uint32_t max_dims;
    uint64_t max_region_bytes;
    int ready;                   /* 1 when the daemon accepts compute requests */
    uint64_t device_allocations; /* made since start; constant after warm-up */
    int operation_count;         /* entries of operations[]; the rest were dropped */
    char operations[GPUCD_INFO_MAX_OPS][GPUCD_INFO_NAME_LEN];
    char multi_gpu[64];          /* operations spanning GPUs: "not built", or "nccl X.Y.Z, no
                                    operations yet" ("" from an older daemon) */
} gpucd_info;

/* Hello: the daemon's identity, device and limits.  (Not named gpucd_info:
 * C gives a function and a typedef one namespace.) */
GPUCD_EXPORT int gpucd_info_get(gpucd_client *client, gpucd_info *out);
/* A no-op round trip; t (optional) receives the timings. */
GPUCD_EXPORT int gpucd_ping(gpucd_client *client, gpucd_timings *t);
/* The daemon's statistics as JSON, NUL-terminated, in *json; free() it. */
GPUCD_EXPORT int gpucd_stats_json(gpucd_client *client, char **json);

/* ---- shared-memory regions -------------------------------------------------------- */

/*
 * Creates a shared-memory region of size bytes (> 0), maps it read-write and
 * registers it with the daemon: a memfd sealed against resizing, passed over
 * the daemon's descriptor socket (the ipc:// path plus ".fd"), so it has no
 * name to leave behind if either process dies and nobody can shrink it.
 * Daemons reached over tcp:// or tls+tcp:// refuse with GPUCD_EPERMISSION_DENIED.
 */
GPUCD_EXPORT int gpucd_region_create(gpucd_client *client, size_t size, gpucd_region **out);
/* Unregisters the region (waiting for requests that use it) and unmaps it.
 * The region is freed even when unregistering fails; that failure is returned.
 * NULL is a no-op returning 0. */
GPUCD_EXPORT int gpucd_region_destroy(gpucd_region *region);
GPUCD_EXPORT void *gpucd_region_data(const gpucd_region *region); /* 64-byte aligned */
GPUCD_EXPORT size_t gpucd_region_size(const gpucd_region *region);
GPUCD_EXPORT uint64_t gpucd_region_id(const gpucd_region *region);

typedef struct gpucd_region_info {
    uint64_t id;
    char name[208];
    uint64_t size;
    uint32_t users; /* requests using it now */
} gpucd_region_info;

/* The regions this connection registered, in *list (free() it), *count entries. */
GPUCD_EXPORT int gpucd_regions_list(gpucd_client *client, gpucd_region_info **list,
                                    size_t *count);

/* ---- resident tensors ------------------------------------------------------------- */

/* Copies src (host, region or resident) into a new resident tensor; its id in *id. */
GPUCD_EXPORT int gpucd_tensor_put(gpucd_client *client, const gpucd_tensor *src, uint64_t *id);
/* Copies resident tensor id to dst (GPUCD_HOST or GPUCD_REGION, with the
 * tensor's dtype and shape). */
GPUCD_EXPORT int gpucd_tensor_get(gpucd_client *client, uint64_t id, gpucd_tensor *dst);
GPUCD_EXPORT int gpucd_tensor_free(gpucd_client *client, uint64_t id);

/* ---- compute operations ------------------------------------------------------------
 *
 * Inputs are `const gpucd_tensor *`, outputs `gpucd_tensor *`.  Shapes and
 * dtypes follow kernels/gk.h; the daemon checks them and names the problem.
 */

typedef enum gpucd_math {
    GPUCD_MATH_DEFAULT = 0, /* exact fp32 for f32 tensors; fp32 accumulation for bf16/f16 */
    GPUCD_MATH_TF32 = 1,    /* f32 tensors through tf32 tensor cores */
} gpucd_math;

typedef struct gpucd_conv2d_params {
    int stride_h, stride_w; /* >= 1 */
    int pad_h, pad_w;       /* >= 0 */
    int relu;               /* forward: y = relu(conv + b); backward: dy masked by y > 0 */
    gpucd_math math;
} gpucd_conv2d_params;

/* Stride 1, no padding, no relu, default math. */
GPUCD_EXPORT void gpucd_conv2d_params_init(gpucd_conv2d_params *p);

/* x (N, C, H, W), w (OC, C, KH, KW), b (OC) optional, y (N, OC, OH, OW); f32 or bf16. */
GPUCD_EXPORT int gpucd_conv2d_forward(gpucd_client *client, const gpucd_conv2d_params *p,
                                      const gpucd_tensor *x, const gpucd_tensor *w,
                                      const gpucd_tensor *b, gpucd_tensor *y, gpucd_timings *t);
/* y: the saved forward output (required with relu, else optional); dx and db
 * optional, dw required; dw/db are overwritten, not accumulated. */
GPUCD_EXPORT int gpucd_conv2d_backward(gpucd_client *client, const gpucd_conv2d_params *p,
                                       const gpucd_tensor *x, const gpucd_tensor *w,
                                       const gpucd_tensor *y, const gpucd_tensor *dy,
                                       gpucd_tensor *dx, gpucd_tensor *dw, gpucd_tensor *db,
                                       gpucd_timings *t);

enum { GPUCD_MULTIHOT_MAX_FEATURES = 64 };

/* byte = obs_offset + (h*width + w)*nfeat + f; feature f with value v < slots[f]
 * sets channel offsets[f] + v of out (B, channels, height, width). */
typedef struct gpucd_multihot_layout {
    int height, width;
    int nfeat; /* 1..GPUCD_MULTIHOT_MAX_FEATURES */
    int obs_offset;
    int channels;
    int slots[GPUCD_MULTIHOT_MAX_FEATURES];
    int offsets[GPUCD_MULTIHOT_MAX_FEATURES];
} gpucd_multihot_layout;

/* layout NULL: the NMMO3 preset (11x15, 10 features, 59 channels); obs u8 (B, L);
 * out (B, channels, H, W) f32 or bf16. */
GPUCD_EXPORT int gpucd_multihot_encode(gpucd_client *client, const gpucd_multihot_layout *layout,
                                       const gpucd_tensor *obs, gpucd_tensor *out,
                                       gpucd_timings *t);

/* idx u8|i32|i64 of shape S, table (V, D) f32|bf16, out (S..., D) of the table's dtype. */
GPUCD_EXPORT int gpucd_embedding_forward(gpucd_client *client, const gpucd_tensor *idx,
                                         const gpucd_tensor *table, gpucd_tensor *out,
                                         gpucd_timings *t);
/* dout (S..., D) f32|bf16; dtable (V, D) f32, overwritten with the sum of rows. */
GPUCD_EXPORT int gpucd_embedding_backward(gpucd_client *client, const gpucd_tensor *idx,
                                          const gpucd_tensor *dout, gpucd_tensor *dtable,
                                          gpucd_timings *t);
/*
 * Bags of rows summed, forward only: idx i32 (B, K), K ids a row, -1 for
 * padding (adds nothing); table (V, D) f32|bf16; out (B, D) f32, row b the sum
 * of table[idx[b, k]] over k.  An id that is neither -1 nor in [0, V) fails
 * the call with GPUCD_EOUT_OF_RANGE naming the first one.
 */
GPUCD_EXPORT int gpucd_embedding_bag(gpucd_client *client, const gpucd_tensor *idx,
                                     const gpucd_tensor *table, gpucd_tensor *out,
                                     gpucd_timings *t);

typedef enum gpucd_reduction {
    GPUCD_REDUCE_MEAN = 0,
    GPUCD_REDUCE_SUM = 1,
    GPUCD_REDUCE_NONE = 2,
} gpucd_reduction;

typedef struct gpucd_lce_params {
    int64_t ignore_index;      /* rows whose target equals it contribute nothing */
    float softcap;             /* > 0: logits z = softcap * tanh(z / softcap); 0: off */
    gpucd_reduction reduction;
    int shift;                 /* row i is scored against target i + 1 */
    int filter_auto;           /* eps = 2^-12 for bf16/f16 inputs, off for f32 */
    float filter_eps;          /* when !filter_auto: > 0 drops tiny gradient terms; 0: off */
    gpucd_math math;
    float grad_scale;          /* gradients of grad_scale * loss; finite and non-zero */
} gpucd_lce_params;

/* ignore_index -100, no softcap, mean, no shift, filtering off, default math, grad_scale 1. */
GPUCD_EXPORT void gpucd_lce_params_init(gpucd_lce_params *p);

/*
 * Fused linear cross entropy: E (N, D), C (V, D), bias (V) optional, targets (N) i32|i64.
 * loss f32: (N) for GPUCD_REDUCE_NONE else a scalar (ndim 0); lse (N) f32 optional;
 * dE, dC, dbias optional gradients (any subset), f32 or the input dtype.
 * p NULL: the defaults of gpucd_lce_params_init.
 */
GPUCD_EXPORT int gpucd_linear_cross_entropy(gpucd_client *client, const gpucd_lce_params *p,
                                            const gpucd_tensor *E, const gpucd_tensor *C,
                                            const gpucd_tensor *bias, const gpucd_tensor *targets,
                                            gpucd_tensor *loss, gpucd_tensor *lse,
                                            gpucd_tensor *dE, gpucd_tensor *dC,
                                            gpucd_tensor *dbias, gpucd_timings *t);

/*
 * NMMO3 encoder weights, all of one dtype f32|bf16: conv1_w (128, 59, 5, 5),
 * conv1_b (128), conv2_w (128, 128, 3, 3), conv2_b (128), embed (128, 32),
 * proj_w (hidden, 1817) and proj_b (hidden) optional (both or neither).
 * As gradients (gpucd_nmmo3_encode_backward) the same shapes in f32, each an output.
 */
typedef struct gpucd_nmmo3_weights {
    gpucd_tensor *conv1_w, *conv1_b, *conv2_w, *conv2_b, *embed, *proj_w, *proj_b;
} gpucd_nmmo3_weights;

enum {
    GPUCD_NMMO3_OBS_BYTES = 1707,
    GPUCD_NMMO3_FEATURES = 1817,
};

/* obs u8 (B, 1707); features (B, 1817) and/or hidden (B, hidden, needs proj_w). */
GPUCD_EXPORT int gpucd_nmmo3_encode(gpucd_client *client, const gpucd_nmmo3_weights *w,
                                    const gpucd_tensor *obs, gpucd_tensor *features,
                                    gpucd_tensor *hidden, gpucd_timings *t);
/* dout: d(hidden) with a projection, else d(features); grads: where each
 * weight's gradient goes (proj_* only with a projection). */
GPUCD_EXPORT int gpucd_nmmo3_encode_backward(gpucd_client *client, const gpucd_nmmo3_weights *w,
                                             const gpucd_tensor *obs, const gpucd_tensor *dout,
                                             const gpucd_nmmo3_weights *grads, gpucd_timings *t);

/*
 * A training step without the backward's recompute: the forward of
 * gpucd_nmmo3_encode that also keeps the activations the backward needs in
 * saved, on the daemon's device, and the backward that reads them.  saved is
 * a resident tensor (u8, one row per agent, sized by the daemon): pass
 * gpucd_tensor_new_resident(GPUCD_U8, 0, NULL) to create one (the call fills
 * in its id and shape), or a tensor made so before, for the same batch size
 * and weight shapes, to overwrite it.  The backward must get the same
 * weights and obs as the forward that wrote saved; it still validates obs.
 * Free saved with gpucd_tensor_free.
 */
GPUCD_EXPORT int gpucd_nmmo3_encode_save(gpucd_client *client, const gpucd_nmmo3_weights *w,
                                         const gpucd_tensor *obs, gpucd_tensor *features,
                                         gpucd_tensor *hidden, gpucd_tensor *saved,
                                         gpucd_timings *t);
GPUCD_EXPORT int gpucd_nmmo3_encode_backward_saved(gpucd_client *client,
                                                   const gpucd_nmmo3_weights *w,
                                                   const gpucd_tensor *obs,
                                                   const gpucd_tensor *saved,
                                                   const gpucd_tensor *dout,
                                                   const gpucd_nmmo3_weights *grads,
                                                   gpucd_timings *t);

/* ---- a pool of daemons -------------------------------------------------------------
 *
 * A gpucd_pool holds one gpucd_client per daemon URL (ipc://, tcp://, tls+tcp://, the
 * same options for each) and spreads calls over the daemons that are up, to the one with
 * the fewest calls in flight.  A daemon whose call fails for want of an answer (the codes
 * of gpucd_pool_daemon_down), or whose client has lost its connection, is marked down and
 * skipped; the pool's own thread probes it again (its client connected again, and
 * gpucd_info_get saying ready on a second client kept for probes), first at once, then after
 * probe_min_ms, the wait doubling to probe_max_ms.  A call that chose a daemon just as its
 * connection dropped waits for the connection to come back, or fails at its timeout.
 *
 * Two ways to call:
 *   gpucd_pool_run(pool, fn, arg)   runs fn(client, arg) on the least busy daemon, and
 *       again on another one (each daemon once) when the one it ran on was down.  Only a
 *       stateless call is safe to run twice, on any daemon: every tensor fn names on that
 *       client must be GPUCD_HOST, and fn may make compute calls, gpucd_info_get,
 *       gpucd_ping and gpucd_stats_json alone.  Regions, resident tensors (new or
 *       existing) and gpucd_tensor_put/get/free belong to one daemon: the library refuses
 *       them inside fn (GPUCD_EINVAL, before any request).  A timed-out call is not run
 *       again (its time is spent), nor is one the daemon answered with an error of the
 *       request's own (an invalid argument is invalid everywhere).
 *   gpucd_pool_acquire / gpucd_pool_release   the least busy daemon's client for calls
 *       of any kind (regions, resident tensors), which the caller retries or not; the
 *       outcome given back marks the daemon down when it is one of those codes.
 */

typedef struct gpucd_pool gpucd_pool;

enum { GPUCD_POOL_MAX_DAEMONS = 1024 };

typedef struct gpucd_pool_options {
    gpucd_options client; /* each daemon's connection (gpucd_options_init's defaults) */
    int probe_min_ms;     /* a down daemon's first probe after this; 0: 100 */
    int probe_max_ms;     /* the wait between probes doubles up to this; 0: 5000 */
    int probe_timeout_ms; /* a probe's connection and info call; 0: 2000 */
} gpucd_pool_options;

/* Fills the defaults above, and gpucd_options_init's for the client. */
GPUCD_EXPORT void gpucd_pool_options_init(gpucd_pool_options *opts);

/*
 * Connects to the count daemons of urls (1..GPUCD_POOL_MAX_DAEMONS; NULL opts: the
 * defaults) and starts the pool's probing thread.  A daemon that cannot be reached now is
 * down until a probe finds it; gpucd_pool_open fails only when none could be reached (with
 * the first daemon's error), a URL is malformed (GPUCD_EADDRESS) or an argument is invalid.
 */
GPUCD_EXPORT int gpucd_pool_open(const char *const *urls, int count,
                                 const gpucd_pool_options *opts, gpucd_pool **out);
/* Stops the thread and closes every connection.  No other thread may still be using the pool
 * or a client it lent.  NULL is a no-op. */
GPUCD_EXPORT void gpucd_pool_close(gpucd_pool *pool);

/* 1 when code means the daemon gave no usable answer (GPUCD_ECONNREFUSED, GPUCD_ECLOSED,
 * GPUCD_ETIMEDOUT, GPUCD_ETRANSPORT, GPUCD_EUNTRUSTED, GPUCD_EUNAVAILABLE: draining or not
 * ready, GPUCD_EDEVICE: its device failed), so the pool marks it down; else 0. */
GPUCD_EXPORT int gpucd_pool_daemon_down(int code);

typedef int (*gpucd_pool_fn)(gpucd_client *client, void *arg);

/*
 * Runs fn(client, arg) on the daemon that is up with the fewest calls in flight; when fn
 * returns a code of gpucd_pool_daemon_down but GPUCD_ETIMEDOUT, marks that daemon down and
 * runs fn again on another one that is up and not tried yet.  Returns fn's result (0 once
 * one run succeeds), or GPUCD_ECONNREFUSED when no daemon was up to try.  fn must leave its
 * outputs as a fresh run would (it may run more than once); what it may call: above.
 */
GPUCD_EXPORT int gpucd_pool_run(gpucd_pool *pool, gpucd_pool_fn fn, void *arg);

/* What gpucd_pool_acquire lends; caller-owned. */
typedef struct gpucd_pool_lease {
    gpucd_client *client; /* valid until gpucd_pool_close */
    int daemon;           /* its index in the pool's URLs */
} gpucd_pool_lease;

/* The client of the daemon that is up with the fewest calls in flight, counted in flight until
 * gpucd_pool_release.  GPUCD_ECONNREFUSED when none is up. */
GPUCD_EXPORT int gpucd_pool_acquire(gpucd_pool *pool, gpucd_pool_lease *lease);
/* Ends a lease with the outcome of the calls made on it (0, or the code of the failure that
 * ended them): a code of gpucd_pool_daemon_down marks the daemon down. */
GPUCD_EXPORT void gpucd_pool_release(gpucd_pool *pool, const gpucd_pool_lease *lease,
                                     int outcome);

/* One daemon as the pool sees it. */
typedef struct gpucd_pool_daemon {
    char url[256];       /* truncated to fit */
    int up;              /* 1: calls go to it; 0: skipped until a probe finds it ready */
    int last_error;      /* the code that marked it down last; 0: never down */
    uint64_t calls;      /* runs of gpucd_pool_run and leases started on it */
    uint64_t failures;   /* of those, the ones that ended with a code other than 0 */
    uint64_t retries;    /* of those, the runs gpucd_pool_run moved to another daemon */
    uint64_t downs;      /* times it was marked down */
    uint64_t in_flight;  /* runs and leases on it now */
    int connected;       /* 1 while the pool's client has a connection to it (nng redials) */
} gpucd_pool_daemon;

/* The number of daemons in the pool (the count given to gpucd_pool_open). */
GPUCD_EXPORT int gpucd_pool_size(const gpucd_pool *pool);
/* Daemon i's state and counts (i in 0..gpucd_pool_size-1); 0 or GPUCD_EINVAL. */
GPUCD_EXPORT int gpucd_pool_stats(gpucd_pool *pool, int i, gpucd_pool_daemon *out);

#ifdef __cplusplus
}
#endif

#endif /* GPUCD_H */
