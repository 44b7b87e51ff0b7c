/* The device: see device.h. */
#include "harness/device.h"

#include <stdlib.h>
#include <string.h>

#include "harness/message.h"

int fgh_cu(const fgh_device *d, CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return 1;
    char text[256];
    cuda_error_text(d->cu, r, text, sizeof text);
    return fgh_fail("%s: %s", what, text);
}

int fgh_device_open(fgh_device *d) {
    char err[512];
    memset(d, 0, sizeof *d);
    d->cu = cuda_driver_load(err, sizeof err);
    if (!d->cu) return fgh_fail("%s", err);
    const char *env = getenv("FLASHGEN_DEVICE");
    CUcontext context = NULL;
    if (!fgh_cu(d, d->cu->cuDeviceGet(&d->device, env && *env ? atoi(env) : 0), "cuDeviceGet") ||
        !fgh_cu(d, d->cu->cuDevicePrimaryCtxRetain(&context, d->device), "cuDevicePrimaryCtxRetain"))
        return fgh_fail("cannot open the CUDA device (%s)", fgh_message());
    d->context = context;
    if (!fgh_cu(d, d->cu->cuCtxSetCurrent(context), "cuCtxSetCurrent"))
        return fgh_fail("cannot open the CUDA device (%s)", fgh_message());
    return 1;
}

void fgh_device_close(fgh_device *d) {
    if (d->context) d->cu->cuDevicePrimaryCtxRelease(d->device);
    d->context = NULL;
}
