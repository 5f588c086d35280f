#include "lib/comm/shm/local_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <thread>
#include <utility>

#include "lib/comm/reduction.h"

namespace perseus::comm::shm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x3153554553524550;  // "PERSEUS1"
constexpr size_t kLine = 64;
constexpr size_t kPage = 4096;
// A rank reduces its block in pieces of this size, so that the running result stays in cache
// while every peer's piece is added to it.
constexpr size_t kPiece = 64 * 1024;
// How long a barrier polls before it sleeps on the futex. It polls with sched_yield, not with
// a busy loop: with a core for every rank a peer is about to arrive and the yield returns at
// once, cheaper than a sleep and a wake-up; with more ranks than cores (or a busy host) the
// yield hands the core to the rank being waited for. Measured on 2 cores with 2 and 4 ranks:
// a 4 KB call takes 2 to 4 us (2 ranks) this way, against 150 us with a 50 us busy loop and
// 6 us when sleeping at once.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kPeerCheck = std::chrono::milliseconds(100);
// Small calls take a path of one barrier instead of two (see small_area): each rank's bytes,
// up to kSmallBytes, go into its place in one of two areas used in turn, and every rank
// reduces (or gathers) them all itself; an all-reduce when the ranks' bytes together are at
// most kSmallTotal.
constexpr size_t kSmallBytes = LocalAllreduce::kSmallBytes;
constexpr size_t kSmallTotal = 256 * 1024;
constexpr auto kSetupPoll = std::chrono::milliseconds(1);

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

struct alignas(kLine) CacheLine {
  std::atomic<uint32_t> value;
};

constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string errno_text(int error) { return std::to_string(error) + " " + std::strerror(error); }

long futex(std::atomic<uint32_t> *word, int op, uint32_t value, const timespec *timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), op, value, timeout, nullptr, 0);
}

// kill(pid, 0) succeeds for a zombie too (a rank that ended but was not yet reaped), so ask
// /proc for its state as well; without /proc, a pid that answers counts as alive.
bool alive(pid_t pid) {
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  char text[512];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return true;
  text[n] = '\0';
  const char *paren = std::strrchr(text, ')');  // the command name may hold spaces or ')'
  if (!paren || paren[1] == '\0' || paren[2] == '\0') return true;
  return paren[2] != 'Z' && paren[2] != 'X';
}

