// LocalAllreduce across real processes: the test forks one child per local rank (doctest runs
// no threads, so fork is safe), each child reports one line through a pipe, and the parent
// asserts on the lines. Children never use doctest's macros: a failure there would be lost with
// the child, so they return "FAIL ..." instead.

#include "lib/comm/shm/local_allreduce.h"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/half_float.h"
#include "lib/comm/reduction.h"
#include "lib/comm/types.h"
#include "tests/unit/comm_element_types.h"

namespace perseus::comm::shm {
namespace {

using Clock = std::chrono::steady_clock;
using Body = std::function<std::string(int rank, const std::vector<pid_t> &pids)>;

const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct};

std::string unique_name() {
  std::random_device random;
  char text[64];
  std::snprintf(text, sizeof text, "/perseus-test-%d-%08x%08x", static_cast<int>(getpid()),
                random(), random());
  return text;
}

bool segment_left(const std::string &name) {
  return access(("/dev/shm" + name).c_str(), F_OK) == 0 || errno != ENOENT;
}

void write_all(int fd, const void *data, size_t n) {
  const auto *p = static_cast<const char *>(data);
  while (n > 0) {
    const ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    p += k;
    n -= static_cast<size_t>(k);
  }
}

std::string read_all(int fd) {
  std::string text;
  char chunk[4096];
  for (;;) {
    const ssize_t k = read(fd, chunk, sizeof chunk);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return text;
    text.append(chunk, static_cast<size_t>(k));
  }
}

[[noreturn]] void run_child(int rank, int size, int pids_fd, int out_fd, const Body &body) {
  alarm(60);  // a hang ends the child (and fails the test) instead of the test run
  std::vector<pid_t> pids(static_cast<size_t>(size));
  const std::string bytes = read_all(pids_fd);
  std::string result;
  if (bytes.size() != pids.size() * sizeof(pid_t)) {
    result = "FAIL: no pids";
  } else {
    std::memcpy(pids.data(), bytes.data(), bytes.size());
    try {
      result = body(rank, pids);
    } catch (const Error &e) {
      result = "error " + std::to_string(static_cast<int>(e.code())) + " " + e.what();
    } catch (const std::exception &e) {
      result = std::string("FAIL: exception ") + e.what();
    }
  }
  write_all(out_fd, result.data(), result.size());
  _exit(0);
}

// Forks `size` ranks, runs body in each, returns what each returned (or how it ended).
std::vector<std::string> run_ranks(int size, const Body &body) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  std::vector<int> to_child, from_child;
  for (int rank = 0; rank < size; ++rank) {
    int in[2], out[2];
    REQUIRE(pipe(in) == 0);
    REQUIRE(pipe(out) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(in[1]);
      close(out[0]);
      for (int fd : to_child) close(fd);
      for (int fd : from_child) close(fd);
      run_child(rank, size, in[0], out[1], body);
    }
    close(in[0]);
    close(out[1]);
    pids.push_back(pid);
    to_child.push_back(in[1]);
    from_child.push_back(out[0]);
  }
  for (int fd : to_child) {
    write_all(fd, pids.data(), pids.size() * sizeof(pid_t));
    close(fd);
  }
  std::vector<std::string> results;
  for (size_t rank = 0; rank < pids.size(); ++rank) {
    results.push_back(read_all(from_child[rank]));
    close(from_child[rank]);
    int status = 0;
    waitpid(pids[rank], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      results.back() +=
          "ended by signal " + std::to_string(WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    }
  }
  return results;
}

// Small integers, so that every sum, product, minimum and maximum is exact in every type and
// the result cannot depend on the order the ranks' values are combined in. Element i holds the
// value for residue(i), a hash: not periodic in i, so that a block put in the wrong place
// shows, yet only kResidues values to compute the reference for.
constexpr size_t kResidues = 21;  // a multiple of 3 and of 7

size_t residue(size_t i) { return ((i + 1) * 2654435761u >> 7) % kResidues; }

int64_t value(DataType type, ReduceOp op, int rank, size_t residue) {
  const bool is_unsigned = type == DataType::kUint8;
  if (op == ReduceOp::kProduct) {
    static const int64_t kFactors[] = {1, 2, -1};
    const int64_t v = kFactors[(residue + static_cast<size_t>(rank)) % 3];
    return is_unsigned ? std::abs(v) : v;
  }
  const auto v = static_cast<int64_t>((residue + 3 * static_cast<size_t>(rank)) % 7);
  return is_unsigned ? v : v - 3;
}

int64_t combine(ReduceOp op, int64_t a, int64_t b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return a + b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kProduct:
      return a * b;
  }
  return 0;
}

