/* NVRTC and the CUDA driver, loaded at run time with dlopen so the library
 * builds and generates on machines with no driver, and a program that never
 * compiles never needs NVRTC. */
#ifndef FG_CUDA_LIBS_H
#define FG_CUDA_LIBS_H

#include <cuda.h>
#include <stddef.h>

/* ---- NVRTC ---- */
typedef struct nvrtc_resources {
    int registers;
    int spill_stores;  /* bytes */
    int spill_loads;   /* bytes */
    int stack_bytes;
    int smem_static;   /* bytes */
} nvrtc_resources;

/* Load libnvrtc once (thread-safe). Returns 0, or -1 with err set, which
 * names every file tried and why each was passed over. Search order:
 * $FLASHGEN_NVRTC alone when set; else each folder of $FLASHGEN_NVRTC_PATH
 * (libnvrtc.so.13, libnvrtc.so.12), the loader's libnvrtc.so.13, .so.12 and
 * .so, then the toolkit's folder. Only NVRTC 12 and 13 are accepted. */
int nvrtc_lib_load(char *err, size_t err_len);
int nvrtc_lib_version(int *major, int *minor);
/* The file loaded (as it was named to dlopen), or NULL if none. */
const char *nvrtc_lib_path(void);
/* Try `paths` in order as nvrtc_lib_load would, keeping none: the index of
 * the first usable one, or -1. `report` lists those passed over and why. */
int nvrtc_lib_probe(const char *const *paths, int count, char *report, size_t report_len);

/* Compile `source` to a cubin for a target ("sm_90", "sm_90a"). options:
 * extra NVRTC options. On success *cubin (malloc'ed)
 * and *cubin_len are set, res is filled from ptxas' verbose report, and *log
 * (malloc'ed, may be NULL) holds the compile log. On failure returns -1, err
 * holds a one-line reason and *log the full NVRTC log. */
int nvrtc_compile_cubin(const char *source, const char *program_name, const char *target,
                        const char *const *options, int option_count, void **cubin,
                        size_t *cubin_len, char **log, nvrtc_resources *res, char *err,
                        size_t err_len);

/* The options nvrtc_compile_cubin always passes for a target, joined by
 * spaces (they are part of the cache key). */
void nvrtc_base_options(const char *target, char *buf, size_t len);

/* The same with nothing that depends on the NVRTC version, and computed
 * without loading NVRTC: part of the portable key under which bundles keep
 * kernels (cache/bundle.h). */
void nvrtc_portable_options(const char *target, char *buf, size_t len);

/* ---- CUDA driver ---- */
typedef struct cuda_driver {
    CUresult (*cuInit)(unsigned int);
    CUresult (*cuDriverGetVersion)(int *);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetName)(char *, int, CUdevice);
    CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int);
    CUresult (*cuFuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
    /* Launches with attributes (thread block clusters); NULL in a driver
     * older than CUDA 12, whose launches then use cuLaunchKernel alone. */
    CUresult (*cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    /* Tensor maps of the TMA copies (CUDA 12 drivers and newer; else NULL). */
    CUresult (*cuTensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                       const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                       const cuuint32_t *, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion,
                                       CUtensorMapFloatOOBfill);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*cuMemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*cuPointerGetAttributes)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
    CUresult (*cuEventCreate)(CUevent *, unsigned int);
    CUresult (*cuEventDestroy)(CUevent);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventSynchronize)(CUevent);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*cuGetErrorString)(CUresult, const char **);
    CUresult (*cuGetErrorName)(CUresult, const char **);
} cuda_driver;

/* Load libcuda.so.1 once and cuInit it. Returns the table, or NULL with err
 * saying why ("no CUDA driver: libcuda.so.1 not found", "no CUDA device"). */
const cuda_driver *cuda_driver_load(char *err, size_t err_len);

/* "CUDA_ERROR_X: description" for a result. */
void cuda_error_text(const cuda_driver *d, CUresult r, char *buf, size_t len);

#endif
