/* The output of parity-mismatch: the text report on stdout, --json, --csv and --svg, and the
 * checks that fail the run. Every figure comes from the jobs' metrics (parity-mismatch.c,
 * mismatch-moe.c); growth figures are computed here from the long run's log-probs, per
 * position bucket and prefix length. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mismatch.h"
#include "svg.h"

/* ---------------------------------------------------------------------------------------- */
/* Growth: bucketed positions, prefix lengths                                               */
/* ---------------------------------------------------------------------------------------- */

static const uint32_t bucket_lo[] = {0, 16, 64, 256, 1024};
static const uint32_t bucket_hi[] = {15, 63, 255, 1023, UINT32_MAX};
#define N_BUCKETS 5
#define MAX_LENGTHS 8

/* Prefix lengths of the growth run: 16, 32, 64, ... up to its length, and its length. */
static int growth_lengths(const bench *b, uint32_t out[MAX_LENGTHS]) {
    int n = 0;
    for (uint32_t len = 16; len < b->growth_tokens && n < MAX_LENGTHS - 1; len *= 2) out[n++] = len;
    if (b->growth_tokens) out[n++] = b->growth_tokens;
    return n;
}

static uint32_t longest_completion(const rollouts *r) {
    uint32_t m = 0;
    for (size_t c = 0; c < r->n_seqs; c++)
        if (r->gen_off[c + 1] - r->gen_off[c] > m)
            m = (uint32_t)(r->gen_off[c + 1] - r->gen_off[c]);
    return m;
}

/* Completions with at least `len` generated tokens. */
static size_t completions_reaching(const rollouts *r, uint32_t len) {
    size_t n = 0;
    for (size_t c = 0; c < r->n_seqs; c++) n += r->gen_off[c + 1] - r->gen_off[c] >= len;
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* Text report                                                                              */
/* ---------------------------------------------------------------------------------------- */

static void fmt_num(char *out, size_t size, double v) {
    if (!isfinite(v)) snprintf(out, size, "-");
    else if (v == 0) snprintf(out, size, "0");
    else snprintf(out, size, "%.2e", v);
}

static void fmt_greedy(char *out, size_t size, const greedy_cmp *g) {
    if (!g->measured) snprintf(out, size, "-");
    else if (!g->differing) snprintf(out, size, "none");
    else snprintf(out, size, "%.0f (min %.0f, %zu/%zu)", g->first_mean, g->first_min, g->differing,
                  g->prompts);
}

static void pair_label(const job *j, char *out, size_t size) {
    if (strcmp(j->order, "same"))
        snprintf(out, size, "%s [%s] -> %s", j->sampler, j->order, j->learner);
    else snprintf(out, size, "%s -> %s", j->sampler, j->learner);
}

static void print_table_header(int width) {
    printf("  %-*s %6s %8s %8s %8s %9s %8s %8s %8s %6s %8s %7s %8s %8s  %s\n", width, "pair",
           "tokens", "mean|d|", "p99|d|", "max|d|", "bias", "k3 KL", "ratio", "r std", "out",
           "r max", "equal", "seq|S|", "max|S|", "greedy 1st diff");
}

static void print_job_row(const job *j, int width, const char *extra) {
    char label[256], v[10][24], g[64];
    pair_label(j, label, sizeof label);
    const metrics *m = &j->m;
    const double vals[10] = {m->mean_abs, m->p99_abs, m->max_abs, m->bias, m->k3,
                             m->ratio_std, m->seq_mean_abs, m->seq_max_abs};
    for (int i = 0; i < 8; i++) fmt_num(v[i], sizeof v[i], vals[i]);
    snprintf(v[8], sizeof v[8], "%.1f%%", 100 * m->ratio_outside);
    snprintf(v[9], sizeof v[9], "%.1f%%", 100 * m->equal_frac);
    fmt_greedy(g, sizeof g, &j->g);
    printf("  %-*s %6zu %8s %8s %8s %9s %8s %8.4f %8s %6s %8.4f %7s %8s %8s  %s%s\n", width, label,
           m->tokens, v[0], v[1], v[2], v[3], v[4], m->ratio_mean, v[5], v[8], m->ratio_max, v[9],
           v[6], v[7], g, extra ? extra : "");
}

static int label_width(const bench *b, section sec) {
    int w = 10;
    for (size_t i = 0; i < b->jobs.n; i++) {
        if (b->jobs.v[i].sec != sec) continue;
        char label[256];
        pair_label(&b->jobs.v[i], label, sizeof label);
        if ((int)strlen(label) > w) w = (int)strlen(label);
    }
    return w;
}

static void print_section_table(const bench *b, section sec) {
    int w = label_width(b, sec);
    print_table_header(w);
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec != sec) continue;
        char extra[96] = "";
        if (sec == SEC_HEADLINE) snprintf(extra, sizeof extra, "   (%s)", j->note);
        if (sec == SEC_MOE)
            snprintf(extra, sizeof extra, "   (%s)", b->moe[j->moe.model].name);
        print_job_row(j, w, extra);
    }
}

static void print_legend(void) {
    printf("Legend (over generated tokens; r = logp_learner - logp_sampler, a token's log "
           "importance ratio):\n"
           "  mean|d| p99|d| max|d|  mean, 99th percentile (nearest rank) and max of |r|\n"
           "  bias      mean of r (signed: a systematic shift, not noise)\n"
           "  k3 KL     mean of exp(r) - r - 1 (k3 estimator of KL(sampler || learner))\n"
           "  ratio, r std, r max   mean, std and max of the importance ratio exp(r)\n"
           "  out       fraction of tokens with exp(r) outside [0.8, 1.2]\n"
           "  equal     fraction of tokens whose two log-probs are bitwise equal\n"
           "  seq|S| max|S|  S = sum of r over a completion: mean and max of |S| over "
           "completions\n"
           "  greedy 1st diff  first position where greedy decoding under the sampler's "
           "configuration and\n"
           "            under the learner's policy diverge: mean (min, prompts that differ / "
           "prompts); none = never\n"
           "  [split_k=K] the sampler's decode GEMMs sum K in K chunks; [split_kv=N] its decode "
           "attention runs\n"
           "            in segments of N positions merged in order (flash-decoding); the "
           "learner keeps one order\n\n");
}

static void print_equivalences(const bench *b) {
    int any = 0;
    for (size_t i = 0; i < b->learners.n; i++)
        for (size_t k = i + 1; k < b->learners.n; k++)
            if (same_policy(&b->learners.v[i].policy, &b->learners.v[k].policy)) {
                if (!any) printf("Identical policies (same switches):");
                printf(" %s = %s;", b->learners.v[i].name, b->learners.v[k].name);
                any = 1;
            }
    if (any) printf("\n");
    if (b->o.temperature == 1.0f)
        printf("At temperature 1 the temperature switch has no effect (bf16 logits / 1 is "
               "exact).\n");
    printf("\n");
}

/* The value of the matrix pair (sampler s, order, learner l), or NULL. */
static const job *find_matrix_job(const bench *b, const char *s, const char *order,
                                  const char *l) {
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec == SEC_MATRIX && !strcmp(j->sampler, s) && !strcmp(j->order, order) &&
            !strcmp(j->learner, l))
            return j;
    }
    return NULL;
}

