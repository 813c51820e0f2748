/* Manifest checksums: FNV-1a 64 over a tensor's byte stream, whole (manifest version 1) or per
 * 64 KiB chunk with the chunks' checksums hashed in order (version 2), as a stream or in bulk
 * over buffers on a pool's threads; and the public calls that compute them for a caller's
 * buffers (parity_bytes_checksum, parity_tensor_checksum: version 1; parity_tensor_checksums:
 * either version, on a parity_pool).
 *
 * Speed: FNV-1a is a chain of multiplies, one per byte, so one chain runs at the multiply's
 * latency. Version 2's chunks are independent: the bulk path hashes four chunks of a buffer
 * at once on each worker (four chains in flight: the multiplier's throughput, not its
 * latency) and spreads a buffer's chunks over the workers, so one large tensor (an embedding)
 * does not leave the other threads idle. Which worker hashes a chunk never changes its value,
 * and the chunks' checksums are combined in order by one thread: the result does not depend
 * on the pool's size. */
#include <stdint.h>
#include <string.h>

#include "base/alloc.h"
#include "base/errors.h"
#include "base/floats.h"
#include "checksum.h"
#include "user_pool.h"

void checksum_begin(checksum_stream *s, uint32_t version) {
    *s = (checksum_stream){.version = version, .chunk = FNV1A64_OFFSET, .chunks = FNV1A64_OFFSET};
}

void checksum_bytes(checksum_stream *s, const void *data, uint64_t n) {
    const uint8_t *p = data;
    for (uint64_t i = 0; i < n; i++) checksum_byte(s, p[i]);
}

uint64_t checksum_end(checksum_stream *s) {
    if (s->version < 2) return s->chunk;
    if (s->used) s->chunks = checksum_fold(s->chunks, s->chunk);
    s->used = 0;
    s->chunk = FNV1A64_OFFSET;
    return s->chunks;
}

/* ---- buffers ----------------------------------------------------------------------------- */

/* Bytes of the stream per value: 1 for F8_E4M3 (the bytes as they are), else 2 (bf16). */
static uint64_t stream_bytes_per_value(uint32_t dtype) {
    return dtype == PARITY_DTYPE_F8_E4M3 ? 1 : 2;
}

/* Value i of a buffer as the bf16 bits the stream holds (the caller's memory need not be
 * aligned: values are read with memcpy). */
static inline uint16_t bf16_value_at(uint32_t dtype, const uint8_t *src, uint64_t i) {
    uint16_t v;
    if (dtype == PARITY_DTYPE_F32) {
        float f;
        memcpy(&f, src + 4 * i, 4);
        return bf16_from_f32(f);
    }
    memcpy(&v, src + 2 * i, 2);
    return dtype == PARITY_DTYPE_F16 ? bf16_from_f32(f16_to_f32(v)) : v;
}

/* FNV-1a 64 from h over values [begin, end) of a buffer's stream, one chain. */
static uint64_t hash_values(const checksum_job *j, uint64_t begin, uint64_t end, uint64_t h) {
    const uint8_t *src = j->data;
    if (j->dtype == PARITY_DTYPE_F8_E4M3) {
        for (uint64_t i = begin; i < end; i++) h = fnv1a64_byte(h, src[i]);
        return h;
    }
    for (uint64_t i = begin; i < end; i++) {
        const uint16_t v = bf16_value_at(j->dtype, src, i);
        h = fnv1a64_byte(fnv1a64_byte(h, (uint8_t)v), (uint8_t)(v >> 8));
    }
    return h;
}

/* Four FNV-1a 64 chains h[0..3] continued over n bf16 values of four streams (two bytes
 * each, low byte first): the chains in locals, so that the four multiplies of a step are in
 * flight together. */
