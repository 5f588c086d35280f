#include "lib/comm/types.h"

#include <array>

#include "lib/comm/error.h"

namespace perseus::comm {

namespace {

struct TypeInfo {
  const char *name;
  size_t size;
};

constexpr std::array<TypeInfo, 9> kTypes = {{
    {"uint8", 1},
    {"int8", 1},
    {"int32", 4},
    {"int64", 8},
    {"float16", 2},
    {"bfloat16", 2},
    {"float32", 4},
    {"float64", 8},
    {"int16", 2},
}};

constexpr std::array<const char *, 5> kOps = {"sum", "average", "min", "max", "product"};

}  // namespace

DataType to_data_type(int value) {
  if (value < 0 || static_cast<size_t>(value) >= kTypes.size()) {
    throw Error(Code::kInvalidArgument,
                "dtype " + std::to_string(value) +
                    " is not a perseus_dtype_t (PERSEUS_UINT8 = 0 ... PERSEUS_INT16 = 8)");
  }
  return static_cast<DataType>(value);
}

ReduceOp to_reduce_op(int value) {
  if (value < 0 || static_cast<size_t>(value) >= kOps.size()) {
    throw Error(Code::kInvalidArgument,
                "op " + std::to_string(value) +
                    " is not a perseus_op_t (PERSEUS_SUM = 0 ... PERSEUS_PRODUCT = 4)");
  }
  return static_cast<ReduceOp>(value);
}

size_t element_size(DataType type) { return kTypes.at(static_cast<size_t>(type)).size; }

const char *name_of(DataType type) { return kTypes.at(static_cast<size_t>(type)).name; }

const char *name_of(ReduceOp op) { return kOps.at(static_cast<size_t>(op)); }

}  // namespace perseus::comm
