#pragma once
// Element-wise reductions on host memory, one function per (type, op), in the untyped form
// Gloo's allreduce calls: out[i] = op(a[i], b[i]) for n elements, where out may equal a or b.

#include <cstddef>

#include "lib/comm/types.h"

namespace perseus::comm {

using ReduceFunction = void (*)(void *out, const void *a, const void *b, size_t n);

// The function that combines two ranks' elements. For kAverage that is the sum: divide the
// result with divide_elements afterwards.
ReduceFunction reduce_function(DataType type, ReduceOp op);

// data[i] /= divisor. Integers: C's division (toward zero); 16-bit floats: in float32.
void divide_elements(void *data, size_t n, DataType type, int divisor);

// data[i] *= factor (prescale and postscale). Integers: in float64, rounded toward zero;
// 16-bit floats: in float32. A factor of 1 leaves data untouched.
void scale_elements(void *data, size_t n, DataType type, double factor);

}  // namespace perseus::comm
