#include "spindle/messages/prompt.hpp"

#include <utility>

namespace spindle {

namespace {

const std::vector<tool_call> no_calls;

} // namespace

chat_message chat_message_view::to_message() const {
  return chat_message{std::string{role}, std::string{content},
                      std::string{tool_call_id}, tool_calls};
}

prompt::prompt(std::vector<chat_message> messages)
  : owned_(std::move(messages)) {
  entries_.reserve(owned_.size());
  for (size_t i = 0; i < owned_.size(); ++i)
    entries_.push_back(entry{nullptr, i, false});
}

prompt::prompt(std::initializer_list<chat_message> messages)
  : prompt(std::vector<chat_message>{messages}) {
}

chat_message_view prompt::operator[](size_t i) const {
  auto& e = entries_[i];
  if (e.stored == nullptr) {
    auto& m = owned_[e.owned];
    return {m.role, m.content, m.tool_call_id, m.tool_calls};
  }
  auto& t = *e.stored;
  return {to_string(t.role), t.content, t.tool_call_id,
          e.result ? no_calls : t.tool_calls};
}

std::vector<chat_message> prompt::to_messages() const {
  std::vector<chat_message> out;
  out.reserve(size());
  for (size_t i = 0; i < size(); ++i)
    out.push_back((*this)[i].to_message());
  return out;
}

void prompt::keep(std::shared_ptr<const void> owner) {
  if (owner_ == owner)
    return;
  if (owner_) {
    // The turns read in place so far become owned copies.
    for (auto& e : entries_) {
      if (e.stored == nullptr)
        continue;
      auto view = (*this)[static_cast<size_t>(&e - entries_.data())];
      owned_.push_back(view.to_message());
      e = entry{nullptr, owned_.size() - 1, false};
    }
  }
  owner_ = std::move(owner);
}

void prompt::reserve(size_t n) {
  entries_.reserve(n);
}

void prompt::push_back(chat_message x) {
  owned_.push_back(std::move(x));
  entries_.push_back(entry{nullptr, owned_.size() - 1, false});
}

void prompt::push_turn(const turn& x, bool as_result) {
  entries_.push_back(entry{&x, 0, as_result});
}

void prompt::pop_back() {
  auto& e = entries_.back();
  if (e.stored == nullptr && e.owned + 1 == owned_.size())
    owned_.pop_back();
  entries_.pop_back();
}

bool operator==(const prompt& x, const prompt& y) {
  if (x.size() != y.size())
    return false;
  for (size_t i = 0; i < x.size(); ++i) {
    auto a = x[i];
    auto b = y[i];
    if (a.role != b.role || a.content != b.content
        || a.tool_call_id != b.tool_call_id || a.tool_calls != b.tool_calls)
      return false;
  }
  return true;
}

} // namespace spindle
