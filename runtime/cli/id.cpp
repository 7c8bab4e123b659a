// `spindle id ...`: IDs for scripts.

#include "cli.hpp"

namespace spindle::cli {

void add_id(CLI::App& app, registry& commands) {
  auto* sub = app.add_subcommand("id", "Claim IDs from file counters.");
  sub->require_subcommand(1);
  (void) commands;
}

} // namespace spindle::cli
