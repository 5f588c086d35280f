#include "lib/comm/engine.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <limits>

#include <unistd.h>

#include "lib/comm/fusion_plan.h"
#include "lib/comm/nccl/device_executor.h"
#include "lib/comm/nccl/hierarchy.h"
#include "lib/comm/ops/ops.h"
#include "lib/comm/reduction.h"

namespace perseus::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Every cycle starts with an allgather of one slot per rank: the length of the rank's message
// and as much of it as fits. Only when some message does not fit does a second allgather carry
// the whole messages. A training step's cached messages fit.
constexpr size_t kSlotBytes = 256;
constexpr size_t kSlotPayload = kSlotBytes - sizeof(uint32_t);

// Within kBusyWindow of the last work, the thread polls kPollFor for new work before it sleeps.
constexpr auto kBusyWindow = std::chrono::milliseconds(1);
constexpr auto kPollFor = std::chrono::microseconds(50);
// Work found, the thread waits until the queue has not grown for kSettle (kBurstQuiet within a
// burst), at most kSettleAtMost (and never longer than the cycle time); see Engine::settle.
constexpr auto kSettle = std::chrono::microseconds(5);
constexpr auto kBurstQuiet = std::chrono::microseconds(40);
constexpr auto kSettleAtMost = std::chrono::microseconds(500);
// After this many cycles in a row that each found one request and no burst behind it (a loop of
// blocking calls), the thread stops settling until a cycle finds several requests again.
constexpr int kLoneCyclesBeforeNoSettle = 3;

// While operations that some rank announced wait for the others, every rank cycles at least
// this often (each sees the same announcements), so that the cycle after the last rank submits
// follows within about this time rather than up to a whole cycle time later (every cycle is a
// collective exchange: a rank that sleeps holds up the others). For at most kPendingPollFor
// without progress: a rank that is far behind (a long evaluation) is not waited for this eagerly.
constexpr auto kPendingPoll = std::chrono::microseconds(50);
constexpr auto kPendingPollFor = std::chrono::milliseconds(50);

// After this long without any work the thread sleeps longer between cycles.
constexpr auto kIdleAfter = std::chrono::seconds(1);
constexpr int kIdleFactor = 5;

// When other ranks leave, the launcher's word on how they ended (their exit code, written to the
// store as each rank ends) is awaited this long. A rank that left after an error exits non-zero
// meanwhile, so the launcher names it as the job's cause, not this one.
// The note comes when the leaving process has ended, after its interpreter's teardown: 0.2 s on
// an idle machine, but over 3 s (the limit before 2026-12-05) on a loaded CI machine, where the
// survivors then exited first and the job ended with their code 1 instead of the leaver's.
constexpr auto kExitNotePatience = std::chrono::seconds(8);
// Under another launcher (mpirun, torchrun) no notes come; its own fail-fast is given this long to
// end the job first (torchrun looks every 5 s), so that it blames the rank that failed, not this
// one.
constexpr auto kNoNotesPatience = std::chrono::seconds(8);
constexpr auto kExitNotePoll = std::chrono::milliseconds(50);

std::string ranks_text(const std::vector<int> &ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8 && ranks.size() > 10) {
      return text + " and " + std::to_string(ranks.size() - i) + " more";
    }
    text += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return text;
}

std::string operation_text(const std::string &name, OpKind kind) {
  return std::string(name_of(kind)) + " '" + name + "'";
}

