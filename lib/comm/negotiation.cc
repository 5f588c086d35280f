#include "lib/comm/negotiation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "lib/comm/op_traits.h"

namespace perseus::comm {

namespace {

// ---- wire format: little-endian, lengths before contents -------------------------------------

constexpr uint8_t kShutdownFlag = 1;
constexpr uint8_t kJoinFlag = 2;
constexpr uint8_t kWaitingFlag = 4;
constexpr uint8_t kDeadlockFlag = 8;

class Writer {
 public:
  template <typename T>
  void put(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out_.append(bytes, sizeof(T));
  }
  void put_string(const std::string &text) {
    put<uint32_t>(static_cast<uint32_t>(text.size()));
    out_ += text;
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(std::string_view bytes, int from) : bytes_(bytes), from_(from) {}

  template <typename T>
  T get(const char *what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  // A count of entries, refused above `cap` before anything is allocated for them.
  size_t length(const char *what, size_t cap) {
    const auto n = get<uint32_t>(what);
    if (n > cap)
      bad(std::string(what) + " is " + std::to_string(n) + ", over the cap of " +
          std::to_string(cap));
    return n;
  }
  std::string get_string(const char *what) {
    const size_t n = length(what, kMaxNameBytes);
    need(n, what);
    std::string text(bytes_.substr(at_, n));
    at_ += n;
    return text;
  }
  void finish() {
    if (at_ != bytes_.size()) {
      bad(std::to_string(bytes_.size() - at_) + " bytes follow the end of the message");
    }
  }
  [[noreturn]] void bad(const std::string &what) const {
    throw Error(Code::kCommunication, "rank " + std::to_string(from_) +
                                          " sent a malformed negotiation message (" +
                                          std::to_string(bytes_.size()) + " bytes): " + what +
                                          ". Do all ranks run the same libperseus version?");
  }

 private:
  void need(size_t n, const char *what) const {
    if (bytes_.size() - at_ < n) bad(std::string("truncated in ") + what);
  }
  std::string_view bytes_;
  size_t at_ = 0;
  int from_;
};

void put_descriptor(Writer &w, const Descriptor &d) {
  w.put<uint8_t>(static_cast<uint8_t>(d.kind));
  w.put<uint8_t>(static_cast<uint8_t>(d.type));
  w.put<uint8_t>(static_cast<uint8_t>(d.op));
  w.put<int32_t>(d.root);
  w.put<int32_t>(d.device);
  w.put<int32_t>(d.process_set);
  w.put<double>(d.prescale);
  w.put<double>(d.postscale);
  w.put<uint64_t>(d.count);
  w.put<uint32_t>(static_cast<uint32_t>(d.counts.size()));
  for (uint64_t c : d.counts) w.put<uint64_t>(c);
  w.put<int32_t>(d.has_shape ? static_cast<int32_t>(d.shape.size()) : -1);
  for (int64_t extent : d.shape) w.put<int64_t>(extent);
  w.put_string(d.name);
}

Descriptor get_descriptor(Reader &r, int ranks) {
  Descriptor d;
  const auto kind = r.get<uint8_t>("kind");
  const auto type = r.get<uint8_t>("dtype");
  const auto op = r.get<uint8_t>("op");
  if (kind >= kOpKinds) r.bad("operation kind " + std::to_string(kind) + " is unknown");
  if (type > static_cast<uint8_t>(DataType::kInt16)) {
    r.bad("dtype " + std::to_string(type) + " is unknown");
  }
  if (op > static_cast<uint8_t>(ReduceOp::kProduct))
    r.bad("op " + std::to_string(op) + " is unknown");
  d.kind = static_cast<OpKind>(kind);
  d.type = static_cast<DataType>(type);
  d.op = static_cast<ReduceOp>(op);
  d.root = r.get<int32_t>("root");
  d.device = r.get<int32_t>("device");
  d.process_set = r.get<int32_t>("process set");
  if (d.process_set < 0) r.bad("process set " + std::to_string(d.process_set) + " is negative");
  d.prescale = r.get<double>("prescale");
  d.postscale = r.get<double>("postscale");
  d.count = r.get<uint64_t>("count");
  const size_t n = r.length("number of counts", static_cast<size_t>(ranks));
  d.counts.reserve(n);
  for (size_t i = 0; i < n; ++i) d.counts.push_back(r.get<uint64_t>("counts"));
  const auto dims = r.get<int32_t>("number of dimensions");
  if (dims < -1 || dims > static_cast<int32_t>(kMaxShapeDims)) {
    r.bad("number of dimensions " + std::to_string(dims) + " is not in -1.." +
          std::to_string(kMaxShapeDims));
  }
  d.has_shape = dims >= 0;
  for (int32_t i = 0; i < dims; ++i) {
    const auto extent = r.get<int64_t>("shape");
    if (extent < 0) r.bad("dimension " + std::to_string(extent) + " is negative");
    d.shape.push_back(extent);
  }
  d.name = r.get_string("name");
  return d;
}

std::string counts_text(const std::vector<uint64_t> &counts) {
  std::string text = "[";
  for (size_t i = 0; i < counts.size(); ++i) text += (i ? ", " : "") + std::to_string(counts[i]);
  return text + "]";
}

// One field that must agree: whether two descriptors do (asked for every rank of every
// operation, so by value), and its value as text (only for the mismatch message).
struct Field {
  const char *name;
  std::string (*show)(const Descriptor &);
  bool (*same)(const Descriptor &, const Descriptor &);
};

bool same_double(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }
bool same_kind(const Descriptor &a, const Descriptor &b) { return a.kind == b.kind; }
bool same_type(const Descriptor &a, const Descriptor &b) { return a.type == b.type; }
bool same_op(const Descriptor &a, const Descriptor &b) { return a.op == b.op; }
bool same_count(const Descriptor &a, const Descriptor &b) { return a.count == b.count; }
bool same_counts(const Descriptor &a, const Descriptor &b) { return a.counts == b.counts; }
bool same_root(const Descriptor &a, const Descriptor &b) { return a.root == b.root; }
bool same_scales(const Descriptor &a, const Descriptor &b) {
  return same_double(a.prescale, b.prescale) && same_double(a.postscale, b.postscale);
}
bool same_memory(const Descriptor &a, const Descriptor &b) {
  return (a.device < 0) == (b.device < 0);
}
bool same_set(const Descriptor &a, const Descriptor &b) { return a.process_set == b.process_set; }

// A scale factor as the caller wrote it, to the last bit (std::to_string keeps 6 decimals).
std::string scale_text(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

std::string show_kind(const Descriptor &d) { return name_of(d.kind); }
std::string show_type(const Descriptor &d) { return name_of(d.type); }
std::string show_op(const Descriptor &d) { return name_of(d.op); }
std::string show_count(const Descriptor &d) { return std::to_string(d.count); }
std::string show_counts(const Descriptor &d) { return counts_text(d.counts); }
std::string show_root(const Descriptor &d) { return std::to_string(d.root); }
std::string show_scales(const Descriptor &d) {
  return scale_text(d.prescale) + "/" + scale_text(d.postscale);
}
std::string show_memory(const Descriptor &d) { return d.device < 0 ? "host" : "device"; }
std::string show_set(const Descriptor &d) { return std::to_string(d.process_set); }

std::string shape_text(const std::vector<int64_t> &shape, size_t from) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + (i < from ? std::string("*") : std::to_string(shape[i]));
  }
  return text + "]";
}

// The shapes of the ranks that gave one must agree (a rank that gave none, a C caller, is not
// compared). "" when they do.
std::string check_shapes(const Agreed &agreed) {
  const Descriptor *reference = nullptr;
  size_t first = 0;
  const auto counted = [&](size_t r) {
    return agreed.member[r] && !agreed.joined[r] && agreed.per_rank[r].has_shape;
  };
  for (size_t r = 0; r < agreed.per_rank.size() && !reference; ++r) {
    if (counted(r)) {
      reference = &agreed.per_rank[r];
      first = r;
    }
  }
  if (!reference) return "";
  const size_t from = traits(reference->kind).shape_agrees_from;
  if (from == std::string::npos) return "";
  const auto part = [&](const Descriptor &d) {
    return d.shape.size() < from ? d.shape
                                 : std::vector<int64_t>(d.shape.begin() + from, d.shape.end());
  };
  const auto expected = part(*reference);
  std::string text;
  for (size_t r = 0; r < agreed.per_rank.size(); ++r) {
    if (counted(r) && (agreed.per_rank[r].shape.size() != reference->shape.size() ||
                       part(agreed.per_rank[r]) != expected)) {
      text += ", rank " + std::to_string(r) + " " + shape_text(agreed.per_rank[r].shape, from);
    }
  }
  if (text.empty()) return "";
  return std::string("the ranks disagree on its shape") +
         (from ? " (all but the first dimension must agree)" : "") + ": rank " +
         std::to_string(first) + " gave " + shape_text(reference->shape, from) + text +
         " (every rank must submit it with the same arguments)";
}

// What the output of an allgatherv or alltoall would need: refused before any rank allocates
// it when the elements the peers announce overflow size_t in bytes. "" when they fit.
std::string check_output_size(const Agreed &agreed) {
  size_t first = 0;
  while (first + 1 < agreed.per_rank.size() && !agreed.member[first]) ++first;
  const Descriptor &any = agreed.per_rank[first];
  const uint64_t limit = std::numeric_limits<size_t>::max() / element_size(any.type);
  const auto too_big = [&](const std::string &what) {
    return what + " add up to more elements of " + name_of(any.type) + " than fit in memory";
  };
  if (any.kind == OpKind::kAllgatherv) {
    uint64_t total = 0;
    for (size_t r = 0; r < agreed.per_rank.size(); ++r) {
      if (!agreed.member[r]) continue;
      const uint64_t c = agreed.per_rank[r].count;
      if (c > limit - total) return too_big("the ranks' counts");
      total += c;
    }
  } else if (any.kind == OpKind::kAlltoall) {
    // check() has made sure that every member gave one count per member.
    size_t n = 0;
    for (size_t r = 0; r < agreed.per_rank.size(); ++r) {
      if (agreed.member[r]) n = agreed.per_rank[r].counts.size();
    }
    for (size_t to = 0; to < n; ++to) {
      uint64_t total = 0;
      for (size_t r = 0; r < agreed.per_rank.size(); ++r) {
        if (!agreed.member[r]) continue;
        const uint64_t c = agreed.per_rank[r].counts[to];
        if (c > limit - total) {
          return too_big(std::string("the counts sent to ") +
                         (any.process_set ? "member " : "rank ") + std::to_string(to));
        }
        total += c;
      }
    }
  }
  return "";
}

std::vector<Field> make_fields(OpKind kind) {
  const OpTraits &op = traits(kind);
  std::vector<Field> fields = {{"operation", show_kind, same_kind},
                               {"dtype", show_type, same_type},
                               {"memory", show_memory, same_memory},
                               {"process set", show_set, same_set}};
  if (op.same_count) fields.push_back({"count", show_count, same_count});
  if (op.same_counts) fields.push_back({op.same_counts, show_counts, same_counts});
  if (op.same_root) fields.push_back({"root", show_root, same_root});
  if (op.reduces) {
    fields.insert(fields.end(),
                  {{"op", show_op, same_op}, {"prescale/postscale", show_scales, same_scales}});
  }
  return fields;
}

// Made once per kind.
const std::vector<Field> &fields_for(OpKind kind) {
  static const auto *const all = [] {
    auto *made = new std::vector<std::vector<Field>>;
    for (int k = 0; k < kOpKinds; ++k) made->push_back(make_fields(static_cast<OpKind>(k)));
    return made;
  }();
  return all->at(static_cast<size_t>(kind));
}

}  // namespace

std::string encode(const RankMessage &message) {
  Writer w;
  w.put<uint8_t>(static_cast<uint8_t>(
      (message.shutdown ? kShutdownFlag : 0) | (message.join ? kJoinFlag : 0) |
      (message.waiting ? kWaitingFlag : 0) | (message.deadlock ? kDeadlockFlag : 0)));
  w.put<uint32_t>(static_cast<uint32_t>(message.cached.size()));
  for (uint32_t n : message.cached) w.put<uint32_t>(n);
  w.put<uint32_t>(static_cast<uint32_t>(message.fresh.size()));
  for (const auto &d : message.fresh) put_descriptor(w, d);
  w.put<uint32_t>(static_cast<uint32_t>(message.cancel.size()));
  for (const auto &name : message.cancel) w.put_string(name);
  return w.take();
}

RankMessage decode(std::string_view bytes, int from, int ranks) {
  Reader r(bytes, from);
  RankMessage m;
  const auto flags = r.get<uint8_t>("flags");
  if (flags & ~(kShutdownFlag | kJoinFlag | kWaitingFlag | kDeadlockFlag)) {
    r.bad("unknown flags " + std::to_string(flags));
  }
  m.shutdown = flags & kShutdownFlag;
  m.join = flags & kJoinFlag;
  m.waiting = flags & kWaitingFlag;
  m.deadlock = flags & kDeadlockFlag;
  const size_t cached = r.length("number of cached operations", kMaxEntries);
  m.cached.reserve(cached);
  for (size_t i = 0; i < cached; ++i) m.cached.push_back(r.get<uint32_t>("cached number"));
  const size_t fresh = r.length("number of new operations", kMaxEntries);
  for (size_t i = 0; i < fresh; ++i) m.fresh.push_back(get_descriptor(r, ranks));
  const size_t cancel = r.length("number of cancelled operations", kMaxEntries);
  for (size_t i = 0; i < cancel; ++i) m.cancel.push_back(r.get_string("cancelled name"));
  r.finish();
  return m;
}

Negotiator::Negotiator(int rank, int size, size_t cache_descriptors)
    : rank_(rank),
      size_(size),
      cache_capacity_(
          std::max<size_t>(64, cache_descriptors / static_cast<size_t>(std::max(size, 1)))),
      joined_(static_cast<size_t>(size), false),
      waiting_(static_cast<size_t>(size), false) {
  std::vector<int> everyone(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) everyone[static_cast<size_t>(r)] = r;
  sets_.push_back(std::move(everyone));
}

RankMessage Negotiator::outgoing(const std::vector<Descriptor> &local, bool shutdown, bool join,
                                 std::vector<std::string> cancel) const {
  RankMessage message;
  message.shutdown = shutdown;
  message.join = join;
  message.cancel = std::move(cancel);
  for (const auto &d : local) {
    // The newest agreement of this descriptor, if any (a name agreed with other arguments
    // before is sent in full).
    const auto found = cached_by_name_.find(d.name);
    if (found != cached_by_name_.end() && cache_[found->second][static_cast<size_t>(rank_)] == d) {
      message.cached.push_back(found->second);
    } else {
      message.fresh.push_back(d);
    }
  }
  return message;
}

void Negotiator::announce(int rank, const Descriptor &descriptor, Cycle &cycle,
                          std::chrono::steady_clock::time_point now) {
  auto [it, inserted] = pending_.try_emplace(descriptor.name);
  Pending &p = it->second;
  if (inserted) {
    p.per_rank.resize(static_cast<size_t>(size_));
    p.order = next_order_++;
    p.first_seen = now;
  }
  auto &slot = p.per_rank[static_cast<size_t>(rank)];
  if (slot) {
    // The submitting rank refuses a name already in flight, so a second announcement is a
    // broken peer.
    throw Error(Code::kCommunication,
                "rank " + std::to_string(rank) + " announced '" + descriptor.name + "' twice");
  }
  slot = descriptor;
  cycle.announced.emplace_back(descriptor.name, rank);
}

// Every member of the operation's process set that has not joined has submitted it. The set is
// the one named by whoever submitted first; a rank outside it that submits is refused by check().
// The process set the first submitter named (every submitter names the same one, or check()
// refuses the operation).
int Negotiator::set_of(const Pending &pending) {
  for (const auto &d : pending.per_rank) {
    if (d) return d->process_set;
  }
  return 0;
}

// member[r]: rank r belongs to process set `set`; all false for a set that does not exist.
std::vector<bool> Negotiator::member_mask(int set) const {
  std::vector<bool> member(static_cast<size_t>(size_), false);
  if (set >= 0 && static_cast<size_t>(set) < sets_.size()) {
    for (int r : sets_[static_cast<size_t>(set)]) member[static_cast<size_t>(r)] = true;
  }
  return member;
}

// Every member of the operation's process set that has not joined has submitted it. A set that
// does not exist counts as complete: check() then refuses the operation.
bool Negotiator::complete(const Pending &pending) const {
  const int set = set_of(pending);
  if (set < 0 || static_cast<size_t>(set) >= sets_.size()) return true;
  // An operation that cannot run while a member has joined fails at once, as in Horovod,
  // without waiting for the ranks that have not submitted it (and may never: they may have
  // counted their unnamed operations differently).
  const OpKind kind = kind_of(pending);
  if (!traits(kind).runs_while_joined) {
    for (int r : sets_[static_cast<size_t>(set)]) {
      if (joined_[static_cast<size_t>(r)]) return true;
    }
  }
  for (int r : sets_[static_cast<size_t>(set)]) {
    const auto index = static_cast<size_t>(r);
    if (!pending.per_rank[index] && !joined_[index]) return false;
  }
  return true;
}

OpKind Negotiator::kind_of(const Pending &pending) {
  for (const auto &d : pending.per_rank) {
    if (d) return d->kind;
  }
  return OpKind::kAllreduce;
}

int index_of(const std::vector<int> &members, int rank) {
  const auto at = std::find(members.begin(), members.end(), rank);
  return at == members.end() ? -1 : static_cast<int>(at - members.begin());
}

const std::vector<int> &Negotiator::members(int set) const {
  return sets_.at(static_cast<size_t>(set));
}

std::string Negotiator::check(const Agreed &agreed) const {
  // The first submitter's descriptor is the reference.
  size_t first = 0;
  while (agreed.joined[first] || !agreed.member[first]) ++first;
  const Descriptor &reference = agreed.per_rank[first];
  if (reference.kind == OpKind::kAddProcessSet) {
    if (reference.process_set != 0) return "process sets are made by every rank (set 0)";
    if (reference.counts.empty()) return "a process set needs at least one rank";
    for (size_t i = 0; i < reference.counts.size(); ++i) {
      const uint64_t r = reference.counts[i];
      if (r >= static_cast<uint64_t>(size_) || (i > 0 && r <= reference.counts[i - 1])) {
        return "its ranks must be distinct, in increasing order and below " + std::to_string(size_);
      }
    }
  }
  for (size_t r = 0; r < agreed.per_rank.size(); ++r) {
    if (!agreed.joined[r]) continue;
    if (!traits(reference.kind).runs_while_joined) {
      return std::string(name_of(reference.kind)) + " cannot run while rank " + std::to_string(r) +
             " has joined (perseus_join): only allreduce and barrier can, as in Horovod";
    }
  }
  for (const Field &field : fields_for(reference.kind)) {
    std::vector<int> differ;
    for (size_t r = 0; r < agreed.per_rank.size(); ++r) {
      if (agreed.member[r] && !agreed.joined[r] && !field.same(agreed.per_rank[r], reference)) {
        differ.push_back(static_cast<int>(r));
      }
    }
    if (!differ.empty()) {
      std::string text = "the ranks disagree on its " + std::string(field.name) + ": rank " +
                         std::to_string(first) + " gave " + field.show(reference);
      for (int r : differ) {
        text += ", rank " + std::to_string(r) + " " +
                field.show(agreed.per_rank[static_cast<size_t>(r)]);
      }
      return text + " (every rank must submit it with the same arguments)";
    }
  }
  if (const char *counts = traits(reference.kind).counts_per_member) {
    // One count per member of the set (every rank for set 0).
    const size_t n = members(reference.process_set).size();
    for (size_t r = 0; r < agreed.per_rank.size(); ++r) {
      if (!agreed.member[r]) continue;
      if (agreed.per_rank[r].counts.size() != n) {
        return "rank " + std::to_string(r) + " gave " +
               std::to_string(agreed.per_rank[r].counts.size()) + " " + counts + " for " +
               std::to_string(n) + (reference.process_set ? " members" : " ranks");
      }
    }
  }
  std::string shapes = check_shapes(agreed);
  if (!shapes.empty()) return shapes;
  return check_output_size(agreed);
}

Negotiator::Cycle Negotiator::receive(const std::vector<RankMessage> &messages,
                                      std::chrono::steady_clock::time_point now) {
  Cycle cycle;
  bool all_shutdown = true;
  bool active = false;
  for (size_t r = 0; r < messages.size(); ++r) {
    const RankMessage &m = messages[r];
    const int rank = static_cast<int>(r);
    all_shutdown = all_shutdown && m.shutdown;
    if (m.shutdown) cycle.shut_down.push_back(rank);
    for (uint32_t n : m.cached) {
      if (n >= cache_.size()) {
        throw Error(Code::kCommunication, "rank " + std::to_string(rank) +
                                              " referred to agreed operation number " +
                                              std::to_string(n) + ", but only " +
                                              std::to_string(cache_.size()) + " exist");
      }
      announce(rank, cache_[n][r], cycle, now);
    }
    for (const auto &d : m.fresh) announce(rank, d, cycle, now);
    waiting_[r] = m.waiting;
    if (!m.cached.empty() || !m.fresh.empty() || m.join || !m.cancel.empty()) active = true;
    if (m.join && !joined_[r]) {
      joined_[r] = true;
      last_joined_ = rank;  // within one cycle, the highest rank counts as last
    }
    if (rank == 0) {
      cycle.deadlock = m.deadlock && !m.cancel.empty();
      for (const auto &name : m.cancel) {
        const auto it = pending_.find(name);
        if (it == pending_.end()) continue;
        cycle.cancelled.push_back(describe(*it, now));
        pending_.erase(it);
      }
    }
  }
  cycle.all_shutdown = all_shutdown;

  // Ready: every rank that has not joined has submitted it. Run in order of first sighting.
  std::vector<std::map<std::string, Pending>::iterator> ready;
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (complete(it->second)) ready.push_back(it);
  }
  std::sort(ready.begin(), ready.end(),
            [](const auto &a, const auto &b) { return a->second.order < b->second.order; });
  for (auto it : ready) {
    Agreed agreed;
    agreed.name = it->first;
    agreed.joined.assign(static_cast<size_t>(size_), false);
    const Descriptor *first = nullptr;
    for (const auto &d : it->second.per_rank) {
      if (d && !first) first = &*d;
    }
    if (!first) {
      // Every rank has joined and none submitted it: cannot happen (joined ranks submit
      // nothing), but never run an operation nobody asked for.
      pending_.erase(it);
      continue;
    }
    bool any_joined = false;
    const int set = first->process_set;
    agreed.member = member_mask(set);
    for (size_t r = 0; r < it->second.per_rank.size(); ++r) {
      const auto &d = it->second.per_rank[r];
      agreed.per_rank.push_back(d ? *d : *first);
      // A member that has not submitted it has joined, or the operation fails at once
      // because another has (complete()).
      agreed.joined[r] = agreed.member[r] && !d && joined_[r];
      any_joined = any_joined || agreed.joined[r];
      if (d && !agreed.member[r] && agreed.error.empty()) {
        agreed.error = "rank " + std::to_string(r) + " submitted it in process set " +
                       std::to_string(set) + ", of which it is not a member";
      }
    }
    if (static_cast<size_t>(set) >= sets_.size()) {
      agreed.error = "process set " + std::to_string(set) +
                     " does not exist (perseus_add_process_set "
                     "makes them, numbered from 1; 0 is every rank)";
    }
    if (agreed.error.empty()) agreed.error = check(agreed);
    if (agreed.error.empty() && first->kind == OpKind::kAddProcessSet) {
      agreed.created_set = static_cast<int>(sets_.size());
      std::vector<int> ranks;
      for (uint64_t r : first->counts) ranks.push_back(static_cast<int>(r));
      sets_.push_back(std::move(ranks));
    }
    if (agreed.error.empty() && !any_joined && first->kind != OpKind::kAddProcessSet &&
        !unnamed_number(agreed.name, first->kind, first->process_set)) {
      remember(agreed);
    }
    cycle.ready.push_back(std::move(agreed));
    pending_.erase(it);
  }

