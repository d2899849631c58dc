/* wire.c - message framing; see wire.h. */
#include "wire.h"

#include <string.h>

static const uint8_t wire_magic[4] = {'G', 'P', 'C', 'D'};

int wire_split(const void *buf, size_t len, const uint8_t **header, size_t *header_len,
               const uint8_t **payload, size_t *payload_len, const char **why)
{
    const uint8_t *p = buf;
    if (len < WIRE_PREFIX) {
        *why = "message shorter than the 8-byte prefix";
        return -1;
    }
    if (memcmp(p, wire_magic, sizeof wire_magic) != 0) {
        *why = "bad magic: not a gpucd message";
        return -1;
    }
    uint32_t hlen = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                    (uint32_t)p[7] << 24;
    if (hlen > WIRE_MAX_HEADER || hlen > len - WIRE_PREFIX) {
        *why = "header length exceeds the message";
        return -1;
    }
    size_t off = wire_payload_offset(hlen);
    *header = p + WIRE_PREFIX;
    *header_len = hlen;
    if (off >= len) {
        *payload = NULL;
        *payload_len = 0;
    } else {
        *payload = p + off;
        *payload_len = len - off;
    }
    return 0;
}

void wire_pack_header(void *buf, const ProtobufCMessage *msg, size_t packed_size)
{
    uint8_t *p = buf;
    uint32_t hlen = (uint32_t)packed_size;
    memcpy(p, wire_magic, sizeof wire_magic);
    p[4] = (uint8_t)hlen;
    p[5] = (uint8_t)(hlen >> 8);
    p[6] = (uint8_t)(hlen >> 16);
    p[7] = (uint8_t)(hlen >> 24);
    protobuf_c_message_pack(msg, p + WIRE_PREFIX);
    size_t end = WIRE_PREFIX + packed_size;
    memset(p + end, 0, wire_payload_offset(packed_size) - end);
}
