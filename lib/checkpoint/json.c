/* A strict RFC 8259 JSON parser. The tree is built in an arena of chained blocks owned by the
 * json_doc. Containers collect their children on a shared scratch stack and copy them into
 * the arena when they close, so that each array or object is one contiguous run of values.
 * Recursion follows the nesting and is bounded by JSON_MAX_DEPTH. Every read is checked
 * against the input length. Numbers whose magnitude overflows a double are rejected. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtod_l, newlocale */
#endif
#include "json.h"

#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"

/* ---- arena ------------------------------------------------------------------------------- */

#define ARENA_BLOCK (64u * 1024u)
#define ARENA_ALIGN (alignof(max_align_t))

typedef struct arena_block arena_block;
struct arena_block {
    arena_block *next;
    size_t used, cap;
    alignas(max_align_t) unsigned char data[];
};

struct json_doc {
    arena_block *blocks; /* newest first */
    json_value root;
};

/* Returns size bytes aligned to ARENA_ALIGN from the doc's arena, or NULL when out of memory. */
static void *arena_alloc(json_doc *doc, size_t size) {
    size_t need = (size + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
    if (need < size) return NULL;
    arena_block *b = doc->blocks;
    if (!b || b->cap - b->used < need) {
        size_t cap = need > ARENA_BLOCK ? need : ARENA_BLOCK;
        if (cap > SIZE_MAX - sizeof(arena_block)) return NULL;
        b = px_malloc(sizeof(arena_block) + cap, "JSON tree");
        if (!b) return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = doc->blocks;
        doc->blocks = b;
    }
    void *p = b->data + b->used;
    b->used += need;
    return p;
}

/* ---- parser state ------------------------------------------------------------------------ */

/* One pending child of an open container: the value and, inside objects, its key. */
typedef struct slot {
    json_value value;
    const char *key;
    size_t key_len;
} slot;

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    int depth;
    json_doc *doc;
    slot *stack;
    size_t top, cap;
    int status;           /* first error, 0 while none */
    char *err;
    size_t errlen;
} parser;

