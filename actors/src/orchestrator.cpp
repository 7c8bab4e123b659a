#include "spindle/actors/orchestrator.hpp"

#include <caf/all.hpp>

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

bool executable(const record& r) {
  return r.state == task_state::pending && r.incomplete == 0;
}

// Announces `id` to the scheduler if it just became executable.
void announce_if_executable(orchestrator_pointer self, const task_id& id,
                            const record& r) {
  if (executable(r))
    self->send(self->state.scheduler, ready_atom::value,
               std::vector<task_id>{id});
}

} // namespace

orchestrator_actor::behavior_type
orchestrator(orchestrator_pointer self, task_id root, std::string payload,
             scheduler_actor scheduler, id_allocator_actor ids,
             std::chrono::milliseconds timeout) {
  auto& st = self->state;
  st.root = root;
  st.scheduler = std::move(scheduler);
  st.ids = std::move(ids);
  st.timeout = timeout;
  st.tasks[root].payload = std::move(payload);
  return {
    [self](caf::spawn_atom, const task_id& parent,
           std::vector<std::string>& payloads)
      -> caf::result<std::vector<std::string>> {
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
      self
        ->request(self->state.ids, self->state.timeout, next_atom::value,
                  parent.to_string(), count)
        .then(
          [self, rp, parent,
           payloads = std::move(payloads)](id_range& range) mutable {
            auto& all = self->state.tasks;
            auto p = all.find(parent);
            // The parent may have completed while the IDs were on their way;
            // the values are then skipped (gaps are allowed, reuse is not).
            if (p == all.end() || p->second.state == task_state::completed) {
              rp.deliver(make_error(errc::conflict,
                                    "task " + parent.to_string()
                                      + " completed while its subtasks were "
                                        "being created"));
              return;
            }
            auto was_executable = executable(p->second);
            std::vector<std::string> out;
            std::vector<task_id> ready;
            out.reserve(payloads.size());
            ready.reserve(payloads.size());
            for (uint64_t k = 0; k < range.count; ++k) {
              auto n = range.first + k;
              auto child = parent.child(n);
              auto& r = all[child];
              r.payload = std::move(payloads[k]);
              out.push_back(child.to_string());
              ready.push_back(std::move(child));
              p->second.children.push_back(n); // map inserts keep `p` valid
            }
            p->second.incomplete += range.count;
            if (was_executable)
              self->send(self->state.scheduler, unready_atom::value, parent);
            self->send(self->state.scheduler, ready_atom::value,
                       std::move(ready));
            rp.deliver(std::move(out));
          },
          [rp](caf::error& err) mutable { rp.deliver(std::move(err)); });
      return rp;
    },
    [self](claim_atom, const task_id& id,
           std::string& worker) -> caf::result<task_claim> {
      auto& tasks = self->state.tasks;
      auto i = tasks.find(id);
      if (i == tasks.end() || !executable(i->second))
        return task_claim{};
      i->second.state = task_state::running;
      i->second.worker = std::move(worker);
      return task_claim{true, info_of(id, i->second)};
    },
    [self](complete_atom, const task_id& id,
           std::string& result) -> caf::result<task_info> {
      auto& tasks = self->state.tasks;
      auto i = tasks.find(id);
      if (i == tasks.end())
        return unknown(id);
      if (i->second.state != task_state::running)
        return wrong_state(id, i->second, "running");
      i->second.state = task_state::completed;
      i->second.outcome = std::move(result);
      if (auto parent = id.parent()) {
        auto p = tasks.find(*parent);
        if (p != tasks.end() && p->second.incomplete > 0) {
          --p->second.incomplete;
          announce_if_executable(self, *parent, p->second);
        }
      }
      return info_of(id, i->second);
    },
    [self](fail_atom, const task_id& id,
           std::string& reason) -> caf::result<task_info> {
      auto& tasks = self->state.tasks;
      auto i = tasks.find(id);
      if (i == tasks.end())
        return unknown(id);
      if (i->second.state != task_state::running)
        return wrong_state(id, i->second, "running");
      i->second.state = task_state::failed;
      i->second.outcome = std::move(reason);
      return info_of(id, i->second);
    },
    [self](requeue_atom, const task_id& id) -> caf::result<task_info> {
      auto& tasks = self->state.tasks;
      auto i = tasks.find(id);
      if (i == tasks.end())
        return unknown(id);
      if (i->second.state != task_state::stale
          && i->second.state != task_state::failed)
        return wrong_state(id, i->second, "stale or failed");
      i->second.state = task_state::pending;
      i->second.outcome.clear();
      announce_if_executable(self, id, i->second);
      return info_of(id, i->second);
    },
    [self](stale_atom, const task_id& id,
           const std::string& worker) -> caf::result<task_info> {
      auto& tasks = self->state.tasks;
      auto i = tasks.find(id);
      if (i == tasks.end())
        return unknown(id);
      // Only the worker that holds it can lose it: a completion that beat
      // the news of the worker's death stands.
      if (i->second.state == task_state::running && i->second.worker == worker)
        i->second.state = task_state::stale;
      return info_of(id, i->second);
    },
    [self](caf::get_atom) -> caf::result<task_tree> {
      task_tree out;
      out.orchestration = self->state.root.to_string();
      out.tasks.reserve(self->state.tasks.size());
      for (auto& [id, r] : self->state.tasks)
        out.tasks.push_back(info_of(id, r));
      return out;
    },
    [self](caf::get_atom, task_atom,
           const task_id& id) -> caf::result<task_info> {
      auto& tasks = self->state.tasks;
      auto i = tasks.find(id);
      if (i == tasks.end())
        return unknown(id);
      return info_of(id, i->second);
    },
  };
}

} // namespace spindle
