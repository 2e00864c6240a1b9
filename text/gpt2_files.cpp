#include "xgrad/text/gpt2_files.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/detail/json_file.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/text/gpt2_byte_encoding.hpp"

namespace xgrad::text {

namespace {

using Json = nlohmann::json;

std::string in_quotes(std::string_view text) { return "\"" + readable_bytes(text) + "\""; }

Json parse_json_file(const std::string& path, const std::string& who) {
  return xgrad::detail::parse_json(read_file(path, who), who + ": '" + path + "'");
}

// One merge as a file writes it: two printable tokens, and where it stands ("line 7").
struct MergeText {
  std::string left, right, where;
};

// A token whose id the file gives outside the vocab (tokenizer.json's added_tokens): raw text.
struct AddedToken {
  std::int64_t id;
  std::string content;
  bool special, normalized;
  std::string where;
};

// A key that a JSON object repeats, with the values it is given ("" when the object repeats none).
// nlohmann's parser keeps one of them, so that a repeated token's other id becomes a hole.
class RepeatedKeyFinder : public nlohmann::json_sax<Json> {
 public:
  // Looks in the object at `path` (keys from the root; {} for the root itself).
  explicit RepeatedKeyFinder(std::vector<std::string> path) : path_(std::move(path)) {}
  // "the token "hello" is given twice, with the ids 259 and 260", or "".
  static std::string find(const std::string& text, const std::vector<std::string>& path) {
    RepeatedKeyFinder finder(path);
    Json::sax_parse(text, &finder);
    return finder.found_;
  }

