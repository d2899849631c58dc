/*
 * gpucdctl - asks a running gpucd daemon what it is and how it is doing.
 *
 *   gpucdctl [--url URL] [--timeout-ms N] [--spin-us N] [--trust-uid UID] [--tls-ca FILE]
 *            [--tls-cert FILE] [--tls-key FILE] COMMAND
 *
 * Each command is one entry of the table below: a name, a one-line summary
 * and a function that prints what the daemon reports and returns an exit code.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "ctl_format.h"
#include "gpucd.h"

typedef struct ctl_command {
    const char *name;
    const char *summary;
    int (*run)(gpucd_client *client, int argc, char **argv);
    /* Optional: checks the command's arguments before connecting; 0 or exit status 2. */
    int (*check)(int argc, char **argv);
} ctl_command;

/* Prints why the call failed and gives the exit status. */
static int ctl_fail(const char *what, int code)
{
    const char *msg = gpucd_errmsg(NULL);
    if (msg[0] != '\0')
        fprintf(stderr, "gpucdctl: %s: %s (%s)\n", what, msg, gpucd_strerror(code));
    else
        fprintf(stderr, "gpucdctl: %s: %s\n", what, gpucd_strerror(code));
    return 1;
}

static void print_bytes(const char *label, uint64_t bytes)
{
    if (bytes >= (uint64_t)INT64_MAX) /* what the daemon reports for "no limit" */
        printf("%-20s no limit\n", label);
    else if (bytes >= (1ull << 30))
        printf("%-20s %.2f GiB (%llu bytes)\n", label, (double)bytes / (1ull << 30),
               (unsigned long long)bytes);
    else if (bytes >= (1ull << 20))
        printf("%-20s %.2f MiB (%llu bytes)\n", label, (double)bytes / (1ull << 20),
               (unsigned long long)bytes);
    else
        printf("%-20s %llu bytes\n", label, (unsigned long long)bytes);
}

static int cmd_info(gpucd_client *client, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    gpucd_info info;
    int rv = gpucd_info_get(client, &info);
    if (rv < 0)
        return ctl_fail("info", rv);
    printf("%-20s %u (this gpucdctl speaks %d)\n", "protocol", info.protocol_version,
           GPUCD_PROTOCOL_VERSION);
    printf("%-20s %s\n", "server version", info.server_version);
    printf("%-20s %s\n", "backend", info.backend);
    printf("%-20s %s\n", "device", info.device_name);
    printf("%-20s %u\n", "SM count", info.sm_count);
    print_bytes("device memory", info.device_memory_bytes);
    printf("%-20s %s\n", "ready", info.ready ? "yes" : "no");
    printf("%-20s %llu\n", "device allocations", (unsigned long long)info.device_allocations);
    print_bytes("max message", info.max_message_bytes);
    printf("%-20s %u\n", "max in flight", info.max_inflight);
    print_bytes("workspace", info.workspace_bytes);
    printf("%-20s %u\n", "max dims", info.max_dims);
    print_bytes("max region", info.max_region_bytes);
    printf("%-20s", "operations");
    for (int i = 0; i < info.operation_count; i++)
        printf(" %s", info.operations[i]);
    printf("\n");
    return 0;
}

/* ping [COUNT]: COUNT in 1..1000000, default 1; -1 when malformed. */
static int ping_count(int argc, char **argv)
{
    if (argc < 2)
        return 1;
    char *end;
    long n = strtol(argv[1], &end, 10);
    if (*end != '\0' || n < 1 || n > 1000000)
        return -1;
    return (int)n;
}

/* For commands that take no arguments. */
static int check_no_args(int argc, char **argv)
{
    if (argc > 1) {
        fprintf(stderr, "gpucdctl: %s: unexpected argument '%s'\n", argv[0], argv[1]);
        return 2;
    }
    return 0;
}

