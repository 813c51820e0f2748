/* Fuzz target: loading a whole checkpoint directory. The input is split at each FUZZ_MARKER
 * ("@@FILE") into up to five parts, which become config.json, model.safetensors.index.json,
 * model.safetensors and two shards, in that order (an empty or absent part: no such file),
 * in a directory of this process; then parity_model_load. A model that loads is scored. */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_make_dir("load");
    return 0;
}

static const uint8_t *find_marker(const uint8_t *p, const uint8_t *end) {
    for (; end - p >= FUZZ_MARKER_LEN; p++)
        if (!memcmp(p, FUZZ_MARKER, FUZZ_MARKER_LEN)) return p;
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *p = data, *end = data + size;
    for (size_t i = 0; i < FUZZ_N_FILES; i++) {
        const uint8_t *m = p ? find_marker(p, end) : NULL;
        const uint8_t *part_end = m ? m : end;
        if (p && part_end > p)
            fuzz_write(fuzz_dir, fuzz_files[i], p, (size_t)(part_end - p));
        else
            fuzz_remove(fuzz_dir, fuzz_files[i]);
        p = m ? m + FUZZ_MARKER_LEN : NULL;
    }
    fuzz_load_dir();
    return 0;
}
