/* Specs: what a kernel is specialized on, canonicalized so that equivalent
 * requests share one kernel. */
#ifndef FG_SPEC_H
#define FG_SPEC_H

#include <stddef.h>

#include "flashgen.h"

/* Validate and canonicalize: fields that do not apply are zeroed, flags are
 * 0/1. Returns 0, or -1 with err naming the field and the reason. */
int spec_canonicalize(const fg_spec *in, fg_spec *out, char *err, size_t err_len);

/* Short name of a canonical spec: "bf16_d128_causal_drop_bfly3_b64x64". */
void spec_name(const fg_spec *spec, char *buf, size_t len);

/* Head dim rounded up to the tensor-core k step (16). */
int spec_head_dim_padded(const fg_spec *spec);

const char *spec_dtype_name(fg_dtype dtype);
const char *spec_mask_name(fg_mask mask);

#endif
