/* parity-speed: prefill and decode throughput per preset, backend and thread count, each
 * figure printed beside the machine limit it is bounded by, measured in the same run.
 *
 *   parity-speed [--model SPEC] [--presets LIST] [--backends LIST] [--threads LIST]
 *                [--prompts LIST] [--batches LIST] [--contexts LIST] [--steps N] [--reps N]
 *                [--paths LIST|all] [--peers LIST] [--score-all] [--formats] [--ggufs LIST]
 *                [--profile] [--json FILE] [--quick] [--early-exit [--thresholds LIST]]
 *                [--layers N]
 *
 * Defaults (a run of about three minutes on 2 cores with the peers: 1 min 53 s without them on
 * an AVX2 AMD EPYC VM, 3 min 57 s with llama-bench and torch's fp32 fallback, whose generic
 * BLAS decodes at 0.6 s a step there): synthetic:qwen3-0.6b; presets
 * aligned,hf-eager,vllm (measured interleaved, repetition by repetition, and their spread
 * printed); backends bf16, and amx where the CPU has AMX-BF16; threads 2; prefill and scoring of 512 tokens; decode
 * at batch 1 and 32 with 128 tokens of context; 1 warm-up and 3 repetitions per figure
 * (median, and min..max as the spread), each on one object kept across them (a sampler or a
 * scorer per preset, as a server or a trainer keeps its own: the warm-up touches its buffers,
 * so no figure pays their first-touch page faults); the CPU path the library picks (--paths all: every
 * SIMD path this CPU has, one after the other, the same rows for each; the portable path,
 * the specification, runs only when named, being some 500 times slower); peers torch,llama
 * where available.
 *
 * --layers N runs a synthetic:NAME shape cut to its first N layers (bench_layers.h), for the
 * shapes that do not fit the machine's memory whole (a mixture of experts'; bench/model-memory
 * says what each holds): a layer reads and runs the same whatever the depth, so its decode
 * bandwidth and speed per layer are the whole shape's, while the head and the embedding
 * weigh more in a step of fewer layers. The torch peer does not run on a cut shape.
 *
 * Peers, measured in the same run at the largest thread count, for the first preset's shape:
 *   torch   bench/torch_peer.py under /usr/bin/python3 (Debian's python3-torch), for
 *           synthetic:NAME models: PyTorch bf16 prefill of the largest prompt and decode at
 *           the listed batches and the first context; it names the oneDNN ISA it ran on.
 *           PARITY_TORCH_PEER names another copy of the script.
 *   llama   llama.cpp's llama-bench when LLAMA_BENCH (the binary) is set, on each GGUF of
 *           --ggufs LIST or LLAMA_GGUF (comma-separated; a BF16 GGUF of the same shape,
 *           bench/peer_gguf.py's, and the types llama-quantize makes of it: its docstring
 *           says how): pp<largest prompt> and tg<first context> (tg is measured from an
 *           empty context; its tokens/s sit beside decode at batch 1), each file's weight
 *           type read from llama-bench's model_type.
 * Each libparity row with a peer figure of the same phase, batch and tokens is printed with
 * the ratio libparity / peer; a llama figure only beside the presets of its nearest
 * arithmetic (BF16 beside bf16; Q8_0 beside FP8 and MXFP8; NVFP4, MXFP4 and Q4_0 beside
 * NVFP4 and MXFP4; TQ2_0 and TQ1_0 beside ternary). --peers none skips them.
 *
 * --formats adds the presets of each quantized format beside bf16 vllm, those not already
 * listed: vllm, aligned, vllm+fp8-block:deepseek, vllm+mxfp8:ocp, vllm+nvfp4:modelopt,
 * vllm+mxfp4:ocp, vllm+ternary:bitnet (at most 8 presets in all), measured interleaved with
 * the others. Every run then prints, per preset and backend, what the library says a decode
 * step reads and what a model serving the preset holds (parity_model_bytes, asked once every
 * row has run, so that each preset's copies are built): the linear layers' bytes (the
 * quantized codes and scales as the model holds them: E4M3 and ternary codes one a byte, E2M1
 * two a byte), the head's, the norms', one embedding row, one KV position, and
 * held_for_policy, the weights a model serving that preset alone holds; beside them the
 * process's resident set (VmRSS), which holds every preset's copies in one model.
 *
 * Phases
 *   prefill  the sampler's: a prompt of L tokens, up to the logits of its last position (as
 *            llama-bench counts pp); tokens/s = L / time. Bounded by compute: achieved
 *            GFLOP/s (2 flops per weight per token, plus attention) against the FMA peak.
 *   score    the scorer's: log-probs at every position of L tokens (the lm_head runs on every
 *            row); tokens/s = L / time. For the first preset only, unless --score-all;
 *            timed interleaved with the prefill rows of the same L, call by call.
 *            Below the table, each score row beside the prefill row of its tokens, split by
 *            the library's profile of the timed calls: the decoder layers, the head (whose
 *            GFLOP/s on all L rows is printed against the row's peak), the log-probs, and
 *            the untimed first call of each object (score and prefill), the one that touches
 *            its buffers' pages for the first time.
 *   decode   one step of B sequences at a given context; tokens/s = B * steps / time. The
 *            samplers of the decode rows and of --profile are created with prefault set (the
 *            KV cache written at creation, as llama.cpp's is), so that the timed steps, whose
 *            sequences reach new cache blocks, take no first-touch page faults.
 *            Every step reads every weight once (a mixture of experts': the experts its
 *            tokens run; parity_model_bytes counts one token's num_experts_per_tok a sparse
 *            layer, which a step of B > 1 sequences may exceed: its GB/s is a floor)
 *            (achieved GB/s = the bytes a step reads /
 *            step time, against the read bandwidth measured here: the weights as the
 *            library counts them under the preset (parity_model_bytes: codes and scales of
 *            a quantized format's linear layers, else values; the head; the norms), B
 *            embedding rows, and the KV positions the step attends, on average over the
 *            timed steps, the prompt's full blocks that the B forks share once) and does B
 *            tokens' flops
 *            (achieved GFLOP/s against the FMA peak); the bound column shows the limit of
 *            the larger fraction: memory at batch 1, the FMA units at batch 32.
 *   --profile  instead of the table: where the time goes, from the library's profile
 *            (parity_sampler_set_profiling) of the first preset, backend and the largest
 *            thread count: a prefill of the first prompt length, then decode steps at each
 *            batch and context (contexts 128, 1024 and 4096 unless --contexts is given),
 *            drawing at temperature 1; each phase (embed, gemm, rounding, regions,
 *            attention, head, sampling, other) as a share of the step, and the thread
 *            pool's own share.
 *   --early-exit  instead of the table, for a looped model (default synthetic:ouro-1.4b): decode
 *            at each batch after a prompt of the first context (32 unless --contexts is
 *            given), greedy, under the first preset with the KV rule LAST_EXITED, once with
 *            every loop (the dense loop, PARITY_EXIT_FULL) and once per threshold of LIST
 *            (default 0.5,0.7,0.9,0.99; PARITY_EXIT_THRESHOLD on the gate's exit CDF): tokens/s
 *            (median of the repetitions), the mean depth of the decode steps (the first, which
 *            feeds the prompt's last token, runs every loop and is not counted) and the
 *            speed-up over the dense loop.
 * Peers: torch_peer.py runs bf16 weights unless torch has no bf16 GEMM kernel for the CPU
 * (then fp32, as a user of that CPU would, and the weights column says so).
 * Machine limits, measured by this program per thread count at the start and again before
 * every repetition of a group of rows (the rows' interleaved calls of one repetition follow
 * it): a row's bound column gives the medians of its limits and, as its percentage, the median
 * over its repetitions of the fraction each reached of the limits measured just before it
 * (on a shared VM the read bandwidth of 2 threads jumped between about 32 and 60 GB/s for a
 * second or two at a time, a decode row then reading 126% of a limit taken before its group;
 * the preset spread is paired the same way): memory read bandwidth (sum of a
 * 1 GiB buffer, split over the threads, in 4 KB pages and in huge pages; decode is judged
 * against the better) and the peak of every instruction a CPU path's bf16 GEMM runs that
 * this CPU has (bench_peak.h: register-only loops of vfmadd231ps ymm for avx2, vfmadd231ps
 * zmm for avx512, vdpbf16ps zmm for avx512bf16) and of AMX's tdpbf16ps where the CPU has it; a
 * row's bound is its own path's peak, or AMX's on the amx backend.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bench_clock.h"
#include "bench_layers.h"
#include "bench_peak.h"
#include "options.h"
#include "parity.h"

#ifndef PARITY_BENCH_DIR
#define PARITY_BENCH_DIR "bench"
#endif

#define MAX_LIST 8
#define MAX_REPS 50  /* the most --reps takes */

typedef struct stat3 {
    double median, min, max;
} stat3;

/* Median, min and max of n <= MAX_REPS values, left in their order (the repetitions' order
 * pairs the presets of a group). */
static stat3 summarise(const double *v, int n) {
    double c[MAX_REPS];
    memcpy(c, v, (size_t)n * sizeof *v);
    qsort(c, (size_t)n, sizeof *c, bench_cmp_double);
    stat3 s = {n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]), c[0], c[n - 1]};
    return s;
}

/* ---- machine limits -------------------------------------------------------------------- */

typedef struct bw_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_job;

/* The sum of a thread's share: 4 independent 64-bit lane sums (AVX2 where the CPU has it,
 * so that the loop is bound by memory, not by the adds). */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 4)));
        c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(p + i + 8)));
        d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
    uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (; i < n; i++) s += p[i];
    return s;
}
#endif

static void *bw_thread(void *arg) {
    bw_job *j = arg;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        j->sum = sum_avx2(j->p, j->n);
        return NULL;
    }
#endif
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        s0 += j->p[i];
        s1 += j->p[i + 1];
        s2 += j->p[i + 2];
        s3 += j->p[i + 3];
    }
    j->sum = s0 + s1 + s2 + s3;
    return NULL;
}

/* The two 1 GiB buffers the bandwidth is read from (4 KB pages, huge pages), made and filled
 * once: the limits are measured again before every repetition of a group of rows. */
static uint64_t *bw_buffers[2];

static void bw_free(void) {
    for (int i = 0; i < 2; i++) free(bw_buffers[i]), bw_buffers[i] = NULL;
}

/* Read bandwidth in GB/s with `threads` threads over a buffer much larger than the caches, in
 * 4 KB pages or advised MADV_HUGEPAGE (as the library advises the weight buffers it
 * allocates; a mapped BF16 checkpoint stays in 4 KB page-cache pages). */
static double measure_bandwidth(unsigned threads, int huge) {
    const size_t bytes = (size_t)1 << 30, n = bytes / 8, align = (size_t)2 << 20;
    uint64_t *buf = bw_buffers[huge != 0];
    if (!buf) {
        if (posix_memalign((void **)&buf, align, bytes) != 0) return 0;
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
        (void)madvise(buf, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#endif
        for (size_t i = 0; i < n; i++) buf[i] = i;
        bw_buffers[huge != 0] = buf;
    }
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        pthread_t tid[16];
        bw_job jobs[16];
        double t0 = bench_now();
        for (unsigned t = 0; t < threads; t++) {
            jobs[t] = (bw_job){buf + n / threads * t, n / threads, 0};
            pthread_create(&tid[t], NULL, bw_thread, &jobs[t]);
        }
        uint64_t sum = 0;
        for (unsigned t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            sum += jobs[t].sum;
        }
        double gbs = (double)bytes / (bench_now() - t0) / 1e9;
        if (sum == 42) gbs = 0; /* keeps the sum alive */
        if (gbs > best) best = gbs;
    }
    return best;
}

#define FMA_ITERS 20000000L

typedef struct fma_job {
    bench_peak_kind kind;
    double sink;
} fma_job;

static void *fma_thread(void *arg) {
    fma_job *j = arg;
    j->sink = bench_peak_loop(FMA_ITERS, j->kind);
    return NULL;
}

/* Peak GFLOP/s of one peak loop (bench_peak.h) on `threads` threads (0 for NONE or a loop
 * this CPU does not run). */
