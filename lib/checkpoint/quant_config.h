/* A checkpoint's quantization settings, read from config.json's quantization_config or
 * hf_quant_config.json (lib/checkpoint/quant_config.c) into the model's quant_checkpoint. */
#ifndef PARITY_QUANT_CONFIG_H
#define PARITY_QUANT_CONFIG_H

#include <stddef.h>

#include "model/model.h"

/* config.json's quantization_config into *out (all zero when there is none); PARITY_ERR_CONFIG
 * for a malformed one, PARITY_ERR_UNSUPPORTED for another method, format or block size, or a
 * field that would change the arithmetic. */
int quant_checkpoint_parse(const char *text, size_t len, const char *path, quant_checkpoint *out);
/* hf_quant_config.json (ModelOpt's {"quantization": {...}}) into *out, for a checkpoint whose
 * config.json has no quantization_config. */
int quant_checkpoint_parse_modelopt(const char *text, size_t len, const char *path,
                                    quant_checkpoint *out);
void quant_checkpoint_free(quant_checkpoint *c);
/* Whether the checkpoint keeps the weight NAME ("<module>.weight") unquantized. */
int quant_checkpoint_keeps(const quant_checkpoint *c, const char *weight_name);
/* "fp8", "bitnet", "modelopt NVFP4", "mxfp4" or "none", for messages. */
const char *quant_method_name(int method);

#endif
