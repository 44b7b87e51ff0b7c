/* What the mma.sync families share: the tensor cores they drive. */
#ifndef FG_MMA_SYNC_H
#define FG_MMA_SYNC_H

#include <stddef.h>

#include "flashgen.h"
#include "gen/profile.h"

/* bf16 needs the tensor cores of sm_80; Turing's have none. Returns 0, or -1
 * with the reason in err. */
int mma_sync_supports(const fg_spec *spec, const fg_profile *profile, char *err, size_t err_len);

#endif
