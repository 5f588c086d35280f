// lib/rendezvous: the wire protocol (checked against an independent implementation of the
// format wire.h documents), the server and the client in-process on loopback, and raw TCP peers
// that break the protocol. Every wait is bounded.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lib/rendezvous/client.h"
#include "lib/rendezvous/server.h"
#include "lib/rendezvous/wire.h"

namespace perseus::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// ---- an independent implementation of the format of wire.h ---------------------------------

std::string be(uint64_t value, int size) {
  std::string out;
  for (int shift = 8 * (size - 1); shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>(value >> shift));
  }
  return out;
}

template <size_t N>
std::string str(const std::array<uint8_t, N> &bytes) {
  return std::string(reinterpret_cast<const char *>(bytes.data()), N);
}

std::string ref_hmac(const std::string &key, const std::string &data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char *>(data.data()), data.size(), mac, &size);
  return std::string(reinterpret_cast<const char *>(mac), size);
}

std::string ref_session_key(const Secret &secret, const Nonce &server, const Nonce &client) {
  return ref_hmac(str(secret), "perseus-rdzv-key" + str(server) + str(client));
}

std::string ref_body(uint64_t counter, uint8_t op, const std::string &key,
                     const std::string &value) {
  return be(counter, 8) + std::string(1, static_cast<char>(op)) + be(key.size(), 4) + key +
         be(value.size(), 4) + value;
}

// [length][body][HMAC(K, direction || length || body)]
std::string ref_frame(const std::string &session_key, char direction, const std::string &body) {
  const std::string frame = be(body.size(), 4) + body;
  return frame + ref_hmac(session_key, std::string(1, direction) + frame);
}

Secret secret_of(uint8_t seed) {
  Secret secret{};
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>(seed + 7 * i);
  return secret;
}

Nonce nonce_of(uint8_t seed) {
  Nonce nonce{};
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<uint8_t>(seed * 3 + i);
  return nonce;
}

std::string all_bytes() {
  std::string bytes;
  for (int byte = 0; byte < 256; ++byte) bytes.push_back(static_cast<char>(byte));
  return bytes;
}

const Op kAllOps[] = {Op::kSet, Op::kGet, Op::kAdd, Op::kCheck, Op::kReply, Op::kError};

// Both ends of one connection: the client seals with 'C', the server opens 'C' frames; and the
// other way round with 'S'.
struct Ends {
  explicit Ends(const Secret &s = secret_of(1), const Nonce &sn = nonce_of(2),
                const Nonce &cn = nonce_of(3))
      : secret(s),
        server(sn),
        client(cn),
        client_send(s, sn, cn, 'C'),
        server_receive(s, sn, cn, 'C'),
        server_send(s, sn, cn, 'S'),
        client_receive(s, sn, cn, 'S') {}
  Secret secret;
  Nonce server;
  Nonce client;
  Channel client_send;
  Channel server_receive;
  Channel server_send;
  Channel client_receive;
};

bool same_message(const Message &a, const Message &b) {
  return a.op == b.op && a.key == b.key && a.value == b.value;
}

// True when `receiver` refuses `buffer` with a WireError. A frame whose (changed) length field
// asks for more bytes is given them (zeros): waiting for more is not a refusal, taking the
// message is a failure.
bool refused(Channel &receiver, std::string buffer) {
  try {
    for (int round = 0; round < 2; ++round) {
      if (receiver.open(buffer)) return false;
      const uint32_t length = static_cast<uint32_t>(static_cast<uint8_t>(buffer[0])) << 24 |
                              static_cast<uint32_t>(static_cast<uint8_t>(buffer[1])) << 16 |
                              static_cast<uint32_t>(static_cast<uint8_t>(buffer[2])) << 8 |
                              static_cast<uint32_t>(static_cast<uint8_t>(buffer[3]));
      buffer.resize(std::max<size_t>(buffer.size(), kHeaderSize + length + kMacSize), '\0');
    }
    return false;
  } catch (const WireError &) {
    return true;
  }
}

// ---- Channel ----------------------------------------------------------------------------------

TEST_CASE("rendezvous Channel: seal writes exactly the frame format of wire.h, both directions") {
  Ends ends;
  const std::string key = ref_session_key(ends.secret, ends.server, ends.client);
  CHECK(ends.client_send.seal({Op::kSet, "rank/0", "addr"}) ==
        ref_frame(key, 'C', ref_body(1, 1, "rank/0", "addr")));
  CHECK(ends.client_send.seal({Op::kGet, "rank/1", ""}) ==
        ref_frame(key, 'C', ref_body(2, 2, "rank/1", "")));
  CHECK(ends.client_send.seal({Op::kAdd, "n", "-5"}) ==
        ref_frame(key, 'C', ref_body(3, 3, "n", "-5")));
  CHECK(ends.server_send.seal({Op::kReply, "", "addr"}) ==
        ref_frame(key, 'S', ref_body(1, 10, "", "addr")));
  CHECK(ends.server_send.seal({Op::kError, "", "why"}) ==
        ref_frame(key, 'S', ref_body(2, 11, "", "why")));
  // And frames made by the reference are opened.
  std::string buffer = ref_frame(key, 'C', ref_body(1, 4, "k", ""));
  const auto opened = ends.server_receive.open(buffer);
  REQUIRE(opened.has_value());
  CHECK(same_message(*opened, Message{Op::kCheck, "k", ""}));
  CHECK(buffer.empty());
}

