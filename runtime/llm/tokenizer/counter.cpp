// The token counter of threads and the context builder (messages/tokens.hpp)
// over one of the encodings.

#include "spindle/messages/tokens.hpp"

#include <array>

#include "spindle/runtime/tokenizer.hpp"

namespace spindle {

namespace {

class encoding_counter final : public token_counter {
public:
  encoding_counter(const tokens::encoding& enc, token_encoding_id id)
    : enc_(enc), id_(id) {
    for (size_t i = 0; i < roles_.size(); ++i)
      role_tokens_[i] = enc_.count(roles_[i]);
  }

  token_encoding_id id() const noexcept override {
    return id_;
  }

  std::string_view name() const noexcept override {
    return enc_.name();
  }

  size_t count_text(std::string_view text) const override {
    return text.empty() ? 0 : enc_.count(text);
  }

  size_t count_role(std::string_view role) const override {
    for (size_t i = 0; i < roles_.size(); ++i)
      if (role == roles_[i])
        return role_tokens_[i];
    return count_text(role);
  }

private:
  static constexpr std::array<std::string_view, 4> roles_{
    "system", "user", "assistant", "tool"};
  const tokens::encoding& enc_;
  token_encoding_id id_;
  std::array<size_t, 4> role_tokens_{};
};

} // namespace

std::shared_ptr<const token_counter> make_token_counter(std::string_view name) {
  token_encoding_id id;
  if (name == "o200k_base")
    id = token_encoding_id::o200k_base;
  else if (name == "cl100k_base")
    id = token_encoding_id::cl100k_base;
  else
    return nullptr;
  auto enc = tokens::encoding::find(name);
  if (enc == nullptr)
    return nullptr;
  return std::make_shared<encoding_counter>(*enc, id);
}

} // namespace spindle
