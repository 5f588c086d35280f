#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/launcher/output_sink.h"
#include "lib/launch/launcher/output_tail.h"
#include "lib/launch/protocol/frame_channel.h"

namespace perseus::launch {
namespace {

std::string joined(const std::vector<std::string> &lines) {
  std::string out;
  for (const std::string &line : lines) out += line + "|";
  return out;
}

TEST_CASE("OutputTail keeps the last lines, in order, within its limits") {
  OutputTail tail;
  CHECK(tail.lines().empty());
  tail.feed("Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntime");
  tail.feed("Error: boom");
  CHECK(joined(tail.lines()) ==
        "Traceback (most recent call last):|  File \"x.py\", line 1|RuntimeError: boom|");
  tail.feed("\n");
  CHECK(tail.lines().size() == 3);
  for (int i = 0; i < 100; ++i) tail.feed("line " + std::to_string(i) + "\n");
  const std::vector<std::string> last = tail.lines();
  REQUIRE(last.size() == OutputTail::kMaxLines);
  CHECK(last.front() == "line 80");
  CHECK(last.back() == "line 99");
}

TEST_CASE("OutputTail cuts long lines and keeps at most kMaxBytes") {
  OutputTail tail;
  tail.feed(std::string(100000, 'a') + "\nlast\n");
  const std::vector<std::string> lines = tail.lines();
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].size() < OutputTail::kMaxLineBytes + 10);
  CHECK(lines[0].find("[...]") != std::string::npos);
  CHECK(lines[1] == "last");
  for (int i = 0; i < 30; ++i) tail.feed(std::string(1000, 'b') + "\n");
  size_t bytes = 0;
  for (const std::string &line : tail.lines()) bytes += line.size();
  CHECK(bytes <= OutputTail::kMaxBytes);
}

TEST_CASE("OutputSink: a pipe nobody reads never blocks; drop counts whole lines per rank") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  OutputSink sink(write_end.get(), "stdout");
  const std::string line = std::string(999, 'x') + "\n";
  for (int i = 0; i < 1000; ++i) sink.append(i % 2, line);  // 1 MB, more than the pipe takes
  sink.flush();                                             // returns: nothing blocks
  CHECK(sink.backlog() > 0);
  CHECK(sink.poll_fd() >= 0);
  const size_t left = sink.backlog();
  sink.drop();
  size_t lost_bytes = 0, lost_lines = 0;
  for (const auto &[rank, loss] : sink.losses()) {
    lost_bytes += loss.bytes;
    lost_lines += loss.lines;
  }
  CHECK(lost_bytes == left);
  CHECK(lost_lines == (left + line.size() - 1) / line.size());
  CHECK(sink.losses().size() == 2);
  CHECK_FALSE(sink.take_error().has_value());
  // What did arrive is whole lines and maybe the start of one: never two lines mixed.
  std::string got(1u << 20, '\0');
  const ssize_t n = read(read_end.get(), got.data(), got.size());
  REQUIRE(n > 0);
  got.resize(static_cast<size_t>(n));
  CHECK(got.find_first_not_of("x\n") == std::string::npos);
  CHECK(static_cast<size_t>(n) + left == 1000 * line.size());
}

TEST_CASE("OutputSink: /dev/full is an error said once, and the rest counted as lost") {
  UniqueFd full(open("/dev/full", O_WRONLY | O_CLOEXEC));
  REQUIRE(full.valid());
  OutputSink sink(full.get(), "stdout");
  sink.append(3, "hello\n");
  sink.flush();
  const std::optional<std::string> error = sink.take_error();
  REQUIRE(error.has_value());
  CHECK(error->find("space") != std::string::npos);
  CHECK_FALSE(sink.take_error().has_value());
  sink.append(3, "more\n");
  CHECK(sink.losses().at(3).lines == 2);
  CHECK(sink.losses().at(3).bytes == 11);
}

TEST_CASE("OutputSink: a reader that went away (EPIPE) drops silently") {
  ::signal(SIGPIPE, SIG_IGN);  // as perseusrun does
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  close(fds[0]);
  UniqueFd write_end(fds[1]);
  OutputSink sink(write_end.get(), "stdout");
  sink.append(0, "x\n");
  sink.flush();
  sink.append(0, "y\n");
  CHECK_FALSE(sink.take_error().has_value());
  CHECK(sink.losses().empty());
  CHECK_FALSE(sink.open());
}

TEST_CASE("FrameChannel: an oversized message names its size and the limit, not a version") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  FrameChannel sender{UniqueFd(open("/dev/null", O_RDONLY)), UniqueFd(fds[1]), "agent on h"};
  FrameChannel receiver{UniqueFd(fds[0]), UniqueFd(open("/dev/null", O_WRONLY)), "agent on h"};
  const std::string big(kMaxFramePayload + 1, 'j');
  CHECK_THROWS_WITH_AS(sender.send(FrameType::kJob, big),
                       doctest::Contains("a message of 67108865 bytes to the agent on h exceeds "
                                         "the limit of 67108864 bytes"),
                       LaunchError);
  // A header that announces too much, as a peer of another build could send.
  const unsigned char header[] = {2, 0x10, 0, 0, 0};
  REQUIRE(write(fds[1], header, sizeof header) == 5);
  std::vector<Frame> frames;
  CHECK_THROWS_WITH_AS(
      receiver.read_available(frames),
      doctest::Contains("a message of 268435456 bytes from the agent on h exceeds"), LaunchError);
}

}  // namespace
}  // namespace perseus::launch