bool valid_name(const std::string &name) {
  if (name.size() < 17 || name.size() > 201 || name[0] != '/') return false;
  return std::all_of(name.begin() + 1, name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

}  // namespace

// At the start of the segment; the rest is zero until rank 0 fills it in and publishes magic.
struct SegmentHeader {
  std::atomic<uint64_t> magic;  // written last by rank 0
  uint64_t local_size;
  uint64_t block_bytes;
  alignas(kLine) std::atomic<uint32_t> mapped;      // ranks that have mapped the segment
  alignas(kLine) std::atomic<uint32_t> arrived;     // at the current barrier
  alignas(kLine) std::atomic<uint32_t> generation;  // barriers completed: the futex word
  std::atomic<uint32_t> sleepers;                   // ranks in FUTEX_WAIT on it
  alignas(kLine) std::atomic<uint32_t> abort_claimed;
  std::atomic<int32_t> aborted_by;  // local rank + 1 of the first rank that gave up
  int32_t abort_code;
  char abort_message[1024];
};

// One round's bytes, cut into size_ blocks of `stride` (the last ones shorter or empty).
struct LocalAllreduce::Split {
  size_t bytes;
  size_t stride;
  size_t begin(int k) const { return std::min(bytes, static_cast<size_t>(k) * stride); }
  size_t length(int k) const {
    return std::min(bytes, static_cast<size_t>(k + 1) * stride) - begin(k);
  }
};

namespace {

// After the header: one line per rank counting the barriers it has reached (to name the ranks
// that are late), then the slots, from a page boundary.
constexpr size_t kArrivalsAt = round_up(sizeof(SegmentHeader), kLine);

CacheLine *arrivals_of(uint8_t *base) { return reinterpret_cast<CacheLine *>(base + kArrivalsAt); }

std::string octal(unsigned mode) {
  char text[16];
  std::snprintf(text, sizeof text, "0%o", mode);
  return text;
}

}  // namespace

LocalAllreduce::LocalAllreduce(const std::string &segment_name, int local_rank, int local_size,
                               std::vector<pid_t> peer_pids, std::chrono::milliseconds timeout,
                               size_t slot_bytes)
    : name_(segment_name),
      rank_(local_rank),
      size_(local_size),
      pids_(std::move(peer_pids)),
      timeout_(timeout) {
  const std::string where = "shared-memory all-reduce: ";
  if (!valid_name(name_)) {
    throw Error(Code::kInvalidArgument,
                where + "segment name '" + name_ +
                    "' is not '/' followed by 16 to 200 of [A-Za-z0-9._-] (derive it from the "
                    "job and a random token)");
  }
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    throw Error(Code::kInvalidArgument, where + "local rank " + std::to_string(rank_) +
                                            " is not in [0, local size " + std::to_string(size_) +
                                            ")");
  }
  if (pids_.size() != static_cast<size_t>(size_)) {
    throw Error(Code::kInvalidArgument, where + std::to_string(pids_.size()) +
                                            " peer pids for local size " + std::to_string(size_));
  }
  if (timeout_.count() <= 0) {
    throw Error(Code::kInvalidArgument,
                where + "timeout " + std::to_string(timeout_.count()) + " ms is not positive");
  }
  if (size_ == 1) return;  // nothing to share
  block_bytes_ = std::max(kLine, slot_bytes / static_cast<size_t>(size_) / kLine * kLine);
  const size_t slots_at = round_up(kArrivalsAt + size_ * sizeof(CacheLine), kPage);
  const size_t small_at = slots_at + static_cast<size_t>(size_) * size_ * block_bytes_;
  mapped_bytes_ = small_at + 2 * static_cast<size_t>(size_) * kSmallBytes;
  last_peer_check_ = Clock::now();
  try {
    if (rank_ == 0) {
      create();
      wait_until_all_mapped();
    } else {
      open();
    }
  } catch (const Error &e) {
    publish_abort(e.code(), e.what());  // a peer still polling in its setup stops now
    release();
    throw;
  } catch (...) {
    release();
    throw;
  }
  slots_ = base_ + slots_at;
  small_ = base_ + small_at;
}

LocalAllreduce::~LocalAllreduce() {
  if (broken_.empty()) {
    publish_abort(Code::kCommunication,
                  "local rank " + std::to_string(rank_) + " closed its shared-memory all-reduce");
  }
  release();
}

void LocalAllreduce::create() {
  const int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;
    throw Error(Code::kCommunication,
                "shared-memory all-reduce: local rank 0 could not create segment " + name_ +
                    ": shm_open(O_CREAT|O_EXCL) failed: " + errno_text(error) +
                    (error == EEXIST ? " (the name must be unique to the job)" : ""));
  }
  created_ = true;
  int error = 0;
  do {
    error = posix_fallocate(fd, 0, static_cast<off_t>(mapped_bytes_));
  } while (error == EINTR);
  if (error != 0) {
    ::close(fd);
    throw Error(Code::kCommunication, "shared-memory all-reduce: posix_fallocate of " +
                                          std::to_string(mapped_bytes_) + " bytes for segment " +
                                          name_ + " failed: " + errno_text(error) +
                                          " (is /dev/shm large enough? docker: --shm-size)");
  }
  map(fd, "created");
  header_->local_size = static_cast<uint64_t>(size_);
  header_->block_bytes = block_bytes_;
  header_->magic.store(kMagic, std::memory_order_release);
  header_->mapped.fetch_add(1, std::memory_order_acq_rel);
}