static int check_ping(int argc, char **argv)
{
    if (argc > 2) {
        fprintf(stderr, "gpucdctl: ping: unexpected argument '%s'\n", argv[2]);
        return 2;
    }
    if (ping_count(argc, argv) < 0) {
        fprintf(stderr, "gpucdctl: ping: COUNT '%s' is not a number in 1..1000000\n", argv[1]);
        return 2;
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The round trips of `ping N`, least to most, as one line. */
static void ping_summary(uint64_t *rtt, int n)
{
    qsort(rtt, (size_t)n, sizeof *rtt, cmp_u64);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += (double)rtt[i];
    double median = n % 2 ? (double)rtt[n / 2] : ((double)rtt[n / 2 - 1] + (double)rtt[n / 2]) / 2;
    char lo[16], med[16], mean[16], hi[16];
    printf("%d ping%s: round trip min %s, median %s, mean %s, max %s\n", n, n == 1 ? "" : "s",
           ctl_format_us((double)rtt[0], lo, sizeof lo), ctl_format_us(median, med, sizeof med),
           ctl_format_us(sum / n, mean, sizeof mean),
           ctl_format_us((double)rtt[n - 1], hi, sizeof hi));
}

static int cmd_ping(gpucd_client *client, int argc, char **argv)
{
    int count = ping_count(argc, argv);
    if (count < 1)
        return 2; /* check_ping refused it already */
    uint64_t *rtt = malloc((size_t)count * sizeof *rtt);
    if (rtt == NULL) {
        fprintf(stderr, "gpucdctl: ping: out of memory\n");
        return 1;
    }
    for (int i = 0; i < count; i++) {
        gpucd_timings t;
        int rv = gpucd_ping(client, &t);
        if (rv < 0) {
            free(rtt);
            return ctl_fail("ping", rv);
        }
        rtt[i] = t.round_trip_us;
        char trip[16], total[16], queue[16];
        printf("ping %d: round trip %s (daemon: total %s, queue %s)\n", i + 1,
               ctl_format_us((double)t.round_trip_us, trip, sizeof trip),
               ctl_format_us((double)t.total_us, total, sizeof total),
               ctl_format_us((double)t.queue_us, queue, sizeof queue));
    }
    ping_summary(rtt, count);
    free(rtt);
    return 0;
}

static int cmd_regions(gpucd_client *client, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    gpucd_region_info *list;
    size_t n;
    int rv = gpucd_regions_list(client, &list, &n);
    if (rv < 0)
        return ctl_fail("regions", rv);
    /* Region ids are per connection: a fresh gpucdctl connection sees its own (none). */
    printf("%zu region%s\n", n, n == 1 ? "" : "s");
    if (n > 0)
        printf("%-20s %-16s %-6s %s\n", "id", "size", "users", "name");
    for (size_t i = 0; i < n; i++)
        printf("%-20llu %-16llu %-6u %s\n", (unsigned long long)list[i].id,
               (unsigned long long)list[i].size, list[i].users, list[i].name);
    free(list);
    return 0;
}

static int check_stats(int argc, char **argv)
{
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "--json") != 0)) {
        fprintf(stderr, "gpucdctl: stats: unexpected argument '%s' (only --json)\n",
                argv[argc - 1]);
        return 2;
    }
    return 0;
}

/* The daemon's JSON indented for people, or with --json on one line as the daemon sent it. */
static int cmd_stats(gpucd_client *client, int argc, char **argv)
{
    char *json;
    int rv = gpucd_stats_json(client, &json);
    if (rv < 0)
        return ctl_fail("stats", rv);
    int status = 0;
    size_t at;
    if (argc == 2) {
        printf("%s\n", json);
    } else if (ctl_json_pretty(stdout, json, strlen(json), &at) != 0) {
        fprintf(stderr, "gpucdctl: stats: the daemon's reply is not JSON (at byte %zu); "
                        "stats --json prints it as it came\n",
                at);
        status = 1;
    }
    free(json);
    return status;
}

static const char *ctl_url; /* --url, for bench (NULL: the default) */
static uint64_t ctl_trust_uid; /* for bench's own connection (--server-side) */

static int cmd_bench(gpucd_client *client, int argc, char **argv)
{
    return bench_main(client, ctl_url, ctl_trust_uid, argc, argv);
}

static const ctl_command ctl_commands[] = {
    {"info", "the daemon's version, backend, device, limits and operations", cmd_info,
     check_no_args},
    {"ping", "[COUNT] round trips through the daemon, with timings", cmd_ping, check_ping},
    {"regions", "the shared-memory regions registered on this connection", cmd_regions,
     check_no_args},
    {"stats", "[--json] the daemon's counters and histograms, indented (--json: as sent)",
     cmd_stats, check_stats},
    {"bench", "[OPTIONS] drive the daemon with an operation and measure (bench --help)",
     cmd_bench, bench_check_args},
};

