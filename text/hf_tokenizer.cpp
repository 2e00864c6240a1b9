#include "xgrad/text/hf_tokenizer.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/text/detail/hf_added_tokens.hpp"
#include "xgrad/text/detail/hf_components.hpp"
#include "xgrad/text/detail/special_roles.hpp"

namespace xgrad::text {

namespace {

using detail::HfAddedToken;
using detail::HfFields;
using detail::HfSection;
using detail::Json;
using detail::JsonPlace;

constexpr std::uint64_t kMaxTokenizerBytes = std::uint64_t{1} << 30;

std::string in_quotes(std::string_view text) { return "\"" + readable_bytes(text) + "\""; }

// The document, refusing a key that an object repeats (nlohmann keeps one of them silently: a
// vocab that gives one token two ids would lose one).
Json parse_tokenizer_document(std::string_view text, const std::string& source) {
  std::vector<std::unordered_set<std::string>> keys;  // of each open object, by depth
  std::vector<std::string> path;                      // the key at each depth
  std::string repeated;
  const auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    const auto d = static_cast<std::size_t>(depth);
    if (event == Json::parse_event_t::object_start) {
      if (keys.size() <= d + 1) keys.resize(d + 2);
      keys[d + 1].clear();
    } else if (event == Json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (path.size() < d) path.resize(d);
      path.resize(d);
      path.push_back(key);
      if (d < keys.size() && !keys[d].insert(key).second && repeated.empty()) {
        std::string where;
        for (std::size_t i = 0; i + 1 < path.size(); ++i) where += (i ? "." : "") + readable_bytes(path[i]);
        repeated = "the object " + (where.empty() ? std::string("at the top") : where) + " gives the key " +
                   in_quotes(key) + " twice";
      }
    }
    return true;
  };
  Json doc = xgrad::detail::parse_json(text, source, callback);
  if (!repeated.empty()) throw Error(source + ": " + repeated);
  return doc;
}

// A token named by tokenizer_config.json: a string, or an object with its "content".
std::optional<std::string> config_token(const Json& config, const char* key, const JsonPlace& place) {
  if (!config.is_object() || !config.contains(key) || config[key].is_null()) return std::nullopt;
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  place.at(key).fail("is " + xgrad::detail::json_excerpt(v) +
                     ", neither a token's text nor an object with its content");
}

// tokenizer_config.json's fields that change ids or text in Hugging Face's transformers, each
// refused unless it holds the value that changes nothing.
void refuse_config_options(const Json& config, const JsonPlace& place) {
  const std::pair<const char*, bool> neutral[] = {{"split_special_tokens", false},
                                                  {"do_lower_case", false},
                                                  {"remove_space", false},
                                                  {"do_lowercase_and_remove_accent", false},
                                                  {"add_prefix_space", false}};
  for (const auto& [key, value] : neutral)
    if (config.contains(key) && !config[key].is_null() && config[key] != value)
      place.at(key).fail("is " + xgrad::detail::json_excerpt(config[key]) +
                         ", which would change the ids; xgrad runs tokenizer.json's pipeline as it is (this "
                         "option only as " +
                         (value ? "true" : "false") + " or absent)");
}

}  // namespace

struct HfTokenizer::Impl {
  std::string source;
  std::string document;  // to_json
  std::unique_ptr<detail::HfNormalizer> normalizer;
  std::unique_ptr<detail::HfPreTokenizer> pre_tokenizer;
  std::unique_ptr<detail::HfModel> model;
  std::unique_ptr<detail::HfDecoder> decoder;
  std::vector<HfAddedToken> added;
  // matchers[m][p]: pass p = 0 in the text as given (the tokens with normalized false, or all
  // when there is no normalizer), p = 1 in the normalized text; m = 1 with the special tokens.
  detail::HfAddedTokenMatcher matchers[2][2];
  std::vector<std::string> token_of;  // by id: the model's tokens, the added tokens over them
  std::vector<bool> is_added;         // by id
  TokenIds before, after;             // the template's special tokens around a text
  std::string end_of_word_suffix;
  bool clean_up_spaces = false;
  SpecialTokens roles;

