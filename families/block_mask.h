/* block_mask: the build of a block mask (templates/kernel_block_mask.lua),
 * for sm_75 and later. A spec's mask predicate is classified over the
 * blocks of its layout into empty, partial and full, and written as the
 * layout's lists, full blocks marked, which the forward and backward
 * families walk as any layout's (fg_block_mask_create). Nothing to plan or
 * tune: 256 threads per block of the layout, 128 per list. */
#ifndef FG_BLOCK_MASK_H
#define FG_BLOCK_MASK_H

#include "families/family.h"
#include "flashgen.h"

extern const kernel_family block_mask_family;

/* The spec a block mask for calls of `spec` is built with: what the
 * predicate and the blocks need of it (its mask predicate, aux tensors and
 * block sizes), the rest at defaults, so that specs differing elsewhere
 * share one kernel. Returns 0, or -1 with why spec's calls take no block
 * mask. */
int block_mask_spec(const fg_spec *spec, fg_spec *out, char *err, size_t err_len);

#endif