// Runs one all-reduce and compares it with the reference; "" when equal.
std::string check_one(LocalAllreduce &local, int rank, int size, DataType type, ReduceOp op,
                      size_t count) {
  std::string verdict;
  with_type(type, [&]<typename T>(T) {
    std::vector<T> mine(kResidues), expected(kResidues), data(count);
    for (size_t k = 0; k < kResidues; ++k) {
      mine[k] = from_integer<T>(value(type, op, rank, k));
      int64_t r = value(type, op, 0, k);
      for (int peer = 1; peer < size; ++peer) r = combine(op, r, value(type, op, peer, k));
      expected[k] = from_integer<T>(r);
    }
    if (op == ReduceOp::kAverage) divide_elements(expected.data(), kResidues, type, size);
    for (size_t i = 0; i < count; ++i) data[i] = mine[residue(i)];
    local.allreduce(data.data(), count, type, op);
    for (size_t i = 0; i < count; ++i) {
      if (std::memcmp(&data[i], &expected[residue(i)], sizeof(T)) == 0) continue;
      verdict = std::string("FAIL: ") + name_of(type) + " " + name_of(op) + " count " +
                std::to_string(count) + ": element " + std::to_string(i) + " differs";
      return;
    }
  });
  return verdict;
}

std::string all_types_and_ops(const std::string &name, int rank, const std::vector<pid_t> &pids,
                              size_t slot_bytes) {
  const int size = static_cast<int>(pids.size());
  LocalAllreduce local(name, rank, size, pids, std::chrono::seconds(20), slot_bytes);
  for (DataType type : kAllTypes) {
    // 3 MB and a few elements: several rounds, the last one partial.
    const size_t big = (size_t{3} << 20) / element_size(type) + 3;
    for (ReduceOp op : kAllOps) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, big}) {
        std::string verdict = check_one(local, rank, size, type, op, count);
        if (!verdict.empty()) return verdict;
      }
    }
  }
  return "ok";
}

TEST_CASE("shm LocalAllreduce: every type, op and size on 2, 3 and 4 ranks") {
  for (int size : {2, 3, 4}) {
    // 100000: a slot that local_size does not divide, nor 64.
    for (size_t slot_bytes : {size_t{1} << 20, size_t{100000}}) {
      if (slot_bytes == 100000 && size != 3) continue;
      CAPTURE(size);
      CAPTURE(slot_bytes);
      const std::string name = unique_name();
      const auto results = run_ranks(size, [&](int rank, const std::vector<pid_t> &pids) {
        return all_types_and_ops(name, rank, pids, slot_bytes);
      });
      for (const std::string &result : results) CHECK(result == "ok");
      CHECK_FALSE(segment_left(name));
    }
  }
}

