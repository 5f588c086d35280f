#include "lib/launch/planning/rank_environment.h"

#include "lib/rendezvous/job_contract.h"

namespace perseus::launch {

EnvironmentChanges rank_environment(const Placement &placement, int rank, const JobFacts &job) {
  const RankPlace &p = placement.ranks.at(static_cast<size_t>(rank));
  const std::string size = std::to_string(placement.size());
  const std::string nodes = std::to_string(placement.nodes.size());
  const std::string r = std::to_string(p.rank);
  const std::string local_rank = std::to_string(p.local_rank);
  const std::string local_size = std::to_string(p.local_size);
  const std::string node_rank = std::to_string(p.node_rank);
  const std::string cross_rank = std::to_string(p.cross_rank);
  const std::string cross_size = std::to_string(p.cross_size);
  EnvironmentChanges changes = {
      // Open MPI. NODE_RANK is Open MPI's "rank among the processes on this node".
      {"OMPI_COMM_WORLD_RANK", r},
      {"OMPI_COMM_WORLD_SIZE", size},
      {"OMPI_COMM_WORLD_LOCAL_RANK", local_rank},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", local_size},
      {"OMPI_COMM_WORLD_NODE_RANK", local_rank},
      // torchrun / torch.distributed.launch, and NODE_RANK as PyTorch Lightning reads it.
      {"RANK", r},
      {"WORLD_SIZE", size},
      {"LOCAL_RANK", local_rank},
      {"LOCAL_WORLD_SIZE", local_size},
      {"GROUP_RANK", node_rank},
      {"GROUP_WORLD_SIZE", nodes},
      {"ROLE_RANK", r},
      {"ROLE_WORLD_SIZE", size},
      {"NODE_RANK", node_rank},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(job.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(job.max_restarts)},
      {"MASTER_ADDR", job.master_addr},
      {"MASTER_PORT", std::to_string(job.master_port)},
      // Horovod.
      {"HOROVOD_RANK", r},
      {"HOROVOD_SIZE", size},
      {"HOROVOD_LOCAL_RANK", local_rank},
      {"HOROVOD_LOCAL_SIZE", local_size},
      {"HOROVOD_CROSS_RANK", cross_rank},
      {"HOROVOD_CROSS_SIZE", cross_size},
      // Perseus (lib/rendezvous/job_contract.h).
      {contract::kRank, r},
      {contract::kSize, size},
      {contract::kLocalRank, local_rank},
      {contract::kLocalSize, local_size},
      {contract::kCrossRank, cross_rank},
      {contract::kCrossSize, cross_size},
      {contract::kNodeRank, node_rank},
      {contract::kNumNodes, nodes},
      {contract::kJobId, job.job_id},
      {contract::kRendezvousAddr, job.rendezvous_addr},
      {contract::kRendezvousPort, std::to_string(job.rendezvous_port)},
  };
  if (!job.library.empty()) changes.emplace_back(contract::kLibrary, job.library);
  if (!job.python_path.empty()) changes.emplace_back("PYTHONPATH", job.python_path);
  return changes;
}

}  // namespace perseus::launch