/* Records the first error with its position (line and byte column, both from 1). */
static int fail_at(parser *p, size_t at, int status, const char *fmt, ...) PARITY_PRINTF(4, 5);
static int fail_at(parser *p, size_t at, int status, const char *fmt, ...) {
    if (p->status) return p->status;
    p->status = status;
    if (p->err && p->errlen) {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < at && i < p->len; i++) {
            if (p->s[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        int n = snprintf(p->err, p->errlen, "line %zu, column %zu: ", line, col);
        if (n >= 0 && (size_t)n < p->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return status;
}

#define SYNTAX(p, at, ...) fail_at((p), (at), PARITY_ERR_JSON_SYNTAX, __VA_ARGS__)
#define NOMEM(p) fail_at((p), (p)->pos, PARITY_ERR_OUT_OF_MEMORY, "out of memory")

/* A short printable description of the byte at pos, for messages. */
static const char *describe(const parser *p, size_t pos, char buf[16]) {
    if (pos >= p->len) return "end of input";
    unsigned c = p->s[pos];
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, 16, "'%c'", (char)c);
    else
        snprintf(buf, 16, "byte 0x%02x", c);
    return buf;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int push(parser *p, const json_value *v, const char *key, size_t key_len) {
    if (p->top == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof(slot)) return NOMEM(p);
        slot *s = px_realloc(p->stack, cap * sizeof(slot), "JSON parser stack");
        if (!s) return NOMEM(p);
        p->stack = s;
        p->cap = cap;
    }
    p->stack[p->top].value = *v;
    p->stack[p->top].key = key;
    p->stack[p->top].key_len = key_len;
    p->top++;
    return 0;
}

/* ---- literals and numbers ---------------------------------------------------------------- */

static int parse_literal(parser *p, const char *word, json_type type, json_value *v) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return SYNTAX(p, p->pos, "invalid literal (expected '%s')", word);
    p->pos += n;
    v->type = type;
    return 0;
}

/* The "C" numeric locale for strtod_l, so that '.' is the decimal point whatever the host's
 * setlocale() says. Created on first use and kept for the life of the process. */
static locale_t c_locale(void) {
    static _Atomic(locale_t) cached;
    locale_t loc = atomic_load(&cached);
    if (loc) return loc;
    loc = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!loc) return (locale_t)0;
    locale_t expected = (locale_t)0;
    if (!atomic_compare_exchange_strong(&cached, &expected, loc)) {
        /* another thread won the race: use its locale */
        freelocale(loc);
        loc = expected;
    }
    return loc;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *p, json_value *v) {
    size_t start = p->pos, i = p->pos;
    const unsigned char *s = p->s;
    int negative = 0, integral = 1;
    if (i < p->len && s[i] == '-') {
        negative = 1;
        i++;
    }
    if (i >= p->len || !is_digit(s[i]))
        return SYNTAX(p, i, "invalid number: expected a digit");
    if (s[i] == '0') {
        i++;
        if (i < p->len && is_digit(s[i]))
            return SYNTAX(p, i, "invalid number: leading zero");
    } else {
        while (i < p->len && is_digit(s[i])) i++;
    }
    if (i < p->len && s[i] == '.') {
        integral = 0;
        i++;
        if (i >= p->len || !is_digit(s[i]))
            return SYNTAX(p, i, "invalid number: expected a digit after '.'");
        while (i < p->len && is_digit(s[i])) i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        integral = 0;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || !is_digit(s[i]))
            return SYNTAX(p, i, "invalid number: expected a digit in the exponent");
        while (i < p->len && is_digit(s[i])) i++;
    }
    size_t n = i - start;

    /* strtod needs a NUL-terminated copy: the input need not be terminated. */
    char small[64];
    char *lit = small;
    if (n >= sizeof small) {
        lit = px_malloc(n + 1, "JSON number literal");
        if (!lit) return NOMEM(p);
    }
    memcpy(lit, s + start, n);
    lit[n] = '\0';
    locale_t loc = c_locale();
    double d = 0.0;
    if (loc) d = strtod_l(lit, NULL, loc);
    if (lit != small) px_free(lit);
    if (!loc) return NOMEM(p);
    if (isinf(d)) return SYNTAX(p, start, "number out of range of a double");

    v->type = JSON_NUMBER;
    v->number = d;
    v->is_int = 0;
    v->integer = 0;
    if (integral) {
        /* Accumulate as a negative number so that INT64_MIN fits. */
        int64_t acc = 0;
        int fits = 1;
        for (size_t k = start + (size_t)negative; k < i; k++) {
            int digit = s[k] - '0';
            if (acc < (INT64_MIN + digit) / 10) {
                fits = 0;
                break;
            }
            acc = acc * 10 - digit;
        }
        if (fits && !negative && acc == INT64_MIN) fits = 0;
        if (fits) {
            v->is_int = 1;
            v->integer = negative ? acc : -acc;
        }
    }
    p->pos = i;
    return 0;
}

/* ---- strings ------------------------------------------------------------------------------ */

static int hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned c = s[k], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

/* Length of the valid UTF-8 sequence at s[0..n) (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF), or 0 if it is invalid or truncated. s[0] >= 0x80. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;      /* overlong */
        if (c == 0xed) hi = 0x9f;      /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;      /* overlong */
        if (c == 0xf4) hi = 0x8f;      /* above U+10FFFF */
    } else {
        return 0;
    }
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if (s[k] < 0x80 || s[k] > 0xbf) return 0;
    return len;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Parses the string at p->pos (on its opening quote) into the arena. */
static int parse_string(parser *p, const char **out, size_t *out_len) {
    const unsigned char *s = p->s;
    size_t open = p->pos, i = open + 1;

    /* Find the closing quote first: the decoded string is never longer than the raw one, so
     * one allocation of the raw length holds it. */
    size_t end = i;
    while (end < p->len && s[end] != '"') end += s[end] == '\\' ? 2 : 1;
    if (end >= p->len) return SYNTAX(p, open, "unterminated string");

    char *o = arena_alloc(p->doc, end - i + 1);
    if (!o) return NOMEM(p);
    size_t n = 0;
    while (i < end) {
        unsigned c = s[i];
        if (c < 0x20)
            return SYNTAX(p, i, "control character 0x%02x in a string (must be escaped)", c);
        if (c >= 0x80) {
            size_t k = utf8_seq(s + i, end - i);
            if (!k) return SYNTAX(p, i, "invalid UTF-8 in a string");
            memcpy(o + n, s + i, k);
            n += k;
            i += k;
            continue;
        }
        if (c != '\\') {
            o[n++] = (char)c;
            i++;
            continue;
        }
        /* i + 1 < end holds: the scan above skipped the escaped byte, which is not the
         * closing quote. */
        size_t esc = i;
        unsigned e = s[i + 1];
        i += 2;
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (end - i < 4 || hex4(s + i, &cp))
                return SYNTAX(p, esc, "invalid \\u escape (expected 4 hex digits)");
            i += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff)
                return SYNTAX(p, esc, "lone low surrogate \\u%04x", cp);
            if (cp >= 0xd800 && cp <= 0xdbff) {
                if (end - i < 6 || s[i] != '\\' || s[i + 1] != 'u' || hex4(s + i + 2, &lo) ||
                    lo < 0xdc00 || lo > 0xdfff)
                    return SYNTAX(p, esc, "high surrogate \\u%04x not followed by a low "
                                  "surrogate escape", cp);
                i += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            /* Each escape is at least as long as its UTF-8 encoding (6 bytes -> at most 3,
             * 12 bytes -> 4), so the output stays within the allocation. */
            n += put_utf8(o + n, cp);
            break;
        }
        default:
            return SYNTAX(p, esc, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? (char)e : '?');
        }
    }
    o[n] = '\0';
    p->pos = end + 1;
    *out = o;
    *out_len = n;
    return 0;
}