typedef enum grid_value { GRID_K3, GRID_MEAN_ABS, GRID_EQUAL, GRID_GREEDY } grid_value;

static void grid_cell(const job *j, grid_value what, char *out, size_t size) {
    if (!j) snprintf(out, size, "-");
    else if (what == GRID_K3) fmt_num(out, size, j->m.k3);
    else if (what == GRID_MEAN_ABS) fmt_num(out, size, j->m.mean_abs);
    else if (what == GRID_EQUAL) snprintf(out, size, "%.3f", j->m.equal_frac);
    else if (!j->g.differing) snprintf(out, size, "none");
    else snprintf(out, size, "%.0f", j->g.first_mean);
}

static void print_grid(const bench *b, grid_value what, const char *title) {
    uint32_t k[4], kv[4];
    int n_orders = kernel_orders(&b->o, k, kv);
    printf("%s (rows: sampler [kernel order]; columns: learner)\n", title);
    printf("  %-30s", "sampler \\ learner");
    for (size_t l = 0; l < b->learners.n; l++) {
        int w = (int)strlen(b->learners.v[l].name);
        printf(" %*s", w > 9 ? w : 9, b->learners.v[l].name);
    }
    printf("\n");
    for (size_t s = 0; s < b->samplers.n; s++)
        for (int ord = 0; ord < n_orders; ord++) {
            char order[ORDER_MAX_LEN], row[160];
            describe_order(k[ord], kv[ord], order);
            if (!find_matrix_job(b, b->samplers.v[s].name, order, b->learners.v[0].name)) continue;
            if (ord) snprintf(row, sizeof row, "%s [%s]", b->samplers.v[s].name, order);
            else snprintf(row, sizeof row, "%s", b->samplers.v[s].name);
            printf("  %-30s", row);
            for (size_t l = 0; l < b->learners.n; l++) {
                int w = (int)strlen(b->learners.v[l].name);
                char cell[32];
                grid_cell(find_matrix_job(b, b->samplers.v[s].name, order, b->learners.v[l].name),
                          what, cell, sizeof cell);
                printf(" %*s", w > 9 ? w : 9, cell);
            }
            printf("\n");
        }
    printf("\n");
}

static const job *ablation_base(const bench *b) {
    for (size_t i = 0; i < b->jobs.n; i++)
        if (b->jobs.v[i].sec == SEC_ABLATION) return &b->jobs.v[i];
    return NULL;
}

static double share(double part, double whole) { return whole > 0 ? part / whole : NAN; }

static void print_ablation(const bench *b) {
    const job *base = ablation_base(b);
    if (!base) return;
    printf("== Region ablation: sampler %s, learner %s copying the sampler's switches of the "
           "listed regions ==\n", b->ablation_s.name, b->ablation_l.name);
    printf("   (norm = residual+RMSNorm: norm_input, norm_weight, qk_norm; rope = rope_table, "
           "rope_apply; swiglu;\n    attn = attention; logits = logits, temperature, compute; "
           "the last row equals the sampler)\n");
    printf("  %-28s %9s %7s %9s %7s %9s %9s %9s %7s %9s\n", "regions aligned", "mean|d|",
           "share", "k3 KL", "share", "p99|d|", "max|d|", "bias", "equal", "seq|S|");
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec != SEC_ABLATION) continue;
        const double vals[6] = {j->m.mean_abs, j->m.k3, j->m.p99_abs, j->m.max_abs, j->m.bias,
                                j->m.seq_mean_abs};
        char v[6][24];
        for (int k = 0; k < 6; k++) fmt_num(v[k], sizeof v[k], vals[k]);
        printf("  %-28s %9s %6.1f%% %9s %6.1f%% %9s %9s %9s %6.1f%% %9s\n", j->regions, v[0],
               100 * share(j->m.mean_abs, base->m.mean_abs), v[1], 100 * share(j->m.k3, base->m.k3),
               v[2], v[3], v[4], 100 * j->m.equal_frac, v[5]);
    }
    printf("   share = the row's value as a fraction of the unaligned row's (the mismatch that "
           "remains)\n\n");
}

static void print_growth(const bench *b) {
    printf("== Growth: sampler %s, %zu prompts x %u completions x %u tokens ==\n",
           b->ablation_s.name, b->growth_prompts.n, b->o.growth_n, b->growth_tokens);
    printf("  mean |d| by position in the completion (k3 KL in brackets)\n");
    printf("  %-48s", "pair");
    for (int k = 0; k < N_BUCKETS; k++) {
        if (bucket_lo[k] >= b->growth_tokens) break;
        char h[32];
        if (bucket_hi[k] == UINT32_MAX) snprintf(h, sizeof h, "%u+", bucket_lo[k]);
        else snprintf(h, sizeof h, "%u-%u", bucket_lo[k], bucket_hi[k]);
        printf(" %20s", h);
    }
    printf("\n");
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec != SEC_GROWTH) continue;
        char label[256];
        pair_label(j, label, sizeof label);
        printf("  %-48s", label);
        for (int k = 0; k < N_BUCKETS; k++) {
            if (bucket_lo[k] >= b->growth_tokens) break;
            metrics m;
            compute_metrics(j->ro, j->learner_lp, bucket_lo[k], bucket_hi[k], &m);
            char a[24], c[24], cell[64];
            fmt_num(a, sizeof a, m.mean_abs);
            fmt_num(c, sizeof c, m.k3);
            snprintf(cell, sizeof cell, "%s [%s]", a, c);
            printf(" %20s", cell);
        }
        printf("\n");
    }
    printf("  mean |S| (sequence log-ratio) of the first L tokens of each completion\n");
    uint32_t lengths[MAX_LENGTHS];
    int n_lengths = growth_lengths(b, lengths);
    printf("  %-48s", "pair");
    for (int k = 0; k < n_lengths; k++) printf(" %8u", lengths[k]);
    printf("\n");
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec != SEC_GROWTH) continue;
        char label[256];
        pair_label(j, label, sizeof label);
        printf("  %-48s", label);
        for (int k = 0; k < n_lengths; k++) {
            metrics m;
            compute_metrics(j->ro, j->learner_lp, 0, lengths[k] - 1, &m);
            char a[24];
            fmt_num(a, sizeof a, m.seq_mean_abs);
            printf(" %8s", a);
        }
        printf("\n");
    }
    printf("\n");
}

/* Acceptance checks: equal policies with one kernel order agree bitwise; the mismatched pair
 * does not. Mixture of experts: a learner of the sampler's policy routes every position as the
 * sampler did and returns its log-probs bitwise, recomputing or replaying; every replaying
 * learner ran the sampler's experts. */
typedef struct acceptance {
    int equal_pairs_exact, equal_pairs_seen, mismatched_nonzero;
    int kernel_order_seen, kernel_order_effective;
    int moe_equal_exact, moe_equal_seen, moe_replay_followed, moe_replay_seen;
} acceptance;

