/* parity-mismatch: how far a learner's log-probs drift from a sampler's, per precision policy.
 *
 *   parity-mismatch [--model DIR|synthetic:NAME[:SEED]] [--prompts FILE...] [--prompt-tokens]
 *                   [--prompt-len N] [--n N] [--max-tokens N] [--greedy-tokens N] [--policies LIST]
 *                   [--learners LIST] [--kernel-policies LIST|all|none] [--split-k N]
 *                   [--split-kv N] [--ablation SAMPLER,LEARNER|none] [--growth-tokens N]
 *                   [--growth-n N] [--growth-prompts N] [--threads N] [--lib-threads N]
 *                   [--temperature T] [--top-p P] [--seed S] [--exit-threshold T]
 *                   [--moe-models LIST|none] [--moe-pairs S/L,...]
 *                   [--logprob-mode raw|processed|processed-truncated] [--backend bf16|openblas]
 *                   [--json FILE] [--csv FILE] [--svg DIR] [--full-tables] [--quiet]
 *
 * What it does, as an RL trainer would:
 *   1. Rollouts: for each sampler configuration, the sampler prefills every prompt once, forks
 *      n completions from it (stream = the completion's index, one seed for the run) and draws
 *      up to --max-tokens tokens each at --temperature / --top-p, recording the log-prob it
 *      reports for every drawn token (--logprob-mode, "raw" by default). Each configuration
 *      generates once; configurations with identical switches share their rollouts.
 *   2. Scoring: the scorer (the learner's entry point) recomputes the log-probs of the same
 *      tokens under a learner policy, all completions of a rollout set in one parity_score
 *      call, with the sampler's mode, temperature and top-p.
 *   3. Greedy: every configuration of the headline and the matrix also decodes each prompt
 *      greedily once (temperature 0, --greedy-tokens long).
 * Sections of the report:
 *   headline  sampler S (vllm) against learner L (hf-eager: other rounding points), against L
 *             with its regions aligned, against S itself, S+aligned on both sides (the same
 *             policy; then S+aligned -> L+aligned, each side keeping its own attention), S with
 *             other decode kernels, and the fp32 learner; then the formats: S+fp16 -> L+fp16
 *             (the same mismatched pair with every rounding point in fp16), S+fp16 -> S+fp16,
 *             an fp16 sampler against the bf16 learner S; S+fp8-block:deepseek against S with
 *             TE's power-of-two quantizer, against the bf16 learner S, and against itself;
 *             the same three for S+nvfp4:modelopt (other quantizer: TE's), S+mxfp4:ocp
 *             (RCEIL) and S+ternary:bitnet (onebitllms' half-up rounding);
 *   matrix    every sampler policy x every learner policy, plus kernel-order rows: the
 *             sampler's decode steps with split-K GEMMs (--split-k chunks) and/or split-KV
 *             attention (--split-kv positions per segment), as engines run them, for the
 *             samplers in --kernel-policies ("kernel_order" in the JSON: "same" or e.g.
 *             "split_k=4,split_kv=64");
 *   ablation  from the mismatched pair (S, L), the learner copies the sampler's switches region
 *             by region (residual+RMSNorm, RoPE, SwiGLU one at a time, attention alone, pairs,
 *             the three, then attention, then logits: the learner equals the sampler);
 *   growth    a longer run of S (--growth-tokens): mismatch by position in the completion and
 *             by completion length, for S -> L and S -> S with and without other kernels.
 *   looped    for a looped model (Ouro, e.g. --model synthetic:ouro-tiny): an early-exit sampler
 *             (threshold --exit-threshold, default 0.7, on the gate's exit CDF; K/V of exited
 *             tokens copied into the deeper planes, LAST_EXITED) of aligned against the dense
 *             learner (every loop for every token), the learner replaying the sampler's depths
 *             (bitwise), the replay with every plane computed instead (FULL K/V), and the same
 *             for hf-eager, whose exit CDF is bf16, against a learner that re-derives the
 *             depths with an fp32 CDF.
 *   moe       mixture-of-experts models (mismatch-moe.c; --moe-models: by default --model if it
 *             has experts, else the trained models/qwen3-moe-bytes-8.4m and the
 *             transformers-made test/data/moe/qwen2-moe-tiny, the prompts fitted to each):
 *             per sampler/learner pair (--moe-pairs), the sampler's rollouts with its routing
 *             record, scored by the learner routing every position itself and replaying the
 *             record; the fraction of (position, sparse layer) routing decisions whose expert
 *             set differs from the sampler's, the fraction of positions with one such layer at
 *             least, and the metrics below, each way. Equal policies must give the same routes
 *             and bitwise log-probs both ways, and every replay must have run the record.
 *
 * Metrics, per (sampler, learner) pair, over generated tokens, with
 *   r = logp_learner - logp_sampler   (the log importance ratio of a token):
 *   mean|d|      mean of |r|                      p99|d|  99th percentile of |r| (nearest rank)
 *   max|d|       max of |r|                       bias    mean of r (signed)
 *   k3 KL        mean of exp(r) - r - 1 (Schulman's k3 estimator; >= 0, 0 iff r = 0)
 *   ratio, r std mean and (population) standard deviation of exp(r)
 *   out          fraction of tokens with exp(r) outside [0.8, 1.2] (PPO-style clip range)
 *   r max        max of exp(r)
 *   equal        fraction of tokens whose two log-probs are bitwise equal (float bits)
 *   seq|S| max|S|  S = sum of r over one completion (sequence-level log-ratio): mean |S| and
 *                max |S| over completions
 *   greedy       first position (0-based, in the completion) where greedy decoding under the
 *                sampler configuration and greedy decoding under the learner policy (same
 *                prompt, same length) pick different tokens; mean and min over the prompts where
 *                they differ, and how many prompts differ; "none" if they never differ
 *   nonfinite    tokens where either log-prob is not finite (possible in processed-truncated
 *                mode); they are left out of every other metric
 * Growth gives the per-token metrics for positions bucketed in the completion (0-15, 16-63,
 * 64-255, 256-1023, 1024+) and mean/max |S| over the first L tokens of each completion.
 *
 * Outputs: a table on stdout with a legend; --json FILE (every figure and the configuration:
 * model, policies and their switches, prompts, seeds, build, CPU path, threads); --csv FILE (one
 * row per pair, growth bucket and prefix length); --svg DIR (heatmap_k3.svg, hist_logratio.svg,
 * growth_position.svg, growth_length.svg; moe_routes.svg and moe_logprob.svg, the MoE section's
 * routing and log-prob mismatch per pair and model). Progress on stderr (--quiet: none). The
 * "Checks" line ends the table; the run exits with status 1 (after writing every output) when
 * one that must hold fails: equal policies not bitwise equal, or an MoE row of equal policies
 * or a replay that did not follow the record.
 *
 * Threads: --threads workers take independent tasks (a rollout set to generate, a learner's
 * scorings), each with its own single-threaded sampler or scorer (--lib-threads for more). The
 * log-probs do not depend on either.
 *
 * Defaults (about half a minute on 2 idle cores): the bundled model
 * models/qwen3-bytes-pystdlib-4.9m (else synthetic:tiny); prompts = 32-byte slices of the
 * held-out text test/data/reference/eval_0{0..3}.bin at offsets 0 and 256 (bytes are tokens);
 * n 2, 64 tokens, temperature 1, top-p 1, seed 0; greedy runs of 128 tokens; kernel-order rows
 * for vllm with split_k 4 and split_kv 64; growth 320 tokens on 4 prompts x 2 (--growth-tokens
 * 1024 for the full length); the MoE section on the same prompts, n and length (a second or
 * two: its models are tiny).
 * The source tree is $PARITY_SOURCE_ROOT, else the directory this was built from. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_clock.h"
#include "mismatch.h"
#include "options.h"

#ifndef PARITY_SOURCE_DIR
#define PARITY_SOURCE_DIR "."
#endif

/* ---------------------------------------------------------------------------------------- */
/* Small utilities                                                                          */
/* ---------------------------------------------------------------------------------------- */

void die_parity(const char *what, int status) {
    die("%s: %s: %s", what, parity_status_name(status), parity_last_error());
}

static void *xrealloc(void *p, size_t size) {
    p = realloc(p, size ? size : 1);
    if (!p) die("out of memory");
    return p;
}

static unsigned char *read_whole_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    unsigned char *buf = xcalloc(cap, 1);
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        buf = xrealloc(buf, cap *= 2);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

const char *source_root(void) {
    const char *env = getenv("PARITY_SOURCE_ROOT");
    return env && *env ? env : PARITY_SOURCE_DIR;
}

/* A finite float option value (parse_float, and no infinity or NaN). */
static int parse_f32(const char *s, float *out) { return parse_float(s, out) && isfinite(*out); }

