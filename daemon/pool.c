/*
 * pool.c - see pool.h.
 *
 * The pool is an array of segments sorted by offset that tiles [0, size)
 * exactly: each segment is used or free, and no two free segments touch
 * (a free merges with its free neighbours).  Allocation scans for the first
 * free segment that fits and splits it.  Resident tensors number in the
 * hundreds at most, so linear scans and array moves cost less than a tree.
 */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

typedef struct segment {
    uint64_t offset, size;
    int used;
} segment;

struct gcd_pool {
    segment *segs;
    size_t count, cap;
    uint64_t size;
};

gcd_pool *gcd_pool_create(uint64_t size)
{
    gcd_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->size = size / GCD_POOL_ALIGN * GCD_POOL_ALIGN;
    p->cap = 16;
    p->segs = malloc(p->cap * sizeof *p->segs);
    if (p->segs == NULL) {
        free(p);
        return NULL;
    }
    if (p->size > 0)
        p->segs[p->count++] = (segment){.offset = 0, .size = p->size, .used = 0};
    return p;
}

void gcd_pool_destroy(gcd_pool *p)
{
    if (p == NULL)
        return;
    free(p->segs);
    free(p);
}

/* Makes room for one more segment at index i; -1 when out of memory. */
static int segment_insert(gcd_pool *p, size_t i, segment s)
{
    if (p->count == p->cap) {
        size_t cap = p->cap * 2;
        segment *segs = realloc(p->segs, cap * sizeof *segs);
        if (segs == NULL)
            return -1;
        p->segs = segs;
        p->cap = cap;
    }
    memmove(&p->segs[i + 1], &p->segs[i], (p->count - i) * sizeof *p->segs);
    p->segs[i] = s;
    p->count++;
    return 0;
}

static void segment_remove(gcd_pool *p, size_t i)
{
    memmove(&p->segs[i], &p->segs[i + 1], (p->count - i - 1) * sizeof *p->segs);
    p->count--;
}

int gcd_pool_alloc(gcd_pool *p, uint64_t bytes, uint64_t *offset)
{
    if (bytes > p->size)
        return -1;
    uint64_t need = bytes == 0 ? GCD_POOL_ALIGN
                               : (bytes + GCD_POOL_ALIGN - 1) / GCD_POOL_ALIGN * GCD_POOL_ALIGN;
    for (size_t i = 0; i < p->count; i++) {
        segment *s = &p->segs[i];
        if (s->used || s->size < need)
            continue;
        if (s->size > need) {
            segment rest = {.offset = s->offset + need, .size = s->size - need, .used = 0};
            if (segment_insert(p, i + 1, rest) != 0)
                return -1;
            s = &p->segs[i]; /* the array may have moved */
            s->size = need;
        }
        s->used = 1;
        *offset = s->offset;
        return 0;
    }
    return -1;
}

int gcd_pool_free(gcd_pool *p, uint64_t offset)
{
    /* Binary search for the segment starting at offset. */
    size_t lo = 0, hi = p->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->segs[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == p->count || p->segs[lo].offset != offset || !p->segs[lo].used)
        return -1;
    size_t i = lo;
    p->segs[i].used = 0;
    if (i + 1 < p->count && !p->segs[i + 1].used) {
        p->segs[i].size += p->segs[i + 1].size;
        segment_remove(p, i + 1);
    }
    if (i > 0 && !p->segs[i - 1].used) {
        p->segs[i - 1].size += p->segs[i].size;
        segment_remove(p, i);
    }
    return 0;
}

void gcd_pool_usage_get(const gcd_pool *p, gcd_pool_usage *out)
{
    memset(out, 0, sizeof *out);
    out->size = p->size;
    for (size_t i = 0; i < p->count; i++) {
        const segment *s = &p->segs[i];
        if (s->used) {
            out->used += s->size;
            out->allocations++;
        } else if (s->size > out->largest_free) {
            out->largest_free = s->size;
        }
    }
}
