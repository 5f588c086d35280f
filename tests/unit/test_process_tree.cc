#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include "lib/launch/agent/process_tree.h"
#include "lib/launch/system_call.h"

namespace perseus::launch {
namespace {

TEST_CASE("parse_stat_parent reads the parent pid of real-looking stat texts") {
  struct Row {
    std::string stat;
    pid_t parent;
  };
  const std::vector<Row> rows = {
      {"1 (systemd) S 0 1 1 0 -1 4194560 49163 1620921 109 1181 111 177 2693 1338 20 0 1 0 "
       "29 172384256 3191 18446744073709551615 1 1 0 0 0 0 671173123 4096 1260 0 0 0 17 3 0 0 "
       "0 0 0 0 0 0 0 0 0 0 0\n",
       0},
      {"4242 (python3) R 4100 4242 4100 34816 4242 4194304 2101 0 0 0 3 1 0 0 20 0 1 0 "
       "123456 27000832 2478 18446744073709551615\n",
       4100},
      {"77 (my prog) S 12 77 77 0 -1", 12},
      {"78 (a) b) S 13 78", 13},
      {"79 ((nested)) S 14 79", 14},
      {"80 (x(y) S 15", 15},
      {"81 ()) (S 1 ) S 16 81", 16},
      {"82 ( ) Z 17 82", 17},
      {"83 () S 18 83", 18},
      {"84 (tab\tname) D 19 84", 19},
      {"85 (kworker/0:1-events) I 2 0 0 0 -1 69238880", 2},
      {"86 (x) S 4194304 1", 4194304},
  };
  for (const Row &row : rows) {
    CAPTURE(row.stat);
    CHECK(parse_stat_parent(row.stat) == std::optional<pid_t>(row.parent));
  }
}

TEST_CASE("parse_stat_parent refuses malformed texts") {
  for (const std::string stat : {"", "1", "1 (name", "1 name S 2", "1 (x)", "1 (x) ", "1 (x) S",
                                 "1 (x) S ", "1 (x) S abc", "1 (x) S  ", "garbage", "1 (x) S )"}) {
    CAPTURE(stat);
    CHECK(parse_stat_parent(stat) == std::nullopt);
  }
}

// BUG (minor, robustness only: the kernel never writes such texts): the parser takes the number
// at the start of the fourth field without checking that the field ends there or that a "("
// opened the name, so "1 (x) S 12abc" gives 12, "1 x) S 2" gives 2 and "1 (x) S -5" gives -5.
TEST_CASE("parse_stat_parent refuses a malformed parent field") {
  for (const std::string stat : {"1 (x) S 12abc 1", "1 x) S 2 1", "1 (x) S -5 1"}) {
    CAPTURE(stat);
    CHECK(parse_stat_parent(stat) == std::nullopt);
  }
}

// Waits up to `timeout_ms` for a byte on `fd`; returns it, or nullopt on timeout or EOF.
std::optional<char> read_byte(int fd, int timeout_ms = 5000) {
  pollfd entry{fd, POLLIN, 0};
  if (retry_on_eintr([&] { return ::poll(&entry, 1, timeout_ms); }) != 1) return std::nullopt;
  char byte = 0;
  if (retry_on_eintr([&] { return ::read(fd, &byte, 1); }) != 1) return std::nullopt;
  return byte;
}

bool contains(const std::vector<pid_t> &pids, pid_t pid) {
  return std::find(pids.begin(), pids.end(), pid) != pids.end();
}

// A child in a process group of its own that forks a grandchild; both sleep until killed.
// The child reaps the grandchild and reports it on `events` ('g'), so that a test can wait for
// the grandchild's end. The destructor kills the whole group and reaps what the test started,
// whatever the test's assertions did. While it lives, this process is a child subreaper, so an
// orphaned grandchild comes back here to be reaped.
class ProcessFamily {
 public:
  ProcessFamily() {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    Pipe pipe = make_pipe();
    child_ = ::fork();
    REQUIRE(child_ >= 0);
    if (child_ == 0) run_child(pipe.write_end.get());
    pipe.write_end.reset();
    events_ = std::move(pipe.read_end);
    // No REQUIRE from here on: the destructor would not run. grandchild() stays -1 on failure.
    pid_t grandchild = 0;
    char *bytes = reinterpret_cast<char *>(&grandchild);
    for (size_t i = 0; i < sizeof grandchild; ++i) {
      const std::optional<char> got = read_byte(events_.get());
      if (!got) return;
      bytes[i] = *got;
    }
    grandchild_ = grandchild;
  }

  ~ProcessFamily() {
    // The group is the child's; its id cannot be reused while the child is unreaped.
    ::kill(-child_, SIGKILL);
    ::kill(child_, SIGKILL);
    retry_on_eintr([&] { return ::waitpid(child_, nullptr, 0); });
    // The grandchild: reaped by the child already (ECHILD), or an orphan reparented here.
    if (grandchild_ > 0) retry_on_eintr([&] { return ::waitpid(grandchild_, nullptr, 0); });
    ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }

  ProcessFamily(const ProcessFamily &) = delete;
  ProcessFamily &operator=(const ProcessFamily &) = delete;

  pid_t child() const { return child_; }
  pid_t grandchild() const { return grandchild_; }
  int events() const { return events_.get(); }

