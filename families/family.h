/* Kernel families. A family is one way of computing one pass on a range of
 * targets: the mma.sync forward (fwd_sm80), backward (bwd_sm80) and decoding
 * step (fwd_decode) for sm_75 and later, and the TMA + wgmma forward and
 * backward (fwd_sm90a, bwd_sm90a) for sm_90. It
 * owns its plan type and planner, its tuning candidates
 * and how its tilings are written down, its templates and generate
 * function, the launch arguments of its calls and its workspace; the
 * templates return the launches they assume. The runtime picks a family
 * from family_table by (pass, target) and does everything else through this
 * interface. */
#ifndef FG_FAMILY_H
#define FG_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "flashgen.h"
#include "gen/generate.h"
#include "gen/kernel_params.h"
#include "gen/profile.h"
#include "gen/target.h"

/* A tiling named explicitly, in the family's own terms (tuning candidates,
 * tuned choices); all 0 names the derived plan. */
#define FAMILY_TILING_INTS 8
typedef struct family_tiling {
    int v[FAMILY_TILING_INTS];
} family_tiling;

/* A plan, held for the family in its own type (at most this big). */
typedef union family_plan {
    max_align_t align;
    unsigned char bytes[2048];
} family_plan;

/* A block layout's lists on the device (all 0 without one); batch and
 * heads are 1 where one list set serves every batch row or head; states,
 * a block mask's per-block classification (lib_sparse.lua's build). */
typedef struct family_layout {
    int batch, heads, blocks_q, blocks_k;
    uint64_t states;
    uint64_t counts, indices;               /* per query block: its kept key blocks */
    uint64_t counts_by_key, indices_by_key; /* per key block: the query blocks keeping it */
} family_layout;

/* A call, as validated by the runtime: the forward's arguments, for a
 * backward pass the backward's (whose .forward is `forward`), and the
 * layout's lists. */
typedef struct family_call {
    const fg_forward_args *forward;
    const fg_backward_args *backward;
    family_layout layout;
    const fg_spec *spec; /* the spec the call runs */
    /* a split step's turn counters (fg_forward_args.split_counters, or the
     * context's with its workspace); 0: none */
    uint64_t split_counters;
    /* the thread blocks' walk lists the family made for this call
     * (kernel_family.walk_key), on the device; 0: none */
    uint64_t walk_lists;
} family_call;

/* The element types of a tensor map. */
typedef enum { FAMILY_MAP_F16, FAMILY_MAP_BF16, FAMILY_MAP_F32 } family_map_type;

/* What a family may know of the device a call runs on, and the driver's
 * tensor-map encoder: a TMA map of a tensor of `type` at `address` read or
 * written in boxes with 128-byte swizzling, dims and box innermost first,
 * rank - 1 strides in bytes (cuTensorMapEncodeTiled). It returns 0, or -1
 * with the driver's refusal in err. NULL where the driver has none. */
typedef struct family_device family_device;
struct family_device {
    const fg_profile *profile;
    size_t memory; /* bytes of device memory; 0 if unknown */
    int (*encode_map)(const family_device *dev, void *map, family_map_type type, int rank,
                      uint64_t address,
                      const uint64_t *dims, const uint64_t *strides, const uint32_t *box,
                      char *err, size_t err_len);
    const void *driver; /* the runtime's, for encode_map */
};

/* The launch arguments of one call, and the part of its workspace to zero
 * before the launches. */
#define FAMILY_PARAMS_MAX 2048
typedef struct family_args {
    _Alignas(64) unsigned char params[FAMILY_PARAMS_MAX]; /* 64: tensor maps */
    size_t clear_offset, clear_bytes;
} family_args;

/* The words of a walk lists' key (kernel_family.walk_key). */
#define FAMILY_WALK_KEY_WORDS 5

/* Workspaces are 256-byte aligned (the public header's contract), and so is
 * every part a family carves out of one. */
#define FAMILY_WORKSPACE_ALIGN 256

/* Outputs of a call that tuning compares between tilings. */
enum { FAMILY_WRITES_O = 1, FAMILY_WRITES_GRADIENTS = 2 };

