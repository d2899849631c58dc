/*
 * fake_daemon.h - an in-process REP server on inproc:// for the client unit
 * tests: it decodes each request with the real wire code and lets the test
 * decide the reply, so that the library's encoding, its checks of replies and
 * its error paths are tested without the real daemon.
 */
#ifndef FAKE_DAEMON_H
#define FAKE_DAEMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "wire.h"

typedef enum fake_action {
    FAKE_REPLY,       /* send the reply */
    FAKE_SILENT,      /* send nothing (the client times out) */
    FAKE_DISCONNECT,  /* close the server socket (the client loses the connection) */
} fake_action;

/* What a handler fills in: the reply header and the payload after it. */
typedef struct fake_reply {
    Gpucd__V1__Reply reply;
    Gpucd__V1__TensorRef out_refs[20];
    Gpucd__V1__TensorRef *out_ptrs[20];
    Gpucd__V1__InlineSlice out_slices[20];
    Gpucd__V1__Timings timings;
    uint8_t *payload;
    size_t payload_len;
} fake_reply;

/* Called for each request on the server thread; req and payload live until it returns. */
typedef fake_action (*fake_handler)(void *arg, const Gpucd__V1__Request *req,
                                    const uint8_t *payload, size_t payload_len, fake_reply *out);

enum { FAKE_FDS_MAX = 16 };

typedef struct fake_daemon {
    char url[64];
    char dir[32];   /* with regions: the folder of its ipc:// socket and descriptor socket */
    int side;       /* with regions: the descriptor socket (proto/fdpass_wire.h); else -1 */
    pthread_t side_thread;
    pthread_mutex_t fd_lock;
    int fds[FAKE_FDS_MAX]; /* the memfd passed under token i + 1; -1 once taken */
    int nfds;
    nng_socket sock;
    pthread_t thread;
    fake_handler handler;
    void *arg;
    bool serves_regions; /* RegionRegister goes to the handler; else it is refused here */
    int requests; /* handled so far */
    bool stopped;
} fake_daemon;

/*
 * Starts a server at a fresh inproc:// URL (fd->url).  It refuses every
 * RegionRegister itself, without counting it, so that a handler written for
 * other operations never sees the region the library makes for its
 * completion records (the library then goes on without them).
 */
void fake_daemon_start(fake_daemon *fd, fake_handler handler, void *arg);
/*
 * The same, with RegionRegister handed to the handler like any request, at an
 * ipc:// URL beside which it serves the descriptor socket as the daemon does:
 * each memfd passed gets the next token (1, 2, ...), no check made (the
 * handler checks what it takes); a wake page request is refused.
 */
void fake_daemon_start_with_regions(fake_daemon *fd, fake_handler handler, void *arg);
/* The memfd passed under token (the caller's to close), or -1: none, or taken already. */
int fake_daemon_take_fd(fake_daemon *fd, uint64_t token);
void fake_daemon_stop(fake_daemon *fd);

/* Handler helpers: an OK reply with the request's id; an error status with a message. */
void fake_reply_ok(fake_reply *out, const Gpucd__V1__Request *req);
void fake_reply_status(fake_reply *out, const Gpucd__V1__Request *req, Gpucd__V1__Status status,
                       const char *message);
/* Appends an output that says "in the payload at offset" / "resident id". */
void fake_reply_output_payload(fake_reply *out, uint64_t offset);
void fake_reply_output_resident(fake_reply *out, uint64_t id);
/* Attaches timings (queue, copy in, compute, copy out, batch wait, total). */
void fake_reply_timings(fake_reply *out, const uint64_t us[6]);
/* Sets the payload to a copy of len bytes. */
void fake_reply_payload(fake_reply *out, const void *bytes, size_t len);

#endif /* FAKE_DAEMON_H */
