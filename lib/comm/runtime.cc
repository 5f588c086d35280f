#include "lib/comm/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/gloo/backend.h"
#include "lib/comm/local_address.h"
#include "lib/comm/nccl/cuda_api.h"
#include "lib/comm/nccl/device_executor.h"
#include "lib/comm/nccl/nccl_api.h"
#include "lib/comm/op_traits.h"
#include "lib/comm/rendezvous_store.h"
#include "lib/comm/shm/local_allreduce.h"
#include "lib/comm/solo/backend.h"
#include "lib/rendezvous/client.h"
#include "lib/rendezvous/job_contract.h"
#include "lib/rendezvous/wire.h"

namespace perseus::comm {

namespace {

std::string seconds_of(std::chrono::milliseconds timeout) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
}

rendezvous::Secret read_secret(const JobEnvironment &job) {
  try {
    return rendezvous::Client::read_secret_file(job.secret_file);
  } catch (const rendezvous::WireError &error) {
    throw Error(Code::kRendezvous, "rank " + std::to_string(job.rank) +
                                       " could not read the job's secret: " + error.what() +
                                       " (perseusrun writes it and removes it when the job ends)");
  }
}

std::unique_ptr<rendezvous::Client> open_store(const JobEnvironment &job,
                                               const std::optional<rendezvous::Secret> &given) {
  const auto secret = given ? *given : read_secret(job);
  try {
    return std::make_unique<rendezvous::Client>(job.rendezvous_addr, job.rendezvous_port, secret,
                                                job.init_timeout);
  } catch (const rendezvous::WireError &error) {
    throw Error(Code::kRendezvous,
                "rank " + std::to_string(job.rank) + " could not join the job's rendezvous " +
                    "store within " + seconds_of(job.init_timeout) + " s: " + error.what() +
                    " (is perseusrun still running? PERSEUS_INIT_TIMEOUT sets the limit)");
  }
}

// Gloo writes to its sockets with writev, which cannot say MSG_NOSIGNAL: a write to a peer that
// just died raises SIGPIPE, whose default action kills this rank silently before Gloo can
// report the lost peer. So SIGPIPE is ignored (as Python does at start-up), unless the program
// has its own handler; the write then fails with EPIPE, which Gloo reports.
void ignore_sigpipe() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

Error invalid(const std::string &message) { return Error(Code::kInvalidArgument, message); }

void require_buffer(const void *pointer, const char *argument, size_t count) {
  if (!pointer) {
    throw invalid(std::string(argument) + " is NULL while count is " + std::to_string(count) +
                  " (NULL is allowed only with count 0)");
  }
}

// count * element size * ranks, refusing a product that does not fit size_t.
size_t byte_count(size_t count, DataType type, int ranks) {
  const size_t unit = element_size(type) * static_cast<size_t>(ranks);
  if (count > std::numeric_limits<size_t>::max() / unit) {
    throw invalid("count " + std::to_string(count) + " of " + name_of(type) +
                  " is too large: its size in bytes does not fit size_t");
  }
  return count * unit;
}

bool overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

size_t total_of(const size_t *counts, int ranks, const char *argument, DataType type) {
  size_t total = 0;
  for (int r = 0; r < ranks; ++r) {
    if (counts[r] > std::numeric_limits<size_t>::max() - total) {
      throw invalid(std::string(argument) + " add up to more than size_t holds");
    }
    total += counts[r];
  }
  byte_count(total, type, 1);
  return total;
}

}  // namespace

