#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <csignal>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/protocol/agent_protocol.h"
#include "lib/launch/protocol/frame_channel.h"
#include "lib/launch/system_call.h"

namespace perseus::launch {
namespace {

using nlohmann::json;

constexpr const char *kPeer = "agent on node7";

// Every byte from 1 to 255, in order.
std::string all_nonzero_bytes() {
  std::string bytes;
  for (int byte = 1; byte <= 255; ++byte) bytes.push_back(static_cast<char>(byte));
  return bytes;
}

// Strings a shell or a text codec would mangle.
std::vector<std::string> awkward_strings() {
  std::vector<std::string> strings = {all_nonzero_bytes(),
                                      "",
                                      "it's \"quoted\"",
                                      "$HOME ${PATH} $(rm -rf /)",
                                      "`id` and `uname`",
                                      "line one\nline two\r\n",
                                      " leading and trailing spaces ",
                                      "\xff\xfe\x80 not UTF-8 \xc3\x28",
                                      "caf\xc3\xa9 \xe2\x82\xac"};
  for (int byte = 1; byte <= 255; ++byte) strings.emplace_back(1, static_cast<char>(byte));
  return strings;
}

std::string cbor(const json &value) {
  const std::vector<std::uint8_t> bytes = json::to_cbor(value);
  return std::string(bytes.begin(), bytes.end());
}

json bytes_of(const std::string &text) {
  return json::binary(std::vector<std::uint8_t>(text.begin(), text.end()));
}

void check_same(const Hello &got, const Hello &want) {
  CHECK(got.version == want.version);
  CHECK(got.protocol == want.protocol);
  CHECK(got.hostname == want.hostname);
  CHECK(got.cpu_count == want.cpu_count);
  CHECK(got.gpu_count == want.gpu_count);
  CHECK(got.cuda_visible_devices == want.cuda_visible_devices);
}

void check_same(const JobDescription &got, const JobDescription &want) {
  CHECK(got.job_id == want.job_id);
  CHECK(got.host_label == want.host_label);
  CHECK(got.argv == want.argv);
  CHECK(got.working_directory == want.working_directory);
  CHECK(got.stdin_rank == want.stdin_rank);
  CHECK(got.kill_grace_seconds == want.kill_grace_seconds);
  CHECK(got.heartbeat_timeout_seconds == want.heartbeat_timeout_seconds);
  CHECK(got.elastic == want.elastic);
  CHECK(got.common_environment == want.common_environment);
  REQUIRE(got.ranks.size() == want.ranks.size());
  for (size_t i = 0; i < want.ranks.size(); ++i) {
    CHECK(got.ranks[i].rank == want.ranks[i].rank);
    CHECK(got.ranks[i].environment == want.ranks[i].environment);
  }
}

TEST_CASE("Hello round trips with and without the GPU facts") {
  Hello full{"0.1.0", kProtocolVersion, "node7.cluster", 96, 8, "0,1,GPU-1234abcd"};
  Hello no_driver{"0.1.0", kProtocolVersion, "node8", 4, std::nullopt, std::nullopt};
  Hello zero_gpus{"0.1.0", 7, "n", 1, 0, std::nullopt};
  Hello empty_visible{"0.1.0", kProtocolVersion, "n", 2, 4, ""};
  for (const Hello &hello : {full, no_driver, zero_gpus, empty_visible}) {
    CAPTURE(hello.hostname);
    check_same(decode_hello(encode(hello), kPeer), hello);
  }
}

TEST_CASE("JobDescription round trips argv, environment and cwd byte for byte") {
  const std::vector<std::string> strings = awkward_strings();
  JobDescription job;
  job.job_id = "perseus-1234-abcd";
  job.host_label = "alice@node7";
  job.argv = strings;
  job.working_directory = "/tmp/dir with $pace/\xff\xfe";
  job.stdin_rank = 3;
  job.kill_grace_seconds = 2.5;
  job.heartbeat_timeout_seconds = 7.5;
  job.elastic = true;
  EnvironmentChanges environment;
  for (size_t i = 0; i < strings.size(); ++i) {
    environment.emplace_back("NAME_" + std::to_string(i), strings[i]);
  }
  environment.emplace_back(all_nonzero_bytes(), all_nonzero_bytes());
  environment.emplace_back("", "");
  job.ranks = {RankLaunch{3, environment}, RankLaunch{4, {}}, RankLaunch{1048575, {{"A", "b"}}}};
  check_same(decode_job(encode(job), kPeer), job);
}

TEST_CASE("JobDescription round trips when empty") {
  JobDescription job;
  check_same(decode_job(encode(job), kPeer), job);
  job.argv = {""};
  check_same(decode_job(encode(job), kPeer), job);
}

TEST_CASE("RankStarted, RankExited, AgentError, Terminate and counts round trip") {
  const RankStarted started = decode_started(encode(RankStarted{5, 4242}), kPeer);
  CHECK(started.rank == 5);
  CHECK(started.pid == 4242);

  for (const RankExited &exited :
       {RankExited{0, 100, 0, 0}, RankExited{7, 101, 3, 0}, RankExited{1048575, INT_MAX, 0, 9}}) {
    const RankExited got = decode_exited(encode(exited), kPeer);
    CHECK(got.rank == exited.rank);
    CHECK(got.pid == exited.pid);
    CHECK(got.exit_code == exited.exit_code);
    CHECK(got.signal == exited.signal);
  }

  const AgentError error = decode_error(encode(AgentError{"cannot fork: \xff", 126}), kPeer);
  CHECK(error.message == "cannot fork: \xff");
  CHECK(error.exit_code == 126);

  for (double grace : {0.0, 0.25, 5.0, 3600.0}) {
    CHECK(decode_terminate(encode(Terminate{grace}), kPeer).grace_seconds == grace);
  }
  for (size_t count : {size_t{0}, size_t{1}, size_t{65536}, size_t{1} << 40}) {
    CHECK(decode_count(encode_count(count), kPeer) == count);
  }
}

TEST_CASE("OutputChunk round trips binary bytes and large ranks") {
  std::string binary;
  for (int byte = 0; byte <= 255; ++byte) binary.push_back(static_cast<char>(byte));
  for (int rank : {0, 1, 255, 256, 65535, 65536, 1048575, INT_MAX}) {
    for (OutputStream stream : {OutputStream::kStdout, OutputStream::kStderr}) {
      for (const std::string &bytes : {std::string(), binary, std::string(100000, '\0')}) {
        CAPTURE(rank);
        const OutputChunk got = decode_output(encode(OutputChunk{rank, stream, bytes}), kPeer);
        CHECK(got.rank == rank);
        CHECK(got.stream == stream);
        CHECK(got.bytes == bytes);
      }
    }
  }
}

TEST_CASE("OutputChunk is 4 bytes of big-endian rank, 1 byte of stream, then the bytes") {
  const std::string payload = encode(OutputChunk{0x01020304, OutputStream::kStderr, "hi"});
  CHECK(payload == std::string("\x01\x02\x03\x04\x02hi", 7));
}

TEST_CASE("a malformed output chunk throws LaunchError naming the peer") {
  const std::vector<std::string> payloads = {"",
                                             "\x00",
                                             std::string("\x00\x00\x00\x01", 4),
                                             std::string("\x00\x00\x00\x01\x00", 5),
                                             std::string("\x00\x00\x00\x01\x03hello", 10),
                                             std::string("\x00\x00\x00\x01\xff", 5)};
  for (const std::string &payload : payloads) {
    CAPTURE(payload.size());
    CHECK_THROWS_WITH_AS(decode_output(payload, kPeer), doctest::Contains(kPeer), LaunchError);
  }
}

TEST_CASE("every truncation of a CBOR message throws LaunchError naming the peer") {
  Hello hello{"0.1.0", kProtocolVersion, "node7", 8, 8, "0,1"};
  JobDescription job;
  job.job_id = "j";
  job.argv = {"python", "train.py"};
  job.ranks = {RankLaunch{0, {{"A", "1"}}}};
  const std::string hello_payload = encode(hello);
  const std::string job_payload = encode(job);
  const std::string exited_payload = encode(RankExited{1, 2, 3, 0});
  for (size_t size = 0; size < hello_payload.size(); ++size) {
    CAPTURE(size);
    CHECK_THROWS_WITH_AS(decode_hello(hello_payload.substr(0, size), kPeer),
                         doctest::Contains(kPeer), LaunchError);
  }
  for (size_t size = 0; size < job_payload.size(); ++size) {
    CAPTURE(size);
    CHECK_THROWS_WITH_AS(decode_job(job_payload.substr(0, size), kPeer), doctest::Contains(kPeer),
                         LaunchError);
  }
  for (size_t size = 0; size < exited_payload.size(); ++size) {
    CAPTURE(size);
    CHECK_THROWS_WITH_AS(decode_exited(exited_payload.substr(0, size), kPeer),
                         doctest::Contains(kPeer), LaunchError);
  }
}

TEST_CASE("CBOR messages of the wrong shape throw LaunchError naming the peer") {
  const json hello = {{"version", "0.1.0"}, {"protocol", 1},        {"hostname", "n"},
                      {"cpu_count", 4},     {"gpu_count", nullptr}, {"cuda_visible", nullptr},
                      {"free_port", 29500}};
  REQUIRE_NOTHROW(decode_hello(cbor(hello), kPeer));
  for (const auto &[key, value] :
       std::vector<std::pair<std::string, json>>{{"version", 1},
                                                 {"protocol", "one"},
                                                 {"hostname", json::array()},
                                                 {"cpu_count", "4"},
                                                 {"gpu_count", "8"},
                                                 {"cuda_visible", 3},
                                                 {"free_port", "29500"}}) {
    CAPTURE(key);
    json wrong = hello;
    wrong[key] = value;
    CHECK_THROWS_WITH_AS(decode_hello(cbor(wrong), kPeer), doctest::Contains(kPeer), LaunchError);
    json missing = hello;
    missing.erase(key);
    CHECK_THROWS_WITH_AS(decode_hello(cbor(missing), kPeer), doctest::Contains(kPeer), LaunchError);
  }

  const json job = {{"job_id", "j"},
                    {"host", "h"},
                    {"argv", {bytes_of("a")}},
                    {"cwd", bytes_of("/")},
                    {"stdin_rank", -1},
                    {"kill_grace", 5.0},
                    {"heartbeat_timeout", 10.0},
                    {"secret", bytes_of("s")},
                    {"common_env", {{bytes_of("B"), bytes_of("2")}}},
                    {"elastic", false},
                    {"ranks", {{{"rank", 0}, {"env", {{bytes_of("A"), bytes_of("1")}}}}}}};
  REQUIRE_NOTHROW(decode_job(cbor(job), kPeer));
  for (const auto &[key, value] : std::vector<std::pair<std::string, json>>{
           {"argv", json::array({"text, not bytes"})},
           {"cwd", "/text"},
           {"stdin_rank", "0"},
           {"kill_grace", "5"},
           {"heartbeat_timeout", "10"},
           {"secret", "text, not bytes"},
           {"elastic", "yes"},
           {"ranks", json::array({{{"rank", "0"}, {"env", json::array()}}})},
           {"ranks", json::array({{{"rank", 0}, {"env", json::array({"A=1"})}}})},
           {"ranks", json::array({{{"rank", 0}, {"env", {{"A", "1"}}}}})},
           {"ranks", json::array({{{"rank", 0}}})}}) {
    CAPTURE(key);
    json wrong = job;
    wrong[key] = value;
    CHECK_THROWS_WITH_AS(decode_job(cbor(wrong), kPeer), doctest::Contains(kPeer), LaunchError);
  }

  const std::vector<std::string> not_maps = {cbor(json::array({1, 2})), cbor(json(3)),
                                             cbor(json("text")), cbor(bytes_of("x"))};
  for (const std::string &payload : not_maps) {
    CHECK_THROWS_WITH_AS(decode_hello(payload, kPeer), doctest::Contains(kPeer), LaunchError);
    CHECK_THROWS_WITH_AS(decode_job(payload, kPeer), doctest::Contains(kPeer), LaunchError);
    CHECK_THROWS_WITH_AS(decode_started(payload, kPeer), doctest::Contains(kPeer), LaunchError);
    CHECK_THROWS_WITH_AS(decode_exited(payload, kPeer), doctest::Contains(kPeer), LaunchError);
    CHECK_THROWS_WITH_AS(decode_error(payload, kPeer), doctest::Contains(kPeer), LaunchError);
    CHECK_THROWS_WITH_AS(decode_terminate(payload, kPeer), doctest::Contains(kPeer), LaunchError);
    CHECK_THROWS_WITH_AS(decode_count(payload, kPeer), doctest::Contains(kPeer), LaunchError);
  }
  CHECK_THROWS_WITH_AS(decode_started(cbor({{"rank", 1}, {"pid", "1"}}), kPeer),
                       doctest::Contains(kPeer), LaunchError);
  CHECK_THROWS_WITH_AS(decode_exited(cbor({{"rank", 1}, {"pid", 1}, {"exit_code", 0}}), kPeer),
                       doctest::Contains(kPeer), LaunchError);
  CHECK_THROWS_WITH_AS(decode_error(cbor({{"message", bytes_of("m")}, {"exit_code", 1}}), kPeer),
                       doctest::Contains(kPeer), LaunchError);
  CHECK_THROWS_WITH_AS(decode_terminate(cbor({{"grace", "5"}}), kPeer), doctest::Contains(kPeer),
                       LaunchError);
  CHECK_THROWS_WITH_AS(decode_count(cbor({{"count", "5"}}), kPeer), doctest::Contains(kPeer),
                       LaunchError);
  // Trailing garbage after a complete message.
  CHECK_THROWS_WITH_AS(decode_terminate(encode(Terminate{1}) + "x", kPeer),
                       doctest::Contains(kPeer), LaunchError);
}

// ---- FrameChannel over real pipes ----

// A channel reading from one pipe and writing to another, with the far ends kept here.
struct ChannelRig {
  UniqueFd to_channel;    // write here, the channel reads it
  UniqueFd from_channel;  // the channel writes, read it here
  FrameChannel channel;

