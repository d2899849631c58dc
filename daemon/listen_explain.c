/* listen_explain.c - see listen_explain.h. */
#include "listen_explain.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <nng/nng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* The process's name from /proc into comm ("" when unreadable). */
static void process_comm(pid_t pid, char *comm, size_t commlen)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    comm[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fgets(comm, (int)commlen, f) == NULL)
            comm[0] = '\0';
        fclose(f);
    }
    comm[strcspn(comm, "\n")] = '\0';
}

/* "another gpucd (pid 123)" or "another process (pid 123, name)". */
static void holder_name(pid_t pid, char *out, size_t outlen)
{
    char comm[64];
    process_comm(pid, comm, sizeof comm);
    if (strcmp(comm, "gpucd") == 0)
        snprintf(out, outlen, "another gpucd (pid %d)", (int)pid);
    else if (comm[0] != '\0')
        snprintf(out, outlen, "another process (pid %d, %s)", (int)pid, comm);
    else
        snprintf(out, outlen, "another process (pid %d)", (int)pid);
}

/* ---- ipc:// -------------------------------------------------------------------------- */

/* The folder of a socket path ("." for a relative path without one). */
static void path_dir(const char *path, char *out, size_t outlen)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(out, outlen, ".");
    else if (slash == path)
        snprintf(out, outlen, "/");
    else
        snprintf(out, outlen, "%.*s", (int)(slash - path), path);
}

static int ipc_in_use(const char *path, const char *flag, char *out, size_t outlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return -1;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    /*
     * A connection closed at once, as nng's own stale-socket check has just made: a gpucd
     * there may see its listener stop over it and re-creates it (listen_watch.h).
     */
    int connected = connect(s, (struct sockaddr *)&sa, sizeof sa) == 0;
    int why = errno;
    struct ucred cred = {0};
    socklen_t len = sizeof cred;
    int known = connected && getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
                cred.pid > 0;
    close(s);
    char holder[192];
    if (known && cred.pid == getpid()) {
        snprintf(out, outlen, "this daemon already listens at %s: give each %s its own path",
                 path, flag);
        return 0;
    }
    if (known) {
        holder_name(cred.pid, holder, sizeof holder);
        snprintf(out, outlen, "%s is listening at %s: stop it or give another %s", holder, path,
                 flag);
        return 0;
    }
    if (connected) {
        snprintf(out, outlen, "another process is listening at %s: stop it or give another %s",
                 path, flag);
        return 0;
    }
    struct stat st;
    if (lstat(path, &st) != 0) /* gone meanwhile: a retry may work */
        return -1;
    if (why == EACCES || why == EPERM) {
        snprintf(out, outlen,
                 "%s belongs to uid %u and this daemon (uid %u) may neither connect to it nor "
                 "remove it: stop its owner's daemon, or give another %s",
                 path, (unsigned)st.st_uid, (unsigned)geteuid(), flag);
        return 0;
    }
    snprintf(out, outlen,
             "nothing answers at %s (%s), but it could not be removed (its folder is not "
             "writable by uid %u): remove it, or give another %s",
             path, strerror(why), (unsigned)geteuid(), flag);
    return 0;
}

static int ipc_folder(const char *path, int rv, const char *flag, char *out, size_t outlen)
{
    char dir[128]; /* a socket path has at most 107 bytes */
    path_dir(path, dir, sizeof dir);
    struct stat st;
    if (rv == NNG_ENOENT && stat(dir, &st) != 0) {
        snprintf(out, outlen,
                 "the folder %s does not exist: under systemd the unit's RuntimeDirectory= "
                 "makes it (gpucd.service's makes /run/gpucd); run by hand, create it first "
                 "(mkdir -m 0700 %s) or give another %s",
                 dir, dir, flag);
        return 0;
    }
    if (rv == NNG_EPERM) {
        snprintf(out, outlen,
                 "this daemon (uid %u) may not make its socket in %s: run it as that folder's "
                 "owner, or give another %s",
                 (unsigned)geteuid(), dir, flag);
        return 0;
    }
    return -1;
}

/* ---- tcp:// and friends ----------------------------------------------------------------- */

/* The port of scheme://host:port[/...] (http:// without one: 80); -1 when none is there. */
static int url_port(const char *url)
{
    const char *p = strstr(url, "://");
    if (p == NULL)
        return -1;
    p += 3;
    const char *end = p + strcspn(p, "/");
    const char *colon = NULL;
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (rb != NULL && rb + 1 < end && rb[1] == ':')
            colon = rb + 1;
    } else {
        for (const char *q = p; q < end; q++)
            if (*q == ':')
                colon = q;
    }
    if (colon == NULL)
        return strncmp(url, "http://", 7) == 0 ? 80 : -1;
    long port = 0;
    for (const char *q = colon + 1; q < end; q++) {
        if (!isdigit((unsigned char)*q) || (port = port * 10 + (*q - '0')) > 65535)
            return -1;
    }
    return colon + 1 < end && port > 0 ? (int)port : -1;
}

