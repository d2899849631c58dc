/* stats_daemon.c - see stats_daemon.h. */
#include "stats_daemon.h"

#include <stdio.h>

#include "scrape.h"

int ts_daemon_start(th_daemon *d)
{
    const int port = ts_free_port();
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    const char *extra[] = {"--stats-listen", url, NULL};
    th_daemon_start(d, extra);
    return port;
}