// The timeline's name of an operation, in capitals as Horovod's timeline has them.
std::string phase_of(OpKind kind) {
  std::string name = name_of(kind);
  for (char &c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace

Engine::Engine(const JobEnvironment &job, std::unique_ptr<HostExecutor> host,
               EngineSettings settings, LostPeers lost_peers, EngineStore store,
               ExitNotes exit_notes)
    : job_(job),
      settings_(std::move(settings)),
      host_(std::move(host)),
      lost_peers_(std::move(lost_peers)),
      exit_notes_(std::move(exit_notes)),
      store_(std::move(store)),
      negotiator_(job.rank, job.size),
      timeline_(job.rank == 0 ? settings_.timeline : ""),
      last_stall_scan_(Clock::now()),
      last_work_(Clock::now()) {
  sets_.push_back(negotiator_.members(0));
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    if (!stopped_ && failure_.empty()) {
      failure_code_ = Code::kNotInitialized;
      failure_ = "libperseus was shut down before this operation ran";
    }
    shutdown_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) {
    // Without shutdown() first (the orderly, agreed way) the thread may still wait in a cycle
    // until the other ranks' connections close or time out.
    thread_.join();
  }
}

std::string Engine::unnamed(OpKind kind, int set) {
  uint64_t n = 0;
  {
    std::lock_guard lock(mutex_);
    n = unnamed_[{static_cast<int>(kind), set}]++;
  }
  return unnamed_name(kind, n);
}

void Engine::submit(const std::shared_ptr<Request> &request) {
  {
    std::unique_lock lock(mutex_);
    if (!failure_.empty()) throw_failure(lock);
    if (shutdown_) {
      throw Error(Code::kNotInitialized, "libperseus is shutting down (perseus_finalize)");
    }
    const auto [it, inserted] = in_flight_.try_emplace(request->what.name, request);
    if (!inserted) {
      throw Error(Code::kInvalidArgument,
                  "an operation named '" + request->what.name +
                      "' is already in flight on this rank: wait for it first, or use another "
                      "name");
    }
    request->submitted = Clock::now();
    queue_.push_back(request);
    queued_.fetch_add(1, std::memory_order_release);
  }
  work_.notify_one();
}

void Engine::join(const std::shared_ptr<Request> &request) {
  {
    std::unique_lock lock(mutex_);
    if (!failure_.empty()) throw_failure(lock);
    if (join_) throw Error(Code::kInvalidArgument, "perseus_join is already running on this rank");
    request->submitted = Clock::now();
    join_ = request;
    join_announced_ = false;
  }
  work_.notify_one();
}

bool Engine::shutdown() { return shutdown(settings_.shutdown_timeout); }

bool Engine::shutdown(std::chrono::milliseconds limit) {
  {
    std::lock_guard lock(mutex_);
    shutdown_ = true;
  }
  work_.notify_all();
  if (!thread_.joinable()) return true;
  {
    std::unique_lock lock(mutex_);
    const auto ended = [this] { return ended_; };
    if (limit.count() == 0) {
      ended_signal_.wait(lock, ended);
    } else if (!ended_signal_.wait_for(lock, limit, ended)) {
      return false;
    }
  }
  thread_.join();
  return true;
}

[[noreturn]] void Engine::throw_failure(std::unique_lock<std::mutex> &lock) {
  if (!left_.empty() && !left_noted_) {
    left_noted_ = true;
    const std::vector<int> left = left_;
    lock.unlock();
    std::string text = departure_text(left);
    lock.lock();
    failure_ = std::move(text);
  }
  throw Error(failure_code_, failure_);
}

void Engine::note_departures(const std::vector<int> &ranks) {
  std::lock_guard lock(mutex_);
  stopped_ = true;
  if (std::find(ranks.begin(), ranks.end(), job_.rank) != ranks.end()) return;  // left too
  left_ = ranks;
}

// The launcher's note on the ranks that left is awaited even when nothing is in flight here: a
// call submitted while the text is made (failure_ is still empty then) is failed with it, and
// this rank must not end before the leaver, or the job would end with this rank's code. The
// wait ends at once when this rank shuts down too.
std::pair<Code, std::string> Engine::end_reason() {
  std::vector<int> left;
  {
    std::lock_guard lock(mutex_);
    left = left_;
    left_noted_ = true;
  }
  if (left.empty()) {
    return {Code::kNotInitialized,
            "perseus_finalize was called before this operation ran on every rank"};
  }
  return {Code::kCommunication, departure_text(left)};
}

std::string Engine::departure_text(const std::vector<int> &left) {
  std::string notes;
  const auto give_up = Clock::now() + (exit_notes_ ? kExitNotePatience : kNoNotesPatience);
  for (;;) {
    if (exit_notes_) notes = exit_notes_(left);
    if (!notes.empty() || Clock::now() >= give_up) break;
    {
      std::lock_guard lock(mutex_);
      if (shutdown_) break;  // this rank is leaving as well: nobody waits for the answer
    }
    std::this_thread::sleep_for(kExitNotePoll);
  }
  const bool one = left.size() == 1;
  return std::string(one ? "rank " : "ranks ") + ranks_text(left) + (one ? " has" : " have") +
         " left the job (perseus_finalize: its script ended, or is exiting after an error of its "
         "own; see its output), so no collective can complete any more" +
         (notes.empty() ? "" : "; " + notes) +
         ". This rank cannot go on either: exit with a non-zero code";
}

std::shared_ptr<Request> Engine::find(const std::string &name) {
  std::lock_guard lock(mutex_);
  const auto it = in_flight_.find(name);
  return it == in_flight_.end() ? nullptr : it->second;
}

// Requests stay in in_flight_ while they run, so that a failure in the middle fails them too.
void Engine::succeed(const std::shared_ptr<Request> &request) {
  if (!request) return;
  {
    std::lock_guard lock(mutex_);
    in_flight_.erase(request->what.name);
  }
  request->succeed();
}

void Engine::fail(const std::shared_ptr<Request> &request, Code code, const std::string &message) {
  if (!request) return;
  {
    std::lock_guard lock(mutex_);
    in_flight_.erase(request->what.name);
  }
  request->fail(code, message);
}

void Engine::fail_if_stuck(const std::string &ended, std::chrono::milliseconds after) {
  bool stuck = false;
  {
    std::lock_guard lock(mutex_);
    const auto now = Clock::now();
    for (const auto &[name, request] : in_flight_) {
      stuck = stuck || now - request->submitted > after;
    }
    stuck = stuck || (join_ && now - join_->submitted > after);
  }
  if (stuck) {
    fail_everything(Code::kCommunication,
                    ended +
                        ", and no collective can complete without it. The job cannot go on: "
                        "exit with a non-zero code and perseusrun ends the other ranks");
  }
}

void Engine::fail_everything(Code code, const std::string &message) {
  std::map<std::string, std::shared_ptr<Request>> requests;
  std::shared_ptr<Request> join;
  {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) {
      failure_code_ = code;
      failure_ = message;
    }
    requests.swap(in_flight_);
    queue_.clear();
    join.swap(join_);
    stopped_ = true;
  }
  for (auto &[name, request] : requests) {
    request->fail(code, operation_text(name, request->what.kind) + ": " + message);
  }
  if (join) join->fail(code, message);
}

