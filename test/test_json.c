/* Tests of the strict JSON parser (lib/checkpoint/json.c): valid documents and their values, a table of
 * inputs the grammar rejects, the nesting limit, duplicate keys, json_get. */
#include <locale.h>
#include <math.h>
#include <string.h>

#include "check.h"
#include "checkpoint/json.h"

static char err[256];

/* Parses a NUL-terminated text; returns the doc or NULL (then err holds the message). */
static json_doc *parse(const char *text) {
    json_doc *doc = NULL;
    int s = json_parse(text, strlen(text), &doc, err, sizeof err);
    if (s != PARITY_OK) {
        fprintf(stderr, "unexpected parse failure of %s: %s\n", text, err);
        return NULL;
    }
    return doc;
}

/* Parses `text`, CHECKs that it parsed and that its root is of `type`; returns the root, or
 * NULL when it did not parse. *doc is the doc (NULL when it did not parse), for json_free. */
static const json_value *parse_root(const char *text, json_type type, json_doc **doc) {
    *doc = parse(text);
    CHECK(*doc != NULL);
    if (!*doc) return NULL;
    const json_value *v = json_doc_root(*doc);
    CHECK_INT(v->type, type);
    return v;
}

static void test_scalars(void) {
    struct {
        const char *text;
        json_type type;
    } cases[] = {
        {"null", JSON_NULL}, {"true", JSON_TRUE}, {"false", JSON_FALSE},
        {" \t\r\n null \n", JSON_NULL}, {"\"\"", JSON_STRING}, {"0", JSON_NUMBER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_doc *doc;
        parse_root(cases[i].text, cases[i].type, &doc);
        json_free(doc);
    }
}

static void test_numbers(void) {
    struct {
        const char *text;
        double number;
        int is_int;
        int64_t integer;
    } cases[] = {
        {"0", 0.0, 1, 0},
        {"-0", -0.0, 1, 0},
        {"7", 7.0, 1, 7},
        {"-12345", -12345.0, 1, -12345},
        {"1.5", 1.5, 0, 0},
        {"-0.25", -0.25, 0, 0},
        {"1e3", 1000.0, 0, 0},
        {"1E+3", 1000.0, 0, 0},
        {"25e-2", 0.25, 0, 0},
        {"-1.5e-3", -0.0015, 0, 0},
        {"0.1", 0.1, 0, 0},
        {"1e-400", 0.0, 0, 0},
        {"9223372036854775807", 9223372036854775807.0, 1, INT64_MAX},
        {"-9223372036854775808", -9223372036854775808.0, 1, INT64_MIN},
        {"9223372036854775808", 9223372036854775808.0, 0, 0},
        {"-9223372036854775809", -9223372036854775809.0, 0, 0},
        {"18446744073709551616", 18446744073709551616.0, 0, 0},
        {"1000000.0", 1e6, 0, 0},
        {"1.7976931348623157e308", 1.7976931348623157e308, 0, 0},
        {"4.9e-324", 4.9e-324, 0, 0},
        {"1e-6", 1e-6, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_doc *doc;
        const json_value *v = parse_root(cases[i].text, JSON_NUMBER, &doc);
        if (!v) continue;
        CHECK(v->number == cases[i].number);
        CHECK_INT(signbit(v->number) != 0, signbit(cases[i].number) != 0);
        CHECK_INT(v->is_int, cases[i].is_int);
        if (cases[i].is_int) CHECK_INT(v->integer, cases[i].integer);
        json_free(doc);
    }
}

static void test_strings(void) {
    struct {
        const char *text;
        const char *value;
        size_t len;
    } cases[] = {
        {"\"abc\"", "abc", 3},
        {"\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"", "\"\\/\b\f\n\r\t", 8},
        {"\"\\u0041\\u00e9\"", "A\xc3\xa9", 3},
        {"\"\\u20AC\"", "\xe2\x82\xac", 3},
        {"\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80", 4},       /* surrogate pair */
        {"\"\\uDBFF\\uDFFF\"", "\xf4\x8f\xbf\xbf", 4},       /* U+10FFFF */
        {"\"a\\u0000b\"", "a\0b", 3},                        /* embedded NUL */
        {"\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\"",
         "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15},
        {"\"\xef\xbf\xbf\"", "\xef\xbf\xbf", 3},             /* U+FFFF: a noncharacter, valid */
        {"\"\x7f\"", "\x7f", 1},                             /* DEL is not a control char */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_doc *doc;
        const json_value *v = parse_root(cases[i].text, JSON_STRING, &doc);
        if (!v) continue;
        CHECK_INT(v->len, cases[i].len);
        CHECK(v->len == cases[i].len && memcmp(v->str, cases[i].value, v->len) == 0);
        CHECK_INT(v->str[v->len], '\0');
        json_free(doc);
    }
}

static void test_nested(void) {
    const char *text =
        "{\n"
        "  \"name\": \"qwen\",\n"
        "  \"layers\": [1, 2.5, -3, [], {}, [[null]]],\n"
        "  \"rope\": {\"type\": \"yarn\", \"factor\": 4.0, \"ok\": true, \"no\": false},\n"
        "  \"\\u00e9t\\u00e9\": \"summer\",\n"
        "  \"empty\": \"\"\n"
        "}\n";
    json_doc *doc = parse(text);
    CHECK(doc != NULL);
    if (!doc) return;
    const json_value *root = json_doc_root(doc);
    CHECK_INT(root->type, JSON_OBJECT);
    CHECK_INT(root->count, 5);
    CHECK(strcmp(root->keys[0], "name") == 0 && root->key_lens[0] == 4);
    CHECK(strcmp(root->keys[3], "\xc3\xa9t\xc3\xa9") == 0);

    const json_value *layers = json_get(root, "layers");
    CHECK(layers && layers->type == JSON_ARRAY && layers->count == 6);
    if (layers && layers->count == 6) {
        CHECK(layers->items[0].is_int && layers->items[0].integer == 1);
        CHECK(layers->items[1].number == 2.5 && !layers->items[1].is_int);
        CHECK(layers->items[2].integer == -3);
        CHECK(layers->items[3].type == JSON_ARRAY && layers->items[3].count == 0);
        CHECK(layers->items[4].type == JSON_OBJECT && layers->items[4].count == 0);
        const json_value *inner = &layers->items[5];
        CHECK(inner->type == JSON_ARRAY && inner->count == 1 &&
              inner->items[0].type == JSON_ARRAY && inner->items[0].count == 1 &&
              inner->items[0].items[0].type == JSON_NULL);
    }
    const json_value *rope = json_get(root, "rope");
    CHECK(rope && rope->type == JSON_OBJECT);
    const json_value *type = json_get(rope, "type");
    CHECK(type && type->type == JSON_STRING && strcmp(type->str, "yarn") == 0);
    const json_value *factor = json_get(rope, "factor");
    CHECK(factor && factor->number == 4.0 && !factor->is_int);
    CHECK(json_get(rope, "ok") && json_get(rope, "ok")->type == JSON_TRUE);
    CHECK(json_get(rope, "no") && json_get(rope, "no")->type == JSON_FALSE);
    CHECK(json_get(root, "\xc3\xa9t\xc3\xa9") != NULL);
    CHECK(json_get(root, "empty") && json_get(root, "empty")->len == 0);
    CHECK(json_get(root, "missing") == NULL);
    CHECK(json_get(root, "nam") == NULL);
    CHECK(json_get(layers, "name") == NULL); /* not an object */
    CHECK(json_get(NULL, "name") == NULL);
    CHECK_INT(json_find_duplicate_key(root), -1);
    json_free(doc);
}

/* The input is not NUL-terminated: the parser must stop at len. */
static void test_length_bounds(void) {
    const char text[] = "[1, 2]xyz";
    json_doc *doc = NULL;
    CHECK_OK(json_parse(text, 6, &doc, err, sizeof err));
    if (doc) CHECK_INT(json_doc_root(doc)->count, 2);
    json_free(doc);
    CHECK_STATUS(json_parse(text, 5, &doc, err, sizeof err), PARITY_ERR_JSON_SYNTAX);
    /* a number that ends at len, with a digit right after it in memory */
    const char num[] = "12345";
    CHECK_OK(json_parse(num, 3, &doc, err, sizeof err));
    if (doc) CHECK_INT(json_doc_root(doc)->integer, 123);
    json_free(doc);
    /* embedded NUL outside a string is not whitespace */
    CHECK_STATUS(json_parse("1\0", 2, &doc, err, sizeof err), PARITY_ERR_JSON_SYNTAX);
    CHECK_STATUS(json_parse("\"a\0b\"", 5, &doc, err, sizeof err), PARITY_ERR_JSON_SYNTAX);
    CHECK_STATUS(json_parse(NULL, 0, &doc, err, sizeof err), PARITY_ERR_JSON_SYNTAX);
    /* no error buffer is fine */
    CHECK_STATUS(json_parse("[", 1, &doc, NULL, 0), PARITY_ERR_JSON_SYNTAX);
}

static void test_invalid(void) {
    static const char *const bad[] = {
        "",                  /* empty input */
        "   ",               /* whitespace only */
        "[1,]",              /* trailing comma in an array */
        "{\"a\":1,}",        /* trailing comma in an object */
        "[,1]",
        "[1,,2]",
        "[1 2]",
        "{\"a\" 1}",
        "{\"a\":}",
        "{\"a\"}",
        "{1:2}",             /* non-string key */
        "{a:1}",
        "['a']",             /* single quotes */
        "{'a':1}",
        "01",                /* leading zeros */
        "-01",
        "00",
        "-",                 /* minus alone */
        "1.",                /* no fraction digits */
        ".5",
        "+1",
        "1e",
        "1e+",
        "1.e5",
        "-.5",
        "0x10",
        "1e400",             /* overflows a double */
        "-1e400",
        "NaN",
        "Infinity",
        "-Infinity",
        "nul",
        "True",
        "nulll",
        "\"abc",             /* unterminated string */
        "\"\\\"",
        "\"a\tb\"",          /* bare control characters */
        "\"a\nb\"",
        "\"\x1f\"",
        "\"\\x41\"",         /* invalid escapes */
        "\"\\a\"",
        "\"\\u12\"",
        "\"\\u12G4\"",
        "\"\\U0041\"",
        "\"\\'\"",
        "\"\\ud800\"",       /* lone high surrogate */
        "\"\\ud800x\"",
        "\"\\ud800\\u0041\"",
        "\"\\ud800\\ud800\"",
        "\"\\udc00\"",       /* lone low surrogate */
        "\"\\udfff\\ud800\"",
        "\"\xff\"",          /* invalid UTF-8 */
        "\"\x80\"",
        "\"\xc0\xaf\"",      /* overlong '/' */
        "\"\xc1\xbf\"",
        "\"\xe0\x80\xaf\"",
        "\"\xf0\x80\x80\xaf\"",
        "\"\xed\xa0\x80\"",  /* surrogate U+D800 encoded in UTF-8 */
        "\"\xed\xbf\xbf\"",
        "\"\xf4\x90\x80\x80\"", /* > U+10FFFF */
        "\"\xf5\x80\x80\x80\"",
        "\"\xe2\x82\"",      /* truncated sequences */
        "\"\xf0\x9f\x98\"",
        "\"\xc3\"",
        "\xef\xbb\xbf{}",    /* a byte-order mark */
        "// c\n{}",          /* comments */
        "{} /* c */",
        "{}#",
        "[1] x",             /* trailing garbage */
        "{}{}",
        "[] []",
        "[",
        "]",
        "{",
        "}",
        "[[]",
        "{\"a\":[}",
        "\"\\",
        "tru",
        "\x0c{}",            /* form feed is not JSON whitespace */
        "\xc2\xa0{}",        /* nor is U+00A0 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_doc *doc = NULL;
        err[0] = '\0';
        int s = json_parse(bad[i], strlen(bad[i]), &doc, err, sizeof err);
        check_count++;
        if (s != PARITY_ERR_JSON_SYNTAX) {
            check_failures++;
            fprintf(stderr, "invalid input #%zu '%s' returned %s (expected a syntax error)\n",
                    i, bad[i], parity_status_name(s));
            if (s == PARITY_OK) json_free(doc);
            continue;
        }
        CHECK(strncmp(err, "line ", 5) == 0 && strstr(err, ", column ") != NULL);
    }
}

static void test_error_position(void) {
    json_doc *doc;
    const char *text = "{\n  \"a\": 1,\n  \"b\": 01\n}";
    CHECK_STATUS(json_parse(text, strlen(text), &doc, err, sizeof err), PARITY_ERR_JSON_SYNTAX);
    CHECK(strncmp(err, "line 3, column 9: ", 18) == 0);
    if (strncmp(err, "line 3, column 9: ", 18) != 0) fprintf(stderr, "message: %s\n", err);
    CHECK_STATUS(json_parse("[1,]", 4, &doc, err, sizeof err), PARITY_ERR_JSON_SYNTAX);
    CHECK(strncmp(err, "line 1, column 4: ", 18) == 0);
    /* a small error buffer is truncated, never overrun */
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    CHECK_STATUS(json_parse("[1,]", 4, &doc, tiny, 5), PARITY_ERR_JSON_SYNTAX);
    CHECK(strcmp(tiny, "line") == 0 && tiny[5] == 'x');
}

static void test_depth(void) {
    char buf[2 * (JSON_MAX_DEPTH + 1) + 1];
    json_doc *doc = NULL;
    /* exactly JSON_MAX_DEPTH levels: accepted */
    for (int i = 0; i < JSON_MAX_DEPTH; i++) {
        buf[i] = '[';
        buf[JSON_MAX_DEPTH + i] = ']';
    }
    CHECK_OK(json_parse(buf, 2 * JSON_MAX_DEPTH, &doc, err, sizeof err));
    json_free(doc);
    /* one more: rejected */
    for (int i = 0; i <= JSON_MAX_DEPTH; i++) {
        buf[i] = '[';
        buf[JSON_MAX_DEPTH + 1 + i] = ']';
    }
    CHECK_STATUS(json_parse(buf, 2 * (JSON_MAX_DEPTH + 1), &doc, err, sizeof err),
                 PARITY_ERR_JSON_SYNTAX);
    CHECK(strstr(err, "deep") != NULL);
    /* very deep input, objects and arrays mixed: rejected without exhausting the stack */
    size_t n = 1000000;
    char *deep = malloc(n);
    CHECK(deep != NULL);
    if (!deep) return;
    for (size_t i = 0; i < n; i++) deep[i] = i % 6 == 0 ? '{' : i % 6 == 1 ? '"' : i % 6 == 2 ? 'k'
                                          : i % 6 == 3 ? '"' : i % 6 == 4 ? ':' : '[';
    CHECK_STATUS(json_parse(deep, n, &doc, err, sizeof err), PARITY_ERR_JSON_SYNTAX);
    free(deep);
}

static void test_duplicates(void) {
    json_doc *doc = parse("{\"a\":1,\"b\":2,\"c\":3,\"b\":4,\"a\":5}");
    CHECK(doc != NULL);
    if (doc) {
        const json_value *root = json_doc_root(doc);
        CHECK_INT(root->count, 5); /* duplicates are kept */
        CHECK_INT(json_find_duplicate_key(root), 0);
        CHECK_INT(json_get(root, "a")->integer, 1); /* first match */
        CHECK_INT(json_find_duplicate_key(&root->items[0]), -1); /* not an object */
    }
    json_free(doc);

    doc = parse("{\"x\":{\"k\":1,\"k\":2},\"y\":{\"ab\":1,\"a\\u0062\":2},"
                "\"z\":{\"a\":1,\"A\":2}}");
    CHECK(doc != NULL);
    if (doc) {
        const json_value *root = json_doc_root(doc);
        CHECK_INT(json_find_duplicate_key(root), -1);
        CHECK_INT(json_find_duplicate_key(json_get(root, "x")), 0);
        CHECK_INT(json_find_duplicate_key(json_get(root, "y")), 0); /* equal after decoding */
        CHECK_INT(json_find_duplicate_key(json_get(root, "z")), -1);
    }
    json_free(doc);

    /* keys that differ only after a NUL are different keys */
    doc = parse("{\"a\\u0000b\":1,\"a\\u0000c\":2,\"a\":3}");
    CHECK(doc != NULL);
    if (doc) {
        CHECK_INT(json_find_duplicate_key(json_doc_root(doc)), -1);
        CHECK(json_get(json_doc_root(doc), "a") == &json_doc_root(doc)->items[2]);
    }
    json_free(doc);

    /* large objects (the sorted path): no duplicate, then one far apart */
    enum { N = 5000 };
    char *text = malloc(N * 24 + 16);
    CHECK(text != NULL);
    if (!text) return;
    for (int dup = 0; dup < 2; dup++) {
        size_t pos = 0;
        text[pos++] = '{';
        for (int i = 0; i < N; i++) {
            int key = dup && i == N - 10 ? 1234 : i;
            pos += (size_t)sprintf(text + pos, "%s\"k%d\":%d", i ? "," : "", key, i);
        }
        text[pos++] = '}';
        text[pos] = '\0';
        doc = parse(text);
        CHECK(doc != NULL);
        if (doc) {
            CHECK_INT(json_doc_root(doc)->count, N);
            CHECK_INT(json_find_duplicate_key(json_doc_root(doc)), dup ? 1234 : -1);
        }
        json_free(doc);
    }
    free(text);
}

/* A big flat document exercises the arena's block chaining and the scratch stack. */
static void test_large(void) {
    enum { N = 200000 };
    char *text = malloc(N * 32 + 16);
    CHECK(text != NULL);
    if (!text) return;
    size_t pos = 0;
    text[pos++] = '[';
    for (int i = 0; i < N; i++)
        pos += (size_t)sprintf(text + pos, "%s[%d,\"s%d\"]", i ? "," : "", i, i);
    text[pos++] = ']';
    json_doc *doc = NULL;
    CHECK_OK(json_parse(text, pos, &doc, err, sizeof err));
    if (doc) {
        const json_value *root = json_doc_root(doc);
        CHECK_INT(root->count, N);
        int good = 1;
        for (int i = 0; i < N && good; i++) {
            char s[16];
            snprintf(s, sizeof s, "s%d", i);
            const json_value *pair = &root->items[i];
            good = pair->count == 2 && pair->items[0].integer == i &&
                   strcmp(pair->items[1].str, s) == 0;
        }
        CHECK(good);
    }
    json_free(doc);
    free(text);
}

/* Under a locale whose decimal point is ',' (when one is installed), numbers still parse. */
static void test_locale(void) {
    static const char *const names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!setlocale(LC_NUMERIC, names[i])) continue;
        json_doc *doc = parse("[1.5, 2e-1]");
        CHECK(doc != NULL);
        if (doc)
            CHECK(json_doc_root(doc)->items[0].number == 1.5 &&
                  json_doc_root(doc)->items[1].number == 0.2);
        json_free(doc);
        setlocale(LC_NUMERIC, "C");
        return;
    }
}

int main(void) {
    test_scalars();
    test_numbers();
    test_strings();
    test_nested();
    test_length_bounds();
    test_invalid();
    test_error_position();
    test_depth();
    test_duplicates();
    test_large();
    test_locale();
    json_free(NULL);
    return check_report("test_json");
}
