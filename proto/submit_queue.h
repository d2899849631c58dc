/*
 * submit_queue.h - a local client's submission queue (SubmitQueueOpen): the
 * shared-memory layout that the client library and the daemon both use.
 *
 * Why: nng 1.5 moves every message of a process through one poller thread,
 * and a daemon serving many clients spends that thread on each request's
 * trip in.  Local requests that end on their completion record (record-only,
 * doorbell_record.h) need no socket at all: the client writes the request's
 * bytes into its slot's buffer and queues the slot; the daemon's queue
 * poller takes it from there.  The socket stays for everything else.
 *
 * The area is one of the client's regions.  Slot i owns records[i] and
 * buffers[i]; a slot has at most one request queued or running.  cells is a
 * bounded queue of slot numbers with one consumer (the daemon) and any
 * number of producers (the client's threads), each cell a sequence number
 * and a payload:
 *   - the client sets cells[i].seq = i before opening the queue;
 *   - a producer takes pos = tail++ (fetch-add), waits until
 *     cells[pos % SUBMIT_SLOTS].seq == pos (the cell is free), writes id,
 *     slot and len, then stores seq = pos + 1;
 *   - the daemon, at its own head h (never read from this memory), takes the
 *     cell when seq == h + 1, copies what it names, and stores
 *     seq = h + SUBMIT_SLOTS, freeing it for the producer at that position.
 * Nothing here is trusted by the daemon: it reads each field once, checks
 * it, and copies the request's bytes before decoding them.
 *
 * Waking the daemon: the poller polls the queues while requests come and
 * then sleeps on the `sleeping` word of the daemon's wake page (a memfd
 * sealed against resizing, from the descriptor socket: fdpass_wire.h): it stores sleeping = 1,
 * looks at every queue again, and sleeps while the word is 1.  A producer
 * stores its cell's seq, then sleeping = 0, then wakes the word's sleeper
 * (all sequentially consistent): if the poller's last look missed the cell,
 * its sleep either sees the 0 or is woken.  The producer wakes always: every
 * client can write the word, so a producer that trusted it to say whether
 * the poller sleeps could be made to skip the wake by another client, and
 * that client's requests would wait for the poller's nap to end.  A wake
 * with nobody asleep costs the producer one system call, not the daemon.
 *
 * The answer: a request that succeeds record-only is answered by its record
 * alone.  Any other answer (a failure, with its message) is the reply's
 * bytes in the slot's buffer, the record, whose status is the reply's, and
 * then reply_id = the request's id, last: a client that sees a failure in the
 * record (which the request's own path may have stored first) waits for
 * reply_id before reading the message or using the slot again.
 */
#ifndef GPUCD_SUBMIT_QUEUE_H
#define GPUCD_SUBMIT_QUEUE_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "doorbell_record.h"

enum {
    SUBMIT_SLOTS = 64,           /* slots of an area, and cells of its queue */
    SUBMIT_BUFFER_BYTES = 2048,  /* a slot's buffer, header included */
    SUBMIT_WAKE_BYTES = 4096,    /* the daemon's wake page */
};

typedef struct submit_cell {
    _Atomic uint64_t seq;
    uint64_t id;   /* the request's id: the record's id whatever the bytes say */
    uint32_t slot; /* < SUBMIT_SLOTS */
    uint32_t len;  /* bytes of the request in buffers[slot].bytes */
    uint8_t pad[40];
} submit_cell;

typedef struct submit_buffer {
    _Atomic uint64_t reply_id; /* the request whose reply bytes are here: stored after them */
    uint32_t reply_len;        /* 0: the reply did not fit; the record's status stands alone */
    uint32_t pad;
    uint8_t bytes[SUBMIT_BUFFER_BYTES - 16]; /* the request, then its reply (wire framing) */
} submit_buffer;

typedef struct submit_area {
    doorbell_record records[SUBMIT_SLOTS]; /* first: record i is at offset 64 i */
    _Atomic uint64_t tail;
    uint8_t pad[56];
    submit_cell cells[SUBMIT_SLOTS];
    submit_buffer buffers[SUBMIT_SLOTS];
} submit_area;

typedef struct submit_wake {
    _Atomic uint32_t sleeping; /* the daemon's poller sleeps while it is 1 */
} submit_wake;

enum { SUBMIT_MESSAGE_MAX = (int)sizeof(((submit_buffer *)0)->bytes) };

_Static_assert(sizeof(submit_cell) == 64, "one cell, one cache line");
_Static_assert(sizeof(submit_buffer) == SUBMIT_BUFFER_BYTES, "buffers tile the area");
_Static_assert(sizeof(submit_area) % 64 == 0, "the area is whole cache lines");

/* Wakes the daemon's poller if it sleeps (see above why unconditionally). */
static inline void submit_wake_poller(submit_wake *w)
{
    atomic_store_explicit(&w->sleeping, 0, memory_order_seq_cst);
    syscall(SYS_futex, (void *)&w->sleeping, FUTEX_WAKE, 1, NULL, NULL, 0);
}

#endif
