/* Small helpers shared by the command-line tools: reading token files, the options every tool
 * takes (on options.h, the parser the benchmarks share), failures and usage lists. */
#ifndef PARITY_EXAMPLES_COMMON_H
#define PARITY_EXAMPLES_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
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

/* The option at argv[*i] and its value, *i moved past both. Returns 0, or the exit status to
 * return now after usage(): 0 for -h/--help, 2 for an option without a value. */
static int next_option(int argc, char **argv, int *i, void (*usage)(void), const char **opt,
                       const char **val) {
    *opt = argv[*i];
    int help = option_is_help(*opt);
    if (!help && option_value(argc, argv, i, val)) return -1;
    if (!help) fprintf(stderr, "error: %s needs a value\n", *opt);
    usage();
    return help ? 0 : 2;
}

/* A failed library call: its status and message on stderr; the tools' exit status 1. */
static int fail(const char *what, int status) {
    fprintf(stderr, "error: %s: %s: %s\n", what, parity_status_name(status), parity_last_error());
    return 1;
}

/* The library's names, for usage messages: a NULL-terminated list, or the names of the values
 * 0, 1, ... of an enumeration (name() is NULL past the last). */
static void print_names(const char *const *names, const char *sep) {
    for (size_t i = 0; names[i]; i++) fprintf(stderr, "%s%s", i ? sep : "", names[i]);
}

static void print_value_names(const char *(*name)(int), const char *sep) {
    for (int v = 0; name(v); v++) fprintf(stderr, "%s%s", v ? sep : "", name(v));
}

/* The choices of the options every tool takes, after its usage line. */
static void print_choices(void) {
    fprintf(stderr, "presets: ");
    print_names(parity_policy_preset_names(), " ");
    fprintf(stderr, " (+aligned, +fp32-head)\nbackends: ");
    print_value_names(parity_backend_name, " ");
    fprintf(stderr, "\nlog-prob modes: ");
    print_value_names(parity_logprob_mode_name, " ");
    fprintf(stderr, "\nbuilt-in models (synthetic:NAME[:SEED]): ");
    print_names(parity_config_builtin_names(), " ");
    fprintf(stderr, "\n");
}

/* --policy NAME and --backend NAME, by the library's names, into a sampler's or scorer's
 * parameters; 0, after printing why, if either is not a name. */
static int parse_policy_backend(const char *policy, const char *backend, parity_policy *pol,
                                uint32_t *backend_out) {
    parity_backend b;
    int rc = parity_policy_from_name(policy, pol);
    if (rc) return !fail("--policy", rc);
    if ((rc = parity_backend_from_name(backend, &b))) return !fail("--backend", rc);
    *backend_out = (uint32_t)b;
    return 1;
}

/* --logprob-mode NAME; 0, after printing why, if it is not a mode. */
static int parse_logprob_mode(const char *s, uint32_t *out) {
    parity_logprob_mode m;
    int rc = parity_logprob_mode_from_name(s, &m);
    if (rc) return !fail("--logprob-mode", rc);
    *out = (uint32_t)m;
    return 1;
}

#endif