static void hash4_u16(const uint16_t *s0, const uint16_t *s1, const uint16_t *s2,
                      const uint16_t *s3, size_t n, uint64_t h[4]) {
    uint64_t h0 = h[0], h1 = h[1], h2 = h[2], h3 = h[3];
    for (size_t i = 0; i < n; i++) {
        const uint16_t v0 = s0[i], v1 = s1[i], v2 = s2[i], v3 = s3[i];
        h0 = fnv1a64_byte(h0, (uint8_t)v0);
        h1 = fnv1a64_byte(h1, (uint8_t)v1);
        h2 = fnv1a64_byte(h2, (uint8_t)v2);
        h3 = fnv1a64_byte(h3, (uint8_t)v3);
        h0 = fnv1a64_byte(h0, (uint8_t)(v0 >> 8));
        h1 = fnv1a64_byte(h1, (uint8_t)(v1 >> 8));
        h2 = fnv1a64_byte(h2, (uint8_t)(v2 >> 8));
        h3 = fnv1a64_byte(h3, (uint8_t)(v3 >> 8));
    }
    h[0] = h0, h[1] = h1, h[2] = h2, h[3] = h3;
}

/* The same over n bytes of four streams. */
static void hash4_u8(const uint8_t *s0, const uint8_t *s1, const uint8_t *s2, const uint8_t *s3,
                     size_t n, uint64_t h[4]) {
    uint64_t h0 = h[0], h1 = h[1], h2 = h[2], h3 = h[3];
    for (size_t i = 0; i < n; i++) {
        h0 = fnv1a64_byte(h0, s0[i]);
        h1 = fnv1a64_byte(h1, s1[i]);
        h2 = fnv1a64_byte(h2, s2[i]);
        h3 = fnv1a64_byte(h3, s3[i]);
    }
    h[0] = h0, h[1] = h1, h[2] = h2, h[3] = h3;
}

/* Values converted to bf16 per step of the four-chunk path (F16 and F32 sources, and bf16
 * ones the caller did not align). */
#define CONVERT_BLOCK 1024

/* The checksums of four consecutive full chunks of a buffer, `chunk` values each, the first
 * starting at value `first`: four independent chains, a value of each chunk in turn. */
static void hash_four_chunks(const checksum_job *j, uint64_t first, uint64_t chunk,
                             uint64_t out[4]) {
    const uint8_t *src = j->data;
    out[0] = out[1] = out[2] = out[3] = FNV1A64_OFFSET;
    if (j->dtype == PARITY_DTYPE_F8_E4M3) {
        const uint8_t *b = src + first;
        hash4_u8(b, b + chunk, b + 2 * chunk, b + 3 * chunk, chunk, out);
        return;
    }
    if (j->dtype == PARITY_DTYPE_BF16 && ((uintptr_t)src & 1u) == 0) {
        const uint16_t *v = (const uint16_t *)(const void *)src + first;
        hash4_u16(v, v + chunk, v + 2 * chunk, v + 3 * chunk, chunk, out);
        return;
    }
    /* a block of each chunk converted, then hashed (the conversion loops vectorize) */
    uint16_t bf[4][CONVERT_BLOCK];
    for (uint64_t b = 0; b < chunk; b += CONVERT_BLOCK) {
        const size_t n = chunk - b < CONVERT_BLOCK ? (size_t)(chunk - b) : CONVERT_BLOCK;
        for (int k = 0; k < 4; k++) {
            const uint64_t at = first + (uint64_t)k * chunk + b;
            if (j->dtype == PARITY_DTYPE_F32) {
                const float *f = (const float *)(const void *)src;
                if (((uintptr_t)src & 3u) == 0)
                    for (size_t i = 0; i < n; i++) bf[k][i] = bf16_from_f32(f[at + i]);
                else
                    for (size_t i = 0; i < n; i++) bf[k][i] = bf16_value_at(j->dtype, src, at + i);
            } else {
                for (size_t i = 0; i < n; i++) bf[k][i] = bf16_value_at(j->dtype, src, at + i);
            }
        }
        hash4_u16(bf[0], bf[1], bf[2], bf[3], n, out);
    }
}

/* A task of the bulk path: up to four consecutive chunks of one buffer. */
#define CHUNKS_PER_TASK 4

/* Values per chunk and the number of chunks of a buffer (version 2). */
static uint64_t chunk_values(const checksum_job *j) {
    return CHECKSUM_CHUNK_BYTES / stream_bytes_per_value(j->dtype);
}
static uint64_t chunk_count(const checksum_job *j) {
    return (j->count + chunk_values(j) - 1) / chunk_values(j);
}

