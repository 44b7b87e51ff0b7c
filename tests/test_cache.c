/* The kernel cache: SHA-256 against published vectors, keys that change with
 * every field and cannot alias, the on-disk entry format, damaged entries
 * reading as misses, location resolution, graceful degradation when the
 * folder is unusable, and many processes writing at once. Everything happens
 * under a fresh mkdtemp folder that is removed at the end. */
#include "cache/cache.h"
#include "tests/check.h"
#include "tests/store_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


/* ---- helpers ---------------------------------------------------------------- */

static void to_hex(const uint8_t d[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
}

static void sha_pieces(const void *data, size_t len, size_t piece, char hex[65]) {
    const uint8_t *p = data;
    cache_sha256 h;
    uint8_t d[32];
    cache_sha256_init(&h);
    while (len > 0) {
        size_t n = len < piece ? len : piece;
        cache_sha256_update(&h, p, n);
        p += n;
        len -= n;
    }
    cache_sha256_final(&h, d);
    to_hex(d, hex);
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Overwrites bytes in place (not through the store). */
static int patch(const char *path, long offset, const void *bytes, size_t n) {
    FILE *f = fopen(path, "r+b");
    if (f == NULL) return -1;
    int ok = fseek(f, offset, SEEK_SET) == 0 && fwrite(bytes, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int mode_of(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int)(st.st_mode & 0777) : -1;
}

/* Counts entries in a folder whose names start with prefix (or end with
 * suffix when prefix is NULL). */
static int count_names(const char *folder, const char *prefix, const char *suffix) {
    DIR *d = opendir(folder);
    if (d == NULL) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (prefix != NULL && strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
        if (prefix == NULL && suffix != NULL && len >= strlen(suffix) &&
            strcmp(e->d_name + len - strlen(suffix), suffix) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* Loads and compares with the expected bytes: 1 intact hit, 0 miss, -1 a hit
 * with the wrong content. */
static int load_matches(const cache_store *s, const char *target, const char *key,
                        const void *want, size_t want_len) {
    void *got = NULL;
    size_t got_len = 12345;
    int hit = cache_store_load(s, target, key, &got, &got_len);
    if (!hit) {
        int clean = got == NULL && got_len == 0;
        free(got);
        return clean ? 0 : -1;
    }
    int same = got != NULL && got_len == want_len && memcmp(got, want, want_len) == 0;
    free(got);
    return same ? 1 : -1;
}

/* ---- SHA-256 ------------------------------------------------------------------ */

static void test_sha256(void) {
    char hex[65];

    /* FIPS 180-4 example messages and the NIST one-million-'a' vector. */
    cache_sha256_hex("", 0, hex);
    CHECK(strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0,
          "empty: %s", hex);
    cache_sha256_hex(NULL, 0, hex);
    CHECK(strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0,
          "NULL empty: %s", hex);
    cache_sha256_hex("abc", 3, hex);
    CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0,
          "abc: %s", hex);
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    cache_sha256_hex(m448, strlen(m448), hex);
    CHECK(strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1") == 0,
          "448-bit: %s", hex);

    static char million[1000000];
    memset(million, 'a', sizeof million);
    const char *want_m = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    size_t pieces[] = {1000, 1, 63, 64, 65, 4096, sizeof million};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        sha_pieces(million, sizeof million, pieces[i], hex);
        CHECK(strcmp(hex, want_m) == 0, "million a in pieces of %zu: %s", pieces[i], hex);
    }

    /* Padding edges: 55 bytes is the most that fits one block with the
     * length; 56..64 need a second block. Values from an independent
     * implementation. */
    struct {
        size_t n;
        const char *hex;
    } edges[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
    };
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        cache_sha256_hex(million, edges[i].n, hex);
        CHECK(strcmp(hex, edges[i].hex) == 0, "%zu x 'a': %s", edges[i].n, hex);
    }

    /* Any split of the input gives the one-shot digest. */
    uint8_t data[300];
    fill(data, sizeof data, 7);
    char one[65];
    cache_sha256_hex(data, sizeof data, one);
    int split_bad = 0;
    for (size_t cut = 0; cut <= sizeof data; cut++) {
        for (size_t cut2 = cut; cut2 <= sizeof data; cut2 += 37) {
            cache_sha256 h;
            uint8_t d[32];
            cache_sha256_init(&h);
            cache_sha256_update(&h, data, cut);
            cache_sha256_update(&h, NULL, 0);
            cache_sha256_update(&h, data + cut, cut2 - cut);
            cache_sha256_update(&h, data + cut2, sizeof data - cut2);
            cache_sha256_final(&h, d);
            to_hex(d, hex);
            if (strcmp(hex, one) != 0) split_bad++;
        }
    }
    CHECK(split_bad == 0, "%d splits differ from the one-shot digest", split_bad);
    /* and a change of one bit anywhere changes it */
    data[150] ^= 0x80;
    cache_sha256_hex(data, sizeof data, hex);
    CHECK(strcmp(hex, one) != 0, "a flipped bit kept the digest");
}

/* ---- keys ------------------------------------------------------------------------ */

static cache_key_input base_input(void) {
    cache_key_input in = {
        .source = "extern \"C\" __global__ void fg_fwd(float *o) { o[0] = 1.0f; }",
        .options = "--gpu-architecture=sm_80 -default-device -std=c++17",
        .target = "sm_80",
        .nvrtc_major = 13,
        .nvrtc_minor = 0,
        .generator_version = "0.1.0",
    };
    return in;
}

static void put_u64_le(cache_sha256 *h, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    cache_sha256_update(h, b, 8);
}

static void put_named(cache_sha256 *h, const char *name, const char *value) {
    put_u64_le(h, strlen(name));
    cache_sha256_update(h, name, strlen(name));
    put_u64_le(h, strlen(value));
    cache_sha256_update(h, value, strlen(value));
}

static void test_keys(void) {
    cache_key_input in = base_input();
    char k0[65], k[65];
    cache_key(&in, k0);
    CHECK(strlen(k0) == 64 && strspn(k0, "0123456789abcdef") == 64, "key shape: %s", k0);

    /* Equal content in other buffers gives the same key. */
    char src[256], opt[256], gen[32];
    snprintf(src, sizeof src, "%s", in.source);
    snprintf(opt, sizeof opt, "%s", in.options);
    snprintf(gen, sizeof gen, "%s", in.generator_version);
    char target[16] = "sm_80";
    cache_key_input copy = {src, opt, target, 13, 0, gen};
    cache_key(&copy, k);
    CHECK(strcmp(k, k0) == 0, "equal inputs, different keys: %s vs %s", k, k0);
    cache_key(&in, k);
    CHECK(strcmp(k, k0) == 0, "key not stable: %s vs %s", k, k0);

    /* The documented layout: named, length-prefixed fields, so shipped
     * bundles stay valid across builds of the same format. */
    cache_sha256 h;
    uint8_t d[32];
    char want[65], num[32];
    cache_sha256_init(&h);
    snprintf(num, sizeof num, "%d", CACHE_FORMAT_VERSION);
    put_named(&h, "format", num);
    put_named(&h, "source", in.source);
    put_named(&h, "options", in.options);
    put_named(&h, "target", "sm_80");
    put_named(&h, "nvrtc", "13.0");
    put_named(&h, "generator", in.generator_version);
    cache_sha256_final(&h, d);
    to_hex(d, want);
    CHECK(strcmp(k0, want) == 0, "key layout: %s, expected %s", k0, want);

    /* Each field alone changes the key, and all the changed keys differ. */
    char keys[10][65];
    int nk = 0;
    strcpy(keys[nk++], k0);
    cache_key_input v;
    v = in; v.source = "extern \"C\" __global__ void fg_fwd(float *o) { o[0] = 2.0f; }";
    cache_key(&v, keys[nk++]);
    v = in; v.options = "--gpu-architecture=sm_80 -default-device -std=c++17 -lineinfo";
    cache_key(&v, keys[nk++]);
    v = in; v.target = "sm_86";
    cache_key(&v, keys[nk++]);
    v = in; v.target = "sm_80a"; /* arch-specific code is another binary */
    cache_key(&v, keys[nk++]);
    v = in; v.target = "sm_80f";
    cache_key(&v, keys[nk++]);
    v = in; v.nvrtc_major = 12;
    cache_key(&v, keys[nk++]);
    v = in; v.nvrtc_minor = 1;
    cache_key(&v, keys[nk++]);
    v = in; v.generator_version = "0.1.1";
    cache_key(&v, keys[nk++]);
    for (int i = 0; i < nk; i++)
        for (int j = i + 1; j < nk; j++)
            CHECK(strcmp(keys[i], keys[j]) != 0, "variants %d and %d share key %s", i, j,
                  keys[i]);

    /* Field boundaries cannot alias. */
    cache_key_input a = in, b = in;
    a.source = "ab"; a.options = "c";
    b.source = "a"; b.options = "bc";
    char ka[65], kb[65];
    cache_key(&a, ka);
    cache_key(&b, kb);
    CHECK(strcmp(ka, kb) != 0, "source/options boundary aliases: %s", ka);
    a = in; b = in;
    a.options = "-O3"; a.generator_version = "1";
    b.options = "-O"; b.generator_version = "31";
    cache_key(&a, ka);
    cache_key(&b, kb);
    CHECK(strcmp(ka, kb) != 0, "options/generator boundary aliases: %s", ka);
    a = in; b = in;
    a.nvrtc_major = 1; a.nvrtc_minor = 23;
    b.nvrtc_major = 12; b.nvrtc_minor = 3;
    cache_key(&a, ka);
    cache_key(&b, kb);
    CHECK(strcmp(ka, kb) != 0, "nvrtc 1.23 and 12.3 alias: %s", ka);
    a = in; b = in;
    a.source = ""; a.options = "x";
    b.source = "x"; b.options = "";
    cache_key(&a, ka);
    cache_key(&b, kb);
    CHECK(strcmp(ka, kb) != 0, "empty fields alias: %s", ka);
    a = in; b = in;
    a.options = "x sm_9"; a.target = "0";
    b.options = "x sm_"; b.target = "90";
    cache_key(&a, ka);
    cache_key(&b, kb);
    CHECK(strcmp(ka, kb) != 0, "options/target boundary aliases: %s", ka);

    /* A missing string is the empty string. */
    a = in; b = in;
    a.options = NULL;
    b.options = "";
    cache_key(&a, ka);
    cache_key(&b, kb);
    CHECK(strcmp(ka, kb) == 0, "NULL and empty options differ: %s vs %s", ka, kb);
}

/* ---- target names ----------------------------------------------------------------- */

static void test_targets(void) {
    const char *good[] = {"sm_75", "sm_80", "sm_90", "sm_90a", "sm_100f", "sm_120a", "sm_1",
                          "sm_123456789012"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        CHECK(cache_target_valid(good[i]), "'%s' refused", good[i]);
    const char *bad[] = {NULL, "", "sm", "sm_", "sm_a", "sm_0", "sm_09", "sm_90A", "sm_90b",
                         "sm_90aa", "sm_90-a", "90", "SM_90", "xsm_90", "sm_90/", "../sm_90",
                         "sm_1234567890123", "compute_90", "sm_9 0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(!cache_target_valid(bad[i]), "'%s' accepted", bad[i] ? bad[i] : "(null)");

    /* What --arch takes. */
    struct {
        const char *text, *want;
    } parse[] = {
        {"90", "sm_90"}, {"sm_90", "sm_90"}, {"90a", "sm_90a"}, {"sm_90a", "sm_90a"},
        {"100f", "sm_100f"}, {"75", "sm_75"},
    };
    char t[CACHE_TARGET_SIZE];
    for (size_t i = 0; i < sizeof parse / sizeof parse[0]; i++)
        CHECK(cache_target_parse(parse[i].text, t) == 0 && strcmp(t, parse[i].want) == 0,
              "parse '%s': '%s'", parse[i].text, t);
    const char *unparsed[] = {"", "sm_", "a", "90x", "sm_sm_90", "0", "../90", "90 ", "9a0",
                              "1234567890123"};
    for (size_t i = 0; i < sizeof unparsed / sizeof unparsed[0]; i++) {
        strcpy(t, "x");
        CHECK(cache_target_parse(unparsed[i], t) == -1 && t[0] == '\0', "parsed '%s' as '%s'",
              unparsed[i], t);
    }
    CHECK(cache_target_parse(NULL, t) == -1, "NULL parsed");

    /* Numeric order, then the suffix. */
    const char *order[] = {"sm_75", "sm_80", "sm_86", "sm_90", "sm_90a", "sm_90f", "sm_100",
                           "sm_100a", "sm_120"};
    size_t n = sizeof order / sizeof order[0];
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            int c = cache_target_cmp(order[i], order[j]);
            int want = (i > j) - (i < j);
            CHECK((c > 0) - (c < 0) == want, "cmp(%s, %s) = %d", order[i], order[j], c);
        }
    CHECK(cache_target_sm("sm_90a") == 90 && cache_target_sm("sm_100") == 100 &&
              cache_target_sm("sm_75") == 75 && cache_target_sm("90") == -1,
          "SM numbers");
}

/* sm_90 and sm_90a are separate targets: separate folders, never each
 * other's entries, even under one key. */
static void test_arch_specific(void) {
    cache_store s;
    if (open_at(&s, "specific") != 0) return;
    char key[65], err[512], p90[2048], p90a[2048], want[2048];
    cache_key_input in = base_input();
    in.target = "sm_90";
    cache_key(&in, key);
    uint8_t a[300], b[500];
    fill(a, sizeof a, 90);
    fill(b, sizeof b, 91);
    CHECK(cache_store_save(&s, "sm_90", key, a, sizeof a, err, sizeof err) == 0, "save: %s", err);
    CHECK(load_matches(&s, "sm_90a", key, a, sizeof a) == 0, "sm_90 entry found for sm_90a");
    CHECK(load_matches(&s, "sm_90f", key, a, sizeof a) == 0, "sm_90 entry found for sm_90f");
    CHECK(cache_store_save(&s, "sm_90a", key, b, sizeof b, err, sizeof err) == 0, "save: %s", err);
    CHECK(load_matches(&s, "sm_90", key, a, sizeof a) == 1, "sm_90 entry replaced by sm_90a's");
    CHECK(load_matches(&s, "sm_90a", key, b, sizeof b) == 1, "sm_90a entry");
    CHECK(cache_entry_path(&s, "sm_90", key, p90, sizeof p90) == 0 &&
              cache_entry_path(&s, "sm_90a", key, p90a, sizeof p90a) == 0,
          "paths");
    snprintf(want, sizeof want, "%s/sm_90a/%s.fgc", s.root, key);
    CHECK(strcmp(p90a, want) == 0 && access(p90a, R_OK) == 0, "sm_90a path %s", p90a);
    snprintf(want, sizeof want, "%s/sm_90/%s.fgc", s.root, key);
    CHECK(strcmp(p90, want) == 0 && access(p90, R_OK) == 0, "sm_90 path %s", p90);

    /* And the keys of the two differ anyway. */
    char key_a[65];
    in.target = "sm_90a";
    cache_key(&in, key_a);
    CHECK(strcmp(key, key_a) != 0, "sm_90 and sm_90a share key %s", key);
}

/* ---- the store ------------------------------------------------------------------ */

static void test_round_trip(void) {
    cache_store s;
    if (open_at(&s, "rt") != 0) return;
    char want_root[1100];
    path_in(want_root, sizeof want_root, "rt");
    CHECK(strcmp(s.root, want_root) == 0, "root %s", s.root);

    char key[65];
    cache_key_input in = base_input();
    cache_key(&in, key);

    size_t n = 100000;
    uint8_t *payload = malloc(n);
    fill(payload, n, 1);
    CHECK(load_matches(&s, "sm_80", key, payload, n) == 0, "hit before any save");

    char err[512] = "untouched";
    int rc = cache_store_save(&s, "sm_80", key, payload, n, err, sizeof err);
    CHECK(rc == 0 && err[0] == '\0', "save: rc %d err '%s'", rc, err);
    CHECK(load_matches(&s, "sm_80", key, payload, n) == 1, "round trip failed");
    CHECK(load_matches(&s, "sm_86", key, payload, n) == 0, "entry leaked into another target");
    CHECK(load_matches(&s, "sm_80a", key, payload, n) == 0, "an sm_80 entry found for sm_80a");

    /* The path and the file's exact layout. */
    char path[2048], want_path[2048];
    cache_entry_path(&s, "sm_80", key, path, sizeof path);
    snprintf(want_path, sizeof want_path, "%s/sm_80/%s.fgc", want_root, key);
    CHECK(strcmp(path, want_path) == 0, "entry path %s", path);
    size_t flen = 0;
    uint8_t *raw = slurp(path, &flen);
    CHECK(raw != NULL && flen == 56 + n, "file size %zu", flen);
    if (raw != NULL && flen == 56 + n) {
        CHECK(memcmp(raw, "FGCACHE\0", 8) == 0, "magic");
        uint32_t fmt = raw[8] | raw[9] << 8 | raw[10] << 16 | (uint32_t)raw[11] << 24;
        CHECK(fmt == CACHE_FORMAT_VERSION, "format field %u", fmt);
        CHECK(raw[12] == 0 && raw[13] == 0 && raw[14] == 0 && raw[15] == 0, "reserved");
        uint64_t l = 0;
        for (int i = 7; i >= 0; i--) l = l << 8 | raw[16 + i];
        CHECK(l == n, "length field %llu", (unsigned long long)l);
        cache_sha256 h;
        uint8_t d[32];
        cache_sha256_init(&h);
        cache_sha256_update(&h, payload, n);
        cache_sha256_final(&h, d);
        CHECK(memcmp(raw + 24, d, 32) == 0, "checksum field");
        CHECK(memcmp(raw + 56, payload, n) == 0, "payload bytes");
    }
    free(raw);
    char folder[1200];
    snprintf(folder, sizeof folder, "%s/sm_80", want_root);
    CHECK(mode_of(path) == 0644, "file mode %o", mode_of(path));
    CHECK(mode_of(folder) == 0755, "target folder mode %o", mode_of(folder));
    CHECK(mode_of(want_root) == 0755, "root mode %o", mode_of(want_root));
    CHECK(count_names(folder, ".tmp", NULL) == 0, "temp files left after save");
    CHECK(count_names(want_root, ".", NULL) == 2, "probe or temp files left in the root");

    /* Saving again replaces the entry. */
    fill(payload, n, 2);
    rc = cache_store_save(&s, "sm_80", key, payload, n / 2, err, sizeof err);
    CHECK(rc == 0, "overwrite: %s", err);
    CHECK(load_matches(&s, "sm_80", key, payload, n / 2) == 1, "overwrite not seen");

    /* Empty payloads are entries too. */
    rc = cache_store_save(&s, "sm_75", key, NULL, 0, err, sizeof err);
    CHECK(rc == 0, "empty save: %s", err);
    CHECK(load_matches(&s, "sm_75", key, "", 0) == 1, "empty payload did not round trip");

    /* Keys that are not hex never become paths. */
    rc = cache_store_save(&s, "sm_80", "../../escape", payload, 10, err, sizeof err);
    CHECK(rc == -1 && err[0] != '\0', "non-hex key accepted");
    CHECK(load_matches(&s, "sm_80", "../../escape", payload, 10) == 0, "non-hex key loaded");
    /* Nor do targets that are not target names. */
    const char *bad_targets[] = {"", "..", "../x", "sm_80/../x", "sm_", "sm_0", "sm_080", "80",
                                 "SM_80", "sm_80b", "sm_80af", "sm_80a/", "sm 80", "compute_80",
                                 "sm_1234567890123"};
    for (size_t i = 0; i < sizeof bad_targets / sizeof bad_targets[0]; i++) {
        err[0] = '\0';
        rc = cache_store_save(&s, bad_targets[i], key, payload, 10, err, sizeof err);
        CHECK(rc == -1 && strstr(err, "not a target name") != NULL, "target '%s' accepted: %s",
              bad_targets[i], err);
        CHECK(load_matches(&s, bad_targets[i], key, payload, 10) == 0, "target '%s' loaded",
              bad_targets[i]);
        strcpy(path, "untouched");
        CHECK(cache_entry_path(&s, bad_targets[i], key, path, sizeof path) == -1 && path[0] == '\0',
              "path for target '%s': %s", bad_targets[i], path);
    }
    rc = cache_store_save(&s, NULL, key, payload, 10, err, sizeof err);
    CHECK(rc == -1 && err[0] != '\0', "NULL target accepted");
    CHECK(load_matches(&s, NULL, key, payload, 10) == 0, "NULL target loaded");
    DIR *root = opendir(want_root);
    struct dirent *d;
    while (root != NULL && (d = readdir(root)) != NULL)
        CHECK(d->d_name[0] == '.' || cache_target_valid(d->d_name), "folder %s made", d->d_name);
    if (root != NULL) closedir(root);
    path_in(path, sizeof path, "x");
    CHECK(access(path, F_OK) != 0, "a save reached %s", path);

    /* A save that fails at the rename (a folder sits at the entry's name)
     * reports it and leaves no temporary file behind. */
    char other[65];
    in.target = "sm_90";
    cache_key(&in, other);
    cache_entry_path(&s, "sm_80", other, path, sizeof path);
    CHECK(mkdir(path, 0755) == 0, "mkdir %s", path);
    rc = cache_store_save(&s, "sm_80", other, payload, n, err, sizeof err);
    CHECK(rc == -1 && err[0] != '\0', "save over a folder: rc %d", rc);
    CHECK(count_names(folder, ".tmp", NULL) == 0, "temp file left after a failed save");
    CHECK(load_matches(&s, "sm_80", other, payload, n) == 0, "a folder loaded as an entry");
    rmdir(path);
    rc = cache_store_save(&s, "sm_80", other, payload, n, err, sizeof err);
    CHECK(rc == 0 && load_matches(&s, "sm_80", other, payload, n) == 1, "save after cleanup: %s",
          err);
    free(payload);
}

/* Truncated, padded and altered entries are misses; a save repairs them. */
static void test_damage(void) {
    cache_store s;
    if (open_at(&s, "damage") != 0) return;
    const char *key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    size_t n = 4096 + 17;
    uint8_t *payload = malloc(n);
    fill(payload, n, 3);
    char path[2048], err[512];
    cache_entry_path(&s, "sm_80", key, path, sizeof path);

    long sizes[] = {0, 1, 8, 23, 55, 56, 57, (long)(56 + n / 2), (long)(56 + n - 1)};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int rc = cache_store_save(&s, "sm_80", key, payload, n, err, sizeof err);
        CHECK(rc == 0 && load_matches(&s, "sm_80", key, payload, n) == 1, "setup save: %s", err);
        CHECK(truncate(path, sizes[i]) == 0, "truncate to %ld", sizes[i]);
        CHECK(load_matches(&s, "sm_80", key, payload, n) == 0, "truncated to %ld bytes: not a miss",
              sizes[i]);
        rc = cache_store_save(&s, "sm_80", key, payload, n, err, sizeof err);
        CHECK(rc == 0 && load_matches(&s, "sm_80", key, payload, n) == 1,
              "save did not repair the entry truncated to %ld: %s", sizes[i], err);
    }

    /* A trailing byte breaks the length check. */
    FILE *f = fopen(path, "ab");
    CHECK(f != NULL && fputc('z', f) == 'z' && fclose(f) == 0, "append");
    CHECK(load_matches(&s, "sm_80", key, payload, n) == 0, "trailing byte: not a miss");

    /* One changed byte in each part of the file. */
    struct {
        long offset;
        const char *what;
    } flips[] = {
        {0, "magic"},          {7, "magic NUL"},           {8, "format"},
        {11, "format high"},   {12, "reserved"},           {16, "length"},
        {23, "length high"},   {24, "checksum"},           {55, "checksum end"},
        {56, "payload start"}, {56 + (long)n / 2, "payload middle"}, {56 + (long)n - 1, "payload end"},
    };
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        int rc = cache_store_save(&s, "sm_80", key, payload, n, err, sizeof err);
        CHECK(rc == 0 && load_matches(&s, "sm_80", key, payload, n) == 1, "setup save: %s", err);
        CHECK(flip_byte(path, flips[i].offset) == 0, "flip %s", flips[i].what);
        CHECK(load_matches(&s, "sm_80", key, payload, n) == 0, "flipped %s byte: not a miss",
              flips[i].what);
    }

    /* Well-formed files of another format or with another magic. */
    uint8_t le[4];
    uint32_t formats[] = {0, CACHE_FORMAT_VERSION + 1, 0xffffffffu};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        cache_store_save(&s, "sm_80", key, payload, n, err, sizeof err);
        for (int b = 0; b < 4; b++) le[b] = (uint8_t)(formats[i] >> (8 * b));
        CHECK(patch(path, 8, le, 4) == 0, "patch format");
        CHECK(load_matches(&s, "sm_80", key, payload, n) == 0, "format %u: not a miss", formats[i]);
    }
    cache_store_save(&s, "sm_80", key, payload, n, err, sizeof err);
    CHECK(patch(path, 0, "FGCACHE1", 8) == 0, "patch magic");
    CHECK(load_matches(&s, "sm_80", key, payload, n) == 0, "magic FGCACHE1: not a miss");
    cache_store_save(&s, "sm_80", key, payload, n, err, sizeof err);
    CHECK(patch(path, 0, "fgcache\0", 8) == 0, "patch magic");
    CHECK(load_matches(&s, "sm_80", key, payload, n) == 0, "lower-case magic: not a miss");

    /* A length field that claims more than the file holds (and a huge one). */
    uint8_t big[8];
    uint64_t lens[] = {(uint64_t)n + 1, (uint64_t)n - 1, UINT64_MAX, 0};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        cache_store_save(&s, "sm_80", key, payload, n, err, sizeof err);
        for (int b = 0; b < 8; b++) big[b] = (uint8_t)(lens[i] >> (8 * b));
        CHECK(patch(path, 16, big, 8) == 0, "patch length");
        CHECK(load_matches(&s, "sm_80", key, payload, n) == 0, "length %llu: not a miss",
              (unsigned long long)lens[i]);
    }

    int rc = cache_store_save(&s, "sm_80", key, payload, n, err, sizeof err);
    CHECK(rc == 0 && load_matches(&s, "sm_80", key, payload, n) == 1, "final repair: %s", err);
    free(payload);
}

