/* local_socket.c - see local_socket.h. */
#include "local_socket.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* The checks of both kinds of folder; `given`: one named by --listen (see socket_dir.h). */
static int dir_check(const char *dir, uid_t uid, int given, char *why, size_t whylen)
{
    struct stat st;
    if (lstat(dir, &st) != 0) {
        const int e = errno;
        snprintf(why, whylen, "cannot inspect socket directory %s: %s", dir, strerror(e));
        return e == ENOENT ? -ENOENT : -1;
    }
    const int others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if (S_ISLNK(st.st_mode))
        snprintf(why, whylen, "socket directory %s is a symbolic link", dir);
    else if (!S_ISDIR(st.st_mode))
        snprintf(why, whylen, "socket directory %s is not a directory", dir);
    else if (st.st_uid != uid && !(given && st.st_uid == 0))
        snprintf(why, whylen, "socket directory %s is owned by uid %u, not by uid %u%s", dir,
                 (unsigned)st.st_uid, (unsigned)uid, given ? " or root" : "");
    else if (others_write && !(given && (st.st_mode & S_ISVTX) != 0))
        snprintf(why, whylen, "socket directory %s has mode %04o: group and others must not "
                              "write to it%s",
                 dir, (unsigned)(st.st_mode & 07777),
                 given ? " (unless its sticky bit is set, as /tmp's)" : "");
    else
        return 0;
    return -1;
}

int local_socket_dir_check(const char *dir, uid_t uid, char *why, size_t whylen)
{
    return dir_check(dir, uid, 0, why, whylen);
}

int local_socket_dir_check_given(const char *dir, uid_t uid, char *why, size_t whylen)
{
    return dir_check(dir, uid, 1, why, whylen);
}

int local_socket_dir_of(const char *url, char *dir, size_t len)
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

const char *local_socket_url_from_environment(void)
{
    const char *url = getenv("GPUCD_URL");
    return url != NULL && *url != '\0' ? url : NULL;
}

int local_socket_default_url(char *buf, size_t len)
{
    /* The XDG spec says to ignore a relative XDG_RUNTIME_DIR. */
    const char *xdg = getenv("XDG_RUNTIME_DIR"), *env = local_socket_url_from_environment();
    int n;
    if (env != NULL)
        n = snprintf(buf, len, "%s", env);
    else if (xdg != NULL && xdg[0] == '/')
        n = snprintf(buf, len, "ipc://%s/gpucd.sock", xdg);
    else
        n = snprintf(buf, len, "ipc:///tmp/gpucd-%lu/gpucd.sock", (unsigned long)getuid());
    return n < 0 || (size_t)n >= len ? -1 : 0;
}
