#include "spindle/messages/context_window.hpp"

#include <algorithm>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"

namespace spindle {

caf::error validate(const window_options& options) {
  if (options.capacity < 1)
    return make_error(errc::invalid_argument,
                      "capacity must be at least 1, got "
                        + std::to_string(options.capacity));
  if (options.token_budget < 0)
    return make_error(errc::invalid_argument,
                      "token_budget must be 0 (no bound) or positive, got "
                        + std::to_string(options.token_budget));
  return caf::none;
}

context_window::context_window(window_options options) {
  if (!validate(options))
    options_ = options;
}

bool context_window::over_bounds(uint64_t extra_items,
                                 uint64_t extra_tokens) const noexcept {
  if (live_ + extra_items > static_cast<uint64_t>(options_.capacity))
    return true;
  return options_.token_budget > 0
         && tokens_ + extra_tokens
              > static_cast<uint64_t>(options_.token_budget);
}

caf::error context_window::admissible(const context_item& item) const {
  auto seq = item.sequence();
  if (seq == 0)
    return make_error(errc::invalid_id, "id '" + item.id()
                                          + "' is not a context item ID");
  if (index_.count(seq) > 0)
    return make_error(errc::already_exists,
                      "id '" + item.id() + "' is already in the window");
  auto tokens = item.tokens();
  if (options_.token_budget > 0
      && tokens > static_cast<uint64_t>(options_.token_budget))
    return make_error(errc::capacity_exceeded,
                      "content of " + std::to_string(item.content().size())
                        + " bytes is about " + std::to_string(tokens)
                        + " tokens, more than the whole token_budget of "
                        + std::to_string(options_.token_budget));
  return caf::none;
}

caf::error context_window::push(context_item item,
                                std::vector<context_item>* evicted) {
  if (auto err = admissible(item))
    return err;
  auto tokens = item.tokens();
  while (live_ > 0 && over_bounds(1, tokens))
    evict_oldest(evicted);
  index_.emplace(item.sequence(), base_ + slots_.size());
  slots_.emplace_back(std::move(item));
  ++live_;
  tokens_ += tokens;
  return caf::none;
}

void context_window::evict_oldest(std::vector<context_item>* evicted) {
  drop_holes();
  if (slots_.empty())
    return;
  auto& oldest = *slots_.front();
  index_.erase(oldest.sequence());
  tokens_ -= oldest.tokens();
  --live_;
  if (evicted != nullptr)
    evicted->push_back(std::move(oldest));
  slots_.pop_front();
  ++base_;
  drop_holes();
}

void context_window::drop_holes() {
  while (!slots_.empty() && !slots_.front()) {
    slots_.pop_front();
    ++base_;
  }
  while (!slots_.empty() && !slots_.back())
    slots_.pop_back();
  // Holes in the middle stay until they reach an end; compact once they
  // outnumber the items, so the cost is O(1) amortized per erase.
  if (slots_.size() > 2 * live_ + 32) {
    std::deque<std::optional<context_item>> packed;
    for (auto& slot : slots_)
      if (slot) {
        index_[slot->sequence()] = base_ + packed.size();
        packed.emplace_back(std::move(slot));
      }
    slots_.swap(packed);
  }
}

const context_item* context_window::find(std::string_view id) const {
  auto seq = parse_context_id(id);
  if (!seq)
    return nullptr;
  auto i = index_.find(*seq);
  if (i == index_.end())
    return nullptr;
  return &*slots_[static_cast<size_t>(i->second - base_)];
}

std::optional<context_item> context_window::erase(std::string_view id) {
  auto seq = parse_context_id(id);
  if (!seq)
    return std::nullopt;
  auto i = index_.find(*seq);
  if (i == index_.end())
    return std::nullopt;
  auto& slot = slots_[static_cast<size_t>(i->second - base_)];
  std::optional<context_item> out{std::move(*slot)};
  slot.reset();
  index_.erase(i);
  tokens_ -= out->tokens();
  --live_;
  drop_holes();
  return out;
}

std::vector<context_item> context_window::newest(uint64_t limit) const {
  std::vector<context_item> out;
  out.reserve(static_cast<size_t>(std::min<uint64_t>(limit, live_)));
  for (auto i = slots_.rbegin(); i != slots_.rend() && out.size() < limit; ++i)
    if (*i)
      out.push_back(**i);
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<context_item> context_window::clear() {
  std::vector<context_item> out;
  out.reserve(live_);
  for (auto& slot : slots_)
    if (slot)
      out.push_back(std::move(*slot));
  base_ += slots_.size();
  slots_.clear();
  index_.clear();
  live_ = 0;
  tokens_ = 0;
  return out;
}

caf::error context_window::configure(window_options options,
                                     std::vector<context_item>* evicted) {
  if (auto err = validate(options))
    return err;
  options_ = options;
  while (live_ > 0 && over_bounds(0, 0))
    evict_oldest(evicted);
  return caf::none;
}

} // namespace spindle
