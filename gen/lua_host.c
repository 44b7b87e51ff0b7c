/* The sandboxed Lua host that runs the templates (see lua_host.h).
 *
 * Each run gets a fresh lua_State, so nothing a template does survives it.
 * Everything that can raise a Lua error runs inside one lua_pcall; outside
 * it we only read strings already on the stack, so the panic handler (which
 * would abort) is never reached. */
#include "gen/lua_host.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

/* Generated kernels are a few hundred KiB; 256 MiB only stops runaways. */
#define HOST_MEMORY_LIMIT ((size_t)256 << 20)
/* The budget is checked every this many VM instructions. */
#define HOST_HOOK_INTERVAL 1000
#define HOST_TEMPLATE_MAX_BYTES ((size_t)16 << 20)
#define HOST_TEMPLATE_NAME_MAX 128

typedef struct host_run {
    const char *entry;
    const lua_host_param *params;
    int param_count;
    long long budget;
    long long executed;   /* instructions counted so far, in hook steps */
    size_t mem_used;
    size_t mem_limit;
    int mem_refused;      /* the allocator said no at least once */
    char seen_src[LUA_IDSIZE]; /* where the last hook found the template running */
    int seen_line;
    generated *out;       /* launches are parsed into it inside the pcall */
} host_run;

static void set_err(char *err, size_t err_len, const char *fmt, ...) {
    if (err == NULL || err_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

static int is_ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* [A-Za-z0-9_]+ followed by ".lua": no paths, no dots, nothing to escape. */
static int template_name_ok(const char *name) {
    size_t len = strlen(name);
    if (len <= 4 || len >= HOST_TEMPLATE_NAME_MAX || strcmp(name + len - 4, ".lua") != 0) return 0;
    for (size_t i = 0; i < len - 4; i++)
        if (!is_ident_char(name[i])) return 0;
    return 1;
}

static int c_identifier_ok(const char *s, size_t len) {
    if (len == 0 || (s[0] >= '0' && s[0] <= '9')) return 0;
    for (size_t i = 0; i < len; i++)
        if (!is_ident_char(s[i])) return 0;
    return 1;
}

static host_run *run_of(lua_State *L) { return *(host_run **)lua_getextraspace(L); }

/* ---- template text ---------------------------------------------------------- */

static char *read_template_file(const char *dir, const char *name, char *err, size_t err_len) {
    size_t dir_len = strlen(dir);
    int need_slash = dir[dir_len - 1] != '/';
    size_t path_len = dir_len + (size_t)need_slash + strlen(name) + 1;
    char *path = malloc(path_len);
    if (path == NULL) {
        set_err(err, err_len, "%s: out of memory building its path", name);
        return NULL;
    }
    snprintf(path, path_len, "%s%s%s", dir, need_slash ? "/" : "", name);

    char *text = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        char why[128];
        if (strerror_r(e, why, sizeof why) != 0) snprintf(why, sizeof why, "error %d", e);
        set_err(err, err_len, "%s: cannot open %s: %s", name, path, why);
        free(path);
        return NULL;
    }
    size_t cap = 4096, len = 0;
    text = malloc(cap);
    while (text != NULL) {
        if (len + 1 >= cap) {
            if (cap > HOST_TEMPLATE_MAX_BYTES) {
                set_err(err, err_len, "%s: %s is larger than %zu MiB", name, path,
                        HOST_TEMPLATE_MAX_BYTES >> 20);
                free(text);
                text = NULL;
                break;
            }
            char *bigger = realloc(text, cap * 2);
            if (bigger == NULL) {
                free(text);
                text = NULL;
                break;
            }
            text = bigger;
            cap *= 2;
        }
        size_t got = fread(text + len, 1, cap - 1 - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                set_err(err, err_len, "%s: cannot read %s", name, path);
                free(text);
                text = NULL;
            }
            break;
        }
    }
    fclose(f);
    if (text == NULL) {
        /* keep a more specific message if one was written */
        if (err != NULL && err_len > 0 && err[0] == '\0')
            set_err(err, err_len, "%s: out of memory reading %s", name, path);
        free(path);
        return NULL;
    }
    text[len] = '\0';
    /* the text travels as a C string; an embedded NUL would cut it short */
    if (memchr(text, '\0', len) != NULL) {
        set_err(err, err_len, "%s: %s contains a NUL byte", name, path);
        free(text);
        free(path);
        return NULL;
    }
    free(path);
    return text;
}

