/* What both halves of parity-mismatch share (the run in parity-mismatch.c, the report in
 * mismatch-report.c): progress lines and fatal errors, allocation, policy lists, the kernel
 * orders and the metrics of a pair. A module below both, so that the report never calls back
 * into the program. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_clock.h"
#include "mismatch.h"
#include "options.h"

static double start_time;
static int quiet;

void progress_start(void) { start_time = bench_now(); }

void progress_silence(void) { quiet = 1; }

double progress_seconds(void) { return bench_now() - start_time; }

/* One line on stderr, written at once (workers report concurrently). */
void progress(const char *fmt, ...) {
    if (quiet) return;
    char line[512];
    int n = snprintf(line, sizeof line, "[%6.1f s] ", bench_now() - start_time);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_error(fmt, ap);
    va_end(ap);
    exit(1);
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory");
    return p;
}

/* "same", "split_k=4", "split_kv=64" or "split_k=4,split_kv=64". */
void describe_order(uint32_t split_k, uint32_t split_kv, char out[ORDER_MAX_LEN]) {
    if (split_k && split_kv)
        snprintf(out, ORDER_MAX_LEN, "split_k=%u,split_kv=%u", split_k, split_kv);
    else if (split_k) snprintf(out, ORDER_MAX_LEN, "split_k=%u", split_k);
    else if (split_kv) snprintf(out, ORDER_MAX_LEN, "split_kv=%u", split_kv);
    else snprintf(out, ORDER_MAX_LEN, "same");
}

int same_policy(const parity_policy *a, const parity_policy *b) {
    return !memcmp(a, b, sizeof *a);
}

const spec *find_spec(const spec_list *l, const char *name) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->v[i].name, name)) return &l->v[i];
    return NULL;
}

/* The kernel orders: "same", then split-K, split-KV and both, leaving out any that a zero
 * --split-k / --split-kv turns off; returns how many. */
int kernel_orders(const options *o, uint32_t k[4], uint32_t kv[4]) {
    int n = 0;
    k[n] = 0, kv[n++] = 0;
    if (o->split_k) k[n] = o->split_k, kv[n++] = 0;
    if (o->split_kv) k[n] = 0, kv[n++] = o->split_kv;
    if (o->split_k && o->split_kv) k[n] = o->split_k, kv[n++] = o->split_kv;
    return n;
}

static int bitwise_equal(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

/* The metrics over generated positions [lo, hi] (0-based in each completion) of rollouts `r`
 * scored as `learner`. Sequence-level sums run over the same positions. */
void compute_metrics(const rollouts *r, const float *learner, uint32_t lo, uint32_t hi,
                     metrics *m) {
    memset(m, 0, sizeof *m);
    double *abs_r = xcalloc(r->gen_off[r->n_seqs], sizeof *abs_r);
    double s_abs = 0, s_r = 0, s_k3 = 0, s_w = 0, s_w2 = 0, s_seq = 0;
    size_t n = 0, outside = 0;
    for (size_t c = 0; c < r->n_seqs; c++) {
        size_t n_gen = r->gen_off[c + 1] - r->gen_off[c];
        double seq = 0;
        int any = 0;
        for (size_t t = lo; t < n_gen && t <= hi; t++) {
            float ls = r->lp[r->gen_off[c] + t], ll = learner[r->gen_off[c] + t];
            m->tokens++;
            any = 1;
            if (bitwise_equal(ls, ll)) m->equal++;
            if (!isfinite(ls) || !isfinite(ll)) {
                m->nonfinite++;
                continue;
            }
            double d = (double)ll - (double)ls, w = exp(d);
            abs_r[n++] = fabs(d);
            s_abs += fabs(d);
            s_r += d;
            s_k3 += w - d - 1;
            s_w += w;
            s_w2 += w * w;
            outside += w < 0.8 || w > 1.2;
            if (fabs(d) > m->max_abs) m->max_abs = fabs(d);
            if (w > m->ratio_max) m->ratio_max = w;
            seq += d;
        }
        if (!any) continue;
        m->seqs++;
        s_seq += fabs(seq);
        if (fabs(seq) > m->seq_max_abs) m->seq_max_abs = fabs(seq);
    }
    if (n) {
        qsort(abs_r, n, sizeof *abs_r, bench_cmp_double);
        size_t rank = (size_t)ceil(0.99 * (double)n);
        m->p99_abs = abs_r[rank ? rank - 1 : 0];
        m->mean_abs = s_abs / (double)n;
        m->bias = s_r / (double)n;
        m->k3 = s_k3 / (double)n;
        m->ratio_mean = s_w / (double)n;
        double var = s_w2 / (double)n - m->ratio_mean * m->ratio_mean;
        m->ratio_std = var > 0 ? sqrt(var) : 0;
        m->ratio_outside = (double)outside / (double)n;
    } else {
        m->mean_abs = m->p99_abs = m->bias = m->k3 = m->ratio_mean = m->ratio_std = NAN;
        m->ratio_outside = NAN;
    }
    m->equal_frac = m->tokens ? (double)m->equal / (double)m->tokens : NAN;
    m->seq_mean_abs = m->seqs ? s_seq / (double)m->seqs : NAN;
    free(abs_r);
}