static acceptance check_acceptance(const bench *b) {
    acceptance a = {1, 0, 0, 0, 0, 1, 0, 1, 0};
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec == SEC_LOOPED) continue; /* its learners differ in depth, not in policy */
        if (j->sec == SEC_MOE) {
            if (j->moe.replay) {
                a.moe_replay_seen++;
                if (j->moe.differing) a.moe_replay_followed = 0;
            }
            if (!same_policy(&j->sv.policy, &j->learner_policy)) continue;
            a.moe_equal_seen++;
            if (j->moe.differing || j->m.mean_abs != 0 || j->m.equal != j->m.tokens)
                a.moe_equal_exact = 0;
            continue;
        }
        int same = same_policy(&j->sv.policy, &j->learner_policy);
        if (same && !strcmp(j->order, "same")) {
            a.equal_pairs_seen++;
            if (j->m.mean_abs != 0 || j->m.equal != j->m.tokens) a.equal_pairs_exact = 0;
        }
        if (same && strcmp(j->order, "same")) {
            a.kernel_order_seen = 1;
            if (j->m.equal != j->m.tokens) a.kernel_order_effective = 1;
        }
        if (j->sec == SEC_HEADLINE && !strcmp(j->sampler, b->ablation_s.name) &&
            !strcmp(j->learner, b->ablation_l.name) && !strcmp(j->order, "same"))
            a.mismatched_nonzero = j->m.mean_abs > 0;
    }
    return a;
}

/* "1.2%", or "-" for no value. */
static void fmt_share(char *out, size_t size, size_t part, size_t whole) {
    if (whole) snprintf(out, size, "%.1f%%", 100.0 * (double)part / (double)whole);
    else snprintf(out, size, "-");
}

/* A mixture-of-experts job's pair with the other way of routing (replay or not), or NULL. */
static const job *moe_partner(const bench *b, const job *j) {
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *o = &b->jobs.v[i];
        if (o->sec == SEC_MOE && o->moe.model == j->moe.model && o->moe.replay != j->moe.replay &&
            !strcmp(o->sampler, j->sampler) && same_policy(&o->learner_policy, &j->learner_policy))
            return o;
    }
    return NULL;
}

/* The learner's policy name without the " replay" a replaying job's learner carries. */
static void moe_learner_name(const job *j, char *out, size_t size) {
    size_t n = strlen(j->learner);
    if (j->moe.replay && n > 7 && !strcmp(j->learner + n - 7, " replay")) n -= 7;
    snprintf(out, size, "%.*s", (int)n, j->learner);
}

static void print_moe_metrics(const metrics *m) {
    char v[3][24];
    fmt_num(v[0], sizeof v[0], m->mean_abs);
    fmt_num(v[1], sizeof v[1], m->max_abs);
    fmt_num(v[2], sizeof v[2], m->k3);
    printf("  %8s %8s %8s %6.1f%%", v[0], v[1], v[2], 100 * m->equal_frac);
}

/* One table per MoE model: a row per pair, routing and log-prob mismatch recomputed, then the
 * log-prob mismatch with the sampler's routes replayed. */
static void print_moe(const bench *b) {
    if (!b->n_moe) return;
    printf("== Mixture of experts: a sampler recording its routes; the learner routing every "
           "position itself (recompute) or replaying the record ==\n");
    int w = 10;
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        char learner[NAME_MAX_LEN], label[2 * NAME_MAX_LEN + 8];
        if (j->sec != SEC_MOE || j->moe.replay) continue;
        moe_learner_name(j, learner, sizeof learner);
        snprintf(label, sizeof label, "%s -> %s", j->sampler, learner);
        if ((int)strlen(label) > w) w = (int)strlen(label);
    }
    for (size_t m = 0; m < b->n_moe; m++) {
        const moe_model *mm = &b->moe[m];
        printf("  %s (%s): %u experts, top-%u, %u sparse layers; %zu prompts x %u completions x "
               "%u tokens\n  expert load in %s's routes: %.1f%% .. %.1f%% of a layer's choices "
               "(uniform %.1f%%)\n", mm->name, mm->arch, mm->experts, mm->top_k,
               mm->sparse_layers, mm->prompts.n, b->o.n, b->o.max_tokens, mm->load_sampler,
               100 * mm->load_min, 100 * mm->load_max, 100.0 / mm->experts);
        printf("  %-*s  %-19s  %-40s  %s\n", w, "", "routes differ", "recompute", "replay");
        printf("  %-*s %9s %9s  %8s %8s %8s %7s  %8s %8s %8s %7s\n", w, "pair", "decisions",
               "positions", "mean|d|", "max|d|", "k3 KL", "equal", "mean|d|", "max|d|", "k3 KL",
               "equal");
        for (size_t i = 0; i < b->jobs.n; i++) {
            const job *j = &b->jobs.v[i];
            if (j->sec != SEC_MOE || j->moe.model != m || j->moe.replay) continue;
            const job *r = moe_partner(b, j);
            char label[2 * NAME_MAX_LEN + 8], dec[16], pos[16];
            snprintf(label, sizeof label, "%s -> %s", j->sampler, j->learner);
            fmt_share(dec, sizeof dec, j->moe.differing, j->moe.decisions);
            fmt_share(pos, sizeof pos, j->moe.positions_differing, j->moe.positions);
            printf("  %-*s %9s %9s", w, label, dec, pos);
            print_moe_metrics(&j->m);
            if (r) print_moe_metrics(&r->m);
            printf("\n");
        }
    }
    printf("   routes differ: of the (position, sparse layer) routing decisions, and of the "
           "positions, those where\n   the learner's own routing chose another expert set "
           "than the sampler's record; positions = those\n   whose outputs give the generated "
           "tokens' log-probs. replay: the learner runs the sampler's experts,\n   weighting "
           "them from its own router logits under its policy\n");
    if (b->o.full_tables) {
        print_section_table(b, SEC_MOE);
    }
    printf("\n");
}

