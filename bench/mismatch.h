/* The types and functions of parity-mismatch: parity-mismatch.c runs the rollouts, scores and
 * measures; mismatch-report.c writes the table, JSON, CSV and SVG output; mismatch.c holds
 * what both use. See parity-mismatch.c for what is measured. */
#ifndef PARITY_BENCH_MISMATCH_H
#define PARITY_BENCH_MISMATCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "parity.h"

#define NAME_MAX_LEN 96
#define ORDER_MAX_LEN 48
#define LABEL_MAX_LEN (2 * NAME_MAX_LEN + ORDER_MAX_LEN + 16)
#define MAX_SPECS 64

typedef struct options {
    const char *model_spec;
    char **prompt_files;          /* into argv */
    size_t n_prompt_files;
    int prompt_tokens;          /* prompt files hold decimal ids instead of bytes */
    uint32_t prompt_len;        /* length of the default prompt slices */
    uint32_t n, max_tokens;
    uint32_t greedy_tokens;     /* length of the greedy runs; 0 = none */
    uint32_t threads;           /* worker threads, each with its own sampler or scorer */
    uint32_t lib_threads;       /* threads of each sampler's and scorer's own pool */
    uint32_t split_k, split_kv;
    uint32_t growth_tokens, growth_n, growth_prompts;
    float temperature, top_p;
    float exit_threshold;       /* looped models: the early-exit sampler's threshold */
    unsigned long long seed;
    uint32_t mode, backend;
    const char *policies, *learners, *kernel_policies, *ablation;
    const char *json_path, *csv_path, *svg_dir;
    int full_tables;
} options;

/* A named policy. */
typedef struct spec {
    char name[NAME_MAX_LEN];
    parity_policy policy;
} spec;

typedef struct spec_list {
    spec v[MAX_SPECS];
    size_t n;
} spec_list;

typedef struct prompt_set {
    size_t n;
    int32_t **tok;
    uint32_t *len;
    char **source;    /* "FILE" or "FILE@OFFSET" */
} prompt_set;

/* A sampler configuration: a policy and the kernel-order switches. */
typedef struct variant {
    parity_policy policy;
    uint32_t split_k, split_kv;
    uint32_t backend;   /* the sampler's GEMM backend; VARIANT_RUN_BACKEND: --backend's */
} variant;
#define VARIANT_RUN_BACKEND UINT32_MAX

/* Completions of a prompt set under one configuration, and the log-probs the sampler
 * reported (temperature 0: a greedy run). Planned first, generated later. */
typedef struct rollouts {
    variant v;
    char label[LABEL_MAX_LEN];
    const prompt_set *prompts;
    uint32_t per_prompt, max_new;
    float temperature;
    int generated;
    size_t n_seqs;
    uint32_t *prompt_index;   /* [n_seqs] */
    uint32_t *length;         /* [n_seqs] prompt + generated */
    uint32_t *prompt_len;     /* [n_seqs] */
    size_t *tok_off;          /* [n_seqs + 1] offsets of the full sequences in tokens */
    size_t *gen_off;          /* [n_seqs + 1] offsets of the generated tokens' values in lp */
    int32_t *tokens;          /* full sequences, concatenated */
    float *lp;                /* the sampler's log-probs of the generated tokens */
} rollouts;

typedef struct rollout_cache {
    rollouts **v;
    size_t n;
} rollout_cache;

/* One scoring: rollouts under a learner policy; lp is indexed like the rollouts' lp. */
typedef struct score_entry {
    parity_policy learner;
    const rollouts *ro;
    float *lp;
} score_entry;

typedef struct score_list {
    score_entry *v;
    size_t n;
} score_list;

typedef struct metrics {
    size_t tokens, nonfinite, equal, seqs;
    double mean_abs, p99_abs, max_abs, bias, k3;
    double ratio_mean, ratio_std, ratio_outside, ratio_max, equal_frac;
    double seq_mean_abs, seq_max_abs;
} metrics;

typedef struct greedy_cmp {
    int measured;
    size_t prompts, differing;
    uint32_t length;
    double first_mean, first_min;
} greedy_cmp;

typedef enum section {
    SEC_HEADLINE,
    SEC_MATRIX,    /* includes the kernel-order rows */
    SEC_ABLATION,
    SEC_GROWTH,
    SEC_LOOPED,    /* a looped model: early exit against dense and replaying learners */
    N_SECTIONS
} section;

/* One (sampler configuration, learner policy) pair of a section. */
typedef struct job {
    section sec;
    char sampler[NAME_MAX_LEN], learner[NAME_MAX_LEN], order[ORDER_MAX_LEN];
    char regions[64];       /* ablation: the regions copied from the sampler */
    char note[64];          /* headline: what the row shows */
    variant sv;
    parity_policy learner_policy;
    int long_run;           /* growth: the long rollouts */
    rollouts *ro, *greedy_sampler, *greedy_learner;
    size_t score;           /* index in the score list */
    const float *learner_lp;
    metrics m;
    greedy_cmp g;
} job;

typedef struct job_list {
    job *v;
    size_t n;
} job_list;

typedef struct bench {
    options o;
    parity_model *model;
    char model_spec[1024];
    prompt_set prompts, growth_prompts;
    spec_list samplers, learners, kernel;
    spec ablation_s, ablation_l;
    int has_ablation;
    uint32_t growth_tokens;
    rollout_cache rollouts;   /* sampled and greedy */
    score_list scores;
    job_list jobs;
    double elapsed;
} bench;

/* mismatch.c: shared by both halves */
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
void progress_start(void);      /* the time progress lines count from */
void progress_silence(void);    /* --quiet: no progress lines */
double progress_seconds(void);  /* since progress_start */
void progress(const char *fmt, ...) PRINTF_LIKE(1, 2);
void die(const char *fmt, ...) PRINTF_LIKE(1, 2) __attribute__((noreturn));
void *xcalloc(size_t n, size_t size);
int same_policy(const parity_policy *a, const parity_policy *b);
const spec *find_spec(const spec_list *l, const char *name);
void describe_order(uint32_t split_k, uint32_t split_kv, char out[ORDER_MAX_LEN]);
int kernel_orders(const options *o, uint32_t k[4], uint32_t kv[4]);
void compute_metrics(const rollouts *r, const float *learner, uint32_t lo, uint32_t hi,
                     metrics *m);

/* mismatch-report.c */
void print_report(const bench *b);
void write_json(const bench *b, const char *path);
void write_csv(const bench *b, const char *path);
void write_svgs(const bench *b, const char *dir);

#endif
