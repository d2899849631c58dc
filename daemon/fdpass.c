/* fdpass.c - see fdpass.h; the wire and why are proto/fdpass_wire.h's. */
#include "fdpass.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "fdpass_wire.h"
#include "log.h"
#include "submit_queue.h"

enum {
    FDS_MAX = 16, /* descriptors one message may bring (all closed but the one kept) */
    TICK_MS = 100, /* the longest poll while a deadline or expiry is due, looked at this often */
};

_Static_assert(GCD_MAX_LISTEN <= 16, "listeners fit the poll set's share");

typedef struct pending {
    uint64_t token; /* 0: a free entry */
    uid_t uid;
    int fd;
    dev_t dev;
    ino_t ino;
    uint64_t size;
    uint64_t expires_us;
} pending;

typedef struct side_conn {
    int fd; /* -1: a free entry */
    uid_t uid;
    uint64_t deadline_us, accepted_us;
} side_conn;

struct gcd_fdpass {
    gcd_regions *regions;
    int listeners[GCD_MAX_LISTEN];
    char paths[GCD_MAX_LISTEN][sizeof(((struct sockaddr_un *)0)->sun_path)];
    int nlisteners;
    side_conn conns[GCD_FDPASS_CONNS_MAX];
    int wake_fd; /* the daemon's wake page, -1 when there is none */
    dev_t wake_dev;
    ino_t wake_ino;
    int stop_fd; /* an eventfd: the thread returns when it is readable */
    pthread_t thread;
    int started;
    pthread_mutex_t lock; /* the pending table: the thread adds, workers claim */
    pending *pend;
    size_t npending;
};

int gcd_fdpass_init(gcd_fdpass **out, gcd_regions *regions)
{
    gcd_fdpass *fp = calloc(1, sizeof *fp);
    if (fp == NULL)
        return -1;
    fp->pend = calloc(GCD_FDPASS_PENDING_MAX, sizeof *fp->pend);
    fp->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fp->pend == NULL || fp->stop_fd < 0) {
        if (fp->stop_fd >= 0)
            close(fp->stop_fd);
        free(fp->pend);
        free(fp);
        return -1;
    }
    fp->regions = regions;
    fp->wake_fd = -1;
    for (int i = 0; i < GCD_FDPASS_CONNS_MAX; i++)
        fp->conns[i].fd = -1;
    pthread_mutex_init(&fp->lock, NULL);
    *out = fp;
    return 0;
}

int gcd_fdpass_listen(gcd_fdpass *fp, const char *ipc_path, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    const size_t n = strlen(ipc_path) + strlen(FDPASS_SUFFIX);
    if (n >= sizeof sa.sun_path) {
        snprintf(err, errlen, "cannot listen on %s" FDPASS_SUFFIX ": the descriptor socket's "
                              "path is %zu bytes, more than a Unix socket's %zu",
                 ipc_path, n, sizeof sa.sun_path - 1);
        return -1;
    }
    if (fp->nlisteners == GCD_MAX_LISTEN) {
        snprintf(err, errlen, "at most %d descriptor sockets", GCD_MAX_LISTEN);
        return -1;
    }
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s" FDPASS_SUFFIX, ipc_path);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
        snprintf(err, errlen, "cannot listen on %s: socket: %s", sa.sun_path, strerror(errno));
        return -1;
    }
    /* The ipc:// listener beside it started: the path is this daemon's, a file there stale. */
    unlink(sa.sun_path);
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || chmod(sa.sun_path, 0600) != 0 ||
        listen(s, GCD_FDPASS_CONNS_MAX) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", sa.sun_path, strerror(errno));
        close(s);
        return -1;
    }
    fp->listeners[fp->nlisteners] = s;
    memcpy(fp->paths[fp->nlisteners], sa.sun_path, sizeof sa.sun_path);
    fp->nlisteners++;
    gcd_log_info("descriptor socket on %s", sa.sun_path);
    return 0;
}

/* ---- the pending table ---------------------------------------------------------------- */

/* With the lock: closes and frees every entry expired by now (all of them: now UINT64_MAX). */
static void pending_sweep_locked(gcd_fdpass *fp, uint64_t now)
{
    for (size_t i = 0; i < GCD_FDPASS_PENDING_MAX && fp->npending > 0; i++) {
        pending *p = &fp->pend[i];
        if (p->token != 0 && p->expires_us <= now) {
            close(p->fd);
            p->token = 0;
            fp->npending--;
        }
    }
}

