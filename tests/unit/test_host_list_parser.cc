#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

#include "lib/launch/errors.h"
#include "lib/launch/planning/host_list_parser.h"

namespace perseus::launch {
namespace {

std::string error_of(std::string_view value) {
  try {
    parse_host_list(value);
  } catch (const InputError &error) {
    return error.what();
  }
  return "";
}

HostSpec entry(std::string user, std::string host, int slots) {
  return HostSpec{std::move(user), std::move(host), slots, std::nullopt, "-H"};
}

TEST_CASE("-H: hosts with and without slots, users, IPv6 in brackets") {
  CHECK(parse_host_list("localhost:8") == std::vector<HostSpec>{entry("", "localhost", 8)});
  CHECK(parse_host_list("a,b:2") == std::vector<HostSpec>{entry("", "a", 1), entry("", "b", 2)});
  CHECK(parse_host_list("user@h:3") == std::vector<HostSpec>{entry("user", "h", 3)});
  CHECK(parse_host_list("[::1]:2") == std::vector<HostSpec>{entry("", "::1", 2)});
  CHECK(parse_host_list("[fe80::1]") == std::vector<HostSpec>{entry("", "fe80::1", 1)});
  CHECK(parse_host_list("alice@[fe80::1%eth0]:4,node-2.example.com,n_3:65536") ==
        std::vector<HostSpec>{entry("alice", "fe80::1%eth0", 4), entry("", "node-2.example.com", 1),
                              entry("", "n_3", 65536)});
  CHECK(parse_host_list("a:01")[0].slots == 1);
}

TEST_CASE("-H: a bare entry is exactly one slot, repeated entries are kept") {
  std::vector<HostSpec> specs = parse_host_list("a,a,b");
  REQUIRE(specs.size() == 3);
  CHECK(specs[0].slots == 1);
  CHECK(specs[1] == specs[0]);
  CHECK(specs[2].origin == "-H");
}

TEST_CASE("-H: exact messages") {
  CHECK(error_of("a,,b") == "-H 'a,,b': entry 2 is empty; remove the extra comma: -H 'a,b'");
  CHECK(error_of("a,b,") == "-H 'a,b,': entry 3 is empty; remove the extra comma: -H 'a,b'");
  CHECK(error_of("") ==
        "-H '': no hosts given; write host[:slots] entries separated by commas, e.g. -H "
        "node1:4,node2");
  CHECK(error_of("node1:") ==
        "-H 'node1:': entry 'node1:' has no slot count after ':'; write node1:N with N from 1 to "
        "65536, or node1 for 1 slot");
  CHECK(error_of("a,node1:x") ==
        "-H 'a,node1:x': slot count 'x' in 'node1:x' is not a number; write node1:N with N from "
        "1 to 65536");
  CHECK(error_of("node1:0") ==
        "-H 'node1:0': slot count '0' in 'node1:0' is out of range; write node1:N with N from 1 "
        "to 65536");
  CHECK(error_of("a, b") == "-H 'a, b': entry ' b' contains whitespace; remove it: -H 'a,b'");
  CHECK(error_of(std::string_view("a\0b", 3)) ==
        "-H 'a\\x00b': entry 'a\\x00b' contains a NUL byte; remove it");
  CHECK(error_of("fe80::1") ==
        "-H 'fe80::1': IPv6 address 'fe80::1' needs brackets; write [fe80::1] or [fe80::1]:N");
}

TEST_CASE("-H: every bad value names the problem") {
  struct Case {
    std::string_view value;
    std::string_view phrase;
  };
  std::vector<Case> cases = {
      {",", "no hosts given"},
      {",a", "entry 1 is empty; remove the extra comma: -H 'a'"},
      {"host:1:2", "entry 'host:1:2' has more than one ':'"},
      {"host:-1", "slot count '-1' in 'host:-1' is not a number"},
      {"host:99999999999", "slot count '99999999999' in 'host:99999999999' is out of range"},
      {"host:65537", "is out of range"},
      {"host: 4", "contains whitespace; remove it (hosts are separated by commas"},
      {" a ,b", "contains whitespace; remove it: -H 'a,b'"},
      {"a b",
       "contains whitespace; remove it (hosts are separated by commas, e.g. -H node1:4,node2)"},
      {"a\tb", "entry 'a\\x09b' contains whitespace"},
      {" ", "entry ' ' contains whitespace; remove it (hosts"},
      {"a\x01", "contains control character 0x01"},
      {":4", "has no host name before ':'; write host:N, e.g. node1:4"},
      {"user@", "has no host name after '@'; write user@host, e.g. user@node1"},
      {"@h", "has an empty user name before '@'"},
      {"a@b@c", "has more than one '@'"},
      {"u$er@h", "'$' is not allowed in the user name of 'u$er@h'"},
      {"no/de", "'/' is not allowed in the host name of 'no/de'"},
      {"[::1", "'[' without ']' in '[::1'"},
      {"::1]", "unbalanced ']' in '::1]'"},
      {"a]:2", "unbalanced ']'"},
      {"[::1]x", "unexpected 'x' after ']' in '[::1]x'; write [addr] or [addr]:N, e.g. [::1]:2"},
      {"[::1]:", "has no slot count after ':'; write [::1]:N"},
      {"[::1]:0", "slot count '0' in '[::1]:0' is out of range"},
      {"[node1]:2", "'node1' in '[node1]:2' is not an IPv6 address"},
      {"[]", "'' in '[]' is not an IPv6 address"},
      {"fe80::1:2", "IPv6 address 'fe80::1:2' needs brackets"},
  };
  for (const Case &c : cases) {
    CAPTURE(c.value);
    std::string message = error_of(c.value);
    CHECK(message.starts_with("-H '"));
    CHECK(message.find(c.phrase) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(message.find("; ") != std::string::npos);
  }
}

}  // namespace
}  // namespace perseus::launch