static double measure_fma_peak(unsigned threads, bench_peak_kind kind) {
    if (!bench_peak_available(kind) || threads > 16) return 0;
    pthread_t tid[16];
    fma_job jobs[16];
    double t0 = bench_now();
    for (unsigned t = 0; t < threads; t++) {
        jobs[t].kind = kind;
        pthread_create(&tid[t], NULL, fma_thread, &jobs[t]);
    }
    for (unsigned t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    return FMA_ITERS * bench_peak_flops_per_iter(kind) * threads / (bench_now() - t0) / 1e9;
}

/* ---- the model's size -------------------------------------------------------------------- */

typedef struct model_size {
    double flops_per_tok;  /* 2 x matrix weights one token runs (a mixture of experts: the
                              router, num_experts_per_tok experts, the shared expert and its
                              gate), without the lm_head */
    double head_flops;     /* 2 x lm_head weights */
    double attn_flops;     /* per (query, key) pair: 4 x heads x head_dim x layers */
} model_size;

/* Whether layer l is sparse (parity.h, parity_config: every decoder_sparse_step-th layer that
 * mlp_only_layers does not name, in a model with experts). */
static int layer_is_sparse(const parity_config *c, uint32_t l) {
    return c->num_experts && c->decoder_sparse_step && (l + 1) % c->decoder_sparse_step == 0 &&
           !((c->mlp_only_layers[l / 64] >> (l % 64)) & 1u);
}

static model_size size_of(const parity_config *c) {
    const double h = c->hidden_size, q = (double)c->num_attention_heads * c->head_dim,
                 kv = (double)c->num_key_value_heads * c->head_dim, f = c->intermediate_size;
    const double attention = h * q * 2 + h * kv * 2;
    const double experts = (double)c->num_experts * h +
                           3.0 * h * c->moe_intermediate_size * c->num_experts_per_tok +
                           (c->shared_expert_intermediate_size
                                ? 3.0 * h * c->shared_expert_intermediate_size + h
                                : 0);
    model_size s = {0};
    for (uint32_t l = 0; l < c->num_hidden_layers; l++)
        s.flops_per_tok += 2 * (attention + (layer_is_sparse(c, l) ? experts : 3 * h * f));
    s.head_flops = 2 * h * c->vocab_size;
    s.attn_flops = 4.0 * q * c->num_hidden_layers;
    return s;
}

/* What a preset reads and holds, as the library counts it (parity_model_bytes): the weights
 * a decode step streams (the linear layers' codes and scales under a quantized gemm, as the
 * model holds them, else their values; the head; the norms), one embedding row and one KV
 * position per sequence, and what a model serving the preset alone holds. NULL policy or a
 * failed query: reported, and -1. */
static int preset_bytes(const parity_model *model, const char *preset, uint32_t backend,
                        parity_weight_bytes *out) {
    parity_policy pol;
    memset(out, 0, sizeof *out);
    out->size = sizeof *out;
    if (parity_policy_from_name(preset, &pol) || parity_model_bytes(model, &pol, backend, out)) {
        fprintf(stderr, "parity-speed: bytes of %s: %s\n", preset, parity_last_error());
        return -1;
    }
    return 0;
}

/* The bytes one decode step of B sequences reads: every weight once, B embedding rows, and
 * the KV positions attended: `shared` positions that all B sequences share (a prompt's full
 * blocks, which their forks keep in common) once, and `own` more per sequence. */
static double decode_step_bytes(const parity_weight_bytes *b, uint32_t B, double shared,
                                double own) {
    return (double)(b->step_linear + b->step_head + b->step_vectors) +
           B * (double)b->embedding_row + (shared + B * own) * (double)b->kv_position;
}

/* ---- runs ---------------------------------------------------------------------------------- */

typedef struct run_cfg {
    const parity_model *model;
    const char *preset;
    uint32_t backend, threads;
} run_cfg;

static int fail(const char *what) {
    fprintf(stderr, "parity-speed: %s: %s\n", what, parity_last_error());
    return -1;
}

/* The parameters the sampler and the scorer share, from the run's configuration. */
static int run_params(const run_cfg *r, parity_policy *policy, uint32_t *backend,
                      uint32_t *n_threads) {
    if (parity_policy_from_name(r->preset, policy)) return fail(r->preset);
    *backend = r->backend;
    *n_threads = r->threads;
    return 0;
}

static int make_sampler(const run_cfg *r, uint32_t max_seqs, uint32_t max_len, parity_sampler **s) {
    parity_sampler_params p;
    parity_sampler_default_params(&p);
    if (run_params(r, &p.policy, &p.backend, &p.n_threads)) return -1;
    p.max_seqs = max_seqs;
    p.max_len = max_len;
    p.max_batch = max_seqs;
    /* as a server sets it (llama.cpp clears its KV buffer at creation too): the timed steps,
     * whose sequences reach new cache blocks, take no first-touch page faults */
    p.prefault = 1;
    return parity_sampler_create(r->model, &p, s) ? fail("sampler") : 0;
}

/* A prompt phase's object, kept across its timed calls as a server or a trainer keeps its
 * sampler or scorer: prefill (a sampler of one sequence, its prompt added, first-stepped and
 * released again per call) or score (a scorer of L tokens). prompt_open makes one untimed call,
 * so that the object's buffers (a scorer's 512 x 151936 fp32 logits are 311 MB) are touched
 * before the clock runs: their first-touch page faults are the allocation's cost, not the
 * phase's, and a fresh object per call would put them in every figure. */
typedef struct prompt_run {
    int score;
    uint32_t L;
    parity_sampler *sampler;
    parity_scorer *scorer;
    int32_t *tokens;
    float *lp;
    double first_s;  /* the untimed first call: with the first touch of the object's buffers */
} prompt_run;

static double prompt_time(prompt_run *x);

static void prompt_close(prompt_run *x) {
    parity_sampler_free(x->sampler);
    parity_scorer_free(x->scorer);
    free(x->tokens);
    free(x->lp);
    memset(x, 0, sizeof *x);
}

static int prompt_open(const run_cfg *r, int score, uint32_t L, prompt_run *x) {
    memset(x, 0, sizeof *x);
    x->score = score;
    x->L = L;
    x->tokens = malloc(L * sizeof *x->tokens);
    x->lp = malloc(L * sizeof *x->lp);
    if (!x->tokens || !x->lp) {
        prompt_close(x);
        return fail("out of memory");
    }
    bench_prompt(x->tokens, L, parity_model_config(r->model)->vocab_size);
    if (score) {
        parity_scorer_params p;
        parity_scorer_default_params(&p);
        if (run_params(r, &p.policy, &p.backend, &p.n_threads)) {
            prompt_close(x);
            return -1;
        }
        p.max_tokens = L;
        if (parity_scorer_create(r->model, &p, &x->scorer)) {
            prompt_close(x);
            return fail("scorer");
        }
    } else if (make_sampler(r, 1, L + 1, &x->sampler)) {
        prompt_close(x);
        return -1;
    }
    x->first_s = prompt_time(x); /* the untimed call */
    if (x->first_s < 0) {
        prompt_close(x);
        return -1;
    }
    /* the timed calls are profiled (a few clock readings per layer): where a call's time goes */
    if (score ? parity_scorer_set_profiling(x->scorer, 1) : parity_sampler_set_profiling(x->sampler, 1)) {
        prompt_close(x);
        return fail("profiling");
    }
    return 0;
}

/* The profile of the timed calls so far. */
static int prompt_profile(const prompt_run *x, parity_profile *p) {
    p->size = sizeof *p;
    return x->score ? parity_scorer_profile(x->scorer, p) : parity_sampler_profile(x->sampler, p);
}

/* Seconds for one call of the phase: the sampler taking the L-token prompt to its first
 * logits (as llama-bench counts pp), or the scorer's log-probs at all L positions. */
static double prompt_time(prompt_run *x) {
    int rc;
    double t0;
    if (x->score) {
        parity_score_options o;
        parity_score_default_options(&o);
        uint32_t L = x->L;
        t0 = bench_now();
        rc = parity_score(x->scorer, &o, x->tokens, &L, 1, x->lp, NULL, NULL, NULL);
    } else {
        parity_sampling g;
        parity_sampling_default(&g);
        g.temperature = 0;
        uint32_t q, fin;
        int32_t tok;
        float lp;
        t0 = bench_now();
        rc = parity_sampler_add(x->sampler, x->tokens, x->L, &g, 0, &q);
        if (!rc) rc = parity_sampler_step(x->sampler, &q, 1, &tok, &lp, &fin, 0, NULL, NULL);
        const double dt = bench_now() - t0;
        if (!rc) rc = parity_sampler_release(x->sampler, q);
        return rc ? fail("prefill") : dt;
    }
    const double dt = bench_now() - t0;
    return rc ? fail("score") : dt;
}

/* A decode run of B sequences at `context` tokens (one prefill, B forks), its first step
 * taken, ready for decode_time. */
typedef struct decode_run {
    parity_sampler *s;
    uint32_t B, seqs[64], fin[64];
    int32_t tok[64];
    float lp[64];
} decode_run;

static int decode_open(const run_cfg *r, uint32_t B, uint32_t context, uint32_t max_steps,
                       const parity_sampling *sampling, decode_run *d) {
    d->B = B;
    if (make_sampler(r, B + 1, context + max_steps + 2, &d->s)) return -1;
    int32_t *prompt = malloc(context * sizeof *prompt);
    bench_prompt(prompt, context, parity_model_config(r->model)->vocab_size);
    parity_sampling g;
    parity_sampling_default(&g);
    g.temperature = 0;
    if (sampling) g = *sampling;
    uint32_t parent;
    int rc = parity_sampler_add(d->s, prompt, context, &g, 0, &parent);
    for (uint32_t b = 0; b < B && !rc; b++) rc = parity_sampler_fork(d->s, parent, &g, b, &d->seqs[b]);
    /* warm-up: the first step also copies the forks' shared last block */
    if (!rc) rc = parity_sampler_step(d->s, d->seqs, B, d->tok, d->lp, d->fin, 0, NULL, NULL);
    free(prompt);
    if (rc) {
        parity_sampler_free(d->s);
        return fail("decode");
    }
    return 0;
}

/* One decode step of the run: its seconds, or -1 (reported) when the step fails. */
static double decode_step(decode_run *d) {
    const double t0 = bench_now();
    const int rc = parity_sampler_step(d->s, d->seqs, d->B, d->tok, d->lp, d->fin, 0, NULL, NULL);
    const double dt = bench_now() - t0;
    return rc ? fail("decode") : dt;
}

/* Seconds per step over `steps` steps, after one untimed step (which wakes the pool's
 * workers if another run let them sleep); -1 on failure. */
static double decode_time(decode_run *d, uint32_t steps) {
    if (decode_step(d) < 0) return -1;
    double sum = 0;
    for (uint32_t i = 0; i < steps; i++) {
        const double dt = decode_step(d);
        if (dt < 0) return -1;
        sum += dt;
    }
    return sum / steps;
}

/* ---- early exit (--early-exit) ------------------------------------------------------------------ */

/* Decode of a looped model with each exit rule: tokens/s, mean depth, speed-up over every loop. */
static int run_early_exit(const run_cfg *r, const char *model_spec, const uint32_t *batches,
                          int nbatch, uint32_t context,
                          const float *thresholds, int nthr, uint32_t steps, int reps,
                          const char *json) {
    const parity_config *c = parity_model_config(r->model);
    if (c->arch != PARITY_ARCH_OURO || !c->early_exit_gate) {
        fprintf(stderr, "parity-speed: --early-exit needs a looped model with an exit gate "
                        "(e.g. --model synthetic:ouro-1.4b)\n");
        return -1;
    }
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) return fail(json);
    if (jf)
        fprintf(jf, "{\"early_exit\": {\"model\": \"%s\", \"preset\": \"%s\", \"threads\": %u, "
                    "\"context\": %u, \"loops\": %u, \"loop_kv\": \"last-exited\", \"rows\": [",
                model_spec, r->preset, r->threads, context, c->total_ut_steps);
    printf("early exit: %s, preset %s, %u threads, prompt %u tokens, %u loops, KV rule last-exited, "
           "greedy; %d x %u steps a row\n",
           model_spec, r->preset, r->threads, context, c->total_ut_steps, reps, steps);
    printf("%5s %-16s %10s %11s %9s\n", "batch", "exit rule", "tok/s", "mean depth", "speed-up");
    int first_row = 1;
    for (int bi = 0; bi < nbatch; bi++) {
        double dense = 0;
        for (int k = -1; k < nthr; k++) {
            parity_sampling g;
            parity_sampling_default(&g);
            g.temperature = 0;
            if (k >= 0) {
                g.exit_rule = PARITY_EXIT_THRESHOLD;
                g.exit_threshold = thresholds[k];
            }
            const uint32_t B = batches[bi];
            decode_run d;
            if (decode_open(r, B, context, (uint32_t)reps * (steps + 1) + 2, &g, &d)) {
                if (jf) fclose(jf);
                return -1;
            }
            double v[MAX_REPS];
            for (int i = 0; i < reps; i++) {
                const double dt = decode_time(&d, steps);
                if (dt < 0) {
                    parity_sampler_free(d.s);
                    if (jf) fclose(jf);
                    return -1;
                }
                v[i] = B / dt;
            }
            const stat3 st = summarise(v, reps);
            /* the depths of the decode steps after the first (the prompt's last token runs
             * every loop) */
            double depth_sum = 0;
            size_t depth_n = 0;
            for (uint32_t b = 0; b < B; b++) {
                const uint32_t *dep;
                uint32_t n;
                if (parity_sampler_depths(d.s, d.seqs[b], &dep, &n)) continue;
                for (uint32_t j = context; j < n; j++) depth_sum += dep[j], depth_n++;
            }
            parity_sampler_free(d.s);
            const double depth = depth_n ? depth_sum / (double)depth_n : 0;
            if (k < 0) dense = st.median;
            char rule[32];
            if (k < 0)
                snprintf(rule, sizeof rule, "every loop");
            else
                snprintf(rule, sizeof rule, "threshold %.2f", (double)thresholds[k]);
            printf("%5u %-16s %10.2f %11.2f %8.2fx\n", B, rule, st.median, depth,
                   dense > 0 ? st.median / dense : 0.0);
            if (jf)
                fprintf(jf, "%s\n  {\"batch\": %u, \"exit_rule\": \"%s\", \"threshold\": %.4g, "
                            "\"tokens_per_s\": %.4f, \"min\": %.4f, \"max\": %.4f, "
                            "\"mean_depth\": %.4f, \"speedup\": %.4f}",
                        first_row ? "" : ",", B, k < 0 ? "full" : "threshold",
                        k < 0 ? 1.0 : (double)thresholds[k], st.median, st.min, st.max, depth,
                        dense > 0 ? st.median / dense : 0.0);
            first_row = 0;
        }
    }
    if (jf) {
        fprintf(jf, "\n]}}\n");
        fclose(jf);
    }
    return 0;
}

