#include "spindle/runtime/llm.hpp"

#include <thread>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "net/io_pool.hpp"

#include "spindle/messages/context_builder.hpp"
#include "spindle/messages/error.hpp"

namespace spindle {

llm_provider::~llm_provider() = default;

bool llm_provider::start(prompt, completion_options,
                         delta_callback, completion_done) {
  return false;
}

namespace {

constexpr std::string_view original_prefix = "Original user message:\n";
constexpr std::string_view rewrite_separator
  = "\n\n---\n\nContextualized query:\n";

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// At most `limit` bytes of `text`, never splitting a UTF-8 sequence.
std::string clip(const std::string& text, size_t limit) {
  if (text.size() <= limit)
    return text;
  auto end = limit;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80)
    --end;
  return text.substr(0, end) + "...";
}

const char* yes_no(bool x) {
  return x ? "yes" : "no";
}

} // namespace

std::string trim_model_output(const std::string& text) {
  auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
  };
  size_t b = 0, e = text.size();
  while (b < e && is_space(text[b]))
    ++b;
  while (e > b && is_space(text[e - 1]))
    --e;
  return text.substr(b, e - b);
}

prompt_summary summarize_prompt(const prompt& messages) {
  prompt_summary out;
  out.messages = messages.size();
  if (messages.empty())
    return out;
  size_t first = 0;
  auto is_memory = [](const chat_message_view& m) {
    return m.role == "system" && starts_with(m.content, memory_message_prefix);
  };
  auto is_summary = [](const chat_message_view& m) {
    return m.role == "system"
           && starts_with(m.content, summary_message_prefix);
  };
  if (messages[0].role == "system" && !is_memory(messages[0])
      && !is_summary(messages[0])) {
    out.system_prompt = true;
    first = 1;
  }
  if (first < messages.size() && is_summary(messages[first])) {
    out.summary = true;
    ++first;
  }
  if (first < messages.size() && is_memory(messages[first])) {
    out.memory = true;
    ++first;
  }
  auto last = messages.back();
  auto last_index = messages.size() - 1;
  out.history_turns = last_index > first ? last_index - first : 0;
  std::string_view content{last.content};
  auto sep = content.find(rewrite_separator);
  if (last.role == "user" && starts_with(content, original_prefix)
      && sep != std::string_view::npos) {
    out.rewrite = true;
    out.original = std::string{
      content.substr(original_prefix.size(), sep - original_prefix.size())};
    out.rewritten = std::string{content.substr(sep + rewrite_separator.size())};
  } else {
    out.original = std::string{last.content};
  }
  return out;
}

