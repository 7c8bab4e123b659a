#include "spindle/actors/thread_registry.hpp"

#include <algorithm>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/actors/records.hpp"
#include "spindle/actors/thread.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

namespace {

using pointer = thread_registry_pointer;
using state = thread_registry_state;
using resolved = state::resolved;
using continuation = state::continuation;
using steady = std::chrono::steady_clock;

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch())
    .count();
}

caf::error store_error(const std::string& id, const caf::error& err) {
  return make_error(errc::storage_failure,
                    "thread '" + id + "' cannot be loaded or stored: "
                      + describe(err));
}

void touch(state& st, state::resident& r) {
  st.lru.splice(st.lru.begin(), st.lru, r.lru);
  r.used = steady::now();
}

void shed(pointer self);

thread_actor spawn_thread(pointer self, const std::string& id,
                          records::stored_thread initial) {
  auto& st = self->state;
  auto handle = self->spawn<caf::lazy_init>(conversation_thread, id,
                                            std::move(initial), st.store,
                                            st.options.store_timeout);
  self->monitor(handle);
  st.lru.push_front(id);
  st.threads.emplace(id, state::resident{handle, st.lru.begin(),
                                         steady::now()});
  st.ids.emplace(handle.address(), id);
  return handle;
}

// Answers every request waiting for `id`, in arrival order; a creation is
// reported to the first request that asked for one.
void finish(pointer self, const std::string& id, caf::expected<resolved> r) {
  auto& st = self->state;
  auto i = st.transit.find(id);
  if (i == st.transit.end())
    return;
  auto waiting = std::move(i->second);
  st.transit.erase(i);
  bool created = r && r->created;
  for (auto& w : waiting) {
    if (!r) {
      w.next(r.error());
      continue;
    }
    w.next(resolved{r->handle, created && w.create});
    if (w.create)
      created = false;
  }
  shed(self);
}

void create(pointer self, const std::string& id,
            std::vector<turn> turns = {}) {
  auto& st = self->state;
  auto write = records::create_thread(id, turns, now_ms());
  self->request(st.store, st.options.store_timeout, store_atom::value,
                std::move(write))
    .then(
      [self, id, turns](uint64_t) mutable {
        records::stored_thread initial;
        initial.next_seq = turns.size();
        initial.turns = std::move(turns);
        auto handle = spawn_thread(self, id, std::move(initial));
        finish(self, id, resolved{handle, true});
      },
      [self, id](caf::error& err) {
        finish(self, id, store_error(id, err));
      });
}

// Loads `id` from the store; creates it if it is not stored and a waiting
// request asked for that.
void activate(pointer self, const std::string& id) {
  auto& st = self->state;
  self
    ->request(st.store, st.options.store_timeout, load_atom::value,
              records::load_thread(id))
    .then(
      [self, id](sql_rows& rows) {
        auto stored = records::decode_thread(rows);
        if (!stored) {
          finish(self, id, stored.error());
          return;
        }
        if (*stored) {
          ++self->state.activations;
          auto handle = spawn_thread(self, id, std::move(**stored));
          finish(self, id, resolved{handle, false});
          return;
        }
        auto& waiting = self->state.transit[id];
        if (std::none_of(waiting.begin(), waiting.end(),
                         [](auto& w) { return w.create; })) {
          finish(self, id, resolved{});
          return;
        }
        create(self, id);
      },
      [self, id](caf::error& err) {
        finish(self, id, store_error(id, err));
      });
}

// Calls `next` with the thread `id` once it is in memory (loading or
// creating it as needed), or with an invalid handle if it does not exist
// and `create` is false.
void resolve(pointer self, const std::string& id, bool create_missing,
             continuation next) {
  auto& st = self->state;
  if (auto i = st.threads.find(id); i != st.threads.end()) {
    touch(st, i->second);
    next(resolved{i->second.handle, false});
    return;
  }
  if (auto i = st.transit.find(id); i != st.transit.end()) {
    i->second.push_back({create_missing, std::move(next)});
    return;
  }
  if (!st.store) {
    if (!create_missing) {
      next(resolved{});
      return;
    }
    auto handle = spawn_thread(self, id, {});
    next(resolved{handle, true});
    shed(self);
    return;
  }
  st.transit[id].push_back({create_missing, std::move(next)});
  activate(self, id);
}

// Asks the thread to stop if idle. Requests arriving meanwhile wait; if it
// stopped, they load it again.
void passivate(pointer self, const std::string& id) {
  auto& st = self->state;
  auto i = st.threads.find(id);
  if (i == st.threads.end())
    return;
  auto handle = i->second.handle;
  st.lru.erase(i->second.lru);
  st.threads.erase(i);
  st.transit[id]; // requests for it wait from now on
  st.passivating.emplace(id, handle);
  self->request(handle, st.options.store_timeout, passivate_atom::value)
    .then(
      [self, id, handle](bool stopped) {
        auto& s = self->state;
        s.passivating.erase(id);
        if (!stopped) {
          // Busy: it stays, as the most recently used.
          s.lru.push_front(id);
          s.threads.emplace(id, state::resident{handle, s.lru.begin(),
                                                steady::now()});
          finish(self, id, resolved{handle, false});
          return;
        }
        ++s.passivations;
        if (s.transit[id].empty())
          s.transit.erase(id);
        else
          activate(self, id);
      },
      [self, id](caf::error&) {
        // It is gone either way: load it again if anyone asks.
        auto& s = self->state;
        s.passivating.erase(id);
        if (s.transit[id].empty())
          s.transit.erase(id);
        else
          activate(self, id);
      });
}

