#include "lib/launch/protocol/agent_protocol.h"

#include <nlohmann/json.hpp>

#include "lib/launch/errors.h"

namespace perseus::launch {

namespace {

using nlohmann::json;

json as_bytes(const std::string &text) {
  return json::binary(std::vector<std::uint8_t>(text.begin(), text.end()));
}

std::string from_bytes(const json &value) {
  const auto &bytes = value.get_binary();
  return std::string(bytes.begin(), bytes.end());
}

std::string to_payload(const json &message) {
  const std::vector<std::uint8_t> cbor = json::to_cbor(message);
  return std::string(cbor.begin(), cbor.end());
}

// Parses a CBOR payload and runs `read` on it; any type or key mismatch becomes LaunchError.
template <typename Read>
auto from_payload(const std::string &payload, const std::string &peer, const char *what,
                  Read read) {
  try {
    return read(json::from_cbor(payload));
  } catch (const json::exception &error) {
    throw LaunchError(std::string("malformed ") + what + " message from the " + peer + ": " +
                      error.what());
  }
}

json encode_environment(const EnvironmentChanges &environment) {
  json list = json::array();
  for (const auto &[name, value] : environment) {
    list.push_back(json::array({as_bytes(name), as_bytes(value)}));
  }
  return list;
}

EnvironmentChanges decode_environment(const json &list) {
  EnvironmentChanges environment;
  for (const auto &entry : list) {
    environment.emplace_back(from_bytes(entry.at(0)), from_bytes(entry.at(1)));
  }
  return environment;
}

}  // namespace

std::string encode(const Hello &m) {
  json j = {{"version", m.version},     {"protocol", m.protocol}, {"hostname", m.hostname},
            {"cpu_count", m.cpu_count}, {"gpu_count", nullptr},   {"cuda_visible", nullptr},
            {"free_port", m.free_port}};
  if (m.gpu_count) j["gpu_count"] = *m.gpu_count;
  if (m.cuda_visible_devices) j["cuda_visible"] = *m.cuda_visible_devices;
  return to_payload(j);
}

Hello decode_hello(const std::string &payload, const std::string &peer) {
  return from_payload(payload, peer, "hello", [](const json &j) {
    Hello m;
    m.version = j.at("version").get<std::string>();
    m.protocol = j.at("protocol").get<int>();
    m.hostname = j.at("hostname").get<std::string>();
    m.cpu_count = j.at("cpu_count").get<int>();
    if (!j.at("gpu_count").is_null()) m.gpu_count = j.at("gpu_count").get<int>();
    m.free_port = j.at("free_port").get<int>();
    if (!j.at("cuda_visible").is_null()) {
      m.cuda_visible_devices = j.at("cuda_visible").get<std::string>();
    }
    return m;
  });
}

std::string encode(const JobDescription &m) {
  json argv = json::array();
  for (const auto &arg : m.argv) argv.push_back(as_bytes(arg));
  json ranks = json::array();
  for (const auto &rank : m.ranks) {
    ranks.push_back({{"rank", rank.rank}, {"env", encode_environment(rank.environment)}});
  }
  return to_payload({{"job_id", m.job_id},
                     {"host", m.host_label},
                     {"argv", argv},
                     {"cwd", as_bytes(m.working_directory)},
                     {"stdin_rank", m.stdin_rank},
                     {"kill_grace", m.kill_grace_seconds},
                     {"heartbeat_timeout", m.heartbeat_timeout_seconds},
                     {"secret", as_bytes(m.secret)},
                     {"common_env", encode_environment(m.common_environment)},
                     {"elastic", m.elastic},
                     {"ranks", ranks}});
}

JobDescription decode_job(const std::string &payload, const std::string &peer) {
  return from_payload(payload, peer, "job", [](const json &j) {
    JobDescription m;
    m.job_id = j.at("job_id").get<std::string>();
    m.host_label = j.at("host").get<std::string>();
    for (const auto &arg : j.at("argv")) m.argv.push_back(from_bytes(arg));
    m.working_directory = from_bytes(j.at("cwd"));
    m.stdin_rank = j.at("stdin_rank").get<int>();
    m.kill_grace_seconds = j.at("kill_grace").get<double>();
    m.heartbeat_timeout_seconds = j.at("heartbeat_timeout").get<double>();
    m.secret = from_bytes(j.at("secret"));
    m.common_environment = decode_environment(j.at("common_env"));
    m.elastic = j.at("elastic").get<bool>();
    for (const auto &rank : j.at("ranks")) {
      m.ranks.push_back(RankLaunch{rank.at("rank").get<int>(), decode_environment(rank.at("env"))});
    }
    return m;
  });
}

std::string encode(const RankStarted &m) { return to_payload({{"rank", m.rank}, {"pid", m.pid}}); }

RankStarted decode_started(const std::string &payload, const std::string &peer) {
  return from_payload(payload, peer, "started", [](const json &j) {
    return RankStarted{j.at("rank").get<int>(), j.at("pid").get<int>()};
  });
}

std::string encode(const RankExited &m) {
  return to_payload(
      {{"rank", m.rank}, {"pid", m.pid}, {"exit_code", m.exit_code}, {"signal", m.signal}});
}

RankExited decode_exited(const std::string &payload, const std::string &peer) {
  return from_payload(payload, peer, "exited", [](const json &j) {
    return RankExited{j.at("rank").get<int>(), j.at("pid").get<int>(), j.at("exit_code").get<int>(),
                      j.at("signal").get<int>()};
  });
}

std::string encode(const AgentError &m) {
  return to_payload({{"message", m.message}, {"exit_code", m.exit_code}});
}

AgentError decode_error(const std::string &payload, const std::string &peer) {
  return from_payload(payload, peer, "error", [](const json &j) {
    return AgentError{j.at("message").get<std::string>(), j.at("exit_code").get<int>()};
  });
}

std::string encode(const Terminate &m) { return to_payload({{"grace", m.grace_seconds}}); }

Terminate decode_terminate(const std::string &payload, const std::string &peer) {
  return from_payload(payload, peer, "terminate",
                      [](const json &j) { return Terminate{j.at("grace").get<double>()}; });
}

std::string encode(const OutputChunk &m) {
  std::string payload;
  payload.reserve(5 + m.bytes.size());
  const auto rank = static_cast<uint32_t>(m.rank);
  for (int shift = 24; shift >= 0; shift -= 8) {
    payload.push_back(static_cast<char>((rank >> shift) & 0xff));
  }
  payload.push_back(static_cast<char>(m.stream));
  payload.append(m.bytes);
  return payload;
}

OutputChunk decode_output(const std::string &payload, const std::string &peer) {
  const auto stream = payload.size() >= 5 ? static_cast<uint8_t>(payload[4]) : 0;
  if (stream != 1 && stream != 2) {
    throw LaunchError("malformed output message from the " + peer);
  }
  uint32_t rank = 0;
  for (int i = 0; i < 4; ++i) rank = (rank << 8) | static_cast<uint8_t>(payload[i]);
  return OutputChunk{static_cast<int>(rank), static_cast<OutputStream>(stream), payload.substr(5)};
}

std::string encode_count(size_t count) { return to_payload({{"count", count}}); }

size_t decode_count(const std::string &payload, const std::string &peer) {
  return from_payload(payload, peer, "count",
                      [](const json &j) { return j.at("count").get<size_t>(); });
}

EnvironmentChanges rank_changes(const JobDescription &job, const RankLaunch &launch) {
  EnvironmentChanges all = job.common_environment;
  all.insert(all.end(), launch.environment.begin(), launch.environment.end());
  return all;
}

}  // namespace perseus::launch