TEST_CASE("rendezvous Channel: every op round trips with empty, binary and maximal keys/values") {
  const std::string max_key(kMaxKey, 'k');
  std::string max_value(kMaxValue, 'v');
  max_value[0] = '\0';
  max_value[kMaxValue - 1] = '\xff';
  const std::string binary = all_bytes() + all_bytes();
  Ends ends;
  for (const Op op : kAllOps) {
    CAPTURE(static_cast<int>(op));
    std::vector<Message> messages = {
        {op, "", ""},      {op, binary, ""},    {op, "", binary},        {op, binary, binary},
        {op, max_key, ""}, {op, "", max_value}, {op, max_key, max_value}};
    for (const Message &message : messages) {
      CAPTURE(message.key.size());
      CAPTURE(message.value.size());
      for (auto [send, receive] : {std::pair{&ends.client_send, &ends.server_receive},
                                   std::pair{&ends.server_send, &ends.client_receive}}) {
        std::string buffer = send->seal(message);
        CHECK(buffer.size() ==
              kHeaderSize + kBodyOverhead + message.key.size() + message.value.size() + kMacSize);
        const auto opened = receive->open(buffer);
        REQUIRE(opened.has_value());
        CHECK(same_message(*opened, message));
        CHECK(buffer.empty());
      }
    }
  }
}

TEST_CASE("rendezvous Channel: messages back to back in one buffer come out one by one") {
  Ends ends;
  std::string buffer;
  for (int i = 0; i < 50; ++i) {
    buffer += ends.client_send.seal({Op::kSet, "key" + std::to_string(i), std::string(i, 'x')});
  }
  for (int i = 0; i < 50; ++i) {
    const auto opened = ends.server_receive.open(buffer);
    REQUIRE(opened.has_value());
    CHECK(opened->key == "key" + std::to_string(i));
    CHECK(opened->value == std::string(i, 'x'));
  }
  CHECK(buffer.empty());
  CHECK_FALSE(ends.server_receive.open(buffer).has_value());
}

TEST_CASE("rendezvous Channel: a message split across many appends opens only when whole") {
  Ends ends;
  SUBCASE("byte by byte") {
    const std::string key("k\0y", 3);
    const std::string frame = ends.client_send.seal({Op::kSet, key, all_bytes()});
    std::string buffer;
    for (size_t i = 0; i + 1 < frame.size(); ++i) {
      buffer.push_back(frame[i]);
      REQUIRE_FALSE(ends.server_receive.open(buffer).has_value());
      REQUIRE(buffer.size() == i + 1);  // nothing taken off while incomplete
    }
    buffer.push_back(frame.back());
    const auto opened = ends.server_receive.open(buffer);
    REQUIRE(opened.has_value());
    CHECK(same_message(*opened, Message{Op::kSet, key, all_bytes()}));
    CHECK(buffer.empty());
  }
  SUBCASE("two large messages in uneven chunks, the second starting inside a chunk") {
    const std::string first_value(3 << 20, 'a');
    const std::string second_value(1 << 20, 'b');
    std::string stream = ends.client_send.seal({Op::kSet, "first", first_value});
    stream += ends.client_send.seal({Op::kAdd, "second", second_value});
    std::string buffer;
    std::vector<Message> got;
    size_t at = 0;
    size_t chunk = 1;
    while (at < stream.size()) {
      const size_t n = std::min(chunk, stream.size() - at);
      buffer.append(stream, at, n);
      at += n;
      chunk = chunk * 7 % 65537 + 1;
      while (auto opened = ends.server_receive.open(buffer)) got.push_back(*opened);
      if (got.size() < 1) {
        CHECK(buffer.size() == at);
      }
    }
    REQUIRE(got.size() == 2);
    CHECK(same_message(got[0], Message{Op::kSet, "first", first_value}));
    CHECK(same_message(got[1], Message{Op::kAdd, "second", second_value}));
    CHECK(buffer.empty());
  }
}

TEST_CASE("rendezvous Channel: flipping any one byte of a frame (header, body or MAC) is refused") {
  Ends ends;
  const std::string frame = ends.client_send.seal({Op::kSet, "key", "value"});
  int refusals = 0;
  for (size_t position = 0; position < frame.size(); ++position) {
    for (const int mask : {0x01, 0x80, 0xff}) {
      CAPTURE(position);
      CAPTURE(mask);
      std::string forged = frame;
      forged[position] = static_cast<char>(static_cast<uint8_t>(forged[position]) ^ mask);
      Channel receiver(ends.secret, ends.server, ends.client, 'C');
      const bool was_refused = refused(receiver, forged);
      CHECK(was_refused);
      refusals += was_refused;
    }
  }
  CHECK(refusals == static_cast<int>(3 * frame.size()));
  // The receiver that refused nothing still opens the original.
  std::string buffer = frame;
  CHECK(ends.server_receive.open(buffer).has_value());
}

TEST_CASE("rendezvous Channel: a replayed frame is refused") {
  Ends ends;
  const std::string frame = ends.client_send.seal({Op::kAdd, "n", "1"});
  std::string buffer = frame;
  REQUIRE(ends.server_receive.open(buffer).has_value());
  buffer = frame;
  CHECK_THROWS_AS(ends.server_receive.open(buffer), WireError);
  // Also when it comes right behind itself in one read.
  Ends other;
  const std::string twice = other.client_send.seal({Op::kSet, "k", "v"});
  buffer = twice + twice;
  REQUIRE(other.server_receive.open(buffer).has_value());
  CHECK_THROWS_AS(other.server_receive.open(buffer), WireError);
}