// Keeps at most `max_resident` threads in memory (a store is needed to
// give any back).
void shed(pointer self) {
  auto& st = self->state;
  if (!st.store || st.options.max_resident == 0)
    return;
  auto excess = st.threads.size() > st.options.max_resident
                  ? st.threads.size() - st.options.max_resident
                  : 0;
  while (excess-- > 0 && !st.lru.empty())
    passivate(self, st.lru.back());
}

void passivate_idle(pointer self) {
  auto& st = self->state;
  if (!st.store || st.options.idle_timeout.count() == 0)
    return;
  auto deadline = steady::now() - st.options.idle_timeout;
  while (!st.lru.empty()) {
    auto& oldest = st.threads.at(st.lru.back());
    if (oldest.used > deadline)
      break;
    passivate(self, st.lru.back());
  }
}

std::chrono::milliseconds tick_interval(const thread_registry_options& o) {
  using namespace std::chrono;
  return std::clamp<milliseconds>(o.idle_timeout / 4, milliseconds{10},
                                  milliseconds{seconds{5}});
}

std::string fresh_id(pointer self) {
  for (;;) {
    auto id = make_uuid_v4();
    if (self->state.threads.count(id) == 0
        && self->state.transit.count(id) == 0)
      return id;
  }
}

template <class T>
using promise = caf::typed_response_promise<T>;

// Resolves `id`, then forwards the request to the thread; `if_missing`
// answers when it does not exist.
template <class T, class Missing, class... Ts>
caf::result<T> route(pointer self, const std::string& id, bool create_missing,
                     Missing if_missing, Ts... xs) {
  auto rp = self->make_response_promise<T>();
  resolve(self, id, create_missing,
          [rp, if_missing, xs...](caf::expected<resolved> r) mutable {
            if (!r)
              rp.deliver(r.error());
            else if (!r->handle) {
              caf::expected<T> x = if_missing();
              if (x)
                rp.deliver(std::move(*x));
              else
                rp.deliver(x.error());
            } else
              rp.delegate(r->handle, xs...);
          });
  return rp;
}

template <class T>
caf::result<T> query(pointer self, sql_statement q,
                     std::function<T(const sql_rows&)> decode) {
  auto rp = self->make_response_promise<T>();
  self->request(self->state.store, self->state.options.store_timeout,
                load_atom::value, std::move(q))
    .then([rp, decode](sql_rows& rows) mutable { rp.deliver(decode(rows)); },
          [rp](caf::error& err) mutable {
            rp.deliver(make_error(errc::storage_failure,
                                  "cannot read the thread list: "
                                    + describe(err)));
          });
  return rp;
}

caf::error not_found(const std::string& id) {
  return make_error(errc::not_found, "thread '" + id + "' does not exist");
}

} // namespace

