/* tls_config.c - see tls_config.h. */
#include "tls_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PEM files are small; a larger one is a wrong path, not a certificate. */
enum { TLS_PEM_MAX = 1 << 20 };

/* The whole file, NUL-terminated as nng wants PEM text; NULL with a message in err. */
static char *pem_read(const char *what, const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(TLS_PEM_MAX + 1);
    size_t n = buf != NULL ? fread(buf, 1, TLS_PEM_MAX + 1, f) : 0;
    int bad = buf == NULL || ferror(f) || n > TLS_PEM_MAX;
    fclose(f);
    if (bad) {
        snprintf(err, errlen, "%s %s: %s", what, path,
                 buf == NULL ? "out of memory" : n > TLS_PEM_MAX ? "larger than 1 MiB" : "read error");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* The own certificate and key; the key's bytes are wiped before they are freed. */
static int own_cert_load(nng_tls_config *cfg, const char *cert_file, const char *key_file,
                         char *err, size_t errlen)
{
    size_t clen, klen;
    char *cert = pem_read("certificate", cert_file, &clen, err, errlen);
    if (cert == NULL)
        return NNG_ENOENT;
    char *key = pem_read("key", key_file, &klen, err, errlen);
    if (key == NULL) {
        free(cert);
        return NNG_ENOENT;
    }
    int rv = nng_tls_config_own_cert(cfg, cert, key, NULL);
    if (rv != 0)
        snprintf(err, errlen,
                 "certificate %s with key %s: not a PEM certificate and its unencrypted "
                 "private key (%s)",
                 cert_file, key_file, nng_strerror(rv));
    explicit_bzero(key, klen);
    free(key);
    free(cert);
    return rv;
}

int tls_config_load(nng_tls_config **out, nng_tls_mode mode, nng_tls_auth_mode auth,
                    const char *ca_file, const char *cert_file, const char *key_file,
                    const char *server_name, char *err, size_t errlen)
{
    *out = NULL;
    if ((cert_file == NULL) != (key_file == NULL)) {
        snprintf(err, errlen, "a certificate needs its key and a key its certificate");
        return NNG_EINVAL;
    }
    nng_tls_config *cfg;
    int rv = nng_tls_config_alloc(&cfg, mode);
    if (rv != 0) {
        snprintf(err, errlen, "cannot make a TLS configuration: %s", nng_strerror(rv));
        return rv;
    }
    if ((rv = nng_tls_config_auth_mode(cfg, auth)) != 0) {
        snprintf(err, errlen, "TLS peer authentication mode: %s", nng_strerror(rv));
        goto fail;
    }
    if (ca_file != NULL && (rv = nng_tls_config_ca_file(cfg, ca_file)) != 0) {
        snprintf(err, errlen, "CA file %s: cannot be read as PEM certificates (%s)", ca_file,
                 nng_strerror(rv));
        goto fail;
    }
    if (cert_file != NULL && (rv = own_cert_load(cfg, cert_file, key_file, err, errlen)) != 0)
        goto fail;
    if (server_name != NULL && (rv = nng_tls_config_server_name(cfg, server_name)) != 0) {
        snprintf(err, errlen, "TLS server name %s: %s", server_name, nng_strerror(rv));
        goto fail;
    }
    *out = cfg;
    return 0;
fail:
    nng_tls_config_free(cfg);
    return rv;
}
