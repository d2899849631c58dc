/*
 * config.c - one table of options drives both the command line and the config
 * file, so the two can never disagree on a key, a type or a range.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpucd.h"

typedef int (*config_setter)(gcd_config *cfg, const char *value, char *err, size_t errlen);

typedef struct config_option {
    const char *key;
    const char *arg;
    const char *help;
    config_setter set;
} config_option;

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (*s == '\0' || *s == '-')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int set_listen(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (cfg->nlisten >= GCD_MAX_LISTEN) {
        snprintf(err, errlen, "at most %d --listen URLs", GCD_MAX_LISTEN);
        return -1;
    }
    if (strncmp(v, "ipc://", 6) != 0 && strncmp(v, "tcp://", 6) != 0) {
        snprintf(err, errlen, "--listen %s: only ipc:// and tcp:// URLs are served", v);
        return -1;
    }
    if (strlen(v) >= GCD_URL_MAX) {
        snprintf(err, errlen, "--listen URL longer than %d bytes", GCD_URL_MAX - 1);
        return -1;
    }
    snprintf(cfg->listen[cfg->nlisten++], GCD_URL_MAX, "%s", v);
    return 0;
}

static int set_backend(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (strcmp(v, "auto") == 0)
        cfg->backend = GCD_BACKEND_AUTO;
    else if (strcmp(v, "cpu") == 0)
        cfg->backend = GCD_BACKEND_CPU;
    else if (strcmp(v, "cuda") == 0)
        cfg->backend = GCD_BACKEND_CUDA;
    else {
        snprintf(err, errlen, "--backend %s: expected auto, cuda or cpu", v);
        return -1;
    }
    return 0;
}

static int set_device(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    uint64_t n;
    if (parse_u64(v, 0, 63, &n) != 0) {
        snprintf(err, errlen, "--device %s: expected a device index 0..63", v);
        return -1;
    }
    cfg->device = (int)n;
    return 0;
}

static int set_workspace(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (parse_u64(v, 1, 1u << 20, &cfg->workspace_mb) != 0) {
        snprintf(err, errlen, "--workspace-mb %s: expected 1..1048576", v);
        return -1;
    }
    return 0;
}

static int set_resident(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (parse_u64(v, 1, 1u << 24, &cfg->resident_mb) != 0) {
        snprintf(err, errlen, "--resident-mb %s: expected 1..16777216", v);
        return -1;
    }
    return 0;
}

static int set_max_message(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    /* nng refuses receive limits of 4 GiB and more (with the error-reply slack). */
    if (parse_u64(v, 1, 2048, &cfg->max_message_mb) != 0) {
        snprintf(err, errlen, "--max-message-mb %s: expected 1..2048", v);
        return -1;
    }
    return 0;
}

static int set_max_inflight(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    uint64_t n;
    if (parse_u64(v, 1, 4096, &n) != 0) {
        snprintf(err, errlen, "--max-inflight %s: expected 1..4096", v);
        return -1;
    }
    cfg->max_inflight = (uint32_t)n;
    return 0;
}

static int set_batch_window(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (parse_u64(v, 0, 1000000, &cfg->batch_window_us) != 0) {
        snprintf(err, errlen, "--batch-window-us %s: expected 0..1000000", v);
        return -1;
    }
    return 0;
}

static int set_max_batch(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (parse_u64(v, 1, 1u << 20, &cfg->max_batch) != 0) {
        snprintf(err, errlen, "--max-batch %s: expected 1..1048576 rows", v);
        return -1;
    }
    return 0;
}

static int set_log_level(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (gcd_log_level_parse(v, &cfg->log_level) != 0) {
        snprintf(err, errlen, "--log-level %s: expected error, warn, info or debug", v);
        return -1;
    }
    return 0;
}

static int set_stats_listen(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    if (strcmp(v, "none") != 0 && strncmp(v, "http://", 7) != 0) {
        snprintf(err, errlen, "--stats-listen %s: expected http://ADDR:PORT or none", v);
        return -1;
    }
    if (strlen(v) >= GCD_URL_MAX) {
        snprintf(err, errlen, "--stats-listen URL longer than %d bytes", GCD_URL_MAX - 1);
        return -1;
    }
    snprintf(cfg->stats_listen, sizeof cfg->stats_listen, "%s", v);
    return 0;
}

static int read_config_file(gcd_config *cfg, const char *path, char *err, size_t errlen);

static int set_config(gcd_config *cfg, const char *v, char *err, size_t errlen)
{
    return read_config_file(cfg, v, err, errlen);
}

