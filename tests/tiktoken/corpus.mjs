// Writes the corpus the tokenizer is compared on (docs/tokens.md,
// "Tests"): files read as they are, then generated text (many scripts,
// emoji, whitespace and digit runs, very long words, contractions, special
// token text, invalid UTF-8) until the corpus holds --bytes bytes.
//   node corpus.mjs --out FILE [--bytes N] [--seed S] [--bench] PATH...
// PATH: files or directories (walked for text files). --bench leaves out
// the fixed edge cases and invalid UTF-8 and keeps generated words under
// 200 characters: text as a service meets it, to measure speed on (the
// reference merges a long piece in quadratic time). Format: u32 LE
// record count; per record u32 LE label length, the label (UTF-8), u32 LE
// text length, the text's bytes (not always valid UTF-8).
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { extname, join } from "node:path";

const args = process.argv.slice(2);
let out = null;
let target = 0;
let seed = 25;
let bench = false;
const paths = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--out") out = args[++i];
  else if (args[i] === "--bytes") target = Number(args[++i]);
  else if (args[i] === "--seed") seed = Number(args[++i]);
  else if (args[i] === "--bench") bench = true;
  else paths.push(args[i]);
}
if (!out) {
  console.error("usage: node corpus.mjs --out FILE [--bytes N] [--seed S] PATH...");
  process.exit(2);
}

const records = [];
let total = 0;
function add(label, bytes) {
  records.push([Buffer.from(label), Buffer.from(bytes)]);
  total += bytes.length;
}

// -- files -------------------------------------------------------------------
const text_ext = new Set([".md", ".txt", ".cpp", ".hpp", ".h", ".py", ".sh",
                          ".mjs", ".js", ".json", ".cmake", ".in", ".yml",
                          ".yaml", ".supp", ".csv"]);
function walk(path) {
  const st = statSync(path, { throwIfNoEntry: false });
  if (!st) return;
  if (st.isDirectory()) {
    for (const name of readdirSync(path).sort()) {
      if (name.startsWith(".") || name === "node_modules" || name === "build")
        continue;
      walk(join(path, name));
    }
  } else if (st.isFile() && (text_ext.has(extname(path)) || paths.includes(path))
             && st.size < 4 * 1024 * 1024) {
    add(path, readFileSync(path));
  }
}
for (const p of paths) walk(p);

// -- generated text ----------------------------------------------------------
let state = seed >>> 0;
function random() { // mulberry32
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (xs) => xs[Math.floor(random() * xs.length)];
const int = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));
const repeat = (s, n) => s.repeat(Math.max(0, n));

