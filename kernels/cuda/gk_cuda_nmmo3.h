/*
 * gk_cuda_nmmo3.h - the NMMO3 encoder forward on the GPU (nmmo3.cu).
 *
 * Composed on ex->stream, never synchronising: conv1 + bias + ReLU straight
 * from the observation bytes (conv1_obs.cu: the 59-channel multihot image is
 * never materialised) -> conv2 + bias (bf16 with ex->blas given: a cuBLAS
 * strided-batched GEMM on conv1's output in window order; else the
 * convolution kernel) -> one assembly kernel that writes each
 * features row [conv2 256 | player embedding 1504 | player values 47 |
 * rewards 10] -> optionally the projection relu(features . proj_w^T +
 * proj_b): a cuBLAS GEMM (fp32 accumulation and output, true fp32 for f32)
 * and a bias + ReLU kernel when ex->blas is given, else a 1x1 convolution.
 * The workspace covers both.  Before conv1, one kernel makes every per-call
 * weight transform (conv1's packed weights, conv2_w in window order, proj_w
 * with padded rows) and resets the error records; conv1 is launched as its
 * programmatic dependent (its prologue overlaps it).  Rollout batches (at
 * most one conv1 tile an SM) take conv1's smaller tiles, the features rows
 * written inside conv1's kernel and the GEMMs' small-n algorithms: a row's
 * bytes are the same at every batch size (tests/kernels/nmmo3).  Shapes and dtypes as
 * gk_nmmo3_forward_check.  Data values are validated on the device: after
 * the caller has synchronised ex->stream, gk_cuda_nmmo3_status returns
 * GK_ERANGE with the CPU kernel's message (a map value first, as the CPU
 * checks the map first, then a player value).  It reads the records at the
 * start of the workspace: block 0 the player values' (agent * 47 + i), block
 * 1 conv1's map values' (the multihot record, agent * 1650 + byte); the
 * backward fills the same ones.
 *
 * The whole encode is not yet one CUDA graph.
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
 * conv1 alone, from the bytes (conv1_obs.cu): c1 = relu(conv1(multihot(obs))
 * + conv1_b), conv1_w (128, 59, 5, 5) and conv1_b (128) f32 or bf16, obs u8
 * (B, 1707), c1 (B, 128, 3, 4) of the weights' dtype.  The workspace (16-byte
 * aligned) holds the error record and the repacked weights; every map byte is
 * checked, and gk_cuda_nmmo3_conv1_status (after a synchronisation) names the
 * first bad one as the CPU multihot does.
 */
int gk_cuda_nmmo3_conv1_workspace_bytes(const gk_tensor *conv1_w, size_t *bytes, gk_err *err);
int gk_cuda_nmmo3_conv1(const gk_tensor *conv1_w, const gk_tensor *conv1_b, const gk_tensor *obs,
                        const gk_tensor *c1, const gk_cuda_exec *ex, gk_err *err);
int gk_cuda_nmmo3_conv1_status(const gk_tensor *obs, const gk_cuda_exec *ex, gk_err *err);

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

/*
 * Saved activations (gk.h: gk_nmmo3_saved_check), for training steps whose
 * activations stay resident between the forward and the backward.
 * forward_save is gk_cuda_nmmo3_forward that also writes every byte of saved
 * (16-byte aligned; a cuBLAS handle required): conv1 writes its output into
 * the saved rows besides its own, the features rows are assembled there
 * (with a projection) and projected in place, and the projection's ReLU mask
 * is made from hidden (hidden > 0: the same as the fp32 test but where a
 * positive value rounds to 0, below 2^-133 in bf16).  Its values are checked
 * as the forward's: gk_cuda_nmmo3_status after a synchronisation.
 *
 * backward_saved is gk_cuda_nmmo3_backward reading conv1's output, the
 * features and the mask from saved instead of recomputing them (it skips
 * conv1, conv2, the assembly and the projection's product), so its workspace
 * is smaller.  It checks every observation value first and waits for the
 * verdict, as the backward does.  Its gradients equal the stateless
 * backward's up to the recompute's rounding: the same conv1 kernel, but
 * conv2, the features and the pre-activations there come from products of
 * another order than the forward's (see tests/kernels/nmmo3).  Nothing is
 * addressed through saved's bytes: garbage in them gives garbage gradients,
 * never a fault.
 */
int gk_cuda_nmmo3_forward_save_workspace_bytes(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                               const gk_tensor *features, const gk_tensor *hidden,
                                               const gk_tensor *saved, int sm_count, size_t *bytes,
                                               gk_err *err);
int gk_cuda_nmmo3_forward_save(const gk_nmmo3_weights *w, const gk_tensor *obs,
                               const gk_tensor *features, const gk_tensor *hidden,
                               const gk_tensor *saved, const gk_cuda_exec *ex, gk_err *err);
int gk_cuda_nmmo3_backward_saved_workspace_bytes(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                                 const gk_tensor *saved, const gk_tensor *dout,
                                                 const gk_nmmo3_weights *grads, int sm_count,
                                                 size_t budget, size_t *bytes, gk_err *err);
int gk_cuda_nmmo3_backward_saved(const gk_nmmo3_weights *w, const gk_tensor *obs,
                                 const gk_tensor *saved, const gk_tensor *dout,
                                 const gk_nmmo3_weights *grads, const gk_cuda_exec *ex,
                                 gk_err *err);

#ifdef __cplusplus
}
#endif

#endif
