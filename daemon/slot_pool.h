/*
 * slot_pool.h - a backend's execution slots as a pool of indices: a run takes
 * one, waiting while every slot is busy, and gives it back.  The most
 * recently given slot is taken first, so a light load keeps reusing one
 * slot's warm resources.
 */
#ifndef GCD_SLOT_POOL_H
#define GCD_SLOT_POOL_H

#include <pthread.h>

enum { GCD_SLOT_POOL_MAX = 16 };

typedef struct gcd_slot_pool {
    pthread_mutex_t lock;
    pthread_cond_t freed;
    int free[GCD_SLOT_POOL_MAX]; /* a stack: free[nfree - 1] is taken next */
    int nfree;
} gcd_slot_pool;

/* Empty: slots become takeable as they are given. */
void gcd_slot_pool_init(gcd_slot_pool *p);
void gcd_slot_pool_destroy(gcd_slot_pool *p);

/* A free slot's index, waiting for one if none is free. */
int gcd_slot_pool_take(gcd_slot_pool *p);

/* Makes slot (0 <= slot < GCD_SLOT_POOL_MAX, not already free) takeable, waking a waiter. */
void gcd_slot_pool_give(gcd_slot_pool *p, int slot);

#endif
