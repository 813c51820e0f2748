/* Fuzz target: the sharded-checkpoint path. The input is written as
 * model.safetensors.index.json into a directory that holds a valid micro checkpoint
 * (config.json, model.safetensors, and the same tensors split into two shards), and the
 * directory is loaded. A model that loads is scored. */
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_write_checkpoint(fuzz_make_dir("index"));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write(fuzz_dir, fuzz_files[1], data, size);
    fuzz_load_dir();
    return 0;
}
