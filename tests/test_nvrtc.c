/* NVRTC and CUDA driver loading. Without a driver: the driver loader must
 * refuse with a clear reason, and NVRTC must still compile cubins for every
 * supported arch with a parsed ptxas report. With a GPU, a compiled kernel is
 * also loaded and run, and the parsed report is checked against the driver's
 * own function attributes. */
#include "gen/kernel_params.h"
#include "runtime/cuda_libs.h"
#include "runtime/runtime.h"
#include "tests/check.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Register-heavy: 32 live accumulators carried through a loop. The kernels
 * around it hold 1 KiB and 64 bytes of static shared memory and few
 * registers, so the report's per-field maxima come from different functions
 * and neither the first nor the last function reported holds both. */
static const char *busy_source =
    "extern \"C\" __global__ void staged(float *out) {\n"
    "    __shared__ float tile[256];\n"
    "    tile[threadIdx.x] = (float)threadIdx.x;\n"
    "    __syncthreads();\n"
    "    out[threadIdx.x] = tile[255 - threadIdx.x];\n"
    "}\n"
    "extern \"C\" __global__ void busy(float *out, const float *in, int n) {\n"
    "    float acc[32];\n"
    "    for (int i = 0; i < 32; ++i) acc[i] = in[i * n + threadIdx.x];\n"
    "    for (int j = 0; j < n; ++j)\n"
    "        for (int i = 0; i < 32; ++i) acc[i] = acc[i] * acc[(i + 1) & 31] + in[j];\n"
    "    float s = 0.0f;\n"
    "    for (int i = 0; i < 32; ++i) s += acc[i];\n"
    "    out[threadIdx.x] = expf(s);\n"
    "}\n"
    "extern \"C\" __global__ void tiny(int *out) {\n"
    "    __shared__ int flag[16];\n"
    "    flag[threadIdx.x & 15] = 1;\n"
    "    __syncthreads();\n"
    "    out[threadIdx.x] = flag[0];\n"
    "}\n";

/* A syntax error on line 3 (missing ';' is reported at the '}'). */
static const char *broken_source =
    "extern \"C\" __global__ void broken(float *out) {\n"
    "    out[threadIdx.x] = 1.0f\n"
    "}\n";

/* 48 accumulators cannot live in 24 registers (ptxas' floor for
 * -maxrregcount=16): ptxas must spill them to the stack. */
static const char *spill_source =
    "extern \"C\" __global__ void spilly(float *out, const float *in, int n) {\n"
    "    float acc[48];\n"
    "    for (int i = 0; i < 48; ++i) acc[i] = in[i * n + threadIdx.x];\n"
    "    for (int j = 0; j < n; ++j)\n"
    "        for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + 7) % 48] + in[j];\n"
    "    float s = 0.0f;\n"
    "    for (int i = 0; i < 48; ++i) s += acc[i] * acc[47 - i];\n"
    "    out[threadIdx.x] = s;\n"
    "}\n";

static const char *trivial_source =
    "extern \"C\" __global__ void trivial(int *p) { p[threadIdx.x] = threadIdx.x; }\n";

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int is_cuda_elf(const void *bin, size_t len) {
    const unsigned char *b = bin;
    /* ELF magic, 64-bit class, and e_machine == EM_CUDA (190). */
    return len > 20 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F' && b[4] == 2 &&
           (b[18] | (b[19] << 8)) == 190;
}

/* The fake NVRTC 11.8's folder (tests/fake_nvrtc.c, as libnvrtc.so.13). */
static const char *fake_dir = "";

/* The loader reads $FLASHGEN_NVRTC and $FLASHGEN_NVRTC_PATH once, at first
 * use, so each case runs in a fresh child process with them set (NULL:
 * unset). Returns the child's exit code: 0 loaded an accepted NVRTC whose
 * file name ends with `want`, 1 refused with a message containing `want`,
 * 2 anything else (printed). */
