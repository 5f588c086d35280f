#pragma once
// For libperseus's unit tests: calls f with a value of the C++ element type of a DataType, so
// that one templated check covers all eight types.

#include <cstdint>
#include <stdexcept>

#include "lib/comm/half_float.h"
#include "lib/comm/types.h"

namespace perseus::comm {

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