/* ---------------------------------------------------------------------------------------- */
/* Options                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static const char *const DEFAULT_POLICIES =
    "fp32,hf-eager,hf-sdpa,vllm,sglang,aligned,vllm+aligned,hf-eager+aligned";

static const char *const DEFAULT_MOE_PAIRS =
    "vllm/hf-eager,sglang/hf-eager,vllm/sglang,vllm/fp32,hf-eager/hf-eager,vllm/vllm,"
    "sglang/sglang,aligned/aligned,vllm+fp8-block:deepseek/vllm,"
    "vllm+fp8-block:deepseek/vllm+fp8-block:deepseek,vllm+nvfp4:modelopt/vllm,"
    "vllm+nvfp4:modelopt/vllm+nvfp4:modelopt";

static void default_options(options *o) {
    /* rollouts; threads; kernel orders; growth run; sampling; policies */
    *o = (options){.prompt_len = 32, .n = 2, .max_tokens = 64, .greedy_tokens = 128,
                   .threads = 2, .lib_threads = 1,
                   .split_k = 4, .split_kv = 64,
                   .growth_tokens = 320, .growth_n = 2, .growth_prompts = 4,
                   .temperature = 1.0f, .top_p = 1.0f, .mode = PARITY_LOGPROB_RAW,
                   .exit_threshold = 0.7f,
                   .backend = PARITY_BACKEND_BF16,
                   .policies = DEFAULT_POLICIES, .kernel_policies = "vllm",
                   .ablation = "vllm,hf-eager", .moe_pairs = DEFAULT_MOE_PAIRS};
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: parity-mismatch [options]\n"
        "  --model SPEC            DIR or synthetic:NAME[:SEED] (default: the bundled\n"
        "                          models/qwen3-bytes-pystdlib-4.9m, else synthetic:tiny)\n"
        "  --prompts FILE...       prompt files, one prompt each (bytes are tokens; default:\n"
        "                          slices of test/data/reference/eval_0{0..3}.bin)\n"
        "  --prompt-tokens         prompt files hold whitespace-separated token ids\n"
        "  --prompt-len N          length of the default prompt slices (32)\n"
        "  --n N                   completions per prompt (2)\n"
        "  --max-tokens N          tokens per completion (64)\n"
        "  --greedy-tokens N       length of the greedy runs, 0 = none (128)\n"
        "  --policies LIST         sampler policies, comma-separated (%s)\n"
        "  --learners LIST         learner policies (default: the sampler policies)\n"
        "  --kernel-policies LIST  samplers that also get kernel-order rows: names, all or\n"
        "                          none (%s)\n"
        "  --split-k N             split-K chunks of the kernel-order rows (4; 0 = none)\n"
        "  --split-kv N            split-KV segment of the kernel-order rows, positions\n"
        "                          (64; 0 = none)\n"
        "  --ablation S,L          the mismatched pair of the region ablation, or none\n"
        "                          (vllm,hf-eager)\n"
        "  --growth-tokens N       length of the growth run, 0 = none (320; up to 1024)\n"
        "  --growth-n N            completions per prompt of the growth run (2)\n"
        "  --growth-prompts N      prompts of the growth run (4)\n"
        "  --threads N             worker threads, each running its own sampler or scorer on\n"
        "                          independent tasks (2)\n"
        "  --lib-threads N         threads of each sampler's and scorer's own pool (1)\n"
        "  --temperature T         sampling temperature (1)\n"
        "  --top-p P               nucleus sampling mass (1 = off)\n"
        "  --seed S                sampling seed (0)\n"
        "  --exit-threshold T      looped models: the early-exit sampler's threshold (0.7)\n"
        "  --moe-models LIST       mixture-of-experts models of the MoE section, comma-separated,\n"
        "                          or none (default: --model if it has experts, else\n"
        "                          models/qwen3-moe-bytes-8.4m and test/data/moe/qwen2-moe-tiny)\n"
        "  --moe-pairs LIST        the MoE section's SAMPLER/LEARNER policy pairs,\n"
        "                          comma-separated (default: below)\n"
        "  --logprob-mode M        a log-prob mode, below (raw)\n"
        "  --backend B             a backend, below (bf16)\n"
        "  --json FILE  --csv FILE  --svg DIR   machine-readable outputs and plots\n"
        "  --full-tables           print every matrix pair's metrics, not only the grids\n"
        "  --quiet                 no progress on stderr\n",
        DEFAULT_POLICIES, "vllm");
    /* the choices, by the library's names */
    fprintf(f, "log-prob modes:");
    for (int m = 0; parity_logprob_mode_name(m); m++) fprintf(f, " %s", parity_logprob_mode_name(m));
    fprintf(f, "\nbackends:");
    for (int k = 0; parity_backend_name(k); k++) fprintf(f, " %s", parity_backend_name(k));
    fprintf(f, "\npresets:");
    for (const char *const *p = parity_policy_preset_names(); *p; p++) fprintf(f, " %s", *p);
    /* the default pairs, a line of at most 96 columns each */
    int column = fprintf(f, "\ndefault MoE pairs:") - 1;
    for (const char *p = DEFAULT_MOE_PAIRS, *comma; *p; p = comma ? comma + 1 : p + strlen(p)) {
        comma = strchr(p, ',');
        const int len = comma ? (int)(comma - p) : (int)strlen(p);
        if (column + 1 + len > 96) column = fprintf(f, "\n ") - 1;
        column += fprintf(f, " %.*s", len, p);
    }
    fprintf(f, "\n");
}

static uint32_t parse_mode(const char *v) {
    parity_logprob_mode m;
    int rc = parity_logprob_mode_from_name(v, &m);
    if (rc) die_parity("--logprob-mode", rc);
    return (uint32_t)m;
}

static uint32_t parse_backend(const char *v) {
    parity_backend b;
    int rc = parity_backend_from_name(v, &b);
    if (rc) die_parity("--backend", rc);
    return (uint32_t)b;
}

/* Options with a numeric value; returns 1 if `a` was one of them. */
static int parse_numeric_option(options *o, const char *a, const char *v) {
    struct {
        const char *name;
        uint32_t *out;
        uint32_t min;
    } u[] = {
        {"--prompt-len", &o->prompt_len, 1}, {"--n", &o->n, 1},
        {"--max-tokens", &o->max_tokens, 1}, {"--threads", &o->threads, 1},
        {"--lib-threads", &o->lib_threads, 1}, {"--greedy-tokens", &o->greedy_tokens, 0},
        {"--split-k", &o->split_k, 0},       {"--split-kv", &o->split_kv, 0},
        {"--growth-tokens", &o->growth_tokens, 0}, {"--growth-n", &o->growth_n, 1},
        {"--growth-prompts", &o->growth_prompts, 1},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
        if (!strcmp(a, u[i].name)) {
            if (!parse_u32(v, u[i].out) || *u[i].out < u[i].min)
                die("bad value for %s: '%s' (an integer >= %u)", a, v, u[i].min);
            return 1;
        }
    if (!strcmp(a, "--temperature")) {
        if (!parse_f32(v, &o->temperature) || o->temperature < 0) die("bad --temperature '%s'", v);
        return 1;
    }
    if (!strcmp(a, "--top-p")) {
        if (!parse_f32(v, &o->top_p) || !(o->top_p > 0 && o->top_p <= 1))
            die("bad --top-p '%s'", v);
        return 1;
    }
    if (!strcmp(a, "--exit-threshold")) {
        if (!parse_f32(v, &o->exit_threshold) || !(o->exit_threshold >= 0 && o->exit_threshold <= 1))
            die("bad --exit-threshold '%s' (0..1)", v);
        return 1;
    }
    if (!strcmp(a, "--seed")) {
        char *end;
        errno = 0;
        o->seed = strtoull(v, &end, 10);
        if (errno || !*v || *v == '-' || *end) die("bad --seed '%s'", v);
        return 1;
    }
    return 0;
}

static void parse_options(options *o, int argc, char **argv) {
    default_options(o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (option_is_help(a)) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--prompt-tokens")) { o->prompt_tokens = 1; continue; }
        if (!strcmp(a, "--full-tables")) { o->full_tables = 1; continue; }
        if (!strcmp(a, "--quiet")) { progress_silence(); continue; }
        if (!strcmp(a, "--prompts")) {
            o->prompt_files = &argv[i + 1];
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) i++, o->n_prompt_files++;
            if (!o->n_prompt_files) die("--prompts needs at least one file");
            continue;
        }
        const char *v;
        if (!option_value(argc, argv, &i, &v)) die("%s needs a value (see --help)", a);
        if (parse_numeric_option(o, a, v)) continue;
        if (!strcmp(a, "--model")) o->model_spec = v;
        else if (!strcmp(a, "--policies")) o->policies = v;
        else if (!strcmp(a, "--learners")) o->learners = v;
        else if (!strcmp(a, "--kernel-policies")) o->kernel_policies = v;
        else if (!strcmp(a, "--ablation")) o->ablation = v;
        else if (!strcmp(a, "--moe-models")) o->moe_models = v;
        else if (!strcmp(a, "--moe-pairs")) o->moe_pairs = v;
        else if (!strcmp(a, "--logprob-mode")) o->mode = parse_mode(v);
        else if (!strcmp(a, "--json")) o->json_path = v;
        else if (!strcmp(a, "--csv")) o->csv_path = v;
        else if (!strcmp(a, "--svg")) o->svg_dir = v;
        else if (!strcmp(a, "--backend")) o->backend = parse_backend(v);
        else {
            usage(stderr);
            die("unknown option %s", a);
        }
    }
    if (!o->learners) o->learners = o->policies;
    if (o->split_k == 1) die("--split-k must be 0 (off) or at least 2");
}

