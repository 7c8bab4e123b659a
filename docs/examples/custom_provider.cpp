// A custom `llm_provider`: the runtime asks it for every reply, streaming
// what it generates through the delta callback. This one answers in
// capitals, word by word; a real one would call a model. It also shows
// what a provider is given: the prompt the context builder assembled
// (system prompt, summary, memory, history, the user's message).
//
// Build and run: see docs/examples/README.md.

#include <cctype>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include <spindle/runtime/llm.hpp>
#include <spindle/runtime/runtime.hpp>

namespace {

class shouting_provider : public spindle::llm_provider {
public:
  std::string name() const override {
    return "shouting";
  }

  // Blocking form: the runtime calls it on a thread of its own (this
  // provider has no asynchronous `start`). Called from several threads at
  // once, so it keeps no mutable state.
  caf::expected<spindle::completion>
  complete(const spindle::prompt& messages,
           const spindle::completion_options&,
           const spindle::delta_callback& on_delta) override {
    std::string asked{messages.back().content};
    std::string reply = "YOU SAID: ";
    for (char c : asked)
      reply += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    spindle::completion out;
    // Stream it a word at a time; a false return means the client went
    // away: stop and say so.
    size_t from = 0;
    while (from < reply.size()) {
      size_t to = reply.find(' ', from + 1);
      if (to == std::string::npos)
        to = reply.size();
      std::string piece = reply.substr(from, to - from);
      out.text += piece;
      if (on_delta && !on_delta(piece)) {
        out.interrupted = true;
        return out;
      }
      from = to;
    }
    return out;
  }
};

} // namespace

int main() {
  spindle::runtime_options opts;
  opts.provider = std::make_shared<shouting_provider>();
  auto started = spindle::runtime::start(opts);
  if (!started) {
    std::cerr << "cannot start: " << spindle::describe(started.error()) << "\n";
    return 1;
  }
  spindle::runtime& rt = **started;

  std::string streamed;
  auto first = rt.send_message("shout-1", "hello there", "ada",
                               spindle::conflict_policy::queue,
                               spindle::builder_default_max_turns,
                               [&](std::string_view delta) {
                                 streamed += delta;
                                 return true;
                               });
  auto second = rt.send_message("shout-1", "and again", "ada");
  if (!first || !second) {
    std::cerr << "send failed: "
              << spindle::describe(!first ? first.error() : second.error())
              << "\n";
    return 1;
  }
  std::cout << first->reply << "\n" << second->reply << "\n";
  // The streamed deltas are the reply; the second prompt held the first
  // exchange as history (system prompt, 2 history turns, the message).
  if (streamed != first->reply
      || first->reply.find("HELLO THERE") == std::string::npos
      || second->reply.find("AND AGAIN") == std::string::npos
      || second->history_turns != 2) {
    std::cerr << "custom_provider: unexpected replies\n";
    return 1;
  }
  auto turns = rt.history("shout-1");
  if (!turns || turns->size() != 4 || (*turns)[3].content != second->reply) {
    std::cerr << "custom_provider: the replies were not stored\n";
    return 1;
  }
  std::cout << "custom_provider: replies streamed and stored\n";
  rt.stop();
  return EXIT_SUCCESS;
}