/* ---- the profile (--profile) ----------------------------------------------------------------- */

/* Where a prefill or a decode step spends its time: the library's own profile
 * (parity_sampler_set_profiling) of the sampler's calls, as shares of their wall time. */
typedef struct profile_row {
    const char *phase;  /* "prefill", "decode" */
    uint32_t batch, tokens, context;
    uint32_t units;     /* what ms/unit is per: 1 prefill, or the decode steps */
    parity_profile p;
} profile_row;

static void profile_print(const profile_row *r) {
    const parity_profile *p = &r->p;
    double known = 0;
    for (int i = 0; i < PARITY_PHASE_COUNT; i++) known += p->phase_seconds[i];
    printf("%-8s %5u %6u %7u %9.2f", r->phase, r->batch, r->tokens, r->context,
           1e3 * p->call_seconds / r->units);
    for (int i = 0; i < PARITY_PHASE_COUNT; i++)
        printf(" %8.1f%%", 100 * p->phase_seconds[i] / p->call_seconds);
    printf(" %8.1f%% %8.1f%%\n", 100 * (p->call_seconds - known) / p->call_seconds,
           100 * p->dispatch_seconds / p->call_seconds);
}

/* Profiles the sampler of the first configuration: a prefill of `prompt` tokens (its add and
 * first step), then decode steps at each batch and context, drawing as RL rollouts do by
 * default (temperature 1, no truncation: what verl and OpenRLHF sample with; sampling-bench
 * times the truncations, --step-ms giving them a decode step's time from here). */
static int run_profile(const run_cfg *r, uint32_t prompt, const uint32_t *batches, int nbatch,
                       const uint32_t *contexts, int nc, uint32_t steps, const char *json) {
    profile_row rows[1 + MAX_LIST * MAX_LIST];
    int n = 0;
    parity_sampling g;
    parity_sampling_default(&g);
    g.temperature = 1.0f;
    g.seed = 7;
    const uint32_t vocab = parity_model_config(r->model)->vocab_size;
    {
        parity_sampler *s;
        if (make_sampler(r, 1, prompt + 1, &s)) return -1;
        int32_t *tokens = malloc(prompt * sizeof *tokens);
        bench_prompt(tokens, prompt, vocab);
        uint32_t q, fin;
        int32_t tok;
        float lp;
        int rc = parity_sampler_add(s, tokens, prompt, &g, 0, &q); /* warm-up */
        if (!rc) rc = parity_sampler_release(s, q);
        if (!rc) rc = parity_sampler_set_profiling(s, 1);
        if (!rc) rc = parity_sampler_add(s, tokens, prompt, &g, 0, &q);
        if (!rc) rc = parity_sampler_step(s, &q, 1, &tok, &lp, &fin, 0, NULL, NULL);
        rows[n] = (profile_row){"prefill", 1, prompt, prompt, 1, {.size = sizeof(parity_profile)}};
        if (!rc) rc = parity_sampler_profile(s, &rows[n].p);
        free(tokens);
        parity_sampler_free(s);
        if (rc) return fail("profile");
        n++;
    }
    for (int ci = 0; ci < nc; ci++)
        for (int bi = 0; bi < nbatch; bi++) {
            decode_run d;
            fprintf(stderr, "parity-speed: profile: decode batch %u context %u\n", batches[bi],
                    contexts[ci]);
            if (decode_open(r, batches[bi], contexts[ci], steps + 2, &g, &d)) return -1;
            int rc = parity_sampler_step(d.s, d.seqs, d.B, d.tok, d.lp, d.fin, 0, NULL, NULL);
            if (!rc) rc = parity_sampler_set_profiling(d.s, 1);
            for (uint32_t k = 0; k < steps && !rc; k++)
                rc = parity_sampler_step(d.s, d.seqs, d.B, d.tok, d.lp, d.fin, 0, NULL, NULL);
            rows[n] = (profile_row){"decode", d.B, d.B, contexts[ci], steps,
                                    {.size = sizeof(parity_profile)}};
            if (!rc) rc = parity_sampler_profile(d.s, &rows[n].p);
            parity_sampler_free(d.s);
            if (rc) return fail("profile");
            n++;
        }
    printf("profile of the sampler's calls: %s, backend %s, %u thread(s), CPU path %s; "
           "temperature 1; decode over %u steps\n", r->preset,
           parity_backend_name((int)r->backend), r->threads, parity_cpu_path_name(parity_get_cpu_path()),
           steps);
    printf("(ms: a prefill's or a decode step's; the shares are of the calls' wall time; \"other\" is the rest of a call: its checks, the cache's\n"
           " block bookkeeping and copy-on-write; \"pool\" is the thread pool's own time inside the\n"
           " phases: per parallel loop, its wall time less its slowest worker's work)\n\n");
    printf("%-8s %5s %6s %7s %9s", "phase", "batch", "tokens", "context", "ms");
    for (int i = 0; i < PARITY_PHASE_COUNT; i++) printf(" %9s", parity_phase_name((uint32_t)i));
    printf(" %9s %9s\n", "other", "pool");
    for (int i = 0; i < n; i++) profile_print(&rows[i]);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "parity-speed: cannot write %s\n", json);
            return -1;
        }
        fprintf(f, "{\"profile\": {\"preset\": \"%s\", \"backend\": \"%s\", \"threads\": %u, "
                   "\"cpu_path\": \"%s\", \"steps\": %u, \"rows\": [", r->preset,
                parity_backend_name((int)r->backend), r->threads,
                parity_cpu_path_name(parity_get_cpu_path()), steps);
        for (int i = 0; i < n; i++) {
            const parity_profile *p = &rows[i].p;
            fprintf(f, "%s\n  {\"phase\": \"%s\", \"batch\": %u, \"tokens\": %u, \"context\": %u, "
                       "\"calls\": %llu, \"forwards\": %llu, \"rows\": %llu, \"call_seconds\": %.6f, "
                       "\"dispatch_seconds\": %.6f, \"loops\": %llu, \"phase_seconds\": {",
                    i ? "," : "", rows[i].phase, rows[i].batch, rows[i].tokens, rows[i].context,
                    (unsigned long long)p->calls, (unsigned long long)p->forwards,
                    (unsigned long long)p->rows, p->call_seconds, p->dispatch_seconds,
                    (unsigned long long)p->loops);
            for (int k = 0; k < PARITY_PHASE_COUNT; k++)
                fprintf(f, "%s\"%s\": %.6f", k ? ", " : "", parity_phase_name((uint32_t)k),
                        p->phase_seconds[k]);
            fprintf(f, "}}");
        }
        fprintf(f, "\n]}}\n");
        fclose(f);
    }
    return 0;
}

/* ---- peers ----------------------------------------------------------------------------------- */

#define MAX_PEER_ROWS 32
#define MAX_NOTES 8

typedef struct peer_row {
    const char *peer;   /* "torch", "llama" */
    const char *phase;  /* "prefill", "decode" */
    uint32_t threads, batch, tokens, context;
    double tps, lo, hi;
    char weights[16];   /* the peer's weight type: torch's dtype, the GGUF's type */
} peer_row;

typedef struct peers {
    peer_row rows[MAX_PEER_ROWS];
    int n;
    char notes[MAX_NOTES][512];  /* what each peer ran on, or why it did not run */
    int n_notes;
} peers;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void peer_note(peers *P, const char *fmt, ...) {
    if (P->n_notes < MAX_NOTES) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(P->notes[P->n_notes], sizeof P->notes[0], fmt, ap);
        va_end(ap);
        char *nl = strchr(P->notes[P->n_notes], '\n');
        if (nl) *nl = 0;
        P->n_notes++;
    }
}

/* Closes a peer's pipe and notes what it ran on, or why it measured nothing (its last line
 * of output). */
static void peer_finish(peers *P, const char *peer, FILE *f, int got, const char *last,
                        const char *about) {
    int status = pclose(f);
    if (status != 0 || !got)
        peer_note(P, "%s: not measured (%s)", peer, last[0] ? last : "no output");
    else
        peer_note(P, "%s: %s", peer, about);
}

static int shell_safe(const char *s) {
    for (; *s; s++)
        if (*s == '\'' || *s == '\n') return 0;
    return 1;
}

/* torch_peer's time budget per row: where torch is slow (fp32 on a reference BLAS, as
 * Debian's is on a CPU without a bf16 GEMM kernel), fewer repetitions, so that the default
 * run stays near three minutes. */
#define TORCH_ROW_SECONDS 8

