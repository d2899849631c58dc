/*
 * test_quota_limits.c - quota.c alone: the limits per connection and per peer (only one uid
 * is at hand for the integration tests, so peers are made up here), charges given back
 * after a disconnect, connection limits, and the defaults derived from the configuration.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "quota.h"

static gcd_quota_limits roomy(void)
{
    gcd_quota_limits lim;
    for (int k = 0; k < GCD_QUOTA_KINDS; k++)
        lim.conn[k] = lim.peer[k] = UINT64_MAX;
    lim.max_connections = lim.peer_connections = 100;
    return lim;
}

static const gcd_charge one_region = {.n = {[GCD_QUOTA_REGIONS] = 1}};

/* The peers' holdings as /stats shows them. */
static char *json(gcd_quota *q)
{
    strbuf b;
    strbuf_init(&b, 256);
    gcd_quota_json(q, &b);
    char *s = strbuf_finish(&b, NULL);
    assert_non_null(s);
    return s;
}

static void test_peer_limit_spans_connections(void **state)
{
    (void)state;
    gcd_quota_limits lim = roomy();
    lim.conn[GCD_QUOTA_REGIONS] = 3;
    lim.peer[GCD_QUOTA_REGIONS] = 5;
    gcd_quota *q;
    assert_int_equal(gcd_quota_init(&q, &lim), 0);
    char why[256];
    assert_int_equal(gcd_quota_connect(q, 1, "uid 7", why, sizeof why), 0);
    assert_int_equal(gcd_quota_connect(q, 2, "uid 7", why, sizeof why), 0);
    assert_int_equal(gcd_quota_connect(q, 3, "tcp 10.0.0.1", why, sizeof why), 0);
    gcd_quota_conn *held[16];
    int n = 0;
    for (int i = 0; i < 3; i++)
        assert_int_equal(gcd_quota_take(q, 1, &one_region, &held[n++], why, sizeof why),
                         GCD_OK);
    gcd_quota_conn *no;
    assert_int_equal(gcd_quota_take(q, 1, &one_region, &no, why, sizeof why),
                     GCD_RESOURCE_EXHAUSTED);
    assert_null(no);
    assert_string_equal(why, "regions per connection: 3 held, 1 asked, limit 3 (--conn-regions)");
    for (int i = 0; i < 2; i++)
        assert_int_equal(gcd_quota_take(q, 2, &one_region, &held[n++], why, sizeof why),
                         GCD_OK);
    assert_int_equal(gcd_quota_take(q, 2, &one_region, &no, why, sizeof why),
                     GCD_RESOURCE_EXHAUSTED);
    assert_string_equal(why, "regions per peer: 5 held, 1 asked, limit 5 (--peer-regions)");
    /* Another peer is not held back by this one. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(gcd_quota_take(q, 3, &one_region, &held[n++], why, sizeof why),
                         GCD_OK);
    /* One given back makes room for one. */
    gcd_quota_give(q, held[0], &one_region);
    assert_int_equal(gcd_quota_take(q, 2, &one_region, &held[0], why, sizeof why), GCD_OK);
    char *s = json(q);
    assert_non_null(strstr(s, "\"refused\":{\"connections\":0,\"resident_bytes_per_connection\":0,"
                              "\"resident_bytes_per_peer\":0,\"region_count_per_connection\":1,"
                              "\"region_count_per_peer\":1,"));
    assert_non_null(strstr(s, "{\"peer\":\"uid 7\",\"connections\":2,\"resident_bytes\":0,"
                              "\"region_count\":5,"));
    free(s);
    for (int i = 0; i < n; i++)
        gcd_quota_give(q, held[i], &one_region);
    gcd_quota_fini(q);
}

static void test_bytes_named_in_units(void **state)
{
    (void)state;
    gcd_quota_limits lim = roomy();
    lim.peer[GCD_QUOTA_RESIDENT_BYTES] = 1ull << 30;
    gcd_quota *q;
    assert_int_equal(gcd_quota_init(&q, &lim), 0);
    char why[256];
    assert_int_equal(gcd_quota_connect(q, 9, "tcp ::1", why, sizeof why), 0);
    const gcd_charge most = {.n = {[GCD_QUOTA_RESIDENT_BYTES] = (1ull << 30) - 100}};
    const gcd_charge more = {.n = {[GCD_QUOTA_RESIDENT_BYTES] = 8ull << 20}};
    gcd_quota_conn *h, *no;
    assert_int_equal(gcd_quota_take(q, 9, &most, &h, why, sizeof why), GCD_OK);
    assert_int_equal(gcd_quota_take(q, 9, &more, &no, why, sizeof why), GCD_RESOURCE_EXHAUSTED);
    assert_string_equal(why, "resident bytes per peer: 1073741724 bytes held, 8 MiB asked, limit "
                             "1 GiB (--peer-resident-mb)");
    gcd_quota_give(q, h, &most);
    gcd_quota_fini(q);
}

