// The token budget (docs/builder.md, "The token budget"): turns counted once
// and stored with their counts, prompts filled in priority order within
// max_context_tokens less the reply's reserve, tool calls kept whole, no
// orphan at the start, a manifest of what went in, and 413 for a message
// that cannot fit. The property test checks 10,000 random prompts against
// the reference tokenizer (tests/tiktoken).

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include "spindle/messages/context_builder.hpp"
#include "spindle/messages/memory.hpp"
#include "spindle/messages/tokens.hpp"
#include "spindle/runtime/runtime.hpp"
#include "byte_counter.hpp"
#include "spindle/runtime/tokenizer.hpp"
#include "support.hpp"
#include "tiktoken/golden.hpp"

using namespace spindle;
using json = nlohmann::json;

namespace {

using test::byte_counter;

turn calling(std::vector<tool_call> calls, std::string content = {}) {
  turn t = make_assistant_turn(std::move(content));
  t.tool_calls = std::move(calls);
  return t;
}

prompt_parts parts_of(std::vector<turn> history, std::string message = "q") {
  prompt_parts p;
  p.system_prompt = "S";
  p.history = std::move(history);
  p.original = std::move(message);
  p.rewritten = p.original;
  return p;
}

// Every tokens of a byte-counted message: 3 + role + content (+ ids, calls).
size_t cost(const chat_message& m) {
  return count_message_tokens(byte_counter{}, m);
}

size_t total(const prompt& messages) {
  size_t n = reply_primer_tokens;
  for (auto m : messages)
    n += cost(m.to_message());
  return n;
}

const token_counter& o200k() {
  static auto counter = make_token_counter("o200k_base");
  return *counter;
}

std::string words(size_t n, unsigned seed) {
  static const char* pool[] = {"alpha", "beta",  "gamma", "delta", "river",
                               "stone", "cloud", "north", "seven", "Zürich",
                               "日本語", "données", "🙂",    "42",    "x"};
  std::mt19937 rng{seed};
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0)
      out += ' ';
    out += pool[rng() % (sizeof pool / sizeof pool[0])];
  }
  return out;
}

} // namespace

TEST_CASE("token budget: a text message costs what the cookbook counts") {
  auto& c = o200k();
  // [{"role":"user","content":"hello world"}] is 9 with the primer.
  CHECK(count_message_tokens(c, chat_message{"user", "hello world", {}, {}})
          + reply_primer_tokens
        == 9);
  auto t = make_user_turn("hello world");
  count_turn(c, t);
  CHECK(t.tokens == 6);
  CHECK(t.token_encoding == static_cast<uint8_t>(token_encoding_id::o200k_base));
  CHECK(turn_tokens(c, t) == 6);
  // A stored count is used as it is; another encoding's is not.
  t.tokens = 1000;
  CHECK(turn_tokens(c, t) == 1000);
  t.token_encoding = static_cast<uint8_t>(token_encoding_id::cl100k_base);
  CHECK(turn_tokens(c, t) == 6);
}

TEST_CASE("token budget: the newest history that fits, never an orphan at "
          "the start") {
  std::vector<turn> history{make_user_turn("u1-aaaaaaaaaa"),
                            make_assistant_turn("a1-aaaaaaaaaa"),
                            make_user_turn("u2"), make_assistant_turn("a2")};
  context_manifest m;
  auto all = fit_prompt(byte_counter{}, 1000, 0, parts_of(history), m);
  REQUIRE(all);
  CHECK(all->size() == 6);
  CHECK(m.turns == std::vector<uint64_t>{0, 1, 2, 3});
  CHECK(m.total_tokens == total(*all));
  CHECK(m.turns_left_out == 0);

  // Room for the newest three turns only: "a1" would start the history
  // without its user turn, so it goes too.
  auto floor = cost({"system", "S", {}, {}}) + cost({"user", "q", {}, {}})
               + reply_primer_tokens;
  auto newest_two = cost({"user", "u2", {}, {}})
                    + cost({"assistant", "a2", {}, {}});
  auto a1 = cost({"assistant", "a1-aaaaaaaaaa", {}, {}});
  auto budget = floor + newest_two + a1;
  context_manifest cut;
  auto some = fit_prompt(byte_counter{}, budget + 10, 10, parts_of(history),
                         cut);
  REQUIRE(some);
  REQUIRE(some->size() == 4);
  CHECK((*some)[1].content == "u2");
  CHECK(cut.turns == std::vector<uint64_t>{2, 3});
  CHECK(cut.turns_left_out == 2);
  CHECK(cut.budget == budget);
  CHECK(cut.total_tokens == total(*some));
  CHECK(cut.total_tokens <= cut.budget);
  CHECK(cut.history_tokens == newest_two);

  // Indexes are the thread's: the window starts at turn 40.
  auto offset = parts_of(history);
  offset.first_index = 40;
  context_manifest shifted;
  REQUIRE(fit_prompt(byte_counter{}, budget + 10, 10, offset, shifted));
  CHECK(shifted.turns == std::vector<uint64_t>{42, 43});
}

