#include <doctest/doctest.h>
#include <poll.h>

#include <string>
#include <vector>

#include "lib/launch/remote/agent_link.h"

namespace perseus::launch {
namespace {

// Reads the agent's stdout until it closes, as the launcher does.
void read_until_closed(AgentLink &link) {
  std::vector<Frame> frames;
  for (;;) {
    pollfd fd{link.channel().read_fd(), POLLIN, 0};
    REQUIRE(poll(&fd, 1, 5000) == 1);
    if (!link.channel().read_available(frames)) return;
  }
}

// The launcher asks failure() once an agent's connection has closed without its "done": each
// way an agent can end so is named, none is "".
TEST_CASE("a process agent that closed its connection says how it ended") {
  struct Row {
    const char *script;
    int wait_ms;
    const char *says;
  };
  const std::vector<Row> rows = {
      {"exit 7", 2000, "'sh' exited with code 7"},
      {"kill -9 $$", 2000, "'sh' was killed by signal 9"},
      {"exit 0", 2000, "'sh' exited with code 0 before saying it was done"},
      {"exec 1>&- sleep 30", 200, "closed its connection, and its process ('sh') had not exited"},
  };
  for (const Row &row : rows) {
    CAPTURE(row.script);
    auto link = start_process_agent({"sh", "-c", row.script}, "hostA");
    read_until_closed(*link);
    link->reap(row.wait_ms);
    const std::string why = link->failure();
    CHECK(why.find("the agent on hostA") == 0);
    CHECK(why.find(row.says) != std::string::npos);
  }
}

}  // namespace
}  // namespace perseus::launch