/* PyTorch (bench/torch_peer.py under Debian's python3) on a built-in config's shape. */
static void run_torch_peer(peers *P, const char *model_spec, uint32_t threads, uint32_t prompt,
                           const char *batches, uint32_t context, uint32_t steps, int reps) {
    const char *script = getenv("PARITY_TORCH_PEER");
    if (!script || !*script) script = PARITY_BENCH_DIR "/torch_peer.py";
    if (strncmp(model_spec, "synthetic:", 10) != 0) {
        peer_note(P, "torch: not run (%s is not a built-in config; torch_peer.py takes "
                     "synthetic:NAME shapes)", model_spec);
        return;
    }
    const char *config = model_spec + 10;
    if (!shell_safe(config) || !shell_safe(script) || !shell_safe(batches)) {
        peer_note(P, "torch: not run (a quote in %s or %s)", config, script);
        return;
    }
    char cmd[1400];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s' --config '%s' --threads %u --prompt %u --batches '%s' "
             "--context %u --steps %u --reps %d --row-seconds %d 2>&1",
             script, config, threads, prompt, batches, context, steps, reps, TORCH_ROW_SECONDS);
    fprintf(stderr, "parity-speed: peer torch: %s\n", cmd);
    FILE *f = popen(cmd, "r");
    if (!f) {
        peer_note(P, "torch: not run (cannot start /usr/bin/python3: %s)", strerror(errno));
        return;
    }
    char line[1024], last[1024] = "", header[1024] = "", weights[16] = "bf16";
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        char phase[16];
        unsigned b, t, c;
        double tps, lo, hi;
        if (sscanf(line, "%15s %u %u %u %lf (%lf..%lf)", phase, &b, &t, &c, &tps, &lo, &hi) == 7 &&
            (!strcmp(phase, "prefill") || !strcmp(phase, "decode")) && P->n < MAX_PEER_ROWS) {
            peer_row *r = &P->rows[P->n++];
            *r = (peer_row){"torch", !strcmp(phase, "prefill") ? "prefill" : "decode", threads, b,
                            t, c, tps, lo, hi, ""};
            snprintf(r->weights, sizeof r->weights, "%s", weights);
            got++;
        } else if (!strncmp(line, "torch_peer: PyTorch", 19)) {
            /* "...; weights fp32 (why); ...": torch_peer runs fp32 where torch has no bf16
             * GEMM kernel for the CPU */
            const char *w = strstr(line, "; weights ");
            if (w) sscanf(w + 10, "%15[a-z0-9]", weights);
            snprintf(header, sizeof header, "%s", line + 12);
        } else if (line[0] != '{' && line[0] != '\n') {
            snprintf(last, sizeof last, "%s", line);
        }
    }
    peer_finish(P, "torch", f, got, last, header);
}

/* Index of a column in a CSV header line (fields possibly quoted), -1 if absent. */
static int csv_column(const char *header, const char *name) {
    int col = 0;
    const char *p = header;
    while (*p) {
        const char *q = p;
        if (*q == '"') q++;
        size_t n = strlen(name);
        if (!strncmp(q, name, n) && (q[n] == '"' || q[n] == ',' || q[n] == '\n' || !q[n]))
            return col;
        while (*p && *p != ',') p++;
        if (*p == ',') p++, col++;
        else break;
    }
    return -1;
}

/* Field `col` of a CSV line into out (quotes dropped). */
static void csv_field(const char *line, int col, char *out, size_t size) {
    const char *p = line;
    int in_quotes = 0;
    for (int c = 0; c < col && *p; p++) {
        if (*p == '"') in_quotes = !in_quotes;
        else if (*p == ',' && !in_quotes) c++;
    }
    size_t n = 0;
    if (*p == '"') p++, in_quotes = 1;
    else in_quotes = 0;
    while (*p && n + 1 < size && (in_quotes ? *p != '"' : (*p != ',' && *p != '\n'))) out[n++] = *p++;
    out[n] = 0;
}

/* The weights' type in llama-bench's model_type ("llama 0.6B Q8_0", "qwen3 0.6B MXFP4 MoE",
 * "llama ?B BF16 (guessed)"): what follows the architecture and the size, less a "(guessed)"
 * (a file without general.file_type). */
static void llama_weights_type(const char *model_type, char *out, size_t size) {
    const char *p = model_type;
    for (int word = 0; word < 2 && strchr(p, ' '); word++) p = strchr(p, ' ') + 1;
    const char *guessed = strstr(p, " (guessed)");
    size_t n = guessed ? (size_t)(guessed - p) : strlen(p);
    if (n >= size) n = size - 1;
    memcpy(out, p, n);
    out[n] = 0;
}

/* llama.cpp's llama-bench (LLAMA_BENCH) on one GGUF: pp<prompt> and tg<context>, its rows
 * tagged with the GGUF's weight type. */
static void run_llama_gguf(peers *P, const char *bin, const char *gguf, uint32_t threads,
                           uint32_t prompt, uint32_t context, int reps) {
    if (!shell_safe(bin) || !shell_safe(gguf)) {
        peer_note(P, "llama: not run (a quote in %s or %s)", bin, gguf);
        return;
    }
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "'%s' -m '%s' -t %u -p %u -n %u -r %d -o csv 2>&1", bin, gguf,
             threads, prompt, context, reps);
    fprintf(stderr, "parity-speed: peer llama: %s\n", cmd);
    FILE *f = popen(cmd, "r");
    if (!f) {
        peer_note(P, "llama: not run (cannot start %s: %s)", bin, strerror(errno));
        return;
    }
    char line[4096], last[4096] = "", about[1024] = "", weights[16] = "?";
    int c_prompt = -1, c_gen = -1, c_ts = -1, c_sd = -1, c_cpu = -1, c_back = -1, c_commit = -1;
    int c_type = -1;
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        if (c_ts < 0 && strstr(line, "avg_ts")) {
            c_prompt = csv_column(line, "n_prompt"), c_gen = csv_column(line, "n_gen");
            c_ts = csv_column(line, "avg_ts"), c_sd = csv_column(line, "stddev_ts");
            c_cpu = csv_column(line, "cpu_info"), c_back = csv_column(line, "backends");
            c_commit = csv_column(line, "build_commit");
            c_type = csv_column(line, "model_type");
            continue;
        }
        if (c_ts >= 0 && c_prompt >= 0 && c_gen >= 0 && P->n < MAX_PEER_ROWS) {
            char a[64], b[64], ts[64], sd[64] = "0";
            csv_field(line, c_prompt, a, sizeof a), csv_field(line, c_gen, b, sizeof b);
            csv_field(line, c_ts, ts, sizeof ts);
            if (c_sd >= 0) csv_field(line, c_sd, sd, sizeof sd);
            const uint32_t np = (uint32_t)strtoul(a, NULL, 10), ng = (uint32_t)strtoul(b, NULL, 10);
            const double v = strtod(ts, NULL), sdev = strtod(sd, NULL);
            if (v <= 0 || (np == 0) == (ng == 0)) continue;
            if (c_type >= 0) {
                char type[128];
                csv_field(line, c_type, type, sizeof type);
                llama_weights_type(type, weights, sizeof weights);
            }
            peer_row *r = &P->rows[P->n++];
            *r = (peer_row){"llama", np ? "prefill" : "decode", threads, 1, np ? np : 1,
                            np ? np : ng, v, v - sdev, v + sdev, ""};
            snprintf(r->weights, sizeof r->weights, "%s", weights);
            if (!got) {
                char cpu[128] = "", back[64] = "", commit[64] = "";
                if (c_cpu >= 0) csv_field(line, c_cpu, cpu, sizeof cpu);
                if (c_back >= 0) csv_field(line, c_back, back, sizeof back);
                if (c_commit >= 0) csv_field(line, c_commit, commit, sizeof commit);
                snprintf(about, sizeof about, "%s (%s): llama-bench build %s, backend %s, %s "
                         "(min..max is the mean -/+ its standard deviation)", weights, gguf,
                         commit, back, cpu);
            }
            got++;
        } else if (c_ts < 0) {
            snprintf(last, sizeof last, "%s", line);
        }
    }
    peer_finish(P, "llama", f, got, last, about);
}

/* llama-bench on each GGUF of `ggufs` (comma-separated: a BF16 one of the model's shape and
 * the types llama-quantize made of it). */
static void run_llama_peer(peers *P, const char *ggufs, uint32_t threads, uint32_t prompt,
                           uint32_t context, int reps) {
    const char *bin = getenv("LLAMA_BENCH");
    if (!bin || !*bin || !ggufs || !*ggufs) {
        peer_note(P, "llama: not run (set LLAMA_BENCH to llama-bench, and LLAMA_GGUF or "
                     "--ggufs to GGUFs of the model's shape: BF16, and Q8_0, Q4_0, MXFP4, TQ2_0 "
                     "beside the formats)");
        return;
    }
    char list[1024];
    snprintf(list, sizeof list, "%s", ggufs);
    const char *files[MAX_LIST];
    const int n = split_list(list, files, MAX_LIST);
    for (int i = 0; i < n; i++) run_llama_gguf(P, bin, files[i], threads, prompt, context, reps);
}

/* Whether a llama.cpp weight type is the nearest to a preset's arithmetic: BF16 beside a
 * bf16 policy (F32, F16 beside fp32, fp16), Q8_0 beside FP8 and MXFP8, NVFP4, MXFP4 and Q4_0
 * beside NVFP4, MXFP4 and Q4_0 beside MXFP4, TQ2_0 and TQ1_0 beside ternary. */
