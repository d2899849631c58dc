/*
 * gk_cuda_nmmo3.h - the NMMO3 encoder forward on the GPU (nmmo3.cu).
 *
 * Composed from the other kernels, on ex->stream, never synchronising:
 * multihot (the one-hot image, materialised in the workspace) -> conv1 + bias
 * + ReLU -> conv2 + bias -> one assembly kernel that writes each features row
 * [conv2 256 | player embedding 1504 | player values 47 | rewards 10] ->
 * optionally the projection relu(features . proj_w^T + proj_b), run as a 1x1
 * convolution.  Shapes and dtypes as gk_nmmo3_forward_check.  Data values are
 * validated on the device: after the caller has synchronised ex->stream,
 * gk_cuda_nmmo3_status returns GK_ERANGE with the CPU kernel's message (a map
 * value first, as the CPU checks the map first, then a player value).
 *
 * Not yet the target design of issue 6 (conv1 built from the bytes without
 * the multihot image, one graph for the whole encode): a correct first step.
 */
#ifndef GK_CUDA_NMMO3_H
#define GK_CUDA_NMMO3_H

#include "gk_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Workspace the forward needs: two error records, the intermediates, the convs' scratch. */
int gk_cuda_nmmo3_forward_workspace_bytes(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                          const gk_tensor *features, const gk_tensor *hidden,
                                          int sm_count, size_t *bytes, gk_err *err);
int gk_cuda_nmmo3_forward(const gk_nmmo3_weights *w, const gk_tensor *obs,
                          const gk_tensor *features, const gk_tensor *hidden,
                          const gk_cuda_exec *ex, gk_err *err);
/*
 * The forward that also keeps conv1's output (after its ReLU) in c1_out,
 * (B, 128, 3, 4) of the weights' dtype, for the backward; c1_out NULL or
 * absent: as gk_cuda_nmmo3_forward.
 */
int gk_cuda_nmmo3_forward_keep(const gk_nmmo3_weights *w, const gk_tensor *obs,
                               const gk_tensor *features, const gk_tensor *hidden,
                               const gk_tensor *c1_out, const gk_cuda_exec *ex, gk_err *err);
int gk_cuda_nmmo3_status(const gk_tensor *obs, const gk_cuda_exec *ex, gk_err *err);

/*
 * The backward (nmmo3_backward.cu): as gk_cpu_nmmo3_backward, on the device.
 * Recomputes the activations, then every weight gradient in fp32 through
 * cuBLAS (ex->blas required).  Checks every observation value first and waits
 * for the verdict (one synchronisation of ex->stream), so a bad value fails
 * with GK_ERANGE and the CPU's message before any gradient is written; the
 * rest is only enqueued.  The batch runs in chunks of agents fitted to the
 * workspace; the gradients' bits depend on the request, the device and the
 * chunk size (so on the workspace size), never on timing.
 */
int gk_cuda_nmmo3_backward_workspace_bytes(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                           const gk_tensor *dout, const gk_nmmo3_weights *grads,
                                           int sm_count, size_t budget, size_t *bytes,
                                           gk_err *err);
int gk_cuda_nmmo3_backward(const gk_nmmo3_weights *w, const gk_tensor *obs, const gk_tensor *dout,
                           const gk_nmmo3_weights *grads, const gk_cuda_exec *ex, gk_err *err);

#ifdef __cplusplus
}
#endif

#endif
