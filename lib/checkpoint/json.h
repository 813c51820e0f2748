/* A small strict JSON reader (RFC 8259) for config.json, index.json and safetensors headers.
 * It rejects everything the grammar rejects: trailing commas, leading zeros, bare control
 * characters in strings, invalid escapes or UTF-8, lone surrogates, NaN/Infinity, comments,
 * trailing garbage. Nesting is limited to JSON_MAX_DEPTH. The whole tree lives in one arena:
 * json_free() releases it. */
#ifndef PARITY_JSON_H
#define PARITY_JSON_H

#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 64

typedef enum json_type {
    JSON_NULL,
    JSON_FALSE,
    JSON_TRUE,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT,
} json_type;

typedef struct json_value json_value;
struct json_value {
    json_type type;
    /* JSON_NUMBER: the value as a double (strtod-exact), and, when the literal is an integer
     * (no fraction or exponent) that fits, as int64 with is_int = 1. */
    double number;
    int64_t integer;
    int is_int;
    /* JSON_STRING: UTF-8, NUL-terminated; len excludes the NUL (may contain \u0000). */
    const char *str;
    size_t len;
    /* JSON_ARRAY: count items; JSON_OBJECT: count members, keys[i] (NUL-terminated, length
     * key_lens[i]) -> items[i], in file order, duplicates kept. */
    size_t count;
    json_value *items;
    const char **keys;
    size_t *key_lens;
};

typedef struct json_doc json_doc;

/* Parses text[0..len). On success returns 0 and *out (root: json_doc_root(*out)). On error
 * returns PARITY_ERR_JSON_SYNTAX (or PARITY_ERR_OUT_OF_MEMORY) and writes a message
 * "line L, column C: what" into err (errlen bytes). It does not call set_error. */
int json_parse(const char *text, size_t len, json_doc **out, char *err, size_t errlen);
const json_value *json_doc_root(const json_doc *doc);
void json_free(json_doc *doc);

/* Object member lookup (first match), NULL if absent or not an object. */
const json_value *json_get(const json_value *obj, const char *key);
/* "null", "a boolean", "a number", "a string", "an array", "an object": for messages. */
const char *json_type_name(json_type t);
/* Index of the first key that appears twice in the object, or -1. */
long json_find_duplicate_key(const json_value *obj);

#endif