// Rank r keeps block r of `count` elements cut into blocks of sizes[r]; "" when it is right.
std::string check_scatter(LocalAllreduce &local, int rank, int size, DataType type, ReduceOp op,
                          const std::vector<size_t> &sizes) {
  std::string verdict;
  with_type(type, [&]<typename T>(T) {
    size_t count = 0;
    size_t first = 0;
    for (int r = 0; r < size; ++r) {
      if (r == rank) first = count;
      count += sizes[static_cast<size_t>(r)];
    }
    const size_t mine = sizes[static_cast<size_t>(rank)];
    std::vector<T> expected(kResidues), data(count), out(mine + 1, from_integer<T>(99));
    for (size_t k = 0; k < kResidues; ++k) {
      int64_t r = value(type, op, 0, k);
      for (int peer = 1; peer < size; ++peer) r = combine(op, r, value(type, op, peer, k));
      expected[k] = from_integer<T>(r);
    }
    if (op == ReduceOp::kAverage) divide_elements(expected.data(), kResidues, type, size);
    for (size_t i = 0; i < count; ++i) data[i] = from_integer<T>(value(type, op, rank, residue(i)));
    local.reducescatter(data.data(), count, first, mine, out.data(), type, op);
    for (size_t i = 0; i < mine; ++i) {
      if (std::memcmp(&out[i], &expected[residue(first + i)], sizeof(T)) == 0) continue;
      verdict = std::string("FAIL: reducescatter ") + name_of(type) + " " + name_of(op) +
                " count " + std::to_string(count) + ": element " + std::to_string(i) + " of rank " +
                std::to_string(rank) + "'s block differs";
      return;
    }
    const T guard = from_integer<T>(99);
    if (std::memcmp(&out[mine], &guard, sizeof(T)) != 0) {
      verdict = "FAIL: reducescatter wrote past rank " + std::to_string(rank) + "'s block";
    }
  });
  return verdict;
}

TEST_CASE("shm LocalAllreduce: reducescatter keeps each rank's block, of any size, every type") {
  for (int size : {2, 3}) {
    CAPTURE(size);
    const std::string name = unique_name();
    const auto results = run_ranks(size, [&](int rank, const std::vector<pid_t> &pids) {
      // Slots of 100000 bytes: the blocks below straddle rounds and their cache-line splits.
      LocalAllreduce local(name, rank, size, pids, std::chrono::seconds(20), 100000);
      const std::vector<std::vector<size_t>> cuts = {
          {1, 0, 2}, {0, 0, 0}, {7, 1001, 3}, {70001, 13, 40000}, {0, 50021, 1}};
      for (DataType type : kAllTypes) {
        for (ReduceOp op : kAllOps) {
          for (const auto &cut : cuts) {
            std::string verdict = check_scatter(local, rank, size, type, op, cut);
            if (!verdict.empty()) return verdict;
          }
        }
      }
      return std::string("ok");
    });
    for (const std::string &result : results) CHECK(result == "ok");
    CHECK_FALSE(segment_left(name));
  }
}

TEST_CASE("shm LocalAllreduce: allgather interleaved with all-reduces, rank order kept") {
  for (int size : {2, 3, 4}) {
    CAPTURE(size);
    const std::string name = unique_name();
    const auto results = run_ranks(size, [&](int rank, const std::vector<pid_t> &pids) {
      LocalAllreduce shm(name, rank, size, pids, std::chrono::seconds(10), size_t{1} << 16);
      for (int round = 0; round < 50; ++round) {
        // 256 bytes of this rank's number and the round, then an all-reduce that uses the same
        // slots: the allgather must neither see nor disturb it.
        std::vector<uint8_t> mine(256, static_cast<uint8_t>(rank * 16 + round % 16));
        std::vector<uint8_t> all(256 * static_cast<size_t>(size));
        shm.allgather(mine.data(), mine.size(), all.data());
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < 256; ++i) {
            if (all[static_cast<size_t>(r) * 256 + i] !=
                static_cast<uint8_t>(r * 16 + round % 16)) {
              return std::string("allgather: rank ") + std::to_string(r) + " wrong in round " +
                     std::to_string(round);
            }
          }
        }
        std::vector<int32_t> x(5000, rank + 1);
        shm.allreduce(x.data(), x.size(), DataType::kInt32, ReduceOp::kSum);
        if (x.front() != size * (size + 1) / 2 || x.back() != size * (size + 1) / 2) {
          return std::string("allreduce wrong in round ") + std::to_string(round);
        }
      }
      return std::string("ok");
    });
    for (const std::string &result : results) CHECK(result == "ok");
    CHECK_FALSE(segment_left(name));
  }
}

