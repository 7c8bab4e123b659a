#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace spindle::cli {

/// Exit codes every subcommand shares.
enum exit_code : int {
  ok = 0,
  failure = 1,   // the operation failed (busy session, violation, ...)
  usage = 2,     // bad arguments or input: nothing was touched
  nothing = 3,   // nothing to do (no executable task)
};

/// Collects the action of whichever subcommand the parser selected.
class registry {
public:
  /// Binds `action` to `sub`: it runs when `sub` was given.
  void on(CLI::App* sub, std::function<int()> action) {
    sub->callback([this, action] { selected_ = action; });
  }

  int run() const {
    return selected_ ? selected_() : exit_code::usage;
  }

private:
  std::function<int()> selected_;
};

void add_demo(CLI::App& app, registry& commands);
void add_id(CLI::App& app, registry& commands);
void add_task(CLI::App& app, registry& commands);
void add_session(CLI::App& app, registry& commands);
void add_serve(CLI::App& app, registry& commands);
void add_stress(CLI::App& app, registry& commands);
void add_worker(CLI::App& app, registry& commands);
/// `spindle tenant ...` and `spindle key ...` (tenant.cpp).
void add_tenant(CLI::App& app, registry& commands);

} // namespace spindle::cli
