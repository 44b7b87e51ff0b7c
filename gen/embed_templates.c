/* fg_embed_templates OUT.c file1.lua file2.lua ...
 *
 * Build-time tool: syntax-checks each template (text mode, as the runtime
 * loads them) and writes OUT.c defining fg_embedded_templates[] and
 * fg_embedded_template_count (gen/lua_host.h). A broken template fails the
 * build with "path:LINE: message". The output goes to OUT.c.tmp first and
 * is renamed into place, so an interrupted build leaves no half file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

/* Source bytes per string literal; keeps every literal far below the 4095
 * characters C11 guarantees, however many escapes it holds. */
#define EMBED_CHUNK_BYTES 512

typedef struct embedded {
    const char *path;
    const char *name; /* basename */
    char *text;
    size_t len;
} embedded;

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Same rule as lua_host.c applies at run time: [A-Za-z0-9_]+\.lua. */
static int template_name_ok(const char *name) {
    size_t len = strlen(name);
    if (len <= 4 || len >= 128 || strcmp(name + len - 4, ".lua") != 0) return 0;
    for (size_t i = 0; i < len - 4; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

static int read_file(const char *path, char **text, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "%s: cannot open: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (buf == NULL) {
            fprintf(stderr, "%s: out of memory\n", path);
            fclose(f);
            return -1;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *bigger = realloc(buf, cap * 2);
        if (bigger == NULL) free(buf);
        buf = bigger;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        fprintf(stderr, "%s: read error\n", path);
        free(buf);
        return -1;
    }
    *text = buf;
    *len = n;
    return 0;
}

/* Loads the text exactly as the host will (mode "t", chunk "@name") and
 * reports Lua's "name:LINE: msg" with the full path in front instead. */
static int syntax_check(const embedded *t) {
    if (memchr(t->text, '\0', t->len) != NULL) {
        fprintf(stderr, "%s: contains a NUL byte; templates are embedded as C strings\n", t->path);
        return -1;
    }
    lua_State *L = luaL_newstate();
    if (L == NULL) {
        fprintf(stderr, "%s: cannot create a Lua state\n", t->path);
        return -1;
    }
    char chunkname[160];
    snprintf(chunkname, sizeof chunkname, "@%s", t->name);
    int status = luaL_loadbufferx(L, t->text, t->len, chunkname, "t");
    if (status != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        size_t name_len = strlen(t->name);
        if (msg == NULL) msg = "unknown load error";
        if (strncmp(msg, t->name, name_len) == 0 && msg[name_len] == ':')
            fprintf(stderr, "%s%s\n", t->path, msg + name_len);
        else
            fprintf(stderr, "%s: %s\n", t->path, msg);
    }
    lua_close(L);
    return status == LUA_OK ? 0 : -1;
}

/* One literal per source line (longer lines are split), each byte escaped
 * so the C compiler reproduces it exactly. '?' is escaped because -std=c11
 * turns trigraphs like "??=" into other characters. */
static void write_literal_text(FILE *out, const char *text, size_t len) {
    if (len == 0) {
        fputs("    \"\"", out);
        return;
    }
    size_t in_chunk = 0;
    int open = 0;
    for (size_t i = 0; i < len; i++) {
        if (!open) {
            fputs("    \"", out);
            open = 1;
            in_chunk = 0;
        }
        unsigned char c = (unsigned char)text[i];
        switch (c) {
        case '\n': fputs("\\n", out); break;
        case '\t': fputs("\\t", out); break;
        case '\r': fputs("\\r", out); break;
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '?': fputs("\\?", out); break;
        default:
            if (c >= 0x20 && c < 0x7f)
                fputc(c, out);
            else
                fprintf(out, "\\%03o", c); /* always 3 digits: cannot swallow the next char */
        }
        in_chunk++;
        if (c == '\n' || in_chunk == EMBED_CHUNK_BYTES || i + 1 == len) {
            fputs(i + 1 == len ? "\"" : "\"\n", out);
            open = 0;
        }
    }
}

static int write_output(const char *out_path, const embedded *t, int count) {
    size_t tmp_len = strlen(out_path) + 5;
    char *tmp = malloc(tmp_len);
    if (tmp == NULL) {
        fprintf(stderr, "%s: out of memory\n", out_path);
        return -1;
    }
    snprintf(tmp, tmp_len, "%s.tmp", out_path);
    FILE *out = fopen(tmp, "wb");
    if (out == NULL) {
        fprintf(stderr, "%s: cannot create: %s\n", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    fprintf(out, "/* Generated by fg_embed_templates from %d template%s; do not edit. */\n", count,
            count == 1 ? "" : "s");
    fputs("#include \"gen/lua_host.h\"\n\n", out);
    for (int i = 0; i < count; i++) {
        fprintf(out, "/* %s */\nstatic const char fg_template_text_%d[] =\n", t[i].name, i);
        write_literal_text(out, t[i].text, t[i].len);
        fputs(";\n\n", out);
    }
    fputs("const template_file fg_embedded_templates[] = {\n", out);
    for (int i = 0; i < count; i++) fprintf(out, "    {\"%s\", fg_template_text_%d},\n", t[i].name, i);
    /* end marker; also keeps the array non-empty when there are no templates */
    fputs("    {NULL, NULL},\n};\n\n", out);
    fprintf(out, "const int fg_embedded_template_count = %d;\n", count);

    int failed = ferror(out);
    if (fclose(out) != 0) failed = 1;
    if (failed) {
        fprintf(stderr, "%s: write error\n", tmp);
        remove(tmp);
        free(tmp);
        return -1;
    }
    if (rename(tmp, out_path) != 0) {
        fprintf(stderr, "%s: cannot rename to %s: %s\n", tmp, out_path, strerror(errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT.c [template.lua ...]\n", argv[0]);
        return 2;
    }
    int count = argc - 2;
    embedded *t = calloc(count > 0 ? (size_t)count : 1, sizeof *t);
    if (t == NULL) {
        fprintf(stderr, "%s: out of memory\n", argv[0]);
        return 1;
    }
    int failed = 0;
    for (int i = 0; i < count; i++) {
        t[i].path = argv[i + 2];
        t[i].name = base_name(t[i].path);
        if (!template_name_ok(t[i].name)) {
            fprintf(stderr, "%s: template file names must be [A-Za-z0-9_]+.lua\n", t[i].path);
            failed = 1;
            continue;
        }
        for (int j = 0; j < i; j++) {
            if (strcmp(t[j].name, t[i].name) == 0) {
                fprintf(stderr, "%s: same name as %s\n", t[i].path, t[j].path);
                failed = 1;
            }
        }
        if (read_file(t[i].path, &t[i].text, &t[i].len) != 0 || syntax_check(&t[i]) != 0) failed = 1;
    }
    if (!failed && write_output(argv[1], t, count) != 0) failed = 1;
    for (int i = 0; i < count; i++) free(t[i].text);
    free(t);
    return failed ? 1 : 0;
}
