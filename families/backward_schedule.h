/* The backward's schedule, shared by its families: how the key blocks of a
 * (batch, key/value head) are spread over thread blocks, and the workspace
 * that follows from it.
 *
 * The fast schedule gives every key block a thread block of its own and adds
 * dQ into one fp32 accumulator in whatever order the thread blocks reach it.
 * The deterministic one gives each of n_groups thread blocks a fixed list of
 * key blocks (group g: g, then in rounds of n_groups, every other round in
 * reverse, which balances causal work) and an accumulator slice of its own,
 * which it adds to in a fixed order; the last kernel sums the slices in a
 * fixed order. */
#ifndef FG_BACKWARD_SCHEDULE_H
#define FG_BACKWARD_SCHEDULE_H

#include <stddef.h>

#include "families/family.h"
#include "flashgen.h"

/* Workspace: D (B,Hq,Sq) fp32, then the dQ accumulator (slices, B, Hq, Sq,
 * head dim padded) fp32, each part FAMILY_WORKSPACE_ALIGN-aligned. */
typedef struct backward_schedule {
    int n_blocks; /* key blocks of block_n keys */
    int n_groups; /* thread blocks per (batch, key/value head, column split) */
    int slices;   /* dQ accumulator slices */
    size_t delta_bytes, slice_bytes, total_bytes;
} backward_schedule;

/* The schedule of call `a` for key blocks of block_n keys, the accumulator's
 * rows head_dim_padded wide, and col_splits thread blocks per key block. */
void backward_schedule_of(const family_device *dev, const fg_forward_args *a, int deterministic,
                          int block_n, int head_dim_padded, int col_splits,
                          backward_schedule *s);

#endif
