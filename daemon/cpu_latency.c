/* cpu_latency.c - see cpu_latency.h. */
#include "cpu_latency.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char pm_qos_path[] = "/dev/cpu_dma_latency";

int gcd_cpu_latency_hold(gcd_cpu_latency *l, int64_t us, char *err, size_t errlen)
{
    l->held = 0;
    if (us < 0)
        return 0;
    int fd = open(pm_qos_path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "--cpu-latency-us: cannot open %s: %s", pm_qos_path, strerror(e));
        return -e;
    }
    /* The file takes the latency as a binary 32-bit value (or hex text). */
    const int32_t value = (int32_t)us;
    if (write(fd, &value, sizeof value) != (ssize_t)sizeof value) {
        int e = errno != 0 ? errno : EIO;
        snprintf(err, errlen, "--cpu-latency-us: cannot write %s: %s", pm_qos_path, strerror(e));
        close(fd);
        return -e;
    }
    l->held = 1;
    l->fd = fd;
    l->us = us;
    return 0;
}

void gcd_cpu_latency_release(gcd_cpu_latency *l)
{
    if (l->held)
        close(l->fd);
    l->held = 0;
}
