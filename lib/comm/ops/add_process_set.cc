// add_process_set: the engine has made the set (its members connected) when the ranks agreed;
// the request's result is the new set's number.

#include "lib/comm/ops/ops.h"

namespace perseus::comm::ops {

void add_process_set_on_host(HostExecutor &, const OpRun &run) {
  if (run.request) run.request->created_set = run.agreed.created_set;
}

}  // namespace perseus::comm::ops
