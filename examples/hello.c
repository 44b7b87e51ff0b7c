/* Plan the bf16, d=128, causal forward kernel for an H100, offline: no GPU needed. */
#include <flashgen.h>
#include <stdio.h>

int main(void) {
    fg_context *ctx;
    if (fg_context_create(&ctx, "h100") != FG_OK) {
        fprintf(stderr, "%s\n", fg_last_message());
        return 1;
    }
    fg_spec spec = fg_spec_default(128, FG_BF16);
    spec.mask = FG_MASK_CAUSAL;
    fg_plan_info plan;
    fg_status st = fg_plan(ctx, &spec, FG_PASS_FORWARD, &plan);
    if (st == FG_OK)
        printf("%s: Br=%d Bc=%d, %d warps\n", plan.kernel_name, plan.block_m, plan.block_n,
               plan.warps);
    else
        fprintf(stderr, "fg_plan: %s\n", fg_context_message(ctx));
    fg_context_destroy(ctx);
    return st == FG_OK ? 0 : 1;
}