  bool null() override { return value("null"); }
  bool boolean(bool b) override { return value(b ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return value(std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override { return value(std::to_string(v)); }
  bool number_float(number_float_t, const string_t& s) override { return value(s); }
  bool string(string_t&) override { return value("a string"); }
  bool binary(binary_t&) override { return value("binary"); }
  bool start_object(std::size_t) override { return start(true); }
  bool start_array(std::size_t) override { return start(false); }
  bool key(string_t& k) override {
    if (skipped_ == 0) keys_.back() = k;
    return true;
  }
  bool end_object() override { return end(); }
  bool end_array() override { return end(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  // keys_ holds the current key of each object from the root towards the path (only those: any
  // other container just counts in skipped_, so that deep nesting elsewhere costs nothing).
  bool start(bool object) {
    if (skipped_ > 0) {
      ++skipped_;
      return true;
    }
    if (!value(object ? "an object" : "an array")) return false;
    const std::size_t depth = keys_.size();
    if (object && depth <= path_.size() && (depth == 0 || keys_.back() == path_[depth - 1]))
      keys_.emplace_back();
    else
      ++skipped_;
    return true;
  }
  bool end() {
    if (skipped_ > 0)
      --skipped_;
    else
      keys_.pop_back();
    if (keys_.size() <= path_.size()) values_.clear();  // left the object at the path
    return true;
  }
  // A value of the current key; false (stop) once the object at the path repeats a key.
  bool value(const std::string& shown) {
    if (skipped_ > 0 || keys_.size() != path_.size() + 1) return true;
    const auto [it, inserted] = values_.emplace(keys_.back(), shown);
    if (inserted) return true;
    found_ = "the token " + in_quotes(keys_.back()) + " is given twice, with the ids " + it->second + " and " + shown;
    return false;
  }

  std::vector<std::string> path_, keys_;
  std::size_t skipped_ = 0;
  std::unordered_map<std::string, std::string> values_;  // of the object at the path, by key
  std::string found_;
};

// The vocabulary of printable tokens by id, merges and added tokens; `vocab_file` and
// `merges_file` name the files for messages ("load_gpt2_vocabulary: 'dir/vocab.json'"), the
// merges_file also for the added tokens (tokenizer.json's). `repeated_token` says which token the vocab
// object repeats, or "" (RepeatedKeyFinder; called only when the ids are wrong).
BpeVocabulary assemble(const std::string& vocab_file, const Json& vocab, const std::string& merges_file,
                       const std::vector<MergeText>& merges, const std::vector<AddedToken>& added, bool ignore_merges,
                       const std::function<std::string()>& repeated_token) {
  if (!vocab.is_object()) throw Error(vocab_file + " holds " + std::string(vocab.type_name()) + ", not an object");
  const auto bad_ids = [&](const std::string& what) {
    const std::string repeated = repeated_token();
    throw Error(vocab_file + ": " + (repeated.empty() ? what : repeated + " (" + what + ")"));
  };
  // The ids: vocab entries and added tokens together must run 0..N-1.
  std::unordered_map<std::string, std::int64_t> id_of;
  std::unordered_map<std::int64_t, std::string> printable_of;
  id_of.reserve(vocab.size());
  printable_of.reserve(vocab.size());
  for (const auto& [key, value] : vocab.items()) {
    if (!value.is_number_integer())
      throw Error(vocab_file + ": the entry " + in_quotes(key) + " has the value " +
                  xgrad::detail::json_excerpt(value) + ", not an integer id");
    const std::int64_t id = value.get<std::int64_t>();
    if (id < 0)
      throw Error(vocab_file + ": the entry " + in_quotes(key) + " has the negative id " + std::to_string(id));
    const auto [it, inserted] = printable_of.emplace(id, key);
    if (!inserted)
      bad_ids("the entries " + in_quotes(it->second) + " and " + in_quotes(key) + " both have the id " +
              std::to_string(id));
    id_of.emplace(key, id);
  }
  // Hugging Face's tokenizers give each added token, in the file's order, the id of its text in
  // model.vocab, else the next id after model.vocab's size; a file's other "id" only gets a warning.
  // xgrad reads the file's ids, so refuses those. (A text given twice Hugging Face gives one id,
  // with the options of the later token: refused too.)
  std::unordered_map<std::string, std::size_t> added_index;  // the added token of a text
  std::int64_t next_id = static_cast<std::int64_t>(vocab.size());
  for (std::size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    std::int64_t expected;
    std::string because;
    if (const auto earlier = added_index.find(a.content); earlier != added_index.end()) {
      throw Error(merges_file + ": " + a.where + " " + in_quotes(a.content) + " repeats the text of " +
                  added[earlier->second].where);
    } else if (const auto in_vocab = id_of.find(a.content); in_vocab != id_of.end()) {
      expected = in_vocab->second;
      because = "the id of model.vocab's token of that text";
    } else {
      expected = next_id++;
      because = "the next id after model.vocab's " + std::to_string(vocab.size()) + " tokens and the added ones before";
    }
    if (a.id != expected)
      throw Error(merges_file + ": " + a.where + " " + in_quotes(a.content) + " has the id " + std::to_string(a.id) +
                  ", but Hugging Face's tokenizers give it the id " + std::to_string(expected) + " (" + because + ")");
    added_index.emplace(a.content, i);
  }
  std::unordered_map<std::int64_t, const AddedToken*> added_at;
  for (const AddedToken& a : added) added_at.emplace(a.id, &a);
  std::vector<std::int64_t> ids;
  ids.reserve(printable_of.size() + added_at.size());
  for (const auto& entry : printable_of) ids.push_back(entry.first);
  for (const auto& entry : added_at)
    if (!printable_of.count(entry.first)) ids.push_back(entry.first);
  std::sort(ids.begin(), ids.end());
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] != static_cast<std::int64_t>(i))
      bad_ids("no token has the id " + std::to_string(i) + " (the ids must run from 0 to " +
              std::to_string(ids.size() - 1) + " without holes; the largest is " + std::to_string(ids.back()) + ")");
  const std::size_t n = ids.size();

  BpeVocabulary v;
  v.tokens.resize(n);
  std::vector<bool> printable(n, false);  // the token's key is in GPT-2's byte form
  for (const auto& [id, key] : printable_of) {
    if (std::optional<std::string> bytes = gpt2_bytes_from_printable(key)) {
      v.tokens[id] = std::move(*bytes);
      printable[id] = true;
    } else {
      v.tokens[id] = key;  // only a special token may be so; the merges below refuse it otherwise
    }
  }
  std::vector<std::int64_t> made_by(n, -1);  // the first merge line that makes the token
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto result = id_of.find(merges[rank].left + merges[rank].right);
    if (result != id_of.end() && made_by[result->second] < 0) made_by[result->second] = static_cast<std::int64_t>(rank);
  }
  std::unordered_map<std::string, std::size_t> merge_index;
  merge_index.reserve(merges.size());
  v.merges.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const MergeText& m = merges[rank];
    const std::string where = merges_file + " " + m.where;
    std::int64_t part_id[2];
    const std::string* part_text[2] = {&m.left, &m.right};
    for (int k = 0; k < 2; ++k) {
      const auto it = id_of.find(*part_text[k]);
      if (it == id_of.end())
        throw Error(where + ": the token " + in_quotes(*part_text[k]) + " is not in " +
                    vocab_file.substr(vocab_file.find('\'')));
      part_id[k] = it->second;
      if (!printable[part_id[k]])
        throw Error(where + ": the token " + in_quotes(*part_text[k]) + " is not in GPT-2's printable byte form");
      if (v.tokens[part_id[k]].size() > 1 &&
          (made_by[part_id[k]] < 0 || made_by[part_id[k]] >= static_cast<std::int64_t>(rank)))
        throw Error(where + ": the token " + in_quotes(*part_text[k]) + " is not made by an earlier merge" +
                    (made_by[part_id[k]] >= 0 ? " (only by the later " + merges[made_by[part_id[k]]].where + ")" : "") +
                    ": the ranks do not match");
    }
    const std::string joined = m.left + m.right;
    const auto result = id_of.find(joined);
    if (result == id_of.end())
      throw Error(where + ": " + in_quotes(m.left) + " + " + in_quotes(m.right) + " gives " + in_quotes(joined) +
                  ", which is not in " + vocab_file.substr(vocab_file.find('\'')));
    const auto [it, inserted] = merge_index.emplace(m.left + ' ' + m.right, rank);
    if (!inserted) throw Error(where + ": repeats the merge of " + merges[it->second].where);
    v.merges.emplace_back(part_id[0], part_id[1]);
  }
  // A vocab token no merge makes is special, unless a piece can be it whole (ignore_merges).
  std::vector<bool> special(n, false), matched(n, false);
  for (std::size_t id = 0; id < n; ++id)
    if (printable_of.count(id) && made_by[id] < 0 && !(printable[id] && (v.tokens[id].size() == 1 || ignore_merges)))
      special[id] = true;
  bool any_normalized = false, any_not_normalized = false;
  for (const auto& [id, a] : added_at) {
    (a->normalized ? any_normalized : any_not_normalized) = true;
    special[id] = a->special;
    matched[id] = !a->special;
    if (a->special || !printable_of.count(id)) {
      v.tokens[id] = a->content;
    } else if (v.tokens[id] != a->content) {
      throw Error(merges_file + ": " + a->where + " " + in_quotes(a->content) + " is the vocab's token of id " +
                  std::to_string(id) + ", whose bytes " + in_quotes(v.tokens[id]) +
                  " differ from its text; xgrad cannot match the one and decode the other");
    }
  }
  for (std::size_t id = 0; id < n; ++id) {
    if (special[id]) v.special_tokens.push_back(static_cast<std::int64_t>(id));
    if (matched[id]) v.added_tokens.push_back(static_cast<std::int64_t>(id));
    // Hugging Face matches the added tokens with "normalized": false first, then the others.
    if (any_normalized && any_not_normalized && added_at.count(id) && added_at.at(id)->normalized)
      v.matched_later.push_back(static_cast<std::int64_t>(id));
  }
  v.ignore_merges = ignore_merges;
  check_bpe_vocabulary(v, vocab_file);
  return v;
}

std::string file_label(const std::string& who, const std::string& path) { return who + ": '" + path + "'"; }

bool is_folder(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

BpeVocabulary load_gpt2_vocabulary(const std::string& vocab_json, const std::string& merges_txt) {
  const std::string who = "load_gpt2_vocabulary";
  const Json vocab = parse_json_file(vocab_json, who);
  const std::string text = read_file(merges_txt, who);
  // A file saved by a Windows editor may start with a UTF-8 byte order mark (vocab.json's JSON
  // parser skips it too).
  const std::size_t start = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
  std::vector<MergeText> merges;
  std::size_t line_number = 0;
  for (std::size_t at = start; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + at, end - at);
    at = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_number == 1 && line.substr(0, 8) == "#version") continue;
    const std::string where = "line " + std::to_string(line_number);
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      throw Error(file_label(who, merges_txt) + " " + where + ": " + in_quotes(line) +
                  " is not two tokens separated by one space");
    merges.push_back({std::string(line.substr(0, space)), std::string(line.substr(space + 1)), where});
  }
  return assemble(file_label(who, vocab_json), vocab, file_label(who, merges_txt), merges, {}, false,
                  [&] { return RepeatedKeyFinder::find(read_file(vocab_json, who), {}); });
}

BpeVocabulary load_hf_tokenizer_json(const std::string& path) {
  const std::string who = "load_hf_tokenizer_json";
  const std::string file = file_label(who, path);
  const Json doc = parse_json_file(path, who);
  if (!doc.is_object()) throw Error(file + " holds " + std::string(doc.type_name()) + ", not an object");
  if (!doc.contains("model") || !doc["model"].is_object()) throw Error(file + ": no object field \"model\"");
  const Json& model = doc["model"];
  if (model.contains("type")) {
    if (model["type"] != "BPE")
      throw Error(file + ": model.type is " + xgrad::detail::json_excerpt(model["type"]) +
                  ", not \"BPE\" (xgrad reads byte-level BPE tokenizers only)");
  } else if (!model.contains("merges")) {
    throw Error(file + ": model has neither \"type\" nor \"merges\": not a BPE model");
  }
  bool ignore_merges = false;
  if (model.contains("ignore_merges") && !model["ignore_merges"].is_null()) {
    if (!model["ignore_merges"].is_boolean())
      throw Error(file + ": model.ignore_merges is " + xgrad::detail::json_excerpt(model["ignore_merges"]) +
                  ", not true or false");
    ignore_merges = model["ignore_merges"].get<bool>();
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0)
    throw Error(file + ": model.dropout is " + xgrad::detail::json_excerpt(model["dropout"]) +
                "; xgrad encodes without BPE dropout");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(affix) && !model[affix].is_null() && model[affix] != "")
      throw Error(file + ": model." + affix + " is " + xgrad::detail::json_excerpt(model[affix]) +
                  ", which byte-level BPE does not use");
  if (doc.contains("normalizer") && !doc["normalizer"].is_null())
    throw Error(
        file + ": normalizer is " +
        (doc["normalizer"].is_object() && doc["normalizer"].contains("type") && doc["normalizer"]["type"].is_string()
             ? doc["normalizer"]["type"].get<std::string>()
             : xgrad::detail::json_excerpt(doc["normalizer"])) +
        ", not null (GPT-2's byte-level BPE changes no text before splitting it)");
  // The pre-tokenizer must be GPT-2's: ByteLevel with its regex and no added space.
  const auto check_byte_level = [&](const Json& p, const std::string& field) {
    if (!p.is_object() || p.value("type", "") != "ByteLevel")
      throw Error(file + ": " + field + " is " +
                  (p.is_object() && p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>()
                                                                                : xgrad::detail::json_excerpt(p)) +
                  ", not ByteLevel (GPT-2's pre-tokenizer)");
    if (p.value("add_prefix_space", true))
      throw Error(file + ": " + field +
                  ".add_prefix_space is true (or missing: Hugging Face's default); "
                  "GPT-2 adds no space before the text");
    if (!p.value("use_regex", true))
      throw Error(file + ": " + field + ".use_regex is false; GPT-2 splits the text by its pattern");
  };
  if (!doc.contains("pre_tokenizer") || doc["pre_tokenizer"].is_null())
    throw Error(file + ": pre_tokenizer is missing or null, not ByteLevel (GPT-2's pre-tokenizer)");
  const Json& pre = doc["pre_tokenizer"];
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array() || pre["pretokenizers"].size() != 1)
      throw Error(file + ": pre_tokenizer is a Sequence of other than one member; xgrad reads a ByteLevel one alone");
    check_byte_level(pre["pretokenizers"][0], "pre_tokenizer.pretokenizers[0]");
  } else {
    check_byte_level(pre, "pre_tokenizer");
  }
  if (!model.contains("vocab")) throw Error(file + ": no field model.vocab");
  if (!model.contains("merges") || !model["merges"].is_array()) throw Error(file + ": no array field model.merges");
  std::vector<MergeText> merges;
  const Json& list = model["merges"];
  merges.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    const Json& m = list[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const std::size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size() ||
          s.find(' ', space + 1) != std::string::npos)
        throw Error(file + " " + where + ": " + xgrad::detail::json_excerpt(m) +
                    " is not two tokens separated by one space");
      merges.push_back({s.substr(0, space), s.substr(space + 1), where});
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back({m[0].get<std::string>(), m[1].get<std::string>(), where});
    } else {
      throw Error(file + " " + where + ": " + xgrad::detail::json_excerpt(m) +
                  " is neither \"a b\" nor a pair of strings");
    }
  }
  std::vector<AddedToken> added;
  if (doc.contains("added_tokens") && !doc["added_tokens"].is_null()) {
    if (!doc["added_tokens"].is_array()) throw Error(file + ": added_tokens is not an array");
    const Json& tokens = doc["added_tokens"];
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      const Json& t = tokens[i];
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string() || t["content"] == "")
        throw Error(file + ": " + where + " is " + xgrad::detail::json_excerpt(t) +
                    ", not an object with an integer \"id\" and a non-empty string \"content\"");
      const std::string content = t["content"].get<std::string>();
      const auto flag = [&](const char* name, bool absent) {
        if (!t.contains(name) || t[name].is_null()) return absent;
        if (!t[name].is_boolean())
          throw Error(file + ": " + where + "." + name + " is " + xgrad::detail::json_excerpt(t[name]) +
                      ", not true or false");
        return t[name].get<bool>();
      };
      // What Hugging Face does with these, xgrad does not: refused rather than ignored.
      const std::pair<const char*, const char*> options[] = {
          {"single_word", "matches the token only where no letter, digit or _ is next to it"},
          {"lstrip", "takes the whitespace before the token into it"},
          {"rstrip", "takes the whitespace after the token into it"}};
      for (const auto& [name, what] : options)
        if (flag(name, false))
          throw Error(file + ": " + where + " " + in_quotes(content) + " has " + name +
                      " true, which xgrad does not implement (Hugging Face " + what + ")");
      const bool special = flag("special", false);
      added.push_back({t["id"].get<std::int64_t>(), content, special, flag("normalized", !special), where});
    }
  }
  return assemble(file + " model.vocab", model["vocab"], file, merges, added, ignore_merges, [&] {
    return RepeatedKeyFinder::find(read_file(path, who), {"model", "vocab"});
  });
}

