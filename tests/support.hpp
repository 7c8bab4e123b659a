#pragma once

// Shared helpers for spindle's tests: temporary directories and running the
// spindle binary (or any command) as a child process.

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace spindle::test {

/// A fresh directory under the system's temp dir, removed on destruction.
class temp_dir {
public:
  temp_dir();
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const noexcept {
    return path_;
  }
  std::string str() const {
    return path_.string();
  }

private:
  std::filesystem::path path_;
};

/// What a finished child process left behind.
struct process_result {
  int exit_code = -1;     // -1 when killed by a signal
  int signal = 0;         // the signal that ended it, or 0
  std::string out;
  std::string err;
};

/// Runs `argv` (argv[0] is a path or a name on PATH) with `input` on its
/// standard input and waits for it. `env` entries are added to (or replace)
/// the environment.
process_result run(const std::vector<std::string>& argv,
                   const std::string& input = {},
                   const std::map<std::string, std::string>& env = {});

/// A child process running in the background; killed on destruction.
class child {
public:
  explicit child(const std::vector<std::string>& argv,
                 const std::map<std::string, std::string>& env = {});
  ~child();
  child(const child&) = delete;
  child& operator=(const child&) = delete;

  pid_t pid() const noexcept {
    return pid_;
  }
  /// Sends `sig` to the child.
  void kill(int sig);
  /// Waits for the child to end; returns its exit code (-1 if signalled).
  int wait();

private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

/// `spindle serve` running as a child on a free loopback port; stopped
/// (SIGTERM, then SIGKILL after 10 s) on destruction. stderr (the log) is
/// collected in a file.
class server_process {
public:
  /// Starts `spindle serve --port 0 --data :memory: <extra>` (without
  /// `--data :memory:` when `extra` names a --data) and waits
  /// until it prints its address.
  explicit server_process(const std::vector<std::string>& extra = {},
                          const std::map<std::string, std::string>& env = {});
  ~server_process();
  server_process(const server_process&) = delete;
  server_process& operator=(const server_process&) = delete;

  int port() const noexcept {
    return port_;
  }
  pid_t pid() const noexcept {
    return pid_;
  }
  /// Sends `sig` and waits for the exit code (-1 if killed by a signal).
  int stop(int sig);
  /// Everything the server logged so far.
  std::string log() const;

private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool reaped_ = false;
  std::string log_path_;
};

/// Path of the spindle binary under test.
std::string spindle_binary();

/// Splits text into lines (without the trailing newline).
std::vector<std::string> lines(const std::string& text);

/// A PID that belongs to no running process right now.
pid_t dead_pid();

} // namespace spindle::test
