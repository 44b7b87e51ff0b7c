/* The family table: which families exist and which one a (pass, target)
 * gets. The first family in the table that serves a pass on an arch and
 * supports the spec is the one its calls use; a family that cannot take a
 * call (its `accepts`) hands it to the next. */
#include <stdio.h>
#include <string.h>

#include "families/block_mask.h"
#include "families/bwd_sm80.h"
#include "families/bwd_sm90a.h"
#include "families/family.h"
#include "families/fwd_decode.h"
#include "families/fwd_mla.h"
#include "families/fwd_mla_sm90a.h"
#include "families/fwd_sm80.h"
#include "families/fwd_sm90a.h"

static const kernel_family *const family_table[] = {
    /* before fwd_sm80: faster where it serves (docs/benchmarks.md); over a
     * KV cache it takes the calls of many queries (chunked prefill) and
     * hands the decoding steps to fwd_decode (its accepts) */
    &fwd_sm90a_family,
    &fwd_decode_family,    /* the decoding steps (spec.kv_cache) */
    &fwd_mla_sm90a_family, /* those over a latent cache (FG_KV_LATENT), on sm_90 */
    &fwd_mla_family,       /* the rest over a latent cache */
    &fwd_sm80_family,
    &bwd_sm90a_family, /* before bwd_sm80: the specs and calls it takes */
    &bwd_sm80_family,
    &block_mask_family, /* block masks' builds (fg_block_mask_create) */
};
#define FAMILY_COUNT ((int)(sizeof family_table / sizeof family_table[0]))

static int serves(const kernel_family *f, int cc) {
    return cc >= f->min_cc && (f->max_cc == 0 || cc <= f->max_cc);
}

int families_for(fg_pass pass, const fg_profile *profile, const kernel_family **out, int max) {
    int n = 0;
    for (int i = 0; i < FAMILY_COUNT && n < max; i++)
        if (family_table[i]->pass == pass && serves(family_table[i], profile->arch))
            out[n++] = family_table[i];
    return n;
}

const kernel_family *family_for(fg_pass pass, const fg_profile *profile) {
    const kernel_family *f = NULL;
    return families_for(pass, profile, &f, 1) ? f : NULL;
}

const kernel_family *family_named(const char *name) {
    for (int i = 0; i < FAMILY_COUNT; i++)
        if (strcmp(family_table[i]->name, name) == 0) return family_table[i];
    return NULL;
}

const char *family_names(char *buf, size_t len) {
    size_t used = 0;
    if (len) buf[0] = '\0';
    for (int i = 0; i < FAMILY_COUNT && used < len; i++) {
        int n = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", family_table[i]->name);
        if (n < 0) break;
        used += (size_t)n;
    }
    return buf;
}

kernel_target family_target(const kernel_family *f, const fg_profile *profile) {
    kernel_target t = {profile->arch, f->arch_specific};
    return t;
}