static int load_with(const char *nvrtc, const char *path, const char *want) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (nvrtc) setenv("FLASHGEN_NVRTC", nvrtc, 1);
        else unsetenv("FLASHGEN_NVRTC");
        if (path) setenv("FLASHGEN_NVRTC_PATH", path, 1);
        else unsetenv("FLASHGEN_NVRTC_PATH");
        char err[4096] = "";
        if (nvrtc_lib_load(err, sizeof err) == 0) {
            const char *loaded = nvrtc_lib_path();
            int major = 0, minor = 0;
            nvrtc_lib_version(&major, &minor);
            size_t n = strlen(loaded), w = strlen(want);
            if (major >= 12 && major <= 13 && n >= w && strcmp(loaded + n - w, want) == 0) _exit(0);
            fprintf(stderr, "load_with(%s, %s): loaded %s, NVRTC %d.%d\n", nvrtc, path, loaded,
                    major, minor);
            _exit(2);
        }
        if (err[0] && strstr(err, want)) _exit(1);
        fprintf(stderr, "load_with(%s, %s): '%s'\n", nvrtc, path, err);
        _exit(2);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

static void test_env_override(void) {
    char fake[1024], buf[4096];
    snprintf(fake, sizeof fake, "%s/libnvrtc.so.13", fake_dir);
    /* A set FLASHGEN_NVRTC is the only file tried: a path that does not
     * exist means no NVRTC (how tests run as if it were absent), and the
     * message says why nothing else was tried. */
    CHECK(load_with("/nonexistent/libnvrtc.so.13", NULL,
                    "FLASHGEN_NVRTC=/nonexistent/libnvrtc.so.13 cannot be used") == 1,
          "a bad FLASHGEN_NVRTC fell back to other names");
    CHECK(load_with("/nonexistent/libnvrtc.so.13", fake_dir, "no other file is tried") == 1,
          "FLASHGEN_NVRTC_PATH searched while FLASHGEN_NVRTC is set");
    /* Empty counts as unset: the usual names. */
    CHECK(load_with("", NULL, "") == 0, "empty FLASHGEN_NVRTC");
    /* A library that is not NVRTC is named in the reason, not used silently. */
    CHECK(load_with("libm.so.6", NULL, "libm.so.6 cannot be used, and no other file is tried while "
                                       "it is set: not a usable NVRTC: it lacks") == 1,
          "libm accepted as NVRTC");
    /* An NVRTC older than 12 is refused, saying what it is and what would do. */
    snprintf(buf, sizeof buf, "FLASHGEN_NVRTC=%s cannot be used", fake);
    CHECK(load_with(fake, NULL, buf) == 1, "NVRTC 11.8 accepted or not named");
    CHECK(load_with(fake, NULL, "NVRTC 11.8, but only NVRTC 12 and 13 are accepted") == 1,
          "the refusal names neither the version found nor those accepted");

    /* FLASHGEN_NVRTC_PATH: folders searched in order, libnvrtc.so.13 then
     * .so.12 in each; an old NVRTC there is passed over for the next
     * candidate, here the system's. */
    CHECK(load_with(NULL, "/nonexistent:", "") == 0, "a folder with no NVRTC stops the search");
    snprintf(buf, sizeof buf, "/nonexistent:%s", fake_dir);
    CHECK(load_with(NULL, buf, "") == 0, "an old NVRTC in FLASHGEN_NVRTC_PATH stops the search");
    char dir[] = "/tmp/fg-nvrtc-path-XXXXXX", link12[1100];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(link12, sizeof link12, "%s/libnvrtc.so.12", dir);
    CHECK(symlink(FG_CUDA_LIB_DIR "/libnvrtc.so.13", link12) == 0, "symlink");
    /* the folder's .so.12 (the toolkit's NVRTC under that name) is found
     * after the fake folder's .so.13 is refused; empty entries are skipped */
    snprintf(buf, sizeof buf, "::%s::%s:", fake_dir, dir);
    CHECK(load_with(NULL, buf, link12) == 0, "FLASHGEN_NVRTC_PATH=%s did not load %s", buf, link12);
    CHECK(load_with(NULL, dir, link12) == 0, "FLASHGEN_NVRTC_PATH=%s did not load %s", dir, link12);
    unlink(link12);
    rmdir(dir);

    /* The report of a search that finds nothing: every file, and why. */
    const char *none[] = {"/nonexistent/libnvrtc.so.13", fake, "libm.so.6"};
    CHECK(nvrtc_lib_probe(none, 3, buf, sizeof buf) == -1, "probe found an NVRTC");
    CHECK(strstr(buf, "/nonexistent/libnvrtc.so.13: not found; ") != NULL,
          "report: %s", buf);
    CHECK(strstr(buf, "; libm.so.6: not a usable NVRTC: it lacks nvrtcGetErrorString") != NULL,
          "report: %s", buf);
    char want[1200];
    snprintf(want, sizeof want, "; %s: NVRTC 11.8, but only NVRTC 12 and 13 are accepted;", fake);
    CHECK(strstr(buf, want) != NULL, "report: %s", buf);
    const char *later[] = {fake, FG_CUDA_LIB_DIR "/libnvrtc.so.13"};
    CHECK(nvrtc_lib_probe(later, 2, buf, sizeof buf) == 1, "probe: %s", buf);
}