/* ---------------------------------------------------------------------------------------- */
/* Policies                                                                                 */
/* ---------------------------------------------------------------------------------------- */

void spec_from_name(const char *name, spec *out) {
    memset(out, 0, sizeof *out);
    if (strlen(name) >= NAME_MAX_LEN) die("policy name too long: '%s'", name);
    snprintf(out->name, sizeof out->name, "%s", name);
    int rc = parity_policy_from_name(name, &out->policy);
    if (rc) die_parity(name, rc);
}

/* A comma-separated list of policy names; "none" or "" gives an empty list. */
static void parse_spec_list(const char *list, spec_list *out) {
    out->n = 0;
    if (!strcmp(list, "none")) return;
    const char *p = list;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len) {
            char name[NAME_MAX_LEN];
            if (len >= sizeof name) die("policy name too long in '%s'", list);
            memcpy(name, p, len);
            name[len] = '\0';
            if (out->n == MAX_SPECS) die("more than %d policies", MAX_SPECS);
            spec_from_name(name, &out->v[out->n++]);
        }
        p = comma ? comma + 1 : p + len;
    }
}

/* The ablation's regions: the switches each one owns. */
enum {
    REGION_RESNORM = 1,  /* residual + RMSNorm: norm_input, norm_weight, qk_norm */
    REGION_ROPE = 2,     /* rope_table, rope_apply */
    REGION_SWIGLU = 4,   /* swiglu */
    REGION_ATTN = 8,     /* attention */
    REGION_LOGITS = 16,  /* logits, temperature (and compute: the learner then equals the
                            sampler) */
};

static const char *const region_names[] = {"norm", "rope", "swiglu", "attn", "logits"};

/* The learner's policy with the given regions' switches copied from the sampler's. */
static parity_policy copy_regions(parity_policy learner, const parity_policy *sampler,
                                  unsigned regions) {
    if (regions & REGION_RESNORM) {
        learner.norm_input = sampler->norm_input;
        learner.norm_weight = sampler->norm_weight;
        learner.qk_norm = sampler->qk_norm;
    }
    if (regions & REGION_ROPE) {
        learner.rope_table = sampler->rope_table;
        learner.rope_apply = sampler->rope_apply;
    }
    if (regions & REGION_SWIGLU) learner.swiglu = sampler->swiglu;
    if (regions & REGION_ATTN) learner.attention = sampler->attention;
    if (regions & REGION_LOGITS) {
        learner.logits = sampler->logits;
        learner.temperature = sampler->temperature;
        learner.compute = sampler->compute;
    }
    return learner;
}

/* "norm+rope", or "none". */
static void describe_regions(unsigned regions, char *out, size_t size) {
    out[0] = '\0';
    for (unsigned i = 0; i < 5; i++)
        if (regions & (1u << i))
            snprintf(out + strlen(out), size - strlen(out), "%s%s", out[0] ? "+" : "",
                     region_names[i]);
    if (!out[0]) snprintf(out, size, "none");
}

/* ---------------------------------------------------------------------------------------- */
/* Prompts                                                                                  */
/* ---------------------------------------------------------------------------------------- */

void prompt_push(prompt_set *ps, const int32_t *tok, uint32_t len, const char *source) {
    ps->tok = xrealloc(ps->tok, (ps->n + 1) * sizeof *ps->tok);
    ps->len = xrealloc(ps->len, (ps->n + 1) * sizeof *ps->len);
    ps->source = xrealloc(ps->source, (ps->n + 1) * sizeof *ps->source);
    ps->tok[ps->n] = xcalloc(len, sizeof(int32_t));
    memcpy(ps->tok[ps->n], tok, len * sizeof(int32_t));
    ps->len[ps->n] = len;
    ps->source[ps->n] = strdup(source);
    if (!ps->source[ps->n]) die("out of memory");
    ps->n++;
}

/* Whitespace-separated decimal token ids. */
static int32_t *parse_token_text(const unsigned char *data, size_t len, uint32_t *count,
                                 const char *path) {
    int32_t *tok = xcalloc(len / 2 + 1, sizeof *tok);
    char *text = xcalloc(len + 1, 1);
    memcpy(text, data, len);
    size_t n = 0;
    for (char *p = text;;) {
        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && !strchr(" \t\r\n", *end)))
            die("%s: '%.20s' is not a token id", path, p);
        tok[n++] = (int32_t)v;
        p = end;
    }
    free(text);
    *count = (uint32_t)n;
    return tok;
}

static void load_prompt_file(prompt_set *ps, const char *path, int as_ids) {
    size_t len;
    unsigned char *data = read_whole_file(path, &len);
    if (!data) die("%s: %s", path, strerror(errno));
    uint32_t n = 0;
    int32_t *tok;
    if (as_ids) {
        tok = parse_token_text(data, len, &n, path);
    } else {
        tok = xcalloc(len, sizeof *tok);
        for (size_t i = 0; i < len; i++) tok[i] = data[i];
        n = (uint32_t)len;
    }
    if (!n) die("%s: empty prompt", path);
    prompt_push(ps, tok, n, path);
    free(tok);
    free(data);
}

/* Some Python, for when the source tree's held-out text is not there. */
static const char FALLBACK_TEXT[] =
    "import os\nimport sys\n\n\ndef main(argv=None):\n    \"\"\"Print the arguments.\"\"\"\n"
    "    if argv is None:\n        argv = sys.argv[1:]\n    for i, arg in enumerate(argv):\n"
    "        print(i, arg)\n    return 0\n\n\nclass Reader(object):\n"
    "    def __init__(self, path, mode='r'):\n        self.path = path\n"
    "        self.mode = mode\n        self._file = None\n\n    def open(self):\n"
    "        self._file = open(self.path, self.mode)\n        return self._file\n";

/* Slices of the held-out text: --prompt-len bytes at offsets 0 and 256 of each file, the
 * offset-0 slices first (the growth run takes the first prompts). */
static void load_default_prompts(prompt_set *ps, uint32_t plen) {
    static const uint32_t offsets[] = {0, 256};
    char paths[4][1024];
    unsigned char *data[4] = {0};
    size_t len[4] = {0};
    for (int k = 0; k < 4; k++) {
        snprintf(paths[k], sizeof paths[k], "%s/test/data/reference/eval_%02d.bin", source_root(),
                 k);
        data[k] = read_whole_file(paths[k], &len[k]);
        if (!data[k]) {
            data[k] = xcalloc(sizeof FALLBACK_TEXT, 1);
            memcpy(data[k], FALLBACK_TEXT, sizeof FALLBACK_TEXT - 1);
            len[k] = sizeof FALLBACK_TEXT - 1;
            snprintf(paths[k], sizeof paths[k], "built-in text %d", k);
        }
    }
    int32_t *tok = xcalloc(plen, sizeof *tok);
    for (size_t s = 0; s < sizeof offsets / sizeof offsets[0]; s++)
        for (int k = 0; k < 4; k++) {
            size_t off = (offsets[s] + (size_t)k * 37 * !strncmp(paths[k], "built-in", 8)) % len[k];
            for (uint32_t i = 0; i < plen; i++) tok[i] = data[k][(off + i) % len[k]];
            char source[1100];
            snprintf(source, sizeof source, "%s@%zu", paths[k], off);
            prompt_push(ps, tok, plen, source);
        }
    free(tok);
    for (int k = 0; k < 4; k++) free(data[k]);
}

/* Checks every prompt against the model; bytes beyond a small vocabulary wrap around. */
void fit_prompts(prompt_set *ps, const parity_config *c, uint32_t room) {
    for (size_t i = 0; i < ps->n; i++) {
        if (ps->len[i] + room > c->max_position_embeddings) {
            if (room >= c->max_position_embeddings) die("the model's context is too short");
            ps->len[i] = c->max_position_embeddings - room;
        }
        for (uint32_t t = 0; t < ps->len[i]; t++)
            if ((uint32_t)ps->tok[i][t] >= c->vocab_size)
                ps->tok[i][t] = (int32_t)((uint32_t)ps->tok[i][t] % c->vocab_size);
    }
}

