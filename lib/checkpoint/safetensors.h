/* safetensors reader: maps the file and validates every rule of the format, as the
 * reference implementation (huggingface/safetensors) does, plus duplicate names:
 *   - 8-byte little-endian header length N: the file holds at least 8 bytes, 0 < N <= 100 MB,
 *     8 + N <= file size                                     -> PARITY_ERR_ST_HEADER_LENGTH
 *   - header bytes are valid UTF-8                           -> PARITY_ERR_ST_HEADER_UTF8
 *   - header is a JSON object (it starts with '{'); each member other than "__metadata__"
 *     (an object of strings) is {"dtype": str, "shape": [uint...], "data_offsets": [b, e]}
 *     and nothing else                                       -> PARITY_ERR_ST_HEADER_JSON
 *   - dtype is one of BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64
 *                                                            -> PARITY_ERR_ST_DTYPE
 *   - tensors sorted by offsets are contiguous from 0: begin == previous end, end >= begin
 *                                                            -> PARITY_ERR_ST_OFFSETS
 *   - product of shape and x dtype size computed with overflow checks -> PARITY_ERR_ST_OVERFLOW
 *   - that byte count == end - begin                         -> PARITY_ERR_ST_SIZE
 *   - 8 + N + last end <= file size                          -> PARITY_ERR_ST_TRUNCATED
 *   - 8 + N + last end == file size                          -> PARITY_ERR_ST_TRAILING
 *   - no name twice                                          -> PARITY_ERR_ST_DUPLICATE
 * Every error calls set_error() with a message naming the file, the tensor (where there is
 * one) and the rule. */
#ifndef PARITY_SAFETENSORS_H
#define PARITY_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_HEADER (100u * 1000u * 1000u)
#define ST_MAX_DIMS 8

typedef enum st_dtype {
    ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16,
    ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64,
} st_dtype;

const char *st_dtype_name(st_dtype t);
size_t st_dtype_size(st_dtype t);

typedef struct st_tensor {
    const char *name;           /* NUL-terminated */
    st_dtype dtype;
    uint32_t ndim;
    uint64_t shape[ST_MAX_DIMS];
    uint64_t n_elements;
    uint64_t begin, end;        /* data_offsets, relative to the data section */
    const uint8_t *data;        /* points into the mapping (or the buffer given to st_parse) */
} st_tensor;

typedef struct st_file {
    char *path;                 /* for messages */
    const uint8_t *base;        /* whole file */
    size_t size;
    void *map;                  /* mmap'd region (NULL when parsed from a caller's buffer) */
    size_t n_tensors;
    st_tensor *tensors;         /* in header order */
    void *arena;                /* internal */
} st_file;

/* Maps and validates a file. */
int st_open(const char *path, st_file **out);
/* Validates a file image held in memory (not copied: buf must outlive the result). `path` is
 * used in messages only. */
int st_parse(const uint8_t *buf, size_t size, const char *path, st_file **out);
void st_close(st_file *f);
/* The tensor of that name, or NULL. */
const st_tensor *st_find(const st_file *f, const char *name);
/* The tensor of that name in the first of files[0 .. n) that holds it (*file set to that
 * file), or NULL. */
const st_tensor *st_find_in(st_file *const *files, size_t n, const char *name,
                            const st_file **file);

#endif
