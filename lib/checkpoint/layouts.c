/* The list of checkpoint layouts (layouts.h), each row defined in its own file, and what is
 * looked up in it: a layout by its save name or by the quantization method it reads. */
#include <stdio.h>
#include <string.h>

#include "base/errors.h"
#include "layouts.h"

static const checkpoint_layout *const layouts[] = {
    &layout_bf16, &layout_fp16, &layout_fp32, &layout_fp8_block, &layout_bitnet, &layout_nvfp4,
    &layout_mxfp4,
};
#define N_LAYOUTS (sizeof layouts / sizeof layouts[0])

const checkpoint_layout *layout_of_method(int method) {
    for (size_t i = 0; i < N_LAYOUTS; i++)
        if (method != QUANT_METHOD_NONE && layouts[i]->method == method) return layouts[i];
    return NULL;
}

int layout_parse(const char *spec, const checkpoint_layout **layout, int *rule) {
    *rule = -1;
    *layout = &layout_bf16;
    if (!spec) return PARITY_OK;
    for (size_t i = 0; i < N_LAYOUTS; i++) {
        const checkpoint_layout *l = layouts[i];
        const size_t n = strlen(l->name);
        if (strncmp(spec, l->name, n) || (spec[n] && (spec[n] != ':' || !l->rule_from_name)))
            continue;
        *layout = l;
        return spec[n] ? l->rule_from_name(spec + n + 1, rule) : PARITY_OK;
    }
    return set_error(PARITY_ERR_INVALID_ARGUMENT, "layout '%s' is not one of bf16, fp16, fp32, "
                     "fp8-block[:RULE], bitnet[:RULE], nvfp4[:RULE], mxfp4[:RULE]", spec);
}