enum { TCP_LISTEN = 0x0A };

/* A socket listening on port in /proc/net/tcp or tcp6: its inode and uid; 0 when found. */
static int tcp_listener_find(int port, unsigned long *inode, unsigned *uid)
{
    static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
        FILE *f = fopen(tables[t], "r");
        if (f == NULL)
            continue;
        char line[512];
        int found = 0;
        if (fgets(line, sizeof line, f) != NULL) { /* the heading */
            while (!found && fgets(line, sizeof line, f) != NULL) {
                unsigned lport, state;
                if (sscanf(line, " %*d: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x %*x:%*x %*x:%*x %*x "
                                 "%u %*d %lu",
                           &lport, &state, uid, inode) == 4 &&
                    lport == (unsigned)port && state == TCP_LISTEN)
                    found = 1;
            }
        }
        fclose(f);
        if (found)
            return 0;
    }
    return -1;
}

/* The process holding socket inode open, from the descriptors /proc shows us; -1: none seen. */
static pid_t socket_owner(unsigned long inode)
{
    char want[48];
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    DIR *proc = opendir("/proc");
    if (proc == NULL)
        return -1;
    pid_t owner = -1;
    struct dirent *pe;
    while (owner < 0 && (pe = readdir(proc)) != NULL) {
        if (!isdigit((unsigned char)pe->d_name[0]))
            continue;
        char fddir[300];
        snprintf(fddir, sizeof fddir, "/proc/%s/fd", pe->d_name);
        DIR *fds = opendir(fddir); /* another uid's: EACCES, unless root */
        if (fds == NULL)
            continue;
        struct dirent *fe;
        while (owner < 0 && (fe = readdir(fds)) != NULL) {
            char link[600], target[64];
            snprintf(link, sizeof link, "%s/%s", fddir, fe->d_name);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n <= 0)
                continue;
            target[n] = '\0';
            if (strcmp(target, want) == 0)
                owner = (pid_t)atoi(pe->d_name);
        }
        closedir(fds);
    }
    closedir(proc);
    return owner;
}

static int tcp_in_use(const char *url, const char *flag, char *out, size_t outlen)
{
    const int port = url_port(url);
    if (port < 0)
        return -1;
    unsigned long inode = 0;
    unsigned uid = 0;
    if (tcp_listener_find(port, &inode, &uid) != 0) {
        snprintf(out, outlen,
                 "port %d is taken; `ss -ltnp 'sport = :%d'` names the process holding it: stop "
                 "it or give another port to %s",
                 port, port, flag);
        return 0;
    }
    const pid_t pid = inode != 0 ? socket_owner(inode) : -1;
    if (pid == getpid()) {
        snprintf(out, outlen, "this daemon already listens on port %d: give each %s its own "
                              "port",
                 port, flag);
    } else if (pid > 0) {
        char holder[192];
        holder_name(pid, holder, sizeof holder);
        snprintf(out, outlen, "port %d is taken: %s listens on it; stop it or give another port "
                              "to %s",
                 port, holder, flag);
    } else {
        snprintf(out, outlen,
                 "port %d is taken by a socket of uid %u; `ss -ltnp 'sport = :%d'` (as root) "
                 "names its process: stop it or give another port to %s",
                 port, uid, port, flag);
    }
    return 0;
}

int gcd_listen_path_check(const char *url, const char *flag, char *out, size_t outlen)
{
    struct stat st;
    if (strncmp(url, "ipc://", 6) != 0 || lstat(url + 6, &st) != 0 || S_ISSOCK(st.st_mode))
        return 0;
    snprintf(out, outlen,
             "cannot listen on %s: %s is a %s, not a socket, and listening there would remove "
             "it; give another %s",
             url, url + 6, S_ISDIR(st.st_mode) ? "folder" : S_ISLNK(st.st_mode) ? "symbolic link"
                                                                                : "file",
             flag);
    return -1;
}

void gcd_listen_error(const char *what, const char *url, int rv, const char *flag, char *err,
                      size_t errlen)
{
    char why[768];
    int known = -1;
    if (strncmp(url, "ipc://", 6) == 0) {
        if (rv == NNG_EADDRINUSE)
            known = ipc_in_use(url + 6, flag, why, sizeof why);
        else
            known = ipc_folder(url + 6, rv, flag, why, sizeof why);
    } else if (rv == NNG_EADDRINUSE) {
        known = tcp_in_use(url, flag, why, sizeof why);
    }
    if (known == 0)
        snprintf(err, errlen, "cannot %s on %s (%s): %s", what, url, nng_strerror(rv), why);
    else
        snprintf(err, errlen, "cannot %s on %s: %s", what, url, nng_strerror(rv));
}
