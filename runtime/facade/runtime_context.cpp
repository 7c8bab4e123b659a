// The runtime facade's context-item calls: every call finds the thread's
// manager at the context directory, then asks the manager.

#include <caf/all.hpp>

#include "spindle/runtime/runtime.hpp"

namespace spindle {

namespace {

bool is_missing(const caf::expected<context_manager_actor>& manager) {
  return !manager && classify(manager.error()) == errc::not_found;
}

// What a read of a thread without a window answers (none is created).
template <class R>
using fallback = std::function<caf::expected<R>()>;

// A manager passivated between the lookup and the request is looked up
// again: it holds exactly what it stored.
constexpr int max_lookups = 4;

bool passivated(const caf::error& err) {
  return err == caf::sec::request_receiver_down;
}

// Two-hop call: directory (get or open), then the manager.
template <class R, class... Ts>
caf::expected<R> via_manager(runtime& rt, std::chrono::milliseconds timeout,
                             const std::string& thread, bool create,
                             const fallback<R>& if_missing, const Ts&... xs) {
  for (int attempt = 1;; ++attempt) {
    auto manager = rt.context_manager_of(thread, create);
    if (if_missing && is_missing(manager))
      return if_missing();
    if (!manager)
      return manager.error();
    auto result = rt.call<R>(*manager, timeout, xs...);
    if (result || !passivated(result.error()) || attempt == max_lookups)
      return result;
  }
}

// Asynchronous two-hop call: directory (get or open), then the manager.
template <class R, class... Ts>
void via_manager_async(runtime& rt, std::chrono::milliseconds timeout,
                       const std::string& thread, bool create,
                       fallback<R> if_missing,
                       std::function<void(caf::expected<R>)> done,
                       Ts... xs) {
  auto attempt = std::make_shared<int>(1);
  auto lookup = std::make_shared<std::function<void()>>();
  std::function<void(caf::expected<context_manager_actor>)> next =
    [&rt, timeout, if_missing, done, attempt, lookup, xs...](
      caf::expected<context_manager_actor> manager) {
      if (!manager) {
        *lookup = nullptr; // break the cycle
        if (if_missing && is_missing(manager))
          done(if_missing());
        else
          done(manager.error());
        return;
      }
      rt.call_async<R>(*manager, timeout,
                       [done, attempt, lookup](caf::expected<R> result) {
                         if (!result && passivated(result.error())
                             && ++*attempt <= max_lookups) {
                           (*lookup)();
                           return;
                         }
                         *lookup = nullptr;
                         done(std::move(result));
                       },
                       xs...);
    };
  *lookup = [&rt, timeout, thread, create, next] {
    if (create)
      rt.call_async<context_manager_actor>(rt.context_directory(), timeout,
                                           next, ctx_open_atom::value,
                                           thread);
    else
      rt.call_async<context_manager_actor>(rt.context_directory(), timeout,
                                           next, caf::get_atom::value,
                                           thread);
  };
  (*lookup)();
}

caf::error item_not_found(const std::string& thread, const std::string& id) {
  return make_error(errc::not_found,
                    "no item '" + id + "' in thread '" + thread + "'");
}

} // namespace

caf::expected<context_manager_actor>
runtime::context_manager_of(const std::string& thread_id, bool create) {
  if (create)
    return call<context_manager_actor>(context_directory_,
                                       options_.default_timeout,
                                       ctx_open_atom::value, thread_id);
  return call<context_manager_actor>(context_directory_,
                                     options_.default_timeout,
                                     caf::get_atom::value, thread_id);
}

caf::expected<context_add_result>
runtime::add_context(const std::string& thread_id, context_type type,
                     std::string content, nlohmann::json metadata) {
  auto draft = make_context_draft(type, std::move(content),
                                  std::move(metadata));
  if (!draft)
    return draft.error();
  return add_context(thread_id, std::move(*draft));
}

caf::expected<context_add_result>
runtime::add_context(const std::string& thread_id, context_draft draft) {
  return via_manager<context_add_result>(*this, options_.default_timeout,
                                         thread_id, true, nullptr,
                                         caf::add_atom::value, draft);
}

caf::expected<context_add_result>
runtime::restore_context(const std::string& thread_id, context_item item) {
  return via_manager<context_add_result>(*this, options_.default_timeout,
                                         thread_id, true, nullptr,
                                         caf::add_atom::value, item);
}

caf::expected<std::vector<context_item>>
runtime::context_items(const std::string& thread_id, uint64_t limit) {
  return via_manager<std::vector<context_item>>(
    *this, options_.default_timeout, thread_id, false,
    [] {
      return caf::expected<std::vector<context_item>>{
        std::vector<context_item>{}};
    },
    ctx_items_atom::value, limit);
}

caf::expected<context_item>
runtime::get_context_item(const std::string& thread_id,
                          const std::string& id) {
  return via_manager<context_item>(
    *this, options_.default_timeout, thread_id, false,
    [&]() -> caf::expected<context_item> {
      return item_not_found(thread_id, id);
    },
    caf::get_atom::value, id);
}

caf::expected<context_item>
runtime::remove_context_item(const std::string& thread_id,
                             const std::string& id) {
  return via_manager<context_item>(
    *this, options_.default_timeout, thread_id, false,
    [&]() -> caf::expected<context_item> {
      return item_not_found(thread_id, id);
    },
    caf::delete_atom::value, id);
}

caf::expected<uint64_t> runtime::clear_context(const std::string& thread_id) {
  return via_manager<uint64_t>(
    *this, options_.default_timeout, thread_id, false,
    [] { return caf::expected<uint64_t>{uint64_t{0}}; },
    caf::reset_atom::value);
}

caf::expected<std::string>
runtime::render_context(const std::string& thread_id, uint64_t limit) {
  return via_manager<std::string>(
    *this, options_.default_timeout, thread_id, false,
    [] { return caf::expected<std::string>{std::string{}}; },
    ctx_render_atom::value, limit);
}

caf::expected<context_stats>
runtime::get_context_stats(const std::string& thread_id) {
  auto window = options_.context.window;
  return via_manager<context_stats>(
    *this, options_.default_timeout, thread_id, false,
    [&]() -> caf::expected<context_stats> {
      context_stats empty;
      empty.thread_id = thread_id;
      empty.capacity = window.capacity;
      empty.token_budget = window.token_budget;
      return empty;
    },
    ctx_stats_atom::value);
}

caf::expected<context_evicted>
runtime::configure_context(const std::string& thread_id,
                           window_options options) {
  if (auto err = validate(options))
    return err;
  // A new window starts with these bounds; an existing one is re-bounded.
  for (int attempt = 1;; ++attempt) {
    auto manager = call<context_manager_actor>(context_directory_,
                                               options_.default_timeout,
                                               ctx_open_atom::value, thread_id,
                                               options);
    if (!manager)
      return manager.error();
    auto result = call<context_evicted>(*manager, options_.default_timeout,
                                        caf::put_atom::value, options);
    if (result || !passivated(result.error()) || attempt == max_lookups)
      return result;
  }
}

// -- asynchronous variants -------------------------------------------------------

void runtime::add_context_async(
  const std::string& thread_id, context_draft draft,
  std::function<void(caf::expected<context_add_result>)> done) {
  via_manager_async<context_add_result>(*this, options_.default_timeout,
                                        thread_id, true, nullptr,
                                        std::move(done), caf::add_atom::value,
                                        std::move(draft));
}

void runtime::context_items_async(
  const std::string& thread_id, uint64_t limit,
  std::function<void(caf::expected<std::vector<context_item>>)> done) {
  via_manager_async<std::vector<context_item>>(
    *this, options_.default_timeout, thread_id, false,
    [] {
      return caf::expected<std::vector<context_item>>{
        std::vector<context_item>{}};
    },
    std::move(done), ctx_items_atom::value, limit);
}

void runtime::get_context_item_async(
  const std::string& thread_id, const std::string& id,
  std::function<void(caf::expected<context_item>)> done) {
  via_manager_async<context_item>(
    *this, options_.default_timeout, thread_id, false,
    [thread_id, id]() -> caf::expected<context_item> {
      return item_not_found(thread_id, id);
    },
    std::move(done), caf::get_atom::value, id);
}

void runtime::remove_context_item_async(
  const std::string& thread_id, const std::string& id,
  std::function<void(caf::expected<context_item>)> done) {
  via_manager_async<context_item>(
    *this, options_.default_timeout, thread_id, false,
    [thread_id, id]() -> caf::expected<context_item> {
      return item_not_found(thread_id, id);
    },
    std::move(done), caf::delete_atom::value, id);
}

void runtime::clear_context_async(
  const std::string& thread_id,
  std::function<void(caf::expected<uint64_t>)> done) {
  via_manager_async<uint64_t>(
    *this, options_.default_timeout, thread_id, false,
    [] { return caf::expected<uint64_t>{uint64_t{0}}; }, std::move(done),
    caf::reset_atom::value);
}

void runtime::render_context_async(
  const std::string& thread_id, uint64_t limit,
  std::function<void(caf::expected<std::string>)> done) {
  via_manager_async<std::string>(
    *this, options_.default_timeout, thread_id, false,
    [] { return caf::expected<std::string>{std::string{}}; },
    std::move(done), ctx_render_atom::value, limit);
}

} // namespace spindle
