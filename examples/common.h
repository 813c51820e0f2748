/* Small helpers shared by the command-line tools: reading token files, parsing numbers. */
#ifndef PARITY_EXAMPLES_COMMON_H
#define PARITY_EXAMPLES_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parity.h"

/* Reads a whole file; returns NULL (and prints why) on failure. */
static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        unsigned char *grown = realloc(buf, cap *= 2);
        if (!grown) free(buf);
        buf = grown;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        fprintf(stderr, "error: %s: %s\n", path, buf ? "read error" : "out of memory");
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* --bytes FILE: each byte is a token id. --tokens FILE: whitespace-separated decimal ids. */
static int32_t *read_tokens(const char *path, int as_bytes, uint32_t *count) {
    size_t len;
    unsigned char *data = read_file(path, &len);
    if (!data) return NULL;
    int32_t *tok = malloc((len + 1) * sizeof *tok);
    size_t n = 0;
    if (tok && as_bytes) {
        for (size_t i = 0; i < len; i++) tok[n++] = data[i];
    } else if (tok) {
        size_t i = 0;
        while (i < len) {
            while (i < len && strchr(" \t\r\n", data[i])) i++;
            if (i == len) break;
            char num[32];
            size_t k = 0;
            while (i < len && !strchr(" \t\r\n", data[i]) && k < sizeof num - 1) num[k++] = (char)data[i++];
            num[k] = '\0';
            char *end;
            errno = 0;
            long v = strtol(num, &end, 10);
            if (*end || errno || v < INT32_MIN || v > INT32_MAX || (i < len && !strchr(" \t\r\n", data[i]))) {
                fprintf(stderr, "error: %s: '%s' is not a token id\n", path, num);
                free(tok);
                free(data);
                return NULL;
            }
            tok[n++] = (int32_t)v;
        }
    }
    free(data);
    if (!tok) fprintf(stderr, "error: out of memory\n");
    *count = (uint32_t)n;
    return tok;
}

static int parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return 0;
    *out = (float)v;
    return 1;
}

static int parse_uint(const char *s, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > UINT32_MAX) return 0;
    *out = (uint32_t)v;
    return 1;
}

/* --backend bf16|openblas */
static int parse_backend(const char *s, uint32_t *out) {
    if (!strcmp(s, "bf16")) *out = PARITY_BACKEND_BF16;
    else if (!strcmp(s, "openblas")) *out = PARITY_BACKEND_OPENBLAS;
    else return 0;
    return 1;
}

/* --logprob-mode raw|processed|processed-truncated */
static int parse_logprob_mode(const char *s, uint32_t *out) {
    if (!strcmp(s, "raw")) *out = PARITY_LOGPROB_RAW;
    else if (!strcmp(s, "processed")) *out = PARITY_LOGPROB_PROCESSED;
    else if (!strcmp(s, "processed-truncated")) *out = PARITY_LOGPROB_PROCESSED_TRUNCATED;
    else return 0;
    return 1;
}

#endif
