#pragma once

// Shared helpers for spindle's benchmarks: timing, percentiles, RSS, and a
// report that prints aligned tables (each with its baselines side by side)
// and writes the same figures as JSON for the benchmark report.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <sys/types.h>

#include <nlohmann/json.hpp>

namespace spindle::bench {

using clock = std::chrono::steady_clock;

/// Seconds elapsed since `start`.
double seconds_since(clock::time_point start);

/// The p-th percentile (0..100) of `samples` (sorted in place).
double percentile(std::vector<double>& samples, double p);

/// Resident set size of this process in bytes (from /proc/self/status).
uint64_t rss_bytes();

/// One table: a title, column names, rows of cells (strings or numbers),
/// and notes (target, how to read it) printed under it. A table measured
/// as another's baseline names it in `beside` (make_report.py: the
/// table's "benchmark" and "title" prefix, "versus" column pairs, "unit"),
/// and the report shows it under that table.
struct table {
  std::string title;
  std::vector<std::string> columns;
  std::vector<std::vector<nlohmann::json>> rows;
  std::vector<std::string> notes;
  nlohmann::json beside;

  /// Appends a row; each cell may be a string or a number.
  template <class... Ts>
  void add_row(Ts&&... cells) {
    rows.push_back(
      std::vector<nlohmann::json>{nlohmann::json(std::forward<Ts>(cells))...});
  }
};

/// Collects tables, prints them as they are added, and writes
/// {"benchmark", "machine", "tables": [...]} to a JSON file.
class report {
public:
  explicit report(std::string benchmark);

  /// Prints `t` to stdout and keeps it for `write`.
  void add(table t);

  /// Writes the JSON document; returns false on I/O failure.
  bool write(const std::string& path) const;

  /// The JSON output path from argv (--json PATH), or
  /// bench/results/<benchmark>.json beside the working directory.
  static std::string json_path(int argc, char** argv,
                               const std::string& benchmark);

  /// The value after `flag` in argv (`--redis-port 6379`), or empty.
  static std::string value(int argc, char** argv, const std::string& flag);

  /// True if argv holds --quick (smaller sizes, for smoke runs in CI).
  static bool quick(int argc, char** argv);

  /// True unless argv holds `--only NAME` for another section: runs one
  /// section of a benchmark alone (`--only builder`), to measure or
  /// profile it without the others.
  static bool selected(int argc, char** argv, const std::string& section);

private:
  std::string name_;
  std::vector<table> tables_;
};

/// Runs `fn` in a forked child process and returns the number it returns
/// (0 if the child failed). For measurements that need a fresh process
/// (resident memory). Call it only while no other thread runs.
uint64_t in_child(const std::function<uint64_t()>& fn);

/// `spindle serve --port 0 --log-level warn ARGS...` (the build's binary)
/// as a child process, its port read from the first line it prints;
/// stopped with SIGTERM, and waited for, on destruction. Exits the
/// benchmark when the server does not start.
class serve_child {
public:
  explicit serve_child(const std::vector<std::string>& args);
  ~serve_child();
  serve_child(const serve_child&) = delete;
  serve_child& operator=(const serve_child&) = delete;

  int port() const noexcept {
    return port_;
  }

private:
  pid_t pid_ = -1;
  int port_ = 0;
};

/// Formats a number with thousands separators and `digits` decimals.
std::string fmt(double value, int digits = 0);

/// A description of this machine: CPU model, cores, memory, kernel.
nlohmann::json machine();

} // namespace spindle::bench
