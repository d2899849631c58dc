/*
 * parts.h - running an op whose host tensors come in parts (gcd_parts, ops.h)
 * on a backend that needs each tensor in one piece: gather the parts of every
 * input into a buffer, run, scatter every output back into its parts.
 */
#ifndef GCD_PARTS_H
#define GCD_PARTS_H

#include "ops.h"

/* Bytes of one row of a host tensor (its bytes over its first dimension). */
size_t gcd_arg_row_bytes(const gcd_arg *a);

/* Copies the argument's bytes (in parts or whole) into one contiguous dst of bytes. */
void gcd_arg_gather(void *dst, const gcd_arg *a, size_t bytes);
/* Copies one contiguous src of bytes into the argument's memory (in parts or whole). */
void gcd_arg_scatter(const gcd_arg *a, const void *src, size_t bytes);

/*
 * Points every parted argument of op at a buffer of its own (bufs[i], NULL
 * for the others) and gathers the inputs' parts into theirs; GK_ENOMEM
 * (buffers freed, op unchanged) when one cannot be allocated.
 */
int gcd_parts_gather(gcd_op *op, void *bufs[GCD_OP_MAX_ARGS], gk_err *err);
/* After the run: scatters the outputs' buffers into their parts, frees every buffer. */
void gcd_parts_scatter(const gcd_op *op, void *bufs[GCD_OP_MAX_ARGS]);

#endif