void LocalAllreduce::map(int fd, const char *how) {
  void *p = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int error = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    throw Error(Code::kCommunication, "shared-memory all-reduce: mmap of " +
                                          std::to_string(mapped_bytes_) + " bytes of the " + how +
                                          " segment " + name_ + " failed: " + errno_text(error));
  }
  base_ = static_cast<uint8_t *>(p);
  header_ = reinterpret_cast<SegmentHeader *>(base_);
}

void LocalAllreduce::open() {
  const auto deadline = Clock::now() + timeout_;
  const auto poll = [&](auto &&done) {
    while (!done()) {
      check_peers_and_abort(deadline, "while setting up");
      std::this_thread::sleep_for(kSetupPoll);
    }
  };
  int fd = -1;
  poll([&] {
    fd = shm_open(name_.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd >= 0 || errno == ENOENT) return fd >= 0;
    throw Error(Code::kCommunication, "shared-memory all-reduce: local rank " +
                                          std::to_string(rank_) + " could not open segment " +
                                          name_ + ": shm_open failed: " + errno_text(errno));
  });
  struct stat st {};
  std::string wrong;
  poll([&] {
    if (fstat(fd, &st) != 0) wrong = "fstat failed: " + errno_text(errno);
    if (wrong.empty() && (st.st_uid != geteuid() || (st.st_mode & 077) != 0)) {
      wrong = "it belongs to uid " + std::to_string(st.st_uid) + " with mode " +
              octal(st.st_mode & 0777) + ", not to this user with mode 0600";
    }
    const auto size = static_cast<size_t>(st.st_size);
    if (wrong.empty() && size != 0 && size != mapped_bytes_) {
      wrong = "it has " + std::to_string(size) + " bytes where this rank expects " +
              std::to_string(mapped_bytes_) + " (local size or slot bytes differ)";
    }
    return !wrong.empty() || size == mapped_bytes_;
  });
  if (!wrong.empty()) {
    ::close(fd);
    throw Error(Code::kCommunication, "shared-memory all-reduce: local rank " +
                                          std::to_string(rank_) + " will not use segment " + name_ +
                                          ": " + wrong);
  }
  map(fd, "opened");
  poll([&] { return header_->magic.load(std::memory_order_acquire) == kMagic; });
  if (header_->local_size != static_cast<uint64_t>(size_) || header_->block_bytes != block_bytes_) {
    throw Error(Code::kInvalidArgument, "shared-memory all-reduce: local rank 0 made segment " +
                                            name_ + " for " + std::to_string(header_->local_size) +
                                            " ranks of " + std::to_string(header_->block_bytes) +
                                            "-byte blocks; local rank " + std::to_string(rank_) +
                                            " expects " + std::to_string(size_) + " of " +
                                            std::to_string(block_bytes_));
  }
  header_->mapped.fetch_add(1, std::memory_order_acq_rel);
}

void LocalAllreduce::wait_until_all_mapped() {
  const auto deadline = Clock::now() + timeout_;
  while (header_->mapped.load(std::memory_order_acquire) < static_cast<uint32_t>(size_)) {
    check_peers_and_abort(deadline, "while setting up");
    std::this_thread::sleep_for(kSetupPoll);
  }
  // Every rank holds a mapping now: the name is no longer needed, and without it nothing is
  // left in /dev/shm however the job ends.
  if (shm_unlink(name_.c_str()) != 0) {
    throw Error(Code::kCommunication,
                "shared-memory all-reduce: shm_unlink(" + name_ + ") failed: " + errno_text(errno));
  }
  unlinked_ = true;
}

void LocalAllreduce::release() noexcept {
  if (created_ && !unlinked_) shm_unlink(name_.c_str());
  unlinked_ = true;
  if (base_) munmap(base_, mapped_bytes_);
  base_ = nullptr;
  header_ = nullptr;
}

void LocalAllreduce::allreduce(void *buffer, size_t count, DataType type, ReduceOp op) {
  allreduce(buffer, buffer, count, type, op);
}

void LocalAllreduce::allreduce(const void *send, void *recv, size_t count, DataType type,
                               ReduceOp op) {
  reduce_window(send, count, type, op, 0, count, recv);
}