TEST_CASE("token budget: a call and its results fit together or not at "
          "all") {
  std::vector<turn> history{
    make_user_turn("weather?"),
    calling({{"c1", "get", "{}"}, {"c2", "get", "{}"}}),
    make_tool_turn("sunny", "c1"), make_tool_turn("rain", "c2"),
    make_assistant_turn("done")};
  auto floor = cost({"system", "S", {}, {}}) + cost({"user", "q", {}, {}})
               + reply_primer_tokens;
  auto done = cost({"assistant", "done", {}, {}});
  auto unit = cost({"assistant", "", {}, {{"c1", "get", "{}"},
                                          {"c2", "get", "{}"}}})
              + cost({"tool", "sunny", "c1", {}})
              + cost({"tool", "rain", "c2", {}});
  for (size_t room = 0; room < unit + 40; ++room) {
    context_manifest m;
    auto prompt = fit_prompt(byte_counter{}, floor + done + room, 0,
                             parts_of(history), m);
    REQUIRE(prompt);
    CHECK(m.total_tokens == total(*prompt));
    CHECK(m.total_tokens <= m.budget);
    // The history is empty (an assistant turn alone would be an orphan)
    // or starts with the user turn and holds the whole call.
    for (size_t i = 0; i < prompt->size(); ++i) {
      auto msg = (*prompt)[i];
      if (!msg.tool_calls.empty()) {
        REQUIRE(i + 2 < prompt->size());
        CHECK((*prompt)[i + 1].tool_call_id == "c1");
        CHECK((*prompt)[i + 2].tool_call_id == "c2");
      }
      CHECK_FALSE((msg.role == "tool" && i > 0
                   && (*prompt)[i - 1].role != "assistant"
                   && (*prompt)[i - 1].role != "tool"));
    }
    if (prompt->size() > 2)
      CHECK((*prompt)[1].role == "user");
  }
}

TEST_CASE("token budget: the message comes first, then memory, then "
          "history") {
  auto p = parts_of({make_user_turn("old"), make_assistant_turn("reply")},
                    "the message");
  p.memory_snippet = "- a fact";
  p.memory_entries = {7, 9};
  p.rewritten = "the message, with context";
  auto floor = cost({"system", "S", {}, {}})
               + cost({"user", "the message", {}, {}}) + reply_primer_tokens;

  SECTION("a message that cannot fit alone is too large, with its counts") {
    context_manifest m;
    auto r = fit_prompt(byte_counter{}, floor - 1, 0, p, m);
    REQUIRE_FALSE(r);
    CHECK(classify(r.error()) == errc::too_large);
    auto text = describe(r.error());
    CHECK(text.find(std::to_string(cost({"user", "the message", {}, {}})))
          != std::string::npos);
    CHECK(text.find("budget is " + std::to_string(floor - 1))
          != std::string::npos);
  }
  SECTION("the contextualized query goes when only the message fits") {
    context_manifest m;
    auto r = fit_prompt(byte_counter{}, floor, 0, p, m);
    REQUIRE(r);
    CHECK(m.rewrite_left_out);
    CHECK(m.memory_left_out);
    CHECK(r->back().content == "the message");
    CHECK(r->size() == 2);
    CHECK(m.total_tokens == floor);
  }
  SECTION("memory before history") {
    auto with_rewrite = cost(
      {"user", final_user_content("the message", "the message, with context"),
       {}, {}});
    auto memory = cost({"system", "Long-term memory:\n- a fact", {}, {}});
    context_manifest m;
    auto budget = floor - cost({"user", "the message", {}, {}}) + with_rewrite
                  + memory;
    auto r = fit_prompt(byte_counter{}, budget, 0, p, m);
    REQUIRE(r);
    CHECK_FALSE(m.rewrite_left_out);
    CHECK_FALSE(m.memory_left_out);
    CHECK(m.memory_entries == std::vector<int64_t>{7, 9});
    CHECK(m.turns.empty());
    CHECK(m.turns_left_out == 2);
    CHECK(m.memory_tokens == memory);
    CHECK(r->size() == 3);
  }
  SECTION("a reserve that leaves nothing is refused") {
    context_manifest m;
    auto r = fit_prompt(byte_counter{}, 100, 97, p, m);
    REQUIRE_FALSE(r);
    CHECK(classify(r.error()) == errc::invalid_argument);
  }
}

