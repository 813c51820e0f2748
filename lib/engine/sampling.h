/* From logits to a distribution, its log-probs and a draw: the same code for the scorer
 * (learner) and the sampler, so that both report the same value for a token bit for bit. */
#ifndef PARITY_SAMPLING_H
#define PARITY_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "parity.h"

/* What defines the distribution of a position besides its logits. */
typedef struct dist_params {
    uint32_t mode;        /* parity_logprob_mode */
    float temperature;    /* >= 0; 0 = greedy (counts as 1 for the log-probs) */
    uint32_t top_k;       /* 0 = off */
    float top_p;          /* (0, 1]; 1 = off */
    float min_p;          /* [0, 1); 0 = off */
} dist_params;

/* Buffers for one position: x, e, ids, e_by_id and sort_tmp are [V] each; the histograms are
 * DIST_WORK_HIST floats. dist_work_floats(V) floats hold them all. */
typedef struct dist_work {
    float *x;             /* the processed logits, where they differ from the logits */
    float *e;             /* exp(x - m), in support order */
    uint32_t *ids;        /* the truncated support, best first */
    float *e_by_id;       /* exp(x - m) in id order (truncation without top-k) */
    uint32_t *sort_tmp;   /* the sort's second buffer; then dist_draw's running sums */
    float *hist;          /* the sort's digit counts and the mass per bucket of e */
} dist_work;

#define DIST_SORT_DIGIT_BITS 11
#define DIST_SORT_DIGITS 3                       /* 3 x 11 bits cover a 32-bit key */
#define DIST_MASS_BUCKETS 2048                   /* e's bit pattern >> 19: sign, exponent, 3 bits */
#define DIST_WORK_HIST (DIST_SORT_DIGITS * (1u << DIST_SORT_DIGIT_BITS) + 2 * DIST_MASS_BUCKETS)
static inline size_t dist_work_floats(size_t V) { return (5 * V + DIST_WORK_HIST + 15) / 16 * 16; }
/* Carves w out of dist_work_floats(V) floats at base (aligned for doubles). */
static inline dist_work dist_work_at(float *base, size_t V) {
    return (dist_work){base + DIST_WORK_HIST + 0 * V, base + DIST_WORK_HIST + 1 * V,
                       (uint32_t *)(base + DIST_WORK_HIST + 2 * V), base + DIST_WORK_HIST + 3 * V,
                       (uint32_t *)(base + DIST_WORK_HIST + 4 * V), base};
}

/* A distribution over the vocabulary:
 *   RAW:        x = logits
 *   PROCESSED:  x = logits / T (rounded to bf16 when policy->temperature says so)
 *   TRUNCATED:  PROCESSED restricted to the support: the arg max alone when greedy; else the
 *               tokens sorted by x (descending, ties to the lower id, NaN last), cut by top-k,
 *               then top-p (the shortest prefix whose exp(x - m) sum, in that order and in
 *               double, reaches top_p times the total), then min-p (exp(x - m) >= min_p).
 *               The total is that of the candidates: the top-k ones' sum in the same order
 *               and in double under top-k; without top-k, the whole vocabulary's
 *               sum_exp(x, m) (kernels.h dot16 order, fp32: the untruncated denominator), so
 *               that only the tokens the cut can reach are ever sorted.
 * m = max x. Full support: lse = logf(sum_exp(x, m)) (kernels.h dot16 order); truncated:
 * lse = (float)log(sum over the support in sorted order, in double). log p(t) =
 * (x[t] - m) - lse, -inf outside the support. */
typedef struct dist {
    const float *x;       /* the mode's logits: the logits passed to dist_build (which must
                           * outlive the dist) when the mode leaves them as they are, else w->x */
    int x_is_logits;      /* x is the logits themselves (bit for bit the RAW mode's x) */
    float m, lse;
    uint32_t n;           /* support size */
    int truncated;        /* support = ids[0 .. n) (else the whole vocabulary) */
    int greedy;
} dist;

int dist_params_check(const dist_params *p, uint32_t vocab);
void dist_build(const parity_policy *pol, const dist_params *p, const float *logits, size_t V,
                const dist_work *w, dist *d);
/* Whether d, built by dist_build from `built`, is bit for bit the distribution dist_build
 * would build from `want` on the same logits (so that it need not be built again). */
int dist_built_as(const dist_params *built, const dist *d, const dist_params *want);
float dist_logprob(const dist *d, const dist_work *w, int32_t token);
/* The entropy of the distribution, -sum p log p. It overwrites w->x and w->e (so d->x where
 * that is w->x): call it last. */
float dist_entropy(const dist *d, const dist_work *w, size_t V);
/* The top_n tokens by log-prob within the support, best first, ties to the lower id; past
 * the support of a truncated distribution, id -1 and log-prob -inf. Uses w->ids. */
void dist_top(const dist *d, const dist_work *w, size_t V, uint32_t top_n, int32_t *ids,
              float *logprobs);
/* A draw from the distribution (a TRUNCATED one: the support the sampler uses), driven by
 * u in [0, 1): the first token, in support order (id order when not truncated), whose
 * cumulative exp(x - m) sum (in double) exceeds u times the total. Greedy: the arg max. */
int32_t dist_draw(const dist *d, const dist_work *w, size_t V, double u);

/* The most rows dist_draw_rows draws together. */
#define DIST_DRAW_ROWS 4

/* dist_draw of `rows` <= DIST_DRAW_ROWS distributions (d[k] built in w[k], driven by u[k]),
 * out[k] the k-th's draw: the same draws, their sums interleaved so that each hides the
 * others' latency. */
void dist_draw_rows(unsigned rows, const dist *d, const dist_work *w, const double *u, size_t V,
                    int32_t *out);

/* Counter-based randomness: Philox4x32-10 keyed by the seed, counting (position, stream):
 * a uniform double in [0, 1) with 53 random bits. */
double philox_uniform(uint64_t seed, uint64_t stream, uint64_t position);

#endif