// The small calls' path (one barrier, two areas used in turn): back-to-back calls whose data
// change every round, so that a rank reading a place a peer already overwrote for the next call
// gets a wrong sum; small all-reduces, allgathers, allgathervs and reduce-scatters interleaved
// with large calls, as the engine makes them.
TEST_CASE("shm LocalAllreduce: small calls back to back, every round's data its own") {
  for (int size : {2, 3, 4}) {
    CAPTURE(size);
    const std::string name = unique_name();
    const auto results = run_ranks(size, [&](int rank, const std::vector<pid_t> &pids) {
      LocalAllreduce shm(name, rank, size, pids, std::chrono::seconds(20), size_t{1} << 16);
      const auto fail = [](const char *what, int round) {
        return std::string("FAIL: ") + what + " wrong in round " + std::to_string(round);
      };
      for (int round = 0; round < 3000; ++round) {
        // 1 to 8000 int32s (32000 bytes: the largest small call at 2 ranks).
        const size_t count = 1 + static_cast<size_t>(round * 7919) % 8000;
        std::vector<int32_t> x(count, rank * 1000 + round), y(count);
        const int32_t want = size * round + 1000 * size * (size - 1) / 2;
        shm.allreduce(x.data(), y.data(), count, DataType::kInt32, ReduceOp::kSum);
        if (y.front() != want || y.back() != want) return fail("allreduce", round);
        const int32_t gathered_mine = rank * 100000 + round;
        std::vector<int32_t> all(static_cast<size_t>(size));
        shm.allgather(&gathered_mine, sizeof gathered_mine, all.data());
        for (int r = 0; r < size; ++r) {
          if (all[static_cast<size_t>(r)] != r * 100000 + round) return fail("allgather", round);
        }
        // allgatherv: rank r gives (r + round) % 5 bytes (some none), each its rank and round.
        std::vector<size_t> lengths(static_cast<size_t>(size));
        size_t total = 0;
        for (int r = 0; r < size; ++r) total += lengths[r] = static_cast<size_t>(r + round) % 5;
        std::vector<uint8_t> given(lengths[rank], static_cast<uint8_t>(rank * 50 + round % 50));
        std::vector<uint8_t> got(total + 1, 0xee);
        shm.allgatherv(given.data(), got.data(), lengths);
        size_t at = 0;
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < lengths[r]; ++i) {
            if (got[at++] != static_cast<uint8_t>(r * 50 + round % 50)) {
              return fail("allgatherv", round);
            }
          }
        }
        if (got[total] != 0xee) return fail("allgatherv (wrote past the end)", round);
        if (round % 3 == 0) {
          std::vector<float> z(5, static_cast<float>(rank + round)), out(2);
          shm.reducescatter(z.data(), 5, 3, 2, out.data(), DataType::kFloat32, ReduceOp::kMax);
          if (out[0] != static_cast<float>(size - 1 + round)) return fail("reducescatter", round);
        }
        if (round % 500 == 0) {  // a large call between: its own slots, two barriers
          std::vector<int64_t> big(40000, rank + round);
          shm.allreduce(big.data(), big.size(), DataType::kInt64, ReduceOp::kMin);
          if (big.front() != round || big.back() != round) return fail("large allreduce", round);
        }
      }
      return std::string("ok");
    });
    for (const std::string &result : results) CHECK(result == "ok");
    CHECK_FALSE(segment_left(name));
  }
}