char *lua_host_template_text(const char *name, char *err, size_t err_len) {
    if (err != NULL && err_len > 0) err[0] = '\0';
    if (name == NULL || !template_name_ok(name)) {
        set_err(err, err_len, "invalid template name '%.64s' (expected letters, digits or '_' then .lua)",
                name ? name : "(null)");
        return NULL;
    }
    const char *dir = getenv("FLASHGEN_TEMPLATE_DIR");
    if (dir != NULL && dir[0] != '\0') return read_template_file(dir, name, err, err_len);

    for (int i = 0; i < fg_embedded_template_count; i++) {
        if (strcmp(fg_embedded_templates[i].name, name) != 0) continue;
        size_t len = strlen(fg_embedded_templates[i].text);
        char *text = malloc(len + 1);
        if (text == NULL) {
            set_err(err, err_len, "%s: out of memory copying the embedded text", name);
            return NULL;
        }
        memcpy(text, fg_embedded_templates[i].text, len + 1);
        return text;
    }
    set_err(err, err_len,
            "%s: no such template among the %d embedded ones (FLASHGEN_TEMPLATE_DIR is unset or empty)", name,
            fg_embedded_template_count);
    return NULL;
}

/* ---- limits: memory and instructions ---------------------------------------- */

static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    host_run *run = ud;
    size_t old = ptr != NULL ? osize : 0; /* for new blocks osize is a type tag */
    if (nsize == 0) {
        free(ptr);
        run->mem_used -= old;
        return NULL;
    }
    if (nsize > old && nsize - old > run->mem_limit - run->mem_used) {
        run->mem_refused = 1;
        return NULL; /* Lua collects garbage, retries, then raises a memory error */
    }
    void *block = realloc(ptr, nsize);
    if (block == NULL) {
        run->mem_refused = 1;
        return NULL;
    }
    run->mem_used = run->mem_used - old + nsize;
    return block;
}

static void budget_hook(lua_State *L, lua_Debug *ar) {
    host_run *run = run_of(L);
    if (lua_getinfo(L, "Sl", ar)) {
        memcpy(run->seen_src, ar->short_src, sizeof run->seen_src);
        run->seen_line = ar->currentline;
    }
    run->executed += HOST_HOOK_INTERVAL;
    if (run->executed <= run->budget) return;
    /* From now on every instruction fails, so a template's pcall cannot
     * swallow the stop and keep looping. */
    lua_sethook(L, budget_hook, LUA_MASKCOUNT, 1);
    lua_pushfstring(L, "%s:%d: instruction budget exceeded (%I instructions)", ar->short_src,
                    ar->currentline, (lua_Integer)run->budget);
    lua_error(L);
}

/* ---- error messages ---------------------------------------------------------- */

/* Does msg start with "something:LINE:" as Lua's positioned errors do? */
static int has_location(const char *msg) {
    const char *p = msg;
    while (*p != '\0' && *p != ':' && *p != '\n') p++;
    if (p == msg || *p != ':') return 0;
    p++;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') p++;
    return *p == ':';
}

/* Message handler: makes sure the message starts with file:line of the Lua
 * code that failed, then appends a short traceback. */
static int host_traceback(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    lua_Debug ar;
    int found = 0;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0) {
            found = 1;
            break;
        }
    }
    if (!found) { /* raised by the host before or after any template code ran */
        lua_pushstring(L, msg);
        return 1;
    }
    if (!has_location(msg)) msg = lua_pushfstring(L, "%s:%d: %s", ar.short_src, ar.currentline, msg);
    luaL_traceback(L, L, msg, 1);
    return 1;
}

/* ---- the sandbox ------------------------------------------------------------- */

/* setmetatable without __gc: finalizers run with hooks off, so a looping one
 * would escape the instruction budget (and could run at lua_close). */
static int sandbox_setmetatable(lua_State *L) {
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            return luaL_error(L, "setmetatable: __gc metamethods are not allowed in templates");
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, 1);
    return 1;
}

/* __close of the import chain: drops the innermost entry when an import
 * finishes, also when it fails inside a template's pcall. */
