#include "server/server.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include <unistd.h>

#include <boost/asio/thread_pool.hpp>
#include <spdlog/spdlog.h>

#include "spindle/actors/event_log.hpp"
#include "http_server.hpp"
#include "idempotency.hpp"
#include "admission/limiter.hpp"
#include "admission/upstream.hpp"
#include "tenancy/tenant_store.hpp"
#include "metrics.hpp"
#include "recorder.hpp"
#include "router.hpp"
#include "core/allocator.hpp"
#include "net/io_pool.hpp"
#include "spindle/messages/clock.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/work.hpp"
#include "core/logging.hpp"
#include "spindle/runtime/runtime.hpp"
#include "spindle/version.hpp"

namespace spindle {

using json = nlohmann::json;

struct server::impl {
  impl(runtime& r, server_options opts)
    : rt(r), options(std::move(opts)),
      loops(options.loops ? options.loops
                          : net::make_io_pool(
                            options.http_threads > 0
                              ? options.http_threads
                              : std::max(1u,
                                         std::thread::hardware_concurrency()))),
      workers(std::max<size_t>(options.http_workers, 1)),
      routes(rt, options, metrics, workers) {
    routes.set_loops(loops);
  }

  ~impl() {
    if (http)
      http->stop();
    workers.join();
  }

