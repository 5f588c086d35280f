#pragma once
// How the ranks agree on what to run, without a coordinator: every cycle each rank sends the
// others (one allgather) what it has newly submitted, and every rank feeds all the messages, in
// rank order, to its own Negotiator. Since every Negotiator sees the same messages in the same
// order, each decides the same thing: which named operations every rank has now submitted, in
// which order to run them, which of them disagree between ranks. No clock and no randomness
// enter a decision (only stall reports, which change nothing, read the clock), so all ranks run
// the same operations in the same order even when they submitted them in different orders.
//
// The cached fast path: an operation agreed once gets a number, the same on every rank; when a
// rank submits the same descriptor again it sends only the number. Training loops submit the
// same tensors every step, so after the first step a cycle's message is a few bytes per tensor.
//
// Pure: no threads, no network, no clock of its own (tests drive it directly).

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/comm/operation.h"

namespace perseus::comm {

// One rank's message for one cycle.
struct RankMessage {
  bool shutdown = false;            // sticky: this rank called perseus_finalize
  bool join = false;                // this rank called perseus_join (sent once)
  std::vector<uint32_t> cached;     // numbers of agreed descriptors submitted again
  std::vector<Descriptor> fresh;    // descriptors sent in full
  std::vector<std::string> cancel;  // rank 0 only: names given up on (stall shutdown, deadlock)
  bool deadlock = false;            // rank 0 only: `cancel` ends a deadlock (every rank waits)
  // State, sent every cycle: a thread of this rank is blocked waiting for an operation that is
  // not agreed yet (on the rank's pending list). Not work: empty() ignores it.
  bool waiting = false;

  bool empty() const {
    return !shutdown && !join && cached.empty() && fresh.empty() && cancel.empty();
  }
  bool operator==(const RankMessage &) const = default;
};

// Caps checked before anything is allocated when decoding a peer's message.
constexpr size_t kMaxNameBytes = 64 * 1024;
constexpr size_t kMaxEntries = 1 << 20;
constexpr size_t kMaxShapeDims = 64;

std::string encode(const RankMessage &message);
// Throws Error(kCommunication) naming `from` and what is wrong when `bytes` is not a message
// encode() could have written (truncated, extended, out-of-range values, lengths over the caps).
RankMessage decode(std::string_view bytes, int from, int ranks);

// One agreed operation, ready on every rank that has not joined.
struct Agreed {
  std::string name;
  // Each rank's descriptor; for a rank that has joined, a copy of the first submitter's with
  // `joined` set.
  std::vector<Descriptor> per_rank;
  std::vector<bool> joined;
  // The ranks of its process set (all of them for set 0); the others take no part.
  std::vector<bool> member;
  // A successful add_process_set: the new set's number.
  int created_set = -1;
  // Non-empty when the ranks' descriptors disagree (or a joined rank cannot take part): then
  // nothing runs and every rank's request fails with this message.
  std::string error;
};

struct Stall {
  std::string name;
  OpKind kind;
  std::vector<int> submitted;  // ranks that have submitted it
  std::vector<int> missing;    // ranks that have not
  std::chrono::seconds waited;
  int process_set = 0;
};

// rank's index among a process set's members (in rank order); -1 when it is not one.
int index_of(const std::vector<int> &members, int rank);

class Negotiator {
 public:
  // The agreed-descriptor cache holds at most cache_descriptors descriptors over all its
  // entries (an entry is one per rank): at most cache_descriptors / size names, at least 64.
  static constexpr size_t kCacheDescriptors = size_t{1} << 17;
  Negotiator(int rank, int size, size_t cache_descriptors = kCacheDescriptors);

  // The message for this cycle announcing `local` (this rank's new submissions, in the order
  // they were made), with agreed descriptors replaced by their numbers.
  RankMessage outgoing(const std::vector<Descriptor> &local, bool shutdown, bool join,
                       std::vector<std::string> cancel = {}) const;

