#include "spindle/actors/thread.hpp"

#include <algorithm>
#include <chrono>

#include <caf/all.hpp>

#include "spindle/messages/clock.hpp"
#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

using state = thread_state;
using waiter = state::waiter;

using promise = caf::typed_response_promise<uint64_t>;

void drain(thread_pointer self);

caf::error store_error(const std::string& thread_id, const caf::error& err) {
  return make_storage_error(err, "thread '" + thread_id
                                   + "': the write was not stored: "
                                   + describe(err));
}

// The event of turn number `n` (with `role`) appended to `thread`.
event appended_event(const std::string& thread, turn_role role, uint64_t n) {
  return thread_event("thread.turn_appended", thread,
                      std::string{",\"role\":\""} + to_string(role)
                        + "\",\"turns\":"
                        + std::to_string(n));
}

// Publishes `e` of this thread at once (a runtime without a store).
void emit(thread_pointer self, event e) {
  if (self->state.events)
    self->state.events->publish({std::move(e)});
}

// An append's outcome, run by the state store on its own thread: after the
// commit it publishes the turn in the log the append was made against (the
// store is then that log's only writer: appends are handed to it in order
// and it runs their hooks in that order) and gives the caller the new turn
// count; the store sends that answer to the caller directly.
class append_hook final : public write_hook {
public:
  append_hook(std::shared_ptr<turn_log> log, turn t,
              std::shared_ptr<state::write_progress> appends,
              std::shared_ptr<event_log> events)
    : log_(std::move(log)),
      turn_(std::move(t)),
      appends_(std::move(appends)),
      events_(std::move(events)) {
    appends_->in_flight.fetch_add(1, std::memory_order_relaxed);
  }

  ~append_hook() override {
    // Never run: the store stopped before the write reached it.
    if (!done_)
      finish();
  }

  uint64_t committed(uint64_t) override {
    auto role = turn_.role;
    auto n = log_->push_back(std::move(turn_));
    if (events_)
      events_->publish({appended_event(appends_->thread_id, role, n)});
    finish();
    return n;
  }

  caf::error failed(caf::error reason) override {
    finish();
    return store_error(appends_->thread_id, reason);
  }

private:
  void finish() {
    done_ = true;
    // Release: whoever sees the count drop sees the published turn.
    appends_->in_flight.fetch_sub(1, std::memory_order_release);
  }

  std::shared_ptr<turn_log> log_;
  turn turn_;
  std::shared_ptr<state::write_progress> appends_;
  std::shared_ptr<event_log> events_;
  bool done_ = false;
};

size_t appends_in_flight(const state& st) {
  return st.appends->in_flight.load(std::memory_order_acquire);
}

// Without a store: applies at once. With one: hands the turn to the store,
// which publishes it after the commit and answers `rp`'s caller itself.
// Later appends follow at once (the store keeps their order).
void append(thread_pointer self, turn t, promise rp) {
  auto& st = self->state;
  if (t.timestamp_ms == 0)
    t.timestamp_ms = unix_time_ms();
  if (st.tokens)
    count_turn(*st.tokens, t);
  if (!st.store) {
    auto role = t.role;
    auto n = st.turns->push_back(std::move(t));
    if (st.catalog)
      st.catalog->set_turns(st.thread_id, n);
    emit(self, appended_event(st.thread_id, role, n));
    rp.deliver(n);
    return;
  }
  auto write = records::fenced(st.thread_id, st.lease_epoch,
                                records::append_turn(st.thread_id,
                                                     st.next_seq++, t));
  rp.delegate(st.store, store_atom::value, std::move(write),
              write_hook_ptr{std::make_shared<append_hook>(
                st.turns, std::move(t), st.appends, st.events)});
}

template <class Apply>
void write_through(thread_pointer self, sql_write write, promise rp,
                   Apply apply, std::vector<event> events);

