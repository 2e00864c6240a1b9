// XGRAD_ARG declares one option of an options struct: a field with its default, a getter and
// a chainable setter, so that MultiHeadAttentionOptions(512, 8).dropout(0.1).norm(Norm::pre)
// reads like the sentence it is.
#pragma once

#define XGRAD_ARG(T, name, default_value)   \
 public:                                    \
  auto& name(const T& v) {                  \
    name##_ = v;                            \
    return *this;                           \
  }                                         \
  const T& name() const { return name##_; } \
                                            \
 private:                                   \
  T name##_ = default_value
