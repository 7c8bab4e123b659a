#include "spindle/actors/id_allocator.hpp"

#include <algorithm>

#include <caf/all.hpp>

#include "spindle/messages/error.hpp"

namespace spindle {

namespace {

using state = id_allocator_state;
using counter = state::counter;
using waiter = state::waiter;

uint64_t block_of(const state& st, const counter& c) {
  auto block = c.kind == counter_kind::context ? st.options.context_block
                                               : st.options.sequence_block;
  return std::max<uint64_t>(block, 1);
}

// Answers the first `n` requests with `err`; they leave the front.
void fail_front(counter& c, size_t n, const caf::error& err) {
  for (size_t i = 0; i < n; ++i) {
    auto& w = c.waiting[i];
    if (w.what == waiter::op::next)
      w.range.deliver(err);
    else
      w.value.deliver(err);
  }
  c.waiting.erase(c.waiting.begin(),
                  c.waiting.begin() + static_cast<std::ptrdiff_t>(n));
}

void count_issued(id_allocator_state& st, counter_kind kind, uint64_t n) {
  switch (kind) {
    case counter_kind::context:
      st.issued.context += n;
      break;
    case counter_kind::orchestration:
      st.issued.orchestration += n;
      break;
    case counter_kind::task:
      st.issued.task += n;
      break;
  }
}

void ensure_reserved(id_allocator_pointer self, const std::string& key,
                     counter& c, uint64_t needed);

void ask_store(id_allocator_pointer self, const std::string& key, counter& c,
               bool one_at_a_time = false);

// Serves waiters in arrival order while their counter can answer them; stops
// at the first that needs a larger reservation, so each caller sees its own
// values increase.
void drain(id_allocator_pointer self, const std::string& key, counter& c) {
  if (self->state.options.cluster) {
    ask_store(self, key, c);
    return;
  }
  if (!c.loaded)
    return;
  auto limit = max_sequence(c.kind);
  // Served waiters leave from the front, all at once.
  size_t served = 0;
  struct eraser {
    counter& c;
    size_t& n;
    ~eraser() {
      c.waiting.erase(c.waiting.begin(),
                      c.waiting.begin() + static_cast<std::ptrdiff_t>(n));
    }
  } erase_served{c, served};
  while (served < c.waiting.size()) {
    auto& w = c.waiting[served];
    switch (w.what) {
      case waiter::op::next: {
        if (w.amount > limit || c.next > limit - w.amount + 1) {
          w.range.deliver(counter_exhausted(key, w.amount, limit));
          break;
        }
        auto last = c.next + w.amount - 1;
        if (last > c.durable) {
          ensure_reserved(self, key, c, last);
          return;
        }
        w.range.deliver(id_range{key, c.next, w.amount});
        count_issued(self->state, c.kind, w.amount);
        c.next = last + 1;
        break;
      }
      case waiter::op::advance: {
        if (w.amount > c.durable) {
          ensure_reserved(self, key, c, w.amount);
          return;
        }
        c.next = std::max(c.next, w.amount + 1);
        w.value.deliver(c.next);
        break;
      }
      case waiter::op::peek:
        w.value.deliver(c.next);
        break;
    }
    ++served;
  }
  // Renew the reservation once half of it is used, so `next` rarely waits.
  auto block = block_of(self->state, c);
  if (c.durable < limit && c.durable - (c.next - 1) < (block + 1) / 2)
    ensure_reserved(self, key, c, c.next - 1);
}

// Makes sure a store is in flight whose mark covers `needed` plus a block.
void ensure_reserved(id_allocator_pointer self, const std::string& key,
                     counter& c, uint64_t needed) {
  if (c.storing != 0)
    return; // its reply drains again and renews if still short
  auto limit = max_sequence(c.kind);
  auto block = block_of(self->state, c);
  auto base = std::max(needed, c.next - 1);
  auto mark = base > limit - std::min(block, limit) ? limit : base + block;
  if (mark <= c.durable)
    return;
  c.storing = mark;
  self
    ->request(self->state.store, self->state.options.store_timeout,
              store_atom::value, counter_atom::value, key, mark)
    .then(
      [self, key](uint64_t stored) {
        auto& ctr = self->state.counters[key];
        ctr.storing = 0;
        ctr.durable = std::max(ctr.durable, stored);
        drain(self, key, ctr);
      },
      [self, key](caf::error& err) {
        auto& ctr = self->state.counters[key];
        ctr.storing = 0;
        fail_front(ctr, ctr.waiting.size(),
                   make_storage_error(err, "cannot reserve IDs of counter '"
                                             + key + "': " + describe(err)));
      });
}

// -- cluster mode ---------------------------------------------------------------

// The counter store answered the requests in flight (`c.asking`, at the
// front): they leave, and the next ones go.
void answered(id_allocator_pointer self, const std::string& key, counter& c) {
  c.waiting.erase(c.waiting.begin(),
                  c.waiting.begin() + static_cast<std::ptrdiff_t>(c.asking));
  c.asking = 0;
  ask_store(self, key, c);
}

// The counter store could not answer the requests in flight: each gets the
// error, and the next ones go.
void not_answered(id_allocator_pointer self, const std::string& key,
                  counter& c, const caf::error& err) {
  auto failure = classify(err) == errc::exhausted
                   ? err
                   : make_storage_error(err, "cannot reach counter '" + key
                                               + "': " + describe(err));
  fail_front(c, c.asking, failure);
  c.asking = 0;
  ask_store(self, key, c);
}

// The requests at the front of `c.waiting` go to the counter store in one
// round trip and are answered once it committed: every `next` there (one
// step by the sum of their counts, handed out in arrival order), or else
// the one `advance` or `peek` at the front. One round trip per counter at
// a time; what arrives meanwhile goes in the next. `one_at_a_time`: only
// the first request, to tell which of a batch the counter's end refuses.
void ask_store(id_allocator_pointer self, const std::string& key, counter& c,
               bool one_at_a_time) {
  if (c.asking > 0)
    return;
  auto limit = max_sequence(c.kind);
  while (!c.waiting.empty() && c.waiting.front().what == waiter::op::next
         && c.waiting.front().amount > limit)
    fail_front(c, 1, counter_exhausted(key, c.waiting.front().amount, limit));
  if (c.waiting.empty())
    return;
  auto& st = self->state;
  auto& front = c.waiting.front();
  auto failed = [self, key](caf::error& err) {
    not_answered(self, key, self->state.counters[key], err);
  };
  // `peek` reads the mark, `advance` raises it to its value; both answer
  // with the value after it.
  auto next_value = [self, key](uint64_t mark) {
    auto& ctr = self->state.counters[key];
    ctr.waiting.front().value.deliver(mark + 1);
    answered(self, key, ctr);
  };
  c.asking = 1;
  if (front.what == waiter::op::peek) {
    self
      ->request(st.store, st.options.store_timeout, load_atom::value,
                counter_atom::value, key)
      .then(next_value, failed);
    return;
  }
  if (front.what == waiter::op::advance) {
    self
      ->request(st.store, st.options.store_timeout, next_atom::value,
                counter_atom::value, key, uint64_t{0}, front.amount, limit)
      .then(next_value, failed);
    return;
  }
  // The batch: the `next` requests at the front, as many as the counter
  // can hold together.
  uint64_t sum = front.amount;
  size_t n = 1;
  for (; n < c.waiting.size() && !one_at_a_time; ++n) {
    auto& w = c.waiting[n];
    if (w.what != waiter::op::next || w.amount > limit - sum)
      break;
    sum += w.amount;
  }
  c.asking = n;
  self
    ->request(st.store, st.options.store_timeout, next_atom::value,
              counter_atom::value, key, sum, uint64_t{0}, limit)
    .then(
      [self, key, sum](uint64_t mark) {
        auto& ctr = self->state.counters[key];
        auto first = mark - sum + 1;
        for (size_t i = 0; i < ctr.asking; ++i) {
          auto& w = ctr.waiting[i];
          w.range.deliver(id_range{key, first, w.amount});
          first += w.amount;
        }
        count_issued(self->state, ctr.kind, sum);
        answered(self, key, ctr);
      },
      [self, key](caf::error& err) {
        auto& ctr = self->state.counters[key];
        if (classify(err) == errc::exhausted && ctr.asking > 1) {
          // The end refuses the batch, perhaps not each of it: the first
          // alone, then the rest.
          ctr.asking = 0;
          ask_store(self, key, ctr, true);
          return;
        }
        // A storage error fails the whole batch. The step may still have
        // committed: its values are then a gap, never handed out.
        not_answered(self, key, ctr, err);
      });
}

// Nothing in flight and nobody waiting: it can be forgotten and loaded
// again from its durable mark.
bool idle(const counter& c) {
  return c.loaded && !c.loading && c.storing == 0 && c.waiting.empty();
}

// Forgets the least recently used idle counters beyond the cap.
void forget_idle(id_allocator_pointer self) {
  auto& st = self->state;
  auto cap = st.options.max_counters;
  if (cap == 0)
    return;
  auto i = st.recent.end();
  while (st.counters.size() > cap && i != st.recent.begin()) {
    --i;
    auto c = st.counters.find(*i);
    if (c == st.counters.end() || !idle(c->second))
      continue;
    st.counters.erase(c);
    i = st.recent.erase(i);
  }
}

// Returns the counter for `key`, loading it from the store on first use.
counter* lookup(id_allocator_pointer self, const std::string& key,
                caf::error& err) {
  auto& st = self->state;
  auto i = st.counters.find(key);
  if (i != st.counters.end()) {
    st.recent.splice(st.recent.begin(), st.recent, i->second.place);
    return &i->second;
  }
  auto kind = classify_counter_key(key);
  if (!kind) {
    err = kind.error();
    return nullptr;
  }
  forget_idle(self);
  auto& c = st.counters[key];
  c.kind = *kind;
  st.recent.push_front(key);
  c.place = st.recent.begin();
  if (st.options.cluster) {
    // Nothing to load: every request asks the counter store.
    c.loaded = true;
    return &c;
  }
  c.loading = true;
  self
    ->request(self->state.store, self->state.options.store_timeout,
              load_atom::value, counter_atom::value, key)
    .then(
      [self, key](uint64_t mark) {
        auto& ctr = self->state.counters[key];
        ctr.loading = false;
        ctr.loaded = true;
        // Everything up to the stored mark may have been handed out before
        // a restart; continue above it (gaps are allowed, reuse is not).
        ctr.durable = mark;
        ctr.next = mark + 1;
        drain(self, key, ctr);
      },
      [self, key](caf::error& load_err) {
        auto found = self->state.counters.find(key);
        if (found == self->state.counters.end())
          return;
        fail_front(found->second, found->second.waiting.size(),
                   make_storage_error(load_err, "cannot load counter '" + key
                                                  + "': "
                                                  + describe(load_err)));
        self->state.recent.erase(found->second.place);
        self->state.counters.erase(found);
      });
  return &c;
}

template <class Promise>
Promise enqueue(id_allocator_pointer self, const std::string& key, counter& c,
                waiter w, Promise promise) {
  c.waiting.push_back(std::move(w));
  drain(self, key, c);
  return promise;
}

} // namespace

id_allocator_actor::behavior_type id_allocator(id_allocator_pointer self,
                                               counter_store_actor store,
                                               id_allocator_options options) {
  self->state.store = std::move(store);
  self->state.options = options;
  return {
    [self](next_atom, const std::string& key,
           uint64_t count) -> caf::result<id_range> {
      if (count == 0)
        return make_error(errc::invalid_argument,
                          "count must be at least 1");
      caf::error err;
      auto* c = lookup(self, key, err);
      if (c == nullptr)
        return err;
      // Fast path: loaded, nobody waiting, reservation covers the range
      // (never in cluster mode, which holds no reservation).
      if (!self->state.options.cluster && c->loaded && c->waiting.empty()
          && count <= max_sequence(c->kind) - c->next + 1
          && c->next + count - 1 <= c->durable) {
        id_range result{key, c->next, count};
        c->next += count;
        count_issued(self->state, c->kind, count);
        drain(self, key, *c);
        return result;
      }
      auto rp = self->make_response_promise<id_range>();
      return enqueue(self, key, *c, waiter{waiter::op::next, count, rp, {}},
                     rp);
    },
    [self](advance_atom, const std::string& key,
           uint64_t value) -> caf::result<uint64_t> {
      caf::error err;
      auto* c = lookup(self, key, err);
      if (c == nullptr)
        return err;
      if (value > max_sequence(c->kind))
        return make_error(errc::invalid_argument,
                          "value " + std::to_string(value)
                            + " is beyond counter '" + key + "'");
      auto rp = self->make_response_promise<uint64_t>();
      return enqueue(self, key, *c,
                     waiter{waiter::op::advance, value, {}, rp}, rp);
    },
    [self](stats_atom) -> id_stats {
      auto out = self->state.issued;
      out.counters = self->state.counters.size();
      return out;
    },
    [self](peek_atom, const std::string& key) -> caf::result<uint64_t> {
      caf::error err;
      auto* c = lookup(self, key, err);
      if (c == nullptr)
        return err;
      if (!self->state.options.cluster && c->loaded && c->waiting.empty())
        return c->next;
      auto rp = self->make_response_promise<uint64_t>();
      return enqueue(self, key, *c, waiter{waiter::op::peek, 0, {}, rp}, rp);
    },
  };
}

} // namespace spindle