  static ChannelRig make() {
    Pipe in = make_pipe();
    Pipe out = make_pipe();
    return ChannelRig{std::move(in.write_end), std::move(out.read_end),
                      FrameChannel(std::move(in.read_end), std::move(out.write_end), kPeer)};
  }
};

std::string header(uint8_t type, uint32_t length) {
  std::string bytes(1, static_cast<char>(type));
  for (int shift = 24; shift >= 0; shift -= 8) {
    bytes.push_back(static_cast<char>((length >> shift) & 0xff));
  }
  return bytes;
}

// Reads `size` bytes from a blocking fd.
std::string read_exactly(int fd, size_t size) {
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, bytes.data() + done, size - done);
    REQUIRE(n > 0);
    done += static_cast<size_t>(n);
  }
  return bytes;
}

// Calls read_available until `count` frames have arrived; fails on end of stream.
std::vector<Frame> read_frames(FrameChannel &channel, size_t count) {
  std::vector<Frame> frames;
  for (int attempt = 0; frames.size() < count && attempt < 10000; ++attempt) {
    REQUIRE(channel.read_available(frames));
  }
  return frames;
}

TEST_CASE("frames sent in one go are read back") {
  ChannelRig a = ChannelRig::make();
  const std::string job = encode(JobDescription{"j", "h", {"a", "b"}, "/", 0, 5, {}});
  a.channel.send(FrameType::kJob, job);
  a.channel.send(FrameType::kStdinEof, "");
  a.channel.send(FrameType::kTerminate, encode(Terminate{2}));
  CHECK(a.channel.wants_write());
  CHECK(a.channel.queued_bytes() ==
        3 * kFrameHeaderSize + job.size() + encode(Terminate{2}).size());
  REQUIRE(a.channel.flush());
  CHECK_FALSE(a.channel.wants_write());
  CHECK(a.channel.queued_bytes() == 0);

  const std::string wire = read_exactly(
      a.from_channel.get(), 3 * kFrameHeaderSize + job.size() + encode(Terminate{2}).size());
  CHECK(wire.substr(0, kFrameHeaderSize) == header(2, static_cast<uint32_t>(job.size())));

  // Loop the bytes back into a second channel's reading end.
  ChannelRig b = ChannelRig::make();
  REQUIRE(write_all(b.to_channel.get(), wire));
  const std::vector<Frame> frames = read_frames(b.channel, 3);
  REQUIRE(frames.size() == 3);
  CHECK(frames[0].type == FrameType::kJob);
  CHECK(decode_job(frames[0].payload, kPeer).argv == std::vector<std::string>{"a", "b"});
  CHECK(frames[1].type == FrameType::kStdinEof);
  CHECK(frames[1].payload.empty());
  CHECK(frames[2].type == FrameType::kTerminate);
  CHECK(decode_terminate(frames[2].payload, kPeer).grace_seconds == 2);
}