std::vector<std::string> split_deltas(const std::string& text, size_t parts) {
  std::vector<std::string> out;
  if (text.empty() || parts == 0)
    return out;
  auto target = (text.size() + parts - 1) / parts;
  size_t pos = 0;
  while (pos < text.size()) {
    if (out.size() + 1 == parts) {
      out.push_back(text.substr(pos));
      break;
    }
    auto end = std::min(text.size(), pos + target);
    // Cut after the next space so words stay whole.
    auto space = text.find(' ', end);
    end = space == std::string::npos ? text.size() : space + 1;
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

offline_provider::offline_provider(std::chrono::milliseconds delta_delay,
                                   std::shared_ptr<net::io_pool> loops)
  : delta_delay_(delta_delay), loops_(std::move(loops)) {
}

std::string offline_provider::name() const {
  return "offline";
}

std::string
offline_provider::reply_for(const prompt& messages) {
  auto s = summarize_prompt(messages);
  std::string out = "[offline provider] No language model is configured, so "
                    "this is not an answer. Received ";
  out += std::to_string(s.messages);
  out += s.messages == 1 ? " message: system prompt "
                         : " messages: system prompt ";
  out += yes_no(s.system_prompt);
  if (s.summary)
    out += ", a summary of earlier turns";
  out += ", long-term memory ";
  out += yes_no(s.memory);
  out += ", ";
  out += std::to_string(s.history_turns);
  out += s.history_turns == 1 ? " history turn" : " history turns";
  out += ", rewritten query ";
  out += yes_no(s.rewrite);
  out += ". Your message: \"";
  out += clip(s.original, 500);
  out += "\"";
  if (s.rewrite) {
    out += " Rewritten query: \"";
    out += clip(s.rewritten, 500);
    out += "\"";
  }
  return out;
}

caf::expected<completion>
offline_provider::complete(const prompt& messages,
                           const completion_options&,
                           const delta_callback& on_delta) {
  if (messages.empty())
    return make_error(errc::upstream_failure,
                      "the offline provider received no messages");
  auto text = reply_for(messages);
  completion out;
  for (auto& piece : split_deltas(text, 4)) {
    if (delta_delay_.count() > 0)
      std::this_thread::sleep_for(delta_delay_);
    out.text += piece;
    if (on_delta && !on_delta(piece)) {
      out.interrupted = true;
      break;
    }
  }
  return out;
}

namespace {

// One delayed offline reply: a timer per delta on one event loop.
struct delayed_reply : std::enable_shared_from_this<delayed_reply> {
  delayed_reply(boost::asio::io_context& ctx, std::vector<std::string> ps,
                std::chrono::milliseconds d, delta_callback delta,
                completion_done end)
    : timer(ctx), parts(std::move(ps)), delay(d), on_delta(std::move(delta)),
      done(std::move(end)) {
  }

  // A pool destroyed mid-reply drops the pending timer: the reply still
  // ends, as unavailable.
  ~delayed_reply() {
    if (!ended)
      done(make_error(errc::unavailable, "the offline provider stopped"));
  }

  void end(caf::expected<completion> result) {
    ended = true;
    if (flow)
      flow->drop();
    done(std::move(result));
  }

  void next() {
    timer.expires_after(delay);
    timer.async_wait(
      [self = shared_from_this()](const boost::system::error_code& ec) {
        self->step(ec);
      });
  }

  void step(const boost::system::error_code& ec) {
    if (cancelled) {
      out.interrupted = true;
      end(std::move(out));
      return;
    }
    if (ec) {
      end(make_error(errc::unavailable, "the offline provider stopped"));
      return;
    }
    auto& piece = parts[index++];
    out.text += piece;
    if (on_delta && !on_delta(piece)) {
      out.interrupted = true;
      end(std::move(out));
      return;
    }
    if (index == parts.size()) {
      end(std::move(out));
      return;
    }
    next();
  }

  boost::asio::steady_timer timer;
  std::vector<std::string> parts;
  size_t index = 0;
  std::chrono::milliseconds delay;
  delta_callback on_delta;
  completion_done done;
  completion out;
  bool ended = false;
  std::shared_ptr<flow_control> flow;
  bool cancelled = false;
};

} // namespace

bool offline_provider::start(prompt messages,
                             completion_options options,
                             delta_callback on_delta, completion_done done) {
  if (delta_delay_.count() > 0 && !loops_)
    return false;
  if (delta_delay_.count() == 0 || messages.empty()) {
    done(complete(messages, options, on_delta));
    return true;
  }
  auto parts = split_deltas(reply_for(messages), 4);
  auto reply = std::make_shared<delayed_reply>(loops_->next(),
                                               std::move(parts), delta_delay_,
                                               std::move(on_delta),
                                               std::move(done));
  if (options.flow) {
    reply->flow = options.flow;
    // A cancelled reply ends at the abort, not at its next piece.
    options.flow->on_cancel(
      [weak = std::weak_ptr<delayed_reply>(reply),
       ex = reply->timer.get_executor()] {
        boost::asio::post(ex, [weak] {
          if (auto r = weak.lock()) {
            r->cancelled = true;
            r->timer.cancel();
          }
        });
      });
  }
  boost::asio::post(reply->timer.get_executor(),
                    [reply] { reply->next(); });
  return true;
}

std::shared_ptr<llm_provider> make_offline_provider() {
  return std::make_shared<offline_provider>();
}

} // namespace spindle
