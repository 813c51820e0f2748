/* Fuzz target: the JSON reader (json_parse) and the config.json reader (config_parse) on the
 * input text. An accepted document is walked whole; an accepted config validates. */
#include "fuzz_common.h"
#include "base/errors.h"
#include "checkpoint/config_json.h"
#include "checkpoint/json.h"
#include "model/config.h"

/* The earliest index whose key occurs again, or -1: the definition, quadratic. */
static long first_duplicate(const json_value *obj) {
    for (size_t i = 0; i < obj->count; i++)
        for (size_t j = i + 1; j < obj->count; j++)
            if (obj->key_lens[i] == obj->key_lens[j] &&
                !memcmp(obj->keys[i], obj->keys[j], obj->key_lens[i]))
                return (long)i;
    return -1;
}

/* Visits every value; returns the number of values (so the walk is not optimised away). */
static size_t walk(const json_value *v, int depth) {
    FUZZ_REQUIRE(depth <= JSON_MAX_DEPTH + 1, "depth %d", depth);
    size_t n = 1;
    switch (v->type) {
    case JSON_STRING:
        FUZZ_REQUIRE(v->str && v->str[v->len] == '\0' && strlen(v->str) <= v->len, "string");
        break;
    case JSON_OBJECT:
        if (v->count <= 4096)
            FUZZ_REQUIRE(json_find_duplicate_key(v) == first_duplicate(v), "duplicate keys");
        for (size_t i = 0; i < v->count; i++) {
            FUZZ_REQUIRE(v->keys[i][v->key_lens[i]] == '\0', "key");
            FUZZ_REQUIRE(json_get(v, v->keys[i]) != NULL || strlen(v->keys[i]) < v->key_lens[i],
                         "json_get misses a key");
        }
        /* fall through */
    case JSON_ARRAY:
        for (size_t i = 0; i < v->count; i++) n += walk(&v->items[i], depth + 1);
        break;
    case JSON_NUMBER:
        /* both are the correctly rounded double of the same integer */
        FUZZ_REQUIRE(!v->is_int || (double)v->integer == v->number,
                     "integer %lld vs number %.17g", (long long)v->integer, v->number);
        break;
    default:
        break;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    json_doc *doc = NULL;
    char err[256];
    int rc = json_parse(text, size, &doc, err, sizeof err);
    if (rc == PARITY_OK) {
        FUZZ_REQUIRE(walk(json_doc_root(doc), 0) > 0, "empty walk");
        json_free(doc);
    } else {
        FUZZ_REQUIRE(rc == PARITY_ERR_JSON_SYNTAX && err[0], "json_parse: status %d", rc);
    }

    parity_config c;
    clear_error();
    rc = config_parse(text, size, "config.json", &c);
    if (rc == PARITY_OK)
        FUZZ_REQUIRE(config_validate(&c) == PARITY_OK, "accepted config does not validate: %s",
                     parity_last_error());
    else
        fuzz_check_failure(rc);
    return 0;
}
