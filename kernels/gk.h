/*
 * gk.h - the compute kernels' interface, shared by every backend.
 *
 * A kernel call takes tensors whose bytes the caller already placed where the
 * backend can reach them (host memory for the CPU backend, device memory for
 * the CUDA backend).  Shapes are validated once, by the gk_*_check functions
 * in check.c, before any backend runs; backends may assume checked shapes.
 * Data values (observation bytes, embedding indices, targets) can only be
 * checked while computing, so every kernel validates those itself and fails
 * with GK_ERANGE and a message naming the offending element.
 *
 * Conventions: 0 or a negative gk_code; on failure err->msg says why.
 */
#ifndef GK_H
#define GK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gk_code {
    GK_OK = 0,
    GK_EINVAL = -1,  /* shape, option or argument combination invalid */
    GK_EDTYPE = -2,  /* dtype or dtype combination not supported */
    GK_ERANGE = -3,  /* a data value (observation, index, target) out of range */
    GK_ENOMEM = -4,  /* scratch memory or workspace exhausted */
    GK_EDEVICE = -5, /* the device failed */
} gk_code;

const char *gk_strerror(int code);

typedef struct gk_err {
    char msg[256];
} gk_err;

/* Formats err->msg (printf style) and returns code, for `return gk_fail(...)`. */
int gk_fail(gk_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

typedef enum gk_dtype {
    GK_DTYPE_INVALID = 0,
    GK_F32 = 1,
    GK_BF16 = 2,
    GK_F16 = 3,
    GK_U8 = 4,
    GK_I32 = 5,
    GK_I64 = 6,
} gk_dtype;

size_t gk_dtype_size(gk_dtype dt); /* 0 for an unknown dtype */
const char *gk_dtype_name(gk_dtype dt);

enum { GK_MAX_DIMS = 8 };

/* A view of caller-owned bytes; data may be NULL for an absent optional tensor. */
typedef struct gk_tensor {
    void *data;
    gk_dtype dtype;
    int ndim;
    int64_t shape[GK_MAX_DIMS];
} gk_tensor;

/* Element count, or -1 if a dimension is negative or the product overflows int64. */
int64_t gk_tensor_numel(const gk_tensor *t);
/* Byte size, or -1 as above. */
int64_t gk_tensor_bytes(const gk_tensor *t);
/* Builds a tensor view; the shape is copied. */
gk_tensor gk_tensor_make(void *data, gk_dtype dt, int ndim, const int64_t *shape);
static inline int gk_tensor_present(const gk_tensor *t) { return t != NULL && t->data != NULL; }

/* ---- 2-D convolution, NCHW, weights (OC, IC, KH, KW) ---------------------- */

typedef struct gk_conv2d {
    int stride_h, stride_w;
    int pad_h, pad_w;
    int relu; /* forward: y = relu(conv + b); backward: dy masked by y > 0 */
    int tf32; /* f32 tensors only: tensor-core tf32 math allowed */
} gk_conv2d;

/*
 * Forward: x (N, C, H, W), w (OC, C, KH, KW), b (OC) optional,
 * y (N, OC, OH, OW) with OH = (H + 2*pad_h - KH) / stride_h + 1.
 * All of one dtype: f32 or bf16 (fp32 accumulation).
 */
int gk_conv2d_forward_check(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                            const gk_tensor *b, const gk_tensor *y, gk_err *err);
/*
 * Backward: dy (N, OC, OH, OW); y is the saved forward output, required when
 * p->relu; dx optional (same shape as x), dw required, db optional.
 * x, w, y, dy, dx, dw, db of one dtype; dw/db are overwritten, not accumulated.
 */
int gk_conv2d_backward_check(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                             const gk_tensor *y, const gk_tensor *dy, const gk_tensor *dx,
                             const gk_tensor *dw, const gk_tensor *db, gk_err *err);

/* ---- multihot encoding of categorical observations ------------------------ */

enum { GK_MULTIHOT_MAX_FEATURES = 64 };

/*
 * Observation bytes hold a height x width map, tile-major, nfeat bytes a tile,
 * starting at byte obs_offset: byte = obs_offset + (h*width + w)*nfeat + f.
 * Feature f with value v sets channel offsets[f] + v, for v < slots[f].
 */
typedef struct gk_multihot_layout {
    int height, width;
    int nfeat;
    int obs_offset;
    int channels;
    int slots[GK_MULTIHOT_MAX_FEATURES];
    int offsets[GK_MULTIHOT_MAX_FEATURES];
} gk_multihot_layout;

extern const gk_multihot_layout gk_nmmo3_layout; /* 11x15, 10 features, 59 channels */

/* Checks the layout itself: positive sizes, slots > 0, channels in range, no overlap. */
int gk_multihot_layout_check(const gk_multihot_layout *l, gk_err *err);
/* obs u8 (B, L) with L >= obs_offset + H*W*nfeat; out (B, channels, H, W) f32 or bf16. */
int gk_multihot_check(const gk_multihot_layout *l, const gk_tensor *obs, const gk_tensor *out,
                      gk_err *err);

/* ---- embedding ------------------------------------------------------------- */

/* idx u8|i32|i64 of any shape S; table (V, D) f32|bf16; out (S..., D) of the table's dtype. */
int gk_embedding_forward_check(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                               gk_err *err);
/* dout (S..., D) f32|bf16; dtable (V, D) f32, overwritten: the fp32 sum of the rows. */
int gk_embedding_backward_check(const gk_tensor *idx, const gk_tensor *dout,
                                const gk_tensor *dtable, gk_err *err);
/*
 * Bags of rows summed (embedding_bag): idx i32 (B, K), K ids a row of which -1
 * is padding; table (V, D) f32|bf16; out (B, D) f32, row b the sum in f32 of
 * table[idx[b, k]] over k in order, padding left out.  Forward only.
 */
int gk_embedding_bag_check(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                           gk_err *err);
/*
 * The error of a bag id out of range: GK_ERANGE naming position pos of idx
 * (checked by gk_embedding_bag_check), its coordinates and value against the
 * table's vocab rows.  The CPU and
 * CUDA kernels name the first offender with it, in the same words.
 */
int gk_embedding_bag_index_fail(const gk_tensor *idx, int64_t pos, int64_t value, int64_t vocab,
                                gk_err *err);

/* ---- fused linear cross entropy ------------------------------------------- */

typedef enum gk_reduction { GK_REDUCE_MEAN = 0, GK_REDUCE_SUM = 1, GK_REDUCE_NONE = 2 } gk_reduction;

typedef struct gk_lce {
    int64_t ignore_index; /* rows whose target equals it contribute nothing (default -100) */
    float softcap;        /* > 0: logits z = softcap * tanh(z / softcap) */
    gk_reduction reduction;
    int shift;            /* row i is scored against target i + 1; the last row is ignored */
    float filter_eps;     /* > 0: drop gradient terms with |softmax - onehot| < eps; 0: off */
    int tf32;             /* f32 inputs only: tf32 math allowed */
    float grad_scale;     /* gradients are of grad_scale * (reduced loss) */
} gk_lce;

/* Fills the defaults: ignore_index -100, mean, no softcap, no shift, filtering off, scale 1. */
void gk_lce_defaults(gk_lce *p);

/*
 * E (N, D) and C (V, D) of one dtype f32|bf16|f16; bias (V) optional, same dtype;
 * targets (N) i32|i64, each in [0, V) or ignore_index.
 * Outputs: loss f32, shape (N) for GK_REDUCE_NONE else a scalar (ndim 0);
 * lse (N) f32 optional (ignored rows get their true LSE all the same);
 * dE (N, D), dC (V, D), dbias (V) optional, each f32 or the input dtype
 * (accumulated in fp32 either way).  Mean divides by the count of non-ignored
 * rows (a loss of 0 and zero gradients when there are none).
 * loss is required, dbias needs bias, shift and tf32 are 0 or 1, and no output
 * may share bytes with another tensor.  Kernels check every element of
 * targets (targets[0] too under shift) before writing any output.
 */
int gk_lce_check(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
                 const gk_tensor *targets, const gk_tensor *loss, const gk_tensor *lse,
                 const gk_tensor *dE, const gk_tensor *dC, const gk_tensor *dbias, gk_err *err);

/* ---- NMMO3 observation encoder -------------------------------------------- */

enum {
    GK_NMMO3_OBS_BYTES = 1707,
    GK_NMMO3_PLAYER_OFFSET = 1650,
    GK_NMMO3_PLAYER_COUNT = 47,
    GK_NMMO3_REWARD_OFFSET = 1697,
    GK_NMMO3_REWARD_COUNT = 10,
    GK_NMMO3_EMBED_VOCAB = 128,
    GK_NMMO3_EMBED_DIM = 32,
    GK_NMMO3_CONV_CH = 128,
    GK_NMMO3_FEATURES = 1817, /* 256 conv2 + 1504 embedding + 47 player + 10 reward */
};

/*
 * Weights, all of one dtype f32|bf16, features and hidden of the same dtype:
 * conv1_w (128, 59, 5, 5), conv1_b (128), conv2_w (128, 128, 3, 3), conv2_b (128),
 * embed (128, 32), and optionally proj_w (hidden, 1817) and proj_b (hidden).
 * In the backward, the gradients have the weights' shapes, in f32.
 */
typedef struct gk_nmmo3_weights {
    gk_tensor conv1_w, conv1_b, conv2_w, conv2_b, embed, proj_w, proj_b;
} gk_nmmo3_weights;

/*
 * Forward: obs u8 (B, 1707); features (B, 1817) required unless hidden is given;
 * hidden (B, hidden) required when proj_w is present.
 */
int gk_nmmo3_forward_check(const gk_nmmo3_weights *w, const gk_tensor *obs,
                           const gk_tensor *features, const gk_tensor *hidden, gk_err *err);
/*
 * Backward: dout is d(hidden) when proj_w is present, else d(features);
 * grads receives every weight's gradient (proj_* only with a projection).
 */
int gk_nmmo3_backward_check(const gk_nmmo3_weights *w, const gk_tensor *obs,
                            const gk_tensor *dout, const gk_nmmo3_weights *grads, gk_err *err);

/*
 * Saved activations: what a forward keeps so that its backward need not
 * recompute them (resident between the two calls).  One row of bytes an
 * agent, row b belonging to obs row b (so a range of rows can be split off
 * with its observations); its contents are the backend's own, and a backend
 * accepts what it wrote itself.  Both backends lay a row out alike, in the
 * weights' dtype: [features, 1817 padded to 1824 (with a projection only) |
 * conv1's output after its ReLU (128, 3, 4) | with a projection, its ReLU
 * mask: bit h%8 of byte h/8 set where hidden h is positive, padded to 16].
 * The bytes are hostile like any input: nothing is addressed through them.
 */
/* Bytes one row of saved activations takes (a multiple of 16); 0 if w is not checkable. */
size_t gk_nmmo3_saved_row_bytes(const gk_nmmo3_weights *w);
/* saved given at all (the saved calls' first check: NULL would mean the stateless path). */
int gk_nmmo3_saved_require(const gk_tensor *saved, gk_err *err);
/* saved: u8 (B, gk_nmmo3_saved_row_bytes(w)), B = obs's rows; w and obs as the forward's. */
int gk_nmmo3_saved_check(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *saved,
                         gk_err *err);
/* The forward's check, saved's, and saved (written) overlapping no other tensor. */
int gk_nmmo3_forward_save_check(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                const gk_tensor *features, const gk_tensor *hidden,
                                const gk_tensor *saved, gk_err *err);
/* The backward's check, saved's, and no gradient overlapping saved. */
int gk_nmmo3_backward_saved_check(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                  const gk_tensor *saved, const gk_tensor *dout,
                                  const gk_nmmo3_weights *grads, gk_err *err);

/* ---- the CPU backend (kernels/cpu/) --------------------------------------- */

int gk_cpu_conv2d_forward(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                          const gk_tensor *b, const gk_tensor *y, gk_err *err);
int gk_cpu_conv2d_backward(const gk_conv2d *p, const gk_tensor *x, const gk_tensor *w,
                           const gk_tensor *y, const gk_tensor *dy, const gk_tensor *dx,
                           const gk_tensor *dw, const gk_tensor *db, gk_err *err);
int gk_cpu_multihot_encode(const gk_multihot_layout *l, const gk_tensor *obs,
                           const gk_tensor *out, gk_err *err);
int gk_cpu_embedding_forward(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                             gk_err *err);
int gk_cpu_embedding_backward(const gk_tensor *idx, const gk_tensor *dout,
                              const gk_tensor *dtable, gk_err *err);
int gk_cpu_embedding_bag(const gk_tensor *idx, const gk_tensor *table, const gk_tensor *out,
                         gk_err *err);
int gk_cpu_lce(const gk_lce *p, const gk_tensor *E, const gk_tensor *C, const gk_tensor *bias,
               const gk_tensor *targets, const gk_tensor *loss, const gk_tensor *lse,
               const gk_tensor *dE, const gk_tensor *dC, const gk_tensor *dbias, gk_err *err);
int gk_cpu_nmmo3_forward(const gk_nmmo3_weights *w, const gk_tensor *obs,
                         const gk_tensor *features, const gk_tensor *hidden, gk_err *err);
int gk_cpu_nmmo3_backward(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *dout,
                          const gk_nmmo3_weights *grads, gk_err *err);
/* gk_cpu_nmmo3_forward that also fills saved (gk_nmmo3_saved_check). */
int gk_cpu_nmmo3_forward_save(const gk_nmmo3_weights *w, const gk_tensor *obs,
                              const gk_tensor *features, const gk_tensor *hidden,
                              const gk_tensor *saved, gk_err *err);
/*
 * gk_cpu_nmmo3_backward from the activations gk_cpu_nmmo3_forward_save kept
 * in saved instead of recomputing them: the same gradients, bit for bit.
 * Every observation value is still checked before any gradient is written.
 */
int gk_cpu_nmmo3_backward_saved(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                const gk_tensor *saved, const gk_tensor *dout,
                                const gk_nmmo3_weights *grads, gk_err *err);

#ifdef __cplusplus
}
#endif

#endif /* GK_H */
