/* Distributions over the vocabulary: temperature, truncation (top-k, top-p, min-p), log-probs,
 * entropy, top-n, and draws with counter-based randomness. */
#include "sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/floats.h"
#include "kernels/kernels.h"

int dist_params_check(const dist_params *p, uint32_t vocab) {
    if (p->mode > PARITY_LOGPROB_PROCESSED_TRUNCATED)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "unknown log-prob mode %u", p->mode);
    if (!(p->temperature >= 0 && isfinite(p->temperature)))
        return set_error(PARITY_ERR_INVALID_ARGUMENT,
                         "temperature %g must be finite and >= 0 (0 = greedy)", (double)p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "top_p %g must be in (0, 1] (1 = off)",
                         (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p < 1))
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "min_p %g must be in [0, 1) (0 = off)",
                         (double)p->min_p);
    if (p->top_k > vocab)
        return set_error(PARITY_ERR_INVALID_ARGUMENT, "top_k %u exceeds the vocabulary (%u)",
                         p->top_k, vocab);
    return PARITY_OK;
}

/* ---- ordering ---------------------------------------------------------------------------- */

/* The candidates order: larger x first, ties to the lower id, NaN after every number (so
 * that the order is total and every sort below agrees with it). */
static int better(const float *x, uint32_t a, uint32_t b) {
    const float xa = x[a], xb = x[b];
    if (xa != xa || xb != xb) return xb != xb && (xa == xa || a < b);
    return xa > xb || (xa == xb && a < b);
}

/* x as an unsigned key, ascending in `better`'s order without its tie rule: -0 as +0,
 * every NaN one key after all numbers. */
static inline uint32_t order_key(float v) {
    if (v != v) return UINT32_MAX;
    if (v == 0) v = 0.0f;
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    const uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ~ascending;
}

/* Sorts ids[0..n), which come in ascending id order, by `better`: stable counting passes
 * over DIST_SORT_DIGITS digits of order_key (least significant first; a digit that every
 * key shares is skipped), so equal x keep ascending ids. tmp[n] is scratch, count the
 * digit tables of dist_work.hist. */
static void sort_by_key(const float *x, uint32_t *ids, uint32_t *tmp, size_t n, uint32_t *count) {
    const uint32_t R = 1u << DIST_SORT_DIGIT_BITS;
    memset(count, 0, (size_t)DIST_SORT_DIGITS * R * sizeof *count);
    for (size_t i = 0; i < n; i++) {
        const uint32_t key = order_key(x[ids[i]]);
        for (int d = 0; d < DIST_SORT_DIGITS; d++)
            count[d * R + ((key >> (d * DIST_SORT_DIGIT_BITS)) & (R - 1))]++;
    }
    uint32_t *src = ids, *dst = tmp;
    for (int d = 0; d < DIST_SORT_DIGITS; d++) {
        uint32_t *c = count + d * R;
        int shared = 0;
        for (uint32_t b = 0, at = 0; b < R; b++) {
            const uint32_t k = c[b];
            if (k == n) shared = 1;
            c[b] = at; /* the digit's first slot */
            at += k;
        }
        if (shared) continue;
        for (size_t i = 0; i < n; i++) {
            const uint32_t id = src[i];
            dst[c[(order_key(x[id]) >> (d * DIST_SORT_DIGIT_BITS)) & (R - 1)]++] = id;
        }
        uint32_t *t = src;
        src = dst, dst = t;
    }
    if (src != ids) memcpy(ids, src, n * sizeof *ids);
}

/* The mass bucket of e = exp(x - m) in [0, 1]: its bit pattern's top bits, so a larger x
 * never has a lower bucket; NaN in bucket 0, with the smallest. */
static inline uint32_t mass_bucket(float e) {
    uint32_t b;
    memcpy(&b, &e, sizeof b);
    b >>= 19;
    return b < DIST_MASS_BUCKETS ? b : 0;
}

/* Sorts ids[0..n) by `better` (heap sort: no recursion, no allocation). */
static void sift_down(const float *x, uint32_t *ids, size_t i, size_t n) {
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) return;
        /* a max-heap of the *worst* element, so that the sorted result is best first */
        if (c + 1 < n && better(x, ids[c], ids[c + 1])) c++;
        if (!better(x, ids[i], ids[c])) return;
        uint32_t t = ids[i];
        ids[i] = ids[c];
        ids[c] = t;
        i = c;
    }
}

