/*
 * pool.h - a first-fit allocator of byte ranges inside one preallocated block.
 *
 * The CUDA backend takes its device memory once, at start, and carves resident
 * tensors out of it with this allocator, so that no request ever calls
 * cudaMalloc or cudaFree.  The pool knows nothing of devices: it hands out
 * offsets in [0, size), each a multiple of GCD_POOL_ALIGN, which the caller
 * adds to its base pointer.  It is not thread-safe: the caller locks.
 */
#ifndef GCD_POOL_H
#define GCD_POOL_H

#include <stddef.h>
#include <stdint.h>

enum { GCD_POOL_ALIGN = 256 }; /* the alignment of cudaMalloc, and of every offset handed out */

typedef struct gcd_pool gcd_pool;

/* A pool managing [0, size); size is rounded down to GCD_POOL_ALIGN.  NULL when out of memory. */
gcd_pool *gcd_pool_create(uint64_t size);
void gcd_pool_destroy(gcd_pool *p);

/*
 * Takes the first free range that holds bytes (rounded up to GCD_POOL_ALIGN;
 * 0 bytes take one unit, so that every allocation has its own offset).
 * Returns 0 with the offset in *offset, or -1 when no free range is large enough.
 */
int gcd_pool_alloc(gcd_pool *p, uint64_t bytes, uint64_t *offset);

/* Returns a range taken by gcd_pool_alloc; -1 (and nothing changes) for any other offset. */
int gcd_pool_free(gcd_pool *p, uint64_t offset);

typedef struct gcd_pool_usage {
    uint64_t size;         /* managed bytes */
    uint64_t used;         /* bytes in allocated ranges (after rounding) */
    uint64_t largest_free; /* the largest allocation that would succeed now */
    uint64_t allocations;  /* ranges allocated now */
} gcd_pool_usage;

void gcd_pool_usage_get(const gcd_pool *p, gcd_pool_usage *out);

#endif
