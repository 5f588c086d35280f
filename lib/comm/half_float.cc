#include "lib/comm/half_float.h"

#include <bit>
#include <cmath>

namespace perseus::comm {

namespace {

constexpr uint32_t kFloatExponentMask = 0x7f800000u;
constexpr uint32_t kSmallestNormalHalf = 0x38800000u;  // 2^-14 as float32 bits
constexpr uint32_t kHalfOverflow = 0x477ff000u;        // 65520: rounds to infinity
constexpr int kExponentRebias = 127 - 15;

}  // namespace

float to_float(Float16 value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | kFloatExponentMask | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + kExponentRebias) << 23) | (mantissa << 13));
}

float to_float(Bfloat16 value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16);
}

Float16 to_float16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > kFloatExponentMask) return {static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (x >= kHalfOverflow) return {static_cast<uint16_t>(sign | 0x7c00u)};      // infinity
  if (x < kSmallestNormalHalf) {
    // Subnormal or zero: the half's mantissa is value * 2^24 rounded; nearbyint rounds to even
    // in the default rounding mode, and 1024 correctly becomes the smallest normal.
    const float scaled = std::ldexp(std::bit_cast<float>(x), 24);
    return {static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)))};
  }
  // Normal: add just under half an ulp, plus one when the kept part is odd (ties to even); a
  // carry into the exponent is the right result.
  x += 0xfffu + ((x >> 13) & 1u);
  x -= static_cast<uint32_t>(kExponentRebias) << 23;
  return {static_cast<uint16_t>(sign | (x >> 13))};
}

Bfloat16 to_bfloat16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > kFloatExponentMask) return {static_cast<uint16_t>((x >> 16) | 0x40u)};
  x += 0x7fffu + ((x >> 16) & 1u);
  return {static_cast<uint16_t>(x >> 16)};
}

}  // namespace perseus::comm