void free_prompts(prompt_set *ps) {
    for (size_t i = 0; i < ps->n; i++) {
        free(ps->tok[i]);
        free(ps->source[i]);
    }
    free(ps->tok);
    free(ps->len);
    free(ps->source);
}

/* ---------------------------------------------------------------------------------------- */
/* Rollouts: the sampler's completions and the log-probs it reported                        */
/* ---------------------------------------------------------------------------------------- */

void sampling_for(const run_env *e, float temperature, uint32_t max_new, parity_sampling *sp) {
    parity_sampling_default(sp);
    sp->temperature = temperature;
    sp->top_p = e->o->top_p;
    sp->seed = e->o->seed;
    sp->max_new_tokens = max_new;
    sp->logprob_mode = e->o->mode;
}

uint32_t max_prompt_len(const prompt_set *ps) {
    uint32_t m = 0;
    for (size_t i = 0; i < ps->n; i++)
        if (ps->len[i] > m) m = ps->len[i];
    return m;
}

/* A sampler sized for one wave of `prompts` prompts with `per` completions each. */
static parity_sampler *make_sampler(const run_env *e, const variant *v, size_t prompts,
                                    uint32_t per, uint32_t max_len) {
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    p.n_threads = e->o->lib_threads;
    p.backend = v->backend == VARIANT_RUN_BACKEND ? e->o->backend : v->backend;
    p.policy = v->policy;
    p.split_k = v->split_k;
    p.split_kv = v->split_kv;
    p.record_routes = v->record_routes;
    p.max_seqs = (uint32_t)(prompts * (per + 1));
    p.max_len = max_len;
    const uint64_t block = parity_kv_block_tokens(), seq_blocks = (max_len + block - 1) / block;
    uint64_t blocks = (uint64_t)prompts * (seq_blocks + (uint64_t)per * (seq_blocks + 1));
    p.cache_tokens = (uint32_t)(blocks * block);
    p.max_batch = (uint32_t)(prompts * per < 64 ? prompts * per : 64);
    parity_sampler *s = NULL;
    int rc = parity_sampler_create(e->model, &p, &s);
    if (rc) die_parity("creating a sampler", rc);
    return s;
}

/* Adds the prompts [first, last) and forks `per` completions of each, drawn with `sp`; the
 * parents are released (their blocks stay with the children). live[k] = sequence id,
 * slot[k] = index of the completion in the rollouts. */
static size_t start_wave(parity_sampler *s, const parity_sampling *sp, rollouts *r,
                         size_t first, size_t last, uint32_t *live, size_t *slot) {
    size_t n_live = 0;
    for (size_t p = first; p < last; p++) {
        uint32_t parent;
        int rc = parity_sampler_add(s, r->prompts->tok[p], r->prompts->len[p], sp, 0, &parent);
        if (rc) die_parity("prefilling a prompt", rc);
        for (uint32_t j = 0; j < r->per_prompt; j++) {
            size_t c = p * r->per_prompt + j;
            if ((rc = parity_sampler_fork(s, parent, sp, c, &live[n_live])))
                die_parity("forking a completion", rc);
            slot[n_live++] = c;
        }
        parity_sampler_release(s, parent);
    }
    return n_live;
}

/* Copies sequence `seq`'s depth schedule and routing record, as `rec` asks, to completion c's
 * place. */
static void keep_record(const parity_sampler *s, uint32_t seq, size_t c,
                        const completion_record *rec) {
    uint32_t n;
    int rc;
    if (rec->depth) {
        const uint32_t *d;
        if ((rc = parity_sampler_depths(s, seq, &d, &n))) die_parity("depths", rc);
        memcpy(rec->depth + c * rec->max_len, d, n * sizeof *d);
        rec->depth[c * rec->max_len + n] = 1; /* the last position's: not used */
    }
    if (rec->routes) {
        const uint16_t *routes;
        uint32_t stride;
        if ((rc = parity_sampler_routes(s, seq, &routes, &n, &stride))) die_parity("routes", rc);
        if (stride != rec->route_stride) die("routing record stride %u, not %u", stride,
                                             rec->route_stride);
        memcpy(rec->routes + c * rec->max_len * stride, routes,
               (size_t)n * stride * sizeof *routes);
    }
}

/* Steps the live completions until all have finished, appending tokens and log-probs to
 * gen_tok/gen_lp[c * max_new ...] and counting them in gen_n[c], and keeping what `rec` asks
 * for (NULL: nothing). */
static void decode_wave(parity_sampler *s, const rollouts *r, uint32_t *live, size_t *slot,
                        size_t n_live, int32_t *gen_tok, float *gen_lp, uint32_t *gen_n,
                        const completion_record *rec) {
    int32_t *tok = xcalloc(n_live, sizeof *tok);
    float *lp = xcalloc(n_live, sizeof *lp);
    uint32_t *fin = xcalloc(n_live, sizeof *fin);
    while (n_live) {
        int rc = parity_sampler_step(s, live, n_live, tok, lp, fin, 0, NULL, NULL);
        if (rc) die_parity("decoding", rc);
        size_t kept = 0;
        for (size_t k = 0; k < n_live; k++) {
            size_t c = slot[k];
            gen_tok[c * r->max_new + gen_n[c]] = tok[k];
            gen_lp[c * r->max_new + gen_n[c]] = lp[k];
            gen_n[c]++;
            if (fin[k] || gen_n[c] == r->max_new) {
                if (rec) keep_record(s, live[k], c, rec);
                parity_sampler_release(s, live[k]);
            } else {
                live[kept] = live[k];
                slot[kept++] = c;
            }
        }
        n_live = kept;
    }
    free(tok);
    free(lp);
    free(fin);
}

/* Lays the completions out as the scorer takes them: full sequences, concatenated. */
static void pack_rollouts(rollouts *r, const int32_t *gen_tok, const float *gen_lp,
                          const uint32_t *gen_n) {
    size_t n = r->n_seqs, toks = 0, gens = 0;
    /* the per-sequence arrays in one allocation, the size_t ones first (alignment); it is
     * freed through tok_off */
    size_t *offsets = xcalloc(2 * (n + 1) * sizeof(size_t) + 3 * n * sizeof(uint32_t), 1);
    r->tok_off = offsets;
    r->gen_off = offsets + n + 1;
    r->prompt_index = (uint32_t *)(offsets + 2 * (n + 1));
    r->length = r->prompt_index + n;
    r->prompt_len = r->length + n;
    for (size_t c = 0; c < n; c++) {
        size_t p = c / r->per_prompt;
        r->prompt_index[c] = (uint32_t)p;
        r->prompt_len[c] = r->prompts->len[p];
        r->length[c] = r->prompts->len[p] + gen_n[c];
        r->tok_off[c] = toks;
        r->gen_off[c] = gens;
        toks += r->length[c];
        gens += gen_n[c];
    }
    r->tok_off[n] = toks;
    r->gen_off[n] = gens;
    r->tokens = xcalloc(toks, sizeof *r->tokens);
    r->lp = xcalloc(gens, sizeof *r->lp);
    for (size_t c = 0; c < n; c++) {
        int32_t *t = r->tokens + r->tok_off[c];
        memcpy(t, r->prompts->tok[r->prompt_index[c]], r->prompt_len[c] * sizeof *t);
        memcpy(t + r->prompt_len[c], gen_tok + c * r->max_new, gen_n[c] * sizeof *t);
        memcpy(r->lp + r->gen_off[c], gen_lp + c * r->max_new, gen_n[c] * sizeof *r->lp);
    }
}

/* Generates every completion of `r` (its configuration filled in), in waves of at most 64
 * live completions. */
static void generate(const run_env *e, rollouts *r) {
    const prompt_set *ps = r->prompts;
    r->n_seqs = ps->n * r->per_prompt;
    uint32_t context = parity_model_config(e->model)->max_position_embeddings;
    uint64_t max_len = (uint64_t)max_prompt_len(ps) + r->max_new;
    if (max_len > context) max_len = context;
    size_t per_wave = r->per_prompt >= 64 ? 1 : 64 / r->per_prompt;
    if (per_wave > ps->n) per_wave = ps->n;
    int32_t *gen_tok = xcalloc(r->n_seqs * r->max_new, sizeof *gen_tok);
    float *gen_lp = xcalloc(r->n_seqs * r->max_new, sizeof *gen_lp);
    uint32_t *gen_n = xcalloc(r->n_seqs, sizeof *gen_n);
    uint32_t *live = xcalloc(per_wave * r->per_prompt, sizeof *live);
    size_t *slot = xcalloc(per_wave * r->per_prompt, sizeof *slot);
    parity_sampler *s = make_sampler(e, &r->v, per_wave, r->per_prompt, (uint32_t)max_len);
    parity_sampling sp;
    sampling_for(e, r->temperature, r->max_new, &sp);
    for (size_t first = 0; first < ps->n; first += per_wave) {
        size_t last = first + per_wave < ps->n ? first + per_wave : ps->n;
        size_t n_live = start_wave(s, &sp, r, first, last, live, slot);
        decode_wave(s, r, live, slot, n_live, gen_tok, gen_lp, gen_n, NULL);
    }
    parity_sampler_free(s);
    pack_rollouts(r, gen_tok, gen_lp, gen_n);
    free(gen_tok);
    free(gen_lp);
    free(gen_n);
    free(live);
    free(slot);
}

