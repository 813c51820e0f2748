/* The thread pool: persistent workers woken by a generation counter.
 *
 * A decode step calls pool_run about 15 times per layer, often on loops of a few hundred
 * microseconds, so a round trip must cost a few microseconds, not a system call:
 *   - the caller publishes a loop by writing its description and bumping `generation`, all
 *     on one cache line, and touches the mutex and condition variable only when a worker is
 *     actually asleep (`sleepers`);
 *   - workers spin on `generation` (pause) for WORKER_SPIN_NS before they sleep, long enough
 *     to span the serial gaps between the loops of a step;
 *   - the caller, after its own share, spins on `remaining` (its own cache line, the only
 *     one the workers write in a round trip) for CALLER_SPIN_NS, then sleeps;
 *   - a spin yields the core at each look at the clock (keep_spinning), so that where
 *     threads outnumber cores (two processes on two cores) the one waited for gets to run
 *     instead of waiting out a scheduler slice: 10x on test_looped in a parallel suite;
 *   - the sleeps use the usual "announce, re-check, wait" handshake, so a wake-up is never
 *     lost (see wait_generation and wait_workers).
 * pool_run splits [0, n_tasks) into contiguous ranges, one per worker, statically;
 * pool_run_dynamic hands out chunks of tasks to whichever worker asks next, so that a worker
 * slowed down (by a neighbour on the core, say) takes fewer. Which thread computes a task
 * never changes a result: tasks are independent and per-worker scratch holds nothing from
 * one call of fn to the next. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "alloc.h"
#include "errors.h"

#define CACHE_LINE 64
/* How long an idle worker spins before it sleeps, and how long the caller spins on the
 * workers still running before it sleeps. */
#define WORKER_SPIN_NS 200000
#define CALLER_SPIN_NS 100000
/* The most workers a pool times (engine_check allows 256 threads). */
#define POOL_MAX_WORKERS 256

/* Spin iterations between two looks at the clock. */
#define SPINS_PER_CLOCK 64

struct threadpool {
    /* fixed at creation */
    unsigned n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* workers sleep here for the next generation */
    pthread_cond_t done;    /* the caller sleeps here for `remaining` to reach 0 */
    atomic_int stop;

    /* The caller's line: the loop, then its generation, published together. Workers only
     * read it. */
    alignas(CACHE_LINE) pool_fn fn;
    void *ctx;
    size_t n_tasks;
    size_t chunk;            /* 0: static ranges; else tasks handed out `chunk` at a time */
    atomic_uint generation;  /* bumped for every loop (and for shutdown) */

    /* The next task of a dynamic loop, taken by every worker. */
    alignas(CACHE_LINE) atomic_size_t next;