Runtime::Runtime(JobEnvironment job, std::optional<rendezvous::Secret> secret,
                 EngineSettings settings, int generation)
    : job_(std::move(job)) {
  ignore_sigpipe();
  store_ = open_store(job_, secret);
  if (job_.elastic_worker >= 0) join_elastic_world();
  const std::string address = address_toward(job_.rendezvous_addr, job_.rendezvous_port);
  // An elastic world's keys are its own (every process of it, old or new, uses them); else each
  // perseus_init of the job's processes has its own.
  const std::string keys = job_.elastic_worker >= 0
                               ? world_keys_ + "comm/"
                               : "perseus/comm/" + std::to_string(generation) + "/";
  // Every host-memory connection of this perseus_init, the job's (set 0) and each process
  // set's, is made here, under keys of its own in the job's store.
  HostExecutor::ConnectSet connect = [this, keys, address](int set, int rank_in_set, int set_size) {
    JobEnvironment members = job_;
    members.rank = rank_in_set;
    members.size = set_size;
    std::lock_guard lock(store_mutex_);
    RendezvousStore store(*store_,
                          keys + (set == 0 ? "gloo/" : "set/" + std::to_string(set) + "/gloo/"),
                          rank_in_set, job_.init_timeout);
    // In an elastic world, a join that waits for a peer the launcher has given up on ends.
    if (job_.elastic_world >= 0)
      store.give_up_when(contract::elastic_ended_key(job_.elastic_world));
    return std::unique_ptr<transport::Backend>(
        std::make_unique<gloo::Backend>(members, store, address));
  };
  std::unique_ptr<transport::Backend> world;
  try {
    world = connect(0, job_.rank, job_.size);
  } catch (const Error &error) {
    // A join that fails breaks its elastic world for every member (their connections to this
    // process would wait in vain): this process ends it, and perseusrun makes the next one.
    if (job_.elastic_world >= 0) {
      try {
        std::lock_guard lock(store_mutex_);
        store_->set(contract::elastic_ended_key(job_.elastic_world),
                    "rank " + std::to_string(job_.rank) + " (elastic worker " +
                        std::to_string(job_.elastic_worker) + ") could not join: " + error.what());
      } catch (const std::exception &) {  // the launcher is gone: nothing to tell
      }
    }
    throw;
  }
  EngineStore engine_store;
  engine_store.prefix = keys;
  engine_store.set = [this](const std::string &key, const std::string &value) {
    std::lock_guard lock(store_mutex_);
    store_->set(key, value);
  };
  engine_store.get = [this](const std::string &key, std::chrono::milliseconds timeout) {
    std::lock_guard lock(store_mutex_);
    try {
      return store_->get(key, timeout);
    } catch (const rendezvous::TimeoutError &error) {
      throw Error(Code::kTimeout, std::string("waiting for the job's store: ") + error.what());
    } catch (const rendezvous::WireError &error) {
      throw Error(Code::kRendezvous, std::string("the job's store: ") + error.what());
    }
  };
  auto host = std::make_unique<HostExecutor>(job_.rank, std::move(world),
                                             open_local_allreduce(engine_store, settings), connect);
  engine_ = std::make_unique<Engine>(
      job_, std::move(host), std::move(settings), [this] { return lost_peers(); },
      std::move(engine_store),
      secret ? Engine::ExitNotes()  // another launcher: it writes no notes to this store
             : [this](const std::vector<int> &ranks) { return exit_notes(ranks); });
  if (!secret) watchdog_ = std::thread([this] { watch_for_ended_peers(); });
}

