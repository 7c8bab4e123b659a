#include "spindle/runtime/server.hpp"

#include <atomic>

#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include "http_metrics.hpp"
#include "http_router.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/runtime/logging.hpp"
#include "spindle/runtime/runtime.hpp"
#include "spindle/version.hpp"

namespace spindle {

using http::json;

struct server::impl {
  impl(runtime& r, server_options opts)
    : rt(r), options(std::move(opts)), routes(svr, rt, options, metrics) {
  }

  runtime& rt;
  server_options options;
  httplib::Server svr;
  http_metrics metrics;
  http::router routes;
  bool bound = false;
  std::atomic<bool> stopping{false};
  /// The listening socket, seen when httplib creates it.
  int listen_fd = -1;
};

namespace {

// Replies for requests that never reached a route (no such route, body too
// large, unparsable request) in the same JSON shape as every other error,
// and counts and logs them under the route "unmatched".
void error_reply(http_metrics& metrics, const httplib::Request& req,
                 httplib::Response& res) {
  if (!res.body.empty())
    return;
  metrics.observe("unmatched", req.method, res.status, 0);
  // A request refused before routing may have left its body unread on the
  // connection; never read the next request from there.
  res.set_header("Connection", "close");
  spdlog::info(log_fields("request", {{"method", req.method},
                                      {"route", "unmatched"},
                                      {"path", req.path.substr(0, 200)},
                                      {"status", res.status}}));
  std::string code = "error", message;
  switch (res.status) {
    case 404:
      code = "not_found";
      message = "no route for " + req.method + " "
                + req.path.substr(0, 200);
      break;
    case 413:
      code = "too_large";
      message = "the request body exceeds the server's limit";
      break;
    case 400:
      code = "malformed";
      message = "the request could not be parsed";
      break;
    case 414:
      code = "too_large";
      message = "the request line is too long (a path segment such as a "
                "thread ID may have at most 128 characters)";
      break;
    default:
      message = "request failed with status " + std::to_string(res.status);
  }
  http::reply(res, res.status,
              {{"error", {{"code", code}, {"message", message}}}});
}

// Gauges computed at scrape time from the runtime's actors.
void add_gauges(http_metrics& metrics, runtime& rt) {
  metrics.add_gauge(
    "spindle_ids_issued", "IDs handed out since the server started, by kind",
    [&rt] {
      http_metrics::samples out;
      auto stats = rt.call<id_stats>(rt.id_allocator(),
                                     std::chrono::seconds(2),
                                     stats_atom::value);
      if (stats) {
        out.push_back({{{"kind", "context"}},
                       static_cast<double>(stats->context)});
        out.push_back({{{"kind", "orchestration"}},
                       static_cast<double>(stats->orchestration)});
        out.push_back({{{"kind", "task"}}, static_cast<double>(stats->task)});
      }
      return out;
    });
  metrics.add_gauge(
    "spindle_tasks", "Tasks of every orchestration, by state", [&rt] {
      http_metrics::samples out;
      if (auto n = rt.count_tasks()) {
        for (auto state : {task_state::pending, task_state::running,
                           task_state::completed, task_state::failed,
                           task_state::stale})
          out.push_back({{{"state", to_string(state)}},
                         static_cast<double>(n->of(state))});
      }
      return out;
    });
  // The state store's counters, read without asking it (docs/storage.md).
  struct storage_gauge {
    const char* name;
    const char* help;
    double (*field)(const storage_stats&);
  };
  static constexpr storage_gauge storage_gauges[] = {
    {"spindle_storage_commits",
     "State store transactions committed since the start",
     [](const storage_stats& x) { return static_cast<double>(x.commits); }},
    {"spindle_storage_writes",
     "Writes committed by the state store since the start (writes per "
     "commit: how well group commit batches)",
     [](const storage_stats& x) { return static_cast<double>(x.writes); }},
    {"spindle_storage_failed_writes",
     "Writes the state store answered with storage_failure since the start",
     [](const storage_stats& x) {
       return static_cast<double>(x.failed_writes);
     }},
    {"spindle_storage_commit_seconds",
     "Seconds the state store spent in commits since the start",
     [](const storage_stats& x) { return x.commit_seconds; }},
    {"spindle_storage_folds",
     "Folds of the turn journal into the turns table since the start",
     [](const storage_stats& x) { return static_cast<double>(x.folds); }},
    {"spindle_storage_fold_seconds",
     "Seconds the state store spent folding the turn journal since the "
     "start",
     [](const storage_stats& x) { return x.fold_seconds; }},
    {"spindle_storage_lingers",
     "Times the state store polled its mailbox after a small commit "
     "instead of sleeping, since the start",
     [](const storage_stats& x) { return static_cast<double>(x.lingers); }},
    {"spindle_storage_linger_hits",
     "Lingers that a write arriving ended, since the start",
     [](const storage_stats& x) {
       return static_cast<double>(x.linger_hits);
     }},
    {"spindle_storage_linger_seconds",
     "Seconds the state store spent lingering since the start",
     [](const storage_stats& x) { return x.linger_seconds; }},
  };
  for (auto& g : storage_gauges)
    metrics.add_gauge(g.name, g.help, [&rt, field = g.field] {
      return http_metrics::samples{{{}, field(rt.store_stats())}};
    });
  metrics.add_gauge("spindle_threads", "Conversation threads that exist",
                    [&rt] {
                      http_metrics::samples out;
                      if (auto n = rt.count_threads())
                        out.push_back({{}, static_cast<double>(*n)});
                      return out;
                    });
}

} // namespace

server::server(runtime& rt, server_options options)
  : impl_(std::make_unique<impl>(rt, std::move(options))) {
  auto& svr = impl_->svr;
  auto& r = impl_->routes;
  auto threads = std::max<size_t>(impl_->options.http_threads, 2);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(impl_->options.body_limit);
  svr.set_keep_alive_max_count(100000);
  // Headers and body leave in separate writes; without TCP_NODELAY a
  // keep-alive client waits out the peer's delayed ACK (~40 ms) per reply.
  svr.set_tcp_nodelay(true);
  svr.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    impl_->listen_fd = sock;
  });
  svr.set_error_handler(
    [this](const httplib::Request& req, httplib::Response& res) {
      error_reply(impl_->metrics, req, res);
    });
  svr.Get("/healthz",
          r.wrap("GET /healthz",
                 [this](const httplib::Request&, httplib::Response& res,
                        http::request_context&) {
                   bool up = impl_->rt.running() && !impl_->stopping;
                   http::reply(res, up ? 200 : 503,
                               {{"status", up ? "ok" : "stopping"},
                                {"version", version_string}});
                 },
                 /*open=*/true));
  r.get("/metrics", "GET /metrics",
        [this](const httplib::Request&, httplib::Response& res,
               http::request_context&) {
          res.set_content(impl_->metrics.scrape(),
                          "text/plain; version=0.0.4");
        });
  http::add_id_routes(r);
  http::add_thread_routes(r);
  http::add_item_routes(r);
  http::add_memory_routes(r);
  http::add_task_routes(r);
  add_gauges(impl_->metrics, impl_->rt);
}

server::~server() {
  stop();
}

caf::expected<int> server::bind() {
  auto& opts = impl_->options;
  int port = opts.port == 0 ? impl_->svr.bind_to_any_port(opts.bind)
                            : (impl_->svr.bind_to_port(opts.bind, opts.port)
                                 ? opts.port
                                 : -1);
  if (port < 0)
    return make_error(errc::io_failure,
                      "cannot listen on " + opts.bind + ":"
                        + std::to_string(opts.port)
                        + " (address in use or not available)");
  // Debian's httplib listens with a backlog of 5, which drops connections
  // when many clients connect at once; Linux lets a second listen() raise
  // it.
  if (impl_->listen_fd >= 0)
    ::listen(impl_->listen_fd, SOMAXCONN);
  impl_->bound = true;
  return port;
}

void server::run() {
  if (impl_->bound)
    impl_->svr.listen_after_bind();
}

void server::stop() {
  impl_->stopping = true;
  impl_->svr.stop();
}

} // namespace spindle
