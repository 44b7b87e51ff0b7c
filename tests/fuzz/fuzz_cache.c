/* What the cache and bundles read from disk, which a crash, a full disk or
 * another program may have left in any state: an entry file (through a
 * pipe, as an open file), its payload, a bundle manifest's line, and the
 * sizes and target names the command line takes. Each is refused or read
 * whole, never read past; what is read back is written again the same.
 * Input: the first byte picks the reader, the rest is its bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/bundle.h"
#include "cache/cache.h"
#include "cache/internal.h"
#include "tests/fuzz/fuzz.h"

/* The input as an entry file's bytes; or (when its first byte is odd) a
 * payload made from the input, written as an entry, that byte's upper bits
 * picking one byte of the file to damage or none: read back whole and the
 * same, or refused when damaged. */
static void entry_file(const uint8_t *data, size_t size) {
    if (!size) return;
    char path[] = "/tmp/fg_fuzz_entry_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return;
    unlink(path);
    const int made = data[0] & 1;
    size_t file_len = size - 1, payload_len = 0;
    void *made_payload = NULL;
    if (made) {
        cache_payload_info info = {(int)size, 0, 0, 0, "fg_fuzz"};
        made_payload = cache_payload_pack(&info, data + 1, size - 1, &payload_len);
        FUZZ_CHECK(made_payload && cache_entry_write(fd, made_payload, payload_len) == 0, "no entry written");
        file_len = CACHE_ENTRY_HEADER_SIZE + payload_len;
    } else if (write(fd, data + 1, size - 1) != (ssize_t)(size - 1)) {
        close(fd);
        return;
    }
    const size_t damage = made && data[0] >> 1 ? (size_t)(data[0] >> 1) * 7 % file_len : SIZE_MAX;
    if (made && damage != SIZE_MAX) {
        uint8_t byte;
        FUZZ_CHECK(pread(fd, &byte, 1, (off_t)damage) == 1, "no byte to damage");
        byte ^= 0x5a;
        FUZZ_CHECK(pwrite(fd, &byte, 1, (off_t)damage) == 1, "no byte damaged");
    }
    FUZZ_CHECK(lseek(fd, 0, SEEK_SET) == 0, "no seek");
    void *payload = NULL;
    size_t len = 0;
    char why[256];
    const int ok = cache_entry_read_fd(fd, &payload, &len, why, sizeof why);
    if (made) {
        FUZZ_CHECK(ok == (damage == SIZE_MAX), "an entry %s read as %s", damage == SIZE_MAX ? "whole" : "damaged",
                   ok ? "whole" : why);
        FUZZ_CHECK(!ok || (len == payload_len && !memcmp(payload, made_payload, len)), "an entry read back differs");
    }
    if (ok) {
        FUZZ_CHECK(len <= file_len, "a payload of %zu bytes from a file of %zu", len, file_len);
        cache_payload_info info;
        size_t cubin_len = 0;
        (void)cache_payload_unpack(payload, len, &info, &cubin_len);
    } else {
        FUZZ_CHECK(strlen(why) > 0, "an entry refused without a reason");
    }
    free(payload);
    free(made_payload);
    close(fd);
}

static void payload(const uint8_t *data, size_t size) {
    cache_payload_info info;
    size_t cubin_len = 0;
    const uint8_t *cubin = cache_payload_unpack(data, size, &info, &cubin_len);
    if (!cubin) return;
    FUZZ_CHECK(cubin >= data && cubin + cubin_len <= data + size, "the cubin lies outside the payload");
    FUZZ_CHECK(memchr(info.kernel_name, '\0', sizeof info.kernel_name) != NULL, "an unterminated name");
    size_t len = 0;
    void *again = cache_payload_pack(&info, cubin, cubin_len, &len);
    FUZZ_CHECK(again != NULL, "a read payload does not pack again");
    cache_payload_info info2;
    size_t cubin_len2 = 0;
    const uint8_t *cubin2 = cache_payload_unpack(again, len, &info2, &cubin_len2);
    FUZZ_CHECK(cubin2 && cubin_len2 == cubin_len && !memcmp(cubin2, cubin, cubin_len) &&
                   info2.registers == info.registers && info2.spill_bytes == info.spill_bytes &&
                   !strcmp(info2.kernel_name, info.kernel_name),
               "a payload packed again reads differently");
    free(again);
}

static void manifest_line(const uint8_t *data, size_t size) {
    char line[4096], why[256], again[4096];
    size_t n = size < sizeof line - 1 ? size : sizeof line - 1;
    memcpy(line, data, n);
    line[n] = '\0';
    bundle_entry e, e2;
    if (bundle_entry_parse(line, &e, why, sizeof why) != 0) {
        FUZZ_CHECK(strlen(why) > 0, "a line refused without a reason");
        return;
    }
    FUZZ_CHECK(bundle_entry_format(&e, again, sizeof again) == 0, "a parsed line does not format: %s", line);
    FUZZ_CHECK(bundle_entry_parse(again, &e2, why, sizeof why) == 0, "a formatted line does not parse (%s): %s",
               why, again);
    char third[4096];
    FUZZ_CHECK(bundle_entry_format(&e2, third, sizeof third) == 0 && !strcmp(third, again),
               "a line formats differently once read again: %s / %s", again, third);
}

static void words(const uint8_t *data, size_t size) {
    char text[256];
    size_t n = size < sizeof text - 1 ? size : sizeof text - 1;
    memcpy(text, data, n);
    text[n] = '\0';
    uint64_t bytes;
    (void)cache_parse_size(text, &bytes);
    char target[CACHE_TARGET_SIZE];
    if (cache_target_parse(text, target) == 0)
        FUZZ_CHECK(memchr(target, '\0', sizeof target) != NULL, "an unterminated target");
}

const fuzz_seed fuzz_seeds[] = {
    FUZZ_SEED("\x00\x01" "FGCACHE\x00\x03\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00"),
    FUZZ_SEED("\x00\x01\x7f\x45\x4c\x46 a cubin's bytes"),
    FUZZ_SEED("\x00\x0b\x7f\x45\x4c\x46 a cubin's bytes, damaged"),
    FUZZ_SEED("\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"),
    FUZZ_SEED("\x02" "forward\tfp16_d64\tfg_fwd_sm80_fp16_d64_m128n64w4\tBr=128 Bc=64 warps=4 stages=2\tsm_80\t"
              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\t"
              "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\t0.1.0\t13.0\t3\tkept\n"),
    FUZZ_SEED("\x03" "4G"), FUZZ_SEED("\x03" "512m"), FUZZ_SEED("\x03" "sm_90a"), FUZZ_SEED("\x03" "90"),
};
const int fuzz_seed_count = (int)(sizeof fuzz_seeds / sizeof fuzz_seeds[0]);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    switch (data[0] % 4) {
    case 0: entry_file(data + 1, size - 1); break;
    case 1: payload(data + 1, size - 1); break;
    case 2: manifest_line(data + 1, size - 1); break;
    default: words(data + 1, size - 1); break;
    }
    return 0;
}
