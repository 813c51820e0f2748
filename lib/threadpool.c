/* The thread pool: persistent workers woken by a generation counter. Workers spin briefly
 * (a decode step runs many short loops back to back) and then sleep on a condition
 * variable. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "internal.h"

#define SPIN_ITERATIONS 2000

struct threadpool {
    unsigned n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_cond_t done;
    atomic_uint generation;  /* bumped for every loop (and for shutdown) */
    atomic_uint remaining;   /* workers still running the current loop */
    atomic_int stop;
    pool_fn fn;
    void *ctx;
    size_t n_tasks;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
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

static void run_share(threadpool *p, unsigned worker) {
    size_t begin = p->n_tasks * worker / p->n, end = p->n_tasks * (worker + 1) / p->n;
    if (begin < end) p->fn(p->ctx, begin, end, worker);
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
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen) {
            if (++spins < SPIN_ITERATIONS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->generation, memory_order_acquire) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = gen;
        if (atomic_load(&p->stop)) return NULL;
        run_share(p, arg.index);
        if (atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int pool_create(unsigned n_workers, threadpool **out) {
    if (n_workers == 0) n_workers = 1;
    threadpool *p = px_calloc(1, sizeof *p, "thread pool");
    if (!p) return PARITY_ERR_OUT_OF_MEMORY;
    p->n = n_workers;
    atomic_init(&p->generation, 0);
    atomic_init(&p->remaining, 0);
    atomic_init(&p->stop, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_workers > 1) {
        p->threads = px_calloc(n_workers - 1, sizeof *p->threads, "thread pool threads");
        if (!p->threads) {
            p->n = 1; /* no worker started: nothing for pool_free to stop or join */
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
        atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
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

void pool_run(threadpool *p, pool_fn fn, void *ctx, size_t n_tasks) {
    if (n_tasks == 0) return;
    if (p->n == 1 || n_tasks == 1) {
        fn(ctx, 0, n_tasks, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->remaining, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->remaining, memory_order_acquire) != 0) {
        if (++spins < SPIN_ITERATIONS) {
            cpu_relax();
            continue;
        }
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->remaining, memory_order_acquire) != 0)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
