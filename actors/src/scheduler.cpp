#include "spindle/actors/scheduler.hpp"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "spindle/actors/orchestrator.hpp"
#include "spindle/actors/task_records.hpp"
#include "spindle/messages/clock.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/threads.hpp"

namespace spindle {

namespace {

using worker_record = scheduler_state::worker_record;

// What went wrong, without the code's name when it is spindle's own
// storage failure (the caller's message names it once).
std::string reason_of(const caf::error& err) {
  if (is_storage_error(err) && err.context().match_elements<std::string>())
    return err.context().get_as<std::string>(0);
  return describe(err);
}

using resident_continuation
  = std::function<void(caf::expected<orchestrator_actor>)>;

void load(scheduler_pointer self, uint64_t ordinal);

caf::error no_orchestration(uint64_t ordinal) {
  return make_error(errc::not_found,
                    "orchestration " + task_id{ordinal, {}}.to_string()
                      + " does not exist");
}

// Stored, not in memory now, and on its way back (retiring, being loaded,
// or to be loaded after a failed write): a request for it waits.
bool coming_back(const scheduler_state& st, uint64_t ordinal) {
  return st.store
         && (st.retiring.count(ordinal) > 0 || st.loading.count(ordinal) > 0
             || st.unloaded.count(ordinal) > 0);
}

// Calls `next` with the orchestrator of `ordinal` once it is in memory: at
// once, or once it is loaded from the store (an orchestration that retired,
// or whose orchestrator stopped after a failed write), after one retiring
// now has stopped with everything it wrote committed.
void with_resident(scheduler_pointer self, uint64_t ordinal,
                   resident_continuation next) {
  auto& st = self->state;
  if (auto i = st.orchestrators.find(ordinal); i != st.orchestrators.end()) {
    next(i->second);
    return;
  }
  if (!st.store || st.creating.count(ordinal) > 0) {
    next(no_orchestration(ordinal));
    return;
  }
  st.awaiting[ordinal].push_back(std::move(next));
  if (st.retiring.count(ordinal) == 0 && st.loading.insert(ordinal).second)
    load(self, ordinal);
}

// Parses a task ID from outside, then calls `f(id, orchestrator, rp)` once
// its orchestration is in memory; `f` answers through `rp`.
template <class T, class F>
caf::result<T> with_orchestration(scheduler_pointer self,
                                  const std::string& text, F f) {
  auto id = task_id::parse(text);
  if (!id)
    return id.error();
  auto rp = self->make_response_promise<T>();
  auto& st = self->state;
  if (auto i = st.orchestrators.find(id->orchestration);
      i != st.orchestrators.end()) {
    f(std::move(*id), i->second, rp);
    return rp;
  }
  with_resident(self, id->orchestration,
                [rp, id = *id, f](caf::expected<orchestrator_actor> h) mutable {
                  if (!h)
                    rp.deliver(h.error());
                  else
                    f(std::move(id), *h, rp);
                });
  return rp;
}

// Sets the lease expiry of `t` when a lease holds it (orchestrators do
// not know leases; the scheduler keeps them).
void add_lease(scheduler_pointer self, task_info& t) {
  if (t.state != task_state::running)
    return;
  auto id = task_id::parse(t.id);
  if (!id)
    return;
  auto& st = self->state;
  auto token = st.lease_of.find(*id);
  if (token == st.lease_of.end())
    return;
  if (auto lease = st.leases.find(token->second); lease != st.leases.end())
    t.lease_expires_ms = lease->second.expires_ms;
}

void track(scheduler_pointer self, const task_id& id,
           const std::string& worker) {
  self->state.running[id] = worker;
  self->state.workers[worker].running.insert(id);
}

void drop_lease(scheduler_pointer self, const task_id& id);

void untrack(scheduler_pointer self, const task_id& id) {
  auto& st = self->state;
  // The task is no longer running: its lease ends with it.
  drop_lease(self, id);
  auto i = st.running.find(id);
  if (i == st.running.end())
    return;
  auto w = st.workers.find(i->second);
  if (w != st.workers.end())
    w->second.running.erase(id);
  st.running.erase(i);
}

void mark_stale(scheduler_pointer self, const std::string& worker,
                std::function<void(std::vector<std::string>)> done);

// -- leases ------------------------------------------------------------------------

using lease_record = scheduler_state::lease_record;

int64_t wall_ms_after(std::chrono::milliseconds d) {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()
                                     + d)
    .count();
}

// Arms the lease timer for `at` (replacing the one armed: only the latest
// counts).
void start_lease_timer(scheduler_pointer self,
                       std::chrono::steady_clock::time_point at) {
  auto& st = self->state;
  st.lease_timer_at = at;
  auto left = std::max(at - std::chrono::steady_clock::now(),
                       std::chrono::steady_clock::duration::zero());
  self->delayed_send(self,
                     std::chrono::duration_cast<std::chrono::microseconds>(left)
                       + std::chrono::microseconds{1},
                     lease_atom::value, ++st.lease_timer);
}

// (Re)sets lease `token` to expire `length` from now; the one timer is
// armed again only if this lease now expires first.
void arm(scheduler_pointer self, const std::string& token, lease_record& l,
         std::chrono::milliseconds length) {
  auto& st = self->state;
  st.lease_deadlines.erase({l.expires, token});
  l.expires = std::chrono::steady_clock::now() + length;
  l.expires_ms = wall_ms_after(length);
  st.lease_deadlines.emplace(l.expires, token);
  if (l.expires < st.lease_timer_at)
    start_lease_timer(self, l.expires);
}

void drop_lease(scheduler_pointer self, const task_id& id) {
  auto& st = self->state;
  auto i = st.lease_of.find(id);
  if (i == st.lease_of.end())
    return;
  if (auto l = st.leases.find(i->second); l != st.leases.end()) {
    st.lease_deadlines.erase({l->second.expires, i->second});
    st.leases.erase(l);
  }
  st.lease_of.erase(i);
}

// Lease `token` expired: it is dropped (a late call is lease_lost from now
// on) and its task loses its worker at its orchestrator.
void expire_lease(scheduler_pointer self, const std::string& token) {
  auto& st = self->state;
  auto i = st.leases.find(token);
  if (i == st.leases.end())
    return;
  auto l = i->second;
  untrack(self, l.task);
  auto orch = st.orchestrators.find(l.task.orchestration);
  if (orch == st.orchestrators.end())
    return;
  auto why = "{\"lease_expired_at\":" + std::to_string(l.expires_ms)
             + ",\"worker\":" + nlohmann::json(l.worker).dump() + "}";
  self
    ->request(orch->second, st.options.timeout, stale_atom::value, l.task,
              l.worker, std::move(why))
    .then([](task_info&) {},
          [task = l.task](caf::error& err) {
            spdlog::warn("task {}: its lease expired but it could not be "
                         "made stale: {}",
                         task.to_string(), describe(err));
          });
}

// A fresh lease on `id` for `worker`; a lease the task held before (an
// earlier claim) is taken over.
std::string grant_lease(scheduler_pointer self, const task_id& id,
                        const std::string& worker, uint64_t ms,
                        int64_t& expires_ms) {
  auto& st = self->state;
  drop_lease(self, id);
  auto token = make_uuid_v4();
  token.erase(std::remove(token.begin(), token.end(), '-'), token.end());
  auto& l = st.leases[token];
  l.task = id;
  l.worker = worker;
  arm(self, token, l, std::chrono::milliseconds{ms});
  st.lease_of[id] = token;
  expires_ms = l.expires_ms;
  return token;
}

caf::error lease_lost(const task_id& id, const std::string& why) {
  return make_error(errc::lease_lost,
                    "task " + id.to_string() + ": " + why);
}

// The live lease `token` of task `id`, or why the caller does not hold it.
// An empty token is the caller of a task that no lease holds.
caf::expected<lease_record*> held(scheduler_pointer self, const task_id& id,
                                  const std::string& token) {
  auto& st = self->state;
  if (token.empty()) {
    if (st.lease_of.count(id) > 0)
      return lease_lost(id, "it is held under a lease; pass its token as "
                            "'lease'");
    return static_cast<lease_record*>(nullptr);
  }
  auto i = st.leases.find(token);
  if (i == st.leases.end() || !(i->second.task == id))
    return lease_lost(id, "the lease expired, was taken over by a later "
                          "claim, or was never issued for it");
  if (i->second.expires <= std::chrono::steady_clock::now())
    return lease_lost(id, "the lease expired");
  return &i->second;
}

using claim_waiter = scheduler_state::claim_waiter;

// A waiting claim that found nothing after all: it waits on (first in
// line, where it was), or is answered empty once its time is up.
void wait_again(scheduler_pointer self, claim_waiter w) {
  if (std::chrono::steady_clock::now() >= w.deadline) {
    w.promise.deliver(task_claim{});
    return;
  }
  self->state.waiting_claims.push_front(std::move(w));
}

// Takes the first executable task and asks its orchestrator to hand it to
// `worker`; moves on when the orchestrator refuses. A waiting claim
// (`waiter`) that finds nothing waits again instead of being answered.
void try_claim(scheduler_pointer self, std::string worker,
               caf::typed_response_promise<task_claim> rp,
               uint64_t lease_ms = 0,
               std::optional<claim_waiter> waiter = std::nullopt) {
  auto& st = self->state;
  while (!st.executable.empty()) {
    auto node = st.executable.extract(st.executable.begin());
    auto id = std::move(node.value().id);
    auto orch = st.orchestrators.find(id.orchestration);
    if (orch == st.orchestrators.end()) {
      auto o = id.orchestration;
      if (!coming_back(st, o))
        continue;
      // Its orchestrator is retiring (a requeue made it unfinished again)
      // or being loaded: the claim waits for it.
      st.executable.insert(d1_key{std::move(id)});
      with_resident(self, o,
                    [self, worker, rp, lease_ms,
                     waiter](caf::expected<orchestrator_actor> h) mutable {
                      if (!h) {
                        rp.deliver(h.error());
                        return;
                      }
                      try_claim(self, std::move(worker), std::move(rp),
                                lease_ms, std::move(waiter));
                    });
      return;
    }
    self->request(orch->second, st.options.timeout, claim_atom::value, id, worker)
      .then(
        [self, worker, rp, id, lease_ms, waiter](task_claim& claim) mutable {
          if (!claim.claimed) {
            // No longer executable; the orchestrator announces it again
            // once it is.
            try_claim(self, std::move(worker), std::move(rp), lease_ms,
                      std::move(waiter));
            return;
          }
          track(self, id, worker);
          if (lease_ms > 0)
            claim.lease = grant_lease(self, id, worker, lease_ms,
                                      claim.lease_expires_ms);
          rp.deliver(std::move(claim));
          // The worker died while its claim was on the way: the task must
          // not stay running for nobody.
          if (self->state.workers[worker].gone)
            mark_stale(self, worker, [](std::vector<std::string>) {});
        },
        [self, worker, rp, lease_ms, waiter](caf::error& err) mutable {
          // The claim may not have been stored: say so rather than hand
          // out the next task (the orchestrator is loaded again and its
          // executable tasks return to the index).
          if (is_storage_error(err) || classify(err) == errc::timeout) {
            rp.deliver(std::move(err));
            return;
          }
          // The orchestrator is gone: take the next task.
          try_claim(self, std::move(worker), std::move(rp), lease_ms,
                    std::move(waiter));
        });
    return;
  }
  if (waiter)
    wait_again(self, std::move(*waiter));
  else
    rp.deliver(task_claim{});
}

// Hands executable tasks to waiting claims, first come first served: each
// takes one entry of the index at once, so as many are served as there are
// tasks.
void serve_waiting_claims(scheduler_pointer self) {
  auto& st = self->state;
  while (!st.waiting_claims.empty() && !st.executable.empty()) {
    auto w = std::move(st.waiting_claims.front());
    st.waiting_claims.pop_front();
    auto worker = w.worker;
    auto rp = w.promise;
    auto lease_ms = w.lease_ms;
    try_claim(self, std::move(worker), std::move(rp), lease_ms, std::move(w));
  }
}

// Marks every running task of `worker` stale at its orchestrator. Calls
// `done` with the IDs that did become stale once every orchestrator
// answered.
void mark_stale(scheduler_pointer self, const std::string& worker,
                std::function<void(std::vector<std::string>)> done) {
  auto& st = self->state;
  auto w = st.workers.find(worker);
  std::vector<task_id> ids;
  if (w != st.workers.end()) {
    ids.assign(w->second.running.begin(), w->second.running.end());
    for (auto& id : ids) {
      st.running.erase(id);
      drop_lease(self, id);
    }
    w->second.running.clear();
  }
  struct pending_answers {
    size_t left;
    std::vector<std::string> stale;
    std::function<void(std::vector<std::string>)> done;
  };
  auto answers = std::make_shared<pending_answers>(
    pending_answers{ids.size(), {}, std::move(done)});
  if (ids.empty()) {
    answers->done({});
    return;
  }
  auto finish_one = [answers] {
    if (--answers->left == 0) {
      std::sort(answers->stale.begin(), answers->stale.end(),
                [](const std::string& x, const std::string& y) {
                  return *task_id::parse(x) < *task_id::parse(y);
                });
      answers->done(std::move(answers->stale));
    }
  };
  for (auto& id : ids) {
    auto orch = st.orchestrators.find(id.orchestration);
    if (orch == st.orchestrators.end()) {
      finish_one();
      continue;
    }
    self->request(orch->second, st.options.timeout, stale_atom::value, id, worker)
      .then(
        [answers, finish_one, worker](task_info& info) {
          if (info.state == task_state::stale && info.worker == worker)
            answers->stale.push_back(std::move(info.id));
          finish_one();
        },
        [finish_one](caf::error&) { finish_one(); });
  }
}

// Completes or fails `task` for the holder of lease `token` (none: a task
// no lease holds). The lease is checked and set aside first, so its expiry
// cannot make the task stale meanwhile; if the orchestrator refuses, it
// holds again.
template <class Atom>
caf::result<task_info> finish(scheduler_pointer self, Atom atom,
                              const std::string& task, std::string text,
                              const std::string& token) {
  return with_orchestration<task_info>(
    self, task,
    [self, atom, text = std::move(text),
     token](task_id id, orchestrator_actor orch,
            caf::typed_response_promise<task_info>& rp) mutable {
      auto lease = held(self, id, token);
      if (!lease) {
        rp.deliver(lease.error());
        return;
      }
      std::optional<lease_record> kept;
      if (*lease) {
        kept = **lease;
        drop_lease(self, id);
      }
      self
        ->request(orch, self->state.options.timeout, atom, id,
                  std::move(text))
        .then(
          [self, rp, id](task_info& info) mutable {
            untrack(self, id);
            rp.deliver(std::move(info));
          },
          [self, rp, id, token, kept](caf::error& err) mutable {
            auto& st = self->state;
            if (kept && st.lease_of.count(id) == 0) {
              auto& l = st.leases[token];
              l = *kept;
              st.lease_of[id] = token;
              auto left
                = std::chrono::duration_cast<std::chrono::milliseconds>(
                  l.expires - std::chrono::steady_clock::now());
              arm(self, token, l,
                  std::max(left, std::chrono::milliseconds{1}));
            }
            rp.deliver(std::move(err));
          });
    });
}

caf::result<std::vector<std::string>>
spawn_under(scheduler_pointer self, const std::string& parent,
            std::vector<std::string> payloads, task_retry retry) {
  return with_orchestration<std::vector<std::string>>(
    self, parent,
    [payloads = std::move(payloads),
     retry](task_id id, orchestrator_actor orch,
            caf::typed_response_promise<std::vector<std::string>>& rp) mutable {
      rp.delegate(orch, caf::spawn_atom::value, std::move(id),
                  std::move(payloads), retry);
    });
}

// Spawns the orchestrator of `orch` and puts its executable tasks into the
// index; running tasks are tracked for their workers.
orchestrator_actor adopt(scheduler_pointer self,
                         records::stored_orchestration orch) {
  auto& st = self->state;
  auto ordinal = orch.root.orchestration;
  for (auto& id : records::executable_tasks(orch, unix_time_ms()))
    st.executable.insert(d1_key{std::move(id)});
  std::set<std::string> gone;
  for (auto& t : orch.tasks)
    if (t.state == task_state::running) {
      track(self, t.id, t.worker);
      if (st.workers[t.worker].gone)
        gone.insert(t.worker);
    }
  auto handle = self->spawn(orchestrator, std::move(orch),
                            caf::actor_cast<scheduler_actor>(self), st.ids,
                            st.store, st.options.timeout, st.options.events,
                            st.options.tenant);
  self->monitor(handle);
  st.orchestrators.emplace(ordinal, handle);
  st.orchestrator_of.emplace(handle.address(), ordinal);
  // A worker that went down while its orchestration was not loaded.
  for (auto& worker : gone)
    mark_stale(self, worker, [](std::vector<std::string>) {});
  serve_waiting_claims(self);
  return handle;
}

// Loads orchestration `ordinal` from what committed and answers the
// requests waiting for it. A failed load answers them with the error; the
// next request tries again.
void load(scheduler_pointer self, uint64_t ordinal) {
  auto& st = self->state;
  task_id root{ordinal, {}};
  auto answer = [self, ordinal](caf::expected<orchestrator_actor> x) {
    auto& s = self->state;
    s.loading.erase(ordinal);
    auto i = s.awaiting.find(ordinal);
    if (i == s.awaiting.end())
      return;
    auto waiters = std::move(i->second);
    s.awaiting.erase(i);
    for (auto& w : waiters)
      w(x);
  };
  auto failed = [answer, root](const caf::error& err) {
    spdlog::error("orchestration {}: cannot be loaded from the state store "
                  "({}); it is tried again on its next request",
                  root.to_string(), describe(err));
    answer(make_storage_error(err, "orchestration " + root.to_string()
                                     + " cannot be loaded from the state "
                                       "store: "
                                     + reason_of(err)));
  };
  self
    ->request(st.store, st.options.timeout, load_atom::value,
              records::load_orchestration(root, st.options.tenant))
    .then(
      [self, ordinal, answer, failed](sql_rows& rows) {
        auto stored = records::decode_tasks(rows);
        if (!stored) {
          failed(stored.error());
          return;
        }
        auto& s = self->state;
        if (auto i = s.orchestrators.find(ordinal);
            i != s.orchestrators.end()) {
          answer(i->second);
          return;
        }
        if (stored->empty() && s.unloaded.count(ordinal) == 0) {
          answer(no_orchestration(ordinal));
          return;
        }
        if (stored->size() != 1
            || stored->front().root.orchestration != ordinal) {
          failed(make_error(errc::storage_failure,
                            "the store holds no such orchestration"));
          return;
        }
        if (s.unloaded.erase(ordinal) == 0) {
          // It retired finished: counted there until its orchestrator
          // counts it again.
          s.retired_counts -= records::count_states(stored->front());
        } else {
          spdlog::debug("orchestration {}: loaded again from the state store",
                       task_id{ordinal, {}}.to_string());
        }
        answer(adopt(self, std::move(stored->front())));
      },
      [failed](caf::error& err) { failed(err); });
}

// Loads `ordinal` now, whether or not a request waits: its executable
// tasks must return to the index.
void load_now(scheduler_pointer self, uint64_t ordinal) {
  with_resident(self, ordinal, [](caf::expected<orchestrator_actor>) {});
}

// The scheduler cannot start from what the store holds.
void restore_failed(scheduler_pointer self, const caf::error& err) {
  auto e = make_error(errc::storage_failure,
                      "stored orchestrations cannot be loaded: "
                        + reason_of(err));
  spdlog::error("{}", describe(e));
  self->quit(e);
}

void restore_all(scheduler_pointer self,
                 std::vector<records::stored_orchestration>& all,
                 const std::vector<std::string>& made_stale) {
  size_t tasks = 0, resident = 0;
  for (auto& orch : all) {
    tasks += orch.tasks.size();
    if (records::finished(orch)) {
      // Finished: it stays in the store until a request asks for it.
      self->state.retired_counts += records::count_states(orch);
      continue;
    }
    ++resident;
    adopt(self, std::move(orch));
  }
  if (!all.empty())
    spdlog::info("orchestration: restored {} orchestrations with {} tasks "
                 "from the state store, {} of them unfinished and in memory",
                 all.size(), tasks, resident);
  if (made_stale.empty())
    return;
  // Name a few; the tree and the task list show every one.
  std::string named;
  for (size_t i = 0; i < made_stale.size() && i < 10; ++i)
    named += (i == 0 ? "" : ", ") + made_stale[i];
  if (made_stale.size() > 10)
    named += ", ...";
  spdlog::warn("orchestration: {} tasks were running under the previous "
               "process and are now stale, or pending again when they have "
               "attempts left (their workers are gone): {}",
               made_stale.size(), named);
}

// Loads every stored orchestration before the scheduler serves anything
// (`await` holds the other messages). Running tasks lost their workers with
// the previous process: they become stale, in the store first.
void restore(scheduler_pointer self) {
  auto& st = self->state;
  self
    ->request(st.store, st.options.timeout, load_atom::value,
              records::load_tasks(self->state.options.tenant))
    .await(
      [self](sql_rows& rows) {
        auto stored = records::decode_tasks(rows);
        if (!stored) {
          restore_failed(self, stored.error());
          return;
        }
        auto all = std::make_shared<std::vector<records::stored_orchestration>>(
          std::move(*stored));
        std::vector<std::string> running;
        for (auto& orch : *all)
          for (auto& t : orch.tasks)
            if (t.state == task_state::running)
              running.push_back(t.id.to_string());
        if (running.empty()) {
          restore_all(self, *all, running);
          return;
        }
        // Each loses its attempt: retried when it has attempts left.
        auto now = unix_time_ms();
        sql_write write;
        for (auto& orch : *all)
          for (auto& t : orch.tasks)
            if (t.state == task_state::running) {
              records::lose_worker(t, {}, now);
              write.push_back(records::update_task(t));
            }
        auto& s = self->state;
        self
          ->request(s.store, s.options.timeout, store_atom::value,
                    std::move(write))
          .await(
            [self, all, running](uint64_t) {
              restore_all(self, *all, running);
            },
            [self](caf::error& err) { restore_failed(self, err); });
      },
      [self](caf::error& err) { restore_failed(self, err); });
}

} // namespace

