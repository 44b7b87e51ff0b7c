/* The CUDA driver API, opened with dlopen so that the library links and runs
 * (generation, caching) on machines with no driver. cuda.h renames several
 * entry points with macros (cuMemAlloc -> cuMemAlloc_v2, ...); the struct
 * members are renamed the same way wherever they are used, so that is
 * harmless, but dlsym takes strings, which are not renamed: the symbol names
 * below are therefore spelled out with their version suffixes. */
#include "runtime/cuda_libs.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static cuda_driver driver;
static int driver_ok;
static char driver_err[256];

/* Where each member lives and which exported symbol fills it. `fallback` is
 * an older name with the same signature, tried when the newer one is absent
 * (e.g. cuEventElapsedTime_v2 appeared in CUDA 12.8). */
typedef struct driver_symbol {
    size_t offset;
    const char *name;
    const char *fallback;
} driver_symbol;

#define SLOT(member) offsetof(cuda_driver, member)
static const driver_symbol driver_symbols[] = {
    {SLOT(cuInit), "cuInit", NULL},
    {SLOT(cuDriverGetVersion), "cuDriverGetVersion", NULL},
    {SLOT(cuDeviceGetCount), "cuDeviceGetCount", NULL},
    {SLOT(cuDeviceGet), "cuDeviceGet", NULL},
    {SLOT(cuDeviceGetName), "cuDeviceGetName", NULL},
    {SLOT(cuDeviceGetAttribute), "cuDeviceGetAttribute", NULL},
    {SLOT(cuDeviceTotalMem), "cuDeviceTotalMem_v2", NULL},
    {SLOT(cuDevicePrimaryCtxRetain), "cuDevicePrimaryCtxRetain", NULL},
    {SLOT(cuDevicePrimaryCtxRelease), "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"},
    {SLOT(cuCtxSetCurrent), "cuCtxSetCurrent", NULL},
    {SLOT(cuCtxGetCurrent), "cuCtxGetCurrent", NULL},
    {SLOT(cuCtxSynchronize), "cuCtxSynchronize", NULL},
    {SLOT(cuModuleLoadData), "cuModuleLoadData", NULL},
    {SLOT(cuModuleUnload), "cuModuleUnload", NULL},
    {SLOT(cuModuleGetFunction), "cuModuleGetFunction", NULL},
    {SLOT(cuFuncSetAttribute), "cuFuncSetAttribute", NULL},
    {SLOT(cuFuncGetAttribute), "cuFuncGetAttribute", NULL},
    {SLOT(cuLaunchKernel), "cuLaunchKernel", NULL},
    /* The unsuffixed memory calls are the 32-bit-size legacy ones: no fallback. */
    {SLOT(cuMemAlloc), "cuMemAlloc_v2", NULL},
    {SLOT(cuMemFree), "cuMemFree_v2", NULL},
    {SLOT(cuMemcpyHtoD), "cuMemcpyHtoD_v2", NULL},
    {SLOT(cuMemcpyHtoDAsync), "cuMemcpyHtoDAsync_v2", NULL},
    {SLOT(cuMemcpyDtoH), "cuMemcpyDtoH_v2", NULL},
    {SLOT(cuMemcpyDtoD), "cuMemcpyDtoD_v2", NULL},
    {SLOT(cuMemsetD8), "cuMemsetD8_v2", NULL},
    {SLOT(cuMemsetD32Async), "cuMemsetD32Async", NULL},
    {SLOT(cuStreamSynchronize), "cuStreamSynchronize", NULL},
    {SLOT(cuStreamIsCapturing), "cuStreamIsCapturing", NULL},
    {SLOT(cuPointerGetAttributes), "cuPointerGetAttributes", NULL},
    {SLOT(cuEventCreate), "cuEventCreate", NULL},
    {SLOT(cuEventDestroy), "cuEventDestroy_v2", "cuEventDestroy"},
    {SLOT(cuEventRecord), "cuEventRecord", NULL},
    {SLOT(cuEventSynchronize), "cuEventSynchronize", NULL},
    {SLOT(cuEventElapsedTime), "cuEventElapsedTime_v2", "cuEventElapsedTime"},
    {SLOT(cuGetErrorString), "cuGetErrorString", NULL},
    {SLOT(cuGetErrorName), "cuGetErrorName", NULL},
};
/* Members a driver may lack: left NULL, and the calls that need them say so. */
static const driver_symbol optional_symbols[] = {
    {SLOT(cuLaunchKernelEx), "cuLaunchKernelEx", NULL},
    {SLOT(cuTensorMapEncodeTiled), "cuTensorMapEncodeTiled", NULL},
};
#undef SLOT

