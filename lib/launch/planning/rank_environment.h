#pragma once
// The variables every rank gets, so that scripts written for mpirun, torchrun or horovodrun
// run unchanged (docs/USAGE.md lists them). A pure function of the placement.

#include <string>

#include "lib/launch/planning/placement.h"
#include "lib/launch/protocol/agent_protocol.h"

namespace perseus::launch {

struct JobFacts {
  std::string job_id;
  std::string master_addr;
  int master_port = 0;
  std::string rendezvous_addr;  // the launcher's key-value store (lib/rendezvous)
  int rendezvous_port = 0;
  std::string secret;  // bytes; to the agents only, never into an environment
  // Where ranks find libperseus and the `perseus` Python package (PERSEUS_LIBRARY, PYTHONPATH);
  // empty: left as the rank's environment has them.
  std::string library;
  std::string python_path;
  // torchrun's TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_MAX_RESTARTS (--max-restarts).
  int restart_count = 0;
  int max_restarts = 0;
};

EnvironmentChanges rank_environment(const Placement &placement, int rank, const JobFacts &job);

}  // namespace perseus::launch