/* ---- location -------------------------------------------------------------------- */

static void set_or_unset(const char *name, const char *value) {
    if (value == NULL)
        unsetenv(name);
    else
        setenv(name, value, 1);
}

static void test_location(void) {
    const char *names[] = {"FLASHGEN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    char *saved[3];
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        saved[i] = v != NULL ? strdup(v) : NULL;
    }

    cache_store s;
    char warn[512], want[1200], home[1100], xdg[1100], envdir[1100], arg[1100];
    path_in(home, sizeof home, "home");
    path_in(xdg, sizeof xdg, "xdg");
    path_in(envdir, sizeof envdir, "env/deep/er");
    path_in(arg, sizeof arg, "arg");

    /* Nothing to go on. */
    unsetenv("FLASHGEN_CACHE_DIR");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    warn[0] = '\0';
    int rc = cache_store_open(&s, NULL, warn, sizeof warn);
    CHECK(rc == -1 && warn[0] != '\0' && s.writable == 0, "no location: rc %d warn '%s'", rc,
          warn);
    setenv("HOME", "", 1);
    rc = cache_store_open(&s, NULL, warn, sizeof warn);
    CHECK(rc == -1, "empty HOME counted as a location: rc %d root %s", rc, s.root);

    /* HOME only. */
    setenv("HOME", home, 1);
    rc = cache_store_open(&s, NULL, warn, sizeof warn);
    snprintf(want, sizeof want, "%s/.cache/flashgen", home);
    CHECK(rc == 0 && s.writable && strcmp(s.root, want) == 0, "HOME: rc %d root %s", rc, s.root);
    CHECK(is_dir(want), "%s not created", want);

    /* A relative XDG_CACHE_HOME is ignored; an absolute one wins over HOME. */
    setenv("XDG_CACHE_HOME", "relative/xdg", 1);
    rc = cache_store_open(&s, NULL, warn, sizeof warn);
    CHECK(rc == 0 && strcmp(s.root, want) == 0, "relative XDG: root %s", s.root);
    setenv("XDG_CACHE_HOME", xdg, 1);
    rc = cache_store_open(&s, NULL, warn, sizeof warn);
    snprintf(want, sizeof want, "%s/flashgen", xdg);
    CHECK(rc == 0 && s.writable && strcmp(s.root, want) == 0, "XDG: rc %d root %s", rc, s.root);
    CHECK(is_dir(want), "%s not created", want);

    /* An empty FLASHGEN_CACHE_DIR is unset; a set one wins, nested folders
     * are created. */
    setenv("FLASHGEN_CACHE_DIR", "", 1);
    rc = cache_store_open(&s, NULL, warn, sizeof warn);
    CHECK(rc == 0 && strcmp(s.root, want) == 0, "empty FLASHGEN_CACHE_DIR: root %s", s.root);
    setenv("FLASHGEN_CACHE_DIR", envdir, 1);
    rc = cache_store_open(&s, NULL, warn, sizeof warn);
    CHECK(rc == 0 && s.writable && strcmp(s.root, envdir) == 0, "env: rc %d root %s", rc, s.root);
    CHECK(is_dir(envdir) && mode_of(envdir) == 0755, "%s not created 0755", envdir);

    /* The argument wins over everything; trailing slashes are dropped. */
    char arg_slash[1200];
    snprintf(arg_slash, sizeof arg_slash, "%s//", arg);
    rc = cache_store_open(&s, arg_slash, warn, sizeof warn);
    CHECK(rc == 0 && s.writable && strcmp(s.root, arg) == 0, "dir arg: rc %d root %s", rc, s.root);
    CHECK(is_dir(arg), "%s not created", arg);

    /* Entries land under the resolved root. */
    char err[256], path[2048];
    rc = cache_store_save(&s, "sm_89", "abcdef", "kernel", 6, err, sizeof err);
    snprintf(want, sizeof want, "%s/sm_89/abcdef.fgc", arg);
    cache_entry_path(&s, "sm_89", "abcdef", path, sizeof path);
    CHECK(rc == 0 && strcmp(path, want) == 0 && access(want, R_OK) == 0, "entry at %s", path);

    for (int i = 0; i < 3; i++) {
        set_or_unset(names[i], saved[i]);
        free(saved[i]);
    }
}