TEST_CASE("a frame larger than the pipe buffer goes through in several flushes and reads") {
  ChannelRig a = ChannelRig::make();
  std::string payload(300000, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7);
  a.channel.send(FrameType::kOutput, payload);
  ChannelRig b = ChannelRig::make();
  // Pump: the channel writes what the pipe takes, we move it across to b, b parses it.
  std::vector<Frame> frames;
  for (int round = 0; round < 10000 && frames.empty(); ++round) {
    REQUIRE(a.channel.flush());
    char buffer[65536];
    const ssize_t n = ::read(a.from_channel.get(), buffer, sizeof buffer);
    REQUIRE(n > 0);
    REQUIRE(write_all(b.to_channel.get(), std::string_view(buffer, static_cast<size_t>(n))));
    REQUIRE(b.channel.read_available(frames));
  }
  REQUIRE(frames.size() == 1);
  CHECK(frames[0].type == FrameType::kOutput);
  CHECK(frames[0].payload == payload);
  CHECK_FALSE(a.channel.wants_write());
}

TEST_CASE("a frame split across several reads is assembled") {
  const std::string payload = "payload \x00\xff bytes";
  const std::string wire = header(4, static_cast<uint32_t>(payload.size())) + payload +
                           header(11, 0) + header(3, 1) + "x";
  // Every way to cut the bytes in two, and one byte at a time.
  for (size_t cut = 1; cut < wire.size(); ++cut) {
    CAPTURE(cut);
    ChannelRig rig = ChannelRig::make();
    std::vector<Frame> frames;
    REQUIRE(write_all(rig.to_channel.get(), wire.substr(0, cut)));
    REQUIRE(rig.channel.read_available(frames));
    REQUIRE(write_all(rig.to_channel.get(), wire.substr(cut)));
    REQUIRE(rig.channel.read_available(frames));
    REQUIRE(frames.size() == 3);
    CHECK(frames[0].type == FrameType::kOutput);
    CHECK(frames[0].payload == payload);
    CHECK(frames[1].type == FrameType::kDone);
    CHECK(frames[1].payload.empty());
    CHECK(frames[2].type == FrameType::kStarted);
    CHECK(frames[2].payload == "x");
  }
  ChannelRig rig = ChannelRig::make();
  std::vector<Frame> frames;
  std::vector<size_t> counts;  // frames complete after each byte
  for (size_t i = 0; i < wire.size(); ++i) {
    REQUIRE(write_all(rig.to_channel.get(), wire.substr(i, 1)));
    REQUIRE(rig.channel.read_available(frames));
    counts.push_back(frames.size());
  }
  const size_t first_end = kFrameHeaderSize + payload.size();
  CHECK(counts[first_end - 2] == 0);
  CHECK(counts[first_end - 1] == 1);
  CHECK(counts[first_end + kFrameHeaderSize - 2] == 1);
  CHECK(counts[first_end + kFrameHeaderSize - 1] == 2);
  CHECK(counts[wire.size() - 2] == 2);
  CHECK(counts[wire.size() - 1] == 3);
  REQUIRE(frames.size() == 3);
  CHECK(frames[0].payload == payload);
  CHECK(frames[2].payload == "x");
}

