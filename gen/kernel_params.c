#include "gen/kernel_params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KP_FIELD(type, name) {#type, #name, offsetof(STRUCT, name), 1},
#define KP_ARRAY(type, name, count) {#type, #name, offsetof(STRUCT, name), count},

#define STRUCT fg_fwd_params
static const param_field fwd_fields[] = {FWD_PARAMS(KP_FIELD, KP_ARRAY)};
#undef STRUCT
#define STRUCT fg_fwd_tma_params
static const param_field fwd_tma_fields[] = {FWD_TMA_PARAMS(KP_FIELD, KP_ARRAY)};
#undef STRUCT
#define STRUCT fg_bwd_params
static const param_field bwd_fields[] = {BWD_PARAMS(KP_FIELD, KP_ARRAY)};
#undef STRUCT
#define STRUCT fg_bwd_tma_params
static const param_field bwd_tma_fields[] = {BWD_TMA_PARAMS(KP_FIELD, KP_ARRAY)};
#undef STRUCT
#define STRUCT fg_decode_params
static const param_field decode_fields[] = {DECODE_PARAMS(KP_FIELD, KP_ARRAY)};
#undef STRUCT
#define STRUCT fg_decode_tma_params
static const param_field decode_tma_fields[] = {DECODE_TMA_PARAMS(KP_FIELD, KP_ARRAY)};
#undef STRUCT
#define STRUCT fg_block_mask_params
static const param_field block_mask_fields[] = {BLOCK_MASK_PARAMS(KP_FIELD, KP_ARRAY)};
#undef STRUCT

const params_layout fwd_params_layout = {"fg_fwd_params", sizeof(fg_fwd_params), fwd_fields,
                                         (int)(sizeof fwd_fields / sizeof fwd_fields[0])};
const params_layout fwd_tma_params_layout = {
    "fg_fwd_tma_params", sizeof(fg_fwd_tma_params), fwd_tma_fields,
    (int)(sizeof fwd_tma_fields / sizeof fwd_tma_fields[0])};
const params_layout bwd_params_layout = {"fg_bwd_params", sizeof(fg_bwd_params), bwd_fields,
                                         (int)(sizeof bwd_fields / sizeof bwd_fields[0])};
const params_layout bwd_tma_params_layout = {
    "fg_bwd_tma_params", sizeof(fg_bwd_tma_params), bwd_tma_fields,
    (int)(sizeof bwd_tma_fields / sizeof bwd_tma_fields[0])};
const params_layout decode_params_layout = {"fg_decode_params", sizeof(fg_decode_params),
                                            decode_fields,
                                            (int)(sizeof decode_fields / sizeof decode_fields[0])};
const params_layout decode_tma_params_layout = {
    "fg_decode_tma_params", sizeof(fg_decode_tma_params), decode_tma_fields,
    (int)(sizeof decode_tma_fields / sizeof decode_tma_fields[0])};
const params_layout block_mask_params_layout = {
    "fg_block_mask_params", sizeof(fg_block_mask_params), block_mask_fields,
    (int)(sizeof block_mask_fields / sizeof block_mask_fields[0])};

const param_field *params_field(const params_layout *l, const char *name) {
    for (int i = 0; i < l->field_count; i++)
        if (strcmp(l->fields[i].name, name) == 0) return &l->fields[i];
    return NULL;
}

/* NVRTC has no offsetof, so the CUDA side finds each field's offset itself:
 * a constexpr store of 1 (a float's lowest bit) into the field of a zeroed
 * struct, seen through __builtin_bit_cast as bytes, sets first the byte at
 * the field's offset (little endian). NVRTC 12.0 and 12.1 have no
 * __builtin_bit_cast: there only the size is checked, so their kernels
 * still compile. */
static const char offset_probe[] =
    "#if defined(__has_builtin)\n"
    "#if __has_builtin(__builtin_bit_cast)\n"
    "#define FG_PARAM_OFFSETS_CHECKED 1\n"
    "#endif\n"
    "#endif\n"
    "#ifdef FG_PARAM_OFFSETS_CHECKED\n"
    "template <typename S, typename F> constexpr int fg_param_offset(F store) {\n"
    "  struct bytes { unsigned char x[sizeof(S)]; };\n"
    "  S s{};\n"
    "  store(s);\n"
    "  const bytes b = __builtin_bit_cast(bytes, s);\n"
    "  for (int i = 0; i < (int)sizeof(S); ++i)\n"
    "    if (b.x[i]) return i;\n"
    "  return -1;\n"
    "}\n";

char *kernel_params_source(const params_layout *l) {
    size_t cap = 1024 + (size_t)l->field_count * 256, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    int maps = 0;
    for (int i = 0; i < l->field_count; i++) maps |= strcmp(l->fields[i].type, "tmap") == 0;
    if (maps)
        n += (size_t)snprintf(s + n, cap - n,
                              "// A TMA tensor map, encoded on the host (cuTensorMapEncodeTiled).\n"
                              "struct alignas(64) tmap { u64 opaque[16]; };\n");
    n += (size_t)snprintf(s + n, cap - n, "// Launch arguments, laid out as the host fills them.\nstruct %s {\n",
                          l->name);
    for (int i = 0; i < l->field_count; i++) {
        const param_field *f = &l->fields[i];
        if (f->count > 1)
            n += (size_t)snprintf(s + n, cap - n, "  %s %s[%zu];\n", f->type, f->name, f->count);
        else
            n += (size_t)snprintf(s + n, cap - n, "  %s %s;\n", f->type, f->name);
    }
    n += (size_t)snprintf(s + n, cap - n,
                          "};\nstatic_assert(sizeof(%s) == %zu, \"%s: size differs from the host's\");\n",
                          l->name, l->size, l->name);
    n += (size_t)snprintf(s + n, cap - n, "%s", offset_probe);
    for (int i = 0; i < l->field_count; i++) {
        const param_field *f = &l->fields[i];
        int is_float = strcmp(f->type, "float") == 0, is_map = strcmp(f->type, "tmap") == 0;
        n += (size_t)snprintf(s + n, cap - n,
                              "static_assert(fg_param_offset<%s>([](%s& p) { p.%s%s = %s; }) == %zu,\n"
                              "              \"%s.%s: offset differs from the host's\");\n",
                              l->name, l->name, f->name,
                              f->count > 1 ? "[0]" : is_map ? ".opaque[0]" : "",
                              is_float ? "__builtin_bit_cast(float, 1u)" : "1", f->offset, l->name,
                              f->name);
    }
    n += (size_t)snprintf(s + n, cap - n, "#endif\n");
    if (n >= cap) { /* cannot happen with the estimate above; never emit a cut struct */
        free(s);
        return NULL;
    }
    return s;
}