/* ---- concurrent first use: both loaders must agree across threads ---- */
typedef struct {
    int nvrtc_rc;
    const cuda_driver *driver;
    char err[256];
} loader_result;

static void *load_both(void *arg) {
    loader_result *r = arg;
    char ignored[256];
    r->nvrtc_rc = nvrtc_lib_load(ignored, sizeof ignored);
    r->driver = cuda_driver_load(r->err, sizeof r->err);
    return NULL;
}

typedef struct {
    const char *target;
    int rc;
    size_t len;
} compile_job;

static void *compile_in_thread(void *arg) {
    compile_job *job = arg;
    void *bin = NULL;
    char err[512];
    job->rc = nvrtc_compile_cubin(busy_source, "thread.cu", job->target, NULL, 0, &bin, &job->len,
                                  NULL, NULL, err, sizeof err);
    free(bin);
    return NULL;
}

static void test_error_text_without_driver(void) {
    char buf[160];
    cuda_error_text(NULL, CUDA_ERROR_OUT_OF_MEMORY, buf, sizeof buf);
    CHECK(strncmp(buf, "CUDA_ERROR_OUT_OF_MEMORY: ", 26) == 0, "got '%s'", buf);
    cuda_error_text(NULL, CUDA_ERROR_NO_BINARY_FOR_GPU, buf, sizeof buf);
    CHECK(strncmp(buf, "CUDA_ERROR_NO_BINARY_FOR_GPU: ", 30) == 0, "got '%s'", buf);
    cuda_error_text(NULL, (CUresult)12345, buf, sizeof buf);
    CHECK(strstr(buf, "12345") != NULL, "unknown code not shown: '%s'", buf);
    char tiny[8];
    cuda_error_text(NULL, CUDA_ERROR_LAUNCH_FAILED, tiny, sizeof tiny);
    CHECK(strlen(tiny) == sizeof tiny - 1, "truncation: '%s'", tiny);
}

static void test_base_options(void) {
    char o75[256], o80[256], o90[256], o90a[256], again[256];
    nvrtc_base_options("sm_75", o75, sizeof o75);
    nvrtc_base_options("sm_80", o80, sizeof o80);
    nvrtc_base_options("sm_90", o90, sizeof o90);
    nvrtc_base_options("sm_90a", o90a, sizeof o90a);
    nvrtc_base_options("sm_80", again, sizeof again);
    CHECK(strcmp(o80, o90) != 0 && strcmp(o75, o80) != 0 && strcmp(o90, o90a) != 0,
          "options equal across arches: '%s'", o80);
    CHECK(strstr(o90a, "--gpu-architecture=sm_90a ") != NULL, "'%s'", o90a);
    CHECK(strcmp(o80, again) == 0, "options not stable: '%s' vs '%s'", o80, again);
    CHECK(strstr(o80, "--gpu-architecture=sm_80") != NULL, "'%s'", o80);
    CHECK(strstr(o90, "--gpu-architecture=sm_90 ") != NULL, "'%s'", o90);
    CHECK(strstr(o80, "--ptxas-options=-v") != NULL, "no ptxas report option: '%s'", o80);
    int major = 0;
    nvrtc_lib_version(&major, NULL);
    CHECK(major < 13 || strstr(o80, "--no-cache") != NULL,
          "NVRTC %d's own cubin cache must be off: '%s'", major, o80);
    CHECK(strstr(o80, "fast_math") == NULL && strstr(o80, "fast-math") == NULL,
          "fast math must not be on: '%s'", o80);
    char small[12];
    nvrtc_base_options("sm_80", small, sizeof small);
    CHECK(strlen(small) == sizeof small - 1, "truncation: '%s'", small);
}