// Appends `batch` in one write, after every append handed to the store
// before it is published (a barrier when some are in flight), so that it
// is checked against every turn of the thread: tool call IDs unique, tool
// turns answering open calls. Later requests wait for it.
void append_batch(thread_pointer self, std::vector<turn> batch, promise rp) {
  auto& st = self->state;
  if (st.store && appends_in_flight(st) > 0) {
    st.writing = true;
    self->request(st.store, caf::infinite, store_atom::value, sql_write{})
      .then(
        [self, batch = std::move(batch), rp](uint64_t) mutable {
          self->state.writing = false;
          append_batch(self, std::move(batch), std::move(rp));
          drain(self);
        },
        [self, rp](caf::error& err) mutable {
          self->state.writing = false;
          rp.deliver(store_error(self->state.thread_id, err));
          drain(self);
        });
    return;
  }
  tool_call_ledger ledger;
  auto& log = *st.turns;
  for (size_t i = 0, n = log.size(); i < n; ++i)
    ledger.add(log[i]);
  if (auto err = validate_turn_batch(std::move(ledger), batch)) {
    rp.deliver(std::move(err));
    return;
  }
  auto now = unix_time_ms();
  std::vector<event> events;
  auto count = log.size();
  for (auto& t : batch) {
    if (t.timestamp_ms == 0)
      t.timestamp_ms = now;
    if (st.tokens)
      count_turn(*st.tokens, t);
    events.push_back(appended_event(st.thread_id, t.role, ++count));
  }
  sql_write write;
  if (st.store) {
    write = records::fenced(
      st.thread_id, st.lease_epoch,
      records::append_turns(st.thread_id, st.next_seq, batch));
    st.next_seq += batch.size();
  }
  auto turns = std::make_shared<std::vector<turn>>(std::move(batch));
  write_through(
    self, std::move(write), std::move(rp),
    [self, turns]() -> uint64_t {
      auto& s = self->state;
      uint64_t n = s.turns->size();
      for (auto& t : *turns)
        n = s.turns->push_back(std::move(t));
      if (!s.store && s.catalog)
        s.catalog->set_turns(s.thread_id, n);
      return n;
    },
    std::move(events));
}

// Runs `apply` once `write` committed (at once without a store), then
// answers `rp` with what it returns; `events` are published after the
// commit. Later requests wait until then. The store answers only after
// every append handed to it before has run its hook, so `apply` sees them
// all in the log; an empty write is such a barrier alone.
template <class Apply>
void write_through(thread_pointer self, sql_write write, promise rp,
                   Apply apply, std::vector<event> events) {
  auto& st = self->state;
  if (!st.store) {
    rp.deliver(apply());
    if (st.events)
      st.events->publish(std::move(events));
    return;
  }
  st.writing = true;
  // Untimed (see docs/storage.md): the store answers every write after its
  // commit, or bounces it when it stops, so the outcome is never unknown;
  // a stalled disk shows as the caller's own timeout.
  self
    ->request(st.store, caf::infinite, store_atom::value, std::move(write),
              publish_on_commit(st.events, std::move(events)))
    .then(
      [self, rp, apply](uint64_t) mutable {
        self->state.writing = false;
        rp.deliver(apply());
        drain(self);
      },
      [self, rp](caf::error& err) mutable {
        self->state.writing = false;
        rp.deliver(store_error(self->state.thread_id, err));
        drain(self);
      });
}

void clear(thread_pointer self, promise rp) {
  auto& st = self->state;
  auto write = st.store ? records::fenced(st.thread_id, st.lease_epoch,
                                         records::clear_thread(st.thread_id))
                       : sql_write{};
  std::vector<event> cleared{thread_event("thread.cleared", st.thread_id)};
  write_through(self, std::move(write), std::move(rp), [self]() -> uint64_t {
    auto& s = self->state;
    auto removed = s.turns->size();
    // A new log: the memory goes back once no reader holds the old one.
    s.turns = std::make_shared<turn_log>();
    s.next_seq = 0;
    ++s.epoch;
    s.summary = nullptr; // it summarized the turns that went
    s.publish();
    if (!s.store && s.catalog)
      s.catalog->set_turns(s.thread_id, 0);
    return removed;
  }, std::move(cleared));
}