void Engine::loop() {
  try {
    for (;;) {
      cycle();
      std::lock_guard lock(mutex_);
      if (stopped_) break;
    }
    complete_device_work(true);  // queued before the shutdown was agreed
    const auto [code, message] = end_reason();
    fail_everything(code, message);
  } catch (const Error &error) {
    std::string message = error.what();
    if ((error.code() == Code::kCommunication || error.code() == Code::kTimeout) && lost_peers_) {
      const std::string lost = lost_peers_();
      if (!lost.empty()) message = lost + "; " + message;
    }
    // The callers first, then the connections: closing them makes the ranks that wait on this
    // one fail too, but might itself wait on a broken peer.
    fail_everything(error.code(), message);
    host_->close();
  } catch (const std::exception &error) {
    host_->close();
    fail_everything(Code::kInternal, std::string("the background thread failed (a bug in "
                                                 "libperseus, please report it): ") +
                                         error.what());
  }
  device_pending_.clear();  // their requests have succeeded or failed by now
  device_.reset();          // on the thread that used it
  host_->finish();
  timeline_.flush();
  {
    std::lock_guard lock(mutex_);
    ended_ = true;
  }
  ended_signal_.notify_all();
}

nccl::DeviceExecutor &Engine::device(int ordinal) {
  if (!device_) {
    // Every rank reaches its first device operation at the same point of the agreed order, so
    // they all make the communicator together here.
    const nccl::HostLayout layout = device_layout();
    const auto exchange = [&](const std::string &which, const std::string &mine) {
      const std::string key = store_.prefix + "nccl/" + which + "/unique_id";
      if (!mine.empty()) {
        store_.set(key, mine);
        return mine;
      }
      return store_.get(key, job_.init_timeout);
    };
    device_ = std::make_unique<nccl::DeviceExecutor>(job_.rank, job_.size, ordinal,
                                                     settings_.allreduce_streams, layout, exchange,
                                                     Clock::now() + job_.init_timeout);
  } else if (device_->device() != ordinal) {
    throw Error(Code::kInvalidArgument,
                "this rank's device operations use CUDA device " +
                    std::to_string(device_->device()) + ", not " + std::to_string(ordinal) +
                    ": one GPU per rank (CUDA_VISIBLE_DEVICES from perseusrun gives each rank "
                    "its own)");
  }
  return *device_;
}