TEST_CASE("rendezvous Channel: reordered or dropped frames are refused") {
  Ends ends;
  const std::string first = ends.client_send.seal({Op::kSet, "a", "1"});
  const std::string second = ends.client_send.seal({Op::kSet, "b", "2"});
  SUBCASE("the second before the first") {
    std::string buffer = second;
    CHECK_THROWS_AS(ends.server_receive.open(buffer), WireError);
  }
  SUBCASE("the first after the second was refused is still fine, then the second") {
    std::string buffer = second;
    CHECK_THROWS_AS(ends.server_receive.open(buffer), WireError);
    buffer = first + second;
    CHECK(ends.server_receive.open(buffer).has_value());
    CHECK(ends.server_receive.open(buffer).has_value());
  }
  SUBCASE("a counter that starts at 0 or skips one") {
    const std::string key = ref_session_key(ends.secret, ends.server, ends.client);
    for (const uint64_t counter : {0ull, 2ull, 0xffffffffffffffffull}) {
      CAPTURE(counter);
      Channel receiver(ends.secret, ends.server, ends.client, 'C');
      std::string buffer = ref_frame(key, 'C', ref_body(counter, 1, "k", "v"));
      CHECK_THROWS_AS(receiver.open(buffer), WireError);
    }
  }
}

TEST_CASE("rendezvous Channel: a frame reflected back to its sender's side is refused") {
  Ends ends;
  std::string from_client = ends.client_send.seal({Op::kSet, "k", "v"});
  CHECK_THROWS_AS(ends.client_receive.open(from_client), WireError);
  std::string from_server = ends.server_send.seal({Op::kReply, "", "v"});
  CHECK_THROWS_AS(ends.server_receive.open(from_server), WireError);
}

TEST_CASE("rendezvous Channel: another secret, server nonce or client nonce cannot open a frame") {
  Ends ends;
  const std::string frame = ends.client_send.seal({Op::kSet, "k", "v"});
  Channel other_secret(secret_of(99), ends.server, ends.client, 'C');
  Channel other_server(ends.secret, nonce_of(50), ends.client, 'C');
  Channel other_client(ends.secret, ends.server, nonce_of(51), 'C');
  Channel swapped(ends.secret, ends.client, ends.server, 'C');
  for (Channel *receiver : {&other_secret, &other_server, &other_client, &swapped}) {
    std::string buffer = frame;
    CHECK_THROWS_AS(receiver->open(buffer), WireError);
  }
}

TEST_CASE("rendezvous Channel: a length above kMaxBody is refused from the 4 header bytes alone") {
  for (const uint64_t length : {uint64_t{kMaxBody} + 1, uint64_t{1} << 31, uint64_t{0xffffffff}}) {
    CAPTURE(length);
    Ends ends;
    std::string header = be(length, 4);
    CHECK_THROWS_WITH_AS(ends.server_receive.open(header), doctest::Contains("refused a message"),
                         WireError);
  }
  // The cap itself only waits for the rest.
  Ends ends;
  std::string header = be(kMaxBody, 4);
  CHECK_FALSE(ends.server_receive.open(header).has_value());
  CHECK(header.size() == kHeaderSize);
  std::string partial = be(1, 1);  // less than a header
  CHECK_FALSE(ends.server_receive.open(partial).has_value());
}

TEST_CASE("rendezvous Channel: a length below the fixed part of a body is refused") {
  for (const uint64_t length : {uint64_t{0}, uint64_t{1}, uint64_t{kBodyOverhead - 1}}) {
    CAPTURE(length);
    Ends ends;
    std::string header = be(length, 4);
    CHECK_THROWS_AS(ends.server_receive.open(header), WireError);
  }
  Ends ends;
  std::string header = be(kBodyOverhead, 4);
  CHECK_FALSE(ends.server_receive.open(header).has_value());
}

TEST_CASE("rendezvous Channel: malformed bodies with a valid MAC are refused") {
  Ends ends;
  const std::string key = ref_session_key(ends.secret, ends.server, ends.client);
  const std::string counter = be(1, 8);
  const std::vector<std::pair<const char *, std::string>> bodies = {
      {"op 0", ref_body(1, 0, "k", "v")},
      {"op 5", ref_body(1, 5, "k", "v")},
      {"op 9", ref_body(1, 9, "k", "v")},
      {"op 12", ref_body(1, 12, "k", "v")},
      {"op 255", ref_body(1, 255, "k", "v")},
      {"key above kMaxKey", ref_body(1, 1, std::string(kMaxKey + 1, 'k'), "")},
      {"key length past the end",
       counter + "\x01" + be(1000, 4) + "abc" + be(0, 4) + std::string(10, 'x')},
      {"key length 2^32-1", counter + "\x01" + be(0xffffffff, 4) + std::string(8, 'x')},
      {"value length past the end", counter + "\x01" + be(1, 4) + "k" + be(100, 4) + "v"},
      {"value length short of the end", counter + "\x01" + be(1, 4) + "k" + be(1, 4) + "vv"},
      {"value length 2^32-1", counter + "\x01" + be(1, 4) + "k" + be(0xffffffff, 4) + "v"},
      {"no room for a value length", counter + "\x01" + be(4, 4) + "kkkk"},
  };
  for (const auto &[what, body] : bodies) {
    const std::string name = what;
    CAPTURE(name);
    Channel receiver(ends.secret, ends.server, ends.client, 'C');
    std::string buffer = ref_frame(key, 'C', body);
    CHECK(refused(receiver, buffer));
  }
}

// wire.h: "Lengths are checked against the caps"; seal refuses a value above kMaxValue, but
// open takes one (up to kMaxValue + kMaxKey bytes when the key is short): the server then stores
// a value it can never send (sealing the reply throws, which drops the getter).
TEST_CASE("rendezvous Channel: a value above kMaxValue is refused even with a valid MAC") {
  Ends ends;
  const std::string key = ref_session_key(ends.secret, ends.server, ends.client);
  std::string buffer = ref_frame(key, 'C', ref_body(1, 1, "k", std::string(kMaxValue + 1, 'v')));
  CHECK(refused(ends.server_receive, buffer));
}