thread_registry_actor::behavior_type
thread_registry(thread_registry_pointer self, thread_registry_options options,
                storage_actor store) {
  self->state.options = options;
  self->state.store = std::move(store);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    auto i = st.ids.find(dm.source);
    if (i == st.ids.end())
      return;
    auto id = std::move(i->second);
    st.ids.erase(i);
    auto j = st.threads.find(id);
    if (j == st.threads.end() || j->second.handle.address() != dm.source)
      return; // passivated, or already replaced
    if (dm.reason)
      spdlog::error("thread '{}' (actor {}) failed: {}; it is dropped", id,
                    j->second.handle.id(), caf::to_string(dm.reason));
    st.lru.erase(j->second.lru);
    st.threads.erase(j);
  });
  // Stopping the registry stops every thread it holds.
  self->set_exit_handler([self](caf::exit_msg& em) {
    auto& st = self->state;
    for (auto& kvp : st.threads)
      self->send_exit(kvp.second.handle, em.reason);
    for (auto& kvp : st.passivating)
      self->send_exit(kvp.second, em.reason);
    self->quit(em.reason);
  });
  if (self->state.store && options.idle_timeout.count() > 0)
    self->delayed_send(self, tick_interval(options), tick_atom::value);
  return {
    [self](caf::get_atom, const std::string& id) -> caf::result<thread_ref> {
      if (auto err = validate_thread_id(id))
        return err;
      auto rp = self->make_response_promise<thread_ref>();
      resolve(self, id, false, [rp, id](caf::expected<resolved> r) mutable {
        if (!r)
          rp.deliver(r.error());
        else
          rp.deliver(thread_ref{id, r->handle, static_cast<bool>(r->handle), false, {}});
      });
      return rp;
    },
    [self](caf::put_atom, const std::string& given) -> caf::result<thread_ref> {
      if (auto err = validate_thread_id(given))
        return err;
      auto id = given == "new" ? fresh_id(self) : given;
      auto rp = self->make_response_promise<thread_ref>();
      resolve(self, id, true, [rp, id](caf::expected<resolved> r) mutable {
        if (!r)
          rp.deliver(r.error());
        else
          rp.deliver(
            thread_ref{id, r->handle, !r->created, r->created, {}});
      });
      return rp;
    },
    [self](fork_atom, const std::string& source) -> caf::result<thread_ref> {
      if (auto err = validate_thread_id(source))
        return err;
      auto rp = self->make_response_promise<thread_ref>();
      resolve(self, source, false, [self, rp, source](
                                     caf::expected<resolved> r) mutable {
        if (!r || !r->handle) {
          rp.deliver(r ? not_found(source) : r.error());
          return;
        }
        self
          ->request(r->handle, self->state.options.snapshot_timeout,
                    caf::get_atom::value, thread_snapshot_atom::value)
          .then(
            [self, rp, source](thread_snapshot& snap) mutable {
              // Copy the completed exchanges only: a running exchange's
              // user turn stays with the original.
              auto n = std::min<uint64_t>(snap.committed, snap.turns.size());
              snap.turns.resize(static_cast<size_t>(n));
              auto id = fresh_id(self);
              auto deliver = [rp, source, id](caf::expected<resolved> x) mutable {
                if (!x)
                  rp.deliver(x.error());
                else
                  rp.deliver(thread_ref{id, x->handle, false, true, source});
              };
              if (!self->state.store) {
                records::stored_thread initial;
                initial.next_seq = snap.turns.size();
                initial.turns = std::move(snap.turns);
                deliver(resolved{spawn_thread(self, id, std::move(initial)),
                                 true});
                shed(self);
                return;
              }
              self->state.transit[id].push_back({true, deliver});
              create(self, id, std::move(snap.turns));
            },
            [rp, source](caf::error& err) mutable {
              rp.deliver(make_error(classify(err),
                                    "cannot fork thread '" + source
                                      + "': " + describe(err)));
            });
      });
      return rp;
    },
    [self](caf::add_atom, const std::string& id,
           turn& t) -> caf::result<uint64_t> {
      if (auto err = validate_thread_id(id))
        return err;
      if (id == "new")
        return make_error(errc::invalid_id,
                          "thread_id 'new' names no thread: create one with "
                          "get_or_create or send a message to 'new'");
      if (auto err = validate_turn(t))
        return err; // an invalid turn creates no thread
      return route<uint64_t>(
        self, id, true, [] { return uint64_t{0}; }, caf::add_atom::value,
        std::move(t));
    },
    [self](caf::get_atom, history_atom, const std::string& id,
           uint64_t max_turns) -> caf::result<history_window> {
      if (auto err = validate_thread_id(id))
        return err;
      if (auto err = validate_max_turns(max_turns))
        return err;
      return route<history_window>(
        self, id, false, [] { return history_window{}; },
        caf::get_atom::value, history_atom::value, max_turns);
    },
    [self](caf::get_atom, thread_snapshot_atom,
           const std::string& id) -> caf::result<thread_snapshot> {
      if (auto err = validate_thread_id(id))
        return err;
      return route<thread_snapshot>(
        self, id, false,
        [id]() -> caf::expected<thread_snapshot> { return not_found(id); },
        caf::get_atom::value, thread_snapshot_atom::value);
    },
    [self](caf::reset_atom, const std::string& id) -> caf::result<uint64_t> {
      if (auto err = validate_thread_id(id))
        return err;
      return route<uint64_t>(
        self, id, false,
        [id]() -> caf::expected<uint64_t> { return not_found(id); },
        caf::reset_atom::value);
    },
    [self](caf::get_atom,
           thread_list_atom) -> caf::result<std::vector<std::string>> {
      auto& st = self->state;
      if (st.store)
        return query<std::vector<std::string>>(
          self, records::list_threads(), [](const sql_rows& rows) {
            std::vector<std::string> ids;
            ids.reserve(rows.size());
            for (auto& row : rows)
              if (!row.empty())
                ids.push_back(row[0].text);
            return ids;
          });
      std::vector<std::string> ids;
      ids.reserve(st.threads.size());
      for (auto& kvp : st.threads)
        ids.push_back(kvp.first);
      std::sort(ids.begin(), ids.end());
      return ids;
    },
    [self](caf::get_atom, thread_count_atom) -> caf::result<uint64_t> {
      auto& st = self->state;
      if (st.store)
        return query<uint64_t>(self, records::count_threads(),
                               [](const sql_rows& rows) -> uint64_t {
                                 if (rows.empty() || rows[0].empty())
                                   return 0;
                                 return static_cast<uint64_t>(
                                   rows[0][0].integer);
                               });
      return st.threads.size();
    },
    [self](stats_atom) -> thread_registry_stats {
      auto& st = self->state;
      return {st.threads.size() + st.passivating.size(), st.activations,
              st.passivations};
    },
    [self](tick_atom) {
      passivate_idle(self);
      self->delayed_send(self, tick_interval(self->state.options),
                         tick_atom::value);
    },
  };
}

} // namespace spindle
