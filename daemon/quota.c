/* quota.c - see quota.h. */
#include "quota.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer.h"

enum { CONN_BUCKETS = 256, MIN_CONNECTIONS = 8 };

typedef struct quota_peer {
    char name[GCD_PEER_NAME_MAX];
    uint64_t used[GCD_QUOTA_KINDS];
    uint32_t conns; /* admitted and not yet gone */
    uint32_t refs;  /* connection records, open or still holding */
    struct quota_peer *next;
} quota_peer;

struct gcd_quota_conn {
    uint32_t id;
    int open;
    uint64_t refs; /* 1 while open, plus one per hold */
    uint64_t used[GCD_QUOTA_KINDS];
    quota_peer *peer;
    struct gcd_quota_conn *next; /* in its bucket, while open */
};

struct gcd_quota {
    pthread_mutex_t lock;
    gcd_quota_limits lim;
    gcd_quota_conn *open[CONN_BUCKETS]; /* admitted connections, by id */
    quota_peer *peers;
    uint32_t connections;
    uint64_t refused[GCD_QUOTA_KINDS][2]; /* [kind][0: connection, 1: peer] */
    uint64_t refused_connections;
};

/* Names as messages, flags and stats keys say them. */
static const struct {
    const char *what, *conn_flag, *peer_flag, *key;
    int bytes;
} kinds[GCD_QUOTA_KINDS] = {
    [GCD_QUOTA_RESIDENT_BYTES] = {"resident bytes", "--conn-resident-mb", "--peer-resident-mb",
                                  "resident_bytes", 1},
    [GCD_QUOTA_REGIONS] = {"regions", "--conn-regions", "--peer-regions", "region_count", 0},
    [GCD_QUOTA_REGION_BYTES] = {"region bytes", "--conn-region-mb", "--peer-region-mb",
                                "region_bytes", 1},
    [GCD_QUOTA_INFLIGHT_BYTES] = {"bytes in flight", "--conn-inflight-mb", "--peer-inflight-mb",
                                  "inflight_bytes", 1},
};

const char *gcd_quota_kind_name(gcd_quota_kind k)
{
    return kinds[k].key;
}

static uint64_t mb_or(uint64_t mb, uint64_t dflt_bytes)
{
    return mb == GCD_QUOTA_AUTO ? dflt_bytes : mb << 20;
}

uint64_t gcd_quota_fd_reserve(const gcd_config *cfg)
{
    /* 64 for the daemon's own (17 on the cpu backend, idle: loop, wake-ups, log,
     * listeners, wake page; a device's more), 16 stats clients. */
    return 64 + (uint64_t)cfg->max_inflight + 16;
}

void gcd_quota_limits_from_config(const gcd_config *cfg, uint64_t nofile, gcd_quota_limits *out)
{
    const uint64_t message = cfg->max_message_mb << 20;
    const uint64_t half_resident = (cfg->resident_mb << 20) / 2;
    out->peer[GCD_QUOTA_RESIDENT_BYTES] = mb_or(cfg->peer_resident_mb, half_resident);
    out->conn[GCD_QUOTA_RESIDENT_BYTES] = mb_or(cfg->conn_resident_mb, half_resident);
    out->peer[GCD_QUOTA_REGIONS] = cfg->peer_regions;
    out->conn[GCD_QUOTA_REGIONS] = cfg->conn_regions;
    out->peer[GCD_QUOTA_REGION_BYTES] = cfg->peer_region_mb << 20;
    out->conn[GCD_QUOTA_REGION_BYTES] = cfg->conn_region_mb << 20;
    /* A message up to 1 MiB past the limit is read and answered with an error (server.c). */
    out->peer[GCD_QUOTA_INFLIGHT_BYTES] = mb_or(cfg->peer_inflight_mb, 4 * message + (4 << 20));
    out->conn[GCD_QUOTA_INFLIGHT_BYTES] = mb_or(cfg->conn_inflight_mb, 2 * message + (2 << 20));
    uint64_t reserve = gcd_quota_fd_reserve(cfg);
    uint64_t conns = cfg->max_connections;
    if (conns == GCD_QUOTA_AUTO) /* a few even where the reserve takes it all */
        conns = nofile > reserve + MIN_CONNECTIONS ? nofile - reserve : MIN_CONNECTIONS;
    if (conns > UINT32_MAX)
        conns = UINT32_MAX;
    out->max_connections = (uint32_t)conns;
    uint64_t per_peer = cfg->peer_connections == GCD_QUOTA_AUTO ? (conns + 1) / 2
                                                                : cfg->peer_connections;
    out->peer_connections = (uint32_t)(per_peer < conns ? per_peer : conns);
}