static int import_chain_pop(lua_State *L) {
    lua_Unsigned n = lua_rawlen(L, 1);
    if (n > 0) {
        lua_pushnil(L);
        lua_rawseti(L, 1, (lua_Integer)n);
    }
    return 0;
}

/* import(name): upvalues 1 = sandbox env, 2 = finished modules by file name,
 * 3 = chain of file names being imported (outermost first). */
static int sandbox_import(lua_State *L) {
    const char *arg = luaL_checkstring(L, 1);
    char file[HOST_TEMPLATE_NAME_MAX + 8];
    size_t arg_len = strlen(arg);
    int has_ext = arg_len > 4 && strcmp(arg + arg_len - 4, ".lua") == 0;
    if (arg_len >= HOST_TEMPLATE_NAME_MAX) return luaL_error(L, "import: module name is too long");
    snprintf(file, sizeof file, "%s%s", arg, has_ext ? "" : ".lua");
    if (!template_name_ok(file))
        return luaL_error(L, "import: invalid module name '%s' (expected letters, digits or '_')", arg);
    lua_settop(L, 1);

    lua_pushstring(L, file);
    if (lua_rawget(L, lua_upvalueindex(2)) != LUA_TNIL) return 1; /* imported before in this run */
    lua_pop(L, 1);

    lua_Integer depth = (lua_Integer)lua_rawlen(L, lua_upvalueindex(3));
    for (lua_Integer i = 1; i <= depth; i++) {
        lua_rawgeti(L, lua_upvalueindex(3), i);
        int same = strcmp(lua_tostring(L, -1), file) == 0;
        lua_pop(L, 1);
        if (!same) continue;
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        luaL_addstring(&b, "import cycle: ");
        for (lua_Integer j = 1; j <= depth; j++) {
            lua_rawgeti(L, lua_upvalueindex(3), j);
            luaL_addvalue(&b);
            luaL_addstring(&b, " -> ");
        }
        luaL_addstring(&b, file);
        luaL_pushresult(&b);
        return luaL_error(L, "%s", lua_tostring(L, -1));
    }

    char why[512];
    char *text = lua_host_template_text(file, why, sizeof why);
    if (text == NULL) return luaL_error(L, "%s", why);
    char chunkname[sizeof file + 1];
    snprintf(chunkname, sizeof chunkname, "@%s", file); /* errors then read "file.lua:LINE:" */
    int status = luaL_loadbufferx(L, text, strlen(text), chunkname, "t");
    free(text);
    if (status != LUA_OK) {
        /* syntax errors carry "file.lua:LINE:"; others (a binary chunk) get the file name */
        if (lua_type(L, -1) == LUA_TSTRING && !has_location(lua_tostring(L, -1)))
            lua_pushfstring(L, "%s: %s", file, lua_tostring(L, -1));
        return lua_error(L);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_setupvalue(L, -2, 1); /* the chunk's _ENV is the sandbox */

    lua_pushstring(L, file);
    lua_rawseti(L, lua_upvalueindex(3), depth + 1);
    lua_pushvalue(L, lua_upvalueindex(3));
    lua_toclose(L, -1);      /* pops `file` off the chain however the call ends */
    lua_pushvalue(L, -2);    /* stack: arg, chunk, chain guard, chunk */
    lua_call(L, 0, 1);
    if (lua_isnil(L, -1)) {  /* a module that returns nothing imports as true */
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushstring(L, file);
    lua_pushvalue(L, -2);
    lua_rawset(L, lua_upvalueindex(2));
    return 1;
}

static const char *const sandbox_base_names[] = {
    "assert", "error",    "ipairs", "next",    "pairs",  "pcall",  "select",       "tonumber",
    "tostring", "type",   "xpcall", "rawequal", "rawlen", "rawget", "getmetatable", "_VERSION",
};

static const struct {
    const char *name;
    lua_CFunction open;
} sandbox_libs[] = {
    {LUA_STRLIBNAME, luaopen_string},
    {LUA_TABLIBNAME, luaopen_table},
    {LUA_MATHLIBNAME, luaopen_math},
    {LUA_UTF8LIBNAME, luaopen_utf8},
};

/* Builds the environment table and leaves it on the stack. The libraries are
 * used directly rather than copied: the state lives for one run only. */
static void push_sandbox_env(lua_State *L) {
    luaL_requiref(L, "_G", luaopen_base, 0);
    int globals = lua_gettop(L);
    lua_newtable(L);
    int env = lua_gettop(L);
    for (size_t i = 0; i < sizeof sandbox_base_names / sizeof sandbox_base_names[0]; i++) {
        lua_getfield(L, globals, sandbox_base_names[i]);
        lua_setfield(L, env, sandbox_base_names[i]);
    }
    lua_getfield(L, globals, "setmetatable");
    lua_pushcclosure(L, sandbox_setmetatable, 1);
    lua_setfield(L, env, "setmetatable");
    for (size_t i = 0; i < sizeof sandbox_libs / sizeof sandbox_libs[0]; i++) {
        luaL_requiref(L, sandbox_libs[i].name, sandbox_libs[i].open, 0);
        if (sandbox_libs[i].open == luaopen_string) {
            /* binary chunks bypass the parser's checks; nothing may make one.
             * Removed from the library itself, which strings' __index also is. */
            lua_pushnil(L);
            lua_setfield(L, -2, "dump");
        }
        lua_setfield(L, env, sandbox_libs[i].name);
    }
    lua_pushvalue(L, env);
    lua_setfield(L, env, "_G");

    lua_pushvalue(L, env);
    lua_newtable(L); /* finished modules */
    lua_newtable(L); /* import chain, with its __close */
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, import_chain_pop);
    lua_setfield(L, -2, "__close");
    lua_setmetatable(L, -2);
    lua_pushcclosure(L, sandbox_import, 3);
    lua_setfield(L, env, "import");
    lua_remove(L, globals);
}

/* ---- launches ----------------------------------------------------------------- */

/* Integer field `key` of the table at idx, or def when absent; a Lua error
 * (caught by the pcall) when it is something else or out of range. */
static long long launch_int(lua_State *L, int idx, const char *key, long long def,
                            long long lo, long long hi, const char *what) {
    int type = lua_getfield(L, idx, key);
    long long v = def;
    if (type != LUA_TNIL) {
        int isint = 0;
        v = (long long)lua_tointegerx(L, -1, &isint);
        if (!isint || v < lo || v > hi)
            luaL_error(L, "%s: '%s' must be an integer in %I..%I", what, key, (lua_Integer)lo,
                       (lua_Integer)hi);
    }
    lua_pop(L, 1);
    return v;
}

/* grid = { { "field", ..., scale = n, per = n }, ... } at idx. */
static void parse_grid(lua_State *L, int idx, kernel_launch *l, const char *what) {
    if (lua_getfield(L, idx, "grid") != LUA_TTABLE) luaL_error(L, "%s: 'grid' must be a table", what);
    int grid = lua_gettop(L);
    l->factor_count = (int)luaL_len(L, grid);
    if (l->factor_count < 1 || l->factor_count > LAUNCH_FACTORS_MAX)
        luaL_error(L, "%s: a grid has 1..%d factors", what, LAUNCH_FACTORS_MAX);
    for (int f = 0; f < l->factor_count; f++) {
        launch_factor *x = &l->factor[f];
        if (lua_rawgeti(L, grid, f + 1) != LUA_TTABLE)
            luaL_error(L, "%s: grid factor %d must be a table", what, f + 1);
        int factor = lua_gettop(L);
        x->field_count = (int)luaL_len(L, factor);
        if (x->field_count > LAUNCH_FIELDS_MAX)
            luaL_error(L, "%s: a grid factor names at most %d fields", what, LAUNCH_FIELDS_MAX);
        for (int i = 0; i < x->field_count; i++) {
            size_t len;
            lua_rawgeti(L, factor, i + 1);
            const char *name = lua_tolstring(L, -1, &len);
            if (!name || !c_identifier_ok(name, len) || len >= sizeof x->field[i])
                luaL_error(L, "%s: grid fields are launch-argument names", what);
            memcpy(x->field[i], name, len + 1);
            lua_pop(L, 1);
        }
        x->scale = launch_int(L, factor, "scale", 1, 1, 1 << 30, what);
        x->per = launch_int(L, factor, "per", 1, 1, 1 << 30, what);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* The optional launches list of the result table at idx, into run->out. */
static void parse_launches(lua_State *L, int idx, host_run *run) {
    if (lua_getfield(L, idx, "launches") == LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    if (!lua_istable(L, -1)) luaL_error(L, "%s: 'launches' must be a table", run->entry);
    int list = lua_gettop(L);
    int n = (int)luaL_len(L, list);
    if (n > LAUNCH_MAX) luaL_error(L, "%s: at most %d launches", run->entry, LAUNCH_MAX);
    for (int i = 0; i < n; i++) {
        kernel_launch *l = &run->out->launch[i];
        char what[HOST_TEMPLATE_NAME_MAX + 32];
        snprintf(what, sizeof what, "%s: launch %d", run->entry, i + 1);
        if (lua_rawgeti(L, list, i + 1) != LUA_TTABLE) luaL_error(L, "%s must be a table", what);
        int item = lua_gettop(L);
        size_t len;
        lua_getfield(L, item, "entry");
        const char *entry = lua_tolstring(L, -1, &len);
        if (!entry || !c_identifier_ok(entry, len) || len >= sizeof l->entry)
            luaL_error(L, "%s: 'entry' must name a kernel (a C identifier)", what);
        memcpy(l->entry, entry, len + 1);
        lua_pop(L, 1);
        l->threads = (int)launch_int(L, item, "threads", 0, 1, 1024, what);
        if (l->threads < 1) luaL_error(L, "%s: 'threads' is required", what);
        l->smem_bytes = (int)launch_int(L, item, "smem", 0, 0, 1 << 30, what);
        l->cluster = (int)launch_int(L, item, "cluster", 1, 1, LAUNCH_CLUSTER_MAX, what);
        l->programmatic = (int)launch_int(L, item, "programmatic", 0, 0, 1, what);
        if (l->programmatic && i == 0)
            luaL_error(L, "%s: the first launch has no previous one to depend on", what);
        parse_grid(L, item, l, what);
        lua_pop(L, 1);
    }
    run->out->launch_count = n;
    lua_pop(L, 1);
}

/* Runs inside lua_pcall. Returns (true, source, name) or (false, message)
 * for a result that ran fine but is unusable. */
static int host_main(lua_State *L) {
    host_run *run = run_of(L);
    push_sandbox_env(L);
    lua_getfield(L, -1, "import");
    lua_pushstring(L, run->entry);
    lua_call(L, 1, 1);
    if (lua_type(L, -1) != LUA_TFUNCTION) {
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "%s: template must return a generator function, returned a %s value",
                        run->entry, luaL_typename(L, -2));
        return 2;
    }

    lua_createtable(L, 0, run->param_count);
    for (int i = 0; i < run->param_count; i++) {
        const lua_host_param *p = &run->params[i];
        switch (p->kind) {
        case LUA_PARAM_INT: lua_pushinteger(L, (lua_Integer)p->int_value); break;
        case LUA_PARAM_BOOL: lua_pushboolean(L, p->int_value != 0); break;
        case LUA_PARAM_STRING: lua_pushstring(L, p->string_value); break;
        }
        lua_setfield(L, -2, p->key);
    }
    lua_call(L, 1, 1);
    if (lua_type(L, -1) != LUA_TTABLE) {
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "%s: generator returned a %s value instead of a table { source = ..., name = ... }",
                        run->entry, luaL_typename(L, -2));
        return 2;
    }
    int result = lua_gettop(L);
    static const char *const fields[] = {"source", "name"};
    for (int i = 0; i < 2; i++) {
        if (lua_getfield(L, result, fields[i]) != LUA_TSTRING) {
            lua_pushboolean(L, 0);
            lua_pushfstring(L, "%s: generator returned no '%s' string (it is a %s value)", run->entry,
                            fields[i], luaL_typename(L, -2));
            return 2;
        }
    }
    size_t source_len, name_len;
    const char *source = lua_tolstring(L, result + 1, &source_len);
    const char *name = lua_tolstring(L, result + 2, &name_len);
    if (strlen(source) != source_len) {
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "%s: generated source contains a NUL byte", run->entry);
        return 2;
    }
    if (name_len >= sizeof(((generated *)0)->kernel_name)) {
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "%s: kernel name is %I characters long, the limit is %d", run->entry,
                        (lua_Integer)name_len, (int)sizeof(((generated *)0)->kernel_name) - 1);
        return 2;
    }
    if (!c_identifier_ok(name, name_len)) {
        lua_pushboolean(L, 0);
        lua_pushfstring(L, "%s: kernel name '%s' is not a C identifier", run->entry, name);
        return 2;
    }
    parse_launches(L, result, run);
    lua_pushboolean(L, 1);
    lua_pushvalue(L, result + 1);
    lua_pushvalue(L, result + 2);
    return 3;
}

