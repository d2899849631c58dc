/*
 * raw.h - requests built by hand and sent on a bare nng REQ socket, for tests
 * that must say exactly what goes on the wire (malformed and hostile input).
 */
#ifndef TH_RAW_H
#define TH_RAW_H

#include <nng/nng.h>
#include <stddef.h>
#include <stdint.h>

#include "gpucd.pb-c.h"

typedef struct th_raw {
    nng_socket sock;
    uint64_t next_id;
} th_raw;

void th_raw_open(th_raw *r, const char *url);
void th_raw_close(th_raw *r);

/* Sends bytes as they are; returns the decoded reply, or NULL if none came (rv in *err). */
Gpucd__V1__Reply *th_raw_send_bytes(th_raw *r, const void *bytes, size_t len, int *err);
/* Frames req (version and id filled in unless set) with payload and sends it. */
Gpucd__V1__Reply *th_raw_call(th_raw *r, Gpucd__V1__Request *req, const void *payload,
                              size_t payload_len);

/* A fresh shared-memory object of size bytes with the given mode, mapped; name in name[64]. */
void *th_shm_create(char name[64], size_t size, int mode);
/* Registers a region by name on this socket; returns the reply. */
Gpucd__V1__Reply *th_raw_register(th_raw *r, const char *name, uint64_t size);

#endif
