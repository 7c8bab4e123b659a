// Orchestration routes: create, spawn subtasks, claim, complete, fail, and
// the tree with states.

#include "auth.hpp"
#include "router.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/task_id.hpp"
#include "spindle/runtime/runtime.hpp"

namespace spindle::http {

namespace {

// Payloads, results and reasons may be any JSON value; they are kept as
// their JSON text and given back as the same value.
std::string keep(const json& body, const char* field, bool required) {
  auto it = body.find(field);
  if (it == body.end()) {
    if (required)
      throw api_error{400, "malformed",
                      std::string{"field '"} + field + "' is required"};
    return "null";
  }
  return dump(*it);
}

json give_back(const std::string& text) {
  if (text.empty())
    return nullptr;
  auto parsed = json::parse(text, nullptr, false);
  return parsed.is_discarded() ? json(text) : parsed;
}

json task_json(const task_info& t) {
  json out{{"id", t.id},
           {"parent", t.parent.empty() ? json(nullptr) : json(t.parent)},
           {"state", to_string(t.state)},
           {"payload", give_back(t.payload)},
           {"worker", t.worker.empty() ? json(nullptr) : json(t.worker)},
           {"incomplete_children", t.incomplete_children},
           {"attempts", t.attempts},
           {"max_attempts", t.max_attempts},
           {"backoff_s", static_cast<double>(t.backoff_ms) / 1000},
           {"retry_at", t.retry_at_ms > 0 ? json(t.retry_at_ms)
                                          : json(nullptr)},
           {"lease_expires_at", t.lease_expires_ms > 0
                                  ? json(t.lease_expires_ms)
                                  : json(nullptr)}};
  if (t.state == task_state::completed)
    out["result"] = give_back(t.outcome);
  else if (t.state == task_state::failed)
    out["reason"] = give_back(t.outcome);
  else if (t.state == task_state::stale && !t.outcome.empty())
    out["stale"] = give_back(t.outcome); // whose lease expired, and when
  else if (!t.outcome.empty())
    // Pending for a retry, or running again: why the last attempt ended.
    out["last_error"] = give_back(t.outcome);
  return out;
}

// A length in seconds from `field` of `body`, between `min` and `max`
// seconds; `fallback` when absent or null.
std::chrono::milliseconds seconds_field(const json& body, const char* field,
                                        double min, double max,
                                        std::chrono::milliseconds fallback) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null())
    return fallback;
  if (!it->is_number())
    throw api_error{400, "malformed",
                    std::string{"field '"} + field + "' must be a number",
                    field};
  auto seconds = it->get<double>();
  if (!(seconds >= min && seconds <= max)) {
    auto bound = [](double x) { return std::to_string(static_cast<int>(x)); };
    throw api_error{400, "invalid_argument",
                    std::string{field} + " must be between " + bound(min)
                      + " and " + bound(max) + " seconds",
                    field};
  }
  return std::chrono::milliseconds{static_cast<int64_t>(seconds * 1000)};
}

// The lease length of a body's "lease_s" (default 30 s).
std::chrono::milliseconds lease_length(const json& body) {
  return seconds_field(body, "lease_s", 1, 3600,
                       std::chrono::milliseconds{default_lease_ms});
}

// The retry settings of a creation body: "max_attempts" (1 to 100,
// default 1) and "backoff_s" (0 to 3600, default 0).
task_retry retry_of(const json& body) {
  task_retry out;
  if (auto it = body.find("max_attempts"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer())
      throw api_error{400, "malformed",
                      "field 'max_attempts' must be an integer",
                      "max_attempts"};
    auto n = it->get<int64_t>();
    if (n < 1 || n > max_task_attempts)
      throw api_error{400, "invalid_argument",
                      "max_attempts must be between 1 and 100",
                      "max_attempts"};
    out.max_attempts = static_cast<uint32_t>(n);
  }
  out.backoff_ms = static_cast<uint64_t>(
    seconds_field(body, "backoff_s", 0, 3600, std::chrono::milliseconds{0})
      .count());
  return out;
}

json claim_json(const task_claim& c) {
  auto out = task_json(c.task);
  out["lease"] = {{"token", c.lease}, {"expires_at", c.lease_expires_ms}};
  // The task as GET /v1/tasks/{id} shows it now: under this lease.
  if (c.lease_expires_ms > 0)
    out["lease_expires_at"] = c.lease_expires_ms;
  return out;
}

// The task the next claim takes, over every orchestration of the
// request's tenant (D1): its scheduler's first executable task, or null.
json next_task(router& r, const request& req) {
  auto next = r.rt().executable_tasks(who(req).prefix, 1);
  return next && !next->empty() ? json(next->front()) : json(nullptr);
}

// A task ID of the path, checked, as the facade names it in the request's
// tenant ("TENANT~0001_t1"; docs/tenants.md).
std::string path_task(const request& req) {
  auto& id = req.matches[1];
  if (auto parsed = task_id::parse(id); !parsed)
    fail(parsed.error());
  return who(req).qualify(id);
}

// The tenant's ID for the facade ("" for the default tenant).
std::string tenant_id_of(const request& req) {
  return std::string{tenant_of_id(who(req).prefix)};
}

} // namespace