uint64_t grant(thread_pointer self, caf::strong_actor_ptr holder) {
  auto& st = self->state;
  st.lease = ++st.last_lease;
  st.committed = st.turns->size();
  st.holder = caf::actor_cast<caf::actor_addr>(holder);
  // A holder that terminates without ending its exchange must not keep the
  // thread forever (monitoring a dead actor reports at once).
  if (holder)
    self->monitor(holder);
  return st.lease;
}

// Begins an exchange for `holder` once every append handed to the store
// has been published (the exchange counts the turns it starts from), after
// a barrier if some are still in flight.
void begin(thread_pointer self, caf::strong_actor_ptr holder, promise rp) {
  if (appends_in_flight(self->state) == 0) {
    rp.deliver(grant(self, std::move(holder)));
    return;
  }
  write_through(self, sql_write{}, std::move(rp),
                [self, holder = std::move(holder)]() mutable {
                  return grant(self, std::move(holder));
                },
                {});
}

caf::error deleted_error(const std::string& thread_id) {
  return make_error(errc::not_found,
                    "thread '" + thread_id + "' was deleted");
}

// Deletes the thread for good once nothing runs on it: what waits behind
// the deletion fails, the rows go (after every append handed to the store
// before), then the actor stops. A failed write leaves it as it was.
void remove(thread_pointer self) {
  auto& st = self->state;
  auto rp = *st.deleting; // stays set: the destructor answers if it must
  for (auto& w : st.waiting)
    w.promise.deliver(deleted_error(st.thread_id));
  st.waiting.clear();
  auto finish = [self, rp]() mutable {
    auto& s = self->state;
    auto removed = s.turns->size();
    s.deleting.reset();
    if (s.catalog)
      s.catalog->remove(s.thread_id);
    s.withdraw();
    rp.deliver(static_cast<uint64_t>(removed));
    self->quit();
  };
  auto deleted = thread_event("thread.deleted", st.thread_id);
  if (!st.store) {
    emit(self, std::move(deleted));
    finish();
    return;
  }
  st.writing = true;
  self
    ->request(st.store, caf::infinite, store_atom::value,
              records::fenced(st.thread_id, st.lease_epoch,
                              records::delete_thread(st.thread_id)),
              publish_on_commit(st.events, {std::move(deleted)}))
    .then([finish](uint64_t) mutable { finish(); },
          [self, rp](caf::error& err) mutable {
            auto& s = self->state;
            s.writing = false;
            s.deleting.reset();
            rp.deliver(store_error(s.thread_id, err));
            drain(self);
          });
}

void write_metadata(thread_pointer self);

// Serves waiting requests in arrival order until one of them begins an
// exchange (which holds the thread again); a deletion goes first, once
// nothing runs.
void drain(thread_pointer self) {
  auto& st = self->state;
  if (st.deleting) {
    if (st.lease == 0 && !st.writing && st.metadata_changes.empty())
      remove(self);
    return;
  }
  while (st.lease == 0 && !st.writing && !st.waiting.empty()) {
    auto w = std::move(st.waiting.front());
    st.waiting.pop_front();
    switch (w.what) {
      case waiter::op::add:
        append(self, std::move(w.item), std::move(w.promise));
        break;
      case waiter::op::add_batch:
        append_batch(self, std::move(w.items), std::move(w.promise));
        break;
      case waiter::op::clear:
        clear(self, std::move(w.promise));
        break;
      case waiter::op::begin:
        begin(self, std::move(w.requester), std::move(w.promise));
        break;
    }
  }
}

