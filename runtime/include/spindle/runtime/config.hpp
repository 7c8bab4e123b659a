#pragma once

#include <chrono>
#include <cstddef>

#include <caf/actor_system_config.hpp>

namespace spindle {

/// The actor system configuration every spindle process uses: registers
/// spindle's type-ID block and its error category, so tests, the CLI and
/// the server name, print and render spindle's messages and errors alike.
/// Never reads caf-application.ini or the command line.
class config : public caf::actor_system_config {
public:
  /// `threads` sizes the scheduler; 0 keeps CAF's default (one worker per
  /// core).
  explicit config(size_t threads = 0);

  /// How long an idle scheduler worker stays parked before it looks for
  /// work by itself. Every enqueue wakes a parked worker, so this is only a
  /// safety net (docs/architecture.md, "Threading").
  std::chrono::milliseconds park_timeout{10};
};

} // namespace spindle