/* Every named target's arch, and sm_90a: the arch-specific target Hopper's
 * own instructions need. */
static void test_compile_all_arches(void) {
    static const char *const arches[] = {"sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"};
    for (size_t i = 0; i < sizeof arches / sizeof arches[0]; i++) {
        const char *arch = arches[i];
        void *bin = NULL;
        size_t len = 0;
        char *log = NULL;
        nvrtc_resources res;
        memset(&res, 0xff, sizeof res);
        char err[512] = "";
        int rc = nvrtc_compile_cubin(busy_source, "busy.cu", arch, NULL, 0, &bin, &len, &log,
                                     &res, err, sizeof err);
        CHECK(rc == 0, "%s: %s", arch, err);
        CHECK(bin != NULL && is_cuda_elf(bin, len), "%s: not a CUDA ELF (%zu bytes)", arch, len);
        CHECK(res.registers > 16 && res.registers <= 255, "%s: registers %d", arch,
              res.registers);
        CHECK(res.spill_stores == 0 && res.spill_loads == 0, "%s: spills %d/%d", arch,
              res.spill_stores, res.spill_loads);
        CHECK(res.stack_bytes == 0, "%s: stack %d", arch, res.stack_bytes);
        CHECK(res.smem_static == 1024, "%s: smem %d (want the staged kernel's 1024)", arch,
              res.smem_static);
        char want[64];
        snprintf(want, sizeof want, "for '%s'", arch);
        CHECK(log != NULL && strstr(log, want) != NULL, "%s: log lacks ptxas report: %s", arch,
              log ? log : "(null)");
        free(bin);
        free(log);
    }
}

/* The same program twice: identical cubins, and the second compile must
 * still run ptxas and report (NVRTC 13 would otherwise answer it from the
 * driver's cache, with an empty log, wherever a driver is installed). */
static void test_deterministic(void) {
    void *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    char err[512];
    nvrtc_resources ra_res, rb_res;
    int ra = nvrtc_compile_cubin(busy_source, "busy.cu", "sm_86", NULL, 0, &a, &la, NULL, &ra_res, err,
                                 sizeof err);
    int rb = nvrtc_compile_cubin(busy_source, "busy.cu", "sm_86", NULL, 0, &b, &lb, NULL, &rb_res, err,
                                 sizeof err);
    CHECK(ra == 0 && rb == 0, "%s", err);
    CHECK(la == lb && la > 0 && memcmp(a, b, la) == 0, "two compiles differ (%zu vs %zu bytes)",
          la, lb);
    CHECK(ra_res.registers > 0 && memcmp(&ra_res, &rb_res, sizeof ra_res) == 0,
          "repeat compile reported %d registers, first %d", rb_res.registers, ra_res.registers);
    free(a);
    free(b);
}

static void test_syntax_error(void) {
    void *bin = (void *)1;
    size_t len = 7;
    char *log = NULL;
    nvrtc_resources res;
    char err[512] = "";
    int rc = nvrtc_compile_cubin(broken_source, "broken.cu", "sm_80", NULL, 0, &bin, &len, &log, &res,
                                 err, sizeof err);
    CHECK(rc == -1, "broken source compiled");
    CHECK(bin == NULL && len == 0, "outputs not cleared on failure");
    CHECK(strncmp(err, "NVRTC compile failed for sm_80: ", 32) == 0, "err '%s'", err);
    CHECK(strstr(err, "broken.cu(3)") != NULL && strstr(err, "error") != NULL,
          "err does not name the error line: '%s'", err);
    CHECK(strchr(err, '\n') == NULL, "err is not one line: '%s'", err);
    CHECK(log != NULL && strstr(log, "broken.cu(3): error") != NULL, "log: %s",
          log ? log : "(null)");
    free(log);

    /* No log wanted: still fails cleanly. */
    rc = nvrtc_compile_cubin(broken_source, "broken.cu", "sm_75", NULL, 0, &bin, &len, NULL, NULL, err,
                             sizeof err);
    CHECK(rc == -1 && strstr(err, "sm_75") != NULL, "err '%s'", err);
}

