/* What a built-in shape holds and reads, counted from its blueprint without making its
 * weights: parameters (all, and active in one token's step), the bytes held once loaded from
 * a checkpoint of each layout (bf16, and the quantized layouts whose codes and scales the
 * library holds as shipped: block-FP8, NVFP4, MXFP4, BitNet ternary) and the bytes one decode
 * step of one sequence reads (the linear weights it runs, the lm_head, one embedding row).
 * The decoder layers' linear weights are counted by the formats' own code and scale sizes
 * (quant_weight_code_bytes, quant_weight_scale_bytes: what a load allocates or maps); the
 * embedding, lm_head and routers in bf16, norms and biases in bf16 plus their fp32 copy.
 * A mixture-of-experts step runs num_experts_per_tok of each sparse layer's experts.
 *
 *   build/bench/model-memory [--json FILE] [NAME ...]   (default: the MoE built-ins and
 *                                                        qwen3-0.6b; "fits" = held <= 24 GiB)
 */
#include <stdio.h>
#include <string.h>

#include "model/config.h"
#include "model/model.h"
#include "quant/quant_weight.h"
#include "quant/rules.h"

static const struct {
    const char *name;
    uint32_t gemm; /* PARITY_GEMM_* of the layout's codes; BF16: values */
} layouts[] = {
    {"bf16", PARITY_GEMM_BF16},       {"fp8-block", PARITY_GEMM_FP8_BLOCK},
    {"nvfp4", PARITY_GEMM_NVFP4},     {"mxfp4", PARITY_GEMM_MXFP4},
    {"ternary", PARITY_GEMM_TERNARY},
};
enum { LAYOUTS = sizeof layouts / sizeof layouts[0] };

typedef struct shape_bytes {
    double params, active;        /* parameters; of them, those one token's step runs */
    double held[LAYOUTS];         /* bytes held, per layout */
    double step[LAYOUTS];         /* bytes one decode step reads, per layout */
} shape_bytes;

/* The bytes of one tensor in a layout: a linear weight's codes and scales, else bf16 values
 * (and the fp32 copy of a vector). */
static double tensor_bytes(const expected *t, uint32_t gemm) {
    const uint64_t rows = t->rows ? t->rows : 1, n = rows * t->cols;
    if (t->linear && gemm != PARITY_GEMM_BF16) {
        const quant_format *f = quant_format_row(gemm);
        return (double)(quant_weight_code_bytes(f, rows, t->cols) +
                        quant_weight_scale_bytes(f, rows, t->cols));
    }
    return (double)n * (rows == 1 ? 6 : 2);
}

/* Whether the entry is a routed expert's weight (its name says so). */
static int is_expert(const expected *t) { return strstr(t->name, ".mlp.experts.") != NULL; }

static int count_shape(const char *name, shape_bytes *out) {
    parity_config c;
    if (parity_config_builtin(name, &c) != PARITY_OK) {
        fprintf(stderr, "model-memory: %s\n", parity_last_error());
        return 1;
    }
    parity_model *m = model_new(&c);
    if (!m) {
        fprintf(stderr, "model-memory: out of memory for %s's blueprint\n", name);
        return 1;
    }
    memset(out, 0, sizeof *out);
    const double share = c.num_experts ? (double)c.num_experts_per_tok / c.num_experts : 1.0;
    size_t n;
    const expected *t = model_tensors(m, &n);
    for (size_t i = 0; i < n; i++) {
        const double params = (double)(t[i].rows ? t[i].rows : 1) * t[i].cols;
        const int embed = !strcmp(t[i].name, "model.embed_tokens.weight");
        /* a step reads one embedding row (a tied head reads the table as the head) */
        const double read = embed ? (c.tie_word_embeddings ? 1.0 : 1.0 / c.vocab_size)
                                  : is_expert(&t[i]) ? share
                                                     : 1.0;
        out->params += params;
        out->active += params * (is_expert(&t[i]) ? share : 1.0); /* as Qwen counts them */
        for (size_t l = 0; l < LAYOUTS; l++) {
            const double b = tensor_bytes(&t[i], layouts[l].gemm);
            out->held[l] += b;
            out->step[l] += b * read;
        }
    }
    parity_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    const char *json_path = NULL;
    const char *names[64];
    int n_names = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: model-memory [--json FILE] [BUILT-IN NAME ...]\n");
            return 2;
        } else if (n_names < 64) names[n_names++] = argv[i];
    }
    if (!n_names) {
        static const char *defaults[] = {"qwen3-0.6b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b",
                                         "qwen2-57b-a14b"};
        for (; n_names < 4; n_names++) names[n_names] = defaults[n_names];
    }
    FILE *json = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && !json) {
        perror(json_path);
        return 1;
    }
    const double gib = 1024.0 * 1024.0 * 1024.0, budget = 24.0 * gib;
    printf("%-18s %8s %8s  %-10s %10s %10s %5s\n", "shape", "params", "active", "layout",
           "held GiB", "step GiB", "fits");
    if (json) fprintf(json, "{\"budget_gib\": 24, \"shapes\": [");
    for (int s = 0; s < n_names; s++) {
        shape_bytes b;
        if (count_shape(names[s], &b)) return 1;
        if (json)
            fprintf(json, "%s\n  {\"name\": \"%s\", \"params\": %.0f, \"active\": %.0f, \"layouts\": [",
                    s ? "," : "", names[s], b.params, b.active);
        for (size_t l = 0; l < LAYOUTS; l++) {
            printf("%-18s %7.2fB %7.2fB  %-10s %10.2f %10.2f %5s\n", l ? "" : names[s],
                   b.params / 1e9, b.active / 1e9, layouts[l].name, b.held[l] / gib,
                   b.step[l] / gib, b.held[l] <= budget ? "yes" : "no");
            if (json)
                fprintf(json, "%s{\"layout\": \"%s\", \"held_bytes\": %.0f, \"step_bytes\": %.0f, "
                        "\"fits_24gib\": %s}", l ? ", " : "", layouts[l].name, b.held[l],
                        b.step[l], b.held[l] <= budget ? "true" : "false");
        }
        if (json) fprintf(json, "]}");
    }
    if (json) {
        fprintf(json, "\n]}\n");
        fclose(json);
    }
    return 0;
}
