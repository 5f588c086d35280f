#pragma once
// Element types and reductions as libperseus uses them inside, and their checks against the
// ints that arrive through the C ABI.

#include <cstddef>
#include <string>

namespace perseus::comm {

// Same values as perseus_dtype_t and perseus_op_t (c_api.cc checks that they agree).
enum class DataType : int {
  kUint8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBfloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kInt16 = 8,  // after the others: their numbers are the ABI's
};
enum class ReduceOp : int { kSum = 0, kAverage = 1, kMin = 2, kMax = 3, kProduct = 4 };

// Throw Error(kInvalidArgument) naming the argument and the value when out of range.
DataType to_data_type(int value);
ReduceOp to_reduce_op(int value);

size_t element_size(DataType type);
const char *name_of(DataType type);
const char *name_of(ReduceOp op);

}  // namespace perseus::comm
