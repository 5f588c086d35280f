#pragma once
// For libperseus's unit tests: every DataType, a call of f with a value of the C++ element type
// of a DataType (so that one templated check covers them all), and a value of that type.

#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "lib/comm/half_float.h"
#include "lib/comm/types.h"

namespace perseus::comm {

inline constexpr DataType kAllTypes[] = {
    DataType::kUint8,    DataType::kInt8,    DataType::kInt16,
    DataType::kInt32,    DataType::kInt64,   DataType::kFloat16,
    DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64};

// value in T (16-bit floats rounded to nearest even through float32).
template <typename T>
T from_double(double value) {
  if constexpr (std::is_same_v<T, Float16>) {
    return to_float16(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, Bfloat16>) {
    return to_bfloat16(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

// A small integer in T (exact in every type for |value| <= 256).
template <typename T>
T from_integer(int64_t value) {
  return from_double<T>(static_cast<double>(value));
}

template <typename F>
void with_type(DataType type, F &&f) {
  switch (type) {
    case DataType::kUint8:
      return f(uint8_t{});
    case DataType::kInt8:
      return f(int8_t{});
    case DataType::kInt16:
      return f(int16_t{});
    case DataType::kInt32:
      return f(int32_t{});
    case DataType::kInt64:
      return f(int64_t{});
    case DataType::kFloat16:
      return f(Float16{});
    case DataType::kBfloat16:
      return f(Bfloat16{});
    case DataType::kFloat32:
      return f(float{});
    case DataType::kFloat64:
      return f(double{});
  }
  throw std::logic_error("with_type: unknown dtype");
}

}  // namespace perseus::comm
