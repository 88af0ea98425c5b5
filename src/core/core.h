/* Internal helpers shared by every part of the library (the public ones
 * are in whale_util.h). */
#ifndef WHALE_CORE_H
#define WHALE_CORE_H

#include "whale_util.h"

/* Overflow-checked size arithmetic: returns 0 on overflow. */
int whale_mul_size(size_t a, size_t b, size_t *out);

#endif