int print_report(const bench *b) {
    const parity_config *c = parity_model_config(b->model);
    printf("parity-mismatch: libparity %s, CPU path %s, %u threads, backend %s\n",
           parity_version(), parity_cpu_path_name(parity_get_cpu_path()), b->o.threads,
           parity_backend_name((int)b->o.backend));
    printf("model %s (vocab %u, hidden %u, %u layers)\n", b->model_spec, c->vocab_size,
           c->hidden_size, c->num_hidden_layers);
    printf("rollouts: %zu prompts x %u completions x %u tokens; temperature %g, top-p %g, seed "
           "%llu, log-probs %s; greedy runs of %u tokens\n\n", b->prompts.n, b->o.n,
           b->o.max_tokens, b->o.temperature, b->o.top_p, b->o.seed,
           parity_logprob_mode_name((int)b->o.mode),
           b->o.greedy_tokens);
    print_legend();
    print_equivalences(b);
    if (b->has_ablation) {
        printf("== Headline: sampler %s; learner %s (mismatched) vs learners aligned to it ==\n",
               b->ablation_s.name, b->ablation_l.name);
        print_section_table(b, SEC_HEADLINE);
        printf("\n");
    }
    if (b->samplers.n && b->learners.n) {
        printf("== Matrix ==\n");
        print_grid(b, GRID_K3, "mean k3 KL");
        print_grid(b, GRID_MEAN_ABS, "mean |d logp|");
        print_grid(b, GRID_EQUAL, "bitwise-equal fraction");
        if (b->o.greedy_tokens) {
            char title[160];
            snprintf(title, sizeof title, "greedy first differing position (mean over prompts; "
                     "none = not within %u tokens)", b->o.greedy_tokens);
            print_grid(b, GRID_GREEDY, title);
        }
        if (b->o.full_tables) {
            print_section_table(b, SEC_MATRIX);
            printf("\n");
        }
    }
    if (b->has_ablation) print_ablation(b);
    if (b->has_ablation && b->growth_tokens) print_growth(b);
    {
        int any = 0;
        for (size_t i = 0; i < b->jobs.n; i++) any |= b->jobs.v[i].sec == SEC_LOOPED;
        if (any) {
            printf("== Looped model: an early-exit sampler (threshold %g on the exit CDF, K/V "
                   "last-exited) against learners ==\n", (double)b->o.exit_threshold);
            const int w = label_width(b, SEC_LOOPED);
            print_table_header(w);
            for (size_t i = 0; i < b->jobs.n; i++) {
                const job *j = &b->jobs.v[i];
                if (j->sec != SEC_LOOPED) continue;
                char extra[96];
                snprintf(extra, sizeof extra, "   (%s)", j->note);
                print_job_row(j, w, extra);
            }
            printf("\n");
        }
    }
    print_moe(b);
    acceptance a = check_acceptance(b);
    printf("Checks: equal policies, same kernels -> bitwise equal: %s (%d pairs)",
           a.equal_pairs_exact ? "yes" : "NO", a.equal_pairs_seen);
    if (b->has_ablation)
        printf("; %s -> %s nonzero: %s", b->ablation_s.name, b->ablation_l.name,
               a.mismatched_nonzero ? "yes" : "NO");
    if (a.kernel_order_seen)
        printf("; kernel-order switches change log-probs: %s",
               a.kernel_order_effective ? "yes" : "no (does the library ignore them?)");
    if (a.moe_equal_seen || a.moe_replay_seen)
        printf("; MoE, equal policies -> same routes and bitwise equal, recomputed and "
               "replayed: %s (%d rows); replays ran the sampler's experts: %s (%d rows)",
               a.moe_equal_exact ? "yes" : "NO", a.moe_equal_seen,
               a.moe_replay_followed ? "yes" : "NO", a.moe_replay_seen);
    printf("\n");
    printf("Wall time %.1f s\n", b->elapsed);
    const int failed = !a.equal_pairs_exact || !a.moe_equal_exact || !a.moe_replay_followed;
    if (failed) printf("A check that must hold failed: the run exits with status 1.\n");
    return failed;
}

/* ---------------------------------------------------------------------------------------- */
/* JSON                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.9g", v);
    else fputs("null", f);
}

static void json_key_num(FILE *f, const char *key, double v) {
    fprintf(f, ", \"%s\": ", key);
    json_num(f, v);
}

static void json_policy(FILE *f, const parity_policy *p) {
    fprintf(f, "{\"compute\": %u, \"norm_input\": %u, \"norm_weight\": %u, \"qk_norm\": %u, "
               "\"rope_table\": %u, \"rope_apply\": %u, \"swiglu\": %u, \"attention\": %u, "
               "\"logits\": %u, \"temperature\": %u}",
            p->compute, p->norm_input, p->norm_weight, p->qk_norm, p->rope_table, p->rope_apply,
            p->swiglu, p->attention, p->logits, p->temperature);
}

static void json_metrics(FILE *f, const metrics *m) {
    fprintf(f, ", \"tokens\": %zu, \"nonfinite_tokens\": %zu", m->tokens, m->nonfinite);
    json_key_num(f, "mean_abs_dlogp", m->mean_abs);
    json_key_num(f, "p99_abs_dlogp", m->p99_abs);
    json_key_num(f, "max_abs_dlogp", m->max_abs);
    json_key_num(f, "mean_dlogp", m->bias);
    json_key_num(f, "k3_kl_mean", m->k3);
    json_key_num(f, "ratio_mean", m->ratio_mean);
    json_key_num(f, "ratio_std", m->ratio_std);
    json_key_num(f, "ratio_outside_0.8_1.2", m->ratio_outside);
    json_key_num(f, "ratio_max", m->ratio_max);
    json_key_num(f, "bitwise_equal_fraction", m->equal_frac);
    fprintf(f, ", \"completions\": %zu", m->seqs);
    json_key_num(f, "seq_logratio_mean_abs", m->seq_mean_abs);
    json_key_num(f, "seq_logratio_max_abs", m->seq_max_abs);
}

/* A pair's object without its closing brace, so that a section can add fields. */
static void json_job_fields(FILE *f, const job *j) {
    fputs("{\"sampler\": ", f);
    json_str(f, j->sampler);
    fputs(", \"learner\": ", f);
    json_str(f, j->learner);
    fputs(", \"kernel_order\": ", f);
    json_str(f, j->order);
    fprintf(f, ", \"same_policy\": %s",
            same_policy(&j->sv.policy, &j->learner_policy) ? "true" : "false");
    if (j->sec == SEC_ABLATION) {
        fputs(", \"aligned_regions\": ", f);
        json_str(f, j->regions);
    }
    if (j->sec == SEC_HEADLINE || j->sec == SEC_LOOPED || j->sec == SEC_MOE) {
        fputs(", \"note\": ", f);
        json_str(f, j->note);
    }
    fputs(", \"learner_policy\": ", f);
    json_policy(f, &j->learner_policy);
    json_metrics(f, &j->m);
    if (j->g.measured) {
        fprintf(f, ", \"greedy_prompts\": %zu, \"greedy_prompts_differing\": %zu, "
                   "\"greedy_tokens\": %u", j->g.prompts, j->g.differing, j->g.length);
        json_key_num(f, "greedy_first_diff_mean", j->g.first_mean);
        json_key_num(f, "greedy_first_diff_min", j->g.first_min);
        fputs(", \"greedy_first_diff\": ", f);
        if (j->g.differing) json_num(f, j->g.first_mean);
        else json_str(f, "none");
    }
}

/* A mixture-of-experts row's model and routing figures. */
static void json_moe_fields(FILE *f, const bench *b, const job *j) {
    fputs(", \"model\": ", f);
    json_str(f, b->moe[j->moe.model].spec);
    fprintf(f, ", \"routing_replayed\": %s, \"route_decisions\": %zu, "
               "\"route_decisions_differing\": %zu, \"route_positions\": %zu, "
               "\"route_positions_differing\": %zu", j->moe.replay ? "true" : "false",
            j->moe.decisions, j->moe.differing, j->moe.positions, j->moe.positions_differing);
    json_key_num(f, "route_decisions_differing_fraction",
                 share((double)j->moe.differing, (double)j->moe.decisions));
    json_key_num(f, "route_positions_differing_fraction",
                 share((double)j->moe.positions_differing, (double)j->moe.positions));
}

