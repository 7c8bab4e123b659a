// Exact token counts (docs/tokens.md): known tokens checked by hand
// against tiktoken's own examples, the model table, the chat overhead,
// loading from many threads, the golden comparison with the reference
// (the tiktoken npm package, tests/tiktoken/) over a varied corpus, and
// POST /v1/tokens/count through the running server.

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "support.hpp"
#include "tiktoken/golden.hpp"
#include "spindle/messages/tokens.hpp"
#include "spindle/runtime/tokenizer.hpp"

using json = nlohmann::json;
using spindle::tokens::encoding;
using tokens = std::vector<uint32_t>;

namespace {

const encoding& o200k() {
  auto* enc = encoding::find("o200k_base");
  REQUIRE(enc);
  return *enc;
}

const encoding& cl100k() {
  auto* enc = encoding::find("cl100k_base");
  REQUIRE(enc);
  return *enc;
}

} // namespace

TEST_CASE("tokens: known texts give tiktoken's tokens in both encodings") {
  // cl100k's "tiktoken is great!" is the example of tiktoken's README; the
  // others were read from tiktoken's encode_ordinary.
  CHECK(o200k().encode("hello world") == tokens{24912, 2375});
  CHECK(cl100k().encode("hello world") == tokens{15339, 1917});
  CHECK(cl100k().encode("tiktoken is great!")
        == tokens{83, 1609, 5963, 374, 2294, 0});
  CHECK(o200k().encode("tiktoken is great!")
        == tokens{83, 8251, 2488, 382, 2212, 0});
  CHECK(o200k().encode("Größe 你好 👍🏽")
        == tokens{3193, 52715, 220, 177519, 160433, 52622, 121});
  CHECK(cl100k().encode("Größe 你好 👍🏽")
        == tokens{6600, 80040, 220, 57668, 53901, 62904, 235, 9468, 237, 121});
  CHECK(o200k().encode("  \n\n   x") == tokens{11691, 256, 1215});
  CHECK(cl100k().encode("12345678") == tokens{4513, 10961, 2495});
  CHECK(o200k().encode("").empty());
  CHECK(o200k().count("tiktoken is great!") == 6);
  CHECK(o200k().vocabulary_size() == 199998);
  CHECK(cl100k().vocabulary_size() == 100256);
  CHECK(o200k().name() == "o200k_base");
}

TEST_CASE("tokens: special token text is ordinary text") {
  // Not <|endoftext|>'s own token (199999, 100257): seven plain ones.
  CHECK(o200k().encode("<|endoftext|>")
        == tokens{27, 91, 419, 1440, 919, 91, 29});
  CHECK(cl100k().encode("<|endoftext|>")
        == tokens{27, 91, 8862, 728, 428, 91, 29});
}

TEST_CASE("tokens: invalid UTF-8 counts as U+FFFD per maximal invalid "
          "subpart") {
  for (auto* enc : {&o200k(), &cl100k()}) {
    auto fffd = std::string{"\xef\xbf\xbd"};
    CHECK(enc->encode("\xff") == enc->encode(fffd));
    // A truncated sequence is one replacement; a stray continuation byte
    // another.
    CHECK(enc->encode("a\xe4\xbdz\x80")
          == enc->encode("a" + fffd + "z" + fffd));
    // A surrogate encoded in UTF-8 is three.
    CHECK(enc->encode("\xed\xa0\x80") == enc->encode(fffd + fffd + fffd));
  }
}

TEST_CASE("tokens: decoding the tokens of a text gives the text back") {
  std::string text = "Spindle keeps 1234567 turns — «quoted» 東京 "
                     "🇫🇷\r\n\t end  ";
  for (auto* enc : {&o200k(), &cl100k()})
    CHECK(enc->decode(enc->encode(text)) == text);
  CHECK_THROWS_AS(o200k().decode({300000}), std::out_of_range);
}

TEST_CASE("tokens: an encoding loads once and is shared by concurrent "
          "callers") {
  CHECK(encoding::find("p50k_base") == nullptr);
  CHECK(encoding::find("") == nullptr);
  std::vector<const encoding*> seen(8);
  std::vector<size_t> counts(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i)
    threads.emplace_back([&, i] {
      seen[i] = encoding::find(i % 2 ? "cl100k_base" : "o200k_base");
      for (int k = 0; k < 200; ++k)
        counts[i] += seen[i]->count("the same text, counted again and again");
    });
  for (auto& t : threads)
    t.join();
  for (size_t i = 0; i < seen.size(); ++i) {
    CHECK(seen[i] == (i % 2 ? &cl100k() : &o200k()));
    CHECK(counts[i] == counts[i % 2]);
  }
  CHECK(o200k().load_seconds() > 0);
  CHECK(o200k().load_seconds() < 5);
}

