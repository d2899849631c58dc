/* scrape.c - see scrape.h. */
#include "scrape.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

int ts_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        fprintf(stderr, "no free port: %s\n", strerror(errno));
        abort();
    }
    close(fd);
    return ntohs(sa.sin_port);
}

void ts_http_free(ts_http *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

static const char *header_value(const char *head, size_t head_len, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = head; p != NULL && p < head + head_len; p = strstr(p, "\r\n")) {
        if (p != head)
            p += 2;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            p += nl + 1;
            while (*p == ' ')
                p++;
            return p;
        }
    }
    return NULL;
}

int ts_http_get(int port, const char *path, ts_http *out)
{
    memset(out, 0, sizeof *out);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    char req[512];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", path,
                     port);
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    size_t body_at = 0, want = SIZE_MAX;
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        ssize_t got = recv(fd, buf + len, cap - len - 1, 0);
        if (got <= 0)
            break;
        len += (size_t)got;
        buf[len] = '\0';
        if (body_at == 0) {
            char *end = strstr(buf, "\r\n\r\n");
            if (end != NULL) {
                body_at = (size_t)(end - buf) + 4;
                const char *cl = header_value(buf, body_at, "Content-Length");
                if (cl != NULL)
                    want = body_at + strtoull(cl, NULL, 10);
            }
        }
        if (body_at != 0 && len >= want)
            break;
    }
    close(fd);
    buf[len] = '\0';
    if (body_at == 0 || sscanf(buf, "HTTP/1.%*d %d", &out->status) != 1) {
        free(buf);
        return -1;
    }
    const char *ct = header_value(buf, body_at, "Content-Type");
    if (ct != NULL)
        snprintf(out->content_type, sizeof out->content_type, "%.*s", (int)strcspn(ct, "\r\n"), ct);
    out->len = len - body_at;
    out->body = malloc(out->len + 1);
    memcpy(out->body, buf + body_at, out->len);
    out->body[out->len] = '\0';
    free(buf);
    return 0;
}

/* ---- the exposition format ----------------------------------------------------------- */

enum { MAX_FAMILIES = 128 };

typedef struct family {
    char name[128];
    char type[16];
} family;