/* The MoE section's models. */
static void json_moe_models(FILE *f, const bench *b) {
    fputs(",\n\"moe_models\": [", f);
    for (size_t m = 0; m < b->n_moe; m++) {
        const moe_model *mm = &b->moe[m];
        fputs(m ? ",\n  {\"model\": " : "\n  {\"model\": ", f);
        json_str(f, mm->spec);
        fputs(", \"arch\": ", f);
        json_str(f, mm->arch);
        fprintf(f, ", \"experts\": %u, \"top_k\": %u, \"sparse_layers\": %u, \"prompts\": %zu",
                mm->experts, mm->top_k, mm->sparse_layers, mm->prompts.n);
        fputs(", \"expert_load_sampler\": ", f);
        json_str(f, mm->load_sampler);
        json_key_num(f, "expert_load_min_share", mm->load_min);
        json_key_num(f, "expert_load_max_share", mm->load_max);
        fputs("}", f);
    }
    fputs("]", f);
}

static void json_jobs(FILE *f, const bench *b, const char *key, section sec) {
    fprintf(f, ",\n\"%s\": [", key);
    int first = 1;
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec != sec) continue;
        fputs(first ? "\n  " : ",\n  ", f);
        json_job_fields(f, j);
        if (sec == SEC_MOE) json_moe_fields(f, b, j);
        if (sec == SEC_ABLATION) {
            const job *base = ablation_base(b);
            json_key_num(f, "share_of_baseline_mean_abs", share(j->m.mean_abs, base->m.mean_abs));
            json_key_num(f, "share_of_baseline_k3", share(j->m.k3, base->m.k3));
        }
        fputc('}', f);
        first = 0;
    }
    fputs("]", f);
}

static void json_growth(FILE *f, const bench *b) {
    fputs(",\n\"growth\": [", f);
    int first = 1;
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec != SEC_GROWTH) continue;
        for (int k = 0; k < N_BUCKETS && bucket_lo[k] < b->growth_tokens; k++) {
            metrics m;
            compute_metrics(j->ro, j->learner_lp, bucket_lo[k], bucket_hi[k], &m);
            fputs(first ? "\n  {\"sampler\": " : ",\n  {\"sampler\": ", f);
            first = 0;
            json_str(f, j->sampler);
            fputs(", \"learner\": ", f);
            json_str(f, j->learner);
            fputs(", \"kernel_order\": ", f);
            json_str(f, j->order);
            fprintf(f, ", \"position_lo\": %u, \"position_hi\": ", bucket_lo[k]);
            if (bucket_hi[k] == UINT32_MAX) fputs("null", f);
            else fprintf(f, "%u", bucket_hi[k]);
            json_metrics(f, &m);
            fputc('}', f);
        }
    }
    fputs("],\n\"growth_by_length\": [", f);
    uint32_t lengths[MAX_LENGTHS];
    int n_lengths = growth_lengths(b, lengths);
    first = 1;
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec != SEC_GROWTH) continue;
        for (int k = 0; k < n_lengths; k++) {
            metrics m;
            compute_metrics(j->ro, j->learner_lp, 0, lengths[k] - 1, &m);
            fputs(first ? "\n  {\"sampler\": " : ",\n  {\"sampler\": ", f);
            first = 0;
            json_str(f, j->sampler);
            fputs(", \"learner\": ", f);
            json_str(f, j->learner);
            fputs(", \"kernel_order\": ", f);
            json_str(f, j->order);
            fprintf(f, ", \"length\": %u, \"completions_reaching\": %zu", lengths[k],
                    completions_reaching(j->ro, lengths[k]));
            json_metrics(f, &m);
            fputc('}', f);
        }
    }
    fputs("]", f);
}

static void json_spec_list(FILE *f, const char *key, const spec_list *l) {
    fprintf(f, ", \"%s\": [", key);
    for (size_t i = 0; i < l->n; i++) {
        if (i) fputs(", ", f);
        json_str(f, l->v[i].name);
    }
    fputc(']', f);
}

static void json_policies(FILE *f, const bench *b) {
    fputs(", \"policy_switches\": {", f);
    const spec_list *lists[] = {&b->samplers, &b->learners};
    int first = 1;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < lists[k]->n; i++) {
            if (k == 1 && find_spec(&b->samplers, lists[k]->v[i].name)) continue;
            fputs(first ? "" : ", ", f);
            first = 0;
            json_str(f, lists[k]->v[i].name);
            fputs(": ", f);
            json_policy(f, &lists[k]->v[i].policy);
        }
    fputc('}', f);
}

static void json_prompts(FILE *f, const prompt_set *ps) {
    fputs("[", f);
    for (size_t i = 0; i < ps->n; i++) {
        fprintf(f, "%s{\"source\": ", i ? ", " : "");
        json_str(f, ps->source[i]);
        fprintf(f, ", \"tokens\": %u}", ps->len[i]);
    }
    fputs("]", f);
}

static void json_config(FILE *f, const bench *b) {
    const parity_config *c = parity_model_config(b->model);
    fputs("\"config\": {\"model\": ", f);
    json_str(f, b->model_spec);
    fprintf(f, ", \"model_config\": {\"arch\": %u, \"vocab_size\": %u, \"hidden_size\": %u, "
               "\"intermediate_size\": %u, \"num_hidden_layers\": %u, \"num_attention_heads\": %u, "
               "\"num_key_value_heads\": %u, \"head_dim\": %u, \"max_position_embeddings\": %u}",
            c->arch, c->vocab_size, c->hidden_size, c->intermediate_size, c->num_hidden_layers,
            c->num_attention_heads, c->num_key_value_heads, c->head_dim,
            c->max_position_embeddings);
    fputs(", \"build\": ", f);
    json_str(f, parity_version());
    fputs(", \"compiler\": ", f);
    json_str(f, __VERSION__);
    fputs(", \"cpu_path\": ", f);
    json_str(f, parity_cpu_path_name(parity_get_cpu_path()));
    fprintf(f, ", \"threads\": %u, \"lib_threads\": %u, \"threading\": \"%u workers on "
               "independent tasks, each sampler/scorer with %u pool thread(s)\", "
               "\"backend\": \"%s\"",
            b->o.threads, b->o.lib_threads, b->o.threads, b->o.lib_threads,
            parity_backend_name((int)b->o.backend));
    json_spec_list(f, "sampler_policies", &b->samplers);
    json_spec_list(f, "learner_policies", &b->learners);
    json_spec_list(f, "kernel_order_samplers", &b->kernel);
    json_policies(f, b);
    fprintf(f, ", \"completions_per_prompt\": %u, \"max_tokens\": %u, \"greedy_tokens\": %u",
            b->o.n, b->o.max_tokens, b->o.greedy_tokens);
    json_key_num(f, "temperature", b->o.temperature);
    json_key_num(f, "top_p", b->o.top_p);
    fprintf(f, ", \"seed\": %llu, \"logprob_mode\": \"%s\", \"split_k\": %u, \"split_kv\": %u",
            b->o.seed, parity_logprob_mode_name((int)b->o.mode), b->o.split_k, b->o.split_kv);
    fputs(", \"ablation\": ", f);
    if (b->has_ablation) {
        fputs("{\"sampler\": ", f);
        json_str(f, b->ablation_s.name);
        fputs(", \"learner\": ", f);
        json_str(f, b->ablation_l.name);
        fputs("}", f);
    } else {
        fputs("null", f);
    }
    fprintf(f, ", \"growth_tokens\": %u, \"growth_completions_per_prompt\": %u", b->growth_tokens,
            b->o.growth_n);
    fputs(", \"prompts\": ", f);
    json_prompts(f, &b->prompts);
    fputs(", \"growth_prompts\": ", f);
    json_prompts(f, &b->growth_prompts);
    fputs("}", f);
}

