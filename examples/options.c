/* The command line of the tools and the benchmarks: see options.h. */
#include "options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int option_is_help(const char *arg) { return !strcmp(arg, "-h") || !strcmp(arg, "--help"); }

int option_value(int argc, char **argv, int *i, const char **value) {
    if (*i + 1 >= argc) {
        *value = NULL;
        return 0;
    }
    *value = argv[++*i];
    return 1;
}

int parse_u32(const char *s, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > UINT32_MAX) return 0;
    *out = (uint32_t)v;
    return 1;
}

int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return 0;
    *out = (float)v;
    return 1;
}

int split_list(char *s, const char **out, int max) {
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok && n < max;
         tok = strtok_r(NULL, ",", &save))
        out[n++] = tok;
    return n;
}

void print_error(const char *fmt, va_list ap) {
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}