TEST_CASE("nothing to read is not the end of the stream") {
  ChannelRig rig = ChannelRig::make();
  std::vector<Frame> frames;
  CHECK(rig.channel.read_available(frames));
  CHECK(frames.empty());
}

TEST_CASE("an unknown frame type throws LaunchError naming the peer") {
  for (int type : {0, 16, 100, 255}) {
    CAPTURE(type);
    ChannelRig rig = ChannelRig::make();
    std::vector<Frame> frames;
    REQUIRE(write_all(rig.to_channel.get(), header(static_cast<uint8_t>(type), 0)));
    CHECK_THROWS_WITH_AS(rig.channel.read_available(frames), doctest::Contains(kPeer), LaunchError);
    CHECK(frames.empty());
  }
}

TEST_CASE("a length above kMaxFramePayload throws as soon as the header is in") {
  for (uint32_t length : {kMaxFramePayload + 1, 0xffffffffu}) {
    CAPTURE(length);
    ChannelRig rig = ChannelRig::make();
    std::vector<Frame> frames;
    // Only the header is written: the channel must refuse before waiting for (or allocating)
    // the payload.
    REQUIRE(write_all(rig.to_channel.get(), header(4, length)));
    CHECK_THROWS_WITH_AS(rig.channel.read_available(frames), doctest::Contains(kPeer), LaunchError);
  }
  // The limit itself is allowed: the header is accepted and the channel waits for the payload.
  ChannelRig rig = ChannelRig::make();
  std::vector<Frame> frames;
  REQUIRE(write_all(rig.to_channel.get(), header(4, kMaxFramePayload)));
  CHECK(rig.channel.read_available(frames));
  CHECK(frames.empty());
}