static gcd_status pending_add(gcd_fdpass *fp, uid_t uid, int fd, const struct stat *st,
                              uint64_t *token, char *why, size_t whylen)
{
    uint64_t t = 0;
    while (t == 0) /* 0 is no token */
        if (getrandom(&t, sizeof t, 0) != (ssize_t)sizeof t) {
            snprintf(why, whylen, "no random token: %s", strerror(errno));
            return GCD_INTERNAL;
        }
    gcd_status status = GCD_OK;
    pthread_mutex_lock(&fp->lock);
    size_t mine = 0, free_at = GCD_FDPASS_PENDING_MAX;
    for (size_t i = 0; i < GCD_FDPASS_PENDING_MAX; i++) {
        const pending *p = &fp->pend[i];
        if (p->token == 0) {
            if (free_at == GCD_FDPASS_PENDING_MAX)
                free_at = i;
            continue;
        }
        mine += p->uid == uid;
        if (p->dev == st->st_dev && p->ino == st->st_ino && status == GCD_OK) {
            snprintf(why, whylen, "this memfd is pending registration already (one object "
                                  "is one region)");
            status = GCD_INVALID_ARGUMENT;
        }
    }
    if (status == GCD_OK && mine >= GCD_FDPASS_PENDING_PER_UID) {
        snprintf(why, whylen, "uid %u has %d memfds waiting for their RegionRegister already",
                 (unsigned)uid, GCD_FDPASS_PENDING_PER_UID);
        status = GCD_RESOURCE_EXHAUSTED;
    } else if (status == GCD_OK && free_at == GCD_FDPASS_PENDING_MAX) {
        snprintf(why, whylen, "%d memfds are waiting for their RegionRegister already",
                 GCD_FDPASS_PENDING_MAX);
        status = GCD_RESOURCE_EXHAUSTED;
    }
    if (status == GCD_OK) {
        fp->pend[free_at] = (pending){.token = t, .uid = uid, .fd = fd, .dev = st->st_dev,
                                      .ino = st->st_ino, .size = (uint64_t)st->st_size,
                                      .expires_us = gcd_now_us() +
                                                    GCD_FDPASS_TOKEN_TTL_MS * 1000ull};
        fp->npending++;
        *token = t;
    }
    pthread_mutex_unlock(&fp->lock);
    return status;
}

gcd_status gcd_fdpass_claim(gcd_fdpass *fp, uint64_t token, uid_t uid, int *fd, uint64_t *size,
                            char *why, size_t whylen)
{
    gcd_status status = GCD_NOT_FOUND;
    pthread_mutex_lock(&fp->lock);
    pending_sweep_locked(fp, gcd_now_us());
    for (size_t i = 0; token != 0 && i < GCD_FDPASS_PENDING_MAX; i++) {
        pending *p = &fp->pend[i];
        if (p->token != token || p->uid != uid)
            continue;
        *fd = p->fd;
        *size = p->size;
        p->token = 0;
        fp->npending--;
        status = GCD_OK;
        break;
    }
    pthread_mutex_unlock(&fp->lock);
    if (status != GCD_OK)
        snprintf(why, whylen, "no memfd is pending under token %016llx for this uid (unknown, "
                              "expired after %d ms, or claimed); regions are sealed memfds "
                              "passed over the descriptor socket",
                 (unsigned long long)token, GCD_FDPASS_TOKEN_TTL_MS);
    return status;
}

/* ---- one message ------------------------------------------------------------------------ */

static gcd_status refuse(fdpass_answer *ans, gcd_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static gcd_status refuse(fdpass_answer *ans, gcd_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ans->message, sizeof ans->message, fmt, ap);
    va_end(ap);
    return st;
}

/*
 * Checks the region's memfd before anything maps it: sealed against resizing,
 * a regular file of the declared size within the limits, and no object the
 * daemon has already (a region, or its wake page).
 */
static gcd_status region_check(gcd_fdpass *fp, int fd, uint64_t size, struct stat *st,
                               fdpass_answer *ans)
{
    if (size == 0 || size > (uint64_t)SIZE_MAX / 2)
        return refuse(ans, GCD_INVALID_ARGUMENT, "region size %llu is out of range (1 to %zu)",
                      (unsigned long long)size, (size_t)SIZE_MAX / 2);
    const int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        return refuse(ans, GCD_INVALID_ARGUMENT,
                      "region is not a sealed memfd (needs F_SEAL_SHRINK|F_SEAL_GROW)");
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode))
        return refuse(ans, GCD_INVALID_ARGUMENT, "region is not a regular file");
    if ((uint64_t)st->st_size != size)
        return refuse(ans, GCD_INVALID_ARGUMENT, "region is %lld bytes, not the %llu declared",
                      (long long)st->st_size, (unsigned long long)size);
    if (fp->wake_fd >= 0 && st->st_dev == fp->wake_dev && st->st_ino == fp->wake_ino)
        return refuse(ans, GCD_INVALID_ARGUMENT, "region is the daemon's wake page");
    uint64_t id;
    if (gcd_regions_has_object(fp->regions, st->st_dev, st->st_ino, &id))
        return refuse(ans, GCD_INVALID_ARGUMENT,
                      "this memfd is registered already, as region %llu (one object is one "
                      "region)",
                      (unsigned long long)id);
    return GCD_OK;
}