static void test_spills_and_options(void) {
    void *bin = NULL;
    size_t len = 0;
    char err[512] = "";
    nvrtc_resources free_res, tight_res;
    int rc = nvrtc_compile_cubin(spill_source, "spill.cu", "sm_80", NULL, 0, &bin, &len, NULL,
                                 &free_res, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    free(bin);
    CHECK(free_res.spill_stores == 0 && free_res.registers > 24,
          "unconstrained: %d registers, %d spill bytes", free_res.registers,
          free_res.spill_stores);

    const char *opts[] = {"-maxrregcount=16"};
    char *log = NULL;
    rc = nvrtc_compile_cubin(spill_source, "spill.cu", "sm_80", opts, 1, &bin, &len, &log, &tight_res,
                             err, sizeof err);
    CHECK(rc == 0, "%s", err);
    CHECK(tight_res.registers > 0 && tight_res.registers <= 24, "registers %d",
          tight_res.registers);
    CHECK(tight_res.spill_stores > 0 && tight_res.spill_loads > 0 && tight_res.stack_bytes > 0,
          "no spills reported: stores %d loads %d stack %d\n%s", tight_res.spill_stores,
          tight_res.spill_loads, tight_res.stack_bytes, log ? log : "");
    free(bin);
    free(log);

    /* A caller option NVRTC rejects is reported as a compile failure. */
    const char *bad[] = {"--no-such-option"};
    rc = nvrtc_compile_cubin(trivial_source, "t.cu", "sm_80", bad, 1, &bin, &len, NULL, NULL, err,
                             sizeof err);
    CHECK(rc == -1 && strstr(err, "NVRTC") != NULL, "bad option: rc %d err '%s'", rc, err);
}

static void test_bad_arguments(void) {
    void *bin = NULL;
    size_t len = 0;
    char err[256] = "";
    CHECK(nvrtc_compile_cubin(NULL, "x.cu", "sm_80", NULL, 0, &bin, &len, NULL, NULL, err,
                              sizeof err) == -1 && err[0],
          "NULL source accepted");
    err[0] = '\0';
    CHECK(nvrtc_compile_cubin(trivial_source, "x.cu", "compute_5", NULL, 0, &bin, &len, NULL,
                              NULL, err, sizeof err) == -1 && strstr(err, "compute_5") != NULL,
          "target compute_5 accepted: '%s'", err);
    err[0] = '\0';
    CHECK(nvrtc_compile_cubin(trivial_source, "x.cu", "sm_80", NULL, 2, &bin, &len, NULL, NULL, err,
                              sizeof err) == -1 && err[0],
          "2 options from a NULL list accepted");
    /* sm_70 is gone from CUDA 13: NVRTC itself must refuse it, with its reason. */
    int major = 0;
    nvrtc_lib_version(&major, NULL);
    if (major >= 13) {
        err[0] = '\0';
        int rc = nvrtc_compile_cubin(trivial_source, "x.cu", "sm_70", NULL, 0, &bin, &len, NULL, NULL,
                                     err, sizeof err);
        CHECK(rc == -1 && strstr(err, "sm_70") != NULL, "sm_70: rc %d '%s'", rc, err);
        if (rc == 0) free(bin);
    }
}

/* The launch-argument structs as the templates compile them: the host's
 * layout compiles, and a layout that differs from the CUDA struct in one
 * field's offset, or in size, fails the compile naming what differs. */
static int compile_params(const params_layout *l, char *err, size_t err_len, char **log) {
    char *src = kernel_params_source(l);
    const char *prelude = "typedef unsigned int u32;\ntypedef unsigned long long u64;\n"
                          "typedef long long i64;\n";
    size_t n = strlen(prelude) + strlen(src) + 64;
    char *full = malloc(n);
    snprintf(full, n, "%s%s__global__ void k() {}\n", prelude, src);
    void *bin = NULL;
    size_t len = 0;
    int rc = nvrtc_compile_cubin(full, "params.cu", "sm_80", NULL, 0, &bin, &len, log, NULL, err,
                                 err_len);
    free(bin), free(full), free(src);
    return rc;
}

static void test_params_contract(void) {
    const params_layout *layouts[] = {&fwd_params_layout, &bwd_params_layout};
    for (int i = 0; i < 2; i++) {
        const params_layout *l = layouts[i];
        char err[512] = "", *log = NULL;
        CHECK(compile_params(l, err, sizeof err, &log) == 0, "%s: %s", l->name, err);
        free(log);
        param_field fields[128];
        CHECK(l->field_count <= 128, "%s: %d fields", l->name, l->field_count);
        memcpy(fields, l->fields, sizeof fields[0] * (size_t)l->field_count);
        int f = l->field_count / 2;
        fields[f].offset += 4;
        params_layout moved = *l;
        moved.fields = fields;
        log = NULL;
        char want[128];
        snprintf(want, sizeof want, "%s.%s: offset differs", l->name, fields[f].name);
        CHECK(compile_params(&moved, err, sizeof err, &log) != 0 && log && strstr(log, want),
              "%s: a moved field compiled (%s)", l->name, err);
        free(log);
        params_layout grown = *l;
        grown.size += 8;
        log = NULL;
        CHECK(compile_params(&grown, err, sizeof err, &log) != 0 && log &&
                  strstr(log, "size differs"),
              "%s: a wrong size compiled (%s)", l->name, err);
        free(log);
    }
}

static void test_concurrent_compiles(void) {
    compile_job jobs[2] = {{"sm_80", -1, 0}, {"sm_90", -1, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, compile_in_thread, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK(jobs[0].rc == 0 && jobs[1].rc == 0 && jobs[0].len > 0 && jobs[1].len > 0,
          "concurrent compiles: rc %d/%d", jobs[0].rc, jobs[1].rc);
}

static void trivial_timing(void) {
    void *bin = NULL;
    size_t len = 0;
    char err[512];
    double t0 = now_s();
    int rc = nvrtc_compile_cubin(trivial_source, "trivial.cu", "sm_80", NULL, 0, &bin, &len, NULL,
                                 NULL, err, sizeof err);
    double dt = now_s() - t0;
    CHECK(rc == 0, "%s", err);
    CHECK(dt < 10.0, "trivial compile took %.2f s", dt);
    printf("trivial compile for sm_80: %.1f ms, %zu-byte cubin\n", dt * 1e3, len);
    free(bin);
}

/* With a GPU: compile for the device's own arch, run, and compare the ptxas
 * report with what the driver says about the loaded functions. */
static void test_on_gpu(const cuda_driver *d) {
    char text[160];
    CUdevice dev;
    int major = 0, minor = 0;
    CHECK(d->cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "cuDeviceGet");
    d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    char arch[16], name[128] = "";
    snprintf(arch, sizeof arch, "sm_%d", major * 10 + minor);
    d->cuDeviceGetName(name, (int)sizeof name, dev);
    printf("GPU: %s, %s\n", name, arch);

    CUcontext ctx = NULL;
    CUresult r = d->cuDevicePrimaryCtxRetain(&ctx, dev);
    CHECK(r == CUDA_SUCCESS && ctx, "retain primary context");
    CHECK(d->cuCtxSetCurrent(ctx) == CUDA_SUCCESS, "set context");

    void *bin = NULL;
    size_t len = 0;
    char err[512] = "";
    nvrtc_resources res;
    char *log = NULL;
    int rc = nvrtc_compile_cubin(busy_source, "busy.cu", arch, NULL, 0, &bin, &len, &log, &res,
                                 err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (rc != 0) {
        free(log);
        return;
    }
    CUmodule mod = NULL;
    r = d->cuModuleLoadData(&mod, bin);
    cuda_error_text(d, r, text, sizeof text);
    CHECK(r == CUDA_SUCCESS, "cuModuleLoadData: %s", text);
    free(bin);
    if (r != CUDA_SUCCESS) return;

    CUfunction busy = NULL, staged = NULL, tiny = NULL, missing = NULL;
    CHECK(d->cuModuleGetFunction(&busy, mod, "busy") == CUDA_SUCCESS, "busy");
    CHECK(d->cuModuleGetFunction(&staged, mod, "staged") == CUDA_SUCCESS, "staged");
    CHECK(d->cuModuleGetFunction(&tiny, mod, "tiny") == CUDA_SUCCESS, "tiny");
    r = d->cuModuleGetFunction(&missing, mod, "nope");
    cuda_error_text(d, r, text, sizeof text);
    CHECK(r == CUDA_ERROR_NOT_FOUND && strncmp(text, "CUDA_ERROR_NOT_FOUND: ", 22) == 0,
          "missing function: %s", text);

    CUfunction all[3] = {busy, staged, tiny};
    int most_regs = 0, most_smem = 0;
    for (int i = 0; i < 3; i++) {
        int regs = 0, smem = 0;
        d->cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, all[i]);
        d->cuFuncGetAttribute(&smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, all[i]);
        if (regs > most_regs) most_regs = regs;
        if (smem > most_smem) most_smem = smem;
    }
    CHECK(res.registers == most_regs, "ptxas said %d registers, driver %d; log:\n%s",
          res.registers, most_regs, log ? log : "(none)");
    CHECK(res.smem_static == most_smem && most_smem == 1024, "ptxas said %d smem bytes, driver %d",
          res.smem_static, most_smem);
    free(log);

    /* staged writes out[i] = 255 - i through shared memory. */
    CUdeviceptr out = 0;
    CHECK(d->cuMemAlloc(&out, 256 * sizeof(float)) == CUDA_SUCCESS, "cuMemAlloc");
    CHECK(d->cuMemsetD8(out, 0xff, 256 * sizeof(float)) == CUDA_SUCCESS, "cuMemsetD8");
    void *args[] = {&out};
    CUevent e0 = NULL, e1 = NULL;
    d->cuEventCreate(&e0, 0);
    d->cuEventCreate(&e1, 0);
    d->cuEventRecord(e0, NULL);
    r = d->cuLaunchKernel(staged, 1, 1, 1, 256, 1, 1, 0, NULL, args, NULL);
    cuda_error_text(d, r, text, sizeof text);
    CHECK(r == CUDA_SUCCESS, "launch: %s", text);
    d->cuEventRecord(e1, NULL);
    CHECK(d->cuEventSynchronize(e1) == CUDA_SUCCESS, "event sync");
    float ms = -1.0f;
    CHECK(d->cuEventElapsedTime(&ms, e0, e1) == CUDA_SUCCESS && ms >= 0.0f, "elapsed %f", ms);
    CHECK(d->cuStreamSynchronize(NULL) == CUDA_SUCCESS && d->cuCtxSynchronize() == CUDA_SUCCESS,
          "synchronize");
    float host[256];
    CHECK(d->cuMemcpyDtoH(host, out, sizeof host) == CUDA_SUCCESS, "DtoH");
    int wrong = 0;
    for (int i = 0; i < 256; i++) wrong += host[i] != (float)(255 - i);
    CHECK(wrong == 0, "%d wrong values (host[0] = %f)", wrong, host[0]);
    float ones[256];
    for (int i = 0; i < 256; i++) ones[i] = 1.0f;
    CHECK(d->cuMemcpyHtoD(out, ones, sizeof ones) == CUDA_SUCCESS, "HtoD");
    CHECK(d->cuMemcpyDtoH(host, out, sizeof host) == CUDA_SUCCESS && host[17] == 1.0f,
          "round trip");

    d->cuEventDestroy(e0);
    d->cuEventDestroy(e1);
    CHECK(d->cuMemFree(out) == CUDA_SUCCESS, "cuMemFree");
    CHECK(d->cuModuleUnload(mod) == CUDA_SUCCESS, "unload");
    CUcontext cur = NULL;
    CHECK(d->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == ctx, "current context");
    CHECK(d->cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS, "release primary context");
}

/* With a GPU of sm_90 or later: a launch that asks for clusters of 2 runs
 * as clusters of 2 (each block reads its rank and the cluster's size), and a
 * grid that is no whole number of clusters is refused. */
static void test_cluster_launch(void) {
    fg_context *ctx = NULL;
    if (fg_context_create(&ctx, NULL) != FG_OK || fg_context_arch(ctx) < 90) {
        printf("cluster launch: skipped (%s)\n", ctx ? "the GPU has no clusters" : fg_last_message());
        fg_context_destroy(ctx);
        return;
    }
    static const char *const source =
        "extern \"C\" __global__ void ranks(unsigned* out) {\n"
        "  unsigned r, n;\n"
        "  asm(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(r));\n"
        "  asm(\"mov.u32 %0, %%cluster_nctarank;\" : \"=r\"(n));\n"
        "  if (threadIdx.x == 0) out[blockIdx.x] = r | n << 8;\n"
        "}\n";
    void *bin = NULL;
    size_t len = 0;
    char err[512] = "";
    CHECK(nvrtc_compile_cubin(source, "ranks.cu", "sm_90", NULL, 0, &bin, &len, NULL, NULL, err,
                              sizeof err) == 0,
          "%s", err);
    const cuda_driver *cu = ctx->cu;
    CUmodule module = NULL;
    CUfunction f = NULL;
    CUdeviceptr out = 0;
    unsigned got[4] = {0};
    CHECK(bin && fg_make_current(ctx) == FG_OK && cu->cuModuleLoadData(&module, bin) == CUDA_SUCCESS &&
              cu->cuModuleGetFunction(&f, module, "ranks") == CUDA_SUCCESS &&
              cu->cuMemAlloc(&out, sizeof got) == CUDA_SUCCESS,
          "cluster kernel setup");
    if (f && out) {
        kernel_launch l;
        memset(&l, 0, sizeof l);
        snprintf(l.entry, sizeof l.entry, "ranks");
        l.threads = 32, l.cluster = 2;
        void *params[] = {&out};
        fg_status st = launch_one(ctx, f, &l, 4, NULL, params, 0);
        CHECK(st == FG_OK && cu->cuCtxSynchronize() == CUDA_SUCCESS &&
                  cu->cuMemcpyDtoH(got, out, sizeof got) == CUDA_SUCCESS,
              "cluster launch: %s", fg_context_message(ctx));
        for (int b = 0; b < 4; b++)
            CHECK(got[b] == ((unsigned)(b % 2) | 2u << 8), "block %d: rank %u of %u", b,
                  got[b] & 0xff, got[b] >> 8);
        CHECK(launch_one(ctx, f, &l, 3, NULL, params, 0) == FG_ERR_INTERNAL &&
                  strstr(fg_context_message(ctx), "no whole number of clusters of 2"),
              "a grid of 3 in clusters of 2: %s", fg_context_message(ctx));
        printf("cluster launch: 4 blocks in clusters of 2 ran as such\n");
    }
    if (out) cu->cuMemFree(out);
    if (module) cu->cuModuleUnload(module);
    free(bin);
    fg_context_destroy(ctx);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_nvrtc FAKE_NVRTC_DIR\n");
        return 2;
    }
    fake_dir = argv[1];
    test_env_override(); /* forks: before any thread or load in this process */
    /* First use from several threads at once. */
    loader_result results[4];
    memset(results, 0, sizeof results);
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) pthread_create(&threads[i], NULL, load_both, &results[i]);
    for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
    for (int i = 1; i < 4; i++) {
        CHECK(results[i].nvrtc_rc == results[0].nvrtc_rc, "threads disagree on NVRTC");
        CHECK(results[i].driver == results[0].driver, "threads disagree on the driver");
        CHECK(strcmp(results[i].err, results[0].err) == 0, "'%s' vs '%s'", results[i].err,
              results[0].err);
    }

    char err[512] = "";
    const cuda_driver *d = cuda_driver_load(err, sizeof err);
    void *probe = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!probe) {
        CHECK(d == NULL, "driver loaded without libcuda.so.1");
        CHECK(strcmp(err, "no CUDA driver: libcuda.so.1 not found") == 0, "err '%s'", err);
        printf("driver: %s\n", err);
    } else if (!d) {
        CHECK(strstr(err, "no CUDA") != NULL || strstr(err, "cuInit") != NULL, "err '%s'", err);
        printf("driver present but not usable: %s\n", err);
    }
    if (probe) dlclose(probe);
    test_error_text_without_driver();

    CHECK(nvrtc_lib_load(err, sizeof err) == 0, "NVRTC: %s", err);
    int major = -1, minor = -1;
    CHECK(nvrtc_lib_version(&major, &minor) == 0, "nvrtc_lib_version");
    /* The NVRTC found at run time must be the toolkit release we built against. */
    CHECK(major == CUDA_VERSION / 1000 && minor >= 0, "NVRTC %d.%d, headers %d", major, minor,
          CUDA_VERSION);
    printf("NVRTC %d.%d (%s)\n", major, minor, nvrtc_lib_path());

    test_base_options();
    trivial_timing();
    test_compile_all_arches();
    test_deterministic();
    test_syntax_error();
    test_spills_and_options();
    test_bad_arguments();
    test_params_contract();
    test_concurrent_compiles();
    if (d) test_on_gpu(d);
    if (d) test_cluster_launch();
    return check_summary("test_nvrtc");
}
