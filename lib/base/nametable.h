/* Tables of named entries: arrays of n structs, `stride` bytes apart, whose first member is
 * the entry's name (const char *); lookups and the lists of names for messages. */
#ifndef PARITY_BASE_NAMETABLE_H
#define PARITY_BASE_NAMETABLE_H

#include <stddef.h>

/* The entry whose name is the `len` bytes at `name`, or NULL: */
const void *name_table_find(const void *table, size_t n, size_t stride, const char *name,
                            size_t len);
/* "a, b, c": the names, for messages (truncated to size). */
void name_table_list(const void *table, size_t n, size_t stride, char *buf, size_t size);
/* names[0..n-1] = the names, names[n] = NULL. */
void name_table_names(const void *table, size_t n, size_t stride, const char **names);
/* The three for an array `t` whose length the compiler knows. */
#define NAME_FIND(t, name, len) name_table_find(t, sizeof t / sizeof t[0], sizeof t[0], name, len)
#define NAME_LIST(t, buf) name_table_list(t, sizeof t / sizeof t[0], sizeof t[0], buf, sizeof buf)
#define NAME_NAMES(t, names) name_table_names(t, sizeof t / sizeof t[0], sizeof t[0], names)
/* Defines `const char *const *getter(void)`: the names of table t, NULL-terminated, derived
 * once (the including file includes <pthread.h>). */
#define NAME_NAMES_ONCE(t, getter)                                                             \
    static const char *getter##_list[sizeof t / sizeof t[0] + 1];                              \
    static pthread_once_t getter##_once = PTHREAD_ONCE_INIT;                                   \
    static void getter##_fill(void) { NAME_NAMES(t, getter##_list); }                          \
    const char *const *getter(void) {                                                          \
        pthread_once(&getter##_once, getter##_fill);                                           \
        return getter##_list;                                                                  \
    }

#endif /* PARITY_BASE_NAMETABLE_H */
