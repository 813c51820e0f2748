/* The command line of the tools (examples/) and the benchmarks (bench/): walking argv (help,
 * an option's value) and reading values strictly (unsigned and float numbers, comma-separated
 * lists). Each program keeps its own option names, messages and exit statuses. */
#ifndef PARITY_OPTIONS_H
#define PARITY_OPTIONS_H

#include <stdarg.h>
#include <stdint.h>

/* 1 if `arg` asks for help: -h or --help. */
int option_is_help(const char *arg);

/* The value of the option at argv[*i]: 1 with *value = argv[*i + 1] and *i moved onto it; 0
 * (nothing moved, *value NULL) when argv ends at the option. */
int option_value(int argc, char **argv, int *i, const char **value);

/* A whole decimal number in 0..UINT32_MAX (no sign, nothing after it): 1 and *out, or 0. */
int parse_u32(const char *s, uint32_t *out);

/* A whole floating-point number (nothing after it; out of double's range is an error), as a
 * float: 1 and *out, or 0. */
int parse_float(const char *s, float *out);

/* Splits the comma-separated list `s` in place into at most `max` non-empty items; returns
 * how many. */
int split_list(char *s, const char **out, int max);

/* "error: " and the message of fmt and ap on stderr, with a newline: how every tool reports
 * a failure before returning or exiting with its status. */
void print_error(const char *fmt, va_list ap);

#endif
