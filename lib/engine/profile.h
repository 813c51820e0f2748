/* The forward's profile: the monotonic clock (profile.c) and the laps of its phases. */
#ifndef PARITY_ENGINE_PROFILE_H
#define PARITY_ENGINE_PROFILE_H

#include "forward_types.h"

/* The monotonic clock in seconds, for the profile. */
double profile_now(void);

/* A phase's lap: adds the time since *t to the phase and restarts *t; no clock is read
 * without a profile. Start with t = phase_start(ctx). */
static inline double phase_start(const fwd_ctx *ctx) { return ctx->prof ? profile_now() : 0.0; }
static inline void phase_lap(const fwd_ctx *ctx, parity_phase phase, double *t) {
    if (!ctx->prof) return;
    const double now = profile_now();
    ctx->prof->phase_s[phase] += now - *t;
    *t = now;
}

#endif /* PARITY_ENGINE_PROFILE_H */