    /* Written by workers: once per loop each, and on sleeping. */
    alignas(CACHE_LINE) atomic_uint remaining;  /* workers still running the current loop */
    atomic_int caller_sleeping;                 /* the caller waits on `done` */
    alignas(CACHE_LINE) atomic_uint sleepers;   /* workers waiting (or about to) on `wake` */
    char pad[CACHE_LINE - sizeof(atomic_uint)];
    /* pool_set_timing: set by the caller between loops, read by the workers in a loop */
    int timing;
    long long overhead_ns;   /* the caller's sums */
    uint64_t loops;
    alignas(CACHE_LINE) long long busy_ns[POOL_MAX_WORKERS];  /* each worker's time in fn */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

static inline long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

unsigned fp_env_enter(void) {
#if defined(__x86_64__)
    unsigned saved = _mm_getcsr();
    _mm_setcsr(0x1f80u); /* all exceptions masked, round to nearest, FTZ and DAZ off */
    return saved;
#else
    return 0;
#endif
}

void fp_env_restore(unsigned saved) {
#if defined(__x86_64__)
    _mm_setcsr(saved);
#else
    (void)saved;
#endif
}

static void run_tasks(threadpool *p, unsigned worker) {
    if (p->chunk) {
        for (;;) {
            const size_t begin = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
            if (begin >= p->n_tasks) return;
            const size_t end = p->n_tasks - begin < p->chunk ? p->n_tasks : begin + p->chunk;
            p->fn(p->ctx, begin, end, worker);
        }
    }
    size_t begin = p->n_tasks * worker / p->n, end = p->n_tasks * (worker + 1) / p->n;
    if (begin < end) p->fn(p->ctx, begin, end, worker);
}

/* A worker's share of the loop, timed into busy_ns when the pool is timing. */
static void run_share(threadpool *p, unsigned worker) {
    if (!p->timing || worker >= POOL_MAX_WORKERS) {
        run_tasks(p, worker);
        return;
    }
    const long long t0 = now_ns();
    run_tasks(p, worker);
    p->busy_ns[worker] = now_ns() - t0;
}

/* The spin before a sleep: keep_spinning() after each check that failed relaxes the CPU and
 * says whether to check again, until `spin_ns` have passed since the first reading of the
 * clock (read every SPINS_PER_CLOCK checks). */
typedef struct spinner {
    unsigned checks;
    long long deadline;  /* 0 until the first reading */
    long long spin_ns;
} spinner;

static int keep_spinning(spinner *s) {
    cpu_relax();
    if (++s->checks % SPINS_PER_CLOCK != 0) return 1;
    long long t = now_ns();
    if (s->deadline == 0) {
        s->deadline = t + s->spin_ns;
        return 1;
    }
    /* The thread this one waits for may be waiting for a core (more runnable threads than
     * cores: another process, or more workers than cores): let it run. With nothing else
     * runnable the yield returns at once (about a microsecond per SPINS_PER_CLOCK pauses). */
    sched_yield();
    return t <= s->deadline;
}

/* Waits for a generation other than `seen` and returns it. The sleep is safe against the
 * caller's bump: a worker counts itself in `sleepers` (under the mutex) before it re-checks
 * the generation, and the caller bumps the generation before it reads `sleepers` (both
 * sequentially consistent), so either the worker sees the new generation or the caller sees
 * the sleeper and broadcasts, which it can only do once the worker waits (it needs the
 * mutex). */
static unsigned wait_generation(threadpool *p, unsigned seen) {
    unsigned gen;
    spinner s = {0, 0, WORKER_SPIN_NS};
    do {
        gen = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (gen != seen) return gen;
    } while (keep_spinning(&s));
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->sleepers, 1, memory_order_seq_cst);
    while ((gen = atomic_load_explicit(&p->generation, memory_order_seq_cst)) == seen)
        pthread_cond_wait(&p->wake, &p->mu);
    atomic_fetch_sub_explicit(&p->sleepers, 1, memory_order_relaxed);
    pthread_mutex_unlock(&p->mu);
    return gen;
}

/* The caller's side of the same handshake for `remaining` and `caller_sleeping`. */
static void wait_workers(threadpool *p) {
    spinner s = {0, 0, CALLER_SPIN_NS};
    do {
        if (atomic_load_explicit(&p->remaining, memory_order_acquire) == 0) return;
    } while (keep_spinning(&s));
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->caller_sleeping, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&p->remaining, memory_order_seq_cst) != 0)
        pthread_cond_wait(&p->done, &p->mu);
    atomic_store_explicit(&p->caller_sleeping, 0, memory_order_relaxed);
    pthread_mutex_unlock(&p->mu);
}

typedef struct worker_arg {
    threadpool *pool;
    unsigned index;
} worker_arg;

