#pragma once

#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string_view>
#include <type_traits>
#include <vector>

#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>

#include "spindle/messages/chat.hpp"
#include "spindle/messages/threads.hpp"

// What a model is given (docs/builder.md, "The prompt"). A prompt's
// history is read in place from the thread's published turn log, which
// the prompt keeps alive: a build does not copy the turns a prompt keeps,
// and neither does handing the prompt on (to an exchange, to a provider,
// to a retry), where a vector of chat messages copied every turn each
// time.

namespace spindle {

/// One message of a `prompt`, read in place. The views are valid while
/// the prompt they were read from lives and is not changed.
struct chat_message_view {
  std::string_view role;
  std::string_view content;
  std::string_view tool_call_id;
  /// The calls an assistant message makes; empty for every other role.
  const std::vector<tool_call>& tool_calls;

  /// A copy that owns its text.
  chat_message to_message() const;
};

/// The messages of a prompt in OpenAI's chat order: messages it owns
/// (the system prompt, the summary, the memory snippet, the user's
/// message, results that say a call was interrupted) and stored turns of
/// a thread read in place from the log that holds them. A prompt keeps
/// that log alive with one reference for all its turns. Copying a prompt
/// copies its owned messages and shares the log; neither copies a turn.
/// Not thread-safe; const members may be called from several threads.
class prompt {
public:
  /// Reads the messages in order; each one a view, as `operator[]`.
  class const_iterator {
  public:
    using iterator_category = std::input_iterator_tag;
    using value_type = chat_message_view;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = chat_message_view;

    const_iterator() = default;
    const_iterator(const prompt* p, size_t i) : p_(p), i_(i) {
    }
    chat_message_view operator*() const {
      return (*p_)[i_];
    }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    const_iterator operator++(int) {
      auto old = *this;
      ++i_;
      return old;
    }
    friend bool operator==(const const_iterator& x, const const_iterator& y) {
      return x.i_ == y.i_;
    }
    friend bool operator!=(const const_iterator& x, const const_iterator& y) {
      return x.i_ != y.i_;
    }

  private:
    const prompt* p_ = nullptr;
    size_t i_ = 0;
  };

  prompt() = default;

  /// A prompt of owned messages.
  prompt(std::vector<chat_message> messages); // NOLINT: implicit on purpose
  prompt(std::initializer_list<chat_message> messages);

  size_t size() const noexcept {
    return entries_.size();
  }
  bool empty() const noexcept {
    return entries_.empty();
  }
  /// Precondition: `i < size()`.
  chat_message_view operator[](size_t i) const;
  chat_message_view front() const {
    return (*this)[0];
  }
  chat_message_view back() const {
    return (*this)[size() - 1];
  }
  const_iterator begin() const {
    return {this, 0};
  }
  const_iterator end() const {
    return {this, size()};
  }

  /// The messages as copies that own their text.
  std::vector<chat_message> to_messages() const;

  /// Stored turns read in place must outlive the prompt: `owner` keeps
  /// them (a thread's published log). A prompt keeps one owner; setting
  /// another one copies the turns read in place so far first.
  void keep(std::shared_ptr<const void> owner);

  void reserve(size_t n);
  void push_back(chat_message x);
  /// Appends the stored turn `x`, read in place; with `as_result` as a
  /// tool result (its calls left out). Precondition: `keep` was given
  /// what holds `x`.
  void push_turn(const turn& x, bool as_result = false);
  /// Precondition: `!empty()`.
  void pop_back();

  friend bool operator==(const prompt& x, const prompt& y);
  friend bool operator!=(const prompt& x, const prompt& y) {
    return !(x == y);
  }

private:
  struct entry {
    const turn* stored; // null: owned_[owned]
    size_t owned;
    bool result;
  };
  std::vector<entry> entries_;
  std::vector<chat_message> owned_;
  std::shared_ptr<const void> owner_;
};

/// Travels as its messages (owned at the receiver).
template <class Inspector>
typename std::enable_if<Inspector::reads_state,
                        typename Inspector::result_type>::type
inspect(Inspector& f, prompt& x) {
  auto messages = x.to_messages();
  return f(caf::meta::type_name("prompt"), messages);
}

template <class Inspector>
typename std::enable_if<Inspector::writes_state,
                        typename Inspector::result_type>::type
inspect(Inspector& f, prompt& x) {
  std::vector<chat_message> messages;
  auto load = caf::meta::load_callback([&]() -> caf::error {
    x = prompt{std::move(messages)};
    return caf::none;
  });
  return f(caf::meta::type_name("prompt"), messages, load);
}

} // namespace spindle