static int llama_type_near(const char *preset, const char *type) {
    parity_policy pol;
    if (parity_policy_from_name(preset, &pol)) return 0;
    const char *near = "";
    switch (pol.gemm) {
    case PARITY_GEMM_BF16:
        near = pol.compute == PARITY_COMPUTE_BF16   ? "BF16"
               : pol.compute == PARITY_COMPUTE_FP16 ? "F16"
                                                    : "F32";
        break;
    case PARITY_GEMM_FP8_BLOCK:
    case PARITY_GEMM_MXFP8: near = "Q8_0"; break;
    case PARITY_GEMM_NVFP4: near = "NVFP4,MXFP4,Q4_0"; break;
    case PARITY_GEMM_MXFP4: near = "MXFP4,Q4_0"; break;
    case PARITY_GEMM_TERNARY: near = "TQ2_0,TQ1_0"; break;
    }
    /* the type's first word ("MXFP4" of "MXFP4 MoE") among the near ones */
    const size_t len = strcspn(type, " ");
    for (const char *p = near; *p;) {
        const size_t n = strcspn(p, ",");
        if (n == len && !strncmp(p, type, len)) return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* Whether a peer figure compares with a libparity row: same threads, phase and batch; the
 * same prompt length for prefill, the same context for a torch decode (llama's tg starts
 * from an empty context); a llama figure of a weight type near the row's preset. */
static int peer_fits(const peer_row *r, const char *phase, const char *preset, uint32_t threads,
                     uint32_t batch, uint32_t tokens, uint32_t context) {
    const int llama = !strcmp(r->peer, "llama");
    if (strcmp(r->phase, phase) || r->threads != threads || r->batch != batch) return 0;
    if (llama && !llama_type_near(preset, r->weights)) return 0;
    return !strcmp(phase, "prefill") ? r->tokens == tokens : (llama || r->context == context);
}

/* ---- options and output -------------------------------------------------------------------- */

static int split_uints(char *s, uint32_t *out) {
    const char *items[MAX_LIST];
    int n = split_list(s, items, MAX_LIST);
    for (int i = 0; i < n; i++) out[i] = (uint32_t)strtoul(items[i], NULL, 10);
    return n;
}

typedef struct result {
    const char *phase, *preset, *backend;
    parity_cpu_path path;
    uint32_t threads, batch, tokens, context;
    stat3 tps;
    double gbs, gflops;
    double step_bytes;  /* decode: the bytes a step reads (decode_step_bytes) */
    /* the machine's limits measured just before each repetition of the row's group (a VM's
     * neighbours change them from one second to the next): their medians (read bandwidth,
     * the better of the two page sizes; the row's peak), and the fractions of them the row
     * reached: the median over the repetitions of each repetition's speed against the limits
     * measured just before it */
    double limit_gbs, limit_gflops, mem_frac, fma_frac;
    /* prefill and score: the profile of the timed calls, per call (seconds): the decoder
     * layers (everything before the head), the head (final norm, lm_head, logits' rounding),
     * and the log-softmax, draws and log-probs */
    double layers_s, head_s, sampling_s;
    /* prefill and score: the untimed first call of the row's object (seconds), in which the
     * pages of its buffers are touched for the first time */
    double first_s;
    /* each repetition's tokens/s, in the order they ran (the presets of a group interleaved) */
    int reps;
    double rep_tps[MAX_REPS];
} result;

/* Whether two rows differ at most in their preset. */
static int same_row_but_preset(const result *a, const result *b) {
    return !strcmp(a->phase, b->phase) && !strcmp(a->backend, b->backend) && a->path == b->path &&
           a->threads == b->threads && a->batch == b->batch && a->tokens == b->tokens &&
           a->context == b->context;
}

/* A row's repetitions and limits (tps: its tokens/s per repetition, in order; gbs, gflops:
 * the limits measured before each), with x->gbs and x->gflops already the achieved rates at
 * the median tokens/s: the limits' medians and the median fractions reached. */
static void judge(result *x, const double *tps, const double *gbs, const double *gflops, int reps) {
    double mem[MAX_REPS], fma[MAX_REPS];
    x->reps = reps;
    for (int k = 0; k < reps; k++) {
        x->rep_tps[k] = tps[k];
        const double scale = x->tps.median > 0 ? tps[k] / x->tps.median : 0;
        mem[k] = gbs[k] > 0 ? x->gbs * scale / gbs[k] : 0;
        fma[k] = gflops[k] > 0 ? x->gflops * scale / gflops[k] : 0;
    }
    x->limit_gbs = summarise(gbs, reps).median;
    x->limit_gflops = summarise(gflops, reps).median;
    x->mem_frac = summarise(mem, reps).median;
    x->fma_frac = summarise(fma, reps).median;
}

/* How much faster row a ran than row b, measured in the same repetitions: the median over
 * the repetitions of the ratio of their tokens/s, minus 1. A phase of the machine that slows
 * one repetition slows both rows of it alike, where it moves either row's median alone. */
static double paired_speedup(const result *a, const result *b) {
    double r[MAX_REPS];
    const int n = a->reps < b->reps ? a->reps : b->reps;
    if (n < 1) return 0;
    for (int k = 0; k < n; k++) r[k] = b->rep_tps[k] > 0 ? a->rep_tps[k] / b->rep_tps[k] : 0;
    return summarise(r, n).median - 1;
}

/* The limits beside a group of rows, for `threads` threads and the peak of `kind`. */
static void group_limits(unsigned threads, bench_peak_kind kind, double *gbs, double *gflops) {
    const double a = measure_bandwidth(threads, 0), b = measure_bandwidth(threads, 1);
    *gbs = a > b ? a : b;
    *gflops = measure_fma_peak(threads, kind);
}

/* The peak a row is judged against: its CPU path's GEMM instruction, or AMX's on the amx
 * backend. */
static bench_peak_kind row_peak_kind(parity_backend backend, parity_cpu_path path) {
    return backend == PARITY_BACKEND_AMX ? BENCH_PEAK_AMX_BF16 : bench_peak_of_path(path);
}

/* The prefill row a score row is compared with: same preset, backend, path, threads and
 * tokens; NULL if the run has none. */
static const result *prefill_of(const result *res, int nres, const result *score) {
    for (int j = 0; j < nres; j++) {
        const result *z = &res[j];
        if (!strcmp(z->phase, "prefill") && !strcmp(z->preset, score->preset) &&
            !strcmp(z->backend, score->backend) && z->path == score->path &&
            z->threads == score->threads && z->tokens == score->tokens)
            return z;
    }
    return NULL;
}

/* ---- the command line and the modes ------------------------------------------------------- */

/* The command line, as given (the lists still comma-separated). */
typedef struct options {
    const char *model_spec, *json;
    char presets_s[256], backends_s[64], threads_s[64], prompts_s[64], batches_s[64];
    char contexts_s[64], peers_s[64], paths_s[64], thresholds_s[128], ggufs_s[1024];
    int reps, score_all, profile, contexts_given, early_exit, model_given, formats;
    uint32_t steps;
    uint32_t layers;       /* --layers: a synthetic shape cut to this many layers; 0: all */
    char model_label[256]; /* the model as the output names it: the spec, and the cut */
} options;

/* The lists of the command line, split, and the CPU paths to run (chosen: the library's). */
typedef struct plan {
    const char *presets[MAX_LIST], *backends[MAX_LIST];
    uint32_t threads[MAX_LIST], prompts[MAX_LIST], batches[MAX_LIST], contexts[MAX_LIST];
    int np, nb, nt, nl, nbatch, nc;
    parity_cpu_path paths[8], chosen;
    int npath;
} plan;

/* Parses the command line into o; returns -1 to go on, or the exit status (usage: 0 for
 * --help, 2 for an error). */
static int parse_options(int argc, char **argv, options *o) {
    *o = (options){.model_spec = "synthetic:qwen3-0.6b", .presets_s = "aligned,hf-eager,vllm",
                   .threads_s = "2", .prompts_s = "512", .batches_s = "1,32",
                   .contexts_s = "128", .peers_s = "torch,llama",
                   .thresholds_s = "0.5,0.7,0.9,0.99", .reps = 3, .steps = 4};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--quick")) {
            strcpy(o->presets_s, "aligned");
            strcpy(o->prompts_s, "64");
            strcpy(o->batches_s, "1,8");
            strcpy(o->contexts_s, "128");
            strcpy(o->peers_s, "none");
            o->reps = 1;
            o->steps = 4;
            continue;
        }
        if (!strcmp(a, "--score-all")) {
            o->score_all = 1;
            continue;
        }
        if (!strcmp(a, "--profile")) {
            o->profile = 1;
            continue;
        }
        if (!strcmp(a, "--early-exit")) {
            o->early_exit = 1;
            continue;
        }
        if (!strcmp(a, "--formats")) {
            o->formats = 1;
            continue;
        }
        if (option_is_help(a) || !option_value(argc, argv, &i, &v)) {
            fprintf(stderr, "usage: parity-speed [--model SPEC] [--presets LIST] [--backends LIST] "
                            "[--threads LIST] [--prompts LIST] [--batches LIST] [--contexts LIST] "
                            "[--steps N] [--reps N] [--layers N] [--paths LIST|all] [--peers LIST|none] [--score-all] "
                            "[--formats] [--ggufs LIST] [--profile] [--json FILE] [--quick] "
                            "[--early-exit [--thresholds LIST]]\n");
            return option_is_help(a) ? 0 : 2;
        }
        if (!strcmp(a, "--model")) o->model_spec = v, o->model_given = 1;
        else if (!strcmp(a, "--thresholds"))
            snprintf(o->thresholds_s, sizeof o->thresholds_s, "%s", v);
        else if (!strcmp(a, "--json")) o->json = v;
        else if (!strcmp(a, "--presets")) snprintf(o->presets_s, sizeof o->presets_s, "%s", v);
        else if (!strcmp(a, "--backends")) snprintf(o->backends_s, sizeof o->backends_s, "%s", v);
        else if (!strcmp(a, "--threads")) snprintf(o->threads_s, sizeof o->threads_s, "%s", v);
        else if (!strcmp(a, "--prompts")) snprintf(o->prompts_s, sizeof o->prompts_s, "%s", v);
        else if (!strcmp(a, "--batches")) snprintf(o->batches_s, sizeof o->batches_s, "%s", v);
        else if (!strcmp(a, "--contexts")) {
            snprintf(o->contexts_s, sizeof o->contexts_s, "%s", v);
            o->contexts_given = 1;
        }
        else if (!strcmp(a, "--steps")) o->steps = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--layers")) {
            if (bench_layers_option("parity-speed", v, &o->layers)) return 2;
        }
        else if (!strcmp(a, "--reps")) o->reps = atoi(v);
        else if (!strcmp(a, "--peers")) snprintf(o->peers_s, sizeof o->peers_s, "%s", v);
        else if (!strcmp(a, "--paths")) snprintf(o->paths_s, sizeof o->paths_s, "%s", v);
        else if (!strcmp(a, "--ggufs")) snprintf(o->ggufs_s, sizeof o->ggufs_s, "%s", v);
        else {
            fprintf(stderr, "parity-speed: unknown option %s\n", a);
            return 2;
        }
    }
    if (!o->ggufs_s[0] && getenv("LLAMA_GGUF"))
        snprintf(o->ggufs_s, sizeof o->ggufs_s, "%s", getenv("LLAMA_GGUF"));
    if (o->reps < 1 || o->reps > MAX_REPS || o->steps < 1) {
        fprintf(stderr, "parity-speed: --reps must be 1..50 and --steps >= 1\n");
        return 2;
    }

    return -1;
}

/* The presets --formats adds, those of them the list lacks: bf16 vllm, aligned, and each
 * quantized format under vllm's roundings with the quantizer its checkpoints ship. */
static const char *const format_presets[] = {"vllm", "aligned", "vllm+fp8-block:deepseek",
                                             "vllm+mxfp8:ocp", "vllm+nvfp4:modelopt",
                                             "vllm+mxfp4:ocp", "vllm+ternary:bitnet"};

/* Appends the format presets pl lacks; -1 (reported) when the list would be too long. */
static int add_format_presets(plan *pl) {
    const int n = (int)(sizeof format_presets / sizeof *format_presets);
    for (int i = 0; i < n; i++) {
        int have = 0;
        for (int j = 0; j < pl->np; j++) have |= !strcmp(pl->presets[j], format_presets[i]);
        if (have) continue;
        if (pl->np == MAX_LIST) {
            fprintf(stderr, "parity-speed: --formats adds %s beside the presets, which makes "
                            "more than %d: name fewer with --presets\n", format_presets[i],
                    MAX_LIST);
            return -1;
        }
        pl->presets[pl->np++] = format_presets[i];
    }
    return 0;
}

/* Splits o's lists into pl (o's list strings are cut up) and picks the CPU paths: the
 * library's choice, every SIMD one this CPU has, or the listed ones. Returns 0, or the exit
 * status 2 for a bad list. */
static int make_plan(options *o, plan *pl) {
    /* every backend this CPU runs, unless --backends names them */
    if (!o->backends_s[0])
        snprintf(o->backends_s, sizeof o->backends_s, "%s",
                 parity_backend_check(PARITY_BACKEND_AMX) == PARITY_OK ? "bf16,amx" : "bf16");
    pl->np = split_list(o->presets_s, pl->presets, MAX_LIST);
    if (o->formats && add_format_presets(pl)) return 2;
    pl->nb = split_list(o->backends_s, pl->backends, MAX_LIST);
    pl->nt = split_uints(o->threads_s, pl->threads);
    pl->nl = split_uints(o->prompts_s, pl->prompts);
    pl->nbatch = split_uints(o->batches_s, pl->batches);
    pl->nc = split_uints(o->contexts_s, pl->contexts);
    for (int i = 0; i < pl->nbatch; i++)
        if (pl->batches[i] < 1 || pl->batches[i] > 64) {
            fprintf(stderr, "parity-speed: batches must be 1..64\n");
            return 2;
        }
    pl->npath = 0;
    pl->chosen = parity_get_cpu_path();
    if (!o->paths_s[0]) {
        pl->paths[pl->npath++] = pl->chosen;
    } else if (!strcmp(o->paths_s, "all")) {
        for (int p = PARITY_CPU_AVX2; p <= PARITY_CPU_AVX512BF16; p++)
            if (parity_set_cpu_path((parity_cpu_path)p) == PARITY_OK)
                pl->paths[pl->npath++] = (parity_cpu_path)p;
        parity_set_cpu_path(pl->chosen);
    } else {
        const char *names[MAX_LIST];
        const int n = split_list(o->paths_s, names, MAX_LIST);
        for (int i = 0; i < n && pl->npath < 8; i++) {
            if (parity_cpu_path_from_name(names[i], &pl->paths[pl->npath]) ||
                parity_set_cpu_path(pl->paths[pl->npath])) {
                fail("--paths");
                return 2;
            }
            pl->npath++;
        }
        parity_set_cpu_path(pl->chosen);
    }
    return 0;
}

/* --early-exit: the looped model's decode at each threshold (run_early_exit). */
static int early_exit_mode(options *o, const plan *pl, parity_model *model) {
    parity_backend backend;
    if (parity_backend_from_name(pl->backends[0], &backend)) return fail("--backends") ? 2 : 2;
    float thr[MAX_LIST];
    int nthr = 0;
    for (char *t = strtok(o->thresholds_s, ","); t && nthr < MAX_LIST; t = strtok(NULL, ","))
        thr[nthr++] = strtof(t, NULL);
    const run_cfg cfg = {model, pl->presets[0], backend, pl->threads[pl->nt - 1]};
    const int rc = run_early_exit(&cfg, o->model_spec, pl->batches, pl->nbatch,
                                  o->contexts_given ? pl->contexts[0] : 32, thr, nthr, o->steps,
                                  o->reps, o->json);
    return rc ? 1 : 0;
}

