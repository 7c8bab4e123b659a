// Which encoding counts a model's tokens, and the chat format's overhead
// (docs/tokens.md, "Models" and "Chat messages").

#include "spindle/runtime/tokenizer.hpp"

#include <utility>

namespace spindle::tokens {

namespace {

constexpr const char* o200k = "o200k_base";
constexpr const char* cl100k = "cl100k_base";

// tiktoken's MODEL_TO_ENCODING (tiktoken/model.py), the rows of these two
// encodings.
constexpr std::pair<std::string_view, const char*> exact_models[] = {
  {"o1", o200k},
  {"o3", o200k},
  {"o4-mini", o200k},
  {"gpt-5", o200k},
  {"gpt-4.1", o200k},
  {"gpt-4o", o200k},
  {"gpt-4", cl100k},
  {"gpt-3.5-turbo", cl100k},
  {"gpt-3.5", cl100k},
  {"gpt-35-turbo", cl100k},
  {"davinci-002", cl100k},
  {"babbage-002", cl100k},
  {"text-embedding-ada-002", cl100k},
  {"text-embedding-3-small", cl100k},
  {"text-embedding-3-large", cl100k},
};

// tiktoken's MODEL_PREFIX_TO_ENCODING, in its order (the first prefix that
// matches wins). `gpt-oss-` is o200k_harmony there: o200k_base with more
// special tokens, the same tokens for ordinary text.
constexpr std::pair<std::string_view, const char*> model_prefixes[] = {
  {"o1-", o200k},
  {"o3-", o200k},
  {"o4-mini-", o200k},
  {"gpt-5-", o200k},
  {"gpt-4.5-", o200k},
  {"gpt-4.1-", o200k},
  {"chatgpt-4o-", o200k},
  {"gpt-4o-", o200k},
  {"gpt-4-", cl100k},
  {"gpt-3.5-turbo-", cl100k},
  {"gpt-35-turbo-", cl100k},
  {"gpt-oss-", o200k},
  {"ft:gpt-4o", o200k},
  {"ft:gpt-4", cl100k},
  {"ft:gpt-3.5-turbo", cl100k},
  {"ft:davinci-002", cl100k},
  {"ft:babbage-002", cl100k},
};

} // namespace

model_encoding encoding_for_model(std::string_view model) {
  for (auto& [name, enc] : exact_models)
    if (model == name)
      return {enc, true};
  for (auto& [prefix, enc] : model_prefixes)
    if (model.substr(0, prefix.size()) == prefix)
      return {enc, true};
  return {o200k, false};
}

size_t count_messages(const encoding& enc,
                      const std::vector<message_text>& messages) {
  size_t n = tokens_reply_primer;
  for (auto& m : messages) {
    n += tokens_per_message + enc.count(m.role) + enc.count(m.content);
    if (m.name)
      n += tokens_per_name + enc.count(*m.name);
  }
  return n;
}

} // namespace spindle::tokens
