/* tls.c - the dialer's TLS for tls+tcp:// URLs: whom to trust, what to show, which name to expect. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tls_config.h"

/* The option, else the environment variable; an empty one is unset. */
static const char *tls_file(const char *opt, const char *env)
{
    const char *v = opt != NULL ? opt : getenv(env);
    return v != NULL && *v != '\0' ? v : NULL;
}

/* HOST of tls+tcp://HOST:PORT, [brackets] of an IPv6 address taken off. */
static int url_host(const char *url, char *host, size_t len)
{
    const char *h = url + strlen("tls+tcp://");
    const char *end;
    if (*h == '[') {
        h++;
        end = strchr(h, ']');
    } else {
        end = strrchr(h, ':');
    }
    if (end == NULL || end == h || (size_t)(end - h) >= len)
        return -1;
    memcpy(host, h, (size_t)(end - h));
    host[end - h] = '\0';
    return 0;
}

int gpucdc_tls_dialer(nng_dialer dialer, const char *url, const gpucd_options *opts)
{
    const char *ca = tls_file(opts->tls_ca, "GPUCD_TLS_CA");
    const char *cert = tls_file(opts->tls_cert, "GPUCD_TLS_CERT");
    const char *key = tls_file(opts->tls_key, "GPUCD_TLS_KEY");
    if (ca == NULL)
        return gpucdc_fail(GPUCD_EINVAL,
                           "gpucd_connect: %s: tls+tcp:// needs the CA that signs the daemon's "
                           "certificate (gpucd_options.tls_ca or GPUCD_TLS_CA)",
                           url);
    if ((cert == NULL) != (key == NULL))
        return gpucdc_fail(GPUCD_EINVAL,
                           "gpucd_connect: a client certificate needs its key and a key its "
                           "certificate (gpucd_options.tls_cert and tls_key, or GPUCD_TLS_CERT "
                           "and GPUCD_TLS_KEY)");
    char host[256];
    if (url_host(url, host, sizeof host) != 0)
        return gpucdc_fail(GPUCD_EADDRESS, "gpucd_connect: '%s': expected tls+tcp://HOST:PORT",
                           url);
    /* The server's certificate must be signed by ca and name the host dialed. */
    nng_tls_config *cfg;
    char why[512];
    int rv = tls_config_load(&cfg, NNG_TLS_MODE_CLIENT, NNG_TLS_AUTH_MODE_REQUIRED, ca, cert, key,
                             host, why, sizeof why);
    if (rv != 0)
        return gpucdc_fail(rv == NNG_ENOMEM ? GPUCD_ENOMEM : GPUCD_EINVAL, "gpucd_connect: %s",
                           why);
    rv = nng_dialer_set_ptr(dialer, NNG_OPT_TLS_CONFIG, cfg); /* the dialer holds it now */
    nng_tls_config_free(cfg);
    if (rv != 0)
        return gpucdc_fail_nng(rv, "gpucd_connect", "setting the TLS configuration");
    return 0;
}