void release(thread_pointer self) {
  auto& st = self->state;
  if (st.holder)
    self->demonitor(st.holder);
  st.lease = 0;
  st.holder = caf::actor_addr{};
  st.committed = st.turns->size();
  drain(self);
}

// Whether a clear or an exchange must wait (appends in flight do not hold
// them up: they wait for those behind a barrier).
bool busy(const state& st) {
  return st.lease != 0 || st.writing || !st.waiting.empty();
}

// The sender of the current request. Read it before making the request's
// response promise, which takes the sender out of the message.
caf::strong_actor_ptr requester(thread_pointer self) {
  return self->current_sender();
}

caf::typed_response_promise<uint64_t>
enqueue(thread_pointer self, waiter::op what, turn item) {
  auto from = requester(self);
  auto rp = self->make_response_promise<uint64_t>();
  self->state.waiting.push_back(
    waiter{what, std::move(item), {}, rp, std::move(from)});
  return rp;
}

caf::typed_response_promise<uint64_t> enqueue_batch(thread_pointer self,
                                                    std::vector<turn> items) {
  auto from = requester(self);
  auto rp = self->make_response_promise<uint64_t>();
  self->state.waiting.push_back(waiter{waiter::op::add_batch, turn{},
                                       std::move(items), rp,
                                       std::move(from)});
  return rp;
}

// Writes the first queued metadata patch, then the next.
void write_metadata(thread_pointer self) {
  auto& st = self->state;
  if (st.metadata_changes.empty())
    return;
  auto& change = st.metadata_changes.front();
  auto merged = apply_metadata_patch(st.metadata, change.patch);
  auto next = [self] {
    self->state.metadata_changes.pop_front();
    if (self->state.metadata_changes.empty())
      drain(self);
    else
      write_metadata(self);
  };
  if (!merged) {
    change.promise.deliver(merged.error());
    next();
    return;
  }
  auto apply = [self, merged = *merged, next]() mutable {
    auto& s = self->state;
    s.metadata = merged;
    if (!s.store && s.catalog)
      s.catalog->set_metadata(s.thread_id, merged);
    s.metadata_changes.front().promise.deliver(std::move(merged));
    next();
  };
  if (!st.store) {
    apply();
    return;
  }
  self
    ->request(st.store, caf::infinite, store_atom::value,
              records::fenced(st.thread_id, st.lease_epoch,
                              records::set_thread_metadata(st.thread_id,
                                                           *merged)))
    .then([apply](uint64_t) mutable { apply(); },
          [self, next](caf::error& err) mutable {
            auto& s = self->state;
            s.metadata_changes.front().promise.deliver(
              store_error(s.thread_id, err));
            next();
          });
}

} // namespace

void thread_state::publish() {
  if (views)
    views->publish(thread_id, std::make_shared<const thread_view>(
                                thread_view{turns, epoch, actor_id, summary}));
}

void thread_state::withdraw() {
  if (views)
    views->withdraw(thread_id, actor_id);
}

thread_state::~thread_state() {
  withdraw();
  auto stopped = [this] {
    return make_error(errc::unavailable,
                      "thread '" + thread_id + "' has stopped");
  };
  for (auto& w : waiting)
    w.promise.deliver(stopped());
  for (auto& c : metadata_changes)
    c.promise.deliver(stopped());
  if (deleting)
    deleting->deliver(stopped());
}