/*
 * Serves one message: *keep is set when fds[0] became a pending entry (it is
 * then not closed), *give is the descriptor to send with the answer (-1: none).
 */
static gcd_status serve(gcd_fdpass *fp, const side_conn *c, const void *buf, ssize_t len,
                        int flags, const int *fds, int nfds, fdpass_answer *ans, int *keep,
                        int *give)
{
    fdpass_request req;
    if (flags & MSG_CTRUNC)
        return refuse(ans, GCD_BAD_MESSAGE, "the descriptors were truncated: send exactly "
                                            "one descriptor with a region");
    if ((flags & MSG_TRUNC) || len != (ssize_t)sizeof req)
        return refuse(ans, GCD_BAD_MESSAGE, "a request is %zu bytes, not %s%zd", sizeof req,
                      (flags & MSG_TRUNC) ? "more than " : "", len);
    memcpy(&req, buf, sizeof req);
    if (req.magic != FDPASS_MAGIC)
        return refuse(ans, GCD_BAD_MESSAGE, "bad magic %08x (expected %08x)", req.magic,
                      FDPASS_MAGIC);
    if (req.version != FDPASS_VERSION)
        return refuse(ans, GCD_VERSION_MISMATCH, "descriptor socket version %u; this daemon "
                                                 "speaks %d",
                      req.version, FDPASS_VERSION);
    if (req.op == FDPASS_OP_WAKE) {
        if (nfds != 0)
            return refuse(ans, GCD_BAD_MESSAGE, "a wake page request carries no descriptor");
        if (fp->wake_fd < 0)
            return refuse(ans, GCD_UNAVAILABLE, "submission queues are off (--submit-queues 0)");
        *give = fp->wake_fd;
        ans->size = SUBMIT_WAKE_BYTES;
        return GCD_OK;
    }
    if (req.op != FDPASS_OP_REGION)
        return refuse(ans, GCD_UNKNOWN_OPERATION, "no descriptor socket op %u", req.op);
    if (nfds != 1)
        return refuse(ans, GCD_BAD_MESSAGE, "a region request carries exactly one descriptor, "
                                            "not %d",
                      nfds);
    struct stat st;
    gcd_status s = region_check(fp, fds[0], req.size, &st, ans);
    if (s == GCD_OK)
        s = pending_add(fp, c->uid, fds[0], &st, &ans->token, ans->message, sizeof ans->message);
    *keep = s == GCD_OK;
    return s;
}

/* Takes the connection's message if it came (else leaves it waiting), answers, closes it. */
static void conn_read(gcd_fdpass *fp, side_conn *c)
{
    uint8_t buf[sizeof(fdpass_request) + 1];
    union {
        char bytes[CMSG_SPACE(FDS_MAX * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {buf, sizeof buf};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.bytes,
                        .msg_controllen = sizeof ctl.bytes};
    ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    int fds[FDS_MAX], nfds = 0;
    for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm != NULL;
         cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        const size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k && nfds < FDS_MAX; i++)
            memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
    }
    if (n > 0) {
        fdpass_answer ans = {.magic = FDPASS_MAGIC, .version = FDPASS_VERSION};
        int keep = 0, give = -1;
        ans.status = (uint32_t)serve(fp, c, buf, n, mh.msg_flags, fds, nfds, &ans, &keep, &give);
        if (ans.status != GCD_OK)
            gcd_log_debug("descriptor socket: uid %u refused: %s", (unsigned)c->uid,
                          ans.message);
        union {
            char bytes[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } out;
        struct iovec oiov = {&ans, sizeof ans};
        struct msghdr om = {.msg_iov = &oiov, .msg_iovlen = 1};
        if (give >= 0) {
            memset(&out, 0, sizeof out);
            om.msg_control = out.bytes;
            om.msg_controllen = sizeof out.bytes;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&om);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &give, sizeof give);
        }
        /* An answer is one small datagram on an empty socket: it never waits.  A token whose
         * answer is lost expires unclaimed. */
        if (sendmsg(c->fd, &om, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)sizeof ans)
            gcd_log_debug("descriptor socket: answer not sent: %s", strerror(errno));
        for (int i = keep; i < nfds; i++)
            close(fds[i]);
    } else {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
    }
    close(c->fd);
    c->fd = -1;
}

/* ---- the thread ------------------------------------------------------------------------- */