void save_gpt2_vocabulary(const BpeVocabulary& v, const std::string& dir) {
  const std::string who = "save_gpt2_vocabulary";
  check_bpe_vocabulary(v, who);
  if (!v.added_tokens.empty())
    throw Error(who + ": the vocabulary has added tokens (the first is id " + std::to_string(v.added_tokens[0]) + " " +
                in_quotes(v.tokens[v.added_tokens[0]]) +
                "), matched in any text; vocab.json and merges.txt cannot say so (keep its tokenizer.json)");
  if (v.ignore_merges)
    throw Error(who +
                ": the vocabulary ignores the merges for a piece that is a token (ignore_merges); "
                "vocab.json and merges.txt cannot say so (keep its tokenizer.json)");
  const std::string vocab_path = dir + "/vocab.json", merges_path = dir + "/merges.txt";
  std::vector<bool> special(v.tokens.size(), false);
  for (const std::int64_t id : v.special_tokens) special[id] = true;
  std::vector<bool> made(v.tokens.size(), false);
  {
    std::unordered_map<std::string_view, std::size_t> id_of;
    for (std::size_t id = 0; id < v.tokens.size(); ++id)
      if (!special[id]) id_of.emplace(v.tokens[id], id);
    for (const auto& [left, right] : v.merges) made[id_of.at(v.tokens[left] + v.tokens[right])] = true;
  }
  std::string vocab = "{";
  std::unordered_map<std::string, std::size_t> id_of_key;
  for (std::size_t id = 0; id < v.tokens.size(); ++id) {
    if (!special[id] && v.tokens[id].size() > 1 && !made[id])
      throw Error(who + ": the token of id " + std::to_string(id) + " " + in_quotes(v.tokens[id]) +
                  " is made by no merge; load_gpt2_vocabulary would read it back as a special token");
    const std::string key = gpt2_printable_from_bytes(v.tokens[id]);
    const auto [it, inserted] = id_of_key.emplace(key, id);
    if (!inserted)
      throw Error(who + ": ids " + std::to_string(it->second) + " and " + std::to_string(id) + " are both " +
                  in_quotes(v.tokens[id]) + ", which vocab.json cannot hold twice");
    if (id) vocab += ", ";
    vocab += Json(key).dump() + ": " + std::to_string(id);
  }
  vocab += "}\n";
  std::string merges = "#version: 0.2\n";
  for (const auto& [left, right] : v.merges)
    merges += gpt2_printable_from_bytes(v.tokens[left]) + ' ' + gpt2_printable_from_bytes(v.tokens[right]) + '\n';
  for (const std::string& path : {vocab_path, merges_path})
    if (exists(path))
      throw Error(who + ": '" + path +
                  "' exists; xgrad writes a vocabulary only where none is (remove it or choose another folder)");
  prepare_output_dir(dir, who);
  write_file_atomically(merges_path, merges, who);
  write_file_atomically(vocab_path, vocab, who);
}

std::unique_ptr<ByteLevelBpe> load_byte_level_bpe(const std::string& path) {
  if (is_folder(path)) {
    const std::string vocab = path + "/vocab.json", merges = path + "/merges.txt", hf = path + "/tokenizer.json";
    if (!exists(vocab) && !exists(merges) && exists(hf))
      return std::make_unique<ByteLevelBpe>(load_hf_tokenizer_json(hf));
    return std::make_unique<ByteLevelBpe>(load_gpt2_vocabulary(vocab, merges));
  }
  if (!exists(path))
    throw Error("load_byte_level_bpe: '" + path +
                "' does not exist (a folder with vocab.json and merges.txt, or a tokenizer.json file)");
  return std::make_unique<ByteLevelBpe>(load_hf_tokenizer_json(path));
}

}  // namespace xgrad::text
