/* The Lua template host: results and parameters, what the sandbox hides,
 * error positions, instruction and memory limits, import caching and cycles,
 * template names and lookup. Templates are written into a temporary folder
 * that FLASHGEN_TEMPLATE_DIR points at. */
#include "gen/generate.h"
#include "gen/lua_host.h"
#include "tests/check.h"

#include <lauxlib.h>
#include <lua.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char dir[64];
static char err[4096];
static generated res;

static void write_file(const char *name, const char *text, size_t len) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(text, 1, len, f) != len) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static void tpl(const char *name, const char *text) { write_file(name, text, strlen(text)); }

static int run(const char *entry, const lua_host_param *params, int n, long long budget) {
    free(res.source);
    res.source = NULL;
    err[0] = '\0';
    return lua_host_run(entry, params, n, budget, &res, err, sizeof err);
}

static int starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_good_template(void) {
    tpl("naming.lua",
        "local M = {}\n"
        "function M.kernel_name(p)\n"
        "  return 'fg_fwd_' .. p.dtype .. '_d' .. p.head_dim .. (p.causal and '_causal' or '')\n"
        "end\n"
        "return M\n");
    tpl("good.lua",
        "local naming = import('naming')\n"
        "return function(p)\n"
        "  local name = naming.kernel_name(p)\n"
        "  local src = string.format('// d=%d causal=%s dtype=%s big=%d\\n', p.head_dim,\n"
        "    tostring(p.causal), p.dtype, p.big)\n"
        "  src = src .. table.concat({math.type(p.head_dim), type(p.causal), type(p.dtype),\n"
        "    tostring(p.dropout)}, ' ') .. '\\n'\n"
        "  return { source = src .. 'extern \"C\" __global__ void ' .. name .. '() {}\\n', name = name }\n"
        "end\n");
    lua_host_param params[] = {
        {"head_dim", LUA_PARAM_INT, 128, NULL},
        {"causal", LUA_PARAM_BOOL, 1, NULL},
        {"dropout", LUA_PARAM_BOOL, 0, NULL},
        {"dtype", LUA_PARAM_STRING, 0, "bf16"},
        {"big", LUA_PARAM_INT, -(1LL << 40) - 3, NULL},
    };
    int rc = run("good.lua", params, 5, LUA_HOST_DEFAULT_BUDGET);
    CHECK(rc == 0, "good template failed: %s", err);
    if (rc != 0) return;
    CHECK(strcmp(res.kernel_name, "fg_fwd_bf16_d128_causal") == 0, "name %s", res.kernel_name);
    CHECK(strstr(res.source, "// d=128 causal=true dtype=bf16 big=-1099511627779\n") != NULL, "source:\n%s",
          res.source);
    CHECK(strstr(res.source, "integer boolean string false\n") != NULL, "param types:\n%s", res.source);
    CHECK(strstr(res.source, "void fg_fwd_bf16_d128_causal() {}") != NULL, "source:\n%s", res.source);

    /* different params, different result: nothing cached across runs */
    params[1].int_value = 0;
    params[3].string_value = "fp16";
    rc = run("good.lua", params, 5, 0);
    CHECK(rc == 0 && strcmp(res.kernel_name, "fg_fwd_fp16_d128") == 0, "second run: rc %d name %s err %s", rc,
          res.kernel_name, err);
}