int gcd_quota_init(gcd_quota **out, const gcd_quota_limits *limits)
{
    gcd_quota *q = calloc(1, sizeof *q);
    if (q == NULL)
        return -1;
    pthread_mutex_init(&q->lock, NULL);
    q->lim = *limits;
    *out = q;
    return 0;
}

void gcd_quota_fini(gcd_quota *q)
{
    for (int b = 0; b < CONN_BUCKETS; b++) {
        for (gcd_quota_conn *c = q->open[b], *next; c != NULL; c = next) {
            next = c->next;
            free(c);
        }
    }
    for (quota_peer *p = q->peers, *next; p != NULL; p = next) {
        next = p->next;
        free(p);
    }
    pthread_mutex_destroy(&q->lock);
    free(q);
}

static gcd_quota_conn **conn_slot(gcd_quota *q, uint32_t id)
{
    gcd_quota_conn **at = &q->open[id % CONN_BUCKETS];
    while (*at != NULL && (*at)->id != id)
        at = &(*at)->next;
    return at;
}

static quota_peer *peer_find(gcd_quota *q, const char *name)
{
    for (quota_peer *p = q->peers; p != NULL; p = p->next)
        if (strcmp(p->name, name) == 0)
            return p;
    return NULL;
}

/* Drops one reference of c (closed already); the last frees it and, maybe, its peer. */
static void conn_unref_locked(gcd_quota *q, gcd_quota_conn *c)
{
    if (--c->refs > 0)
        return;
    quota_peer *p = c->peer;
    free(c);
    if (--p->refs > 0)
        return;
    quota_peer **at = &q->peers;
    while (*at != p)
        at = &(*at)->next;
    *at = p->next;
    free(p);
}

int gcd_quota_connect(gcd_quota *q, uint32_t conn, const char *peer, char *why, size_t whylen)
{
    pthread_mutex_lock(&q->lock);
    quota_peer *p = peer_find(q, peer);
    int rc = -1;
    if (q->connections >= q->lim.max_connections) {
        snprintf(why, whylen, "connections: %u open, limit %u (--max-connections)",
                 q->connections, q->lim.max_connections);
    } else if (p != NULL && p->conns >= q->lim.peer_connections) {
        snprintf(why, whylen, "connections per peer: %s has %u open, limit %u "
                              "(--peer-connections)",
                 peer, p->conns, q->lim.peer_connections);
    } else if (*conn_slot(q, conn) != NULL) {
        snprintf(why, whylen, "connection %u is admitted already", conn);
    } else {
        gcd_quota_conn *c = calloc(1, sizeof *c);
        if (p == NULL && c != NULL && (p = calloc(1, sizeof *p)) != NULL) {
            snprintf(p->name, sizeof p->name, "%s", peer);
            p->next = q->peers;
            q->peers = p;
        }
        if (c == NULL || p == NULL) {
            free(c);
            snprintf(why, whylen, "out of memory");
        } else {
            c->id = conn;
            c->open = 1;
            c->refs = 1;
            c->peer = p;
            p->refs++;
            p->conns++;
            q->connections++;
            *conn_slot(q, conn) = c;
            rc = 0;
        }
    }
    if (rc != 0)
        q->refused_connections++;
    pthread_mutex_unlock(&q->lock);
    return rc;
}

int gcd_quota_disconnect(gcd_quota *q, uint32_t conn)
{
    pthread_mutex_lock(&q->lock);
    gcd_quota_conn **at = conn_slot(q, conn), *c = *at;
    if (c != NULL) {
        *at = c->next;
        c->open = 0;
        c->peer->conns--;
        q->connections--;
        conn_unref_locked(q, c);
    }
    pthread_mutex_unlock(&q->lock);
    return c != NULL;
}

static void amount_format(char *out, size_t len, gcd_quota_kind k, uint64_t n)
{
    if (!kinds[k].bytes)
        snprintf(out, len, "%" PRIu64, n);
    else if (n >= (1u << 30) && n % (1u << 30) == 0)
        snprintf(out, len, "%" PRIu64 " GiB", n >> 30);
    else if (n >= (1u << 20) && n % (1u << 20) == 0)
        snprintf(out, len, "%" PRIu64 " MiB", n >> 20);
    else
        snprintf(out, len, "%" PRIu64 " bytes", n);
}

