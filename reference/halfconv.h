/* fp16 and bf16 on the host, round to nearest even (halfconv.c). The
 * library's tuner uses these too, so they stand apart from the reference. */
#ifndef FG_HALFCONV_H
#define FG_HALFCONV_H

#include <stdint.h>

uint16_t ref_float_to_half(float f);
float ref_half_to_float(uint16_t h);
uint16_t ref_float_to_bf16(float f);
float ref_bf16_to_float(uint16_t b);
/* Round a value to the storage precision: dtype 0 fp16, 1 bf16. */
float ref_round(float f, int dtype);

#endif