// An elastic job's process takes its place from the store: the latest world's, once that world
// is not one that has already ended (a survivor may get here before perseusrun has made the
// next one). A process left out of the latest world fails, naming the world.
void Runtime::join_elastic_world() {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + job_.init_timeout;
  const int worker = job_.elastic_worker;
  const auto fail = [&](Code code, const std::string &what) {
    throw Error(code, "elastic worker " + std::to_string(worker) + " (" + contract::kElasticWorker +
                          "): " + what);
  };
  for (;;) {
    int world = -1;
    std::string place;
    bool ended = false;
    try {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const std::string text =
          store_->get(contract::kElasticWorldKey, std::max(left, std::chrono::milliseconds(1)));
      world = std::stoi(text);
      ended = world < job_.elastic_first_world || store_->check(contract::elastic_ended_key(world));
      if (!ended && store_->check(contract::elastic_place_key(world, worker))) {
        place = store_->get(contract::elastic_place_key(world, worker), std::chrono::seconds(5));
      }
    } catch (const rendezvous::TimeoutError &) {
      fail(Code::kTimeout, "no world was published within PERSEUS_INIT_TIMEOUT (" +
                               seconds_of(job_.init_timeout) + " s)");
    } catch (const rendezvous::WireError &error) {
      fail(Code::kRendezvous, std::string("the job's store: ") + error.what());
    } catch (const std::logic_error &) {
      fail(Code::kRendezvous, "the store's world number is not a number");
    }
    if (!ended) {
      if (place.empty()) {
        fail(Code::kRendezvous, "perseusrun left this process out of the job's world " +
                                    std::to_string(world) +
                                    " (it ends the processes it leaves out)");
      }
      JobEnvironment placed = job_;
      if (sscanf(place.c_str(), "%d %d %d %d %d %d", &placed.rank, &placed.size, &placed.local_rank,
                 &placed.local_size, &placed.cross_rank, &placed.cross_size) != 6 ||
          placed.rank < 0 || placed.rank >= placed.size || placed.local_rank < 0 ||
          placed.local_rank >= placed.local_size || placed.cross_rank < 0 ||
          placed.cross_rank >= placed.cross_size) {
        fail(Code::kRendezvous,
             "malformed place '" + place + "' in world " + std::to_string(world));
      }
      placed.node_rank = -1;  // hosts are told apart by name (the launcher's node numbers change)
      placed.elastic_world = world;
      job_ = placed;
      world_keys_ = contract::elastic_prefix(world);
      return;
    }
    if (Clock::now() >= deadline) {
      fail(Code::kTimeout, "world " + std::to_string(world) +
                               " ended and no other came within PERSEUS_INIT_TIMEOUT (" +
                               seconds_of(job_.init_timeout) + " s)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Runtime::declare_elastic() {
  if (job_.elastic_worker < 0 || !store_) return;
  std::lock_guard lock(store_mutex_);
  store_->set(contract::elastic_ready_key(job_.elastic_worker), std::to_string(job_.elastic_world));
}

long long Runtime::hosts_updated() {
  if (job_.elastic_worker < 0 || !store_) return 0;
  std::lock_guard lock(store_mutex_);
  if (!store_->check(contract::kElasticHostsKey)) return 0;
  return std::stoll(store_->get(contract::kElasticHostsKey, std::chrono::seconds(5)));
}

std::unique_ptr<Runtime> Runtime::alone(JobEnvironment job, EngineSettings settings,
                                        int generation) {
  return std::unique_ptr<Runtime>(
      new Runtime(std::move(job), std::move(settings), generation, Alone{}));
}

// One rank is every rank: a get can only wait for this rank's own set, which the engine's
// thread has made before (the NCCL id), so a missing key is a bug, not a peer to wait for.
Runtime::Runtime(JobEnvironment job, EngineSettings settings, int generation, Alone)
    : job_(std::move(job)) {
  EngineStore engine_store;
  engine_store.prefix = "perseus/comm/" + std::to_string(generation) + "/";
  engine_store.set = [this](const std::string &key, const std::string &value) {
    std::lock_guard lock(store_mutex_);
    own_keys_[key] = value;
  };
  engine_store.get = [this](const std::string &key, std::chrono::milliseconds) {
    std::lock_guard lock(store_mutex_);
    const auto found = own_keys_.find(key);
    if (found == own_keys_.end()) {
      throw Error(Code::kInternal, "a job of one rank waits for key '" + key +
                                       "', which only this rank could set (a bug in libperseus)");
    }
    return found->second;
  };
  // A process set of this one rank is a set of one: the host executor needs no connection.
  auto host = std::make_unique<HostExecutor>(job_.rank, std::make_unique<solo::Backend>(), nullptr,
                                             nullptr);
  engine_ = std::make_unique<Engine>(
      job_, std::move(host), std::move(settings), [] { return std::string(); },
      std::move(engine_store));
}

// A rank that has ended can take part in no further collective: once perseusrun says one has
// (contract::kFirstExitKey), operations that have waited kStuckAfter more fail naming it, even if
// the transport never notices the lost connection (a TCP peer that vanished without a reset, a
// wait that missed the close). Polls once a second while the runtime lives.
void Runtime::watch_for_ended_peers() {
  // An elastic world's end is looked for more often: every survivor waits for it to go on.
  const auto kPoll =
      job_.elastic_worker >= 0 ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1000);
  constexpr auto kStuckAfter = std::chrono::seconds(5);
  std::string ended;
  std::unique_lock lock(watchdog_mutex_);
  while (!watchdog_stop_) {
    watchdog_wake_.wait_for(lock, kPoll, [this] { return watchdog_stop_; });
    if (watchdog_stop_ || process_exiting()) break;
    if (job_.elastic_world >= 0 && !world_ended_) {
      std::string why;
      try {
        std::lock_guard store_lock(store_mutex_);
        const std::string key = contract::elastic_ended_key(job_.elastic_world);
        if (store_->check(key)) why = store_->get(key, std::chrono::seconds(1));
      } catch (const std::exception &) {
        break;
      }
      if (!why.empty()) {
        world_ended_ = true;
        engine_->abort(Code::kCommunication,
                       "the job's world " + std::to_string(job_.elastic_world) + " ended (" + why +
                           "): this process may join the next one after perseus_finalize");
      }
    }
    if (ended.empty()) {
      try {
        std::lock_guard store_lock(store_mutex_);
        const std::string key = world_keys_ + contract::kFirstExitKey;
        if (store_->check(key)) ended = store_->get(key, std::chrono::seconds(1));
      } catch (const std::exception &) {
        break;  // the launcher is gone: the transport's own errors must do
      }
    }
    if (!ended.empty()) engine_->fail_if_stuck(ended, kStuckAfter);
  }
}

// When every rank is on this host, all-reduces go through shared memory (shm/): the ranks agree
// on a segment name with an unpredictable part through the store, and on each other's pids (to
// notice a peer's death while waiting for it).
std::unique_ptr<shm::LocalAllreduce> Runtime::open_local_allreduce(const EngineStore &store,
                                                                   const EngineSettings &settings) {
  if (!settings.shared_memory || job_.local_size < 2 || job_.local_size != job_.size) {
    return nullptr;
  }
  const std::string prefix = store.prefix + "shm/";
  if (job_.local_rank == 0) {
    const auto secret = rendezvous::random_secret();
    std::string token;
    static constexpr char kHex[] = "0123456789abcdef";
    for (size_t i = 0; i < 12; ++i) {
      token += kHex[secret[i] >> 4];
      token += kHex[secret[i] & 15];
    }
    store.set(prefix + "name", "/perseus-" + token);
  }
  store.set(prefix + "pid/" + std::to_string(job_.local_rank), std::to_string(getpid()));
  const std::string name = store.get(prefix + "name", job_.init_timeout);
  std::vector<pid_t> pids(static_cast<size_t>(job_.local_size), 0);
  for (int r = 0; r < job_.local_size; ++r) {
    const std::string pid = store.get(prefix + "pid/" + std::to_string(r), job_.init_timeout);
    pids[static_cast<size_t>(r)] = static_cast<pid_t>(std::stol(pid));
  }
  return std::make_unique<shm::LocalAllreduce>(name, job_.local_rank, job_.local_size, pids,
                                               job_.collective_timeout);
}

Runtime::~Runtime() { stop_watchdog(); }

void Runtime::stop_watchdog() {
  {
    std::lock_guard lock(watchdog_mutex_);
    watchdog_stop_ = true;
  }
  watchdog_wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

// perseusrun publishes contract::exit_key(rank) in the store when a rank's process ends (how, and
// where). After a lost connection, the peer that ended is usually already there; a survivor
// may notice a moment before the launcher does, so this waits a little.
std::atomic<bool> &process_exiting() {
  static std::atomic<bool> exiting{false};
  return exiting;
}

std::string Runtime::lost_peers() {
  if (!store_ || process_exiting()) return "";
  constexpr auto kPatience = std::chrono::seconds(2);
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  try {
    for (;;) {
      std::string found;
      for (int r = 0; r < job_.size && !process_exiting(); ++r) {
        if (r == job_.rank) continue;
        const std::string key = world_keys_ + contract::exit_key(r);
        std::lock_guard lock(store_mutex_);
        if (store_->check(key)) {
          found += (found.empty() ? "" : "; ") + store_->get(key, std::chrono::seconds(1));
        }
      }
      if (!found.empty()) return found;
      if (std::chrono::steady_clock::now() >= deadline) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception &) {
    return "";  // the launcher itself is gone: nothing more to learn
  }
}

std::string Runtime::exit_notes(const std::vector<int> &ranks) {
  if (!store_ || process_exiting()) return "";
  std::string found;
  try {
    for (int r : ranks) {
      const std::string key = world_keys_ + contract::exit_key(r);
      std::lock_guard lock(store_mutex_);
      if (store_->check(key)) {
        found += (found.empty() ? "" : "; ") + store_->get(key, std::chrono::seconds(1));
      }
    }
  } catch (const std::exception &) {
    // the launcher (or under mpirun rank 0, which serves the store) is gone
  }
  return found;
}

std::shared_ptr<Request> Runtime::make(OpKind kind, const char *name, int dtype, int device,
                                       void *stream, int process_set) {
  auto request = std::make_shared<Request>();
  request->what.kind = kind;
  request->what.type = to_data_type(dtype);
  if (device < -1) {
    throw invalid("device " + std::to_string(device) +
                  " is neither PERSEUS_DEVICE_CPU (-1) nor a CUDA device ordinal");
  }
  if (device >= 0) {
    std::string why;
    if (!nccl::nccl_available(&why)) {
      throw invalid("device " + std::to_string(device) +
                    " given, but device memory needs NCCL and a GPU: " + why +
                    " (perseus_nccl_built() is 0 here; pass host buffers with "
                    "PERSEUS_DEVICE_CPU)");
    }
  }
  request->what.device = device;
  request->stream = stream;
  if (name && std::strlen(name) > kMaxNameBytes) {
    throw invalid("the name is " + std::to_string(std::strlen(name)) + " bytes long, over " +
                  std::to_string(kMaxNameBytes));
  }
  check_set(process_set, *request);
  request->what.process_set = process_set;
  request->what.name = name && *name ? name : engine_->unnamed(kind, process_set);
  qualify(*request, process_set);
  return request;
}

std::optional<std::vector<int64_t>> &next_shape() {
  static thread_local std::optional<std::vector<int64_t>> shape;
  return shape;
}

namespace {

// The elements a descriptor's shape must hold: its count, which for alltoall and reducescatter
// is the sum of the counts.
void check_shape(const Descriptor &d) {
  uint64_t elements = 1;
  for (int64_t extent : d.shape) {
    const auto e = static_cast<uint64_t>(extent);
    elements = (e != 0 && elements > std::numeric_limits<uint64_t>::max() / e) ? 0 : elements * e;
  }
  std::string text = "[";
  for (size_t i = 0; i < d.shape.size(); ++i) text += (i ? ", " : "") + std::to_string(d.shape[i]);
  text += "]";
  if (elements != d.count) {
    throw invalid("the shape " + text + " given with the call (perseus_next_shape, or the " +
                  "dims of perseus_allreduce_args_t) holds " + std::to_string(elements) +
                  " elements, but the call has " + std::to_string(d.count) +
                  ": give the tensor's own shape");
  }
  const bool by_rows = traits(d.kind).shape_agrees_from == 1;
  if (by_rows && d.shape.empty()) {
    throw invalid("the shape given with the call (perseus_next_shape) has no dimensions: " +
                  std::string(name_of(d.kind)) + " concatenates along the first one");
  }
  if (d.kind == OpKind::kAlltoall) {
    uint64_t row = 1;
    for (size_t i = 1; i < d.shape.size(); ++i) row *= static_cast<uint64_t>(d.shape[i]);
    for (size_t r = 0; r < d.counts.size(); ++r) {
      if (row != 0 && d.counts[r] % row != 0) {
        throw invalid("send_counts[" + std::to_string(r) + "] = " + std::to_string(d.counts[r]) +
                      " is not a whole number of rows of " + std::to_string(row) +
                      " elements (shape " + text + ")");
      }
    }
  }
}

}  // namespace

std::shared_ptr<Request> Runtime::submit(std::shared_ptr<Request> request) {
  if (auto shape = std::exchange(next_shape(), std::nullopt)) {
    request->what.has_shape = true;
    request->what.shape = std::move(*shape);
    check_shape(request->what);
  }
  if (request->what.device >= 0) {
    const Descriptor &d = request->what;
    if (d.prescale != 1.0 || d.postscale != 1.0) {
      throw invalid(
          "prescale/postscale on device memory are not supported: scale the tensor "
          "on its stream before and after (the torch shim does)");
    }
    if (d.type == DataType::kInt16 && traits(d.kind).reduces) {
      throw invalid(std::string(name_of(d.kind)) +
                    " of int16 on device memory: NCCL has no 16-bit integers to reduce (moving "
                    "them works); reduce them in host memory, or as int32");
    }
    const auto &cuda = nccl::cuda_api();
    if (request->send && d.count > 0) {
      nccl::check_device_pointer(cuda, request->send, d.device, "send buffer");
    }
    if (request->recv && request->recv != request->send && d.kind != OpKind::kReducescatter &&
        d.count > 0) {
      nccl::check_device_pointer(cuda, request->recv, d.device, "recv buffer");
    }
    // Ordered after the work the caller has queued on its stream so far.
    request->ready_event = nccl::record_ready_event(d.device, request->stream);
  } else if (nccl::cuda_in_use()) {
    // A CUDA pointer passed as host memory would crash Gloo: refuse it.
    const auto &cuda = nccl::cuda_api();
    if (request->send) nccl::check_host_pointer(cuda, request->send, "send buffer");
    if (request->recv && request->recv != request->send) {
      nccl::check_host_pointer(cuda, request->recv, "recv buffer");
    }
  }
  engine_->submit(request);
  return request;
}

std::shared_ptr<Request> Runtime::allreduce(const void *send, void *recv, size_t count, int dtype,
                                            int op, double prescale, double postscale,
                                            const char *name, int device, void *stream,
                                            int process_set) {
  auto request = make(OpKind::kAllreduce, name, dtype, device, stream, process_set);
  const DataType type = request->what.type;
  request->what.op = to_reduce_op(op);
  if (!(prescale == prescale) || !(postscale == postscale)) {
    throw invalid("prescale/postscale must be numbers, not NaN");
  }
  request->what.prescale = prescale;
  request->what.postscale = postscale;
  if (count > 0) {
    require_buffer(send, "send", count);
    require_buffer(recv, "recv", count);
    const size_t bytes = byte_count(count, type, 1);
    if (send != recv && overlap(send, bytes, recv, bytes)) {
      throw invalid("send and recv overlap but are not equal: pass the same pointer for in place");
    }
  }
  request->what.count = count;
  request->send = send;
  request->recv = recv;
  return submit(std::move(request));
}

std::shared_ptr<Request> Runtime::broadcast(void *buffer, size_t count, int dtype, int root,
                                            const char *name, int device, void *stream,
                                            int process_set) {
  auto request = make(OpKind::kBroadcast, name, dtype, device, stream, process_set);
  if (process_set != 0 && !engine_->member_of(process_set, root)) {
    throw invalid("root " + std::to_string(root) + " is not a member of process set " +
                  std::to_string(process_set));
  }
  if (root < 0 || root >= job_.size) {
    throw invalid("root " + std::to_string(root) + " is not a rank of this job (ranks 0 to " +
                  std::to_string(job_.size - 1) + ")");
  }
  if (count > 0) {
    require_buffer(buffer, "buf", count);
    byte_count(count, request->what.type, 1);
  }
  request->what.root = root;
  request->what.count = count;
  request->send = buffer;
  request->recv = buffer;
  return submit(std::move(request));
}

void Runtime::allgather(const void *send, void *recv, size_t count, int dtype, const char *name) {
  const DataType type = to_data_type(dtype);
  if (count > 0) {
    require_buffer(send, "send", count);
    require_buffer(recv, "recv", count);
    byte_count(count, type, job_.size);
  }
  // The result arrives in the request's own buffer, so send may lie anywhere in recv.
  auto request = allgatherv(send, count, dtype, name, -1, nullptr);
  request->wait();
  if (!request->output.empty()) std::memcpy(recv, request->output.data(), request->output.size());
}

std::shared_ptr<Request> Runtime::allgatherv(const void *send, size_t count, int dtype,
                                             const char *name, int device, void *stream,
                                             int process_set) {
  auto request = make(OpKind::kAllgatherv, name, dtype, device, stream, process_set);
  if (count > 0) {
    require_buffer(send, "send", count);
    byte_count(count, request->what.type, job_.size);
  }
  request->what.count = count;
  request->send = send;
  return submit(std::move(request));
}

std::shared_ptr<Request> Runtime::alltoall(const void *send, const size_t *send_counts, int dtype,
                                           const char *name, int device, void *stream,
                                           int process_set) {
  auto request = make(OpKind::kAlltoall, name, dtype, device, stream, process_set);
  const auto ranks = members(process_set);
  const auto n = static_cast<int>(ranks.size());
  if (!send_counts) {
    throw invalid(process_set ? "send_counts is NULL: give one count per member of the set"
                              : "send_counts is NULL: give one count per rank");
  }
  const size_t total = total_of(send_counts, n, "send_counts", request->what.type);
  if (total > 0) require_buffer(send, "send", total);
  request->what.counts.assign(send_counts, send_counts + n);
  request->what.count = total;
  request->send = send;
  return submit(std::move(request));
}

std::shared_ptr<Request> Runtime::reducescatter(const void *send, void *recv,
                                                const size_t *recv_counts, int dtype, int op,
                                                double prescale, double postscale, const char *name,
                                                int device, void *stream, int process_set) {
  auto request = make(OpKind::kReducescatter, name, dtype, device, stream, process_set);
  const auto ranks = members(process_set);
  const auto n = static_cast<int>(ranks.size());
  request->what.op = to_reduce_op(op);
  if (!(prescale == prescale) || !(postscale == postscale)) {
    throw invalid("prescale/postscale must be numbers, not NaN");
  }
  request->what.prescale = prescale;
  request->what.postscale = postscale;
  if (!recv_counts) {
    throw invalid(process_set ? "recv_counts is NULL: give one count per member of the set"
                              : "recv_counts is NULL: give one count per rank");
  }
  const size_t total = total_of(recv_counts, n, "recv_counts", request->what.type);
  const size_t mine = recv_counts[static_cast<size_t>(index_of(ranks, job_.rank))];
  if (total > 0) require_buffer(send, "send", total);
  if (mine > 0) {
    require_buffer(recv, "recv", mine);
    const size_t unit = element_size(request->what.type);
    if (overlap(send, total * unit, recv, mine * unit)) {
      throw invalid("send and recv overlap: reducescatter needs separate buffers");
    }
  }
  request->what.counts.assign(recv_counts, recv_counts + n);
  request->what.count = total;
  request->send = send;
  request->recv = recv;
  return submit(std::move(request));
}

int Runtime::add_process_set(const int *ranks, int count) {
  if (!ranks || count < 1) {
    throw invalid("a process set needs at least one rank (ranks is " +
                  std::string(ranks ? "given" : "NULL") + ", count " + std::to_string(count) + ")");
  }
  std::vector<int> sorted(ranks, ranks + count);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= job_.size || (i > 0 && sorted[i] == sorted[i - 1])) {
      throw invalid("rank " + std::to_string(sorted[i]) +
                    (sorted[i] < 0 || sorted[i] >= job_.size
                         ? " is not a rank of this job (0 to " + std::to_string(job_.size - 1) + ")"
                         : " is given twice"));
    }
  }
  auto request = make(OpKind::kAddProcessSet, nullptr, 0, -1, nullptr);
  request->what.counts.assign(sorted.begin(), sorted.end());
  submit(request)->wait();
  return request->created_set;
}

void Runtime::check_set(int process_set, Request &request) {
  if (process_set == 0) return;
  if (request.what.device >= 0) {
    throw invalid("process set " + std::to_string(process_set) +
                  " was given device memory (CUDA device " + std::to_string(request.what.device) +
                  "), but process sets move host memory only: copy the tensor to host memory, or "
                  "use the world (set 0)");
  }
  if (!engine_->member_of(process_set, job_.rank)) {
    throw invalid("this rank (" + std::to_string(job_.rank) + ") is not a member of process set " +
                  std::to_string(process_set) +
                  ", or no such set exists (perseus_add_process_set makes them)");
  }
}

// Names are per process set: the same name may run in two sets at once.
void Runtime::qualify(Request &request, int process_set) {
  request.what.name += process_set_suffix(process_set);
}

void Runtime::barrier(int process_set) {
  auto request = make(OpKind::kBarrier, nullptr, 0, -1, nullptr, process_set);
  submit(request)->wait();
}

std::vector<int> Runtime::members(int process_set) {
  if (process_set == 0) {
    std::vector<int> every(static_cast<size_t>(job_.size));
    for (int r = 0; r < job_.size; ++r) every[static_cast<size_t>(r)] = r;
    return every;
  }
  return engine_->members_of(process_set);
}

std::vector<int> Runtime::members_of(int process_set) {
  std::vector<int> ranks = members(process_set);
  if (ranks.empty()) {
    throw invalid("process set " + std::to_string(process_set) +
                  " does not exist (perseus_comm_create or perseus_add_process_set makes them)");
  }
  return ranks;
}

int Runtime::join(int device) {
  auto request = make(OpKind::kJoin, "join", 0, -1, nullptr);
  (void)device;  // zeros are made where the others' tensors live
  engine_->join(request);
  request->wait();
  return request->last_rank;
}

bool Runtime::shutdown() {
  // After an elastic world's end the thread may wait on a peer that is gone: not for long. The
  // watchdog may not have looked yet (a lost peer's connection can fail first): ask the store.
  if (job_.elastic_world >= 0 && !world_ended_ && !process_exiting()) {
    try {
      std::lock_guard lock(store_mutex_);
      if (store_->check(contract::elastic_ended_key(job_.elastic_world))) world_ended_ = true;
    } catch (const std::exception &) {  // the launcher is gone: the usual wait
    }
  }
  const bool left =
      world_ended_ ? engine_->shutdown(std::chrono::milliseconds(500)) : engine_->shutdown();
  stop_watchdog();
  return left;
}

}  // namespace perseus::comm
