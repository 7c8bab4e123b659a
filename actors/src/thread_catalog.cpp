#include "spindle/actors/thread_catalog.hpp"

#include "spindle/messages/ids.hpp"

#include <algorithm>

namespace spindle {

namespace {

uint64_t now_us() noexcept {
  using namespace std::chrono;
  return static_cast<uint64_t>(
    duration_cast<microseconds>(system_clock::now().time_since_epoch())
      .count());
}

bool matches(const thread_metadata& metadata,
             const thread_metadata& filters) {
  for (auto& [key, value] : filters) {
    auto i = metadata.find(key);
    if (i == metadata.end() || i->second != value)
      return false;
  }
  return true;
}

} // namespace

uint64_t next_thread_version(uint64_t last) noexcept {
  return std::max(last + 1, now_us());
}

void thread_catalog::create(const std::string& id, int64_t created_ms,
                            uint64_t turns, thread_metadata metadata) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (threads_.count(id) != 0)
    return;
  auto& e = threads_[id];
  e.created_ms = created_ms;
  e.turns = turns;
  e.metadata = std::move(metadata);
  e.version = last_ = next_thread_version(last_);
  current_.emplace(e.version, id);
}

void thread_catalog::bump(const std::string& id, entry& e) {
  current_.erase({e.version, id});
  auto next = last_ = next_thread_version(last_);
  // A walk whose snapshot saw this version lists the thread there.
  if (e.version <= pin_)
    past_.emplace(key{e.version, id}, next);
  e.version = next;
  current_.emplace(e.version, id);
  if ((next & 0x3ff) == 0)
    prune();
}

void thread_catalog::prune() {
  auto horizon = now_us()
                 - static_cast<uint64_t>(
                   std::chrono::microseconds{thread_walk_ttl}.count());
  for (auto i = past_.begin(); i != past_.end();)
    i = i->second < horizon ? past_.erase(i) : std::next(i);
}

void thread_catalog::set_turns(const std::string& id, uint64_t turns) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = threads_.find(id);
  if (i == threads_.end())
    return;
  i->second.turns = turns;
  bump(id, i->second);
}

void thread_catalog::set_metadata(const std::string& id,
                                  thread_metadata metadata) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = threads_.find(id);
  if (i == threads_.end())
    return;
  i->second.metadata = std::move(metadata);
  bump(id, i->second);
}

void thread_catalog::remove(const std::string& id) {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = threads_.find(id);
  if (i == threads_.end())
    return;
  current_.erase({i->second.version, id});
  threads_.erase(i);
  for (auto j = past_.begin(); j != past_.end();)
    j = j->first.second == id ? past_.erase(j) : std::next(j);
}

std::optional<thread_info> thread_catalog::get(const std::string& id) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = threads_.find(id);
  if (i == threads_.end())
    return std::nullopt;
  auto& e = i->second;
  return thread_info{id, e.created_ms, e.version, e.turns, e.metadata};
}

uint64_t thread_catalog::last_version() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return last_;
}

thread_page thread_catalog::list(const thread_list_request& request) {
  std::lock_guard<std::mutex> guard{mtx_};
  thread_page page;
  page.snapshot = request.snapshot;
  if (page.snapshot == 0)
    page.snapshot = pin_ = std::max(pin_, last_);
  auto snapshot = page.snapshot;
  // Below the cursor's place, or everything up to the snapshot.
  key from = request.after_version != 0 || !request.after_id.empty()
               ? key{request.after_version, request.after_id}
               : key{snapshot + 1, std::string{}};
  auto floor = static_cast<uint64_t>(request.updated_after_ms) * 1000;
  auto cur = std::make_reverse_iterator(current_.lower_bound(from));
  auto past = std::make_reverse_iterator(past_.lower_bound(from));
  // Versions the snapshot saw: current ones up to it, past ones it saw
  // before they were replaced.
  auto skip = [&] {
    while (cur != current_.rend() && cur->first > snapshot)
      ++cur;
    while (past != past_.rend()
           && (past->first.first > snapshot || past->second <= snapshot))
      ++past;
  };
  for (skip(); cur != current_.rend() || past != past_.rend(); skip()) {
    const key* next;
    if (past == past_.rend()
        || (cur != current_.rend() && *cur > past->first)) {
      next = &*cur;
      ++cur;
    } else {
      next = &past->first;
      ++past;
    }
    if (next->first <= floor)
      break;
    auto& e = threads_.at(next->second);
    if (!matches(e.metadata, request.filters))
      continue;
    if (request.scoped
        && (request.tenant_prefix.empty()
              ? next->second.find(tenant_separator) != std::string::npos
              : next->second.compare(0, request.tenant_prefix.size(),
                                     request.tenant_prefix)
                  != 0))
      continue;
    if (page.threads.size() == request.limit) {
      page.more = true;
      break;
    }
    page.threads.push_back(
      thread_info{next->second, e.created_ms, e.version, e.turns, e.metadata});
    page.last_version = next->first;
  }
  return page;
}

} // namespace spindle