  if (std::all_of(joined_.begin(), joined_.end(), [](bool j) { return j; })) {
    cycle.join_done = last_joined_;
    joined_.assign(joined_.size(), false);
    last_joined_ = -1;
  }
  if (active || !cycle.ready.empty() || last_activity_ == std::chrono::steady_clock::time_point{}) {
    last_activity_ = now;
  }
  return cycle;
}

void Negotiator::remember(const Agreed &agreed) {
  const auto found = cached_by_name_.find(agreed.name);
  if (found != cached_by_name_.end()) {
    std::vector<Descriptor> &entry = cache_[found->second];
    if (entry != agreed.per_rank) entry = agreed.per_rank;  // agreed with other arguments
    return;
  }
  if (cache_.size() >= cache_capacity_) {
    cache_.clear();
    cached_by_name_.clear();
  }
  cached_by_name_.emplace(agreed.name, static_cast<uint32_t>(cache_.size()));
  cache_.push_back(agreed.per_rank);
}

Stall Negotiator::describe(const std::pair<const std::string, Pending> &entry,
                           std::chrono::steady_clock::time_point now) const {
  const auto &[name, p] = entry;
  Stall stall{name,
              OpKind::kAllreduce,
              {},
              {},
              std::chrono::duration_cast<std::chrono::seconds>(now - p.first_seen)};
  const std::vector<bool> member = member_mask(set_of(p));
  for (size_t r = 0; r < p.per_rank.size(); ++r) {
    if (p.per_rank[r]) {
      stall.submitted.push_back(static_cast<int>(r));
      stall.kind = p.per_rank[r]->kind;
      stall.process_set = p.per_rank[r]->process_set;
    } else if (member[r] && !joined_[r]) {
      stall.missing.push_back(static_cast<int>(r));
    }
  }
  return stall;
}

std::vector<Stall> Negotiator::stalls(std::chrono::steady_clock::time_point now,
                                      std::chrono::seconds after) const {
  std::vector<Stall> found;
  for (const auto &entry : pending_) {
    if (now - entry.second.first_seen >= after) found.push_back(describe(entry, now));
  }
  return found;
}

std::vector<Stall> Negotiator::deadlocked(std::chrono::steady_clock::time_point now,
                                          std::chrono::seconds after) const {
  if (pending_.empty() || now - last_activity_ < after) return {};
  for (size_t r = 0; r < waiting_.size(); ++r) {
    if (!joined_[r] && !waiting_[r]) return {};
  }
  std::vector<Stall> found;
  for (const auto &entry : pending_) found.push_back(describe(entry, now));
  return found;
}

}  // namespace perseus::comm