TEST_CASE("end of stream inside a frame throws, between frames returns false") {
  const std::string frame = header(4, 3) + "abc";
  for (size_t cut = 1; cut < frame.size(); ++cut) {
    CAPTURE(cut);
    ChannelRig rig = ChannelRig::make();
    std::vector<Frame> frames;
    REQUIRE(write_all(rig.to_channel.get(), frame + frame.substr(0, cut)));
    rig.to_channel.reset();
    REQUIRE(rig.channel.read_available(frames));
    CHECK(frames.size() == 1);
    CHECK_THROWS_WITH_AS(rig.channel.read_available(frames), doctest::Contains(kPeer), LaunchError);
  }
  ChannelRig rig = ChannelRig::make();
  std::vector<Frame> frames;
  REQUIRE(write_all(rig.to_channel.get(), frame + frame));
  rig.to_channel.reset();
  REQUIRE(rig.channel.read_available(frames));
  CHECK(frames.size() == 2);
  CHECK_FALSE(rig.channel.read_available(frames));
  CHECK(frames.size() == 2);

  ChannelRig empty = ChannelRig::make();
  empty.to_channel.reset();
  CHECK_FALSE(empty.channel.read_available(frames));
}

TEST_CASE("flush reports a peer that has gone away") {
  ChannelRig rig = ChannelRig::make();
  rig.from_channel.reset();
  rig.channel.send(FrameType::kHello, "x");
  // The launcher ignores SIGPIPE; do the same here so that the write fails with EPIPE.
  const auto previous = std::signal(SIGPIPE, SIG_IGN);
  const bool flushed = rig.channel.flush();
  std::signal(SIGPIPE, previous);
  CHECK_FALSE(flushed);
}

