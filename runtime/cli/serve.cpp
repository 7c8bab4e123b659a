// `spindle serve`: the HTTP API on an embedded runtime. With no flags:
// 127.0.0.1:8080, data in ./spindle-data, the offline LLM provider.

#include <atomic>
#include <cstdlib>
#include <csignal>
#include <future>
#include <iostream>
#include <thread>

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include "cli.hpp"
#include "spindle/messages/error.hpp"
#include "net/io_pool.hpp"
#include "core/logging.hpp"
#include "spindle/runtime/openai_provider.hpp"
#include "storage/postgres/postgres.hpp"
#include "spindle/runtime/rewriter.hpp"
#include "spindle/runtime/runtime.hpp"
#include "server/server.hpp"
#include "spindle/runtime/tokenizer.hpp"
#include "spindle/version.hpp"

namespace spindle::cli {

namespace {

struct serve_args {
  server_options http;
  std::string data = "./spindle-data";
  std::string store;
  std::string node_name;
  std::string advertise;
  long node_lease_ms = cluster_options{}.lease.count();
  std::string llm = "offline";
  std::string llm_url;
  std::string llm_model;
  std::string log_level = "info";
  std::string log_format = "text";
  double shutdown_grace_s = 10;
  long idempotency_s = 86400;
  size_t event_backlog = runtime_options{}.event_backlog;
  long delta_delay_ms = 0;
  std::string sync = "full";
  uint64_t max_resident = activation_options{}.max_resident;
  double idle_s = 300;
  long linger_us = storage_options{}.linger.count();
  double header_timeout_s = 10;
  double body_timeout_s = 30;
  double keepalive_timeout_s = 60;
  std::string rewrite_model;
  long rewrite_timeout_ms = 2000;
  std::string summary_model;
  long summary_timeout_ms = 30000;
  uint64_t context_tokens = default_context_tokens;
  uint64_t reply_tokens = default_reply_tokens;
};

// Every connection and upstream call is a descriptor: take the hard limit.
void raise_descriptor_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == 0)
    return "localhost";
  return name;
}

// The host other nodes reach this one at: the bound address, or the
// host's name for a wildcard one.
std::string advertised_host(const serve_args& args) {
  return args.http.bind == "0.0.0.0" || args.http.bind == "::"
           ? host_name()
           : args.http.bind;
}

// The node's name and address in its cluster: given, or made from the
// host's name and the port.
caf::error cluster_identity(const serve_args& args, cluster_options& out) {
  // On port 0 the port is known once bound: the address is advertised
  // then (`advertise_bound`), and the default name is the process's.
  auto port = std::to_string(args.http.port);
  out.node_name = !args.node_name.empty() ? args.node_name
                  : args.http.port == 0
                    ? host_name() + "-pid" + std::to_string(::getpid())
                    : host_name() + "-" + port;
  auto host = advertised_host(args);
  out.advertise = !args.advertise.empty() ? args.advertise
                  : args.http.port == 0 ? std::string{}
                                        : "http://" + host + ":" + port;
  while (out.advertise.size() > 1 && out.advertise.back() == '/')
    out.advertise.pop_back();
  out.lease = std::chrono::milliseconds(args.node_lease_ms);
  out.heartbeat = out.lease / 5;
  out.margin = out.lease / 5;
  out.name_wait = out.lease * 2 + std::chrono::seconds(2);
  if (auto err = validate_cluster_options(out))
    return make_error(errc::invalid_argument,
                      "--node-name/--advertise/--node-lease-ms: "
                        + describe(err));
  return caf::none;
}

// The advertised URL of a node on port 0, once the port is known.
void advertise_bound(runtime& rt, const serve_args& args, int port) {
  auto* cluster = rt.cluster();
  if (cluster == nullptr || !args.advertise.empty() || args.http.port != 0)
    return;
  auto url = "http://" + advertised_host(args) + ":" + std::to_string(port);
  if (auto err = cluster->advertise(url))
    spdlog::error("cluster: node '{}' cannot advertise {}: {}",
                  cluster->options().node_name, url, describe(err));
}

