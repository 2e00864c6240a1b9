// Oniguruma's syntax (Hugging Face's Rust tokenizers compiles tokenizer.json's regular expressions
// with the onig crate's default, ONIG_SYNTAX_ONIGURUMA, on UTF-8) rewritten for PCRE2. One pass
// over the pattern that knows where it is: outside a class, inside one (nested classes flattened),
// in a group (for the atom an interval repeats). Each rewrite was checked against the Rust
// tokenizers (npm package "tokenizers", its Node binding) on texts that tell the two readings apart.
#include "xgrad/text/detail/hf_oniguruma.hpp"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace xgrad::text::detail {

namespace {

// Unicode White_Space (Oniguruma's \s): PCRE2's \s (with UCP) also matches U+180E.
constexpr const char* kSpaceItems =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
// Not White_Space, as a class item (a list cannot be negated inside a class).
constexpr const char* kNotSpaceItem = R"(\P{White_Space})";
// Oniguruma's word characters (\w, \p{Word}) inside a class: Alphabetic, marks, decimal digits,
// connector punctuation (not U+200D, which Rust regex's \w holds).
constexpr const char* kWordItems = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})";
// Outside a class, as the onig crate runs it, \w \W \b \p{Word} also count the Latin-1
// superscripts and fractions ² ³ ¹ ¼ ½ ¾ as word characters (but not ⁴ nor ①); [\w] does not.
constexpr const char* kLatin1WordItems = R"(\x{B2}\x{B3}\x{B9}\x{BC}-\x{BE})";
constexpr const char* kHexItems = "0-9A-Fa-f";
constexpr const char* kNotHexItem = R"(\P{ASCII_Hex_Digit})";

std::string word_class(bool negated) { return std::string(negated ? "[^" : "[") + kWordItems + kLatin1WordItems + "]"; }

// Oniguruma's long names of the general categories, which PCRE2 knows only by their short names
// (keys compared as Oniguruma compares names: lowercase, without ' ', '_' and '-').
const char* short_category_name(const std::string& loose) {
  static const std::pair<const char*, const char*> kNames[] = {{"other", "C"},
                                                               {"control", "Cc"},
                                                               {"format", "Cf"},
                                                               {"unassigned", "Cn"},
                                                               {"privateuse", "Co"},
                                                               {"surrogate", "Cs"},
                                                               {"letter", "L"},
                                                               {"casedletter", "LC"},
                                                               {"lowercaseletter", "Ll"},
                                                               {"modifierletter", "Lm"},
                                                               {"otherletter", "Lo"},
                                                               {"titlecaseletter", "Lt"},
                                                               {"uppercaseletter", "Lu"},
                                                               {"mark", "M"},
                                                               {"combiningmark", "M"},
                                                               {"spacingmark", "Mc"},
                                                               {"enclosingmark", "Me"},
                                                               {"nonspacingmark", "Mn"},
                                                               {"number", "N"},
                                                               {"decimalnumber", "Nd"},
                                                               {"letternumber", "Nl"},
                                                               {"othernumber", "No"},
                                                               {"punctuation", "P"},
                                                               {"connectorpunctuation", "Pc"},
                                                               {"dashpunctuation", "Pd"},
                                                               {"closepunctuation", "Pe"},
                                                               {"finalpunctuation", "Pf"},
                                                               {"initialpunctuation", "Pi"},
                                                               {"otherpunctuation", "Po"},
                                                               {"openpunctuation", "Ps"},
                                                               {"symbol", "S"},
                                                               {"currencysymbol", "Sc"},
                                                               {"modifiersymbol", "Sk"},
                                                               {"mathsymbol", "Sm"},
                                                               {"othersymbol", "So"},
                                                               {"separator", "Z"},
                                                               {"lineseparator", "Zl"},
                                                               {"paragraphseparator", "Zp"},
                                                               {"spaceseparator", "Zs"}};
  for (const auto& [name, short_name] : kNames)
    if (loose == name) return short_name;
  return nullptr;
}

class Translator {
 public:
  Translator(std::string_view pattern, const JsonPlace& place) : in_(pattern), place_(place) {}

  std::string run() {
    while (at_ < in_.size()) {
      const char c = in_[at_];
      switch (c) {
        case '\\':
          escape_outside();
          break;
        case '[':
          character_class();
          break;
        case '(':
          open_group();
          break;
        case ')':
          close_group();
          break;
        case '|':
          out_ += c;
          ++at_;
          atom_ = kNone;
          break;
        case '{':
          interval();
          break;
        case '*':
        case '+':
        case '?':
          out_ += c;
          ++at_;
          break;
        default:
          literal();
          break;
      }
    }
    return out_;
  }

