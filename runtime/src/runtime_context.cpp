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

// Asynchronous two-hop call: directory (get or open), then the manager.
template <class R, class... Ts>
void via_manager_async(runtime& rt, std::chrono::milliseconds timeout,
                       const std::string& thread, bool create,
                       fallback<R> if_missing,
                       std::function<void(caf::expected<R>)> done,
                       Ts... xs) {
  std::function<void(caf::expected<context_manager_actor>)> next =
    [&rt, timeout, if_missing, done, xs...](
      caf::expected<context_manager_actor> manager) {
      if (!manager) {
        if (if_missing && is_missing(manager))
          done(if_missing());
        else
          done(manager.error());
        return;
      }
      rt.call_async<R>(*manager, timeout, done, xs...);
    };
  if (create)
    rt.call_async<context_manager_actor>(rt.context_directory(), timeout,
                                         std::move(next),
                                         ctx_open_atom::value, thread);
  else
    rt.call_async<context_manager_actor>(rt.context_directory(), timeout,
                                         std::move(next),
                                         caf::get_atom::value, thread);
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
  auto manager = context_manager_of(thread_id, true);
  if (!manager)
    return manager.error();
  return call<context_add_result>(*manager, options_.default_timeout,
                                  caf::add_atom::value, std::move(draft));
}

caf::expected<context_add_result>
runtime::restore_context(const std::string& thread_id, context_item item) {
  auto manager = context_manager_of(thread_id, true);
  if (!manager)
    return manager.error();
  return call<context_add_result>(*manager, options_.default_timeout,
                                  caf::add_atom::value, std::move(item));
}

caf::expected<std::vector<context_item>>
runtime::context_items(const std::string& thread_id, uint64_t limit) {
  auto manager = context_manager_of(thread_id, false);
  if (is_missing(manager))
    return std::vector<context_item>{};
  if (!manager)
    return manager.error();
  return call<std::vector<context_item>>(*manager, options_.default_timeout,
                                         ctx_items_atom::value, limit);
}

caf::expected<context_item>
runtime::get_context_item(const std::string& thread_id,
                          const std::string& id) {
  auto manager = context_manager_of(thread_id, false);
  if (is_missing(manager))
    return item_not_found(thread_id, id);
  if (!manager)
    return manager.error();
  return call<context_item>(*manager, options_.default_timeout,
                            caf::get_atom::value, id);
}

caf::expected<context_item>
runtime::remove_context_item(const std::string& thread_id,
                             const std::string& id) {
  auto manager = context_manager_of(thread_id, false);
  if (is_missing(manager))
    return item_not_found(thread_id, id);
  if (!manager)
    return manager.error();
  return call<context_item>(*manager, options_.default_timeout,
                            caf::delete_atom::value, id);
}

caf::expected<uint64_t> runtime::clear_context(const std::string& thread_id) {
  auto manager = context_manager_of(thread_id, false);
  if (is_missing(manager))
    return uint64_t{0};
  if (!manager)
    return manager.error();
  return call<uint64_t>(*manager, options_.default_timeout,
                        caf::reset_atom::value);
}

caf::expected<std::string>
runtime::render_context(const std::string& thread_id, uint64_t limit) {
  auto manager = context_manager_of(thread_id, false);
  if (is_missing(manager))
    return std::string{};
  if (!manager)
    return manager.error();
  return call<std::string>(*manager, options_.default_timeout,
                           ctx_render_atom::value, limit);
}

caf::expected<context_stats>
runtime::get_context_stats(const std::string& thread_id) {
  auto manager = context_manager_of(thread_id, false);
  if (is_missing(manager)) {
    context_stats empty;
    empty.thread_id = thread_id;
    empty.capacity = options_.context.window.capacity;
    empty.token_budget = options_.context.window.token_budget;
    return empty;
  }
  if (!manager)
    return manager.error();
  return call<context_stats>(*manager, options_.default_timeout,
                             ctx_stats_atom::value);
}

caf::expected<context_evicted>
runtime::configure_context(const std::string& thread_id,
                           window_options options) {
  if (auto err = validate(options))
    return err;
  // A new window starts with these bounds; an existing one is re-bounded.
  auto manager = call<context_manager_actor>(context_directory_,
                                             options_.default_timeout,
                                             ctx_open_atom::value, thread_id,
                                             options);
  if (!manager)
    return manager.error();
  return call<context_evicted>(*manager, options_.default_timeout,
                               caf::put_atom::value, options);
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