TEST_CASE("rendezvous Channel: seal refuses an oversized key or value and spends no counter") {
  Ends ends;
  CHECK_THROWS_AS(ends.client_send.seal({Op::kSet, std::string(kMaxKey + 1, 'k'), ""}), WireError);
  CHECK_THROWS_AS(ends.client_send.seal({Op::kSet, "k", std::string(kMaxValue + 1, 'v')}),
                  WireError);
  std::string buffer = ends.client_send.seal({Op::kSet, "k", "v"});
  CHECK(ends.server_receive.open(buffer).has_value());  // counter 1 still
}

// ---- the hello ----------------------------------------------------------------------------------

TEST_CASE("rendezvous check_hello: the right proof passes, anything else fails") {
  const Secret secret = secret_of(10);
  const Nonce server = nonce_of(20);
  const Nonce client = nonce_of(30);
  const std::string hello = hello_proof(secret, server, client);
  REQUIRE(hello.size() == kHelloSize);
  // The client nonce, then HMAC(secret, "perseus-rdzv-hello" || server nonce || client nonce).
  CHECK(hello ==
        str(client) + ref_hmac(str(secret), "perseus-rdzv-hello" + str(server) + str(client)));
  CHECK(check_hello(secret, server, hello));
  CHECK_FALSE(check_hello(secret_of(11), server, hello));
  CHECK_FALSE(check_hello(secret, nonce_of(21), hello));
  CHECK_FALSE(check_hello(secret, server, hello.substr(0, kHelloSize - 1)));
  CHECK_FALSE(check_hello(secret, server, hello.substr(1)));
  CHECK_FALSE(check_hello(secret, server, hello + "x"));
  CHECK_FALSE(check_hello(secret, server, hello + hello));
  CHECK_FALSE(check_hello(secret, server, ""));
  CHECK_FALSE(check_hello(secret, server, std::string(kHelloSize, '\0')));
  // The proof of another client nonce does not fit this one.
  const std::string other = hello_proof(secret, server, nonce_of(31));
  CHECK_FALSE(check_hello(secret, server, str(client) + other.substr(kNonceSize)));
  for (size_t position = 0; position < hello.size(); ++position) {
    CAPTURE(position);
    std::string forged = hello;
    forged[position] = static_cast<char>(forged[position] ^ 0x01);
    CHECK_FALSE(check_hello(secret, server, forged));
  }
}

TEST_CASE("rendezvous random_secret and random_nonce: fresh bytes every call") {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    seen.insert(str(random_secret()));
    seen.insert(str(random_nonce()));
  }
  CHECK(seen.size() == 200);
}

// ---- server and client on loopback
// ---------------------------------------------------------------

bool ipv6_loopback_available() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0;
  close(fd);
  return ok;
}

std::vector<std::string> loopbacks() {
  std::vector<std::string> addresses = {"127.0.0.1"};
  if (ipv6_loopback_available()) {
    addresses.push_back("::1");
  } else {
    MESSAGE("no IPv6 loopback here: ::1 not tested");
  }
  return addresses;
}

bool wait_until(const std::function<bool()> &done, milliseconds within) {
  const auto deadline = Clock::now() + within;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

// A TCP peer that speaks the protocol by hand (the reference framer above), or breaks it.
class RawPeer {
 public:
  RawPeer(const std::string &address, int port) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    addrinfo *found = nullptr;
    REQUIRE(getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found) == 0);
    fd_ = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool connected = fd_ >= 0 && connect(fd_, found->ai_addr, found->ai_addrlen) == 0;
    freeaddrinfo(found);
    REQUIRE(connected);
  }
  ~RawPeer() {
    if (fd_ >= 0) close(fd_);
  }
  RawPeer(const RawPeer &) = delete;
  RawPeer &operator=(const RawPeer &) = delete;

  // False when the server has closed the connection already.
  bool send_bytes(const std::string &bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Some bytes into in_ within the deadline: false when closed (or reset) or out of time.
  bool receive_some(Clock::time_point deadline, bool *closed = nullptr) {
    for (;;) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      pollfd p{fd_, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, static_cast<int>(left)) == 0) return false;
      char chunk[65536];
      const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (closed) *closed = true;
        return false;
      }
      in_.append(chunk, static_cast<size_t>(n));
      return true;
    }
  }

  std::string read_exactly(size_t size, milliseconds within = seconds(5)) {
    const auto deadline = Clock::now() + within;
    while (in_.size() < size) REQUIRE(receive_some(deadline));
    std::string out = in_.substr(0, size);
    in_.erase(0, size);
    return out;
  }

  // The server closed (or reset) the connection within `within`; what it sent before is kept.
  bool closed_within(milliseconds within) {
    const auto deadline = Clock::now() + within;
    bool closed = false;
    while (receive_some(deadline, &closed)) {
    }
    return closed;
  }

  Nonce read_nonce() {
    const std::string bytes = read_exactly(kNonceSize);
    Nonce nonce{};
    std::copy(bytes.begin(), bytes.end(), nonce.begin());
    return nonce;
  }

  // Reads the server nonce, proves `secret` and sets up the session key.
  void authenticate(const Secret &secret) {
    const Nonce server = read_nonce();
    const Nonce client = random_nonce();
    send_bytes(hello_proof(secret, server, client));
    key_ = ref_session_key(secret, server, client);
    receive_.emplace(secret, server, client, 'S');
  }

  std::string frame(uint8_t op, const std::string &key, const std::string &value) {
    return ref_frame(key_, 'C', ref_body(++counter_, op, key, value));
  }

  std::optional<Message> reply(milliseconds within = seconds(5)) {
    const auto deadline = Clock::now() + within;
    for (;;) {
      if (auto message = receive_->open(in_)) return message;
      if (!receive_some(deadline)) return std::nullopt;
    }
  }

  const std::string &session_key() const { return key_; }

 private:
  int fd_ = -1;
  std::string in_;
  std::string key_;
  uint64_t counter_ = 0;
  std::optional<Channel> receive_;
};

