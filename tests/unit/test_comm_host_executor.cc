// lib/comm/host_executor and the Gloo backend's reduce-scatter: ranks are threads of this
// process, each with its own real Gloo backend connected over loopback TCP through an
// in-process store; a recording fake backend shows which backend call each executor call makes.
// Threads never use doctest's macros: each returns "ok" or what went wrong, checked after join.

#include "lib/comm/host_executor.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/gloo/backend.h"
#include "lib/comm/half_float.h"
#include "lib/comm/job_environment.h"
#include "lib/comm/reduction.h"
#include "lib/comm/shm/local_allreduce.h"
#include "lib/comm/types.h"
#include "tests/unit/comm_element_types.h"

namespace perseus::comm {
namespace {

// Gloo's store as the ranks see it. A patient one waits for keys as long as RendezvousStore does
// (not Gloo's connection timeout); a stalling one lets its rank publish its host name and address
// and then holds its first wait for a peer's address until released: a process that published and
// went away (in an elastic job, to the next world) without ever connecting.
class TestStore : public ::gloo::rendezvous::Store {
 public:
  TestStore(::gloo::rendezvous::Store &inner, bool stall) : inner_(inner), stall_(stall) {}
  void set(const std::string &key, const std::vector<char> &data) override {
    inner_.set(key, data);
    std::lock_guard lock(mutex_);
    last_set_ = std::chrono::steady_clock::now();
  }
  std::vector<char> get(const std::string &key) override { return inner_.get(key); }
  void wait(const std::vector<std::string> &keys) override { wait(keys, std::chrono::seconds(30)); }
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override {
    if (stall_) {
      std::unique_lock lock(mutex_);
      released_signal_.wait_for(lock, std::chrono::seconds(30), [this] { return released_; });
      throw std::runtime_error("released");
    }
    inner_.wait(keys, std::chrono::seconds(30));
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    released_signal_.notify_all();
  }
  // When this store's rank last published a key (its address, for the stalling one).
  std::chrono::steady_clock::time_point last_set() {
    std::lock_guard lock(mutex_);
    return last_set_;
  }

 private:
  ::gloo::rendezvous::Store &inner_;
  const bool stall_;
  std::mutex mutex_;
  std::condition_variable released_signal_;
  bool released_ = false;
  std::chrono::steady_clock::time_point last_set_{};
};

using Body = std::function<std::string(int rank, int size, HostExecutor &host)>;

// Runs body on `size` ranks, each a thread with a HostExecutor over a real Gloo backend.
std::vector<std::string> run_ranks(int size, const Body &body) {
  ::gloo::rendezvous::HashStore shared;
  TestStore store(shared, false);
  std::vector<std::string> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      std::string &result = results[static_cast<size_t>(rank)];
      try {
        JobEnvironment job;
        job.rank = rank;
        job.size = size;
        job.init_timeout = std::chrono::seconds(30);
        job.collective_timeout = std::chrono::seconds(30);
        auto backend = std::make_unique<gloo::Backend>(job, store, "127.0.0.1");
        HostExecutor host(rank, std::move(backend), nullptr, nullptr);
        result = body(rank, size, host);
      } catch (const std::exception &e) {
        result = std::string("FAIL: exception ") + e.what();
      }
    });
  }
  for (auto &t : threads) t.join();
  return results;
}

// Small integers, exact in every type under sum and max; unsigned types get no negatives.
int64_t value(DataType type, int rank, size_t i) {
  const auto v = static_cast<int64_t>((i * 7 + static_cast<size_t>(rank) * 3) % 11);
  return type == DataType::kUint8 ? v : v - 5;
}

int64_t reduced(DataType type, ReduceOp op, int size, size_t i) {
  int64_t r = value(type, 0, i);
  for (int peer = 1; peer < size; ++peer) {
    const int64_t v = value(type, peer, i);
    r = op == ReduceOp::kMax ? std::max(r, v) : r + v;
  }
  return r;
}