static const config_option config_options[] = {
    {"listen", "URL", "serve on URL (ipc:// or tcp://); repeatable. Default ipc:// under "
                      "$XDG_RUNTIME_DIR, else /tmp/gpucd-$UID/, mode 0600", set_listen},
    {"backend", "auto|cuda|cpu", "compute backend; auto picks cuda when a GPU is usable",
     set_backend},
    {"device", "N", "CUDA device index (default 0)", set_device},
    {"workspace-mb", "MB", "device workspace preallocated at start (default 1024)", set_workspace},
    {"resident-mb", "MB", "most memory resident tensors may hold, all clients together "
                          "(default 16384)", set_resident},
    {"max-message-mb", "MB", "largest request or inline reply (default 256); a request up to "
                             "1 MiB larger gets an error reply, a larger one is dropped by the "
                             "transport with its connection before anything decodes it",
     set_max_message},
    {"max-inflight", "N", "requests received and served at once (default 64)", set_max_inflight},
    {"batch-window-us", "US", "merge nmmo3_encode forward requests that share resident weights "
                              "and arrive within US of the first into one launch (default 0: "
                              "off)", set_batch_window},
    {"max-batch", "ROWS", "most rows in one merged launch (default 32768)", set_max_batch},
    {"log-level", "LEVEL", "error, warn, info or debug (default info)", set_log_level},
    {"stats-listen", "URL", "HTTP stats endpoint, http://ADDR:PORT or none "
                            "(default http://127.0.0.1:9464)", set_stats_listen},
    {"config", "FILE", "read options from FILE: one 'key = value' a line, keys as the long "
                       "flags without dashes, '#' starts a comment", set_config},
};

static const config_option *option_find(const char *key)
{
    for (size_t i = 0; i < sizeof config_options / sizeof config_options[0]; i++)
        if (strcmp(config_options[i].key, key) == 0)
            return &config_options[i];
    return NULL;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

static int read_config_file(gcd_config *cfg, const char *path, char *err, size_t errlen)
{
    static int depth;
    if (depth > 0) {
        snprintf(err, errlen, "%s: a config file may not include another", path);
        return -1;
    }
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "cannot read config file %s: %s", path, strerror(errno));
        return -1;
    }
    depth++;
    char line[1024];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash != NULL)
            *hash = '\0';
        char *s = trim(line);
        if (*s == '\0')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL) {
            snprintf(err, errlen, "%s:%d: expected 'key = value'", path, lineno);
            rc = -1;
            break;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        const config_option *opt = option_find(key);
        if (opt == NULL) {
            snprintf(err, errlen, "%s:%d: unknown key '%s'", path, lineno, key);
            rc = -1;
            break;
        }
        char why[512];
        if (opt->set(cfg, value, why, sizeof why) != 0) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, why);
            rc = -1;
        }
    }
    depth--;
    fclose(f);
    return rc;
}

void gcd_config_defaults(gcd_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->backend = GCD_BACKEND_AUTO;
    cfg->workspace_mb = 1024;
    cfg->resident_mb = 16384;
    cfg->max_message_mb = 256;
    cfg->max_inflight = 64;
    cfg->max_batch = 32768;
    cfg->log_level = GCD_LOG_INFO;
    snprintf(cfg->stats_listen, sizeof cfg->stats_listen, "http://127.0.0.1:9464");
}

void gcd_config_usage(FILE *out)
{
    fprintf(out, "usage: gpucd [options]\n\ngpucd serves GPU compute requests; it runs in the "
                 "foreground until SIGINT or SIGTERM.\n\n");
    for (size_t i = 0; i < sizeof config_options / sizeof config_options[0]; i++) {
        const config_option *o = &config_options[i];
        char flag[64];
        snprintf(flag, sizeof flag, "--%s %s", o->key, o->arg);
        fprintf(out, "  %-30s %s\n", flag, o->help);
    }
    fprintf(out, "  %-30s %s\n", "--help", "print this help and exit");
}

int gcd_config_parse_args(gcd_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            gcd_config_usage(stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s' (see --help)", a);
            return -1;
        }
        char key[64];
        const char *value = strchr(a, '=');
        size_t klen = value != NULL ? (size_t)(value - a - 2) : strlen(a + 2);
        if (klen >= sizeof key) {
            snprintf(err, errlen, "unknown option '%s' (see --help)", a);
            return -1;
        }
        memcpy(key, a + 2, klen);
        key[klen] = '\0';
        const config_option *opt = option_find(key);
        if (opt == NULL) {
            snprintf(err, errlen, "unknown option '--%s' (see --help)", key);
            return -1;
        }
        if (value != NULL) {
            value++;
        } else {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "--%s needs a value (%s)", key, opt->arg);
                return -1;
            }
            value = argv[++i];
        }
        if (opt->set(cfg, value, err, errlen) != 0)
            return -1;
    }
    return 0;
}

int gcd_config_finish(gcd_config *cfg, char *err, size_t errlen)
{
    if (cfg->nlisten > 0)
        return 0;
    char url[GCD_URL_MAX];
    if (gpucd_default_url(url, sizeof url) != 0) {
        snprintf(err, errlen, "cannot form the default listen URL; give --listen");
        return -1;
    }
    /* The socket's folder must exist; it is private to this user. */
    char dir[GCD_URL_MAX];
    snprintf(dir, sizeof dir, "%s", url + strlen("ipc://"));
    char *slash = strrchr(dir, '/');
    if (slash != NULL && slash != dir) {
        *slash = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
            snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
            return -1;
        }
    }
    snprintf(cfg->listen[0], GCD_URL_MAX, "%s", url);
    cfg->nlisten = 1;
    return 0;
}