typedef struct kernel_family {
    const char *name;      /* "fwd_sm80": tuning.tsv, bundle manifests */
    fg_pass pass;
    int min_cc, max_cc;    /* compute capabilities served (max 0: no bound) */
    int arch_specific;     /* compiled for sm_<cc>a: that exact arch only */
    const params_layout *params;
    int writes;            /* FAMILY_WRITES_*: what tuning compares */
    float tuning_rel_tolerance; /* relative, beside an absolute 1/32 */

    /* A reason (FG_ERR_UNSUPPORTED) when the family cannot run spec here. */
    int (*supports)(const fg_spec *spec, const fg_profile *profile, char *err, size_t err_len);
    /* The derived plan under a register budget (0: the family's first), or
     * a named tiling. Return 0, or -1 with err. */
    int (*plan)(const fg_spec *spec, const fg_profile *profile, int budget, family_plan *plan,
                char *err, size_t err_len);
    int (*plan_tiling)(const fg_spec *spec, const fg_profile *profile, const family_tiling *t,
                       family_plan *plan, char *err, size_t err_len);
    /* Tilings worth timing, in a fixed order (up to max); returns the count. */
    int (*candidates)(const fg_spec *spec, const fg_profile *profile, family_tiling *out, int max);
    void (*tiling_of)(const family_plan *plan, family_tiling *t);
    /* NULL, or a call's own tiling where its lengths, which the derived
     * plan does not know, make another one faster (as measured): 1 with
     * it in out, else 0 (the derived plan). A tuned choice comes first. */
    int (*tiling_for_call)(const fg_spec *spec, const fg_profile *profile, const family_call *call,
                           family_tiling *out);
    /* Registers the plan was made under: its accumulators and the budget
     * (a plan that spills is re-planned under a smaller budget). */
    void (*registers)(const family_plan *plan, int *accumulators, int *budget);
    /* The public figures and the why; kernel_name is left to the caller. */
    void (*describe)(const family_plan *plan, fg_plan_info *out);
    /* How many ints the family's own tiling type is (a struct of ints,
     * packed into family_tiling); as text, in tuning.tsv and manifests,
     * they are joined by commas ("2,4,64"). */
    int tiling_ints;

    int (*generate)(const fg_spec *spec, const family_plan *plan, const kernel_target *target,
                    generated *out, char *err, size_t err_len);

    /* NULL, or whether the family can take this call (a spec it supports
     * may still come with strides it cannot describe): 0, or -1 with why.
     * The runtime then runs the call on the next family of the table. */
    int (*accepts)(const family_call *call, const family_device *dev, char *why, size_t why_len);
    /* NULL, or where a call's thread blocks walk lists of units made on the
     * host (sm90a_walk_lists' form): 1 with key (the same lists for the
     * same key) and their entries, else 0; walk_lists writes them (up to
     * cap): their count, or -1. The runtime keeps them on the device by key
     * and hands them to arguments in call->walk_lists. */
    int (*walk_key)(const family_plan *plan, const family_call *call, const family_device *dev,
                    uint64_t key[FAMILY_WALK_KEY_WORDS], int *entries);
    int (*walk_lists)(const family_plan *plan, const family_call *call, const family_device *dev,
                      uint16_t *out, int cap);
    /* Workspace bytes a call needs (0: none), and its launch arguments with
     * the workspace at device address `workspace`: 0, or -1 with err. */
    size_t (*workspace)(const family_plan *plan, const family_call *call, const family_device *dev);
    int (*arguments)(const family_plan *plan, const fg_spec *spec, const family_call *call,
                     const family_device *dev, uint64_t workspace, family_args *out, char *err,
                     size_t err_len);
} kernel_family;

/* The first family for a pass on a profile's arch, or NULL. */
const kernel_family *family_for(fg_pass pass, const fg_profile *profile);
/* Every family that runs a pass on a profile's arch, in the table's order
 * (the first is family_for's); returns the count (at most max). */
int families_for(fg_pass pass, const fg_profile *profile, const kernel_family **out, int max);
/* By name ("fwd_sm80"), or NULL. */
const kernel_family *family_named(const char *name);
/* Every family's name, in the table's order: "fwd_decode, fwd_sm90a, ..."
 * into buf (cut short to fit len); returns buf. */
const char *family_names(char *buf, size_t len);

/* A family's own tiling type in and out of a family_tiling (its first
 * bytes; the rest 0). */
void family_tiling_pack(family_tiling *t, const void *own, size_t size);
void family_tiling_unpack(const family_tiling *t, void *own, size_t size);

/* The public figures of a plan (describe's work); kernel_name is left empty. */
void family_plan_info(fg_plan_info *out, int block_m, int block_n, int warps, int stages,
                      int head_dim_padded, int smem_bytes, int threads, const char *why);

/* A family's tiling as tuning.tsv and bundle manifests write it:
 * "fwd_sm80:2,4,64" (the family's name, then its own tiling text). */
void family_choice_format(const kernel_family *f, const family_tiling *t, char *buf, size_t len);
/* Parse such a text. Returns 0, or -1 when the family is unknown or its
 * tiling does not parse. */
int family_choice_parse(const char *text, const kernel_family **f, family_tiling *t);

/* The target a family's kernels are compiled for on a profile. */
kernel_target family_target(const kernel_family *f, const fg_profile *profile);

#endif
