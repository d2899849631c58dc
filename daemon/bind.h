/*
 * bind.h - turns the wire's tensor references into memory a backend can use,
 * after validating every one: dtype, shape, size overflow, the byte range
 * inside its region or payload, alignment, ownership, and that no output
 * overlaps another tensor of the same request.
 */
#ifndef GCD_BIND_H
#define GCD_BIND_H

#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "gpucd.pb-c.h"
#include "wire.h"

typedef Gpucd__V1__TensorRef gcd_ref;

/* What one request may reach. */
typedef struct gcd_bind_ctx {
    gcd_daemon *daemon;
    uint32_t pipe; /* the caller's connection */
    uint32_t uid;  /* the caller's uid, GCD_UID_REMOTE over tcp */
    const uint8_t *payload;
    size_t payload_len;
} gcd_bind_ctx;

typedef struct gcd_binding {
    const gcd_ref *ref;
    gcd_region *region;
    gcd_resident *resident;
    int write;
    int locked;
    int new_resident;
    int to_payload;          /* an output returned in the reply payload */
    uint64_t payload_offset; /* its offset there */
    uint64_t lo, hi;         /* byte range in the region or resident */
} gcd_binding;

typedef struct gcd_bound {
    gcd_binding b[GCD_OP_MAX_ARGS];
    int n;
    gcd_binding doorbell; /* the completion record's 64 bytes, if asked for (doorbell_record.h) */
    uint8_t *out_payload; /* the reply payload, 64-byte aligned */
    size_t out_payload_len;
    gcd_quota_conn *out_payload_held; /* its bytes in flight, charged to the caller */
    int out_payload_mapped; /* still the mapping its checks saw (gcd_bound_payload_commit) */
} gcd_bound;

/*
 * Binds every present slot of op (refs from gcd_decode_compute, or built by the
 * caller for single-tensor operations), allocates the reply payload (zeroed; a
 * large one only mapped until gcd_bound_payload_commit) and new
 * resident tensors, and locks the resident tensors used (in id order).  On
 * failure everything taken is released.
 */
gcd_status gcd_bind(const gcd_bind_ctx *ctx, gcd_op *op, const gcd_ref *const refs[],
                    const char *const names[], gcd_bound *bound, char *why, size_t whylen);

/*
 * Charges the reply payload's bytes to the caller's in-flight quota (nothing when there is no
 * payload or it is charged already).  After the request's own checks, so that a request wrong
 * in itself is told so whatever the caller's other requests hold; before anything writes into
 * the payload (its pages are untouched until then).
 */
gcd_status gcd_bound_payload_charge(const gcd_bind_ctx *ctx, gcd_bound *bound, char *why,
                                    size_t whylen);

/*
 * Binds the n bytes at slice, in one of the caller's regions, into *b (region,
 * lo, hi); every message starts with name.  On failure b->region may hold a
 * reference, released by gcd_unbind or the caller.
 */
gcd_status gcd_bind_region_bytes(const gcd_bind_ctx *ctx, const Gpucd__V1__RegionSlice *slice,
                                 uint64_t n, const char *name, gcd_binding *b, char *why,
                                 size_t whylen);

/* True when a and b share bytes of one region or one resident tensor. */
int gcd_bindings_overlap(const gcd_binding *a, const gcd_binding *b);

/*
 * After the operation's checks passed, before it runs: a large reply payload
 * moves from its mapping (untouched, no memory yet) to the heap, zeroed, and
 * op's inline outputs with it.  Without memory for that it stays mapped.
 */
void gcd_bound_payload_commit(gcd_op *op, gcd_bound *bound);

/* Unlocks and releases; new resident tensors are kept only when success. */
void gcd_unbind(const gcd_bind_ctx *ctx, gcd_bound *bound, int success);

/* Fills the reply's description of slot i's output (where its bytes went). */
void gcd_bound_describe(const gcd_bound *bound, int i, const gk_tensor *t,
                        Gpucd__V1__TensorRef *out, Gpucd__V1__RegionSlice *region,
                        Gpucd__V1__InlineSlice *inl, int64_t *shape);

#endif