static void conn_accept(gcd_fdpass *fp, int listener)
{
    for (;;) {
        int s = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (s < 0)
            return; /* EAGAIN, or a connection that went away before it was taken */
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
            close(s);
            continue;
        }
        /* A free entry, else the oldest one's: a crowd of silent connections delays nobody
         * for longer than it takes to make more. */
        side_conn *slot = &fp->conns[0];
        for (int i = 0; i < GCD_FDPASS_CONNS_MAX; i++) {
            side_conn *c = &fp->conns[i];
            if (c->fd < 0) {
                slot = c;
                break;
            }
            if (c->accepted_us < slot->accepted_us)
                slot = c;
        }
        if (slot->fd >= 0)
            close(slot->fd);
        const uint64_t now = gcd_now_us();
        *slot = (side_conn){.fd = s, .uid = cred.uid, .accepted_us = now,
                            .deadline_us = now + GCD_FDPASS_CONN_DEADLINE_MS * 1000ull};
    }
}

static void *fdpass_main(void *arg)
{
    gcd_fdpass *fp = arg;
    struct pollfd pfd[1 + GCD_MAX_LISTEN + GCD_FDPASS_CONNS_MAX];
    side_conn *of[GCD_FDPASS_CONNS_MAX];
    for (;;) {
        int n = 0;
        pfd[n++] = (struct pollfd){.fd = fp->stop_fd, .events = POLLIN};
        for (int i = 0; i < fp->nlisteners; i++)
            pfd[n++] = (struct pollfd){.fd = fp->listeners[i], .events = POLLIN};
        int nconn = 0;
        for (int i = 0; i < GCD_FDPASS_CONNS_MAX; i++)
            if (fp->conns[i].fd >= 0) {
                of[nconn++] = &fp->conns[i];
                pfd[n++] = (struct pollfd){.fd = fp->conns[i].fd, .events = POLLIN};
            }
        pthread_mutex_lock(&fp->lock);
        const int idle = nconn == 0 && fp->npending == 0; /* no deadline to keep: sleep */
        pthread_mutex_unlock(&fp->lock);
        if (poll(pfd, (nfds_t)n, idle ? -1 : TICK_MS) < 0 && errno != EINTR) {
            gcd_log_error("descriptor socket: poll: %s", strerror(errno));
            return NULL;
        }
        if (pfd[0].revents != 0)
            return NULL;
        const int base = 1 + fp->nlisteners;
        for (int i = 0; i < nconn; i++)
            if (pfd[base + i].revents != 0)
                conn_read(fp, of[i]);
        const uint64_t now = gcd_now_us();
        for (int i = 0; i < GCD_FDPASS_CONNS_MAX; i++)
            if (fp->conns[i].fd >= 0 && fp->conns[i].deadline_us <= now) {
                close(fp->conns[i].fd);
                fp->conns[i].fd = -1;
            }
        for (int i = 0; i < fp->nlisteners; i++)
            if (pfd[1 + i].revents != 0)
                conn_accept(fp, fp->listeners[i]);
        pthread_mutex_lock(&fp->lock);
        pending_sweep_locked(fp, now);
        pthread_mutex_unlock(&fp->lock);
    }
}

int gcd_fdpass_start(gcd_fdpass *fp, int wake_fd, char *err, size_t errlen)
{
    struct stat st;
    if (wake_fd >= 0 && fstat(wake_fd, &st) == 0) {
        fp->wake_fd = wake_fd;
        fp->wake_dev = st.st_dev;
        fp->wake_ino = st.st_ino;
    }
    if (pthread_create(&fp->thread, NULL, fdpass_main, fp) != 0) {
        snprintf(err, errlen, "cannot start the descriptor socket's thread");
        return -1;
    }
    fp->started = 1;
    return 0;
}

void gcd_fdpass_free(gcd_fdpass *fp)
{
    if (fp == NULL)
        return;
    if (fp->started) {
        const uint64_t one = 1;
        if (write(fp->stop_fd, &one, sizeof one) != (ssize_t)sizeof one)
            gcd_log_error("descriptor socket: cannot stop its thread: %s", strerror(errno));
        pthread_join(fp->thread, NULL);
    }
    for (int i = 0; i < GCD_FDPASS_CONNS_MAX; i++)
        if (fp->conns[i].fd >= 0)
            close(fp->conns[i].fd);
    for (int i = 0; i < fp->nlisteners; i++) {
        close(fp->listeners[i]);
        unlink(fp->paths[i]);
    }
    pthread_mutex_lock(&fp->lock);
    pending_sweep_locked(fp, UINT64_MAX);
    pthread_mutex_unlock(&fp->lock);
    pthread_mutex_destroy(&fp->lock);
    close(fp->stop_fd);
    free(fp->pend);
    free(fp);
}