/* The chunk checksums of chunks [first, first + n) of a buffer (n <= CHUNKS_PER_TASK) into
 * out[0 .. n). */
static void hash_chunks(const checksum_job *j, uint64_t first, uint64_t n, uint64_t *out) {
    const uint64_t cv = chunk_values(j), begin = first * cv;
    if (n == CHUNKS_PER_TASK && begin + n * cv <= j->count) {
        hash_four_chunks(j, begin, cv, out);
        return;
    }
    for (uint64_t c = 0; c < n; c++) {
        const uint64_t b = begin + c * cv, e = b + cv < j->count ? b + cv : j->count;
        out[c] = hash_values(j, b, e, FNV1A64_OFFSET);
    }
}

/* The chunk checksums in order, combined (version 2). */
static uint64_t fold_chunks(const uint64_t *hashes, uint64_t n) {
    uint64_t h = FNV1A64_OFFSET;
    for (uint64_t c = 0; c < n; c++) h = checksum_fold(h, hashes[c]);
    return h;
}

uint64_t checksum_buffer(uint32_t version, const checksum_job *job) {
    if (version < 2) return hash_values(job, 0, job->count, FNV1A64_OFFSET);
    uint64_t h = FNV1A64_OFFSET, part[CHUNKS_PER_TASK];
    const uint64_t chunks = chunk_count(job);
    for (uint64_t c = 0; c < chunks; c += CHUNKS_PER_TASK) {
        const uint64_t n = chunks - c < CHUNKS_PER_TASK ? chunks - c : CHUNKS_PER_TASK;
        hash_chunks(job, c, n, part);
        for (uint64_t k = 0; k < n; k++) h = checksum_fold(h, part[k]);
    }
    return h;
}

/* The bulk path's work: tasks of CHUNKS_PER_TASK chunks, numbered across the buffers in
 * order; buffer i's tasks start at task_start[i] and its chunks' checksums at
 * chunk_start[i] in `hashes` (version 1: one task a buffer, its checksum in out[i]). */
typedef struct bulk_run {
    uint32_t version;
    const checksum_job *jobs;
    size_t n;
    const uint64_t *task_start, *chunk_start;
    uint64_t *hashes, *out;
} bulk_run;

static void bulk_tasks(void *ctx, size_t begin, size_t end, unsigned worker) {
    (void)worker;
    const bulk_run *r = ctx;
    if (r->version < 2) {
        for (size_t i = begin; i < end; i++)
            r->out[i] = hash_values(&r->jobs[i], 0, r->jobs[i].count, FNV1A64_OFFSET);
        return;
    }
    /* the buffer of task `begin`: the last whose tasks start at or before it */
    size_t lo = 0, hi = r->n;
    while (hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        if (r->task_start[mid] <= begin) lo = mid;
        else hi = mid;
    }
    for (size_t t = begin, i = lo; t < end; t++) {
        while (t >= r->task_start[i + 1]) i++;
        const uint64_t chunks = r->chunk_start[i + 1] - r->chunk_start[i];
        const uint64_t first = (t - r->task_start[i]) * CHUNKS_PER_TASK;
        const uint64_t n = chunks - first < CHUNKS_PER_TASK ? chunks - first : CHUNKS_PER_TASK;
        hash_chunks(&r->jobs[i], first, n, r->hashes + r->chunk_start[i] + first);
    }
}