/* An unusable folder degrades to "no disk cache" with a warning. */
static void test_unwritable(void) {
    char file[1100], dir[1200], warn[512], err[512];
    path_in(file, sizeof file, "plain-file");
    FILE *f = fopen(file, "w");
    CHECK(f != NULL && fclose(f) == 0, "create %s", file);

    /* A regular file where a parent folder should be: mkdir fails even for
     * root. */
    snprintf(dir, sizeof dir, "%s/cache", file);
    cache_store s;
    int rc = cache_store_open(&s, dir, warn, sizeof warn);
    CHECK(rc == 0 && s.writable == 0, "under a file: rc %d writable %d", rc, s.writable);
    CHECK(warn[0] != '\0' && strstr(warn, "plain-file") != NULL, "warning names the folder: '%s'",
          warn);
    CHECK(strcmp(s.root, dir) == 0, "root %s", s.root);
    rc = cache_store_save(&s, "sm_80", "abcd", "x", 1, err, sizeof err);
    CHECK(rc == -1 && err[0] != '\0', "save into an unwritable store: rc %d", rc);
    void *p = (void *)1;
    size_t len = 99;
    CHECK(cache_store_load(&s, "sm_80", "abcd", &p, &len) == 0 && p == NULL && len == 0,
          "load from an unwritable store");

    /* The same through the environment, and a file at the root itself. */
    char *saved = getenv("FLASHGEN_CACHE_DIR") ? strdup(getenv("FLASHGEN_CACHE_DIR")) : NULL;
    setenv("FLASHGEN_CACHE_DIR", file, 1);
    warn[0] = '\0';
    rc = cache_store_open(&s, NULL, warn, sizeof warn);
    CHECK(rc == 0 && s.writable == 0 && warn[0] != '\0', "root is a file: rc %d writable %d",
          rc, s.writable);
    set_or_unset("FLASHGEN_CACHE_DIR", saved);
    free(saved);

    /* A folder that exists but takes no new files, even from root: only the
     * probe write can find that out. */
    if (is_dir("/proc/self")) {
        warn[0] = '\0';
        rc = cache_store_open(&s, "/proc", warn, sizeof warn);
        CHECK(rc == 0 && s.writable == 0 && warn[0] != '\0', "/proc: rc %d writable %d", rc,
              s.writable);
    }

    /* Permissions only bind a non-root user. */
    if (geteuid() != 0) {
        char ro[1100];
        path_in(ro, sizeof ro, "read-only");
        mkdir(ro, 0555);
        chmod(ro, 0555);
        rc = cache_store_open(&s, ro, warn, sizeof warn);
        CHECK(rc == 0 && s.writable == 0 && warn[0] != '\0', "read-only folder: writable %d",
              s.writable);
        chmod(ro, 0755);
    }

    /* A NULL or zero-length warn buffer is fine. */
    rc = cache_store_open(&s, dir, NULL, 0);
    CHECK(rc == 0 && s.writable == 0, "NULL warn buffer");
}