/* ---- values -------------------------------------------------------------------------------- */

static int parse_value(parser *p, json_value *v);

/* Moves the children on the stack above `base` into the arena as the container's items. */
static int close_container(parser *p, size_t base, json_value *v) {
    size_t count = p->top - base;
    memset(v, 0, sizeof *v);
    v->count = count;
    if (count) {
        v->items = arena_alloc(p->doc, count * sizeof(json_value));
        if (!v->items) return NOMEM(p);
        for (size_t k = 0; k < count; k++) v->items[k] = p->stack[base + k].value;
    }
    p->top = base;
    return 0;
}

/* After an element of a container: a ',' (1: another element follows), the container's
 * `close` (0: it ends), or a syntax error (-1, the status set). */
static int after_element(parser *p, char close, const char *container) {
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ',') {
        p->pos++;
        skip_ws(p);
        return 1;
    }
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    char b[16];
    SYNTAX(p, p->pos, "expected ',' or '%c' in %s, found %s", close, container,
           describe(p, p->pos, b));
    return -1;
}

static int parse_array(parser *p, json_value *v) {
    size_t base = p->top;
    p->pos++; /* '[' */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
    } else {
        for (int more = 1; more;) {
            json_value item;
            if (parse_value(p, &item) || push(p, &item, NULL, 0)) return p->status;
            if ((more = after_element(p, ']', "an array")) < 0) return p->status;
        }
    }
    if (close_container(p, base, v)) return p->status;
    v->type = JSON_ARRAY;
    return 0;
}

static int parse_object(parser *p, json_value *v) {
    size_t base = p->top;
    char b[16];
    p->pos++; /* '{' */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
    } else {
        for (;;) {
            if (p->pos >= p->len || p->s[p->pos] != '"')
                return SYNTAX(p, p->pos, "expected a string key in an object, found %s",
                              describe(p, p->pos, b));
            const char *key;
            size_t key_len;
            if (parse_string(p, &key, &key_len)) return p->status;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':')
                return SYNTAX(p, p->pos, "expected ':' after an object key, found %s",
                              describe(p, p->pos, b));
            p->pos++;
            json_value item;
            if (parse_value(p, &item) || push(p, &item, key, key_len)) return p->status;
            int more = after_element(p, '}', "an object");
            if (more < 0) return p->status;
            if (!more) break;
        }
    }
    size_t count = p->top - base;
    const char **keys = NULL;
    size_t *key_lens = NULL;
    if (count) {
        keys = arena_alloc(p->doc, count * sizeof *keys);
        key_lens = arena_alloc(p->doc, count * sizeof *key_lens);
        if (!keys || !key_lens) return NOMEM(p);
        for (size_t k = 0; k < count; k++) {
            keys[k] = p->stack[base + k].key;
            key_lens[k] = p->stack[base + k].key_len;
        }
    }
    if (close_container(p, base, v)) return p->status;
    v->type = JSON_OBJECT;
    v->keys = keys;
    v->key_lens = key_lens;
    return 0;
}

