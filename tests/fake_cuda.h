/* What the stand-in CUDA driver (fake_cuda.c) records: the launches (entry,
 * grid, threads, shared memory, cluster, the parameter buffer), the tensor
 * maps encoded and the 32-bit memsets, in call order, and the copies from
 * the host (a real one from pageable memory may return before its data
 * lands: those since the last cuCtxSynchronize or cuStreamSynchronize are
 * in flight). A test reads them through fake_cuda_get, looked up in the
 * loaded driver with dlsym. */
#ifndef FG_TESTS_FAKE_CUDA_H
#define FG_TESTS_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_CUDA_MAX 64

typedef struct fake_cuda_launch {
    char entry[160];
    unsigned grid, threads, smem, cluster;
    int programmatic; /* launched as a programmatic dependent of the previous launch */
    unsigned char params[2048]; /* FAMILY_PARAMS_MAX: the runtime's buffer */
} fake_cuda_launch;

typedef struct fake_cuda_map {
    uintptr_t address;
    int rank;
    int elem_bytes; /* of the map's data type */
    uint64_t dims[5], strides[4];
    uint32_t box[5];
} fake_cuda_map;

typedef struct fake_cuda_memset {
    uintptr_t address;
    size_t bytes;
} fake_cuda_memset;

typedef struct fake_cuda_record {
    int launch_count, map_count, memset_count;
    int copy_count, copies_in_flight; /* host to device */
    fake_cuda_launch launch[FAKE_CUDA_MAX];
    fake_cuda_map map[FAKE_CUDA_MAX];
    fake_cuda_memset memset[FAKE_CUDA_MAX];
} fake_cuda_record;

const fake_cuda_record *fake_cuda_get(void);
void fake_cuda_clear(void);
/* The allocation (cuMemAlloc) that holds address: 1 with its start and
 * bytes, or 0 when none does. */
int fake_cuda_block_of(uintptr_t address, uintptr_t *start, size_t *bytes);

#endif