const words = {
  english: "the quick brown fox jumps over lazy dog token count context window conversation thread runtime actor message budget compaction it's they're we've I'm you'll he'd DON'T Can'T WON'T o'clock rock'n'roll".split(" "),
  german: "Größe Übergröße Straße Fußgänger Äpfel schön heißen Bücher Mädchen Öffnungszeiten Donaudampfschifffahrtsgesellschaftskapitän".split(" "),
  french: "élève déjà où garçon façon naïve cœur Noël l'homme aujourd'hui qu'il c'est".split(" "),
  russian: "Привет мир токены контекст разговор ПРИВЕТ Москва съешь ещё этих мягких французских булок".split(" "),
  greek: "Καλημέρα κόσμε λόγος ΑΛΦΑ ωμέγα ἀρχή ῥῆμα".split(" "),
  arabic: "مرحبا بالعالم اللغة العربية كتاب مكتبة السَّلامُ عَلَيْكُمْ ١٢٣ ٤٥٦٧٨".split(" "),
  hebrew: "שלום עולם עִבְרִית ספר".split(" "),
  hindi: "नमस्ते दुनिया हिन्दी भाषा क्षत्रिय ज्ञान १२३".split(" "),
  thai: "สวัสดีชาวโลก ภาษาไทย กรุงเทพมหานคร".split(" "),
  chinese: "你好世界 自然语言处理 上下文窗口 令牌计数 中華人民共和國 𠀀𠀁𪚥".split(" "),
  japanese: "こんにちは世界 カタカナ ひらがな 東京都 ｶﾀｶﾅ ー々〆".split(" "),
  korean: "안녕하세요 세계 한국어 토큰 각".split(" "),
  emoji: "😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 🇯🇵 ❤️ 🏳️‍🌈 🤖 🧵 ✅ 🔥🔥🔥 ☕ 1️⃣ #️⃣ 🫠".split(" "),
  symbols: "∑ ∫ √ ≤ ≥ ≠ → ⇒ ∀ ∃ ∈ ∅ ℕ ℝ ½ ¾ ² ³ € £ ¥ © ® ™ § ¶ • … — – « » „ “ ” ‘ ’ ′ ″ °C Ⅻ ⅷ ①②③ ⁴⁵".split(" "),
  combining: "e\u0301 a\u0308 n\u0303 o\u0302\u0323 Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319 \u0915\u094d\u0937".split(" "),
  odd: "\u00a0 \u0085 \u2028 \u2029 \u3000 \u200b \u200d \u202f \u205f \u1680 \ufeff \u00ad \u2060 \ufffd \u0000 \u0001 \u007f \u001b[31m \u180e".split(" "),
  code: "int main() { return 0; } std::vector<uint32_t> x; if (a && b || !c) {} x->y = z[i++]; #include <pcre2.h> def f(x): return x**2 const f = async () => await g(); SELECT * FROM t WHERE id = 42; {\"key\": [1, 2.5e-3, null, true]} </div> &amp; ==> !== <=> ::= // /* */ ${x} @decorator".split(" "),
  specials: "<|endoftext|> <|fim_prefix|> <|fim_middle|> <|fim_suffix|> <|endofprompt|> <|im_start|> <|im_end|> <|start|>".split(" "),
  contractions: "'s 'S 't 'T 're 'RE 'Re 've 'VE 'm 'M 'll 'LL 'd 'D 'ſ 'ſt 'x ’s ''s '''".split(" "),
};
const separators = [" ", " ", " ", " ", "  ", "\n", "\n\n", "\r\n", "\t", " \n ",
                    ", ", ". ", "! ", "? ", ": ", "; ", " - ", "/", "\\", "_",
                    "\u00a0", "\u3000", "\u2028", "\u0085", "", ""];
const scripts = Object.keys(words);

function digits(n) {
  let s = "";
  for (let i = 0; i < n; ++i) s += String(int(0, 9));
  return s;
}
function whitespace(n) {
  let s = "";
  for (let i = 0; i < n; ++i) s += pick([" ", " ", " ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u000b", "\u000c", "\u2029"]);
  return s;
}
function long_word(n) {
  const alphabet = pick(["abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
                         "aAbBcCdDeE", "абвгдеёжзий", "あいうえおかきくけこ",
                         "漢字仮名交", "0123456789", "!@#$%^&*()", "ـ"]);
  const chars = [...alphabet];
  let s = "";
  for (let i = 0; i < n; ++i) s += pick(chars);
  return s;
}
function random_code_point() {
  // Anywhere in Unicode, surrogates included (a lone surrogate is written
  // as U+FFFD, as the reference's own UTF-8 conversion writes it).
  const planes = [[0x20, 0x7e], [0xa0, 0x2fff], [0x3000, 0x9fff],
                  [0xac00, 0xd7a3], [0xd800, 0xdfff], [0xe000, 0xffff],
                  [0x10000, 0x1faff], [0x20000, 0x2fa1f], [0xe0000, 0xe01ef],
                  [0xf0000, 0x10ffff]];
  const [lo, hi] = pick(planes);
  return String.fromCharCode(...(function (cp) {
    if (cp < 0x10000) return [cp];
    cp -= 0x10000;
    return [0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff)];
  })(int(lo, hi)));
}