/* --profile: where the time goes (run_profile). */
static int profile_mode(const options *o, plan *pl, parity_model *model) {
    parity_backend backend;
    if (parity_backend_from_name(pl->backends[0], &backend)) return fail("--backends") ? 2 : 2;
    if (!o->contexts_given)
        pl->nc = 3, pl->contexts[0] = 128, pl->contexts[1] = 1024, pl->contexts[2] = 4096;
    const run_cfg cfg = {model, pl->presets[0], backend, pl->threads[pl->nt - 1]};
    const int rc = run_profile(&cfg, pl->prompts[0], pl->batches, pl->nbatch, pl->contexts,
                               pl->nc, o->steps, o->json);
    return rc ? 1 : 0;
}

/* The machine's limits per thread count, measured at the start: decode is judged against the
 * better of the two bandwidths; peaks[t][kind]: every peak loop this CPU runs (a row is
 * judged against its path's), peak_text[t] their list for the header. */
typedef struct machine {
    double bandwidth[MAX_LIST], bw_4k[MAX_LIST], bw_huge[MAX_LIST];
    double peaks[MAX_LIST][BENCH_PEAK_KINDS];
    char peak_text[MAX_LIST][256];
} machine;

static void measure_machine(const plan *pl, machine *mc) {
    memset(mc, 0, sizeof *mc);
    for (int t = 0; t < pl->nt; t++) {
        mc->bw_4k[t] = measure_bandwidth(pl->threads[t], 0);
        mc->bw_huge[t] = measure_bandwidth(pl->threads[t], 1);
        mc->bandwidth[t] = mc->bw_4k[t] > mc->bw_huge[t] ? mc->bw_4k[t] : mc->bw_huge[t];
        for (int k = 1; k < BENCH_PEAK_KINDS; k++) {
            if (!bench_peak_available((bench_peak_kind)k)) continue;
            mc->peaks[t][k] = measure_fma_peak(pl->threads[t], (bench_peak_kind)k);
            const size_t used = strlen(mc->peak_text[t]);
            snprintf(mc->peak_text[t] + used, sizeof mc->peak_text[t] - used, "%s%s %.0f",
                     used ? ", " : "", bench_peak_instruction((bench_peak_kind)k),
                     mc->peaks[t][k]);
        }
        fprintf(stderr, "parity-speed: %u thread(s): read bandwidth %.1f GB/s (4 KB pages), "
                        "%.1f GB/s (huge pages), peaks (GFLOP/s): %s\n",
                pl->threads[t], mc->bw_4k[t], mc->bw_huge[t],
                mc->peak_text[t][0] ? mc->peak_text[t] : "none");
    }
}

/* The rows of the table, as they are measured. */
typedef struct rows {
    result *v;
    int n;
} rows;

/* The prefill rows of every preset and the score rows (the first preset's, or every one's
 * with --score-all) of prompt length L, for one path, backend and thread count, interleaved.
 * Returns 0, or the exit status 1. */
static int measure_prompt_group(const options *o, const plan *pl, const run_cfg *cfg,
                                const model_size *ms, int pi, int b, int t, uint32_t L,
                                rows *out) {
    const int np = pl->np, reps = o->reps;
    const int ns = o->score_all ? np : 1, nrun = np + ns;
    prompt_run runs[2 * MAX_LIST];
    for (int q = 0; q < nrun; q++)
        if (prompt_open(&cfg[q < np ? q : q - np], q >= np, L, &runs[q])) return 1;
    double lim_gbs[MAX_REPS], lim_gflops[MAX_REPS];
    double v[2 * MAX_LIST][MAX_REPS];
    for (int k = 0; k < reps; k++) {
        group_limits(pl->threads[t], row_peak_kind(cfg[0].backend, pl->paths[pi]), &lim_gbs[k],
                     &lim_gflops[k]);
        for (int i = 0; i < nrun; i++) {
            /* the presets' prefills rotate, each repetition starting one later; the score
             * rows follow them (a score's 311 MB of logits slowed the call after it, which a
             * rotation of all four would always give to the same preset) */
            const int q = i < np ? (k + i) % np : i;
            const double dt = prompt_time(&runs[q]);
            if (dt < 0) return 1;
            v[q][k] = L / dt;
        }
    }
    parity_profile prof[2 * MAX_LIST];
    double first_s[2 * MAX_LIST];
    for (int q = 0; q < nrun; q++) {
        first_s[q] = runs[q].first_s;
        const int rc = prompt_profile(&runs[q], &prof[q]);
        prompt_close(&runs[q]);
        if (rc) return fail("profile");
    }
    for (int q = 0; q < nrun; q++) {
        const int phase = q >= np, p = phase ? q - np : q;
        result *x = &out->v[out->n++];
        *x = (result){.phase = phase ? "score" : "prefill", .preset = pl->presets[p],
                      .backend = pl->backends[b], .path = pl->paths[pi],
                      .threads = pl->threads[t], .batch = 1, .tokens = L, .context = L,
                      .tps = summarise(v[q], reps)};
        const double flops = ms->flops_per_tok * L + ms->attn_flops * L * (L + 1) / 2 +
                             ms->head_flops * (phase ? L : 1);
        x->gflops = flops / (L / x->tps.median) / 1e9;
        judge(x, v[q], lim_gbs, lim_gflops, reps);
        const parity_profile *pr = &prof[q];
        const double calls = reps; /* prefill: an add and a step each */
        x->head_s = pr->phase_seconds[PARITY_PHASE_HEAD] / calls;
        x->sampling_s = pr->phase_seconds[PARITY_PHASE_SAMPLING] / calls;
        x->layers_s = pr->call_seconds / calls - x->head_s - x->sampling_s;
        x->first_s = first_s[q];
    }
    return 0;
}

/* The decode rows of every preset at batch B and context `context`, for one path, backend
 * and thread count, step by step interleaved. Returns 0, or the exit status 1. */
static int measure_decode_group(const options *o, const plan *pl, const run_cfg *cfg,
                                const model_size *ms, int pi, int b, int t, uint32_t B,
                                uint32_t context, rows *out) {
    const int np = pl->np, reps = o->reps;
    const uint32_t steps = o->steps;
    decode_run d[MAX_LIST];
    double lim_gbs[MAX_REPS], lim_gflops[MAX_REPS];
    for (int p = 0; p < np; p++)
        if (decode_open(&cfg[p], B, context, (steps + 1) * (uint32_t)reps, NULL, &d[p])) return 1;
    double tps[MAX_LIST][MAX_REPS];
    for (int k = 0; k < reps; k++) {
        group_limits(pl->threads[t], row_peak_kind(cfg[0].backend, pl->paths[pi]), &lim_gbs[k],
                     &lim_gflops[k]);
        /* an untimed step of each, then the timed steps preset after preset, step by step
         * (each repetition starting one later): a burst or a lull of the machine, which lasts
         * a second or two, then falls on every preset's steps alike */
        double sum[MAX_LIST] = {0};
        for (uint32_t st = 0; st <= steps; st++)
            for (int i = 0; i < np; i++) {
                const int p = (k + i) % np;
                const double dt = decode_step(&d[p]);
                if (dt < 0) return 1;
                if (st) sum[p] += dt;
            }
        for (int p = 0; p < np; p++) tps[p][k] = B / (sum[p] / steps);
    }
    for (int p = 0; p < np; p++) {
        parity_sampler_free(d[p].s);
        result *x = &out->v[out->n++];
        *x = (result){.phase = "decode", .preset = pl->presets[p], .backend = pl->backends[b],
                      .path = pl->paths[pi], .threads = pl->threads[t], .batch = B,
                      .tokens = B, .context = context, .tps = summarise(tps[p], reps)};
        const double step_s = B / x->tps.median;
        /* the KV positions a timed step attends, on average: the prompt's full blocks shared
         * by the B forks, then each sequence's own (the rest of the prompt, the tokens of the
         * steps before it, the untimed ones included, and its new one); step j after
         * decode_open attends context + 1 + j positions */
        const uint32_t block = parity_kv_block_tokens();
        const double shared = context / block * block;
        const double own = context + 1 + 0.5 * (steps + 1) * reps - shared;
        parity_weight_bytes bytes;
        if (preset_bytes(cfg[p].model, pl->presets[p], cfg[p].backend, &bytes)) return 1;
        x->step_bytes = decode_step_bytes(&bytes, B, shared, own);
        x->gbs = x->step_bytes / step_s / 1e9;
        x->gflops = B * (ms->flops_per_tok + ms->head_flops + ms->attn_flops * (context + 1)) /
                    step_s / 1e9;
        judge(x, tps[p], lim_gbs, lim_gflops, reps);
    }
    return 0;
}

/* Every row of the table: per CPU path, backend and thread count, the prompt groups, then
 * the decode groups. The presets of a configuration are measured interleaved, repetition by
 * repetition (preset 1, 2, 3, then 2, 3, 1, then 3, 1, 2: each repetition starts one later,
 * so that no preset always runs first after the limits' measurement; a prompt group's score
 * rows after its prefills; decode rows step by step within a repetition), so that a drift of
 * the machine's speed over the run falls on all of them alike and their spread (printed
 * below) means something. At the default 3 repetitions the paired spread of identical
 * kernels read 0.3-6% here; --reps 6 or 10 resolves a few percent. Returns 0, or the exit
 * status. */
static int measure_rows(const options *o, const plan *pl, parity_model *model,
                        const model_size *ms, rows *out) {
    for (int pi = 0; pi < pl->npath; pi++) {
        parity_set_cpu_path(pl->paths[pi]);
        for (int b = 0; b < pl->nb; b++) {
            parity_backend backend;
            if (parity_backend_from_name(pl->backends[b], &backend)) {
                fail("--backends");
                return 2;
            }
            for (int t = 0; t < pl->nt; t++) {
                run_cfg cfg[MAX_LIST];
                for (int p = 0; p < pl->np; p++)
                    cfg[p] = (run_cfg){model, pl->presets[p], backend, pl->threads[t]};
                fprintf(stderr, "parity-speed: %s / %s / %u thread(s):", pl->backends[b],
                        parity_cpu_path_name(pl->paths[pi]), pl->threads[t]);
                for (int p = 0; p < pl->np; p++)
                    fprintf(stderr, "%s%s", p ? ", " : " ", pl->presets[p]);
                fputc('\n', stderr);
                /* prefill and score of a prompt length in one group, interleaved too: the
                 * score is compared with the prefill below */
                for (int li = 0; li < pl->nl; li++) {
                    const int rc = measure_prompt_group(o, pl, cfg, ms, pi, b, t, pl->prompts[li],
                                                        out);
                    if (rc) return rc;
                }
                for (int ci = 0; ci < pl->nc; ci++)
                    for (int bi = 0; bi < pl->nbatch; bi++)
                        if (measure_decode_group(o, pl, cfg, ms, pi, b, t, pl->batches[bi],
                                                 pl->contexts[ci], out))
                            return 1;
            }
        }
    }
    parity_set_cpu_path(pl->chosen);
    return 0;
}

/* The peers, at the largest thread count, on the first preset's shape. */
static void run_peers(const options *o, const plan *pl, peers *P) {
    if (!strcmp(o->peers_s, "none")) return;
    uint32_t tmax = pl->threads[0], lmax = pl->prompts[0];
    for (int t = 1; t < pl->nt; t++) tmax = pl->threads[t] > tmax ? pl->threads[t] : tmax;
    for (int l = 1; l < pl->nl; l++) lmax = pl->prompts[l] > lmax ? pl->prompts[l] : lmax;
    char batch_list[64] = "";
    for (int i = 0; i < pl->nbatch; i++)
        snprintf(batch_list + strlen(batch_list), sizeof batch_list - strlen(batch_list),
                 "%s%u", i ? "," : "", pl->batches[i]);
    char peer_copy[64];
    snprintf(peer_copy, sizeof peer_copy, "%s", o->peers_s);
    const char *which[MAX_LIST];
    int nw = split_list(peer_copy, which, MAX_LIST);
    for (int i = 0; i < nw; i++) {
        if (!strcmp(which[i], "torch") && o->layers)
            peer_note(P, "torch: not run (torch_peer.py runs a built-in shape whole, not cut "
                         "by --layers)");
        else if (!strcmp(which[i], "torch"))
            run_torch_peer(P, o->model_spec, tmax, lmax, batch_list, pl->contexts[0], o->steps,
                           o->reps);
        else if (!strcmp(which[i], "llama"))
            run_llama_peer(P, o->ggufs_s, tmax, lmax, pl->contexts[0], o->reps);
        else
            peer_note(P, "%s: unknown peer (torch, llama)", which[i]);
    }
}