  void read_added_tokens(const Json* list, const JsonPlace& place) {
    if (!list) return;
    if (!list->is_array()) place.fail("is " + xgrad::detail::json_excerpt(*list) + ", not an array");
    std::unordered_map<std::string, std::size_t> by_content;
    std::unordered_map<std::int64_t, std::size_t> by_id;
    for (std::size_t i = 0; i < list->size(); ++i) {
      const JsonPlace here = place.at(i);
      HfFields f((*list)[i], here);
      HfAddedToken t;
      t.id = f.integer("id", -1);
      t.content = f.string("content");
      t.special = f.boolean("special", false);
      t.normalized = f.boolean("normalized", !t.special);
      t.lstrip = f.boolean("lstrip", false);
      t.rstrip = f.boolean("rstrip", false);
      t.single_word = f.boolean("single_word", false);
      f.done();
      if (t.id < 0 || t.id >= (std::int64_t{1} << 31))
        here.at("id").fail("is " + std::to_string(t.id) + ", not an id in [0, 2^31)");
      if (t.content.empty()) here.at("content").fail("is empty");
      if (const auto bad = first_invalid_utf8(t.content))
        here.at("content").fail("is not UTF-8 (byte " + std::to_string(*bad) + ")");
      if (const auto it = by_content.find(t.content); it != by_content.end())
        here.fail(in_quotes(t.content) + " repeats the text of added_tokens[" + std::to_string(it->second) + "]");
      if (const auto it = by_id.find(t.id); it != by_id.end())
        here.fail("the id " + std::to_string(t.id) + " of " + in_quotes(t.content) +
                  " is also the id of added_tokens[" + std::to_string(it->second) + "] " +
                  in_quotes(added[it->second].content));
      const std::vector<std::string>& vocab = model->vocabulary();
      if (t.id < static_cast<std::int64_t>(vocab.size()) && !vocab[t.id].empty() && vocab[t.id] != t.content)
        here.fail("gives " + in_quotes(t.content) + " the id " + std::to_string(t.id) +
                  ", which model.vocab gives to " + in_quotes(vocab[t.id]));
      if (const std::int64_t in_vocab = model->id_of(t.content); in_vocab >= 0 && in_vocab != t.id)
        here.fail("gives " + in_quotes(t.content) + " the id " + std::to_string(t.id) + ", but model.vocab gives it " +
                  std::to_string(in_vocab));
      by_content.emplace(t.content, i);
      by_id.emplace(t.id, i);
      added.push_back(std::move(t));
    }
  }

  void build_matchers() {
    for (std::size_t i = 0; i < added.size(); ++i) {
      const HfAddedToken& t = added[i];
      const bool in_normalized = t.normalized && normalizer;
      const std::string text = in_normalized ? normalizer->normalize(t.content) : t.content;
      if (text.empty()) continue;
      for (const int mode : {0, 1})
        if (mode == 1 || !t.special) matchers[mode][in_normalized].add(text, static_cast<int>(i));
    }
  }

