// spindle's command-line entry point: one executable, one subcommand per
// job. Each subcommand lives in its own file and registers itself through
// cli.hpp.

#include <iostream>

#include <CLI/CLI.hpp>

#include "cli.hpp"
#include "core/logging.hpp"
#include "spindle/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"spindle: a concurrent actor runtime that keeps LLM "
               "conversation state and orchestrates agent work.",
               "spindle"};
  app.set_version_flag("--version", std::string{"spindle "}
                                      + spindle::version_string);
  app.require_subcommand(1);
  app.fallthrough(false);
  // Logs go to stderr, so stdout stays the command's output; `serve`
  // configures its own level and format.
  spindle::setup_logging("warn", "text");
  spindle::cli::registry commands;
  spindle::cli::add_demo(app, commands);
  spindle::cli::add_id(app, commands);
  spindle::cli::add_task(app, commands);
  spindle::cli::add_session(app, commands);
  spindle::cli::add_serve(app, commands);
  spindle::cli::add_stress(app, commands);
  spindle::cli::add_worker(app, commands);
  spindle::cli::add_tenant(app, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every parse error is a usage error.
    return app.exit(e) == 0 ? spindle::cli::exit_code::ok
                            : spindle::cli::exit_code::usage;
  }
  return commands.run();
}
