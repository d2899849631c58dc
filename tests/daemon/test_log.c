/*
 * test_log.c - daemon/log.c's lines: with stderr the journal's stream ($JOURNAL_STREAM names
 * its device and inode), each line starts with its syslog priority (<3> error, <4> warn, <6>
 * info, <7> debug); without the variable, with one naming another file, or a malformed one,
 * lines start with their timestamp and carry no prefix.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

/*
 * Logs one line at each level with stderr on a fresh file and JOURNAL_STREAM as js (NULL:
 * unset, "SELF...": that file's own device and inode, then the rest); returns the file's text
 * (free it).
 */
static char *log_all_levels(const char *js)
{
    char path[] = "/tmp/gpucd-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    char self[64];
    snprintf(self, sizeof self, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    if (js == NULL)
        unsetenv("JOURNAL_STREAM");
    else
        setenv("JOURNAL_STREAM", js, 1);
    if (js != NULL && strncmp(js, "SELF", 4) == 0) { /* this file's, then what follows SELF */
        char v[96];
        snprintf(v, sizeof v, "%s%s", self, js + 4);
        setenv("JOURNAL_STREAM", v, 1);
    }
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    gcd_log_init();
    gcd_log_set_level(GCD_LOG_DEBUG);
    gcd_log_error("an error %d", 1);
    gcd_log_warn("a warning");
    gcd_log_info("some news");
    gcd_log_debug("a detail");
    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    unsetenv("JOURNAL_STREAM");
    gcd_log_init();
    char *text = calloc(1, 4096);
    assert_non_null(text);
    assert_true(pread(fd, text, 4095, 0) > 0);
    close(fd);
    unlink(path);
    return text;
}

static void test_journal_lines_carry_priorities(void **state)
{
    char *text = log_all_levels("SELF");
    assert_string_equal(text, "<3>error: an error 1\n<4>warn: a warning\n<6>info: some news\n"
                              "<7>debug: a detail\n");
    free(text);
}

/* Plain lines: each starts with a timestamp, "2026-12-07T20:00:00.000Z gpucd error: ...". */
static void assert_plain(const char *text)
{
    static const char *const levels[] = {"error: an error 1", "warn: a warning",
                                         "info: some news", "debug: a detail"};
    const char *line = text;
    for (int i = 0; i < 4; i++) {
        const char *nl = strchr(line, '\n');
        assert_non_null(nl);
        if (line[0] < '0' || line[0] > '9' || line[4] != '-' || line[23] != 'Z')
            fail_msg("not a timestamped line: %.*s", (int)(nl - line), line);
        const char *tail = line + 25; /* past the timestamp and "gpucd " */
        if (strncmp(line + 25, "gpucd ", 6) == 0)
            tail += 6;
        else
            fail_msg("no program name: %.*s", (int)(nl - line), line);
        assert_int_equal(strncmp(tail, levels[i], strlen(levels[i])), 0);
        line = nl + 1;
    }
    assert_string_equal(line, "");
}

static void test_plain_lines_elsewhere(void **state)
{
    static const char *const cases[] = {NULL, "1:2", "", "garbage", "12", "SELFx", "SELF0"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = log_all_levels(cases[i]);
        assert_plain(text);
        free(text);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_journal_lines_carry_priorities),
        cmocka_unit_test(test_plain_lines_elsewhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