/* ---- many writers at once ----------------------------------------------------- */

enum { WRITERS_SAME = 8, WRITERS_OWN = 8, READERS = 2, BIG = 3 * 1024 * 1024 + 123 };

static void key_for(int i, char key[65]) {
    cache_key_input in = base_input();
    char target[32];
    snprintf(target, sizeof target, "sm_%d", 1000 + i); /* any difference will do */
    in.target = target;
    cache_key(&in, key);
}

static void test_concurrency(void) {
    cache_store s;
    if (open_at(&s, "conc") != 0) return;
    char shared_key[65], own_keys[WRITERS_OWN][65], err[512];
    key_for(-1, shared_key);
    for (int i = 0; i < WRITERS_OWN; i++) key_for(i, own_keys[i]);
    uint8_t *shared = malloc(BIG), *own = malloc(BIG);
    fill(shared, BIG, 100);

    /* The shared entry exists before the storm: readers must then always see
     * a whole file, the old one or a new one, never a miss. */
    int rc = cache_store_save(&s, "sm_80", shared_key, shared, BIG, err, sizeof err);
    CHECK(rc == 0, "seed save: %s", err);

    int gate[2];
    if (pipe(gate) != 0) {
        CHECK(0, "pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    enum { N = WRITERS_SAME + WRITERS_OWN + READERS };
    pid_t pids[N];
    int kinds[N];
    int started = 0;
    for (int i = 0; i < N; i++) {
        int kind = i < WRITERS_SAME ? 0 : i < WRITERS_SAME + WRITERS_OWN ? 1 : 2;
        pid_t pid = fork();
        if (pid < 0) break;
        if (pid == 0) {
            close(gate[1]);
            char c;
            while (read(gate[0], &c, 1) < 0 && errno == EINTR) {
            }
            char e[512];
            if (kind == 0) {
                int rc = cache_store_save(&s, "sm_80", shared_key, shared, BIG, e, sizeof e);
                _exit(rc == 0 ? 0 : 1);
            } else if (kind == 1) {
                int k = i - WRITERS_SAME;
                fill(own, BIG, (uint64_t)k);
                int rc = cache_store_save(&s, "sm_80", own_keys[k], own, BIG, e, sizeof e);
                _exit(rc == 0 ? 0 : 1);
            }
            for (int round = 0; round < 40; round++) {
                int m = load_matches(&s, "sm_80", shared_key, shared, BIG);
                if (m == 0) _exit(3);
                if (m < 0) _exit(4);
            }
            _exit(0);
        }
        pids[started] = pid;
        kinds[started] = kind;
        started++;
    }
    CHECK(started == N, "forked %d of %d", started, N);
    close(gate[0]);
    close(gate[1]); /* everyone starts now */

    int status[N], ok[3] = {0, 0, 0}, bad = 0;
    int left = wait_children(pids, started, 60.0, status);
    for (int i = 0; i < started; i++) {
        if (status[i] == -1) continue;
        if (WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0) {
            ok[kinds[i]]++;
        } else {
            bad++;
            fprintf(stderr, "child %d (kind %d) ended with status %d\n", i, kinds[i],
                    WIFEXITED(status[i]) ? WEXITSTATUS(status[i]) : -WTERMSIG(status[i]));
        }
    }
    CHECK(left == 0, "%d children still running after 60 s", left);
    CHECK(bad == 0, "%d children failed", bad);
    CHECK(ok[0] == WRITERS_SAME && ok[1] == WRITERS_OWN && ok[2] == READERS,
          "succeeded: %d same-key writers, %d own-key writers, %d readers", ok[0], ok[1], ok[2]);

    CHECK(load_matches(&s, "sm_80", shared_key, shared, BIG) == 1, "shared entry damaged");
    for (int k = 0; k < WRITERS_OWN; k++) {
        fill(own, BIG, (uint64_t)k);
        CHECK(load_matches(&s, "sm_80", own_keys[k], own, BIG) == 1, "entry %d damaged", k);
    }
    char folder[1200];
    snprintf(folder, sizeof folder, "%s/sm_80", s.root);
    CHECK(count_names(folder, ".tmp", NULL) == 0, "%d temp files left",
          count_names(folder, ".tmp", NULL));
    CHECK(count_names(folder, NULL, ".fgc") == 1 + WRITERS_OWN, "%d entries, expected %d",
          count_names(folder, NULL, ".fgc"), 1 + WRITERS_OWN);
    free(shared);
    free(own);
}

int main(void) {
    umask(022); /* the modes checked below assume the usual mask */
    const char *tmp = getenv("TMPDIR");
    snprintf(base, sizeof base, "%s/flashgen-test-cache-XXXXXX",
             tmp != NULL && tmp[0] == '/' ? tmp : "/tmp");
    if (mkdtemp(base) == NULL) {
        fprintf(stderr, "mkdtemp %s: %s\n", base, strerror(errno));
        return 1;
    }
    test_sha256();
    test_keys();
    test_targets();
    test_round_trip();
    test_arch_specific();
    test_damage();
    test_location();
    test_unwritable();
    test_concurrency();
    remove_tree(base);
    return check_summary("test_cache");
}
