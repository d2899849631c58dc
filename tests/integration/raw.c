/* raw.c - see raw.h. */
#include "raw.h"

#include <fcntl.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "wire.h"

void th_raw_open(th_raw *r, const char *url)
{
    memset(r, 0, sizeof *r);
    r->next_id = 1;
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

Gpucd__V1__Reply *th_raw_call(th_raw *r, Gpucd__V1__Request *req, const void *payload,
                              size_t payload_len)
{
    if (req->version == 0)
        req->version = GPUCD__V1__VERSION__VERSION_CURRENT;
    if (req->id == 0)
        req->id = r->next_id++;
    size_t hl = gpucd__v1__request__get_packed_size(req);
    size_t off = wire_payload_offset(hl);
    uint8_t *buf = calloc(1, off + payload_len);
    wire_pack_header(buf, &req->base, hl);
    if (payload_len > 0)
        memcpy(buf + off, payload, payload_len);
    Gpucd__V1__Reply *rep = th_raw_send_bytes(r, buf, off + payload_len, NULL);
    free(buf);
    return rep;
}

void *th_shm_create(char name[64], size_t size, int mode)
{
    snprintf(name, 64, "/gpucd-test-%d-%016llx", (int)getpid(),
             (unsigned long long)th_rand_u64());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, (mode_t)mode);
    if (fd < 0 || fchmod(fd, (mode_t)mode) != 0 || ftruncate(fd, (off_t)size) != 0) {
        fprintf(stderr, "shm %s failed\n", name);
        exit(1);
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "mmap failed\n");
        exit(1);
    }
    return p;
}

Gpucd__V1__Reply *th_raw_register(th_raw *r, const char *name, uint64_t size)
{
    Gpucd__V1__Request req = GPUCD__V1__REQUEST__INIT;
    Gpucd__V1__RegionRegister reg = GPUCD__V1__REGION_REGISTER__INIT;
    reg.name = (char *)name;
    reg.size = size;
    req.op_case = GPUCD__V1__REQUEST__OP_REGION_REGISTER;
    req.region_register = &reg;
    return th_raw_call(r, &req, NULL, 0);
}
