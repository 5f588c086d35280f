// lib/comm/nccl/hierarchy: the layout chosen from where the ranks are, and the hierarchical
// all-reduce run for real by one thread per rank over a fake NCCL that moves host memory (each
// collective completes when every member of its communicator has called it), so every scheme's
// result is checked against the plain reduction for many layouts, counts, ops and types.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/nccl/communicator.h"
#include "lib/comm/nccl/hierarchy.h"
#include "tests/unit/fake_cuda.h"

namespace perseus::comm::nccl {
namespace {

// ---- A fake NCCL in host memory: C function pointers, so its state is global. ----

enum class Kind { kAllReduce, kReduce, kBroadcast, kReduceScatter, kAllGather };

struct Call {
  Kind kind;
  const void *send;
  void *recv;
  size_t count;
  NcclDataType type;
  NcclRedOp op;
  int root;
};

struct Group {
  explicit Group(int n) : size(n), calls(static_cast<size_t>(n)) {}
  const int size;
  std::mutex mutex;
  std::condition_variable done;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<Call> calls;
};

struct FakeComm {
  std::shared_ptr<Group> group;
  int rank;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<Group>> groups;  // by unique id
  int next_id = 0;
  std::map<std::pair<Kind, int>, int> calls;  // (kind, communicator size) -> calls by rank 0s
};
Registry registry;

template <typename T>
T combine(T a, T b, NcclRedOp op) {
  switch (op) {
    case kNcclProd:
      return a * b;
    case kNcclMax:
      return std::max(a, b);
    case kNcclMin:
      return std::min(a, b);
    default:
      return a + b;  // sum, and avg before its division
  }
}

// The reduction of every member's send at `offset` elements, as NCCL defines it.
template <typename T>
std::vector<T> reduced(const std::vector<Call> &calls, size_t offset, size_t count) {
  const Call &first = calls[0];
  std::vector<T> out(static_cast<const T *>(first.send) + offset,
                     static_cast<const T *>(first.send) + offset + count);
  for (size_t r = 1; r < calls.size(); ++r) {
    const T *in = static_cast<const T *>(calls[r].send) + offset;
    for (size_t i = 0; i < count; ++i) out[i] = combine(out[i], in[i], first.op);
  }
  if (first.op == kNcclAvg) {
    for (T &v : out) v = static_cast<T>(v / static_cast<T>(calls.size()));
  }
  return out;
}

template <typename T>
void store(void *to, const std::vector<T> &values) {
  std::memcpy(to, values.data(), values.size() * sizeof(T));
}

// Runs the collective once every member has posted its call (on the last one's thread, so
// in-place calls read every input before anything is written).
template <typename T>
void execute(std::vector<Call> &calls) {
  const Call &c = calls[0];
  const size_t n = calls.size();
  switch (c.kind) {
    case Kind::kAllReduce: {
      const auto out = reduced<T>(calls, 0, c.count);
      for (Call &each : calls) store(each.recv, out);
      break;
    }
    case Kind::kReduce:
      store(calls[static_cast<size_t>(c.root)].recv, reduced<T>(calls, 0, c.count));
      break;
    case Kind::kBroadcast: {
      const T *from = static_cast<const T *>(calls[static_cast<size_t>(c.root)].send);
      const std::vector<T> out(from, from + c.count);
      for (Call &each : calls) store(each.recv, out);
      break;
    }
    case Kind::kReduceScatter: {
      std::vector<std::vector<T>> blocks;
      for (size_t r = 0; r < n; ++r) blocks.push_back(reduced<T>(calls, r * c.count, c.count));
      for (size_t r = 0; r < n; ++r) store(calls[r].recv, blocks[r]);
      break;
    }
    case Kind::kAllGather: {
      std::vector<T> out;
      for (const Call &each : calls) {
        const T *from = static_cast<const T *>(each.send);
        out.insert(out.end(), from, from + c.count);
      }
      for (Call &each : calls) store(each.recv, out);
      break;
    }
  }
}

NcclResult collective(NcclComm handle, const Call &call) {
  auto *comm = reinterpret_cast<FakeComm *>(handle);
  Group &g = *comm->group;
  std::unique_lock lock(g.mutex);
  g.calls[static_cast<size_t>(comm->rank)] = call;
  if (++g.arrived < g.size) {
    const uint64_t generation = g.generation;
    g.done.wait(lock, [&] { return g.generation != generation; });
    return kNcclSuccess;
  }
  for (const Call &c : g.calls) {
    if (c.kind != call.kind || c.count != call.count || c.type != call.type || c.op != call.op ||
        c.root != call.root) {
      return kNcclInvalidUsage;  // the ranks disagree: a bug in the caller
    }
  }
  if (call.type == kNcclInt32) {
    execute<int32_t>(g.calls);
  } else {
    execute<float>(g.calls);
  }
  {
    std::lock_guard count_lock(registry.mutex);
    ++registry.calls[{call.kind, g.size}];
  }
  g.arrived = 0;
  ++g.generation;
  g.done.notify_all();
  return kNcclSuccess;
}

NcclApi fake_nccl() {
  NcclApi api;
  api.get_unique_id = [](NcclUniqueId *id) {
    std::lock_guard lock(registry.mutex);
    std::memset(id->internal, 0, sizeof id->internal);
    const std::string text = "fake-" + std::to_string(registry.next_id++);
    std::memcpy(id->internal, text.data(), text.size());
    return kNcclSuccess;
  };
  api.comm_init_rank_config = [](NcclComm *comm, int size, NcclUniqueId id, int rank,
                                 NcclConfig *) {
    std::lock_guard lock(registry.mutex);
    auto &group = registry.groups[std::string(id.internal, sizeof id.internal)];
    if (!group) group = std::make_shared<Group>(size);
    if (group->size != size || rank < 0 || rank >= size) return kNcclInvalidArgument;
    *comm = reinterpret_cast<NcclComm>(new FakeComm{group, rank});
    return kNcclSuccess;
  };
  api.comm_get_async_error = [](NcclComm, NcclResult *state) {
    *state = kNcclSuccess;
    return kNcclSuccess;
  };
  api.comm_abort = [](NcclComm comm) {
    delete reinterpret_cast<FakeComm *>(comm);
    return kNcclSuccess;
  };
  api.comm_finalize = [](NcclComm) { return kNcclSuccess; };
  api.comm_destroy = [](NcclComm comm) {
    delete reinterpret_cast<FakeComm *>(comm);
    return kNcclSuccess;
  };
  api.all_reduce = [](const void *send, void *recv, size_t count, NcclDataType type, NcclRedOp op,
                      NcclComm comm, CudaStream) {
    return collective(comm, {Kind::kAllReduce, send, recv, count, type, op, 0});
  };
  api.reduce = [](const void *send, void *recv, size_t count, NcclDataType type, NcclRedOp op,
                  int root, NcclComm comm, CudaStream) {
    return collective(comm, {Kind::kReduce, send, recv, count, type, op, root});
  };
  api.broadcast = [](const void *send, void *recv, size_t count, NcclDataType type, int root,
                     NcclComm comm, CudaStream) {
    return collective(comm, {Kind::kBroadcast, send, recv, count, type, -1, root});
  };
  api.reduce_scatter = [](const void *send, void *recv, size_t count, NcclDataType type,
                          NcclRedOp op, NcclComm comm, CudaStream) {
    return collective(comm, {Kind::kReduceScatter, send, recv, count, type, op, 0});
  };
  api.all_gather = [](const void *send, void *recv, size_t count, NcclDataType type, NcclComm comm,
                      CudaStream) {
    return collective(comm, {Kind::kAllGather, send, recv, count, type, -1, 0});
  };
  api.get_error_string = [](NcclResult) { return "fake NCCL error"; };
  api.get_last_error = [](NcclComm) { return ""; };
  return api;
}

const CudaApi kCuda = testing::fake_cuda<1>();
const NcclApi kNccl = fake_nccl();

// The job's store, as the engine's exchange of unique ids uses it.
class Store {
 public:
  std::string exchange(const std::string &key, const std::string &mine) {
    std::unique_lock lock(mutex_);
    if (!mine.empty()) {
      values_[key] = mine;
      set_.notify_all();
      return mine;
    }
    set_.wait(lock, [&] { return values_.count(key) > 0; });
    return values_[key];
  }

