#pragma once
// The one exception type inside libperseus. c_api.cc turns it into the result code and the
// thread's last-error message; nothing throws across the C ABI.

#include <stdexcept>
#include <string>

namespace perseus::comm {

// Mirrors perseus_result_t (include/perseus/perseus.h); c_api.cc checks that they agree.
enum class Code : int {
  kInvalidArgument = -1,  // bad input: the caller's bug, nothing happened
  kNotInitialized = -2,
  kRendezvous = -3,  // the job's failures: the job cannot go on
  kCommunication = -4,
  kTimeout = -5,
  kInternal = -6,
};

class Error : public std::runtime_error {
 public:
  Error(Code code, const std::string &message) : std::runtime_error(message), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

}  // namespace perseus::comm