void LocalAllreduce::reducescatter(const void *send, size_t count, size_t first, size_t length,
                                   void *recv, DataType type, ReduceOp op) {
  if (first > count || length > count - first) {
    throw Error(Code::kInvalidArgument, "shared-memory reduce-scatter: elements [" +
                                            std::to_string(first) + ", +" + std::to_string(length) +
                                            ") are not within " + std::to_string(count));
  }
  reduce_window(send, count, type, op, first, length, recv);
}

void LocalAllreduce::reduce_window(const void *send, size_t count, DataType type, ReduceOp op,
                                   size_t first, size_t length, void *recv) {
  if (!broken_.empty()) {
    throw Error(Code::kCommunication,
                "shared-memory all-reduce: unusable after an earlier failure: " + broken_);
  }
  const size_t unit = element_size(type);
  const ReduceFunction combine = reduce_function(type, op);
  if (count == 0) return;
  if (count > SIZE_MAX / unit) {
    throw Error(Code::kInvalidArgument,
                "shared-memory all-reduce: count " + std::to_string(count) + " is too large");
  }
  const size_t bytes = count * unit;
  // The bytes of the result this rank keeps: [keep_from, keep_to) of the whole buffer.
  const size_t keep_from = first * unit;
  const size_t keep_to = keep_from + length * unit;
  const auto *in = static_cast<const uint8_t *>(send);
  auto *out = static_cast<uint8_t *>(recv);
  if (size_ == 1) {  // the average over one rank is the input itself
    if (in + keep_from != out && keep_to > keep_from) {
      std::memcpy(out, in + keep_from, keep_to - keep_from);
    }
    return;
  }
  if (bytes <= kSmallBytes && bytes * static_cast<size_t>(size_) <= kSmallTotal) {
    // One barrier: each rank's whole input into its place, then every rank combines them all,
    // in rank order (so that every rank computes the same bits), for what it keeps.
    uint8_t *area = small_area();
    std::memcpy(area + static_cast<size_t>(rank_) * kSmallBytes, in, bytes);
    barrier();
    const size_t n = length;
    if (n == 0) return;
    const auto at = [&](int r) { return area + static_cast<size_t>(r) * kSmallBytes + keep_from; };
    combine(out, at(0), at(1), n);
    for (int r = 2; r < size_; ++r) combine(out, out, at(r), n);
    if (op == ReduceOp::kAverage) divide_elements(out, n, type, size_);
    return;
  }
  const size_t capacity = static_cast<size_t>(size_) * block_bytes_;
  for (size_t done = 0; done < bytes;) {
    const size_t round = std::min(bytes - done, capacity);
    const Split split{round, round_up((round + size_ - 1) / size_, kLine)};
    for (int k = 0; k < size_; ++k) {
      if (k != rank_) std::memcpy(block(rank_, k), in + split.begin(k), split.length(k));
    }
    barrier();
    reduce_round(in, split, combine, type, op);
    barrier();
    for (int k = 0; k < size_; ++k) {
      // The part of block k's result (bytes [done + begin, done + begin + length) of the whole
      // buffer) that falls in what this rank keeps.
      const size_t from = std::max(done + split.begin(k), keep_from);
      const size_t to = std::min(done + split.begin(k) + split.length(k), keep_to);
      if (from < to) {
        std::memcpy(out + (from - keep_from), block(k, k) + (from - done - split.begin(k)),
                    to - from);
      }
    }
    in += round;
    done += round;
  }
}