/* 1 when charge would pass a limit of c's or its peer's: the first such, in why. */
static int refuses(gcd_quota *q, const gcd_quota_conn *c, const gcd_charge *charge, char *why,
                      size_t whylen)
{
    for (int scope = 1; scope >= 0; scope--) { /* the peer's first: the limit others share */
        const uint64_t *used = scope == 0 ? c->used : c->peer->used;
        const uint64_t *lim = scope == 0 ? q->lim.conn : q->lim.peer;
        for (int k = 0; k < GCD_QUOTA_KINDS; k++) {
            uint64_t n = charge->n[k];
            if (n == 0 || (used[k] <= lim[k] && n <= lim[k] - used[k]))
                continue;
            char held[32], asked[32], limit[32];
            amount_format(held, sizeof held, (gcd_quota_kind)k, used[k]);
            amount_format(asked, sizeof asked, (gcd_quota_kind)k, n);
            amount_format(limit, sizeof limit, (gcd_quota_kind)k, lim[k]);
            snprintf(why, whylen, "%s per %s: %s held, %s asked, limit %s (%s)", kinds[k].what,
                     scope == 0 ? "connection" : "peer", held, asked, limit,
                     scope == 0 ? kinds[k].conn_flag : kinds[k].peer_flag);
            q->refused[k][scope]++;
            return 1;
        }
    }
    return 0;
}

gcd_status gcd_quota_take(gcd_quota *q, uint32_t conn, const gcd_charge *c,
                          gcd_quota_conn **held, char *why, size_t whylen)
{
    *held = NULL;
    if (q == NULL)
        return GCD_OK;
    pthread_mutex_lock(&q->lock);
    gcd_quota_conn *qc = *conn_slot(q, conn);
    gcd_status st = GCD_RESOURCE_EXHAUSTED;
    if (qc == NULL) {
        /* Its connection closed while the request waited: nothing may be charged to it. */
        snprintf(why, whylen, "connection %u is closed", conn);
    } else if (!refuses(q, qc, c, why, whylen)) {
        for (int k = 0; k < GCD_QUOTA_KINDS; k++) {
            qc->used[k] += c->n[k];
            qc->peer->used[k] += c->n[k];
        }
        qc->refs++;
        *held = qc;
        st = GCD_OK;
    }
    pthread_mutex_unlock(&q->lock);
    return st;
}

void gcd_quota_give(gcd_quota *q, gcd_quota_conn *held, const gcd_charge *c)
{
    if (held == NULL)
        return;
    pthread_mutex_lock(&q->lock);
    for (int k = 0; k < GCD_QUOTA_KINDS; k++) {
        held->used[k] -= c->n[k];
        held->peer->used[k] -= c->n[k];
    }
    conn_unref_locked(q, held);
    pthread_mutex_unlock(&q->lock);
}

void gcd_quota_json(gcd_quota *q, strbuf *b)
{
    pthread_mutex_lock(&q->lock);
    strbuf_printf(b, "\"quota\":{\"connections\":%u,\"max_connections\":%u,"
                     "\"peer_connections\":%u,\"limits\":{",
                  q->connections, q->lim.max_connections, q->lim.peer_connections);
    for (int k = 0; k < GCD_QUOTA_KINDS; k++)
        strbuf_printf(b, "%s\"%s_per_connection\":%" PRIu64 ",\"%s_per_peer\":%" PRIu64,
                      k ? "," : "", kinds[k].key, q->lim.conn[k], kinds[k].key, q->lim.peer[k]);
    strbuf_printf(b, "},\"refused\":{\"connections\":%" PRIu64, q->refused_connections);
    for (int k = 0; k < GCD_QUOTA_KINDS; k++)
        strbuf_printf(b, ",\"%s_per_connection\":%" PRIu64 ",\"%s_per_peer\":%" PRIu64,
                      kinds[k].key, q->refused[k][0], kinds[k].key, q->refused[k][1]);
    strbuf_printf(b, "},\"peers\":[");
    for (quota_peer *p = q->peers; p != NULL; p = p->next) {
        strbuf_printf(b, "%s{\"peer\":\"", p == q->peers ? "" : ",");
        strbuf_json_escape(b, p->name);
        strbuf_printf(b, "\",\"connections\":%u", p->conns);
        for (int k = 0; k < GCD_QUOTA_KINDS; k++)
            strbuf_printf(b, ",\"%s\":%" PRIu64, kinds[k].key, p->used[k]);
        strbuf_printf(b, "}");
    }
    strbuf_printf(b, "]},");
    pthread_mutex_unlock(&q->lock);
}

void gcd_quota_refusals(gcd_quota *q, uint64_t by_kind[GCD_QUOTA_KINDS][2],
                        uint64_t *connections)
{
    pthread_mutex_lock(&q->lock);
    memcpy(by_kind, q->refused, sizeof q->refused);
    *connections = q->refused_connections;
    pthread_mutex_unlock(&q->lock);
}