// Keeps a summary made by compaction once it is stored. Not held back by
// a running exchange: it touches no turn. The store applies it only if the
// thread is still at `epoch` when it commits, and so does the actor.
caf::result<uint64_t> put_summary(thread_pointer self, thread_summary summary,
                                  uint64_t epoch) {
  auto& st = self->state;
  auto current = st.summary ? st.summary->upto : 0;
  if (epoch != st.epoch || st.writing)
    return make_error(errc::conflict, "thread '" + st.thread_id
                                        + "' was cleared or is being "
                                          "written; the summary is stale");
  if (summary.upto <= current)
    return make_error(errc::conflict,
                      "thread '" + st.thread_id + "' has a summary up to turn "
                        + std::to_string(current) + " already");
  if (summary.upto > st.turns->size())
    return make_error(errc::invalid_argument,
                      "a summary up to turn " + std::to_string(summary.upto)
                        + " is past the " + std::to_string(st.turns->size())
                        + " turns of thread '" + st.thread_id + "'");
  if (summary.content.size() > max_summary_content)
    return make_error(errc::too_large,
                      "a summary has at most "
                        + std::to_string(max_summary_content) + " bytes");
  auto kept = std::make_shared<const thread_summary>(std::move(summary));
  auto apply = [self, kept, epoch]() -> uint64_t {
    auto& s = self->state;
    if (s.epoch == epoch && (!s.summary || s.summary->upto < kept->upto)) {
      s.summary = kept;
      s.publish();
    }
    return kept->upto;
  };
  if (!st.store)
    return apply();
  auto rp = self->make_response_promise<uint64_t>();
  self
    ->request(st.store, caf::infinite, store_atom::value,
              records::fenced(st.thread_id, st.lease_epoch,
                              records::put_summary(st.thread_id, epoch,
                                                   *kept)))
    .then([rp, apply](uint64_t) mutable { rp.deliver(apply()); },
          [self, rp](caf::error& err) mutable {
            rp.deliver(store_error(self->state.thread_id, err));
          });
  return rp;
}

