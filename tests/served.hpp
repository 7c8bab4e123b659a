#pragma once

// A runtime and its HTTP server in the test's own process, on a free
// loopback port, served from a thread of their own until destruction.
// Part of the test support library (compiled once).

#include <memory>
#include <thread>

#include "server/server.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::test {

class served_runtime {
public:
  /// Starts both; `so.port` is replaced by 0 (a free port, see `port`).
  explicit served_runtime(runtime_options ro = {}, server_options so = {});
  ~served_runtime();

  served_runtime(const served_runtime&) = delete;
  served_runtime& operator=(const served_runtime&) = delete;

  runtime& rt() noexcept {
    return *rt_;
  }
  spindle::server& srv() noexcept {
    return *srv_;
  }
  int port() const noexcept {
    return port_;
  }

private:
  std::unique_ptr<runtime> rt_;
  std::unique_ptr<spindle::server> srv_;
  std::thread serving_;
  int port_ = 0;
};

} // namespace spindle::test
