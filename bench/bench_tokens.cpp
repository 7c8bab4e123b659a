// Token counting (docs/tokens.md): the C++ tokenizer beside the reference,
// OpenAI's tiktoken as its npm package runs it (the Rust implementation
// through WASM, in Node), on the same text in the same run. First every
// token of at least 20 MB of varied text (the repository's docs and
// sources, the seeds, generated text in many scripts with emoji, digit and
// whitespace runs) must equal the reference's; then each side encodes the
// whole corpus on one thread, best of three passes, timing the encode calls
// alone. The npm package is installed once into the build tree
// (tests/tiktoken/setup.sh).
//
// Usage: bench_tokens [--quick] [--json PATH] [--bytes N]

#include <array>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <spdlog/spdlog.h>

#include "report.hpp"
#include "../tests/tiktoken/golden.hpp"
#include "spindle/runtime/tokenizer.hpp"

using namespace spindle;
using namespace spindle::bench;
namespace fs = std::filesystem;

namespace {

std::string quote(const std::string& s) {
  return "'" + s + "'";
}

// Runs a shell command; its standard output, or exits the benchmark.
std::string run(const std::string& command) {
  std::string out;
  if (auto* p = ::popen(command.c_str(), "r")) {
    std::array<char, 4096> buf;
    while (auto n = std::fread(buf.data(), 1, buf.size(), p))
      out.append(buf.data(), n);
    if (::pclose(p) == 0)
      return out;
  }
  std::cerr << "bench_tokens: failed: " << command << "\n" << out;
  std::exit(1);
}

// The last line of `out`, parsed (the scripts print one JSON line).
nlohmann::json last_json(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  auto begin = out.rfind('\n', end);
  return nlohmann::json::parse(
    out.substr(begin == std::string::npos ? 0 : begin + 1));
}

} // namespace

int main(int argc, char** argv) {
  bool quick = report::quick(argc, argv);
  size_t bytes = quick ? 2'000'000 : 20'000'000;
  if (auto b = report::value(argc, argv, "--bytes"); !b.empty())
    bytes = std::stoull(b);
  int passes = quick ? 1 : 3;
  std::string src = SPINDLE_SOURCE_DIR;
  auto dir = fs::path{SPINDLE_BINARY}.parent_path() / "tiktoken";
  report rep{"tokens"};
  spdlog::set_level(spdlog::level::warn);

  run(quote(src + "/tests/tiktoken/setup.sh") + " " + quote(dir.string()));
  auto corpus = (dir / "bench-corpus.bin").string();
  auto seeds = src + "/../shared/seeds";
  run("node " + quote((dir / "corpus.mjs").string()) + " --bench --seed 7"
      + " --bytes " + std::to_string(bytes) + " --out " + quote(corpus) + " "
      + quote(src + "/README.md") + " " + quote(src + "/docs") + " "
      + quote(src + "/runtime") + " " + quote(src + "/messages") + " "
      + quote(src + "/actors") + " " + quote(src + "/tests") + " "
      + quote(src + "/bench")
      + (fs::is_directory(seeds) ? " " + quote(seeds) : ""));
  auto records = golden::read_corpus(corpus);
  size_t total = 0;
  for (auto& r : records)
    total += r.text.size();
  double mb = static_cast<double>(total) / 1e6;

  table agree;
  agree.title = "Agreement with the reference (tiktoken npm), token for token";
  agree.columns = {"encoding", "records", "MB", "tokens", "records differing",
                   "first difference"};
  table speed;
  speed.title = "Tokens per second on one thread, beside the reference";
  speed.columns = {"encoding", "spindle MB/s", "tiktoken (npm) MB/s",
                   "spindle / tiktoken", "spindle tokens/s",
                   "tiktoken (npm) tokens/s"};
  table load;
  load.title = "Loading an encoding (once per process)";
  load.columns = {"encoding", "load ms", "tokens in the rank table"};
  bool differ = false;

  for (auto& name : tokens::encoding_names()) {
    auto start = clock::now();
    auto* enc = tokens::encoding::find(name);
    auto first_find = seconds_since(start);
    load.add_row(name, bench::fmt(first_find * 1000, 1),
                 enc->vocabulary_size());

    auto expected = (dir / ("bench-reference-" + name + ".bin")).string();
    auto ref = last_json(run("node " + quote((dir / "reference.mjs").string())
                             + " " + name + " " + quote(corpus) + " "
                             + quote(expected) + " --repeat "
                             + std::to_string(passes)));
    auto reference = golden::read_reference(expected, records.size());
    auto cmp = golden::compare(*enc, records, reference);
    differ = differ || cmp.differing_records > 0;
    agree.add_row(name, cmp.records, bench::fmt(mb, 1), cmp.tokens,
                  cmp.differing_records,
                  cmp.first.empty() ? std::string{"none"}
                                    : cmp.first.substr(0, 300));

    double best = 1e30;
    size_t n = 0;
    std::vector<uint32_t> out;
    for (int pass = 0; pass < passes; ++pass) {
      n = 0;
      auto t0 = clock::now();
      for (auto& r : records) {
        out.clear();
        enc->encode(r.text, out);
        n += out.size();
      }
      best = std::min(best, seconds_since(t0));
    }
    double ref_seconds = ref["seconds"].get<double>();
    double ours = mb / best;
    double theirs = mb / ref_seconds;
    speed.add_row(name, bench::fmt(ours, 1), bench::fmt(theirs, 1),
                  bench::fmt(ours / theirs, 1) + "x",
                  bench::fmt(static_cast<double>(n) / best),
                  bench::fmt(ref["tokens"].get<double>() / ref_seconds));
  }
  agree.notes = {"Target: 0 records differing, over at least 20 MB (the "
                 "full run). The tests compare further edge cases: invalid "
                 "UTF-8, 30 000-byte words, every code point in context "
                 "(tests/test_tokens.cpp)."};
  speed.notes = {"Target: spindle at least 2x the reference. Both encode "
                 "the same records one call each on one thread, best of "
                 "three passes; the reference's time is its encode_ordinary "
                 "calls alone, measured inside Node (the text crosses into "
                 "WASM as UTF-8 on each call, which is part of using it)."};
  load.notes = {"The first `encoding::find` of a name in the process: "
                "inflate the embedded rank table, index it, compile the "
                "split pattern. Later calls return the loaded encoding."};
  rep.add(std::move(agree));
  rep.add(std::move(speed));
  rep.add(std::move(load));
  rep.write(report::json_path(argc, argv, "tokens"));
  return differ ? 1 : 0;
}
