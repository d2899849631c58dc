/*
 * fuzz_request.c - libFuzzer target for the request path: framing, protobuf
 * decoding, validation, binding and the CPU kernels, exactly as the daemon
 * runs them (gcd_request_handle), minus the socket.  Every input must yield a
 * reply and leave nothing behind.
 */
#include <nng/nng.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "conns.h"
#include "daemon.h"
#include "quota.h"
#include "request.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static gcd_daemon fuzz_daemon;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    gcd_daemon *d = &fuzz_daemon;
    gcd_config_defaults(&d->cfg);
    d->cfg.max_message_mb = 1; /* bounds what an input can ask the kernels to write */
    d->cfg.resident_mb = 64;
    gcd_log_set_level(GCD_LOG_ERROR);
    gcd_stats_init(&d->stats);
    d->ops = &gcd_backend_cpu;
    /* Every input is a message of no pipe: the connection the daemon sees it from (nng_pipe_id
     * of no pipe is -1), listed as alive and charged as the daemon's connections are. */
    nng_msg *probe;
    if (nng_msg_alloc(&probe, 0) != 0)
        abort();
    const uint32_t conn = (uint32_t)nng_pipe_id(nng_msg_get_pipe(probe));
    nng_msg_free(probe);
    gk_err err;
    if (d->ops->open(&d->cfg, &d->backend, &err) != 0 ||
        gcd_regions_init(&d->regions, d->backend, d->ops) != 0 ||
        gcd_residents_init(&d->residents, d->backend, d->ops, d->cfg.resident_mb << 20) != 0 ||
        gcd_conns_init(&d->conns) != 0 || gcd_conns_add(d->conns, conn) != 0)
        abort();
    gcd_quota_limits limits;
    gcd_quota_limits_from_config(&d->cfg, 1024, &limits);
    char why[256];
    if (gcd_quota_init(&d->quota, &limits) != 0 ||
        gcd_quota_connect(d->quota, conn, "uid 0", why, sizeof why) != 0)
        abort();
    gcd_regions_set_quota(d->regions, d->quota);
    gcd_residents_set_quota(d->residents, d->quota);
    d->ops->describe(d->backend, &d->device);
    atomic_store(&d->ready, 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nng_msg *msg;
    if (nng_msg_alloc(&msg, size) != 0)
        return 0;
    if (size > 0)
        memcpy(nng_msg_body(msg), data, size);
    gcd_outcome out;
    nng_msg *rep = gcd_request_handle(&fuzz_daemon, msg, gcd_now_us(), 0, &out);
    if (rep == NULL && !out.by_record)
        abort(); /* every request gets a reply, or its completion record alone */
    if (rep != NULL)
        nng_msg_free(rep);
    /* A message with no connection belongs to pipe 0: drop what it created. */
    gcd_residents_drop_owner(fuzz_daemon.residents, 0);
    gcd_regions_drop_owner(fuzz_daemon.regions, 0);
    return 0;
}
