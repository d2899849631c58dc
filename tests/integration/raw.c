/* raw.c - see raw.h. */
#include "raw.h"

#include <errno.h>
#include <fcntl.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "wire.h"

void th_raw_open(th_raw *r, const char *url)
{
    memset(r, 0, sizeof *r);
    r->next_id = 1;
    snprintf(r->url, sizeof r->url, "%s", url);
    if (nng_req0_open(&r->sock) != 0 ||
        nng_socket_set_ms(r->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE) != 0 ||
        nng_socket_set_ms(r->sock, NNG_OPT_RECVTIMEO, 20000) != 0 ||
        nng_dial(r->sock, url, NULL, 0) != 0) {
        fprintf(stderr, "raw: cannot connect to %s\n", url);
        exit(1);
    }
}

void th_raw_close(th_raw *r) { nng_close(r->sock); }

Gpucd__V1__Reply *th_raw_send_bytes(th_raw *r, const void *bytes, size_t len, int *err)
{
    nng_msg *m;
    int rv = nng_msg_alloc(&m, len);
    if (rv == 0) {
        memcpy(nng_msg_body(m), bytes, len);
        rv = nng_sendmsg(r->sock, m, 0);
        if (rv != 0)
            nng_msg_free(m);
    }
    if (rv == 0)
        rv = nng_recvmsg(r->sock, &m, 0);
    if (err != NULL)
        *err = rv;
    if (rv != 0)
        return NULL;
    const uint8_t *h, *p;
    size_t hl, pl;
    const char *why;
    Gpucd__V1__Reply *rep = NULL;
    if (wire_split(nng_msg_body(m), nng_msg_len(m), &h, &hl, &p, &pl, &why) == 0)
        rep = gpucd__v1__reply__unpack(NULL, hl, h);
    nng_msg_free(m);
    return rep;
}

uint8_t *th_raw_frame(th_raw *r, Gpucd__V1__Request *req, const void *payload, size_t payload_len,
                      size_t *len)
{
    if (req->version == 0)
        req->version = GPUCD__V1__VERSION__VERSION_CURRENT;
    if (req->id == 0)
        req->id = r->next_id++;
    size_t hl = gpucd__v1__request__get_packed_size(req);
    size_t off = wire_payload_offset(hl);
    uint8_t *buf = th_xmalloc(off + payload_len);
    memset(buf, 0, off);
    wire_pack_header(buf, &req->base, hl);
    if (payload_len > 0)
        memcpy(buf + off, payload, payload_len);
    *len = off + payload_len;
    return buf;
}

Gpucd__V1__Reply *th_raw_call(th_raw *r, Gpucd__V1__Request *req, const void *payload,
                              size_t payload_len)
{
    size_t len;
    uint8_t *buf = th_raw_frame(r, req, payload, payload_len, &len);
    Gpucd__V1__Reply *rep = th_raw_send_bytes(r, buf, len, NULL);
    free(buf);
    return rep;
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static void write_all(int fd, const void *p, size_t n)
{
    for (const uint8_t *b = p; n > 0;) {
        const ssize_t w = write(fd, b, n);
        if (w <= 0) {
            fprintf(stderr, "raw: write on a hand-made connection: %s\n", strerror(errno));
            exit(1);
        }
        b += w, n -= (size_t)w;
    }
}

/* nng's ipc transport: an 8-byte header each way ("\0SP\0", the protocol, 0), then each message
 * as a type byte (1), its length (8 bytes, big-endian) and the bytes.  A REQ message starts with
 * its 32-bit request id, high bit set. */
enum { SP_PROTO_REQ = 0x30, SP_PROTO_REP = 0x31 };

int th_sp_unread(const char *url, const uint8_t *const *msgs, const size_t *lens, int n)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (strncmp(url, "ipc://", 6) != 0 || strlen(url + 6) >= sizeof sa.sun_path || s < 0) {
        fprintf(stderr, "raw: no hand-made connection to %s\n", url);
        exit(1);
    }
    memcpy(sa.sun_path, url + 6, strlen(url + 6));
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        fprintf(stderr, "raw: cannot connect to %s: %s\n", sa.sun_path, strerror(errno));
        exit(1);
    }
    uint8_t hello[8] = {0, 'S', 'P', 0, 0, SP_PROTO_REQ, 0, 0}, theirs[8];
    write_all(s, hello, sizeof hello);
    size_t got = 0;
    for (ssize_t k; got < sizeof theirs; got += (size_t)k)
        if ((k = read(s, theirs + got, sizeof theirs - got)) <= 0)
            break;
    if (got != sizeof theirs || memcmp(theirs, "\0SP\0", 4) != 0 || theirs[5] != SP_PROTO_REP) {
        fprintf(stderr, "raw: %s answered no REP handshake\n", url);
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        uint8_t head[13];
        head[0] = 1;
        put_be(head + 1, 4 + lens[i], 8);
        put_be(head + 9, 0x80000000u | (uint32_t)(i + 1), 4);
        write_all(s, head, sizeof head);
        write_all(s, msgs[i], lens[i]);
    }
    return s;
}

