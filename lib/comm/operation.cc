#include "lib/comm/operation.h"

#include <array>
#include <charconv>
#include <thread>

namespace perseus::comm {

namespace {

constexpr std::string_view kUnnamed = ".noname.";  // in unnamed operations' names

// Threads in Request::wait() or wait_quietly(), over every request of the process.
std::atomic<int> g_threads_waiting{0};

// Counts a thread in Request::waiters_ (and in g_threads_waiting) while it waits.
class Waiting {
 public:
  explicit Waiting(std::atomic<int> &count) : count_(count) {
    count_.fetch_add(1, std::memory_order_acq_rel);
    g_threads_waiting.fetch_add(1, std::memory_order_acq_rel);
  }
  ~Waiting() {
    g_threads_waiting.fetch_sub(1, std::memory_order_acq_rel);
    count_.fetch_sub(1, std::memory_order_acq_rel);
  }
  Waiting(const Waiting &) = delete;
  Waiting &operator=(const Waiting &) = delete;

 private:
  std::atomic<int> &count_;
};

}  // namespace

std::string unnamed_name(OpKind kind, uint64_t n) {
  return std::string(name_of(kind)).append(kUnnamed) + std::to_string(n);
}

std::string process_set_suffix(int set) {
  return set == 0 ? std::string() : " [process set " + std::to_string(set) + "]";
}

std::optional<uint64_t> unnamed_number(std::string_view name, OpKind kind, int set) {
  const std::string prefix = std::string(name_of(kind)).append(kUnnamed);
  const std::string suffix = process_set_suffix(set);
  if (name.size() <= prefix.size() + suffix.size() || name.substr(0, prefix.size()) != prefix ||
      name.substr(name.size() - suffix.size()) != suffix) {
    return std::nullopt;
  }
  const char *first = name.data() + prefix.size();
  const char *last = name.data() + name.size() - suffix.size();
  uint64_t n = 0;
  const auto [at, ec] = std::from_chars(first, last, n);
  if (ec != std::errc() || at != last) return std::nullopt;
  return n;
}

int threads_waiting() { return g_threads_waiting.load(std::memory_order_acquire); }

void Request::succeed() {
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    done_ = true;
    code_ = Code::kInternal;  // unused on success
    message_.clear();
    finished_.store(true, std::memory_order_release);
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
    finished_.store(true, std::memory_order_release);
  }
  done_changed_.notify_all();
}

bool Request::done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void Request::wait() const {
  // A short operation is often done within microseconds: poll briefly before sleeping. A
  // device operation is polled for up to a millisecond, as cudaStreamSynchronize spins by
  // default: waking a sleeping thread costs tens of microseconds, a tenth of a large transfer
  // on one GPU. Host operations poll less, so as not to take the CPU from the transfers.
  const auto spin =
      what.device >= 0 ? std::chrono::microseconds(1000) : std::chrono::microseconds(30);
  const auto until = std::chrono::steady_clock::now() + spin;
  const Waiting waiting(waiters_);
  while (!finished_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  std::unique_lock lock(mutex_);
  done_changed_.wait(lock, [this] { return done_; });
  if (!message_.empty()) throw Error(code_, message_);
}

void Request::wait_quietly() const noexcept {
  const Waiting waiting(waiters_);
  std::unique_lock lock(mutex_);
  done_changed_.wait(lock, [this] { return done_; });
}

}  // namespace perseus::comm
