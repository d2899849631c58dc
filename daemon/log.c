/* log.c - one line per message, formatted whole and written with one call so
 * that lines from different threads never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = GCD_LOG_INFO;
static const char *const log_names[] = {"error", "warn", "info", "debug"};

int gcd_log_level_parse(const char *s, gcd_log_level *out)
{
    for (int i = 0; i <= GCD_LOG_DEBUG; i++) {
        if (strcmp(s, log_names[i]) == 0) {
            *out = (gcd_log_level)i;
            return 0;
        }
    }
    return -1;
}

void gcd_log_set_level(gcd_log_level level) { atomic_store(&log_level, (int)level); }

void gcd_log(gcd_log_level level, const char *fmt, ...)
{
    if ((int)level > atomic_load(&log_level))
        return;
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ gpucd %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, log_names[level]);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t r = write(STDERR_FILENO, line, (size_t)n);
    (void)r; /* nowhere left to report a failed log write */
}
