/* log.h - leveled logging to stderr, safe from any thread. */
#ifndef GCD_LOG_H
#define GCD_LOG_H

typedef enum gcd_log_level {
    GCD_LOG_ERROR = 0,
    GCD_LOG_WARN = 1,
    GCD_LOG_INFO = 2,
    GCD_LOG_DEBUG = 3,
} gcd_log_level;

/*
 * Reads the environment once, before the first line: when stderr is the journal's stream
 * ($JOURNAL_STREAM names its device and inode), lines start with their syslog priority ("<3>"
 * for an error, sd-daemon(3)) instead of a timestamp, so that `journalctl -p` filters them.
 */
void gcd_log_init(void);
/* Parses "error|warn|info|debug"; returns 0 or -1. */
int gcd_log_level_parse(const char *s, gcd_log_level *out);
void gcd_log_set_level(gcd_log_level level);
void gcd_log(gcd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define gcd_log_error(...) gcd_log(GCD_LOG_ERROR, __VA_ARGS__)
#define gcd_log_warn(...) gcd_log(GCD_LOG_WARN, __VA_ARGS__)
#define gcd_log_info(...) gcd_log(GCD_LOG_INFO, __VA_ARGS__)
#define gcd_log_debug(...) gcd_log(GCD_LOG_DEBUG, __VA_ARGS__)

#endif