  struct Cycle {
    std::vector<Agreed> ready;     // in the order to run them, the same on every rank
    std::vector<Stall> cancelled;  // what rank 0 gave up on; fail them here
    bool deadlock = false;         // ... because every rank waited for one of them
    bool all_shutdown = false;     // every rank has called perseus_finalize
    // The ranks that said shutdown this cycle, in increasing order. When some but not all did,
    // the job is over for every rank (as in Horovod): what this cycle made ready still runs,
    // the rest fails naming these ranks.
    std::vector<int> shut_down;
    std::optional<int> join_done;  // every rank has joined: the last one to join
    // Ranks that announced something for the first time this cycle, per name (for the timeline).
    std::vector<std::pair<std::string, int>> announced;
  };
  // Feeds one cycle's messages (index = rank). `now` stamps first sightings for stall reports.
  // Throws Error(kCommunication) when a message refers to an unknown cached number.
  Cycle receive(const std::vector<RankMessage> &messages,
                std::chrono::steady_clock::time_point now);

  // Operations some ranks have submitted and others not, pending for at least `after`.
  std::vector<Stall> stalls(std::chrono::steady_clock::time_point now,
                            std::chrono::seconds after) const;

  // Every rank that has not joined is waiting (RankMessage::waiting) for operations that cannot
  // run, and no rank has submitted anything nor has anything been agreed for `after`: then no
  // operation pending can ever become ready (unless a thread that does not wait submits one
  // later), and these are all of them. Empty otherwise.
  std::vector<Stall> deadlocked(std::chrono::steady_clock::time_point now,
                                std::chrono::seconds after) const;

  size_t pending() const { return pending_.size(); }
  bool is_pending(const std::string &name) const { return pending_.count(name) != 0; }
  // The ranks of a process set (0: every rank), in increasing order; the set must exist.
  const std::vector<int> &members(int set) const;
  size_t process_sets() const { return sets_.size(); }
  // Entries in the agreed-descriptor cache, and how many it may hold.
  size_t cached() const { return cache_.size(); }
  size_t cache_capacity() const { return cache_capacity_; }
  bool joined(int rank) const { return joined_[static_cast<size_t>(rank)]; }

 private:
  struct Pending {
    std::vector<std::optional<Descriptor>> per_rank;
    uint64_t order = 0;  // first sighting, in the global (rank-ordered) announcement sequence
    std::chrono::steady_clock::time_point first_seen;
  };
  // Caches an agreement, successful and without joined ranks (see cache_).
  void remember(const Agreed &agreed);
  void announce(int rank, const Descriptor &descriptor, Cycle &cycle,
                std::chrono::steady_clock::time_point now);
  std::string check(const Agreed &agreed) const;
  Stall describe(const std::pair<const std::string, Pending> &entry,
                 std::chrono::steady_clock::time_point now) const;
  bool complete(const Pending &pending) const;
  static int set_of(const Pending &pending);
  static OpKind kind_of(const Pending &pending);
  std::vector<bool> member_mask(int set) const;

  int rank_;
  int size_;
  std::map<std::string, Pending> pending_;
  uint64_t next_order_ = 0;
  // Agreed descriptors by number: cache_[n][r] is rank r's descriptor of the name numbered n.
  // A name keeps its number while cached; agreed again with other arguments, its entry is
  // replaced. A new name gets the next number; when the cache is full it is emptied first
  // and the numbers start again (every rank agrees on the same operations in the same order,
  // so every rank's cache stays the same). Unnamed operations ("<op>.noname.<n>", never
  // submitted twice) are not cached. Without these bounds a long job grew it by an entry an
  // operation.
  std::vector<std::vector<Descriptor>> cache_;
  std::map<std::string, uint32_t> cached_by_name_;
  size_t cache_capacity_;
  std::vector<bool> joined_;
  std::vector<bool> waiting_;  // each rank's RankMessage::waiting of the last cycle
  // The last cycle in which a rank submitted or joined, rank 0 cancelled, or something became
  // ready (the first cycle's time until then).
  std::chrono::steady_clock::time_point last_activity_{};
  std::vector<std::vector<int>> sets_;  // process sets by number; 0 is every rank
  int last_joined_ = -1;
};

}  // namespace perseus::comm