/* Every member must be in one of the tables above, exactly once. */
_Static_assert(sizeof driver_symbols / sizeof driver_symbols[0] +
                       sizeof optional_symbols / sizeof optional_symbols[0] ==
                   sizeof(cuda_driver) / sizeof(void (*)(void)),
               "driver_symbols and optional_symbols must list every member of struct cuda_driver");

static void driver_load_once(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(driver_err, sizeof driver_err, "no CUDA driver: libcuda.so.1 not found");
        return;
    }
    cuda_driver table;
    memset(&table, 0, sizeof table);
    for (size_t i = 0; i < sizeof driver_symbols / sizeof driver_symbols[0]; i++) {
        const driver_symbol *s = &driver_symbols[i];
        void *sym = dlsym(lib, s->name);
        if (!sym && s->fallback) sym = dlsym(lib, s->fallback);
        if (!sym) {
            snprintf(driver_err, sizeof driver_err,
                     "CUDA driver too old: libcuda.so.1 lacks %s", s->name);
            dlclose(lib);
            return;
        }
        /* Copy the bits: ISO C has no object-to-function pointer cast. */
        memcpy((char *)&table + s->offset, &sym, sizeof sym);
    }
    for (size_t i = 0; i < sizeof optional_symbols / sizeof optional_symbols[0]; i++) {
        void *sym = dlsym(lib, optional_symbols[i].name);
        if (sym) memcpy((char *)&table + optional_symbols[i].offset, &sym, sizeof sym);
    }

    CUresult r = table.cuInit(0);
    if (r != CUDA_SUCCESS) {
        char text[160];
        cuda_error_text(&table, r, text, sizeof text);
        if (r == CUDA_ERROR_NO_DEVICE)
            snprintf(driver_err, sizeof driver_err, "no CUDA device (%s)", text);
        else if (r == CUDA_ERROR_STUB_LIBRARY)
            snprintf(driver_err, sizeof driver_err,
                     "no CUDA driver: libcuda.so.1 is the toolkit's stub library");
        else
            snprintf(driver_err, sizeof driver_err, "cuInit failed: %s", text);
        dlclose(lib);
        return;
    }
    int count = 0;
    r = table.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count <= 0) {
        char text[160] = "0 devices";
        if (r != CUDA_SUCCESS) cuda_error_text(&table, r, text, sizeof text);
        snprintf(driver_err, sizeof driver_err, "no CUDA device (%s)", text);
        /* The library stays open: cuInit succeeded and cannot be undone. */
        return;
    }
    driver = table;
    driver_ok = 1;
}

const cuda_driver *cuda_driver_load(char *err, size_t err_len) {
    pthread_once(&driver_once, driver_load_once);
    if (!driver_ok) {
        if (err && err_len) snprintf(err, err_len, "%s", driver_err);
        return NULL;
    }
    return &driver;
}

/* Names and short descriptions for the results this project is likely to
 * meet, used when the driver cannot be asked (not loaded, or it does not
 * know the code). */
static const struct {
    CUresult code;
    const char *name;
    const char *text;
} known_results[] = {
#define R(code, text) {code, #code, text}
    R(CUDA_SUCCESS, "no error"),
    R(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    R(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    R(CUDA_ERROR_NOT_INITIALIZED, "driver not initialized"),
    R(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    R(CUDA_ERROR_STUB_LIBRARY, "stub library loaded instead of the real driver"),
    R(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    R(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    R(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    R(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    R(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for this device"),
    R(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "unsupported PTX version"),
    R(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    R(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    R(CUDA_ERROR_ILLEGAL_ADDRESS, "illegal memory access"),
    R(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    R(CUDA_ERROR_LAUNCH_TIMEOUT, "launch timed out"),
    R(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    R(CUDA_ERROR_UNKNOWN, "unknown error"),
#undef R
};

void cuda_error_text(const cuda_driver *d, CUresult r, char *buf, size_t len) {
    if (!buf || len == 0) return;
    const char *name = NULL, *text = NULL;
    if (d && d->cuGetErrorName && d->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (d && d->cuGetErrorString && d->cuGetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
    for (size_t i = 0; i < sizeof known_results / sizeof known_results[0]; i++) {
        if (known_results[i].code != r) continue;
        if (!name) name = known_results[i].name;
        if (!text) text = known_results[i].text;
        break;
    }
    if (name)
        snprintf(buf, len, "%s: %s", name, text ? text : "no description");
    else
        snprintf(buf, len, "CUDA error %d: %s", (int)r, text ? text : "no description");
}