static int parse_value(parser *p, json_value *v) {
    char b[16];
    memset(v, 0, sizeof *v);
    skip_ws(p);
    if (p->pos >= p->len) return SYNTAX(p, p->pos, "expected a value, found end of input");
    switch (p->s[p->pos]) {
    case '{':
    case '[': {
        if (p->depth >= JSON_MAX_DEPTH)
            return SYNTAX(p, p->pos, "nesting deeper than %d levels", JSON_MAX_DEPTH);
        p->depth++;
        int r = p->s[p->pos] == '{' ? parse_object(p, v) : parse_array(p, v);
        p->depth--;
        return r;
    }
    case '"':
        v->type = JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't': return parse_literal(p, "true", JSON_TRUE, v);
    case 'f': return parse_literal(p, "false", JSON_FALSE, v);
    case 'n': return parse_literal(p, "null", JSON_NULL, v);
    default:
        if (p->s[p->pos] == '-' || is_digit(p->s[p->pos])) return parse_number(p, v);
        return SYNTAX(p, p->pos, "expected a value, found %s", describe(p, p->pos, b));
    }
}

/* ---- public ------------------------------------------------------------------------------- */

int json_parse(const char *text, size_t len, json_doc **out, char *err, size_t errlen) {
    if (err && errlen) err[0] = '\0';
    parser p = {.s = (const unsigned char *)text, .len = len, .err = err, .errlen = errlen};
    if (!text && len) return fail_at(&p, 0, PARITY_ERR_JSON_SYNTAX, "no input");
    p.doc = px_calloc(1, sizeof(json_doc), "JSON document");
    if (!p.doc) return NOMEM(&p);

    if (parse_value(&p, &p.doc->root) == 0) {
        skip_ws(&p);
        char b[16];
        if (p.pos < p.len)
            SYNTAX(&p, p.pos, "unexpected %s after the value", describe(&p, p.pos, b));
    }
    px_free(p.stack);
    if (p.status) {
        json_free(p.doc);
        return p.status;
    }
    *out = p.doc;
    return 0;
}

const json_value *json_doc_root(const json_doc *doc) { return doc ? &doc->root : NULL; }

void json_free(json_doc *doc) {
    if (!doc) return;
    arena_block *b = doc->blocks;
    while (b) {
        arena_block *next = b->next;
        px_free(b);
        b = next;
    }
    px_free(doc);
}

static int key_is(const json_value *obj, size_t i, const char *key, size_t n) {
    return obj->key_lens[i] == n && memcmp(obj->keys[i], key, n) == 0;
}

const json_value *json_get(const json_value *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT || !key) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < obj->count; i++)
        if (key_is(obj, i, key, n)) return &obj->items[i];
    return NULL;
}

/* json_find_duplicate_key sorts the keys by length, bytes, then index, so that equal keys
 * are adjacent and the first of a run is its earliest occurrence. */
typedef struct key_ref {
    const char *key;
    size_t len, index;
} key_ref;

static int cmp_keys(const void *a, const void *b) {
    const key_ref *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    int c = memcmp(x->key, y->key, x->len);
    if (c) return c;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The earliest index whose key occurs again: quadratic, for small objects. */
static long first_duplicate_naive(const json_value *obj) {
    for (size_t i = 0; i < obj->count; i++)
        for (size_t j = i + 1; j < obj->count; j++)
            if (key_is(obj, j, obj->keys[i], obj->key_lens[i])) return (long)i;
    return -1;
}

long json_find_duplicate_key(const json_value *obj) {
    if (!obj || obj->type != JSON_OBJECT || obj->count < 2) return -1;
    if (obj->count <= 32) return first_duplicate_naive(obj);
    key_ref *refs = px_calloc(obj->count, sizeof *refs, "JSON duplicate key check");
    if (!refs) return first_duplicate_naive(obj);
    for (size_t i = 0; i < obj->count; i++)
        refs[i] = (key_ref){obj->keys[i], obj->key_lens[i], i};
    qsort(refs, obj->count, sizeof *refs, cmp_keys);
    long best = -1;
    for (size_t k = 0; k + 1 < obj->count; k++) {
        const key_ref *x = &refs[k], *y = &refs[k + 1];
        if (x->len == y->len && memcmp(x->key, y->key, x->len) == 0 &&
            (best < 0 || (long)x->index < best))
            best = (long)x->index;
    }
    px_free(refs);
    return best;
}

const char *json_type_name(json_type t) {
    switch (t) {
    case JSON_NULL: return "null";
    case JSON_FALSE:
    case JSON_TRUE: return "a boolean";
    case JSON_NUMBER: return "a number";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "?";
}
