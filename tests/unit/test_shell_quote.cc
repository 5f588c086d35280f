#include "lib/launch/shell_quote.h"

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace perseus::launch {
namespace {

// What /bin/sh makes of `printf %s <quoted>`: the only way to know the quoting is right.
std::string through_shell(const std::string &quoted) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    const std::string command = "printf %s " + quoted;
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char *>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string output;
  char buffer[4096];
  for (ssize_t n; (n = read(fds[0], buffer, sizeof buffer)) > 0;) {
    output.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  return output;
}

TEST_CASE("shell_quote survives a POSIX shell byte for byte") {
  std::string every_byte;
  for (int c = 1; c < 256; ++c) every_byte += static_cast<char>(c);
  for (const std::string &text :
       {std::string("/opt/perseus/bin/perseusrun"), std::string("it's"), std::string("'"),
        std::string("''"), std::string("a b\tc\nd"), std::string("$HOME `id` $(id) \\ \" ; | &"),
        std::string("-n"), every_byte}) {
    CAPTURE(text);
    CHECK(through_shell(shell_quote(text)) == text);
  }
}

TEST_CASE("shell_quote of the empty string is an empty argument") {
  CHECK(shell_quote("") == "''");
  CHECK(through_shell("x" + shell_quote("") + "y") == "xy");
}

}  // namespace
}  // namespace perseus::launch