/* The table of rows on stdout, with its header. */
static void print_rows(const options *o, const plan *pl, const machine *mc, const rows *rs) {
    const result *res = rs->v;
    const int nres = rs->n;
    printf("parity-speed: %s, libparity %s, CPU path %s (its GEMM's peak: %s)\n", o->model_label,
           parity_version(), parity_cpu_path_name(pl->chosen),
           bench_peak_instruction(bench_peak_of_path(pl->chosen)));
    for (int t = 0; t < pl->nt; t++)
        printf("machine, %u thread(s), at the start: read bandwidth %.1f GB/s (4 KB pages), %.1f "
               "GB/s (huge pages); peaks (GFLOP/s): %s\n", pl->threads[t], mc->bw_4k[t],
               mc->bw_huge[t], mc->peak_text[t][0] ? mc->peak_text[t] : "none");
    printf("(the limits are measured again before every repetition of a group of rows; a row's bound is "
           "the median of its limits and the median over its repetitions of the fraction of them "
           "it reached)\n");
    /* the preset column as wide as the longest name ("aligned+fp8-block:deepseek") */
    int pw = 9;
    for (int i = 0; i < nres; i++)
        if ((int)strlen(res[i].preset) > pw) pw = (int)strlen(res[i].preset);
    printf("\n%-8s %-*s %-8s %-10s %3s %5s %6s %7s %10s %17s  %s\n", "phase", pw, "preset",
           "backend", "path", "thr", "batch", "tokens", "context", "tok/s", "(min..max)", "bound");
    for (int i = 0; i < nres; i++) {
        const result *x = &res[i];
        char bound[96];
        const double mem_frac = x->mem_frac, fma_frac = x->fma_frac;
        if (!strcmp(x->phase, "decode") && mem_frac >= fma_frac)
            snprintf(bound, sizeof bound, "%.1f GB/s of %.1f (%.0f%%)", x->gbs, x->limit_gbs,
                     100 * mem_frac);
        else
            snprintf(bound, sizeof bound, "%.0f GFLOP/s of %.0f (%.0f%%)", x->gflops,
                     x->limit_gflops, 100 * fma_frac);
        printf("%-8s %-*s %-8s %-10s %3u %5u %6u %7u %10.1f (%6.1f..%6.1f)  %s\n", x->phase,
               pw, x->preset, x->backend, parity_cpu_path_name(x->path), x->threads, x->batch,
               x->tokens, x->context, x->tps.median, x->tps.min, x->tps.max, bound);
    }
}

/* The presets' spread per row of the other columns, printed: the largest paired speed-up of
 * one preset over another (paired_speedup: repetition by repetition, the presets having run
 * interleaved), and, beside it, the fastest median over the slowest. spreads[i]: row i's
 * paired spread when it is the first of its group of at least two, -1 otherwise. */
static void print_spreads(const rows *rs, double *spreads) {
    const result *res = rs->v;
    const int nres = rs->n;
    int spread_header = 0;
    for (int i = 0; i < nres; i++) {
        const result *x = &res[i];
        double lo = x->tps.median, hi = x->tps.median, paired = 0;
        int n = 0, first = 1;
        spreads[i] = -1;
        for (int j = 0; j < nres; j++) {
            const result *z = &res[j];
            if (!same_row_but_preset(z, x)) continue;
            if (j < i) first = 0;
            lo = z->tps.median < lo ? z->tps.median : lo;
            hi = z->tps.median > hi ? z->tps.median : hi;
            for (int k = 0; k < nres; k++)
                if (k != j && same_row_but_preset(&res[k], x)) {
                    const double up = paired_speedup(z, &res[k]);
                    paired = up > paired ? up : paired;
                }
            n++;
        }
        if (!first || n < 2) continue;
        spreads[i] = paired;
        if (!spread_header)
            printf("\npreset spread (presets measured interleaved: the largest speed-up of one preset over another, "
                   "as the median over the repetitions of their per-repetition ratio; in brackets the fastest "
                   "median over the slowest, which a phase of the machine during one preset's repetition moves)\n");
        spread_header = 1;
        printf("  %-8s %-8s %-10s thr %u batch %2u tokens %5u context %5u: %4.1f%% over %d presets (%4.1f%%)\n",
               x->phase, x->backend, parity_cpu_path_name(x->path), x->threads, x->batch, x->tokens,
               x->context, 100 * paired, n, 100 * (hi / lo - 1));
    }
}

/* Scoring should cost prefill plus one large GEMM (the head on every row): each score row's
 * calls split by their profile, beside the prefill row's of the same tokens. */
static void print_score_against_prefill(const rows *rs, const model_size *ms) {
    const result *res = rs->v;
    const int nres = rs->n;
    int score_header = 0;
    for (int i = 0; i < nres; i++) {
        const result *x = &res[i];
        const result *pf = !strcmp(x->phase, "score") ? prefill_of(res, nres, x) : NULL;
        if (!pf) continue;
        const double head_gflop = ms->head_flops * x->tokens / 1e9;
        const double head_gflops = x->head_s > 0 ? head_gflop / x->head_s : 0;
        if (!score_header)
            printf("\nscore against prefill, per call from the profile of the timed calls (layers: all before the "
                   "head; head: final norm, lm_head, logits' rounding; log-probs: log-softmax and draws)\n");
        score_header = 1;
        printf("  %-9s %-8s %-10s thr %u tokens %5u: score %.0f ms = layers %.0f + head %.0f + "
               "log-probs %.0f; prefill %.0f ms = layers %.0f + head %.0f + draw %.0f; the score's "
               "head: %.1f GFLOP at %.0f GFLOP/s (%.0f%% of %.0f); first calls (untimed, the buffers' "
               "pages touched): score %.0f ms, prefill %.0f ms\n",
               x->preset, x->backend, parity_cpu_path_name(x->path), x->threads, x->tokens,
               1e3 * (x->layers_s + x->head_s + x->sampling_s), 1e3 * x->layers_s, 1e3 * x->head_s,
               1e3 * x->sampling_s, 1e3 * (pf->layers_s + pf->head_s + pf->sampling_s),
               1e3 * pf->layers_s, 1e3 * pf->head_s, 1e3 * pf->sampling_s, head_gflop, head_gflops,
               x->limit_gflops > 0 ? 100 * head_gflops / x->limit_gflops : 0, x->limit_gflops,
               1e3 * x->first_s, 1e3 * pf->first_s);
    }
}

/* What each preset reads and holds on each backend, asked of the library once the rows ran
 * (each preset's copies built by then), and the process's resident set beside it. */
typedef struct memory {
    const char *preset[MAX_LIST * MAX_LIST], *backend[MAX_LIST * MAX_LIST];
    parity_weight_bytes bytes[MAX_LIST * MAX_LIST];
    int n;
    double rss;  /* the process's VmRSS (bytes), 0 where /proc does not tell */
} memory;

/* The process's resident set (VmRSS of /proc/self/status) in bytes, 0 if unknown. */
static double process_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = strtod(line + 6, NULL);
    if (f) fclose(f);
    return kb * 1024;
}

/* Fills mem for every backend and preset of the plan; -1 when a query fails (reported). */
static int measure_memory(const plan *pl, const parity_model *model, memory *mem) {
    mem->n = 0;
    for (int b = 0; b < pl->nb; b++) {
        parity_backend backend;
        if (parity_backend_from_name(pl->backends[b], &backend)) return fail("--backends");
        for (int p = 0; p < pl->np; p++, mem->n++) {
            mem->preset[mem->n] = pl->presets[p], mem->backend[mem->n] = pl->backends[b];
            if (preset_bytes(model, pl->presets[p], backend, &mem->bytes[mem->n])) return -1;
        }
    }
    mem->rss = process_rss();
    return 0;
}

static void print_memory(const memory *mem) {
    printf("\nbytes per preset, as the library counts them (parity_model_bytes; quantized codes as "
           "the model holds them, E4M3 one a byte, E2M1 two a byte, ternary four a byte (a row's "
           "in groups of 64 codes in 16 bytes), and their scales as fp32, NVFP4's and MXFP4's a "
           "byte each as their checkpoints ship them): a decode step reads "
           "the linear layers once (codes and scales, or values), the head and the norms once, an "
           "embedding row and the attended KV positions per sequence (the forks' shared prompt "
           "blocks once); held: the weights a model serving the preset alone holds "
           "(parity_model_bytes' held_for_policy: the values as loaded and the copies the preset "
           "reads); the process's resident set (VmRSS), every preset's copies in one model: "
           "%.2f GB\n", mem->rss / 1e9);
    printf("  %-24s %-8s %10s %9s %9s %9s %12s %9s\n", "preset", "backend", "linear MB",
           "head MB", "norms KB", "embed B", "KV/pos KB", "held MB");
    for (int i = 0; i < mem->n; i++) {
        const parity_weight_bytes *b = &mem->bytes[i];
        printf("  %-24s %-8s %10.1f %9.1f %9.1f %9llu %12.1f %9.1f\n", mem->preset[i],
               mem->backend[i], b->step_linear / 1e6, b->step_head / 1e6, b->step_vectors / 1e3,
               (unsigned long long)b->embedding_row, b->kv_position / 1e3,
               b->held_for_policy / 1e6);
    }
}

/* A libparity row and a peer figure it is compared with. */
typedef struct peer_ratio {
    const result *x;
    const peer_row *r;
} peer_ratio;

/* Every pair of a prefill or decode row and a peer figure that fits it (peer_fits), row by
 * row, torch's before llama's: *n of them, in an array to free (NULL when none). */
static peer_ratio *peer_ratios(const peers *P, const rows *rs, int *n) {
    *n = 0;
    peer_ratio *out = P->n ? malloc((size_t)rs->n * (size_t)P->n * sizeof *out) : NULL;
    if (!out) return NULL;
    for (int i = 0; i < rs->n; i++) {
        const result *x = &rs->v[i];
        if (!strcmp(x->phase, "score")) continue;
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < P->n; j++) {
                const peer_row *r = &P->rows[j];
                if (!strcmp(r->peer, k ? "llama" : "torch") &&
                    peer_fits(r, x->phase, x->preset, x->threads, x->batch, x->tokens,
                              x->context))
                    out[(*n)++] = (peer_ratio){x, r};
            }
    }
    return out;
}

/* The peers' notes and rows, and each libparity row's ratio to the peer rows it matches. */
static void print_peers(const peers *P, const rows *rs) {
    if (P->n_notes) printf("\npeers\n");
    for (int i = 0; i < P->n_notes; i++) printf("  %s\n", P->notes[i]);
    if (!P->n) return;
    printf("\n%-8s %-10s %-8s %3s %5s %6s %7s %10s %17s\n", "peer", "weights", "phase", "thr",
           "batch", "tokens", "context", "tok/s", "(min..max)");
    for (int i = 0; i < P->n; i++) {
        const peer_row *r = &P->rows[i];
        printf("%-8s %-10s %-8s %3u %5u %6u %7u %10.1f (%6.1f..%6.1f)\n", r->peer, r->weights,
               r->phase, r->threads, r->batch, r->tokens, r->context, r->tps, r->lo, r->hi);
    }
    printf("\nratios libparity / peer (tok/s; llama.cpp's figures beside the presets of the "
           "nearest arithmetic: BF16 beside bf16, Q8_0 beside FP8 and MXFP8, NVFP4, MXFP4 and "
           "Q4_0 beside the 4-bit formats, TQ2_0 beside ternary)\n");
    int n = 0;
    peer_ratio *pr = peer_ratios(P, rs, &n);
    for (int i = 0; i < n; i++) {
        const result *x = pr[i].x;
        const peer_row *r = pr[i].r;
        printf("  %-8s %-9s %-8s %-10s thr %u batch %2u context %5u: %6.2f x %s (%s)\n",
               x->phase, x->preset, x->backend, parity_cpu_path_name(x->path), x->threads,
               x->batch, x->context, x->tps.median / r->tps, r->peer, r->weights);
    }
    free(pr);
}

