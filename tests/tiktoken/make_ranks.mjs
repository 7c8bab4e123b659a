// Writes the rank files spindle's tokenizer embeds
// (runtime/llm/tokenizer/data/<encoding>.ranks.z) from the pinned tiktoken
// npm package. Run by hand after a change of package-lock.json:
//   tests/tiktoken/setup.sh /tmp/tk && node /tmp/tk/make_ranks.mjs runtime/llm/tokenizer/data
// Format (docs/tokens.md, "The rank data"): a 4-byte little-endian size of
// the inflated payload, then the payload deflated with zlib (level 9). The
// payload: "SPTK" 1, the token count n (u32 LE), then for ranks 0..n-1 one
// byte with the token's length and the token's bytes.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { deflateSync } from "node:zlib";
import { join } from "node:path";

const require = createRequire(import.meta.url);
const out = process.argv[2];
if (!out) {
  console.error("usage: node make_ranks.mjs OUTDIR");
  process.exit(2);
}
for (const name of ["o200k_base", "cl100k_base"]) {
  const file = require.resolve(`tiktoken/encoders/${name}.json`);
  const spec = JSON.parse(readFileSync(file, "utf8"));
  const parts = spec.bpe_ranks.split(" ");
  // "! <first rank> token token ...": one group in both encodings.
  if (parts[0] !== "!" || parts[1] !== "0" || parts.indexOf("!", 1) !== -1)
    throw new Error(`${name}: unexpected rank layout`);
  const tokens = parts.slice(2).map((b64) => Buffer.from(b64, "base64"));
  const chunks = [Buffer.from("SPTK\x01", "latin1")];
  const count = Buffer.alloc(4);
  count.writeUInt32LE(tokens.length);
  chunks.push(count);
  for (const t of tokens) {
    if (t.length === 0 || t.length > 255)
      throw new Error(`${name}: a token of ${t.length} bytes`);
    chunks.push(Buffer.from([t.length]), t);
  }
  const payload = Buffer.concat(chunks);
  const size = Buffer.alloc(4);
  size.writeUInt32LE(payload.length);
  const packed = Buffer.concat([size, deflateSync(payload, { level: 9 })]);
  writeFileSync(join(out, `${name}.ranks.z`), packed);
  console.log(`${name}: ${tokens.length} tokens, ${payload.length} bytes, ` +
              `${packed.length} compressed`);
}