/* Generates every completion of `r` (its configuration filled in: r->v's sampler) in one wave
 * drawn with `sp`, keeping what `rec` asks for (its max_len at least the longest prompt plus
 * r->max_new). */
void generate_recorded(const run_env *e, const parity_sampling *sp, rollouts *r,
                       const completion_record *rec) {
    const prompt_set *ps = r->prompts;
    r->n_seqs = ps->n * r->per_prompt;
    const uint32_t max_len = max_prompt_len(ps) + r->max_new;
    parity_sampler *s = make_sampler(e, &r->v, ps->n, r->per_prompt, max_len);
    int32_t *gen_tok = xcalloc(r->n_seqs * r->max_new, sizeof *gen_tok);
    float *gen_lp = xcalloc(r->n_seqs * r->max_new, sizeof *gen_lp);
    uint32_t *gen_n = xcalloc(r->n_seqs, sizeof *gen_n);
    uint32_t *live = xcalloc(r->n_seqs, sizeof *live);
    size_t *slot = xcalloc(r->n_seqs, sizeof *slot);
    const size_t n_live = start_wave(s, sp, r, 0, ps->n, live, slot);
    decode_wave(s, r, live, slot, n_live, gen_tok, gen_lp, gen_n, rec);
    parity_sampler_free(s);
    pack_rollouts(r, gen_tok, gen_lp, gen_n);
    r->generated = 1;
    free(gen_tok);
    free(gen_lp);
    free(gen_n);
    free(live);
    free(slot);
}

static void free_rollouts(rollouts *r) {
    free(r->tok_off);  /* and the other per-sequence arrays (pack_rollouts) */
    free(r->tokens);
    free(r->lp);
    free(r->routes);
}

static int same_variant(const variant *a, const variant *b) {
    return same_policy(&a->policy, &b->policy) && a->split_k == b->split_k &&
           a->split_kv == b->split_kv && a->backend == b->backend;
}

/* The rollouts of a configuration, planned once per (configuration, prompts, length,
 * temperature) and generated later. */
