/* A stand-in CUDA driver for the runtime's launch path on machines with no
 * GPU: one device that reports an H100's figures (FAKE_CUDA_ARCH=80 an
 * A100's), memory from the host's heap, modules that load any bytes, and
 * launches, tensor maps and memsets that run nothing but are recorded for
 * the test to read (fake_cuda_record). test_launch puts it where the loader
 * looks (as libcuda.so.1 in a folder of its own). */
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fake_cuda.h"

static fake_cuda_record record;

/* allocations, to tell device pointers from others */
typedef struct block {
    uintptr_t at;
    size_t bytes;
} block;
static block blocks[1024];
static int block_count;

static int arch(void) {
    const char *a = getenv("FAKE_CUDA_ARCH");
    return a && *a ? atoi(a) : 90;
}

/* FAKE_CUDA_MEMORY=h200: an H200's memory (3201 MHz, 6016 bits) on the
 * H100's SMs; else the arch's own (H100 2619 MHz, 5120 bits; A100 1215). */
static int h200_memory(void) {
    const char *m = getenv("FAKE_CUDA_MEMORY");
    return m && strcmp(m, "h200") == 0;
}

const fake_cuda_record *fake_cuda_get(void) { return &record; }

void fake_cuda_clear(void) { memset(&record, 0, sizeof record); }

int fake_cuda_block_of(uintptr_t address, uintptr_t *start, size_t *bytes) {
    for (int i = 0; i < block_count; i++)
        if (address >= blocks[i].at && address - blocks[i].at < (blocks[i].bytes ? blocks[i].bytes : 1)) {
            *start = blocks[i].at, *bytes = blocks[i].bytes;
            return 1;
        }
    return 0;
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    *version = 13000;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice device) {
    (void)device;
    strncpy(name, arch() == 90 ? "Fake H100" : "Fake A100", (size_t)len - 1);
    name[len - 1] = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device) {
    (void)device;
    int h = arch() == 90;
    switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = arch() / 10; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = arch() % 10; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = h ? 132 : 108; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = h ? 232448 : 166912; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
        *value = h ? 233472 : 167936;
        break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *value = h200_memory() ? 3201000 : h ? 2619000 : 1215000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = h200_memory() ? 6016 : 5120; break;
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice device) {
    (void)device;
    *bytes = (size_t)80 << 30;
    return CUDA_SUCCESS;
}

static int context_token;

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
    (void)device;
    *ctx = (CUcontext)&context_token;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
    (void)device;
    return CUDA_SUCCESS;
}

static CUcontext current;

CUresult cuCtxSetCurrent(CUcontext ctx) {
    current = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
    *ctx = current;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    record.copies_in_flight = 0;
    return CUDA_SUCCESS;
}

/* a module is any bytes; a function its entry's name */
CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    (void)image;
    *module = (CUmodule)calloc(1, 1);
    return *module ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuModuleUnload(CUmodule module) {
    free(module);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule module, const char *name) {
    (void)module;
    char *copy = malloc(strlen(name) + 1);
    if (!copy) return CUDA_ERROR_OUT_OF_MEMORY;
    strcpy(copy, name);
    *f = (CUfunction)copy; /* kept for the process's life, as the launches name it */
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attribute, int value) {
    (void)f, (void)attribute, (void)value;
    return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attribute, CUfunction f) {
    (void)attribute, (void)f;
    *value = 0;
    return CUDA_SUCCESS;
}

