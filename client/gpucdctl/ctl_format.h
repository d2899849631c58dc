/*
 * ctl_format.h - how gpucdctl writes figures for people: times in the unit
 * that fits, and the daemon's JSON indented.
 */
#ifndef GPUCD_CTL_FORMAT_H
#define GPUCD_CTL_FORMAT_H

#include <stddef.h>
#include <stdio.h>

/* A duration of `us` microseconds with three significant digits or fewer in us, ms or s:
 * "0.4 us", "812 us", "9.31 ms", "12.3 s".  Writes at most len bytes; returns buf. */
char *ctl_format_us(double us, char *buf, size_t len);

/*
 * Writes the JSON text json[0..len) to out indented by two spaces a level, its
 * tokens as they came (numbers keep the daemon's digits).  A container that
 * holds no object is written on one line when that fits in 100 columns.
 * Returns 0, or -1 with nothing written and *at set to the byte offset where
 * the text stopped being JSON.
 */
int ctl_json_pretty(FILE *out, const char *json, size_t len, size_t *at);

#endif