TEST_CASE("token budget: turns are counted once and stored with their "
          "counts") {
  test::temp_dir dir;
  runtime_options opts;
  opts.storage.data_dir = dir.str();
  std::string id = "counted";
  {
    runtime rt{opts};
    REQUIRE(rt.add_turn(id, make_user_turn("hello world")));
    REQUIRE(rt.add_turn(id, make_assistant_turn(words(50, 1))));
    auto snap = rt.snapshot(id);
    REQUIRE(snap);
    REQUIRE(snap->turns.size() == 2);
    for (auto& t : snap->turns) {
      CHECK(t.token_encoding
            == static_cast<uint8_t>(token_encoding_id::o200k_base));
      CHECK(t.tokens == count_turn_tokens(o200k(), t));
    }
    CHECK(snap->turns[0].tokens == 6);
  }
  // The store keeps the count: a restart reads it and does not recount
  // (a count changed in the file shows through).
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open((dir.path() / "spindle.db").c_str(), &db) == SQLITE_OK);
  auto exec = [&](const char* sql) {
    char* err = nullptr;
    auto rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
    INFO((err ? err : ""));
    sqlite3_free(err);
    REQUIRE(rc == SQLITE_OK);
  };
  exec("UPDATE turns SET tokens = 777 WHERE seq = 0;"
       "UPDATE turn_journal SET tokens = 777 WHERE seq = 0;");
  sqlite3_close(db);
  runtime rt{opts};
  auto snap = rt.snapshot(id);
  REQUIRE(snap);
  REQUIRE(snap->turns.size() == 2);
  CHECK(snap->turns[0].tokens == 777);
  CHECK(snap->turns[1].tokens == count_turn_tokens(o200k(), snap->turns[1]));
}

TEST_CASE("token budget: a long thread's prompt fits its budget") {
  runtime rt;
  std::string id = "long";
  // 14 turns of 20,000 words: far more than the window takes.
  for (unsigned i = 0; i < 14; ++i)
    REQUIRE(rt.add_turn(id, i % 2 == 0 ? make_user_turn(words(20000, i))
                                       : make_assistant_turn(words(20000, i))));
  build_options o;
  o.max_turns = 100;
  o.max_context_tokens = 64000;
  auto built = rt.build_context(id, "", "and now?", o);
  REQUIRE(built);
  auto& m = built->manifest;
  CHECK(m.encoding == "o200k_base");
  CHECK(m.budget == 64000 - default_reply_tokens);
  size_t counted = reply_primer_tokens;
  for (auto msg : built->messages)
    counted += count_message_tokens(o200k(), msg.to_message());
  CHECK(m.total_tokens == counted);
  CHECK(counted <= m.budget);
  CHECK_FALSE(m.turns.empty());
  CHECK(m.turns.back() == 13);
  CHECK(m.turns.size() + m.turns_left_out == 14);
  CHECK(built->short_term_history.size() == m.turns.size());
  // The first history message is a user turn (nothing orphaned).
  CHECK(built->short_term_history.front().role == turn_role::user);
  CHECK(m.history_tokens + m.system_tokens + m.message_tokens + m.memory_tokens
          + reply_primer_tokens
        == m.total_tokens);

  // Too small for the message itself: 413's error, nothing stored.
  o.max_context_tokens = default_reply_tokens + 20;
  auto refused = rt.build_context(id, "", words(200, 3), o);
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == errc::too_large);
  exchange_request x;
  x.thread_id = id;
  x.content = words(200, 3);
  x.build = o;
  auto sent = rt.send_message(x);
  REQUIRE_FALSE(sent);
  CHECK(classify(sent.error()) == errc::too_large);
  auto snap = rt.snapshot(id);
  REQUIRE(snap);
  CHECK(snap->turns.size() == 14);
}