function paragraph() {
  const kind = random();
  if (kind < 0.04) return digits(int(1, 200));
  if (kind < 0.08) return whitespace(int(1, 300));
  if (kind < 0.10) return long_word(bench ? int(20, 200) : int(50, 5000));
  if (kind < 0.13) {
    let s = "";
    for (let n = int(1, 200), i = 0; i < n; ++i) s += random_code_point();
    return s;
  }
  const script = pick(scripts);
  const mix = random() < 0.3;
  let s = "";
  for (let n = int(5, 120), i = 0; i < n; ++i) {
    let w = pick(words[mix ? pick(scripts) : script]);
    const r = random();
    if (r < 0.05) w = w.toUpperCase();
    else if (r < 0.08) w = w[0].toUpperCase() + w.slice(1);
    else if (r < 0.10) w += digits(int(1, 12));
    s += w + pick(separators);
  }
  return s;
}

// Fixed edge cases first, then paragraphs until the target size.
const fixed = [
  ["empty", ""],
  ["hello world", "hello world"],
  ["only spaces", repeat(" ", 1000)],
  ["spaces then word", repeat(" ", 57) + "word"],
  ["spaces then newline", repeat(" ", 40) + "\n" + repeat(" ", 3) + "x"],
  ["newlines", repeat("\n", 500) + repeat("\r\n", 300)],
  ["tabs and spaces", repeat("\t \t  ", 200) + "end"],
  ["trailing space", "end of text "],
  ["digits", digits(10000)],
  ["digits mixed", "1 12 123 1234 12345 123456 3.14159 1,000,000 ١٢٣٤ ²³ ½ Ⅻ ①"],
  ["long word", long_word(20000)],
  ["long lower", repeat("a", 30000)],
  ["long upper", repeat("A", 30000)],
  ["long camel", repeat("Ab", 15000)],
  ["long punct", repeat("!", 10000) + repeat("=-", 5000)],
  ["long cjk", repeat("汉字", 10000)],
  ["long emoji", repeat("👍🏽", 3000)],
  ["special tokens", words.specials.join(" ") + "<|endoftext|><|endoftext|>"],
  ["contractions", words.contractions.join(" ") + " it's IT'S It'S they'Re we'VE 'ſ 'ſs"],
  ["combining", words.combining.join(" ") + repeat("\u0301", 500)],
  ["odd whitespace", words.odd.join("x") + words.odd.join("")],
  ["bom", "\ufeffBOM at the start"],
  ["lone surrogates", "a\ud800b\udc00c\udbff\udfff\ud83d"],
  ["nul", "a\u0000b\u0000\u0000c"],
  ["json", JSON.stringify({ messages: [{ role: "user", content: "Hi! 👋\n\tcount me" }], n: [1, 2, 3] })],
];
for (const [label, text] of bench ? [] : fixed)
  add(`generated: ${label}`, Buffer.from(text));

// Invalid UTF-8: stray continuation bytes, truncated sequences, overlong
// forms, surrogates encoded in UTF-8, bytes that never occur.
const invalid = [
  [0x80], [0xbf], [0xc0, 0xaf], [0xc1, 0xbf], [0xc2], [0xe0, 0x80, 0xaf],
  [0xe0, 0xa0], [0xed, 0xa0, 0x80], [0xed, 0xbf, 0xbf], [0xef, 0xbf],
  [0xf0, 0x80, 0x80, 0xaf], [0xf0, 0x9f, 0x98], [0xf4, 0x90, 0x80, 0x80],
  [0xf5, 0x80, 0x80, 0x80], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xfe], [0xff],
];
for (let i = 0; i < (bench ? 0 : 200); ++i) {
  const parts = [];
  for (let n = int(1, 30), k = 0; k < n; ++k) {
    parts.push(random() < 0.4 ? Buffer.from(pick(invalid))
                              : Buffer.from(pick(words[pick(scripts)]) + pick(separators)));
  }
  add(`generated: invalid utf-8 ${i}`, Buffer.concat(parts));
}

let n = 0;
while (total < target) {
  let doc = "";
  const size = int(200, 60000);
  while (doc.length < size) doc += paragraph() + pick(["\n", "\n\n", " ", ""]);
  add(`generated: document ${n++}`, Buffer.from(doc));
}

const chunks = [];
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b; };
chunks.push(u32(records.length));
for (const [label, bytes] of records) chunks.push(u32(label.length), label, u32(bytes.length), bytes);
writeFileSync(out, Buffer.concat(chunks));
console.log(JSON.stringify({ records: records.length, bytes: total }));