// One reduce-scatter with blocks of `cuts` (one per rank) of `type` and `op`; "" when right.
std::string check_scatter(HostExecutor &host, int rank, int size, DataType type, ReduceOp op,
                          const std::vector<size_t> &cuts, HostExecutor::Scaling scaling) {
  std::string verdict;
  with_type(type, [&]<typename T>(T) {
    size_t total = 0;
    size_t first = 0;
    for (int r = 0; r < size; ++r) {
      if (r == rank) first = total;
      total += cuts[static_cast<size_t>(r)];
    }
    const size_t mine = cuts[static_cast<size_t>(rank)];
    std::vector<T> send(total);
    for (size_t i = 0; i < total; ++i) send[i] = from_integer<T>(value(type, rank, i));
    const std::vector<T> sent = send;
    std::vector<T> recv(mine + 1, from_integer<T>(99));
    // One count per member: the first `size` of the cuts.
    const std::vector<size_t> counts(cuts.begin(), cuts.begin() + size);
    host.reducescatter(0, send.data(), mine ? recv.data() : nullptr, counts, rank, type, op,
                       scaling);
    std::vector<T> expected(mine);
    for (size_t i = 0; i < mine; ++i)
      expected[i] = from_integer<T>(reduced(type, op, size, first + i));
    const double factor = scaling.prescale * scaling.postscale;
    if (op == ReduceOp::kAverage) divide_elements(expected.data(), mine, type, size);
    if (mine) scale_elements(expected.data(), mine, type, factor);
    for (size_t i = 0; i < mine; ++i) {
      if (std::memcmp(&recv[i], &expected[i], sizeof(T)) == 0) continue;
      verdict = std::string("FAIL: ") + name_of(type) + " " + name_of(op) + ": rank " +
                std::to_string(rank) + "'s element " + std::to_string(i) + " of " +
                std::to_string(mine) + " differs";
      return;
    }
    const T guard = from_integer<T>(99);
    if (std::memcmp(&recv[mine], &guard, sizeof(T)) != 0) verdict = "FAIL: wrote past the block";
    if (total > 0 && std::memcmp(send.data(), sent.data(), total * sizeof(T)) != 0) {
      verdict = "FAIL: the send buffer changed";
    }
  });
  return verdict;
}

// A backend that records which collective each call made.
class RecordingBackend : public transport::Backend {
 public:
  explicit RecordingBackend(std::vector<std::string> &calls) : calls_(calls) {}
  void allreduce(const void *send, void *recv, size_t count, DataType type, ReduceOp) override {
    if (send != recv) std::memcpy(recv, send, count * element_size(type));
    calls_.push_back("allreduce " + std::to_string(count));
  }
  void broadcast(void *, size_t count, DataType, int root) override {
    calls_.push_back("broadcast " + std::to_string(count) + " from " + std::to_string(root));
  }
  void allgather(const void *, void *, size_t, DataType) override { calls_.push_back("allgather"); }
  void barrier() override { calls_.push_back("barrier"); }
  void allgatherv(const void *, void *, const std::vector<size_t> &) override {
    calls_.push_back("allgatherv");
  }
  void alltoallv(const void *, const std::vector<size_t> &, void *,
                 const std::vector<size_t> &) override {
    calls_.push_back("alltoallv");
  }
  void reducescatter(const void *send, void *recv, const std::vector<size_t> &counts, DataType type,
                     ReduceOp) override {
    // As rank 1 of two: its block is the second.
    std::memcpy(recv, static_cast<const uint8_t *>(send) + counts[0] * element_size(type),
                counts[1] * element_size(type));
    calls_.push_back("reducescatter " + std::to_string(counts[0]) + "," +
                     std::to_string(counts[1]));
  }

 private:
  std::vector<std::string> &calls_;
};

}  // namespace

TEST_CASE("Gloo reduce-scatter: blocks of any size, empty ones too, every type, 2 to 4 ranks") {
  const std::vector<std::vector<size_t>> cuts = {
      {1, 0, 2, 5}, {0, 0, 0, 0}, {3, 1, 0, 0}, {1001, 7, 4093, 1}, {0, 65537, 3, 0}};
  for (int size : {2, 3, 4}) {
    CAPTURE(size);
    const auto results = run_ranks(size, [&](int rank, int n, HostExecutor &host) {
      for (DataType type : kAllTypes) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
          for (const auto &cut : cuts) {
            std::string verdict = check_scatter(host, rank, n, type, op, cut, {});
            if (!verdict.empty()) return verdict;
          }
        }
      }
      return std::string("ok");
    });
    for (const std::string &result : results) CHECK(result == "ok");
  }
}