int checksum_buffers(threadpool *pool, uint32_t version, const checksum_job *jobs, size_t n,
                     uint64_t *out) {
    if (n == 0) return PARITY_OK;
    if (version < 2) {
        bulk_run r = {.version = version, .jobs = jobs, .n = n, .out = out};
        if (pool) pool_run_dynamic(pool, bulk_tasks, &r, n, 1);
        else bulk_tasks(&r, 0, n, 0);
        return PARITY_OK;
    }
    uint64_t *starts = px_malloc(2 * (n + 1) * sizeof *starts, "checksum task table");
    if (!starts) return PARITY_ERR_OUT_OF_MEMORY;
    uint64_t *task_start = starts, *chunk_start = starts + n + 1;
    task_start[0] = chunk_start[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const uint64_t chunks = chunk_count(&jobs[i]);
        chunk_start[i + 1] = chunk_start[i] + chunks;
        task_start[i + 1] = task_start[i] + (chunks + CHUNKS_PER_TASK - 1) / CHUNKS_PER_TASK;
    }
    uint64_t *hashes = px_malloc((chunk_start[n] ? chunk_start[n] : 1) * sizeof *hashes,
                                 "chunk checksums");
    if (!hashes) {
        px_free(starts);
        return PARITY_ERR_OUT_OF_MEMORY;
    }
    bulk_run r = {version, jobs, n, task_start, chunk_start, hashes, out};
    /* a few tasks (a MiB of a bf16 stream) at a time to whichever worker is free */
    if (pool) pool_run_dynamic(pool, bulk_tasks, &r, task_start[n], 4);
    else bulk_tasks(&r, 0, task_start[n], 0);
    for (size_t i = 0; i < n; i++)
        out[i] = fold_chunks(hashes + chunk_start[i], chunk_start[i + 1] - chunk_start[i]);
    px_free(hashes);
    px_free(starts);
    return PARITY_OK;
}

/* ---- the public calls ---------------------------------------------------------------------- */

int parity_bytes_checksum(const void *data, uint64_t n_bytes, uint64_t *fnv1a64) {
    clear_error();
    if (!fnv1a64 || (!data && n_bytes))
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "parity_bytes_checksum: data or output is NULL");
    const checksum_job job = {PARITY_DTYPE_F8_E4M3, data, n_bytes};
    *fnv1a64 = checksum_buffer(1, &job);
    return PARITY_OK;
}

/* A dtype the checksums read, else the message naming `fn`. */
static int check_dtype(const char *fn, uint32_t dtype) {
    if (dtype <= PARITY_DTYPE_F8_E4M3) return PARITY_OK;
    return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: dtype %u is not BF16 (0), F16 (1), F32 (2) "
                     "or F8_E4M3 (3)", fn, dtype);
}

int parity_tensor_checksum(uint32_t dtype, const void *data, uint64_t n, uint64_t *fnv1a64) {
    clear_error();
    if (!fnv1a64 || (!data && n))
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "parity_tensor_checksum: data or output is NULL");
    TRY(check_dtype("parity_tensor_checksum", dtype));
    const checksum_job job = {dtype, data, n};
    *fnv1a64 = checksum_buffer(1, &job);
    return PARITY_OK;
}

int parity_tensor_checksums(parity_pool *pool, uint32_t manifest_version,
                            const parity_tensor_data *tensors, size_t n, uint64_t *checksums) {
    clear_error();
    const char *fn = "parity_tensor_checksums";
    if ((!tensors && n) || (!checksums && n))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: tensors or checksums is NULL", fn);
    if (!checksum_version_known(manifest_version))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: manifest version %u; the library's "
                         "are 1 and 2", fn, manifest_version);
    checksum_job *jobs = px_malloc((n ? n : 1) * sizeof *jobs, "checksum jobs");
    if (!jobs) return PARITY_ERR_OUT_OF_MEMORY;
    int rc = PARITY_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        const parity_tensor_data *t = &tensors[i];
        if ((rc = check_dtype(fn, t->dtype))) break;
        if (t->ndim != 1 && t->ndim != 2) {
            rc = set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: tensor %zu has %u dimensions; 1 or 2",
                           fn, i, t->ndim);
            break;
        }
        uint64_t count = t->shape[0];
        if (t->ndim == 2 && mul_overflows(t->shape[0], t->shape[1], &count)) {
            rc = set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: tensor %zu's shape overflows", fn, i);
            break;
        }
        if (!t->data && count) {
            rc = set_error(PARITY_ERR_INVALID_ARGUMENT, "%s: tensor %zu's data is NULL", fn, i);
            break;
        }
        jobs[i] = (checksum_job){t->dtype, t->data, count};
    }
    threadpool *threads = NULL;
    if (!rc) rc = user_pool_enter(pool, &threads, fn);
    if (!rc) {
        rc = checksum_buffers(threads, manifest_version, jobs, n, checksums);
        user_pool_leave(pool, threads);
    }
    px_free(jobs);
    return rc;
}
