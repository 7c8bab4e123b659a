// Every code point (U+0080..U+10FFFF, surrogates left out) in the contexts
// where the split patterns classify it: after and before letters of both
// cases, between digits, among spaces, between punctuation, before a
// contraction. One record per code point, labelled with its hex value, in
// corpus.mjs's format; reference.mjs encodes it. Found the code points of
// Unicode 15 and 16 that PCRE2 10.42 does not know
// (runtime/llm/tokenizer/unicode_16.hpp), and pins that none else differ.
//   node probe.mjs OUT
import { writeFileSync } from "node:fs";

const out = process.argv[2];
if (!out) {
  console.error("usage: node probe.mjs OUT");
  process.exit(2);
}
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b; };
const chunks = [null];
let count = 0;
for (let c = 0x80; c <= 0x10ffff; ++c) {
  if (c >= 0xd800 && c <= 0xdfff) continue;
  const s = String.fromCodePoint(c);
  const text = ["a" + s + "b", "A" + s + "b", "A" + s + "B", "1" + s + "1",
                " " + s + " x", "!" + s + "!", "(" + s + "a", s + "'s",
                "\u00e9" + s].join("\n");
  const label = Buffer.from(c.toString(16));
  const bytes = Buffer.from(text);
  chunks.push(u32(label.length), label, u32(bytes.length), bytes);
  ++count;
}
chunks[0] = u32(count);
writeFileSync(out, Buffer.concat(chunks));
console.log(JSON.stringify({ records: count }));