  void read_post_processor(const Json* json, const JsonPlace& place) {
    if (!json) return;
    HfFields f(*json, place);
    const std::string type = f.type();
    if (type == "Sequence") {
      const Json& list = f.required("processors");
      if (!list.is_array()) place.at("processors").fail("is not an array");
      f.done();
      for (std::size_t i = 0; i < list.size(); ++i) read_post_processor(&list[i], place.at("processors").at(i));
      return;
    }
    if (type == "ByteLevel") {  // moves offsets only
      for (const char* key : {"add_prefix_space", "trim_offsets", "use_regex"}) f.ignore(key);
      f.done();
      return;
    }
    if (type != "TemplateProcessing")
      place.fail("is a post-processor of type \"" + type +
                 "\", which xgrad does not implement (TemplateProcessing, ByteLevel, Sequence)");
    if (!before.empty() || !after.empty()) place.fail("is a second TemplateProcessing");
    f.ignore("pair");  // xgrad encodes one text at a time
    const Json& specials = f.required("special_tokens");
    if (!specials.is_object()) place.at("special_tokens").fail("is not an object");
    const Json& single = f.required("single");
    if (!single.is_array()) place.at("single").fail("is not an array");
    f.done();
    bool seen_text = false;
    for (std::size_t i = 0; i < single.size(); ++i) {
      const JsonPlace here = place.at("single").at(i);
      const Json& item = single[i];
      if (!item.is_object() || item.size() != 1)
        here.fail("is " + xgrad::detail::json_excerpt(item) + ", not one piece");
      if (item.contains("Sequence")) {
        HfFields s(item["Sequence"], here.at("Sequence"));
        if (s.string("id") != "A" || seen_text) here.fail("is a sequence other than the one text A");
        s.ignore("type_id");
        s.done();
        seen_text = true;
        continue;
      }
      if (!item.contains("SpecialToken"))
        here.fail("is " + xgrad::detail::json_excerpt(item) + ", neither Sequence nor SpecialToken");
      HfFields s(item["SpecialToken"], here.at("SpecialToken"));
      const std::string name = s.string("id");
      s.ignore("type_id");
      s.done();
      if (!specials.contains(name))
        here.fail("names " + in_quotes(name) + ", which post_processor.special_tokens does not define");
      const JsonPlace defined = place.at("special_tokens").at(name);
      HfFields d(specials[name], defined);
      d.string("id");
      const Json& ids = d.required("ids");
      const Json& tokens = d.required("tokens");
      d.done();
      if (!ids.is_array() || !tokens.is_array() || ids.size() != tokens.size())
        defined.fail("has ids and tokens that are not two arrays of one length");
      for (std::size_t k = 0; k < ids.size(); ++k) {
        if (!ids[k].is_number_integer() || !tokens[k].is_string())
          defined.fail("has " + xgrad::detail::json_excerpt(ids[k]) + " / " + xgrad::detail::json_excerpt(tokens[k]) +
                       ", not an id and a token");
        const std::int64_t id = ids[k].get<std::int64_t>();
        if (id < 0 || id >= static_cast<std::int64_t>(token_of.size()) || token_of[id] != tokens[k].get<std::string>())
          defined.fail(
              "gives the token " + in_quotes(tokens[k].get<std::string>()) + " the id " + std::to_string(id) +
              ", which is " +
              (id >= 0 && id < static_cast<std::int64_t>(token_of.size()) ? in_quotes(token_of[id]) : "no token"));
        (seen_text ? after : before).push_back(id);
      }
    }
    if (!seen_text) place.at("single").fail("holds no Sequence A: the text itself would be dropped");
  }

  // bos/eos/pad/unk from tokenizer_config.json, checked against the template; else by their texts.
  void read_config(const Json& config, const JsonPlace& place, const Json& model_json) {
    const auto id_of_text = [&](const std::string& text) -> std::optional<std::int64_t> {
      for (const HfAddedToken& t : added)
        if (t.content == text) return t.id;
      const std::int64_t id = model->id_of(text);
      return id >= 0 ? std::optional<std::int64_t>(id) : std::nullopt;
    };
    std::optional<std::int64_t>* role[] = {&roles.bos, &roles.eos, &roles.pad, &roles.unk};
    const char* key[] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    for (int r = 0; r < 4; ++r) {
      const std::optional<std::string> text = config_token(config, key[r], place);
      if (!text) continue;
      *role[r] = id_of_text(*text);
      if (!*role[r]) place.at(key[r]).fail("is " + in_quotes(*text) + ", which is no token of tokenizer.json");
    }
    if (config.is_object()) {
      refuse_config_options(config, place);
      const auto flag = [&](const char* k) -> std::optional<bool> {
        if (!config.contains(k) || config[k].is_null()) return std::nullopt;
        if (!config[k].is_boolean())
          place.at(k).fail("is " + xgrad::detail::json_excerpt(config[k]) + ", not true or false");
        return config[k].get<bool>();
      };
      const auto check =
          [&](const char* k, const std::optional<std::int64_t>& id, const TokenIds& side, const char* where) {
        const std::optional<bool> asks = flag(k);
        if (!asks) return;
        const bool has = id && std::find(side.begin(), side.end(), *id) != side.end();
        if (*asks != has)
          place.at(k).fail(std::string("is ") + (*asks ? "true" : "false") + ", but tokenizer.json's post_processor " +
                           (has ? "adds" : "does not add") + " that token " + where +
                           " the text: the two files disagree (xgrad follows neither)");
      };
      check("add_bos_token", roles.bos, before, "before");
      check("add_eos_token", roles.eos, after, "after");
      if (const std::optional<bool> clean = flag("clean_up_tokenization_spaces")) clean_up_spaces = *clean;
    }
    // Roles the config does not name: by the special tokens' texts, and the model's unk_token.
    if (!roles.unk && model_json.contains("unk_token") && model_json["unk_token"].is_string())
      roles.unk = id_of_text(model_json["unk_token"].get<std::string>());
    const SpecialTokens by_text = detail::special_roles_by_text([&](const char* text) -> std::optional<std::int64_t> {
      for (const HfAddedToken& t : added)
        if (t.special && t.content == text) return t.id;
      return std::nullopt;
    });
    if (!roles.bos) roles.bos = by_text.bos;
    if (!roles.eos) roles.eos = by_text.eos;
    if (!roles.pad) roles.pad = by_text.pad;
    if (!roles.unk) roles.unk = by_text.unk;
  }

