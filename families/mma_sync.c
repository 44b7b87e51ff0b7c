#include "families/mma_sync.h"

#include <stdio.h>

int mma_sync_supports(const fg_spec *spec, const fg_profile *prof, char *err, size_t err_len) {
    if (spec->dtype == FG_BF16 && prof->arch < 80) {
        snprintf(err, err_len,
                 "spec.dtype: bf16 needs sm_80 or newer; %s is sm_%d (Turing tensor cores have "
                 "no bf16): use fp16",
                 prof->name, prof->arch);
        return -1;
    }
    return 0;
}