void add_task_routes(router& r) {
  r.post(R"(/v1/orchestrations)", "POST /v1/orchestrations",
         [&r](const request& req, response& res,
              request_context& ctx) {
           auto body = parse_body(req, {"payload", "max_attempts",
                                        "backoff_s"});
           auto id = r.rt().create_orchestration(keep(body, "payload", true),
                                                 retry_of(body),
                                                 tenant_id_of(req));
           if (!id)
             fail(id.error());
           ctx.log["task"] = *id;
           reply(res, 201, {{"id", *id}});
         });

  r.get(R"(/v1/orchestrations/([^/]+))", "GET /v1/orchestrations/{id}",
        [&r](const request& req, response& res,
             request_context&) {
          auto id = path_task(req);
          auto tree = r.rt().orchestration_tree(id);
          if (!tree)
            fail(tree.error());
          json tasks = json::array();
          for (auto& t : tree->tasks)
            tasks.push_back(task_json(t));
          auto executable = r.rt().executable_tasks(id);
          reply(res, 200,
                {{"id", tree->orchestration},
                 {"tasks", tasks},
                 {"executable", executable ? json(*executable)
                                           : json::array()},
                 {"next", next_task(r, req)}});
        });

  r.get(R"(/v1/orchestrations)", "GET /v1/orchestrations",
        [&r](const request& req, response& res, request_context&) {
          only_params(req, {});
          auto ids = r.rt().list_orchestrations(tenant_id_of(req));
          if (!ids)
            fail(ids.error());
          reply(res, 200, {{"object", "list"},
                           {"data", *ids},
                           {"next", next_task(r, req)}});
        });

  r.get(R"(/v1/tasks/([^/]+))", "GET /v1/tasks/{id}",
        [&r](const request& req, response& res,
             request_context&) {
          auto t = r.rt().task(path_task(req));
          if (!t)
            fail(t.error());
          reply(res, 200, task_json(*t));
        });

  r.post(R"(/v1/tasks/([^/]+)/subtasks)", "POST /v1/tasks/{id}/subtasks",
         [&r](const request& req, response& res,
              request_context& ctx) {
           auto parent = path_task(req);
           auto body = parse_body(req, {"payload", "max_attempts",
                                        "backoff_s"});
           auto ids = r.rt().spawn_subtasks(
             parent, {keep(body, "payload", true)}, retry_of(body));
           if (!ids)
             fail(ids.error());
           ctx.log["task"] = ids->front();
           reply(res, 201, {{"id", ids->front()}});
         });

  // Asynchronous: a claim that waits for a task (wait_s) holds no thread.
  r.post_async(
    R"(/v1/tasks/claim)", "POST /v1/tasks/claim",
    [&r](std::shared_ptr<async_call> call) {
      auto body = parse_body(call->req(), {"worker", "lease_s", "wait_s"});
      auto worker = required_string(body, "worker");
      // Workers are per tenant: a name never holds the tenant separator.
      if (worker.find(tenant_separator) != std::string::npos)
        throw api_error{400, "invalid_argument",
                        "worker: a worker name may not hold '~'", "worker"};
      worker = who(call->req()).qualify(worker);
      auto lease = lease_length(body);
      auto wait = seconds_field(body, "wait_s", 0, 60,
                                std::chrono::milliseconds{0});
      r.rt().claim_task_async(
        worker, lease, wait, [call](caf::expected<task_claim> claimed) {
          if (!claimed) {
            call->fail(claimed.error());
            return;
          }
          if (!claimed->claimed) {
            response res;
            res.status = 204;
            call->send(std::move(res));
            return;
          }
          call->ctx.log["task"] = claimed->task.id;
          call->reply(200, claim_json(*claimed));
        });
    });

  auto finish = [&r](bool complete) {
    return [&r, complete](const request& req, response& res,
                          request_context& ctx) {
      auto id = path_task(req);
      auto field = complete ? "result" : "reason";
      auto body = parse_body(req, {field, "lease"}, /*allow_empty=*/true);
      auto value = keep(body, field, false);
      auto lease = optional_string(body, "lease").value_or("");
      auto t = complete ? r.rt().complete_task(id, value, lease)
                        : r.rt().fail_task(id, value, lease);
      if (!t)
        fail(t.error());
      ctx.log["task"] = id;
      reply(res, 200, task_json(*t));
    };
  };
  r.post(R"(/v1/tasks/([^/]+)/heartbeat)", "POST /v1/tasks/{id}/heartbeat",
         [&r](const request& req, response& res, request_context& ctx) {
           auto id = path_task(req);
           auto body = parse_body(req, {"lease", "lease_s"});
           auto lease = required_string(body, "lease");
           auto extended = r.rt().heartbeat_task(id, lease,
                                                 lease_length(body));
           if (!extended)
             fail(extended.error());
           ctx.log["task"] = id;
           reply(res, 200, claim_json(*extended));
         });
  r.post(R"(/v1/tasks/([^/]+)/requeue)", "POST /v1/tasks/{id}/requeue",
         [&r](const request& req, response& res, request_context& ctx) {
           auto id = path_task(req);
           parse_body(req, {}, /*allow_empty=*/true);
           auto t = r.rt().requeue_task(id);
           if (!t)
             fail(t.error());
           ctx.log["task"] = id;
           reply(res, 200, task_json(*t));
         });
  r.post(R"(/v1/tasks/([^/]+)/complete)", "POST /v1/tasks/{id}/complete",
         finish(true));
  r.post(R"(/v1/tasks/([^/]+)/fail)", "POST /v1/tasks/{id}/fail",
         finish(false));
}

} // namespace spindle::http