TEST_CASE("token budget: builds fitted in place while the thread grows "
          "each see one prefix of its turns") {
  // Turn i says "t<i> ..." (users at even indexes): every build, whatever
  // it raced with, must show consecutive turns ending at its count, each
  // with its own content, in its manifest, its history and its prompt.
  runtime rt;
  const std::string id = "growing";
  auto content = [](size_t i) {
    return "t" + std::to_string(i) + " " + words(5 + i % 40, unsigned(i));
  };
  REQUIRE(rt.add_turn(id, make_user_turn(content(0))));
  constexpr size_t total = 400;
  std::atomic<bool> done{false};
  std::atomic<size_t> failures{0};
  std::atomic<size_t> builds{0};
  std::thread writer{[&] {
    for (size_t i = 1; i < total; ++i) {
      auto t = i % 2 == 0 ? make_user_turn(content(i))
                          : make_assistant_turn(content(i));
      if (!rt.add_turn(id, std::move(t)))
        ++failures;
    }
    done = true;
  }};
  std::vector<std::thread> readers;
  std::mutex mtx;
  std::vector<std::string> problems;
  auto problem = [&](std::string what) {
    std::lock_guard<std::mutex> guard{mtx};
    if (problems.size() < 10)
      problems.push_back(std::move(what));
  };
  for (int r = 0; r < 4; ++r)
    readers.emplace_back([&, r] {
      build_options o;
      o.max_turns = 30;
      o.max_context_tokens = default_reply_tokens + 600 + 200 * r;
      while (!done || builds < 200) {
        auto built = rt.build_context(id, "", "and then?", o);
        ++builds;
        if (!built) {
          problem("build failed: " + describe(built.error()));
          continue;
        }
        auto& m = built->manifest;
        if (m.total_tokens > m.budget)
          problem("over budget");
        if (m.turns.empty() || m.turns.back() + 1 != built->total_turns)
          problem("the newest turn is not the last in the prompt");
        if (built->short_term_history.size() != m.turns.size()
            || built->messages.size() != m.turns.size() + 2) {
          problem("history, manifest and prompt disagree");
          continue;
        }
        for (size_t k = 0; k < m.turns.size(); ++k) {
          auto i = static_cast<size_t>(m.turns[k]);
          if (k > 0 && m.turns[k - 1] + 1 != m.turns[k])
            problem("turns not consecutive");
          auto& t = built->short_term_history[k];
          if (t.content != content(i)
              || t.role != (i % 2 == 0 ? turn_role::user
                                       : turn_role::assistant)
              || built->messages[k + 1].content != content(i))
            problem("turn " + std::to_string(i) + " is not its own");
        }
        if (built->short_term_history.front().role != turn_role::user)
          problem("the history starts with an orphan");
      }
    });
  writer.join();
  for (auto& t : readers)
    t.join();
  INFO(builds.load() << " builds");
  for (auto& p : problems)
    FAIL_CHECK(p);
  CHECK(failures == 0);
  CHECK(problems.empty());
}

