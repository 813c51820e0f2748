/* The truncated distribution (top-k, top-p, min-p) against a direct reading of its
 * definition in lib/engine/sampling.h: every token sorted by a comparison sort, e = exp(x - m) in
 * that order, the cuts in that order. dist_build sorts only the tokens the cuts can reach,
 * with a radix sort; its support (ids in order), e and lse must be the reference's bit for
 * bit, on flat and peaked logits, with ties, signed zeros, -inf and NaN among them. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "base/floats.h"
#include "kernels/kernels.h"
#include "engine/sampling.h"

static const float *cmp_x;

/* larger x first, ties to the lower id, NaN after every number */
static int cmp_best(const void *pa, const void *pb) {
    const uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    const float xa = cmp_x[a], xb = cmp_x[b];
    const int na = xa != xa, nb = xb != xb;
    if (na != nb) return na - nb;
    if (!na && xa != xb) return xa > xb ? -1 : 1;
    return (a > b) - (a < b);
}

/* The dot16 sum of exp(x - m) (kernels.h), written out. */
static float sum_exp_dot16(const float *x, size_t V, float m) {
    float acc[16] = {0};
    for (size_t i = 0; i < V; i++) acc[i % 16] = acc[i % 16] + parity_expf(x[i] - m);
    for (int s = 8; s >= 1; s /= 2)
        for (int l = 0; l < s; l++) acc[l] = acc[l] + acc[l + s];
    return acc[0];
}

typedef struct ref_dist {
    uint32_t n;
    float lse;
} ref_dist;

/* x: processed logits; the distribution truncated, not greedy. ids[V], e[V] out. */
static ref_dist reference(const float *x, size_t V, const dist_params *p, uint32_t *ids, float *e) {
    const float m = kern()->max_f32(x, V); /* the max's own order is kernels.h's */
    for (uint32_t i = 0; i < V; i++) ids[i] = i;
    cmp_x = x;
    qsort(ids, V, sizeof *ids, cmp_best);
    size_t n = p->top_k && p->top_k < V ? p->top_k : V;
    for (size_t i = 0; i < n; i++) e[i] = parity_expf(x[ids[i]] - m);
    double total = 0;
    if (p->top_k && p->top_k < V)
        for (size_t i = 0; i < n; i++) total += e[i];
    else
        total = sum_exp_dot16(x, V, m);
    if (p->top_p < 1) {
        const double target = (double)p->top_p * total;
        double run = 0;
        size_t keep = 0;
        while (keep < n) {
            run += e[keep++];
            if (run >= target) break;
        }
        n = keep;
    }
    if (p->min_p > 0) {
        size_t keep = 1;
        while (keep < n && e[keep] >= p->min_p) keep++;
        n = keep;
    }
    double z = 0;
    for (size_t i = 0; i < n; i++) z += e[i];
    return (ref_dist){(uint32_t)n, (float)log(z)};
}

static uint64_t rng = 88172645463325252ull;
static double uniform(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}
static double normal(void) {
    return sqrt(-2 * log(1 - uniform())) * cos(6.283185307179586 * uniform());
}

static uint32_t bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

enum { FLAT, PEAKED, COARSE, SPECIAL, N_KINDS };
static const char *const KIND[] = {"flat", "peaked", "coarse ties", "zeros, -inf, NaN"};

static void fill(float *x, size_t V, int kind) {
    for (size_t i = 0; i < V; i++) {
        double v = normal();
        switch (kind) {
        case FLAT: x[i] = round_bf16((float)(2.5 * v)); break;
        case PEAKED: x[i] = round_bf16((float)(4 * v + (uniform() < 0.001 ? 25 : 0))); break;
        case COARSE: x[i] = (float)floor(3 * v) / 2; break; /* few distinct values, many ties */
        default: {
            double u = uniform();
            x[i] = u < 0.1 ? -0.0f : u < 0.2 ? 0.0f : u < 0.3 ? -INFINITY : round_bf16((float)v);
        }
        }
    }
    if (kind == SPECIAL && V > 3) x[V / 2] = NAN, x[V - 1] = NAN; /* not at 0: m stays a number */
}

/* The draw as its definition reads (lib/engine/sampling.h): the first i whose running sum of e, in
 * double and in order, exceeds u times the whole sum; else the last i with e > 0. */
