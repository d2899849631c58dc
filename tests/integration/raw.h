/*
 * raw.h - requests built by hand and sent on a bare nng REQ socket, for tests
 * that must say exactly what goes on the wire (malformed and hostile input).
 */
#ifndef TH_RAW_H
#define TH_RAW_H

#include <nng/nng.h>
#include <stddef.h>
#include <stdint.h>

#include "fdpass_wire.h"
#include "gk.h"
#include "gpucd.pb-c.h"

typedef struct th_raw {
    nng_socket sock;
    uint64_t next_id;
    char url[256];
} th_raw;

void th_raw_open(th_raw *r, const char *url);
void th_raw_close(th_raw *r);

/* Sends bytes as they are; returns the decoded reply, or NULL if none came (rv in *err). */
Gpucd__V1__Reply *th_raw_send_bytes(th_raw *r, const void *bytes, size_t len, int *err);
/* Frames req (version and id filled in unless set) with payload and sends it. */
Gpucd__V1__Reply *th_raw_call(th_raw *r, Gpucd__V1__Request *req, const void *payload,
                              size_t payload_len);

/* Frames req (version and id filled in unless set) with payload: *len bytes, to free(). */
uint8_t *th_raw_frame(th_raw *r, Gpucd__V1__Request *req, const void *payload, size_t payload_len,
                      size_t *len);

/*
 * A connection made by hand to the ipc:// url's socket (the SP handshake, then framed messages)
 * that sends n messages as REQ requests and never reads: a reply larger than the socket's buffer
 * stays in the daemon's transport, and the replies behind it wait, as for any client that stopped
 * reading.  Returns the descriptor: closing it lets them go.  Exits on failure.
 */
int th_sp_unread(const char *url, const uint8_t *const *msgs, const size_t *lens, int n);

/* A tensor reference; the shape array must outlive the request.  Room for more dimensions
 * than the daemon takes, for the tests of that limit. */
typedef struct th_ref {
    Gpucd__V1__TensorRef t;
    Gpucd__V1__RegionSlice region;
    Gpucd__V1__InlineSlice inl;
    int64_t shape[12];
} th_ref;

/* A tensor inline in the payload at offset. */
Gpucd__V1__TensorRef *th_ref_payload(th_ref *r, Gpucd__V1__DType dt, uint64_t offset, int ndim,
                                     const int64_t *shape);
/* A tensor in a registered region at offset. */
Gpucd__V1__TensorRef *th_ref_region(th_ref *r, Gpucd__V1__DType dt, uint64_t region,
                                    uint64_t offset, int ndim, const int64_t *shape);
/* A resident tensor. */
Gpucd__V1__TensorRef *th_ref_resident(th_ref *r, Gpucd__V1__DType dt, uint64_t id, int ndim,
                                      const int64_t *shape);

/* An f32 conv2d_forward with x and w inline (random values) and y inline, of the shapes given. */
typedef struct th_conv_req {
    Gpucd__V1__Request req;
    Gpucd__V1__Conv2dForward op;
    Gpucd__V1__Conv2dParams params;
    th_ref x, w, y;
    uint8_t *payload; /* to free() */
    size_t payload_len;
} th_conv_req;

void th_conv_req_init(th_conv_req *c, int stride, const int64_t x[4], const int64_t w[4],
                      const int64_t y[4]);

/* A memfd of a test's: its descriptor (kept open, so tests can try to resize it), mapping, id. */
typedef struct th_region {
    int fd;
    uint8_t *base;
    size_t size;
    uint64_t id; /* 0 until registered */
} th_region;

/* A memfd of size bytes with `seals` added (F_SEAL_*; 0: none), mapped. */
void th_memfd_make(th_region *reg, size_t size, unsigned seals);
/* Unmaps and closes it. */
void th_region_free(th_region *reg);

/* A connection to the descriptor socket next to the ipc:// url; exits on failure. */
int th_fdpass_connect(const char *url);
/*
 * One exchange on the descriptor socket next to the ipc:// url: sends len
 * bytes of msg with nfds (at most 32) descriptors, reads the answer into *ans and, when it
 * carries one, its descriptor into *fd (else -1; fd may be NULL).  0, or -1
 * when no answer came (the daemon closed the connection).
 */
int th_fdpass(const char *url, const void *msg, size_t len, const int *fds, int nfds,
              fdpass_answer *ans, int *fd);
/* Passes reg's memfd (FDPASS_OP_REGION, reg->size); 0 with the token, or -1 with *ans's reason. */
int th_fdpass_region(const char *url, const th_region *reg, uint64_t *token,
                     fdpass_answer *ans);
/* RegionRegister naming a token; returns the reply. */
Gpucd__V1__Reply *th_raw_register(th_raw *r, uint64_t token, uint64_t size);
/* A sealed memfd region of size bytes registered on r, the library's way; exits on failure. */
void th_raw_region(th_raw *r, size_t size, th_region *reg);

#endif
