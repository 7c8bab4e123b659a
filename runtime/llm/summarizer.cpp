// Summarizers: the offline extractive one and the provider-backed one
// (runtime/summarizer.hpp, docs/threads.md "Compaction").

#include "spindle/runtime/summarizer.hpp"

#include <deque>

#include "spindle/messages/error.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/runtime/llm.hpp"

namespace spindle {

summarizer::~summarizer() = default;

bool summarizer::blocking() const noexcept {
  return true;
}

bool summarizer::start(summary_input, summary_done) {
  return false;
}

namespace {

constexpr size_t max_line_text = 160;

// Whether `at` starts a UTF-8 character (not a continuation byte).
bool char_start(const std::string& s, size_t at) {
  return at >= s.size() || (static_cast<unsigned char>(s[at]) & 0xC0) != 0x80;
}

// The first sentence of `text`, at most `max_line_text` bytes, cut at a
// word (or a character) with "..." when it had to be cut.
std::string first_sentence(const std::string& text) {
  for (size_t i = 0; i < text.size() && i < max_line_text; ++i) {
    auto c = text[i];
    if ((c == '.' || c == '!' || c == '?')
        && (i + 1 == text.size() || text[i + 1] == ' '))
      return text.substr(0, i + 1);
  }
  if (text.size() <= max_line_text)
    return text;
  auto cut = text.rfind(' ', max_line_text);
  if (cut == std::string::npos || cut < max_line_text / 2) {
    cut = max_line_text;
    while (cut > 0 && !char_start(text, cut))
      --cut;
  }
  return text.substr(0, cut) + "...";
}

std::string line_of(const turn& t) {
  std::string out = to_string(t.role);
  out += ": ";
  auto text = first_sentence(memory_normalized(t.content));
  if (!t.tool_calls.empty()) {
    out += "called ";
    for (size_t i = 0; i < t.tool_calls.size(); ++i)
      out += (i > 0 ? ", " : "") + t.tool_calls[i].name;
    if (!text.empty())
      out += "; ";
  }
  return out + text;
}

} // namespace

extractive_summarizer::extractive_summarizer(size_t max_bytes)
  : max_bytes_(std::min(max_bytes, max_summary_content)) {
}

std::string extractive_summarizer::name() const {
  return "extractive";
}

bool extractive_summarizer::blocking() const noexcept {
  return false;
}

caf::expected<std::string>
extractive_summarizer::summarize(const summary_input& input) {
  std::deque<std::string> lines;
  size_t bytes = 0;
  auto push = [&](std::string line) {
    if (line.empty())
      return;
    bytes += line.size() + 1;
    lines.push_back(std::move(line));
    while (bytes > max_bytes_ + 1 && lines.size() > 1) {
      bytes -= lines.front().size() + 1;
      lines.pop_front();
    }
  };
  size_t start = 0;
  auto& prev = input.previous;
  for (size_t i = 0; i <= prev.size(); ++i)
    if (i == prev.size() || prev[i] == '\n') {
      push(prev.substr(start, i - start));
      start = i + 1;
    }
  for (auto& t : input.turns)
    if (t.role != turn_role::tool) // a result's gist is its call's answer
      push(line_of(t));
  std::string out;
  for (auto& line : lines) {
    if (!out.empty())
      out += '\n';
    out += line;
  }
  if (out.size() > max_bytes_) { // one line longer than the whole budget
    auto cut = max_bytes_;
    while (cut > 0 && !char_start(out, cut))
      --cut;
    out.resize(cut);
  }
  if (out.empty())
    out = "(nothing said)";
  return out;
}

std::vector<chat_message> summary_prompt(const summary_input& input) {
  std::string body = "Summary so far:\n";
  body += input.previous.empty() ? "(none)" : input.previous;
  body += "\n\nNew turns:\n";
  for (auto& t : input.turns) {
    body += to_string(t.role);
    if (!t.tool_calls.empty()) {
      body += " (calls";
      for (auto& c : t.tool_calls)
        body += " " + c.name + "(" + c.arguments + ")";
      body += ")";
    }
    if (!t.tool_call_id.empty())
      body += " (result of " + t.tool_call_id + ")";
    body += ": ";
    body += t.content;
    body += "\n";
  }
  return {
    chat_message{"system",
                 "You keep the running summary of a conversation. Fold the "
                 "new turns into the summary so far. Keep names, numbers, "
                 "decisions, open questions and what the user wants; drop "
                 "pleasantries. Answer with the updated summary only, in at "
                 "most 300 words.",
                 {},
                 {}},
    chat_message{"user", std::move(body), {}, {}}};
}

llm_summarizer::llm_summarizer(std::shared_ptr<llm_provider> provider,
                               std::chrono::milliseconds timeout,
                               std::string model)
  : provider_(std::move(provider)), timeout_(timeout),
    model_(std::move(model)) {
}

std::string llm_summarizer::name() const {
  return provider_ ? "llm:" + provider_->name() : "llm";
}

completion_options llm_summarizer::options() const {
  completion_options out;
  out.timeout = timeout_;
  out.model = model_;
  out.max_tokens = 1024;
  return out;
}

namespace {

// A model's answer as a summary: trimmed, not empty, not oversized.
caf::expected<std::string> summary_of(caf::expected<completion> out) {
  if (!out)
    return out.error();
  auto text = trim_model_output(out->text);
  if (text.empty())
    return make_error(errc::invalid_argument, "the summary came back empty");
  if (text.size() > max_summary_content)
    return make_error(errc::invalid_argument,
                      "the summary came back with " + std::to_string(text.size())
                        + " bytes; at most "
                        + std::to_string(max_summary_content) + " are kept");
  return text;
}

} // namespace

caf::expected<std::string>
llm_summarizer::summarize(const summary_input& input) {
  if (!provider_)
    return make_error(errc::unavailable, "the summarizer has no provider");
  try {
    return summary_of(provider_->complete(summary_prompt(input), options(), {}));
  } catch (const std::exception& e) {
    return make_error(errc::upstream_failure,
                      std::string{"the provider threw: "} + e.what());
  } catch (...) {
    return make_error(errc::upstream_failure, "the provider threw");
  }
}

bool llm_summarizer::start(summary_input input, summary_done done) {
  if (!provider_)
    return false;
  return provider_->start(summary_prompt(input), options(),
                          [](std::string_view) { return true; },
                          [done = std::move(done)](
                            caf::expected<completion> out) {
                            done(summary_of(std::move(out)));
                          });
}

} // namespace spindle