scheduler_actor::behavior_type scheduler(scheduler_pointer self,
                                         id_allocator_actor ids,
                                         storage_actor store,
                                         scheduler_options options) {
  self->state.ids = std::move(ids);
  self->state.store = std::move(store);
  self->state.options = options;
  // Orchestrators are monitored, not linked: one failing orchestration must
  // not take the others down. On exit the scheduler takes them along.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    for (auto& [ordinal, orch] : self->state.orchestrators)
      self->send_exit(orch, msg.reason);
    for (auto& [ordinal, leaving] : self->state.retiring)
      self->send_exit(leaving.actor, msg.reason);
    self->quit(msg.reason);
  });
  self->set_down_handler([self](caf::down_msg& msg) {
    auto& st = self->state;
    if (auto o = st.orchestrator_of.find(msg.source);
        o != st.orchestrator_of.end()) {
      auto ordinal = o->second;
      st.orchestrator_of.erase(o);
      st.orchestrators.erase(ordinal);
      for (auto i = st.executable.begin(); i != st.executable.end();)
        i = i->id.orchestration == ordinal ? st.executable.erase(i) : ++i;
      for (auto i = st.running.begin(); i != st.running.end();) {
        if (i->first.orchestration == ordinal) {
          st.workers[i->second].running.erase(i->first);
          i = st.running.erase(i);
        } else {
          ++i;
        }
      }
      // It stopped after a failed write: what committed is its state.
      if (st.store) {
        st.unloaded.insert(ordinal);
        load_now(self, ordinal);
      }
      return;
    }
    for (auto& [ordinal, leaving] : st.retiring) {
      if (leaving.actor.address() != msg.source)
        continue;
      // Stopped while retiring without reporting back: a write failed.
      // (A clean stop reported `retired` first.)
      if (msg.reason) {
        auto o = ordinal;
        st.retired_counts -= leaving.counted;
        st.retiring.erase(o);
        st.unloaded.insert(o);
        load_now(self, o);
      }
      return;
    }
    auto w = st.watched.find(msg.source);
    if (w == st.watched.end())
      return;
    auto names = std::move(w->second);
    st.watched.erase(w);
    for (auto& name : names) {
      auto rec = st.workers.find(name);
      if (rec != st.workers.end() && rec->second.actor == msg.source) {
        rec->second.actor = caf::actor_addr{};
        rec->second.gone = true;
      }
      mark_stale(self, name, [](std::vector<std::string>) {});
    }
  });
  if (self->state.store)
    restore(self);
  return {
    [self](orchestrate_atom,
           std::string& payload) -> caf::result<std::string> {
      return self->delegate(caf::actor_cast<scheduler_actor>(self),
                            orchestrate_atom::value, std::move(payload),
                            task_retry{});
    },
    [self](orchestrate_atom, std::string& payload,
           task_retry retry) -> caf::result<std::string> {
      if (auto err = validate_retry(retry))
        return err;
      auto rp = self->make_response_promise<std::string>();
      self
        ->request(self->state.ids, self->state.options.timeout,
                  next_atom::value,
                  std::string{counter_keys::orchestration}, uint64_t{1})
        .then(
          [self, rp, retry,
           payload = std::move(payload)](id_range& range) mutable {
            task_id root{range.first, {}};
            auto& st = self->state;
            std::vector<event> created;
            if (st.options.events) {
              task_info t;
              t.id = root.to_string();
              t.max_attempts = retry.max_attempts;
              created.push_back(task_event("task.created", t));
              created.back().tenant = st.options.tenant;
            }
            if (!st.store) {
              if (st.options.events)
                st.options.events->publish(std::move(created));
              adopt(self, records::new_orchestration(root, std::move(payload),
                                                     retry));
              rp.deliver(root.to_string());
              return;
            }
            // The orchestration exists once its row committed; a failed
            // write skips the ID (gaps are allowed, reuse is not). Until
            // then a request for it finds nothing, even if the row has
            // committed: its orchestrator is spawned here, once.
            auto write = sql_write{records::insert_task(root, payload, retry,
                                                        st.options.tenant)};
            st.creating.insert(root.orchestration);
            self
              ->request(st.store, st.options.timeout, store_atom::value,
                        std::move(write),
                        publish_on_commit(st.options.events,
                                          std::move(created)))
              .then(
                [self, rp, root, retry,
                 payload = std::move(payload)](uint64_t) mutable {
                  self->state.creating.erase(root.orchestration);
                  adopt(self, records::new_orchestration(
                                root, std::move(payload), retry));
                  rp.deliver(root.to_string());
                },
                [self, rp, root](caf::error& err) mutable {
                  self->state.creating.erase(root.orchestration);
                  rp.deliver(make_storage_error(
                    err, "orchestration " + root.to_string()
                           + " was not stored: " + reason_of(err)));
                });
          },
          [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
      return rp;
    },
    [self](caf::spawn_atom, const std::string& parent,
           std::vector<std::string>& payloads)
      -> caf::result<std::vector<std::string>> {
      return spawn_under(self, parent, std::move(payloads), task_retry{});
    },
    [self](caf::spawn_atom, const std::string& parent,
           std::vector<std::string>& payloads,
           task_retry retry) -> caf::result<std::vector<std::string>> {
      return spawn_under(self, parent, std::move(payloads), retry);
    },
    [self](claim_atom, std::string& worker) -> caf::result<task_claim> {
      if (auto err = validate_worker_name(worker))
        return err;
      auto rp = self->make_response_promise<task_claim>();
      try_claim(self, std::move(worker), rp);
      return rp;
    },
    [self](claim_atom, std::string& worker,
           uint64_t lease_ms) -> caf::result<task_claim> {
      if (auto err = validate_worker_name(worker))
        return err;
      if (auto err = validate_lease_ms(lease_ms))
        return err;
      auto rp = self->make_response_promise<task_claim>();
      try_claim(self, std::move(worker), rp, lease_ms);
      return rp;
    },
    [self](claim_atom, std::string& worker, uint64_t lease_ms,
           uint64_t wait_ms) -> caf::result<task_claim> {
      if (auto err = validate_worker_name(worker))
        return err;
      if (lease_ms != 0)
        if (auto err = validate_lease_ms(lease_ms))
          return err;
      if (wait_ms > max_claim_wait_ms)
        return make_error(errc::invalid_argument,
                          "a claim waits at most 60 seconds");
      auto& st = self->state;
      auto rp = self->make_response_promise<task_claim>();
      if (wait_ms == 0) {
        try_claim(self, std::move(worker), rp, lease_ms);
        return rp;
      }
      claim_waiter w{++st.next_waiter, worker, lease_ms, rp,
                     std::chrono::steady_clock::now()
                       + std::chrono::milliseconds{wait_ms}};
      self->delayed_send(self, std::chrono::milliseconds{wait_ms},
                         claim_wait_atom::value, w.id);
      // In line behind earlier claims; served at once if tasks wait.
      st.waiting_claims.push_back(std::move(w));
      serve_waiting_claims(self);
      return rp;
    },
    [self](claim_wait_atom, uint64_t id) {
      // The time of waiting claim `id` is up: answered empty, unless it
      // is being served right now (then it is answered by that claim).
      auto& waiting = self->state.waiting_claims;
      auto i = std::find_if(waiting.begin(), waiting.end(),
                            [id](const claim_waiter& w) { return w.id == id; });
      if (i == waiting.end())
        return;
      i->promise.deliver(task_claim{});
      waiting.erase(i);
    },
    [self](heartbeat_atom, const std::string& task, const std::string& token,
           uint64_t lease_ms) -> caf::result<task_claim> {
      if (auto err = validate_lease_ms(lease_ms))
        return err;
      return with_orchestration<task_claim>(
        self, task,
        [self, token, lease_ms](task_id id, orchestrator_actor orch,
                                caf::typed_response_promise<task_claim>& rp) {
          if (token.empty()) {
            rp.deliver(lease_lost(id, "a heartbeat names its lease"));
            return;
          }
          auto lease = held(self, id, token);
          if (!lease) {
            rp.deliver(lease.error());
            return;
          }
          if (!*lease) {
            rp.deliver(lease_lost(id, "no lease holds it"));
            return;
          }
          arm(self, token, **lease, std::chrono::milliseconds{lease_ms});
          task_claim out{true, {}, token, (*lease)->expires_ms};
          self
            ->request(orch, self->state.options.timeout, caf::get_atom::value,
                      task_atom::value, id)
            .then(
              [rp, out](task_info& info) mutable {
                out.task = std::move(info);
                rp.deliver(std::move(out));
              },
              [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        });
    },
    [self](lease_atom, uint64_t timer) {
      auto& st = self->state;
      if (timer != st.lease_timer)
        return; // a later timer replaced this one
      st.lease_timer_at = std::chrono::steady_clock::time_point::max();
      auto now = std::chrono::steady_clock::now();
      while (!st.lease_deadlines.empty()
             && st.lease_deadlines.begin()->first <= now) {
        auto token = st.lease_deadlines.begin()->second;
        st.lease_deadlines.erase(st.lease_deadlines.begin());
        expire_lease(self, token);
      }
      if (!st.lease_deadlines.empty())
        start_lease_timer(self, st.lease_deadlines.begin()->first);
    },
    [self](complete_atom, const std::string& task,
           std::string& result) -> caf::result<task_info> {
      return finish(self, complete_atom::value, task, std::move(result), "");
    },
    [self](fail_atom, const std::string& task,
           std::string& reason) -> caf::result<task_info> {
      return finish(self, fail_atom::value, task, std::move(reason), "");
    },
    [self](complete_atom, const std::string& task, std::string& result,
           const std::string& token) -> caf::result<task_info> {
      return finish(self, complete_atom::value, task, std::move(result),
                    token);
    },
    [self](fail_atom, const std::string& task, std::string& reason,
           const std::string& token) -> caf::result<task_info> {
      return finish(self, fail_atom::value, task, std::move(reason), token);
    },
    [self](requeue_atom, const std::string& task) -> caf::result<task_info> {
      return with_orchestration<task_info>(
        self, task,
        [](task_id id, orchestrator_actor orch,
           caf::typed_response_promise<task_info>& rp) {
          rp.delegate(orch, requeue_atom::value, std::move(id));
        });
    },
    [self](caf::get_atom,
           const std::string& orchestration) -> caf::result<task_tree> {
      if (auto id = task_id::parse(orchestration);
          id && !id->is_orchestration())
        return make_error(errc::invalid_id,
                          "'" + orchestration
                            + "' is a task, not an orchestration ID");
      return with_orchestration<task_tree>(
        self, orchestration,
        [self](task_id, orchestrator_actor orch,
               caf::typed_response_promise<task_tree>& rp) {
          self
            ->request(orch, self->state.options.timeout, caf::get_atom::value)
            .then(
              [self, rp](task_tree& tree) mutable {
                for (auto& t : tree.tasks)
                  add_lease(self, t);
                rp.deliver(std::move(tree));
              },
              [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        });
    },
    [self](caf::get_atom, task_atom,
           const std::string& task) -> caf::result<task_info> {
      return with_orchestration<task_info>(
        self, task,
        [self](task_id id, orchestrator_actor orch,
               caf::typed_response_promise<task_info>& rp) {
          self
            ->request(orch, self->state.options.timeout, caf::get_atom::value,
                      task_atom::value, std::move(id))
            .then(
              [self, rp](task_info& t) mutable {
                add_lease(self, t);
                rp.deliver(std::move(t));
              },
              [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
        });
    },
    [self](caf::get_atom,
           orchestrate_atom) -> caf::result<std::vector<std::string>> {
      auto& st = self->state;
      if (!st.store) {
        std::set<uint64_t> ordinals;
        for (auto& [ordinal, actor] : st.orchestrators)
          ordinals.insert(ordinal);
        std::vector<std::string> out;
        out.reserve(ordinals.size());
        for (auto ordinal : ordinals)
          out.push_back(task_id{ordinal, {}}.to_string());
        return out;
      }
      // Every orchestration is stored (created only once committed), most
      // of them only there once they finished.
      auto rp = self->make_response_promise<std::vector<std::string>>();
      self
        ->request(st.store, st.options.timeout, load_atom::value,
                  records::list_orchestrations(self->state.options.tenant))
        .then(
          [rp](sql_rows& rows) mutable {
            std::vector<task_id> roots;
            roots.reserve(rows.size());
            for (auto& row : rows)
              if (!row.empty())
                if (auto id = task_id::parse(row[0].text))
                  roots.push_back(std::move(*id));
            std::sort(roots.begin(), roots.end());
            std::vector<std::string> out;
            out.reserve(roots.size());
            for (auto& id : roots)
              out.push_back(id.to_string());
            rp.deliver(std::move(out));
          },
          [rp](caf::error& err) mutable {
            rp.deliver(make_storage_error(
              err, "cannot list the orchestrations: " + reason_of(err)));
          });
      return rp;
    },
    [self](executable_atom, const std::string& orchestration,
           uint64_t limit) -> caf::result<std::vector<std::string>> {
      std::optional<uint64_t> only;
      if (!orchestration.empty()) {
        auto id = task_id::parse(orchestration);
        if (!id)
          return id.error();
        if (!id->is_orchestration())
          return make_error(errc::invalid_id,
                            "'" + orchestration
                              + "' is a task, not an orchestration ID");
        only = id->orchestration;
      }
      std::vector<std::string> out;
      for (auto& key : self->state.executable) {
        if (out.size() >= limit)
          break;
        if (!only || key.id.orchestration == *only)
          out.push_back(key.id.to_string());
      }
      return out;
    },
    [self](attach_atom, std::string& worker,
           caf::actor_addr& actor) -> caf::result<caf::ok_atom> {
      if (auto err = validate_worker_name(worker))
        return err;
      if (!actor)
        return make_error(errc::invalid_argument,
                          "actor: worker '" + worker
                            + "' needs a live actor to attach");
      auto& st = self->state;
      auto& rec = st.workers[worker];
      if (rec.actor && rec.actor != actor) {
        auto old = st.watched.find(rec.actor);
        if (old != st.watched.end())
          old->second.erase(worker);
      }
      rec.actor = actor;
      rec.gone = false;
      auto& names = st.watched[actor];
      if (names.empty())
        self->monitor(actor);
      names.insert(worker);
      return caf::ok_atom::value;
    },
    [self](attach_atom, std::string& worker, int32_t pid,
           uint64_t start_time) -> caf::result<caf::ok_atom> {
      if (auto err = validate_worker_name(worker))
        return err;
      if (pid <= 0)
        return make_error(errc::invalid_argument,
                          "pid: " + std::to_string(pid)
                            + " is not a process ID");
      auto& rec = self->state.workers[worker];
      rec.pid = pid;
      rec.start_time = start_time;
      return caf::ok_atom::value;
    },
    [self](workers_atom) -> caf::result<std::vector<process_worker>> {
      std::vector<process_worker> out;
      for (auto& [name, rec] : self->state.workers)
        if (rec.pid > 0 && !rec.running.empty())
          out.push_back(process_worker{name, rec.pid, rec.start_time});
      return out;
    },
    [self](stale_atom,
           const std::string& worker) -> caf::result<std::vector<std::string>> {
      if (auto err = validate_worker_name(worker))
        return err;
      auto rp = self->make_response_promise<std::vector<std::string>>();
      mark_stale(self, worker, [rp](std::vector<std::string> stale_ids) mutable {
        rp.deliver(std::move(stale_ids));
      });
      return rp;
    },
    [self](stats_atom) -> caf::result<task_counts> {
      auto& st = self->state;
      if (st.orchestrators.empty())
        return st.retired_counts;
      struct tally {
        size_t left;
        task_counts sum;
      };
      auto acc = std::make_shared<tally>(
        tally{st.orchestrators.size(), st.retired_counts});
      auto rp = self->make_response_promise<task_counts>();
      for (auto& [ordinal, orch] : st.orchestrators)
        self->request(orch, st.options.timeout, stats_atom::value)
          .then(
            [acc, rp](task_counts& counts) mutable {
              acc->sum += counts;
              if (--acc->left == 0)
                rp.deliver(acc->sum);
            },
            [acc, rp](caf::error&) mutable {
              // An orchestrator that stopped meanwhile counts as none.
              if (--acc->left == 0)
                rp.deliver(acc->sum);
            });
      return rp;
    },
    [self](orch_idle_atom, uint64_t ordinal, task_counts& counts) {
      // Every task of it is completed or failed and stored: it leaves
      // memory. What was routed to it before `retire` is answered first.
      auto& st = self->state;
      auto i = st.orchestrators.find(ordinal);
      if (!st.store || i == st.orchestrators.end()
          || self->current_sender()
               != caf::actor_cast<caf::strong_actor_ptr>(i->second))
        return;
      auto orch = i->second;
      st.orchestrators.erase(i);
      st.orchestrator_of.erase(orch.address());
      // Counted as retired from now on: `count_tasks` never misses it.
      st.retired_counts += counts;
      st.retiring.emplace(ordinal, scheduler_state::retiree{orch, counts});
      self->send(orch, retire_atom::value);
    },
    [self](retired_atom, uint64_t ordinal, task_counts& counts,
           bool finished) {
      auto& st = self->state;
      auto r = st.retiring.find(ordinal);
      if (r == st.retiring.end())
        return;
      st.retired_counts -= r->second.counted;
      st.retiring.erase(r);
      if (finished) {
        st.retired_counts += counts;
      } else {
        // A requeue came in before `retire`: it has work again.
        st.unloaded.insert(ordinal);
        load_now(self, ordinal);
        return;
      }
      if (st.awaiting.count(ordinal) > 0 && st.loading.insert(ordinal).second)
        load(self, ordinal);
    },
    [self](ready_atom, std::vector<task_id>& ready) {
      auto& index = self->state.executable;
      for (auto& id : ready)
        index.insert(d1_key{std::move(id)});
      serve_waiting_claims(self);
    },
    [self](unready_atom, task_id& id) {
      self->state.executable.erase(d1_key{std::move(id)});
    },
  };
}

} // namespace spindle
