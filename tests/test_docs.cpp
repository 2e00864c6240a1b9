// The pages themselves: every relative link and image in README.md and docs/**/*.md names a file
// of the tree and, with an #anchor, a heading of its page (GitHub's anchor rules); docs/layout.md
// mentions every top-level folder and example program and names no path that does not exist.
// External http(s) and mailto links are not checked (no network). Also tests of the checker.
#include <catch2/catch.hpp>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_files.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kSource = XGRAD_SOURCE_DIR;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// The lines of a page that are prose: fenced code blocks (``` or ~~~) become empty lines, so line
// numbers stay those of the file, and inline code spans are blanked.
std::vector<std::string> prose_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  std::string fence;  // the open fence's marker, empty outside a block
  while (std::getline(in, line)) {
    const std::size_t indent = line.find_first_not_of(' ');
    const std::string body = indent == std::string::npos ? "" : line.substr(indent);
    const bool is_fence = body.rfind("```", 0) == 0 || body.rfind("~~~", 0) == 0;
    if (fence.empty() && is_fence) {
      fence = body.substr(0, 3);
      out.emplace_back();
      continue;
    }
    if (!fence.empty()) {
      if (is_fence && body.substr(0, 3) == fence && body.find_first_not_of(fence[0]) == std::string::npos)
        fence.clear();
      out.emplace_back();
      continue;
    }
    out.push_back(std::regex_replace(line, std::regex("`[^`]*`"), "``"));
  }
  return out;
}

}  // namespace

// GitHub's anchor for a heading: markup and link targets dropped, lower case, every character
// but letters, digits, '_', '-' and spaces removed (characters outside ASCII are kept), spaces
// turned into '-'.
std::string heading_slug(const std::string& heading) {
  std::string text = std::regex_replace(heading, std::regex("!?\\[([^\\]]*)\\]\\([^)]*\\)"), "$1");
  std::string slug;
  for (unsigned char c : text) {
    if (c >= 0x80 || std::isalnum(c) || c == '_' || c == '-') {
      slug += static_cast<char>(c >= 0x80 ? c : std::tolower(c));
    } else if (c == ' ') {
      slug += '-';
    }
  }
  return slug;
}

// Every anchor of a page's headings (ATX headings outside code blocks); a repeated slug gets
// -1, -2, ... as on GitHub.
std::set<std::string> page_anchors(const std::string& text) {
  std::set<std::string> anchors;
  std::map<std::string, int> seen;
  std::istringstream in(text);
  std::string line;
  bool in_fence = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0 || line.rfind("~~~", 0) == 0) in_fence = !in_fence;
    if (in_fence) continue;
    std::smatch m;
    if (!std::regex_match(line, m, std::regex("#{1,6} +(.*?) *#* *"))) continue;
    const std::string slug = heading_slug(m[1].str());
    const int n = seen[slug]++;
    anchors.insert(n == 0 ? slug : slug + "-" + std::to_string(n));
  }
  return anchors;
}

// Every problem with the relative links and images of the page at `page` ("page:line: ..."):
// a target that is not a file or folder of the tree, or an #anchor that no heading of the page
// it points to has. Pages are named relative to `root`.
std::vector<std::string> link_problems(const fs::path& page, const fs::path& root) {
  std::vector<std::string> problems;
  const std::string name = fs::relative(page, root).string();
  const std::vector<std::string> lines = prose_lines(read_text(page));
  // [text](target "title"), ![alt](target), and reference definitions [name]: target
  const std::regex inline_link("\\]\\(\\s*<?([^)\\s>]*)>?(?:\\s+\"[^\"]*\")?\\s*\\)");
  const std::regex reference("^\\s*\\[[^\\]]+\\]:\\s*<?(\\S+?)>?(\\s.*)?$");
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string> targets;
    for (std::sregex_iterator it(lines[i].begin(), lines[i].end(), inline_link), end; it != end; ++it)
      targets.push_back((*it)[1].str());
    std::smatch m;
    if (std::regex_match(lines[i], m, reference)) targets.push_back(m[1].str());
    for (const std::string& target : targets) {
      const std::string where = name + ":" + std::to_string(i + 1) + ": ";
      if (target.empty()) {
        problems.push_back(where + "an empty link target");
        continue;
      }
      if (std::regex_search(target, std::regex("^[a-zA-Z][a-zA-Z0-9+.-]*:"))) continue;  // http:, https:, mailto:
      const std::size_t hash = target.find('#');
      const std::string path = target.substr(0, hash);
      const std::string anchor = hash == std::string::npos ? "" : target.substr(hash + 1);
      const fs::path file = path.empty() ? page : (page.parent_path() / path).lexically_normal();
      if (path.rfind('/', 0) == 0) {
        problems.push_back(where + "'" + target + "' is an absolute path; links must be relative");
        continue;
      }
      if (!fs::exists(file)) {
        problems.push_back(where + "'" + target + "': no such file");
        continue;
      }
      if (!anchor.empty()) {
        if (file.extension() != ".md" || fs::is_directory(file)) {
          problems.push_back(where + "'" + target + "': an anchor into a file that is not a page");
        } else if (!page_anchors(read_text(file)).count(anchor)) {
          problems.push_back(where + "'" + target + "': no heading with the anchor #" + anchor);
        }
      }
    }
  }
  return problems;
}

// README.md and every .md under docs/.
std::vector<fs::path> doc_pages(const fs::path& root) {
  std::vector<fs::path> pages = {root / "README.md"};
  for (const auto& e : fs::recursive_directory_iterator(root / "docs"))
    if (e.is_regular_file() && e.path().extension() == ".md") pages.push_back(e.path());
  return pages;
}

