/* NVRTC, opened with dlopen on first use: the library builds and generates
 * source on machines without the toolkit, and a program that only reads
 * cached cubins never needs it. nvrtc.h is included for its types only. */
#include "runtime/cuda_libs.h"

#include <dlfcn.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FG_CUDA_LIB_DIR
#define FG_CUDA_LIB_DIR "/usr/local/cuda/lib64"
#endif

typedef struct nvrtc_api {
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                 const char *const *, const char *const *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
} nvrtc_api;

static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;
static nvrtc_api nvrtc;
static int nvrtc_ok;
static int nvrtc_major, nvrtc_minor;
static char nvrtc_path[4096];
static char nvrtc_load_err[4096];

/* The NVRTC majors whose output the templates are tested with. */
#define NVRTC_MAJOR_MIN 12
#define NVRTC_MAJOR_MAX 13

static void set_err(char *err, size_t err_len, const char *fmt, ...) {
    if (!err || err_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* Append to a report, keeping it terminated however long it grows. */
static void append(char *buf, size_t len, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used + 1 >= len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* dlsym returns an object pointer; copying the bits is the portable way to
 * turn it into a function pointer under ISO C. */
static int bind_symbol(void *lib, const char *name, void *fn_slot, size_t fn_size) {
    void *sym = dlsym(lib, name);
    if (!sym) return -1;
    memcpy(fn_slot, &sym, fn_size);
    return 0;
}

/* Open one file as NVRTC: load it, bind every function, and ask its version,
 * which must be one we accept. Returns the handle with *api and the version
 * filled, or NULL with why it was passed over. */
static void *try_nvrtc(const char *path, nvrtc_api *api, int *major, int *minor, char *why,
                       size_t why_len) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        /* dlerror starts with the path, which the report already names */
        const char *e = dlerror();
        if (!e) e = "cannot be loaded";
        size_t n = strlen(path);
        if (strncmp(e, path, n) == 0 && strncmp(e + n, ": ", 2) == 0) e += n + 2;
        if (strcmp(e, "cannot open shared object file: No such file or directory") == 0)
            e = "not found";
        set_err(why, why_len, "%s", e);
        return NULL;
    }
    struct {
        const char *name;
        void *slot;
        size_t size;
    } syms[] = {
        {"nvrtcGetErrorString", &api->GetErrorString, sizeof api->GetErrorString},
        {"nvrtcVersion", &api->Version, sizeof api->Version},
        {"nvrtcCreateProgram", &api->CreateProgram, sizeof api->CreateProgram},
        {"nvrtcCompileProgram", &api->CompileProgram, sizeof api->CompileProgram},
        {"nvrtcGetProgramLogSize", &api->GetProgramLogSize, sizeof api->GetProgramLogSize},
        {"nvrtcGetProgramLog", &api->GetProgramLog, sizeof api->GetProgramLog},
        {"nvrtcGetCUBINSize", &api->GetCUBINSize, sizeof api->GetCUBINSize},
        {"nvrtcGetCUBIN", &api->GetCUBIN, sizeof api->GetCUBIN},
        {"nvrtcDestroyProgram", &api->DestroyProgram, sizeof api->DestroyProgram},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        if (bind_symbol(lib, syms[i].name, syms[i].slot, syms[i].size) != 0) {
            set_err(why, why_len, "not a usable NVRTC: it lacks %s", syms[i].name);
            dlclose(lib);
            return NULL;
        }
    }
    nvrtcResult r = api->Version(major, minor);
    if (r != NVRTC_SUCCESS) {
        set_err(why, why_len, "nvrtcVersion failed: %s", api->GetErrorString(r));
        dlclose(lib);
        return NULL;
    }
    if (*major < NVRTC_MAJOR_MIN || *major > NVRTC_MAJOR_MAX) {
        set_err(why, why_len, "NVRTC %d.%d, but only NVRTC %d and %d are accepted", *major, *minor,
                NVRTC_MAJOR_MIN, NVRTC_MAJOR_MAX);
        dlclose(lib);
        return NULL;
    }
    return lib;
}

/* Try the files in order; the first usable one is kept. Every one passed
 * over is listed in `report` ("path: why; ...") so a failure can say what was
 * tried. Returns the index of the one loaded, or -1. */
static int load_first(const char *const *paths, int count, nvrtc_api *api, void **handle,
                      int *major, int *minor, char *report, size_t report_len) {
    report[0] = '\0';
    for (int i = 0; i < count; i++) {
        char why[512];
        void *lib = try_nvrtc(paths[i], api, major, minor, why, sizeof why);
        if (lib) {
            *handle = lib;
            return i;
        }
        append(report, report_len, "%s%s: %s", report[0] ? "; " : "", paths[i], why);
    }
    return -1;
}

int nvrtc_lib_probe(const char *const *paths, int count, char *report, size_t report_len) {
    nvrtc_api api;
    void *lib = NULL;
    int major = 0, minor = 0;
    char local[16];
    if (!report || report_len == 0) report = local, report_len = sizeof local;
    int i = load_first(paths, count, &api, &lib, &major, &minor, report, report_len);
    if (lib) dlclose(lib);
    return i;
}

/* Where NVRTC is looked for, in order:
 *  - $FLASHGEN_NVRTC, when set, is the only file tried: whoever sets it wants
 *    that NVRTC and no other (a pinned version, or "/nonexistent" to run as if
 *    NVRTC were absent, which is how the bundle tests prove a bundled kernel
 *    needs none);
 *  - each folder of $FLASHGEN_NVRTC_PATH (colon-separated): libnvrtc.so.13,
 *    then libnvrtc.so.12 (where Python packages set the NVIDIA pip wheels'
 *    folders, which the system loader does not search);
 *  - the loader's names: libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so;
 *  - the toolkit we were built against.
 * A file that loads but is no accepted NVRTC is passed over for the next. */
static const char *const versioned_names[] = {"libnvrtc.so.13", "libnvrtc.so.12"};
static const char *const fixed_candidates[] = {
    "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
    FG_CUDA_LIB_DIR "/libnvrtc.so.13", FG_CUDA_LIB_DIR "/libnvrtc.so",
};
#define FIXED_COUNT ((int)(sizeof fixed_candidates / sizeof fixed_candidates[0]))
#define NAME_COUNT ((int)(sizeof versioned_names / sizeof versioned_names[0]))

static void nvrtc_load_once(void) {
    const char *env = getenv("FLASHGEN_NVRTC");
    void *lib = NULL;
    if (env && env[0]) {
        char why[512];
        if (!(lib = try_nvrtc(env, &nvrtc, &nvrtc_major, &nvrtc_minor, why, sizeof why))) {
            snprintf(nvrtc_load_err, sizeof nvrtc_load_err,
                     "NVRTC not found: FLASHGEN_NVRTC=%s cannot be used, and no other file is "
                     "tried while it is set: %s",
                     env, why);
            return;
        }
        snprintf(nvrtc_path, sizeof nvrtc_path, "%s", env);
        nvrtc_ok = 1;
        return;
    }

    /* The folders' files first, then the fixed ones, in one list. */
    const char *dirs = getenv("FLASHGEN_NVRTC_PATH");
    int folders = 0;
    if (dirs && dirs[0]) {
        folders = 1;
        for (const char *p = dirs; *p; p++) folders += *p == ':';
    }
    size_t max = (size_t)folders * NAME_COUNT + FIXED_COUNT;
    const char **paths = calloc(max, sizeof *paths);
    char *joined = malloc(dirs ? 2 * strlen(dirs) + (size_t)folders * 64 + 1 : 1);
    if (!paths || !joined) {
        free(paths), free(joined);
        snprintf(nvrtc_load_err, sizeof nvrtc_load_err, "out of memory looking for NVRTC");
        return;
    }
    int n = 0;
    char *out = joined;
    for (const char *p = dirs; p && *p;) {
        size_t len = strcspn(p, ":");
        for (int k = 0; k < NAME_COUNT && len > 0; k++) {
            /* each name gets the folder, "/", the name and its terminator */
            paths[n++] = out;
            out += sprintf(out, "%.*s/%s", (int)len, p, versioned_names[k]) + 1;
        }
        p += len;
        if (*p == ':') p++;
    }
    for (int k = 0; k < FIXED_COUNT; k++) paths[n++] = fixed_candidates[k];

    char report[sizeof nvrtc_load_err - 32];
    int i = load_first(paths, n, &nvrtc, &lib, &nvrtc_major, &nvrtc_minor, report, sizeof report);
    if (i >= 0) {
        snprintf(nvrtc_path, sizeof nvrtc_path, "%s", paths[i]);
        nvrtc_ok = 1; /* the handle is kept for the life of the process on purpose */
    } else {
        snprintf(nvrtc_load_err, sizeof nvrtc_load_err, "NVRTC not found (tried %s)", report);
    }
    free(paths);
    free(joined);
}

int nvrtc_lib_load(char *err, size_t err_len) {
    pthread_once(&nvrtc_once, nvrtc_load_once);
    if (!nvrtc_ok) {
        set_err(err, err_len, "%s", nvrtc_load_err);
        return -1;
    }
    return 0;
}

int nvrtc_lib_version(int *major, int *minor) {
    if (nvrtc_lib_load(NULL, 0) != 0) return -1;
    if (major) *major = nvrtc_major;
    if (minor) *minor = nvrtc_minor;
    return 0;
}

const char *nvrtc_lib_path(void) {
    return nvrtc_lib_load(NULL, 0) == 0 ? nvrtc_path : NULL;
}

/* The fixed options, in order. No fast math: the kernels need exact expf and
 * exp2f. Nothing here depends on time or the host, so the string can be part
 * of a cache key.
 *
 * --no-cache: from CUDA 13 on, NVRTC looks compiled cubins up in the
 * driver's compute cache when a driver is present; a hit skips ptxas, so the
 * log carries no resource report (seen on an H200: report missing on every
 * repeat compile). It also initializes the driver, which made a trivial
 * compile 0.24 s instead of 0.03 s there. Our own cache already keeps cubins,
 * so NVRTC's is switched off. Older NVRTC has no such cache or option. */
#define NVRTC_BASE_MAX 5
static int base_options_for(const char *target, int major, char arch_opt[64],
                            const char *opts[NVRTC_BASE_MAX]) {
    int n = 0;
    snprintf(arch_opt, 64, "--gpu-architecture=%s", target);
    opts[n++] = arch_opt;
    opts[n++] = "-default-device";
    opts[n++] = "--std=c++17";
    opts[n++] = "--ptxas-options=-v"; /* ptxas' resource report, parsed below */
    if (major >= 13) opts[n++] = "--no-cache";
    return n;
}

static int base_options(const char *target, char arch_opt[64], const char *opts[NVRTC_BASE_MAX]) {
    int major = CUDA_VERSION / 1000; /* the toolkit we were built with, if NVRTC is absent */
    if (nvrtc_lib_load(NULL, 0) == 0) major = nvrtc_major;
    return base_options_for(target, major, arch_opt, opts);
}

static void join_options(const char *const *opts, int n, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? " " : "", opts[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
}

void nvrtc_base_options(const char *target, char *buf, size_t len) {
    if (!buf || len == 0) return;
    char arch_opt[64];
    const char *opts[NVRTC_BASE_MAX];
    join_options(opts, base_options(target, arch_opt, opts), buf, len);
}

/* The only option that varies with the NVRTC version is --no-cache, which
 * switches off NVRTC's own lookup and leaves the cubin as it is. Leaving it
 * out (the list as NVRTC 12 would get it) makes a string that needs no NVRTC
 * to compute and is the same whichever NVRTC built the bundle. */
void nvrtc_portable_options(const char *target, char *buf, size_t len) {
    if (!buf || len == 0) return;
    char arch_opt[64];
    const char *opts[NVRTC_BASE_MAX];
    join_options(opts, base_options_for(target, 0, arch_opt, opts), buf, len);
}

/* Number just before `tag` on the line (e.g. "232 bytes stack frame"), or -1. */
static int number_before(const char *line, const char *end, const char *tag) {
    size_t tag_len = strlen(tag);
    for (const char *p = line; p + tag_len <= end; p++) {
        if (memcmp(p, tag, tag_len) != 0) continue;
        const char *q = p;
        while (q > line && q[-1] == ' ') q--;
        const char *digits_end = q;
        while (q > line && q[-1] >= '0' && q[-1] <= '9') q--;
        if (q == digits_end) return -1;
        long v = 0;
        for (const char *d = q; d < digits_end && v < 1000000000L; d++) v = v * 10 + (*d - '0');
        return (int)v;
    }
    return -1;
}

static void take_max(int *field, int v) {
    if (v > *field) *field = v;
}

/* ptxas -v prints per function, e.g.
 *   ptxas         .     232 bytes stack frame, 448 bytes spill stores, 492 bytes spill loads
 *   ptxas info    : Used 24 registers, used 1 barriers, 1024 bytes smem, 372 bytes cmem[0]
 * With several functions in one program each field takes the largest value. */
static void parse_ptxas_report(const char *log, nvrtc_resources *res) {
    memset(res, 0, sizeof *res);
    if (!log) return;
    for (const char *line = log; *line;) {
        const char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        if (end - line > 5 && memcmp(line, "ptxas", 5) == 0) {
            take_max(&res->registers, number_before(line, end, " registers"));
            take_max(&res->stack_bytes, number_before(line, end, " bytes stack frame"));
            take_max(&res->spill_stores, number_before(line, end, " bytes spill stores"));
            take_max(&res->spill_loads, number_before(line, end, " bytes spill loads"));
            take_max(&res->smem_static, number_before(line, end, " bytes smem"));
        }
        line = *end ? end + 1 : end;
    }
}

/* The line that best says why a compile failed: the first front-end error,
 * else the first ptxas error or fatal line, else the first non-empty line. */
static void first_error_line(const char *log, char *out, size_t out_len) {
    static const char *const markers[] = {": error", "error:", "fatal", "error"};
    out[0] = '\0';
    if (!log) return;
    for (size_t m = 0; m < sizeof markers / sizeof markers[0]; m++) {
        for (const char *line = log; *line;) {
            const char *end = strchr(line, '\n');
            if (!end) end = line + strlen(line);
            const char *hit = strstr(line, markers[m]);
            if (hit && hit < end) {
                snprintf(out, out_len, "%.*s", (int)(end - line), line);
                return;
            }
            line = *end ? end + 1 : end;
        }
    }
    const char *line = log;
    while (*line == '\n' || *line == ' ') line++;
    const char *end = strchr(line, '\n');
    int len = end ? (int)(end - line) : (int)strlen(line);
    snprintf(out, out_len, "%.*s", len, line);
}

static char *program_log(nvrtcProgram prog) {
    size_t size = 0;
    if (nvrtc.GetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size == 0) return NULL;
    char *text = malloc(size + 1);
    if (!text) return NULL;
    if (nvrtc.GetProgramLog(prog, text) != NVRTC_SUCCESS) {
        free(text);
        return NULL;
    }
    text[size] = '\0';
    if (text[0] == '\0') {
        free(text);
        return NULL;
    }
    return text;
}

int nvrtc_compile_cubin(const char *source, const char *program_name, const char *target,
                        const char *const *options, int option_count, void **cubin,
                        size_t *cubin_len, char **log, nvrtc_resources *res, char *err,
                        size_t err_len) {
    if (cubin) *cubin = NULL;
    if (cubin_len) *cubin_len = 0;
    if (log) *log = NULL;
    if (res) memset(res, 0, sizeof *res);
    if (!source || !cubin || !cubin_len) {
        set_err(err, err_len, "nvrtc_compile_cubin: source, cubin and cubin_len are required");
        return -1;
    }
    if (!target || strncmp(target, "sm_", 3) != 0 || strlen(target) > 15) {
        set_err(err, err_len, "nvrtc_compile_cubin: invalid target '%s'", target ? target : "(null)");
        return -1;
    }
    if (option_count < 0 || (option_count > 0 && !options)) {
        set_err(err, err_len, "nvrtc_compile_cubin: bad option list (count %d)", option_count);
        return -1;
    }
    if (nvrtc_lib_load(err, err_len) != 0) return -1;

    const char **argv = malloc((size_t)(NVRTC_BASE_MAX + option_count) * sizeof *argv);
    if (!argv) {
        set_err(err, err_len, "out of memory building NVRTC options");
        return -1;
    }
    char arch_opt[64];
    int total = base_options(target, arch_opt, argv);
    for (int i = 0; i < option_count; i++) argv[total++] = options[i];

    nvrtcProgram prog = NULL;
    nvrtcResult r = nvrtc.CreateProgram(&prog, source, program_name ? program_name : "flashgen.cu",
                                        0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        free(argv);
        set_err(err, err_len, "nvrtcCreateProgram failed: %s", nvrtc.GetErrorString(r));
        return -1;
    }
    r = nvrtc.CompileProgram(prog, total, argv);
    free(argv);
    char *text = program_log(prog);

    if (r != NVRTC_SUCCESS) {
        char why[300];
        first_error_line(text, why, sizeof why);
        set_err(err, err_len, "NVRTC compile failed for %s: %s", target,
                why[0] ? why : nvrtc.GetErrorString(r));
        if (log)
            *log = text;
        else
            free(text);
        nvrtc.DestroyProgram(&prog);
        return -1;
    }

    size_t size = 0;
    r = nvrtc.GetCUBINSize(prog, &size);
    void *bin = NULL;
    if (r == NVRTC_SUCCESS && size > 0) {
        bin = malloc(size);
        if (!bin) {
            set_err(err, err_len, "out of memory for a %zu-byte cubin", size);
            free(text);
            nvrtc.DestroyProgram(&prog);
            return -1;
        }
        r = nvrtc.GetCUBIN(prog, bin);
    }
    nvrtc.DestroyProgram(&prog);
    if (r != NVRTC_SUCCESS || !bin) {
        free(bin);
        set_err(err, err_len, "NVRTC produced no cubin for %s: %s", target,
                r != NVRTC_SUCCESS ? nvrtc.GetErrorString(r) : "empty output");
        if (log)
            *log = text;
        else
            free(text);
        return -1;
    }

    if (res) parse_ptxas_report(text, res);
    *cubin = bin;
    *cubin_len = size;
    if (log)
        *log = text;
    else
        free(text);
    return 0;
}
