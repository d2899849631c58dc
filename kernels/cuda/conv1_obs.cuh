/*
 * conv1_obs.cuh - conv1 from the observation bytes (conv1_obs.cu) as the
 * nmmo3 forward calls it: shapes already checked, and the output in either
 * or both of two layouts.
 */
#ifndef CONV1_OBS_CUH
#define CONV1_OBS_CUH

#include "gk_cuda.h"

/*
 * c1 = relu(conv1(multihot(obs)) + b) into nchw, (B, 128, 3, 4), and/or whc,
 * (B, 4, 3, 128): per agent the 4 columns of 3 rows of 128 channels, so that
 * conv2's input window at output column ow is the contiguous run
 * [ow * 384, ow * 384 + 1152) of the agent's 1536 values.  NULL: not
 * written.  ex->workspace: the error record, then the repacked weights
 * (gk_cuda_nmmo3_conv1_workspace_bytes).
 */
int conv1_obs_enqueue(const gk_tensor *w, const gk_tensor *b, const gk_tensor *obs, void *nchw,
                      void *whc, const gk_cuda_exec *ex, gk_err *err);

#endif