/* A connection's holds outlive it: given back after the disconnect, nothing drifts. */
static void test_holds_outlive_the_connection(void **state)
{
    (void)state;
    gcd_quota_limits lim = roomy();
    gcd_quota *q;
    assert_int_equal(gcd_quota_init(&q, &lim), 0);
    char why[256];
    assert_int_equal(gcd_quota_connect(q, 5, "uid 1", why, sizeof why), 0);
    const gcd_charge c = {.n = {[GCD_QUOTA_REGIONS] = 1, [GCD_QUOTA_REGION_BYTES] = 4096}};
    const gcd_charge none = {.n = {0}};
    gcd_quota_conn *a, *b;
    assert_int_equal(gcd_quota_take(q, 5, &c, &a, why, sizeof why), GCD_OK);
    assert_int_equal(gcd_quota_take(q, 5, &none, &b, why, sizeof why), GCD_OK);
    assert_int_equal(gcd_quota_disconnect(q, 5), 1);
    assert_int_equal(gcd_quota_disconnect(q, 5), 0); /* once */
    /* Nothing more is charged to it... */
    gcd_quota_conn *no;
    assert_int_equal(gcd_quota_take(q, 5, &c, &no, why, sizeof why), GCD_RESOURCE_EXHAUSTED);
    assert_string_equal(why, "connection 5 is closed");
    char *s = json(q);
    assert_non_null(strstr(s, "\"connections\":0,"));
    assert_non_null(strstr(s, "\"region_count\":1,\"region_bytes\":4096,"));
    free(s);
    /* ...and what it held is given back when the objects go. */
    gcd_quota_give(q, a, &c);
    s = json(q);
    assert_non_null(strstr(s, "\"region_count\":0,\"region_bytes\":0,"));
    free(s);
    gcd_quota_give(q, b, &none);
    s = json(q);
    assert_non_null(strstr(s, "\"peers\":[]"));
    free(s);
    /* The same id may come again (nng reuses them) as a new connection. */
    assert_int_equal(gcd_quota_connect(q, 5, "uid 2", why, sizeof why), 0);
    assert_int_equal(gcd_quota_take(q, 5, &c, &a, why, sizeof why), GCD_OK);
    gcd_quota_give(q, a, &c);
    assert_int_equal(gcd_quota_disconnect(q, 5), 1);
    gcd_quota_fini(q);
}

static void test_connection_limits(void **state)
{
    (void)state;
    gcd_quota_limits lim = roomy();
    lim.max_connections = 3;
    lim.peer_connections = 2;
    gcd_quota *q;
    assert_int_equal(gcd_quota_init(&q, &lim), 0);
    char why[256];
    assert_int_equal(gcd_quota_connect(q, 1, "uid 1", why, sizeof why), 0);
    assert_int_equal(gcd_quota_connect(q, 2, "uid 1", why, sizeof why), 0);
    assert_int_equal(gcd_quota_connect(q, 3, "uid 1", why, sizeof why), -1);
    assert_string_equal(why, "connections per peer: uid 1 has 2 open, limit 2 "
                             "(--peer-connections)");
    assert_int_equal(gcd_quota_disconnect(q, 3), 0); /* refused: never counted */
    assert_int_equal(gcd_quota_connect(q, 4, "uid 2", why, sizeof why), 0);
    assert_int_equal(gcd_quota_connect(q, 5, "uid 3", why, sizeof why), -1);
    assert_string_equal(why, "connections: 3 open, limit 3 (--max-connections)");
    assert_int_equal(gcd_quota_disconnect(q, 1), 1);
    assert_int_equal(gcd_quota_connect(q, 5, "uid 3", why, sizeof why), 0);
    uint64_t refused[GCD_QUOTA_KINDS][2], refused_connections;
    gcd_quota_refusals(q, refused, &refused_connections);
    assert_int_equal(refused_connections, 2);
    gcd_quota_fini(q); /* with connections still open */
}

static void test_defaults(void **state)
{
    (void)state;
    gcd_config cfg;
    gcd_config_defaults(&cfg);
    cfg.resident_mb = 64;
    cfg.max_message_mb = 8;
    gcd_quota_limits lim;
    gcd_quota_limits_from_config(&cfg, 256, &lim);
    assert_int_equal(lim.peer[GCD_QUOTA_RESIDENT_BYTES], 32u << 20);
    assert_int_equal(lim.conn[GCD_QUOTA_RESIDENT_BYTES], 32u << 20);
    assert_int_equal(lim.peer[GCD_QUOTA_REGIONS], 4096);
    assert_int_equal(lim.conn[GCD_QUOTA_REGIONS], 1024);
    /* A request up to 1 MiB past --max-message-mb is read and answered: one always fits. */
    assert_true(lim.conn[GCD_QUOTA_INFLIGHT_BYTES] >= (8u << 20) + (1u << 20));
    assert_true(lim.peer[GCD_QUOTA_INFLIGHT_BYTES] >= 2 * lim.conn[GCD_QUOTA_INFLIGHT_BYTES]);
    /* Below the descriptor limit by the reserve, half of them for one peer. */
    assert_int_equal(lim.max_connections, 256 - gcd_quota_fd_reserve(&cfg));
    assert_int_equal(lim.peer_connections, (lim.max_connections + 1) / 2);
    gcd_quota_limits_from_config(&cfg, 20, &lim); /* no room: a few all the same */
    assert_true(lim.max_connections > 0 && lim.peer_connections > 0);

    cfg.peer_resident_mb = 10;
    cfg.conn_inflight_mb = 3;
    cfg.max_connections = 50;
    cfg.peer_connections = 60;
    gcd_quota_limits_from_config(&cfg, 256, &lim);
    assert_int_equal(lim.peer[GCD_QUOTA_RESIDENT_BYTES], 10u << 20);
    assert_int_equal(lim.conn[GCD_QUOTA_INFLIGHT_BYTES], 3u << 20);
    assert_int_equal(lim.max_connections, 50);
    assert_int_equal(lim.peer_connections, 50); /* never more than all */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peer_limit_spans_connections),
        cmocka_unit_test(test_bytes_named_in_units),
        cmocka_unit_test(test_holds_outlive_the_connection),
        cmocka_unit_test(test_connection_limits),
        cmocka_unit_test(test_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