static void sort_best_first(const float *x, uint32_t *ids, size_t n) {
    for (size_t i = n / 2; i-- > 0;) sift_down(x, ids, i, n);
    for (size_t end = n; end > 1; end--) {
        uint32_t t = ids[0];
        ids[0] = ids[end - 1];
        ids[end - 1] = t;
        sift_down(x, ids, 0, end - 1);
    }
}

/* Keeps the k best of ids[0..n) in ids[0..k), sorted best first: a heap of the k best seen,
 * whose root is the worst of them. */
static void select_best(const float *x, uint32_t *ids, size_t n, size_t k) {
    for (size_t i = k / 2; i-- > 0;) sift_down(x, ids, i, k);
    for (size_t i = k; i < n; i++)
        if (better(x, ids[i], ids[0])) {
            ids[0] = ids[i];
            sift_down(x, ids, 0, k);
        }
    sort_best_first(x, ids, k);
}

/* The first index of the largest x by `>` (a NaN never replaces anything; x[0] a NaN stays). */
static uint32_t arg_max(const float *x, size_t V) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* arg_max(x, V) given m = max_f32(x, V) (kernels.h: every lane starts at x[0] and takes only
 * strictly greater values). Where x[0] is a number, m is the largest number of x (no NaN is
 * ever taken), and arg_max's answer is the first i with x[i] == m: every x before it is
 * smaller or a NaN, and later ones equal to it do not replace it (a zero of either sign ==
 * m = 0 of either sign, as `>` sees them equal too). The search runs in blocks whose equality
 * tests vectorize, then finds the index inside the first block that holds it. */
static uint32_t arg_max_of(const float *x, size_t V, float m) {
    enum { BLOCK = 64 };
    if (x[0] != x[0]) return 0;
    for (size_t b = 0; b < V; b += BLOCK) {
        const size_t end = b + BLOCK < V ? b + BLOCK : V;
        int hit = 0;
        for (size_t i = b; i < end; i++) hit |= x[i] == m;
        if (hit)
            for (size_t i = b; i < end; i++)
                if (x[i] == m) return (uint32_t)i;
    }
    return arg_max(x, V); /* not reached: m is one of the x */
}

/* ---- distributions ----------------------------------------------------------------------- */

/* The mass top-p must reach. */
static double top_p_target(const dist_params *p, double total) { return (double)p->top_p * total; }

/* Without top-k: sorts into ids[0..c) the best c tokens, a prefix of the whole sorted order
 * that holds every token the top-p and min-p cuts can keep, and returns c. Tokens are
 * bucketed by their e (w->e_by_id): the buckets from the best down until their mass, summed
 * in double, reaches the top-p target times (1 + 2^-20), or until e falls below min_p; the
 * cut itself is made exactly, on the sorted prefix, by the caller. Both that mass and the
 * caller's running sum are double sums of at most V < 2^28 terms in [0, 1], each within
 * V * 2^-53 < 2^-25 of the exact sum, so the prefix always reaches the target; larger
 * vocabularies, or buckets that never reach it (top_p near 1), sort every token. */
static size_t sorted_candidates(const dist_params *p, const dist_work *w, const float *x,
                                size_t V, double total) {
    uint32_t *count = (uint32_t *)w->hist;
    double *mass = (double *)(w->hist + DIST_SORT_DIGITS * (1u << DIST_SORT_DIGIT_BITS));
    uint32_t first = 0; /* the lowest bucket kept */
    if (p->top_p < 1 && total == total && V < (1u << 28)) {
        memset(mass, 0, DIST_MASS_BUCKETS * sizeof *mass);
        for (size_t i = 0; i < V; i++) mass[mass_bucket(w->e_by_id[i])] += w->e_by_id[i];
        const double need = top_p_target(p, total) * (1 + 0x1p-20);
        double run = 0;
        for (first = DIST_MASS_BUCKETS; first-- > 0;)
            if ((run += mass[first]) >= need) break;
        if (first >= DIST_MASS_BUCKETS) first = 0;
    }
    if (p->min_p > 0) {
        const uint32_t b = mass_bucket(p->min_p);
        if (b > first) first = b; /* e >= min_p lies in bucket b or above */
    }
    size_t c = 0;
    if (first > 0) {
        for (uint32_t i = 0; i < V; i++)
            if (mass_bucket(w->e_by_id[i]) >= first) w->ids[c++] = i;
        if (c) {
            sort_by_key(x, w->ids, w->sort_tmp, c, count);
            return c;
        }
    }
    for (uint32_t i = 0; i < V; i++) w->ids[i] = i;
    sort_by_key(x, w->ids, w->sort_tmp, V, count);
    return V;
}

