/*
 * tls_config.h - an nng TLS configuration from PEM files, for the daemon's
 * tls+tcp:// listeners and the client library's tls+tcp:// dialer alike.
 */
#ifndef GPUCD_TLS_CONFIG_H
#define GPUCD_TLS_CONFIG_H

#include <stddef.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

/*
 * Makes a configuration for mode that checks the peer's certificate as auth says
 * against the CAs of ca_file (NULL: none; then auth must be NONE), presents the
 * certificate of cert_file with the private key of key_file (both NULL: none), and,
 * for a client, expects server_name in the server's certificate (NULL: not checked).
 * Returns 0 with *out (free with nng_tls_config_free), or an nng error with a message
 * naming the file in err.
 */
int tls_config_load(nng_tls_config **out, nng_tls_mode mode, nng_tls_auth_mode auth,
                    const char *ca_file, const char *cert_file, const char *key_file,
                    const char *server_name, char *err, size_t errlen);

#endif