int serve(serve_args args) {
  if (auto err = setup_logging(args.log_level, args.log_format)) {
    std::cerr << "spindle serve: " << describe(err) << "\n";
    return exit_code::usage;
  }
  // Signals are taken by one thread with sigwait; block them everywhere
  // else before any other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  raise_descriptor_limit();
  // The event loops: the server's connections and the provider's upstream
  // calls share them.
  auto loops = net::make_io_pool(
    args.http.http_threads > 0
      ? args.http.http_threads
      : std::max(1u, std::thread::hardware_concurrency()));
  args.http.loops = loops;
  // One reply reserve, the tenants' and the upstream's.
  args.http.upstream.reply_reserve = args.http.default_limits.reply_reserve;
  // The test suite's record of every answer, checked against
  // docs/openapi.yaml (runtime/server/recorder.hpp).
  if (auto* dir = std::getenv("SPINDLE_RECORD_RESPONSES"))
    args.http.record_dir = dir;
  args.http.header_timeout = std::chrono::milliseconds(
    static_cast<int64_t>(args.header_timeout_s * 1000));
  args.http.body_timeout = std::chrono::milliseconds(
    static_cast<int64_t>(args.body_timeout_s * 1000));
  args.http.keepalive_timeout = std::chrono::milliseconds(
    static_cast<int64_t>(args.keepalive_timeout_s * 1000));

  runtime_options opts;
  opts.storage.data_dir = args.data;
  if (!args.store.empty()) {
    // A bad or unreachable database is a usage error, told before anything
    // starts; messages show the URL without its password.
    if (!is_postgres_url(args.store)) {
      std::cerr << "spindle serve: --store: '" << redact_url(args.store)
                << "' is not a PostgreSQL URL (postgres://USER@HOST:PORT/DB)"
                << "\n";
      return exit_code::usage;
    }
    if (auto probe = open_postgres(args.store, false); !probe) {
      std::cerr << "spindle serve: --store: " << describe(probe.error())
                << "\n";
      return exit_code::usage;
    }
    opts.storage.store = args.store;
    // On PostgreSQL a node is always a cluster node, alone or not
    // (docs/cluster.md): named after its host and port unless told.
    if (auto err = cluster_identity(args, opts.cluster)) {
      std::cerr << "spindle serve: " << describe(err) << "\n";
      return exit_code::usage;
    }
  } else if (!args.node_name.empty() || !args.advertise.empty()) {
    std::cerr << "spindle serve: --node-name and --advertise need a "
                 "PostgreSQL --store (a cluster keeps its state there)\n";
    return exit_code::usage;
  }
  opts.storage.sync = args.sync == "normal" ? sync_mode::normal
                                            : sync_mode::full;
  opts.storage.linger = std::chrono::microseconds(args.linger_us);
  opts.event_backlog = args.event_backlog;
  activation_options activation;
  activation.max_resident = args.max_resident;
  activation.idle_timeout = std::chrono::milliseconds(
    static_cast<int64_t>(args.idle_s * 1000));
  opts.context.activation = activation;
  opts.conversation.registry.activation = activation;
  // Turns are counted, and prompts fitted, in the encoding of the model
  // the provider is given, unless --tokenizer names one (docs/tokens.md).
  opts.conversation.encoding
    = !args.http.tokenizer.empty()
        ? args.http.tokenizer
        : tokens::encoding_for_model(args.llm_model).encoding;
  opts.conversation.builder.context_tokens = args.context_tokens;
  opts.conversation.builder.reply_tokens = args.reply_tokens;
  if (auto err = validate_context_tokens(args.context_tokens,
                                         args.reply_tokens)) {
    std::cerr << "spindle serve: --context-tokens: " << describe(err) << "\n";
    return exit_code::usage;
  }
  if (args.llm == "offline" && args.delta_delay_ms > 0)
    opts.provider = std::make_shared<offline_provider>(
      std::chrono::milliseconds(args.delta_delay_ms), loops);
  if (args.llm == "openai") {
    openai_options llm;
    llm.base_url = args.llm_url;
    llm.model = args.llm_model;
    llm.loops = loops; // upstream calls share the server's event loops
    if (auto* key = std::getenv("SPINDLE_LLM_API_KEY"))
      llm.api_key = key;
    auto provider = make_openai_provider(llm);
    if (!provider) {
      std::cerr << "spindle serve: " << describe(provider.error()) << "\n";
      return exit_code::usage;
    }
    opts.provider = *provider;
    // The query rewriter asks the same provider (falling back to the
    // original message on error, timeout or empty output).
    opts.conversation.rewriter = std::make_shared<llm_rewriter>(
      *provider, std::chrono::milliseconds(args.rewrite_timeout_ms),
      args.rewrite_model);
    opts.conversation.builder.rewrite_timeout
      = std::chrono::milliseconds(args.rewrite_timeout_ms);
    // Summaries of what leaves the prompts: the same provider, with their
    // own model and timeout.
    opts.conversation.summary_maker = std::make_shared<llm_summarizer>(
      *provider, std::chrono::milliseconds(args.summary_timeout_ms),
      args.summary_model);
  }
  auto rt = runtime::start(opts);
  if (!rt) {
    std::cerr << "spindle serve: " << describe(rt.error()) << "\n";
    return exit_code::failure;
  }
  args.http.shutdown_grace = std::chrono::milliseconds(
    static_cast<long>(args.shutdown_grace_s * 1000));
  args.http.idempotency_retention = std::chrono::seconds(args.idempotency_s);
  server srv{**rt, args.http};
  auto port = srv.bind();
  if (!port) {
    std::cerr << "spindle serve: " << describe(port.error()) << "\n";
    return exit_code::failure;
  }
  advertise_bound(**rt, args, *port);
  std::cout << "spindle " << version_string << " serving on http://"
            << args.http.bind << ":" << *port << std::endl;
  spdlog::info(log_fields("start", {{"bind", args.http.bind},
                                    {"port", *port},
                                    {"data", args.data},
                                    {"store", args.store.empty()
                                                ? std::string{"sqlite"}
                                                : redact_url(args.store)},
                                    {"node", opts.cluster.node_name},
                                    {"advertise", opts.cluster.advertise},
                                    {"llm", args.llm},
                                    {"tokenizer", args.http.tokenizer.empty()
                                                    ? "per model"
                                                    : args.http.tokenizer},
                                    {"version", version_string},
                                    {"auth", !args.http.admin_token.empty()
                                               ? "tenants"
                                             : !args.http.token.empty()
                                               ? "token"
                                               : "none"}}));

  std::promise<void> served;
  auto served_future = served.get_future();
  std::thread waiter{[&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info(log_fields("stopping", {{"signal", sig == SIGINT
                                                      ? "SIGINT"
                                                      : "SIGTERM"}}));
    srv.stop();
    // In-flight requests get the grace period; then the process goes.
    if (served_future.wait_for(args.http.shutdown_grace)
        != std::future_status::ready) {
      spdlog::warn(log_fields("shutdown_grace_exceeded", {}));
      spdlog::default_logger()->flush();
      std::_Exit(0);
    }
  }};
  srv.run();
  served.set_value();
  // If the server stopped on its own (not by a signal), release the waiter.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  (*rt)->stop();
  loops->stop();
  spdlog::info(log_fields("stopped", {}));
  spdlog::default_logger()->flush();
  return exit_code::ok;
}

} // namespace

