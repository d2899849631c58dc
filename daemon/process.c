/* process.c - see process.h.  proc(5) describes the files read. */
#include "process.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* /proc/stat's btime: when the machine booted, in Unix seconds. */
static int boot_time(double *out)
{
    FILE *f = fopen("/proc/stat", "re");
    if (f == NULL)
        return -1;
    char line[256];
    int rc = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "btime ", 6) == 0) {
            *out = strtod(line + 6, NULL);
            rc = 0;
            break;
        }
    fclose(f);
    return rc;
}

/* The entries of /proc/self/fd less the one this reading holds open. */
static int open_fds(uint64_t *out)
{
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL)
        return -1;
    uint64_t n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(dir);
    *out = n > 0 ? n - 1 : 0;
    return 0;
}

int gcd_process_read(gcd_process *p)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "re");
    if (f == NULL)
        return -1;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    /* The command name (field 2) is in parentheses and may hold spaces: fields count after it. */
    char *f3 = strrchr(buf, ')');
    if (f3 == NULL || f3[1] != ' ')
        return -1;
    enum { UTIME = 14, STIME = 15, STARTTIME = 22, VSIZE = 23, RSS = 24 };
    unsigned long long field[RSS + 1] = {0};
    char *save, *tok = strtok_r(f3 + 2, " ", &save);
    int n = 3;
    for (; tok != NULL && n <= RSS; tok = strtok_r(NULL, " ", &save), n++)
        field[n] = strtoull(tok, NULL, 10); /* rss, signed, is never negative */
    if (n <= RSS)
        return -1;
    const double tick = (double)sysconf(_SC_CLK_TCK);
    double boot;
    if (tick <= 0 || boot_time(&boot) != 0 || open_fds(&p->open_fds) != 0)
        return -1;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    p->cpu_seconds = (double)(field[UTIME] + field[STIME]) / tick;
    p->start_time = boot + (double)field[STARTTIME] / tick;
    p->virtual_bytes = field[VSIZE];
    p->resident_bytes = field[RSS] * (uint64_t)sysconf(_SC_PAGESIZE);
    p->max_fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
    return 0;
}
