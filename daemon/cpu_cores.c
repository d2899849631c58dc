/* cpu_cores.c - see cpu_cores.h. */
#include "cpu_cores.h"

int gcd_cpu_cores_init(gcd_cpu_cores *c, unsigned cores, unsigned team)
{
    if (pthread_mutex_init(&c->lock, NULL) != 0)
        return -1;
    if (pthread_cond_init(&c->freed, NULL) != 0) {
        pthread_mutex_destroy(&c->lock);
        return -1;
    }
    c->cores = c->free = cores > 0 ? cores : 1;
    c->team = team > 0 ? team : 1;
    c->waiting = 0;
    c->peak = 0;
    return 0;
}

void gcd_cpu_cores_fini(gcd_cpu_cores *c)
{
    pthread_cond_destroy(&c->freed);
    pthread_mutex_destroy(&c->lock);
}

unsigned gcd_cpu_cores_take(gcd_cpu_cores *c)
{
    pthread_mutex_lock(&c->lock);
    c->waiting++;
    while (c->free == 0)
        pthread_cond_wait(&c->freed, &c->lock);
    c->waiting--;
    /* An even share with the runs still waiting (they were woken too), at least one. */
    unsigned n = c->free / (c->waiting + 1);
    if (n == 0)
        n = 1;
    if (n > c->team)
        n = c->team;
    c->free -= n;
    if (c->cores - c->free > c->peak)
        c->peak = c->cores - c->free;
    pthread_mutex_unlock(&c->lock);
    return n;
}

void gcd_cpu_cores_give(gcd_cpu_cores *c, unsigned n)
{
    pthread_mutex_lock(&c->lock);
    c->free += n;
    pthread_cond_broadcast(&c->freed);
    pthread_mutex_unlock(&c->lock);
}

unsigned gcd_cpu_cores_peak(gcd_cpu_cores *c)
{
    pthread_mutex_lock(&c->lock);
    const unsigned peak = c->peak;
    pthread_mutex_unlock(&c->lock);
    return peak;
}