  Impl(const Json& doc, const Json& config, const std::string& who) : source(who) {
    const JsonPlace top{who, "tokenizer.json"};
    HfFields f(doc, {who, "the top level of tokenizer.json"});
    f.ignore("version");
    for (const char* key : {"truncation", "padding"})
      if (f.optional(key)) top.at(key).fail("is set; xgrad encodes without truncating or padding (null)");
    const Json& model_json = f.required("model");
    const JsonPlace model_place{who, "model"};
    const std::string model_type = HfFields(model_json, model_place).type();
    if (model_type == "BPE" || (model_type.empty() && model_json.contains("merges")))
      model = detail::make_hf_bpe_model(model_json, model_place);
    else if (model_type == "Unigram")
      model = detail::make_hf_unigram_model(model_json, model_place);
    else
      model_place.fail("is a model of type \"" + model_type + "\", which xgrad does not implement (BPE, Unigram)");
    if (const Json* n = f.optional("normalizer")) normalizer = detail::make_hf_normalizer(*n, {who, "normalizer"});
    if (const Json* p = f.optional("pre_tokenizer"))
      pre_tokenizer = detail::make_hf_pre_tokenizer(*p, {who, "pre_tokenizer"});
    if (const Json* d = f.optional("decoder")) decoder = detail::make_hf_decoder(*d, {who, "decoder"});
    read_added_tokens(f.optional("added_tokens"), {who, "added_tokens"});
    token_of = model->vocabulary();
    for (const HfAddedToken& t : added)
      if (t.id >= static_cast<std::int64_t>(token_of.size())) token_of.resize(t.id + 1);
    is_added.assign(token_of.size(), false);
    for (const HfAddedToken& t : added) {
      token_of[t.id] = t.content;
      is_added[t.id] = true;
    }
    read_post_processor(f.optional("post_processor"), {who, "post_processor"});
    f.done();
    if (model_json.contains("end_of_word_suffix") && model_json["end_of_word_suffix"].is_string())
      end_of_word_suffix = model_json["end_of_word_suffix"].get<std::string>();
    read_config(config, {who, "tokenizer_config.json"}, model_json);
    build_matchers();
  }

  void encode(std::string_view input, SpecialText specials, TokenIds& ids) const {
    const std::string replaced = first_invalid_utf8(input) ? detail::replace_invalid_utf8(input) : std::string();
    const std::string_view text = replaced.empty() ? input : std::string_view(replaced);
    const int mode = specials == SpecialText::ordinary ? 0 : 1;
    const std::vector<HfSection> sections = matchers[mode][0].split(text, added);
    for (std::size_t i = 0; i < sections.size(); ++i) {
      const HfSection& s = sections[i];
      if (s.token >= 0) {
        ids.push_back(added[s.token].id);
        continue;
      }
      if (s.text.empty()) continue;
      std::string normalized = normalizer ? normalizer->normalize(std::string(s.text)) : std::string(s.text);
      if (normalized.empty()) continue;
      if (matchers[mode][1].empty()) {
        encode_plain(normalized, i, ids);
        continue;
      }
      for (const HfSection& sub : matchers[mode][1].split(normalized, added)) {
        if (sub.token >= 0)
          ids.push_back(added[sub.token].id);
        else if (!sub.text.empty())
          encode_plain(sub.text, i, ids);
      }
    }
  }

  // Normalized text with no added token in it: each of the pre-tokenizer's pieces through the model
  // as soon as it is cut.
  void encode_plain(std::string_view text, std::size_t section, TokenIds& ids) const {
    if (!pre_tokenizer) return model->tokenize(text, ids);
    pre_tokenizer->split(text, section, [&](std::string_view piece) { model->tokenize(piece, ids); });
  }
};

