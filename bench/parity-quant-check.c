/* parity-quant-check: does a deployed quantized checkpoint hold the codes its training
 * quantizer computes from the fp32 latents?
 *
 *   parity-quant-check --latents DIR --quantizer FORMAT:RULE [--deployed DIR]
 *                      [--policy PRESET] [--write-export DIR]
 *                      [--eval FILE...] [--json FILE] [--per-tensor]
 *
 * For every decoder linear weight of the latents (a checkpoint directory with F32 masters, or
 * bf16; or a .safetensors file of masters beside its directory's config.json),
 * three code sets under the quantizer (FORMAT nvfp4, mxfp4, ternary, fp8-block, mxfp8):
 *   (a) train     the training quantizer on the fp32 latents (parity_quantize_weight);
 *   (b) export    the same quantizer after a bf16 cast of the latents, in bf16 arithmetic for
 *                 the ternary rules (onebitllms' quantize_to_1bit; parity_quantize_bf16_export);
 *   (c) deployed  the --deployed checkpoint's codes: its shipped codes (a BitNet checkpoint),
 *                 else the quantizer applied to its values (fake-quantized bf16 weights);
 * and the fraction of codes where (b) and (c) differ from (a), the scales that differ and by
 * how much. Then the effect: on the evaluation sequences (test/data/reference/eval_0{0..3}.bin
 * by default), the held-out NLL and the sampler/learner mismatch when the sampler serves (b)
 * (and (c)) and the learner trains on the latents, both under PRESET+FORMAT:RULE (default
 * hf-eager). And both remedies: (1) write the training quantizer's codes (the latents saved in
 * the format's checkpoint layout with RULE and loaded back: bitnet, nvfp4 or mxfp4), (2) adjust
 * each bf16 input to the nearest bf16 value whose export gives the training code
 * (parity_quant_adjust_bf16: the 4-bit and ternary rules), each followed by the same count,
 * which must be 0.
 * --write-export DIR writes (b) as a checkpoint of the format (BitNet: the export as
 * onebitllms writes it, weight_scale its bf16 multiplier; ModelOpt NVFP4; MXFP4), which
 * --deployed reads back as (c).
 * Exit status 0 when the remedies give 0 disagreements (where they apply), 1 otherwise.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "options.h"
#include "parity.h"

#define MAX_EVAL 16

static void die(const char *what, int rc) {
    fprintf(stderr, "parity-quant-check: %s: %s (%s)\n", what, parity_last_error(),
            parity_status_name(rc));
    exit(2);
}

static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "parity-quant-check: out of memory\n");
        exit(2);
    }
    return p;
}

/* The bits of an fp32 value: scales and log-probs are compared bit for bit. */
static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

typedef struct counts {
    uint64_t codes, code_diff, scales, scale_diff;
    double scale_rel; /* max relative difference of a scale */
} counts;

/* The scales a format has: the block scales, then the tensor scale where there is one
 * (NVFP4's s2; ternary has the tensor scale only). `first` is where they start. */
static uint64_t scales_of(int gemm, uint64_t grid, uint64_t *first) {
    *first = gemm == PARITY_GEMM_TERNARY ? grid : 0;
    return gemm == PARITY_GEMM_TERNARY ? 1 : gemm == PARITY_GEMM_NVFP4 ? grid + 1 : grid;
}

static void compare(const uint8_t *a, const float *as, const uint8_t *b, const float *bs,
                    uint64_t n, uint64_t n_scales, counts *c) {
    c->codes += n;
    for (uint64_t i = 0; i < n; i++) c->code_diff += a[i] != b[i];
    c->scales += n_scales;
    for (uint64_t i = 0; i < n_scales; i++)
        if (bits_of(as[i]) != bits_of(bs[i])) {
            c->scale_diff++;
            const double rel = fabs((double)bs[i] - as[i]) / fmax(fabs((double)as[i]), 1e-30);
            if (rel > c->scale_rel) c->scale_rel = rel;
        }
}

