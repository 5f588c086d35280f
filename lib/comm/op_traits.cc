#include "lib/comm/op_traits.h"

#include <array>

namespace perseus::comm {

namespace {

constexpr size_t kNoShape = std::string::npos;

// In OpKind's order.
const std::array<OpTraits, kOpKinds> kTraits = {{
    // name, same: count, counts, root, reduces; counts per member; shape from; joined; fusible
    {"allreduce", true, nullptr, false, true, nullptr, 0, true, true},
    {"broadcast", true, nullptr, true, false, nullptr, 0, false, false},
    // allgatherv's counts may differ by design
    {"allgatherv", false, nullptr, false, false, nullptr, 1, false, false},
    // alltoall's send counts are each rank's own
    {"alltoall", false, nullptr, false, false, "send counts", 1, false, false},
    {"reducescatter", false, "recv_counts", false, true, "recv counts", 0, false, false},
    {"barrier", false, nullptr, false, false, nullptr, kNoShape, true, false},
    {"join", false, nullptr, false, false, nullptr, kNoShape, false, false},
    {"add_process_set", false, "ranks", false, false, nullptr, kNoShape, false, false},
}};

}  // namespace

const OpTraits &traits(OpKind kind) {
  static const OpTraits kUnknown = {"unknown", false,    nullptr, false, false,
                                    nullptr,   kNoShape, false,   false};
  const auto index = static_cast<size_t>(kind);
  return index < kTraits.size() ? kTraits[index] : kUnknown;
}

const char *name_of(OpKind kind) { return traits(kind).name; }

}  // namespace perseus::comm
