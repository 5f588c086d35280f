#include "lib/comm/reduction.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "lib/comm/error.h"
#include "lib/comm/half_float.h"

namespace perseus::comm {

namespace {

// The type arithmetic happens in: float32 for the 16-bit floats, the type itself otherwise.
float widen(Float16 x) { return to_float(x); }
float widen(Bfloat16 x) { return to_float(x); }
template <typename T>
T widen(T x) {
  return x;
}

template <typename T, typename C>
T narrow(C x) {
  if constexpr (std::is_same_v<T, Float16>) {
    return to_float16(x);
  } else if constexpr (std::is_same_v<T, Bfloat16>) {
    return to_bfloat16(x);
  } else {
    return x;
  }
}

// Integer sums and products wrap around, through the unsigned type: signed overflow would be
// undefined behaviour, and a sanitizer build would stop on it.
template <typename C>
C add(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename C>
C multiply(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    // In unsigned arithmetic of at least unsigned int's width: uint16 * uint16 would promote
    // to int, where 65535 * 65535 overflows.
    using U = std::make_unsigned_t<C>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<C>(
        static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else {
    return a * b;
  }
}

struct Sum {
  template <typename C>
  static C apply(C a, C b) {
    return add(a, b);
  }
};
struct Product {
  template <typename C>
  static C apply(C a, C b) {
    return multiply(a, b);
  }
};
struct Min {
  template <typename C>
  static C apply(C a, C b) {
    return std::min(a, b);
  }
};
struct Max {
  template <typename C>
  static C apply(C a, C b) {
    return std::max(a, b);
  }
};

template <typename T, typename Op>
void reduce_loop(void *out, const void *a, const void *b, size_t n) {
  auto *o = static_cast<T *>(out);
  const auto *x = static_cast<const T *>(a);
  const auto *y = static_cast<const T *>(b);
  for (size_t i = 0; i < n; ++i) o[i] = narrow<T>(Op::apply(widen(x[i]), widen(y[i])));
}

template <typename T>
ReduceFunction for_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return reduce_loop<T, Sum>;
    case ReduceOp::kMin:
      return reduce_loop<T, Min>;
    case ReduceOp::kMax:
      return reduce_loop<T, Max>;
    case ReduceOp::kProduct:
      return reduce_loop<T, Product>;
  }
  throw Error(Code::kInternal, "reduce_function: unknown op");
}

template <typename T>
void divide_loop(void *data, size_t n, int divisor) {
  auto *p = static_cast<T *>(data);
  using C = decltype(widen(T{}));
  if constexpr (std::is_integral_v<C>) {
    // In 64 bits: the rank count need not fit the element type (uint8 over 256 ranks).
    const auto d = static_cast<int64_t>(divisor);
    for (size_t i = 0; i < n; ++i) {
      p[i] = narrow<T>(static_cast<C>(static_cast<int64_t>(widen(p[i])) / d));
    }
  } else {
    const auto d = static_cast<C>(divisor);
    for (size_t i = 0; i < n; ++i) p[i] = narrow<T>(static_cast<C>(widen(p[i]) / d));
  }
}

template <typename T>
void scale_loop(void *data, size_t n, double factor) {
  auto *p = static_cast<T *>(data);
  using C = decltype(widen(T{}));
  if constexpr (std::is_integral_v<C>) {
    // In float64, rounded toward zero, saturated at the type's limits (a cast of a double
    // out of range would be undefined).
    const double low = static_cast<double>(std::numeric_limits<T>::min());
    const double high = static_cast<double>(std::numeric_limits<T>::max());
    for (size_t i = 0; i < n; ++i) {
      const double x = static_cast<double>(widen(p[i])) * factor;
      if (x != x) {
        p[i] = T{0};  // NaN (0 * inf)
      } else if (x <= low) {
        p[i] = std::numeric_limits<T>::min();
      } else if (x >= high) {  // high may round up to 2^63, itself out of range
        p[i] = std::numeric_limits<T>::max();
      } else {
        p[i] = static_cast<T>(x);
      }
    }
  } else {
    const auto f = static_cast<C>(factor);
    for (size_t i = 0; i < n; ++i) p[i] = narrow<T>(static_cast<C>(widen(p[i]) * f));
  }
}

// Calls f with a null pointer of the element type of `type`, to pick a template instance.
template <typename F>
auto dispatch(DataType type, F &&f) {
  switch (type) {
    case DataType::kUint8:
      return f(static_cast<uint8_t *>(nullptr));
    case DataType::kInt8:
      return f(static_cast<int8_t *>(nullptr));
    case DataType::kInt16:
      return f(static_cast<int16_t *>(nullptr));
    case DataType::kInt32:
      return f(static_cast<int32_t *>(nullptr));
    case DataType::kInt64:
      return f(static_cast<int64_t *>(nullptr));
    case DataType::kFloat16:
      return f(static_cast<Float16 *>(nullptr));
    case DataType::kBfloat16:
      return f(static_cast<Bfloat16 *>(nullptr));
    case DataType::kFloat32:
      return f(static_cast<float *>(nullptr));
    case DataType::kFloat64:
      return f(static_cast<double *>(nullptr));
  }
  throw Error(Code::kInternal, "dispatch: unknown dtype");
}

}  // namespace

ReduceFunction reduce_function(DataType type, ReduceOp op) {
  return dispatch(type, [op]<typename T>(T *) { return for_op<T>(op); });
}

void divide_elements(void *data, size_t n, DataType type, int divisor) {
  dispatch(type, [&]<typename T>(T *) { divide_loop<T>(data, n, divisor); });
}

void scale_elements(void *data, size_t n, DataType type, double factor) {
  if (factor == 1.0) return;
  dispatch(type, [&]<typename T>(T *) { scale_loop<T>(data, n, factor); });
}

}  // namespace perseus::comm
