// The reference: tiktoken's `encode_ordinary` (OpenAI's Rust
// implementation through WASM) over a corpus written by corpus.mjs.
//   node reference.mjs ENCODING CORPUS OUT [--repeat N]
// Each record's bytes are decoded as a WHATWG decoder does (invalid
// sequences become U+FFFD, a BOM is kept) and encoded. OUT: per record a
// u32 LE token count, then the tokens as u32 LE. Prints one JSON line:
// the records, bytes, tokens, and the seconds spent in encode_ordinary
// alone (the best of N passes with --repeat N).
import { readFileSync, writeFileSync } from "node:fs";
import { get_encoding } from "tiktoken";

const [name, corpus, out, flag, value] = process.argv.slice(2);
if (!out) {
  console.error("usage: node reference.mjs ENCODING CORPUS OUT [--repeat N]");
  process.exit(2);
}
const passes = flag === "--repeat" ? Number(value) : 1;
const raw = readFileSync(corpus);
const decoder = new TextDecoder("utf-8", { ignoreBOM: true });
const texts = [];
let bytes = 0;
for (let at = 4, n = raw.readUInt32LE(0), i = 0; i < n; ++i) {
  const label_len = raw.readUInt32LE(at);
  at += 4 + label_len;
  const len = raw.readUInt32LE(at);
  at += 4;
  texts.push(decoder.decode(raw.subarray(at, at + len)));
  bytes += len;
  at += len;
}

const enc = get_encoding(name);
let best = Infinity;
let results = null;
for (let pass = 0; pass < passes; ++pass) {
  const got = new Array(texts.length);
  const start = process.hrtime.bigint();
  for (let i = 0; i < texts.length; ++i) got[i] = enc.encode_ordinary(texts[i]);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  best = Math.min(best, seconds);
  results = got;
}
enc.free();

let tokens = 0;
for (const r of results) tokens += r.length;
const buf = Buffer.alloc(4 * (results.length + tokens));
let at = 0;
for (const r of results) {
  buf.writeUInt32LE(r.length, at);
  at += 4;
  for (const t of r) {
    buf.writeUInt32LE(t, at);
    at += 4;
  }
}
writeFileSync(out, buf);
console.log(JSON.stringify({ encoding: name, records: texts.length, bytes,
                             tokens, seconds: best }));
