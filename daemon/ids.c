/* ids.c - see ids.h. */
#include "ids.h"

#include <errno.h>
#include <sys/random.h>

int gcd_ids_init(gcd_ids *ids)
{
    uint32_t bits;
    ssize_t n = getrandom(&bits, sizeof bits, 0);
    if (n != (ssize_t)sizeof bits) {
        if (n >= 0)
            errno = EIO; /* 4 bytes never come short from the urandom source; say so if they do */
        return -1;
    }
    ids->epoch = (uint64_t)bits << 32;
    ids->next = 1;
    return 0;
}

int gcd_ids_next(gcd_ids *ids, uint64_t *id)
{
    if (ids->next > GCD_IDS_COUNTER_MAX)
        return -1;
    *id = ids->epoch | ids->next++;
    return 0;
}