/* Whether round_bf16 leaves every x[i] as it is: its low 16 bits are zero and it is not a NaN
 * (round_bf16 makes every NaN 0x7fc0, the one that stays is left out for simplicity). */
static int bf16_exact(const float *x, size_t n) {
    uint32_t low = 0, nan = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        low |= b & 0xffffu;
        nan |= (b & 0x7fffffffu) > 0x7f800000u;
    }
    return !low && !nan;
}

void dist_build(const parity_policy *pol, const dist_params *p, const float *logits, size_t V,
                const dist_work *w, dist *d) {
    const kernels *k = kern();
    memset(d, 0, sizeof *d);
    d->greedy = p->temperature == 0;

    const float *x = logits;
    const float t = d->greedy ? 1.0f : p->temperature;
    /* verl's logits.div_(temperature) on bf16 (fp16) logits rounds the quotient */
    const int round = pol->temperature == PARITY_TEMPERATURE_BF16;
    /* x / 1 == x for every number (DAZ is off in every call), and a NaN stays a NaN: at
     * temperature 1 without the rounding, the processed logits are the logits; with it, they
     * are too where every logit is a bf16 number already (as LOGITS_BF16 leaves them) */
    if (p->mode != PARITY_LOGPROB_RAW && (t != 1 || round) &&
        !(t == 1 && pol->compute == PARITY_COMPUTE_BF16 && bf16_exact(logits, V))) {
        for (size_t i = 0; i < V; i++) w->x[i] = logits[i] / t;
        if (round) round_with(k, pol, w->x, V);
        x = w->x;
    }
    d->x = x;
    d->x_is_logits = x == logits;
    d->m = k->max_f32(x, V);

    int truncate = p->mode == PARITY_LOGPROB_PROCESSED_TRUNCATED &&
                   (d->greedy || (p->top_k && p->top_k < V) || p->top_p < 1 || p->min_p > 0);
    if (!truncate) {
        d->n = (uint32_t)V;
        d->lse = logf(k->sum_exp(x, V, d->m, w->e));
        return;
    }
    d->truncated = 1;
    if (d->greedy) {
        w->ids[0] = arg_max_of(x, V, d->m);
        d->n = 1;
        d->lse = 0; /* log 1: the whole mass on the arg max */
        return;
    }
    size_t n;
    double total = 0;
    if (p->top_k && p->top_k < V) {
        for (uint32_t i = 0; i < V; i++) w->ids[i] = i;
        select_best(x, w->ids, V, p->top_k);
        n = p->top_k;
        /* e in support order; the total of the k in that order, in double */
        for (size_t i = 0; i < n; i++) {
            w->e[i] = parity_expf(x[w->ids[i]] - d->m);
            total += w->e[i];
        }
    } else {
        total = k->sum_exp(x, V, d->m, w->e_by_id);
        n = sorted_candidates(p, w, x, V, total);
        for (size_t i = 0; i < n; i++) w->e[i] = w->e_by_id[w->ids[i]];
    }
    if (p->top_p < 1) {
        const double target = top_p_target(p, total);
        double run = 0;
        size_t keep = 0;
        while (keep < n) {
            run += w->e[keep++];
            if (run >= target) break;
        }
        n = keep;
    }
    if (p->min_p > 0) {
        size_t keep = 1; /* the best token has e = 1 >= min_p */
        while (keep < n && w->e[keep] >= p->min_p) keep++;
        n = keep;
    }
    double z = 0;
    for (size_t i = 0; i < n; i++) z += w->e[i];
    d->n = (uint32_t)n;
    d->lse = (float)log(z);
}

int dist_built_as(const dist_params *built, const dist *d, const dist_params *want) {
    if (d->truncated || want->mode == PARITY_LOGPROB_PROCESSED_TRUNCATED) return 0;
    /* untruncated: x = logits / T (rounded as pol says), m = max x, lse = logf(sum_exp) */
    if (want->mode == PARITY_LOGPROB_PROCESSED)
        return built->mode != PARITY_LOGPROB_RAW && want->temperature == built->temperature;
    /* RAW: x = logits, which d has where dist_build found its processed logits to be them */
    return d->x_is_logits;
}