static void add(counts *t, const counts *c) {
    t->codes += c->codes, t->code_diff += c->code_diff, t->scales += c->scales;
    t->scale_diff += c->scale_diff;
    if (c->scale_rel > t->scale_rel) t->scale_rel = c->scale_rel;
}

/* The linear weights of layer l (q, k, v, o, gate, up, down) and their names. */
static const char *const linear_names[7] = {"self_attn.q_proj", "self_attn.k_proj",
                                            "self_attn.v_proj", "self_attn.o_proj",
                                            "mlp.gate_proj",    "mlp.up_proj", "mlp.down_proj"};

/* A linear weight of layer l, by its checkpoint name, and its shape: what a model says of it. */
typedef struct linear {
    char name[128];
    size_t rows, cols;
    int quantized;  /* 0: the checkpoint keeps it in bf16 */
} linear;

static linear linear_of(const parity_model *m, uint32_t l, int j) {
    linear w;
    snprintf(w.name, sizeof w.name, "model.layers.%u.%s.weight", l, linear_names[j]);
    parity_weight_info info = {.size = sizeof info};
    const int rc = parity_model_weight_info(m, w.name, &info);
    if (rc) die(w.name, rc);
    w.rows = info.shape[0], w.cols = info.shape[1], w.quantized = (int)info.quantized;
    return w;
}

/* The weight's values in fp32: its fp32 masters where it has them, else its bf16 values. */
static float *values_of(const parity_model *m, const linear *w) {
    const size_t n = w->rows * w->cols;
    float *x = xmalloc(n * sizeof *x);
    const int rc = parity_model_weight_values(m, w->name, x, n);
    if (rc) die(w->name, rc);
    return x;
}

/* A linear weight's latent values and the training quantizer's codes and scales of them. */
typedef struct trained {
    size_t n;       /* values (rows x cols) */
    uint64_t grid;  /* block scales; the scales hold grid + 1, the tensor scale last */
    float *x, *scales;
    uint8_t *codes;
} trained;

static trained train(const parity_model *m, const linear *w, int quantizer) {
    trained t = {w->rows * w->cols, parity_quant_scale_count(quantizer, w->rows, w->cols),
                 values_of(m, w), NULL, NULL};
    t.scales = xmalloc((t.grid + 1) * 4);
    t.codes = xmalloc(t.n);
    const int rc = parity_quantize_weight(quantizer, w->rows, w->cols, t.x, w->cols, t.codes,
                                          t.scales);
    if (rc) die("train", rc);
    return t;
}

static void trained_free(trained *t) { free(t->x), free(t->scales), free(t->codes); }

/* What m's policies of format `gemm` read for w from now on: these codes and scales, as a
 * checkpoint of the format ships them (the scales stored in scale_dtype where it chooses). */
static void serve_codes(parity_model *m, const linear *w, int gemm, const uint8_t *codes,
                        const float *scales, uint64_t grid, int scale_dtype) {
    const int rc = parity_model_set_quantized(m, w->name, (uint32_t)gemm, codes, w->rows * w->cols,
                                              scales, grid + 1, (uint32_t)scale_dtype);
    if (rc) die("serving codes", rc);
}

/* The codes and scales m's policies of `quantizer` read for w: its shipped codes of the
 * format, else the quantizer's of its values. */
static void codes_of(const parity_model *m, const linear *w, int quantizer, uint8_t *codes,
                     float *scales, uint64_t grid) {
    const int rc = parity_model_weight_codes(m, w->name, quantizer, codes, w->rows * w->cols,
                                             scales, grid + 1);
    if (rc) die(w->name, rc);
}