nccl::HostLayout Engine::device_layout() {
  // Each rank's record: whether it asks for hierarchical all-reduces, then its host: the
  // launcher's node number when it gave one, else the host's name.
  constexpr size_t kRecord = 72;
  std::vector<char> mine(kRecord, 0);
  mine[0] = settings_.hierarchical_allreduce ? 1 : 0;
  std::string host;
  if (job_.node_rank >= 0) {
    host = "node " + std::to_string(job_.node_rank);
  } else {
    char name[kRecord] = {};
    gethostname(name, sizeof name - 1);
    host = std::string("host ") + name;
  }
  std::copy_n(host.begin(), std::min(host.size(), kRecord - 2), mine.begin() + 1);
  std::vector<char> all(kRecord * static_cast<size_t>(job_.size));
  host_->allgather(mine.data(), kRecord, all.data());
  const bool wanted = all[0] != 0;
  if (wanted != settings_.hierarchical_allreduce) {
    std::fprintf(stderr,
                 "perseus: rank %d: PERSEUS_HIERARCHICAL_ALLREDUCE is %d here but %d on rank 0; "
                 "rank 0's setting holds for every rank\n",
                 job_.rank, settings_.hierarchical_allreduce ? 1 : 0, wanted ? 1 : 0);
  }
  if (!wanted) return {};  // flat
  std::vector<std::string> hosts;
  for (int r = 0; r < job_.size; ++r) {
    const char *record = all.data() + kRecord * static_cast<size_t>(r) + 1;
    hosts.emplace_back(record, strnlen(record, kRecord - 1));
  }
  nccl::HostLayout layout = nccl::plan_hierarchy(hosts, job_.rank);
  if (job_.rank == 0) {
    std::fprintf(stderr, "perseus: hierarchical all-reduce on GPUs: %s\n",
                 layout.describe().c_str());
  }
  return layout;
}

void Engine::run_device_allreduces(const std::vector<const Agreed *> &group,
                                   const std::vector<std::shared_ptr<Request>> &requests) {
  const Descriptor &d = group.front()->per_rank[static_cast<size_t>(job_.rank)];
  std::vector<nccl::DeviceExecutor::Piece> pieces;
  for (size_t k = 0; k < group.size(); ++k) {
    const auto &r = requests[k];
    pieces.push_back({r ? r->send : nullptr, r ? r->recv : nullptr,
                      static_cast<size_t>(group[k]->per_rank[0].count),
                      r ? r->ready_event.get() : nullptr});
  }
  const auto sent = Clock::now();
  nccl::DeviceExecutor &executor = device(d.device);
  executor.allreduce(pieces, d.type, d.op);
  if (timeline_.enabled()) {
    const char *what = executor.layout().scheme == nccl::Scheme::kFlat
                           ? "NCCL_ALLREDUCE"
                           : "NCCL_HIERARCHICAL_ALLREDUCE";
    for (const Agreed *a : group) timeline_.span(a->name, what, sent, Clock::now());
  }
}

void Engine::settle(size_t found) const {
  // Python submits one tensor every 10 to 30 us, slower than kSettle: once a burst shows (more
  // than one request, or the queue grew), the quiet that ends it is kBurstQuiet, slept rather
  // than spun so that the submitting threads have the CPU. A thread that waits for a result ends
  // the settle at once: a loop that submits, then waits, has submitted all it will.
  const auto limit =
      Clock::now() + std::min<std::chrono::microseconds>(settings_.cycle_time, kSettleAtMost);
  bool burst = found > 1;
  size_t seen = found;
  while (threads_waiting() == 0 && Clock::now() < limit) {
    if (burst) {
      std::this_thread::sleep_for(kBurstQuiet);
    } else {
      const auto quiet_until = Clock::now() + kSettle;
      while (Clock::now() < quiet_until) std::this_thread::yield();
    }
    const size_t now_queued = queued_.load(std::memory_order_acquire);
    if (now_queued == seen) return;
    burst = true;
    seen = now_queued;
  }
}