/* Position of token t in the truncated support, or -1. */
static long support_index(const dist *d, const dist_work *w, int32_t t) {
    for (uint32_t i = 0; i < d->n; i++)
        if (w->ids[i] == (uint32_t)t) return (long)i;
    return -1;
}

float dist_logprob(const dist *d, const dist_work *w, int32_t token) {
    if (d->truncated && support_index(d, w, token) < 0) return -INFINITY;
    return (d->x[token] - d->m) - d->lse;
}

float dist_entropy(const dist *d, const dist_work *w, size_t V) {
    /* H = -sum p_i logp_i over the support, p_i = exp(logp_i) */
    if (!d->truncated) {
        for (size_t i = 0; i < V; i++) {
            w->e[i] = (d->x[i] - d->m) - d->lse; /* logp_i */
            w->x[i] = parity_expf(w->e[i]);       /* p_i (where d->x may be w->x: read first) */
        }
        return -kern()->dot_f32(w->x, w->e, V);
    }
    double h = 0;
    for (uint32_t i = 0; i < d->n; i++) {
        float lp = (d->x[w->ids[i]] - d->m) - d->lse;
        h -= (double)parity_expf(lp) * lp;
    }
    return (float)h;
}

void dist_top(const dist *d, const dist_work *w, size_t V, uint32_t top_n, int32_t *ids,
              float *logprobs) {
    /* the support of a truncated distribution is sorted already */
    uint32_t j = 0;
    if (d->truncated) {
        for (; j < top_n && j < d->n; j++) {
            ids[j] = (int32_t)w->ids[j];
            logprobs[j] = (d->x[w->ids[j]] - d->m) - d->lse;
        }
    } else {
        /* the k best by a heap selection, O(V log k): top_n may be as large as V */
        const size_t k = top_n < V ? top_n : V;
        for (uint32_t i = 0; i < V; i++) w->ids[i] = i;
        select_best(d->x, w->ids, V, k);
        for (; j < k; j++) {
            ids[j] = (int32_t)w->ids[j];
            logprobs[j] = (d->x[w->ids[j]] - d->m) - d->lse;
        }
    }
    for (; j < top_n; j++) {
        ids[j] = -1;
        logprobs[j] = -INFINITY;
    }
}

/* Elements between the running sums dist_draw keeps. */
#define DRAW_MARK_STRIDE 64

/* The draw is the first i whose running sum e[0] + ... + e[i] (in double, in order) exceeds u
 * times the whole sum. The sum before every DRAW_MARK_STRIDE-th element is kept (in the sort's
 * scratch, unused by now) while the whole sum is formed, so the search replays one stretch
 * instead of the additions up to i: the same additions in the same order, so the same running
 * sums. They never decrease (every e >= 0, and rounding to nearest is monotone), so i lies in
 * the first stretch whose end exceeds the target; where some e is NaN, so are the whole sum and
 * the target, and no comparison holds either way. */
typedef struct draw_row {
    const float *e;
    size_t n;
    unsigned char *marks; /* marks[b - 1]: the sum before stretch b >= 1 (n / 8 bytes at most,
                           * of sort_tmp's 4 V) */
    double total;
} draw_row;

static draw_row draw_row_of(const dist *d, const dist_work *w, size_t V) {
    return (draw_row){w->e, d->truncated ? d->n : V, (unsigned char *)w->sort_tmp, 0};
}

static size_t stretch_end(size_t b, size_t n) {
    return (b + 1) * DRAW_MARK_STRIDE < n ? (b + 1) * DRAW_MARK_STRIDE : n;
}

/* The whole sums of up to DIST_DRAW_ROWS rows, their additions interleaved: each row's are a
 * sequential chain of double additions, latency-bound alone, and the others' fill its gaps.
 * A stretch that every row has whole runs as four chains side by side, a row that is done
 * (or missing) adding zeros from `zeros`: t + 0 == t for every t a sum of e >= 0 can be
 * (+0, a positive number, +inf or NaN), so those additions change nothing. */
