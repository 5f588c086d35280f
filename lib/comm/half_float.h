#pragma once
// 16-bit floating-point element types and their conversions to and from float32, written here
// so that libperseus needs neither CUDA's cuda_fp16.h nor a compiler's _Float16. Reductions on
// these types run in float32 and round back to nearest even, as CUDA's __float2half_rn and
// PyTorch's CPU kernels do.

#include <cstdint>

namespace perseus::comm {

struct Float16 {  // IEEE 754 binary16
  uint16_t bits;
};

struct Bfloat16 {  // the upper 16 bits of a float32
  uint16_t bits;
};

float to_float(Float16 value);
float to_float(Bfloat16 value);
// Round to nearest, ties to even; NaN stays NaN (quiet), too large becomes infinity.
Float16 to_float16(float value);
Bfloat16 to_bfloat16(float value);

}  // namespace perseus::comm
