/* fake_daemon.c - see fake_daemon.h. */
#include "fake_daemon.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <nng/protocol/reqrep0/rep.h>

#include "fdpass_wire.h"

static atomic_int fake_counter;

void fake_reply_ok(fake_reply *out, const Gpucd__V1__Request *req)
{
    out->reply.id = req->id;
    out->reply.status = GPUCD__V1__STATUS__OK;
}

void fake_reply_status(fake_reply *out, const Gpucd__V1__Request *req, Gpucd__V1__Status status,
                       const char *message)
{
    out->reply.id = req->id;
    out->reply.status = status;
    out->reply.message = (char *)message;
}

static Gpucd__V1__TensorRef *output_next(fake_reply *out)
{
    size_t i = out->reply.n_outputs++;
    gpucd__v1__tensor_ref__init(&out->out_refs[i]);
    out->out_ptrs[i] = &out->out_refs[i];
    out->reply.outputs = out->out_ptrs;
    return &out->out_refs[i];
}

void fake_reply_output_payload(fake_reply *out, uint64_t offset)
{
    size_t i = out->reply.n_outputs;
    Gpucd__V1__TensorRef *ref = output_next(out);
    gpucd__v1__inline_slice__init(&out->out_slices[i]);
    out->out_slices[i].offset = offset;
    ref->where_case = GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD;
    ref->payload = &out->out_slices[i];
}

void fake_reply_output_resident(fake_reply *out, uint64_t id)
{
    Gpucd__V1__TensorRef *ref = output_next(out);
    ref->where_case = GPUCD__V1__TENSOR_REF__WHERE_RESIDENT;
    ref->resident = id;
}

void fake_reply_timings(fake_reply *out, const uint64_t us[6])
{
    gpucd__v1__timings__init(&out->timings);
    out->timings.queue_us = us[0];
    out->timings.copy_in_us = us[1];
    out->timings.compute_us = us[2];
    out->timings.copy_out_us = us[3];
    out->timings.batch_wait_us = us[4];
    out->timings.total_us = us[5];
    out->reply.timings = &out->timings;
}

void fake_reply_payload(fake_reply *out, const void *bytes, size_t len)
{
    free(out->payload);
    out->payload = malloc(len > 0 ? len : 1);
    if (len > 0)
        memcpy(out->payload, bytes, len);
    out->payload_len = len;
}

static void *fake_serve(void *arg)
{
    fake_daemon *fd = arg;
    for (;;) {
        nng_msg *msg;
        if (nng_recvmsg(fd->sock, &msg, 0) != 0)
            return NULL; /* closed */
        const uint8_t *header, *payload;
        size_t header_len, payload_len;
        const char *why;
        if (wire_split(nng_msg_body(msg), nng_msg_len(msg), &header, &header_len, &payload,
                       &payload_len, &why) != 0) {
            fprintf(stderr, "fake_daemon: bad framing from the client: %s\n", why);
            abort();
        }
        Gpucd__V1__Request *req = gpucd__v1__request__unpack(NULL, header_len, header);
        if (req == NULL) {
            fprintf(stderr, "fake_daemon: the client's request does not decode\n");
            abort();
        }
        fake_reply out;
        memset(&out, 0, sizeof out);
        gpucd__v1__reply__init(&out.reply);
        fake_action action;
        if (req->op_case == GPUCD__V1__REQUEST__OP_REGION_REGISTER && !fd->serves_regions) {
            fake_reply_status(&out, req, GPUCD__V1__STATUS__UNAVAILABLE,
                              "this fake daemon serves no regions");
            action = FAKE_REPLY;
        } else {
            action = fd->handler(fd->arg, req, payload, payload_len, &out);
            fd->requests++;
        }
        gpucd__v1__request__free_unpacked(req, NULL);
        nng_msg_free(msg);
        if (action == FAKE_DISCONNECT) {
            free(out.payload);
            nng_close(fd->sock);
            return NULL;
        }
        if (action == FAKE_SILENT) {
            free(out.payload);
            continue;
        }
        size_t hlen = protobuf_c_message_get_packed_size(&out.reply.base);
        size_t head = wire_payload_offset(hlen);
        nng_msg *rep;
        if (nng_msg_alloc(&rep, head + out.payload_len) != 0)
            abort();
        wire_pack_header(nng_msg_body(rep), &out.reply.base, hlen);
        if (out.payload_len > 0)
            memcpy((uint8_t *)nng_msg_body(rep) + head, out.payload, out.payload_len);
        free(out.payload);
        if (nng_sendmsg(fd->sock, rep, 0) != 0)
            nng_msg_free(rep);
    }
}

