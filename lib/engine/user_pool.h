/* A caller's parity_pool (parity_ops.h) as the engine's calls outside ops.c run on it (the
 * manifests' checksums): defined in ops.c, which owns the pool's struct. */
#ifndef PARITY_ENGINE_USER_POOL_H
#define PARITY_ENGINE_USER_POOL_H

#include "base/threadpool.h"
#include "parity.h"

/* The threads to run a call of `fn` on: those of `pool`, entered (PARITY_ERR_BUSY, with fn in
 * the message, if another call is using it), or for NULL a one-thread pool of the call's own.
 * user_pool_leave(pool, *out) releases what user_pool_enter took. */
int user_pool_enter(parity_pool *pool, threadpool **out, const char *fn);
void user_pool_leave(parity_pool *pool, threadpool *taken);

#endif /* PARITY_ENGINE_USER_POOL_H */