static void draw_totals(draw_row *r, unsigned rows) {
    static const float zeros[DRAW_MARK_STRIDE];
    size_t stretches[DIST_DRAW_ROWS] = {0}, most = 0;
    double t[DIST_DRAW_ROWS] = {0};
    for (unsigned k = 0; k < rows; k++) {
        stretches[k] = (r[k].n + DRAW_MARK_STRIDE - 1) / DRAW_MARK_STRIDE;
        if (stretches[k] > most) most = stretches[k];
    }
    for (size_t s = 0; s < most; s++) {
        const size_t lo = s * DRAW_MARK_STRIDE;
        const float *p[DIST_DRAW_ROWS];
        int whole = 1;
        for (unsigned k = 0; k < DIST_DRAW_ROWS; k++) {
            p[k] = zeros;
            if (k >= rows || s >= stretches[k]) continue;
            if (s) memcpy(r[k].marks + (s - 1) * sizeof t[k], &t[k], sizeof t[k]);
            p[k] = r[k].e + lo;
            if (stretch_end(s, r[k].n) - lo < DRAW_MARK_STRIDE) whole = 0;
        }
        if (whole) {
            double t0 = t[0], t1 = t[1], t2 = t[2], t3 = t[3];
            for (size_t i = 0; i < DRAW_MARK_STRIDE; i++) {
                t0 += p[0][i];
                t1 += p[1][i];
                t2 += p[2][i];
                t3 += p[3][i];
            }
            t[0] = t0, t[1] = t1, t[2] = t2, t[3] = t3;
        } else {
            for (unsigned k = 0; k < rows; k++)
                if (s < stretches[k])
                    for (size_t i = lo, end = stretch_end(s, r[k].n); i < end; i++) t[k] += r[k].e[i];
        }
    }
    for (unsigned k = 0; k < rows; k++) r[k].total = t[k];
}

static int32_t draw_find(const dist *d, const dist_work *w, const draw_row *r, double u) {
    const size_t n = r->n, stretches = (n + DRAW_MARK_STRIDE - 1) / DRAW_MARK_STRIDE;
    const double target = u * r->total;
    for (size_t b = 0; b < stretches; b++) {
        double after = r->total, run = 0;
        if (b + 1 < stretches) memcpy(&after, r->marks + b * sizeof after, sizeof after);
        if (!(after > target)) continue;
        if (b) memcpy(&run, r->marks + (b - 1) * sizeof run, sizeof run);
        for (size_t i = b * DRAW_MARK_STRIDE, end = stretch_end(b, n); i < end; i++) {
            run += r->e[i];
            if (run > target) return d->truncated ? (int32_t)w->ids[i] : (int32_t)i;
        }
        break; /* not reached: the stretch's last running sum is `after` */
    }
    /* u * total rounded up to total: the last token with mass */
    for (size_t i = n; i-- > 0;)
        if (r->e[i] > 0) return d->truncated ? (int32_t)w->ids[i] : (int32_t)i;
    return d->truncated ? (int32_t)w->ids[0] : 0;
}

static int32_t draw_greedy(const dist *d, const dist_work *w, size_t V) {
    return d->truncated ? (int32_t)w->ids[0] : (int32_t)arg_max(d->x, V);
}

int32_t dist_draw(const dist *d, const dist_work *w, size_t V, double u) {
    int32_t out;
    dist_draw_rows(1, d, w, &u, V, &out);
    return out;
}

void dist_draw_rows(unsigned rows, const dist *d, const dist_work *w, const double *u, size_t V,
                    int32_t *out) {
    draw_row r[DIST_DRAW_ROWS];
    unsigned of[DIST_DRAW_ROWS], n = 0; /* r[i] is row of[i]'s */
    for (unsigned k = 0; k < rows; k++) {
        if (d[k].greedy) {
            out[k] = draw_greedy(&d[k], &w[k], V);
            continue;
        }
        of[n] = k;
        r[n++] = draw_row_of(&d[k], &w[k], V);
    }
    if (!n) return;
    draw_totals(r, n);
    for (unsigned i = 0; i < n; i++) out[of[i]] = draw_find(&d[of[i]], &w[of[i]], &r[i], u[of[i]]);
}

/* ---- Philox4x32-10 ------------------------------------------------------------------- */

static inline void mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

double philox_uniform(uint64_t seed, uint64_t stream, uint64_t position) {
    uint32_t c[4] = {(uint32_t)position, (uint32_t)(position >> 32), (uint32_t)stream,
                     (uint32_t)(stream >> 32)};
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        mulhilo(0xD2511F53u, c[0], &hi0, &lo0);
        mulhilo(0xCD9E8D57u, c[2], &hi1, &lo1);
        uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = lo1;
        c[2] = n2;
        c[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    uint64_t bits = ((uint64_t)c[0] << 21) ^ (c[1] >> 11); /* 53 bits */
    return (double)(bits & ((1ull << 53) - 1)) * 0x1p-53;
}
