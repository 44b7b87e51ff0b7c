/* A stand-in for an NVRTC too old to use: every function the loader binds,
 * with nvrtcVersion answering 11.8. test_nvrtc puts it where the loader
 * looks (as libnvrtc.so.13) to see it refused by version and passed over. */
#include <nvrtc.h>

const char *nvrtcGetErrorString(nvrtcResult r) {
    (void)r;
    return "fake NVRTC";
}

nvrtcResult nvrtcVersion(int *major, int *minor) {
    *major = 11;
    *minor = 8;
    return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int n,
                               const char *const *headers, const char *const *names) {
    (void)prog, (void)src, (void)name, (void)n, (void)headers, (void)names;
    return NVRTC_ERROR_INTERNAL_ERROR;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int n, const char *const *opts) {
    (void)prog, (void)n, (void)opts;
    return NVRTC_ERROR_INTERNAL_ERROR;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *size) {
    (void)prog, (void)size;
    return NVRTC_ERROR_INTERNAL_ERROR;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log) {
    (void)prog, (void)log;
    return NVRTC_ERROR_INTERNAL_ERROR;
}

nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *size) {
    (void)prog, (void)size;
    return NVRTC_ERROR_INTERNAL_ERROR;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin) {
    (void)prog, (void)cubin;
    return NVRTC_ERROR_INTERNAL_ERROR;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog) {
    (void)prog;
    return NVRTC_SUCCESS;
}
