#include "spindle/actors/orchestrator.hpp"

#include <iterator>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/messages/clock.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/hybrid36.hpp"

namespace spindle {

namespace {

using record = orchestrator_state::record;

// The most children one spawn request may create: the most a task level
// can ever hold.
constexpr uint64_t max_spawn = hybrid36::max_ordinal;

task_info info_of(const task_id& id, const record& r) {
  task_info out;
  out.id = id.to_string();
  if (auto parent = id.parent())
    out.parent = parent->to_string();
  out.state = r.state;
  out.payload = r.payload;
  out.outcome = r.outcome;
  out.worker = r.worker;
  out.incomplete_children = r.incomplete;
  out.children.reserve(r.children.size());
  for (auto n : r.children)
    out.children.push_back(id.child(n).to_string());
  out.attempts = r.attempts;
  out.max_attempts = r.retry.max_attempts;
  out.backoff_ms = r.retry.backoff_ms;
  out.retry_at_ms = r.retry_at_ms;
  return out;
}

caf::error unknown(const task_id& id) {
  return make_error(errc::not_found, "task " + id.to_string()
                                       + " does not exist");
}

caf::error wrong_state(const task_id& id, const record& r,
                       const std::string& wanted) {
  return make_error(errc::conflict, "task " + id.to_string() + " is "
                                      + to_string(r.state) + ", not "
                                      + wanted);
}

// What went wrong, without the code's name when it is spindle's own
// storage failure (the caller's message names it once).
std::string reason_of(const caf::error& err) {
  if (is_storage_error(err) && err.context().match_elements<std::string>())
    return err.context().get_as<std::string>(0);
  return describe(err);
}

// A retry waiting out its backoff is not executable until its timer says so
// (`retry_at_ms` is then 0).
bool executable(const record& r) {
  return r.state == task_state::pending && r.incomplete == 0
         && r.retry_at_ms == 0;
}

// Announces `id` to the scheduler if it just became executable.
void announce_if_executable(orchestrator_pointer self, const task_id& id,
                            const record& r) {
  if (executable(r))
    self->send(self->state.scheduler, ready_atom::value,
               std::vector<task_id>{id});
}

void set_state(orchestrator_state& st, record& r, task_state to) {
  --st.counts.of(r.state);
  ++st.counts.of(to);
  r.state = to;
}

// -- write-through -----------------------------------------------------------------

using acknowledgement = orchestrator_state::acknowledgement;

void flush(orchestrator_pointer self);

// A write failed or its outcome is unknown (timeout): memory is ahead of
// the store. Every waiting reply gets the error, and the orchestrator stops
// so the scheduler loads it again from what committed.
void write_failed(orchestrator_pointer self, const caf::error& err) {
  auto& st = self->state;
  auto e = make_storage_error(err, "orchestration " + st.root.to_string()
                                     + ": the change was not stored: "
                                     + reason_of(err));
  spdlog::warn("orchestration {}: a write to the state store failed ({}); "
               "it is reloaded from what committed",
               st.root.to_string(), describe(err));
  auto in_flight = std::move(st.in_flight);
  auto next = std::move(st.next_acks);
  st.in_flight.clear();
  st.next_acks.clear();
  st.next_write.clear();
  st.next_events.clear(); // never happened
  for (auto& ack : in_flight)
    ack(e);
  for (auto& ack : next)
    ack(e);
  self->quit(e);
}

// -- retirement ---------------------------------------------------------------------

// Every task completed or failed: nothing will change unless a failed one is
// requeued.
bool finished(const orchestrator_state& st) {
  return st.counts.pending == 0 && st.counts.running == 0
         && st.counts.stale == 0;
}

bool quiet(const orchestrator_state& st) {
  return !st.writing && st.next_write.empty() && st.next_acks.empty()
         && st.in_flight.empty() && st.spawning == 0;
}

// Tells the scheduler once the orchestration is finished and stored, so it
// can leave memory (docs/orchestration.md, "Retirement"); after a retire
// request, stops once everything committed.
void settle(orchestrator_pointer self) {
  auto& st = self->state;
  if (!st.store || !quiet(st))
    return;
  if (st.retiring) {
    self->send(st.scheduler, retired_atom::value, st.root.orchestration,
               st.counts, finished(st));
    self->quit();
    return;
  }
  if (!finished(st)) {
    st.reported_idle = false;
    return;
  }
  if (st.reported_idle)
    return;
  st.reported_idle = true;
  self->send(st.scheduler, orch_idle_atom::value, st.root.orchestration,
             st.counts);
}

// Sends the collected changes as one write unless one is in flight.
void flush(orchestrator_pointer self) {
  auto& st = self->state;
  if (st.writing || st.next_acks.empty())
    return;
  if (st.next_write.empty()) {
    // Only replies that wait for earlier changes, which have committed.
    auto acks = std::move(st.next_acks);
    st.next_acks.clear();
    for (auto& ack : acks)
      ack(caf::none);
    settle(self);
    return;
  }
  st.writing = true;
  st.in_flight = std::move(st.next_acks);
  st.next_acks.clear();
  auto write = std::move(st.next_write);
  st.next_write.clear();
  // The events go out in the store, right after the commit: in commit
  // order with every other writer's.
  auto hook = publish_on_commit(st.events, std::move(st.next_events));
  st.next_events.clear();
  self
    ->request(st.store, st.timeout, store_atom::value, std::move(write),
              std::move(hook))
    .then(
      [self](uint64_t) {
        auto& s = self->state;
        auto acks = std::move(s.in_flight);
        s.in_flight.clear();
        s.writing = false;
        for (auto& ack : acks)
          ack(caf::none);
        flush(self);
        settle(self);
      },
      [self](caf::error& err) { write_failed(self, err); });
}

// Calls `ack` once `write` and every change made before it committed; at
// once without a store, or when nothing is waiting to be stored.
void after_commit(orchestrator_pointer self, sql_write write,
                  acknowledgement ack) {
  auto& st = self->state;
  if (!st.store || (write.empty() && !st.writing)) {
    ack(caf::none);
    return;
  }
  if (write.empty() && st.next_write.empty()) {
    // Only the write in flight holds earlier changes.
    st.in_flight.push_back(std::move(ack));
    return;
  }
  st.next_write.insert(st.next_write.end(),
                       std::make_move_iterator(write.begin()),
                       std::make_move_iterator(write.end()));
  st.next_acks.push_back(std::move(ack));
  flush(self);
}

// Replies `value` once `write` (empty: nothing of its own) and every change
// before it committed; at once without a store.
template <class T>
caf::result<T> reply_after_commit(orchestrator_pointer self, sql_write write,
                                  T value) {
  auto& st = self->state;
  if (!st.store || (write.empty() && !st.writing))
    return value;
  auto rp = self->make_response_promise<T>();
  after_commit(self, std::move(write),
               [rp, value = std::move(value)](const caf::error& err) mutable {
                 if (err)
                   rp.deliver(err);
                 else
                   rp.deliver(std::move(value));
               });
  return rp;
}

// The statement storing the state of `id` (none without a store).
sql_write stored_state(const orchestrator_state& st, const task_id& id,
                       const record& r) {
  if (!st.store)
    return {};
  return {records::update_task(id, r.state, r.outcome, r.worker, r.attempts,
                               r.retry_at_ms)};
}

// Publishes the event of a change: with the write holding the change, or
// at once without a store.
void emit(orchestrator_pointer self, event e) {
  auto& st = self->state;
  if (!st.events)
    return;
  e.tenant = st.tenant;
  if (!st.store)
    st.events->publish({std::move(e)});
  else
    st.next_events.push_back(std::move(e));
}

void emit(orchestrator_pointer self, const char* type, const task_id& id,
          const record& r, const std::string& extra = {}) {
  if (self->state.events)
    emit(self, task_event(type, info_of(id, r), extra));
}

// Announces `id` once its backoff is over (`retry` timer), or at once.
void schedule_retry(orchestrator_pointer self, const task_id& id,
                    const record& r) {
  if (r.retry_at_ms == 0) {
    announce_if_executable(self, id, r);
    return;
  }
  auto left = std::max<int64_t>(r.retry_at_ms - unix_time_ms(), 0);
  self->delayed_send(self, std::chrono::milliseconds{left}, retry_atom::value,
                     id);
}

// Running task `id` lost its attempt (it failed, or its worker is gone):
// pending again after its backoff when it has attempts left (a `retried`
// event follows `type`'s), else `to`. Returns the statement to store.
sql_write end_attempt(orchestrator_pointer self, const task_id& id, record& r,
                      task_state to, std::string outcome, const char* type,
                      const std::string& extra = {}) {
  auto& st = self->state;
  r.outcome = std::move(outcome);
  if (r.attempts >= r.retry.max_attempts) {
    set_state(st, r, to);
    emit(self, type, id, r, extra);
    return stored_state(st, id, r);
  }
  set_state(st, r, task_state::pending);
  auto delay = retry_delay_ms(r.retry.backoff_ms, r.attempts);
  r.retry_at_ms = delay == 0 ? 0
                             : unix_time_ms() + static_cast<int64_t>(delay);
  // The cause first (a lease that expired), then the retry; a plain
  // failure is only a retry.
  if (to == task_state::stale)
    emit(self, type, id, r, extra);
  emit(self, "task.retried", id, r);
  auto write = stored_state(st, id, r);
  schedule_retry(self, id, r);
  return write;
}

// Running by `worker` -> stale (or retried), keeping `outcome` (why);
// otherwise the task is left alone: only the worker that holds it can lose
// it, and a completion that beat the news of the worker's death stands.
caf::result<task_info> make_stale(orchestrator_pointer self, const task_id& id,
                                  const std::string& worker,
                                  std::string outcome) {
  auto& st = self->state;
  auto i = st.tasks.find(id);
  if (i == st.tasks.end())
    return unknown(id);
  sql_write write;
  if (i->second.state == task_state::running && i->second.worker == worker) {
    // A lease's expiry says so in its outcome.
    auto type = outcome.rfind("{\"lease_expired_at\"", 0) == 0
                  ? "task.lease_expired"
                  : "task.stale";
    write = end_attempt(self, id, i->second, task_state::stale,
                        std::move(outcome), type);
  }
  return reply_after_commit(self, std::move(write), info_of(id, i->second));
}

} // namespace


orchestrator_state::~orchestrator_state() {
  if (in_flight.empty() && next_acks.empty())
    return;
  auto e = make_error(errc::unavailable, "orchestration " + root.to_string()
                                           + " has stopped");
  for (auto& ack : in_flight)
    ack(e);
  for (auto& ack : next_acks)
    ack(e);
}

orchestrator_actor::behavior_type
orchestrator(orchestrator_pointer self, records::stored_orchestration initial,
             scheduler_actor scheduler, id_allocator_actor ids,
             storage_actor store, std::chrono::milliseconds timeout,
             std::shared_ptr<event_log> events, std::string tenant) {
  auto& init = self->state;
  init.events = std::move(events);
  init.tenant = std::move(tenant);
  init.root = initial.root;
  init.scheduler = std::move(scheduler);
  init.ids = std::move(ids);
  init.store = std::move(store);
  init.timeout = timeout;
  // The stored tasks come in preorder by value: a parent before its
  // children, siblings by sequence number.
  for (auto& t : initial.tasks) {
    auto& r = init.tasks[t.id];
    r.state = t.state;
    r.payload = std::move(t.payload);
    r.outcome = std::move(t.outcome);
    r.worker = std::move(t.worker);
    r.attempts = t.attempts;
    r.retry = t.retry;
    r.retry_at_ms = t.state == task_state::pending ? t.retry_at_ms : 0;
    ++init.counts.of(r.state);
    if (auto parent = t.id.parent()) {
      auto& p = init.tasks[*parent];
      p.children.push_back(t.id.sequence());
      if (r.state != task_state::completed)
        ++p.incomplete;
    }
  }
  init.counts.orchestrations = 1;
  // Retries still in their backoff are announced when it ends; the rest
  // are due (the scheduler indexed them: records::executable_tasks).
  auto now = unix_time_ms();
  for (auto& [id, r] : init.tasks) {
    if (r.retry_at_ms != 0 && r.retry_at_ms <= now)
      r.retry_at_ms = 0;
    if (r.retry_at_ms != 0)
      schedule_retry(self, id, r);
  }
  // A finished orchestration loaded for a request leaves memory again.
  settle(self);
  return {
    [self](caf::spawn_atom, const task_id& parent,
           std::vector<std::string>& payloads,
           task_retry retry) -> caf::result<std::vector<std::string>> {
      if (auto err = validate_retry(retry))
        return err;
      auto& tasks = self->state.tasks;
      auto i = tasks.find(parent);
      if (i == tasks.end())
        return unknown(parent);
      if (i->second.state == task_state::completed)
        return make_error(errc::conflict,
                          "task " + parent.to_string()
                            + " is completed; a completed task takes no "
                              "subtasks");
      if (payloads.empty())
        return make_error(errc::invalid_argument,
                          "payloads: at least one subtask is needed");
      if (payloads.size() > max_spawn)
        return make_error(errc::too_large,
                          "payloads: at most " + std::to_string(max_spawn)
                            + " subtasks per request");
      auto rp = self->make_response_promise<std::vector<std::string>>();
      auto count = static_cast<uint64_t>(payloads.size());
      ++self->state.spawning;
      self
        ->request(self->state.ids, self->state.timeout, next_atom::value,
                  parent.to_string(), count)
        .then(
          [self, rp, parent, retry,
           payloads = std::move(payloads)](id_range& range) mutable {
            auto& st = self->state;
            --st.spawning;
            auto& all = st.tasks;
            auto p = all.find(parent);
            // The parent may have completed while the IDs were on their way;
            // the values are then skipped (gaps are allowed, reuse is not).
            if (p == all.end() || p->second.state == task_state::completed) {
              rp.deliver(make_error(errc::conflict,
                                    "task " + parent.to_string()
                                      + " completed while its subtasks were "
                                        "being created"));
              settle(self);
              return;
            }
            auto was_executable = executable(p->second);
            std::vector<std::string> out;
            std::vector<task_id> ready;
            sql_write write;
            out.reserve(payloads.size());
            ready.reserve(payloads.size());
            for (uint64_t k = 0; k < range.count; ++k) {
              auto n = range.first + k;
              auto child = parent.child(n);
              if (st.store)
                write.push_back(
                  records::insert_task(child, payloads[k], retry));
              auto& r = all[child];
              r.payload = std::move(payloads[k]);
              r.retry = retry;
              ++st.counts.pending;
              emit(self, "task.created", child, r);
              out.push_back(child.to_string());
              ready.push_back(std::move(child));
              p->second.children.push_back(n); // map inserts keep `p` valid
            }
            p->second.incomplete += range.count;
            if (was_executable)
              self->send(st.scheduler, unready_atom::value, parent);
            self->send(st.scheduler, ready_atom::value, std::move(ready));
            after_commit(self, std::move(write),
                         [rp, out = std::move(out)](
                           const caf::error& err) mutable {
                           if (err)
                             rp.deliver(err);
                           else
                             rp.deliver(std::move(out));
                         });
          },
          [self, rp](caf::error& err) mutable {
            --self->state.spawning;
            rp.deliver(std::move(err));
            settle(self);
          });
      return rp;
    },
    [self](claim_atom, const task_id& id,
           std::string& worker) -> caf::result<task_claim> {
      auto& st = self->state;
      auto i = st.tasks.find(id);
      if (i == st.tasks.end() || !executable(i->second))
        return task_claim{};
      set_state(st, i->second, task_state::running);
      i->second.worker = std::move(worker);
      ++i->second.attempts;
      emit(self, "task.claimed", id, i->second);
      return reply_after_commit(self, stored_state(st, id, i->second),
                                task_claim{true, info_of(id, i->second)});
    },
    [self](complete_atom, const task_id& id,
           std::string& result) -> caf::result<task_info> {
      auto& st = self->state;
      auto i = st.tasks.find(id);
      if (i == st.tasks.end())
        return unknown(id);
      if (i->second.state != task_state::running)
        return wrong_state(id, i->second, "running");
      set_state(st, i->second, task_state::completed);
      i->second.outcome = std::move(result);
      emit(self, "task.completed", id, i->second);
      if (auto parent = id.parent()) {
        auto p = st.tasks.find(*parent);
        if (p != st.tasks.end() && p->second.incomplete > 0) {
          --p->second.incomplete;
          announce_if_executable(self, *parent, p->second);
        }
      }
      return reply_after_commit(self, stored_state(st, id, i->second),
                                info_of(id, i->second));
    },
    [self](fail_atom, const task_id& id,
           std::string& reason) -> caf::result<task_info> {
      auto& st = self->state;
      auto i = st.tasks.find(id);
      if (i == st.tasks.end())
        return unknown(id);
      if (i->second.state != task_state::running)
        return wrong_state(id, i->second, "running");
      auto write = end_attempt(self, id, i->second, task_state::failed,
                               std::move(reason), "task.failed");
      return reply_after_commit(self, std::move(write),
                                info_of(id, i->second));
    },
    [self](requeue_atom, const task_id& id) -> caf::result<task_info> {
      auto& st = self->state;
      auto i = st.tasks.find(id);
      if (i == st.tasks.end())
        return unknown(id);
      if (i->second.state != task_state::stale
          && i->second.state != task_state::failed)
        return wrong_state(id, i->second, "stale or failed");
      set_state(st, i->second, task_state::pending);
      i->second.outcome.clear();
      emit(self, "task.requeued", id, i->second);
      announce_if_executable(self, id, i->second);
      return reply_after_commit(self, stored_state(st, id, i->second),
                                info_of(id, i->second));
    },
    [self](stale_atom, const task_id& id,
           const std::string& worker) -> caf::result<task_info> {
      return make_stale(self, id, worker, std::string{});
    },
    [self](stale_atom, const task_id& id, const std::string& worker,
           std::string& outcome) -> caf::result<task_info> {
      return make_stale(self, id, worker, std::move(outcome));
    },
    [self](caf::get_atom) -> caf::result<task_tree> {
      auto& st = self->state;
      task_tree out;
      out.orchestration = st.root.to_string();
      out.tasks.reserve(st.tasks.size());
      for (auto& [id, r] : st.tasks)
        out.tasks.push_back(info_of(id, r));
      return reply_after_commit(self, sql_write{}, std::move(out));
    },
    [self](caf::get_atom, task_atom,
           const task_id& id) -> caf::result<task_info> {
      auto& tasks = self->state.tasks;
      auto i = tasks.find(id);
      if (i == tasks.end())
        return unknown(id);
      return reply_after_commit(self, sql_write{}, info_of(id, i->second));
    },
    [self](stats_atom) -> caf::result<task_counts> {
      auto out = self->state.counts;
      out.resident = 1;
      return out;
    },
    [self](retire_atom) {
      // Every request the scheduler routed here before it is answered (or
      // waits for its commit); it stops once nothing is in flight.
      self->state.retiring = true;
      settle(self);
    },
    [self](retry_atom, const task_id& id) {
      // The backoff is over: the task is due (what is stored says so
      // already: its retry time has passed).
      auto i = self->state.tasks.find(id);
      if (i == self->state.tasks.end()
          || i->second.state != task_state::pending
          || i->second.retry_at_ms == 0)
        return;
      if (i->second.retry_at_ms > unix_time_ms()) {
        schedule_retry(self, id, i->second); // an early timer
        return;
      }
      i->second.retry_at_ms = 0;
      announce_if_executable(self, id, i->second);
    },
  };
}

} // namespace spindle