TEST_CASE("tokens: models map to tiktoken's encodings and unknown ones to "
          "o200k_base") {
  using spindle::tokens::encoding_for_model;
  for (auto* model : {"gpt-4o", "gpt-4o-mini", "gpt-4o-2024-08-06", "gpt-4.1",
                      "gpt-4.1-nano", "o1", "o1-mini", "o3", "o3-mini",
                      "o4-mini", "gpt-5", "gpt-5-mini", "chatgpt-4o-latest",
                      "gpt-4.5-preview", "ft:gpt-4o-mini:org:x:1",
                      "gpt-oss-120b"}) {
    INFO(model);
    auto e = encoding_for_model(model);
    CHECK(e.encoding == "o200k_base");
    CHECK(e.known);
  }
  for (auto* model : {"gpt-4", "gpt-4-0613", "gpt-4-turbo", "gpt-3.5-turbo",
                      "gpt-3.5-turbo-16k", "gpt-35-turbo",
                      "text-embedding-3-small",
                      "text-embedding-3-large", "text-embedding-ada-002",
                      "ft:gpt-3.5-turbo:org:x:1", "davinci-002"}) {
    INFO(model);
    auto e = encoding_for_model(model);
    CHECK(e.encoding == "cl100k_base");
    CHECK(e.known);
  }
  for (auto* model : {"llama-3.1-8b", "", "GPT-4O", "claude"}) {
    INFO(model);
    auto e = encoding_for_model(model);
    CHECK(e.encoding == "o200k_base");
    CHECK_FALSE(e.known);
  }
}

TEST_CASE("tokens: chat messages count 3 per message 1 per name and 3 for "
          "the reply") {
  // "user" and "hello world" are 1 and 2 tokens in cl100k_base.
  std::vector<spindle::tokens::message_text> one{{"user", "hello world", {}}};
  CHECK(spindle::tokens::count_messages(cl100k(), one) == 3 + 3 + 1 + 2);
  auto named = one;
  named[0].name = "user";
  CHECK(spindle::tokens::count_messages(cl100k(), named) == 9 + 1 + 1);
  CHECK(spindle::tokens::count_messages(cl100k(), {}) == 3);
}

TEST_CASE("tokens: a counter's role counts are its text counts") {
  for (auto* name : {"o200k_base", "cl100k_base"}) {
    auto counter = spindle::make_token_counter(name);
    REQUIRE(counter);
    for (std::string role : {"system", "user", "assistant", "tool",
                             "developer", "", "user ", "System", "日本語"}) {
      INFO(name << " role '" << role << "'");
      CHECK(counter->count_role(role) == counter->count_text(role));
    }
  }
}

// -- the reference ------------------------------------------------------------