void Engine::cycle() {
  std::vector<std::shared_ptr<Request>> fresh;
  bool shutdown = false;
  bool join = false;
  // While device all-reduces run on the GPU, poll for their end and for new submissions (which
  // then negotiate while the GPU works), without sleeping.
  complete_device_work(false);
  while (!device_pending_.empty() && queued_.load(std::memory_order_acquire) == 0) {
    {
      std::lock_guard lock(mutex_);
      if (stopped_ || shutdown_ || (join_ && !join_announced_)) break;
    }
    std::this_thread::yield();
    complete_device_work(false);
  }
  // Right after work, the next submission usually follows within microseconds (a training
  // loop's next tensor, a benchmark's next call): poll for it briefly before sleeping, which
  // saves the wake-up of a sleeping thread on every call.
  if (Clock::now() - last_work_ < kBusyWindow) {
    const auto until = Clock::now() + kPollFor;
    while (queued_.load(std::memory_order_acquire) == 0 && Clock::now() < until) {
      std::this_thread::yield();
    }
  }
  {
    std::unique_lock lock(mutex_);
    const auto now = Clock::now();
    const bool idle = now - last_work_ > kIdleAfter;
    auto sleep = std::chrono::duration_cast<std::chrono::microseconds>(
        idle ? settings_.cycle_time * kIdleFactor : settings_.cycle_time);
    if (negotiator_.pending() > 0 && now - waiting_since_ < kPendingPollFor) {
      sleep = std::min<std::chrono::microseconds>(sleep, kPendingPoll);
    }
    work_.wait_for(lock, sleep,
                   [this] { return !queue_.empty() || shutdown_ || (join_ && !join_announced_); });
  }
  // Submissions come in bursts (a backward pass's gradients, a loop of async calls): while the
  // queue still grows, let it, so that one cycle takes the burst and fuses it, instead of a
  // cycle per tensor. A lone blocking call pays one short settle, and a run of them none.
  const size_t found = queued_.load(std::memory_order_acquire);
  if (found > 1 || (found == 1 && lone_cycles_ < kLoneCyclesBeforeNoSettle)) settle(found);
  {
    std::unique_lock lock(mutex_);
    fresh.assign(queue_.begin(), queue_.end());
    queue_.clear();
    if (fresh.size() == 1) {
      lone_cycles_ = std::min(lone_cycles_ + 1, kLoneCyclesBeforeNoSettle);
    } else if (fresh.size() > 1) {
      lone_cycles_ = 0;
    }
    queued_.store(0, std::memory_order_release);
    shutdown = shutdown_;
    if (join_ && !join_announced_) {
      join = true;
      join_announced_ = true;
    }
  }
  const auto now = Clock::now();
  std::vector<Descriptor> local;
  local.reserve(fresh.size());
  for (const auto &request : fresh) {
    local.push_back(request->what);
    timeline_.begin(request->what.name, "NEGOTIATE_" + phase_of(request->what.kind),
                    request->submitted);
  }

  RankMessage mine = negotiator_.outgoing(local, shutdown, join, std::move(cancel_));
  mine.deadlock = cancel_deadlock_;
  mine.waiting = waiting_for_others();
  cancel_.clear();
  cancel_deadlock_ = false;
  const auto messages = exchange(mine);
  auto agreed = negotiator_.receive(messages, Clock::now());
  if (timeline_.enabled()) {
    for (const auto &[name, rank] : agreed.announced) {
      timeline_.instant(name, "rank " + std::to_string(rank) + " ready", now);
    }
  }
  if (!agreed.ready.empty() || !mine.empty()) last_work_ = Clock::now();
  // Announcements or results are progress: the eager polling for the others starts anew.
  if (!agreed.ready.empty() || !agreed.announced.empty()) waiting_since_ = Clock::now();

  fail_cancelled(agreed);
  run(agreed.ready);
  if (agreed.join_done) {
    std::shared_ptr<Request> request;
    {
      std::lock_guard lock(mutex_);
      request.swap(join_);
    }
    if (request) {
      request->last_rank = *agreed.join_done;
      request->succeed();
    }
  }
  report_stalls();
  timeline_.flush();
  if (!agreed.shut_down.empty()) note_departures(agreed.shut_down);
}