static void json_legend(FILE *f) {
    static const char *const legend[][2] = {
        {"r", "logp_learner - logp_sampler of a generated token (log importance ratio)"},
        {"mean_abs_dlogp", "mean of |r| over generated tokens"},
        {"p99_abs_dlogp", "99th percentile of |r| (nearest rank)"},
        {"max_abs_dlogp", "max of |r|"},
        {"mean_dlogp", "mean of r (signed bias)"},
        {"k3_kl_mean", "mean of exp(r) - r - 1"},
        {"ratio_mean", "mean of exp(r)"},
        {"ratio_std", "population standard deviation of exp(r)"},
        {"ratio_outside_0.8_1.2", "fraction of tokens with exp(r) < 0.8 or > 1.2"},
        {"ratio_max", "max of exp(r)"},
        {"bitwise_equal_fraction", "fraction of tokens whose log-probs have equal float bits"},
        {"seq_logratio_mean_abs", "mean over completions of |sum of r over the completion|"},
        {"seq_logratio_max_abs", "max over completions of |sum of r over the completion|"},
        {"greedy_first_diff", "first 0-based completion position where greedy decoding under "
                              "the sampler configuration and under the learner policy differ: "
                              "mean over differing prompts, or \"none\""},
        {"nonfinite_tokens", "tokens where a log-prob is not finite; excluded from the metrics"},
        {"kernel_order", "\"same\", or the sampler's decode kernel-order switches"},
    };
    fputs(",\n\"legend\": {", f);
    for (size_t i = 0; i < sizeof legend / sizeof legend[0]; i++) {
        fputs(i ? ", " : "", f);
        json_str(f, legend[i][0]);
        fputs(": ", f);
        json_str(f, legend[i][1]);
    }
    fputs("}", f);
}

void write_json(const bench *b, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) die("%s: %s", path, strerror(errno));
    fputs("{\n", f);
    json_config(f, b);
    json_legend(f);
    json_jobs(f, b, "headline", SEC_HEADLINE);
    json_jobs(f, b, "pairs", SEC_MATRIX);
    json_jobs(f, b, "ablation", SEC_ABLATION);
    json_growth(f, b);
    json_jobs(f, b, "looped", SEC_LOOPED);
    json_moe_models(f, b);
    json_jobs(f, b, "moe", SEC_MOE);
    acceptance a = check_acceptance(b);
    fprintf(f, ",\n\"checks\": {\"equal_policy_pairs_bitwise_equal\": %s, \"equal_policy_pairs\": "
               "%d, \"mismatched_pair_nonzero\": %s, \"kernel_order_changes_logprobs\": %s, "
               "\"moe_equal_policy_rows_exact\": %s, \"moe_equal_policy_rows\": %d, "
               "\"moe_replays_ran_sampler_routes\": %s, \"moe_replay_rows\": %d}",
            a.equal_pairs_exact ? "true" : "false", a.equal_pairs_seen,
            !b->has_ablation ? "null" : a.mismatched_nonzero ? "true" : "false",
            !a.kernel_order_seen ? "null" : a.kernel_order_effective ? "true" : "false",
            a.moe_equal_exact ? "true" : "false", a.moe_equal_seen,
            a.moe_replay_followed ? "true" : "false", a.moe_replay_seen);
    fprintf(f, ",\n\"elapsed_seconds\": %.3f\n}\n", b->elapsed);
    if (ferror(f) | fclose(f)) die("%s: write error", path);
}

/* ---------------------------------------------------------------------------------------- */
/* CSV                                                                                      */
/* ---------------------------------------------------------------------------------------- */

static const char *const section_names[N_SECTIONS] = {"headline", "pair", "ablation", "growth",
                                                      "looped", "moe"};

static void csv_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, ",%.9g", v);
    else fputs(",", f);
}

static void csv_row(FILE *f, const bench *b, const char *sec, const job *j, const metrics *m,
                    long lo, long hi) {
    fprintf(f, "%s,%s,%s,\"%s\",%s,", sec, j->sampler, j->learner, j->order, j->regions);
    if (lo >= 0) fprintf(f, "%ld", lo);
    fputc(',', f);
    if (hi >= 0) fprintf(f, "%ld", hi);
    fprintf(f, ",%zu,%zu", m->tokens, m->nonfinite);
    double v[] = {m->mean_abs, m->p99_abs, m->max_abs, m->bias, m->k3, m->ratio_mean,
                  m->ratio_std, m->ratio_outside, m->ratio_max, m->equal_frac};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) csv_num(f, v[i]);
    fprintf(f, ",%zu", m->seqs);
    csv_num(f, m->seq_mean_abs);
    csv_num(f, m->seq_max_abs);
    if (j->g.measured && lo < 0) {
        fprintf(f, ",%zu,%zu", j->g.prompts, j->g.differing);
        csv_num(f, j->g.first_mean);
        csv_num(f, j->g.first_min);
    } else {
        fputs(",,,,", f);
    }
    if (j->sec == SEC_MOE)
        fprintf(f, ",%s,%d,%zu,%zu,%zu,%zu", b->moe[j->moe.model].spec, j->moe.replay,
                j->moe.decisions, j->moe.differing, j->moe.positions, j->moe.positions_differing);
    else
        fputs(",,,,,,", f);
    fputc('\n', f);
}

void write_csv(const bench *b, const char *path) {
    uint32_t lengths[MAX_LENGTHS];
    int n_lengths = growth_lengths(b, lengths);
    FILE *f = fopen(path, "w");
    if (!f) die("%s: %s", path, strerror(errno));
    fputs("section,sampler,learner,kernel_order,aligned_regions,position_lo,position_hi,tokens,"
          "nonfinite_tokens,mean_abs_dlogp,p99_abs_dlogp,max_abs_dlogp,mean_dlogp,k3_kl_mean,"
          "ratio_mean,ratio_std,ratio_outside_0.8_1.2,ratio_max,bitwise_equal_fraction,"
          "completions,seq_logratio_mean_abs,seq_logratio_max_abs,greedy_prompts,"
          "greedy_prompts_differing,greedy_first_diff_mean,greedy_first_diff_min,moe_model,"
          "routing_replayed,route_decisions,route_decisions_differing,route_positions,"
          "route_positions_differing\n", f);
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec != SEC_GROWTH) {
            csv_row(f, b, section_names[j->sec], j, &j->m, -1, -1);
            continue;
        }
        for (int k = 0; k < N_BUCKETS && bucket_lo[k] < b->growth_tokens; k++) {
            metrics m;
            compute_metrics(j->ro, j->learner_lp, bucket_lo[k], bucket_hi[k], &m);
            csv_row(f, b, "growth_position", j, &m, bucket_lo[k],
                    bucket_hi[k] == UINT32_MAX ? -1 : (long)bucket_hi[k]);
        }
        for (int k = 0; k < n_lengths; k++) {
            metrics m;
            compute_metrics(j->ro, j->learner_lp, 0, lengths[k] - 1, &m);
            csv_row(f, b, "growth_length", j, &m, 0, (long)lengths[k] - 1);
        }
    }
    if (ferror(f) | fclose(f)) die("%s: write error", path);
}

