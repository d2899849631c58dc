/*
 * scrape.h - what the stats tests need to read the daemon's HTTP endpoint: a
 * one-shot HTTP GET over a plain socket (so that the test does not share code
 * with what it tests), and a strict reader of the Prometheus text format.
 */
#ifndef TS_SCRAPE_H
#define TS_SCRAPE_H

#include <stddef.h>

/* A free TCP port on 127.0.0.1 (the kernel's choice; racy but fine for tests). */
int ts_free_port(void);

typedef struct ts_http {
    int status; /* 0: no answer (connection refused or reset) */
    char *body; /* NUL-terminated; free with ts_http_free */
    size_t len;
    char content_type[128];
} ts_http;

/* GET path from 127.0.0.1:port; returns 0 with *out filled, or -1 when no answer came. */
int ts_http_get(int port, const char *path, ts_http *out);
void ts_http_free(ts_http *r);

/* One sample: the series (name and labels exactly as written) and its value. */
typedef struct ts_sample {
    char series[256];
    char name[128];
    double value;
} ts_sample;

typedef struct ts_metrics {
    ts_sample *s;
    size_t n;
} ts_metrics;

/*
 * Parses an exposition document and checks every line: HELP/TYPE comments,
 * names, label syntax and escapes, values; a TYPE before each family's samples,
 * one TYPE per family; histogram buckets cumulative with +Inf equal to _count.
 * Returns 0, or -1 with the first problem (and its line) in why.
 */
int ts_metrics_parse(const char *text, ts_metrics *out, char *why, size_t whylen);
void ts_metrics_free(ts_metrics *m);

/* The value of a series ("name{labels}" as written, or a bare name); 0 when absent. */
double ts_metric(const ts_metrics *m, const char *series);
/* The sum over every series of `name` whose labels contain each of the given
 * `key="value"` fragments (NULL-terminated list, may be empty). */
double ts_metric_sum(const ts_metrics *m, const char *name, const char *const *has);

/* Scrapes /metrics and parses it; fails the test (cmocka) on any problem. */
void ts_scrape(int port, ts_metrics *out);

#endif