std::vector<RankMessage> Engine::exchange(const RankMessage &mine) {
  const std::string bytes = encode(mine);
  const auto size = static_cast<size_t>(job_.size);
  std::vector<uint8_t> slot(kSlotBytes, 0);
  const auto length = static_cast<uint32_t>(bytes.size());
  std::memcpy(slot.data(), &length, sizeof length);
  std::memcpy(slot.data() + sizeof length, bytes.data(), std::min(bytes.size(), kSlotPayload));
  std::vector<uint8_t> slots(kSlotBytes * size);
  host_->allgather(slot.data(), kSlotBytes, slots.data());

  std::vector<size_t> lengths(size);
  bool all_fit = true;
  for (size_t r = 0; r < size; ++r) {
    uint32_t n = 0;
    std::memcpy(&n, slots.data() + r * kSlotBytes, sizeof n);
    lengths[r] = n;
    all_fit = all_fit && n <= kSlotPayload;
  }
  std::vector<RankMessage> messages(size);
  if (all_fit) {
    for (size_t r = 0; r < size; ++r) {
      const auto *at = reinterpret_cast<const char *>(slots.data() + r * kSlotBytes + 4);
      messages[r] = decode(std::string_view(at, lengths[r]), static_cast<int>(r), job_.size);
    }
    return messages;
  }
  // Some message is longer: every rank sends its whole message (the lengths are known to all).
  size_t total = 0;
  for (size_t n : lengths) total += n;
  std::vector<uint8_t> all(std::max<size_t>(total, 1));
  host_->allgatherv(0, bytes.data(), all.data(), lengths);
  size_t offset = 0;
  for (size_t r = 0; r < size; ++r) {
    const auto *at = reinterpret_cast<const char *>(all.data() + offset);
    messages[r] = decode(std::string_view(at, lengths[r]), static_cast<int>(r), job_.size);
    offset += lengths[r];
  }
  return messages;
}

void Engine::run(const std::vector<Agreed> &ready) {
  for (const auto &indexes : plan_fusion(ready, settings_.fusion_threshold)) {
    const Agreed &first = ready[indexes.front()];
    if (!fusible(first)) {
      run_one(first);
      continue;
    }
    std::vector<const Agreed *> group;
    for (size_t i : indexes) group.push_back(&ready[i]);
    run_allreduces(group);
  }
  if (!device_queued_.empty()) {
    // The cycle's device all-reduces are queued on Perseus's streams: they complete when the
    // GPU gets there, seen by complete_device_work() while the next cycles go on.
    device_pending_.push_back({device_->mark(), std::move(device_queued_)});
    device_queued_.clear();
  }
}

void Engine::complete_device_work(bool block) {
  while (!device_pending_.empty()) {
    DevicePending &oldest = device_pending_.front();
    if (block) {
      device_->wait(oldest.marker);
    } else if (!device_->done(oldest.marker)) {
      return;
    }
    const auto finished = Clock::now();
    for (auto &[name, request] : oldest.requests) {
      timeline_.end(name, finished);
      succeed(request);
    }
    device_pending_.pop_front();
  }
}

