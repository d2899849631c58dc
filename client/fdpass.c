/*
 * fdpass.c - the client's side of the daemon's descriptor socket
 * (proto/fdpass_wire.h): one connection an exchange, bounded by the client's
 * timeout.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"

/* The descriptor received with the answer (-1: none); every other one is closed. */
static int answer_fd(struct msghdr *mh)
{
    int kept = -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm != NULL; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        const size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (kept < 0)
                kept = fd;
            else
                close(fd);
        }
    }
    return kept;
}

/* A signal the application handles must not fail the exchange. */
static ssize_t send_retrying(int s, const struct msghdr *mh)
{
    ssize_t n;
    while ((n = sendmsg(s, mh, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    return n;
}

int gpucdc_fdpass(gpucd_client *c, const char *op, const fdpass_request *req, int fd,
                  fdpass_answer *ans, int *got)
{
    *got = -1;
    if (c->fd_path[0] == '\0')
        return gpucdc_fail(c->local ? GPUCD_EADDRESS : GPUCD_EPERMISSION_DENIED,
                           "%s: shared memory needs a daemon at an ipc:// URL whose path, with "
                           "'" FDPASS_SUFFIX "', fits a Unix socket",
                           op);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0)
        return gpucdc_fail(GPUCD_ESYSTEM, "%s: socket: %s", op, strerror(errno));
    const long ms = c->timeout_ms == NNG_DURATION_INFINITE ? GPUCDC_DEFAULT_TIMEOUT_MS
                                                           : (long)c->timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, c->fd_path, sizeof sa.sun_path);
    union {
        char bytes[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {(void *)req, sizeof *req};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        mh.msg_control = ctl.bytes;
        mh.msg_controllen = sizeof ctl.bytes;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    }
    int rv = 0;
    const char *what = "connect";
    if (setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        connect(s, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        (what = "send", send_retrying(s, &mh) != (ssize_t)sizeof *req))
        rv = -1;
    union {
        char bytes[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } in;
    struct iovec aiov = {ans, sizeof *ans};
    struct msghdr am = {.msg_iov = &aiov, .msg_iovlen = 1, .msg_control = in.bytes,
                        .msg_controllen = sizeof in.bytes};
    ssize_t n = -1;
    if (rv == 0) {
        what = "receive";
        while ((n = recvmsg(s, &am, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
            ;
        if (n >= 0)
            *got = answer_fd(&am);
    }
    const int err = errno;
    close(s);
    if (rv != 0 || n < 0)
        return gpucdc_fail(err == EAGAIN || err == EWOULDBLOCK ? GPUCD_ETIMEDOUT : GPUCD_ESYSTEM,
                           "%s: the daemon's descriptor socket %s: %s: %s", op, c->fd_path, what,
                           strerror(err));
    if (n != (ssize_t)sizeof *ans || ans->magic != FDPASS_MAGIC ||
        ans->version != FDPASS_VERSION) {
        rv = gpucdc_fail(GPUCD_EPROTO, "%s: the descriptor socket's answer is malformed", op);
    } else if (ans->status != GPUCD__V1__STATUS__OK) {
        ans->message[sizeof ans->message - 1] = '\0';
        rv = gpucdc_fail(gpucdc_status_code((int)ans->status), "%s: %s", op, ans->message);
    }
    if (rv != 0 && *got >= 0) {
        close(*got);
        *got = -1;
    }
    return rv;
}