static int32_t reference_draw(const float *e, const uint32_t *ids, size_t n, double u) {
    double total = 0, run = 0;
    for (size_t i = 0; i < n; i++) total += e[i];
    const double target = u * total;
    for (size_t i = 0; i < n; i++) {
        run += e[i];
        if (run > target) return ids ? (int32_t)ids[i] : (int32_t)i;
    }
    for (size_t i = n; i-- > 0;)
        if (e[i] > 0) return ids ? (int32_t)ids[i] : (int32_t)i;
    return ids ? (int32_t)ids[0] : 0;
}

/* dist_draw against reference_draw for uniforms spread over [0, 1), the extremes, and the
 * running sums themselves (u * total at a boundary between two tokens, where `>` decides);
 * and dist_draw_rows of d at every place of a group beside DIST_DRAW_ROWS - 1 partner
 * distributions pd[q] (in pw[q]), against the same definition for each row; returns the
 * number of draws compared. */
static int check_draws(const dist *d, const dist_work *w, size_t V, const char *what,
                       const dist *pd, const dist_work *pw) {
    const size_t n = d->truncated ? d->n : V;
    const uint32_t *ids = d->truncated ? w->ids : NULL;
    double total = 0;
    for (size_t i = 0; i < n; i++) total += w->e[i];
    int draws = 0, bad = 0;
    for (int t = 0; t < 64; t++) {
        double u;
        if (t == 0) u = 0;
        else if (t == 1) u = 0x1.fffffffffffffp-1;
        else if (t < 32) u = (t - 2) / 30.0 + 1e-3;
        else {
            /* u * total equal to (or one rounding from) the running sum before token i */
            const size_t i = (size_t)(t - 32) * n / 32;
            double run = 0;
            for (size_t k = 0; k < i; k++) run += w->e[k];
            u = total > 0 ? run / total : 0;
            if (!(u < 1)) u = 0x1.fffffffffffffp-1;
        }
        const int32_t got = dist_draw(d, w, V, u), want = reference_draw(w->e, ids, n, u);
        draws++;
        if (got != want && bad++ < 3)
            fprintf(stderr, "%s: draw at u = %a is %d, the definition's %d\n", what, u, got, want);
        /* d at every place of a group of 2 .. DIST_DRAW_ROWS rows, beside the partners */
        for (unsigned rows = 2; rows <= DIST_DRAW_ROWS; rows++)
            for (unsigned at = 0; at < rows; at++) {
                dist gd[DIST_DRAW_ROWS];
                dist_work gw[DIST_DRAW_ROWS];
                double gu[DIST_DRAW_ROWS];
                int32_t gwant[DIST_DRAW_ROWS], got_rows[DIST_DRAW_ROWS];
                for (unsigned k = 0, q = 0; k < rows; k++) {
                    if (k == at) {
                        gd[k] = *d, gw[k] = *w, gu[k] = u, gwant[k] = want;
                        continue;
                    }
                    gd[k] = pd[q], gw[k] = pw[q];
                    gu[k] = fmod((t + 1) * (0.6180339887498949 + q), 1.0);
                    gwant[k] = reference_draw(pw[q].e, pd[q].truncated ? pw[q].ids : NULL,
                                              pd[q].truncated ? pd[q].n : V, gu[k]);
                    q++;
                }
                dist_draw_rows(rows, gd, gw, gu, V, got_rows);
                draws += (int)rows;
                for (unsigned k = 0; k < rows; k++)
                    if (got_rows[k] != gwant[k] && bad++ < 3)
                        fprintf(stderr, "%s: row %u of %u drawn together at u = %a is %d, the "
                                "definition's %d\n", what, k, rows, gu[k], got_rows[k], gwant[k]);
            }
    }
    CHECK(bad == 0);
    return draws;
}

/* The processed logits at temperature 1 under a policy that rounds the quotient (aligned):
 * where every logit is a bf16 number, dist_build takes them as they are (x_is_logits) and a
 * RAW log-prob may reuse the distribution; where one is not (a fraction below bf16's, or a
 * NaN), it rounds them. Either way x, m and lse are bit for bit those of round_bf16(logits / 1)
 * built as RAW logits, which is what the processed distribution is by definition. */