void Engine::run_allreduces(const std::vector<const Agreed *> &group) {
  const Descriptor &d = group.front()->per_rank[0];
  const auto me = static_cast<size_t>(job_.rank);
  if (!group.front()->member[me]) return;  // another process set's operations
  std::vector<std::shared_ptr<Request>> requests;
  for (const Agreed *a : group) requests.push_back(a->joined[me] ? nullptr : find(a->name));
  const auto started = Clock::now();
  for (const Agreed *a : group) {
    timeline_.end(a->name, started);
    timeline_.begin(a->name, "ALLREDUCE", started);
  }
  if (d.device >= 0) {
    run_device_allreduces(group, requests);
    for (size_t k = 0; k < group.size(); ++k) {
      device_queued_.emplace_back(group[k]->name, requests[k]);
    }
    return;
  }
  std::vector<HostExecutor::Piece> pieces;
  for (size_t k = 0; k < group.size(); ++k) {
    const auto &r = requests[k];
    pieces.push_back({r ? r->send : nullptr, r ? r->recv : nullptr,
                      static_cast<size_t>(group[k]->per_rank[0].count)});
  }
  const auto times =
      host_->allreduce(d.process_set, pieces, d.type, d.op, {d.prescale, d.postscale});
  const auto finished = Clock::now();
  for (size_t k = 0; k < group.size(); ++k) {
    const std::string &name = group[k]->name;
    if (times.fused) timeline_.span(name, "MEMCPY_IN_FUSION_BUFFER", started, times.packed);
    if (times.reduced != times.packed) timeline_.span(name, times.by, times.packed, times.reduced);
    if (times.fused) timeline_.span(name, "MEMCPY_OUT_FUSION_BUFFER", times.reduced, finished);
    timeline_.end(name, finished);
    succeed(requests[k]);
  }
}

int Engine::rank_in_set(int set, int rank) const {
  const auto &ranks = negotiator_.members(set);
  return index_of(ranks, rank);
}

