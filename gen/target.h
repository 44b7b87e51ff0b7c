/* What a kernel is compiled for: a compute capability and whether the kernel
 * uses features of that arch alone (sm_90a: wgmma, setmaxnreg). Such a
 * binary runs on that exact arch only, so its name, cache folder and key say
 * so: "sm_90a" beside "sm_90". */
#ifndef FG_TARGET_H
#define FG_TARGET_H

#include <stddef.h>

typedef struct kernel_target {
    int cc;            /* compute capability: 75, 80, 86, 89, 90 */
    int arch_specific; /* 1: compiled for sm_<cc>a */
} kernel_target;

/* "sm_90" or "sm_90a": NVRTC's --gpu-architecture and the cache's folder. */
void target_name(const kernel_target *t, char *buf, size_t len);

/* "sm90" or "sm90a": the part of kernel names that says the target. */
void target_tag(const kernel_target *t, char *buf, size_t len);

#endif