 private:
  std::mutex mutex_;
  std::condition_variable set_;
  std::map<std::string, std::string> values_;
};

// Rank r's element i: small integers, so sums and products are exact in float too.
int value(int rank, size_t i) { return static_cast<int>((rank * 7 + i * 3) % 11) - 5; }

template <typename T>
T expected(int size, size_t i, ReduceOp op) {
  T out = static_cast<T>(value(0, i));
  for (int r = 1; r < size; ++r) {
    const T v = static_cast<T>(value(r, i));
    switch (op) {
      case ReduceOp::kProduct:
        out *= v;
        break;
      case ReduceOp::kMax:
        out = std::max(out, v);
        break;
      case ReduceOp::kMin:
        out = std::min(out, v);
        break;
      default:
        out += v;
    }
  }
  if (op == ReduceOp::kAverage) out = static_cast<T>(out / static_cast<T>(size));
  return out;
}

struct Mismatch {
  std::string what;
};

// One rank's part: the communicators the device executor makes for one lane, then every case.
template <typename T>
void run_rank(const std::vector<std::string> &hosts, int rank, DataType type, Store &store,
              std::vector<Mismatch> &mismatches, std::mutex &mismatches_mutex) {
  const int size = static_cast<int>(hosts.size());
  const HostLayout layout = plan_hierarchy(hosts, rank);
  const auto deadline = Communicator::Clock::now() + std::chrono::seconds(30);
  const auto join = [&](const std::string &which, int member, int members) {
    return std::make_unique<Communicator>(
        kCuda, kNccl, member, members, 0,
        [&store, which](const std::string &mine) { return store.exchange(which, mine); }, deadline);
  };
  auto flat = join("0", rank, size);
  std::unique_ptr<Communicator> local, cross;
  if (layout.scheme != Scheme::kFlat) {
    local =
        join("0/host/" + std::to_string(layout.host_index), layout.local_rank, layout.local_size);
    if (layout.in_cross) {
      cross = join("0/cross/" + std::to_string(layout.local_rank), layout.cross_rank,
                   layout.cross_size);
    }
  }
  const auto tolerance = std::is_floating_point_v<T> ? 1e-5 : 0.0;
  for (size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{5}, size_t{1003}}) {
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (bool in_place : {false, true}) {
        std::vector<T> send(count), recv(count, static_cast<T>(99));
        for (size_t i = 0; i < count; ++i) send[i] = static_cast<T>(value(rank, i));
        void *out = in_place ? static_cast<void *>(send.data()) : recv.data();
        hierarchical_allreduce(layout, *flat, local.get(), cross.get(), send.data(), out, count,
                               type, op, nullptr);
        const T *got = static_cast<const T *>(out);
        for (size_t i = 0; i < count; ++i) {
          const T want = expected<T>(size, i, op);
          if (std::abs(static_cast<double>(got[i]) - static_cast<double>(want)) > tolerance) {
            std::lock_guard lock(mismatches_mutex);
            mismatches.push_back({"rank " + std::to_string(rank) + " count " +
                                  std::to_string(count) + " " + name_of(op) +
                                  (in_place ? " in place" : " out of place") + " element " +
                                  std::to_string(i) + ": " + std::to_string(got[i]) +
                                  ", expected " + std::to_string(want)});
            break;
          }
        }
      }
    }
  }
}

