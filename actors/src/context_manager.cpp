#include "spindle/actors/context_manager.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/actors/records.hpp"

namespace spindle {

namespace {

using pointer = context_manager_pointer;
using add_promise = caf::typed_response_promise<context_add_result>;

// An allocated ID can lose its claim only to an explicit ID claimed in the
// short time between the allocation and the claim; a fresh ID then wins.
constexpr int max_claim_attempts = 8;

// CAF's own errors (a timeout, a dead actor) become spindle errors that say
// which collaborator failed.
caf::error from(const char* who, const caf::error& err) {
  if (err.category() == error_category)
    return err;
  return make_error(classify(err), std::string{who} + ": " + describe(err));
}

std::string join(const std::vector<std::string>& ids) {
  std::string out;
  for (auto& id : ids) {
    if (!out.empty())
      out += ", ";
    out += id;
  }
  return out;
}

// Answers an add: the add is no longer in flight.
template <class T>
void answer(pointer self, add_promise& rp, T&& x) {
  --self->state.in_flight;
  rp.deliver(std::forward<T>(x));
}

// The window row with the current bounds and counters.
sql_statement window_row(const context_manager_state& st) {
  return records::put_window(st.thread_id, st.window.options(), st.added,
                             st.evicted, st.removed, st.cleared);
}

// Answers `rp` with `value` once `write` committed (at once without a
// store). The change is already applied in memory; a write that fails
// stops the manager, so the directory loads the window again from what
// committed.
template <class T>
void persist(pointer self, sql_write write,
             caf::typed_response_promise<T> rp, T value) {
  auto& st = self->state;
  if (!st.store) {
    rp.deliver(std::move(value));
    return;
  }
  write.push_back(window_row(st));
  ++st.in_flight;
  // Untimed, as a thread's writes (docs/storage.md).
  self->request(st.store, caf::infinite, store_atom::value, std::move(write))
    .then(
      [self, rp, value](uint64_t) mutable {
        --self->state.in_flight;
        rp.deliver(std::move(value));
      },
      [self, rp](caf::error& err) mutable {
        --self->state.in_flight;
        rp.deliver(make_storage_error(err, "context '"
                                             + self->state.thread_id
                                             + "': the change was not "
                                               "stored: "
                                             + describe(err)));
        self->quit(err);
      });
}

void release(pointer self, std::vector<uint64_t> ids) {
  if (ids.empty() || !self->state.directory)
    return;
  self->send(self->state.directory, ctx_release_atom::value,
             context_released{self->state.thread_id, std::move(ids)});
}

// Reports items that left the window by eviction: the directory forgets
// their IDs, the log and the counter record them, the caller gets the IDs.
std::vector<std::string> account_evictions(pointer self,
                                           std::vector<context_item>& gone,
                                           const char* cause) {
  std::vector<std::string> ids;
  std::vector<uint64_t> numbers;
  ids.reserve(gone.size());
  numbers.reserve(gone.size());
  for (auto& item : gone) {
    ids.push_back(item.id());
    numbers.push_back(item.sequence());
  }
  if (!ids.empty()) {
    self->state.evicted += ids.size();
    spdlog::debug("context '{}': evicted {} ({})", self->state.thread_id,
                  join(ids), cause);
    release(self, std::move(numbers));
  }
  return ids;
}

void store(pointer self, context_item item, add_promise rp) {
  auto& st = self->state;
  std::vector<context_item> gone;
  if (auto err = st.window.push(item, &gone)) {
    // The bounds changed while the ID was on its way.
    release(self, {item.sequence()});
    answer(self, rp, err);
    return;
  }
  ++st.added;
  auto cause = st.window.options().token_budget > 0 ? "capacity or token budget"
                                                    : "capacity";
  auto evicted = account_evictions(self, gone, cause);
  sql_write write;
  if (st.store) {
    write.push_back(records::insert_item(st.thread_id, st.next_position++,
                                         item));
    for (auto& old : gone)
      write.push_back(records::delete_item(old.sequence()));
  }
  --st.in_flight; // from here on, `persist` accounts for it
  persist(self, std::move(write), rp,
          context_add_result{std::move(item), std::move(evicted)});
}

void allocate(pointer self, context_draft draft, add_promise rp,
              int attempt);

// Claims the item's ID in the runtime-wide index, then stores it. A lost
// claim of an allocated ID is retried with a fresh ID; of an explicit ID,
// it is the caller's error.
void claim_and_store(pointer self, context_item item, add_promise rp,
                     std::optional<context_draft> retry, int attempt) {
  auto& st = self->state;
  auto seq = item.sequence();
  self
    ->request(st.directory, st.timeout, ctx_claim_atom::value, seq,
              st.thread_id)
    .then(
      [self, item, rp](uint64_t) mutable {
        store(self, std::move(item), std::move(rp));
      },
      [self, rp, retry, attempt](caf::error& err) mutable {
        if (retry && classify(err) == errc::already_exists
            && attempt + 1 < max_claim_attempts) {
          allocate(self, std::move(*retry), std::move(rp), attempt + 1);
          return;
        }
        answer(self, rp, from("context directory", err));
      });
}

void allocate(pointer self, context_draft draft, add_promise rp,
              int attempt) {
  auto& st = self->state;
  self
    ->request(st.ids, st.timeout, next_atom::value,
              std::string{counter_keys::context}, uint64_t{1})
    .then(
      [self, draft, rp, attempt](id_range& range) mutable {
        auto item = make_context_item(draft, format_context_id(range.first),
                                      universal_time_now());
        if (!item) {
          answer(self, rp, item.error());
          return;
        }
        claim_and_store(self, std::move(*item), std::move(rp),
                        std::move(draft), attempt);
      },
      [self, rp](caf::error& err) mutable {
        answer(self, rp, from("ID allocator", err));
      });
}

caf::error not_found(pointer self, const std::string& id) {
  return make_error(errc::not_found, "no item '" + id + "' in thread '"
                                       + self->state.thread_id + "'");
}

} // namespace

context_manager_actor::behavior_type
context_manager(context_manager_pointer self, std::string thread_id,
                context_manager_options options, id_allocator_actor ids,
                context_directory_actor directory,
                records::stored_window initial, storage_actor store) {
  auto& init = self->state;
  init.thread_id = std::move(thread_id);
  init.window = context_window{options.window};
  for (auto& item : initial.items) {
    std::vector<context_item> gone; // a stored window fits its bounds
    init.window.push(std::move(item), &gone);
  }
  init.added = initial.added;
  init.evicted = initial.evicted;
  init.removed = initial.removed;
  init.cleared = initial.cleared;
  init.next_position = initial.next_position;
  init.store = std::move(store);
  init.ids = std::move(ids);
  init.directory = std::move(directory);
  init.timeout = options.request_timeout;
  return {
    [self](caf::add_atom,
           context_draft& draft) -> caf::result<context_add_result> {
      // Check everything but the ID before spending one.
      auto probe = make_context_item(draft, "ctx-1", 0);
      if (!probe)
        return probe.error();
      auto& window = self->state.window;
      auto budget = window.options().token_budget;
      if (budget > 0 && probe->tokens() > static_cast<uint64_t>(budget))
        return make_error(errc::capacity_exceeded,
                          "content of " + std::to_string(draft.content.size())
                            + " bytes is about "
                            + std::to_string(probe->tokens())
                            + " tokens, more than the whole token_budget of "
                            + std::to_string(budget));
      auto rp = self->make_response_promise<context_add_result>();
      ++self->state.in_flight;
      allocate(self, std::move(draft), rp, 0);
      return rp;
    },
    [self](caf::add_atom,
           context_item& given) -> caf::result<context_add_result> {
      // A message may carry a hand-built item: check it as the codec does.
      auto item = make_context_item(context_draft{given.type(),
                                                  given.content(),
                                                  given.metadata_text()},
                                    given.id(), given.timestamp());
      if (!item)
        return item.error();
      auto& st = self->state;
      if (auto err = st.window.admissible(*item))
        return err;
      auto rp = self->make_response_promise<context_add_result>();
      ++st.in_flight;
      // D4: first make sure the counter never hands this ID out again,
      // then claim it; an allocation racing the advance loses its claim.
      self
        ->request(st.ids, st.timeout, advance_atom::value,
                  std::string{counter_keys::context}, item->sequence())
        .then(
          [self, checked = std::move(*item), rp](uint64_t) mutable {
            auto& s = self->state;
            if (!s.store) {
              claim_and_store(self, std::move(checked), std::move(rp),
                              std::nullopt, 0);
              return;
            }
            // The directory knows the IDs of windows in memory; the store
            // knows every other.
            self
              ->request(s.store, s.timeout, load_atom::value,
                        records::find_item_owner(checked.sequence()))
              .then(
                [self, checked, rp](sql_rows& rows) mutable {
                  if (!rows.empty() && !rows[0].empty()) {
                    answer(self, rp,
                           make_error(errc::already_exists,
                                      "id '" + checked.id()
                                        + "' is already in use in thread '"
                                        + rows[0][0].text + "'"));
                    return;
                  }
                  claim_and_store(self, std::move(checked), std::move(rp),
                                  std::nullopt, 0);
                },
                [self, rp](caf::error& err) mutable {
                  answer(self, rp, from("state store", err));
                });
          },
          [self, rp](caf::error& err) mutable {
            answer(self, rp, from("ID allocator", err));
          });
      return rp;
    },
    [self](ctx_items_atom, uint64_t limit) -> std::vector<context_item> {
      return self->state.window.newest(limit);
    },
    [self](caf::get_atom, const std::string& id) -> caf::result<context_item> {
      if (auto* item = self->state.window.find(id))
        return *item;
      return not_found(self, id);
    },
    [self](caf::delete_atom,
           const std::string& id) -> caf::result<context_item> {
      auto& st = self->state;
      auto item = st.window.erase(id);
      if (!item)
        return not_found(self, id);
      ++st.removed;
      release(self, {item->sequence()});
      auto rp = self->make_response_promise<context_item>();
      sql_write write;
      if (st.store)
        write.push_back(records::delete_item(item->sequence()));
      persist(self, std::move(write), rp, std::move(*item));
      return rp;
    },
    [self](caf::reset_atom) -> caf::result<uint64_t> {
      auto& st = self->state;
      auto gone = st.window.clear();
      std::vector<uint64_t> numbers;
      numbers.reserve(gone.size());
      for (auto& item : gone)
        numbers.push_back(item.sequence());
      st.cleared += gone.size();
      release(self, std::move(numbers));
      auto rp = self->make_response_promise<uint64_t>();
      sql_write write;
      if (st.store)
        write.push_back(records::delete_items(st.thread_id));
      persist(self, std::move(write), rp, uint64_t{gone.size()});
      return rp;
    },
    [self](ctx_render_atom, uint64_t limit) -> std::string {
      return render_markdown(self->state.window.newest(limit));
    },
    [self](ctx_stats_atom) -> context_stats {
      auto& st = self->state;
      context_stats out;
      out.thread_id = st.thread_id;
      out.size = st.window.size();
      out.capacity = st.window.options().capacity;
      out.token_budget = st.window.options().token_budget;
      out.tokens = st.window.tokens();
      out.added = st.added;
      out.evicted = st.evicted;
      out.removed = st.removed;
      out.cleared = st.cleared;
      return out;
    },
    [self](caf::put_atom,
           window_options bounds) -> caf::result<context_evicted> {
      auto& st = self->state;
      std::vector<context_item> gone;
      if (auto err = st.window.configure(bounds, &gone))
        return err;
      sql_write write;
      if (st.store)
        for (auto& old : gone)
          write.push_back(records::delete_item(old.sequence()));
      auto rp = self->make_response_promise<context_evicted>();
      persist(self, std::move(write), rp,
              context_evicted{account_evictions(self, gone, "new bounds")});
      return rp;
    },
    [self](passivate_atom) -> caf::result<bool> {
      if (self->state.in_flight > 0)
        return false;
      // Everything this window holds is stored: its IDs are no longer live
      // in memory (the store knows them). Answer first, then stop.
      std::vector<uint64_t> numbers;
      for (auto& item : self->state.window.newest(UINT64_MAX))
        numbers.push_back(item.sequence());
      release(self, std::move(numbers));
      auto rp = self->make_response_promise<bool>();
      rp.deliver(true);
      self->quit();
      return rp;
    },
  };
}

} // namespace spindle
