#pragma once
// Which of a cycle's agreed operations run together: a pure function of the agreed list, so
// that every rank, given the same list, makes the same plan.

#include <cstddef>
#include <vector>

#include "lib/comm/negotiation.h"

namespace perseus::comm {

// Whether an agreed operation may be packed with others: an all-reduce the ranks agreed on.
bool fusible(const Agreed &agreed);

// Groups of indexes into `ready`, in the order they run. An all-reduce the ranks agreed on
// takes into its group the later ones with the same type, op, prescale, postscale, process set
// and memory kind (host or device) while they fit within `threshold` bytes together, in agreed
// order, skipping those that do not fit (they start groups of their own later); a larger one
// runs alone. Every other operation, and every one that failed agreement, is a group of one.
// threshold 0: no fusion.
std::vector<std::vector<size_t>> plan_fusion(const std::vector<Agreed> &ready, size_t threshold);

}  // namespace perseus::comm
