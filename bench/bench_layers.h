/* A built-in shape cut to its first layers (--layers N of parity-speed and ab-builds): the
 * config of "synthetic:NAME[:SEED]" with num_hidden_layers = N. A decode step of a layer reads
 * the same weights and does the same work whatever the depth, so the cut shape's per-layer
 * speed and bandwidth are the whole shape's; a shape too large for the machine runs so. */
#ifndef PARITY_BENCH_LAYERS_H
#define PARITY_BENCH_LAYERS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parity.h"

/* Fills *c and *seed from spec, cut to `layers` (the mlp_only_layers bits of the layers cut
 * dropped); *whole gets the shape's own count. config_builtin is parity_config_builtin of the
 * library the tool runs (ab-builds loads two). Returns 0, or -1 with the reason on stderr
 * after `tool`'s name. */
static inline int bench_cut_shape(const char *tool, const char *spec, uint32_t layers,
                                  int (*config_builtin)(const char *, parity_config *),
                                  parity_config *c, uint64_t *seed, uint32_t *whole) {
    if (strncmp(spec, "synthetic:", 10)) {
        fprintf(stderr, "%s: --layers cuts a built-in shape: --model synthetic:NAME[:SEED]\n",
                tool);
        return -1;
    }
    char name[64];
    const char *rest = spec + 10, *colon = strchr(rest, ':');
    const size_t len = colon ? (size_t)(colon - rest) : strlen(rest);
    char *end = NULL;
    *seed = colon ? strtoull(colon + 1, &end, 10) : 0;
    if (len == 0 || len >= sizeof name || (colon && (*end || end == colon + 1))) {
        fprintf(stderr, "%s: %s: expected synthetic:NAME[:SEED]\n", tool, spec);
        return -1;
    }
    memcpy(name, rest, len);
    name[len] = '\0';
    if (config_builtin(name, c)) {
        fprintf(stderr, "%s: %s: no built-in shape %s\n", tool, spec, name);
        return -1;
    }
    *whole = c->num_hidden_layers;
    if (layers == 0 || layers > c->num_hidden_layers) {
        fprintf(stderr, "%s: --layers %u: %s has 1..%u layers\n", tool, layers, name,
                c->num_hidden_layers);
        return -1;
    }
    c->num_hidden_layers = layers;
    for (uint32_t l = layers; l < 1024; l++) c->mlp_only_layers[l / 64] &= ~(1ull << (l % 64));
    return 0;
}

/* Parses --layers' value: a count 1..1023 into *layers, or -1 with the reason on stderr. */
static inline int bench_layers_option(const char *tool, const char *v, uint32_t *layers) {
    char *end;
    const unsigned long n = strtoul(v, &end, 10);
    if (*end || end == v || n == 0 || n > 1023 || v[0] == '-') {
        fprintf(stderr, "%s: --layers takes a count of layers, 1..1023\n", tool);
        return -1;
    }
    *layers = (uint32_t)n;
    return 0;
}

#endif