// Runs every case on every rank of `hosts`, one thread each; returns the mismatches.
std::vector<Mismatch> run_job(const std::vector<std::string> &hosts, DataType type) {
  {
    std::lock_guard lock(registry.mutex);
    registry.groups.clear();
    registry.calls.clear();
  }
  Store store;
  std::vector<Mismatch> mismatches;
  std::mutex mismatches_mutex;
  std::vector<std::thread> ranks;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    ranks.emplace_back([&, r] {
      try {
        if (type == DataType::kInt32) {
          run_rank<int32_t>(hosts, r, type, store, mismatches, mismatches_mutex);
        } else {
          run_rank<float>(hosts, r, type, store, mismatches, mismatches_mutex);
        }
      } catch (const std::exception &error) {
        std::lock_guard lock(mismatches_mutex);
        mismatches.push_back({"rank " + std::to_string(r) + " threw: " + error.what()});
      }
    });
  }
  for (std::thread &t : ranks) t.join();
  return mismatches;
}

int calls_of(Kind kind, int comm_size) {
  std::lock_guard lock(registry.mutex);
  const auto it = registry.calls.find({kind, comm_size});
  return it == registry.calls.end() ? 0 : it->second;
}

std::vector<std::string> hosts_of(const std::string &letters) {
  std::vector<std::string> hosts;
  for (char c : letters) hosts.emplace_back(1, c);
  return hosts;
}

