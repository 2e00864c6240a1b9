// xgrad-tokenize: text files to token files (encode), text to ids and back (ids, decode), and a
// token file's header (info). Every failure exits 1 with one line "xgrad-tokenize: ..." on
// stderr, and writes nothing.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/text/load_tokenizer.hpp"
#include "xgrad/text/token_batches.hpp"
#include "xgrad/text/token_file.hpp"

namespace {

using xgrad::fail;
using xgrad::text::TokenIds;
using xgrad::text::Tokenizer;

constexpr const char* kProgram = "xgrad-tokenize";

// The one tokenizer kind that takes no path after it.
bool takes_path(const std::string& kind) { return kind != "bytes"; }

// "--tokenizer KIND [PATH]" as two options CLI11 can read: "--tokenizer KIND --tokenizer-path
// PATH". The path is the argument after every kind but bytes.
std::vector<std::string> rewrite_tokenizer_option(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      for (; i < argc; ++i) args.emplace_back(argv[i]);
      break;
    }
    std::optional<std::string> kind;
    if (a == "--tokenizer" && i + 1 < argc) {
      kind = argv[++i];
    } else if (a.rfind("--tokenizer=", 0) == 0) {
      kind = a.substr(std::strlen("--tokenizer="));
    }
    if (!kind) {
      args.push_back(a);
      continue;
    }
    args.push_back("--tokenizer");
    args.push_back(*kind);
    if (takes_path(*kind) && i + 1 < argc) {
      args.push_back("--tokenizer-path");
      args.push_back(argv[++i]);
    }
  }
  return args;
}

struct TokenizerOption {
  std::string kind, path;
  void add_to(CLI::App& app) {
    app.add_option("--tokenizer", kind, "KIND [PATH]: bytes, gpt2 DIR, bpe PATH, spm FILE or hf DIR")->required();
    app.add_option("--tokenizer-path", path)->group("");  // the PATH of --tokenizer KIND PATH
  }
  std::unique_ptr<Tokenizer> load() const { return xgrad::text::load_tokenizer(kind, path, kProgram); }
};

xgrad::text::SpecialText parse_special(const std::string& s) {
  if (s == "ordinary") return xgrad::text::SpecialText::ordinary;
  if (s == "match") return xgrad::text::SpecialText::match;
  fail(kProgram, ": --special ", s, " is neither ordinary nor match");
}

std::uint64_t parse_seed(const std::string& s) {
  if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string::npos)
    fail(kProgram, ": --seed '", xgrad::text::readable_bytes(s), "' is not a decimal integer in [0, 2^64)");
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE) fail(kProgram, ": --seed ", s, " is past 2^64 - 1");
  return v;
}

double parse_fraction(const std::string& s) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || !(v > 0 && v < 1))
    fail(kProgram, ": --val-fraction '", xgrad::text::readable_bytes(s), "' is not a number in (0, 1)");
  return v;
}

void write_stdout(std::string_view bytes) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0)
    fail(kProgram, ": writing to stdout failed: ", std::strerror(errno));
}

std::string json_ids(const TokenIds& ids) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

// ----------------------------------------------------------------------------------------------
// encode

// How a file's text becomes documents: the whole file, its lines, or the pieces between
// separators. The separator text is not part of any document; a final separator ends the last
// document and starts no empty one.
struct Splitter {
  std::string separator;  // empty: the whole file is one document
  std::vector<std::string_view> split(std::string_view text) const {
    if (separator.empty()) return {text};
    std::vector<std::string_view> docs;
    std::size_t begin = 0;
    while (begin < text.size()) {
      const std::size_t at = text.find(separator, begin);
      if (at == std::string_view::npos) {
        docs.push_back(text.substr(begin));
        break;
      }
      docs.push_back(text.substr(begin, at - begin));
      begin = at + separator.size();
    }
    return docs;
  }
};

struct EncodeOptions {
  TokenizerOption tokenizer;
  std::string out, val, val_fraction = "0.1", seed = "0", separator, special = "ordinary";
  bool split_lines = false;
  std::vector<std::string> files;
};