/* Log-probs of the evaluation sequences under policy p. */
static float *score_all(const parity_model *m, const parity_policy *p, const int32_t *tokens,
                        const uint32_t *lens, size_t n, size_t total) {
    parity_scorer_params sp;
    parity_scorer_default_params(&sp);
    sp.policy = *p;
    sp.n_threads = 2;
    parity_scorer *s;
    int rc = parity_scorer_create(m, &sp, &s);
    if (rc) die("creating a scorer", rc);
    parity_score_options so;
    parity_score_default_options(&so);
    float *lp = xmalloc((total - n) * sizeof *lp);
    if ((rc = parity_score(s, &so, tokens, lens, n, lp, NULL, NULL, NULL))) die("scoring", rc);
    parity_scorer_free(s);
    return lp;
}

typedef struct effect {
    double nll, mean_abs, max_abs, k3, equal;
} effect;

/* The sampler's log-probs `s` against the learner's `l`. */
static effect effect_of(const float *l, const float *s, size_t n) {
    effect e = {0, 0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        const double r = (double)l[i] - s[i];
        e.nll -= s[i];
        e.mean_abs += fabs(r);
        if (fabs(r) > e.max_abs) e.max_abs = fabs(r);
        e.k3 += exp(r) - r - 1;
        e.equal += bits_of(l[i]) == bits_of(s[i]);
    }
    e.nll /= (double)n, e.mean_abs /= (double)n, e.k3 /= (double)n, e.equal /= (double)n;
    return e;
}

