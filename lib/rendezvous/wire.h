#pragma once
// The rendezvous wire protocol: how ranks and the launcher's key-value store talk, and why
// nobody else can.
//
// Connection:
//   server -> client: server nonce (32 random bytes)
//   client -> server: client nonce (32 random bytes) + proof = HMAC(secret, "perseus-rdzv-hello"
//                     || server nonce || client nonce)
//   Both then use session key K = HMAC(secret, "perseus-rdzv-key" || server nonce || client
//   nonce), fresh per connection, so nothing recorded from one connection replays on another.
// Message (either way):
//   [length: 4 bytes BE] [body: length bytes] [mac: 32 bytes]
//   body = [counter: 8 bytes BE] [op: 1] [key length: 4 BE] [key] [value length: 4 BE] [value]
//   mac  = HMAC-SHA256(K, direction byte || length || body)
// The counter of each direction starts at 1 and goes up by exactly 1: a replayed, dropped or
// reordered message is refused. Lengths are checked against the caps before anything is
// allocated for them; MACs are compared in constant time. Any failure is a WireError, after
// which the connection is dropped.

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace perseus::rendezvous {

inline constexpr size_t kSecretSize = 32;
inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;
inline constexpr size_t kMaxKey = 4096;
inline constexpr size_t kMaxValue = 16u << 20;
inline constexpr size_t kHeaderSize = 4;
inline constexpr size_t kBodyOverhead = 8 + 1 + 4 + 4;
inline constexpr size_t kMaxBody = kBodyOverhead + kMaxKey + kMaxValue;
inline constexpr size_t kHelloSize = kNonceSize + kMacSize;

using Secret = std::array<uint8_t, kSecretSize>;
using Nonce = std::array<uint8_t, kNonceSize>;

class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The server did not answer within the caller's timeout (a key nobody set, in time).
class TimeoutError : public WireError {
 public:
  using WireError::WireError;
};

enum class Op : uint8_t {
  kSet = 1,     // key = value
  kGet = 2,     // the value of key; waits until it is set
  kAdd = 3,     // key += value (decimal int64); the reply is the new value
  kCheck = 4,   // reply "1" if key is set, else "0"
  kReply = 10,  // server -> client
  kError = 11,  // server -> client: the request was refused (value says why)
};

struct Message {
  Op op = Op::kReply;
  std::string key;
  std::string value;
};

// Random bytes from the kernel (getrandom).
Secret random_secret();
Nonce random_nonce();

// The client's second handshake message, and the server's check of it (constant time).
std::string hello_proof(const Secret &secret, const Nonce &server, const Nonce &client);
bool check_hello(const Secret &secret, const Nonce &server, std::string_view hello);

// One direction's sealing or opening state of one connection.
class Channel {
 public:
  // `sending`: this end's direction; the server sends with direction 'S', the client 'C'.
  Channel(const Secret &secret, const Nonce &server, const Nonce &client, char direction);

  std::string seal(const Message &message);

  // Takes one whole message off the front of `buffer` when it is there; nullopt when more
  // bytes are needed. Throws WireError for anything malformed, forged, replayed or too long.
  std::optional<Message> open(std::string &buffer);

 private:
  std::array<uint8_t, kMacSize> key_{};
  char direction_;
  uint64_t counter_ = 0;
};

}  // namespace perseus::rendezvous
