// Files for the checkpoint tests: a scratch directory removed at the end of its scope, and whole
// files read and written as byte strings.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

namespace xgrad::testing {

// A fresh directory /tmp/<prefix>_XXXXXX, removed with everything in it at the end of the scope.
struct TempDir {
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
    if (!::mkdtemp(tmpl.data())) FAIL("mkdtemp failed for " << tmpl);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return path + "/" + name; }
  std::set<std::string> entries() const {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) out.insert(e.path().filename().string());
    return out;
  }
  std::string path;
};

// The whole file in one allocation and one read (a growing string stream is several times
// slower on large files, especially under AddressSanitizer); "" when it cannot be opened.
inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::string s(static_cast<std::size_t>(std::filesystem::file_size(path)), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<std::size_t>(in.gcount()));
  return s;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace xgrad::testing
