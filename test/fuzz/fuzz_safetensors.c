/* Fuzz target: the safetensors reader (st_parse) on the input as a whole file image. A file
 * it accepts must keep every promise of lib/safetensors.h: each tensor's bytes lie inside the
 * data section, sizes match shapes, tensors are contiguous from 0 and end at the file's end,
 * names are unique and found by st_find. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_file *f = NULL;
    int rc = st_parse(data, size, "fuzz.safetensors", &f);
    if (rc) {
        fuzz_check_failure(rc);
        FUZZ_REQUIRE(f == NULL, "output set on failure");
        return 0;
    }
    uint64_t header = 0;
    for (int k = 7; k >= 0; k--) header = header << 8 | data[k];
    const uint8_t *begin = data + 8 + header, *end = data + size;
    uint64_t total = 0;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        FUZZ_REQUIRE(t->ndim <= ST_MAX_DIMS, "%u dims", t->ndim);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->ndim; d++) n *= t->shape[d];
        FUZZ_REQUIRE(n == t->n_elements, "%s: n_elements", t->name);
        FUZZ_REQUIRE(t->end >= t->begin && t->end - t->begin == n * st_dtype_size(t->dtype),
                     "%s: byte range", t->name);
        FUZZ_REQUIRE(t->data == begin + t->begin && t->data + (t->end - t->begin) <= end,
                     "%s: data outside the file", t->name);
        FUZZ_REQUIRE(st_find(f, t->name) == t, "%s: st_find", t->name);
        total += t->end - t->begin;
    }
    FUZZ_REQUIRE(begin + total == end, "data section is not covered exactly");
    st_close(f);
    return 0;
}
