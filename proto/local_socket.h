/*
 * local_socket.h - where the local (ipc://) socket lives, for the daemon and the client alike:
 * the default URL, and whether a folder may hold a user's socket; never installed.
 *
 * The default socket folder (/tmp/gpucd-<uid>, or $XDG_RUNTIME_DIR) is one anybody could
 * have made first: made by another user, or writable by one, it lets them put their own
 * server at the daemon's address.  The daemon refuses to listen in such a folder and the
 * client library to dial into one.  A folder named by --listen is checked too, less strictly.
 */
#ifndef GCD_LOCAL_SOCKET_H
#define GCD_LOCAL_SOCKET_H

#include <stddef.h>
#include <sys/types.h>

/*
 * 0 when dir is a directory (not a symbolic link) owned by uid that group and others cannot
 * write; else a message naming dir and what is wrong in why, and -ENOENT when it does not
 * exist, -1 otherwise.
 */
int local_socket_dir_check(const char *dir, uid_t uid, char *why, size_t whylen);

/*
 * The same for a folder named by --listen, which may also be root's (/run), and writable by
 * group or others when its sticky bit keeps them from removing or renaming what is not theirs
 * (/tmp): nobody else can then replace the daemon's socket.
 */
int local_socket_dir_check_given(const char *dir, uid_t uid, char *why, size_t whylen);

/* $GPUCD_URL when set and not empty (an operator's choice, not checked as the built-in is),
 * else NULL. */
const char *local_socket_url_from_environment(void);

/*
 * The default URL into buf: $GPUCD_URL, else ipc://$XDG_RUNTIME_DIR/gpucd.sock when
 * XDG_RUNTIME_DIR is an absolute path, else ipc:///tmp/gpucd-<uid>/gpucd.sock.  0, or -1 when
 * it does not fit in len bytes.
 */
int local_socket_default_url(char *buf, size_t len);

/* The folder of an ipc:// URL's socket into dir; -1 when url is no ipc:// URL with a folder. */
int local_socket_dir_of(const char *url, char *dir, size_t len);

#endif