TEST_CASE("flush_until waits for a slow reader, and gives up at its deadline") {
  ChannelRig rig = ChannelRig::make();
  const std::string payload(1 << 20, 'p');  // far more than a pipe holds
  rig.channel.send(FrameType::kOutput, payload);
  // Nobody reads: the deadline ends the wait, the rest stays queued.
  const long long start = monotonic_ms();
  CHECK_FALSE(rig.channel.flush_until(start + 200));
  CHECK(monotonic_ms() - start >= 200);
  CHECK(rig.channel.wants_write());
  // A reader that drains the pipe a while later: everything goes through.
  std::string received;
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    received = read_exactly(rig.from_channel.get(), kFrameHeaderSize + payload.size());
  });
  const bool flushed = rig.channel.flush_until(monotonic_ms() + 30000);
  reader.join();
  CHECK(flushed);
  CHECK_FALSE(rig.channel.wants_write());
  CHECK(received.substr(kFrameHeaderSize) == payload);
}

TEST_CASE("flush_until reports a peer that has gone away at once") {
  ChannelRig rig = ChannelRig::make();
  rig.from_channel.reset();
  rig.channel.send(FrameType::kHello, "x");
  const auto previous = std::signal(SIGPIPE, SIG_IGN);
  const long long start = monotonic_ms();
  const bool flushed = rig.channel.flush_until(start + 30000);
  std::signal(SIGPIPE, previous);
  CHECK_FALSE(flushed);
  CHECK(monotonic_ms() - start < 5000);
}

}  // namespace
}  // namespace perseus::launch
