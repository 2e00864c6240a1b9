// Encoding speed of Hugging Face's JavaScript tokenizers (npm @huggingface/tokenizers) on a text file,
// or of js-tiktoken with --tiktoken ENCODING. Prints one line:
//   hf-js NAME bytes=N seconds=S MB/s=X tokens=T        (tiktoken-js ENCODING ... with --tiktoken)
// bytes: the file's size; seconds: the median of --repeats timed passes (after one untimed pass that warms
// the JIT and the BPE caches); MB/s: bytes / 10^6 / seconds; tokens: ids in one pass.
// Each pass encodes the text piece by piece, without added BOS/EOS (add_special_tokens false) but with
// special-token text matched as such, as Tokenizers.js always does (js-tiktoken: encode(piece, "all", [])). Pieces: the file read as UTF-8, cut after each "\n"; consecutive lines are joined
// while the piece stays under 4096 UTF-16 code units; a line of 4096 or more is cut after the last " " before
// 4096 code units (or at 4096, moved back one if that would split a surrogate pair). Every pass uses the same pieces.
//   NODE_PATH=/work/npm-hf/node_modules node bench/tokenizers/hf_js_encode.mjs DIR TEXT [REPEATS]
//   NODE_PATH=/work/npm-hf/node_modules node bench/tokenizers/hf_js_encode.mjs --tiktoken o200k_base TEXT [REPEATS]
// DIR holds tokenizer.json and (optionally) tokenizer_config.json, e.g. one unpacked from
// tests/fixtures/hf_tokenizers/NAME.tar.xz; NAME is DIR's last component. REPEATS defaults to 5.
import { createRequire } from "node:module";
import { existsSync, readFileSync } from "node:fs";
import { basename, join } from "node:path";

const require = createRequire(join(process.env.NODE_PATH ?? "", "x.js"));
const args = process.argv.slice(2);
let tiktoken = null;
if (args[0] === "--tiktoken") { tiktoken = args[1]; args.splice(0, 2); }
const [dir, file, rep] = tiktoken ? [null, args[0], args[1]] : args;
const repeats = Number.parseInt(rep ?? "5", 10);
if (!file || !(repeats >= 1) || (!tiktoken && !dir)) {
  console.error("usage: hf_js_encode.mjs DIR TEXT [REPEATS] | hf_js_encode.mjs --tiktoken ENCODING TEXT [REPEATS]");
  process.exit(2);
}

function pieces(text, limit = 4096) {
  const out = [];
  let cur = "";
  const flush = () => { if (cur) out.push(cur); cur = ""; };
  for (let line of text.split(/(?<=\n)/)) {
    while (line.length >= limit) {
      let cut = line.lastIndexOf(" ", limit - 1) + 1;
      if (cut <= 0) { cut = limit; const c = line.charCodeAt(cut - 1); if (c >= 0xd800 && c <= 0xdbff) --cut; }
      flush(); out.push(line.slice(0, cut)); line = line.slice(cut);
    }
    if (cur.length + line.length >= limit) flush();
    cur += line;
  }
  flush();
  return out;
}

const bytes = readFileSync(file);
const parts = pieces(bytes.toString("utf8"));
let encode, label;
if (tiktoken) {
  const { getEncoding } = require("js-tiktoken");
  const enc = getEncoding(tiktoken);
  encode = (s) => enc.encode(s, "all", []).length;
  label = `tiktoken-js ${tiktoken}`;
} else {
  const { Tokenizer } = require("@huggingface/tokenizers");
  const cfgPath = join(dir, "tokenizer_config.json");
  const tok = new Tokenizer(JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
    existsSync(cfgPath) ? JSON.parse(readFileSync(cfgPath, "utf8")) : {});
  encode = (s) => tok.encode(s, { add_special_tokens: false }).ids.length;
  label = `hf-js ${basename(dir.replace(/\/+$/, ""))}`;
}
const pass = () => parts.reduce((n, p) => n + encode(p), 0);
let tokens = pass();
const times = [];
for (let r = 0; r < repeats; ++r) {
  const t0 = process.hrtime.bigint();
  tokens = pass();
  times.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
times.sort((a, b) => a - b);
const seconds = times[Math.floor(times.length / 2)];
console.log(`${label} bytes=${bytes.length} seconds=${seconds.toFixed(4)} MB/s=${(bytes.length / 1e6 / seconds).toFixed(3)} tokens=${tokens}`);
