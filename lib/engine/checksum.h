/* Manifest checksums (checksum.c): FNV-1a 64 as manifest version 1 defines it (over a
 * tensor's byte stream whole) and as version 2 does (the FNV-1a 64 of each 64 KiB chunk of
 * the stream, those checksums' little-endian bytes hashed in order), as a stream fed byte by
 * byte (any source of bytes, e.g. codes unpacked one at a time) or in bulk over buffers on a
 * pool's threads, with the same value whatever the number of threads. */
#ifndef PARITY_ENGINE_CHECKSUM_H
#define PARITY_ENGINE_CHECKSUM_H

#include <stdint.h>

#include "base/threadpool.h"
#include "parity.h"

#define FNV1A64_OFFSET 0xcbf29ce484222325ull
#define FNV1A64_PRIME 0x100000001b3ull
/* A version-2 chunk: 65536 bytes of the stream (the last chunk of a stream may be shorter). */
#define CHECKSUM_CHUNK_BYTES 65536u

static inline uint64_t fnv1a64_byte(uint64_t h, uint8_t b) { return (h ^ b) * FNV1A64_PRIME; }

/* A checksum under construction. */
typedef struct checksum_stream {
    uint32_t version;  /* 1 or 2 */
    uint32_t used;     /* bytes in the current chunk (version 2) */
    uint64_t chunk;    /* FNV-1a 64 of the current chunk (version 1: of everything so far) */
    uint64_t chunks;   /* FNV-1a 64 of the finished chunks' checksums (version 2) */
} checksum_stream;

void checksum_begin(checksum_stream *s, uint32_t version);
/* Appends the chunk checksum `h` to the stream of chunk checksums. */
static inline uint64_t checksum_fold(uint64_t chunks, uint64_t h) {
    for (int k = 0; k < 8; k++) chunks = fnv1a64_byte(chunks, (uint8_t)(h >> (8 * k)));
    return chunks;
}
static inline void checksum_byte(checksum_stream *s, uint8_t b) {
    s->chunk = fnv1a64_byte(s->chunk, b);
    if (s->version >= 2 && ++s->used == CHECKSUM_CHUNK_BYTES) {
        s->chunks = checksum_fold(s->chunks, s->chunk);
        s->chunk = FNV1A64_OFFSET;
        s->used = 0;
    }
}
void checksum_bytes(checksum_stream *s, const void *data, uint64_t n);
uint64_t checksum_end(checksum_stream *s);

/* One buffer to checksum: `count` values of `dtype` (PARITY_DTYPE_BF16, _F16, _F32: the
 * stream is their bf16 values' little-endian bytes, F16 and F32 rounded to nearest even;
 * PARITY_DTYPE_F8_E4M3: the bytes as they are). */
typedef struct checksum_job {
    uint32_t dtype;
    const void *data;
    uint64_t count;
} checksum_job;

/* The checksum of one buffer on the calling thread (four chunks at once where it can). */
uint64_t checksum_buffer(uint32_t version, const checksum_job *job);
/* out[i] = the checksum of jobs[i], on the pool's threads (NULL: the calling thread), the
 * chunks of every buffer spread over them. PARITY_ERR_OUT_OF_MEMORY (with the message set)
 * if the table of chunk checksums cannot be allocated. */
int checksum_buffers(threadpool *pool, uint32_t version, const checksum_job *jobs, size_t n,
                     uint64_t *out);

/* The manifest versions this library reads (it writes PARITY_MANIFEST_VERSION). */
static inline int checksum_version_known(uint64_t version) { return version == 1 || version == 2; }

#endif /* PARITY_ENGINE_CHECKSUM_H */
