// Reading the PyTorch reference fixtures in tests/fixtures (written by make_fixtures.py) and
// comparing arrays against them. Header-only; test executables get XGRAD_FIXTURE_DIR from CMake.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "xgrad/core/autograd/tensor.hpp"

#ifndef XGRAD_FIXTURE_DIR
#error "XGRAD_FIXTURE_DIR must name the tests/fixtures directory (tests/CMakeLists.txt defines it)"
#endif

namespace xgrad::testing {

// Full path of a fixture file given its name inside tests/fixtures.
inline std::string fixture_path(const std::string& file) { return std::string(XGRAD_FIXTURE_DIR) + "/" + file; }

// Parses tests/fixtures/<file>; throws std::runtime_error naming the file if it is missing or
// is not valid JSON.
inline nlohmann::json load_fixture(const std::string& file) {
  const std::string path = fixture_path(file);
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error("load_fixture: cannot open fixture '" + path +
                             "' (regenerate it with /usr/bin/python3 tests/fixtures/make_fixtures.py)");
  }
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("load_fixture: '" + path + "' is not valid JSON: " + e.what());
  }
}

namespace detail {

inline Shape shape_of(const nlohmann::json& j, const char* who) {
  if (!j.is_object() || !j.contains("shape") || !j.contains("data")) {
    throw std::runtime_error(std::string(who) + ": expected an object with \"shape\" and \"data\", got " +
                             j.dump().substr(0, 200));
  }
  Shape s;
  std::size_t n = 1;
  for (const auto& d : j.at("shape")) {
    s.push_back(d.get<std::size_t>());
    n *= s.back();
  }
  if (j.at("data").size() != n) {
    throw std::runtime_error(std::string(who) + ": shape " + j.at("shape").dump() + " holds " + std::to_string(n) +
                             " elements but data has " + std::to_string(j.at("data").size()));
  }
  return s;
}

}  // namespace detail

// {"shape": [...], "data": [flat row-major]} -> float32 array. A shape [] gives a 0-d array.
// The stored doubles are exact float32 values, so the cast loses nothing.
inline Array to_array(const nlohmann::json& j) {
  Array a = Array::from_shape(detail::shape_of(j, "to_array"));
  const auto& data = j.at("data");
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = static_cast<float>(data[i].get<double>());
  return a;
}

// The same layout with integers (class targets, token ids).
inline IndexArray to_index_array(const nlohmann::json& j) {
  IndexArray a = IndexArray::from_shape(detail::shape_of(j, "to_index_array"));
  const auto& data = j.at("data");
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = data[i].get<std::int64_t>();
  return a;
}

// max |got - want| / max(max |want|, 1e-30), computed in double. Returns +inf when the shapes
// differ (or when got holds a NaN/inf where want is finite), so a `<= tol` check fails.
inline double rel_error(const Array& got, const Array& want) {
  if (got.shape() != want.shape()) return std::numeric_limits<double>::infinity();
  double max_diff = 0, max_want = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got.data()[i], w = want.data()[i];
    const double d = std::abs(g - w);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    max_diff = std::max(max_diff, d);
    max_want = std::max(max_want, std::abs(w));
  }
  return max_diff / std::max(max_want, 1e-30);
}

// "(2, 3, 4)" for messages.
inline std::string shape_string(const Shape& s) {
  std::ostringstream os;
  os << '(';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  if (s.size() == 1) os << ',';
  os << ')';
  return os.str();
}

}  // namespace xgrad::testing
