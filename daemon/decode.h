/* decode.h - a decoded wire compute request turned into a gcd_op and its tensor references. */
#ifndef GCD_DECODE_H
#define GCD_DECODE_H

#include <stddef.h>

#include "gpucd.pb-c.h"
#include "ops.h"
#include "status.h"

/*
 * Fills op (kind, parameters, slot count and output flags) and refs (one per
 * slot, NULL where the request left a tensor out) from a compute request.
 * Returns GCD_OK, or an error status with a reason naming the bad field.
 */
gcd_status gcd_decode_compute(const Gpucd__V1__Request *req, gcd_op *op,
                              const Gpucd__V1__TensorRef *refs[GCD_OP_MAX_ARGS], char *why,
                              size_t whylen);

/* For the families' decoders (ops/): r, or NULL when it is absent (no dtype, shape or place). */
const Gpucd__V1__TensorRef *gcd_decode_present(const Gpucd__V1__TensorRef *r);

/* For the families' decoders: a Math value to tf32 (0 or 1); GCD_OK or an error with why. */
gcd_status gcd_decode_math(Gpucd__V1__Math m, int *tf32, char *why, size_t whylen);

/* True when the request carries a compute operation. */
int gcd_decode_is_compute(const Gpucd__V1__Request *req);

#endif