TEST_CASE("token budget: the HTTP routes take max_context_tokens and show "
          "the manifest") {
  test::server_process srv{{"--context-tokens", "8000", "--reply-tokens",
                            "1000"}};
  httplib::Client cli{"127.0.0.1", srv.port()};
  for (int i = 0; i < 4; ++i) {
    auto [code, body] = test::post_json(cli, "/v1/threads/web/messages",
                                        {{"content", words(400, i)}});
    REQUIRE(code == 200);
  }
  auto [code, ctx] = test::post_json(cli, "/v1/threads/web/context",
                                     {{"content", "what next?"},
                                      {"max_context_tokens", 2500}});
  REQUIRE(code == 200);
  auto& m = ctx["manifest"];
  CHECK(m["encoding"] == "o200k_base");
  CHECK(m["max_context_tokens"] == 2500);
  CHECK(m["reply_tokens"] == 1000);
  CHECK(m["budget"] == 1500);
  CHECK(m["tokens"]["total"].get<uint64_t>() <= 1500);
  CHECK(m["turns"].size() == ctx["short_term_history"].size());
  CHECK(m["turns"].size() + m["turns_left_out"].get<size_t>() == 8);
  CHECK(m["rewritten_query"] == ctx["rewritten_query"]);

  // The server's default applies without the field.
  auto [code2, ctx2] = test::post_json(cli, "/v1/threads/web/context",
                                       {{"content", "what next?"}});
  REQUIRE(code2 == 200);
  CHECK(ctx2["manifest"]["budget"] == 7000);

  // Bad values are 400; a message that cannot fit is 413 and not stored.
  for (auto bad : {json(0), json(-5), json(20000000), json(900), json("x")}) {
    auto [c, b] = test::post_json(cli, "/v1/threads/web/messages",
                                  {{"content", "hi"},
                                   {"max_context_tokens", bad}});
    INFO(bad.dump() << " " << b.dump());
    CHECK(c == 400);
  }
  auto [c413, b413] = test::post_json(cli, "/v1/threads/web/messages",
                                      {{"content", words(3000, 9)},
                                       {"max_context_tokens", 2000}});
  CHECK(c413 == 413);
  CHECK(b413["error"]["code"] == "too_large");
  auto [ch, history] = test::get_json(cli, "/v1/threads/web/history?max_turns=100");
  REQUIRE(ch == 200);
  CHECK(history["turns"].size() == 8);
}

TEST_CASE("token budget: a snippet's count is the sum of its lines' "
          "counts") {
  // The rule memory readers count snippets by, checked against the
  // tokenizer over random entries as a snippet shows them.
  std::mt19937 rng{11};
  static const char* pool[]
    = {"fact",   "Fact.", "ends!", "what?", "(paren)", "a/b",  "1984",
       "€",      "东京",  "🙂",    "don't", "x:",      "--",   "...",
       "naïve",  "\"q\"", "#tag",  "\u00a0", "end.",  "Ωmega", "2.5"};
  for (auto* name : {"o200k_base", "cl100k_base"}) {
    auto counter = make_token_counter(name);
    for (int round = 0; round < 2000; ++round) {
      std::string snippet;
      uint64_t lines = 0, last_line = 0, last_alone = 0;
      for (auto k = 1 + rng() % 5; k > 0; --k) {
        std::string entry;
        for (auto w = 1 + rng() % 8; w > 0; --w) {
          if (!entry.empty())
            entry += ' ';
          entry += pool[rng() % (sizeof pool / sizeof pool[0])];
        }
        entry = memory_normalized(entry);
        if (entry.empty())
          continue;
        if (!snippet.empty())
          snippet += '\n';
        snippet += "- " + entry;
        last_alone = counter->count_text("- " + entry);
        last_line = counter->count_text("- " + entry + "\n");
        lines += last_line;
      }
      if (snippet.empty())
        continue;
      INFO(name << ": " << snippet);
      REQUIRE(counter->count_text(snippet) == lines - last_line + last_alone);
      REQUIRE(counter->count_text(std::string{memory_message_prefix}
                                  + snippet)
              == counter->count_text(memory_message_prefix)
                   + counter->count_text(snippet));
    }
  }

  // And what a runtime's memory readers report.
  runtime_options opts;
  runtime rt{opts};
  std::mt19937 gen{5};
  for (int i = 0; i < 300; ++i) {
    std::string entry;
    for (auto w = 3 + gen() % 30; w > 0; --w) {
      if (!entry.empty())
        entry += ' ';
      entry += pool[gen() % (sizeof pool / sizeof pool[0])];
    }
    REQUIRE(rt.store_memory(entry, memory_tags("u1", "")));
  }
  for (auto* q : {"fact", "what ends", "naïve tag", "1984 paren", "东京 x"}) {
    auto s = rt.retrieve_memory("u1", "t", q);
    REQUIRE(s);
    REQUIRE_FALSE(s->text.empty());
    CHECK(s->token_encoding
          == static_cast<uint8_t>(token_encoding_id::o200k_base));
    CHECK(s->tokens == o200k().count_text(s->text));
    CHECK(s->ids.size() == s->entries);
  }
}

// -- the property test against the reference ----------------------------------

