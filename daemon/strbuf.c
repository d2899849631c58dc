/* strbuf.c - see strbuf.h. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void strbuf_init(strbuf *b, size_t cap)
{
    b->len = 0;
    b->cap = cap > 0 ? cap : 64;
    b->s = malloc(b->cap);
    b->failed = b->s == NULL;
    if (b->s != NULL)
        b->s[0] = '\0';
}

static int strbuf_reserve(strbuf *b, size_t more)
{
    if (b->failed)
        return -1;
    if (b->cap - b->len > more)
        return 0;
    size_t cap = (b->len + more + 1) * 2;
    char *s = realloc(b->s, cap);
    if (s == NULL) {
        b->failed = 1;
        return -1;
    }
    b->s = s;
    b->cap = cap;
    return 0;
}

void strbuf_printf(strbuf *b, const char *fmt, ...)
{
    for (;;) {
        if (b->failed)
            return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        if (strbuf_reserve(b, (size_t)n) != 0)
            return;
    }
}

static void strbuf_putc(strbuf *b, char c)
{
    if (strbuf_reserve(b, 1) != 0)
        return;
    b->s[b->len++] = c;
    b->s[b->len] = '\0';
}

void strbuf_json_escape(strbuf *b, const char *s)
{
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            strbuf_putc(b, '\\');
            strbuf_putc(b, (char)c);
        } else if (c < 0x20) {
            strbuf_printf(b, "\\u%04x", c);
        } else {
            strbuf_putc(b, (char)c);
        }
    }
}

void strbuf_label_escape(strbuf *b, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\') {
            strbuf_putc(b, '\\');
            strbuf_putc(b, *s);
        } else if (*s == '\n') {
            strbuf_putc(b, '\\');
            strbuf_putc(b, 'n');
        } else {
            strbuf_putc(b, *s);
        }
    }
}

char *strbuf_finish(strbuf *b, size_t *len)
{
    if (b->failed) {
        free(b->s);
        b->s = NULL;
        return NULL;
    }
    if (len != NULL)
        *len = b->len;
    return b->s;
}
