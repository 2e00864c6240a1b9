// The sentence grammar and the split.
#include "corpus.hpp"

#include <set>

#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"

namespace zh {

namespace {

using Words = std::vector<std::string>;

const Words kSubjects = {"我", "你", "他", "她", "我们", "他们", "老师", "同事", "经理", "妈妈", "爸爸", "朋友"};
const Words kPastTimes = {"昨天", "前天", "上周", "去年"};
const Words kFutureTimes = {"明天", "后天", "下周", "明年"};
const Words kCities = {"北京", "上海", "广州", "深圳", "杭州", "南京", "成都", "西安"};
const Words kCityPurposes = {"出差", "旅游", "开会", "学习"};
const Words kVehicles = {"飞机", "火车", "高铁"};

// A place in town and what one goes there to do.
struct Errand {
  std::string place;
  Words purposes;
};
const std::vector<Errand> kErrands = {{"医院", {"看病"}},         {"学校", {"上课"}}, {"公司", {"上班", "开会"}},
                                      {"超市", {"买菜", "购物"}}, {"公园", {"散步"}}, {"图书馆", {"看书"}},
                                      {"饭馆", {"吃饭"}}};

// A place, a verb done there, and its objects.
struct Activity {
  std::string place, verb;
  Words objects;
};
const std::vector<Activity> kActivities = {{"家", "看", {"电影", "电视"}},
                                           {"饭馆", "吃", {"饺子", "面条", "米饭"}},
                                           {"超市", "买", {"水果", "牛奶", "面包"}},
                                           {"咖啡馆", "喝", {"咖啡", "茶"}},
                                           {"图书馆", "看", {"书", "报纸"}}};

const std::string& pick(const Words& words, xgrad::Generator& gen) { return words[gen.below(words.size())]; }

// One sentence. Past time words take 去 了 / 了 after the verb; future ones 要 before it.
Sentence draw_sentence(xgrad::Generator& gen) {
  const bool past = gen.below(2) == 0;
  const std::string subject = pick(kSubjects, gen);
  const std::string time = pick(past ? kPastTimes : kFutureTimes, gen);
  Sentence s = gen.below(4) == 0 ? Sentence{time, subject} : Sentence{subject, time};
  auto go_to = [&](const std::string& where) {
    if (past) {
      s.insert(s.end(), {"去", "了", where});
    } else {
      s.insert(s.end(), {"要", "去", where});
    }
  };
  switch (gen.below(4)) {
    case 0: {  // 我 昨天 去 了 北京 出差
      go_to(pick(kCities, gen));
      s.push_back(pick(kCityPurposes, gen));
      break;
    }
    case 1: {  // 他 明天 要 去 医院 看病
      const Errand& e = kErrands[gen.below(kErrands.size())];
      go_to(e.place);
      s.push_back(pick(e.purposes, gen));
      break;
    }
    case 2: {  // 她 上周 坐 高铁 去 了 上海
      const std::string vehicle = pick(kVehicles, gen);
      const std::string city = pick(kCities, gen);
      if (past) {
        s.insert(s.end(), {"坐", vehicle, "去", "了", city});
      } else {
        s.insert(s.end(), {"要", "坐", vehicle, "去", city});
      }
      break;
    }
    default: {  // 我们 前天 在 饭馆 吃 了 饺子
      const Activity& a = kActivities[gen.below(kActivities.size())];
      const std::string object = pick(a.objects, gen);
      if (past) {
        s.insert(s.end(), {"在", a.place, a.verb, "了", object});
      } else {
        s.insert(s.end(), {"要", "在", a.place, a.verb, object});
      }
      break;
    }
  }
  return s;
}

}  // namespace

const Sentence& probe_sentence() {
  static const Sentence s = {"我", "昨天", "去", "了", "北京", "出差"};
  return s;
}

std::vector<Sentence> grammar_sentences(std::size_t count) {
  xgrad::Generator gen(20240601);
  std::set<Sentence> seen;
  std::vector<Sentence> out;
  // The grammar has 14784 sentences; for any count up to a few thousand these draws are plenty.
  for (std::size_t draws = 0; out.size() < count && draws < 100 * count + 1000; ++draws) {
    Sentence s = draw_sentence(gen);
    if (seen.insert(s).second) out.push_back(std::move(s));
  }
  if (out.size() < count) xgrad::fail("grammar_sentences: found only ", out.size(), " distinct sentences, not ", count);
  return out;
}

CorpusSplit split_corpus(const std::vector<Sentence>& sentences, std::size_t held_out_every) {
  if (held_out_every < 2)
    xgrad::fail("split_corpus: held_out_every ", held_out_every, " would leave nothing to train on");
  CorpusSplit split;
  for (std::size_t i = 0; i < sentences.size(); ++i) {
    (i % held_out_every == held_out_every - 1 ? split.held_out : split.train).push_back(sentences[i]);
  }
  return split;
}

CorpusSplit builtin_corpus() { return split_corpus(grammar_sentences(2000), 10); }

Sentence split_words(const std::string& text) {
  Sentence words;
  std::string word;
  for (char c : text) {
    if (c == ' ') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(word);
  return words;
}

std::string join_words(const Sentence& words) {
  std::string text;
  for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
  return text;
}

}  // namespace zh
