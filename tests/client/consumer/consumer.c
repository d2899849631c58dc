/* A program outside the project that uses the installed libgpucd. */
#include <stdio.h>
#include <string.h>

#include <gpucd.h>

int main(int argc, char **argv)
{
    char url[256];
    if (gpucd_default_url(url, sizeof url) != 0 || strncmp(url, "ipc://", 6) != 0) {
        fprintf(stderr, "consumer: gpucd_default_url failed\n");
        return 1;
    }
    /* argv[1]: a socket path nothing listens on */
    gpucd_client *client;
    int rv = gpucd_connect(argc > 1 ? argv[1] : "ipc:///nonexistent/gpucd.sock", NULL, &client);
    if (rv != GPUCD_ECONNREFUSED) {
        fprintf(stderr, "consumer: connect gave %d (%s), want GPUCD_ECONNREFUSED\n", rv,
                gpucd_strerror(rv));
        return 1;
    }
    printf("libgpucd %s: %s\n", gpucd_version_string(), gpucd_strerror(rv));
    return 0;
}
