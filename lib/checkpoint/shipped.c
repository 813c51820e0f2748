/* The buffers of the checkpoint layouts (layout.h): a shipped weight's imported values, and the
 * codes a save or a manifest quantizes for a weight without them. */
#include "base/alloc.h"
#include "layout.h"

void shipped_values_free(shipped_values *v) {
    if (!v->codes_mapped) px_free(v->codes);
    if (!v->scales_mapped) px_free(v->scales);
    *v = (shipped_values){0};
}

int quant_weight_make(const weight *w, int rule, uint64_t n_scales, quant_weight *made,
                      const char *what) {
    const size_t f = quant_scratch_floats(w, rule);
    float *scratch = px_malloc((f ? f : 1) * sizeof(float), what);
    const quant_format *format = quant_rule_of(rule)->format;
    made->codes = scratch ? px_malloc(quant_weight_code_bytes(format, w->rows, w->cols), what)
                          : NULL;
    made->scales = made->codes ? px_malloc(n_scales * format->scale_bytes, what) : NULL;
    if (made->scales) quant_weight_quantize(w, rule, made, scratch);
    px_free(scratch);
    if (made->scales) return PARITY_OK;
    px_free(made->codes);
    *made = (quant_weight){0};
    return PARITY_ERR_OUT_OF_MEMORY;
}
