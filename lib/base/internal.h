/* The transition header of issue 49's re-housing: the base headers at once, for the files
 * not yet converted to include only what they need (base/ and engine/ are converted; they do
 * not include this). Nothing here is API. */
#ifndef PARITY_INTERNAL_H
#define PARITY_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "parity.h"

#include "alloc.h"
#include "errors.h"
#include "floats.h"
#include "in_use.h"
#include "nametable.h"

#endif /* PARITY_INTERNAL_H */
