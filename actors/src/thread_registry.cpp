#include "spindle/actors/thread_registry.hpp"

#include <algorithm>
#include <limits>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/actors/records.hpp"
#include "spindle/actors/thread.hpp"
#include "spindle/messages/clock.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

struct thread_registry_state::lease_book {
  /// A lease this node holds: the epoch its writes are fenced with, the
  /// standing's term it was taken in, and the actor serving under it (none
  /// while it loads, or when the thread did not exist: such a lease is let
  /// go a few seconds later unless the request that located the thread
  /// created it meanwhile).
  struct held_lease {
    uint64_t epoch = 0;
    uint64_t term = 0;
    caf::actor_addr actor;
    std::chrono::steady_clock::time_point taken
      = std::chrono::steady_clock::now();
  };
  std::unordered_map<std::string, held_lease> held;
  /// Who held a thread's lease when this node last failed to take it, and
  /// until when `locate` answers that without asking the database again
  /// (a second: a request sent to a node that no longer owns the thread is
  /// served there, or answered `not_owner` and sent again).
  struct seen_elsewhere {
    thread_location where;
    std::chrono::steady_clock::time_point until;
  };
  std::unordered_map<std::string, seen_elsewhere> elsewhere;
};

namespace {

using pointer = thread_registry_pointer;
using held_lease = thread_registry_state::lease_book::held_lease;
using seen_elsewhere = thread_registry_state::lease_book::seen_elsewhere;
using table = activation_table<thread_actor>;
using resolved = table::resolved;
using continuation = table::continuation;

caf::error store_error(const std::string& id, const caf::error& err) {
  return make_storage_error(err, "thread '" + id
                                   + "' cannot be loaded or stored: "
                                   + describe(err));
}

// In a cluster: the epoch of the lease this node holds for `id` (0: none,
// or not in a cluster).
uint64_t lease_epoch(pointer self, const std::string& id) {
  auto& held = self->state.leases->held;
  auto i = held.find(id);
  return i == held.end() ? 0 : i->second.epoch;
}

// Lets the lease of `id` go, if it is held under `epoch`, behind every
// write the store holds (fire and forget: a lease not let go runs out with
// the node's own).
void release_lease(pointer self, const std::string& id, uint64_t epoch) {
  auto& st = self->state;
  st.leases->held.erase(id);
  if (epoch == 0 || !st.store)
    return;
  self
    ->request(st.store, st.options.store_timeout, store_atom::value,
              records::release_thread_lease(id, epoch))
    .then([](uint64_t) {},
          [id](caf::error& err) {
            spdlog::debug("cluster: the lease of thread '{}' was not let go "
                          "({}); it runs out with the node's",
                          id, describe(err));
          });
}

caf::error cut_off(pointer self) {
  return make_error(errc::not_owner,
                    "node '" + self->state.options.cluster->name()
                      + "' cannot renew its cluster lease: it serves no "
                        "thread until it can; send the request through "
                        "another node");
}

// Stops every thread actor at once: this node's lease does not run, and
// another node may take any of its threads. Their writes in flight are
// refused by the fence; whoever asks next loads the thread afresh.
void drop_all(pointer self) {
  auto& st = self->state;
  std::vector<std::string> ids;
  st.threads.for_each_actor(
    [&](const std::string& id, const thread_actor&) { ids.push_back(id); });
  for (auto& id : ids)
    st.threads.retire(id, [self](const thread_actor& handle,
                                 std::function<void(bool)> done) {
      self->send_exit(handle, caf::exit_reason::user_shutdown);
      done(true);
    });
}

// In a cluster, before serving `id`: an error while this node's own lease
// does not run; a thread activated in an earlier term of the lease is
// dropped (it may have moved and changed meanwhile) and loaded again by
// the request.
caf::error check_standing(pointer self, const std::string& id) {
  auto& st = self->state;
  if (!st.options.cluster)
    return caf::none;
  auto now = st.options.cluster->read();
  if (!now.live) {
    drop_all(self);
    return cut_off(self);
  }
  auto& held = st.leases->held;
  auto i = held.find(id);
  if (i != held.end() && i->second.term != now.term
      && st.threads.find(id)) {
    spdlog::info("cluster: thread '{}' was activated before this node's "
                 "lease lapsed; it is loaded afresh",
                 id);
    st.threads.retire(id, [self](const thread_actor& handle,
                                 std::function<void(bool)> done) {
      self->send_exit(handle, caf::exit_reason::user_shutdown);
      done(true);
    });
  }
  return caf::none;
}

thread_actor spawn_thread(pointer self, const std::string& id,
                          records::stored_thread initial) {
  auto& st = self->state;
  auto& held = st.leases->held;
  auto lease = held.find(id);
  if (lease != held.end())
    initial.lease_epoch = lease->second.epoch;
  auto handle = self->spawn<caf::lazy_init>(conversation_thread, id,
                                            std::move(initial), st.store,
                                            st.options.views, st.catalog,
                                            st.options.events,
                                            st.options.tokens);
  self->monitor(handle);
  if (lease != held.end())
    lease->second.actor = handle.address();
  return handle;
}

// In a cluster: takes the lease of `id`, then `next(epoch)`; fails `done`
// with `not_owner` when another node's lease runs (noting it for
// `locate`). Outside a cluster: `next(0)` at once.
template <class Next>
void with_lease(pointer self, const std::string& id, Next next,
                continuation done, int attempt = 0) {
  auto& st = self->state;
  if (!st.options.cluster) {
    next(uint64_t{0});
    return;
  }
  auto& me = *st.options.cluster;
  auto now = me.read();
  if (!now.live) {
    done(cut_off(self));
    return;
  }
  self
    ->request(st.store, st.options.store_timeout, load_atom::value,
              records::acquire_thread_lease(id, me.name(), me.incarnation(),
                                            unix_time_ms()))
    .then(
      [self, id, next, done, attempt,
       term = now.term](sql_rows& rows) mutable {
        auto lease = records::decode_lease(rows);
        if (!lease) {
          done(make_storage_error(lease.error(),
                                  "thread '" + id + "': "
                                    + describe(lease.error())));
          return;
        }
        auto& s = self->state;
        if (lease->epoch == 0 && lease->holder.empty() && attempt < 3) {
          // Another node took the lease while this statement waited for
          // it: the statement's snapshot, taken before, cannot name the
          // winner. A second statement sees it.
          with_lease(self, id, std::move(next), std::move(done),
                     attempt + 1);
          return;
        }
        if (lease->epoch == 0) {
          s.leases->elsewhere[id] = seen_elsewhere{
            thread_location{false, lease->holder, lease->holder_url},
            std::chrono::steady_clock::now() + std::chrono::seconds{1}};
          done(make_error(errc::not_owner,
                          "thread '" + id + "' is served by node '"
                            + lease->holder + "' (" + lease->holder_url
                            + ")"));
          return;
        }
        s.leases->held[id] = held_lease{lease->epoch, term, {},
                                        std::chrono::steady_clock::now()};
        next(lease->epoch);
      },
      [done, id](caf::error& err) mutable {
        done(make_storage_error(err, "thread '" + id
                                       + "': its cluster lease cannot be "
                                         "taken: "
                                       + describe(err)));
      });
}

// Stores a new thread holding `turns` (without a store: at once), then
// spawns it. Publishes `thread.created`, or `thread.forked` from `source`.
void create(pointer self, const std::string& id, std::vector<turn> turns,
            continuation done, thread_metadata metadata = {},
            const std::string& source = {}, thread_summary summary = {}) {
  auto& st = self->state;
  std::vector<event> created;
  if (st.options.events)
    created.push_back(
      source.empty()
        ? thread_event("thread.created", id)
        : thread_event("thread.forked", id,
                       ",\"source\":" + json_quote(std::string{local_id(source)})
                         + ",\"turns\":"
                         + std::to_string(turns.size())));
  auto spawn_it = [self, id, metadata,
                   summary](std::vector<turn> initial_turns) {
    records::stored_thread initial;
    initial.next_seq = initial_turns.size();
    initial.turns = std::move(initial_turns);
    initial.metadata = metadata;
    initial.summary = summary;
    return resolved{spawn_thread(self, id, std::move(initial)), true};
  };
  if (!st.store) {
    if (st.catalog)
      st.catalog->create(id, unix_time_ms(), turns.size(), metadata);
    if (st.options.events)
      st.options.events->publish(std::move(created));
    done(spawn_it(std::move(turns)));
    return;
  }
  auto write = records::fenced(id, lease_epoch(self, id),
                               records::create_thread(id, turns,
                                                      unix_time_ms(),
                                                      metadata, summary));
  self->request(st.store, st.options.store_timeout, store_atom::value,
                std::move(write),
                publish_on_commit(st.options.events, std::move(created)))
    .then(
      [done, spawn_it, turns](uint64_t) mutable {
        done(spawn_it(std::move(turns)));
      },
      [self, done, id](caf::error& err) mutable {
        release_lease(self, id, lease_epoch(self, id));
        done(store_error(id, err));
      });
}

// The activation table's load hook: the thread as stored, or created.
void load_leased(pointer self, const std::string& id, bool create_missing,
                 continuation done);

void load(pointer self, const std::string& id, bool create_missing,
          continuation done) {
  auto& st = self->state;
  if (!st.store) {
    // Asked to create, or for a key that was being deleted meanwhile.
    if (create_missing)
      create(self, id, {}, std::move(done));
    else
      done(resolved{});
    return;
  }
  with_lease(
    self, id,
    [self, id, create_missing, done](uint64_t) mutable {
      load_leased(self, id, create_missing, std::move(done));
    },
    done);
}

// `load` once the lease is held (in a cluster).
void load_leased(pointer self, const std::string& id, bool create_missing,
                 continuation done) {
  auto& st = self->state;
  self
    ->request(st.store, st.options.store_timeout, load_atom::value,
              records::load_thread(id))
    .then(
      [self, id, create_missing, done](sql_rows& rows) mutable {
        auto stored = records::decode_thread(rows);
        if (!stored)
          done(stored.error());
        else if (*stored)
          done(resolved{spawn_thread(self, id, std::move(**stored)), false});
        else if (create_missing)
          create(self, id, {}, std::move(done));
        else {
          // Nothing to serve yet. The lease stays a moment: the request
          // that asked (a message to a new thread) creates it here next,
          // and no other node takes it in between (the tick lets it go).
          done(resolved{});
        }
      },
      [self, done, id](caf::error& err) mutable {
        release_lease(self, id, lease_epoch(self, id));
        done(store_error(id, err));
      });
}

void passivate(pointer self, const thread_actor& handle,
               std::function<void(bool)> done) {
  self->request(handle, self->state.options.store_timeout,
                passivate_atom::value)
    .then([done](bool stopped) { done(stopped); },
          // It is gone either way: load it again if anyone asks.
          [done](caf::error&) { done(true); });
}

void resolve(pointer self, const std::string& id, bool create_missing,
             continuation next) {
  if (auto err = check_standing(self, id)) {
    next(std::move(err));
    return;
  }
  self->state.threads.resolve(id, create_missing, std::move(next));
}

// "new", "TENANT~new" or "TENANT~USER~new": create a thread (of that
// tenant, of that end user).
bool is_new(const std::string& id) {
  auto sep = id.rfind(tenant_separator);
  return std::string_view{id}.substr(sep == std::string::npos ? 0 : sep + 1)
         == "new";
}

// A fresh ID beside `like` (a thread ID or "new"): in its tenant and, for
// an end user's thread, that end user's.
std::string fresh_id(pointer self, const std::string& like) {
  auto& threads = self->state.threads;
  auto sep = like.rfind(tenant_separator);
  auto prefix = sep == std::string::npos ? std::string{}
                                         : like.substr(0, sep + 1);
  for (;;) {
    auto id = prefix + make_uuid_v4();
    if (!threads.find(id) && !threads.in_transit(id))
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
  if (auto err = check_standing(self, id))
    return err;
  if (auto handle = self->state.threads.use(id))
    return self->delegate(handle, std::move(xs)...);
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

// The thread as a resource, as committed: a thread being created answers
// once it is stored.
void read_info(pointer self, const std::string& id,
               std::function<void(caf::expected<thread_info>)> done) {
  auto& st = self->state;
  if (!st.store) {
    if (auto info = st.catalog->get(id))
      done(std::move(*info));
    else
      done(not_found(id));
    return;
  }
  // The ID and the continuation shared by both handlers: made once, not
  // copied into each (a tenant's qualified ID is longer than a string's
  // inline buffer, so every copy would allocate).
  struct pending {
    std::string id;
    std::function<void(caf::expected<thread_info>)> done;
  };
  auto p = std::make_shared<pending>(pending{id, std::move(done)});
  self
    ->request(st.store, st.options.store_timeout, load_atom::value,
              records::load_thread_info(id))
    .then(
      [p](sql_rows& rows) {
        auto info = records::decode_thread_info(rows);
        if (!info)
          p->done(info.error());
        else if (!*info)
          p->done(not_found(p->id));
        else
          p->done(std::move(**info));
      },
      [p](caf::error& err) { p->done(store_error(p->id, err)); });
}

/// `at_turn` meaning every completed turn.
constexpr uint64_t all_turns = std::numeric_limits<uint64_t>::max();

// A new thread (fresh ID) holding the first `at_turn` completed turns of
// `source` (all of them with `all_turns`), and its metadata when
// `with_metadata`: a fork (D9) or a copy (POST .../copy). A running
// exchange's turns stay with the original. Errors: `not_found`,
// `invalid_argument` for an `at_turn` past the completed turns.
caf::result<thread_ref> copy_thread(pointer self, const std::string& source,
                                    uint64_t at_turn, bool with_metadata) {
  if (auto err = validate_thread_id(source))
    return err;
  if (is_new(source))
    return not_found(source);
  auto rp = self->make_response_promise<thread_ref>();
  auto failed = [rp, source](const caf::error& err) mutable {
    rp.deliver(make_error(classify(err), "cannot copy thread '" + source
                                           + "': " + describe(err)));
  };
  resolve(self, source, false, [=](caf::expected<resolved> r) mutable {
    if (!r || !r->handle) {
      rp.deliver(r ? not_found(source) : r.error());
      return;
    }
    self
      ->request(r->handle, self->state.options.snapshot_timeout,
                caf::get_atom::value, thread_snapshot_atom::value)
      .then(
        [=](thread_snapshot& snap) mutable {
          auto n = std::min<uint64_t>(snap.committed, snap.turns.size());
          if (at_turn != all_turns && at_turn > n) {
            rp.deliver(make_error(
              errc::invalid_argument,
              "at_turn " + std::to_string(at_turn) + " is past the "
                + std::to_string(n) + " completed turns of thread '"
                + source + "'"));
            return;
          }
          if (at_turn != all_turns)
            n = at_turn;
          snap.turns.resize(static_cast<size_t>(n));
          // The summary goes with the copy when it covers only turns the
          // copy holds.
          auto summary = snap.summary.upto > 0 && snap.summary.upto <= n
                           ? snap.summary
                           : thread_summary{};
          auto make = [=](std::vector<turn> turns,
                          thread_metadata metadata) mutable {
            auto id = fresh_id(self, source);
            self->state.threads.reserve(
              id, [rp, source, id](caf::expected<resolved> x) mutable {
                if (!x)
                  rp.deliver(x.error());
                else
                  rp.deliver(thread_ref{id, x->handle, false, true, source});
              });
            auto settle = [self, id](caf::expected<resolved> x) {
              self->state.threads.settle(id, std::move(x));
            };
            with_lease(
              self, id,
              [=, turns = std::move(turns),
               metadata = std::move(metadata)](uint64_t) mutable {
                create(self, id, std::move(turns), settle,
                       std::move(metadata), source, summary);
              },
              settle);
          };
          if (!with_metadata) {
            make(std::move(snap.turns), {});
            return;
          }
          auto turns = std::make_shared<std::vector<turn>>(
            std::move(snap.turns));
          read_info(self, source,
                    [=](caf::expected<thread_info> info) mutable {
                      if (!info)
                        failed(info.error());
                      else
                        make(std::move(*turns), std::move(info->metadata));
                    });
        },
        [=](caf::error& err) mutable { failed(err); });
  });
  return rp;
}

// Lets go the leases taken for threads that were not there and were not
// created since (no actor serves them).
void release_unused_leases(pointer self) {
  auto& st = self->state;
  auto old = std::chrono::steady_clock::now() - std::chrono::seconds{5};
  std::vector<std::pair<std::string, uint64_t>> unused;
  for (auto& [id, lease] : st.leases->held)
    if (!lease.actor && lease.taken < old && !st.threads.in_transit(id))
      unused.emplace_back(id, lease.epoch);
  for (auto& [id, epoch] : unused)
    release_lease(self, id, epoch);
}

// How often the registry looks after its threads: idle passivation, and
// in a cluster whether the node's own lease still runs (a few times per
// lease).
std::chrono::milliseconds tick_every(pointer self) {
  auto& st = self->state;
  auto every = st.threads.tick_interval();
  if (st.options.cluster)
    every = std::min(every, std::chrono::milliseconds{250});
  return every;
}

} // namespace

thread_registry_actor::behavior_type
thread_registry(thread_registry_pointer self, thread_registry_options options,
                storage_actor store) {
  auto& init = self->state;
  init.options = options;
  init.leases = std::make_shared<thread_registry_state::lease_book>();
  init.store = std::move(store);
  if (!init.store)
    init.catalog = std::make_shared<thread_catalog>();
  init.threads.init(static_cast<bool>(init.store), options.activation,
                  {[self](const std::string& id, bool create_missing,
                          continuation done) {
                     load(self, id, create_missing, std::move(done));
                   },
                   [self](const thread_actor& handle,
                          std::function<void(bool)> done) {
                     passivate(self, handle, std::move(done));
                   }});
  self->set_down_handler([self](caf::down_msg& dm) {
    auto [was_resident, id] = self->state.threads.down(dm.source);
    auto& held = self->state.leases->held;
    if (auto i = held.find(id);
        i != held.end() && i->second.actor == dm.source)
      release_lease(self, id, i->second.epoch);
    if (was_resident && dm.reason)
      spdlog::error("thread '{}' failed: {}; it is dropped", id,
                    caf::to_string(dm.reason));
  });
  // Stopping the registry stops every thread it holds.
  self->set_exit_handler([self](caf::exit_msg& em) {
    self->state.threads.for_each_actor(
      [&](const std::string&, const thread_actor& handle) {
        self->send_exit(handle, em.reason);
      });
    self->quit(em.reason);
  });
  if ((init.threads.durable() && options.activation.idle_timeout.count() > 0)
      || init.options.cluster)
    self->delayed_send(self, tick_every(self), tick_atom::value);
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
      auto id = is_new(given) ? fresh_id(self, given) : given;
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
      return copy_thread(self, source, all_turns, false);
    },
    [self](fork_atom, const std::string& source,
           uint64_t at_turn) -> caf::result<thread_ref> {
      return copy_thread(self, source, at_turn, true);
    },
    [self](caf::add_atom, const std::string& id,
           turn& t) -> caf::result<uint64_t> {
      if (auto err = validate_thread_id(id))
        return err;
      if (is_new(id))
        return make_error(errc::invalid_id,
                          "thread_id 'new' names no thread: create one with "
                          "get_or_create or send a message to 'new'");
      if (auto err = validate_turn(t))
        return err; // an invalid turn creates no thread
      return route<uint64_t>(
        self, id, true, [] { return uint64_t{0}; }, caf::add_atom::value,
        std::move(t));
    },
    [self](caf::add_atom, const std::string& id,
           std::vector<turn>& batch) -> caf::result<uint64_t> {
      if (auto err = validate_thread_id(id))
        return err;
      if (is_new(id))
        return make_error(errc::invalid_id,
                          "thread_id 'new' names no thread: create one with "
                          "POST /v1/threads, then append to it");
      if (auto err = validate_turns_alone(batch))
        return err;
      // Appending without generating creates no thread: a refused batch
      // must leave nothing behind.
      return route<uint64_t>(
        self, id, false,
        [id]() -> caf::expected<uint64_t> { return not_found(id); },
        caf::add_atom::value, std::move(batch));
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
      st.threads.for_each_actor(
        [&](const std::string& id, const thread_actor&) { ids.push_back(id); });
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
      return st.threads.resident();
    },
    [self](thread_info_atom,
           const std::string& id) -> caf::result<thread_info> {
      if (auto err = validate_thread_id(id))
        return err;
      if (is_new(id))
        return not_found(id);
      auto rp = self->make_response_promise<thread_info>();
      read_info(self, id, [rp](caf::expected<thread_info> info) mutable {
        if (info)
          rp.deliver(std::move(*info));
        else
          rp.deliver(info.error());
      });
      return rp;
    },
    [self](thread_list_atom,
           const thread_list_request& request) -> caf::result<thread_page> {
      if (auto err = validate_thread_list_request(request))
        return err;
      auto& st = self->state;
      if (!st.store)
        return st.catalog->list(request);
      if (request.snapshot == 0) {
        // A new walk: versions that only walks older than the longest a
        // walk lives could need go.
        auto horizon = next_thread_version(0)
                       - static_cast<uint64_t>(
                         std::chrono::microseconds{thread_walk_ttl}.count());
        caf::anon_send(st.store, store_atom::value,
                       sql_write{records::prune_thread_versions(horizon)});
      }
      auto limit = request.limit;
      auto snapshot = request.snapshot;
      auto rp = self->make_response_promise<thread_page>();
      self
        ->request(st.store, st.options.store_timeout, load_atom::value,
                  records::list_threads_page(request))
        .then(
          [rp, limit, snapshot](sql_rows& rows) mutable {
            auto page = records::decode_threads_page(rows, limit, snapshot);
            if (!page)
              rp.deliver(page.error());
            else
              rp.deliver(std::move(*page));
          },
          [rp](caf::error& err) mutable {
            rp.deliver(make_error(errc::storage_failure,
                                  "cannot read the thread list: "
                                    + describe(err)));
          });
      return rp;
    },
    [self](caf::put_atom, const std::string& given,
           thread_metadata& metadata) -> caf::result<thread_ref> {
      if (auto err = validate_thread_id(given))
        return err;
      if (!is_new(given))
        return make_error(errc::invalid_id,
                          "a thread with metadata is created as 'new'");
      thread_metadata_patch patch{metadata, {}};
      if (auto err = validate_metadata_patch(patch))
        return err;
      if (metadata.size() > max_metadata_keys)
        return make_error(errc::too_large,
                          "metadata: at most "
                            + std::to_string(max_metadata_keys) + " keys");
      auto id = fresh_id(self, given);
      auto rp = self->make_response_promise<thread_ref>();
      self->state.threads.reserve(id, [rp, id](caf::expected<resolved> x) mutable {
        if (!x)
          rp.deliver(x.error());
        else
          rp.deliver(thread_ref{id, x->handle, false, true, {}});
      });
      create(
        self, id, {},
        [self, id](caf::expected<resolved> x) {
          self->state.threads.settle(id, std::move(x));
        },
        std::move(metadata));
      return rp;
    },
    [self](thread_metadata_atom, const std::string& id,
           thread_metadata_patch& patch) -> caf::result<thread_metadata> {
      if (auto err = validate_thread_id(id))
        return err;
      if (auto err = validate_metadata_patch(patch))
        return err; // a bad patch activates nothing
      return route<thread_metadata>(
        self, id, false,
        [id]() -> caf::expected<thread_metadata> { return not_found(id); },
        thread_metadata_atom::value, std::move(patch));
    },
    [self](summary_atom, const std::string& id, thread_summary& summary,
           uint64_t epoch) -> caf::result<uint64_t> {
      if (auto err = validate_thread_id(id))
        return err;
      return route<uint64_t>(
        self, id, false,
        [id]() -> caf::expected<uint64_t> { return not_found(id); },
        summary_atom::value, std::move(summary), epoch);
    },
    [self](caf::delete_atom, const std::string& id) -> caf::result<uint64_t> {
      if (auto err = validate_thread_id(id))
        return err;
      if (is_new(id))
        return not_found(id);
      auto rp = self->make_response_promise<uint64_t>();
      resolve(self, id, false, [self, rp, id](caf::expected<resolved> r) mutable {
        if (!r) {
          rp.deliver(r.error());
          return;
        }
        if (!r->handle) {
          rp.deliver(not_found(id));
          return;
        }
        // Requests for the ID wait until the thread is gone, then load it
        // again: they find no thread, or create a new, empty one.
        self->state.threads.retire(
          id, [self, rp](const thread_actor& handle,
                         std::function<void(bool)> done) mutable {
            self->request(handle, caf::infinite, caf::delete_atom::value)
              .then(
                [rp, done](uint64_t removed) mutable {
                  rp.deliver(removed);
                  done(true);
                },
                [rp, done](caf::error& err) mutable {
                  rp.deliver(err);
                  done(false);
                });
          });
      });
      return rp;
    },
    [self](stats_atom) -> thread_registry_stats {
      auto& t = self->state.threads;
      return {t.resident(), t.activations(), t.passivations()};
    },
    [self](tick_atom) {
      auto& st = self->state;
      st.threads.passivate_idle();
      if (st.options.cluster && !st.options.cluster->live())
        drop_all(self);
      release_unused_leases(self);
      self->delayed_send(self, tick_every(self), tick_atom::value);
    },
    [self](locate_atom, const std::string& id) -> caf::result<thread_location> {
      auto& st = self->state;
      if (!st.options.cluster || !st.store || is_new(id)
          || validate_thread_id(id))
        return thread_location{};
      // Seen with another node a moment ago, and not taken here since.
      auto& elsewhere = st.leases->elsewhere;
      if (auto i = elsewhere.find(id); i != elsewhere.end()) {
        if (std::chrono::steady_clock::now() < i->second.until
            && !st.threads.find(id) && !st.threads.in_transit(id))
          return i->second.where;
        elsewhere.erase(i);
      }
      auto rp = self->make_response_promise<thread_location>();
      resolve(self, id, false, [self, rp, id](caf::expected<resolved> r) mutable {
        auto& seen = self->state.leases->elsewhere;
        auto i = seen.find(id);
        if (!r && classify(r.error()) == errc::not_owner && i != seen.end()
            && !i->second.where.url.empty())
          rp.deliver(i->second.where);
        else
          rp.deliver(thread_location{});
      });
      return rp;
    },
  };
}

} // namespace spindle
