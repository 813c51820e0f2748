/* The monotonic clock of the forward's profile. */
#include "profile.h"

#include <time.h>

double profile_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
