#pragma once

// spindle stress: N concurrent clients drive a server (over HTTP) or an
// in-process runtime with a mix of operations, checking spindle's
// invariants on every response.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spindle {

class runtime;

/// What the clients do and for how long.
struct stress_options {
  /// Base URL of a running server; empty with `in_process`.
  std::string url;
  /// Drive an in-process runtime instead of a server.
  bool in_process = false;
  /// Bearer token for the server.
  std::string token;
  size_t clients = 8;
  /// Stop after this long (if > 0) ...
  std::chrono::milliseconds duration{0};
  /// ... or after this many operations in all (if > 0).
  uint64_t requests = 0;
  /// Relative weights of the operations: message, history, context, item,
  /// id, task.
  std::map<std::string, unsigned> mix{{"message", 30}, {"history", 25},
                                      {"context", 10}, {"item", 10},
                                      {"id", 15},      {"task", 10}};
  /// Threads every client writes to (shared); each client also has one of
  /// its own (private).
  size_t shared_threads = 4;
  /// Turns after which a conversation ends and its writers move on to a
  /// new thread (0: never). Each private thread and each shared slot is
  /// then a series of threads of about this many turns, as conversations
  /// are; without it a run grows its few threads without end.
  uint64_t thread_turns = 0;
  uint64_t seed = 1;
  /// Print a live progress line (only when stderr is a terminal).
  bool progress = true;
};

/// Parses "message=30,history=25,..." into weights. Errors name the part.
std::optional<std::map<std::string, unsigned>>
parse_mix(const std::string& text, std::string& error);

/// One broken invariant, with what showed it.
struct stress_violation {
  std::string invariant;
  std::string evidence;
};

/// Latency figures of one operation, in milliseconds.
struct op_stats {
  uint64_t count = 0;
  uint64_t errors = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
};

struct stress_report {
  double seconds = 0;
  uint64_t operations = 0;
  uint64_t errors = 0;
  std::map<std::string, op_stats> ops;
  std::vector<stress_violation> violations;
  /// A few error messages, for the reader.
  std::vector<std::string> error_samples;

  nlohmann::json to_json() const;
  std::string to_text() const;
};

/// Runs the stress; `rt` is used when `options.in_process`.
stress_report run_stress(const stress_options& options, runtime* rt);

} // namespace spindle
