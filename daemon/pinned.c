/* pinned.c - see pinned.h. */
#include "pinned.h"

#include <stdlib.h>

void gcd_pinned_init(gcd_pinned *p)
{
    p->r = NULL;
    p->n = p->cap = 0;
    pthread_rwlock_init(&p->lock, NULL);
}

void gcd_pinned_destroy(gcd_pinned *p)
{
    free(p->r);
    p->r = NULL;
    p->n = p->cap = 0;
    pthread_rwlock_destroy(&p->lock);
}

int gcd_pinned_contains(gcd_pinned *p, const void *ptr, size_t bytes)
{
    uintptr_t lo = (uintptr_t)ptr;
    int found = 0;
    pthread_rwlock_rdlock(&p->lock);
    for (size_t i = 0; i < p->n && !found; i++)
        found = lo >= p->r[i].lo && lo < p->r[i].hi && bytes <= p->r[i].hi - lo;
    pthread_rwlock_unlock(&p->lock);
    return found;
}

int gcd_pinned_add(gcd_pinned *p, void *base, size_t bytes,
                   int (*pin)(void *ctx, void *base, size_t bytes, gk_err *err), void *ctx,
                   gk_err *err)
{
    pthread_rwlock_wrlock(&p->lock);
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        gcd_pinned_range *r = realloc(p->r, cap * sizeof *r);
        if (r == NULL) {
            pthread_rwlock_unlock(&p->lock);
            return gk_fail(err, GK_ENOMEM, "out of memory");
        }
        p->r = r;
        p->cap = cap;
    }
    int rc = pin(ctx, base, bytes, err);
    if (rc == 0)
        p->r[p->n++] = (gcd_pinned_range){(uintptr_t)base, (uintptr_t)base + bytes};
    pthread_rwlock_unlock(&p->lock);
    return rc;
}

void gcd_pinned_remove(gcd_pinned *p, void *base, void (*unpin)(void *ctx, void *base),
                       void *ctx)
{
    pthread_rwlock_wrlock(&p->lock);
    for (size_t i = 0; i < p->n; i++) {
        if (p->r[i].lo != (uintptr_t)base)
            continue;
        p->r[i] = p->r[--p->n];
        unpin(ctx, base);
        break;
    }
    pthread_rwlock_unlock(&p->lock);
}
