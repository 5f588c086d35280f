#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/comm/error.h"
#include "lib/comm/job_environment.h"

namespace perseus::comm {
namespace {

using Variables = std::map<std::string, std::string>;
using std::chrono::milliseconds;

// read_job_environment takes a plain function pointer, so the fake environment it looks in is
// a global that FakeEnvironment points at while it lives.
const Variables *g_variables = nullptr;

const char *fake_lookup(const char *name) {
  REQUIRE(g_variables != nullptr);
  const auto found = g_variables->find(name);
  return found == g_variables->end() ? nullptr : found->second.c_str();
}

class FakeEnvironment {
 public:
  explicit FakeEnvironment(const Variables &variables) : previous_(g_variables) {
    g_variables = &variables;
  }
  ~FakeEnvironment() { g_variables = previous_; }
  FakeEnvironment(const FakeEnvironment &) = delete;
  FakeEnvironment &operator=(const FakeEnvironment &) = delete;

 private:
  const Variables *previous_;
};

JobEnvironment read(const Variables &variables) {
  const FakeEnvironment fake(variables);
  return read_job_environment(fake_lookup);
}

// The error reading `variables` throws, or nullopt (and a failed check) when none.
std::optional<Error> error_of(const Variables &variables) {
  try {
    (void)read(variables);
  } catch (const Error &e) {
    return e;
  }
  FAIL_CHECK("read_job_environment threw nothing");
  return std::nullopt;
}

bool contains(const std::string &text, const std::string &part) {
  return text.find(part) != std::string::npos;
}

// What perseusrun gives rank 5 of 8: 2 hosts of 4 ranks each.
Variables full_environment() {
  return {
      {"PERSEUS_RENDEZVOUS_ADDR", "node-a"},
      {"PERSEUS_RENDEZVOUS_PORT", "29500"},
      {"PERSEUS_SECRET_FILE", "/tmp/perseus-secret"},
      {"PERSEUS_RANK", "5"},
      {"PERSEUS_SIZE", "8"},
      {"PERSEUS_LOCAL_RANK", "1"},
      {"PERSEUS_LOCAL_SIZE", "4"},
      {"PERSEUS_CROSS_RANK", "1"},
      {"PERSEUS_CROSS_SIZE", "2"},
      {"PERSEUS_JOB_ID", "perseus-job-42"},
      {"PERSEUS_NODE_RANK", "1"},
      // perseusrun sets this too; libperseus does not read it.
      {"PERSEUS_NUM_NODES", "2"},
  };
}

const char *const kRequired[] = {
    "PERSEUS_RENDEZVOUS_ADDR",
    "PERSEUS_RENDEZVOUS_PORT",
    "PERSEUS_SECRET_FILE",
    "PERSEUS_RANK",
    "PERSEUS_SIZE",
    "PERSEUS_LOCAL_RANK",
    "PERSEUS_LOCAL_SIZE",
    "PERSEUS_CROSS_RANK",
    "PERSEUS_CROSS_SIZE",
};

const char *const kRequiredNumbers[] = {
    "PERSEUS_RENDEZVOUS_PORT", "PERSEUS_RANK",       "PERSEUS_SIZE",       "PERSEUS_LOCAL_RANK",
    "PERSEUS_LOCAL_SIZE",      "PERSEUS_CROSS_RANK", "PERSEUS_CROSS_SIZE",
};

TEST_CASE("job environment: every variable present") {
  const JobEnvironment e = read(full_environment());
  CHECK(e.rendezvous_addr == "node-a");
  CHECK(e.rendezvous_port == 29500);
  CHECK(e.secret_file == "/tmp/perseus-secret");
  CHECK(e.rank == 5);
  CHECK(e.size == 8);
  CHECK(e.local_rank == 1);
  CHECK(e.local_size == 4);
  CHECK(e.cross_rank == 1);
  CHECK(e.cross_size == 2);
  CHECK(e.node_rank == 1);
  CHECK(e.job_id == "perseus-job-42");
  CHECK(e.init_timeout == milliseconds(60'000));
  CHECK(e.collective_timeout == milliseconds(1'800'000));
  CHECK(e.gloo_iface.empty());
}

TEST_CASE("job environment: optional variables") {
  SUBCASE("no job id") {
    Variables variables = full_environment();
    variables.erase("PERSEUS_JOB_ID");
    CHECK(read(variables).job_id.empty());
  }
  SUBCASE("no node rank: ranks are grouped by host name") {
    Variables variables = full_environment();
    variables.erase("PERSEUS_NODE_RANK");
    CHECK(read(variables).node_rank == -1);
  }
  SUBCASE("a malformed node rank is a rendezvous error naming it") {
    Variables variables = full_environment();
    variables["PERSEUS_NODE_RANK"] = "one";
    try {
      read(variables);
      FAIL("accepted");
    } catch (const Error &error) {
      CHECK(error.code() == Code::kRendezvous);
      CHECK(contains(error.what(), "PERSEUS_NODE_RANK='one'"));
    }
  }
  SUBCASE("timeouts and interface") {
    Variables variables = full_environment();
    variables["PERSEUS_INIT_TIMEOUT"] = "5";
    variables["PERSEUS_COLLECTIVE_TIMEOUT"] = "604800";  // a week, the most allowed
    variables["PERSEUS_GLOO_IFACE"] = "eth1";
    const JobEnvironment e = read(variables);
    CHECK(e.init_timeout == milliseconds(5'000));
    CHECK(e.collective_timeout == milliseconds(604'800'000));
    CHECK(e.gloo_iface == "eth1");
  }
  SUBCASE("empty timeouts keep the defaults") {
    Variables variables = full_environment();
    variables["PERSEUS_INIT_TIMEOUT"] = "";
    variables["PERSEUS_COLLECTIVE_TIMEOUT"] = "";
    const JobEnvironment e = read(variables);
    CHECK(e.init_timeout == milliseconds(60'000));
    CHECK(e.collective_timeout == milliseconds(1'800'000));
  }
  SUBCASE("a single rank") {
    const JobEnvironment e = read({
        {"PERSEUS_RENDEZVOUS_ADDR", "127.0.0.1"},
        {"PERSEUS_RENDEZVOUS_PORT", "1"},
        {"PERSEUS_SECRET_FILE", "s"},
        {"PERSEUS_RANK", "0"},
        {"PERSEUS_SIZE", "1"},
        {"PERSEUS_LOCAL_RANK", "0"},
        {"PERSEUS_LOCAL_SIZE", "1"},
        {"PERSEUS_CROSS_RANK", "0"},
        {"PERSEUS_CROSS_SIZE", "1"},
    });
    CHECK(e.rank == 0);
    CHECK(e.size == 1);
    CHECK(e.rendezvous_port == 1);
    CHECK(e.job_id.empty());
  }
  SUBCASE("the largest port and ranks") {
    Variables variables = full_environment();
    variables["PERSEUS_RENDEZVOUS_PORT"] = "65535";
    variables["PERSEUS_RANK"] = "2147483646";
    variables["PERSEUS_SIZE"] = "2147483647";
    const JobEnvironment e = read(variables);
    CHECK(e.rendezvous_port == 65535);
    CHECK(e.rank == 2147483646);
    CHECK(e.size == 2147483647);
  }
}

TEST_CASE("job environment: each missing variable is a rendezvous error naming it") {
  for (const char *name : kRequired) {
    for (const bool empty : {false, true}) {
      INFO(name << (empty ? " empty" : " unset"));
      Variables variables = full_environment();
      if (empty) {
        variables[name] = "";
      } else {
        variables.erase(name);
      }
      const std::optional<Error> error = error_of(variables);
      REQUIRE(error.has_value());
      CHECK(error->code() == Code::kRendezvous);
      CHECK(contains(error->what(), std::string(name) + " is not set"));
      CHECK(contains(error->what(), "perseusrun"));
    }
  }
}

TEST_CASE("job environment: nothing set names the rendezvous address first") {
  const std::optional<Error> error = error_of({});
  REQUIRE(error.has_value());
  CHECK(error->code() == Code::kRendezvous);
  CHECK(contains(error->what(), "PERSEUS_RENDEZVOUS_ADDR is not set"));
}

TEST_CASE("job environment: no launcher's variable means a process started alone") {
  {
    const Variables tuning = {{"PERSEUS_SHM", "0"},
                              {"PERSEUS_INIT_TIMEOUT", "7"},
                              {"PERSEUS_GLOO_IFACE", "lo"},
                              {"OMPI_MCA_btl", "^openib"},
                              {"MASTER_ADDR", "10.0.0.1"}};
    const FakeEnvironment fake(tuning);
    CHECK(launcher_variables(fake_lookup).empty());
    const JobEnvironment e = alone_job_environment(fake_lookup);
    CHECK(e.rank == 0);
    CHECK(e.size == 1);
    CHECK(e.local_rank == 0);
    CHECK(e.local_size == 1);
    CHECK(e.cross_rank == 0);
    CHECK(e.cross_size == 1);
    CHECK(e.node_rank == 0);
    CHECK(e.rendezvous_addr.empty());
    CHECK(e.init_timeout == std::chrono::seconds(7));
    CHECK(e.gloo_iface == "lo");
  }
  for (const char *name :
       {"PERSEUS_RANK", "PERSEUS_SECRET_FILE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID",
        "PMI_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "HOROVOD_RANK"}) {
    INFO(name);
    const Variables one = {{name, "3"}, {"PERSEUS_SHM", "0"}};
    const FakeEnvironment fake(one);
    CHECK(launcher_variables(fake_lookup) == std::string(name) + "=3");
  }
  const Variables two = {{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"PERSEUS_RANK", ""}};
  const FakeEnvironment fake(two);
  CHECK(launcher_variables(fake_lookup) == "RANK=1, WORLD_SIZE=2");  // empty ones do not count
}

TEST_CASE("job environment: a missing variable names the launcher's variables that are set") {
  const std::optional<Error> error = error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  REQUIRE(error.has_value());
  CHECK(error->code() == Code::kRendezvous);
  CHECK(contains(error->what(), "PERSEUS_RENDEZVOUS_ADDR is not set"));
  CHECK(contains(error->what(), "(RANK=1, WORLD_SIZE=2)"));
  CHECK(contains(error->what(), "unset those variables to run it alone"));
}

TEST_CASE("job environment: each malformed number is a rendezvous error naming it and the value") {
  const std::vector<std::string> malformed = {
      "abc", "3x", " 3", "3 ", "+3", "0x10", "1.5", "1e3", "99999999999", "-",
  };
  for (const char *name : kRequiredNumbers) {
    for (const std::string &value : malformed) {
      INFO(name << "='" << value << "'");
      Variables variables = full_environment();
      variables[name] = value;
      const std::optional<Error> error = error_of(variables);
      REQUIRE(error.has_value());
      CHECK(error->code() == Code::kRendezvous);
      CHECK(contains(error->what(), std::string(name) + "='" + value + "'"));
    }
  }
}

TEST_CASE("job environment: numbers out of range") {
  const struct {
    const char *name;
    const char *value;
  } kCases[] = {
      {"PERSEUS_RENDEZVOUS_PORT", "0"},
      {"PERSEUS_RENDEZVOUS_PORT", "65536"},
      {"PERSEUS_RENDEZVOUS_PORT", "-1"},
      {"PERSEUS_RANK", "-1"},
      {"PERSEUS_SIZE", "0"},
      {"PERSEUS_SIZE", "-8"},
      {"PERSEUS_LOCAL_RANK", "-1"},
      {"PERSEUS_LOCAL_SIZE", "0"},
      {"PERSEUS_CROSS_RANK", "-1"},
      {"PERSEUS_CROSS_SIZE", "0"},
      {"PERSEUS_RANK", "2147483648"},
  };
  for (const auto &c : kCases) {
    INFO(c.name << "='" << c.value << "'");
    Variables variables = full_environment();
    variables[c.name] = c.value;
    const std::optional<Error> error = error_of(variables);
    REQUIRE(error.has_value());
    CHECK(error->code() == Code::kRendezvous);
    CHECK(contains(error->what(), std::string(c.name) + "='" + c.value + "'"));
  }
}

TEST_CASE("job environment: a rank not below its size is a rendezvous error") {
  const struct {
    const char *rank;
    const char *value;
    const char *names;
  } kCases[] = {
      {"PERSEUS_RANK", "8", "PERSEUS_RANK/PERSEUS_SIZE"},
      {"PERSEUS_RANK", "9", "PERSEUS_RANK/PERSEUS_SIZE"},
      {"PERSEUS_LOCAL_RANK", "4", "PERSEUS_LOCAL_RANK/PERSEUS_LOCAL_SIZE"},
      {"PERSEUS_CROSS_RANK", "2", "PERSEUS_CROSS_RANK/PERSEUS_CROSS_SIZE"},
  };
  for (const auto &c : kCases) {
    INFO(c.rank << "=" << c.value);
    Variables variables = full_environment();
    variables[c.rank] = c.value;
    const std::optional<Error> error = error_of(variables);
    REQUIRE(error.has_value());
    CHECK(error->code() == Code::kRendezvous);
    CHECK(contains(error->what(), c.names));
    CHECK(contains(error->what(), std::string("rank ") + c.value + " is not below"));
  }
}

TEST_CASE("job environment: a malformed timeout is an invalid argument naming it") {
  for (const char *name : {"PERSEUS_INIT_TIMEOUT", "PERSEUS_COLLECTIVE_TIMEOUT"}) {
    for (const char *value : {"0", "-5", "abc", "1.5", "10s", "604801", "99999999999"}) {
      INFO(name << "='" << value << "'");
      Variables variables = full_environment();
      variables[name] = value;
      const std::optional<Error> error = error_of(variables);
      REQUIRE(error.has_value());
      CHECK(error->code() == Code::kInvalidArgument);
      CHECK(contains(error->what(), std::string(name) + "='" + value + "'"));
    }
  }
}

// Sets (or unsets) environment variables for one scope and restores what was there before.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const Variables &set, const std::vector<std::string> &unset) {
    for (const auto &[name, value] : set) {
      remember(name);
      ::setenv(name.c_str(), value.c_str(), 1);
    }
    for (const std::string &name : unset) {
      remember(name);
      ::unsetenv(name.c_str());
    }
  }
  ~ScopedEnvironment() {
    for (auto saved = saved_.rbegin(); saved != saved_.rend(); ++saved) {
      if (saved->second) {
        ::setenv(saved->first.c_str(), saved->second->c_str(), 1);
      } else {
        ::unsetenv(saved->first.c_str());
      }
    }
  }
  ScopedEnvironment(const ScopedEnvironment &) = delete;
  ScopedEnvironment &operator=(const ScopedEnvironment &) = delete;

 private:
  void remember(const std::string &name) {
    const char *value = std::getenv(name.c_str());
    saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// The lookup c_api.cc gives read_job_environment.
const char *process_lookup(const char *name) { return std::getenv(name); }

TEST_CASE("job environment: read from the process environment, as perseus_init does") {
  const std::vector<std::string> optional = {"PERSEUS_INIT_TIMEOUT", "PERSEUS_COLLECTIVE_TIMEOUT",
                                             "PERSEUS_GLOO_IFACE"};
  {
    const ScopedEnvironment scoped(full_environment(), optional);
    const JobEnvironment e = read_job_environment(process_lookup);
    CHECK(e.rank == 5);
    CHECK(e.size == 8);
    CHECK(e.rendezvous_addr == "node-a");
    CHECK(e.job_id == "perseus-job-42");
  }
  {
    std::vector<std::string> unset = optional;
    unset.emplace_back("PERSEUS_RENDEZVOUS_ADDR");
    Variables set = full_environment();
    set.erase("PERSEUS_RENDEZVOUS_ADDR");
    const ScopedEnvironment scoped(set, unset);
    try {
      (void)read_job_environment(process_lookup);
      FAIL("no error");
    } catch (const Error &e) {
      CHECK(e.code() == Code::kRendezvous);
      CHECK(contains(e.what(), "PERSEUS_RENDEZVOUS_ADDR is not set"));
    }
  }
}

}  // namespace
}  // namespace perseus::comm
