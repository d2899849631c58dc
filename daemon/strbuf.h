/*
 * strbuf.h - a growing string for the stats documents (/metrics, /stats, the
 * stats operation).  An allocation failure makes the buffer "failed": later
 * appends do nothing and strbuf_finish returns NULL, so callers check once.
 */
#ifndef GCD_STRBUF_H
#define GCD_STRBUF_H

#include <stddef.h>

typedef struct strbuf {
    char *s;
    size_t len, cap;
    int failed;
} strbuf;

/* Starts an empty string with room for cap bytes. */
void strbuf_init(strbuf *b, size_t cap);
void strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as the inside of a JSON string (quotes, backslashes, control bytes escaped). */
void strbuf_json_escape(strbuf *b, const char *s);
/* Appends s as a Prometheus label value (backslash, double quote and newline escaped). */
void strbuf_label_escape(strbuf *b, const char *s);
/* Returns the string (the caller frees it), or NULL after a failure; *len gets its length. */
char *strbuf_finish(strbuf *b, size_t *len);

#endif
