/* Lookups in the library's tables of named entries (presets, modifiers, built-in configs):
 * arrays of structs whose first member is the entry's name (const char *). One table holds
 * each list of names; lookups and messages derive from it. */
#include <stdio.h>

#include <string.h>

#include "nametable.h"

static const char *name_at(const void *table, size_t stride, size_t i) {
    /* a pointer to a struct, converted, points to its first member */
    return *(const char *const *)(const void *)((const char *)table + i * stride);
}

const void *name_table_find(const void *table, size_t n, size_t stride, const char *name,
                            size_t len) {
    for (size_t i = 0; i < n; i++) {
        const char *candidate = name_at(table, stride, i);
        if (strlen(candidate) == len && !memcmp(candidate, name, len))
            return (const char *)table + i * stride;
    }
    return NULL;
}

void name_table_list(const void *table, size_t n, size_t stride, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? ", " : "", name_at(table, stride, i));
        if (w < 0) break;
        used += (size_t)w;
    }
}

void name_table_names(const void *table, size_t n, size_t stride, const char **names) {
    for (size_t i = 0; i < n; i++) names[i] = name_at(table, stride, i);
    names[n] = NULL;
}
