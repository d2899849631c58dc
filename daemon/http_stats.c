/*
 * http_stats.c - see http_stats.h.  Each handler builds its whole answer in
 * the nng callback: the documents are small and built from relaxed atomic
 * loads and two short table locks, so nothing here waits on the request path.
 */
#include "http_stats.h"

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "listen_explain.h"
#include "log.h"
#include "metrics.h"
#include "request.h"

struct gcd_http_stats {
    nng_http_server *server;
    nng_url *url;
};

/* Sends status with body (copied) as the handler's answer. */
static void answer(nng_aio *aio, uint16_t status, const char *content_type, const char *body,
                   size_t len)
{
    nng_http_res *res;
    int rv = nng_http_res_alloc(&res);
    if (rv == 0)
        rv = nng_http_res_set_status(res, status);
    if (rv == 0)
        rv = nng_http_res_set_header(res, "Content-Type", content_type);
    if (rv == 0)
        rv = nng_http_res_set_header(res, "Cache-Control", "no-store");
    if (rv == 0)
        rv = nng_http_res_copy_data(res, body, len);
    if (rv != 0) {
        if (res != NULL)
            nng_http_res_free(res);
        nng_aio_finish(aio, rv);
        return;
    }
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static gcd_daemon *handler_daemon(nng_aio *aio)
{
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    return nng_http_handler_get_data(h);
}

static void on_metrics(nng_aio *aio)
{
    size_t len;
    char *text = gcd_metrics_text(handler_daemon(aio), &len);
    if (text == NULL) {
        static const char oom[] = "out of memory\n";
        answer(aio, NNG_HTTP_STATUS_INTERNAL_SERVER_ERROR, "text/plain", oom, sizeof oom - 1);
        return;
    }
    answer(aio, NNG_HTTP_STATUS_OK, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

static void on_stats(nng_aio *aio)
{
    char *json = gcd_stats_json(handler_daemon(aio));
    if (json == NULL) {
        static const char oom[] = "{\"error\":\"out of memory\"}\n";
        answer(aio, NNG_HTTP_STATUS_INTERNAL_SERVER_ERROR, "application/json", oom,
               sizeof oom - 1);
        return;
    }
    answer(aio, NNG_HTTP_STATUS_OK, "application/json", json, strlen(json));
    free(json);
}

static void on_live(nng_aio *aio)
{
    static const char ok[] = "live\n";
    answer(aio, NNG_HTTP_STATUS_OK, "text/plain", ok, sizeof ok - 1);
}

static void on_ready(nng_aio *aio)
{
    gcd_daemon *d = handler_daemon(aio);
    static const char ready[] = "ready\n", starting[] = "starting\n", draining[] = "draining\n";
    if (atomic_load(&d->ready))
        answer(aio, NNG_HTTP_STATUS_OK, "text/plain", ready, sizeof ready - 1);
    else if (atomic_load(&d->draining))
        answer(aio, NNG_HTTP_STATUS_SERVICE_UNAVAILABLE, "text/plain", draining,
               sizeof draining - 1);
    else
        answer(aio, NNG_HTTP_STATUS_SERVICE_UNAVAILABLE, "text/plain", starting,
               sizeof starting - 1);
}

static void on_index(nng_aio *aio)
{
    static const char index[] = "gpucd: /metrics /stats /health/live /health/ready\n";
    answer(aio, NNG_HTTP_STATUS_OK, "text/plain", index, sizeof index - 1);
}

static const struct {
    const char *path;
    void (*cb)(nng_aio *);
} routes[] = {
    {"/", on_index},
    {"/metrics", on_metrics},
    {"/stats", on_stats},
    {"/health/live", on_live},
    {"/health/ready", on_ready},
};

int gcd_http_stats_start(gcd_http_stats **out, gcd_daemon *d, const char *url, char *err,
                         size_t errlen)
{
    *out = NULL;
    if (strcmp(url, "none") == 0) {
        gcd_log_info("stats endpoint disabled (--stats-listen none)");
        return 0;
    }
    gcd_http_stats *h = calloc(1, sizeof *h);
    if (h == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rv = nng_url_parse(&h->url, url);
    if (rv == 0 && strcmp(h->url->u_scheme, "http") != 0)
        rv = NNG_EADDRINVAL;
    if (rv != 0) {
        snprintf(err, errlen, "--stats-listen %s: %s", url, nng_strerror(rv));
        goto fail;
    }
    if ((rv = nng_http_server_hold(&h->server, h->url)) != 0) {
        snprintf(err, errlen, "--stats-listen %s: %s", url, nng_strerror(rv));
        goto fail;
    }
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        nng_http_handler *hd;
        if ((rv = nng_http_handler_alloc(&hd, routes[i].path, routes[i].cb)) != 0) {
            snprintf(err, errlen, "stats endpoint %s: %s", routes[i].path, nng_strerror(rv));
            goto fail;
        }
        nng_http_handler_set_data(hd, d, NULL);
        /* Once added, the server owns the handler. */
        if ((rv = nng_http_server_add_handler(h->server, hd)) != 0) {
            nng_http_handler_free(hd);
            snprintf(err, errlen, "stats endpoint %s: %s", routes[i].path, nng_strerror(rv));
            goto fail;
        }
    }
    if ((rv = nng_http_server_start(h->server)) != 0) {
        gcd_listen_error("serve stats", url, rv, "--stats-listen", err, errlen);
        goto fail;
    }
    gcd_log_info("stats endpoint on %s (/metrics /stats /health/live /health/ready)", url);
    *out = h;
    return 0;
fail:
    if (h->server != NULL)
        nng_http_server_release(h->server);
    if (h->url != NULL)
        nng_url_free(h->url);
    free(h);
    return -1;
}

void gcd_http_stats_stop(gcd_http_stats *h)
{
    if (h == NULL)
        return;
    nng_http_server_stop(h->server);
    nng_http_server_release(h->server);
    nng_url_free(h->url);
    free(h);
}