int lua_host_run(const char *entry, const lua_host_param *params, int param_count,
                 long long instruction_budget, generated *out, char *err, size_t err_len) {
    if (err != NULL && err_len > 0) err[0] = '\0';
    if (out == NULL) {
        set_err(err, err_len, "lua_host_run: no result struct given");
        return -1;
    }
    memset(out, 0, sizeof *out);
    if (entry == NULL || !template_name_ok(entry)) {
        set_err(err, err_len, "invalid template name '%.64s' (expected letters, digits or '_' then .lua)",
                entry ? entry : "(null)");
        return -1;
    }
    if (param_count < 0 || (param_count > 0 && params == NULL)) {
        set_err(err, err_len, "%s: %d parameters given without an array", entry, param_count);
        return -1;
    }
    for (int i = 0; i < param_count; i++) {
        const lua_host_param *p = &params[i];
        if (p->key == NULL || p->key[0] == '\0') {
            set_err(err, err_len, "%s: parameter %d has no key", entry, i);
            return -1;
        }
        if (p->kind != LUA_PARAM_INT && p->kind != LUA_PARAM_BOOL && p->kind != LUA_PARAM_STRING) {
            set_err(err, err_len, "%s: parameter '%s' has unknown kind %d", entry, p->key, (int)p->kind);
            return -1;
        }
        if (p->kind == LUA_PARAM_STRING && p->string_value == NULL) {
            set_err(err, err_len, "%s: string parameter '%s' has no value", entry, p->key);
            return -1;
        }
    }

    host_run run;
    memset(&run, 0, sizeof run);
    run.entry = entry;
    run.params = params;
    run.param_count = param_count;
    run.budget = instruction_budget > 0 ? instruction_budget : LUA_HOST_DEFAULT_BUDGET;
    run.mem_limit = HOST_MEMORY_LIMIT;
    run.out = out;

    lua_State *L = lua_newstate(capped_alloc, &run);
    if (L == NULL) {
        set_err(err, err_len, "%s: cannot create a Lua state (out of memory)", entry);
        return -1;
    }
    *(host_run **)lua_getextraspace(L) = &run;
    lua_sethook(L, budget_hook, LUA_MASKCOUNT, HOST_HOOK_INTERVAL);
    /* neither push allocates, so nothing here can raise outside the pcall */
    lua_pushcfunction(L, host_traceback);
    lua_pushcfunction(L, host_main);
    int status = lua_pcall(L, 0, 3, 1);

    int rc = -1;
    if (status == LUA_OK && lua_toboolean(L, 2)) {
        size_t len;
        const char *source = lua_tolstring(L, 3, &len);
        const char *name = lua_tostring(L, 4);
        out->source = malloc(len + 1);
        if (out->source == NULL) {
            set_err(err, err_len, "%s: out of memory copying %zu bytes of generated source", entry, len);
        } else {
            memcpy(out->source, source, len + 1);
            snprintf(out->kernel_name, sizeof out->kernel_name, "%s", name);
            rc = 0;
        }
    } else if (status == LUA_OK) {
        set_err(err, err_len, "%s", lua_tostring(L, 3));
    } else if (status == LUA_ERRMEM || (status == LUA_ERRERR && run.mem_refused)) {
        if (run.seen_line > 0)
            set_err(err, err_len, "%s: not enough memory: templates may use at most %zu MiB (last seen running %s:%d)",
                    entry, HOST_MEMORY_LIMIT >> 20, run.seen_src, run.seen_line);
        else
            set_err(err, err_len, "%s: not enough memory: templates may use at most %zu MiB", entry,
                    HOST_MEMORY_LIMIT >> 20);
    } else if (lua_type(L, -1) == LUA_TSTRING) {
        set_err(err, err_len, "%s", lua_tostring(L, -1));
    } else {
        set_err(err, err_len, "%s: template failed with Lua status %d", entry, status);
    }
    lua_close(L);
    if (rc != 0) out->launch_count = 0; /* launches of a result that was refused */
    return rc;
}
