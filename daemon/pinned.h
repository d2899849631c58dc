/*
 * pinned.h - the address ranges of the host memory a backend has pinned (the
 * registered regions), which every run asks about to copy straight from or to
 * them.  Thread-safe: runs read, registering and unregistering write.
 */
#ifndef GCD_PINNED_H
#define GCD_PINNED_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gk.h"

typedef struct gcd_pinned_range {
    uintptr_t lo, hi;
} gcd_pinned_range;

typedef struct gcd_pinned {
    gcd_pinned_range *r;
    size_t n, cap;
    pthread_rwlock_t lock;
} gcd_pinned;

void gcd_pinned_init(gcd_pinned *p);
void gcd_pinned_destroy(gcd_pinned *p);

/* Whether [ptr, ptr + bytes) lies inside one range. */
int gcd_pinned_contains(gcd_pinned *p, const void *ptr, size_t bytes);

/*
 * Pins [base, base + bytes) with pin(ctx, ...) and adds the range, both under
 * the write lock, so that no run sees a range that is not pinned yet.  0, or
 * GK_ENOMEM (nothing pinned), or what pin returned (the range not added).
 */
int gcd_pinned_add(gcd_pinned *p, void *base, size_t bytes,
                   int (*pin)(void *ctx, void *base, size_t bytes, gk_err *err), void *ctx,
                   gk_err *err);

/* Removes the range that starts at base and unpins it with unpin(ctx, base); nothing if none. */
void gcd_pinned_remove(gcd_pinned *p, void *base, void (*unpin)(void *ctx, void *base),
                       void *ctx);

#endif