// Each rank writes its bytes into a block of its own slot that is not its diagonal one: after
// the previous call's second barrier nobody reads those any more (the diagonal blocks are read
// until the last copy-out), and the second barrier here keeps the next call's copy-in from
// overwriting them while a peer still reads.
void LocalAllreduce::allgather(const void *mine, size_t bytes, void *out) {
  if (!broken_.empty()) {
    throw Error(Code::kCommunication,
                "shared-memory allgather: unusable after an earlier failure: " + broken_);
  }
  auto *to = static_cast<uint8_t *>(out);
  if (size_ == 1) {
    std::memcpy(to, mine, bytes);
    return;
  }
  if (bytes > block_bytes_) {
    throw Error(Code::kInvalidArgument, "shared-memory allgather: " + std::to_string(bytes) +
                                            " bytes do not fit a block of " +
                                            std::to_string(block_bytes_));
  }
  if (bytes <= kSmallBytes) {  // one barrier (see small_area)
    allgatherv(mine, out, std::vector<size_t>(static_cast<size_t>(size_), bytes));
    return;
  }
  const auto off_diagonal = [this](int r) { return block(r, (r + 1) % size_); };
  std::memcpy(off_diagonal(rank_), mine, bytes);
  barrier();
  for (int r = 0; r < size_; ++r) {
    std::memcpy(to + static_cast<size_t>(r) * bytes, off_diagonal(r), bytes);
  }
  barrier();
}

// The small calls' area for this call: two areas of size_ places of kSmallBytes, used in turn.
// A rank writes area A again two small calls later, after the barrier of the call between; every
// peer reached that barrier after it had read A, so one barrier a call is enough. The ranks make
// the same calls in the same order, so they agree on the turn.
uint8_t *LocalAllreduce::small_area() {
  uint8_t *area = small_ + (small_calls_ % 2) * static_cast<size_t>(size_) * kSmallBytes;
  ++small_calls_;
  return area;
}

void LocalAllreduce::allgatherv(const void *mine, void *out, const std::vector<size_t> &bytes) {
  if (!broken_.empty()) {
    throw Error(Code::kCommunication,
                "shared-memory allgatherv: unusable after an earlier failure: " + broken_);
  }
  if (bytes.size() != static_cast<size_t>(size_) ||
      *std::max_element(bytes.begin(), bytes.end()) > kSmallBytes) {
    throw Error(Code::kInvalidArgument,
                "shared-memory allgatherv: " + std::to_string(bytes.size()) + " lengths for " +
                    std::to_string(size_) + " ranks, or one over " + std::to_string(kSmallBytes) +
                    " bytes");
  }
  auto *to = static_cast<uint8_t *>(out);
  const size_t own = bytes[static_cast<size_t>(rank_)];
  if (size_ == 1) {
    if (own > 0) std::memcpy(to, mine, own);
    return;
  }
  uint8_t *area = small_area();
  if (own > 0) std::memcpy(area + static_cast<size_t>(rank_) * kSmallBytes, mine, own);
  barrier();
  for (int r = 0; r < size_; ++r) {
    const size_t n = bytes[static_cast<size_t>(r)];
    if (n > 0) std::memcpy(to, area + static_cast<size_t>(r) * kSmallBytes, n);
    to += n;
  }
}

uint8_t *LocalAllreduce::block(int slot, int block) const {
  return slots_ + (static_cast<size_t>(slot) * size_ + block) * block_bytes_;
}

// This rank's block of the round: its own data (still in the caller's buffer) combined with
// every peer's copy of that block, into its own slot, where the peers read the result.
void LocalAllreduce::reduce_round(const uint8_t *data, const Split &split, ReduceFunction reduce,
                                  DataType type, ReduceOp op) {
  const size_t unit = element_size(type);
  const size_t length = split.length(rank_);
  const uint8_t *own = data + split.begin(rank_);
  uint8_t *out = block(rank_, rank_);
  for (size_t at = 0; at < length; at += kPiece) {
    const size_t n = std::min(kPiece, length - at) / unit;
    const uint8_t *first = own + at;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      reduce(out + at, first, block(j, rank_) + at, n);
      first = out + at;
    }
    if (op == ReduceOp::kAverage) divide_elements(out + at, n, type, size_);
  }
}