/* --json FILE: the run's configuration, machines, rows, spreads, score splits and peers.
 * Returns 0, or the exit status 1 when the file cannot be written. */
/* The JSON's config.layers is --layers, 0 when the shape runs whole. */
static int write_json(const options *o, const plan *pl, const machine *mc, const rows *rs,
                      const double *spreads, const peers *P, const model_size *ms,
                      const memory *mem) {
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "parity-speed: cannot write %s\n", o->json);
        return 1;
    }
    fprintf(f, "{\"config\": {\"model\": \"%s\", \"layers\": %u, \"version\": \"%s\", "
               "\"reps\": %d, \"steps\": %u, "
               "\"formats\": %s, \"peak_instruction\": \"%s\"},\n \"machines\": [",
            o->model_spec, o->layers, parity_version(),
            o->reps, o->steps, o->formats ? "true" : "false",
            bench_peak_instruction(bench_peak_of_path(pl->chosen)));
    const bench_peak_kind chosen_kind = bench_peak_of_path(pl->chosen);
    for (int t = 0; t < pl->nt; t++) {
        fprintf(f, "%s{\"threads\": %u, \"bandwidth_gbs\": %.2f, \"bandwidth_4k_gbs\": %.2f, "
                   "\"bandwidth_huge_gbs\": %.2f, \"bf16_peak_gflops\": %.1f, \"cpu_path\": \"%s\", "
                   "\"peaks_gflops\": {",
                t ? ", " : "", pl->threads[t], mc->bandwidth[t], mc->bw_4k[t], mc->bw_huge[t],
                mc->peaks[t][chosen_kind], parity_cpu_path_name(pl->chosen));
        for (int k = 1, n = 0; k < BENCH_PEAK_KINDS; k++)
            if (bench_peak_available((bench_peak_kind)k))
                fprintf(f, "%s\"%s\": %.1f", n++ ? ", " : "", bench_peak_key((bench_peak_kind)k),
                        mc->peaks[t][k]);
        fprintf(f, "}}");
    }
    fprintf(f, "],\n \"machine\": {\"threads\": %u, \"bandwidth_gbs\": %.2f, \"bf16_peak_gflops\": %.1f, "
               "\"cpu_path\": \"%s\"},\n \"results\": [", pl->threads[pl->nt - 1],
            mc->bandwidth[pl->nt - 1],
            mc->peaks[pl->nt - 1][chosen_kind], parity_cpu_path_name(pl->chosen));
    for (int i = 0; i < rs->n; i++) {
        const result *x = &rs->v[i];
        fprintf(f, "%s\n  {\"phase\": \"%s\", \"preset\": \"%s\", \"backend\": \"%s\", "
                   "\"cpu_path\": \"%s\", \"threads\": %u, "
                   "\"batch\": %u, \"tokens\": %u, \"context\": %u, \"tokens_per_s\": %.3f, "
                   "\"tokens_per_s_min\": %.3f, \"tokens_per_s_max\": %.3f, \"achieved_gbs\": %.3f, "
                   "\"achieved_gflops\": %.3f, \"peak_gflops\": %.1f, \"bandwidth_gbs\": %.2f, "
                   "\"fraction_of_bandwidth\": %.4f, \"fraction_of_peak\": %.4f, "
                   "\"step_bytes\": %.0f}",
                i ? "," : "", x->phase, x->preset, x->backend, parity_cpu_path_name(x->path),
                x->threads, x->batch, x->tokens, x->context, x->tps.median, x->tps.min,
                x->tps.max, x->gbs, x->gflops, x->limit_gflops, x->limit_gbs, x->mem_frac,
                x->fma_frac, x->step_bytes);
    }
    fprintf(f, "\n],\n \"memory\": {\"source\": \"parity_model_bytes\", "
               "\"process_rss_bytes\": %.0f, \"presets\": [", mem->rss);
    for (int i = 0; i < mem->n; i++) {
        const parity_weight_bytes *b = &mem->bytes[i];
        fprintf(f, "%s\n  {\"preset\": \"%s\", \"backend\": \"%s\", \"step_linear_bytes\": %llu, "
                   "\"step_head_bytes\": %llu, \"step_vector_bytes\": %llu, "
                   "\"embedding_row_bytes\": %llu, \"kv_position_bytes\": %llu, "
                   "\"held_bytes\": %llu, \"held_for_preset_bytes\": %llu}",
                i ? "," : "", mem->preset[i], mem->backend[i],
                (unsigned long long)b->step_linear, (unsigned long long)b->step_head,
                (unsigned long long)b->step_vectors, (unsigned long long)b->embedding_row,
                (unsigned long long)b->kv_position, (unsigned long long)b->held,
                (unsigned long long)b->held_for_policy);
    }
    fprintf(f, "\n]},\n \"preset_spread\": [");
    for (int i = 0, n = 0; i < rs->n; i++) {
        const result *x = &rs->v[i];
        if (spreads[i] < 0) continue;
        fprintf(f, "%s\n  {\"phase\": \"%s\", \"backend\": \"%s\", \"cpu_path\": \"%s\", "
                   "\"threads\": %u, \"batch\": %u, \"tokens\": %u, \"context\": %u, "
                   "\"paired_spread\": %.4f}",
                n++ ? "," : "", x->phase, x->backend, parity_cpu_path_name(x->path), x->threads,
                x->batch, x->tokens, x->context, spreads[i]);
    }
    fprintf(f, "\n],\n \"score_over_prefill\": [");
    for (int i = 0, n = 0; i < rs->n; i++) {
        const result *x = &rs->v[i];
        const result *pf = !strcmp(x->phase, "score") ? prefill_of(rs->v, rs->n, x) : NULL;
        if (!pf) continue;
        const double head_gflop = ms->head_flops * x->tokens / 1e9;
        fprintf(f, "%s\n  {\"preset\": \"%s\", \"backend\": \"%s\", \"cpu_path\": \"%s\", "
                   "\"threads\": %u, \"tokens\": %u, \"score_layers_seconds\": %.6f, "
                   "\"score_head_seconds\": %.6f, \"score_logprobs_seconds\": %.6f, "
                   "\"prefill_layers_seconds\": %.6f, \"prefill_head_seconds\": %.6f, "
                   "\"prefill_draw_seconds\": %.6f, \"head_gflop\": %.3f, "
                   "\"head_gflops\": %.3f, \"peak_gflops\": %.1f, "
                   "\"score_first_call_seconds\": %.6f, \"prefill_first_call_seconds\": %.6f}",
                n++ ? "," : "", x->preset, x->backend, parity_cpu_path_name(x->path), x->threads,
                x->tokens, x->layers_s, x->head_s, x->sampling_s, pf->layers_s, pf->head_s,
                pf->sampling_s, head_gflop, x->head_s > 0 ? head_gflop / x->head_s : 0,
                x->limit_gflops, x->first_s, pf->first_s);
    }
    fprintf(f, "\n],\n \"peer_notes\": [");
    for (int i = 0; i < P->n_notes; i++) {
        fprintf(f, "%s\"", i ? ", " : "");
        for (const char *c = P->notes[i]; *c; c++)
            if (*c == '"' || *c == '\\') fprintf(f, "\\%c", *c);
            else if ((unsigned char)*c >= 0x20) fputc(*c, f);
        fprintf(f, "\"");
    }
    fprintf(f, "],\n \"peers\": [");
    for (int i = 0; i < P->n; i++) {
        const peer_row *r = &P->rows[i];
        fprintf(f, "%s\n  {\"peer\": \"%s\", \"weights\": \"%s\", \"phase\": \"%s\", "
                   "\"threads\": %u, \"batch\": %u, "
                   "\"tokens\": %u, \"context\": %u, \"tokens_per_s\": %.3f, "
                   "\"tokens_per_s_min\": %.3f, \"tokens_per_s_max\": %.3f}",
                i ? "," : "", r->peer, r->weights, r->phase, r->threads, r->batch, r->tokens,
                r->context, r->tps, r->lo, r->hi);
    }
    fprintf(f, "],\n \"ratios\": [");
    int n = 0;
    peer_ratio *pr = peer_ratios(P, rs, &n);
    for (int i = 0; i < n; i++) {
        const result *x = pr[i].x;
        const peer_row *r = pr[i].r;
        fprintf(f, "%s\n  {\"phase\": \"%s\", \"preset\": \"%s\", \"backend\": \"%s\", "
                   "\"cpu_path\": \"%s\", \"threads\": %u, \"batch\": %u, \"context\": %u, "
                   "\"peer\": \"%s\", \"peer_weights\": \"%s\", "
                   "\"libparity_over_peer\": %.4f}",
                i ? "," : "", x->phase, x->preset, x->backend, parity_cpu_path_name(x->path),
                x->threads, x->batch, x->context, r->peer, r->weights, x->tps.median / r->tps);
    }
    free(pr);
    fprintf(f, "\n]}\n");
    fclose(f);
    return 0;
}

/* The table: the machine's limits, every row, the peers, then the output. */
static int table_mode(const options *o, const plan *pl, parity_model *model,
                      const model_size *ms) {
    machine mc;
    measure_machine(pl, &mc);
    rows rs = {calloc(512, sizeof *rs.v), 0};
    int rc = measure_rows(o, pl, model, ms, &rs);
    if (rc) return rc;
    memory mem;
    bw_free(); /* the bandwidth's 2 GiB of buffers, out of the resident set measured next */
    if (measure_memory(pl, model, &mem)) return 1;
    peers P = {.n = 0};
    run_peers(o, pl, &P);
    double spreads[512];
    print_rows(o, pl, &mc, &rs);
    print_memory(&mem);
    print_spreads(&rs, spreads);
    print_score_against_prefill(&rs, ms);
    print_peers(&P, &rs);
    if (o->json) rc = write_json(o, pl, &mc, &rs, spreads, &P, ms, &mem);
    free(rs.v);
    return rc;
}

/* The model of o's spec; with --layers, its shape cut to that many layers (bench_layers.h).
 * Sets o->model_label: the spec, and the cut with what it means. */
static int open_model(options *o, parity_model **model) {
    snprintf(o->model_label, sizeof o->model_label, "%s", o->model_spec);
    if (!o->layers) return parity_model_open(o->model_spec, model) ? fail(o->model_spec) : 0;
    parity_config c;
    uint64_t seed;
    uint32_t whole;
    if (bench_cut_shape("parity-speed", o->model_spec, o->layers, parity_config_builtin, &c,
                        &seed, &whole))
        return -1;
    snprintf(o->model_label, sizeof o->model_label,
             "%s cut to %u of its %u layers (--layers; a layer's speed and bandwidth do not "
             "depend on the depth: a step of the whole shape runs %u/%u as much in its layers)",
             o->model_spec, o->layers, whole, whole, o->layers);
    return parity_model_synthetic(&c, seed, model) ? fail(o->model_spec) : 0;
}

int main(int argc, char **argv) {
    options o;
    plan pl;
    int rc = parse_options(argc, argv, &o);
    if (rc >= 0) return rc;
    if ((rc = make_plan(&o, &pl))) return rc;
    if (o.early_exit && !o.model_given) o.model_spec = "synthetic:ouro-1.4b";
    parity_model *model;
    fprintf(stderr, "parity-speed: loading %s\n", o.model_spec);
    if (open_model(&o, &model)) return 1;
    const model_size ms = size_of(parity_model_config(model));
    if (o.early_exit) rc = early_exit_mode(&o, &pl, model);
    else if (o.profile) rc = profile_mode(&o, &pl, model);
    else rc = table_mode(&o, &pl, model, &ms);
    if (rc) return rc;
    if (!o.early_exit && !o.profile) bw_free();
    parity_model_free(model);
    return 0;
}