  runtime& rt;
  server_options options;
  std::shared_ptr<net::io_pool> loops;
  boost::asio::thread_pool workers;
  http_metrics metrics;
  http::router routes;
  std::unique_ptr<http::http_server> http;
  std::mutex mx;
  std::condition_variable stopped_cv;
  bool stopped = false;
  /// This node, for GET /v1/stats: its address once bound, and its start.
  std::string address;
  int64_t started_ms = unix_time_ms();
};

namespace {

// In a cluster each node holds a tenant to its share of the limits
// (docs/limits.md, "In a cluster"): each rate and the calls at once split
// evenly among the nodes serving now, rounded up.
rate_limits node_share(rate_limits l, const cluster_membership* cluster) {
  uint64_t n = cluster ? cluster->live_nodes() : 1;
  if (n <= 1)
    return l;
  auto share = [n](uint64_t v) { return v == 0 ? v : (v + n - 1) / n; };
  l.requests_per_min = share(l.requests_per_min);
  l.tokens_per_min = share(l.tokens_per_min);
  l.concurrent_exchanges = share(l.concurrent_exchanges);
  return l;
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
    "spindle_id_counters",
    "ID counters in memory (idle ones beyond the cap are forgotten)", [&rt] {
      http_metrics::samples out;
      if (auto stats = rt.call<id_stats>(rt.id_allocator(),
                                         std::chrono::seconds(2),
                                         stats_atom::value))
        out.push_back({{}, static_cast<double>(stats->counters)});
      return out;
    });
  metrics.add_gauge(
    "spindle_orchestrations",
    "Orchestrations, all of them and those in memory (finished ones leave "
    "it once stored)",
    [&rt] {
      http_metrics::samples out;
      if (auto n = rt.count_tasks()) {
        out.push_back({{{"where", "all"}},
                       static_cast<double>(n->orchestrations)});
        out.push_back({{{"where", "memory"}},
                       static_cast<double>(n->resident)});
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
  // The allocator's own figures (jemalloc only): what the heap in the
  // process's resident memory is made of (docs/reliability.md, "Soak").
  if (read_allocator_stats())
    metrics.add_gauge(
      "spindle_allocator_bytes",
      "What the allocator holds: allocated (live objects), active (their "
      "pages), metadata, resident, dirty (freed, not yet given back)",
      [] {
        http_metrics::samples out;
        if (auto a = read_allocator_stats())
          for (auto [kind, value] :
               {std::pair{"allocated", a->allocated},
                std::pair{"active", a->active},
                std::pair{"metadata", a->metadata},
                std::pair{"resident", a->resident},
                std::pair{"dirty", a->dirty}})
            out.push_back({{{"kind", kind}}, static_cast<double>(value)});
        return out;
      });
  // The event stream (docs/api.md, "Events"), read from its log.
  metrics.add_gauge("spindle_events_published",
                    "Events published since the server started", [&rt] {
                      return http_metrics::samples{
                        {{}, static_cast<double>(rt.events()->last())}};
                    });
  metrics.add_gauge("spindle_event_subscribers",
                    "Clients following GET /v1/events now", [&rt] {
                      return http_metrics::samples{
                        {{}, static_cast<double>(rt.events()->subscribers())}};
                    });
  // Limits on the model (docs/limits.md): refusals by limit, and calls
  // that waited for a slot of concurrent_exchanges.
  metrics.add_gauge(
    "spindle_limit_refusals",
    "Calls to the model refused by a tenant's limit since start, by limit",
    [&rt] {
      auto limiter = rt.limiter();
      auto c = limiter ? limiter->counts() : admission::limiter::totals{};
      return http_metrics::samples{
        {{{"limit", "requests_per_min"}},
         static_cast<double>(c.refused_requests)},
        {{{"limit", "tokens_per_min"}}, static_cast<double>(c.refused_tokens)},
        {{{"limit", "max_queued"}}, static_cast<double>(c.refused_queue)}};
    });
  metrics.add_gauge(
    "spindle_limit_queue",
    "Calls that waited for one of their tenant's concurrent_exchanges: "
    "since start (queued) and now (waiting)",
    [&rt] {
      auto limiter = rt.limiter();
      auto c = limiter ? limiter->counts() : admission::limiter::totals{};
      return http_metrics::samples{
        {{{"kind", "queued"}}, static_cast<double>(c.queued)},
        {{{"kind", "waiting"}}, static_cast<double>(c.waiting)}};
    });
  // The fair queue toward the upstream (docs/limits.md, "The upstream").
  metrics.add_gauge(
    "spindle_upstream_calls",
    "Calls to the model through the upstream's fair queue: sending now "
    "(running), waiting now, sent since start and of those queued first",
    [&rt] {
      auto c = rt.upstream()->counts();
      return http_metrics::samples{
        {{{"state", "running"}}, static_cast<double>(c.running)},
        {{{"state", "waiting"}}, static_cast<double>(c.waiting)},
        {{{"state", "sent"}}, static_cast<double>(c.sent)},
        {{{"state", "queued"}}, static_cast<double>(c.queued)}};
    });
  metrics.add_gauge(
    "spindle_upstream_wait_seconds",
    "Waits for the upstream's room since start: their sum and the longest",
    [&rt] {
      auto c = rt.upstream()->counts();
      return http_metrics::samples{
        {{{"stat", "sum"}}, static_cast<double>(c.waited_ms) / 1000.0},
        {{{"stat", "max"}}, static_cast<double>(c.max_wait_ms) / 1000.0}};
    });
  // Each tenant's refusals and waits since start (those that had any).
  metrics.add_gauge(
    "spindle_tenant_refusals",
    "Calls refused by a tenant's limits since start, by tenant and limit "
    "(tenants refused at least once)",
    [&rt] {
      http_metrics::samples out;
      auto limiter = rt.limiter();
      if (!limiter)
        return out;
      for (auto& [tenant, c] : limiter->counts_by_tenant()) {
        if (c.refused_requests + c.refused_tokens + c.refused_queue == 0)
          continue;
        for (auto [limit, n] :
             {std::pair{"requests_per_min", c.refused_requests},
              std::pair{"tokens_per_min", c.refused_tokens},
              std::pair{"max_queued", c.refused_queue}})
          out.push_back({{{"tenant", tenant}, {"limit", limit}},
                         static_cast<double>(n)});
      }
      return out;
    });
  metrics.add_gauge(
    "spindle_tenant_wait_seconds",
    "Waits since start, by tenant: for a slot of its concurrent_exchanges "
    "(queue=\"slot\") and for the upstream (queue=\"upstream\"), their "
    "sum and the longest (tenants that waited at least once)",
    [&rt] {
      http_metrics::samples out;
      auto add = [&out](const std::string& tenant, const char* queue,
                        uint64_t sum_ms, uint64_t max_ms) {
        out.push_back({{{"tenant", tenant}, {"queue", queue}, {"stat", "sum"}},
                       static_cast<double>(sum_ms) / 1000.0});
        out.push_back({{{"tenant", tenant}, {"queue", queue}, {"stat", "max"}},
                       static_cast<double>(max_ms) / 1000.0});
      };
      if (auto limiter = rt.limiter())
        for (auto& [tenant, c] : limiter->counts_by_tenant())
          if (c.queued != 0)
            add(tenant, "slot", c.waited_ms, c.max_wait_ms);
      for (auto& [tenant, c] : rt.upstream()->counts_by_tenant())
        add(tenant, "upstream", c.waited_ms, c.max_wait_ms);
      return out;
    });
  metrics.add_gauge(
    "spindle_upstream_gate",
    "The upstream's gate (docs/limits.md, \"When the upstream refuses\"): "
    "1 for the state it is in (open, closed, probing, releasing)",
    [&rt] {
      auto g = rt.upstream()->gate();
      using gs = admission::upstream_queue::gate_state;
      http_metrics::samples out;
      for (auto [state, name] :
           {std::pair{gs::open, "open"}, std::pair{gs::closed, "closed"},
            std::pair{gs::probing, "probing"},
            std::pair{gs::releasing, "releasing"}})
        out.push_back({{{"state", name}}, g.state == state ? 1.0 : 0.0});
      return out;
    });
  metrics.add_gauge(
    "spindle_upstream_refusals",
    "Answers of the upstream that refused a call for its load (429, 503) "
    "since start, and the probes sent when its gate reopened",
    [&rt] {
      auto g = rt.upstream()->gate();
      return http_metrics::samples{
        {{{"kind", "refused"}}, static_cast<double>(g.refused)},
        {{{"kind", "probes"}}, static_cast<double>(g.probes)}};
    });
  metrics.add_gauge(
    "spindle_upstream_waiting",
    "Calls waiting for the upstream's room now, by tenant (those waiting)",
    // A tenant that waited once and waits no more is told as 0 (a
    // series, once made, stays).
    [&rt, shown = std::make_shared<std::set<std::string>>()] {
      http_metrics::samples out;
      std::set<std::string> now;
      for (auto& [tenant, n] : rt.upstream()->waiting_by_tenant()) {
          out.push_back({{{"tenant", tenant}}, static_cast<double>(n)});
          now.insert(tenant);
        }
      for (auto& t : *shown)
        if (!now.count(t))
          out.push_back({{{"tenant", t}}, 0.0});
      shown->insert(now.begin(), now.end());
      return out;
    });
  // Compaction (docs/threads.md, "Compaction").
  metrics.add_gauge("spindle_compactions",
                    "Compaction jobs since start by result (stored, failed) "
                    "and running now",
                    [&rt] {
                      auto c = rt.compaction();
                      return http_metrics::samples{
                        {{{"result", "stored"}}, static_cast<double>(c.stored)},
                        {{{"result", "failed"}}, static_cast<double>(c.failed)},
                        {{{"result", "running"}},
                         static_cast<double>(c.running)}};
                    });
  // Work on the paths whose cost must not grow with the data
  // (docs/threads.md, "Flat cost"): divided by exchanges, a constant.
  metrics.add_gauge(
    "spindle_work_total",
    "Work done since start: turns copied out of threads' logs, loaded from "
    "the store and summarized; long-term memory rows and postings read and "
    "written",
    [] {
      auto w = read_work();
      http_metrics::samples out;
      for (size_t i = 0; i < work_kinds; ++i)
        out.push_back({{{"kind", work_kind_names[i]}},
                       static_cast<double>(w.counts[i])});
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
     "Writes the state store answered with storage_failure or storage_full "
     "since the start",
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

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0)
    return "localhost";
  return name;
}

} // namespace

std::string server::stats_body(int window_s) {
  auto& i = *impl_;
  auto now = unix_time_ms();
  auto recent = i.metrics.recent(window_s);
  auto ms = [](double seconds) { return seconds * 1000.0; };
  auto store = i.rt.store_stats();
  http::json tasks = nullptr;
  if (auto n = i.rt.count_tasks())
    tasks = {{"pending", n->pending},     {"running", n->running},
             {"completed", n->completed}, {"failed", n->failed},
             {"stale", n->stale},         {"orchestrations", n->orchestrations},
             {"orchestrations_in_memory", n->resident}};
  http::json threads = nullptr;
  if (auto n = i.rt.count_threads())
    threads = *n;
  // One node today; a cluster would list its members here.
  http::json node{{"name", host_name()},
                  {"address", i.address},
                  {"pid", static_cast<int64_t>(getpid())},
                  {"version", version_string},
                  {"started_at", i.started_ms},
                  {"uptime_s", static_cast<double>(now - i.started_ms) / 1000},
                  {"self", true}};
  http::json body{
    {"object", "stats"},
    {"time", now},
    {"nodes", http::json::array({node})},
    {"http",
     {{"requests_total", i.metrics.requests_total()},
      {"window_s", recent.seconds},
      {"requests_per_s", static_cast<double>(recent.count) / recent.seconds},
      {"latency_ms",
       {{"p50", ms(recent.p50)}, {"p95", ms(recent.p95)},
        {"p99", ms(recent.p99)}}},
      {"connections_open", stats().open_connections}}},
    {"exchanges_in_flight", i.rt.exchanges_in_flight()},
    {"storage",
     {{"commits", store.commits},
      {"writes", store.writes},
      {"writes_per_commit",
       store.commits > 0 ? static_cast<double>(store.writes)
                             / static_cast<double>(store.commits)
                         : 0.0},
      {"failed_writes", store.failed_writes},
      {"commit_seconds", store.commit_seconds}}},
    {"events",
     {{"published", i.rt.events()->last()},
      {"subscribers", i.rt.events()->subscribers()}}},
    {"threads", std::move(threads)},
    {"tasks", std::move(tasks)}};
  return http::dump(body);
}

server::server(runtime& rt, server_options options)
  : impl_(std::make_unique<impl>(rt, std::move(options))) {
  auto& r = impl_->routes;
  r.get_async("/healthz", "GET /healthz",
              [this](std::shared_ptr<http::async_call> call) {
                // Load balancers ask this many times a second: both bodies
                // are made once.
                static const std::string ok = http::dump(
                  {{"status", "ok"}, {"version", version_string}});
                static const std::string stopping = http::dump(
                  {{"status", "stopping"}, {"version", version_string}});
                bool up = impl_->rt.running() && !impl_->routes.stopping();
                http::response res;
                res.status = up ? 200 : 503;
                res.set_content(up ? ok : stopping, "application/json");
                // A cluster node whose own lease does not run serves no
                // thread: it says so, and load balancers pass it by.
                auto* cluster = impl_->rt.cluster();
                if (up && cluster != nullptr && !cluster->standing()->live()) {
                  res.status = 503;
                  res.set_content(
                    http::dump(
                      {{"status", "cut_off"},
                       {"version", version_string},
                       {"node", cluster->options().node_name},
                       {"message",
                        "this node cannot renew its cluster lease in "
                        "PostgreSQL: it serves no thread until it can"}}),
                    "application/json");
                }
                call->send(std::move(res));
              },
              /*open=*/true);
  r.get("/v1/cluster", "GET /v1/cluster",
        [this](const http::request& req, http::response& res,
               http::request_context&) {
          http::only_params(req, {});
          auto* cluster = impl_->rt.cluster();
          if (cluster == nullptr) {
            http::reply(res, 200,
                        {{"clustered", false},
                         {"node", nullptr},
                         {"scheduler", nullptr},
                         {"nodes", json::array()}});
            return;
          }
          auto nodes = cluster->nodes();
          if (!nodes)
            http::fail(nodes.error());
          auto list = json::array();
          json seat = nullptr;
          for (auto& n : *nodes) {
            if (n.scheduler && n.state == "serving")
              seat = n.name;
            list.push_back({{"name", n.name},
                            {"advertise", n.advertise},
                            {"state", n.state},
                            {"incarnation", n.incarnation},
                            {"started_ms", n.started_ms},
                            {"heartbeat_age_ms", n.heartbeat_age_ms},
                            {"lease_left_ms", n.lease_left_ms},
                            {"threads", n.threads},
                            {"scheduler", n.scheduler}});
          }
          http::reply(res, 200,
                      {{"clustered", true},
                       {"node", cluster->options().node_name},
                       {"scheduler", std::move(seat)},
                       {"nodes", std::move(list)}});
        });
  r.get("/metrics", "GET /metrics",
        [this](const http::request&, http::response& res,
               http::request_context&) {
          res.set_content(impl_->metrics.scrape(),
                          "text/plain; version=0.0.4");
        });
  r.get("/v1/stats", "GET /v1/stats",
        [this](const http::request& req, http::response& res,
               http::request_context&) {
          http::only_params(req, {"window"});
          auto window = http::query_int(req, "window").value_or(10);
          if (window < 1 || window > 60)
            throw http::api_error{400, "invalid_argument",
                                  "window must be between 1 and 60 seconds",
                                  "window"};
          res.set_content(stats_body(static_cast<int>(window)),
                          "application/json");
        });
  http::add_console_routes(r);
  http::add_openapi_routes(r);
  http::add_id_routes(r);
  http::add_thread_routes(r);
  http::add_thread_resource_routes(r);
  http::add_item_routes(r);
  http::add_memory_routes(r);
  http::add_task_routes(r);
  http::add_event_routes(r);
  http::add_openai_routes(r);
  http::add_token_routes(r);
  http::add_tenant_routes(r);
  http::add_usage_routes(r);
  // A retry with the same Idempotency-Key gets the first answer.
  for (auto* route :
       {"POST /v1/threads/{id}/messages",
        "POST /v1/threads/{id}/messages/stream",
        "POST /v1/threads/{id}/items", "POST /v1/memories",
        "POST /v1/orchestrations", "POST /v1/chat/completions"})
    r.idempotent(route);
  add_gauges(impl_->metrics, impl_->rt);
  add_connection_gauges();

  auto& o = impl_->options;
  http::limits lim;
  lim.max_connections = o.max_connections;
  lim.header_bytes = o.header_limit;
  lim.header_count = o.max_headers;
  lim.url_bytes = o.url_limit;
  lim.body_bytes = o.body_limit;
  lim.header_timeout = o.header_timeout;
  lim.body_timeout = o.body_timeout;
  lim.keepalive_timeout = o.keepalive_timeout;
  lim.stream_buffer = o.stream_buffer;
  lim.send_buffer = o.send_buffer;
  auto* routes = &impl_->routes;
  std::shared_ptr<http::response_recorder> recorder;
  if (!o.record_dir.empty())
    recorder = http::response_recorder::open(o.record_dir);
  impl_->http = std::make_unique<http::http_server>(
    *impl_->loops, lim,
    [routes, recorder](std::shared_ptr<http::request> req,
                       http::responder_ptr res) {
      if (recorder)
        res = recorder->wrap(*req, std::move(res));
      routes->dispatch(std::move(req), std::move(res));
    },
    [routes, recorder](const http::request& req, int status,
                       const std::string& message) {
      auto res = routes->refusal(req, status, message);
      if (recorder)
        recorder->record(req, res);
      return res;
    });
}

std::vector<std::string> server::routes() const {
  return impl_->routes.route_names();
}

void server::add_connection_gauges() {
  struct connection_gauge {
    const char* name;
    const char* help;
    uint64_t server_stats::*field;
  };
  static constexpr connection_gauge gauges[] = {
    {"spindle_http_connections", "HTTP connections open now",
     &server_stats::open_connections},
    {"spindle_http_connections_accepted",
     "HTTP connections accepted since the start", &server_stats::accepted},
    {"spindle_http_connections_refused",
     "HTTP connections refused with 503 over --max-connections",
     &server_stats::refused},
    {"spindle_http_connections_timed_out",
     "HTTP connections closed because a header, body or keep-alive timeout "
     "passed",
     &server_stats::timed_out},
    {"spindle_http_streams_cut_off",
     "Streamed replies cut off because the client fell more than "
     "--stream-buffer bytes behind",
     &server_stats::cut_off},
    {"spindle_http_streams_paused",
     "Streamed replies whose generation is paused now, waiting for a client "
     "that reads slowly",
     &server_stats::streams_paused},
    {"spindle_http_stream_pauses",
     "Times a streamed reply's generation was paused for a client that "
     "reads slowly, since the start",
     &server_stats::stream_pauses},
  };
  for (auto& g : gauges)
    impl_->metrics.add_gauge(g.name, g.help, [this, field = g.field] {
      return http_metrics::samples{
        {{}, static_cast<double>(stats().*field)}};
    });
  impl_->metrics.add_gauge(
    "spindle_idempotency_keys",
    "Idempotency keys kept now: answers kept for retries, and requests "
    "running under a key",
    [this] {
      http_metrics::samples out;
      if (auto keys = impl_->routes.idempotency())
        out.push_back({{}, static_cast<double>(keys->size())});
      return out;
    });
  impl_->metrics.add_gauge(
    "spindle_key_authentications",
    "Requests authenticated by a tenant's key since the start, by where "
    "the key was found: the cache of keys in use, or the store",
    [this] {
      http_metrics::samples out;
      if (auto tenants = impl_->routes.tenants()) {
        out.push_back({{{"source", "cache"}},
                       static_cast<double>(tenants->cache_hits())});
        out.push_back({{{"source", "store"}},
                       static_cast<double>(tenants->cache_misses())});
      }
      return out;
    });
  impl_->metrics.add_gauge(
    "spindle_end_user_authentications",
    "Requests authenticated by an end user's token since the start: "
    "signatures verified, and tokens found already verified in the cache",
    [this] {
      http_metrics::samples out;
      if (auto tenants = impl_->routes.tenants()) {
        out.push_back({{{"source", "verified"}},
                       static_cast<double>(tenants->jwt_verifications())});
        out.push_back({{{"source", "cache"}},
                       static_cast<double>(tenants->jwt_cache_hits())});
      }
      return out;
    });
  impl_->metrics.add_gauge(
    "spindle_http_loop_connections",
    "HTTP connections open now on each event loop (a loop takes up to 16 "
    "before the next gets one)",
    [this] {
      http_metrics::samples out;
      auto per_loop = impl_->http->stats().open_per_loop;
      for (size_t i = 0; i < per_loop.size(); ++i)
        out.push_back({{{"loop", std::to_string(i)}},
                       static_cast<double>(per_loop[i])});
      return out;
    });
}

server::~server() {
  stop();
  // The runtime may serve on without this server's limits.
  impl_->rt.set_limits({});
  if (!impl_->options.admin_token.empty() || impl_->options.upstream.bounded())
    impl_->rt.set_upstream_limits({});
}

caf::expected<int> server::bind() {
  auto& opts = impl_->options;
  auto keys = http::idempotency_store::open(impl_->rt.options().storage,
                                            opts.idempotency_retention);
  if (!keys)
    return keys.error();
  impl_->routes.set_idempotency(std::move(*keys));
  const cluster_membership* cluster = impl_->rt.cluster();
  if (!opts.admin_token.empty()) {
    auto tenants = tenancy::tenant_store::open(impl_->rt.options().storage);
    if (!tenants)
      return tenants.error();
    // Each tenant's own limits over the server's defaults (this node's
    // share of them in a cluster).
    std::shared_ptr<tenancy::tenant_store> store = std::move(*tenants);
    impl_->rt.set_limits([store, defaults = opts.default_limits,
                          cluster](std::string_view tenant) {
      return node_share(store->limits_of(tenant, defaults), cluster);
    });
    // The tenants' weights share the upstream when calls wait for it:
    // for its bounds, or behind its gate.
    impl_->rt.set_upstream_limits(opts.upstream,
                                  [store](std::string_view tenant) {
                                    return store->weight_of(tenant);
                                  });
    impl_->routes.set_tenants(std::move(store));
  } else {
    if (opts.default_limits.limited())
      impl_->rt.set_limits(
        [defaults = opts.default_limits, cluster](std::string_view) {
          return node_share(defaults, cluster);
        });
    if (opts.upstream.bounded())
      impl_->rt.set_upstream_limits(opts.upstream);
  }
  auto port = impl_->http->listen(opts.bind, opts.port);
  if (port)
    impl_->address = opts.bind + ":" + std::to_string(*port);
  return port;
}

void server::run() {
  {
    std::unique_lock<std::mutex> lock{impl_->mx};
    impl_->stopped_cv.wait(lock, [this] { return impl_->stopped; });
  }
  impl_->http->wait_drained(std::chrono::steady_clock::now()
                            + impl_->options.shutdown_grace);
}

void server::stop() {
  impl_->routes.set_stopping();
  impl_->http->stop();
  std::lock_guard<std::mutex> guard{impl_->mx};
  impl_->stopped = true;
  impl_->stopped_cv.notify_all();
}

server_stats server::stats() const {
  auto s = impl_->http->stats();
  return {s.open,    s.accepted, s.refused, s.timed_out,
          s.cut_off, s.paused,   s.pauses,  std::move(s.open_per_loop)};
}

} // namespace spindle
