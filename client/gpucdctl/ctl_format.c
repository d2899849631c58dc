/*
 * ctl_format.c - how gpucdctl writes figures for people (see ctl_format.h).
 *
 * The JSON indenter re-spaces the daemon's tokens rather than parsing them
 * into values and printing those again: the numbers keep their digits, short
 * containers (a histogram's buckets, one operation's counts) stay on one line,
 * and it needs no JSON library for what is one loop over the text.  The text
 * comes from a daemon and is treated as hostile: every read is bounded, the
 * nesting is limited, and anything that is not JSON is refused.
 */
#include "ctl_format.h"

#include <stdlib.h>
#include <string.h>

char *ctl_format_us(double us, char *buf, size_t len)
{
    if (!(us >= 0)) /* NaN or negative: not a duration */
        snprintf(buf, len, "-");
    else if (us < 9.95)
        snprintf(buf, len, "%.1f us", us);
    else if (us < 999.5)
        snprintf(buf, len, "%.0f us", us);
    else if (us < 9995)
        snprintf(buf, len, "%.2f ms", us / 1e3);
    else if (us < 99950)
        snprintf(buf, len, "%.1f ms", us / 1e3);
    else if (us < 999500)
        snprintf(buf, len, "%.0f ms", us / 1e3);
    else if (us < 9.995e6)
        snprintf(buf, len, "%.2f s", us / 1e6);
    else if (us < 99.95e6)
        snprintf(buf, len, "%.1f s", us / 1e6);
    else
        snprintf(buf, len, "%.0f s", us / 1e6);
    return buf;
}

enum { JP_WIDTH = 100, JP_MAX_DEPTH = 64 };

typedef struct jp {
    const char *s;
    size_t n, i;
    FILE *out;
} jp;

static int jp_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void jp_skip(jp *p)
{
    while (p->i < p->n && jp_space(p->s[p->i]))
        p->i++;
}

/* The end of the string token that starts at i (its closing quote + 1), or 0 if none. */
static size_t jp_string_end(const char *s, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20)
            return 0;
        if (c == '\\') {
            if (++i >= n)
                return 0;
        } else if (c == '"') {
            return i + 1;
        }
    }
    return 0;
}

/* A number or true/false/null: the characters they are made of. */
static int jp_scalar_char(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '-' || c == '+' ||
           c == '.' || c == 'E';
}

/*
 * The container at i written on one line: its width (", " and ": " between tokens),
 * or a width just past JP_WIDTH once it is known not to fit, whether it holds an object
 * and whether it holds any container; -1 when it ends unterminated within that width.
 */
static int jp_flat(const char *s, size_t n, size_t i, size_t *width, int *has_object,
                   int *has_container)
{
    size_t w = 0;
    int depth = 0;
    *has_object = *has_container = 0;
    while (i < n) {
        char c = s[i];
        if (c == '"') {
            size_t e = jp_string_end(s, n, i);
            if (e == 0)
                return -1;
            w += e - i;
            i = e;
            continue;
        }
        i++;
        if (jp_space(c))
            continue;
        if (c == '{' || c == '[') {
            if (depth > 0) {
                *has_container = 1;
                *has_object |= c == '{';
            }
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) {
                *width = w + 1;
                return 0;
            }
        }
        w += c == ',' || c == ':' ? 2 : 1;
        if (w > JP_WIDTH && *has_container) { /* decided: it will not be on one line */
            *width = w;
            return 0;
        }
    }
    return -1;
}

static void jp_indent(jp *p, int indent)
{
    fputc('\n', p->out);
    for (int k = 0; k < indent; k++)
        fputc(' ', p->out);
}

/* The scalar token at p->i (a string, a number or a literal) as is; its width, or 0. */
static size_t jp_scalar(jp *p)
{
    size_t start = p->i;
    if (p->i < p->n && p->s[p->i] == '"') {
        size_t e = jp_string_end(p->s, p->n, p->i);
        if (e == 0)
            return 0;
        p->i = e;
    } else {
        while (p->i < p->n && jp_scalar_char(p->s[p->i]))
            p->i++;
    }
    fwrite(p->s + start, 1, p->i - start, p->out);
    return p->i - start;
}

