#pragma once
// Reaching the nodes of a Slurm allocation without SSH: each host's agent is the one task of a
// job step of its own (srun --nodes=1 --ntasks=1 --nodelist=HOST --overlap ...), on srun's
// stdin and stdout, so the launcher talks to it as to any child-process agent.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lib/launch/remote/agent_link.h"

namespace perseus::launch {

// The srun command line that starts `program --agent` as the only task of a step on `node`.
std::vector<std::string> srun_agent_command(const std::string &node, const std::string &program);

// Each node's address as Slurm knows it (NodeAddr, from sinfo), for the nodes whose names
// Slurm lists; empty when sinfo cannot be run or knows none of them.
std::map<std::string, std::string> slurm_node_addresses(const std::vector<std::string> &nodes);

}  // namespace perseus::launch
