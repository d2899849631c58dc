/*
 * conv1_obs.cuh - conv1 from the observation bytes (conv1_obs.cu) as the
 * nmmo3 forward calls it: shapes already checked, and the output in either
 * or both of two layouts.
 */
#ifndef CONV1_OBS_CUH
#define CONV1_OBS_CUH

#include "gk_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The kernel variants (all exact in the same way, each bitwise reproducible;
 * their bits may differ from each other's in the last place of fp32 sums):
 * ONEHOT_A, mma.sync, 8 warps of 48 rows x 64 channels (222 registers), the
 * one-hot fragments made from the masks in registers, the weights by
 * ldmatrix; WEIGHTS_A, mma.sync, 16 warps of 24 rows x 64 channels (at most
 * 128 registers), the weights as A by ldmatrix and the one-hot as B; WGMMA
 * (sm_90a, the default), three warpgroups issue wgmma m64n128k16 with the
 * one-hot as A from registers and the weights as B in shared memory, fed by
 * bulk copies from a fourth, producer warpgroup that also builds the masks.
 */
enum {
    CONV1_OBS_ONEHOT_A = 0,
    CONV1_OBS_WEIGHTS_A = 1,
    CONV1_OBS_WGMMA = 2,
    CONV1_OBS_VARIANTS = 3,
    CONV1_OBS_DEFAULT = CONV1_OBS_WGMMA
};

/*
 * c1 = relu(conv1(multihot(obs)) + b) into nchw, (B, 128, 3, 4), and/or whc,
 * (B, 4, 3, 128): per agent the 4 columns of 3 rows of 128 channels, so that
 * conv2's input window at output column ow is the contiguous run
 * [ow * 384, ow * 384 + 1152) of the agent's 1536 values.  NULL: not
 * written.  ex->workspace: the error record, then the repacked weights
 * (gk_cuda_nmmo3_conv1_workspace_bytes).
 */
int conv1_obs_enqueue(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw,
                      void *whc, int variant, const gk_cuda_exec *ex, gk_err *err);

/*
 * conv1_obs_enqueue with the default (wgmma) kernel, agent a's nchw values at
 * nchw + a * nchw_ld (elements; >= 1536, rows 16-byte aligned): conv1's
 * output straight into the rows of the saved activations.
 */
int conv1_obs_enqueue_strided(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw,
                              int64_t nchw_ld, void *whc, const gk_cuda_exec *ex, gk_err *err);
/*
 * The nmmo3 features columns that do not depend on conv1: per agent, columns
 * [256, ld) of its row: the 47 player embeddings (a value >= 128 gives zeros
 * and lowers rec to agent * 47 + i, the forward's player-value record), the
 * raw player and reward bytes, zeros past column 1817.
 */
typedef struct conv1_obs_features {
    void *rows;              /* (B, ld) of the weights' dtype, 16-byte aligned */
    int ld;                  /* >= 1817, ld * element size a multiple of 16 */
    const void *embed;       /* (128, 32) of the weights' dtype, 16-byte aligned */
    unsigned long long *rec; /* reset by the caller before the call */
} conv1_obs_features;

/*
 * conv1_obs_enqueue with the default (wgmma) kernel whose producer warps
 * also write f's columns from the tile's bytes while the tensor cores run, so
 * that the forward needs no separate pass over them.  GK_EINVAL when f does
 * not meet its alignment.
 */
int conv1_obs_enqueue_features(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs,
                               void *nchw, void *whc, const conv1_obs_features *f,
                               const gk_cuda_exec *ex, gk_err *err);

/*
 * Whether the default kernel runs a batch of this size in its small tiles (8
 * agents, two consumer warpgroups) instead of 16-agent ones: when they fit
 * one an SM (B <= 1056 on 132 SMs), so that twice the SMs share the work.
 */
int conv1_obs_small_tiles(int64_t batch, int sm_count);

/*
 * The nmmo3 forward's other per-call weight transforms, done by conv1's
 * weight-packing kernel in the same launch (one kernel before conv1 instead
 * of four stream operations): another error record reset; conv2_w (128, 128,
 * 3, 3) reordered to (oc, kw, kh, c) into conv2_r; proj_w (proj_rows, 1817)
 * copied into rows of proj_ld >= 1817 elements at proj_p, zeros in the
 * padding.  All of the weights' dtype; a NULL destination: not done.
 */
typedef struct conv1_obs_prep {
    unsigned long long *rec;
    const void *conv2_w;
    void *conv2_r;
    const void *proj_w;
    void *proj_p;
    int proj_rows, proj_ld;
} conv1_obs_prep;

/*
 * The default (wgmma) kernel as the forward calls it: nchw (may be NULL)
 * with agent rows nchw_ld elements apart (as conv1_obs_enqueue_strided when
 * not 1536), whc (may be NULL), the features columns when f is given (as
 * conv1_obs_enqueue_features), and prep's transforms when given.  The two
 * calls above are this one with fewer parts.
 */
int conv1_obs_enqueue_forward(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw,
                              int64_t nchw_ld, void *whc, const conv1_obs_features *f,
                              const conv1_obs_prep *prep, const gk_cuda_exec *ex, gk_err *err);

#ifdef __cplusplus
}
#endif

#endif