TEST_CASE("shm LocalAllreduce: a rank killed before a barrier ends the others' calls") {
  const std::string name = unique_name();
  const auto results = run_ranks(3, [&](int rank, const std::vector<pid_t> &pids) {
    LocalAllreduce local(name, rank, 3, pids, std::chrono::seconds(20));
    std::vector<float> data(1000, 1.0f);
    local.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
    if (rank == 1) raise(SIGKILL);
    const auto start = Clock::now();
    try {
      local.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kSum);
    } catch (const Error &e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      return std::to_string(static_cast<int>(e.code())) + " " + std::to_string(ms.count()) +
             " ms: " + e.what();
    }
    return std::string("FAIL: no error");
  });
  REQUIRE(results.size() == 3);
  CHECK(results[1] == "ended by signal 9");
  for (int rank : {0, 2}) {
    const std::string &result = results[static_cast<size_t>(rank)];
    CAPTURE(result);
    CHECK(result.rfind(std::to_string(static_cast<int>(Code::kCommunication)) + " ", 0) == 0);
    CHECK(result.find("local rank 1 (pid ") != std::string::npos);
    CHECK(result.find(") ended during a shared-memory all-reduce") != std::string::npos);
    const long ms = std::stol(result.substr(result.find(' ') + 1));
    CHECK(ms < 1000);
  }
  CHECK_FALSE(segment_left(name));
}

TEST_CASE("shm LocalAllreduce: a rank that never maps the segment fails setup, nothing left") {
  const std::string name = unique_name();
  const auto results = run_ranks(2, [&](int rank, const std::vector<pid_t> &pids) {
    if (rank == 1) raise(SIGKILL);
    LocalAllreduce local(name, rank, 2, pids, std::chrono::seconds(20));
    return std::string("FAIL: no error");
  });
  CHECK(results[0].find("local rank 1 (pid ") != std::string::npos);
  CHECK(results[0].find(") ended while setting up") != std::string::npos);
  CHECK_FALSE(segment_left(name));
}

TEST_CASE("shm LocalAllreduce: a rank that does not call times out, naming it") {
  const std::string name = unique_name();
  const auto results = run_ranks(2, [&](int rank, const std::vector<pid_t> &pids) {
    LocalAllreduce local(name, rank, 2, pids, std::chrono::milliseconds(300));
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      return std::string("late");
    }
    std::vector<int32_t> data(10, 1);
    local.allreduce(data.data(), data.size(), DataType::kInt32, ReduceOp::kSum);
    return std::string("FAIL: no error");
  });
  CAPTURE(results[0]);
  CHECK(results[0].rfind("error " + std::to_string(static_cast<int>(Code::kTimeout)) + " ", 0) ==
        0);
  CHECK(results[0].find("waited 300 ms during a shared-memory all-reduce") != std::string::npos);
  CHECK(results[0].find("for local ranks 1 (pid ") != std::string::npos);
  CHECK(results[1] == "late");
}

TEST_CASE("shm LocalAllreduce: bad arguments, and one rank needs no segment") {
  const std::vector<pid_t> one{getpid()};
  const auto code_of = [](auto &&make_it) {
    try {
      make_it();
    } catch (const Error &e) {
      return e.code();
    }
    return Code::kInternal;
  };
  const auto ms = std::chrono::milliseconds(100);
  for (const char *bad : {"", "perseus-test-0123456789abcdef", "/short", "/perseus/test-0123456789",
                          "/perseus test 0123456789"}) {
    CAPTURE(bad);
    CHECK(code_of([&] { LocalAllreduce l(bad, 0, 1, one, ms); }) == Code::kInvalidArgument);
  }
  const std::string name = unique_name();
  CHECK(code_of([&] { LocalAllreduce l(name, 1, 1, one, ms); }) == Code::kInvalidArgument);
  CHECK(code_of([&] { LocalAllreduce l(name, 0, 2, one, ms); }) == Code::kInvalidArgument);
  CHECK(code_of([&] { LocalAllreduce l(name, 0, 1, one, std::chrono::milliseconds(0)); }) ==
        Code::kInvalidArgument);

  LocalAllreduce alone(name, 0, 1, one, ms);
  std::vector<float> data{1.5f, -2.0f};
  alone.allreduce(data.data(), data.size(), DataType::kFloat32, ReduceOp::kAverage);
  CHECK(data == std::vector<float>{1.5f, -2.0f});
  CHECK_FALSE(segment_left(name));
}

}  // namespace
}  // namespace perseus::comm::shm