/* ---------------------------------------------------------------------------------------- */
/* SVG plots                                                                                */
/* ---------------------------------------------------------------------------------------- */

static void svg_path(const char *dir, const char *name, char *out, size_t size) {
    snprintf(out, size, "%s/%s", dir, name);
}

static void check_svg(int rc, const char *path) {
    if (rc) die("%s: %s", path, strerror(errno));
    progress("wrote %s", path);
}

/* DIR/NAME as a line chart. */
static void write_line_chart(const char *dir, const char *name, const char *title,
                             const char *subtitle, svg_axis x, svg_axis y,
                             const svg_series *series, size_t n) {
    char path[1200];
    svg_path(dir, name, path, sizeof path);
    check_svg(svg_line_chart(path, title, subtitle, x, y, series, n), path);
}

/* The first `max` jobs of a section, in order, into sel; returns how many. */
static size_t select_jobs(const bench *b, section sec, const job **sel, size_t max) {
    size_t n = 0;
    for (size_t i = 0; i < b->jobs.n && n < max; i++)
        if (b->jobs.v[i].sec == sec) sel[n++] = &b->jobs.v[i];
    return n;
}

/* Heatmap of mean k3 KL: rows = sampler [kernel order], columns = learners. */
static void plot_heatmap(const bench *b, const char *dir) {
    uint32_t k[4], kv[4];
    int n_orders = kernel_orders(&b->o, k, kv);
    size_t cols = b->learners.n, max_rows = b->samplers.n * 4, rows = 0;
    double *values = xcalloc(max_rows * cols, sizeof *values);
    char **row_labels = xcalloc(max_rows, sizeof *row_labels);
    const char **col_labels = xcalloc(cols, sizeof *col_labels);
    for (size_t l = 0; l < cols; l++) col_labels[l] = b->learners.v[l].name;
    for (size_t s = 0; s < b->samplers.n; s++)
        for (int ord = 0; ord < n_orders; ord++) {
            char order[ORDER_MAX_LEN];
            describe_order(k[ord], kv[ord], order);
            if (!find_matrix_job(b, b->samplers.v[s].name, order, col_labels[0])) continue;
            row_labels[rows] = xcalloc(NAME_MAX_LEN + ORDER_MAX_LEN + 4, 1);
            if (ord) snprintf(row_labels[rows], NAME_MAX_LEN + ORDER_MAX_LEN + 4, "%s [%s]",
                              b->samplers.v[s].name, order);
            else snprintf(row_labels[rows], NAME_MAX_LEN + ORDER_MAX_LEN + 4, "%s",
                          b->samplers.v[s].name);
            for (size_t l = 0; l < cols; l++) {
                const job *j = find_matrix_job(b, b->samplers.v[s].name, order, col_labels[l]);
                values[rows * cols + l] = j ? j->m.k3 : NAN;
            }
            rows++;
        }
    char subtitle[256], path[1200];
    snprintf(subtitle, sizeof subtitle, "%zu prompts x %u completions x %u tokens, T=%g, "
             "top-p %g; rows with [split_...] use other decode kernels", b->prompts.n, b->o.n,
             b->o.max_tokens, b->o.temperature, b->o.top_p);
    svg_heatmap_spec sp = {"Sampler/learner mismatch: mean k3 KL per token", subtitle,
                           "sampler policy [kernel order]", "learner policy", "mean k3 KL",
                           (const char *const *)row_labels, col_labels, rows, cols, values,
                           NULL};
    svg_path(dir, "heatmap_k3.svg", path, sizeof path);
    check_svg(svg_heatmap(path, &sp), path);
    for (size_t r = 0; r < rows; r++) free(row_labels[r]);
    free(row_labels);
    free(col_labels);
    free(values);
}

/* Histograms of r per headline pair, as fractions of tokens, over a symmetric range that
 * covers 99.9% of every pair's values (the rest clamped into the edge bins). */
static void plot_histograms(const bench *b, const char *dir) {
    enum { BINS = 41, MAX_SERIES = 10 };
    const job *sel[MAX_SERIES];
    size_t n = select_jobs(b, SEC_HEADLINE, sel, MAX_SERIES);
    if (!n) return;
    double range = 0;
    for (size_t s = 0; s < n; s++) range = fmax(range, sel[s]->m.p99_abs * 1.5);
    for (size_t s = 0; s < n; s++) range = fmax(range, fmin(sel[s]->m.max_abs, 2 * range));
    if (!(range > 0)) range = 1e-3;
    double width = 2 * range / BINS, edges[BINS];
    for (int k = 0; k < BINS; k++) edges[k] = -range + k * width;
    double (*frac)[BINS] = xcalloc(n, sizeof *frac);
    char (*labels)[256] = xcalloc(n, sizeof *labels);
    svg_series series[MAX_SERIES];
    for (size_t s = 0; s < n; s++) {
        const rollouts *r = sel[s]->ro;
        size_t total = r->gen_off[r->n_seqs], used = 0;
        for (size_t t = 0; t < total; t++) {
            double d = (double)sel[s]->learner_lp[t] - (double)r->lp[t];
            if (!isfinite(d)) continue;
            int k = (int)floor((d + range) / width);
            frac[s][k < 0 ? 0 : k >= BINS ? BINS - 1 : k]++;
            used++;
        }
        for (int k = 0; k < BINS; k++) frac[s][k] /= used ? (double)used : 1;
        pair_label(sel[s], labels[s], sizeof labels[s]);
        if (sel[s]->m.equal == sel[s]->m.tokens)
            strncat(labels[s], " (bitwise equal)", sizeof labels[s] - strlen(labels[s]) - 1);
        series[s] = (svg_series){labels[s], edges, frac[s], BINS, 1, range, s >= 4};
    }
    char subtitle[512];
    snprintf(subtitle, sizeof subtitle, "%zu tokens per pair; bin width %.2g; values beyond "
             "+-%.2g in the edge bins", sel[0]->m.tokens, width, range);
    svg_axis x = {"log importance ratio r = logp_learner - logp_sampler", -range, range, 0};
    svg_axis y = {"fraction of tokens", 0, 0, 1};
    write_line_chart(dir, "hist_logratio.svg", "Histogram of log importance ratios per pair",
                     subtitle, x, y, series, n);
    free(frac);
    free(labels);
}

/* Mean |r| against position in the completion (power-of-two bins), one line per growth pair;
 * and mean |S| of the prefix against its length. */
