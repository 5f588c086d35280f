#include "lib/comm/operation.h"

#include <array>

namespace perseus::comm {

const char *name_of(OpKind kind) {
  static constexpr std::array<const char *, kOpKinds> kNames = {
      "allreduce", "broadcast", "allgatherv", "alltoall", "reducescatter", "barrier", "join"};
  const auto index = static_cast<size_t>(kind);
  return index < kNames.size() ? kNames[index] : "unknown";
}

void Request::succeed() {
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    code_ = Code::kInternal;  // unused on success
    message_.clear();
  }
  done_changed_.notify_all();
}

void Request::fail(Code code, const std::string &message) {
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    code_ = code;
    message_ = message.empty() ? "failed" : message;
  }
  done_changed_.notify_all();
}

bool Request::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void Request::wait() const {
  std::unique_lock lock(mutex_);
  done_changed_.wait(lock, [this] { return done_; });
  if (!message_.empty()) throw Error(code_, message_);
}

void Request::wait_quietly() const noexcept {
  std::unique_lock lock(mutex_);
  done_changed_.wait(lock, [this] { return done_; });
}

}  // namespace perseus::comm