static void check_temperature_one(const parity_policy *pol, float *logits, size_t V,
                                  const dist_work *w, const dist_work *rw, float *xr) {
    const dist_params draw = {PARITY_LOGPROB_PROCESSED_TRUNCATED, 1, 0, 1, 0},
                      raw = {PARITY_LOGPROB_RAW, 1, 0, 1, 0};
    fill(logits, V, FLAT); /* bf16 numbers */
    for (int variant = 0; variant < 3; variant++) {
        if (variant == 1) logits[V / 2] = nextafterf(logits[V / 2], INFINITY); /* not bf16 */
        if (variant == 2) logits[V / 3] = NAN;
        dist d, r;
        dist_build(pol, &draw, logits, V, w, &d);
        for (size_t i = 0; i < V; i++) xr[i] = round_bf16(logits[i] / 1.0f);
        dist_build(pol, &raw, xr, V, rw, &r);
        const int exact = variant == 0;
        CHECK(!d.truncated);
        CHECK(d.x_is_logits == exact);
        CHECK(dist_built_as(&draw, &d, &raw) == exact);
        int same = bits(d.m) == bits(r.m) && bits(d.lse) == bits(r.lse);
        for (size_t i = 0; i < V; i++) same &= bits(d.x[i]) == bits(xr[i]);
        if (!same)
            fprintf(stderr, "temperature 1, variant %d: the processed logits, max or lse differ "
                    "from round_bf16(logits)'s\n", variant);
        CHECK(same);
    }
}

/* The greedy draw against its definition, the first index of the largest logit by `>` (a NaN
 * never replaces the best; a NaN first logit stays), on every kind of logits and on the
 * edges: a NaN first, every logit -inf, zeros of both signs, the largest one last. Returns
 * the number of draws compared. */
static int check_greedy(const parity_policy *pol, float *logits, size_t V, const dist_work *w) {
    const dist_params greedy = {PARITY_LOGPROB_PROCESSED_TRUNCATED, 0, 0, 1, 0};
    int draws = 0, bad = 0;
    for (int kind = 0; kind < N_KINDS + 4; kind++) {
        if (kind < N_KINDS) fill(logits, V, kind);
        else if (kind == N_KINDS) fill(logits, V, SPECIAL), logits[0] = NAN;
        else if (kind == N_KINDS + 1) for (size_t i = 0; i < V; i++) logits[i] = -INFINITY;
        else if (kind == N_KINDS + 2) for (size_t i = 0; i < V; i++) logits[i] = i % 3 ? -0.0f : (i % 2 ? 0.0f : -1.0f);
        else for (size_t i = 0; i < V; i++) logits[i] = i + 1 < V ? -1.0f : 1.0f;
        uint32_t want = 0;
        for (uint32_t i = 1; i < V; i++)
            if (logits[i] > logits[want]) want = i;
        dist d;
        dist_build(pol, &greedy, logits, V, w, &d);
        const int32_t got = dist_draw(&d, w, V, 0.5);
        draws++;
        if (got != (int32_t)want && bad++ < 3)
            fprintf(stderr, "greedy, V %zu, logits %d: drew %d, the definition %u\n", V, kind, got, want);
    }
    CHECK(bad == 0);
    return draws;
}