TEST_CASE("rendezvous Server: set, get, add and check on loopback") {
  const Secret secret = random_secret();
  for (const std::string &address : loopbacks()) {
    CAPTURE(address);
    Server server(secret, address);
    CHECK(server.address() == address);
    CHECK(server.port() > 0);
    CHECK(server.port() < 65536);
    Client client(address, server.port(), secret, seconds(5));
    CHECK_FALSE(client.check("k"));
    client.set("k", "v");
    CHECK(client.check("k"));
    CHECK(client.get("k", seconds(5)) == "v");
    client.set("k", "overwritten");
    CHECK(client.get("k", seconds(5)) == "overwritten");
    const std::string binary_key = std::string("\0key\xff\n", 6);
    client.set(binary_key, all_bytes());
    CHECK(client.get(binary_key, seconds(5)) == all_bytes());
    CHECK_FALSE(client.check(std::string("\0key", 4)));
    client.set("", "");
    CHECK(client.check(""));
    CHECK(client.get("", seconds(5)).empty());
    CHECK(client.add("n", 5) == 5);
    CHECK(client.add("n", -7) == -2);
    CHECK(client.add("n", 0) == -2);
    CHECK(client.get("n", seconds(5)) == "-2");
    client.set("m", "40");
    CHECK(client.add("m", 2) == 42);
    // A second client sees the same store.
    Client other(address, server.port(), secret, seconds(5));
    CHECK(other.get("k", seconds(5)) == "overwritten");
    CHECK(other.add("n", 10) == 8);
    CHECK(client.get("n", seconds(5)) == "8");
    // Values at the caps travel.
    const std::string max_key(kMaxKey, 'K');
    const std::string max_value(kMaxValue, 'V');
    client.set(max_key, max_value);
    const bool same = other.get(max_key, seconds(10)) == max_value;
    CHECK(same);
    CHECK(server.dropped() == 0);
  }
}

TEST_CASE("rendezvous Server: get waits for a set from another client") {
  const Secret secret = random_secret();
  for (const std::string &address : loopbacks()) {
    CAPTURE(address);
    Server server(secret, address);
    Client waiter(address, server.port(), secret, seconds(5));
    Client second_waiter(address, server.port(), secret, seconds(5));
    std::string second_got;
    std::thread second([&] {
      try {
        second_got = second_waiter.get("late", seconds(10));
      } catch (const WireError &error) {
        second_got = std::string("error: ") + error.what();
      }
    });
    std::thread setter([&] {
      std::this_thread::sleep_for(milliseconds(300));
      Client client(address, server.port(), secret, seconds(5));
      client.set("late", "value");
    });
    const auto start = Clock::now();
    std::string got;
    CHECK_NOTHROW(got = waiter.get("late", seconds(10)));
    const auto waited = Clock::now() - start;
    setter.join();
    second.join();
    CHECK(got == "value");
    CHECK(second_got == "value");
    CHECK(waited >= milliseconds(250));
    CHECK(waited < seconds(5));
    // The waiters' connections are still in step.
    CHECK(waiter.check("late"));
    CHECK(second_waiter.add("after", 1) == 1);
    CHECK(server.dropped() == 0);
  }
}

TEST_CASE("rendezvous Server: get gives up after its timeout with a WireError naming the key") {
  const Secret secret = random_secret();
  Server server(secret, "127.0.0.1");
  Client client("127.0.0.1", server.port(), secret, seconds(5));
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(client.get("never/set", milliseconds(300)), doctest::Contains("'never/set'"),
                       WireError);
  const auto waited = Clock::now() - start;
  CHECK(waited >= milliseconds(250));
  CHECK(waited < seconds(3));
}

TEST_CASE("rendezvous Server: add on a value that is not an integer is an error reply") {
  const Secret secret = random_secret();
  Server server(secret, "127.0.0.1");
  Client client("127.0.0.1", server.port(), secret, seconds(5));
  for (const std::string value : {"abc", "", "1.5", " 1", "1 ", "0x10", "99999999999999999999"}) {
    CAPTURE(value);
    client.set("word", value);
    CHECK_THROWS_WITH_AS(client.add("word", 1), doctest::Contains("word"), WireError);
    CHECK(client.get("word", seconds(5)) == value);  // unchanged, and the connection in step
  }
  CHECK(client.check("word"));
  CHECK(client.add("fine", 3) == 3);
  CHECK(server.dropped() == 0);
}

// int64 overflow in the server's add is undefined behaviour; it should be refused.
TEST_CASE("rendezvous Server: add refuses to overflow int64") {
  const Secret secret = random_secret();
  Server server(secret, "127.0.0.1");
  Client client("127.0.0.1", server.port(), secret, seconds(5));
  client.set("big", "9223372036854775807");
  CHECK_THROWS_AS(client.add("big", 1), WireError);
  CHECK(client.get("big", seconds(5)) == "9223372036854775807");
}

// wire.h: "get: the value of key; waits until it is set". An add that creates the key sets it,
// but the server wakes waiters only on a set.
TEST_CASE("rendezvous Server: an add that creates a key wakes a get waiting for it") {
  const Secret secret = random_secret();
  Server server(secret, "127.0.0.1");
  Client waiter("127.0.0.1", server.port(), secret, seconds(5));
  std::thread adder([&] {
    std::this_thread::sleep_for(milliseconds(200));
    Client client("127.0.0.1", server.port(), secret, seconds(5));
    client.add("made/by/add", 5);
  });
  std::string got;
  CHECK_NOTHROW(got = waiter.get("made/by/add", seconds(2)));
  adder.join();
  CHECK(got == "5");
}