 private:
  [[noreturn]] static void run_child(int events) {
    ::setpgid(0, 0);  // before the pid is sent, so that the destructor's kill(-pid) finds both
    const pid_t grandchild = ::fork();
    if (grandchild == 0) {
      for (;;) ::pause();
    }
    if (grandchild < 0) ::_exit(1);
    const bool sent = write_all(
        events, std::string_view(reinterpret_cast<const char *>(&grandchild), sizeof grandchild));
    if (!sent) ::_exit(1);
    while (::waitpid(grandchild, nullptr, 0) == -1 && errno == EINTR) {
    }
    write_all(events, "g");
    for (;;) ::pause();
  }

  pid_t child_ = -1;
  pid_t grandchild_ = -1;
  UniqueFd events_;
};

// Another child of this process, unrelated to the family.
class Sleeper {
 public:
  Sleeper() : pid_(::fork()) {
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      for (;;) ::pause();
    }
  }
  ~Sleeper() {
    ::kill(pid_, SIGKILL);
    retry_on_eintr([&] { return ::waitpid(pid_, nullptr, 0); });
  }
  Sleeper(const Sleeper &) = delete;
  Sleeper &operator=(const Sleeper &) = delete;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_;
};

TEST_CASE("descendants_of finds children and grandchildren") {
  ProcessFamily family;
  Sleeper sleeper;
  REQUIRE(family.grandchild() > 0);
  REQUIRE(family.grandchild() != family.child());

  const std::vector<pid_t> mine = descendants_of(::getpid());
  CHECK(contains(mine, family.child()));
  CHECK(contains(mine, family.grandchild()));
  CHECK(contains(mine, sleeper.pid()));
  CHECK_FALSE(contains(mine, ::getpid()));
  CHECK_FALSE(contains(mine, ::getppid()));

  const std::vector<pid_t> below_child = descendants_of(family.child());
  CHECK(below_child == std::vector<pid_t>{family.grandchild()});

  CHECK(descendants_of(family.grandchild()).empty());
  CHECK(descendants_of(sleeper.pid()).empty());
}

TEST_CASE("signal_descendants kills the grandchild and only it") {
  ProcessFamily family;
  Sleeper sleeper;
  REQUIRE(family.grandchild() > 0);
  CHECK(signal_descendants(family.child(), SIGKILL) == 1);
  // The child reaps the grandchild and says so.
  CHECK(read_byte(family.events()) == std::optional<char>('g'));
  CHECK(descendants_of(family.child()).empty());
  // The child and the unrelated sleeper live on.
  CHECK(::kill(family.child(), 0) == 0);
  CHECK(::kill(sleeper.pid(), 0) == 0);
  CHECK(::waitpid(family.child(), nullptr, WNOHANG) == 0);
  CHECK(::waitpid(sleeper.pid(), nullptr, WNOHANG) == 0);
  CHECK(signal_descendants(family.child(), SIGKILL) == 0);
}

TEST_CASE("descendants_of and signal_descendants leave out the skipped subtree") {
  ProcessFamily family;
  Sleeper sleeper;
  REQUIRE(family.grandchild() > 0);
  const std::vector<pid_t> mine = descendants_of(::getpid(), family.child());
  CHECK_FALSE(contains(mine, family.child()));
  CHECK_FALSE(contains(mine, family.grandchild()));
  CHECK(contains(mine, sleeper.pid()));
  CHECK(signal_descendants(::getpid(), 0, family.child()) == static_cast<int>(mine.size()));
}

TEST_CASE("descendants_of_any finds what is below any root") {
  ProcessFamily family;
  Sleeper sleeper;
  REQUIRE(family.grandchild() > 0);
  std::vector<pid_t> below = descendants_of_any({family.child(), sleeper.pid()});
  CHECK(below == std::vector<pid_t>{family.grandchild()});
  CHECK(descendants_of_any({}).empty());
}

TEST_CASE("parse_stat_start_time reads field 22") {
  const std::string stat =
      "4242 (py thon) R 4100 4242 4100 34816 4242 4194304 2101 0 0 0 3 1 0 0 20 0 1 0 "
      "123456 27000832 2478 18446744073709551615\n";
  CHECK(parse_stat_start_time(stat) == std::optional<unsigned long long>(123456));
  CHECK(parse_stat_start_time("1 (x) S 0 1 1 0 -1 4 5 6 7 8 9 10 11 12 13 14 15 16 99") ==
        std::optional<unsigned long long>(99));
  for (const std::string bad : {"", "1 (x) S 0 1",
                                "1 (x) S 0 1 1 0 -1 4 5 6 7 8 9 10 11 12 13 "
                                "14 15 16 abc 1"}) {
    CAPTURE(bad);
    CHECK(parse_stat_start_time(bad) == std::nullopt);
  }
}

TEST_CASE("start_time_of names a live process, not a reaped one") {
  const auto own = start_time_of(::getpid());
  REQUIRE(own.has_value());
  Sleeper sleeper;
  const auto child = start_time_of(sleeper.pid());
  REQUIRE(child.has_value());
  CHECK(*child >= *own);
  CHECK(start_time_of(0x7ffffff0) == std::nullopt);
}

TEST_CASE("a process without children has no descendants") {
  CHECK(descendants_of(0x7ffffff0).empty());
  CHECK(signal_descendants(0x7ffffff0, 0) == 0);
}

TEST_CASE("zombies are not descendants") {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  // Wait until it is a zombie, without reaping it.
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT) == 0);
  const std::vector<pid_t> mine = descendants_of(::getpid());
  CHECK_FALSE(contains(mine, child));
  CHECK(::waitpid(child, nullptr, 0) == child);
}

}  // namespace
}  // namespace perseus::launch
