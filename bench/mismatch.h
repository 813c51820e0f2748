/* The types and functions of parity-mismatch: parity-mismatch.c runs the rollouts, scores and
 * measures; mismatch-moe.c runs the mixture-of-experts section on its own models;
 * mismatch-report.c writes the table, JSON, CSV and SVG output; mismatch.c holds what both
 * halves use. See parity-mismatch.c for what is measured. */
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
#define MAX_MOE_MODELS 4

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
    const char *moe_models;     /* the MoE section's models, comma-separated; NULL: default */
    const char *moe_pairs;      /* its SAMPLER/LEARNER pairs, comma-separated */
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
    uint32_t record_routes; /* a mixture-of-experts sampler keeps its routing record */
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
    /* v.record_routes: the sampler's routing record, laid out like tokens times route_stride
     * (parity_score_options.routes; each sequence's last position unused) */
    uint16_t *routes;
    uint32_t route_stride;
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

/* A mixture-of-experts pair's routing figures, over the positions whose outputs give the
 * generated tokens' log-probs: the learner's routes (routes_out) against the sampler's record,
 * the expert sets compared per (position, sparse layer). */
typedef struct moe_routing {
    size_t model;                   /* index in bench.moe */
    int replay;                     /* the learner replayed the sampler's record */
    size_t decisions, differing;    /* (position, sparse layer) pairs; with another expert set */
    size_t positions, positions_differing;  /* positions; with at least one differing layer */
} moe_routing;

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
    SEC_MOE,       /* mixture-of-experts models: routing recomputed and replayed */
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
    moe_routing moe;        /* SEC_MOE */
} job;

typedef struct job_list {
    job *v;
    size_t n;
} job_list;

/* A model of the mixture-of-experts section, and the prompts fitted to it. */
typedef struct moe_model {
    char spec[1024];
    char name[NAME_MAX_LEN];    /* the spec's last path component, for the table */
    char arch[32];
    uint32_t experts, top_k, sparse_layers;
    prompt_set prompts;
    /* expert load from the first sampler's record over the scored positions: the least and
     * the most chosen expert's share of a sparse layer's choices, over the layers */
    char load_sampler[NAME_MAX_LEN];
    double load_min, load_max;
} moe_model;

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
    moe_model moe[MAX_MOE_MODELS];
    size_t n_moe;
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

/* parity-mismatch.c: what the mixture-of-experts section shares with the other sections */
typedef struct run_env {
    const options *o;
    const parity_model *model;
} run_env;

/* What generate_recorded keeps of each finished completion c besides its tokens (NULL
 * members: nothing): a looped model's depth schedule at depth[c * max_len ...] (the last
 * position's 1) and a mixture-of-experts model's routing record at
 * routes[c * max_len * route_stride ...], positions 0 .. len - 2. */
typedef struct completion_record {
    uint32_t *depth;
    uint16_t *routes;
    uint32_t route_stride, max_len;
} completion_record;

void die_parity(const char *what, int status) __attribute__((noreturn));
void spec_from_name(const char *name, spec *out);
void prompt_push(prompt_set *ps, const int32_t *tok, uint32_t len, const char *source);
void fit_prompts(prompt_set *ps, const parity_config *c, uint32_t room);
void free_prompts(prompt_set *ps);
uint32_t max_prompt_len(const prompt_set *ps);
void sampling_for(const run_env *e, float temperature, uint32_t max_new, parity_sampling *sp);
void generate_recorded(const run_env *e, const parity_sampling *sp, rollouts *r,
                       const completion_record *rec);
parity_scorer *make_scorer(const run_env *e, const parity_policy *policy, uint32_t longest);
float *score_rollouts(const run_env *e, parity_scorer *s, const rollouts *r,
                      const uint16_t *routes, uint16_t *routes_out);
job *add_job(job_list *jl, section sec, const spec *sampler, uint32_t split_k,
             uint32_t split_kv, const char *learner_name, const parity_policy *learner);
const char *source_root(void);

/* mismatch-moe.c */
void run_moe(bench *b);
void free_moe(bench *b);

/* mismatch-report.c */
int print_report(const bench *b);  /* 1 if a check that must hold failed */
void write_json(const bench *b, const char *path);
void write_csv(const bench *b, const char *path);
void write_svgs(const bench *b, const char *dir);

#endif