void add_serve(CLI::App& app, registry& commands) {
  auto args = std::make_shared<serve_args>();
  auto* sub = app.add_subcommand(
    "serve", "Serve the HTTP API (docs/api.md). Every flag can also be set "
             "with the SPINDLE_* environment variable named beside it.");
  sub->add_option("--port", args->http.port,
                  "port; 0 picks a free one and prints it (default 8080)")
    ->envname("SPINDLE_PORT")
    ->check(CLI::Range(0, 65535));
  sub->add_option("--bind", args->http.bind,
                  "address to listen on (default 127.0.0.1)")
    ->envname("SPINDLE_BIND");
  sub->add_option("--data", args->data,
                  "data directory, or :memory: to keep nothing (default "
                  "./spindle-data); one process owns a directory at a time")
    ->envname("SPINDLE_DATA");
  sub->add_option("--store", args->store,
                  "a PostgreSQL database to keep counters, threads, context "
                  "windows, tasks, long-term memory and idempotency keys in, "
                  "as "
                  "postgres://USER[:PASSWORD]@HOST:PORT/DB (default: SQLite "
                  "in --data; docs/storage.md, \"Backends\")")
    ->envname("SPINDLE_STORE");
  sub->add_option("--node-name", args->node_name,
                  "with --store: this node's name in the cluster of nodes "
                  "sharing the database, 1-64 of [A-Za-z0-9._-] (default "
                  "HOSTNAME-PORT; docs/cluster.md)")
    ->envname("SPINDLE_NODE_NAME");
  sub->add_option("--advertise", args->advertise,
                  "with --store: the URL other nodes reach this node at, "
                  "http://HOST:PORT (default http://BIND:PORT, the host's "
                  "name for a wildcard --bind)")
    ->envname("SPINDLE_ADVERTISE");
  sub->add_option("--node-lease-ms", args->node_lease_ms,
                  "with --store: how long a node's lease runs after its "
                  "last renewal; a node killed outright has its threads "
                  "and the scheduler seat served elsewhere this long after "
                  "(default 5000; renewed "
                  "five times per lease)")
    ->envname("SPINDLE_NODE_LEASE_MS")
    ->check(CLI::Range(500L, 600000L));
  sub->add_option("--llm", args->llm,
                  "LLM provider: offline (default) or openai")
    ->envname("SPINDLE_LLM")
    ->check(CLI::IsMember({"offline", "openai"}));
  sub->add_option("--llm-url", args->llm_url,
                  "base URL of an OpenAI-compatible server, e.g. "
                  "http://127.0.0.1:8081 (for --llm openai; the API key is "
                  "read from SPINDLE_LLM_API_KEY)")
    ->envname("SPINDLE_LLM_URL");
  sub->add_option("--llm-model", args->llm_model,
                  "model name sent to the provider")
    ->envname("SPINDLE_LLM_MODEL");
  sub->add_option("--rewrite-model", args->rewrite_model,
                  "model of query rewrites, a small fast one (for --llm "
                  "openai; default: --llm-model)")
    ->envname("SPINDLE_REWRITE_MODEL");
  sub->add_option("--rewrite-timeout-ms", args->rewrite_timeout_ms,
                  "milliseconds a query rewrite may take before the original "
                  "message is used (for --llm openai; default 2000)")
    ->envname("SPINDLE_REWRITE_TIMEOUT_MS")
    ->check(CLI::Range(1L, 600000L));
  sub->add_option("--llm-delta-delay-ms", args->delta_delay_ms,
                  "offline provider only: wait this long before each piece "
                  "of a reply, to watch streaming (default 0)")
    ->envname("SPINDLE_LLM_DELTA_DELAY_MS")
    ->check(CLI::Range(0L, 60000L));
  sub->add_option("--tokenizer", args->http.tokenizer,
                  "the encoding turns are counted and prompts fitted in, and "
                  "POST /v1/tokens/count uses for every model: o200k_base or "
                  "cl100k_base (default: --llm-model's, from tiktoken's "
                  "table; docs/tokens.md)")
    ->envname("SPINDLE_TOKENIZER")
    ->check(CLI::IsMember(tokens::encoding_names()));
  sub->add_option("--summary-model", args->summary_model,
                  "with --llm openai: the model that folds what leaves the "
                  "prompts into each thread's summary (default: "
                  "--llm-model; docs/threads.md)")
    ->envname("SPINDLE_SUMMARY_MODEL");
  sub->add_option("--summary-timeout-ms", args->summary_timeout_ms,
                  "with --llm openai: how long one summary may take before "
                  "it is given up and tried again later (default 30000)")
    ->envname("SPINDLE_SUMMARY_TIMEOUT_MS")
    ->check(CLI::Range(100L, 600000L));
  sub->add_option("--context-tokens", args->context_tokens,
                  "the context window of a prompt whose request names no "
                  "max_context_tokens, the reply's reserve included "
                  "(default 128000; docs/builder.md)")
    ->envname("SPINDLE_CONTEXT_TOKENS")
    ->check(CLI::Range(uint64_t{1}, max_context_tokens_limit));
  sub->add_option("--reply-tokens", args->reply_tokens,
                  "tokens of the context window kept for the reply "
                  "(default 4096)")
    ->envname("SPINDLE_REPLY_TOKENS")
    ->check(CLI::Range(uint64_t{0}, max_context_tokens_limit));
  sub->add_option("--token", args->http.token,
                  "require 'Authorization: Bearer TOKEN' on every route but "
                  "/healthz and the console's page and files")
    ->envname("SPINDLE_TOKEN");
  sub->add_option("--admin-token", args->http.admin_token,
                  "turn tenancy on (docs/tenants.md): this token manages "
                  "tenants and keys, every other request needs a tenant's "
                  "key and sees only its tenant (--token is then not used)")
    ->envname("SPINDLE_ADMIN_TOKEN");
  // Limits on the model (docs/limits.md): the implicit tenant's, and
  // every tenant's that sets none of its own.
  auto& limits = args->http.default_limits;
  sub->add_option("--requests-per-min", limits.requests_per_min,
                  "calls to the model a tenant may start in any 60 s "
                  "(default 0: no limit; docs/limits.md)")
    ->envname("SPINDLE_REQUESTS_PER_MIN")
    ->check(CLI::Range(uint64_t{0}, uint64_t{1000000000}));
  sub->add_option("--tokens-per-min", limits.tokens_per_min,
                  "tokens a tenant's calls may use in any 60 s, reserved "
                  "when admitted (default 0: no limit)")
    ->envname("SPINDLE_TOKENS_PER_MIN")
    ->check(CLI::Range(uint64_t{0}, uint64_t{1000000000000}));
  sub->add_option("--concurrent-exchanges", limits.concurrent_exchanges,
                  "calls to the model a tenant may have at once; the next "
                  "waits in its queue (default 0: no limit)")
    ->envname("SPINDLE_CONCURRENT_EXCHANGES")
    ->check(CLI::Range(uint64_t{0}, uint64_t{100000}));
  sub->add_option("--max-queued", limits.max_queued,
                  "calls that may wait for one of --concurrent-exchanges; "
                  "past it 429 (default 64)")
    ->envname("SPINDLE_MAX_QUEUED")
    ->check(CLI::Range(uint64_t{0}, uint64_t{100000}));
  sub->add_option("--reply-reserve", limits.reply_reserve,
                  "tokens reserved for a reply that sets no max_tokens, and "
                  "with --tokens-per-min its bound (default 1024)")
    ->envname("SPINDLE_REPLY_RESERVE")
    ->check(CLI::Range(uint64_t{1}, uint64_t{10000000}));
  // What goes to the upstream as a whole (docs/limits.md, "The
  // upstream").
  sub->add_option("--llm-concurrency", args->http.upstream.concurrency,
                  "calls sent to the model at once; past it calls wait, "
                  "the tenants served by their weights (default 0: no "
                  "bound)")
    ->envname("SPINDLE_LLM_CONCURRENCY")
    ->check(CLI::Range(uint64_t{0}, uint64_t{100000}));
  sub->add_option("--llm-tokens-per-min", args->http.upstream.tokens_per_min,
                  "tokens the calls sent to the model may use in any 60 s "
                  "(default 0: no bound)")
    ->envname("SPINDLE_LLM_TOKENS_PER_MIN")
    ->check(CLI::Range(uint64_t{0}, uint64_t{1000000000000}));
  sub->add_option("--log-level", args->log_level,
                  "trace, debug, info (default), warn, error, off")
    ->envname("SPINDLE_LOG_LEVEL");
  sub->add_option("--log-format", args->log_format,
                  "text (default) or json: one object per line")
    ->envname("SPINDLE_LOG_FORMAT")
    ->check(CLI::IsMember({"text", "json"}));
  sub->add_option("--body-limit", args->http.body_limit,
                  "largest request body in bytes; larger gets 413 (default "
                  "1048576)")
    ->envname("SPINDLE_BODY_LIMIT")
    ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  sub->add_option("--http-threads", args->http.http_threads,
                  "event-loop threads holding the connections (default 0: "
                  "one per core)")
    ->envname("SPINDLE_HTTP_THREADS")
    ->check(CLI::Range(size_t{0}, size_t{256}));
  sub->add_option("--http-workers", args->http.http_workers,
                  "threads for routes that wait on the runtime; health, "
                  "messages and streams never take one (default 16)")
    ->envname("SPINDLE_HTTP_WORKERS")
    ->check(CLI::Range(size_t{1}, size_t{4096}));
  sub->add_option("--max-connections", args->http.max_connections,
                  "open connections at once; past it a new one gets 503 "
                  "(default 10000)")
    ->envname("SPINDLE_MAX_CONNECTIONS")
    ->check(CLI::Range(size_t{1}, size_t{1000000}));
  sub->add_option("--header-timeout", args->header_timeout_s,
                  "seconds a request's line and headers may take to arrive "
                  "(default 10)")
    ->envname("SPINDLE_HEADER_TIMEOUT")
    ->check(CLI::Range(0.01, 3600.0));
  sub->add_option("--body-timeout", args->body_timeout_s,
                  "seconds a request's body may take after its headers "
                  "(default 30)")
    ->envname("SPINDLE_BODY_TIMEOUT")
    ->check(CLI::Range(0.01, 3600.0));
  sub->add_option("--keepalive-timeout", args->keepalive_timeout_s,
                  "seconds an idle kept-alive connection stays open "
                  "(default 60)")
    ->envname("SPINDLE_KEEPALIVE_TIMEOUT")
    ->check(CLI::Range(0.01, 86400.0));
  sub->add_option("--stream-buffer", args->http.stream_buffer,
                  "bytes a slow reader of a streamed reply may fall behind "
                  "before it is cut off (default 1048576); the generation "
                  "pauses at 64 KiB behind, or half this when smaller")
    ->envname("SPINDLE_STREAM_BUFFER")
    ->check(CLI::Range(size_t{1024}, size_t{1} << 30));
  sub->add_option("--send-buffer", args->http.send_buffer,
                  "the kernel's send buffer of each client connection in "
                  "bytes (SO_SNDBUF); 0, the default, leaves it to the "
                  "kernel")
    ->envname("SPINDLE_SEND_BUFFER")
    ->check(CLI::Range(size_t{0}, size_t{1} << 30));
  sub->add_option("--shutdown-grace", args->shutdown_grace_s,
                  "seconds in-flight requests get on SIGINT/SIGTERM "
                  "(default 10)")
    ->envname("SPINDLE_SHUTDOWN_GRACE")
    ->check(CLI::Range(0.0, 3600.0));
  sub->add_option("--sync", args->sync,
                  "full (default): an acknowledged write survives power "
                  "loss; normal: it survives a crash of the process")
    ->envname("SPINDLE_SYNC")
    ->check(CLI::IsMember({"full", "normal"}));
  sub->add_option("--max-resident", args->max_resident,
                  "most threads (and context windows) kept in memory; the "
                  "least recently used idle ones are passivated to the data "
                  "directory (default 10000; 0: no cap)")
    ->envname("SPINDLE_MAX_RESIDENT");
  sub->add_option("--idle-timeout", args->idle_s,
                  "seconds after which an unused thread or window is "
                  "passivated (default 300; 0: never)")
    ->envname("SPINDLE_IDLE_TIMEOUT")
    ->check(CLI::Range(0.0, 86400.0 * 365));
  sub->add_option("--store-linger-us", args->linger_us,
                  "microseconds the state store polls for the next write "
                  "after a commit of a few writes before it sleeps (default "
                  "100; 0: never)")
    ->envname("SPINDLE_STORE_LINGER_US")
    ->check(CLI::Range(0L, 100000L));
  sub->add_option("--idempotency-retention", args->idempotency_s,
                  "seconds the answer to a request with an Idempotency-Key "
                  "is kept for its retries (default 86400)")
    ->envname("SPINDLE_IDEMPOTENCY_RETENTION")
    ->check(CLI::Range(1L, 86400L * 30));
  sub->add_option("--event-backlog", args->event_backlog,
                  "latest events kept for event-stream clients that "
                  "reconnect with Last-Event-ID (default 50000)")
    ->envname("SPINDLE_EVENT_BACKLOG")
    ->check(CLI::Range(size_t{1}, size_t{10'000'000}));
  commands.on(sub, [args] { return serve(*args); });
}

} // namespace spindle::cli
