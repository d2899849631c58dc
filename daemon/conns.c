/* conns.c - see conns.h.  A sorted array: two searches a request, a move a connection. */
#include "conns.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "submitq.h"

struct gcd_conns {
    pthread_mutex_t lock;
    uint32_t *ids; /* ascending */
    size_t n, cap;
};

int gcd_conns_init(gcd_conns **out)
{
    gcd_conns *cs = calloc(1, sizeof *cs);
    if (cs == NULL)
        return -1;
    pthread_mutex_init(&cs->lock, NULL);
    *out = cs;
    return 0;
}

void gcd_conns_fini(gcd_conns *cs)
{
    if (cs == NULL)
        return;
    pthread_mutex_destroy(&cs->lock);
    free(cs->ids);
    free(cs);
}

/* With the lock held: where id is, or would go. */
static size_t conns_find(const gcd_conns *cs, uint32_t id)
{
    size_t lo = 0, hi = cs->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cs->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int gcd_conns_add(gcd_conns *cs, uint32_t id)
{
    int rc = 0;
    pthread_mutex_lock(&cs->lock);
    size_t i = conns_find(cs, id);
    if (i < cs->n && cs->ids[i] == id)
        goto out;
    if (cs->n == cs->cap) {
        size_t cap = cs->cap != 0 ? cs->cap * 2 : 64;
        uint32_t *ids = realloc(cs->ids, cap * sizeof *ids);
        if (ids == NULL) {
            rc = -1;
            goto out;
        }
        cs->ids = ids;
        cs->cap = cap;
    }
    memmove(&cs->ids[i + 1], &cs->ids[i], (cs->n - i) * sizeof *cs->ids);
    cs->ids[i] = id;
    cs->n++;
out:
    pthread_mutex_unlock(&cs->lock);
    return rc;
}

int gcd_conns_live(gcd_conns *cs, uint32_t id)
{
    pthread_mutex_lock(&cs->lock);
    size_t i = conns_find(cs, id);
    int live = i < cs->n && cs->ids[i] == id;
    pthread_mutex_unlock(&cs->lock);
    return live;
}

/* Everything connection id holds goes; regions first: a queue opened on one of
 * them meanwhile sees it gone (submitq.c). */
static void conns_drop(gcd_daemon *d, uint32_t id)
{
    gcd_regions_drop_owner(d->regions, id);
    if (d->submitq != NULL)
        gcd_submitq_drop_owner(d->submitq, id);
    gcd_residents_drop_owner(d->residents, id);
}

void gcd_conns_remove(gcd_daemon *d, uint32_t id)
{
    gcd_conns *cs = d->conns;
    pthread_mutex_lock(&cs->lock);
    size_t i = conns_find(cs, id);
    if (i < cs->n && cs->ids[i] == id) {
        memmove(&cs->ids[i], &cs->ids[i + 1], (cs->n - i - 1) * sizeof *cs->ids);
        cs->n--;
    }
    pthread_mutex_unlock(&cs->lock);
    conns_drop(d, id);
}

void gcd_conns_sweep(gcd_daemon *d, uint32_t id)
{
    if (!gcd_conns_live(d->conns, id))
        conns_drop(d, id);
}
