// `spindle stress`: concurrent clients against a server or an in-process
// runtime, invariants checked on every response.

#include <iostream>
#include <stdexcept>

#include "cli.hpp"
#include "spindle/messages/error.hpp"
#include "net/http_client.hpp"
#include "spindle/runtime/runtime.hpp"
#include "stress/stress.hpp"

namespace spindle::cli {

namespace {

struct stress_args {
  stress_options opts;
  double duration_s = 0;
  std::string mix;
  bool json = false;
  bool no_progress = false;
};

int stress(stress_args args) {
  if (args.opts.url.empty() == !args.opts.in_process) {
    std::cerr << "spindle stress: give exactly one of --url and "
                 "--in-process\n";
    return exit_code::usage;
  }
  if (!args.opts.url.empty()) {
    try {
      net::blocking_http_client check{args.opts.url, std::chrono::seconds{1}};
    } catch (const std::invalid_argument& e) {
      std::cerr << "spindle stress: --url: " << e.what() << "\n";
      return exit_code::usage;
    }
  }
  if (args.duration_s <= 0 && args.opts.requests == 0) {
    std::cerr << "spindle stress: give --duration or --requests\n";
    return exit_code::usage;
  }
  if (!args.mix.empty()) {
    std::string error;
    auto mix = parse_mix(args.mix, error);
    if (!mix) {
      std::cerr << "spindle stress: --mix: " << error << "\n";
      return exit_code::usage;
    }
    args.opts.mix = *mix;
  }
  args.opts.duration = std::chrono::milliseconds(
    static_cast<long>(args.duration_s * 1000));
  args.opts.progress = !args.no_progress && !args.json;
  std::unique_ptr<runtime> rt;
  if (args.opts.in_process) {
    auto started = runtime::start({});
    if (!started) {
      std::cerr << "spindle stress: " << describe(started.error()) << "\n";
      return exit_code::failure;
    }
    rt = std::move(*started);
  }
  auto report = run_stress(args.opts, rt.get());
  if (args.json)
    std::cout << report.to_json().dump(2) << "\n";
  else
    std::cout << report.to_text();
  return report.violations.empty() ? exit_code::ok : exit_code::failure;
}

} // namespace

void add_stress(CLI::App& app, registry& commands) {
  auto args = std::make_shared<stress_args>();
  auto* sub = app.add_subcommand(
    "stress",
    "Drive a running server (--url) or an in-process runtime (--in-process) "
    "with concurrent clients and check spindle's invariants on every "
    "response: IDs never repeat and rise for each client; a thread's turn "
    "count never drops; turns alternate user, assistant; every task is "
    "claimed once and never before its children complete. Exit code 1 on "
    "any violation.");
  sub->add_option("--url", args->opts.url,
                  "base URL of a server, e.g. http://127.0.0.1:8080");
  sub->add_flag("--in-process", args->opts.in_process,
                "start an in-memory runtime in this process and drive it "
                "directly");
  sub->add_option("--token", args->opts.token, "bearer token of the server")
    ->envname("SPINDLE_TOKEN");
  sub->add_option("--clients", args->opts.clients,
                  "concurrent clients (default 8)")
    ->check(CLI::Range(size_t{1}, size_t{4096}));
  sub->add_option("--duration", args->duration_s, "seconds to run")
    ->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--requests", args->opts.requests,
                  "operations in all, instead of --duration");
  sub->add_option("--mix", args->mix,
                  "weights, e.g. message=30,history=25,context=10,item=10,"
                  "id=15,task=10 (the default)");
  sub->add_option("--shared-threads", args->opts.shared_threads,
                  "conversation threads all clients write to (default 4); "
                  "each client also has a private one");
  sub->add_option("--thread-turns", args->opts.thread_turns,
                  "turns after which a conversation ends and its writers "
                  "go on in a new thread (default 0: never)");
  sub->add_option("--seed", args->opts.seed, "random seed (default 1)");
  sub->add_flag("--json", args->json, "print the report as JSON");
  sub->add_flag("--no-progress", args->no_progress,
                "no live progress line (it is shown only on a terminal)");
  commands.on(sub, [args] { return stress(*args); });
}

} // namespace spindle::cli