int main(void) {
    const size_t sizes[] = {1, 2, 7, 33, 300, 5000, 151936};
    const float top_ps[] = {1, 0.999f, 0.95f, 0.9f, 0.5f, 0.1f, 1e-6f};
    const float min_ps[] = {0, 0.001f, 0.05f, 0.5f};
    const uint32_t top_ks[] = {0, 1, 50};
    const size_t Vmax = 151936;
    float *x = malloc(Vmax * sizeof *x), *logits = malloc(Vmax * sizeof *logits);
    float *re = malloc(Vmax * sizeof *re), *work = malloc(dist_work_floats(Vmax) * sizeof *work);
    uint32_t *rids = malloc(Vmax * sizeof *rids);
    float *plogits = malloc((DIST_DRAW_ROWS - 1) * Vmax * sizeof *plogits),
          *pwork = malloc((DIST_DRAW_ROWS - 1) * dist_work_floats(Vmax) * sizeof *pwork);
    if (!x || !logits || !re || !work || !rids || !plogits || !pwork) return 1;
    parity_policy pol;
    CHECK_OK(parity_policy_from_name("aligned", &pol));
    int cases = 0, mismatched = 0, draws = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const size_t V = sizes[si];
        const dist_work w = dist_work_at(work, V);
        /* the partners of the draws made together: the whole distribution of other logits,
         * a short truncated one (top-k 5) and a top-p one, each in its own work */
        const dist_params partner[DIST_DRAW_ROWS - 1] = {
            {PARITY_LOGPROB_PROCESSED_TRUNCATED, 1, 0, 1, 0},
            {PARITY_LOGPROB_PROCESSED_TRUNCATED, 1, 5, 1, 0},
            {PARITY_LOGPROB_PROCESSED_TRUNCATED, 1, 0, 0.9f, 0}};
        const int partner_kind[DIST_DRAW_ROWS - 1] = {PEAKED, FLAT, COARSE};
        dist_work pw[DIST_DRAW_ROWS - 1];
        dist pd[DIST_DRAW_ROWS - 1];
        for (unsigned q = 0; q < DIST_DRAW_ROWS - 1; q++) {
            float *pl = plogits + q * Vmax;
            pw[q] = dist_work_at(pwork + q * dist_work_floats(Vmax), V);
            fill(pl, V, partner_kind[q]);
            for (size_t i = 0; i < V; i++) pl[i] = -pl[i];
            dist_build(&pol, &partner[q], pl, V, &pw[q], &pd[q]);
        }
        CHECK(!pd[0].truncated);
        draws += check_greedy(&pol, logits, V, &w);
        for (int kind = 0; kind < N_KINDS; kind++) {
            fill(logits, V, kind);
            for (size_t a = 0; a < sizeof top_ps / sizeof *top_ps; a++)
                for (size_t b = 0; b < sizeof min_ps / sizeof *min_ps; b++)
                    for (size_t c = 0; c < sizeof top_ks / sizeof *top_ks; c++) {
                        const dist_params p = {PARITY_LOGPROB_PROCESSED_TRUNCATED, 1, top_ks[c],
                                               top_ps[a], min_ps[b]};
                        if (p.top_p == 1 && p.min_p == 0 && (!p.top_k || p.top_k >= V)) continue;
                        if (V > 5000 && (a % 2 || b % 2)) continue; /* qsort of V: keep it short */
                        dist d;
                        dist_build(&pol, &p, logits, V, &w, &d);
                        memcpy(x, d.x, V * sizeof *x); /* the processed logits */
                        const ref_dist r = reference(x, V, &p, rids, re);
                        cases++;
                        int bad = !d.truncated || d.n != r.n || bits(d.lse) != bits(r.lse);
                        for (uint32_t i = 0; !bad && i < r.n; i++)
                            bad = w.ids[i] != rids[i] || bits(w.e[i]) != bits(re[i]);
                        if (bad && mismatched++ < 10)
                            fprintf(stderr, "V %zu, %s, top_p %g, min_p %g, top_k %u: n %u (ref %u), "
                                    "lse %a (ref %a)\n", V, KIND[kind], (double)p.top_p,
                                    (double)p.min_p, p.top_k, d.n, r.n, (double)d.lse, (double)r.lse);
                        CHECK(!bad);
                        if (!bad && c == 0 && b == 0) draws += check_draws(&d, &w, V, KIND[kind], pd, pw);
                    }
            /* the whole distribution (no truncation): e in id order */
            const dist_params full = {PARITY_LOGPROB_PROCESSED_TRUNCATED, 1, 0, 1, 0};
            dist d;
            dist_build(&pol, &full, logits, V, &w, &d);
            CHECK(!d.truncated);
            draws += check_draws(&d, &w, V, KIND[kind], pd, pw);
        }
    }
    const dist_work tw = dist_work_at(work, Vmax), trw = dist_work_at(pwork, Vmax);
    check_temperature_one(&pol, logits, Vmax, &tw, &trw, x);
    fprintf(stderr, "%d truncated distributions compared, %d differ; %d draws compared\n", cases,
            mismatched, draws);
    CHECK(draws > 1000);
    CHECK(cases > 500);
    free(x), free(logits), free(re), free(work), free(rids), free(plogits), free(pwork);
    return check_report("test_sampling");
}