TEST_CASE("Gloo reduce-scatter: average, prescale and postscale, and recv inside send") {
  const auto results = run_ranks(3, [](int rank, int n, HostExecutor &host) {
    for (DataType type : {DataType::kFloat32, DataType::kFloat64, DataType::kBfloat16}) {
      std::string verdict = check_scatter(host, rank, n, type, ReduceOp::kAverage, {5, 3, 8}, {});
      if (verdict.empty()) {
        verdict = check_scatter(host, rank, n, type, ReduceOp::kSum, {5, 3, 8}, {0.5, 4.0});
      }
      if (!verdict.empty()) return verdict;
    }
    // recv is the start of send (a caller reusing its input): the result is still exact.
    std::vector<double> data(9);
    for (size_t i = 0; i < data.size(); ++i)
      data[i] = static_cast<double>(value(DataType::kFloat64, rank, i));
    host.reducescatter(0, data.data(), data.data(), {3, 3, 3}, rank, DataType::kFloat64,
                       ReduceOp::kSum, {});
    for (size_t i = 0; i < 3; ++i) {
      const auto want = static_cast<double>(
          reduced(DataType::kFloat64, ReduceOp::kSum, n, static_cast<size_t>(rank) * 3 + i));
      if (data[i] != want) return "FAIL: in place, element " + std::to_string(i);
    }
    return std::string("ok");
  });
  for (const std::string &result : results) CHECK(result == "ok");
}

TEST_CASE("Gloo host executor: a fused all-reduce with a joined rank's zeros and empty pieces") {
  const auto results = run_ranks(3, [](int rank, int n, HostExecutor &host) {
    std::vector<float> a(5), b(1000), c(3);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(rank + 1);
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<float>(i % 13 + static_cast<size_t>(rank));
    for (size_t i = 0; i < c.size(); ++i) c[i] = 1.0f;
    std::vector<HostExecutor::Piece> pieces = {
        {a.data(), a.data(), a.size()}, {nullptr, nullptr, 0}, {b.data(), b.data(), b.size()}};
    // Rank 2 has joined for the third tensor: it adds zeros and gets nothing.
    pieces.push_back(rank == 2 ? HostExecutor::Piece{nullptr, nullptr, c.size()}
                               : HostExecutor::Piece{c.data(), c.data(), c.size()});
    const auto times = host.allreduce(0, pieces, DataType::kFloat32, ReduceOp::kSum, {});
    if (!times.fused || std::string(times.by) != "GLOO_ALLREDUCE") return std::string("FAIL: by");
    for (float v : a) {
      if (v != 6.0f) return "FAIL: a = " + std::to_string(v);
    }
    for (size_t i = 0; i < b.size(); ++i) {
      if (b[i] != 3.0f * static_cast<float>(i % 13) + static_cast<float>(0 + 1 + 2)) {
        return "FAIL: b[" + std::to_string(i) + "]";
      }
    }
    if (rank != 2 && c[0] != 2.0f) return "FAIL: c = " + std::to_string(c[0]);
    (void)n;
    return std::string("ok");
  });
  for (const std::string &result : results) CHECK(result == "ok");
}

TEST_CASE("host executor: reduce-scatter is the backend's reduce-scatter, not an all-reduce") {
  std::vector<std::string> calls;
  HostExecutor host(1, std::make_unique<RecordingBackend>(calls), nullptr, nullptr);
  std::vector<float> send = {1, 2, 3, 4, 5};
  std::vector<float> recv(3, 0);
  host.reducescatter(0, send.data(), recv.data(), {2, 3}, 1, DataType::kFloat32, ReduceOp::kSum,
                     {2.0, 10.0});
  CHECK(calls == std::vector<std::string>{"reducescatter 2,3"});
  // prescale on a copy (the caller's input is untouched), postscale on this rank's block.
  CHECK(send == std::vector<float>{1, 2, 3, 4, 5});
  CHECK(recv == std::vector<float>{60, 80, 100});
  // Nothing at all to reduce: no call.
  calls.clear();
  host.reducescatter(0, nullptr, nullptr, {0, 0}, 1, DataType::kFloat32, ReduceOp::kSum, {});
  CHECK(calls.empty());
}

