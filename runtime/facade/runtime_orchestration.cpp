// The facade's orchestration calls: thin wrappers over the scheduler's
// protocol (messages/orchestration.hpp).

#include <caf/all.hpp>

#include "spindle/runtime/runtime.hpp"

namespace spindle {

namespace {

caf::expected<std::optional<task_info>> unwrap(caf::expected<task_claim> x) {
  if (!x)
    return x.error();
  if (!x->claimed)
    return std::optional<task_info>{};
  return std::optional<task_info>{std::move(x->task)};
}

caf::expected<void> to_void(const caf::expected<caf::ok_atom>& x) {
  if (!x)
    return x.error();
  return {};
}

// The tenant a task ID, parent, orchestration or worker names ("TENANT~x";
// "" for the default tenant), and the name within it.
std::string tenant_in(const std::string& name) {
  return std::string{tenant_of_id(name)};
}
std::string local_in(const std::string& name) {
  return std::string{local_id(name)};
}

} // namespace

template <class R, class... Ts>
caf::expected<R> runtime::ask_scheduler(std::chrono::milliseconds timeout,
                                        Ts&&... xs) {
  auto handle = scheduler();
  if (!handle)
    return no_scheduler_here();
  return call<R>(handle, timeout, std::forward<Ts>(xs)...);
}

template <class R, class... Ts>
void runtime::ask_scheduler_async(std::chrono::milliseconds timeout,
                                  std::function<void(caf::expected<R>)> done,
                                  Ts&&... xs) {
  auto handle = scheduler();
  if (!handle) {
    done(no_scheduler_here());
    return;
  }
  call_async<R>(handle, timeout, std::move(done), std::forward<Ts>(xs)...);
}

namespace {

caf::error not_a_tenant(const std::string& tenant) {
  return make_error(errc::invalid_id,
                    "'" + tenant.substr(0, 64)
                      + "' is not a tenant ID (1 to 32 of a-z 0-9)");
}

} // namespace

template <class R, class... Ts>
caf::expected<R> runtime::ask_scheduler_in(const std::string& tenant,
                                           std::chrono::milliseconds timeout,
                                           Ts&&... xs) {
  if (tenant.empty())
    return ask_scheduler<R>(timeout, std::forward<Ts>(xs)...);
  if (!valid_tenant_id(tenant))
    return not_a_tenant(tenant);
  auto handle = scheduler_of(tenant);
  if (!handle)
    return no_scheduler_here();
  return call<R>(handle, timeout, std::forward<Ts>(xs)...);
}

template <class R, class... Ts>
void runtime::ask_scheduler_in_async(
  const std::string& tenant, std::chrono::milliseconds timeout,
  std::function<void(caf::expected<R>)> done, Ts&&... xs) {
  if (tenant.empty()) {
    ask_scheduler_async<R>(timeout, std::move(done), std::forward<Ts>(xs)...);
    return;
  }
  if (!valid_tenant_id(tenant)) {
    done(not_a_tenant(tenant));
    return;
  }
  auto handle = scheduler_of(tenant);
  if (!handle) {
    done(no_scheduler_here());
    return;
  }
  call_async<R>(handle, timeout, std::move(done), std::forward<Ts>(xs)...);
}

caf::expected<std::string> runtime::create_orchestration(std::string payload) {
  return ask_scheduler<std::string>(options_.default_timeout,
                           orchestrate_atom::value, std::move(payload));
}

caf::expected<std::string> runtime::create_orchestration(std::string payload,
                                                       task_retry retry) {
  return ask_scheduler<std::string>(options_.default_timeout,
                           orchestrate_atom::value, std::move(payload), retry);
}

caf::expected<std::string> runtime::create_orchestration(
  std::string payload, task_retry retry, const std::string& tenant) {
  return ask_scheduler_in<std::string>(tenant, options_.default_timeout,
                                       orchestrate_atom::value,
                                       std::move(payload), retry);
}

caf::expected<std::vector<std::string>>
runtime::spawn_subtasks(const std::string& parent,
                        std::vector<std::string> payloads, task_retry retry) {
  return ask_scheduler_in<std::vector<std::string>>(
    tenant_in(parent), options_.default_timeout, caf::spawn_atom::value,
    local_in(parent), std::move(payloads), retry);
}

caf::expected<std::string> runtime::spawn_subtask(const std::string& parent,
                                                  std::string payload) {
  auto ids = spawn_subtasks(parent, {std::move(payload)});
  if (!ids)
    return ids.error();
  return std::move(ids->front());
}

caf::expected<std::vector<std::string>>
runtime::spawn_subtasks(const std::string& parent,
                        std::vector<std::string> payloads) {
  return ask_scheduler_in<std::vector<std::string>>(
    tenant_in(parent), options_.default_timeout, caf::spawn_atom::value,
    local_in(parent), std::move(payloads));
}

caf::expected<std::optional<task_info>>
runtime::claim_task(const std::string& worker) {
  return unwrap(ask_scheduler_in<task_claim>(tenant_in(worker),
                                            options_.default_timeout,
                                            claim_atom::value,
                                            local_in(worker)));
}

caf::expected<task_info> runtime::complete_task(const std::string& task,
                                                std::string result) {
  return ask_scheduler_in<task_info>(tenant_in(task), options_.default_timeout,
                                     complete_atom::value, local_in(task),
                                     std::move(result));
}

caf::expected<task_info> runtime::fail_task(const std::string& task,
                                            std::string reason) {
  return ask_scheduler_in<task_info>(tenant_in(task), options_.default_timeout,
                                     fail_atom::value, local_in(task),
                                     std::move(reason));
}

namespace {

// A length as the scheduler's protocol carries it (negative: 0).
uint64_t ms(std::chrono::milliseconds x) {
  return static_cast<uint64_t>(std::max<int64_t>(0, x.count()));
}

} // namespace

caf::expected<task_claim>
runtime::claim_task(const std::string& worker,
                    std::chrono::milliseconds length) {
  return ask_scheduler_in<task_claim>(tenant_in(worker),
                                      options_.default_timeout,
                                      claim_atom::value, local_in(worker),
                                      ms(length));
}

void runtime::claim_task_async(
  const std::string& worker, std::chrono::milliseconds length,
  std::chrono::milliseconds wait,
  std::function<void(caf::expected<task_claim>)> done) {
  ask_scheduler_in_async<task_claim>(
    tenant_in(worker),
    options_.default_timeout + std::chrono::milliseconds{ms(wait)},
    std::move(done), claim_atom::value, local_in(worker), ms(length),
    ms(wait));
  // Spawning pins this system's logger in a thread-local of the calling
  // thread (an HTTP loop, say); ~actor_system waits for every such pin.
  caf::logger::set_current_actor_system(nullptr);
}

caf::expected<task_claim>
runtime::claim_task(const std::string& worker,
                    std::chrono::milliseconds length,
                    std::chrono::milliseconds wait) {
  return ask_scheduler_in<task_claim>(
    tenant_in(worker),
    options_.default_timeout + std::chrono::milliseconds{ms(wait)},
    claim_atom::value, local_in(worker), ms(length), ms(wait));
}

caf::expected<task_claim>
runtime::heartbeat_task(const std::string& task, const std::string& lease,
                        std::chrono::milliseconds length) {
  return ask_scheduler_in<task_claim>(tenant_in(task), options_.default_timeout,
                                      heartbeat_atom::value, local_in(task),
                                      lease, ms(length));
}

caf::expected<task_info> runtime::complete_task(const std::string& task,
                                                std::string result,
                                                const std::string& lease) {
  return ask_scheduler_in<task_info>(tenant_in(task), options_.default_timeout,
                                     complete_atom::value, local_in(task),
                                     std::move(result), lease);
}

caf::expected<task_info> runtime::fail_task(const std::string& task,
                                            std::string reason,
                                            const std::string& lease) {
  return ask_scheduler_in<task_info>(tenant_in(task), options_.default_timeout,
                                     fail_atom::value, local_in(task),
                                     std::move(reason), lease);
}

caf::expected<task_info> runtime::requeue_task(const std::string& task) {
  return ask_scheduler_in<task_info>(tenant_in(task), options_.default_timeout,
                                     requeue_atom::value, local_in(task));
}

caf::expected<task_tree>
runtime::orchestration_tree(const std::string& orchestration) {
  return ask_scheduler_in<task_tree>(tenant_in(orchestration),
                                     options_.default_timeout,
                                     caf::get_atom::value,
                                     local_in(orchestration));
}

caf::expected<task_info> runtime::task(const std::string& id) {
  return ask_scheduler_in<task_info>(tenant_in(id), options_.default_timeout,
                                     caf::get_atom::value, task_atom::value,
                                     local_in(id));
}

caf::expected<std::vector<std::string>>
runtime::executable_tasks(const std::string& orchestration, uint64_t limit) {
  // "TENANT~" names every orchestration of the tenant.
  return ask_scheduler_in<std::vector<std::string>>(
    tenant_in(orchestration), options_.default_timeout,
    executable_atom::value, local_in(orchestration), limit);
}

caf::expected<std::vector<std::string>>
runtime::list_orchestrations(const std::string& tenant) {
  return ask_scheduler_in<std::vector<std::string>>(
    tenant, options_.default_timeout, caf::get_atom::value,
    orchestrate_atom::value);
}

caf::expected<void> runtime::attach_worker(const std::string& worker,
                                           const caf::actor_addr& actor) {
  return to_void(ask_scheduler_in<caf::ok_atom>(
    tenant_in(worker), options_.default_timeout, attach_atom::value,
    local_in(worker), actor));
}

caf::expected<void> runtime::attach_worker(const std::string& worker,
                                           const process_identity& who) {
  return to_void(ask_scheduler_in<caf::ok_atom>(
    tenant_in(worker), options_.default_timeout, attach_atom::value,
    local_in(worker), static_cast<int32_t>(who.pid), who.start_time));
}

caf::expected<std::vector<std::string>>
runtime::mark_worker_stale(const std::string& worker) {
  return ask_scheduler_in<std::vector<std::string>>(
    tenant_in(worker), options_.default_timeout, stale_atom::value,
    local_in(worker));
}

caf::expected<task_counts> runtime::count_tasks() {
  auto all = all_schedulers();
  if (all.empty())
    return no_scheduler_here();
  task_counts sum;
  for (auto& handle : all) {
    auto counts = call<task_counts>(handle, options_.default_timeout,
                                    stats_atom::value);
    if (!counts)
      return counts.error();
    sum += *counts;
  }
  return sum;
}

caf::expected<std::vector<std::string>> runtime::detect_stale_tasks() {
  // Process workers attach to the default tenant's scheduler (spindle
  // worker claims with a key's tenant through the HTTP API instead).
  auto candidates = ask_scheduler<std::vector<process_worker>>(
    options_.default_timeout, workers_atom::value);
  if (!candidates)
    return candidates.error();
  // Liveness is read from /proc here, on the caller's thread, so no actor
  // blocks on I/O. A dead identity stays dead (a PID's start time never
  // changes back), so checking outside the scheduler cannot misjudge.
  std::vector<std::string> out;
  for (auto& w : *candidates) {
    if (is_alive(process_identity{static_cast<pid_t>(w.pid), w.start_time}))
      continue;
    auto ids = mark_worker_stale(w.worker);
    if (!ids)
      return ids.error();
    out.insert(out.end(), ids->begin(), ids->end());
  }
  return out;
}

void runtime::create_orchestration_async(
  std::string payload, std::function<void(caf::expected<std::string>)> done) {
  ask_scheduler_async<std::string>(options_.default_timeout,
                          std::move(done), orchestrate_atom::value,
                          std::move(payload));
}

void runtime::spawn_subtasks_async(
  const std::string& parent, std::vector<std::string> payloads,
  std::function<void(caf::expected<std::vector<std::string>>)> done) {
  ask_scheduler_in_async<std::vector<std::string>>(
    tenant_in(parent), options_.default_timeout, std::move(done),
    caf::spawn_atom::value, local_in(parent), std::move(payloads));
}

void runtime::claim_task_async(
  const std::string& worker,
  std::function<void(caf::expected<std::optional<task_info>>)> done) {
  ask_scheduler_in_async<task_claim>(
    tenant_in(worker), options_.default_timeout,
    [done = std::move(done)](caf::expected<task_claim> x) {
      done(unwrap(std::move(x)));
    },
    claim_atom::value, local_in(worker));
}

void runtime::complete_task_async(
  const std::string& task, std::string result,
  std::function<void(caf::expected<task_info>)> done) {
  ask_scheduler_in_async<task_info>(tenant_in(task), options_.default_timeout,
                                    std::move(done), complete_atom::value,
                                    local_in(task), std::move(result));
}

void runtime::fail_task_async(
  const std::string& task, std::string reason,
  std::function<void(caf::expected<task_info>)> done) {
  ask_scheduler_in_async<task_info>(tenant_in(task), options_.default_timeout,
                                    std::move(done), fail_atom::value,
                                    local_in(task), std::move(reason));
}

void runtime::requeue_task_async(
  const std::string& task, std::function<void(caf::expected<task_info>)> done) {
  ask_scheduler_in_async<task_info>(tenant_in(task), options_.default_timeout,
                                    std::move(done), requeue_atom::value,
                                    local_in(task));
}

void runtime::orchestration_tree_async(
  const std::string& orchestration,
  std::function<void(caf::expected<task_tree>)> done) {
  ask_scheduler_in_async<task_tree>(tenant_in(orchestration),
                                    options_.default_timeout, std::move(done),
                                    caf::get_atom::value,
                                    local_in(orchestration));
}

} // namespace spindle