/* The rest of an array of scalars too long for one line, after its '[': as many a line
 * as fit, each line indented by indent + 2. */
static int jp_fill(jp *p, int indent)
{
    size_t col = (size_t)indent + 2;
    jp_indent(p, indent + 2);
    for (;;) {
        jp_skip(p);
        size_t w = jp_scalar(p);
        if (w == 0)
            return -1;
        col += w;
        jp_skip(p);
        if (p->i >= p->n)
            return -1;
        if (p->s[p->i] == ']')
            break;
        if (p->s[p->i] != ',')
            return -1;
        p->i++;
        fputc(',', p->out);
        /* the next token's width, to break the line before it rather than after */
        size_t next = p->i;
        while (next < p->n && jp_space(p->s[next]))
            next++;
        for (w = 0; next + w < p->n && p->s[next + w] != ',' && p->s[next + w] != ']';)
            w++;
        if (col + 2 + w > JP_WIDTH) {
            jp_indent(p, indent + 2);
            col = (size_t)indent + 2;
        } else {
            fputc(' ', p->out);
            col += 2;
        }
    }
    jp_indent(p, indent);
    fputc(']', p->out);
    p->i++;
    return 0;
}

/* One value at p->i, written at column col of a line indented by indent; 0 or -1. */
static int jp_value(jp *p, int indent, size_t col, int flat, int depth)
{
    jp_skip(p);
    if (p->i >= p->n)
        return -1;
    char c = p->s[p->i];
    if (c != '{' && c != '[')
        return jp_scalar(p) > 0 ? 0 : -1;
    if (depth >= JP_MAX_DEPTH)
        return -1;
    char close = c == '{' ? '}' : ']';
    int fill = 0;
    if (!flat) {
        size_t width;
        int has_object, has_container;
        if (jp_flat(p->s, p->n, p->i, &width, &has_object, &has_container) != 0)
            return -1;
        flat = !has_object && col + width <= JP_WIDTH;
        fill = !flat && c == '[' && !has_container;
    }
    fputc(c, p->out);
    p->i++;
    jp_skip(p);
    if (p->i < p->n && p->s[p->i] == close) {
        fputc(close, p->out);
        p->i++;
        return 0;
    }
    if (fill)
        return jp_fill(p, indent);
    for (;;) {
        size_t at = (size_t)indent + 2;
        if (!flat)
            jp_indent(p, indent + 2);
        jp_skip(p);
        if (c == '{') {
            size_t e = p->i < p->n && p->s[p->i] == '"' ? jp_string_end(p->s, p->n, p->i) : 0;
            if (e == 0)
                return -1;
            fwrite(p->s + p->i, 1, e - p->i, p->out);
            at += e - p->i + 2;
            p->i = e;
            jp_skip(p);
            if (p->i >= p->n || p->s[p->i] != ':')
                return -1;
            p->i++;
            fputs(": ", p->out);
        }
        if (jp_value(p, indent + 2, at, flat, depth + 1) != 0)
            return -1;
        jp_skip(p);
        if (p->i >= p->n)
            return -1;
        if (p->s[p->i] == close)
            break;
        if (p->s[p->i] != ',')
            return -1;
        p->i++;
        fputs(flat ? ", " : ",", p->out);
    }
    if (!flat)
        jp_indent(p, indent);
    fputc(close, p->out);
    p->i++;
    return 0;
}

int ctl_json_pretty(FILE *out, const char *json, size_t len, size_t *at)
{
    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    if (mem == NULL) {
        *at = 0;
        return -1;
    }
    jp p = {json, len, 0, mem};
    int rc = jp_value(&p, 0, 0, 0, 0);
    jp_skip(&p);
    if (rc == 0 && p.i != p.n)
        rc = -1;
    if (fclose(mem) != 0)
        rc = -1;
    if (rc == 0) {
        fwrite(text, 1, text_len, out);
        fputc('\n', out);
    }
    *at = p.i;
    free(text);
    return rc;
}