static rollouts *plan_rollouts(rollout_cache *cache, const variant *v, const char *label,
                               const prompt_set *ps, uint32_t per, uint32_t max_new,
                               float temperature) {
    for (size_t i = 0; i < cache->n; i++) {
        rollouts *r = cache->v[i];
        if (same_variant(&r->v, v) && r->prompts == ps && r->per_prompt == per &&
            r->max_new == max_new && r->temperature == temperature)
            return r;
    }
    rollouts *r = xcalloc(1, sizeof *r);
    r->v = *v;
    snprintf(r->label, sizeof r->label, "%s", label);
    r->prompts = ps;
    r->per_prompt = per;
    r->max_new = max_new;
    r->temperature = temperature;
    cache->v = xrealloc(cache->v, (cache->n + 1) * sizeof *cache->v);
    cache->v[cache->n++] = r;
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* Scoring                                                                                  */
/* ---------------------------------------------------------------------------------------- */

parity_scorer *make_scorer(const run_env *e, const parity_policy *policy, uint32_t longest) {
    parity_scorer_params p;
    parity_scorer_default_params(&p);
    p.n_threads = e->o->lib_threads;
    p.backend = e->o->backend;
    p.policy = *policy;
    uint32_t context = parity_model_config(e->model)->max_position_embeddings;
    uint32_t cap = longest > 2048 ? longest : 2048;
    p.max_tokens = cap < context ? cap : context;
    parity_scorer *s = NULL;
    int rc = parity_scorer_create(e->model, &p, &s);
    if (rc) die_parity("creating a scorer", rc);
    return s;
}

/* The learner's log-probs of the generated tokens of `r`, indexed like r->lp; a
 * mixture-of-experts model's routes to replay and routes_out as parity_score_options' (NULL:
 * none). */
float *score_rollouts(const run_env *e, parity_scorer *s, const rollouts *r,
                      const uint16_t *routes, uint16_t *routes_out) {
    parity_score_options so;
    parity_score_default_options(&so);
    so.mode = e->o->mode;
    so.temperature = r->temperature;
    so.top_p = e->o->top_p;
    so.routes = routes;
    so.routes_out = routes_out;
    size_t all = r->tok_off[r->n_seqs] - r->n_seqs;
    float *lp = xcalloc(all, sizeof *lp);
    int rc = parity_score(s, &so, r->tokens, r->length, r->n_seqs, lp, NULL, NULL, NULL);
    if (rc) die_parity("scoring", rc);
    float *gen = xcalloc(r->gen_off[r->n_seqs], sizeof *gen);
    size_t at = 0;
    for (size_t c = 0; c < r->n_seqs; c++) {
        /* sequence c's values predict tokens 1 .. len-1; the generated ones start at plen */
        size_t n_gen = r->gen_off[c + 1] - r->gen_off[c];
        memcpy(gen + r->gen_off[c], lp + at + r->prompt_len[c] - 1, n_gen * sizeof *gen);
        at += r->length[c] - 1;
    }
    free(lp);
    return gen;
}

/* ---------------------------------------------------------------------------------------- */
/* Metrics                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* First position where two greedy runs of the same prompts pick different tokens. */
static void compare_greedy(const rollouts *a, const rollouts *b, greedy_cmp *g) {
    memset(g, 0, sizeof *g);
    g->measured = 1;
    g->prompts = a->n_seqs;
    g->length = a->max_new;
    g->first_min = INFINITY;
    double sum = 0;
    for (size_t c = 0; c < a->n_seqs; c++) {
        size_t na = a->gen_off[c + 1] - a->gen_off[c], nb = b->gen_off[c + 1] - b->gen_off[c];
        const int32_t *ta = a->tokens + a->tok_off[c] + a->prompt_len[c];
        const int32_t *tb = b->tokens + b->tok_off[c] + b->prompt_len[c];
        size_t t = 0, n = na < nb ? na : nb;
        while (t < n && ta[t] == tb[t]) t++;
        if (t == n && na == nb) continue;
        g->differing++;
        sum += (double)t;
        if ((double)t < g->first_min) g->first_min = (double)t;
    }
    g->first_mean = g->differing ? sum / (double)g->differing : NAN;
    if (!g->differing) g->first_min = NAN;
}

/* ---------------------------------------------------------------------------------------- */
/* Jobs: one (sampler configuration, learner policy) pair each                              */
/* ---------------------------------------------------------------------------------------- */

job *add_job(job_list *jl, section sec, const spec *sampler, uint32_t split_k,
             uint32_t split_kv, const char *learner_name, const parity_policy *learner) {
    jl->v = xrealloc(jl->v, (jl->n + 1) * sizeof *jl->v);
    job *j = &jl->v[jl->n++];
    memset(j, 0, sizeof *j);
    j->sec = sec;
    snprintf(j->sampler, sizeof j->sampler, "%s", sampler->name);
    snprintf(j->learner, sizeof j->learner, "%s", learner_name);
    describe_order(split_k, split_kv, j->order);
    j->sv.policy = sampler->policy;
    j->sv.split_k = split_k;
    j->sv.split_kv = split_kv;
    j->sv.backend = VARIANT_RUN_BACKEND;
    j->learner_policy = *learner;
    return j;
}

static int in_list(const spec_list *l, const char *name) { return find_spec(l, name) != NULL; }

static void add_matrix_jobs(job_list *jl, const options *o, const spec_list *samplers,
                            const spec_list *learners, const spec_list *kernel) {
    uint32_t k[4], kv[4];
    int n_orders = kernel_orders(o, k, kv);
    for (size_t s = 0; s < samplers->n; s++)
        for (int ord = 0; ord < n_orders; ord++) {
            if (ord && !in_list(kernel, samplers->v[s].name)) continue;
            for (size_t l = 0; l < learners->n; l++)
                add_job(jl, SEC_MATRIX, &samplers->v[s], k[ord], kv[ord], learners->v[l].name,
                        &learners->v[l].policy);
        }
}

/* The research scenario: sampler S (vLLM), learner L (HF eager) against learners aligned to
 * the sampler, and the kernel-order noise left when rounding points agree. */
static void add_headline_jobs(job_list *jl, const options *o, const spec *S, const spec *L) {
    uint32_t k[4], kv[4];
    int n_orders = kernel_orders(o, k, kv);
    char name[2 * NAME_MAX_LEN];
    spec l_aligned = *L, s_aligned = *S, fp32, s_fp16, l_fp16, s_fp8, s_fp8_other;
    int has_aligned = strstr(L->name, "+aligned") || strstr(S->name, "+aligned");
    if (!has_aligned) {
        snprintf(name, sizeof name, "%s+aligned", L->name);
        spec_from_name(name, &l_aligned);
        snprintf(name, sizeof name, "%s+aligned", S->name);
        spec_from_name(name, &s_aligned);
    }
    /* the same pair with every rounding point in fp16, when both sides are bf16 policies */
    const int fp16_rows = S->policy.compute == PARITY_COMPUTE_BF16 &&
                          L->policy.compute == PARITY_COMPUTE_BF16;
    if (fp16_rows) {
        snprintf(name, sizeof name, "%s+fp16", S->name);
        spec_from_name(name, &s_fp16);
        snprintf(name, sizeof name, "%s+fp16", L->name);
        spec_from_name(name, &l_fp16);
        /* block FP8 on the sampler's rounding points: the DeepSeek/vLLM quantizer, and TE's
         * power-of-two default as another side's */
        snprintf(name, sizeof name, "%s+fp8-block:deepseek", S->name);
        spec_from_name(name, &s_fp8);
        snprintf(name, sizeof name, "%s+fp8-block:te-pow2", S->name);
        spec_from_name(name, &s_fp8_other);
    }
    spec_from_name("fp32", &fp32);
    snprintf(add_job(jl, SEC_HEADLINE, S, 0, 0, L->name, &L->policy)->note, 64,
             "mismatched rounding points");
    if (!has_aligned) {
        snprintf(add_job(jl, SEC_HEADLINE, S, 0, 0, l_aligned.name, &l_aligned.policy)->note, 64,
                 "learner regions aligned, not to S");
        snprintf(add_job(jl, SEC_HEADLINE, &s_aligned, 0, 0, s_aligned.name,
                         &s_aligned.policy)->note, 64, "both +aligned");
        snprintf(add_job(jl, SEC_HEADLINE, &s_aligned, 0, 0, l_aligned.name,
                         &l_aligned.policy)->note, 64, "both +aligned, own attention");
    }
    snprintf(add_job(jl, SEC_HEADLINE, S, 0, 0, S->name, &S->policy)->note, 64,
             "learner = sampler policy");
    for (int ord = 1; ord < n_orders; ord++)
        snprintf(add_job(jl, SEC_HEADLINE, S, k[ord], kv[ord], S->name, &S->policy)->note, 64,
                 "same rounding, other kernels");
    /* the amx backend's tile order on the sampler, the run's backend on the learner, where
     * the CPU has AMX-BF16 and S has bf16 GEMMs */
    if (o->backend != PARITY_BACKEND_AMX && S->policy.compute == PARITY_COMPUTE_BF16 &&
        parity_backend_check(PARITY_BACKEND_AMX) == PARITY_OK) {
        job *j = add_job(jl, SEC_HEADLINE, S, 0, 0, S->name, &S->policy);
        j->sv.backend = PARITY_BACKEND_AMX;
        snprintf(j->order, sizeof j->order, "amx");
        snprintf(j->note, sizeof j->note, "same rounding, amx sampler");
    }
    snprintf(add_job(jl, SEC_HEADLINE, S, 0, 0, fp32.name, &fp32.policy)->note, 64,
             "learner fp32");
    if (fp16_rows) {
        snprintf(add_job(jl, SEC_HEADLINE, &s_fp16, 0, 0, l_fp16.name, &l_fp16.policy)->note, 64,
                 "fp16: mismatched rounding points");
        snprintf(add_job(jl, SEC_HEADLINE, &s_fp16, 0, 0, s_fp16.name, &s_fp16.policy)->note, 64,
                 "fp16: learner = sampler policy");
        snprintf(add_job(jl, SEC_HEADLINE, &s_fp16, 0, 0, S->name, &S->policy)->note, 64,
                 "fp16 sampler, bf16 learner");
        snprintf(add_job(jl, SEC_HEADLINE, &s_fp8, 0, 0, s_fp8_other.name,
                         &s_fp8_other.policy)->note, 64, "fp8: other quantizer");
        snprintf(add_job(jl, SEC_HEADLINE, &s_fp8, 0, 0, S->name, &S->policy)->note, 64,
                 "fp8 sampler, bf16 learner");
        snprintf(add_job(jl, SEC_HEADLINE, &s_fp8, 0, 0, s_fp8.name, &s_fp8.policy)->note, 64,
                 "fp8: same quantizer");
        /* the 4-bit and ternary formats on the sampler's rounding points: a quantizer
         * variant on the learner's side, the bf16 learner, the same quantizer */
        static const struct {
            const char *format, *same, *other;
        } low[] = {{"nvfp4", "nvfp4:modelopt", "nvfp4:te"},
                   {"mxfp4", "mxfp4:ocp", "mxfp4:rceil"},
                   {"ternary", "ternary:bitnet", "ternary:onebitllms"}};
        for (size_t f = 0; f < sizeof low / sizeof low[0]; f++) {
            spec s_low, s_low_other;
            snprintf(name, sizeof name, "%s+%s", S->name, low[f].same);
            spec_from_name(name, &s_low);
            snprintf(name, sizeof name, "%s+%s", S->name, low[f].other);
            spec_from_name(name, &s_low_other);
            snprintf(add_job(jl, SEC_HEADLINE, &s_low, 0, 0, s_low_other.name,
                             &s_low_other.policy)->note, 64, "%s: other quantizer", low[f].format);
            snprintf(add_job(jl, SEC_HEADLINE, &s_low, 0, 0, S->name, &S->policy)->note, 64,
                     "%s sampler, bf16 learner", low[f].format);
            snprintf(add_job(jl, SEC_HEADLINE, &s_low, 0, 0, s_low.name, &s_low.policy)->note, 64,
                     "%s: same quantizer", low[f].format);
        }
    }
}

/* One region at a time (attention alone too), then pairs, then the three, then attention, then
 * logits. */
static void add_ablation_jobs(job_list *jl, const spec *S, const spec *L) {
    static const unsigned steps[] = {
        0, REGION_RESNORM, REGION_ROPE, REGION_SWIGLU, REGION_ATTN, REGION_RESNORM | REGION_ROPE,
        REGION_RESNORM | REGION_SWIGLU, REGION_ROPE | REGION_SWIGLU,
        REGION_RESNORM | REGION_ROPE | REGION_SWIGLU,
        REGION_RESNORM | REGION_ROPE | REGION_SWIGLU | REGION_ATTN,
        REGION_RESNORM | REGION_ROPE | REGION_SWIGLU | REGION_ATTN | REGION_LOGITS,
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        parity_policy p = copy_regions(L->policy, &S->policy, steps[i]);
        char regions[64], name[NAME_MAX_LEN];
        describe_regions(steps[i], regions, sizeof regions);
        if (steps[i]) snprintf(name, sizeof name, "%.40s<-%.40s", L->name, regions);
        else snprintf(name, sizeof name, "%s", L->name);
        job *j = add_job(jl, SEC_ABLATION, S, 0, 0, name, &p);
        snprintf(j->regions, sizeof j->regions, "%s", regions);
    }
}

/* The long run: S -> L and S -> S, with and without the kernel-order switches. */
static void add_growth_jobs(job_list *jl, const options *o, const spec *S, const spec *L) {
    uint32_t both_k = o->split_k, both_kv = o->split_kv;
    add_job(jl, SEC_GROWTH, S, 0, 0, L->name, &L->policy)->long_run = 1;
    add_job(jl, SEC_GROWTH, S, 0, 0, S->name, &S->policy)->long_run = 1;
    add_job(jl, SEC_GROWTH, S, both_k, both_kv, S->name, &S->policy)->long_run = 1;
    add_job(jl, SEC_GROWTH, S, both_k, both_kv, L->name, &L->policy)->long_run = 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Running the jobs                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* Plans every job's rollouts, greedy runs and scoring, sharing what configurations share. */
static void plan_work(bench *b) {
    for (size_t i = 0; i < b->jobs.n; i++) {
        job *j = &b->jobs.v[i];
        char label[LABEL_MAX_LEN];
        snprintf(label, sizeof label, "%s [%s]", j->sampler, j->order);
        if (j->long_run) {
            j->ro = plan_rollouts(&b->rollouts, &j->sv, label, &b->growth_prompts, b->o.growth_n,
                                  b->growth_tokens, b->o.temperature);
        } else {
            j->ro = plan_rollouts(&b->rollouts, &j->sv, label, &b->prompts, b->o.n,
                                  b->o.max_tokens, b->o.temperature);
        }
        if (j->sec != SEC_GROWTH && j->sec != SEC_ABLATION && b->o.greedy_tokens) {
            variant lv = {j->learner_policy, 0, 0, VARIANT_RUN_BACKEND, 0};
            j->greedy_sampler = plan_rollouts(&b->rollouts, &j->sv, label, &b->prompts, 1,
                                              b->o.greedy_tokens, 0.0f);
            j->greedy_learner = plan_rollouts(&b->rollouts, &lv, j->learner, &b->prompts, 1,
                                              b->o.greedy_tokens, 0.0f);
        }
        score_list *sl = &b->scores;
        for (j->score = 0; j->score < sl->n; j->score++)
            if (sl->v[j->score].ro == j->ro &&
                same_policy(&sl->v[j->score].learner, &j->learner_policy))
                break;
        if (j->score == sl->n) {
            sl->v = xrealloc(sl->v, (sl->n + 1) * sizeof *sl->v);
            sl->v[sl->n++] = (score_entry){j->learner_policy, j->ro, NULL};
        }
    }
}

/* Runs fn(ctx, 0 .. n-1) on `threads` threads (the caller is one), tasks taken in order. */
typedef struct task_queue {
    void (*fn)(void *ctx, size_t i);
    void *ctx;
    size_t n;
    atomic_size_t next;
} task_queue;

static void *task_worker(void *arg) {
    task_queue *q = arg;
    for (size_t i; (i = atomic_fetch_add(&q->next, 1)) < q->n;) q->fn(q->ctx, i);
    return NULL;
}

static void run_tasks(size_t n, unsigned threads, void (*fn)(void *, size_t), void *ctx) {
    task_queue q = {fn, ctx, n, 0};
    atomic_init(&q.next, 0);
    if (threads > n) threads = (unsigned)(n ? n : 1);
    pthread_t *t = xcalloc(threads, sizeof *t);
    for (unsigned i = 1; i < threads; i++)
        if (pthread_create(&t[i], NULL, task_worker, &q)) die("cannot start a thread");
    task_worker(&q);
    for (unsigned i = 1; i < threads; i++) pthread_join(t[i], NULL);
    free(t);
}

/* Generation tasks: every planned rollout set, the largest first. */
typedef struct gen_tasks {
    const run_env *env;
    rollouts **todo;
} gen_tasks;

static double generation_cost(const rollouts *r) {
    return (double)r->prompts->n * r->per_prompt * (r->max_new + max_prompt_len(r->prompts));
}

static int by_generation_cost(const void *a, const void *b) {
    double x = generation_cost(*(rollouts *const *)a), y = generation_cost(*(rollouts *const *)b);
    return x > y ? -1 : x < y;
}

static void run_generation(void *ctx, size_t i) {
    gen_tasks *g = ctx;
    rollouts *r = g->todo[i];
    double t0 = bench_now();
    generate(g->env, r);
    r->generated = 1;
    progress("%s %s: %zu prompts x %u x %u tokens (%.1f s)",
             r->temperature == 0 ? "greedy " : "sampled", r->label, r->prompts->n, r->per_prompt,
             r->max_new, bench_now() - t0);
}

static void generate_all(bench *b, const run_env *env) {
    gen_tasks g = {env, xcalloc(b->rollouts.n, sizeof(rollouts *))};
    size_t n = 0;
    for (size_t i = 0; i < b->rollouts.n; i++)
        if (!b->rollouts.v[i]->generated) g.todo[n++] = b->rollouts.v[i];
    qsort(g.todo, n, sizeof *g.todo, by_generation_cost);
    run_tasks(n, b->o.threads, run_generation, &g);
    free(g.todo);
}

/* Scoring tasks: one per distinct learner policy, which scores every rollout set it is paired
 * with through one scorer; the most tokens first. */
typedef struct learner_task {
    const char *name;
    size_t *entries, n, tokens;
} learner_task;

typedef struct score_tasks {
    const run_env *env;
    score_list *scores;
    learner_task *t;
    uint32_t longest;
} score_tasks;

static int by_tokens(const void *a, const void *b) {
    size_t x = ((const learner_task *)a)->tokens, y = ((const learner_task *)b)->tokens;
    return x > y ? -1 : x < y;
}

static void run_scoring(void *ctx, size_t i) {
    score_tasks *st = ctx;
    learner_task *t = &st->t[i];
    double t0 = bench_now();
    parity_scorer *s = make_scorer(st->env, &st->scores->v[t->entries[0]].learner, st->longest);
    for (size_t k = 0; k < t->n; k++) {
        score_entry *e = &st->scores->v[t->entries[k]];
        e->lp = score_rollouts(st->env, s, e->ro, NULL, NULL);
    }
    parity_scorer_free(s);
    progress("scored  %s: %zu rollout sets, %zu tokens (%.1f s)", t->name, t->n, t->tokens,
             bench_now() - t0);
}

/* The learner tasks of the score list; a job names each learner policy. */
static size_t group_by_learner(const bench *b, learner_task *t) {
    size_t n = 0;
    for (size_t e = 0; e < b->scores.n; e++) {
        const score_entry *se = &b->scores.v[e];
        size_t k = 0;
        while (k < n && !same_policy(&b->scores.v[t[k].entries[0]].learner, &se->learner)) k++;
        if (k == n) {
            t[n].entries = xcalloc(b->scores.n, sizeof(size_t));
            for (size_t i = 0; i < b->jobs.n; i++)
                if (same_policy(&b->jobs.v[i].learner_policy, &se->learner)) {
                    t[n].name = b->jobs.v[i].learner;
                    break;
                }
            n++;
        }
        t[k].entries[t[k].n++] = e;
        t[k].tokens += se->ro->tok_off[se->ro->n_seqs];
    }
    return n;
}

static void score_all(bench *b, const run_env *env) {
    score_tasks st = {env, &b->scores, xcalloc(b->scores.n, sizeof(learner_task)), 1};
    for (size_t i = 0; i < b->rollouts.n; i++)
        for (size_t s = 0; s < b->rollouts.v[i]->n_seqs; s++)
            if (b->rollouts.v[i]->length[s] > st.longest) st.longest = b->rollouts.v[i]->length[s];
    size_t n = group_by_learner(b, st.t);
    qsort(st.t, n, sizeof *st.t, by_tokens);
    run_tasks(n, b->o.threads, run_scoring, &st);
    for (size_t i = 0; i < n; i++) free(st.t[i].entries);
    free(st.t);
}

static void measure_all(bench *b) {
    for (size_t i = 0; i < b->jobs.n; i++) {
        job *j = &b->jobs.v[i];
        j->learner_lp = b->scores.v[j->score].lp;
        compute_metrics(j->ro, j->learner_lp, 0, UINT32_MAX, &j->m);
        if (j->greedy_sampler) compare_greedy(j->greedy_sampler, j->greedy_learner, &j->g);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Looped models                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* Rollouts of `r` (prompts, per_prompt, max_new, temperature set) by an early-exit sampler of
 * `policy` (threshold rule, LAST_EXITED), and each sequence's depth schedule, laid out like
 * r->tokens (the last position's: 1). */
static uint32_t *generate_looped(const run_env *e, const parity_policy *policy, float threshold,
                                 rollouts *r) {
    r->v = (variant){*policy, 0, 0, VARIANT_RUN_BACKEND, 0};
    const uint32_t max_len = max_prompt_len(r->prompts) + r->max_new;
    parity_sampling sp;
    sampling_for(e, r->temperature, r->max_new, &sp);
    sp.exit_rule = PARITY_EXIT_THRESHOLD;
    sp.exit_threshold = threshold;
    completion_record rec = {0};
    rec.max_len = max_len;
    rec.depth = xcalloc(r->prompts->n * r->per_prompt * max_len, sizeof *rec.depth);
    generate_recorded(e, &sp, r, &rec);
    uint32_t *sched = xcalloc(r->tok_off[r->n_seqs], sizeof *sched);
    for (size_t c = 0; c < r->n_seqs; c++)
        memcpy(sched + r->tok_off[c], rec.depth + c * max_len, r->length[c] * sizeof *sched);
    free(rec.depth);
    return sched;
}

/* How a looped learner runs the rollouts' positions. */
enum { LOOPED_DENSE, LOOPED_REPLAY, LOOPED_RULE };

/* The learner's log-probs of the generated tokens (indexed like r->lp): every loop for every
 * position, the schedule `sched` replayed under `loop_kv`, or the depths re-derived by the
 * sampler's threshold rule under the learner's own policy. */
static float *score_looped(const run_env *e, const parity_policy *policy, const rollouts *r,
                           int how, const uint32_t *sched, uint32_t loop_kv, float threshold) {
    parity_scorer *s = make_scorer(e, policy, max_prompt_len(r->prompts) + r->max_new);
    float *gen = xcalloc(r->gen_off[r->n_seqs] + 1, sizeof *gen);
    float *lp = xcalloc(max_prompt_len(r->prompts) + r->max_new, sizeof *lp);
    for (size_t c = 0; c < r->n_seqs; c++) {
        parity_score_options so;
        parity_score_default_options(&so);
        so.mode = e->o->mode;
        so.temperature = r->temperature;
        so.top_p = e->o->top_p;
        so.loop_kv = loop_kv;
        if (how == LOOPED_REPLAY) so.depths = sched + r->tok_off[c];
        if (how == LOOPED_RULE) {
            so.exit_rule = PARITY_EXIT_THRESHOLD;
            so.exit_threshold = threshold;
            so.prompt_len = r->prompt_len[c];
        }
        int rc = parity_score(s, &so, r->tokens + r->tok_off[c], &r->length[c], 1, lp, NULL,
                              NULL, NULL);
        if (rc) die_parity("scoring", rc);
        memcpy(gen + r->gen_off[c], lp + r->prompt_len[c] - 1,
               (r->gen_off[c + 1] - r->gen_off[c]) * sizeof *gen);
    }
    parity_scorer_free(s);
    free(lp);
    return gen;
}

/* A row of the looped section: how its learner runs the positions. */
typedef struct looped_row {
    int how;
    uint32_t kv;
    const char *learner, *note;
    int fp32_cdf;   /* the learner's exit CDF in fp32 (the sampler's: its policy's) */
} looped_row;

static const looped_row aligned_rows[] = {
    {LOOPED_DENSE, 0, "aligned dense", "every loop, every token", 0},
    {LOOPED_REPLAY, PARITY_LOOP_KV_LAST_EXITED, "aligned replay", "the sampler's depths, last-exited", 0},
    {LOOPED_REPLAY, PARITY_LOOP_KV_FULL, "aligned replay, full K/V", "the depths, every plane computed", 0},
};
static const looped_row eager_rows[] = {
    {LOOPED_RULE, PARITY_LOOP_KV_LAST_EXITED, "hf-eager rule, fp32 CDF",
     "depths re-derived, exit CDF fp32 not bf16", 1},
    {LOOPED_RULE, PARITY_LOOP_KV_LAST_EXITED, "hf-eager rule", "depths re-derived, bf16 CDF", 0},
};

/* The looped section's rows (after the others: its rollouts are its own). */
static void run_looped(bench *b, const run_env *env) {
    const parity_config *c = parity_model_config(b->model);
    if (c->arch != PARITY_ARCH_OURO || !c->early_exit_gate) return;
    progress("looped model: early-exit rollouts at threshold %g", (double)b->o.exit_threshold);
    static const char *const samplers[2] = {"aligned", "hf-eager"};
    for (int k = 0; k < 2; k++) {
        spec S;
        spec_from_name(samplers[k], &S);
        rollouts *r = xcalloc(1, sizeof *r);
        r->prompts = &b->prompts;
        r->per_prompt = b->o.n;
        r->max_new = b->o.max_tokens;
        r->temperature = b->o.temperature;
        snprintf(r->label, sizeof r->label, "%s early exit", S.name);
        uint32_t *sched = generate_looped(env, &S.policy, b->o.exit_threshold, r);
        /* kept with the others, freed with them */
        b->rollouts.v = xrealloc(b->rollouts.v, (b->rollouts.n + 1) * sizeof *b->rollouts.v);
        b->rollouts.v[b->rollouts.n++] = r;
        const looped_row *rows = k == 0 ? aligned_rows : eager_rows;
        const int n = k == 0 ? 3 : 2;
        for (int i = 0; i < n; i++) {
            parity_policy L = S.policy;
            if (rows[i].fp32_cdf) L.exit_dist = PARITY_EXIT_DIST_FP32;
            job *j = add_job(&b->jobs, SEC_LOOPED, &S, 0, 0, rows[i].learner, &L);
            snprintf(j->note, sizeof j->note, "%s", rows[i].note);
            float *lp = score_looped(env, &L, r, rows[i].how, sched, rows[i].kv,
                                     b->o.exit_threshold);
            compute_metrics(r, lp, 0, UINT32_MAX, &j->m);
            free(lp);
        }
        free(sched);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Setup                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static void open_model(bench *b) {
    if (b->o.model_spec) {
        snprintf(b->model_spec, sizeof b->model_spec, "%s", b->o.model_spec);
    } else {
        char cfg[1100];
        snprintf(b->model_spec, sizeof b->model_spec, "%s/models/qwen3-bytes-pystdlib-4.9m",
                 source_root());
        snprintf(cfg, sizeof cfg, "%s/config.json", b->model_spec);
        if (!file_exists(cfg)) snprintf(b->model_spec, sizeof b->model_spec, "synthetic:tiny");
    }
    int rc = parity_model_open(b->model_spec, &b->model);
    if (rc) die_parity(b->model_spec, rc);
}

static void load_prompts(bench *b) {
    if (b->o.n_prompt_files)
        for (size_t i = 0; i < b->o.n_prompt_files; i++)
            load_prompt_file(&b->prompts, b->o.prompt_files[i], b->o.prompt_tokens);
    else
        load_default_prompts(&b->prompts, b->o.prompt_len);
    const parity_config *c = parity_model_config(b->model);
    uint32_t new_tokens = b->o.max_tokens > b->o.greedy_tokens ? b->o.max_tokens : b->o.greedy_tokens;
    uint32_t room = new_tokens + 1;
    if (room >= c->max_position_embeddings)
        die("--max-tokens or --greedy-tokens exceeds the model's context");
    fit_prompts(&b->prompts, c, room);
    /* the growth run: the first prompts, as long as the context allows */
    size_t n = b->o.growth_prompts < b->prompts.n ? b->o.growth_prompts : b->prompts.n;
    for (size_t i = 0; i < n; i++)
        prompt_push(&b->growth_prompts, b->prompts.tok[i], b->prompts.len[i], b->prompts.source[i]);
    uint32_t longest = max_prompt_len(&b->growth_prompts);
    b->growth_tokens = b->o.growth_tokens;
    if (longest + b->growth_tokens > c->max_position_embeddings)
        b->growth_tokens = c->max_position_embeddings - longest;
}

static void plan_jobs(bench *b) {
    parse_spec_list(b->o.policies, &b->samplers);
    parse_spec_list(b->o.learners, &b->learners);
    if (!strcmp(b->o.kernel_policies, "all")) b->kernel = b->samplers;
    else parse_spec_list(b->o.kernel_policies, &b->kernel);
    for (size_t i = 0; i < b->kernel.n; i++)
        if (!find_spec(&b->samplers, b->kernel.v[i].name))
            fprintf(stderr, "warning: --kernel-policies: %s is not in --policies; it gets no "
                            "kernel-order rows\n", b->kernel.v[i].name);
    if (strcmp(b->o.ablation, "none")) {
        const char *comma = strchr(b->o.ablation, ',');
        if (!comma || strchr(comma + 1, ',')) die("--ablation takes SAMPLER,LEARNER");
        char s[NAME_MAX_LEN];
        snprintf(s, sizeof s, "%.*s", (int)(comma - b->o.ablation), b->o.ablation);
        spec_from_name(s, &b->ablation_s);
        spec_from_name(comma + 1, &b->ablation_l);
        b->has_ablation = 1;
    }
    if (b->has_ablation) add_headline_jobs(&b->jobs, &b->o, &b->ablation_s, &b->ablation_l);
    add_matrix_jobs(&b->jobs, &b->o, &b->samplers, &b->learners, &b->kernel);
    if (b->has_ablation) add_ablation_jobs(&b->jobs, &b->ablation_s, &b->ablation_l);
    if (b->has_ablation && b->growth_tokens)
        add_growth_jobs(&b->jobs, &b->o, &b->ablation_s, &b->ablation_l);
}

static void free_bench(bench *b) {
    for (size_t i = 0; i < b->rollouts.n; i++) {
        free_rollouts(b->rollouts.v[i]);
        free(b->rollouts.v[i]);
    }
    free(b->rollouts.v);
    for (size_t i = 0; i < b->scores.n; i++) free(b->scores.v[i].lp);
    free(b->scores.v);
    free(b->jobs.v);
    free_prompts(&b->prompts);
    free_prompts(&b->growth_prompts);
    free_moe(b);
    parity_model_free(b->model);
}

int main(int argc, char **argv) {
    static bench b;
    progress_start();
    parse_options(&b.o, argc, argv);
    open_model(&b);
    load_prompts(&b);
    plan_jobs(&b);
    plan_work(&b);
    progress("%zu pairs: %zu rollout sets (sampled and greedy), %zu scorings; model %s; "
             "%u worker threads", b.jobs.n, b.rollouts.n, b.scores.n, b.model_spec, b.o.threads);
    run_env env = {&b.o, b.model};
    generate_all(&b, &env);
    score_all(&b, &env);
    measure_all(&b);
    run_looped(&b, &env);
    run_moe(&b);
    b.elapsed = progress_seconds();
    const int failed = print_report(&b);
    if (b.o.json_path) write_json(&b, b.o.json_path);
    if (b.o.csv_path) write_csv(&b, b.o.csv_path);
    if (b.o.svg_dir) write_svgs(&b, b.o.svg_dir);
    free_bench(&b);
    return failed ? 1 : 0;
}
