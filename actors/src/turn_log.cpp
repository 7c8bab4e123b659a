#include "spindle/actors/turn_log.hpp"

#include <new>
#include <stdexcept>

#include "spindle/messages/work.hpp"

namespace spindle {

turn_log::~turn_log() {
  auto n = size_.load(std::memory_order_acquire);
  for (size_t k = 0; k < max_segments; ++k) {
    auto* seg = segments_[k].load(std::memory_order_acquire);
    if (seg == nullptr)
      break;
    auto start = first_segment * ((size_t{1} << k) - 1);
    auto len = first_segment << k;
    for (size_t i = 0; i < len && start + i < n; ++i)
      seg[i].~turn();
    ::operator delete(static_cast<void*>(seg));
  }
}

size_t turn_log::push_back(turn x) {
  auto n = size_.load(std::memory_order_relaxed);
  if (n == capacity())
    throw std::length_error("a thread holds at most 2^30 turns");
  auto [k, offset] = locate(n);
  auto* seg = segments_[k].load(std::memory_order_relaxed);
  if (seg == nullptr) {
    seg = static_cast<turn*>(::operator new(sizeof(turn) * (first_segment << k)));
    segments_[k].store(seg, std::memory_order_release);
  }
  new (seg + offset) turn(std::move(x));
  size_.store(n + 1, std::memory_order_release);
  return n + 1;
}

void turn_log::copy(size_t first, size_t last, std::vector<turn>& out) const {
  count_work(work_kind::turns_copied, last - first);
  out.reserve(out.size() + (last - first));
  for (auto i = first; i < last; ++i)
    out.push_back((*this)[i]);
}

std::pair<size_t, size_t> window_bounds(const thread_view& view,
                                        uint64_t max_turns) {
  auto& log = *view.turns;
  auto n = log.size();
  auto first = history_window_start_in(
    log, n, static_cast<size_t>(std::min<uint64_t>(max_turns, n)));
  return {first, n};
}

history_window read_window(const thread_view& view, uint64_t max_turns) {
  auto& log = *view.turns;
  auto [first, n] = window_bounds(view, max_turns);
  history_window w;
  log.copy(first, n, w.turns);
  w.total_turns = n;
  w.epoch = view.epoch;
  w.found = true;
  w.thread_actor_id = view.actor_id;
  if (view.summary)
    w.summary = *view.summary;
  return w;
}

void thread_views::publish(const std::string& thread_id,
                           std::shared_ptr<const thread_view> view) {
  auto& s = shard_of(thread_id);
  std::lock_guard<std::mutex> guard{s.mtx};
  s.map[thread_id] = std::move(view);
}

void thread_views::withdraw(const std::string& thread_id, uint64_t actor_id) {
  std::shared_ptr<const thread_view> dropped; // released outside the lock
  auto& s = shard_of(thread_id);
  std::lock_guard<std::mutex> guard{s.mtx};
  auto i = s.map.find(thread_id);
  if (i != s.map.end() && i->second->actor_id == actor_id) {
    dropped = std::move(i->second);
    s.map.erase(i);
  }
}

std::shared_ptr<const thread_view>
thread_views::find(const std::string& thread_id) const {
  auto& s = shard_of(thread_id);
  std::lock_guard<std::mutex> guard{s.mtx};
  auto i = s.map.find(thread_id);
  return i == s.map.end() ? nullptr : i->second;
}

size_t thread_views::size() const {
  size_t n = 0;
  for (auto& s : shards_) {
    std::lock_guard<std::mutex> guard{s.mtx};
    n += s.map.size();
  }
  return n;
}

} // namespace spindle