// After a get timed out, its reply may still come (a set of the key later): the client must then
// not take that late reply for the answer to its next request.
TEST_CASE("rendezvous Client: a late reply to a timed-out get is not the answer to the next call") {
  const Secret secret = random_secret();
  Server server(secret, "127.0.0.1");
  Client a("127.0.0.1", server.port(), secret, seconds(5));
  Client b("127.0.0.1", server.port(), secret, seconds(5));
  CHECK_THROWS_AS(a.get("slow", milliseconds(200)), WireError);
  b.set("slow", "late value");
  b.set("other", "right value");
  std::string got;
  try {
    got = a.get("other", seconds(2));
  } catch (const WireError &) {
    got = "<refused>";  // a client that refuses every call after a failure is fine too
  }
  CHECK((got == "right value" || got == "<refused>"));
  CHECK(got != "late value");
}

TEST_CASE("rendezvous Server: many clients meet at once") {
  const Secret secret = random_secret();
  Server server(secret, "127.0.0.1");
  constexpr int kClients = 12;
  std::vector<std::string> errors(kClients);
  std::vector<int64_t> arrived(kClients, 0);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kClients; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Client client("127.0.0.1", server.port(), secret, seconds(10));
        client.set("rank/" + std::to_string(rank), "hello " + std::to_string(rank));
        for (int peer = 0; peer < kClients; ++peer) {
          if (client.get("rank/" + std::to_string(peer), seconds(10)) !=
              "hello " + std::to_string(peer)) {
            errors[rank] = "wrong value of rank/" + std::to_string(peer);
          }
        }
        arrived[rank] = client.add("arrived", 1);
      } catch (const std::exception &error) {
        errors[rank] = error.what();
      }
    });
  }
  for (std::thread &thread : threads) thread.join();
  for (int rank = 0; rank < kClients; ++rank) {
    CAPTURE(rank);
    CHECK(errors[rank] == "");
  }
  std::sort(arrived.begin(), arrived.end());
  for (int rank = 0; rank < kClients; ++rank) CHECK(arrived[rank] == rank + 1);
  CHECK(server.dropped() == 0);
}

TEST_CASE("rendezvous Server: a client with the wrong secret is dropped, the others served") {
  const Secret secret = random_secret();
  for (const std::string &address : loopbacks()) {
    CAPTURE(address);
    Server server(secret, address);
    Client good(address, server.port(), secret, seconds(5));
    good.set("k", "v");
    for (int attempt = 1; attempt <= 3; ++attempt) {
      CAPTURE(attempt);
      const auto bad_client = [&] {
        Client bad(address, server.port(), random_secret(), seconds(5));
        bad.check("k");
      };
      CHECK_THROWS_AS(bad_client(), WireError);
      CHECK(wait_until([&] { return server.dropped() == attempt; }, seconds(3)));
      CHECK(good.get("k", seconds(5)) == "v");
    }
    CHECK(good.add("n", 1) == 1);
    Client late(address, server.port(), secret, seconds(5));
    CHECK(late.get("k", seconds(5)) == "v");
    CHECK(server.dropped() == 3);
  }
}

// One way of breaking the protocol: returns how many connections the server should drop for it.
struct Breach {
  const char *what;
  std::function<int(const std::string &address, int port, const Secret &secret, Client &good)> run;
};