static CUresult launched(CUfunction f, unsigned grid, unsigned threads, unsigned smem,
                         unsigned cluster, int programmatic, void **params) {
    if (record.launch_count == FAKE_CUDA_MAX) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    fake_cuda_launch *l = &record.launch[record.launch_count++];
    strncpy(l->entry, (const char *)f, sizeof l->entry - 1);
    l->grid = grid, l->threads = threads, l->smem = smem, l->cluster = cluster;
    l->programmatic = programmatic;
    memcpy(l->params, params[0], sizeof l->params); /* the runtime's buffer is that large */
    return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, CUstream stream, void **params,
                        void **extra) {
    (void)stream, (void)extra;
    if (gy != 1 || gz != 1 || by != 1 || bz != 1) return CUDA_ERROR_INVALID_VALUE;
    return launched(f, gx, bx, smem, 1, 0, params);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                          void **extra) {
    (void)extra;
    unsigned cluster = 1;
    int programmatic = 0;
    for (unsigned i = 0; i < config->numAttrs; i++) {
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
            cluster = config->attrs[i].value.clusterDim.x;
        if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
            programmatic = config->attrs[i].value.programmaticStreamSerializationAllowed;
    }
    return launched(f, config->gridDimX, config->blockDimX, config->sharedMemBytes, cluster,
                    programmatic, params);
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank,
                                void *address, const cuuint64_t *dims, const cuuint64_t *strides,
                                const cuuint32_t *box, const cuuint32_t *element_strides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion promotion,
                                CUtensorMapFloatOOBfill fill) {
    (void)element_strides, (void)interleave, (void)swizzle, (void)promotion, (void)fill;
    if (rank < 1 || rank > 5 || record.map_count == FAKE_CUDA_MAX) return CUDA_ERROR_INVALID_VALUE;
    for (cuuint32_t i = 0; i < rank; i++) /* as the driver: each 1..2^32 */
        if (dims[i] == 0 || dims[i] > (cuuint64_t)1 << 32) return CUDA_ERROR_INVALID_VALUE;
    fake_cuda_map *m = &record.map[record.map_count++];
    memset(map, 0, sizeof *map);
    m->address = (uintptr_t)address, m->rank = (int)rank;
    m->elem_bytes = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 || type == CU_TENSOR_MAP_DATA_TYPE_INT32 ||
                            type == CU_TENSOR_MAP_DATA_TYPE_UINT32
                        ? 4
                    : type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1
                    : type == CU_TENSOR_MAP_DATA_TYPE_FLOAT64 || type == CU_TENSOR_MAP_DATA_TYPE_INT64 ||
                            type == CU_TENSOR_MAP_DATA_TYPE_UINT64
                        ? 8
                        : 2;
    for (cuuint32_t i = 0; i < rank; i++) {
        m->dims[i] = dims[i], m->box[i] = box[i];
        if (i + 1 < rank) m->strides[i] = strides[i];
    }
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *ptr, size_t bytes) {
    if (block_count == 1024) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    blocks[block_count++] = (block){(uintptr_t)p, bytes};
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr ptr) {
    for (int i = 0; i < block_count; i++)
        if (blocks[i].at == (uintptr_t)ptr) {
            free((void *)blocks[i].at);
            blocks[i] = blocks[--block_count];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t bytes) {
    memcpy((void *)(uintptr_t)dst, src, bytes);
    record.copy_count++, record.copies_in_flight++;
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) {
    (void)stream;
    return cuMemcpyHtoD(dst, src, bytes);
}

CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t bytes) {
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t count) {
    memset((void *)(uintptr_t)dst, value, count);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
    (void)stream;
    if (record.memset_count < FAKE_CUDA_MAX)
        record.memset[record.memset_count++] = (fake_cuda_memset){(uintptr_t)dst, 4 * count};
    unsigned int *p = (unsigned int *)(uintptr_t)dst;
    for (size_t i = 0; i < count; i++) p[i] = value;
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream stream) {
    (void)stream;
    record.copies_in_flight = 0;
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status) {
    (void)stream;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

/* A pointer outside the stand-in's memory reads as type 0, as the
 * driver's unknown pointers do. */
CUresult cuPointerGetAttributes(unsigned int count, CUpointer_attribute *attributes, void **data,
                                CUdeviceptr ptr) {
    int known = 0;
    for (int i = 0; i < block_count; i++)
        known |= (uintptr_t)ptr >= blocks[i].at && (uintptr_t)ptr < blocks[i].at + blocks[i].bytes;
    for (unsigned int a = 0; a < count; a++) {
        if (attributes[a] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
            *(unsigned int *)data[a] = known ? CU_MEMORYTYPE_DEVICE : 0;
        else if (attributes[a] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
            *(int *)data[a] = known ? 0 : -2;
        else
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static int event_token;

CUresult cuEventCreate(CUevent *event, unsigned int flags) {
    (void)flags;
    *event = (CUevent)&event_token;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent event) {
    (void)event;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
    (void)event, (void)stream;
    return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent event) {
    (void)event;
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    (void)start, (void)end;
    *ms = 1.f;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    (void)error;
    *text = "fake CUDA driver error";
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **text) {
    (void)error;
    *text = "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
}
