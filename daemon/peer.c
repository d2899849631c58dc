/* peer.c - see peer.h. */
#include "peer.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>

void gcd_peer_name(nng_pipe p, char *out, size_t len)
{
    uint64_t uid;
    if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) == 0) {
        snprintf(out, len, "uid %llu", (unsigned long long)uid);
        return;
    }
    nng_sockaddr sa;
    char addr[INET6_ADDRSTRLEN] = "";
    if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0) {
        if (sa.s_family == NNG_AF_INET)
            inet_ntop(AF_INET, &sa.s_in.sa_addr, addr, sizeof addr);
        else if (sa.s_family == NNG_AF_INET6)
            inet_ntop(AF_INET6, sa.s_in6.sa_addr, addr, sizeof addr);
    }
    if (addr[0] != '\0')
        snprintf(out, len, "tcp %s", addr);
    else
        snprintf(out, len, "unknown");
}
