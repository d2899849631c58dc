/*
 * listen_explain.h - what to do about a listener that cannot start.
 *
 * nng reports a taken address as "Address in use" and a socket path whose
 * folder is missing as "Entry not found", which name neither the process in
 * the way nor the folder.  This looks them up:
 *
 * - ipc:// in use: nng has already removed a stale socket file (it connects,
 *   and unlinks the path when the connection is refused), so something
 *   answers there, or the path could not be removed.  A connection tells
 *   which, and SO_PEERCRED names the process that listens.
 * - tcp://, tls+tcp:// and http:// in use: the listening socket of that port
 *   in /proc/net/tcp and tcp6, and the process holding it by its descriptors
 *   under /proc (found for the daemon's own uid, or as root; otherwise its
 *   uid, and the `ss` command that names it).
 * - ipc:// not found, or not permitted: the socket's folder, and how it is
 *   made (systemd's RuntimeDirectory=, or by hand).
 *
 * nng's stale-socket check also removes whatever else is at an ipc:// path
 * (connecting to a regular file is refused too), so a mistyped --listen
 * would delete a file: gcd_listen_path_check refuses such a path first.
 */
#ifndef GCD_LISTEN_EXPLAIN_H
#define GCD_LISTEN_EXPLAIN_H

#include <stddef.h>

/*
 * The message for a listener at url that failed with nng error rv: "cannot <what> on url",
 * nng's error, and what stands in the way and what to do where that is known; flag is the
 * option that gave url ("--listen").
 */
void gcd_listen_error(const char *what, const char *url, int rv, const char *flag, char *err,
                      size_t errlen);

/*
 * For an ipc:// url: -1 with a message in out when something other than a socket is at its
 * path (nng would remove it to listen there); else 0.
 */
int gcd_listen_path_check(const char *url, const char *flag, char *out, size_t outlen);

#endif