static void test_sandbox_contents(void) {
    tpl("probe.lua",
        "local hidden = {'io','os','package','debug','require','load','loadfile','dofile',\n"
        "  'collectgarbage','print','loadstring','rawset','coroutine','newproxy','module'}\n"
        "local present = {'assert','error','ipairs','next','pairs','pcall','select','tonumber',\n"
        "  'tostring','type','xpcall','rawequal','rawlen','rawget','setmetatable','getmetatable',\n"
        "  '_VERSION','string','table','math','utf8','import'}\n"
        "return function(p)\n"
        "  local out = {}\n"
        "  for _, k in ipairs(hidden) do if _ENV[k] ~= nil then out[#out+1] = 'visible:' .. k end end\n"
        "  for _, k in ipairs(present) do if _ENV[k] == nil then out[#out+1] = 'missing:' .. k end end\n"
        "  if string.dump ~= nil then out[#out+1] = 'visible:string.dump' end\n"
        "  if getmetatable('').__index.dump ~= nil then out[#out+1] = 'visible:meta.dump' end\n"
        "  if ('x').dump ~= nil then out[#out+1] = 'visible:method.dump' end\n"
        "  return { source = #out == 0 and 'clean' or table.concat(out, ' '), name = 'probe' }\n"
        "end\n");
    int rc = run("probe.lua", NULL, 0, 0);
    CHECK(rc == 0, "probe failed: %s", err);
    if (rc == 0) CHECK(strcmp(res.source, "clean") == 0, "sandbox exposes or lacks: %s", res.source);

    tpl("io_open.lua",
        "return function(p)\n"
        "  local f = io.open('/etc/passwd')\n"
        "  return { source = f:read('a'), name = 'x' }\n"
        "end\n");
    rc = run("io_open.lua", NULL, 0, 0);
    CHECK(rc == -1, "io.open worked");
    CHECK(starts_with(err, "io_open.lua:2: ") && strstr(err, "'io'") != NULL, "io.open error: %s", err);
    CHECK(strstr(err, "stack traceback:") != NULL, "no traceback: %s", err);
    CHECK(res.source == NULL, "source set on failure");

    tpl("os_exec.lua", "return function(p)\n  os.execute('true')\nend\n");
    rc = run("os_exec.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "os_exec.lua:2: "), "os.execute: rc %d err %s", rc, err);

    /* __gc finalizers run with hooks off, so they are refused */
    tpl("gc.lua", "return function(p)\n  setmetatable({}, {__gc = function() while true do end end})\nend\n");
    rc = run("gc.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "gc.lua:2: ") && strstr(err, "__gc") != NULL, "__gc: rc %d err %s", rc,
          err);
    /* ordinary metatables still work */
    tpl("meta.lua",
        "return function(p)\n"
        "  local t = setmetatable({}, {__index = function(_, k) return k .. '!' end})\n"
        "  return { source = t.hello, name = 'm' }\n"
        "end\n");
    rc = run("meta.lua", NULL, 0, 0);
    CHECK(rc == 0 && strcmp(res.source, "hello!") == 0, "metatable: rc %d err %s", rc, err);
}

static int dump_writer(lua_State *L, const void *p, size_t sz, void *ud) {
    (void)L;
    luaL_addlstring((luaL_Buffer *)ud, p, sz);
    return 0;
}

static void test_binary_chunks(void) {
    /* real bytecode, made with the same Lua the host uses */
    lua_State *L = luaL_newstate();
    luaL_loadstring(L, "return function() return { source = 'bytecode', name = 'b' } end");
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    lua_dump(L, dump_writer, &b, 0);
    luaL_pushresult(&b);
    size_t len;
    const char *bytes = lua_tolstring(L, -1, &len);
    write_file("bin_chunk.lua", bytes, len);
    lua_close(L);
    int rc = run("bin_chunk.lua", NULL, 0, 0);
    CHECK(rc == -1 && strstr(err, "bin_chunk.lua") != NULL, "bytecode ran: rc %d err %s", rc, err);

    /* a binary signature with no NUL bytes reaches the loader: text mode refuses it */
    tpl("bin_sig.lua", "\x1bLua return function() end");
    rc = run("bin_sig.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "bin_sig.lua: ") && strstr(err, "binary chunk") != NULL,
          "binary signature: rc %d err %s", rc, err);
    tpl("bin_import.lua", "local m = import('bin_sig')\nreturn function() end\n");
    rc = run("bin_import.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "bin_import.lua:1: bin_sig.lua: ") && strstr(err, "binary chunk") != NULL,
          "imported binary: rc %d err %s", rc, err);
}

static void test_error_positions(void) {
    tpl("syn.lua", "return function(p)\n  local x = = 1\nend\n");
    int rc = run("syn.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "syn.lua:2: "), "syntax error: rc %d err %s", rc, err);

    tpl("syn_user.lua", "-- uses a broken module\nlocal s = import('syn')\nreturn function() end\n");
    rc = run("syn_user.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "syn.lua:2: "), "imported syntax error: rc %d err %s", rc, err);

    tpl("mod_err.lua",
        "local M = {}\n"
        "function M.boom(x)\n"
        "  return x.field + 1\n"
        "end\n"
        "function M.fail() error('custom failure') end\n"
        "function M.fail_table() error({}) end\n"
        "return M\n");
    tpl("user.lua",
        "local m = import('mod_err')\n"
        "return function(p)\n"
        "  if p.which == 1 then m.boom(nil) end\n"
        "  if p.which == 2 then m.fail() end\n"
        "  if p.which == 3 then m.fail_table() end\n"
        "  return {}\n"
        "end\n");
    lua_host_param which = {"which", LUA_PARAM_INT, 1, NULL};
    rc = run("user.lua", &which, 1, 0);
    CHECK(rc == -1 && starts_with(err, "mod_err.lua:3: ") && strstr(err, "field") != NULL,
          "runtime error in module: rc %d err %s", rc, err);
    CHECK(strstr(err, "user.lua:3:") != NULL, "traceback lacks the caller: %s", err);
    which.int_value = 2;
    rc = run("user.lua", &which, 1, 0);
    CHECK(rc == -1 && starts_with(err, "mod_err.lua:5: custom failure"), "error(): rc %d err %s", rc, err);
    which.int_value = 3;
    rc = run("user.lua", &which, 1, 0);
    CHECK(rc == -1 && starts_with(err, "mod_err.lua:6: ") && strstr(err, "table value") != NULL,
          "error(table): rc %d err %s", rc, err);

    tpl("deep.lua", "local function f(n) return 1 + f(n + 1) end\nreturn function() f(1) end\n");
    rc = run("deep.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "deep.lua:1: ") && strstr(err, "stack overflow") != NULL,
          "recursion: rc %d err %.300s", rc, err);

    /* a small buffer gets a truncated, terminated message */
    char small[12];
    memset(small, 'x', sizeof small);
    rc = lua_host_run("syn.lua", NULL, 0, 0, &res, small, sizeof small);
    CHECK(rc == -1 && small[sizeof small - 1] == '\0' && strcmp(small, "syn.lua:2: ") == 0, "small buffer: %s",
          small);
}

static void test_instruction_budget(void) {
    tpl("loop.lua", "return function(p)\n  while true do end\nend\n");
    double t0 = now_seconds();
    int rc = run("loop.lua", NULL, 0, 1000000);
    CHECK(rc == -1 && starts_with(err, "loop.lua:2: ") &&
              strstr(err, "instruction budget exceeded (1000000 instructions)") != NULL,
          "infinite loop: rc %d err %s", rc, err);

    /* catching the stop with pcall does not keep the loop alive */
    tpl("swallow.lua",
        "return function(p)\n"
        "  local n = 0\n"
        "  while true do\n"
        "    pcall(function() while true do end end)\n"
        "    n = n + 1\n"
        "  end\n"
        "end\n");
    rc = run("swallow.lua", NULL, 0, 1000000);
    CHECK(rc == -1 && strstr(err, "instruction budget exceeded") != NULL, "pcall'd loop: rc %d err %s", rc, err);
    CHECK(now_seconds() - t0 < 10.0, "budget stops took %.1f s", now_seconds() - t0);

    tpl("spin.lua", "local M = {}\nfunction M.spin()\n  local i = 0\n  repeat i = i + 1 until false\nend\nreturn M\n");
    tpl("spin_user.lua", "local s = import('spin')\nreturn function() s.spin() end\n");
    rc = run("spin_user.lua", NULL, 0, 200000);
    CHECK(rc == -1 && starts_with(err, "spin.lua:4: ") && strstr(err, "instruction budget") != NULL,
          "loop in module: rc %d err %s", rc, err);

    /* the budget is a real count: 2M loop iterations fit the default, not 1M instructions */
    tpl("counted.lua",
        "return function(p)\n"
        "  local s = 0\n"
        "  for i = 1, p.n do s = s + i end\n"
        "  return { source = tostring(s), name = 'c' }\n"
        "end\n");
    lua_host_param n = {"n", LUA_PARAM_INT, 2000000, NULL};
    rc = run("counted.lua", &n, 1, 0);
    CHECK(rc == 0 && strcmp(res.source, "2000001000000") == 0, "default budget: rc %d err %s", rc, err);
    rc = run("counted.lua", &n, 1, 1000000);
    CHECK(rc == -1 && strstr(err, "instruction budget exceeded (1000000 instructions)") != NULL,
          "small budget: rc %d err %s", rc, err);
}

static void test_memory_limit(void) {
    tpl("bomb_rep.lua",
        "return function(p)\n"
        "  local s = string.rep('x', 1 << 30)\n"
        "  return { source = s, name = 'b' }\n"
        "end\n");
    int rc = run("bomb_rep.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "bomb_rep.lua: not enough memory"), "string.rep bomb: rc %d err %s", rc,
          err);

    tpl("bomb_table.lua",
        "return function(p)\n"
        "  local t = {}\n"
        "  for i = 1, math.huge do\n"
        "    t[i] = string.rep('y', 1 << 20) .. i\n"
        "  end\n"
        "end\n");
    rc = run("bomb_table.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "bomb_table.lua: not enough memory") &&
              strstr(err, "bomb_table.lua:4") != NULL,
          "table bomb: rc %d err %s", rc, err);

    /* a template may catch the failure and go on; the state stays usable */
    tpl("bomb_caught.lua",
        "return function(p)\n"
        "  local ok, e = pcall(string.rep, 'x', 1 << 30)\n"
        "  return { source = tostring(ok) .. ' ' .. tostring(e), name = 'b' }\n"
        "end\n");
    rc = run("bomb_caught.lua", NULL, 0, 0);
    CHECK(rc == 0 && strcmp(res.source, "false not enough memory") == 0, "caught bomb: rc %d err %s src %s", rc,
          err, rc == 0 ? res.source : "");
}

static void test_imports(void) {
    tpl("counter.lua", "loads = (loads or 0) + 1\nreturn { id = {} }\n");
    tpl("quiet.lua", "local x = 1\n");
    tpl("caching.lua",
        "local a = import('counter')\n"
        "local b = import('counter')\n"
        "local c = import('counter.lua')\n"
        "local q = import('quiet')\n"
        "return function(p)\n"
        "  local d = import('counter')\n"
        "  return { source = table.concat({tostring(loads), tostring(a == b), tostring(a == c),\n"
        "    tostring(a == d), tostring(q)}, ' '), name = 'k' }\n"
        "end\n");
    int rc = run("caching.lua", NULL, 0, 0);
    CHECK(rc == 0 && strcmp(res.source, "1 true true true true") == 0, "caching: rc %d err %s src %s", rc, err,
          rc == 0 ? res.source : "");
    /* a new run loads modules afresh */
    rc = run("caching.lua", NULL, 0, 0);
    CHECK(rc == 0 && starts_with(res.source, "1 "), "second run: rc %d err %s", rc, err);

    /* quiet.lua finished before the cycle, so it must not be listed in it */
    tpl("cyc_a.lua", "local q = import('quiet')\nlocal b = import('cyc_b')\nreturn function() end\n");
    tpl("cyc_b.lua", "-- b needs a\nlocal a = import('cyc_a')\nreturn {}\n");
    rc = run("cyc_a.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "cyc_b.lua:2: import cycle: cyc_a.lua -> cyc_b.lua -> cyc_a.lua"),
          "cycle: rc %d err %s", rc, err);
    tpl("self.lua", "local me = import('self')\nreturn function() end\n");
    rc = run("self.lua", NULL, 0, 0);
    CHECK(rc == -1 && strstr(err, "import cycle: self.lua -> self.lua") != NULL, "self import: rc %d err %s", rc,
          err);

    /* a failed import caught by pcall is not mistaken for a cycle later */
    tpl("fails.lua", "error('nope')\n");
    tpl("retry.lua",
        "local ok1, e1 = pcall(import, 'fails')\n"
        "local ok2, e2 = pcall(import, 'fails')\n"
        "return function() return { source = tostring(ok1) .. ' ' .. tostring(ok2) .. ' ' .. e2, name = 'r' } end\n");
    rc = run("retry.lua", NULL, 0, 0);
    CHECK(rc == 0 && strcmp(res.source, "false false fails.lua:1: nope") == 0, "retry: rc %d err %s src %s", rc,
          err, rc == 0 ? res.source : "");

    tpl("imp_bad.lua", "local x = import('../etc/passwd')\nreturn function() end\n");
    rc = run("imp_bad.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "imp_bad.lua:1: ") && strstr(err, "invalid module name") != NULL,
          "bad import name: rc %d err %s", rc, err);
    tpl("imp_missing.lua", "local x = import('not_there')\nreturn function() end\n");
    rc = run("imp_missing.lua", NULL, 0, 0);
    CHECK(rc == -1 && starts_with(err, "imp_missing.lua:1: ") && strstr(err, "not_there.lua") != NULL,
          "missing import: rc %d err %s", rc, err);
}

static void test_bad_results(void) {
    struct {
        const char *file, *text, *expect;
    } cases[] = {
        {"no_source.lua", "return function() return { name = 'k' } end\n",
         "no_source.lua: generator returned no 'source' string"},
        {"num_source.lua", "return function() return { source = 42, name = 'k' } end\n",
         "num_source.lua: generator returned no 'source' string"},
        {"no_name.lua", "return function() return { source = 's' } end\n",
         "no_name.lua: generator returned no 'name' string"},
        {"not_fn.lua", "return 42\n", "not_fn.lua: template must return a generator function"},
        {"not_table.lua", "return function() return 'src' end\n", "not_table.lua: generator returned a string"},
        {"bad_ident.lua", "return function() return { source = 's', name = 'fg-fwd' } end\n",
         "bad_ident.lua: kernel name 'fg-fwd' is not a C identifier"},
        {"digit_ident.lua", "return function() return { source = 's', name = '9k' } end\n",
         "digit_ident.lua: kernel name '9k' is not a C identifier"},
        {"long_name.lua", "return function() return { source = 's', name = string.rep('k', 200) } end\n",
         "long_name.lua: kernel name is 200 characters long"},
        {"nul_source.lua", "return function() return { source = 'a\\0b', name = 'k' } end\n",
         "nul_source.lua: generated source contains a NUL byte"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tpl(cases[i].file, cases[i].text);
        int rc = run(cases[i].file, NULL, 0, 0);
        CHECK(rc == -1 && starts_with(err, cases[i].expect), "%s: rc %d err %s", cases[i].file, rc, err);
        CHECK(res.source == NULL && res.kernel_name[0] == '\0', "%s: result left set", cases[i].file);
    }
    /* the longest name that fits is accepted */
    tpl("max_name.lua", "return function() return { source = 's', name = string.rep('k', 127) } end\n");
    int rc = run("max_name.lua", NULL, 0, 0);
    CHECK(rc == 0 && strlen(res.kernel_name) == 127, "127-char name: rc %d err %s", rc, err);
}

/* Launches: read into the result as given, defaults filled in; malformed
 * ones refused with the launch and the field named. */
static void test_launches(void) {
    tpl("launches.lua",
        "return function(p) return { source = 's', name = 'k', launches = {\n"
        "  { entry = 'k_pre', threads = 256, grid = { { 'batch', 'heads_q', 'seqlen_q', per = 32 } } },\n"
        "  { entry = 'k', threads = 128, smem = 52224, cluster = 2,\n"
        "    grid = { { scale = 4 }, { 'n_groups' } } } } } end\n");
    int rc = run("launches.lua", NULL, 0, 0);
    CHECK(rc == 0 && res.launch_count == 2, "launches: rc %d count %d err %s", rc, res.launch_count,
          err);
    if (rc == 0 && res.launch_count == 2) {
        const kernel_launch *a = &res.launch[0], *b = &res.launch[1];
        CHECK(strcmp(a->entry, "k_pre") == 0 && a->threads == 256 && a->smem_bytes == 0 &&
                  a->cluster == 1 && a->factor_count == 1 && a->factor[0].field_count == 3 &&
                  strcmp(a->factor[0].field[2], "seqlen_q") == 0 && a->factor[0].per == 32 &&
                  a->factor[0].scale == 1,
              "first launch as given, defaults filled");
        CHECK(strcmp(b->entry, "k") == 0 && b->threads == 128 && b->smem_bytes == 52224 &&
                  b->cluster == 2 && b->factor_count == 2 && b->factor[0].field_count == 0 &&
                  b->factor[0].scale == 4 && strcmp(b->factor[1].field[0], "n_groups") == 0,
              "second launch as given");
    }
    struct {
        const char *launch, *expect;
    } bad[] = {
        {"{ entry = 'k', grid = { { 'batch' } } }", "'threads' is required"},
        {"{ entry = 'k', threads = 2048, grid = { { 'batch' } } }", "'threads' must be an integer"},
        {"{ entry = 'k', threads = 64, cluster = 17, grid = { { 'batch' } } }",
         "'cluster' must be an integer in 1..16"},
        {"{ entry = 'k-x', threads = 64, grid = { { 'batch' } } }", "'entry' must name a kernel"},
        {"{ entry = 'k', threads = 64, grid = {} }", "a grid has 1..4 factors"},
        {"{ entry = 'k', threads = 64, grid = { { 'a', 'b', 'c', 'd' } } }", "at most 3 fields"},
        {"{ entry = 'k', threads = 64, grid = { { 'batch', per = 0 } } }", "'per' must be an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "return function(p) return { source = 's', name = 'k', launches = { %s } } end\n",
                 bad[i].launch);
        tpl("bad_launch.lua", text);
        rc = run("bad_launch.lua", NULL, 0, 0);
        CHECK(rc == -1 && strstr(err, "bad_launch.lua: launch 1") && strstr(err, bad[i].expect),
              "%s: rc %d err %s", bad[i].launch, rc, err);
        CHECK(res.source == NULL && res.launch_count == 0, "%s: result left set", bad[i].launch);
    }
}

/* generate_kernel hands a template the launch-argument struct and accepts
 * only launches whose grid fields are ints of that struct. */
static void test_generate_launch_fields(void) {
    fg_spec spec = fg_spec_default(64, FG_FP16);
    kernel_target target = {80, 0};
    struct {
        const char *grid, *expect; /* expect NULL: generated */
    } cases[] = {
        {"{ { 'num_m_blocks' }, { 'heads_q' }, { 'batch' } }", NULL},
        {"{ { 'bogus' } }", "grid field 'bogus' is not an int of fg_fwd_params"},
        {"{ { 'q' } }", "grid field 'q' is not an int of fg_fwd_params"},
        {"{ { 'philox_keys' } }", "grid field 'philox_keys' is not an int of fg_fwd_params"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "return function(p) return { source = p.params_struct, name = 'k_' .. p.target_tag,\n"
                 "  launches = { { entry = 'k', threads = 32, grid = %s } } } end\n",
                 cases[i].grid);
        tpl("kernel_probe.lua", text);
        generated g;
        int rc = generate_kernel("kernel_probe.lua", &spec, &target, NULL, 0, &fwd_params_layout,
                                 &g, err, sizeof err);
        if (!cases[i].expect) {
            CHECK(rc == 0 && strstr(g.source, "struct fg_fwd_params {") &&
                      strcmp(g.kernel_name, "k_sm80") == 0,
                  "%s: rc %d err %s", cases[i].grid, rc, err);
            if (rc == 0) generated_free(&g);
        } else {
            CHECK(rc == -1 && strstr(err, cases[i].expect), "%s: rc %d err %s", cases[i].grid, rc,
                  err);
        }
    }
    tpl("kernel_probe.lua", "return function(p) return { source = 's', name = 'k' } end\n");
    generated g;
    CHECK(generate_kernel("kernel_probe.lua", &spec, &target, NULL, 0, &fwd_params_layout, &g, err,
                          sizeof err) == -1 &&
              strstr(err, "returned no launches"),
          "a kernel without launches: %s", err);
}

static void test_names_and_lookup(void) {
    const char *bad[] = {"../x.lua", "x.lu", ".lua", "a/b.lua", "", "a.b.lua", "x.lua ", "sub/../x.lua", "x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *text = lua_host_template_text(bad[i], err, sizeof err);
        CHECK(text == NULL && strstr(err, "invalid template name") != NULL, "name '%s' accepted: %s", bad[i], err);
        free(text);
        int rc = run(bad[i], NULL, 0, 0);
        CHECK(rc == -1 && strstr(err, "invalid template name") != NULL, "run '%s': rc %d err %s", bad[i], rc, err);
    }
    CHECK(lua_host_template_text(NULL, err, sizeof err) == NULL, "NULL name accepted");
    CHECK(run(NULL, NULL, 0, 0) == -1, "NULL entry accepted");

    char *text = lua_host_template_text("good.lua", err, sizeof err);
    CHECK(text != NULL && starts_with(text, "local naming = import('naming')"), "disk lookup: %s", err);
    free(text);

    int rc = run("missing_tpl.lua", NULL, 0, 0);
    CHECK(rc == -1 && strstr(err, "missing_tpl.lua") != NULL && strstr(err, dir) != NULL,
          "missing template: rc %d err %s", rc, err);

    /* parameters are checked before any Lua runs */
    lua_host_param nokey = {NULL, LUA_PARAM_INT, 1, NULL};
    CHECK(run("good.lua", &nokey, 1, 0) == -1 && strstr(err, "no key") != NULL, "NULL key: %s", err);
    lua_host_param nostr = {"dtype", LUA_PARAM_STRING, 0, NULL};
    CHECK(run("good.lua", &nostr, 1, 0) == -1 && strstr(err, "'dtype'") != NULL, "NULL string: %s", err);
    CHECK(run("good.lua", NULL, 2, 0) == -1, "params NULL with count 2 accepted");
    CHECK(lua_host_run("good.lua", NULL, 0, 0, NULL, err, sizeof err) == -1, "NULL out accepted");

    /* without the folder (unset or empty) the embedded set answers */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0)
            unsetenv("FLASHGEN_TEMPLATE_DIR");
        else
            setenv("FLASHGEN_TEMPLATE_DIR", "", 1);
        for (int i = 0; i < fg_embedded_template_count; i++) {
            char *t = lua_host_template_text(fg_embedded_templates[i].name, err, sizeof err);
            CHECK(t != NULL && strcmp(t, fg_embedded_templates[i].text) == 0, "embedded %s: %s",
                  fg_embedded_templates[i].name, err);
            CHECK(t != fg_embedded_templates[i].text, "embedded text not copied");
            free(t);
        }
        char *t = lua_host_template_text("good.lua", err, sizeof err);
        CHECK(t == NULL && strstr(err, "good.lua") != NULL && strstr(err, "embedded") != NULL,
              "folder still used (pass %d): %s", pass, err);
        free(t);
    }
    setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);
}

/* At exit, so a test that stops early (write_file) leaves nothing behind. */
static void remove_dir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    alarm(120); /* a budget that fails to stop a loop ends the test instead of hanging it */
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/fg_sandbox_XXXXXX", tmp && tmp[0] && strlen(tmp) < 40 ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    atexit(remove_dir);
    setenv("FLASHGEN_TEMPLATE_DIR", dir, 1);

    test_good_template();
    test_sandbox_contents();
    test_binary_chunks();
    test_error_positions();
    test_instruction_budget();
    test_memory_limit();
    test_imports();
    test_bad_results();
    test_launches();
    test_generate_launch_fields();
    test_names_and_lookup();

    free(res.source);
    return check_summary("test_sandbox");
}
