/* flashgen tune: tune forward (or backward) tilings on the live GPU ahead of
 * time, or show the choices kept. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "runtime/tools.h"

static void tiling_text(const fg_plan_info *p, char *buf, size_t len) {
    snprintf(buf, len, "%dx%d w%d", p->block_m, p->block_n, p->warps);
}

static void print_choice(const char *name, int seqlen, const fg_tune_report *r, int timed) {
    char derived[32], chosen[32];
    tiling_text(&r->derived, derived, sizeof derived);
    tiling_text(&r->chosen, chosen, sizeof chosen);
    double win = r->derived_ms > 0 ? 100.0 * (r->derived_ms - r->chosen_ms) / r->derived_ms : 0;
    printf("%-28s seqlen %5d (bucket %5d): derived %-12s %8.3f ms  chosen %-12s %8.3f ms  "
           "%+5.1f%%  spread %.1f%%",
           name, seqlen, r->seqlen_bucket, derived, r->derived_ms, chosen, r->chosen_ms, win,
           100.0 * r->spread);
    if (timed) printf("  %d timed%s", r->candidates, r->persisted ? "" : ", not saved");
    printf("\n");
    fflush(stdout);
}

int cli_tune(const cli_options *o) {
    fg_spec specs[12];
    int count = 0;
    if (o->standard) {
        static const int dims[] = {64, 128, 256};
        for (int d = 0; d < 3; d++)
            for (int causal = 0; causal < 2; causal++)
                for (int drop = 0; drop < 2; drop++) {
                    fg_spec s = fg_spec_default(dims[d], FG_BF16);
                    s.mask = causal ? FG_MASK_CAUSAL : FG_MASK_NONE;
                    s.dropout = drop;
                    specs[count++] = s;
                }
    } else {
        specs[count++] = o->spec;
    }
    int seqlens[16] = {512, 1024, 2048, 4096, 8192, 16384}, nlen = 6;
    if (o->seqlen_count) {
        nlen = o->seqlen_count;
        memcpy(seqlens, o->seqlens, sizeof(int) * (size_t)nlen);
    }

    fg_context *ctx;
    if (cli_live_context(&ctx, "tune") != 0) return 1;
    printf("%s tuning %d spec(s) x %d length(s) on %s\n", o->show ? "Shown:" : "Tuning:", count,
           nlen, fg_context_target(ctx));
    int failed = 0, step = 0, total = count * nlen;
    cli_progress progress; /* timing takes a while; showing the choices does not */
    cli_progress_start(&progress, "tune", o->show ? 0 : total);
    for (int i = 0; i < count; i++)
        for (int j = 0; j < nlen; j++) {
            char name[96], label[128], err[256];
            if (tools_spec_name(&specs[i], name, sizeof name, err, sizeof err) != 0) {
                cli_error("tune: %s", err); /* cli_parse checked the spec */
                fg_context_destroy(ctx);
                return 1;
            }
            snprintf(label, sizeof label, "[%d/%d] %s%s", ++step, total, name,
                     o->pass == FG_PASS_BACKWARD ? " bwd" : "");
            char now[160];
            snprintf(now, sizeof now, "%s%s seqlen %d", name,
                     o->pass == FG_PASS_BACKWARD ? " bwd" : "", seqlens[j]);
            cli_progress_step(&progress, step > 1, now);
            fg_tune_report r;
            fg_status st;
            if (o->show) {
                int found = 0;
                st = fg_tuned(ctx, &specs[i], o->pass, seqlens[j], &r, &found);
                if (st == FG_OK && !found) {
                    printf("%-28s seqlen %5d: not tuned (derived plan)\n", label, seqlens[j]);
                    continue;
                }
            } else {
                st = fg_tune(ctx, &specs[i], o->pass, seqlens[j], &r);
                cli_progress_hide(&progress);
            }
            if (st != FG_OK) {
                cli_error("tune: %s seqlen %d: %s", name, seqlens[j],
                        fg_context_message(ctx));
                failed++;
                continue;
            }
            print_choice(label, seqlens[j], &r, !o->show);
        }
    cli_progress_end(&progress);
    fg_context_destroy(ctx);
    return failed ? 1 : 0;
}