static void plot_growth(const bench *b, const char *dir) {
    enum { MAX_BINS = 16, MAX_SERIES = 8 };
    const job *sel[MAX_SERIES];
    size_t n = select_jobs(b, SEC_GROWTH, sel, MAX_SERIES);
    if (!n) return;
    double xs[MAX_SERIES][MAX_BINS], ys[MAX_SERIES][MAX_BINS];
    double lx[MAX_SERIES][MAX_LENGTHS], ly[MAX_SERIES][MAX_LENGTHS];
    uint32_t lengths[MAX_LENGTHS];
    int n_lengths = growth_lengths(b, lengths);
    char labels[MAX_SERIES][256];
    svg_series pos[MAX_SERIES], len[MAX_SERIES];
    for (size_t s = 0; s < n; s++) {
        uint32_t longest = longest_completion(sel[s]->ro);
        size_t bins = 0;
        for (uint32_t lo = 0, hi = 7; lo < longest && bins < MAX_BINS;
             lo = hi + 1, hi = 2 * hi + 1) {
            metrics m;
            compute_metrics(sel[s]->ro, sel[s]->learner_lp, lo, hi, &m);
            xs[s][bins] = (lo + (hi < longest ? hi : longest - 1)) / 2.0 + 1;
            ys[s][bins++] = m.mean_abs;
        }
        size_t nl = 0;
        for (int k = 0; k < n_lengths && lengths[k] <= longest; k++) {
            metrics m;
            compute_metrics(sel[s]->ro, sel[s]->learner_lp, 0, lengths[k] - 1, &m);
            lx[s][nl] = lengths[k];
            ly[s][nl++] = m.seq_mean_abs;
        }
        pair_label(sel[s], labels[s], sizeof labels[s]);
        pos[s] = (svg_series){labels[s], xs[s], ys[s], bins, 0, 0, s % 2};
        len[s] = (svg_series){labels[s], lx[s], ly[s], nl, 0, 0, s % 2};
    }
    char subtitle[512];
    snprintf(subtitle, sizeof subtitle, "%zu prompts x %u completions x %u tokens, sampler %s",
             b->growth_prompts.n, b->o.growth_n, b->growth_tokens, b->ablation_s.name);
    svg_axis x = {"position in the completion (tokens; bins 0-7, 8-15, 16-31, ...)", 0, 0, 1};
    svg_axis y = {"mean |logp_learner - logp_sampler|", 0, 0, 1};
    write_line_chart(dir, "growth_position.svg", "Mismatch against position in the completion",
                     subtitle, x, y, pos, n);
    svg_axis x2 = {"completion length L (tokens)", 0, 0, 1};
    svg_axis y2 = {"mean |sequence log-ratio over the first L tokens|", 0, 0, 1};
    write_line_chart(dir, "growth_length.svg",
                     "Sequence-level mismatch against completion length", subtitle, x2, y2, len,
                     n);
}

/* The MoE job of model m for the pair of recompute job `pair` (any model), replayed or not. */
static const job *find_moe_job(const bench *b, const job *pair, size_t m, int replay) {
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec == SEC_MOE && j->moe.model == m && j->moe.replay == replay &&
            !strcmp(j->sampler, pair->sampler) &&
            same_policy(&j->learner_policy, &pair->learner_policy))
            return j;
    }
    return NULL;
}

/* Two heatmaps of the MoE section, a row per pair: the fraction of routing decisions that
 * differ (a column per model), and mean |d logp| recomputed and replayed (two per model). */
static void plot_moe(const bench *b, const char *dir) {
    enum { MAX_COLS = 2 * MAX_MOE_MODELS };
    const job **pairs = xcalloc(b->jobs.n, sizeof *pairs);
    size_t rows = 0;
    for (size_t i = 0; i < b->jobs.n; i++) {
        const job *j = &b->jobs.v[i];
        if (j->sec != SEC_MOE || j->moe.replay || j->moe.model) continue;
        pairs[rows++] = j;
    }
    if (!rows) {
        free(pairs);
        return;
    }
    char (*row_text)[2 * NAME_MAX_LEN + 8] = xcalloc(rows, sizeof *row_text);
    const char **row_labels = xcalloc(rows, sizeof *row_labels);
    for (size_t r = 0; r < rows; r++) {
        snprintf(row_text[r], sizeof row_text[r], "%s -> %s", pairs[r]->sampler,
                 pairs[r]->learner);
        row_labels[r] = row_text[r];
    }
    char col_text[MAX_COLS][NAME_MAX_LEN + 16];
    const char *col_labels[MAX_COLS];
    double *routes = xcalloc(rows * b->n_moe, sizeof *routes);
    double *logp = xcalloc(rows * 2 * b->n_moe, sizeof *logp);
    for (size_t m = 0; m < b->n_moe; m++) {
        snprintf(col_text[2 * m], sizeof col_text[0], "%s recompute", b->moe[m].name);
        snprintf(col_text[2 * m + 1], sizeof col_text[0], "%s replay", b->moe[m].name);
        for (size_t r = 0; r < rows; r++) {
            const job *re = find_moe_job(b, pairs[r], m, 0), *rp = find_moe_job(b, pairs[r], m, 1);
            routes[r * b->n_moe + m] =
                re ? share((double)re->moe.differing, (double)re->moe.decisions) : NAN;
            logp[r * 2 * b->n_moe + 2 * m] = re ? re->m.mean_abs : NAN;
            logp[r * 2 * b->n_moe + 2 * m + 1] = rp ? rp->m.mean_abs : NAN;
        }
    }
    for (size_t c = 0; c < 2 * b->n_moe; c++) col_labels[c] = col_text[c];
    const char *model_labels[MAX_MOE_MODELS];
    for (size_t m = 0; m < b->n_moe; m++) model_labels[m] = b->moe[m].name;
    char subtitle[256], path[1200];
    snprintf(subtitle, sizeof subtitle, "%zu prompts x %u completions x %u tokens, T=%g; the "
             "learner routing every position itself", b->prompts.n, b->o.n, b->o.max_tokens,
             b->o.temperature);
    svg_heatmap_spec routes_spec = {"MoE: routing decisions whose expert set differs from the "
                                    "sampler's", subtitle, "sampler -> learner", "model",
                                    "fraction of decisions", row_labels, model_labels, rows,
                                    b->n_moe, routes, "0 (the sampler's routes)"};
    svg_path(dir, "moe_routes.svg", path, sizeof path);
    check_svg(svg_heatmap(path, &routes_spec), path);
    snprintf(subtitle, sizeof subtitle, "%zu prompts x %u completions x %u tokens, T=%g; "
             "replay: the learner runs the sampler's recorded experts", b->prompts.n, b->o.n,
             b->o.max_tokens, b->o.temperature);
    svg_heatmap_spec logp_spec = {"MoE: mean |d logp|, routing recomputed and replayed",
                                  subtitle, "sampler -> learner", "model, learner's routing",
                                  "mean |d logp|", row_labels, col_labels, rows, 2 * b->n_moe,
                                  logp, NULL};
    svg_path(dir, "moe_logprob.svg", path, sizeof path);
    check_svg(svg_heatmap(path, &logp_spec), path);
    free(routes);
    free(logp);
    free(row_labels);
    free(row_text);
    free(pairs);
}

void write_svgs(const bench *b, const char *dir) {
    if (mkdir(dir, 0777) && errno != EEXIST) die("%s: %s", dir, strerror(errno));
    if (b->samplers.n && b->learners.n) plot_heatmap(b, dir);
    plot_histograms(b, dir);
    plot_growth(b, dir);
    plot_moe(b, dir);
}

