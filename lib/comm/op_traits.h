#pragma once
// What each collective is, one entry per OpKind: the rules the runtime's checks, the
// negotiation and the fusion plan read, instead of each switching on the kind. How each one
// runs on host and device memory is in ops/ (ops/ops.h), one file per op.

#include <cstddef>
#include <string>

#include "lib/comm/operation.h"

namespace perseus::comm {

struct OpTraits {
  const char *name;  // the C ABI's and the timeline's ("allreduce", ...)
  // What every rank must give alike, besides the operation, dtype, memory and process set (in
  // this order in a mismatch's message): the element count; the counts, under this name (null:
  // they may differ); the root; the reduce op and prescale/postscale.
  bool same_count;
  const char *same_counts;
  bool same_root;
  bool reduces;
  // Counts that hold one entry per member of the process set, named so in errors ("send
  // counts", "recv counts"); null when the counts are not per member.
  const char *counts_per_member;
  // Which part of a given shape must agree: 0 all of it; 1 all but the first dimension, which
  // each rank chooses (its rows); npos: the op takes no shape.
  size_t shape_agrees_from;
  // Horovod's join: whether a rank that has joined takes part (with zeros) or the op fails.
  bool runs_while_joined;
  // Whether the engine packs it with others of its kind into one fusion buffer.
  bool fusible;
};

const OpTraits &traits(OpKind kind);

}  // namespace perseus::comm
