/*
 * test_backend_choice.c - without a usable CUDA device, --backend cuda refuses to start naming
 * why, and --backend auto logs why it serves on the CPU.
 *
 * Where the CUDA backend is built and no device is usable (no GPU, or no driver), the reason is
 * the CUDA runtime's own error, which this test asks the runtime for itself.  Where the build
 * has no CUDA backend, the reason is that.  Where a device is usable there is nothing to test:
 * skipped (77).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

#if GPUCD_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Why the daemon finds no usable device: what its message must contain. */
static char reason[2][256];

static void test_cuda_refused(void **state)
{
    (void)state;
    char text[8192];
    const int status = th_daemon_run_refused((const char *[]){"--backend", "cuda", NULL}, text,
                                             sizeof text);
    if (status != 1)
        fail_msg("the daemon exited %d, not 1; its output: %s", status, text);
    const char *lacks = th_text_lacks(
        text, (const char *[]){"--backend cuda: ", reason[0], reason[1], "--backend cpu", NULL});
    if (lacks != NULL)
        fail_msg("the daemon's message does not mention '%s': %s", lacks, text);
}

static void test_auto_says_why(void **state)
{
    (void)state;
    th_daemon d;
    th_daemon_start(&d, (const char *[]){"--backend", "auto", NULL});
    char text[16384] = "";
    FILE *f = fopen(d.log_path, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    const char *lacks = th_text_lacks(
        text, (const char *[]){"backend auto: using cpu, since ", reason[0], reason[1], NULL});
    if (lacks != NULL) {
        th_daemon_dump_log(&d);
        fail_msg("the daemon's log does not say '%s'", lacks);
    }
    assert_int_equal(th_daemon_stop(&d), 0);
}

int main(int argc, char **argv)
{
    th_init(argc, argv);
#if GPUCD_TEST_HAVE_CUDA
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count > 0) {
        printf("SKIPPED: a CUDA device is usable (%d)\n", count);
        return 77;
    }
    if (e != cudaSuccess)
        snprintf(reason[0], sizeof reason[0], "no usable CUDA device: cudaGetDeviceCount: %s",
                 cudaGetErrorString(e));
    else
        snprintf(reason[0], sizeof reason[0], "no usable CUDA device: --device 0");
    snprintf(reason[1], sizeof reason[1], "%s", e != cudaSuccess ? cudaGetErrorName(e)
                                                                 : "the machine has 0");
#else
    snprintf(reason[0], sizeof reason[0], "this build has no CUDA backend");
    snprintf(reason[1], sizeof reason[1], "GPUCD_CUDA=OFF");
#endif
    printf("expecting: %s (%s)\n", reason[0], reason[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_refused),
        cmocka_unit_test(test_auto_says_why),
    };
    return th_run_group_tests(tests, NULL, NULL);
}
