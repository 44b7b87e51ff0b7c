/* What the sm_90a families share: the register split setmaxnreg makes
 * between the producer warpgroup and the consumers, the sections of heads
 * a causal call's blocks are ordered in, and the TMA tensor maps of a
 * call's (B, S, H, D) tensors. */
#ifndef FG_SM90A_H
#define FG_SM90A_H

#include <stddef.h>
#include <stdint.h>

#include "families/family.h"
#include "flashgen.h"

/* Registers a producer warpgroup keeps at least (the deterministic
 * backward's, which also issues dQ's reductions, keeps more). */
#define SM90A_PRODUCER_REGISTERS 24

/* setmaxnreg's figures for `consumers` consumer warpgroups beside one
 * producer that keeps at least producer_min: what each consumer takes (at
 * most 240; one consumer keeps what it is given at launch) and what the
 * producer keeps (24 beside two, 32 beside three, for a producer_min of 24).
 * Together they are the launch's share. */
int sm90a_consumer_registers(int consumers, int producer_min);
int sm90a_producer_registers(int consumers, int producer_min);
/* Registers per thread slot of a warpgroup, summed over the warpgroups. */
int sm90a_register_pool(int consumers);

/* Bytes of the tensors a section of heads shares, which it keeps in L2
 * (50 MB on H100, H200): under a causal mask the blocks of a section's
 * heads are ordered together, the longest first, so that long and short
 * blocks mix over the SMs. */
#define SM90A_SECTION_BYTES (24 << 20)

/* The heads (of `heads`) a section takes when each reads head_bytes: as
 * many as fit SM90A_SECTION_BYTES, at least one. */
int sm90a_section_heads(int64_t head_bytes, int64_t heads);

/* Thread blocks' lists of the units they walk, made as a greedy scheduler
 * would: the units in their order, each taken by the thread block with the
 * least work so far (the lower index first). weights[u] is unit u's work
 * (its key tiles and its start). out: blocks + 1 offsets, then the units
 * grouped by thread block, each block's in order (block b's are entries
 * out[blocks + 1 + out[b]] .. out[blocks + 1 + out[b + 1] - 1]). Returns the
 * entries written, blocks + 1 + units, or -1 where they would pass cap, a
 * unit's index or an offset would not fit 16 bits, or memory ran out. */
int sm90a_walk_lists(const int *weights, int units, int blocks, uint16_t *out, int cap);

/* The batch and rows of a call's maps, q's and o's (batch, q) and k's and
 * v's (k_units, k): (B, Sq) and (B, Sk) by its shape, (1, total_q) and
 * (1, total_k) over packed sequences (spec.varlen), whose kernels find a
 * sequence's rows by cu_seqlens, and over a paged KV cache (spec.kv_cache
 * with a block table) K and V as (num_pages, page_size), whose kernels find
 * a key's page by the table. */
typedef struct sm90a_map_rows {
    int batch, q, k_units, k;
} sm90a_map_rows;
sm90a_map_rows sm90a_map_rows_of(const fg_spec *spec, const fg_forward_args *a);

/* 0 when TMA can describe tensor t (name: "q", ...) of a call, else -1 with
 * why: it needs at least one row, a 16-byte aligned address and strides
 * that are nonzero multiples of 16 bytes below 2^40 (a dimension of one
 * element may have any). */
int sm90a_tensor_mappable(const char *name, const fg_tensor *t, int batch, int seqlen, int heads,
                          char *why, size_t len);
/* Its map as a 4-D tensor (cols, S, H, B) read in 128-byte swizzled boxes
 * of 64 columns by box_rows rows (cols: its rows' elements, the head dim or
 * the value head dim): 0, or -1 with err. */
int sm90a_encode(const family_device *dev, void *map, const char *name, const fg_spec *spec,
                 const fg_tensor *t, int cols, int batch, int seqlen, int heads, int box_rows,
                 char *err, size_t err_len);
/* The map of an fp32 accumulator (B, H, S, cols) at `address`, rows
 * contiguous (cols a multiple of 4), as a 4-D tensor (cols, S, H, B) added
 * into in 128-byte swizzled boxes of 32 columns by box_rows rows: 0, or -1
 * with err. */
int sm90a_encode_accumulator(const family_device *dev, void *map, const char *name,
                             uint64_t address, int batch, int heads, int seqlen, int cols,
                             int box_rows, char *err, size_t err_len);

#endif
