/* Loading a kernel's cubin on the device and finding its entry points. */
#include <stdio.h>

#include "runtime/runtime.h"

fg_status module_load(fg_context *ctx, fg_kernel *k, const void *cubin) {
    /* an arch-specific binary runs on its own arch alone: never load it elsewhere */
    if (k->target.arch_specific && k->target.cc != ctx->profile.arch)
        return fg_fail(ctx, FG_ERR_INTERNAL, "%s is built for sm_%da, but %s is sm_%d",
                       k->info.plan.kernel_name, k->target.cc, ctx->profile.name,
                       ctx->profile.arch);
    fg_status st = fg_make_current(ctx);
    if (st) return st;
    const cuda_driver *cu = ctx->cu;
    if ((st = fg_cuda_check(ctx, cu->cuModuleLoadData(&k->module, cubin), "cuModuleLoadData")))
        return st;
    for (int i = 0; i < k->launch_count; i++) {
        const kernel_launch *l = &k->launch[i];
        char what[200];
        snprintf(what, sizeof what, "cuModuleGetFunction(%s)", l->entry);
        if ((st = fg_cuda_check(ctx, cu->cuModuleGetFunction(&k->function[i], k->module, l->entry),
                                what)))
            return st;
        /* clusters beyond the portable 8 need the kernel's consent */
        if (l->cluster > 8 &&
            (st = fg_cuda_check(ctx,
                                cu->cuFuncSetAttribute(k->function[i],
                                                       CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                                                       1),
                                "cuFuncSetAttribute(cluster size)")))
            return st;
        if (l->smem_bytes > 0 &&
            (st = fg_cuda_check(ctx,
                                cu->cuFuncSetAttribute(k->function[i],
                                                       CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                       l->smem_bytes),
                                "cuFuncSetAttribute(shared memory)")))
            return st;
    }
    return FG_OK;
}
