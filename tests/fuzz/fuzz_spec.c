/* Any spec a caller may build: every field from the input, enums and flags
 * out of range among them, expressions and tensor declarations from its
 * tail. Each target's plan, and for some inputs its generated source, of
 * the forward, the backward and a block mask's build: a status and a
 * message, never a crash or a read out of bounds, and a plan that is made
 * is one that fits the target.
 * Input: 24 bytes of fields, then the score expression, a 0 byte, the mask
 * predicate. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashgen.h"
#include "tests/fuzz/fuzz.h"

static const char *const targets[] = {"t4", "a100", "rtx3090", "l4", "h100"};
#define TARGETS ((int)(sizeof targets / sizeof targets[0]))

const fuzz_seed fuzz_seeds[] = {
    FUZZ_SEED("\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x08\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x01\x01\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x0b\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x04\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x01\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x0c\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x0a\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x01\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x04\x00\x01\x00\x01\x00\x08" "s + bias[h, q - k]\0" ""),
    FUZZ_SEED("\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x01\x01\x01" "\0" "doc[q] == doc[k]"),
    FUZZ_SEED("\x00\x00\x04\x00\x00\x00\x00\x02\x04\x04\x04\x02\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x04\x00\x00\x00\x00\x01\x00\x04\x04\x00\x00\x00\x00\x00\x00\x04\x02\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x0c\x48\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x08\x00\x00\x00\x01\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x01\x01\x00\x00\x00\x00\x00" "\0" ""),
    FUZZ_SEED("\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x01\x01\x04\x01\x01\x00\x00\x00\x00" "\0" ""),
};
const int fuzz_seed_count = (int)(sizeof fuzz_seeds / sizeof fuzz_seeds[0]);

/* small values most of the time, anything now and then */
static int field(const uint8_t *b, int small) {
    const int v = (int8_t)b[0];
    return b[1] & 0x80 ? (int)((uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[1] << 8 | b[0])
                       : small ? v % (small + 2) : v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static fg_context *ctx[TARGETS];
    if (!ctx[0])
        for (int i = 0; i < TARGETS; i++)
            FUZZ_CHECK(fg_context_create(&ctx[i], targets[i]) == FG_OK, "no offline context for %s", targets[i]);
    if (size < 24) return 0;
    const uint8_t *b = data;
    static const int dims[] = {8, 16, 32, 40, 64, 72, 80, 96, 128, 160, 192, 256, 576, 0, 1, 257};
    fg_spec s = fg_spec_default(64, FG_FP16);
    s.dtype = (fg_dtype)field(b + 0, 2);
    s.head_dim = b[2] & 0x80 ? field(b + 2, 0) : dims[b[2] % 16];
    s.head_dim_v = b[3] & 0x80 ? field(b + 3, 0) : b[3] & 0x40 ? dims[b[3] % 16] : 0;
    s.mask = (fg_mask)field(b + 4, 3);
    s.dropout = field(b + 6, 1);
    s.sparsity = (fg_sparsity)field(b + 7, 3);
    s.sparse_block_q = b[9] & 0x80 ? field(b + 8, 0) : 16 * (b[9] % 9);
    s.sparse_block_k = b[10] & 0x80 ? field(b + 10, 0) : 16 * (b[10] % 9);
    s.butterfly_factors = field(b + 11, 31);
    s.varlen = field(b + 12, 1);
    s.kv_cache = field(b + 13, 2);
    s.softcap = field(b + 14, 1);
    s.alibi = field(b + 15, 1);
    s.sinks = field(b + 16, 1);
    const int target = b[17] % TARGETS;
    const fg_pass pass = (fg_pass)(b[18] % 3);
    const int source = b[19] & 1;
    /* the expressions and up to three tensor declarations */
    char text[2][1200];
    size_t at = 24, n;
    for (int e = 0; e < 2; e++) {
        for (n = 0; at < size && data[at] && n < sizeof text[e] - 1; n++) text[e][n] = (char)data[at++];
        text[e][n] = '\0';
        at++;
    }
    static const char *const names[] = {"bias", "doc", "t3", "s", "exp", "", "x-y", "a23456789012345678901234567890123"};
    s.score_mod = text[0][0] || (b[20] & 1) ? text[0] : NULL;
    s.mask_mod = text[1][0] || (b[20] & 2) ? text[1] : NULL;
    s.aux_count = field(b + 21, 3);
    if (s.aux_count >= 0 && s.aux_count <= FG_MAX_AUX)
        for (int i = 0; i < s.aux_count; i++)
            s.aux[i] = (fg_aux_decl){names[(b[22] >> (2 * i)) % 8], (fg_aux_type)((b[23] >> i) & 1),
                                     1 + (b[23] >> (3 + i)) % 4};

    fg_plan_info info;
    memset(&info, 0, sizeof info);
    fg_status st = fg_plan(ctx[target], &s, pass, &info);
    const char *msg = fg_context_message(ctx[target]);
    FUZZ_CHECK(msg != NULL, "no message");
    if (st != FG_OK) {
        FUZZ_CHECK(strlen(msg) > 0, "%s refused without a message", fg_status_name(st));
        return 0;
    }
    /* (a block mask's build has no tiles) */
    FUZZ_CHECK(info.threads >= 32 && info.threads <= 1024 &&
                   (pass == FG_PASS_BLOCK_MASK || (info.block_m > 0 && info.block_n > 0)) &&
                   info.smem_bytes >= 0 && info.smem_bytes <= 227 * 1024 &&
                   memchr(info.kernel_name, '\0', sizeof info.kernel_name) &&
                   memchr(info.why, '\0', sizeof info.why),
               "a plan no target holds: %d threads, %dx%d, %d bytes", info.threads, info.block_m, info.block_n,
               info.smem_bytes);
    if (source) {
        const char *src = NULL;
        st = fg_source(ctx[target], &s, pass, &src);
        FUZZ_CHECK(st != FG_OK || (src && strlen(src) > 0), "no source for a planned spec");
        FUZZ_CHECK(st == FG_OK || strlen(fg_context_message(ctx[target])) > 0, "source refused without a message");
    }
    return 0;
}