static void usage(FILE *out)
{
    char url[512];
    if (gpucd_default_url(url, sizeof url) < 0)
        snprintf(url, sizeof url, "(none: %s)", gpucd_errmsg(NULL));
    fprintf(out,
            "usage: gpucdctl [--url URL] [--timeout-ms N] [--spin-us N] [--trust-uid UID]\n"
            "                [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] COMMAND [ARGS]\n"
            "\n"
            "Asks a running gpucd daemon what it reports.\n"
            "\n"
            "options:\n"
            "  --url URL         the daemon's address, ipc://PATH, tls+tcp://HOST:PORT or\n"
            "                    tcp://HOST:PORT (default %s)\n"
            "  --timeout-ms N    how long to wait for each reply (default 30000)\n"
            "  --spin-us N       poll for each reply N us before sleeping (default 0)\n"
            "  --trust-uid UID   over ipc://, the uid the daemon must run as (default\n"
            "                    $GPUCD_TRUST_UID, else this user's)\n"
            "  --tls-ca FILE     tls+tcp://: the CA that signs the daemon's certificate\n"
            "                    (PEM; default $GPUCD_TLS_CA)\n"
            "  --tls-cert FILE   tls+tcp://: this client's certificate (default $GPUCD_TLS_CERT)\n"
            "  --tls-key FILE    tls+tcp://: its private key (default $GPUCD_TLS_KEY)\n"
            "  -h, --help        this help\n"
            "  --version         gpucdctl's version, its library's and its protocol's\n"
            "\n"
            "commands:\n",
            url);
    for (size_t i = 0; i < sizeof ctl_commands / sizeof ctl_commands[0]; i++)
        fprintf(out, "  %-16s  %s\n", ctl_commands[i].name, ctl_commands[i].summary);
    fprintf(out, "\nExit status: 0 on success, 1 when the daemon cannot be reached or refuses, "
                 "2 on a usage error.\n");
}

/* A whole number in lo..hi for option name, or a message and -1. */
static int option_int(const char *name, const char *text, long lo, long hi, int *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "gpucdctl: %s '%s' is not a number in %ld..%ld\n", name, text, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* A uid for --trust-uid, or a message and -1. */
static int option_uid(const char *text, unsigned *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end != '\0' || errno != 0 || v >= UINT32_MAX) {
        fprintf(stderr, "gpucdctl: --trust-uid '%s' is not a uid\n", text);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"url", required_argument, NULL, 'u'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"spin-us", required_argument, NULL, 's'},
        {"tls-ca", required_argument, NULL, 'A'},
        {"tls-cert", required_argument, NULL, 'C'},
        {"tls-key", required_argument, NULL, 'K'},
        {"trust-uid", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    const char *url = NULL;
    gpucd_options opts;
    gpucd_options_init(&opts);
    opts.client_name = "gpucdctl";
    int c;
    /* "+": stop at the command, whose own arguments follow it */
    while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
        switch (c) {
        case 'u':
            url = optarg;
            break;
        case 't':
            if (option_int("--timeout-ms", optarg, 1, 86400000, &opts.timeout_ms) != 0)
                return 2;
            break;
        case 's':
            if (option_int("--spin-us", optarg, 0, 1000000, &opts.spin_us) != 0)
                return 2;
            break;
        case 'A':
            opts.tls_ca = optarg;
            break;
        case 'C':
            opts.tls_cert = optarg;
            break;
        case 'K':
            opts.tls_key = optarg;
            break;
        case 'r':
            if (option_uid(optarg, &opts.trust_uid) != 0)
                return 2;
            opts.trust_uid_set = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("gpucdctl %s (libgpucd %s, protocol %d)\n", GPUCD_VERSION_STRING,
                   gpucd_version_string(), GPUCD_PROTOCOL_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "gpucdctl: no command given\n\n");
        usage(stderr);
        return 2;
    }
    const ctl_command *cmd = NULL;
    for (size_t i = 0; i < sizeof ctl_commands / sizeof ctl_commands[0]; i++) {
        if (strcmp(argv[optind], ctl_commands[i].name) == 0)
            cmd = &ctl_commands[i];
    }
    if (cmd == NULL) {
        fprintf(stderr, "gpucdctl: unknown command '%s' (see gpucdctl --help)\n", argv[optind]);
        return 2;
    }
    if (cmd->check != NULL) {
        int status = cmd->check(argc - optind, argv + optind);
        if (status != 0)
            return status;
    }
    ctl_url = url;
    int rv = gpucd_trusted_uid(&opts, &ctl_trust_uid);
    if (rv < 0)
        return ctl_fail("connect", rv);
    gpucd_client *client;
    rv = gpucd_connect(url, &opts, &client);
    if (rv < 0)
        return ctl_fail("connect", rv);
    int status = cmd->run(client, argc - optind, argv + optind);
    gpucd_close(client);
    return status;
}