std::string describe_file(const std::string& path, const xgrad::text::TokenFileWriter& w, std::uint32_t dtype) {
  return path + ": " + std::to_string(w.tokens()) + " tokens, " + std::to_string(w.documents()) + " documents (" +
         (dtype == 2 ? "uint16" : "uint32") + ")\n";
}

void encode(const EncodeOptions& o, const CLI::App& app) {
  const bool with_val = !o.val.empty();
  if (!with_val && (app.count("--val-fraction") || app.count("--seed")))
    fail(kProgram, ": --val-fraction and --seed choose the validation documents; they need --val");
  const double fraction = parse_fraction(o.val_fraction);
  const std::uint64_t seed = parse_seed(o.seed);
  const xgrad::text::SpecialText special = parse_special(o.special);
  if (app.count("--separator") && o.separator.empty()) fail(kProgram, ": --separator is empty");
  const Splitter splitter{o.split_lines ? "\n" : o.separator};

  // Every input is a readable file; the outputs, before any input is read, are none of the
  // inputs (the tokenizer's files included), not each other, and writable.
  for (const std::string& f : o.files) xgrad::ReadableFile(f, kProgram);
  std::vector<xgrad::RunPath> inputs, outputs = {{"--out", o.out}};
  for (const std::string& f : o.files) inputs.push_back({"the text file", f});
  if (!o.tokenizer.path.empty()) inputs.push_back({"--tokenizer", o.tokenizer.path, true});
  if (with_val) outputs.push_back({"--val", o.val});
  xgrad::check_run_paths(inputs, outputs, kProgram);
  xgrad::check_writable_file(o.out, kProgram);
  if (with_val) xgrad::check_writable_file(o.val, kProgram);

  const std::unique_ptr<Tokenizer> tokenizer = o.tokenizer.load();
  const std::optional<std::int64_t> eos = tokenizer->special_tokens().eos;
  const auto read = [](const std::string& path) { return xgrad::read_file(path, kProgram); };

  // The validation documents: the first round(fraction * n) of a seeded shuffle of all n.
  std::vector<std::size_t> counts;
  std::vector<char> is_val;
  if (with_val) {
    std::size_t n = 0;
    for (const std::string& f : o.files) {
      counts.push_back(splitter.split(read(f)).size());
      n += counts.back();
    }
    const auto n_val = static_cast<std::size_t>(std::llround(fraction * static_cast<double>(n)));
    if (n_val == 0 || n_val >= n)
      fail(kProgram, ": --val-fraction ", fraction, " of ", n, " documents gives ", n_val,
           " validation documents; both files need at least one (more documents, or another fraction)");
    std::vector<std::size_t> index(n);
    for (std::size_t i = 0; i < n; ++i) index[i] = i;
    xgrad::Generator gen(seed);
    for (std::size_t i = 0; i < n_val; ++i)
      std::swap(index[i], index[i + static_cast<std::size_t>(xgrad::text::draw_below(gen, n - i))]);
    is_val.assign(n, 0);
    for (std::size_t i = 0; i < n_val; ++i) is_val[index[i]] = 1;
  }

  const xgrad::text::TokenizerIdentity identity = tokenizer->identity();
  xgrad::text::TokenFileWriter train(o.out, identity, eos);
  std::unique_ptr<xgrad::text::TokenFileWriter> val;
  if (with_val) val = std::make_unique<xgrad::text::TokenFileWriter>(o.val, identity, eos);
  // Without an end-of-text token, documents are joined by the text that separated them.
  const TokenIds joint = eos ? TokenIds{} : tokenizer->encode(splitter.separator, special);
  std::size_t doc = 0;
  std::vector<std::string> sources[2];  // the input files of the documents of train [0] and val [1]
  for (std::size_t f = 0; f < o.files.size(); ++f) {
    const std::string text = read(o.files[f]);
    const std::vector<std::string_view> docs = splitter.split(text);
    if (with_val && docs.size() != counts[f])
      fail(kProgram, ": '", o.files[f], "' changed while being read (", counts[f], " documents, now ", docs.size(),
           ")");
    for (std::size_t k = 0; k < docs.size(); ++k) {
      const bool to_val = with_val && is_val[doc];
      xgrad::text::TokenFileWriter& w = to_val ? *val : train;
      if (w.documents() > 0 && !joint.empty()) w.append(joint);
      TokenIds ids;
      try {
        ids = tokenizer->encode(docs[k], special);
      } catch (const xgrad::Error& e) {
        fail(kProgram, ": encoding '", o.files[f], "' (document ", k + 1, " of ", docs.size(), "): ", e.what());
      }
      w.append_document(ids);
      if (sources[to_val].empty() || sources[to_val].back() != o.files[f]) sources[to_val].push_back(o.files[f]);
      ++doc;
    }
  }
  for (const bool is_val_file : {false, true}) {
    const xgrad::text::TokenFileWriter* w = is_val_file ? val.get() : &train;
    if (!w || w->tokens() > 0) continue;
    std::string from;
    for (const std::string& f : sources[is_val_file]) from += (from.empty() ? "'" : ", '") + f + "'";
    const std::uint64_t n = w->documents();
    const std::string what = n == 0   ? std::string("no document goes to it")
                             : n == 1 ? "its 1 document, from " + from + ", is empty"
                                      : "its " + std::to_string(n) + " documents, from " + from + ", are empty";
    fail(kProgram, ": encode ", is_val_file ? "--val '" + o.val : "--out '" + o.out, "' would hold no tokens: ", what,
         train.tokens() + (val ? val->tokens() : 0) == 0 ? " (the input has no text)"
         : is_val_file                                   ? " (another --seed or --val-fraction chooses others)"
                                                         : "");
  }
  const std::uint32_t dtype = xgrad::text::token_file_dtype(identity.vocab_size);
  std::string report;
  if (val) {
    val->finish();
    report = describe_file(o.val, *val, dtype);
  }
  train.finish();
  write_stdout(describe_file(o.out, train, dtype) + report + "tokenizer: " + xgrad::text::describe(identity) +
               (eos ? ", documents separated by eos " + std::to_string(*eos) : ", no eos: documents joined") + "\n");
}