HfTokenizer::HfTokenizer(std::string_view tokenizer_json, std::string_view config_json, const std::string& source) {
  const Json doc = parse_tokenizer_document(tokenizer_json, source + " tokenizer.json");
  if (!doc.is_object()) throw Error(source + ": tokenizer.json holds " + doc.type_name() + ", not an object");
  Json config;
  if (!config_json.empty()) {
    config = xgrad::detail::parse_json(config_json, source + " tokenizer_config.json");
    if (!config.is_object())
      throw Error(source + ": tokenizer_config.json holds " + config.type_name() + ", not an object");
  }
  impl_ = std::make_unique<Impl>(doc, config, source);
  impl_->document = Json{{"kind", "hf"}, {"tokenizer", doc}, {"config", config}}.dump();
}

HfTokenizer::~HfTokenizer() = default;

TokenIds HfTokenizer::encode(std::string_view text, SpecialText specials) const {
  TokenIds ids;
  ids.reserve(text.size() / 4 + 1);
  impl_->encode(text, specials, ids);
  return ids;
}

TokenIds HfTokenizer::encode_for_model(std::string_view text, SpecialText specials) const {
  TokenIds ids = impl_->before;
  impl_->encode(text, specials, ids);
  ids.insert(ids.end(), impl_->after.begin(), impl_->after.end());
  return ids;
}

std::string HfTokenizer::decode(const TokenIds& ids) const {
  std::vector<std::string> tokens;
  std::vector<bool> added;
  tokens.reserve(ids.size());
  added.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    check_id(ids[i], i, "HfTokenizer::decode");
    tokens.push_back(impl_->token_of[ids[i]]);
    added.push_back(impl_->is_added[ids[i]]);
  }
  std::string text;
  if (impl_->decoder) {
    impl_->decoder->decode_chain(tokens, added);
    for (const std::string& t : tokens) text += t;
    if (!impl_->end_of_word_suffix.empty()) {
      const std::string& suffix = impl_->end_of_word_suffix;
      for (std::size_t at = text.find(suffix); at != std::string::npos; at = text.find(suffix, at + 1))
        text.replace(at, suffix.size(), " ");
    }
  } else {
    for (std::size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
  }
  if (impl_->clean_up_spaces) {
    // Hugging Face's clean_up_tokenization, in its order.
    static const std::pair<const char*, const char*> rules[] = {
        {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : rules) {
      const std::string f = from, t = to;
      std::string out;
      std::size_t at = 0;
      for (std::size_t hit = text.find(f); hit != std::string::npos; hit = text.find(f, at)) {
        out.append(text, at, hit - at).append(t);
        at = hit + f.size();
      }
      out.append(text, at, std::string::npos);
      text = std::move(out);
    }
  }
  return text;
}

std::string HfTokenizer::token_bytes(std::int64_t id) const {
  check_id(id, 0, "HfTokenizer::token_bytes");
  return decode({id});
}

std::size_t HfTokenizer::vocab_size() const { return impl_->token_of.size(); }

SpecialTokens HfTokenizer::special_tokens() const { return impl_->roles; }

std::string HfTokenizer::to_json() const { return impl_->document; }

std::unique_ptr<HfTokenizer> HfTokenizer::from_json(std::string_view json, const std::string& who) {
  const Json doc = xgrad::detail::parse_json(json, who + ": the hf tokenizer document");
  if (!doc.is_object() || doc.value("kind", "") != "hf" || !doc.contains("tokenizer"))
    throw Error(who + ": the document is not an hf tokenizer ({\"kind\":\"hf\",\"tokenizer\":...})");
  const Json& config = doc.contains("config") ? doc["config"] : Json();
  return std::make_unique<HfTokenizer>(doc["tokenizer"].dump(), config.is_null() ? std::string() : config.dump(),
                                       who + ": the hf tokenizer document");
}

std::unique_ptr<HfTokenizer> load_hf_tokenizer(const std::string& path) {
  const std::string who = "load_hf_tokenizer";
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw Error(who + ": '" + path + "' does not exist (a folder with tokenizer.json, or a tokenizer.json file)");
  const bool folder = S_ISDIR(st.st_mode);
  const std::string file = folder ? path + "/tokenizer.json" : path;
  const std::string config_file = folder ? path + "/tokenizer_config.json" : "";
  const std::string tokenizer = read_file(file, who.c_str(), kMaxTokenizerBytes);
  std::string config;
  if (folder && ::stat(config_file.c_str(), &st) == 0) config = read_file(config_file, who.c_str(), kMaxTokenizerBytes);
  return std::make_unique<HfTokenizer>(tokenizer, config, who + ": '" + path + "'");
}

}  // namespace xgrad::text
