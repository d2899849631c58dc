/*
 * socket_dir.h - whether a folder may hold a user's ipc:// socket; never installed.
 *
 * The default socket folder (/tmp/gpucd-<uid>, or $XDG_RUNTIME_DIR) is one anybody could
 * have made first: made by another user, or writable by one, it lets them put their own
 * server at the daemon's address.  The daemon refuses to listen in such a folder and the
 * client library to dial into one.  A folder named by --listen is checked too, less strictly.
 */
#ifndef GPUCDC_SOCKET_DIR_H
#define GPUCDC_SOCKET_DIR_H

#include <stddef.h>
#include <sys/types.h>

/*
 * 0 when dir is a directory (not a symbolic link) owned by uid that group and others cannot
 * write; else a message naming dir and what is wrong in why, and -ENOENT when it does not
 * exist, -1 otherwise.
 */
int gpucdc_socket_dir_check(const char *dir, uid_t uid, char *why, size_t whylen);

/*
 * The same for a folder named by --listen, which may also be root's (/run), and writable by
 * group or others when its sticky bit keeps them from removing or renaming what is not theirs
 * (/tmp): nobody else can then replace the daemon's socket.
 */
int gpucdc_socket_dir_check_given(const char *dir, uid_t uid, char *why, size_t whylen);

/* The folder of an ipc:// URL's socket into dir; -1 when url is no ipc:// URL with a folder. */
int gpucdc_socket_dir_of(const char *url, char *dir, size_t len);

#endif