// ----------------------------------------------------------------------------------------------
// ids, decode, info

std::string text_argument(const std::string& text, const std::string& file, bool text_given, const char* what) {
  if (text_given == !file.empty()) fail(kProgram, ": give the ", what, " or --file F, one of them");
  return text_given ? text : xgrad::read_file(file, kProgram);
}

TokenIds parse_ids(const std::string& json) {
  const nlohmann::json doc = xgrad::detail::parse_json(json, std::string(kProgram) + ": the list of ids");
  if (!doc.is_array()) fail(kProgram, ": the ids must be a JSON array of integers, not a ", doc.type_name());
  TokenIds ids;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    const nlohmann::json& v = doc[i];
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      fail(kProgram, ": id ", xgrad::detail::json_excerpt(v), " at position ", i, " is past 2^63 - 1");
    if (!v.is_number_integer())
      fail(kProgram, ": the element at position ", i, " is ", xgrad::detail::json_excerpt(v), ", not an integer");
    ids.push_back(v.get<std::int64_t>());
  }
  return ids;
}

void info(const std::string& path, bool check) {
  const xgrad::text::TokenFile file(path);
  const xgrad::text::TokenFileHeader& h = file.header();
  std::string out = "file: " + path + "\nformat: XGTOKENS version " + std::to_string(h.version) +
                    "\ndtype: " + (h.dtype == 2 ? "uint16" : "uint32") + "\ntokens: " + std::to_string(h.tokens) +
                    "\ndocuments: " + std::to_string(h.documents) + "\ntokenizer: " + h.tokenizer.kind +
                    "\nvocab_size: " + std::to_string(h.tokenizer.vocab_size) + "\ndigest: " + h.tokenizer.digest +
                    "\neos: " + (h.eos ? std::to_string(*h.eos) : "none") + "\n";
  if (check) {
    file.check_ids();
    out += "ids: all below vocab_size\n";
  }
  write_stdout(out);
}

