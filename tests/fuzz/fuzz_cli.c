/* The command line's options as a user may type them (cli_parse: options,
 * values, --opt=value, --aux declarations, lengths and windows): parsed or
 * refused with a message (1 after --help), never a crash or a read past an
 * argument. Where they parse, the spec they make is planned on each target
 * named (h100 where none is), refused with a message or planned.
 * Input: the first byte picks the command, the rest is its arguments
 * separated by 0 bytes. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "tests/fuzz/fuzz.h"

const fuzz_seed fuzz_seeds[] = {
    FUZZ_SEED("\x00-d\0" "64\0--mask\0causal\0--target\0h100"),
    FUZZ_SEED("\x01--head-dim=128\0--dtype\0bf16\0--backward\0--deterministic"),
    FUZZ_SEED("\x02--mask\0window\0--window\0" "300,40\0--softcap\0" "30\0--sinks"),
    FUZZ_SEED("\x03--varlen\0--lengths\0" "0,1,4000,0,129\0--heads\0" "16\0--kv-heads\0" "4"),
    FUZZ_SEED("\x03--kv-cache\0--page-size\0" "16\0--seqlen-q\0" "2\0--seqlen-k\0" "1000"),
    FUZZ_SEED("\x00--score-mod\0s + bias[h, q - k]\0--aux\0" "bias:f32:4x201\0-d\0" "64"),
    FUZZ_SEED("\x01--mask-mod\0" "doc[q] == doc[k]\0--aux\0" "doc:i32:300\0--all-targets"),
    FUZZ_SEED("\x04--seqlen\0" "2048\0--quick\0--repeats=3\0--csv"),
    FUZZ_SEED("\x05--seqlens\0" "512,1024,4096\0--standard\0--show"),
    FUZZ_SEED("\x03--sparsity\0butterfly\0--butterfly-factors\0" "3\0--sparse-block\0" "64x64"),
    FUZZ_SEED("\x03-d\0" "192\0--head-dim-v\0" "128\0--alibi\0batch\0--dropout\0--batch\0" "3"),
};
const int fuzz_seed_count = (int)(sizeof fuzz_seeds / sizeof fuzz_seeds[0]);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const commands[] = {"plan", "source", "compile", "check", "bench", "tune", "demo"};
    static int quiet = -1;
    if (quiet < 0) quiet = open("/dev/null", O_WRONLY);
    if (size < 1 || size > 2048) return 0;
    static char text[2049];
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    char *argv[40];
    int argc = 0;
    for (size_t at = 0; at < size - 1 && argc < 40;) {
        argv[argc++] = text + at;
        at += strlen(text + at) + 1;
    }
    static cli_options o;
    memset(&o, 0, sizeof o);
    /* the messages and the help go nowhere */
    fflush(stdout), fflush(stderr);
    const int out = dup(1), err = dup(2);
    dup2(quiet, 1), dup2(quiet, 2);
    const int rc = cli_parse(argc, argv, commands[data[0] % 7], &o);
    fflush(stdout), fflush(stderr);
    dup2(out, 1), dup2(err, 2);
    close(out), close(err);
    FUZZ_CHECK(rc == 0 || rc == 1 || rc == -1, "cli_parse returned %d", rc);
    if (rc != 0) return 0;
    /* a context a target, made once */
    static fg_context *ctx[8];
    static char names[8][32];
    for (int t = 0; t < (o.target_count ? o.target_count : 1) && t < 8; t++) {
        const char *target = o.target_count ? o.targets[t] : "h100";
        int i = 0;
        while (i < 8 && names[i][0] && strcmp(names[i], target)) i++;
        if (i == 8 || strlen(target) >= sizeof names[i]) continue;
        if (!names[i][0]) {
            if (fg_context_create(&ctx[i], target) != FG_OK) continue;
            strcpy(names[i], target);
        }
        fg_plan_info info;
        if (fg_plan(ctx[i], &o.spec, o.pass, &info) != FG_OK)
            FUZZ_CHECK(strlen(fg_context_message(ctx[i])) > 0, "a spec from the command line refused without a message");
    }
    return 0;
}
