// POST /v1/tokens/count: exact token counts of a text or of chat messages
// for a model's encoding (docs/tokens.md, docs/api.md "Tokens").

#include <deque>
#include <mutex>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "router.hpp"
#include "core/logging.hpp"
#include "spindle/runtime/tokenizer.hpp"

namespace spindle::http {

namespace {

// Model names already logged as unknown. Bounded: clients choose the
// names, and past the bound a new name is no longer logged.
constexpr size_t max_logged_models = 1024;

void log_unknown_model(const std::string& model) {
  static std::mutex mx;
  static std::unordered_set<std::string> logged;
  std::lock_guard<std::mutex> guard{mx};
  if (logged.size() >= max_logged_models || !logged.insert(model).second)
    return;
  spdlog::info(log_fields("tokenizer_unknown_model",
                          {{"model", model.substr(0, 128)},
                           {"encoding", "o200k_base"}}));
}

std::string joined_encodings() {
  std::string out;
  for (auto& name : tokens::encoding_names())
    out += (out.empty() ? "" : ", ") + name;
  return out;
}

// The request's encoding: its `encoding`, else the server's --tokenizer,
// else its model's, else o200k_base.
const tokens::encoding& choose_encoding(const json& body,
                                        const std::string& forced) {
  std::string name = forced;
  auto asked = optional_string(body, "encoding");
  auto model = optional_string(body, "model");
  if (asked) {
    name = *asked;
  } else if (model && name.empty()) {
    auto choice = tokens::encoding_for_model(*model);
    if (!choice.known)
      log_unknown_model(*model);
    name = choice.encoding;
  }
  if (name.empty())
    name = "o200k_base";
  auto* enc = tokens::encoding::find(name);
  if (!enc)
    throw api_error{400, "invalid_argument",
                    "field 'encoding' must be one of " + joined_encodings()
                      + "; not '" + name.substr(0, 32) + "'",
                    "encoding"};
  return *enc;
}

// The messages' texts: views into `messages` and `keep` (the texts of
// content parts), which must outlive them.
std::vector<tokens::message_text> chat_texts(const json& messages,
                                             std::deque<std::string>& keep) {
  if (!messages.is_array())
    throw api_error{400, "malformed",
                    "field 'messages' must be an array of messages",
                    "messages"};
  std::vector<tokens::message_text> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    auto& m = messages[i];
    auto param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object())
      throw api_error{400, "malformed", param + " must be an object", param};
    for (auto& [key, value] : m.items())
      if (key != "role" && key != "content" && key != "name")
        throw api_error{400, "unknown_field",
                        param + " has an unknown field '" + key.substr(0, 64)
                          + "'; accepted: role, content, name",
                        param + "." + key.substr(0, 64)};
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      throw api_error{400, "malformed", param + ".role must be a string",
                      param + ".role"};
    tokens::message_text text;
    text.role = role->get_ref<const std::string&>();
    if (auto c = m.find("content"); c != m.end() && !c->is_null()) {
      if (c->is_string()) {
        text.content = c->get_ref<const std::string&>();
      } else {
        keep.push_back(chat_content_text(*c, param + ".content"));
        text.content = keep.back();
      }
    }
    if (auto n = m.find("name"); n != m.end() && !n->is_null()) {
      if (!n->is_string())
        throw api_error{400, "malformed", param + ".name must be a string",
                        param + ".name"};
      text.name = n->get_ref<const std::string&>();
    }
    out.push_back(text);
  }
  return out;
}

} // namespace

void add_token_routes(router& r) {
  r.post("/v1/tokens/count", "POST /v1/tokens/count",
         [&r](const request& req, response& res, request_context& ctx) {
           auto body
             = parse_body(req, {"text", "messages", "model", "encoding"});
           bool has_text = body.contains("text") && !body["text"].is_null();
           bool has_messages
             = body.contains("messages") && !body["messages"].is_null();
           if (has_text == has_messages)
             throw api_error{400, "malformed",
                             "give exactly one of the fields 'text' and "
                             "'messages'",
                             has_text ? "messages" : "text"};
           auto& enc = choose_encoding(body, r.options().tokenizer);
           size_t n = 0;
           if (has_text) {
             n = enc.count(required_string(body, "text"));
           } else {
             std::deque<std::string> keep;
             n = tokens::count_messages(enc,
                                        chat_texts(body["messages"], keep));
           }
           std::string name{enc.name()};
           ctx.log["encoding"] = name;
           ctx.log["tokens"] = n;
           reply(res, 200, {{"tokens", n}, {"encoding", name}});
         });
}

} // namespace spindle::http
