// `spindle id next`: claims the next ID of a file counter, for scripts that
// run no server (seed 003, D2, D3).

#include <iostream>

#include "cli.hpp"
#include "spindle/messages/error.hpp"
#include "files/file_counter.hpp"

namespace spindle::cli {

namespace {

struct id_next_args {
  std::string prefix = "global";
  std::string root;
  double timeout_s = 30;
  long stale_grace_ms = 1000;
  long count = 1;
};

int id_next(const id_next_args& args) {
  std::filesystem::path root = args.root.empty() ? default_root()
                                                 : std::filesystem::path{
                                                     args.root};
  claim_options options;
  options.timeout = std::chrono::milliseconds(
    static_cast<long>(args.timeout_s * 1000));
  options.stale_grace = std::chrono::milliseconds(args.stale_grace_ms);
  for (long i = 0; i < args.count; ++i) {
    // Each ID is its own claim and release, so other claimers interleave.
    auto id = claim_next_id(root, args.prefix, options);
    if (!id) {
      std::cerr << "spindle id next: " << describe(id.error()) << "\n";
      auto code = classify(id.error());
      bool bad_input = code == errc::invalid_id
                       || (code == errc::io_failure
                           && !std::filesystem::is_directory(root));
      return bad_input ? exit_code::usage : exit_code::failure;
    }
    std::cout << *id << "\n";
  }
  std::cout << std::flush;
  return exit_code::ok;
}

} // namespace

void add_id(CLI::App& app, registry& commands) {
  auto* id = app.add_subcommand("id", "Claim IDs from file counters "
                                      "(ROOT/ai_comms/counters).");
  id->require_subcommand(1);
  auto args = std::make_shared<id_next_args>();
  auto* next = id->add_subcommand(
    "next",
    "Claim the next ID and print it: prefix 'global' gives 0001, 0002, ...; "
    "prefix 0001 gives 0001_t1, ...; prefix 0001_t1 gives 0001_t1.1, .... "
    "Safe beside other spindle processes and beside scripts following the "
    "seed's rename-as-lock protocol. Exit codes: 0 printed an ID; 1 the "
    "counter is exhausted, busy past --timeout or unreadable; 2 invalid "
    "prefix or root (nothing touched).");
  next->add_option("--prefix", args->prefix,
                   "counter: 'global' or a task ID (default global)");
  next->add_option("--root", args->root,
                   "root directory holding ai_comms/ (default $AI_ROOT, "
                   "else the current directory)");
  next->add_option("--timeout", args->timeout_s,
                   "seconds to wait for a counter another process holds "
                   "(default 30)")
    ->check(CLI::Range(0.0, 86400.0));
  next->add_option("--stale-grace", args->stale_grace_ms,
                   "milliseconds a dead claimer's file must age before it "
                   "is recovered (default 1000)")
    ->check(CLI::Range(0L, 3600000L));
  next->add_option("--count", args->count,
                   "claim this many IDs, one claim each, printing one per "
                   "line (default 1)")
    ->check(CLI::Range(1L, 1000000L));
  commands.on(next, [args] { return id_next(*args); });
}

} // namespace spindle::cli
