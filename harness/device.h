/* The CUDA device the harness works on: the driver table
 * (runtime/cuda_libs.h), the device named by FLASHGEN_DEVICE (default 0) and
 * its primary context. The library retains the same context, so memory
 * allocated here is the library's to use. */
#ifndef FG_HARNESS_DEVICE_H
#define FG_HARNESS_DEVICE_H

#include "runtime/cuda_libs.h"

typedef struct fgh_device {
    const cuda_driver *cu;
    CUdevice device;
    CUcontext context; /* NULL while not open */
} fgh_device;

/* Loads the driver and makes the device's primary context current.
 * 1, or 0 with the message (fgh_message). */
int fgh_device_open(fgh_device *d);
/* Releases the primary context; nothing when it was never retained. */
void fgh_device_close(fgh_device *d);

/* 1 when r is CUDA_SUCCESS; else 0 with "what: CUDA_ERROR_X: text". */
int fgh_cu(const fgh_device *d, CUresult r, const char *what);

#endif
