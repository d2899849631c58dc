/*
 * fdpass_wire.h - the descriptor socket: how a local client hands the daemon a
 * file descriptor (a region's memory) and gets one back (the daemon's wake
 * page), the wire structs that the client library and the daemon both use.
 *
 * Why: a region named in /dev/shm can be opened, shrunk or grown by any
 * process of its uid while the daemon has it mapped, and the daemon's next
 * touch of a page past the new end is a SIGBUS that ends it; a name is also
 * left behind when its maker is killed.  A region is instead a memfd sealed
 * against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW, checked by the
 * daemon before it maps anything): nobody can change its size, and it has no
 * name to leave.  A descriptor crosses between processes only over a Unix
 * socket, so next to each ipc:// listener at PATH the daemon listens on an
 * AF_UNIX SOCK_SEQPACKET socket at PATH FDPASS_SUFFIX (mode 0600).
 *
 * One exchange a connection: the client connects, sends one fdpass_request
 * (one datagram) and reads one fdpass_answer, then closes.
 *   - FDPASS_OP_REGION: the request carries exactly one descriptor
 *     (SCM_RIGHTS), a sealed memfd of `size` bytes.  The daemon keeps it as a
 *     pending registration, answers its token, and forgets it (closing it)
 *     unless a RegionRegister naming the token comes within a few seconds
 *     over an ipc:// connection of the same uid (SO_PEERCRED here, the
 *     connection's peer uid there).
 *   - FDPASS_OP_WAKE: no descriptor; the answer carries the daemon's wake
 *     page (submit_queue.h), a sealed memfd of `size` bytes, in SCM_RIGHTS.
 * A refusal answers a status (gpucd.v1.Status) and a message, no token and
 * no descriptor.  A connection that sends nothing is closed after a second.
 */
#ifndef GPUCD_FDPASS_WIRE_H
#define GPUCD_FDPASS_WIRE_H

#include <stdint.h>

#define FDPASS_SUFFIX ".fd"

enum {
    FDPASS_MAGIC = 0x44465047, /* "GPFD" little-endian */
    FDPASS_VERSION = 1,
    FDPASS_OP_REGION = 1,
    FDPASS_OP_WAKE = 2,
    FDPASS_MESSAGE_MAX = 224,
};

typedef struct fdpass_request {
    uint32_t magic;   /* FDPASS_MAGIC */
    uint32_t version; /* FDPASS_VERSION */
    uint32_t op;      /* FDPASS_OP_* */
    uint32_t reserved; /* 0 */
    uint64_t size;    /* FDPASS_OP_REGION: the memfd's size; else 0 */
} fdpass_request;

typedef struct fdpass_answer {
    uint32_t magic;   /* FDPASS_MAGIC */
    uint32_t version; /* FDPASS_VERSION */
    uint32_t status;  /* gpucd.v1.Status: OK, or why the request was refused */
    uint32_t reserved;
    uint64_t token;   /* FDPASS_OP_REGION: what RegionRegister.token names */
    uint64_t size;    /* FDPASS_OP_WAKE: the wake page's size */
    char message[FDPASS_MESSAGE_MAX]; /* a refusal's reason, NUL-terminated */
} fdpass_answer;

_Static_assert(sizeof(fdpass_request) == 24, "the request's size is its wire size");
_Static_assert(sizeof(fdpass_answer) == 256, "the answer's size is its wire size");

#endif