static int fail_line(char *why, size_t whylen, int lineno, const char *line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int fail_line(char *why, size_t whylen, int lineno, const char *line, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(why, whylen, "line %d: %s: '%.120s'", lineno, what, line);
    return -1;
}

static int name_char(int c, int first)
{
    return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

/* Reads a metric name at p; returns its length (0 if none). */
static size_t read_name(const char *p)
{
    size_t i = 0;
    while (name_char((unsigned char)p[i], i == 0))
        i++;
    return i;
}

static int parse_value(const char *s, double *v)
{
    if (strcmp(s, "+Inf") == 0) {
        *v = INFINITY;
        return 0;
    }
    if (strcmp(s, "-Inf") == 0) {
        *v = -INFINITY;
        return 0;
    }
    if (strcmp(s, "NaN") == 0) {
        *v = NAN;
        return 0;
    }
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return errno == 0 && end != s && *end == '\0' ? 0 : -1;
}

/* The family a sample belongs to: its name less a histogram suffix when one applies. */
static const family *family_of(const family *fams, int nf, const char *name)
{
    for (int i = 0; i < nf; i++)
        if (strcmp(fams[i].name, name) == 0)
            return &fams[i];
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (size_t k = 0; k < 3; k++) {
        size_t nl = strlen(name), sl = strlen(suffixes[k]);
        if (nl <= sl || strcmp(name + nl - sl, suffixes[k]) != 0)
            continue;
        for (int i = 0; i < nf; i++)
            if (strlen(fams[i].name) == nl - sl && strncmp(fams[i].name, name, nl - sl) == 0 &&
                strcmp(fams[i].type, "histogram") == 0)
                return &fams[i];
    }
    return NULL;
}

static int parse_sample(const char *line, int lineno, const family *fams, int nf, ts_sample *s,
                        char *why, size_t whylen)
{
    size_t nl = read_name(line);
    if (nl == 0 || nl >= sizeof s->name)
        return fail_line(why, whylen, lineno, line, "no metric name");
    memcpy(s->name, line, nl);
    s->name[nl] = '\0';
    /* process_*: the names every Prometheus client library gives a process's own figures */
    if (strncmp(s->name, "gpucd_", 6) != 0 && strncmp(s->name, "process_", 8) != 0)
        return fail_line(why, whylen, lineno, line, "name without the gpucd_ or process_ prefix");
    if (family_of(fams, nf, s->name) == NULL)
        return fail_line(why, whylen, lineno, line, "sample before its # TYPE line");
    const char *p = line + nl;
    if (*p == '{') {
        p++;
        while (*p != '}') {
            size_t ln = read_name(p);
            if (ln == 0 || (p[0] == '_' && p[1] == '_'))
                return fail_line(why, whylen, lineno, line, "bad label name");
            p += ln;
            if (p[0] != '=' || p[1] != '"')
                return fail_line(why, whylen, lineno, line, "label without =\"value\"");
            p += 2;
            while (*p != '"') {
                if (*p == '\0' || *p == '\n')
                    return fail_line(why, whylen, lineno, line, "unterminated label value");
                if (*p == '\\') {
                    if (p[1] != '\\' && p[1] != '"' && p[1] != 'n')
                        return fail_line(why, whylen, lineno, line, "bad escape in label value");
                    p++;
                }
                p++;
            }
            p++;
            if (*p == ',')
                p++;
            else if (*p != '}')
                return fail_line(why, whylen, lineno, line, "expected , or } after a label");
        }
        p++;
    }
    size_t series_len = (size_t)(p - line);
    if (series_len >= sizeof s->series)
        return fail_line(why, whylen, lineno, line, "series too long");
    memcpy(s->series, line, series_len);
    s->series[series_len] = '\0';
    if (*p != ' ')
        return fail_line(why, whylen, lineno, line, "no space before the value");
    p++;
    char value[64];
    size_t vl = strcspn(p, " ");
    if (vl == 0 || vl >= sizeof value)
        return fail_line(why, whylen, lineno, line, "no value");
    memcpy(value, p, vl);
    value[vl] = '\0';
    if (parse_value(value, &s->value) != 0)
        return fail_line(why, whylen, lineno, line, "value is not a number");
    if (p[vl] == ' ') { /* an optional integer timestamp */
        const char *ts = p + vl + 1;
        if (*ts == '-')
            ts++;
        if (*ts == '\0' || strspn(ts, "0123456789") != strlen(ts))
            return fail_line(why, whylen, lineno, line, "bad timestamp");
    }
    return 0;
}

static int parse_comment(const char *line, int lineno, family *fams, int *nf, char *why,
                         size_t whylen)
{
    int help = strncmp(line, "# HELP ", 7) == 0, type = strncmp(line, "# TYPE ", 7) == 0;
    if (!help && !type)
        return 0; /* any other comment is allowed */
    const char *p = line + 7;
    size_t nl = read_name(p);
    if (nl == 0 || nl >= sizeof fams[0].name || (p[nl] != ' ' && p[nl] != '\0'))
        return fail_line(why, whylen, lineno, line, "bad metric name in a comment");
    if (help)
        return 0;
    const char *t = p + nl + 1;
    if (strcmp(t, "counter") != 0 && strcmp(t, "gauge") != 0 && strcmp(t, "histogram") != 0 &&
        strcmp(t, "summary") != 0 && strcmp(t, "untyped") != 0)
        return fail_line(why, whylen, lineno, line, "unknown metric type");
    for (int i = 0; i < *nf; i++)
        if (strlen(fams[i].name) == nl && strncmp(fams[i].name, p, nl) == 0)
            return fail_line(why, whylen, lineno, line, "a second TYPE for one family");
    if (*nf >= MAX_FAMILIES)
        return fail_line(why, whylen, lineno, line, "too many families");
    memcpy(fams[*nf].name, p, nl);
    fams[*nf].name[nl] = '\0';
    snprintf(fams[*nf].type, sizeof fams[*nf].type, "%s", t);
    if (strcmp(t, "counter") == 0 && (nl < 6 || strncmp(p + nl - 6, "_total", 6) != 0))
        return fail_line(why, whylen, lineno, line, "a counter whose name does not end in _total");
    (*nf)++;
    return 0;
}

/* The series' labels without le="...", to group a histogram's buckets. */
static void strip_le(const char *series, char *out, size_t outlen)
{
    const char *le = strstr(series, "le=\"");
    if (le == NULL) {
        snprintf(out, outlen, "%s", series);
        return;
    }
    const char *end = strchr(le + 4, '"') + 1;
    size_t keep = (size_t)(le - series);
    if (le[-1] == ',')
        keep--; /* drop the comma before le */
    else if (*end == ',')
        end++; /* le came first: drop the comma after it */
    snprintf(out, outlen, "%.*s%s", (int)keep, series, end);
}

/* Buckets cumulative and +Inf == _count, for every histogram series. */
static int check_histograms(const ts_metrics *m, char *why, size_t whylen)
{
    for (size_t i = 0; i < m->n; i++) {
        const ts_sample *b = &m->s[i];
        size_t nl = strlen(b->name);
        if (nl < 7 || strcmp(b->name + nl - 7, "_bucket") != 0 || strstr(b->series, "le=\"+Inf\"") == NULL)
            continue;
        char group[256];
        strip_le(b->series, group, sizeof group);
        double prev = -1;
        for (size_t j = 0; j < m->n; j++) {
            char g[256];
            if (strcmp(m->s[j].name, b->name) != 0)
                continue;
            strip_le(m->s[j].series, g, sizeof g);
            if (strcmp(g, group) != 0)
                continue;
            if (m->s[j].value < prev) {
                snprintf(why, whylen, "%s: buckets not cumulative", m->s[j].series);
                return -1;
            }
            prev = m->s[j].value;
        }
        /* group is "name_bucket{labels}" less le; the count series is "name_count{labels}" */
        char count[300];
        const char *brace = strchr(group, '{');
        snprintf(count, sizeof count, "%.*s_count%s", (int)(nl - 7), b->name,
                 brace != NULL && strcmp(brace, "{}") != 0 ? brace : "");
        if (ts_metric(m, count) != b->value) {
            snprintf(why, whylen, "%s = %g but %s = %g", b->series, b->value, count,
                     ts_metric(m, count));
            return -1;
        }
    }
    return 0;
}

int ts_metrics_parse(const char *text, ts_metrics *out, char *why, size_t whylen)
{
    memset(out, 0, sizeof *out);
    family fams[MAX_FAMILIES];
    int nf = 0, lineno = 0;
    size_t cap = 0;
    if (text[0] == '\0' || text[strlen(text) - 1] != '\n') {
        snprintf(why, whylen, "the document does not end in a newline");
        return -1;
    }
    const char *p = text;
    while (*p != '\0') {
        const char *nl = strchr(p, '\n');
        size_t len = (size_t)(nl - p);
        char line[1024];
        lineno++;
        if (len >= sizeof line) {
            snprintf(why, whylen, "line %d is too long", lineno);
            goto fail;
        }
        memcpy(line, p, len);
        line[len] = '\0';
        p = nl + 1;
        if (len == 0)
            continue;
        if (line[0] == '#') {
            if (parse_comment(line, lineno, fams, &nf, why, whylen) != 0)
                goto fail;
            continue;
        }
        if (out->n == cap) {
            cap = cap ? cap * 2 : 256;
            out->s = realloc(out->s, cap * sizeof *out->s);
        }
        if (parse_sample(line, lineno, fams, nf, &out->s[out->n], why, whylen) != 0)
            goto fail;
        for (size_t i = 0; i < out->n; i++)
            if (strcmp(out->s[i].series, out->s[out->n].series) == 0) {
                fail_line(why, whylen, lineno, line, "a series given twice");
                goto fail;
            }
        out->n++;
    }
    if (check_histograms(out, why, whylen) != 0)
        goto fail;
    return 0;
fail:
    ts_metrics_free(out);
    return -1;
}

void ts_metrics_free(ts_metrics *m)
{
    free(m->s);
    memset(m, 0, sizeof *m);
}

double ts_metric(const ts_metrics *m, const char *series)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->s[i].series, series) == 0)
            return m->s[i].value;
    return 0;
}

double ts_metric_sum(const ts_metrics *m, const char *name, const char *const *has)
{
    double sum = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->s[i].name, name) != 0)
            continue;
        int all = 1;
        for (int k = 0; has != NULL && has[k] != NULL; k++)
            if (strstr(m->s[i].series, has[k]) == NULL)
                all = 0;
        if (all)
            sum += m->s[i].value;
    }
    return sum;
}

void ts_scrape(int port, ts_metrics *out)
{
    ts_http r;
    if (ts_http_get(port, "/metrics", &r) != 0)
        fail_msg("GET /metrics on port %d: no answer", port);
    if (r.status != 200)
        fail_msg("GET /metrics: status %d", r.status);
    if (strncmp(r.content_type, "text/plain; version=0.0.4", 25) != 0)
        fail_msg("GET /metrics: content type '%s'", r.content_type);
    char why[512];
    if (ts_metrics_parse(r.body, out, why, sizeof why) != 0)
        fail_msg("/metrics is not valid exposition format: %s", why);
    ts_http_free(&r);
}
