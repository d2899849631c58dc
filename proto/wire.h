/*
 * wire.h - message framing shared by the daemon and the client library.
 *
 *   "GPCD" | u32 header_len (LE) | header | zero pad to WIRE_ALIGN | payload
 *
 * The header is a packed gpucd.v1.Request or Reply.  The payload holds inline
 * tensor bytes, each at an offset that is a multiple of WIRE_ALIGN, so that
 * kernels can read them in place with wide loads.
 */
#ifndef GPUCD_WIRE_H
#define GPUCD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "gpucd.pb-c.h"

enum {
    WIRE_ALIGN = 64,
    WIRE_PREFIX = 8, /* magic + header length */
    WIRE_MAX_HEADER = 1 << 20,
};

/* Offset of the payload in a message whose header is header_len bytes. */
static inline size_t wire_payload_offset(size_t header_len)
{
    return (WIRE_PREFIX + header_len + WIRE_ALIGN - 1) / WIRE_ALIGN * WIRE_ALIGN;
}

/*
 * A compute operation: the schema numbers control operations 10-19, compute
 * ones from 20 (conv2d_forward) on; protobuf-c sets no case it does not know.
 */
static inline int wire_op_is_compute(Gpucd__V1__Request__OpCase op)
{
    return op >= GPUCD__V1__REQUEST__OP_CONV2D_FORWARD;
}

static inline uint64_t wire_align_up(uint64_t n)
{
    return (n + WIRE_ALIGN - 1) / WIRE_ALIGN * WIRE_ALIGN;
}

/*
 * Splits a received message.  On success *header and *header_len point at the
 * protobuf bytes and *payload and *payload_len at the payload (inside buf).
 * Returns 0, or -1 with a static reason in *why.
 */
int wire_split(const void *buf, size_t len, const uint8_t **header, size_t *header_len,
               const uint8_t **payload, size_t *payload_len, const char **why);

/* Writes the prefix and packs msg at buf; buf must hold wire_payload_offset(size). */
void wire_pack_header(void *buf, const ProtobufCMessage *msg, size_t packed_size);

#endif /* GPUCD_WIRE_H */