static void *worker_main(void *arg_) {
    worker_arg arg = *(worker_arg *)arg_;
    px_free(arg_);
    threadpool *p = arg.pool;
    fp_env_enter();
    unsigned seen = 0;
    for (;;) {
        seen = wait_generation(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
        run_share(p, arg.index);
        if (atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_seq_cst) == 1 &&
            atomic_load_explicit(&p->caller_sleeping, memory_order_seq_cst)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int pool_create(unsigned n_workers, threadpool **out) {
    if (n_workers == 0) n_workers = 1;
    /* aligned: the hot fields sit on their own cache lines */
    threadpool *p = px_aligned_alloc(sizeof *p, "thread pool");
    if (!p) return PARITY_ERR_OUT_OF_MEMORY;
    memset(p, 0, sizeof *p);
    p->n = n_workers;
    atomic_init(&p->generation, 0);
    atomic_init(&p->remaining, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->stop, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_workers > 1) {
        p->threads = px_calloc(n_workers - 1, sizeof *p->threads, "thread pool threads");
        if (!p->threads) {
            p->n = 1;
            pool_free(p);
            return PARITY_ERR_OUT_OF_MEMORY;
        }
    }
    for (unsigned i = 1; i < n_workers; i++) {
        worker_arg *arg = px_malloc(sizeof *arg, "thread pool worker");
        if (arg) *arg = (worker_arg){.pool = p, .index = i};
        int rc = arg ? pthread_create(&p->threads[i - 1], NULL, worker_main, arg) : -1;
        if (rc != 0) {
            px_free(arg);
            p->n = i; /* the workers started so far are joined by pool_free */
            pool_free(p);
            return arg ? set_error(PARITY_ERR_OUT_OF_MEMORY, "cannot start thread %u of %u",
                                   i, n_workers)
                       : PARITY_ERR_OUT_OF_MEMORY;
        }
    }
    *out = p;
    return PARITY_OK;
}

void pool_free(threadpool *p) {
    if (!p) return;
    if (p->n > 1) {
        atomic_store(&p->stop, 1);
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add_explicit(&p->generation, 1, memory_order_seq_cst);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
        for (unsigned i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    px_free(p->threads);
    px_free(p);
}

unsigned pool_size(const threadpool *p) { return p->n; }

uint64_t pool_bytes(unsigned n_workers) {
    if (n_workers <= 1) return sizeof(threadpool);
    return sizeof(threadpool) + (uint64_t)(n_workers - 1) * (sizeof(pthread_t) + sizeof(worker_arg));
}

static void run_loop(threadpool *p, pool_fn fn, void *ctx, size_t n_tasks, size_t chunk) {
    if (n_tasks == 0) return;
    if (p->n == 1 || n_tasks == 1) {
        fn(ctx, 0, n_tasks, 0);
        return;
    }
    const long long t0 = p->timing ? now_ns() : 0;  /* the publication is dispatch too */
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    p->chunk = chunk;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    /* every worker has finished the previous loop (the caller waited for remaining == 0),
     * so nobody reads the fields above while they change */
    atomic_store_explicit(&p->remaining, p->n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&p->sleepers, memory_order_seq_cst) != 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    run_share(p, 0);
    wait_workers(p);
    if (p->timing) {
        /* the workers wrote busy_ns before their release of `remaining`, which the caller
         * acquired in wait_workers */
        const long long wall = now_ns() - t0;
        long long slowest = 0;
        for (unsigned i = 0; i < p->n && i < POOL_MAX_WORKERS; i++)
            if (p->busy_ns[i] > slowest) slowest = p->busy_ns[i];
        p->overhead_ns += wall > slowest ? wall - slowest : 0;
        p->loops++;
    }
}

void pool_set_timing(threadpool *p, int on) {
    p->timing = on != 0;
    p->overhead_ns = 0;
    p->loops = 0;
}

void pool_timing(const threadpool *p, double *overhead_s, uint64_t *loops) {
    *overhead_s = (double)p->overhead_ns * 1e-9;
    *loops = p->loops;
}

void pool_run(threadpool *p, pool_fn fn, void *ctx, size_t n_tasks) {
    run_loop(p, fn, ctx, n_tasks, 0);
}

void pool_run_dynamic(threadpool *p, pool_fn fn, void *ctx, size_t n_tasks, size_t chunk) {
    run_loop(p, fn, ctx, n_tasks, chunk ? chunk : 1);
}
