#include <doctest/doctest.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "lib/comm/half_float.h"

namespace perseus::comm {
namespace {

constexpr float kFloatInf = std::numeric_limits<float>::infinity();

// A bit pattern as "0x..." for messages.
std::string hex(uint64_t bits) {
  char text[24] = "0x";
  const auto result = std::to_chars(text + 2, text + sizeof(text), bits, 16);
  return std::string(text, result.ptr);
}

uint32_t bits_of(float value) { return std::bit_cast<uint32_t>(value); }
float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }

uint16_t half_bits(float value) { return to_float16(value).bits; }
uint16_t bfloat_bits(float value) { return to_bfloat16(value).bits; }

bool is_half_nan(uint16_t bits) { return (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0; }
bool is_bfloat_nan(uint16_t bits) { return (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0; }

// The value of a binary16 pattern, decoded independently of half_float.cc, in double.
double decode_half(uint16_t bits) {
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// float -> nearest representable value with `precision` significant bits and smallest normal
// exponent `min_exponent`, ties to even, or infinity above `max_finite` (the IEEE rule for
// overflow in round-to-nearest). Computed in double, where every step is exact but the
// rounding itself.
float reference_round(float value, int precision, int min_exponent, double max_finite) {
  if (std::isnan(value)) return value;
  const double magnitude = std::fabs(static_cast<double>(value));
  if (magnitude == 0.0 || std::isinf(magnitude)) return value;
  int exponent = std::ilogb(magnitude);
  if (exponent < min_exponent) exponent = min_exponent;
  const double kept = std::nearbyint(std::ldexp(magnitude, precision - 1 - exponent));
  double rounded = std::ldexp(kept, exponent - (precision - 1));
  if (rounded > max_finite) rounded = std::numeric_limits<double>::infinity();
  return static_cast<float>(std::copysign(rounded, static_cast<double>(value)));
}

float reference_half(float value) { return reference_round(value, 11, -14, 65504.0); }
float reference_bfloat(float value) {
  return reference_round(value, 8, -126, static_cast<double>(std::numeric_limits<float>::max()));
}

TEST_CASE("every float16 pattern decodes exactly and survives a round trip through float32") {
  int nans = 0;
  for (uint32_t pattern = 0; pattern <= 0xffffu; ++pattern) {
    const auto bits = static_cast<uint16_t>(pattern);
    const float value = to_float(Float16{bits});
    const bool negative = (bits & 0x8000u) != 0;
    INFO("float16 pattern " << hex(pattern));
    CHECK(std::signbit(value) == negative);
    if (is_half_nan(bits)) {
      ++nans;
      CHECK(std::isnan(value));
      const uint16_t back = half_bits(value);
      CHECK(is_half_nan(back));
      CHECK((back & 0x0200u) != 0);  // quiet
      CHECK(((back & 0x8000u) != 0) == negative);
      continue;
    }
    CHECK(static_cast<double>(value) == decode_half(bits));
    CHECK(half_bits(value) == bits);
  }
  CHECK(nans == 2 * 1023);
}

TEST_CASE("float16 special values") {
  CHECK(half_bits(0.0f) == 0x0000);
  CHECK(half_bits(-0.0f) == 0x8000);
  CHECK(half_bits(1.0f) == 0x3c00);
  CHECK(half_bits(-2.0f) == 0xc000);
  CHECK(half_bits(65504.0f) == 0x7bff);
  CHECK(half_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(half_bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(to_float(Float16{0x7c00}) == std::numeric_limits<float>::infinity());
  CHECK(to_float(Float16{0xfc00}) == -std::numeric_limits<float>::infinity());
  CHECK(to_float(Float16{0x0001}) == std::ldexp(1.0f, -24));     // smallest subnormal
  CHECK(to_float(Float16{0x03ff}) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(to_float(Float16{0x0400}) == std::ldexp(1.0f, -14));     // smallest normal
  CHECK(to_float(Float16{0x8001}) == -std::ldexp(1.0f, -24));
  CHECK(std::signbit(to_float(Float16{0x8000})));

  SUBCASE("NaN stays NaN, quiet, with its sign") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(is_half_nan(half_bits(nan)));
    CHECK((half_bits(nan) & 0x0200u) != 0);
    CHECK((half_bits(nan) & 0x8000u) == 0);
    CHECK((half_bits(-nan) & 0x8000u) != 0);
    CHECK(is_half_nan(half_bits(-nan)));
    // A signalling NaN whose payload lies entirely in the bits a float16 drops.
    CHECK(is_half_nan(half_bits(from_bits(0x7f800001u))));
    CHECK(is_half_nan(half_bits(from_bits(0xff800001u))));
    CHECK(std::isnan(to_float(Float16{0x7c01})));  // signalling float16 NaN
  }
}

TEST_CASE("float32 -> float16 rounds to nearest, ties to even") {
  const float ulp_at_one = std::ldexp(1.0f, -10);
  const float half_ulp = std::ldexp(1.0f, -11);
  const float tiny = std::ldexp(1.0f, -23);  // float32's ulp at 1

  // 1 + half an ulp is halfway between 0x3c00 (even) and 0x3c01 (odd).
  CHECK(half_bits(1.0f + half_ulp) == 0x3c00);
  CHECK(half_bits(1.0f + half_ulp + tiny) == 0x3c01);
  CHECK(half_bits(1.0f + half_ulp - tiny) == 0x3c00);
  // 1 + 1.5 ulp is halfway between 0x3c01 (odd) and 0x3c02 (even).
  CHECK(half_bits(1.0f + ulp_at_one + half_ulp) == 0x3c02);
  CHECK(half_bits(1.0f + ulp_at_one + half_ulp - tiny) == 0x3c01);
  CHECK(half_bits(-(1.0f + half_ulp)) == 0xbc00);
  CHECK(half_bits(-(1.0f + ulp_at_one + half_ulp)) == 0xbc02);
  // A tie that carries into the exponent: halfway between 2 - ulp (0x3fff, odd) and 2.
  CHECK(half_bits(2.0f - half_ulp) == 0x4000);
  CHECK(half_bits(2.0f - half_ulp - tiny) == 0x3fff);
  // Integers: float16 has 11 significant bits, so above 2048 only even integers are exact.
  CHECK(half_bits(2049.0f) == half_bits(2048.0f));
  CHECK(half_bits(2051.0f) == half_bits(2052.0f));
  CHECK(half_bits(2050.0f) == 0x6801);

  SUBCASE("subnormals") {
    const float smallest = std::ldexp(1.0f, -24);
    CHECK(half_bits(smallest) == 0x0001);
    CHECK(half_bits(smallest / 2) == 0x0000);  // tie: to the even zero
    CHECK(half_bits(-smallest / 2) == 0x8000);
    CHECK(half_bits(smallest / 2 + std::ldexp(1.0f, -40)) == 0x0001);
    CHECK(half_bits(smallest * 1.5f) == 0x0002);  // tie between 1 and 2
    CHECK(half_bits(smallest * 2.5f) == 0x0002);  // tie between 2 and 3
    CHECK(half_bits(smallest * 0.25f) == 0x0000);
    CHECK(half_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
    CHECK(half_bits(-std::numeric_limits<float>::denorm_min()) == 0x8000);
    // Halfway between the largest subnormal (0x03ff, odd) and the smallest normal.
    CHECK(half_bits(std::ldexp(1023.5f, -24)) == 0x0400);
    CHECK(half_bits(std::ldexp(1022.5f, -24)) == 0x03fe);
    CHECK(half_bits(std::nextafter(std::ldexp(1.0f, -14), 0.0f)) == 0x0400);
  }

  SUBCASE("overflow to infinity") {
    CHECK(half_bits(65519.0f) == 0x7bff);
    CHECK(half_bits(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
    CHECK(half_bits(65520.0f) == 0x7c00);  // tie between 65504 (odd) and 65536
    CHECK(half_bits(-65520.0f) == 0xfc00);
    CHECK(half_bits(65536.0f) == 0x7c00);
    CHECK(half_bits(1e10f) == 0x7c00);
    CHECK(half_bits(std::numeric_limits<float>::max()) == 0x7c00);
    CHECK(half_bits(std::numeric_limits<float>::lowest()) == 0xfc00);
  }
}

TEST_CASE("float32 -> float16 at every halfway point and its neighbours") {
  // For each pair of adjacent finite float16 values, the float32 midpoint and the float32s
  // either side of it.
  for (uint32_t pattern = 0; pattern < 0x7bffu; ++pattern) {
    for (const uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const auto low = static_cast<uint16_t>(pattern | sign);
      const auto high = static_cast<uint16_t>((pattern + 1) | sign);
      const float midpoint = static_cast<float>((decode_half(low) + decode_half(high)) / 2);
      const uint16_t even = (low & 1u) ? high : low;
      INFO("between " << hex(low) << " and " << hex(high));
      REQUIRE(static_cast<double>(midpoint) == (decode_half(low) + decode_half(high)) / 2);
      CHECK(half_bits(midpoint) == even);
      const float toward_low = std::nextafter(midpoint, 0.0f);
      const float toward_high = std::nextafter(midpoint, sign ? -kFloatInf : kFloatInf);
      CHECK(half_bits(toward_low) == low);
      CHECK(half_bits(toward_high) == high);
    }
  }
}

TEST_CASE("float32 -> float16 agrees with a reference rounding over a sample of float32") {
  // About a million float32 patterns spread over all exponents and signs; the stride is odd, so
  // the low bits vary too.
  int checked = 0;
  for (uint64_t pattern = 0; pattern <= 0xffffffffu; pattern += 4099) {
    const float value = from_bits(static_cast<uint32_t>(pattern));
    if (std::isnan(value)) continue;
    const float expected = reference_half(value);
    const float actual = to_float(to_float16(value));
    if (bits_of(actual) != bits_of(expected)) {
      INFO("float32 " << hex(pattern));
      CHECK(bits_of(actual) == bits_of(expected));
    }
    ++checked;
  }
  CHECK(checked > 1000000);
}

TEST_CASE("every bfloat16 pattern survives a round trip through float32") {
  int nans = 0;
  for (uint32_t pattern = 0; pattern <= 0xffffu; ++pattern) {
    const auto bits = static_cast<uint16_t>(pattern);
    const float value = to_float(Bfloat16{bits});
    INFO("bfloat16 pattern " << hex(pattern));
    CHECK(bits_of(value) == pattern << 16);
    const uint16_t back = bfloat_bits(value);
    if (is_bfloat_nan(bits)) {
      ++nans;
      CHECK(std::isnan(value));
      CHECK(is_bfloat_nan(back));
      CHECK((back & 0x0040u) != 0);  // quiet
      CHECK((back & 0x8000u) == (bits & 0x8000u));
      continue;
    }
    CHECK(back == bits);
  }
  CHECK(nans == 2 * 127);
}

TEST_CASE("float32 -> bfloat16 rounds the low 16 bits to nearest, ties to even") {
  // Every finite bfloat16 (both signs), with low halves below, at and above half.
  for (uint32_t upper = 0; upper <= 0xffffu; ++upper) {
    if ((upper & 0x7f80u) == 0x7f80u) continue;  // infinities and NaNs
    const auto kept = static_cast<uint16_t>(upper);
    const auto next = static_cast<uint16_t>(upper + 1);  // away from zero; 0x7f7f + 1 is inf
    const uint16_t even = (kept & 1u) ? next : kept;
    INFO("upper half " << hex(upper));
    CHECK(bfloat_bits(from_bits((upper << 16) | 0x0000u)) == kept);
    CHECK(bfloat_bits(from_bits((upper << 16) | 0x0001u)) == kept);
    CHECK(bfloat_bits(from_bits((upper << 16) | 0x7fffu)) == kept);
    CHECK(bfloat_bits(from_bits((upper << 16) | 0x8000u)) == even);
    CHECK(bfloat_bits(from_bits((upper << 16) | 0x8001u)) == next);
    CHECK(bfloat_bits(from_bits((upper << 16) | 0xffffu)) == next);
  }
}

TEST_CASE("bfloat16 special values") {
  CHECK(bfloat_bits(1.0f) == 0x3f80);
  CHECK(bfloat_bits(-0.0f) == 0x8000);
  CHECK(bfloat_bits(256.0f) == 0x4380);
  CHECK(bfloat_bits(257.0f) == 0x4380);  // tie between 256 (even) and 258
  CHECK(bfloat_bits(259.0f) == 0x4382);  // tie between 258 (odd) and 260
  CHECK(bfloat_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bfloat_bits(-std::numeric_limits<float>::infinity()) == 0xff80);
  // The largest float32 is above the midpoint of the largest bfloat16 and 2^128.
  CHECK(bfloat_bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(bfloat_bits(std::numeric_limits<float>::lowest()) == 0xff80);
  CHECK(bfloat_bits(from_bits(0x7f7f7fffu)) == 0x7f7f);
  CHECK(bfloat_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(bfloat_bits(from_bits(0x00008000u)) == 0x0000);  // tie to the even zero
  CHECK(bfloat_bits(from_bits(0x00018000u)) == 0x0002);  // tie to even, subnormal

  SUBCASE("NaN stays NaN, quiet, with its sign") {
    CHECK(bfloat_bits(std::numeric_limits<float>::quiet_NaN()) == 0x7fc0);
    CHECK(bfloat_bits(-std::numeric_limits<float>::quiet_NaN()) == 0xffc0);
    // Payload only in the dropped bits: must not become infinity.
    CHECK(is_bfloat_nan(bfloat_bits(from_bits(0x7f800001u))));
    CHECK(is_bfloat_nan(bfloat_bits(from_bits(0xff80ffffu))));
    CHECK((bfloat_bits(from_bits(0xff800001u)) & 0x8000u) != 0);
    // The largest payload must not carry into the sign.
    CHECK(bfloat_bits(from_bits(0x7fffffffu)) == 0x7fff);
  }
}

TEST_CASE("float32 -> bfloat16 agrees with a reference rounding over a sample of float32") {
  int checked = 0;
  for (uint64_t pattern = 0; pattern <= 0xffffffffu; pattern += 4099) {
    const float value = from_bits(static_cast<uint32_t>(pattern));
    if (std::isnan(value)) continue;
    const float expected = reference_bfloat(value);
    const float actual = to_float(to_bfloat16(value));
    if (bits_of(actual) != bits_of(expected)) {
      INFO("float32 " << hex(pattern));
      CHECK(bits_of(actual) == bits_of(expected));
    }
    ++checked;
  }
  CHECK(checked > 1000000);
}

}  // namespace
}  // namespace perseus::comm
