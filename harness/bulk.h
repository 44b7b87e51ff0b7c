/* Device memory for benchmarks, gigabytes of it: no poisoned zones and no
 * host mirror (buffer.h has both, for checks), random values uploaded from
 * one host block, and the bandwidth of a device-to-device copy to measure
 * memory-bound calls against. */
#ifndef FG_HARNESS_BULK_H
#define FG_HARNESS_BULK_H

#include <stddef.h>

#include "flashgen.h"
#include "harness/device.h"
#include "harness/random.h"

/* bytes of device memory into *p; 1, or 0 with the message (*p is 0 then). */
int fgh_bulk_alloc(const fgh_device *d, CUdeviceptr *p, size_t bytes);
/* Frees *p (nothing for 0) and sets it to 0. */
void fgh_bulk_free(const fgh_device *d, CUdeviceptr *p);
/* n 16-bit values of dt at p, uniform in [-1, 1) from r: one block of at
 * most 2^24 values, uploaded over and over. 1, or 0 with the message. */
int fgh_bulk_random(const fgh_device *d, CUdeviceptr p, size_t n, fg_dtype dt, fgh_rng *r);
/* n int32 values x into new device memory *p. 1, or 0 with the message. */
int fgh_bulk_ints(const fgh_device *d, CUdeviceptr *p, const int *x, size_t n);

/* Bytes moved per second (read + write) by a device-to-device copy of
 * `bytes` bytes (cuMemcpyDtoD), timed as fgh_time_calls times (5 copies a
 * sample). 1, or 0 with the message. */
int fgh_copy_bandwidth(const fgh_device *d, size_t bytes, double *bytes_per_s);

#endif