namespace {

std::filesystem::path reference_dir() {
  return std::filesystem::path{spindle::test::spindle_binary()}.parent_path()
         / "tiktoken";
}

void require_ok(const spindle::test::process_result& r,
                const std::string& what) {
  INFO(what << "\nstdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.exit_code == 0);
}

// build/tiktoken with the reference installed (once) and its scripts.
std::filesystem::path setup_reference() {
  auto dir = reference_dir();
  require_ok(spindle::test::run({std::string{SPINDLE_SOURCE_DIR}
                                   + "/tests/tiktoken/setup.sh",
                                 dir.string()}),
             "setup.sh");
  return dir;
}

// The corpus and the reference's tokens of it, written by the node scripts
// into the build tree; the npm package is installed there once.
void compare_with_reference(const encoding& enc) {
  auto dir = setup_reference();
  std::string src = SPINDLE_SOURCE_DIR;
  auto name = std::string{enc.name()};
  auto corpus = (dir / ("corpus-" + name + ".bin")).string();
  auto expected = (dir / ("reference-" + name + ".bin")).string();
  std::vector<std::string> make{"node", (dir / "corpus.mjs").string(),
                                "--out", corpus, "--bytes", "4000000"};
  for (auto* part : {"/README.md", "/docs", "/runtime", "/messages", "/actors",
                     "/tests", "/bench"})
    make.push_back(src + part);
  auto seeds = std::string{SPINDLE_SHARED_DIR} + "/seeds";
  if (std::filesystem::is_directory(seeds))
    make.push_back(seeds);
  require_ok(spindle::test::run(make), "corpus.mjs");
  require_ok(spindle::test::run({"node", (dir / "reference.mjs").string(),
                                 name, corpus, expected}),
             "reference.mjs");
  auto records = spindle::golden::read_corpus(corpus);
  auto reference = spindle::golden::read_reference(expected, records.size());
  auto result = spindle::golden::compare(enc, records, reference);
  INFO(result.first);
  CHECK(result.records > 300);
  CHECK(result.tokens > 1000000);
  CHECK(result.differing_records == 0);
}

} // namespace

TEST_CASE("tokens: o200k_base equals the reference token for token over "
          "the corpus") {
  compare_with_reference(o200k());
}

TEST_CASE("tokens: cl100k_base equals the reference token for token over "
          "the corpus") {
  compare_with_reference(cl100k());
}

TEST_CASE("tokens: every code point in letter digit space and punctuation "
          "contexts equals the reference in both encodings") {
  // The reference classifies characters by Unicode 16.0, PCRE2 10.42 by
  // 14.0 (runtime/llm/tokenizer/unicode_16.hpp makes up the difference).
  auto dir = setup_reference();
  // The reference's answers depend only on the probe and the package: they
  // are kept beside a stamp of both and made again when either changes.
  auto probe = (dir / "probe.bin").string();
  auto stamp_path = (dir / "probe.stamp").string();
  auto stamp = spindle::golden::slurp((dir / "probe.mjs").string())
               + spindle::golden::slurp((dir / "package-lock.json").string());
  bool fresh = std::filesystem::exists(stamp_path)
               && spindle::golden::slurp(stamp_path) == stamp;
  if (!fresh) {
    std::filesystem::remove(stamp_path);
    require_ok(
      spindle::test::run({"node", (dir / "probe.mjs").string(), probe}),
      "probe.mjs");
  }
  auto records = spindle::golden::read_corpus(probe);
  REQUIRE(records.size() == 0x110000 - 0x80 - 0x800);
  for (auto* enc : {&o200k(), &cl100k()}) {
    auto name = std::string{enc->name()};
    auto expected = (dir / ("probe-reference-" + name + ".bin")).string();
    if (!fresh)
      require_ok(spindle::test::run({"node",
                                     (dir / "reference.mjs").string(), name,
                                     probe, expected}),
                 "reference.mjs");
    auto result = spindle::golden::compare(
      *enc, records, spindle::golden::read_reference(expected, records.size()));
    INFO(result.first);
    CHECK(result.differing_records == 0);
  }
  std::ofstream{stamp_path, std::ios::binary} << stamp;
}

// -- POST /v1/tokens/count ----------------------------------------------------

namespace {

struct client {
  explicit client(int port, std::string token = {}) : cli("127.0.0.1", port) {
    cli.set_read_timeout(std::chrono::seconds(30));
    if (!token.empty())
      cli.set_bearer_token_auth(token);
  }
  std::pair<int, json> post(const std::string& body) {
    auto r = cli.Post("/v1/tokens/count", body, "application/json");
    REQUIRE(r);
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> post(const json& body) {
    return post(body.dump());
  }
  httplib::Client cli;
};

void check_error(const std::pair<int, json>& r, int status,
                 const std::string& code, const json& param = nullptr) {
  INFO(r.second.dump());
  CHECK(r.first == status);
  REQUIRE(r.second.is_object());
  CHECK(r.second["error"]["code"] == code);
  if (!param.is_null())
    CHECK(r.second["error"]["param"] == param);
}

} // namespace

TEST_CASE("tokens: POST /v1/tokens/count counts texts and messages by the "
          "model's encoding") {
  spindle::test::server_process srv;
  client c{srv.port()};
  auto r = c.post(json{{"text", "hello world"}});
  CHECK(r.first == 200);
  CHECK(r.second == json{{"tokens", 2}, {"encoding", "o200k_base"}});

  auto text = std::string{"Größe 你好 👍🏽"};
  r = c.post(json{{"text", text}, {"model", "gpt-4"}});
  CHECK(r.second == json{{"tokens", 10}, {"encoding", "cl100k_base"}});
  r = c.post(json{{"text", text}, {"model", "gpt-4o-mini"}});
  CHECK(r.second == json{{"tokens", 7}, {"encoding", "o200k_base"}});
  // An explicit encoding wins over the model's.
  r = c.post(json{{"text", text}, {"model", "gpt-4o"},
                  {"encoding", "cl100k_base"}});
  CHECK(r.second == json{{"tokens", 10}, {"encoding", "cl100k_base"}});

  json messages = json::array({{{"role", "system"}, {"content", "hello world"}},
                               {{"role", "user"}, {"content", "hello world"},
                                {"name", "user"}}});
  // cl100k: "system" 1, "user" 1, "hello world" 2: 3 + (3+1+2) + (3+1+2+1+1).
  r = c.post(json{{"messages", messages}, {"model", "gpt-3.5-turbo"}});
  CHECK(r.second == json{{"tokens", 17}, {"encoding", "cl100k_base"}});
  // Text parts count as their concatenated text; null content as none.
  json parts = json::array(
    {{{"role", "user"},
      {"content", json::array({{{"type", "text"}, {"text", "hello"}},
                               {{"type", "text"}, {"text", " world"}}})}},
     {{"role", "assistant"}, {"content", nullptr}}});
  r = c.post(json{{"messages", parts}, {"encoding", "cl100k_base"}});
  CHECK(r.second
        == json{{"tokens", 3 + 6 + 3 + 1}, {"encoding", "cl100k_base"}});

  // An unknown model is counted with o200k_base and logged once.
  for (int i = 0; i < 3; ++i) {
    r = c.post(json{{"text", "hello world"}, {"model", "llama-3.1-8b"}});
    CHECK(r.second == json{{"tokens", 2}, {"encoding", "o200k_base"}});
  }
  auto log = srv.log();
  size_t logged = 0;
  for (auto& line : spindle::test::lines(log))
    if (line.find("tokenizer_unknown_model") != std::string::npos
        && line.find("llama-3.1-8b") != std::string::npos)
      ++logged;
  CHECK(logged == 1);
}

TEST_CASE("tokens: POST /v1/tokens/count refuses bad input with the "
          "project's errors") {
  spindle::test::server_process srv{{"--body-limit", "4096"}};
  client c{srv.port()};
  check_error(c.post(std::string{"{"}), 400, "malformed");
  check_error(c.post(std::string{"[]"}), 400, "malformed");
  check_error(c.post(std::string{""}), 400, "malformed");
  check_error(c.post(std::string{"{\"text\":\"\xc3\x28\"}"}), 400, "malformed");
  check_error(c.post(json::object()), 400, "malformed");
  check_error(c.post(json{{"text", "a"}, {"messages", json::array()}}), 400,
              "malformed");
  check_error(c.post(json{{"text", 42}}), 400, "malformed", "text");
  check_error(c.post(json{{"text", "a"}, {"encoding", "p50k_base"}}), 400,
              "invalid_argument", "encoding");
  check_error(c.post(json{{"text", "a"}, {"model", 4}}), 400, "malformed",
              "model");
  check_error(c.post(json{{"text", "a"}, {"colour", "blue"}}), 400,
              "unknown_field");
  check_error(c.post(json{{"messages", "hi"}}), 400, "malformed", "messages");
  check_error(c.post(json{{"messages", json::array({"hi"})}}), 400,
              "malformed", "messages[0]");
  check_error(c.post(json{{"messages", json::array({{{"content", "x"}}})}}),
              400, "malformed", "messages[0].role");
  check_error(c.post(json{{"messages",
                           json::array({{{"role", "user"}, {"content", 3}}})}}),
              400, "invalid_argument", "messages[0].content");
  check_error(c.post(json{{"messages", json::array({{{"role", "user"},
                                                     {"content", "x"},
                                                     {"tool_calls", 1}}})}}),
              400, "unknown_field", "messages[0].tool_calls");
  check_error(c.post(json{{"text", std::string(5000, 'a')}}), 413,
              "too_large");
}

TEST_CASE("tokens: --tokenizer sets the encoding of every model and the "
          "route needs the token like other routes") {
  spindle::test::server_process srv{
    {"--tokenizer", "cl100k_base", "--token", "secret"}};
  client anonymous{srv.port()};
  check_error(anonymous.post(json{{"text", "hello world"}}), 401,
              "unauthorized");
  client c{srv.port(), "secret"};
  std::string text = "Größe 你好 👍🏽";
  auto r = c.post(json{{"text", text}, {"model", "gpt-4o"}});
  CHECK(r.second == json{{"tokens", 10}, {"encoding", "cl100k_base"}});
  r = c.post(json{{"text", text}, {"encoding", "o200k_base"}});
  CHECK(r.second == json{{"tokens", 7}, {"encoding", "o200k_base"}});

  auto bad = spindle::test::run(
    {spindle::test::spindle_binary(), "serve", "--tokenizer", "p50k_base"});
  CHECK(bad.exit_code != 0);
}
