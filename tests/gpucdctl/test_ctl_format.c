/*
 * test_ctl_format.c - gpucdctl's output for people: durations in the unit that
 * fits, and the daemon's JSON indented (still JSON, its tokens unchanged), with
 * anything that is not JSON refused whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ctl_format.h"

static void test_units(void **state)
{
    static const struct {
        double us;
        const char *text;
    } cases[] = {
        {0, "0.0 us"},         {0.44, "0.4 us"},     {9.9, "9.9 us"},      {10, "10 us"},
        {812.4, "812 us"},     {999.4, "999 us"},    {999.6, "1.00 ms"},   {9312, "9.31 ms"},
        {12345, "12.3 ms"},    {412000, "412 ms"},   {999600, "1.00 s"},   {4952794, "4.95 s"},
        {9.3e6, "9.30 s"},     {12.3e6, "12.3 s"},   {3600e6, "3600 s"},   {-1, "-"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[16];
        assert_string_equal(ctl_format_us(cases[i].us, buf, sizeof buf), cases[i].text);
    }
}

/* The text ctl_json_pretty writes for json, or NULL when it refuses it (*at: where). */
static char *pretty(const char *json, size_t *at)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    int rc = ctl_json_pretty(f, json, strlen(json), at);
    fclose(f);
    if (rc != 0) {
        assert_int_equal(len, 0); /* nothing written */
        free(text);
        return NULL;
    }
    return text;
}

static void test_indents_objects_keeps_short_ones_on_a_line(void **state)
{
    size_t at;
    char *t = pretty("{\"a\":1,\"b\":{\"c\":[1,2,3],\"d\":\"x,y:{z}\"},\"e\":{\"f\":{\"g\":true}},"
                     "\"h\":[],\"i\":{},\"j\":[{\"k\":null}],\"n\":-1.5e-05}",
                     &at);
    assert_non_null(t);
    assert_string_equal(t, "{\n"
                           "  \"a\": 1,\n"
                           "  \"b\": {\"c\": [1, 2, 3], \"d\": \"x,y:{z}\"},\n"
                           "  \"e\": {\n"
                           "    \"f\": {\"g\": true}\n"
                           "  },\n"
                           "  \"h\": [],\n"
                           "  \"i\": {},\n"
                           "  \"j\": [\n"
                           "    {\"k\": null}\n"
                           "  ],\n"
                           "  \"n\": -1.5e-05\n"
                           "}\n");
    free(t);
}

/* An array of scalars too long for a line fills lines of 100 columns at most. */
static void test_long_arrays_fill_lines(void **state)
{
    char json[2048] = "{\"buckets\":[";
    for (int i = 0; i < 100; i++)
        snprintf(json + strlen(json), sizeof json - strlen(json), "%s%d", i ? "," : "", 1000 + i);
    strcat(json, "]}");
    size_t at;
    char *t = pretty(json, &at);
    assert_non_null(t);
    int lines = 0;
    for (char *line = strtok(t, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        assert_true(strlen(line) <= 100);
        lines++;
    }
    /* "{", the key, 7 lines of 16 numbers (4 digits and ", " after 4 columns of indent:
     * 16 x 6 = 96), "]" and "}" */
    assert_int_equal(lines, 2 + 7 + 2);
    free(t);
}

static void test_refuses_what_is_not_json(void **state)
{
    static const char *const bad[] = {
        "",          "{",          "{\"a\":1",       "{\"a\" 1}",    "{\"a\":1,}",
        "{1:2}",     "[1 2]",      "{\"a\":\"x",     "\"a\\",        "{\"a\":1}}",
        "{\"a\":1} x", "[,]",      "{\"a\":\"\x01\"}", "@",          "[1,{\"b\":}]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t at = 12345;
        char *t = pretty(bad[i], &at);
        if (t != NULL)
            fail_msg("accepted '%s' as JSON: %s", bad[i], t);
        assert_true(at <= strlen(bad[i]));
    }
    /* nesting past 64 levels is refused, not recursed into; 64 are written */
    char deep[201];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    deep[200] = '\0';
    size_t at;
    assert_null(pretty(deep, &at));
    memset(deep, '[', 64);
    memset(deep + 64, ']', 64);
    deep[128] = '\0';
    char *t = pretty(deep, &at);
    assert_non_null(t);
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units),
        cmocka_unit_test(test_indents_objects_keeps_short_ones_on_a_line),
        cmocka_unit_test(test_long_arrays_fill_lines),
        cmocka_unit_test(test_refuses_what_is_not_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