bool Engine::member_of(int set, int rank) {
  std::lock_guard lock(mutex_);
  if (set < 0 || static_cast<size_t>(set) >= sets_.size()) return false;
  const auto &ranks = sets_[static_cast<size_t>(set)];
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

std::vector<int> Engine::members_of(int set) {
  std::lock_guard lock(mutex_);
  if (set < 0 || static_cast<size_t>(set) >= sets_.size()) return {};
  return sets_[static_cast<size_t>(set)];
}

void Engine::run_one(const Agreed &agreed) {
  const auto me = static_cast<size_t>(job_.rank);
  const Descriptor &d = agreed.per_rank[me];
  if (agreed.error.empty() && agreed.created_set >= 0) {
    const auto &ranks = negotiator_.members(agreed.created_set);
    host_->add_set(agreed.created_set, ranks);  // its members connect now; the others go on
    std::lock_guard lock(mutex_);
    sets_.push_back(ranks);
  }
  if (!agreed.member[me]) return;  // another process set's operation
  auto request = agreed.joined[me] ? nullptr : find(agreed.name);
  const auto started = Clock::now();
  timeline_.end(agreed.name, started);
  if (!agreed.error.empty()) {
    fail(request, Code::kInvalidArgument,
         operation_text(agreed.name, d.kind) + ": " + agreed.error);
    return;
  }
  timeline_.begin(agreed.name, phase_of(d.kind), started);
  const ops::OpRuns &runs = ops::runs_of(d.kind);
  const ops::OpRun run{agreed, d, negotiator_.members(d.process_set),
                       rank_in_set(d.process_set, job_.rank), request.get()};
  if (d.device >= 0) {
    if (runs.device) runs.device(device(d.device), run);
  } else if (runs.host) {
    runs.host(*host_, run);
  }
  timeline_.end(agreed.name, Clock::now());
  succeed(request);
}

// Rank 0 looks every second (kStallScan) and reports an operation once it has waited
// stall_check, then again every stall_check while it still waits; with stall_shutdown it gives up
// on it (once) as soon as it has waited that long. It also looks for a deadlock then.
void Engine::report_stalls() {
  if (job_.rank != 0) return;
  constexpr auto kStallScan = std::chrono::seconds(1);
  const auto now = Clock::now();
  if (now - last_stall_scan_ < kStallScan) return;
  last_stall_scan_ = now;
  end_deadlock(now);
  if (settings_.stall_check.count() == 0) return;
  auto after = settings_.stall_check;
  if (settings_.stall_shutdown.count() > 0) after = std::min(after, settings_.stall_shutdown);
  std::map<std::string, StallReport> still;
  for (const Stall &stall : negotiator_.stalls(now, after)) {
    const auto known = stall_reports_.find(stall.name);
    StallReport report = known == stall_reports_.end() ? StallReport{} : known->second;
    const bool due = known == stall_reports_.end() || report.last == Clock::time_point{} ||
                     now - report.last >= settings_.stall_check;
    if (stall.waited >= settings_.stall_check && due) {
      report.last = now;
      std::fprintf(stderr,
                   "perseus: rank 0: stall: %s has waited %lld s for ranks %s (submitted by ranks "
                   "%s). Do all ranks submit the same operations? (PERSEUS_STALL_CHECK_SECONDS=%lld"
                   " sets this check, 0 turns it off)\n",
                   operation_text(stall.name, stall.kind).c_str(),
                   static_cast<long long>(stall.waited.count()), ranks_text(stall.missing).c_str(),
                   ranks_text(stall.submitted).c_str(),
                   static_cast<long long>(settings_.stall_check.count()));
    }
    if (settings_.stall_shutdown.count() > 0 && stall.waited >= settings_.stall_shutdown &&
        !report.cancelled && !cancel_deadlock_) {
      report.cancelled = true;
      cancel_.push_back(stall.name);
    }
    still.emplace(stall.name, report);
  }
  stall_reports_.swap(still);
}

void Engine::end_deadlock(std::chrono::steady_clock::time_point now) {
  if (settings_.deadlock.count() == 0 || cancel_deadlock_) return;
  const auto stuck = negotiator_.deadlocked(now, settings_.deadlock);
  if (stuck.empty()) return;
  cancel_.clear();
  for (const Stall &stall : stuck) cancel_.push_back(stall.name);
  cancel_deadlock_ = true;
}

bool Engine::waiting_for_others() {
  constexpr auto kWaitingScan = std::chrono::milliseconds(100);
  if (settings_.deadlock.count() == 0 || negotiator_.pending() == 0) return waiting_ = false;
  const auto now = Clock::now();
  if (now - last_waiting_scan_ < kWaitingScan) return waiting_;
  last_waiting_scan_ = now;
  std::lock_guard lock(mutex_);
  waiting_ = std::any_of(in_flight_.begin(), in_flight_.end(), [this](const auto &entry) {
    return entry.second->waited_on() && negotiator_.is_pending(entry.first);
  });
  return waiting_;
}

void Engine::fail_cancelled(const Negotiator::Cycle &agreed) {
  if (agreed.cancelled.empty()) return;
  std::string deadlock;
  if (agreed.deadlock) {
    deadlock = "deadlock: every rank waits, and none has submitted anything for " +
               std::to_string(settings_.deadlock.count()) + " s, for operations that cannot run:";
    for (const Stall &stall : agreed.cancelled) {
      deadlock += " " + operation_text(stall.name, stall.kind) + " (submitted by ranks " +
                  ranks_text(stall.submitted) + ", never by ranks " + ranks_text(stall.missing) +
                  ");";
    }
    deadlock.back() = '.';
    deadlock +=
        " Do all ranks submit the same operations, each before it waits? "
        "(PERSEUS_DEADLOCK_SECONDS=" +
        std::to_string(settings_.deadlock.count()) + " sets this check, 0 turns it off)";
    if (job_.rank == 0) std::fprintf(stderr, "perseus: rank 0: %s\n", deadlock.c_str());
  }
  for (const Stall &stall : agreed.cancelled) {
    if (auto request = find(stall.name)) {
      fail(request, Code::kTimeout,
           agreed.deadlock
               ? operation_text(stall.name, stall.kind) + ": " + deadlock
               : operation_text(stall.name, stall.kind) + ": given up after " +
                     std::to_string(stall.waited.count()) + " s (PERSEUS_STALL_SHUTDOWN_SECONDS=" +
                     std::to_string(settings_.stall_shutdown.count()) + "): ranks " +
                     ranks_text(stall.missing) + " never submitted it");
    }
    if (std::find(stall.missing.begin(), stall.missing.end(), job_.rank) == stall.missing.end()) {
      continue;
    }
    if (const auto n = unnamed_number(stall.name, stall.kind, stall.process_set)) {
      std::lock_guard lock(mutex_);
      auto &next = unnamed_[{static_cast<int>(stall.kind), stall.process_set}];
      next = std::max<uint64_t>(next, *n + 1);
    }
  }
}

}  // namespace perseus::comm