namespace {

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// The top-level folders git tracks (the tree without build outputs), or, outside a git checkout,
// the folders of the source root but .git and build*.
std::set<std::string> top_level_folders(const fs::path& root) {
  std::set<std::string> folders;
  const std::string command = "git -C '" + root.string() + "' ls-files 2>/dev/null";
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, pipe)) {
      const std::string path = buffer;
      const std::size_t slash = path.find('/');
      if (slash != std::string::npos) folders.insert(path.substr(0, slash));
    }
    ::pclose(pipe);
  }
  if (folders.empty()) {
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() && n != ".git" && n.rfind("build", 0) != 0) folders.insert(n);
    }
  }
  return folders;
}

}  // namespace

TEST_CASE("every relative link and image of README.md and docs/ resolves, anchors included") {
  const std::vector<fs::path> pages = doc_pages(kSource);
  REQUIRE(pages.size() >= 10);
  std::vector<std::string> problems;
  for (const fs::path& page : pages)
    for (const std::string& p : link_problems(page, kSource)) problems.push_back(p);
  INFO(joined(problems));
  CHECK(problems.empty());
}

TEST_CASE("the link checker finds broken links, images and anchors, and passes good ones") {
  xgrad::testing::TempDir dir("xgrad_docs");
  fs::create_directories(dir.path + "/docs/images");
  std::ofstream(dir.file("docs/images/a.svg")) << "<svg/>";
  std::ofstream(dir.file("docs/other.md")) << "# Other page\n\n## The rooms of core/\n\n## Twice\n\n## Twice\n";
  std::ofstream(dir.file("docs/page.md"))
      << "# A page\n\n"
         "Good: [other](other.md), [rooms](other.md#the-rooms-of-core), [second](other.md#twice-1),\n"
         "![picture](images/a.svg), [up](../docs/other.md), [here](#a-page), [web](https://example.org/x.md).\n"
         "```\n[in a code block](missing.md)\n```\n"
         "`[in a code span](missing.md)`\n"
         "Bad: [gone](gone.md)\n"
         "![no picture](images/b.svg)\n"
         "[no anchor](other.md#the-rooms-of-nn)\n"
         "[no local anchor](#elsewhere)\n"
         "[ref]: ../missing/ref.md\n";
  const std::vector<std::string> problems = link_problems(dir.file("docs/page.md"), dir.path);
  INFO(joined(problems));
  REQUIRE(problems.size() == 5);
  CHECK(problems[0] == "docs/page.md:9: 'gone.md': no such file");
  CHECK(problems[1] == "docs/page.md:10: 'images/b.svg': no such file");
  CHECK(problems[2] == "docs/page.md:11: 'other.md#the-rooms-of-nn': no heading with the anchor #the-rooms-of-nn");
  CHECK(problems[3] == "docs/page.md:12: '#elsewhere': no heading with the anchor #elsewhere");
  CHECK(problems[4] == "docs/page.md:13: '../missing/ref.md': no such file");
}

TEST_CASE("heading anchors follow GitHub's rules") {
  CHECK(heading_slug("Using xgrad from your own CMake project") == "using-xgrad-from-your-own-cmake-project");
  CHECK(heading_slug("What is exact, what agrees to rounding") == "what-is-exact-what-agrees-to-rounding");
  CHECK(heading_slug("`train_lm` on one machine") == "train_lm-on-one-machine");
  CHECK(heading_slug("The rooms of core/") == "the-rooms-of-core");
  CHECK(heading_slug("Attention over 我 昨天") == "attention-over-我-昨天");
  CHECK(heading_slug("See [the engine](engine.md)") == "see-the-engine");
  const std::set<std::string> anchors = page_anchors("# A\n\n```\n# not a heading\n```\n## B c\n## B c\n");
  CHECK(anchors == std::set<std::string>{"a", "b-c", "b-c-1"});
}

TEST_CASE("docs/layout.md mentions every top-level folder and example program, and names only paths that exist") {
  const std::string layout = read_text(kSource / "docs/layout.md");
  REQUIRE(!layout.empty());

  const std::set<std::string> folders = top_level_folders(kSource);
  REQUIRE(folders.count("core"));
  REQUIRE(folders.count("examples"));
  for (const std::string& folder : folders) {
    INFO("top-level folder " << folder << "/");
    CHECK(layout.find("`" + folder + "/`") != std::string::npos);
  }

  // A program is a .cpp file directly in examples/, or a folder of examples/ with a main.cpp.
  std::vector<std::string> programs;
  for (const auto& e : fs::directory_iterator(kSource / "examples")) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && e.path().extension() == ".cpp") programs.push_back("examples/" + n);
    if (e.is_directory() && fs::exists(e.path() / "main.cpp")) programs.push_back("examples/" + n + "/");
  }
  REQUIRE(programs.size() >= 7);
  for (const std::string& program : programs) {
    INFO("example program " << program);
    CHECK(layout.find("`" + program + "`") != std::string::npos);
  }

  // Every code span that is a path (it has a '/', or a file extension, and no spaces or
  // wildcards) is a file or folder of the tree, from the root.
  std::size_t checked = 0;
  const std::regex span("`([A-Za-z0-9_.][A-Za-z0-9_./-]*)`");
  for (std::sregex_iterator it(layout.begin(), layout.end(), span), end; it != end; ++it) {
    const std::string path = (*it)[1].str();
    if (path.find('/') == std::string::npos && !std::regex_search(path, std::regex("\\.[a-z]+$"))) continue;
    INFO("docs/layout.md names " << path);
    CHECK(fs::exists(kSource / path));
    ++checked;
  }
  CHECK(checked >= 40);
}