const std::vector<Breach> &breaches() {
  static const std::vector<Breach> all = {
      {"garbage instead of a hello",
       [](const std::string &address, int port, const Secret &, Client &) {
         RawPeer peer(address, port);
         peer.send_bytes(std::string(kHelloSize, '\x5a'));
         CHECK(peer.closed_within(seconds(3)));
         RawPeer longer(address, port);
         longer.send_bytes(all_bytes() + all_bytes() + all_bytes());
         CHECK(longer.closed_within(seconds(3)));
         return 2;
       }},
      {"a huge length where the hello belongs",
       [](const std::string &address, int port, const Secret &, Client &) {
         RawPeer peer(address, port);
         peer.send_bytes(be(0x80000000u, 4) + std::string(kHelloSize - 4, '\0'));
         CHECK(peer.closed_within(seconds(3)));
         return 1;
       }},
      {"a hello proved with another secret",
       [](const std::string &address, int port, const Secret &, Client &) {
         RawPeer peer(address, port);
         peer.authenticate(random_secret());
         CHECK(peer.closed_within(seconds(3)));
         return 1;
       }},
      {"a hello of the server nonce echoed back",
       [](const std::string &address, int port, const Secret &, Client &) {
         RawPeer peer(address, port);
         const Nonce server = peer.read_nonce();
         peer.send_bytes(str(server) + str(server));
         CHECK(peer.closed_within(seconds(3)));
         return 1;
       }},
      {"a proper hello, then a length of 2^31: closed at once",
       [](const std::string &address, int port, const Secret &secret, Client &) {
         RawPeer peer(address, port);
         peer.authenticate(secret);
         const auto start = Clock::now();
         CHECK(peer.send_bytes(be(0x80000000u, 4)));
         CHECK(peer.closed_within(seconds(3)));
         CHECK(Clock::now() - start < seconds(3));
         return 1;
       }},
      {"a proper hello, then a length too short for a body",
       [](const std::string &address, int port, const Secret &secret, Client &) {
         RawPeer peer(address, port);
         peer.authenticate(secret);
         CHECK(peer.send_bytes(be(kBodyOverhead - 1, 4)));
         CHECK(peer.closed_within(seconds(3)));
         return 1;
       }},
      {"a proper hello, then a forged MAC",
       [](const std::string &address, int port, const Secret &secret, Client &good) {
         RawPeer peer(address, port);
         peer.authenticate(secret);
         std::string frame = peer.frame(1, "forged", "1");
         frame.back() = static_cast<char>(frame.back() ^ 1);
         CHECK(peer.send_bytes(frame));
         CHECK(peer.closed_within(seconds(3)));
         CHECK_FALSE(good.check("forged"));
         return 1;
       }},
      {"a proper hello, then a message sent twice: one reply, then closed",
       [](const std::string &address, int port, const Secret &secret, Client &good) {
         RawPeer peer(address, port);
         peer.authenticate(secret);
         const std::string frame = peer.frame(3, "replayed", "1");
         CHECK(peer.send_bytes(frame));
         const auto first = peer.reply();
         REQUIRE(first.has_value());
         CHECK(first->op == Op::kReply);
         CHECK(first->value == "1");
         peer.send_bytes(frame);
         CHECK(peer.closed_within(seconds(3)));
         CHECK(good.get("replayed", seconds(5)) == "1");  // added once
         return 1;
       }},
      {"a message of one connection replayed on another",
       [](const std::string &address, int port, const Secret &secret, Client &good) {
         RawPeer first(address, port);
         first.authenticate(secret);
         const std::string frame = first.frame(3, "first", "1");
         CHECK(first.send_bytes(frame));
         REQUIRE(first.reply().has_value());
         RawPeer second(address, port);
         second.authenticate(secret);
         second.send_bytes(frame);
         CHECK(second.closed_within(seconds(3)));
         CHECK(good.get("first", seconds(5)) == "1");
         return 1;
       }},
      {"a proper hello, then a request with a reply's op",
       [](const std::string &address, int port, const Secret &secret, Client &) {
         RawPeer peer(address, port);
         peer.authenticate(secret);
         peer.send_bytes(peer.frame(10, "k", "v"));
         CHECK(peer.closed_within(seconds(3)));
         return 1;
       }},
      {"a proper hello, then an unknown op",
       [](const std::string &address, int port, const Secret &secret, Client &) {
         RawPeer peer(address, port);
         peer.authenticate(secret);
         peer.send_bytes(peer.frame(7, "k", "v"));
         CHECK(peer.closed_within(seconds(3)));
         return 1;
       }},
      {"a hand-made session works (the reference framer agrees with the server)",
       [](const std::string &address, int port, const Secret &secret, Client &good) {
         RawPeer peer(address, port);
         peer.authenticate(secret);
         CHECK(peer.send_bytes(peer.frame(1, "raw", "made by hand")));
         const auto set = peer.reply();
         REQUIRE(set.has_value());
         CHECK(set->op == Op::kReply);
         CHECK(peer.send_bytes(peer.frame(2, "raw", "")));
         const auto get = peer.reply();
         REQUIRE(get.has_value());
         CHECK(get->value == "made by hand");
         // Two requests in one go: the answers come in order.
         std::string two = peer.frame(3, "count", "1");
         two += peer.frame(1, "count", "x");
         CHECK(peer.send_bytes(two));
         const auto add = peer.reply();
         REQUIRE(add.has_value());
         CHECK(add->op == Op::kReply);
         CHECK(add->value == "1");
         const auto overwrite = peer.reply();
         REQUIRE(overwrite.has_value());
         CHECK(overwrite->op == Op::kReply);
         CHECK(peer.send_bytes(peer.frame(3, "count", "1")));
         const auto refused_add = peer.reply();
         REQUIRE(refused_add.has_value());
         CHECK(refused_add->op == Op::kError);
         CHECK(peer.send_bytes(peer.frame(4, "raw", "")));
         const auto check = peer.reply();
         REQUIRE(check.has_value());
         CHECK(check->value == "1");
         CHECK(good.get("raw", seconds(5)) == "made by hand");
         return 0;
       }},
  };
  return all;
}

TEST_CASE("rendezvous Server: raw peers that break the protocol are dropped, the store serves on") {
  const Secret secret = random_secret();
  for (const std::string &address : loopbacks()) {
    CAPTURE(address);
    Server server(secret, address);
    const int port = server.port();
    Client good(address, port, secret, seconds(5));
    good.set("k", "v");
    // A peer that says nothing, and one that stops inside its hello, do not hold up the others
    // (the 10 s hello deadline itself is not waited for here).
    RawPeer silent(address, port);
    RawPeer half_hello(address, port);
    half_hello.send_bytes(std::string(kHelloSize / 2, 'h'));
    int dropped = 0;
    for (const Breach &breach : breaches()) {
      const std::string what = breach.what;
      CAPTURE(what);
      dropped += breach.run(address, port, secret, good);
      CHECK(wait_until([&] { return server.dropped() == dropped; }, seconds(3)));
      CHECK(server.dropped() == dropped);
      CHECK(good.get("k", seconds(5)) == "v");
    }
    // A truncated message and a close: the peer is gone, nothing else changes.
    {
      RawPeer peer(address, port);
      peer.authenticate(secret);
      const std::string frame = peer.frame(1, "truncated", "never stored");
      peer.send_bytes(frame.substr(0, frame.size() - 5));
    }
    CHECK(good.get("k", seconds(5)) == "v");
    CHECK_FALSE(good.check("truncated"));
    CHECK(good.add("still", 1) == 1);
    Client late(address, port, secret, seconds(5));
    CHECK(late.get("k", seconds(5)) == "v");
  }
}

