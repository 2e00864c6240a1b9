// Encoding speed of js-tiktoken 1.0.21's GPT-2 encoder, measured as bench/tokenize.cpp measures
// xgrad's: each file encoded `--repeats` times after one untimed encode (which also warms the JIT),
// the median in MB/s (10^6 bytes of UTF-8 input a second). The text is read as UTF-8.
//     NODE_PATH=~/xgrad-node/node_modules node bench/tokenize_js.mjs [--repeats 15] [--json] FILE...
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const require = createRequire(join(process.env.NODE_PATH ?? "", "x.js"));
const { getEncoding } = await import(require.resolve("js-tiktoken"));
const enc = getEncoding("gpt2");

let repeats = 15, json = false;
const files = [];
const args = process.argv.slice(2);
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--repeats") repeats = Number.parseInt(args[++i], 10);
  else if (args[i] === "--json") json = true;
  else files.push(args[i]);
}
if (files.length === 0 || !(repeats >= 1)) {
  console.error("usage: node bench/tokenize_js.mjs [--repeats N] [--json] FILE...");
  process.exit(2);
}
if (!json) console.log(`${"file".padEnd(40)} ${"bytes".padStart(10)} ${"tokens".padStart(10)} ${"MB/s".padStart(10)}`);
for (const file of files) {
  const bytes = readFileSync(file);
  const text = bytes.toString("utf8");
  let tokens = enc.encode(text, [], []).length;
  const rates = [];
  for (let r = 0; r < repeats; ++r) {
    const t0 = process.hrtime.bigint();
    tokens = enc.encode(text, [], []).length;
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    rates.push(bytes.length / 1e6 / seconds);
  }
  rates.sort((a, b) => a - b);
  const median = rates[Math.floor(rates.length / 2)];
  if (json) console.log(JSON.stringify({ file, bytes: bytes.length, tokens, mb_per_s: Number(median.toFixed(3)) }));
  else console.log(`${file.padEnd(40)} ${String(bytes.length).padStart(10)} ${String(tokens).padStart(10)} ${median.toFixed(2).padStart(10)}`);
}