/* The reference's dtype and shape; where it is, the caller's. */
static Gpucd__V1__TensorRef *ref_init(th_ref *r, Gpucd__V1__DType dt, int ndim,
                                      const int64_t *shape)
{
    if (ndim < 0 || (size_t)ndim > sizeof r->shape / sizeof r->shape[0]) {
        fprintf(stderr, "raw: %d dimensions\n", ndim);
        exit(1);
    }
    gpucd__v1__tensor_ref__init(&r->t);
    r->t.dtype = dt;
    memcpy(r->shape, shape, (size_t)ndim * sizeof *shape);
    r->t.n_shape = (size_t)ndim;
    r->t.shape = r->shape;
    return &r->t;
}

Gpucd__V1__TensorRef *th_ref_payload(th_ref *r, Gpucd__V1__DType dt, uint64_t offset, int ndim,
                                     const int64_t *shape)
{
    ref_init(r, dt, ndim, shape);
    gpucd__v1__inline_slice__init(&r->inl);
    r->inl.offset = offset;
    r->t.where_case = GPUCD__V1__TENSOR_REF__WHERE_PAYLOAD;
    r->t.payload = &r->inl;
    return &r->t;
}

Gpucd__V1__TensorRef *th_ref_region(th_ref *r, Gpucd__V1__DType dt, uint64_t region,
                                    uint64_t offset, int ndim, const int64_t *shape)
{
    ref_init(r, dt, ndim, shape);
    gpucd__v1__region_slice__init(&r->region);
    r->region.region_id = region;
    r->region.offset = offset;
    r->t.where_case = GPUCD__V1__TENSOR_REF__WHERE_REGION;
    r->t.region = &r->region;
    return &r->t;
}

Gpucd__V1__TensorRef *th_ref_resident(th_ref *r, Gpucd__V1__DType dt, uint64_t id, int ndim,
                                      const int64_t *shape)
{
    ref_init(r, dt, ndim, shape);
    r->t.where_case = GPUCD__V1__TENSOR_REF__WHERE_RESIDENT;
    r->t.resident = id;
    return &r->t;
}

void th_conv_req_init(th_conv_req *c, int stride, const int64_t x[4], const int64_t w[4],
                      const int64_t y[4])
{
    gpucd__v1__request__init(&c->req);
    gpucd__v1__conv2d_forward__init(&c->op);
    gpucd__v1__conv2d_params__init(&c->params);
    c->params.stride_h = c->params.stride_w = (uint32_t)stride;
    c->op.params = &c->params;
    const size_t xb = (size_t)(x[0] * x[1] * x[2] * x[3]) * 4;
    const size_t wb = (size_t)(w[0] * w[1] * w[2] * w[3]) * 4;
    size_t woff = wire_align_up(xb);
    c->payload_len = woff + wire_align_up(wb);
    c->payload = th_xmalloc(c->payload_len);
    th_fill_f32((float *)c->payload, c->payload_len / 4);
    c->op.x = th_ref_payload(&c->x, GPUCD__V1__DTYPE__F32, 0, 4, x);
    c->op.w = th_ref_payload(&c->w, GPUCD__V1__DTYPE__F32, woff, 4, w);
    c->op.y = th_ref_payload(&c->y, GPUCD__V1__DTYPE__F32, 0, 4, y);
    c->req.op_case = GPUCD__V1__REQUEST__OP_CONV2D_FORWARD;
    c->req.conv2d_forward = &c->op;
}

void th_memfd_make(th_region *reg, size_t size, unsigned seals)
{
    memset(reg, 0, sizeof *reg);
    reg->size = size;
    reg->fd = memfd_create("gpucd-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (reg->fd < 0 || ftruncate(reg->fd, (off_t)size) != 0 ||
        (seals != 0 && fcntl(reg->fd, F_ADD_SEALS, (int)seals) != 0)) {
        fprintf(stderr, "raw: memfd of %zu bytes: %s\n", size, strerror(errno));
        exit(1);
    }
    reg->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, reg->fd, 0);
    if (reg->base == MAP_FAILED) {
        fprintf(stderr, "raw: mmap: %s\n", strerror(errno));
        exit(1);
    }
}

