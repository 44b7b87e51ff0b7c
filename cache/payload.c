/* What a cache entry holds: a one-line text header with the compile report,
 * then the cubin.
 *
 *   "flashgen-kernel 1\n"
 *   "<registers> <spill bytes> <stack bytes> <static smem> <kernel name>\n"
 *   cubin bytes
 *
 * The store checks the bytes (length, checksum); this checks the meaning. */
#include "cache/cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAYLOAD_MAGIC "flashgen-kernel 1\n"

void *cache_payload_pack(const cache_payload_info *info, const void *cubin, size_t cubin_len,
                         size_t *len) {
    char head[512];
    int n = snprintf(head, sizeof head, PAYLOAD_MAGIC "%d %d %d %d %s\n", info->registers,
                     info->spill_bytes, info->stack_bytes, info->smem_static, info->kernel_name);
    if (n < 0 || (size_t)n >= sizeof head) return NULL;
    char *p = malloc((size_t)n + cubin_len);
    if (!p) return NULL;
    memcpy(p, head, (size_t)n);
    memcpy(p + n, cubin, cubin_len);
    *len = (size_t)n + cubin_len;
    return p;
}

const void *cache_payload_unpack(const void *payload, size_t len, cache_payload_info *info,
                                 size_t *cubin_len) {
    const char *text = payload;
    size_t m = strlen(PAYLOAD_MAGIC);
    if (len < m || memcmp(text, PAYLOAD_MAGIC, m) != 0) return NULL;
    const char *line = text + m;
    const char *end = memchr(line, '\n', len - m);
    if (!end || end - line > 300) return NULL;
    char buf[320];
    memcpy(buf, line, (size_t)(end - line));
    buf[end - line] = 0;
    cache_payload_info got;
    memset(&got, 0, sizeof got);
    if (sscanf(buf, "%d %d %d %d %159s", &got.registers, &got.spill_bytes, &got.stack_bytes,
               &got.smem_static, got.kernel_name) != 5)
        return NULL;
    *info = got;
    if (cubin_len) *cubin_len = len - (size_t)(end + 1 - text);
    return end + 1;
}