/* The descriptor socket: one message a connection, answered with the next token. */
static void *fake_side_serve(void *arg)
{
    fake_daemon *fd = arg;
    for (;;) {
        int s = accept4(fd->side, NULL, NULL, SOCK_CLOEXEC);
        if (s < 0)
            return NULL; /* shut down */
        fdpass_request req;
        union {
            char bytes[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } ctl;
        struct iovec iov = {&req, sizeof req};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.bytes,
                            .msg_controllen = sizeof ctl.bytes};
        fdpass_answer ans = {.magic = FDPASS_MAGIC, .version = FDPASS_VERSION};
        int got = -1;
        if (recvmsg(s, &mh, MSG_CMSG_CLOEXEC) == (ssize_t)sizeof req && CMSG_FIRSTHDR(&mh) != NULL)
            memcpy(&got, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof got);
        pthread_mutex_lock(&fd->fd_lock);
        if (req.op == FDPASS_OP_REGION && got >= 0 && fd->nfds < FAKE_FDS_MAX) {
            fd->fds[fd->nfds++] = got;
            ans.token = (uint64_t)fd->nfds;
        } else {
            if (got >= 0)
                close(got);
            ans.status = GPUCD__V1__STATUS__UNAVAILABLE;
            snprintf(ans.message, sizeof ans.message, "this fake daemon takes region memfds only");
        }
        pthread_mutex_unlock(&fd->fd_lock);
        if (send(s, &ans, sizeof ans, MSG_NOSIGNAL) != (ssize_t)sizeof ans)
            fprintf(stderr, "fake_daemon: the descriptor socket's answer was not sent\n");
        close(s);
    }
}

int fake_daemon_take_fd(fake_daemon *fd, uint64_t token)
{
    pthread_mutex_lock(&fd->fd_lock);
    int got = -1;
    if (token >= 1 && token <= (uint64_t)fd->nfds) {
        got = fd->fds[token - 1];
        fd->fds[token - 1] = -1;
    }
    pthread_mutex_unlock(&fd->fd_lock);
    return got;
}

static void side_start(fake_daemon *fd)
{
    snprintf(fd->dir, sizeof fd->dir, "/tmp/gpucd-fake-XXXXXX");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (mkdtemp(fd->dir) == NULL)
        abort();
    snprintf(fd->url, sizeof fd->url, "ipc://%s/d.sock", fd->dir);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/d.sock" FDPASS_SUFFIX, fd->dir);
    fd->side = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd->side < 0 || bind(fd->side, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(fd->side, 8) != 0 || pthread_create(&fd->side_thread, NULL, fake_side_serve, fd) != 0) {
        fprintf(stderr, "fake_daemon: no descriptor socket at %s\n", sa.sun_path);
        abort();
    }
}

static void start(fake_daemon *fd, fake_handler handler, void *arg, bool serves_regions)
{
    memset(fd, 0, sizeof *fd);
    fd->side = -1;
    pthread_mutex_init(&fd->fd_lock, NULL);
    if (serves_regions)
        side_start(fd);
    else
        snprintf(fd->url, sizeof fd->url, "inproc://gpucd-fake-%d",
                 atomic_fetch_add(&fake_counter, 1));
    fd->handler = handler;
    fd->arg = arg;
    fd->serves_regions = serves_regions;
    if (nng_rep0_open(&fd->sock) != 0 || nng_socket_set_size(fd->sock, NNG_OPT_RECVMAXSZ, 0) != 0 ||
        nng_listen(fd->sock, fd->url, NULL, 0) != 0 ||
        pthread_create(&fd->thread, NULL, fake_serve, fd) != 0) {
        fprintf(stderr, "fake_daemon: cannot start at %s\n", fd->url);
        abort();
    }
}

void fake_daemon_start(fake_daemon *fd, fake_handler handler, void *arg)
{
    start(fd, handler, arg, false);
}

void fake_daemon_start_with_regions(fake_daemon *fd, fake_handler handler, void *arg)
{
    start(fd, handler, arg, true);
}

void fake_daemon_stop(fake_daemon *fd)
{
    if (fd->stopped)
        return;
    nng_close(fd->sock); /* harmless when the handler closed it already */
    pthread_join(fd->thread, NULL);
    if (fd->side >= 0) {
        shutdown(fd->side, SHUT_RDWR); /* ends the accept */
        pthread_join(fd->side_thread, NULL);
        close(fd->side);
        for (int i = 0; i < fd->nfds; i++)
            if (fd->fds[i] >= 0)
                close(fd->fds[i]);
        char path[128];
        snprintf(path, sizeof path, "%s/d.sock", fd->dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/d.sock" FDPASS_SUFFIX, fd->dir);
        unlink(path);
        rmdir(fd->dir);
    }
    pthread_mutex_destroy(&fd->fd_lock);
    fd->stopped = true;
}