int run(int argc, char** argv) {
  CLI::App app{"Text to token files and back, for xgrad's language models."};
  app.name(kProgram);
  app.require_subcommand(1);

  EncodeOptions enc;
  CLI::App* encode_cmd = app.add_subcommand("encode", "tokenize text files into a token file (and a validation one)");
  enc.tokenizer.add_to(*encode_cmd);
  encode_cmd->add_option("--out", enc.out, "the token file to write")->required();
  encode_cmd->add_option("--val", enc.val, "also write a validation token file, of whole documents");
  encode_cmd->add_option("--val-fraction", enc.val_fraction, "the share of documents in --val (default 0.1)");
  encode_cmd->add_option("--seed", enc.seed, "the seed choosing the validation documents (default 0)");
  CLI::Option* lines = encode_cmd->add_flag("--split-lines", enc.split_lines, "each line of a file is a document");
  encode_cmd->add_option("--separator", enc.separator, "the text between two documents of a file")->excludes(lines);
  encode_cmd->add_option("--special", enc.special, "special-token text in the input: ordinary (default) or match");
  encode_cmd->add_option("files", enc.files, "text files; each is a document unless split")->required();

  TokenizerOption ids_tok;
  std::string ids_text, ids_file, ids_special = "ordinary";
  CLI::App* ids_cmd = app.add_subcommand("ids", "print the ids of a text as one JSON array");
  ids_tok.add_to(*ids_cmd);
  ids_cmd->add_option("--special", ids_special, "special-token text: ordinary (default) or match");
  ids_cmd->add_option("--file", ids_file, "read the text from a file");
  CLI::Option* ids_text_opt = ids_cmd->add_option("text", ids_text, "the text");

  TokenizerOption dec_tok;
  std::string dec_json, dec_file;
  CLI::App* dec_cmd = app.add_subcommand("decode", "print the text (raw bytes) of a JSON array of ids");
  dec_tok.add_to(*dec_cmd);
  dec_cmd->add_option("--file", dec_file, "read the JSON array from a file");
  CLI::Option* dec_json_opt = dec_cmd->add_option("ids", dec_json, "the JSON array of ids");

  std::string info_path;
  bool info_check = false;
  CLI::App* info_cmd = app.add_subcommand("info", "print a token file's header");
  info_cmd->add_option("file", info_path, "the token file")->required();
  info_cmd->add_flag("--check", info_check, "also read every id and check it is below vocab_size");

  if (argc >= 2 && argv[1][0] != '-') {
    const std::string command = argv[1];
    if (command != "encode" && command != "ids" && command != "decode" && command != "info")
      fail(kProgram, ": unknown command '", xgrad::text::readable_bytes(command), "' (encode, ids, decode or info)");
  }
  std::vector<std::string> args = rewrite_tokenizer_option(argc, argv);
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::ParseError& e) {
    fail(kProgram, ": ", e.what(), " (see ", kProgram, " --help)");
  }

  if (encode_cmd->parsed()) encode(enc, *encode_cmd);
  if (ids_cmd->parsed()) {
    const std::string text = text_argument(ids_text, ids_file, ids_text_opt->count() > 0, "text");
    const auto tokenizer = ids_tok.load();
    write_stdout(json_ids(tokenizer->encode(text, parse_special(ids_special))) + "\n");
  }
  if (dec_cmd->parsed()) {
    const TokenIds ids = parse_ids(text_argument(dec_json, dec_file, dec_json_opt->count() > 0, "JSON array of ids"));
    write_stdout(dec_tok.load()->decode(ids));
  }
  if (info_cmd->parsed()) info(info_path, info_check);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file size limit (ulimit -f) a write fails with EFBIG, reported naming the file and the
  // limit, and the temporary is removed, instead of the signal killing the program.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of memory\n", kProgram);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    std::fprintf(stderr, "%s\n",
                 what.rfind(kProgram, 0) == 0 ? what.c_str() : (std::string(kProgram) + ": " + what).c_str());
  }
  return 1;
}