TEST_CASE("the layout: one scheme per job shape, the same on every rank") {
  const HostLayout one = plan_hierarchy(hosts_of("aaaa"), 2);
  CHECK(one.scheme == Scheme::kFlat);
  CHECK(one.hosts == 1);
  CHECK(plan_hierarchy(hosts_of("abc"), 1).scheme == Scheme::kFlat);  // one rank per host

  // Ranks interleaved over two hosts: local ranks count in rank order within each host.
  const HostLayout even = plan_hierarchy(hosts_of("abab"), 3);
  CHECK(even.scheme == Scheme::kScatterGather);
  CHECK(even.hosts == 2);
  CHECK(even.host_index == 1);
  CHECK(even.local_rank == 1);
  CHECK(even.local_size == 2);
  CHECK(even.in_cross);
  CHECK(even.cross_rank == 1);
  CHECK(even.cross_size == 2);
  CHECK(even.describe() ==
        "2 hosts x 2 ranks: reduce-scatter in each host, all-reduce across hosts, all-gather");

  const std::vector<std::string> uneven = hosts_of("aaabcc");
  for (int r = 0; r < 6; ++r) {
    const HostLayout layout = plan_hierarchy(uneven, r);
    CHECK(layout.scheme == Scheme::kReduceBroadcast);
    CHECK(layout.hosts == 3);
    CHECK(layout.in_cross == (r == 0 || r == 3 || r == 4));  // each host's first rank
  }
  CHECK(plan_hierarchy(uneven, 4).cross_rank == 2);
  CHECK(plan_hierarchy(uneven, 5).local_rank == 1);
}

TEST_CASE("hierarchical all-reduce equals the flat reduction for every layout, count and op") {
  for (const char *layout : {"aabb", "aaabbb", "abab", "aaab", "abbccc", "aaaa", "abc"}) {
    for (DataType type : {DataType::kFloat32, DataType::kInt32}) {
      const std::string shape = layout;
      const std::string dtype = name_of(type);
      CAPTURE(shape);
      CAPTURE(dtype);
      const auto mismatches = run_job(hosts_of(layout), type);
      for (const Mismatch &m : mismatches) FAIL_CHECK(m.what);
      CHECK(mismatches.empty());
    }
  }
}

TEST_CASE("the schemes use the host and cross-host communicators, not only the flat one") {
  // 2 hosts x 3 ranks: reduce-scatter and all-gather among 3, all-reduce among 2; the flat
  // communicator (6) carries only the elements past the last multiple of 3.
  REQUIRE(run_job(hosts_of("aaabbb"), DataType::kFloat32).empty());
  CHECK(calls_of(Kind::kReduceScatter, 3) > 0);
  CHECK(calls_of(Kind::kAllGather, 3) == calls_of(Kind::kReduceScatter, 3));
  // Three cross-host communicators (one per local rank) and two host ones.
  CHECK(2 * calls_of(Kind::kAllReduce, 2) == 3 * calls_of(Kind::kReduceScatter, 3));
  CHECK(calls_of(Kind::kReduce, 3) == 0);

  // Uneven hosts: reduce and broadcast inside hosts of 3 and 1, all-reduce among 2 first ranks;
  // averages alone go flat (4 ranks).
  REQUIRE(run_job(hosts_of("aaab"), DataType::kInt32).empty());
  CHECK(calls_of(Kind::kReduce, 3) > 0);
  CHECK(calls_of(Kind::kBroadcast, 3) == calls_of(Kind::kReduce, 3));
  CHECK(calls_of(Kind::kAllReduce, 2) == calls_of(Kind::kReduce, 3));
  CHECK(calls_of(Kind::kReduceScatter, 3) == 0);
  CHECK(calls_of(Kind::kAllReduce, 4) > 0);  // the averages

  // One host: only the flat communicator.
  REQUIRE(run_job(hosts_of("aaa"), DataType::kFloat32).empty());
  CHECK(calls_of(Kind::kReduce, 3) == 0);
  CHECK(calls_of(Kind::kReduceScatter, 3) == 0);
  CHECK(calls_of(Kind::kAllReduce, 3) > 0);
}

}  // namespace
}  // namespace perseus::comm::nccl
