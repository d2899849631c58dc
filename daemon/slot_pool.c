/* slot_pool.c - see slot_pool.h. */
#include "slot_pool.h"

void gcd_slot_pool_init(gcd_slot_pool *p)
{
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->freed, NULL);
    p->nfree = 0;
}

void gcd_slot_pool_destroy(gcd_slot_pool *p)
{
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->freed);
}

int gcd_slot_pool_take(gcd_slot_pool *p)
{
    pthread_mutex_lock(&p->lock);
    while (p->nfree == 0)
        pthread_cond_wait(&p->freed, &p->lock);
    int slot = p->free[--p->nfree];
    pthread_mutex_unlock(&p->lock);
    return slot;
}

void gcd_slot_pool_give(gcd_slot_pool *p, int slot)
{
    pthread_mutex_lock(&p->lock);
    p->free[p->nfree++] = slot;
    pthread_cond_signal(&p->freed);
    pthread_mutex_unlock(&p->lock);
}
