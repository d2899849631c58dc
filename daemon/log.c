/*
 * log.c - one line per message, formatted whole and written with one call so that lines from
 * different threads never interleave.  When stderr is the journal's stream, each line starts
 * with its syslog priority as sd-daemon(3) describes ("<3>" for an error), which journald
 * stores as the entry's PRIORITY (`journalctl -p err`); the journal stamps the time and the
 * program itself, so such lines carry neither.
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = GCD_LOG_INFO;
static const char *const log_names[] = {"error", "warn", "info", "debug"};
/* The syslog priorities of the levels: LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG. */
static const char *const log_priorities[] = {"<3>", "<4>", "<6>", "<7>"};
static atomic_int log_journal;

void gcd_log_init(void)
{
    /* systemd sets JOURNAL_STREAM to "DEV:INODE" of the stream it connects stderr to; a
     * stderr that is no longer that stream (redirected by a wrapper) gets plain lines. */
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    int end = 0;
    struct stat st;
    const int journal = js != NULL && sscanf(js, "%llu:%llu%n", &dev, &ino, &end) == 2 &&
                        js[end] == '\0' && fstat(STDERR_FILENO, &st) == 0 &&
                        (unsigned long long)st.st_dev == dev &&
                        (unsigned long long)st.st_ino == ino;
    atomic_store(&log_journal, journal);
}

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
    int n;
    if (atomic_load(&log_journal)) {
        n = snprintf(line, sizeof line, "%s%s: ", log_priorities[level], log_names[level]);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ gpucd %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, log_names[level]);
    }
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
