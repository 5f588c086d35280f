#include "lib/rendezvous/wire.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>

namespace perseus::rendezvous {

namespace {

using Mac = std::array<uint8_t, kMacSize>;

Mac hmac(const uint8_t *key, size_t key_size, std::string_view data) {
  Mac mac{};
  unsigned int size = 0;
  HMAC(EVP_sha256(), key, static_cast<int>(key_size),
       reinterpret_cast<const unsigned char *>(data.data()), data.size(), mac.data(), &size);
  return mac;
}

std::string bytes(const uint8_t *data, size_t size) {
  return std::string(reinterpret_cast<const char *>(data), size);
}

std::string labelled(const char *label, const Nonce &server, const Nonce &client) {
  return std::string(label) + bytes(server.data(), server.size()) +
         bytes(client.data(), client.size());
}

void put_u32(std::string &out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(value >> shift));
}

uint64_t get_be(std::string_view data, size_t offset, size_t size) {
  uint64_t value = 0;
  for (size_t i = 0; i < size; ++i) value = (value << 8) | static_cast<uint8_t>(data[offset + i]);
  return value;
}

template <size_t N>
std::array<uint8_t, N> random_bytes() {
  std::array<uint8_t, N> out{};
  size_t filled = 0;
  while (filled < N) {
    const ssize_t n = getrandom(out.data() + filled, N - filled, 0);
    if (n < 0 && errno != EINTR) throw WireError(std::string("getrandom: ") + strerror(errno));
    if (n > 0) filled += static_cast<size_t>(n);
  }
  return out;
}

bool known_op(uint8_t op) { return (op >= 1 && op <= 4) || op == 10 || op == 11; }

}  // namespace

Secret random_secret() { return random_bytes<kSecretSize>(); }
Nonce random_nonce() { return random_bytes<kNonceSize>(); }

std::string hello_proof(const Secret &secret, const Nonce &server, const Nonce &client) {
  const Mac proof =
      hmac(secret.data(), secret.size(), labelled("perseus-rdzv-hello", server, client));
  return bytes(client.data(), client.size()) + bytes(proof.data(), proof.size());
}

bool check_hello(const Secret &secret, const Nonce &server, std::string_view hello) {
  if (hello.size() != kHelloSize) return false;
  Nonce client{};
  std::memcpy(client.data(), hello.data(), kNonceSize);
  const std::string expected = hello_proof(secret, server, client);
  return CRYPTO_memcmp(expected.data(), hello.data(), kHelloSize) == 0;
}

Channel::Channel(const Secret &secret, const Nonce &server, const Nonce &client, char direction)
    : key_(hmac(secret.data(), secret.size(), labelled("perseus-rdzv-key", server, client))),
      direction_(direction) {}

std::string Channel::seal(const Message &message) {
  if (message.key.size() > kMaxKey || message.value.size() > kMaxValue) {
    throw WireError("message too long: key " + std::to_string(message.key.size()) +
                    " bytes, value " + std::to_string(message.value.size()) + " bytes");
  }
  std::string body;
  const uint64_t counter = ++counter_;
  for (int shift = 56; shift >= 0; shift -= 8) body.push_back(static_cast<char>(counter >> shift));
  body.push_back(static_cast<char>(message.op));
  put_u32(body, static_cast<uint32_t>(message.key.size()));
  body += message.key;
  put_u32(body, static_cast<uint32_t>(message.value.size()));
  body += message.value;
  std::string frame;
  put_u32(frame, static_cast<uint32_t>(body.size()));
  frame += body;
  const Mac mac = hmac(key_.data(), key_.size(), std::string(1, direction_) + frame);
  return frame + bytes(mac.data(), mac.size());
}

std::optional<Message> Channel::open(std::string &buffer) {
  if (buffer.size() < kHeaderSize) return std::nullopt;
  const uint64_t length = get_be(buffer, 0, kHeaderSize);
  if (length < kBodyOverhead || length > kMaxBody) {
    throw WireError("refused a message of " + std::to_string(length) + " bytes (at most " +
                    std::to_string(kMaxBody) + ")");
  }
  const size_t total = kHeaderSize + length + kMacSize;
  if (buffer.size() < total) return std::nullopt;
  const std::string_view frame(buffer.data(), kHeaderSize + length);
  const Mac mac = hmac(key_.data(), key_.size(), std::string(1, direction_) + std::string(frame));
  if (CRYPTO_memcmp(mac.data(), buffer.data() + kHeaderSize + length, kMacSize) != 0) {
    throw WireError("refused a message whose MAC does not match (forged, or another job's)");
  }
  const std::string_view body = frame.substr(kHeaderSize);
  if (get_be(body, 0, 8) != counter_ + 1) {
    throw WireError("refused a message out of sequence (replayed or reordered)");
  }
  const uint8_t op = static_cast<uint8_t>(body[8]);
  const uint64_t key_size = get_be(body, 9, 4);
  if (!known_op(op) || key_size > kMaxKey || 13 + key_size + 4 > body.size()) {
    throw WireError("refused a malformed message");
  }
  const uint64_t value_size = get_be(body, 13 + key_size, 4);
  if (value_size > kMaxValue || 17 + key_size + value_size != body.size()) {
    throw WireError("refused a malformed message");
  }
  ++counter_;
  Message message{static_cast<Op>(op), std::string(body.substr(13, key_size)),
                  std::string(body.substr(17 + key_size, value_size))};
  buffer.erase(0, total);
  return message;
}

}  // namespace perseus::rendezvous
