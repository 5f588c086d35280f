// A rank program for the black-box tests: meets the other ranks through the job's rendezvous
// store exactly as libperseus will (PERSEUS_RENDEZVOUS_ADDR/PORT, PERSEUS_SECRET_FILE), and
// prints what it saw. Exit code 0 when every rank's key was read back and the counter added up.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "lib/rendezvous/client.h"

namespace {

std::string required(const char *name) {
  const char *value = getenv(name);
  if (!value) throw perseus::rendezvous::WireError(std::string(name) + " is not set");
  return value;
}

}  // namespace

int main() {
  using namespace perseus::rendezvous;
  using std::chrono::seconds;
  try {
    const int rank = std::stoi(required("PERSEUS_RANK"));
    const int size = std::stoi(required("PERSEUS_SIZE"));
    Client client(required("PERSEUS_RENDEZVOUS_ADDR"),
                  std::stoi(required("PERSEUS_RENDEZVOUS_PORT")),
                  Client::read_secret_file(required("PERSEUS_SECRET_FILE")), seconds(30));
    client.set("rank/" + std::to_string(rank), "hello from " + std::to_string(rank));
    for (int peer = 0; peer < size; ++peer) {
      const std::string value = client.get("rank/" + std::to_string(peer), seconds(60));
      printf("rank %d read rank/%d = %s\n", rank, peer, value.c_str());
    }
    // Every rank has set its key by now; each adds 1 once, so the counts seen are 1..size.
    const int64_t after = client.add("arrived", 1);
    printf("rank %d added 1 to arrived: %lld\n", rank, static_cast<long long>(after));
    if (after < 1 || after > size || !client.check("rank/0") || client.check("no-such-key")) {
      fprintf(stderr, "rendezvous_probe: add or check answered wrong\n");
      return 1;
    }
    return 0;
  } catch (const std::exception &error) {
    fprintf(stderr, "rendezvous_probe: %s\n", error.what());
    return 1;
  }
}