// Sense reversal through a generation count: the last rank to arrive resets `arrived` and
// then advances `generation`, which the others wait on.
void LocalAllreduce::barrier() {
  SegmentHeader &h = *header_;
  arrivals_of(base_)[rank_].value.fetch_add(1, std::memory_order_relaxed);
  const uint32_t generation = h.generation.load(std::memory_order_acquire);
  if (h.arrived.fetch_add(1, std::memory_order_acq_rel) == static_cast<uint32_t>(size_ - 1)) {
    h.arrived.store(0, std::memory_order_relaxed);
    h.generation.fetch_add(1, std::memory_order_seq_cst);
    // seq_cst on both sides: either this load sees a sleeper, or that sleeper's FUTEX_WAIT
    // sees the new generation and returns at once.
    if (h.sleepers.load(std::memory_order_seq_cst) != 0) {
      futex(&h.generation, FUTEX_WAKE, INT_MAX, nullptr);
    }
    return;
  }
  wait_for_generation(generation);
}

void LocalAllreduce::wait_for_generation(uint32_t seen) {
  SegmentHeader &h = *header_;
  const auto start = Clock::now();
  const auto deadline = start + timeout_;
  while (h.generation.load(std::memory_order_acquire) == seen) {
    if (Clock::now() - start < kSpin) {
      sched_yield();
      continue;
    }
    check_peers_and_abort(deadline, "during");
    h.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const timespec nap{0, std::chrono::nanoseconds(kPeerCheck).count()};
    futex(&h.generation, FUTEX_WAIT, seen, &nap);
    h.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void LocalAllreduce::check_peers_and_abort(Clock::time_point deadline, const char *during) {
  if (header_) {
    const int32_t by = header_->aborted_by.load(std::memory_order_acquire);
    if (by != 0) {
      fail(static_cast<Code>(header_->abort_code),
           "local rank " + std::to_string(by - 1) +
               " gave up the shared-memory all-reduce: " + header_->abort_message);
    }
  }
  const auto now = Clock::now();
  if (now - last_peer_check_ >= kPeerCheck) {
    last_peer_check_ = now;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || alive(pids_[r])) continue;
      fail(Code::kCommunication,
           "local rank " + std::to_string(r) + " (pid " + std::to_string(pids_[r]) + ") ended " +
               during + " a shared-memory all-reduce (segment " + name_ +
               "); the job cannot go on: see that rank's output for why it ended");
    }
  }
  if (now > deadline) fail(Code::kTimeout, timeout_message(during));
}

std::string LocalAllreduce::timeout_message(const char *during) const {
  std::string late;
  if (header_) {
    const CacheLine *arrivals = arrivals_of(base_);
    const uint32_t mine = arrivals[rank_].value.load(std::memory_order_relaxed);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || arrivals[r].value.load(std::memory_order_relaxed) >= mine) continue;
      late += (late.empty() ? "" : ", ") + std::to_string(r) + " (pid " + std::to_string(pids_[r]) +
              ")";
    }
  }
  return "local rank " + std::to_string(rank_) + " waited " + std::to_string(timeout_.count()) +
         " ms " + during + " a shared-memory all-reduce (segment " + name_ + ")" +
         (late.empty() ? "" : " for local ranks " + late + ", which had not arrived") +
         "; if they are only slow, raise PERSEUS_COLLECTIVE_TIMEOUT";
}

void LocalAllreduce::fail(Code code, const std::string &message) {
  broken_ = message;
  publish_abort(code, message);
  throw Error(code, message);
}

// Tells the peers that this rank gives up, so that their waits end now rather than at their
// timeout. The first rank to give up is the one the others name.
void LocalAllreduce::publish_abort(Code code, const std::string &message) noexcept {
  if (!header_) return;
  uint32_t expected = 0;
  if (!header_->abort_claimed.compare_exchange_strong(expected, 1)) return;
  std::snprintf(header_->abort_message, sizeof header_->abort_message, "%s", message.c_str());
  header_->abort_code = static_cast<int32_t>(code);
  header_->aborted_by.store(rank_ + 1, std::memory_order_release);
  futex(&header_->generation, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace perseus::comm::shm