thread_actor::behavior_type
conversation_thread(thread_pointer self, std::string thread_id,
                    records::stored_thread initial, storage_actor store,
                    std::shared_ptr<thread_views> views,
                    std::shared_ptr<thread_catalog> catalog,
                    std::shared_ptr<event_log> events,
                    std::shared_ptr<const token_counter> tokens) {
  auto& st = self->state;
  st.thread_id = std::move(thread_id);
  st.events = std::move(events);
  st.metadata = std::move(initial.metadata);
  st.catalog = std::move(catalog);
  st.tokens = std::move(tokens);
  auto encoding = st.tokens ? static_cast<uint8_t>(st.tokens->id()) : 0;
  for (auto& t : initial.turns) {
    // Stored before counts were kept, or with another encoding.
    if (st.tokens && t.token_encoding != encoding)
      count_turn(*st.tokens, t);
    st.turns->push_back(std::move(t));
  }
  st.epoch = initial.epoch;
  st.lease_epoch = initial.lease_epoch;
  st.next_seq = std::max<uint64_t>(initial.next_seq, st.turns->size());
  // A summary never covers more than the turns there are.
  if (initial.summary.upto > 0 && initial.summary.upto <= st.turns->size())
    st.summary = std::make_shared<const thread_summary>(
      std::move(initial.summary));
  st.store = std::move(store);
  st.appends->thread_id = st.thread_id;
  st.committed = st.turns->size();
  st.views = std::move(views);
  st.actor_id = self->id();
  st.publish();
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.lease != 0 && dm.source == s.holder)
      release(self);
  });
  return {
    [self](caf::add_atom, turn& t) -> caf::result<uint64_t> {
      if (auto err = validate_turn(t))
        return err;
      auto& s = self->state;
      if (busy(s))
        return enqueue(self, waiter::op::add, std::move(t));
      auto rp = self->make_response_promise<uint64_t>();
      append(self, std::move(t), rp);
      return rp;
    },
    [self](caf::add_atom, std::vector<turn>& batch) -> caf::result<uint64_t> {
      // What the batch alone decides, before it waits in line.
      if (auto err = validate_turns_alone(batch))
        return err;
      if (busy(self->state))
        return enqueue_batch(self, std::move(batch));
      auto rp = self->make_response_promise<uint64_t>();
      append_batch(self, std::move(batch), rp);
      return rp;
    },
    [self](caf::add_atom, turn& t, uint64_t lease) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (lease == 0 || lease != s.lease)
        return make_error(errc::conflict,
                          "lease " + std::to_string(lease)
                            + " does not hold thread '" + s.thread_id + "'");
      if (auto err = validate_turn(t))
        return err;
      auto rp = self->make_response_promise<uint64_t>();
      append(self, std::move(t), rp);
      return rp;
    },
    [self](caf::get_atom, history_atom,
           uint64_t max_turns) -> caf::result<history_window> {
      if (auto err = validate_max_turns(max_turns))
        return err;
      auto& s = self->state;
      return read_window(thread_view{s.turns, s.epoch, s.actor_id, s.summary},
                         max_turns);
    },
    [self](caf::get_atom, thread_snapshot_atom) -> thread_snapshot {
      auto& s = self->state;
      std::vector<turn> turns;
      s.turns->copy(0, s.turns->size(), turns);
      return thread_snapshot{s.thread_id,
                             std::move(turns),
                             s.epoch,
                             s.lease != 0 ? s.committed : s.turns->size(),
                             s.lease != 0,
                             s.waiting.size(),
                             s.summary ? *s.summary : thread_summary{}};
    },
    [self](summary_atom, thread_summary& summary,
           uint64_t epoch) -> caf::result<uint64_t> {
      return put_summary(self, std::move(summary), epoch);
    },
    [self](caf::reset_atom) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (busy(s))
        return enqueue(self, waiter::op::clear, turn{});
      auto rp = self->make_response_promise<uint64_t>();
      clear(self, rp);
      return rp;
    },
    [self](exchange_begin_atom,
           conflict_policy policy) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (!busy(s)) {
        auto from = requester(self);
        auto rp = self->make_response_promise<uint64_t>();
        begin(self, std::move(from), rp);
        return rp;
      }
      switch (policy) {
        case conflict_policy::queue:
          return enqueue(self, waiter::op::begin, turn{});
        case conflict_policy::exit:
        case conflict_policy::fork:
          break;
      }
      return make_error(errc::conflict,
                        "thread '" + s.thread_id
                          + "' is busy with another message (on_conflict="
                          + to_string(policy) + ")");
    },
    [self](exchange_end_atom, uint64_t lease) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (lease == 0 || lease != s.lease)
        return make_error(errc::conflict,
                          "lease " + std::to_string(lease)
                            + " does not hold thread '" + s.thread_id + "'");
      auto count = s.turns->size();
      release(self);
      return count;
    },
    [self](thread_metadata_atom,
           thread_metadata_patch& patch) -> caf::result<thread_metadata> {
      if (auto err = validate_metadata_patch(patch))
        return err;
      auto& s = self->state;
      if (s.deleting)
        return deleted_error(s.thread_id);
      auto rp = self->make_response_promise<thread_metadata>();
      s.metadata_changes.push_back({std::move(patch), rp});
      if (s.metadata_changes.size() == 1)
        write_metadata(self);
      return rp;
    },
    [self](caf::delete_atom) -> caf::result<uint64_t> {
      auto& s = self->state;
      if (s.deleting)
        return make_error(errc::conflict, "thread '" + s.thread_id
                                            + "' is being deleted");
      auto rp = self->make_response_promise<uint64_t>();
      s.deleting = rp;
      drain(self);
      return rp;
    },
    [self](passivate_atom) -> caf::result<bool> {
      if (busy(self->state) || appends_in_flight(self->state) > 0
          || !self->state.metadata_changes.empty() || self->state.deleting)
        return false;
      // Everything this thread holds is stored: nothing is lost. Readers
      // go to the registry from now on (before a newer actor of this
      // thread can write); answer, then stop.
      self->state.withdraw();
      auto rp = self->make_response_promise<bool>();
      rp.deliver(true);
      self->quit();
      return rp;
    },
  };
}

} // namespace spindle
