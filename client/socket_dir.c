/* socket_dir.c - see socket_dir.h. */
#include "socket_dir.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int gpucdc_socket_dir_check(const char *dir, uid_t uid, char *why, size_t whylen)
{
    struct stat st;
    if (lstat(dir, &st) != 0) {
        const int e = errno;
        snprintf(why, whylen, "cannot inspect socket directory %s: %s", dir, strerror(e));
        return e == ENOENT ? -ENOENT : -1;
    }
    if (S_ISLNK(st.st_mode))
        snprintf(why, whylen, "socket directory %s is a symbolic link", dir);
    else if (!S_ISDIR(st.st_mode))
        snprintf(why, whylen, "socket directory %s is not a directory", dir);
    else if (st.st_uid != uid)
        snprintf(why, whylen, "socket directory %s is owned by uid %u, not by uid %u", dir,
                 (unsigned)st.st_uid, (unsigned)uid);
    else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
        snprintf(why, whylen, "socket directory %s has mode %04o: group and others must not "
                              "write to it",
                 dir, (unsigned)(st.st_mode & 07777));
    else
        return 0;
    return -1;
}

int gpucdc_socket_dir_of(const char *url, char *dir, size_t len)
{
    if (strncmp(url, "ipc://", 6) != 0)
        return -1;
    const char *path = url + 6, *slash = strrchr(path, '/');
    if (slash == NULL || slash == path || (size_t)(slash - path) >= len)
        return -1;
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    return 0;
}
