"""The C library through cffi's ABI mode: the declarations of gpucd.h the package uses.

ABI mode needs no compiler and no compiled extension: cffi (Debian's python3-cffi) reads these
declarations at import and calls libgpucd.so through libffi, releasing the GIL for the length of
every call, so threads of one process call the daemon at once.  The struct layouts below must
match client/gpucd.h; test_layout checks them against the library's own builders.
"""
import os

from cffi import FFI

ffi = FFI()
ffi.cdef(
    """
    const char *gpucd_version_string(void);
    const char *gpucd_strerror(int code);

    typedef enum gpucd_dtype {
        GPUCD_DTYPE_INVALID = 0, GPUCD_F32 = 1, GPUCD_BF16 = 2, GPUCD_F16 = 3,
        GPUCD_U8 = 4, GPUCD_I32 = 5, GPUCD_I64 = 6
    } gpucd_dtype;
    size_t gpucd_dtype_size(gpucd_dtype dt);

    typedef struct gpucd_region gpucd_region;
    typedef enum gpucd_location {
        GPUCD_LOC_INVALID = 0, GPUCD_HOST = 1, GPUCD_REGION = 2, GPUCD_RESIDENT = 3,
        GPUCD_NEW_RESIDENT = 4
    } gpucd_location;
    typedef struct gpucd_tensor {
        gpucd_dtype dtype;
        int ndim;
        int64_t shape[8];
        gpucd_location where;
        void *data;
        gpucd_region *region;
        uint64_t offset;
        uint64_t resident;
    } gpucd_tensor;
    gpucd_tensor gpucd_tensor_region(gpucd_region *region, uint64_t offset, gpucd_dtype dt,
                                     int ndim, const int64_t *shape);

    typedef struct gpucd_client gpucd_client;
    typedef struct gpucd_options {
        int timeout_ms;
        size_t max_reply_bytes;
        const char *client_name;
        int spin_us;
        const char *tls_ca;
        const char *tls_cert;
        const char *tls_key;
        int trust_uid_set;
        unsigned trust_uid;
    } gpucd_options;
    void gpucd_options_init(gpucd_options *opts);
    int gpucd_default_url(char *buf, size_t len);
    int gpucd_connect(const char *url, const gpucd_options *opts, gpucd_client **out);
    void gpucd_close(gpucd_client *client);
    const char *gpucd_errmsg(const gpucd_client *client);

    typedef struct gpucd_timings {
        uint64_t queue_us, copy_in_us, compute_us, copy_out_us, batch_wait_us, total_us,
                 round_trip_us;
    } gpucd_timings;

    typedef struct gpucd_info {
        uint32_t protocol_version;
        char server_version[32];
        char backend[16];
        char device_name[128];
        uint32_t sm_count;
        uint64_t device_memory_bytes;
        uint64_t max_message_bytes;
        uint32_t max_inflight;
        uint64_t workspace_bytes;
        uint32_t max_dims;
        uint64_t max_region_bytes;
        int ready;
        uint64_t device_allocations;
        int operation_count;
        char operations[32][48];
        char multi_gpu[64];
    } gpucd_info;
    int gpucd_info_get(gpucd_client *client, gpucd_info *out);
    int gpucd_ping(gpucd_client *client, gpucd_timings *t);
    int gpucd_stats_json(gpucd_client *client, char **json);
    void free(void *p);

    int gpucd_region_create(gpucd_client *client, size_t size, gpucd_region **out);
    int gpucd_region_destroy(gpucd_region *region);
    void *gpucd_region_data(const gpucd_region *region);
    size_t gpucd_region_size(const gpucd_region *region);
    uint64_t gpucd_region_id(const gpucd_region *region);
    typedef struct gpucd_region_info {
        uint64_t id;
        char name[208];
        uint64_t size;
        uint32_t users;
    } gpucd_region_info;
    int gpucd_regions_list(gpucd_client *client, gpucd_region_info **list, size_t *count);

    int gpucd_tensor_put(gpucd_client *client, const gpucd_tensor *src, uint64_t *id);
    int gpucd_tensor_get(gpucd_client *client, uint64_t id, gpucd_tensor *dst);
    int gpucd_tensor_free(gpucd_client *client, uint64_t id);

    typedef enum gpucd_math { GPUCD_MATH_DEFAULT = 0, GPUCD_MATH_TF32 = 1 } gpucd_math;
    typedef struct gpucd_conv2d_params {
        int stride_h, stride_w;
        int pad_h, pad_w;
        int relu;
        gpucd_math math;
    } gpucd_conv2d_params;
    int gpucd_conv2d_forward(gpucd_client *client, const gpucd_conv2d_params *p,
                             const gpucd_tensor *x, const gpucd_tensor *w, const gpucd_tensor *b,
                             gpucd_tensor *y, gpucd_timings *t);
    int gpucd_conv2d_backward(gpucd_client *client, const gpucd_conv2d_params *p,
                              const gpucd_tensor *x, const gpucd_tensor *w, const gpucd_tensor *y,
                              const gpucd_tensor *dy, gpucd_tensor *dx, gpucd_tensor *dw,
                              gpucd_tensor *db, gpucd_timings *t);

    typedef struct gpucd_multihot_layout {
        int height, width;
        int nfeat;
        int obs_offset;
        int channels;
        int slots[64];
        int offsets[64];
    } gpucd_multihot_layout;
    int gpucd_multihot_encode(gpucd_client *client, const gpucd_multihot_layout *layout,
                              const gpucd_tensor *obs, gpucd_tensor *out, gpucd_timings *t);

    int gpucd_embedding_forward(gpucd_client *client, const gpucd_tensor *idx,
                                const gpucd_tensor *table, gpucd_tensor *out, gpucd_timings *t);
    int gpucd_embedding_backward(gpucd_client *client, const gpucd_tensor *idx,
                                 const gpucd_tensor *dout, gpucd_tensor *dtable,
                                 gpucd_timings *t);
    int gpucd_embedding_bag(gpucd_client *client, const gpucd_tensor *idx,
                            const gpucd_tensor *table, gpucd_tensor *out, gpucd_timings *t);

    typedef enum gpucd_reduction {
        GPUCD_REDUCE_MEAN = 0, GPUCD_REDUCE_SUM = 1, GPUCD_REDUCE_NONE = 2
    } gpucd_reduction;
    typedef struct gpucd_lce_params {
        int64_t ignore_index;
        float softcap;
        gpucd_reduction reduction;
        int shift;
        int filter_auto;
        float filter_eps;
        gpucd_math math;
        float grad_scale;
    } gpucd_lce_params;
    void gpucd_lce_params_init(gpucd_lce_params *p);
    int gpucd_linear_cross_entropy(gpucd_client *client, const gpucd_lce_params *p,
                                   const gpucd_tensor *E, const gpucd_tensor *C,
                                   const gpucd_tensor *bias, const gpucd_tensor *targets,
                                   gpucd_tensor *loss, gpucd_tensor *lse, gpucd_tensor *dE,
                                   gpucd_tensor *dC, gpucd_tensor *dbias, gpucd_timings *t);

    typedef struct gpucd_nmmo3_weights {
        gpucd_tensor *conv1_w, *conv1_b, *conv2_w, *conv2_b, *embed, *proj_w, *proj_b;
    } gpucd_nmmo3_weights;
    int gpucd_nmmo3_encode(gpucd_client *client, const gpucd_nmmo3_weights *w,
                           const gpucd_tensor *obs, gpucd_tensor *features, gpucd_tensor *hidden,
                           gpucd_timings *t);
    int gpucd_nmmo3_encode_backward(gpucd_client *client, const gpucd_nmmo3_weights *w,
                                    const gpucd_tensor *obs, const gpucd_tensor *dout,
                                    const gpucd_nmmo3_weights *grads, gpucd_timings *t);
    int gpucd_nmmo3_encode_save(gpucd_client *client, const gpucd_nmmo3_weights *w,
                                const gpucd_tensor *obs, gpucd_tensor *features,
                                gpucd_tensor *hidden, gpucd_tensor *saved, gpucd_timings *t);
    int gpucd_nmmo3_encode_backward_saved(gpucd_client *client, const gpucd_nmmo3_weights *w,
                                          const gpucd_tensor *obs, const gpucd_tensor *saved,
                                          const gpucd_tensor *dout,
                                          const gpucd_nmmo3_weights *grads, gpucd_timings *t);

    typedef struct gpucd_pool gpucd_pool;
    typedef struct gpucd_pool_options {
        gpucd_options client;
        int probe_min_ms;
        int probe_max_ms;
        int probe_timeout_ms;
    } gpucd_pool_options;
    void gpucd_pool_options_init(gpucd_pool_options *opts);
    int gpucd_pool_open(const char *const *urls, int count, const gpucd_pool_options *opts,
                        gpucd_pool **out);
    void gpucd_pool_close(gpucd_pool *pool);
    typedef int (*gpucd_pool_fn)(gpucd_client *client, void *arg);
    int gpucd_pool_run(gpucd_pool *pool, gpucd_pool_fn fn, void *arg);
    typedef struct gpucd_pool_daemon {
        char url[256];
        int up;
        int last_error;
        uint64_t calls, failures, retries, downs, in_flight;
        int connected;
    } gpucd_pool_daemon;
    int gpucd_pool_size(const gpucd_pool *pool);
    int gpucd_pool_stats(gpucd_pool *pool, int i, gpucd_pool_daemon *out);
    """
)


def _library_path():
    """$GPUCD_LIBRARY, else the library `cmake --install` put beside this package, else the
    system's search path (ldconfig, LD_LIBRARY_PATH)."""
    path = os.environ.get("GPUCD_LIBRARY")
    if path:
        return path
    try:
        from ._libpath import RELATIVE  # written by cmake --install
    except ImportError:
        return "libgpucd.so.0"
    return os.path.normpath(os.path.join(os.path.dirname(__file__), RELATIVE))


# RTLD_NODELETE: cffi closes the library when its `lib` object goes at interpreter exit, and
# unmapping it under nng's threads, which live until the process ends, crashed the process.
lib = ffi.dlopen(_library_path(), ffi.RTLD_NOW | ffi.RTLD_NODELETE)

# Resolve every declaration now: cffi otherwise builds each on first use under a lock that is
# not re-entrant, and a finalizer that runs during that build (a region unmapped by the garbage
# collector) would wait for it for ever.  A library without one of them also fails here, at import.
for _name in dir(lib):
    getattr(lib, _name)