TEST_CASE("host executor: process sets get their own connection, a set of one needs none") {
  std::vector<std::string> world_calls;
  std::vector<std::string> set_calls;
  std::vector<std::string> connected;
  HostExecutor host(2, std::make_unique<RecordingBackend>(world_calls), nullptr,
                    [&](int set, int rank_in_set, int set_size) {
                      connected.push_back(std::to_string(set) + ": " + std::to_string(rank_in_set) +
                                          " of " + std::to_string(set_size));
                      return std::make_unique<RecordingBackend>(set_calls);
                    });
  host.add_set(1, {0, 2, 3});  // member, index 1
  host.add_set(2, {0, 1});     // not a member
  host.add_set(3, {2});        // alone
  CHECK(connected == std::vector<std::string>{"1: 1 of 3"});
  int value = 7;
  host.broadcast(1, &value, sizeof value, 0);
  CHECK(set_calls == std::vector<std::string>{"broadcast 4 from 0"});
  CHECK(world_calls.empty());
  // The set of one: an all-reduce is its own input, through no connection.
  std::vector<float> data = {1.5f, 2.5f};
  host.allreduce(3, {{data.data(), data.data(), 2}}, DataType::kFloat32, ReduceOp::kSum, {});
  CHECK(data == std::vector<float>{1.5f, 2.5f});
  CHECK(set_calls.size() == 1);
  CHECK(world_calls.empty());
  CHECK_THROWS_AS(host.broadcast(2, &value, sizeof value, 0), Error);
  host.close();
  CHECK_THROWS_AS(host.broadcast(1, &value, sizeof value, 0), Error);
}

TEST_CASE(
    "Gloo backend: a peer that published its address and never connects costs at most the "
    "init timeout, not Gloo's five times its timeout") {
  CHECK(gloo::connect_timeout(JobEnvironment{}) == std::chrono::seconds(12));  // 60 s / 5
  JobEnvironment elastic;
  elastic.elastic_world = 3;
  CHECK(gloo::connect_timeout(elastic) == std::chrono::seconds(2));  // 10 s at most, / 5
  elastic.init_timeout = std::chrono::seconds(5);
  CHECK(gloo::connect_timeout(elastic) == std::chrono::seconds(1));
  // Which side of a pair listens follows the ports the kernel gives, so each trial is one of two
  // cases: rank 0 connects to the stalled rank's listening socket (its device accepts: a quick
  // success), or rank 0 listens for a connection that never comes, which must end within the
  // limit (1 s here; Gloo alone would wait 5 s). Six trials: both cases all but surely come up.
  for (int trial = 0; trial < 6; ++trial) {
    ::gloo::rendezvous::HashStore shared;
    TestStore patient(shared, false);
    TestStore stalling(shared, true);
    std::thread peer([&] {
      JobEnvironment job;
      job.rank = 1;
      job.size = 2;
      try {
        gloo::Backend backend(job, stalling, "127.0.0.1");
      } catch (const std::exception &) {  // released: the expected end
      }
    });
    JobEnvironment job;
    job.rank = 0;
    job.size = 2;
    job.init_timeout = std::chrono::seconds(1);
    const auto started = std::chrono::steady_clock::now();
    std::string outcome = "connected";
    try {
      gloo::Backend backend(job, patient, "127.0.0.1");
    } catch (const Error &error) {
      outcome = error.what();
    }
    // From when both had published (a slow start of the peer's thread is not the wait bounded).
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                      std::max(started, stalling.last_set()))
                            .count();
    stalling.release();
    peer.join();
    INFO("trial " << trial << ": " << outcome);
    CHECK(took < 3.0);
    if (outcome != "connected") CHECK(outcome.find("rank 0 connecting") != std::string::npos);
  }
}

}  // namespace perseus::comm