namespace {

// Random text of `n` words in several scripts, with digits, emoji and
// whitespace runs.
std::string random_text(std::mt19937& rng, size_t n) {
  static const char* pool[]
    = {"the",   "budget", "holds",  "Zürich", "naïve",   "東京",  "мир",
       "🙂🙃",  "1234567", "   ",   "\n\n",   "don't",   "it's",  "{\"a\":1}",
       "x",     "Ωmega",  "ṩ",      "tab\t",  "العربية", "…",     "🤖"};
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && rng() % 4 != 0)
      out += ' ';
    out += pool[rng() % (sizeof pool / sizeof pool[0])];
  }
  return out;
}

// A random history: user and assistant turns, system turns, tool calls
// answered in order, out of order, or not at all.
std::vector<turn> random_history(std::mt19937& rng) {
  std::vector<turn> out;
  auto turns = rng() % 30;
  int call = 0;
  std::vector<std::string> open;
  while (out.size() < turns) {
    auto kind = rng() % 10;
    auto size = (rng() % 5 == 0) ? rng() % 400 : rng() % 40;
    if (kind < 4) {
      out.push_back(make_user_turn(random_text(rng, 1 + size)));
    } else if (kind < 7) {
      out.push_back(make_assistant_turn(random_text(rng, size)));
    } else if (kind < 8) {
      out.push_back(make_system_turn(random_text(rng, 1 + size)));
    } else if (kind < 9) {
      std::vector<tool_call> calls;
      for (auto k = 1 + rng() % 3; k > 0; --k) {
        auto id = "call_" + std::to_string(++call);
        calls.push_back({id, "fn_" + std::to_string(rng() % 5),
                         "{\"q\":\"" + random_text(rng, rng() % 8) + "\"}"});
        open.push_back(id);
      }
      out.push_back(calling(std::move(calls), random_text(rng, rng() % 5)));
    } else if (!open.empty()) {
      auto at = rng() % open.size();
      out.push_back(make_tool_turn(random_text(rng, 1 + size), open[at]));
      open.erase(open.begin() + static_cast<long>(at));
    }
  }
  return out;
}

struct corpus_writer {
  std::string data;
  uint32_t records = 0;
  void add(const std::string& label, std::string_view text) {
    auto put = [&](uint32_t v) {
      data.append(reinterpret_cast<const char*>(&v), 4);
    };
    put(static_cast<uint32_t>(label.size()));
    data += label;
    put(static_cast<uint32_t>(text.size()));
    data.append(text.data(), text.size());
    ++records;
  }
  void write(const std::string& path) const {
    std::ofstream out{path, std::ios::binary};
    out.write(reinterpret_cast<const char*>(&records), 4);
    out << data;
  }
};

} // namespace