void th_region_free(th_region *reg)
{
    munmap(reg->base, reg->size);
    close(reg->fd);
}

int th_fdpass_connect(const char *url)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    const size_t n = strlen(url + 6) + strlen(FDPASS_SUFFIX);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (strncmp(url, "ipc://", 6) != 0 || n >= sizeof sa.sun_path || s < 0) {
        fprintf(stderr, "raw: no descriptor socket for %s\n", url);
        exit(1);
    }
    memcpy(sa.sun_path, url + 6, n - strlen(FDPASS_SUFFIX));
    memcpy(sa.sun_path + n - strlen(FDPASS_SUFFIX), FDPASS_SUFFIX, strlen(FDPASS_SUFFIX));
    struct timeval tv = {20, 0};
    if (setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
        fprintf(stderr, "raw: cannot connect to %s: %s\n", sa.sun_path, strerror(errno));
        exit(1);
    }
    return s;
}

int th_fdpass(const char *url, const void *msg, size_t len, const int *fds, int nfds,
              fdpass_answer *ans, int *fd)
{
    if (fd != NULL)
        *fd = -1;
    if (nfds > 32) {
        fprintf(stderr, "raw: at most 32 descriptors a message\n");
        exit(1);
    }
    int s = th_fdpass_connect(url);
    union {
        char bytes[CMSG_SPACE(32 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {(void *)msg, len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        mh.msg_control = ctl.bytes;
        mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
    }
    if (sendmsg(s, &mh, MSG_NOSIGNAL) != (ssize_t)len) {
        close(s);
        return -1;
    }
    memset(ans, 0, sizeof *ans);
    struct iovec aiov = {ans, sizeof *ans};
    struct msghdr am = {.msg_iov = &aiov, .msg_iovlen = 1, .msg_control = ctl.bytes,
                        .msg_controllen = sizeof ctl.bytes};
    const ssize_t n = recvmsg(s, &am, MSG_CMSG_CLOEXEC);
    close(s);
    if (n != (ssize_t)sizeof *ans)
        return -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&am); cm != NULL; cm = CMSG_NXTHDR(&am, cm)) {
        int got;
        memcpy(&got, CMSG_DATA(cm), sizeof got);
        if (fd != NULL && *fd < 0)
            *fd = got;
        else
            close(got);
    }
    ans->message[sizeof ans->message - 1] = '\0';
    return 0;
}

int th_fdpass_region(const char *url, const th_region *reg, uint64_t *token, fdpass_answer *ans)
{
    fdpass_request req = {.magic = FDPASS_MAGIC, .version = FDPASS_VERSION,
                          .op = FDPASS_OP_REGION, .size = reg->size};
    if (th_fdpass(url, &req, sizeof req, &reg->fd, 1, ans, NULL) != 0 ||
        ans->status != GPUCD__V1__STATUS__OK)
        return -1;
    *token = ans->token;
    return 0;
}

Gpucd__V1__Reply *th_raw_register(th_raw *r, uint64_t token, uint64_t size)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__RegionRegister reg = GPUCD__V1__REGION_REGISTER__INIT;
    reg.token = token;
    reg.size = size;
    req.op_case = GPUCD__V1__REQUEST__OP_REGION_REGISTER;
    req.region_register = &reg;
    return th_raw_call(r, &req, NULL, 0);
}

void th_raw_region(th_raw *r, size_t size, th_region *reg)
{
    th_memfd_make(reg, size, F_SEAL_SHRINK | F_SEAL_GROW);
    uint64_t token;
    fdpass_answer ans;
    if (th_fdpass_region(r->url, reg, &token, &ans) != 0) {
        fprintf(stderr, "raw: the memfd was refused: %s\n", ans.message);
        exit(1);
    }
    Gpucd__V1__Reply *rep = th_raw_register(r, token, size);
    if (rep == NULL || rep->status != GPUCD__V1__STATUS__OK) {
        fprintf(stderr, "raw: region_register failed: %s\n", rep ? rep->message : "no reply");
        exit(1);
    }
    reg->id = rep->region_id;
    gpucd__v1__reply__free_unpacked(rep, NULL);
}