static double frac(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

int main(int argc, char **argv) {
    const char *latents = NULL, *deployed = NULL, *qname = NULL, *preset = "hf-eager";
    const char *export_dir = NULL, *json_path = NULL;
    const char *evals[MAX_EVAL];
    size_t n_eval = 0;
    int per_tensor = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--per-tensor")) per_tensor = 1;
        else if (!strcmp(a, "--eval") && i + 1 < argc) {
            while (i + 1 < argc && argv[i + 1][0] != '-' && n_eval < MAX_EVAL)
                evals[n_eval++] = argv[++i];
        } else if (!option_value(argc, argv, &i, &v)) {
            fprintf(stderr, "usage: parity-quant-check --latents DIR --quantizer FORMAT:RULE "
                            "[--deployed DIR] [--policy PRESET] [--write-export DIR] "
                            "[--eval FILE...] [--json FILE] [--per-tensor]\n");
            return 2;
        } else if (!strcmp(a, "--latents")) latents = v;
        else if (!strcmp(a, "--deployed")) deployed = v;
        else if (!strcmp(a, "--quantizer")) qname = v;
        else if (!strcmp(a, "--policy")) preset = v;
        else if (!strcmp(a, "--write-export")) export_dir = v;
        else if (!strcmp(a, "--json")) json_path = v;
        else {
            fprintf(stderr, "parity-quant-check: unknown option %s\n", a);
            return 2;
        }
    }
    if (!latents || !qname) {
        fprintf(stderr, "parity-quant-check: --latents and --quantizer are required\n");
        return 2;
    }
    /* the policy: PRESET+FORMAT:RULE; its quantizer is the check's */
    char polname[128];
    snprintf(polname, sizeof polname, "%s+%s", preset, qname);
    parity_policy pol;
    int rc = parity_policy_from_name(polname, &pol);
    if (rc) die(polname, rc);
    const int q = pol.quantizer, ternary = pol.gemm == PARITY_GEMM_TERNARY;
    /* the checkpoint layout of the format, where it has one: remedy 1 and --write-export */
    const char *layout_of = ternary                         ? "bitnet"
                            : pol.gemm == PARITY_GEMM_NVFP4 ? "nvfp4"
                            : pol.gemm == PARITY_GEMM_MXFP4 ? "mxfp4"
                                                            : NULL;
    char defaults[4][512];
    if (!n_eval) {
        const char *root = getenv("PARITY_SOURCE_ROOT");
        for (int k = 0; k < 4; k++) {
            snprintf(defaults[k], sizeof defaults[k], "%s/test/data/reference/eval_%02d.bin",
                     root ? root : ".", k);
            evals[n_eval++] = defaults[k];
        }
    }
    /* the evaluation tokens (bytes) */
    int32_t *tokens = xmalloc(n_eval * 4096 * sizeof *tokens);
    uint32_t lens[MAX_EVAL];
    size_t total = 0;
    for (size_t k = 0; k < n_eval; k++) {
        FILE *f = fopen(evals[k], "rb");
        if (!f) {
            fprintf(stderr, "parity-quant-check: %s: %s\n", evals[k], strerror(errno));
            return 2;
        }
        int ch;
        lens[k] = 0;
        while (lens[k] < 4096 && (ch = fgetc(f)) != EOF) tokens[total + lens[k]++] = ch;
        fclose(f);
        total += lens[k];
    }

    /* latents given as a .safetensors file (a checkpoint's fp32 masters beside its bf16
     * model.safetensors, as ../shared/models ships them): a directory of links to it and to
     * its directory's config.json */
    char link_dir[] = "/tmp/parity-quant-latents-XXXXXX";
    const char *latents_dir = latents;
    struct stat st;
    if (stat(latents, &st) == 0 && S_ISREG(st.st_mode)) {
        char src[4096], dst[4096], cfg[4096];
        if (!mkdtemp(link_dir) || !realpath(latents, src)) die("linking the latents", PARITY_ERR_IO);
        snprintf(cfg, sizeof cfg, "%s", src);
        char *slash = strrchr(cfg, '/');
        snprintf(slash + 1, sizeof cfg - (size_t)(slash + 1 - cfg), "config.json");
        snprintf(dst, sizeof dst, "%s/model.safetensors", link_dir);
        int bad = symlink(src, dst) != 0;
        snprintf(dst, sizeof dst, "%s/config.json", link_dir);
        bad |= symlink(cfg, dst) != 0;
        if (bad) die("linking the latents", PARITY_ERR_IO);
        latents_dir = link_dir;
    }
    parity_model *L, *S, *R, *D = NULL; /* R serves the export of the adjusted inputs */
    if ((rc = parity_model_load(latents_dir, &L)) || (rc = parity_model_load(latents_dir, &S)) ||
        (rc = parity_model_load(latents_dir, &R)))
        die(latents, rc);
    if (latents_dir != latents) {
        char p[4200];
        snprintf(p, sizeof p, "%s/model.safetensors", link_dir);
        unlink(p);
        snprintf(p, sizeof p, "%s/config.json", link_dir);
        unlink(p);
        rmdir(link_dir);
    }
    if (deployed && (rc = parity_model_load(deployed, &D))) die(deployed, rc);
    const parity_config *c = parity_model_config(L);
    printf("parity-quant-check: latents %s, quantizer %s (%s), policy %s\n", latents, qname,
           parity_quantizer_name(q), polname);
    if (deployed) printf("deployed %s\n", deployed);
    counts t_export = {0}, t_deployed = {0}, t_adjusted = {0};
    uint64_t moved = 0;
    /* remedy 2 is written for the 4-bit and ternary rules of 1 x 16 (or 1 x 32) blocks, not
     * for "te-2d"'s 16 x 16 tiles (parity_quant_adjust_bf16 refuses it) */
    const int adjustable = layout_of != NULL && q != PARITY_QUANT_NVFP4_TE_2D;
    int adjust_ok = adjustable;
    if (per_tensor)
        printf("\n%-40s %10s %12s %12s %14s\n", "tensor", "codes", "export diff", "deployed diff",
               "export scales");
    for (uint32_t l = 0; l < c->num_hidden_layers; l++)
        for (int j = 0; j < 7; j++) {
            const linear lw = linear_of(L, l, j), *w = &lw;
            if (!w->quantized) continue;
            trained tr = train(L, w, q);
            const size_t n = tr.n;
            const uint64_t grid = tr.grid;
            const float *x = tr.x, *as = tr.scales;
            const uint8_t *a = tr.codes;
            uint8_t *b = xmalloc(n), *d = xmalloc(n);
            float *bs = xmalloc((grid + 1) * 4), *ds = xmalloc((grid + 1) * 4);
            if ((rc = parity_quantize_bf16_export(q, w->rows, w->cols, x, w->cols, b, bs)))
                die("export", rc);
            counts ce = {0}, cd = {0};
            uint64_t first;
            const uint64_t n_scales = scales_of(pol.gemm, grid, &first);
            compare(a, as + first, b, bs + first, n, n_scales, &ce);
            add(&t_export, &ce);
            /* the export's ternary multiplier is a bf16 value, which its checkpoint stores */
            serve_codes(S, w, pol.gemm, b, bs, grid, ternary ? PARITY_DTYPE_BF16 : PARITY_DTYPE_F32);
            if (D) {
                codes_of(D, w, q, d, ds, grid);
                compare(a, as + first, d, ds + first, n, n_scales, &cd);
                add(&t_deployed, &cd);
            }
            if (adjustable) {
                /* the second remedy, then its export: the training codes exactly */
                uint16_t *v = xmalloc(n * 2);
                uint64_t k = 0;
                rc = parity_quant_adjust_bf16(q, w->rows, w->cols, x, w->cols, v, &k);
                if (rc) {
                    adjust_ok = 0;
                    fprintf(stderr, "parity-quant-check: %s\n", parity_last_error());
                } else {
                    moved += k;
                    float *vx = xmalloc(n * 4);
                    for (size_t i = 0; i < n; i++) vx[i] = parity_bf16_to_f32(v[i]);
                    if ((rc = parity_quantize_bf16_export(q, w->rows, w->cols, vx, w->cols, d, ds)))
                        die("export of the adjusted values", rc);
                    counts cr = {0};
                    compare(a, as + first, d, ds + first, n, n_scales, &cr);
                    add(&t_adjusted, &cr);
                    serve_codes(R, w, pol.gemm, d, ds, grid, PARITY_DTYPE_F32);
                    free(vx);
                }
                free(v);
            }
            if (per_tensor) {
                char name[128];
                snprintf(name, sizeof name, "model.layers.%u.%s", l, linear_names[j]);
                printf("%-40s %10zu %11.4f%% %11.4f%% %8llu/%llu\n", name, n,
                       100 * frac(ce.code_diff, ce.codes), 100 * frac(cd.code_diff, cd.codes),
                       (unsigned long long)ce.scale_diff, (unsigned long long)ce.scales);
            }
            trained_free(&tr), free(b), free(d), free(bs), free(ds);
        }

    /* the effect, on the evaluation sequences: learner = latents with the training quantizer */
    parity_policy plain;
    if ((rc = parity_policy_from_name(preset, &plain))) die(preset, rc);
    const size_t n_lp = total - n_eval;
    float *lp_l = score_all(L, &pol, tokens, lens, n_eval, total);
    float *lp_s = score_all(S, &pol, tokens, lens, n_eval, total);
    float *lp_b = score_all(L, &plain, tokens, lens, n_eval, total);
    const effect e_l = effect_of(lp_l, lp_l, n_lp), e_s = effect_of(lp_l, lp_s, n_lp);
    const effect e_b = effect_of(lp_b, lp_b, n_lp);
    effect e_d = {0, 0, 0, 0, 0};
    if (D) {
        float *lp_d = score_all(D, &pol, tokens, lens, n_eval, total);
        e_d = effect_of(lp_l, lp_d, n_lp);
        free(lp_d);
    }
    effect e_r = {0, 0, 0, 0, 0};
    if (adjust_ok) {
        float *lp_r = score_all(R, &pol, tokens, lens, n_eval, total);
        e_r = effect_of(lp_l, lp_r, n_lp);
        free(lp_r);
    }
    /* remedy 1: the latents written in the format's layout with the training rule, loaded back */
    counts t_written = {0};
    effect e_w = {0, 0, 0, 0, 0};
    int written = 0;
    if (layout_of) {
        char dir[] = "/tmp/parity-quant-check-XXXXXX";
        char layout[64];
        snprintf(layout, sizeof layout, "%s:%s", layout_of, parity_quantizer_name(q));
        if (!mkdtemp(dir)) die("mkdtemp", PARITY_ERR_IO);
        parity_model *W;
        if ((rc = parity_model_save_as(L, dir, layout)) || (rc = parity_model_load(dir, &W)))
            die("remedy 1 (the training codes written)", rc);
        for (uint32_t l = 0; l < c->num_hidden_layers; l++)
            for (int j = 0; j < 7; j++) {
                const linear lw = linear_of(L, l, j), *w = &lw;
                if (!w->quantized) continue;
                trained tr = train(L, w, q);
                const uint64_t grid = tr.grid;
                /* the codes W's policy reads: the ones its checkpoint shipped */
                uint8_t *ww = xmalloc(tr.n);
                float *ws_s = xmalloc((grid + 1) * 4);
                codes_of(W, w, q, ww, ws_s, grid);
                uint64_t first;
                const uint64_t n_scales = scales_of(pol.gemm, grid, &first);
                compare(tr.codes, tr.scales + first, ww, ws_s + first, tr.n, n_scales, &t_written);
                trained_free(&tr), free(ww), free(ws_s);
            }
        float *lp_w = score_all(W, &pol, tokens, lens, n_eval, total);
        e_w = effect_of(lp_l, lp_w, n_lp);
        free(lp_w);
        parity_model_free(W);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) fprintf(stderr, "parity-quant-check: could not remove %s\n", dir);
        written = 1;
    }
    if (export_dir && layout_of) {
        mkdir(export_dir, 0755);
        if ((rc = parity_model_save_as(S, export_dir, layout_of))) die(export_dir, rc);
        printf("wrote the export (b) to %s\n", export_dir);
    }

    printf("\ncodes that differ from (a) the training quantizer on the fp32 latents:\n");
    printf("  (b) bf16-cast export      %10llu of %llu (%.4f%%); scales %llu of %llu differ "
           "(max relative %.3g)\n", (unsigned long long)t_export.code_diff,
           (unsigned long long)t_export.codes, 100 * frac(t_export.code_diff, t_export.codes),
           (unsigned long long)t_export.scale_diff, (unsigned long long)t_export.scales,
           t_export.scale_rel);
    if (D)
        printf("  (c) deployed checkpoint   %10llu of %llu (%.4f%%); scales %llu of %llu differ "
               "(max relative %.3g)\n", (unsigned long long)t_deployed.code_diff,
               (unsigned long long)t_deployed.codes, 100 * frac(t_deployed.code_diff, t_deployed.codes),
               (unsigned long long)t_deployed.scale_diff, (unsigned long long)t_deployed.scales,
               t_deployed.scale_rel);
    if (written)
        printf("  remedy 1: codes written   %10llu of %llu; scales %llu differ\n",
               (unsigned long long)t_written.code_diff, (unsigned long long)t_written.codes,
               (unsigned long long)t_written.scale_diff);
    if (adjust_ok)
        printf("  remedy 2: bf16 adjusted   %10llu of %llu (%llu inputs moved one or more bf16 "
               "steps); scales %llu of %llu differ (max relative %.3g)\n",
               (unsigned long long)t_adjusted.code_diff, (unsigned long long)t_adjusted.codes,
               (unsigned long long)moved, (unsigned long long)t_adjusted.scale_diff,
               (unsigned long long)t_adjusted.scales, t_adjusted.scale_rel);
    if (!layout_of)
        printf("  remedy 1: no checkpoint layout for %s here\n", qname);
    if (!adjustable)
        printf("  remedy 2: written for the 4-bit (1 x 16 and 1 x 32 blocks) and ternary rules "
               "only\n");
    printf("\neffect on %zu evaluation sequences (%zu log-probs), policy %s; learner = the "
           "latents with the training quantizer:\n", n_eval, n_lp, polname);
    printf("  %-34s %9s %10s %10s %10s %8s\n", "sampler serves", "NLL", "mean|d|", "max|d|", "k3 KL",
           "equal");
    printf("  %-34s %9.4f %10s %10s %10s %8s\n", "(a) the training codes (= learner)", e_l.nll, "0",
           "0", "0", "1.000");
    printf("  %-34s %9.4f %10.3g %10.3g %10.3g %8.3f\n", "(b) the bf16-cast export", e_s.nll,
           e_s.mean_abs, e_s.max_abs, e_s.k3, e_s.equal);
    if (D)
        printf("  %-34s %9.4f %10.3g %10.3g %10.3g %8.3f\n", "(c) the deployed checkpoint", e_d.nll,
               e_d.mean_abs, e_d.max_abs, e_d.k3, e_d.equal);
    if (written)
        printf("  %-34s %9.4f %10.3g %10.3g %10.3g %8.3f\n", "remedy 1 (training codes written)",
               e_w.nll, e_w.mean_abs, e_w.max_abs, e_w.k3, e_w.equal);
    if (adjust_ok)
        printf("  %-34s %9.4f %10.3g %10.3g %10.3g %8.3f\n", "remedy 2 (export of adjusted bf16)",
               e_r.nll, e_r.mean_abs, e_r.max_abs, e_r.k3, e_r.equal);
    printf("  %-34s %9.4f   (the latents unquantized, policy %s)\n", "reference", e_b.nll, preset);

    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f) {
            fprintf(stderr, "parity-quant-check: %s: %s\n", json_path, strerror(errno));
            return 2;
        }
        fprintf(f, "{\"latents\": \"%s\", \"quantizer\": \"%s\", \"policy\": \"%s\",\n", latents,
                qname, polname);
        fprintf(f, " \"export\": {\"codes\": %llu, \"differ\": %llu, \"scales\": %llu, "
                   "\"scales_differ\": %llu, \"nll\": %.6f, \"mean_abs\": %.6g, \"k3\": %.6g, "
                   "\"equal\": %.6f},\n", (unsigned long long)t_export.codes,
                (unsigned long long)t_export.code_diff, (unsigned long long)t_export.scales,
                (unsigned long long)t_export.scale_diff, e_s.nll, e_s.mean_abs, e_s.k3, e_s.equal);
        if (D)
            fprintf(f, " \"deployed\": {\"codes\": %llu, \"differ\": %llu, \"scales_differ\": %llu, "
                       "\"nll\": %.6f, \"mean_abs\": %.6g, \"equal\": %.6f},\n",
                    (unsigned long long)t_deployed.codes, (unsigned long long)t_deployed.code_diff,
                    (unsigned long long)t_deployed.scale_diff, e_d.nll, e_d.mean_abs, e_d.equal);
        if (written)
            fprintf(f, " \"remedy_written\": {\"differ\": %llu, \"equal\": %.6f},\n",
                    (unsigned long long)t_written.code_diff, e_w.equal);
        if (adjust_ok)
            fprintf(f, " \"remedy_adjusted\": {\"differ\": %llu, \"moved\": %llu, "
                       "\"scales_differ\": %llu, \"equal\": %.6f},\n",
                    (unsigned long long)t_adjusted.code_diff, (unsigned long long)moved,
                    (unsigned long long)t_adjusted.scale_diff, e_r.equal);
        fprintf(f, " \"learner_nll\": %.6f, \"reference_nll\": %.6f}\n", e_l.nll, e_b.nll);
        fclose(f);
    }
    parity_model_free(L);
    parity_model_free(S);
    parity_model_free(R);
    parity_model_free(D);
    free(lp_l), free(lp_s), free(lp_b), free(tokens);
    const int remedy1_ok = !written || (t_written.code_diff == 0 && t_written.scale_diff == 0);
    if (!adjustable) return remedy1_ok ? 0 : 1;
    return adjust_ok && t_adjusted.code_diff == 0 && remedy1_ok ? 0 : 1;
}