TEST_CASE("token budget: 10000 random prompts are within budget by the "
          "reference's count") {
  auto dir = std::filesystem::path{test::spindle_binary()}.parent_path()
             / "tiktoken";
  auto setup = test::run({std::string{SPINDLE_SOURCE_DIR}
                            + "/tests/tiktoken/setup.sh",
                          dir.string()});
  INFO(setup.err);
  REQUIRE(setup.exit_code == 0);
  for (auto* name : {"o200k_base", "cl100k_base"}) {
    auto counter = make_token_counter(name);
    std::mt19937 rng{std::string_view{name}.size()};
    size_t prompts = std::string_view{name} == "o200k_base" ? 10000 : 2000;
    corpus_writer corpus;
    // Per prompt: its budget, its manifest's total and how many fixed
    // tokens it adds to the reference's counts of its texts.
    struct expected {
      uint64_t budget;
      uint64_t total;
      uint64_t fixed;
      uint32_t first_record;
      uint32_t records;
    };
    std::vector<expected> cases;
    size_t too_large = 0;
    for (size_t i = 0; i < prompts; ++i) {
      auto p = parts_of(random_history(rng), random_text(rng, 1 + rng() % 60));
      p.system_prompt = random_text(rng, rng() % 30);
      if (rng() % 2 == 0)
        p.memory_snippet = "- " + random_text(rng, 1 + rng() % 80);
      if (rng() % 3 == 0)
        p.rewritten = random_text(rng, 1 + rng() % 40);
      if (rng() % 3 == 0 && !p.history.empty()) {
        // A summary of the turns before the window's first few, counted
        // when it was made (or not at all).
        p.first_index = rng() % 50;
        p.summary.upto = p.first_index + rng() % (p.history.size() + 1);
        p.summary.content = random_text(rng, 1 + rng() % 120);
        if (rng() % 2 == 0) {
          p.summary.tokens = static_cast<uint32_t>(counter->count_text(
            std::string{summary_message_prefix} + p.summary.content));
          p.summary.token_encoding = static_cast<uint8_t>(counter->id());
        }
      }
      for (auto& t : p.history)
        if (rng() % 2 == 0)
          count_turn(*counter, t); // stored counts and fresh ones mixed
      auto reply = rng() % 200;
      auto max = reply + 4 + rng() % 1500;
      context_manifest m;
      auto prompt = fit_prompt(*counter, max, reply, p, m);
      if (!prompt) {
        REQUIRE(classify(prompt.error()) == errc::too_large);
        ++too_large;
        // The floor alone exceeds the budget: checked below like a prompt.
        std::vector<chat_message> floor_only;
        if (!p.system_prompt.empty())
          floor_only.push_back({"system", p.system_prompt, {}, {}});
        floor_only.push_back({"user", p.original, {}, {}});
        prompt = spindle::prompt{std::move(floor_only)};
        m.total_tokens = ~uint64_t{0};
      }
      // Structure: never an orphan first, never a call split from its
      // results, no turn the summary in the prompt covers.
      if (m.summary_tokens > 0 && !m.turns.empty())
        CHECK(m.turns.front() >= m.summary_upto);
      size_t h = p.system_prompt.empty() ? 0 : 1;
      if (h < prompt->size() && (*prompt)[h].role == "system"
          && (*prompt)[h].content.rfind(summary_message_prefix, 0) == 0)
        ++h;
      if (h < prompt->size() && (*prompt)[h].role == "system"
          && (*prompt)[h].content.rfind("Long-term memory:", 0) == 0)
        ++h;
      // The first turn the history could start with: after the summary
      // when the prompt has it.
      size_t first_head = 0;
      auto covered = m.summary_left_out ? 0 : m.summary_upto;
      while (first_head < p.history.size()
             && (p.history[first_head].role == turn_role::tool
                 || p.first_index + first_head < covered))
        ++first_head;
      if (!m.turns.empty() && m.turns.front() > p.first_index + first_head) {
        auto first = (*prompt)[h];
        CHECK((first.role == "user" || first.role == "system"));
      }
      for (size_t k = 0; k + 1 < prompt->size(); ++k) {
        auto msg = (*prompt)[k];
        for (size_t c = 0; c < msg.tool_calls.size(); ++c) {
          REQUIRE(k + 1 + c < prompt->size());
          CHECK((*prompt)[k + 1 + c].tool_call_id == msg.tool_calls[c].id);
        }
      }
      expected e{m.budget, m.total_tokens, reply_primer_tokens,
                 corpus.records, 0};
      for (auto msg : *prompt) {
        e.fixed += message_overhead_tokens;
        corpus.add("role", msg.role);
        corpus.add("content", msg.content);
        if (!msg.tool_call_id.empty())
          corpus.add("id", msg.tool_call_id);
        for (auto& c : msg.tool_calls) {
          e.fixed += tool_call_overhead_tokens;
          corpus.add("call", c.id);
          corpus.add("call", c.name);
          corpus.add("call", c.arguments);
        }
      }
      e.records = corpus.records - e.first_record;
      cases.push_back(e);
    }
    auto corpus_path = (dir / (std::string{"budget-"} + name + ".bin")).string();
    auto counts_path = (dir / (std::string{"budget-ref-"} + name + ".bin"))
                         .string();
    corpus.write(corpus_path);
    auto ref = test::run({"node", (dir / "reference.mjs").string(), name,
                          corpus_path, counts_path});
    INFO(ref.err);
    REQUIRE(ref.exit_code == 0);
    auto records = golden::read_corpus(corpus_path);
    auto tokens = golden::read_reference(counts_path, records.size());
    size_t checked = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      auto& e = cases[i];
      uint64_t reference = e.fixed;
      for (uint32_t r = 0; r < e.records; ++r)
        reference += tokens[e.first_record + r].size();
      INFO(name << " prompt " << i);
      if (e.total == ~uint64_t{0}) {
        CHECK(reference > e.budget); // refused only when it could not fit
      } else {
        CHECK(reference == e.total);
        CHECK(reference <= e.budget);
        ++checked;
      }
    }
    CHECK(checked + too_large == prompts);
    CHECK(too_large < prompts / 4);
  }
}
