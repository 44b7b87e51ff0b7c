/* The sandboxed Lua host that runs the templates.
 *
 * Templates are Lua 5.4 text chunks. They see only a restricted environment:
 * base functions without load/loadfile/dofile/require/collectgarbage/
 * rawset-on-globals tricks, plus string, table, math and utf8; no io, os,
 * package or debug. `import(name)` loads another template module ("mma_sm80"
 * loads mma_sm80.lua) from the embedded set, or from $FLASHGEN_TEMPLATE_DIR
 * when set, in text mode only, once per run. An instruction budget stops
 * runaway templates. Errors carry "file.lua:LINE: message". */
#ifndef FG_LUA_HOST_H
#define FG_LUA_HOST_H

#include <stddef.h>

typedef struct template_file {
    const char *name; /* "kernel_fwd_sm80.lua" */
    const char *text;
} template_file;

/* The templates compiled into the library (templates_embedded.c, generated). */
extern const template_file fg_embedded_templates[];
extern const int fg_embedded_template_count;

typedef enum { LUA_PARAM_INT, LUA_PARAM_STRING, LUA_PARAM_BOOL } lua_param_kind;

typedef struct lua_host_param {
    const char *key;
    lua_param_kind kind;
    long long int_value;       /* LUA_PARAM_INT, LUA_PARAM_BOOL */
    const char *string_value;  /* LUA_PARAM_STRING */
} lua_host_param;

#define LAUNCH_MAX 7
#define LAUNCH_FACTORS_MAX 4
#define LAUNCH_FIELDS_MAX 3
#define LAUNCH_CLUSTER_MAX 16 /* beyond 8 the kernel opts in to non-portable sizes */

/* One factor of a launch's grid: ceil(scale x the product of the named
 * launch-argument fields / per); no fields is the constant ceil(scale / per).
 * offset: each field's byte offset in the launch arguments, set where the
 * kernel is generated (generate_kernel), so a launch reads them by place. */
typedef struct launch_factor {
    char field[LAUNCH_FIELDS_MAX][32];
    int offset[LAUNCH_FIELDS_MAX];
    int field_count;
    long long scale, per;
} launch_factor;

/* A launch as the template that wrote its kernel assumes it: the entry
 * point, threads per block, dynamic shared memory in bytes, thread blocks
 * per cluster (1: none; sm_90 and later), whether it may start before the
 * call's previous launch ends (programmatic: a programmatic dependent of it,
 * sm_90 and later; the kernel waits for it with griddepcontrol.wait where it
 * needs that launch's writes, and runs in stream order where the previous
 * launch has no thread blocks), and a 1-D grid, the product of its factors.
 * A module's launches run in the order given. */
typedef struct kernel_launch {
    char entry[160];
    int threads;
    int smem_bytes;
    int cluster;
    int programmatic;
    launch_factor factor[LAUNCH_FACTORS_MAX];
    int factor_count;
} kernel_launch;

/* What a template returns: { source = <string>, name = <string>,
 * launches = { { entry = <string>, threads = <int>, smem = <int>, cluster = <int>,
 *                programmatic = <0|1>,
 *                grid = { { "field", ..., scale = <int>, per = <int> }, ... } }, ... } }
 * (launches optional; cluster, scale and per default to 1, programmatic to 0). */
typedef struct generated {
    char *source;           /* malloc'ed; caller frees */
    char kernel_name[128];
    kernel_launch launch[LAUNCH_MAX];
    int launch_count;
} generated;

#define LUA_HOST_DEFAULT_BUDGET 50000000LL

/* Run template `entry` (e.g. "kernel_fwd_sm80.lua"). The chunk must return a function;
 * it is called with one table holding params, and must return a table as
 * `generated` describes. Returns 0, or -1 with err holding
 * "file.lua:LINE: message" (and a short traceback). */
int lua_host_run(const char *entry, const lua_host_param *params, int param_count,
                 long long instruction_budget, generated *out, char *err, size_t err_len);

/* Lookup used by import(): the embedded text, or the file under
 * $FLASHGEN_TEMPLATE_DIR. Returns malloc'ed text or NULL. */
char *lua_host_template_text(const char *name, char *err, size_t err_len);

#endif
