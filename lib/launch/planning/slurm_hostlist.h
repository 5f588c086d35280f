#pragma once
// Slurm's compressed notations, as its commands and job environment write them:
//   host lists        "gpu[01-04,07],login1,rack[1-2]-n[1-3]"  (SLURM_JOB_NODELIST)
//   tasks per node    "8(x4),4,2(x2)"                          (SLURM_TASKS_PER_NODE)
// and the Slurm allocation they describe together. Pure functions; errors throw InputError
// with one line naming the variable and its value, what is wrong and how to fix it:
//   SLURM_JOB_NODELIST 'gpu[3-1]': the range 3-1 in entry 'gpu[3-1]' runs backwards; ...
// A host list entry is literal text (host name characters) and bracket groups of numbers and
// ranges; several groups expand as their product, the first group varying slowest, as Slurm's
// hostlist does. A range's lower bound gives the width: "[08-10]" is 08, 09, 10. At most
// kMaxSlurmHosts names come out of one value; a count is 1 to 65536.

#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/planning/host_spec.h"

namespace perseus::launch {

inline constexpr size_t kMaxSlurmHosts = 65536;

// The origin of the HostSpecs of an allocation.
inline constexpr const char *kSlurmAllocationOrigin = "Slurm allocation";

// Every host name of a compressed host list, in Slurm's order (duplicates kept). `origin` names
// where the value came from, for messages ("SLURM_JOB_NODELIST").
std::vector<std::string> expand_slurm_hostlist(std::string_view value, std::string_view origin);

// The count per node of "N(xK),M,...".
std::vector<int> expand_slurm_tasks_per_node(std::string_view value, std::string_view origin);

// The hosts of an allocation: each node of `nodelist` with its count from `tasks_per_node`
// (one count per node, or an error naming both variables), origin "Slurm allocation".
std::vector<HostSpec> slurm_allocation_hosts(std::string_view nodelist,
                                             std::string_view tasks_per_node);

}  // namespace perseus::launch
