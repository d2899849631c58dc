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

#ifdef __cplusplus
}
#endif

#endif
