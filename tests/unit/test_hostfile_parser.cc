#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/hostfile_parser.h"

namespace perseus::launch {
namespace {

// The message of the InputError that parsing `text` throws, or "" when it parses.
std::string error_of(std::string_view text, const std::string &file = "hosts.txt") {
  try {
    parse_hostfile(text, file);
  } catch (const InputError &error) {
    return error.what();
  }
  return "";
}

HostSpec spec(std::string user, std::string host, std::optional<int> slots,
              std::optional<int> max_slots, std::string origin) {
  return HostSpec{std::move(user), std::move(host), slots, max_slots, std::move(origin)};
}

// A file in the temporary directory, removed at the end of the test.
class TempFile {
 public:
  TempFile(const std::string &name, std::string_view text)
      : path_(std::filesystem::temp_directory_path() / name) {
    std::ofstream(path_, std::ios::binary) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

TEST_CASE("hostfile: bare hosts, slots, max_slots, user@ and comments") {
  std::string_view text =
      "# a comment\n"
      "\n"
      "node1\n"
      "   node2 slots=4   # fast one\n"
      "alice@10.0.0.2\tslots=2\tmax_slots=8\n"
      "node3 max-slots=3\n"
      "node4 count=6\n"
      "  \t \n"
      "node5 slots=04";
  std::vector<HostSpec> expected = {
      spec("", "node1", std::nullopt, std::nullopt, "hosts.txt:3"),
      spec("", "node2", 4, std::nullopt, "hosts.txt:4"),
      spec("alice", "10.0.0.2", 2, 8, "hosts.txt:5"),
      spec("", "node3", std::nullopt, 3, "hosts.txt:6"),
      spec("", "node4", 6, std::nullopt, "hosts.txt:7"),
      spec("", "node5", 4, std::nullopt, "hosts.txt:9"),
  };
  CHECK(parse_hostfile(text, "hosts.txt") == expected);
}

TEST_CASE("hostfile: IPv6 as written or in brackets, with a zone") {
  std::string_view text =
      "fe80::1 slots=2\n"
      "[fe80::2]\n"
      "bob@[::1] slots=1\n"
      "fe80::3%eth0\n";
  std::vector<HostSpec> expected = {
      spec("", "fe80::1", 2, std::nullopt, "f:1"),
      spec("", "fe80::2", std::nullopt, std::nullopt, "f:2"),
      spec("bob", "::1", 1, std::nullopt, "f:3"),
      spec("", "fe80::3%eth0", std::nullopt, std::nullopt, "f:4"),
  };
  CHECK(parse_hostfile(text, "f") == expected);
}

TEST_CASE("hostfile: CRLF line ends, a byte order mark, empty text") {
  CHECK(parse_hostfile("\xEF\xBB\xBFnode1 slots=2\r\nnode2\r\n", "f") ==
        std::vector<HostSpec>{spec("", "node1", 2, std::nullopt, "f:1"),
                              spec("", "node2", std::nullopt, std::nullopt, "f:2")});
  CHECK(parse_hostfile("", "f").empty());
  CHECK(parse_hostfile("# only comments\n\n", "f").empty());
}

TEST_CASE("hostfile: the limits of a count") {
  CHECK(parse_hostfile("a slots=1 max_slots=65536", "f")[0].slots == 1);
  CHECK(parse_hostfile("a slots=65536", "f")[0].slots == 65536);
  CHECK(parse_hostfile("a slots=4 max_slots=4", "f")[0].max_slots == 4);
}

TEST_CASE("hostfile: exact messages, three lines with a caret") {
  CHECK(error_of("node1\nnode2 slots=abc\n") ==
        "hosts.txt:2:13: slots value 'abc' is not a number; write a whole number from 1 to 65536, "
        "e.g. 'slots=4'\n"
        "node2 slots=abc\n"
        "            ^");
  CHECK(error_of("node1 slot=4") ==
        "hosts.txt:1:7: unknown keyword 'slot'; did you mean 'slots=4'?\n"
        "node1 slot=4\n"
        "      ^");
  CHECK(error_of("node1 slots=0") ==
        "hosts.txt:1:13: slots value '0' is out of range; write a whole number from 1 to 65536\n"
        "node1 slots=0\n"
        "            ^");
  CHECK(error_of("node1 node2") ==
        "hosts.txt:1:7: second host name 'node2' on the line; put each host on a line of its own\n"
        "node1 node2\n"
        "      ^");
  CHECK(error_of("node1 max_slots=2 slots=4", "mpi_host.txt") ==
        "mpi_host.txt:1:19: 'slots=4' is more than 'max_slots=2'; lower the slots or raise "
        "max_slots\n"
        "node1 max_slots=2 slots=4\n"
        "                  ^");
  CHECK(error_of("alice@ slots=2") ==
        "hosts.txt:1:7: no host name after 'alice@'; write alice@host, e.g. alice@node1\n"
        "alice@ slots=2\n"
        "      ^");
  CHECK(error_of(std::string_view("node1\tsl\0ts=2", 13)) ==
        "hosts.txt:1:9: NUL byte in the line; a hostfile is plain text: remove it (is this a "
        "binary?)\n"
        "node1\tsl?ts=2\n"
        "        ^");
  CHECK(error_of("node1 \x01") ==
        "hosts.txt:1:7: control character 0x01 in the line; remove it (fields are separated by "
        "spaces or tabs)\n"
        "node1 ?\n"
        "      ^");
}

TEST_CASE("hostfile: every message has three lines and points at the right column") {
  struct Case {
    std::string_view text;
    std::string_view location;  // the start of the first line
    std::string_view phrase;    // in the first line
  };
  std::vector<Case> cases = {
      {"a slots=-1", "hosts.txt:1:9: ", "slots value '-1' is out of range"},
      {"a slots=99999999999", "hosts.txt:1:9: ", "slots value '99999999999' is out of range"},
      {"a slots=", "hosts.txt:1:9: ", "'slots=' has no value"},
      {"a slots=+4", "hosts.txt:1:9: ", "is not a number"},
      {"a slots=4x", "hosts.txt:1:9: ", "is not a number"},
      {"a max_slots=0", "hosts.txt:1:13: ", "max_slots value '0' is out of range"},
      {"a max-slots=x", "hosts.txt:1:13: ", "max-slots value 'x' is not a number"},
      {"a count=0", "hosts.txt:1:9: ", "count value '0' is out of range"},
      {"a slotz=2", "hosts.txt:1:3: ", "did you mean 'slots=2'?"},
      {"a maxslots=2", "hosts.txt:1:3: ", "did you mean 'max_slots=2'?"},
      {"a colour=red", "hosts.txt:1:3: ", "the keywords are slots=N and max_slots=M"},
      {"a =4", "hosts.txt:1:3: ", "unknown keyword ''"},
      {"a slots=2 slots=3", "hosts.txt:1:11: ", "sets slots again (after 'slots=2' at column 3)"},
      {"a slots=2 count=3", "hosts.txt:1:11: ", "'count=3' sets slots again"},
      {"a max_slots=2 max-slots=3", "hosts.txt:1:15: ", "sets max_slots again"},
      {"a count=4 max-slots=3", "hosts.txt:1:3: ", "'count=4' is more than 'max-slots=3'"},
      {"a 4", "hosts.txt:1:3: ", "'4' after the host name is not a keyword; write 'slots=4'"},
      {"a slots =4", "hosts.txt:1:3: ", "'slots' has no '=value'"},
      {"slots=4", "hosts.txt:1:1: ", "where a host name belongs; write the host name first"},
      {"@node1", "hosts.txt:1:1: ", "empty user name before '@'"},
      {"a@b@c", "hosts.txt:1:4: ", "second '@' in 'a@b@c'"},
      {"al ice@b", "hosts.txt:1:4: ", "second host name 'ice@b'"},
      {"a$b@c", "hosts.txt:1:2: ", "'$' is not allowed in a user name"},
      {"node1:4", "hosts.txt:1:6: ", "write 'node1 slots=4'"},
      {"a:b", "hosts.txt:1:2: ", "is neither a host name nor an IPv6 address"},
      {"[fe80::1", "hosts.txt:1:1: ", "'[' without ']'"},
      {"fe80::1]", "hosts.txt:1:8: ", "unbalanced ']' in 'fe80::1]'"},
      {"node]", "hosts.txt:1:5: ", "unbalanced ']'"},
      {"[node1]", "hosts.txt:1:2: ", "'node1' is not an IPv6 address"},
      {"[]", "hosts.txt:1:2: ", "'' is not an IPv6 address"},
      {"[::1]:2", "hosts.txt:1:6: ", "give slots as a keyword, e.g. '[::1] slots=2'"},
      {"no/de", "hosts.txt:1:3: ", "'/' is not allowed in a host name"},
      {"n\xC3\xA9", "hosts.txt:1:2: ", "byte 0xC3 is not allowed in a host name"},
      {"a\r\nb\rc", "hosts.txt:2:2: ", "control character 0x0D"},
      {"a # \x7f", "hosts.txt:1:5: ", "control character 0x7F"},
      {std::string_view("\n\n\0", 3), "hosts.txt:3:1: ", "NUL byte"},
  };
  for (const Case &c : cases) {
    CAPTURE(c.text);
    std::string message = error_of(c.text);
    REQUIRE(!message.empty());
    size_t first_end = message.find('\n');
    size_t second_end = message.find('\n', first_end + 1);
    REQUIRE(second_end != std::string::npos);
    CHECK(message.find('\n', second_end + 1) == std::string::npos);
    std::string first = message.substr(0, first_end);
    CHECK(first.starts_with(c.location));
    CHECK(first.find(c.phrase) != std::string::npos);
    CHECK(first.find("; ") != std::string::npos);
    std::string caret = message.substr(second_end + 1);
    size_t column = std::stoul(first.substr(first.find(':', first.find(':') + 1) + 1));
    CHECK(caret == std::string(column - 1, ' ') + "^");
  }
}

TEST_CASE("hostfile: read_hostfile reads a file, names a missing one and rejects an empty one") {
  TempFile file("perseus_test_hostfile.txt", "node1 slots=2\nnode2\n");
  std::vector<HostSpec> specs = read_hostfile(file.path());
  REQUIRE(specs.size() == 2);
  CHECK(specs[1].origin == file.path() + ":2");

  std::string missing = "/nonexistent/perseus/hosts.txt";
  CHECK_THROWS_WITH_AS(read_hostfile(missing),
                       "cannot read hostfile '/nonexistent/perseus/hosts.txt': No such file or "
                       "directory; check the path given to --hostfile",
                       InputError);

  TempFile empty("perseus_test_empty_hostfile.txt", "# nothing here\n");
  CHECK_THROWS_WITH_AS(
      read_hostfile(empty.path()),
      ("hostfile '" + empty.path() + "' has no hosts; add one host per line, e.g. 'node1 slots=4'")
          .c_str(),
      InputError);

  CHECK_THROWS_AS(read_hostfile(std::filesystem::temp_directory_path().string()), InputError);
}

TEST_CASE("hostfile: the example hostfiles of the repository parse") {
  std::filesystem::path root =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  std::filesystem::path dir = root / "hostfiles";
  if (!std::filesystem::exists(dir)) return;
  std::vector<HostSpec> mpi = read_hostfile((dir / "mpi_host.txt").string());
  REQUIRE(mpi.size() == 4);
  CHECK(mpi[0].host == "10.0.0.1");
  CHECK(mpi[3].host == "10.0.0.4");
  CHECK_FALSE(mpi[0].slots.has_value());
  std::vector<HostSpec> local = read_hostfile((dir / "localhost_slots.txt").string());
  REQUIRE(local.size() == 1);
  CHECK(local[0].slots == 4);
  CHECK(read_hostfile((dir / "mixed.txt").string()).size() >= 4);
}

}  // namespace
}  // namespace perseus::launch