// The value cap of wire.h is not checked by open (see the Channel case above): a SET of a value
// above kMaxValue is stored, and every GET of it then drops the getter.
TEST_CASE("rendezvous Server: a SET of a value above kMaxValue is refused") {
  const Secret secret = random_secret();
  Server server(secret, "127.0.0.1");
  RawPeer peer("127.0.0.1", server.port());
  peer.authenticate(secret);
  peer.send_bytes(peer.frame(1, "big", std::string(kMaxValue + 1, 'v')));
  const auto reply = peer.reply(seconds(10));
  CHECK_FALSE((reply.has_value() && reply->op == Op::kReply));
  Client client("127.0.0.1", server.port(), secret, seconds(5));
  CHECK_FALSE(client.check("big"));
}

TEST_CASE("rendezvous Server: destroying the server ends a waiting get with a WireError") {
  const Secret secret = random_secret();
  auto server = std::make_unique<Server>(secret, "127.0.0.1");
  Client client("127.0.0.1", server->port(), secret, seconds(5));
  RawPeer silent("127.0.0.1", server->port());
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(200));
    server.reset();
  });
  const auto start = Clock::now();
  CHECK_THROWS_AS(client.get("never", seconds(10)), WireError);
  stopper.join();
  CHECK(Clock::now() - start < seconds(5));
  CHECK(silent.closed_within(seconds(3)));
}

TEST_CASE(
    "rendezvous Server: an address that is not an IP literal, or not this machine's, throws") {
  const Secret secret = random_secret();
  for (const std::string address :
       {"localhost", "not an address", "127.0.0.1:80", "300.1.2.3", "[::1]", "::1/128"}) {
    CAPTURE(address);
    CHECK_THROWS_WITH_AS(Server(secret, address), doctest::Contains(address.c_str()), WireError);
  }
  CHECK_THROWS_WITH_AS(Server(secret, "192.0.2.1"), doctest::Contains("192.0.2.1"), WireError);
}

TEST_CASE("rendezvous Client: nothing listening -> a WireError after the timeout") {
  int port = 0;
  {
    Server server(random_secret(), "127.0.0.1");
    port = server.port();
  }
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(Client("127.0.0.1", port, random_secret(), milliseconds(300)),
                       doctest::Contains(("127.0.0.1:" + std::to_string(port)).c_str()), WireError);
  CHECK(Clock::now() - start < seconds(3));
}

TEST_CASE("rendezvous Client: a server that never sends its nonce -> a WireError in time") {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0);
  REQUIRE(listen(listener, 16) == 0);
  socklen_t length = sizeof address;
  getsockname(listener, reinterpret_cast<sockaddr *>(&address), &length);
  const int port = ntohs(address.sin_port);
  const auto start = Clock::now();
  CHECK_THROWS_AS(Client("127.0.0.1", port, random_secret(), milliseconds(300)), WireError);
  CHECK(Clock::now() - start < seconds(3));
  close(listener);
}

// client.h: "gives up after `timeout`". connect() is blocking, so a server whose SYNs go
// unanswered (here: a full accept queue; in life: a firewall that drops) holds the client for
// the kernel's SYN retries (about 2 minutes), whatever the timeout.
TEST_CASE("rendezvous Client: gives up after its timeout when the connect is not answered") {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0);
  REQUIRE(listen(listener, 0) == 0);
  socklen_t length = sizeof address;
  getsockname(listener, reinterpret_cast<sockaddr *>(&address), &length);
  const int port = ntohs(address.sin_port);
  // Fill the accept queue (never accepted): further SYNs are dropped.
  const int filler = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(connect(filler, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0);
  std::atomic<bool> done{false};
  std::thread client([&] {
    try {
      Client c("127.0.0.1", port, random_secret(), milliseconds(500));
    } catch (const WireError &) {
    }
    done = true;
  });
  const bool in_time = wait_until([&] { return done.load(); }, milliseconds(2500));
  // Unblock a client stuck in connect(): the next SYN it retries gets a reset.
  close(filler);
  close(listener);
  client.join();
  CHECK(in_time);
}

TEST_CASE("rendezvous Client::read_secret_file: 32 bytes in a file only its owner may read") {
  char folder_template[] = "/tmp/perseus-test-secret-XXXXXX";
  REQUIRE(mkdtemp(folder_template) != nullptr);
  const std::string folder = folder_template;
  const std::string path = folder + "/secret";
  const auto write = [&](const std::string &bytes, mode_t mode) {
    unlink(path.c_str());
    std::ofstream(path, std::ios::binary) << bytes;
    REQUIRE(chmod(path.c_str(), mode) == 0);
  };
  const Secret secret = random_secret();
  write(str(secret), 0600);
  CHECK(str(Client::read_secret_file(path)) == str(secret));
  write(str(secret), 0400);
  CHECK(str(Client::read_secret_file(path)) == str(secret));
  write(str(secret), 0640);
  CHECK_THROWS_WITH_AS(Client::read_secret_file(path), doctest::Contains(path.c_str()), WireError);
  write(str(secret), 0604);
  CHECK_THROWS_AS(Client::read_secret_file(path), WireError);
  write(str(secret).substr(1), 0600);
  CHECK_THROWS_WITH_AS(Client::read_secret_file(path), doctest::Contains("31 bytes"), WireError);
  write(str(secret) + "\n", 0600);
  CHECK_THROWS_WITH_AS(Client::read_secret_file(path), doctest::Contains("33 bytes"), WireError);
  write("", 0600);
  CHECK_THROWS_AS(Client::read_secret_file(path), WireError);
  unlink(path.c_str());
  CHECK_THROWS_WITH_AS(Client::read_secret_file(path), doctest::Contains(path.c_str()), WireError);
  rmdir(folder.c_str());
}

}  // namespace
}  // namespace perseus::rendezvous