 private:
  static constexpr std::size_t kNone = std::string::npos;

  [[noreturn]] void refuse(const std::string& what, std::size_t where) const {
    place_.fail("holds " + what + " at offset " + std::to_string(where) +
                ", which xgrad does not translate from Oniguruma's syntax to PCRE2's");
  }

  char peek(std::size_t ahead = 0) const { return at_ + ahead < in_.size() ? in_[at_ + ahead] : '\0'; }

  // One character, as it is (a whole UTF-8 sequence).
  void literal() {
    atom_ = out_.size();
    const std::size_t n = std::min(in_.size() - at_, utf8_bytes(static_cast<unsigned char>(in_[at_])));
    out_.append(in_.substr(at_, n));
    at_ += n;
  }
  static std::size_t utf8_bytes(unsigned char lead) { return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

  // Copies from at_ through the first `close` (included); refuses when there is none.
  void copy_through(char close, const char* what) {
    const std::size_t end = in_.find(close, at_);
    if (end == std::string_view::npos) refuse(std::string("an unterminated ") + what, at_);
    out_.append(in_.substr(at_, end + 1 - at_));
    at_ = end + 1;
  }

  // \x.. \o{..} \c. \k<..> \g<..> \uHHHH, digits and the escaped non-letters, which read the
  // same in both syntaxes (or, \uHHHH, become PCRE2's \x{HHHH}). Returns false for other escapes.
  bool shared_escape() {
    const char e = peek(1);
    const std::size_t start = at_;
    if (e == 'x' || e == 'o') {
      at_ += 2;
      out_ += '\\';
      out_ += e;
      if (peek() == '{') {
        copy_through('}', "braced escape");
      } else {
        for (int k = 0; k < 2 && std::isxdigit(static_cast<unsigned char>(peek())); ++k) out_ += in_[at_++];
      }
      return true;
    }
    if (e == 'u') {
      for (std::size_t k = 2; k < 6; ++k)
        if (!std::isxdigit(static_cast<unsigned char>(peek(k)))) refuse("\\u without four hexadecimal digits", start);
      out_ += "\\x{" + std::string(in_.substr(at_ + 2, 4)) + "}";
      at_ += 6;
      return true;
    }
    if (e == 'c') {
      if (at_ + 2 >= in_.size()) refuse("\\c at the end", start);
      out_.append(in_.substr(at_, 3));
      at_ += 3;
      return true;
    }
    if (e == 'a' || e == 'e' || e == 'f' || e == 'n' || e == 'r' || e == 't' || e == 'd' || e == 'D' ||
        std::isdigit(static_cast<unsigned char>(e))) {
      out_.append(in_.substr(at_, 2));  // following digits are copied as they come
      at_ += 2;
      return true;
    }
    if (e == 'v') {  // Oniguruma's \v is the vertical tab; PCRE2's is any vertical space
      out_ += "\\x0B";
      at_ += 2;
      return true;
    }
    if (!std::isalpha(static_cast<unsigned char>(e)) && e != '\0') {  // an escaped symbol or non-ASCII
      ++at_;
      if (static_cast<unsigned char>(e) < 0x80) out_ += '\\';  // a non-ASCII character needs none
      literal();
      return true;
    }
    return false;
  }

  // \p{Name} \p{^Name} \P{Name}, read up to its closing brace: Word and the long category names
  // rewritten, other names left to PCRE2 (whose Unicode names Oniguruma shares).
  struct Property {
    std::string text;
    bool negated = false;
    bool word = false;
  };
  Property property() {
    const std::size_t start = at_;
    if (peek(2) != '{') refuse(std::string("\\") + peek(1) + " without braces", start);
    const std::size_t close = in_.find('}', at_);
    if (close == std::string_view::npos) refuse("an unterminated \\p{", start);
    Property p;
    p.text = std::string(in_.substr(at_, close + 1 - at_));
    std::string_view name = in_.substr(at_ + 3, close - at_ - 3);
    p.negated = peek(1) == 'P';
    if (!name.empty() && name[0] == '^') {
      p.negated = !p.negated;
      name.remove_prefix(1);
    }
    std::string loose;  // Oniguruma compares property names ignoring case, spaces, '_' and '-'
    for (const char c : name)
      if (c != ' ' && c != '_' && c != '-') loose += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    p.word = loose == "word";
    if (const char* category = short_category_name(loose))
      p.text = std::string(p.negated ? "\\P{" : "\\p{") + category + "}";
    at_ = close + 1;
    return p;
  }

  void escape_outside() {
    const std::size_t start = at_;
    const std::size_t atom = out_.size();
    const char e = peek(1);
    if (shared_escape()) {
      atom_ = atom;
      return;
    }
    switch (e) {
      case 's':
        out_ += std::string("[") + kSpaceItems + "]";
        break;
      case 'S':
        out_ += std::string("[^") + kSpaceItems + "]";
        break;
      case 'w':
        out_ += word_class(false);
        break;
      case 'W':
        out_ += word_class(true);
        break;
      case 'h':
        out_ += std::string("[") + kHexItems + "]";
        break;
      case 'H':
        out_ += std::string("[^") + kHexItems + "]";
        break;
      case 'b':
      case 'B': {
        const std::string w = word_class(false);
        const std::string after_word = "(?<=" + w + ")", before_word = "(?=" + w + ")";
        const std::string after_other = "(?<!" + w + ")", before_other = "(?!" + w + ")";
        out_ += e == 'b' ? "(?:" + after_word + before_other + "|" + after_other + before_word + ")"
                         : "(?:" + after_word + before_word + "|" + after_other + before_other + ")";
        break;
      }
      case 'O':
        out_ += "(?s:.)";
        break;
      case 'p':
      case 'P': {
        const Property p = property();
        out_ += p.word ? word_class(p.negated) : p.text;
        atom_ = atom;
        return;
      }
      case 'k':
      case 'g': {  // back reference / subroutine call by name or number: \k<..> \k'..'
        const char open = peek(2);
        if (open != '<' && open != '\'') refuse(std::string("\\") + e + " without <name>", start);
        out_.append(in_.substr(at_, 3));
        at_ += 3;
        copy_through(open == '<' ? '>' : '\'', "name");
        atom_ = atom;
        return;
      }
      case 'R':  // (?>\r\n|[\n\v\f\r\x85\u2028\u2029]) in both, with PCRE2_BSR_UNICODE
      case 'N':  // not a newline (LF)
      case 'K':
      case 'G':
      case 'A':
      case 'z':
      case 'Z':
        out_.append(in_.substr(at_, 2));
        break;
      default:
        refuse(e == '\0' ? std::string("a \\ at the end") : std::string("the escape \\") + e, start);
    }
    at_ += 2;
    atom_ = atom;
  }

  void escape_in_class() {
    const std::size_t start = at_;
    const char e = peek(1);
    if (shared_escape()) return;
    switch (e) {
      case 's':
        out_ += kSpaceItems;
        break;
      case 'S':
        out_ += kNotSpaceItem;
        break;
      case 'w':
        out_ += kWordItems;
        break;
      case 'h':
        out_ += kHexItems;
        break;
      case 'H':
        out_ += kNotHexItem;
        break;
      case 'b':
        out_ += "\\b";
        break;  // backspace in a class, in both
      case 'p':
      case 'P': {
        const Property p = property();
        if (p.word && p.negated) refuse("a negated \\p{Word} inside a character class", start);
        out_ += p.word ? kWordItems : p.text;
        return;
      }
      default:
        refuse(
            e == '\0' ? std::string("a \\ at the end") : std::string("the escape \\") + e + " inside a character class",
            start);
    }
    at_ += 2;
  }

  // [...] with nested non-negated classes flattened into it ([a[bc]] is [abc]).
  void character_class() {
    const std::size_t start = at_;
    atom_ = out_.size();
    out_ += '[';
    ++at_;
    if (peek() == '^') {
      out_ += '^';
      ++at_;
    }
    if (peek() == ']') {  // a ']' first is a literal
      out_ += "\\]";
      ++at_;
    }
    int depth = 1;
    while (at_ < in_.size()) {
      const char c = in_[at_];
      if (c == '\\') {
        escape_in_class();
      } else if (c == '[') {
        if (peek(1) == ':') refuse("a POSIX bracket ([:name:])", at_);
        if (peek(1) == '^') refuse("a negated class inside a class", at_);
        ++depth;
        ++at_;
        if (peek() == ']') {
          out_ += "\\]";
          ++at_;
        }
      } else if (c == ']') {
        ++at_;
        if (--depth == 0) {
          out_ += ']';
          return;
        }
      } else if (c == '&' && peek(1) == '&') {
        refuse("a class intersection (&&)", at_);
      } else {
        const std::size_t n = std::min(in_.size() - at_, utf8_bytes(static_cast<unsigned char>(c)));
        out_.append(in_.substr(at_, n));
        at_ += n;
      }
    }
    refuse("an unterminated character class", start);
  }

  void open_group() {
    const std::size_t start = at_;
    groups_.push_back(out_.size());
    if (peek(1) != '?') {
      out_ += '(';
      ++at_;
      return;
    }
    const char kind = peek(2);
    if (kind == '#') {  // a comment, not a group
      groups_.pop_back();
      copy_through(')', "comment");
      return;
    }
    if (kind == ':' || kind == '=' || kind == '!' || kind == '>') {
      out_.append(in_.substr(at_, 3));
      at_ += 3;
      return;
    }
    if (kind == '<' && (peek(3) == '=' || peek(3) == '!')) {
      out_.append(in_.substr(at_, 4));
      at_ += 4;
      return;
    }
    if (kind == '<' || kind == '\'') {  // a named group
      copy_through(kind == '<' ? '>' : '\'', "group name");
      return;
    }
    if (kind == '~') refuse("an absent group (?~...)", start);
    if (kind == '(') refuse("a conditional group (?(...)...)", start);
    if (kind == '{' || kind == '*') refuse("a callout", start);
    // Options: i is the same in both; Oniguruma's m is PCRE2's s (dot matches a newline).
    out_ += "(?";
    at_ += 2;
    while (at_ < in_.size() && in_[at_] != ':' && in_[at_] != ')') {
      const char option = in_[at_];
      if (option == 'i' || option == '-') {
        out_ += option;
      } else if (option == 'm') {
        out_ += 's';
      } else {
        refuse(std::string("the group option ") + option, at_);
      }
      ++at_;
    }
    if (at_ == in_.size()) refuse("an unterminated group option", start);
    out_ += in_[at_];
    if (in_[at_++] == ')') {  // (?i) sets the option to the end of the enclosing group
      groups_.pop_back();
      atom_ = kNone;
    }
  }

  void close_group() {
    out_ += ')';
    ++at_;
    if (groups_.empty()) {  // PCRE2 refuses the unmatched parenthesis
      atom_ = kNone;
      return;
    }
    atom_ = groups_.back();
    groups_.pop_back();
  }

  // {n} {n,} {n,m} {,m}; anything else from '{' is a literal '{'.
  void interval() {
    const std::size_t start = at_;
    std::size_t i = at_ + 1;
    const auto digits = [&] {
      const std::size_t from = i;
      while (i < in_.size() && std::isdigit(static_cast<unsigned char>(in_[i]))) ++i;
      return std::string(in_.substr(from, i - from));
    };
    const std::string low = digits();
    const bool comma = i < in_.size() && in_[i] == ',';
    if (comma) ++i;
    const std::string high = comma ? digits() : "";
    const bool valid = i < in_.size() && in_[i] == '}' && (!low.empty() || !high.empty());
    if (!valid) {
      atom_ = out_.size();
      out_ += "\\{";
      ++at_;
      return;
    }
    if (atom_ == kNone) refuse("a repeat {n,m} with nothing to repeat", start);
    at_ = i + 1;
    const std::string body = "{" + (low.empty() ? "0" : low) + (comma ? "," + high : "") + "}";
    const char next = peek();
    // Oniguruma reads X{n,m}+ and X{n,m}* as a repeat of X{n,m}, X{n}? as an optional X{n}
    // (X{n,m}? is lazy in both), and X{n}{m} as (X{n}){m}.
    const bool repeat_after = next == '+' || next == '*' || (next == '?' && !comma) || next == '{';
    if (!repeat_after) {
      out_ += body;
      return;
    }
    out_.insert(atom_, "(?:");
    out_ += body + ")";
    if (next != '{') {
      out_ += next;
      ++at_;
    }
  }

  std::string_view in_;
  const JsonPlace& place_;
  std::size_t at_ = 0;
  std::string out_;
  std::size_t atom_ = kNone;         // where the last atom (with its repeats) starts in out_
  std::vector<std::size_t> groups_;  // where each open group starts in out_
};

}  // namespace

std::string oniguruma_to_pcre2(std::string_view pattern, const JsonPlace& place) {
  return Translator(pattern, place).run();
}

}  // namespace xgrad::text::detail
